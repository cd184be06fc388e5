"""``jaxnet study``: each study end to end in --smoke mode, the scaling analysis on hand-computed
numbers, the wall-clock model, and bad input."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import needs_fashion_mnist

from jaxnet import cli
from jaxnet import config as config_lib
from jaxnet.study import async_sgd, batch_scaling

ROOT = Path(__file__).resolve().parents[1]
PNG = b"\x89PNG\r\n\x1a\n"


# ---------------------------------------------------------------------------------------------
# Pure pieces


def test_scaling_analysis_on_hand_computed_numbers():
    # Perfect scaling from batch 64 at 1000 steps: 500, 250, 125, 62.5 steps.
    result = batch_scaling.scaling_analysis([64, 128, 256, 512, 1024], [1000, 520, 300, 240, None])
    assert result["anchor"] == 64
    assert result["perfect_steps"] == [1000.0, 500.0, 250.0, 125.0, 62.5]
    assert result["slowdown"] == pytest.approx([1.0, 1.04, 1.2, 1.92, None])
    assert result["critical_batch"] == 512  # 240 steps <= 2 x 125
    assert result["departs_at"] == 1024  # never reached the target
    tighter = batch_scaling.scaling_analysis([64, 128, 256, 512, 1024], [1000, 520, 300, 240, None], tolerance=1.5)
    assert (tighter["critical_batch"], tighter["departs_at"]) == (256, 512)


def test_scaling_analysis_anchors_at_the_smallest_batch_that_reached_the_target():
    result = batch_scaling.scaling_analysis([256, 32, 64, 128], [100, None, 400, 200])  # any order
    assert result["batches"] == [32, 64, 128, 256]
    assert result["anchor"] == 64
    assert result["perfect_steps"] == [800.0, 400.0, 200.0, 100.0]
    assert result["slowdown"] == [None, 1.0, 1.0, 1.0]
    assert (result["critical_batch"], result["departs_at"]) == (256, None)
    nothing = batch_scaling.scaling_analysis([32, 64], [None, None])
    assert (nothing["anchor"], nothing["critical_batch"], nothing["departs_at"]) == (None, None, None)


def test_learning_rate_rules_and_the_example_grid():
    assert batch_scaling.scaled_lr(0.1, 128, 512, "linear") == pytest.approx(0.4)
    assert batch_scaling.scaled_lr(0.1, 128, 512, "sqrt") == pytest.approx(0.2)
    assert batch_scaling.scaled_lr(0.1, 128, 32, "none") == 0.1
    # lcm(64, 96) = 192; 10,000 / 16 / 192 rounds to 3 grid units of 192 = 576; 18 passes cover the budget
    assert batch_scaling.example_grid([64, 96], 10_000, None) == (576, 10_368)


def test_point_overrides_keep_the_schedule_fixed_in_examples():
    base = config_lib.load_experiment("cnn_fashion_mnist")  # batch 128, lr 2e-3, warmup 200 steps
    overrides = dict(o.split("=", 1) for o in batch_scaling.point_overrides(base, 512, "linear", 5120, 51_200))
    assert overrides["train.batch_size"] == "512"
    assert float(overrides["optim.lr"]) == pytest.approx(8e-3)
    assert overrides["optim.warmup_steps"] == "50"  # 200 steps of 128 = 50 steps of 512
    assert (overrides["train.steps"], overrides["train.eval_every"]) == ("100", "10")


def test_wall_clock_model_of_sync_and_async_sgd():
    # No jitter: sync pays compute + exchange per update; async gets W updates per such interval.
    assert async_sgd.seconds_per_update("sync", 4, 0.010, 0.002, 0.0) == pytest.approx(0.012)
    assert async_sgd.seconds_per_update("async", 4, 0.010, 0.002, 0.0) == pytest.approx(0.003)
    # Jitter 0.5: sync waits for the slowest of 4 (1 + 1/2 + 1/3 + 1/4 = 25/12 mean-1 exponentials).
    assert async_sgd.seconds_per_update("sync", 4, 0.012, 0.0, 0.5) == pytest.approx(0.012 * (1 + 0.5 * 25 / 12))
    assert async_sgd.seconds_per_update("async", 4, 0.012, 0.0, 0.5) == pytest.approx(0.012 * 1.5 / 4)
    assert async_sgd.default_comm_seconds(1_250_000) == pytest.approx(0.008)  # 10 MB over 10 Gbit/s


# ---------------------------------------------------------------------------------------------
# End to end


@needs_fashion_mnist
def test_batch_scaling_smoke_writes_its_json_and_png_and_reuses_finished_runs(tmp_path, capsys):
    workdir = tmp_path / "scaling"
    argv = ["study", "batch-scaling", "cnn_fashion_mnist", "batch=64,128", "--smoke", "--target", "0.3"]
    argv += ["--max-examples", "1024", "--workdir", str(workdir)]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "critical batch size" in out
    record = json.loads((workdir / "batch_scaling.json").read_text())
    assert (workdir / "batch_scaling.png").read_bytes()[:8] == PNG
    assert record["experiment"] == "cnn_fashion_mnist:smoke" and record["metric"] == "accuracy"
    assert record["eval_every_examples"] == 128 and record["budget_examples"] == 1024
    assert [p["batch_size"] for p in record["points"]] == [64, 128]
    assert [p["lr"] for p in record["points"]] == pytest.approx([1e-3, 2e-3])
    for p in record["points"]:
        if p["reached"]:
            assert p["examples_to_target"] == p["steps_to_target"] * p["batch_size"]
            assert p["val_at_target"] >= 0.3
            assert p["final_step"] == p["steps_to_target"]  # stopped at the target
        else:
            assert p["steps_to_target"] is None and p["final_step"] == p["budget_steps"]
    for key in ("critical_batch", "anchor_batch", "departs_at", "environment", "target", "lr_rule"):
        assert key in record
    assert record["environment"]["command"].startswith("jaxnet study batch-scaling")

    assert cli.main(argv) == 0  # again: every point is reused, nothing trains
    assert all(p["reused"] for p in json.loads((workdir / "batch_scaling.json").read_text())["points"])


def test_devices_study_with_cpu_results_only_says_so_and_invents_no_gpu(tmp_path, capsys):
    results = tmp_path / "results"  # the committed CPU bench records alone
    results.mkdir()
    for path in (ROOT / "benchmarks/results").glob("cpu-2*.json"):
        shutil.copy(path, results / path.name)
    assert cli.main(["study", "devices", "--results", str(results), "--workdir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith("no GPU results in ")
    record = json.loads((tmp_path / "devices.json").read_text())
    assert (tmp_path / "devices.png").read_bytes()[:8] == PNG
    assert set(record["families"]) == {"cnn", "lstm", "transformer"}
    benches = [json.loads(p.read_text()) for p in (ROOT / "benchmarks/results").glob("cpu-2*.json")]
    with_cnn = [b for b in benches if b.get("kind") == "benchmark" and "cnn" in b.get("cases", {})]
    newest = max(with_cnn, key=lambda b: b["environment"]["date"])  # a bench of other families only does not count
    assert record["families"]["cnn"]["cpu"]["examples_per_s"] == newest["cases"]["cnn"]["examples_per_s"]
    assert all(r["gpu"] is None and r["speedup"] is None for r in record["families"].values())


def test_devices_study_shows_predicted_gpu_columns_from_the_committed_plan_records(tmp_path, capsys):
    """Beside the measured CPU figure, each family gets the H100 and H200 examples/s of the newest
    committed one-GPU plan record of its experiment, labelled predicted; a measured GPU cell only
    where a committed GPU bench record has that family."""
    results = ROOT / "benchmarks/results"
    assert cli.main(["study", "devices", "--results", str(results), "--workdir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "H100 examples/s (PREDICTED)" in out and "H200 examples/s (PREDICTED)" in out and "not a measurement" in out
    rows = json.loads((tmp_path / "devices.json").read_text())["families"]
    for family, experiment in (("cnn", "cnn_fashion_mnist"), ("transformer", "transformer_shakespeare")):
        for target in ("h100", "h200"):
            newest = sorted(results.glob(f"plan-{experiment}-{target}-*.json"))[-1]
            plan = json.loads(newest.read_text())
            cell = rows[family]["predicted"][target]
            assert cell["examples_per_s"] == plan["prediction"]["examples_per_s"] and "PREDICTED" in cell["label"]
            cpu = rows[family]["cpu"]["examples_per_s"]
            assert cell["speedup_over_cpu"] == round(plan["prediction"]["examples_per_s"] / cpu, 1)
    # a measured GPU cell only from a committed GPU bench record of that family, never from a plan
    gpu_benches = {}
    for path in results.glob("*.json"):
        record = json.loads(path.read_text())
        if record.get("kind") == "benchmark" and record["environment"]["platform"] == "gpu":
            gpu_benches[path.name] = set(record["cases"])
    for family, row in rows.items():
        if row["gpu"] is None:
            assert not any(family in cases for cases in gpu_benches.values())
        else:
            assert family in gpu_benches[Path(row["gpu"]["file"]).name] and "PREDICTED" not in json.dumps(row["gpu"])


def test_devices_study_computes_the_speedup_from_a_compare_devices_record(tmp_path, capsys):
    def bench(platform: str, rates: dict, **extra) -> dict:
        env = {"platform": platform, "device": "NVIDIA H100" if platform == "gpu" else "cpu", "cpu_count": 16}
        env |= {"date": "2026-12-01T00:00:00+00:00", "versions": {"jax": "0.10.2"}}
        cases = {f: {"examples_per_s": r, "dtype": "float32"} for f, r in rates.items()}
        return {"kind": "benchmark", "smoke": False, "environment": env, "cases": cases, **extra}

    results = tmp_path / "results"
    results.mkdir()
    cpu = bench("cpu", {"cnn": 500.0, "lstm": 100.0, "transformer": 50.0})
    gpu = bench("gpu", {"cnn": 40_000.0, "lstm": 2_000.0, "transformer": 5_000.0}, cpu_record=cpu)
    (results / "nvidia-h100-2026-12-01.json").write_text(json.dumps(gpu))
    (results / "cpu-2026-11-21.json").write_text(json.dumps(bench("cpu", {"cnn": 1.0, "lstm": 1.0})))
    assert cli.main(["study", "devices", "--results", str(results), "--workdir", str(tmp_path / "out")]) == 0
    rows = json.loads((tmp_path / "out" / "devices.json").read_text())["families"]
    assert {f: r["speedup"] for f, r in rows.items()} == {"cnn": 80.0, "lstm": 20.0, "transformer": 100.0}
    assert "80.0x" in capsys.readouterr().out


needs_async_sgd = pytest.mark.skipif(
    "parallel.staleness" not in config_lib.keys(), reason="parallel.sgd=async is not in this jaxnet yet"
)


@needs_fashion_mnist
@needs_async_sgd
def test_async_smoke_writes_its_json_and_png(tmp_path, capsys):
    workdir = tmp_path / "async"
    argv = [
        "study",
        "async",
        "cnn_fashion_mnist",
        "staleness=3",
        "workers=2",
        "--smoke",
        "train.steps=8",
        "optim.warmup_steps=2",
    ]
    assert cli.main([*argv, "--workdir", str(workdir)]) == 0
    record = json.loads((workdir / "async.json").read_text())
    assert (workdir / "async.png").read_bytes()[:8] == PNG
    assert [r["name"] for r in record["runs"]] == ["sync", "async-k3"]
    sync, stale = record["runs"]
    assert [p["updates"] for p in sync["curve"]] == [2, 4, 6, 8]
    assert [p["updates"] for p in stale["curve"]] == [4, 8, 12, 16]  # 2 updates per step
    assert stale["staleness"] == 3 and stale["updates_per_step"] == 2
    model = record["model"]
    assert model["t_compute_s"] == pytest.approx(1 / sync["steps_per_s"] / 2)
    assert stale["curve"][-1]["modelled_s"] == pytest.approx(16 * stale["seconds_per_update"])
    assert "async-k3" in capsys.readouterr().out


# ---------------------------------------------------------------------------------------------
# Bad input: one line, exit 2


@pytest.mark.parametrize(
    "args, words",
    [
        (["study", "scaling"], "invalid choice: 'scaling'"),
        (["study", "batch-scaling", "cnn_fashion_mnist", "batch=64,,128"], "comma-separated list"),
        (["study", "batch-scaling", "cnn_fashion_mnist", "batch=64,big"], "'big' is not an integer"),
        (["study", "batch-scaling", "cnn_fashion_mnist", "batch=0,64"], "must be >= 1"),
        (["study", "batch-scaling", "cnn_fashion_mnist", "batch=-64"], "must be >= 1"),
        (["study", "batch-scaling", "cnn_fashion_mnist", "batch=64,64"], "repeated"),
        (["study", "batch-scaling", "cnn_fashion_mnist"], "needs the batch sizes"),
        (["study", "batch-scaling", "cnn_fashion_mnist", "batch=64", "--lr-rule", "cubic"], "--lr-rule 'cubic'"),
        (["study", "batch-scaling", "cnn_fashion_mnist", "batch=64", "--max-examples", "0"], "--max-examples 0"),
        (["study", "batch-scaling", "cnn_fashion_mnist", "batch=64", "--tolerance", "1"], "--tolerance 1"),
        (["study", "batch-scaling", "cnn_fashion_mnist", "batch=64,96", "--eval-examples", "100"], "multiple of"),
        (["study", "batch-scaling", "cnn_fashion_mnist", "batch=64", "optim.lrr=1"], "unknown config key"),
        (["study", "batch-scaling", "no_such_experiment", "batch=64"], "unknown experiment"),
        (["study", "async", "cnn_fashion_mnist"], "needs the staleness values"),
        (["study", "async", "cnn_fashion_mnist", "staleness=0,1", "workers=0"], "must be >= 1"),
        (["study", "async", "cnn_fashion_mnist", "staleness=-1"], "must be >= 0"),
        (["study", "devices", "--results", "/no/such/dir"], "is not a directory"),
        (["study", "devices", "batch=64"], "unrecognized arguments"),
    ],
)
def test_bad_study_input_is_one_line_and_exit_2(args, words, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert cli.main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("jaxnet: error: "), err
    assert words in err
    assert not (tmp_path / "runs").exists()  # nothing was created

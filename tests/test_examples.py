"""The shipped examples end to end: a user's model on their arrays from Python, and an experiment
file with its own model, data, loss, metric and action through the jaxnet command: exact resume,
an 8-device mesh, and the docs showing the very files the tests run."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import docblocks
import jax
import numpy as np
import pytest
from conftest import run_patiently

from jaxnet import cli, config, observe
from jaxnet.checkpoint import Checkpoints
from jaxnet.train.loop import Run

pytest.importorskip("sklearn")  # the examples' data; installed by scripts/test with the test extra

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
CUSTOM = str(EXAMPLES / "custom_experiment.py")
TIMINGS = ("steps_per_s", "examples_per_s", "tokens_per_s")


def python(*args: str, cwd: Path, devices: int = 1) -> subprocess.CompletedProcess:
    from conftest import cpu_env

    return run_patiently(
        [sys.executable, *args], cwd=cwd, env=cpu_env(devices), capture_output=True, text=True, timeout=300
    )


def test_regression_example_prints_test_metrics_consistent_with_its_data(tmp_path):
    result = python(str(EXAMPLES / "regression_diabetes.py"), "--workdir", "run", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    printed = ast.literal_eval(result.stdout.strip().splitlines()[-1])
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert set(printed) == {"loss", "mse", "mae", "r2"} and printed["r2"] == round(summary["test"]["r2"], 4)
    sys.path.insert(0, str(EXAMPLES))
    try:
        from regression_diabetes import diabetes_splits
    finally:
        sys.path.remove(str(EXAMPLES))
    y = diabetes_splits()["test"]["y"].astype(np.float64)
    np.testing.assert_allclose(summary["test"]["r2"], 1 - summary["test"]["mse"] / y.var(), rtol=1e-5)
    assert summary["test"]["r2"] > 0.2  # a least-squares linear fit reaches 0.31 on this split; a constant, 0
    for name in ("config.json", "metrics.jsonl", "curves.png", "checkpoints", "tb"):
        assert (tmp_path / "run" / name).exists(), name
    again = python(str(EXAMPLES / "regression_diabetes.py"), "--workdir", "run", cwd=tmp_path)
    assert "already complete" in again.stdout  # rerunning the command resumes, here at the end


def final_params(workdir: Path, spec: str):
    run = Run(config.load_experiment(spec))
    ckpts = Checkpoints(workdir / "checkpoints", read_only=True)
    try:
        return ckpts.restore(run.abstract_state()).params
    finally:
        ckpts.close()


def without_timings(workdir: Path) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in TIMINGS} for r in observe.read_metrics(workdir / "metrics.jsonl")]


def test_custom_experiment_stopped_and_resumed_ends_bit_identical(tmp_path, capsys):
    spec = f"{CUSTOM}:smoke"
    quiet = "train.progress=false"
    assert cli.main(["train", spec, quiet, "--workdir", str(tmp_path / "whole")]) == 0
    assert cli.main(["train", spec, quiet, "train.stop_after=30", "--workdir", str(tmp_path / "parts")]) == 0
    assert "stopped at step 30 of 60" in capsys.readouterr().out
    assert cli.main(["train", spec, quiet, "--workdir", str(tmp_path / "parts")]) == 0
    assert "resuming" in capsys.readouterr().out
    whole, parts = (json.loads((tmp_path / d / "summary.json").read_text()) for d in ("whole", "parts"))
    assert parts["test"] == whole["test"] and whole["test"]["accuracy"] > 0.8  # 60 steps on real digits
    assert set(whole["test"]) == {"loss", "accuracy", "top2"} and whole["task"] == "focal_digits"
    assert without_timings(tmp_path / "parts") == without_timings(tmp_path / "whole")
    norms = [r["step"] for r in observe.read_metrics(tmp_path / "whole" / "metrics.jsonl") if "param_norm" in r]
    assert norms == [20, 40, 60]  # the file's own action
    a, b = final_params(tmp_path / "whole", spec), final_params(tmp_path / "parts", spec)
    assert all(np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True))
    capsys.readouterr()
    assert cli.main(["eval", "--workdir", str(tmp_path / "whole")]) == 0  # finds the file's model, data and task again
    evaluated = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert {k: evaluated[k] for k in whole["test"]} == whole["test"]
    saved = json.loads((tmp_path / "whole" / "config.json").read_text())
    assert saved["model"] == {
        "name": "residual_mlp",
        "dtype": "auto",
        "param_dtype": "float32",
        "hidden": 128,
        "blocks": 2,
        "dropout": 0.1,
    }  # the file's own model keys, and no others


def test_custom_experiment_trains_on_an_8_device_mesh_with_sharded_weights(tmp_path):
    result = python(
        "-m",
        "jaxnet",
        "train",
        f"{CUSTOM}:smoke",
        "mesh.data=1",
        "mesh.fsdp=8",
        "model.hidden=256",
        "train.progress=false",
        "--workdir",
        "run",
        cwd=tmp_path,
        devices=8,
    )
    assert result.returncode == 0, result.stderr
    assert "mesh data=1 x fsdp=8 x expert=1 x context=1 x tensor=1 (8 cpu device(s))" in result.stdout
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["environment"]["device_count"] == 8 and summary["test"]["accuracy"] > 0.8
    # every weight matrix is split 8 ways along its embed axis: a device holds about 1/8 of them
    line = next(line for line in result.stdout.splitlines() if line.startswith("mesh data=1 x fsdp=8"))
    per_device, whole = line.split("per device ")[1].split(" of parameters")[0], line.split("unsharded: ")[1]
    assert per_device.endswith("KiB") and float(per_device.split()[0]) < 200  # of 1.2 MiB of parameters
    assert "MiB" in whole


def test_docs_show_the_example_files_the_tests_run():
    shown = {b.arg: b.code for b in docblocks.all_blocks() if b.kind == "file"}
    run = {"examples/regression_diabetes.py", "examples/custom_experiment.py"}
    assert set(shown) == run | {"scripts/slurm/train.sbatch"}  # tests/test_cluster.py submits it to Slurm
    for name, text in shown.items():
        assert text == (ROOT / name).read_text(), f"the docs' copy of {name} differs from the file"


FINETUNE = "examples/finetune_fashion_mnist.py"
FROZEN, SCRATCH = "init_from, convolutions frozen", "scratch"


@pytest.mark.slow
def test_finetuning_example_keeps_the_convolutions_and_beats_scratch_on_few_labels(tmp_path):
    from conftest import FASHION_MNIST

    if FASHION_MNIST is None:
        pytest.skip("Fashion-MNIST not installed (scripts/test installs it)")
    args = ["--workdir", "runs", "--labels", "10,100", "--seeds", "0", "--results", "r.json"]
    result = python(str(ROOT / FINETUNE), *args, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    means = json.loads((tmp_path / "r.json").read_text())["mean_test_accuracy"]
    assert means["10"][FROZEN] > means["10"][SCRATCH] and means["100"][FROZEN] > means["100"][SCRATCH]
    import jaxnet

    source = jaxnet.load_params(tmp_path / "runs" / "source")
    frozen = jaxnet.load_params(tmp_path / "runs" / "init_from-convolutions_frozen-100-seed0")
    for layer in ("Conv_0", "Conv_1"):
        np.testing.assert_array_equal(frozen[layer]["kernel"], source[layer]["kernel"])
    assert not np.array_equal(frozen["Dense_0"]["kernel"], source["Dense_0"]["kernel"])


def test_finetuning_page_figures_are_those_of_the_newest_committed_results():
    newest = sorted((ROOT / "benchmarks" / "results").glob("finetune-fashion_mnist-*.json"))[-1]
    figures = json.loads(newest.read_text())
    readme = (ROOT / "docs" / "fine-tuning.md").read_text()
    assert newest.name in readme
    for labels, means in figures["mean_test_accuracy"].items():
        for name, mean in means.items():
            seeds = ", ".join(f"{a:.3f}" for a in figures["test_accuracy"][labels][name].values())
            assert f"| {labels} | {name} | {mean:.3f} | {seeds} |" in readme, (labels, name)

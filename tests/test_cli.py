"""The jaxnet command end to end on real data, its errors, and the README's library example."""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import FASHION_MNIST, needs_fashion_mnist

from jaxnet import cli, observe

ROOT = Path(__file__).resolve().parents[1]


def jaxnet_command(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    return subprocess.run(
        [sys.executable, "-m", "jaxnet", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


def snapshot(directory: Path) -> dict[str, str]:
    """Content hash of every file under ``directory``."""
    return {
        str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory) -> Path:
    """One real `python -m jaxnet train cnn_fashion_mnist:smoke` run, shared by the tests below."""
    if FASHION_MNIST is None:
        pytest.skip("Fashion-MNIST not installed (scripts/test installs it)")
    workdir = tmp_path_factory.mktemp("cli") / "smoke"
    result = jaxnet_command("train", "cnn_fashion_mnist:smoke", "--workdir", str(workdir), cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert re.search(r"test accuracy 0\.\d+ .* run directory .*smoke", result.stdout)
    return workdir


@needs_fashion_mnist
def test_smoke_run_writes_the_run_directory(smoke_run):
    summary = json.loads((smoke_run / "summary.json").read_text())
    assert summary["complete"] and summary["step"] == 60
    assert summary["test"]["accuracy"] > 0.65  # 60 steps on real Fashion-MNIST; chance is 0.10
    assert summary["param_count"] == 824_458
    assert json.loads((smoke_run / "config.json").read_text())["experiment"] == "cnn_fashion_mnist:smoke"
    records = observe.read_metrics(smoke_run / "metrics.jsonl")
    assert {(r["split"], r["step"]) for r in records if r["split"] != "train"} == {
        ("val", 30),
        ("val", 60),
        ("test", 60),
    }
    assert [r["step"] for r in records if r["split"] == "train"] == [10, 20, 30, 40, 50, 60]
    assert (smoke_run / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.name for p in (smoke_run / "checkpoints").iterdir() if p.name.isdigit()) == ["30", "60"]


@needs_fashion_mnist
def test_eval_reproduces_the_final_test_accuracy(smoke_run):
    result = jaxnet_command("eval", "--workdir", str(smoke_run), cwd=ROOT)
    assert result.returncode == 0, result.stderr
    evaluated = json.loads(result.stdout.strip().splitlines()[-1])
    summary = json.loads((smoke_run / "summary.json").read_text())
    assert evaluated["step"] == 60
    assert evaluated["accuracy"] == summary["test"]["accuracy"]


@needs_fashion_mnist
def test_rerunning_a_finished_run_resumes_instead_of_retraining(smoke_run, tmp_path):
    workdir = tmp_path / "again"
    subprocess.run(["cp", "-r", str(smoke_run), str(workdir)], check=True)
    result = jaxnet_command("train", "cnn_fashion_mnist:smoke", "--workdir", str(workdir), cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert "resuming" in result.stdout and "already complete" in result.stdout
    assert "step 10/60" not in result.stdout
    assert snapshot(workdir) == snapshot(smoke_run)


BAD_INPUT = [
    (["train", "no_such_experiment"], "unknown experiment 'no_such_experiment'"),
    (["train", "cnn_fashion_mnist:huge"], "has no variant 'huge'"),
    (["train", "cnn_fashion_mnist:smoke", "optim.learning_rate=0.1"], "did you mean optim.lr"),
    (["train", "cnn_fashion_mnist:smoke", "train.steps=many"], "expected an integer"),
    (["train", "cnn_fashion_mnist:smoke", "train.batch_size=0"], "must be >= 1"),
    (["train", "cnn_fashion_mnist:smoke", "optim.lr=nan"], "finite"),
    (["train", "cnn_fashion_mnist:smoke", "mesh.data=64"], "needs 64 devices but 1 device(s) are present"),
    (["train", "cnn_fashion_mnist:smoke", "data.dir=/no/such/dir"], "does not exist"),
    (["train", "resnet_cifar10:smoke"], "CIFAR-10 directory (none given) does not exist"),
    (["train", "cnn_fashion_mnist:smoke", "model.hidden=128", "--workdir", "{run}"], "params/Dense_0/bias"),
    (["train", "resnet_cifar10:smoke", "data.dir={cifar}", "--workdir", "{run}"], "holds a run of"),
    (["train", "cnn_fashion_mnist:smoke", "train.steps=30", "--workdir", "{run}"], "past train.steps=30"),
    (["train", "cnn_fashion_mnist:smoke", "--workdir", "{run}/config.json"], "is a file"),
    (["train", "cnn_fashion_mnist:smoke", "--workdir", "{run}/config.json/sub"], "cannot create workdir"),
    (["train", "cnn_fashion_mnist:smoke", "data.dir={bad_magic}"], "is not an IDX file (magic number 08080808)"),
    (["train", "cnn_fashion_mnist:smoke", "data.dir={truncated}"], "the file is truncated or damaged"),
    (["eval", "--workdir", "{run}/tb"], "not a run directory"),
    (
        ["train", "cnn_fashion_mnist:smoke", "optim.name=sgd", "train.steps=90", "--workdir", "{run}"],
        "it has no opt_state",
    ),
    (["train", "cnn_fashion_mnist:smoke", "--workdir", "{foreign}"], "is not a jaxnet run directory"),
    (["train", "cnn_fashion_mnist:smoke", "--workdir", ""], "--workdir must name a run directory"),
    (["train", "cnn_fashion_mnist:smoke", "experiment=other"], "experiment cannot be overridden"),
    (["train", "cnn_fashion_mnist:smoke", "model.dropout=1.5"], "must be <= 0.95"),
    (["train", "cnn_fashion_mnist:smoke", "model.name=resnet"], "one entry per ResNet stage"),
    (["train", "{broken_experiment}"], "broken.py:2: ZeroDivisionError"),
    (["train", "{syntax_experiment}"], "syntax.py:1: SyntaxError"),
    (["eval", "--workdir", "{run}", "data.dir=/no/such/dir"], "does not exist"),
    (["eval", "--workdir", "{foreign}"], "not a run directory"),
    (["train"], "the following arguments are required: experiment"),
    (["fly"], "invalid choice: 'fly'"),
]


@needs_fashion_mnist
@pytest.mark.parametrize("args, message", BAD_INPUT, ids=[" ".join(a) for a, _ in BAD_INPUT])
def test_bad_input_is_one_line_exit_2_and_harms_nothing(smoke_run, tmp_path, capsys, args, message):
    cifar = tmp_path / "cifar"
    write_cifar_batches(cifar, per_batch=40)
    bad_magic, truncated = write_idx_dir(tmp_path / "bad_magic", 50), write_idx_dir(tmp_path / "truncated", 50)
    (bad_magic / "train-images-idx3-ubyte").write_bytes(b"\x08" * 100)
    (truncated / "t10k-labels-idx1-ubyte").write_bytes((truncated / "t10k-labels-idx1-ubyte").read_bytes()[:-3])
    before = snapshot(smoke_run)
    foreign = tmp_path / "notes"
    foreign.mkdir()
    (foreign / "thesis.tex").write_text("precious")
    (tmp_path / "broken.py").write_text("def get_config(variant):\n    return 1 / 0\n")
    (tmp_path / "syntax.py").write_text("def get_config(variant:\n")
    places = dict(
        run=smoke_run,
        cifar=cifar,
        bad_magic=bad_magic,
        truncated=truncated,
        foreign=foreign,
        broken_experiment=tmp_path / "broken.py",
        syntax_experiment=tmp_path / "syntax.py",
    )
    code = cli.main([a.format(**places) for a in args])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1 and err.startswith("jaxnet: error: ")
    assert message in err
    assert snapshot(smoke_run) == before
    assert (foreign / "thesis.tex").read_text() == "precious" and len(list(foreign.iterdir())) == 1


def test_bad_input_through_the_real_entry_point_has_no_traceback(tmp_path):
    result = jaxnet_command("train", "cnn_fashion_mnist:smoke", "train.lr=1", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "jaxnet: error: unknown config key 'train.lr'; did you mean optim.lr or train.log_every or train.eval_every?"
    ]
    assert not (tmp_path / "runs").exists()


def write_idx_dir(directory: Path, n: int) -> Path:
    """Four valid, uncompressed IDX files of ``n`` random 28x28 images each."""
    import struct

    import numpy as np

    directory.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for prefix in ("train", "t10k"):
        images = rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
        labels = rng.integers(0, 10, size=n, dtype=np.uint8)
        (directory / f"{prefix}-images-idx3-ubyte").write_bytes(
            struct.pack(">4B3I", 0, 0, 8, 3, n, 28, 28) + images.tobytes()
        )
        (directory / f"{prefix}-labels-idx1-ubyte").write_bytes(struct.pack(">4BI", 0, 0, 8, 1, n) + labels.tobytes())
    return directory


def write_cifar_batches(directory: Path, per_batch: int) -> None:
    """Files in the exact format of cifar-10-batches-py, with random pixels."""
    import pickle

    import numpy as np

    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        batch = {
            b"data": rng.integers(0, 256, size=(per_batch, 3072), dtype=np.uint8),
            b"labels": rng.integers(0, 10, size=per_batch).tolist(),
        }
        (directory / name).write_bytes(pickle.dumps(batch))


def test_resnet_cifar10_smoke_variant_trains_from_a_pickle_directory(tmp_path):
    write_cifar_batches(tmp_path / "cifar", per_batch=64)
    result = jaxnet_command(
        "train", "resnet_cifar10:smoke", f"data.dir={tmp_path / 'cifar'}", "--workdir", "run", cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["complete"] and summary["step"] == 20
    # random pixels and labels: no accuracy to expect, but all 64 test examples were evaluated
    assert math.isfinite(summary["test"]["loss"]) and (64 * summary["test"]["accuracy"]).is_integer()
    assert summary["wall_time_s"] < 60


@needs_fashion_mnist
def test_readme_library_example_runs(tmp_path):
    readme = (ROOT / "README.md").read_text()
    block = readme.split("<!-- library-example")[1].split("```python\n")[1].split("```")[0]
    result = subprocess.run(
        [sys.executable, "-c", block],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
    )
    assert result.returncode == 0, result.stderr
    accuracy = float(re.search(r"test accuracy (0\.\d+)", result.stdout).group(1))
    assert accuracy > 0.6
    assert (tmp_path / "runs" / "mlp" / "summary.json").is_file()

"""The jaxnet command end to end on real data, its errors, and the docs' quickstart and library example."""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import string
import subprocess
import sys
from pathlib import Path
from typing import Any

import docblocks
import pytest
from conftest import FASHION_MNIST, busy, needs_fashion_mnist, run_patiently

from jaxnet import cli, observe

ROOT = Path(__file__).resolve().parents[1]


def jaxnet_command(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """``python -m jaxnet ARGS`` in ``cwd``, on one CPU device."""
    from conftest import cpu_env

    return run_patiently(
        [sys.executable, "-m", "jaxnet", *args],
        cwd=cwd,
        env=cpu_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )


def snapshot(directory: Path) -> dict[str, str]:
    """Content hash of every file under ``directory``."""
    return {
        str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


# A command on 4 devices runs in one child process that the rows share: the device count is fixed
# when JAX starts, and starting JAX was most of each row's time (about 4 s a row on 2 busy cores).
# The child runs each row as the in-process rows run (``cli.main``), its stderr captured per row.
FOUR_DEVICE_CHILD = r"""
import json, os, sys, tempfile
from jaxnet import cli

replies = os.fdopen(os.dup(1), "w")  # the rows' own stdout goes to /dev/null, the replies here
devnull = os.open(os.devnull, os.O_WRONLY)
os.dup2(devnull, 1)
for line in sys.stdin:
    request = json.loads(line)
    os.chdir(request["cwd"])
    with tempfile.TemporaryFile() as err:
        sys.stdout.flush(); sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(err.fileno(), 2)
        try:
            code = cli.main(request["argv"])
        except SystemExit as exit:
            code = exit.code
        finally:
            sys.stdout.flush(); sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
        err.seek(0)
        replies.write(json.dumps({"code": code, "err": err.read().decode(errors="replace")}) + "\n")
        replies.flush()
"""


@pytest.fixture(scope="module")
def four_devices(tmp_path_factory):
    """``run(argv, cwd) -> (exit code, stderr)``: ``jaxnet ARGV`` on 4 host-platform CPU devices, in
    a child process that every 4-device row of this module shares. A row has 300 s on a quiet
    machine, stretched by the load (:class:`conftest.LoadDeadline`)."""
    import selectors

    from conftest import LoadDeadline, cpu_env

    log = tmp_path_factory.mktemp("four_devices") / "stderr.txt"
    started: list[subprocess.Popen] = []  # the child, once a row asks for it

    def run(argv: list[str], cwd: Path) -> tuple[int, str]:
        if not started:
            with open(log, "w") as stderr:
                started.append(
                    subprocess.Popen(
                        [sys.executable, "-c", FOUR_DEVICE_CHILD],
                        stdin=subprocess.PIPE,
                        stdout=subprocess.PIPE,
                        stderr=stderr,
                        env=cpu_env(4),
                        text=True,
                    )
                )
        child = started[0]
        child.stdin.write(json.dumps({"argv": argv, "cwd": str(cwd)}) + "\n")
        child.stdin.flush()
        waiting = selectors.DefaultSelector()
        waiting.register(child.stdout, selectors.EVENT_READ)
        deadline = LoadDeadline(300)
        while not waiting.select(timeout=5.0):
            assert child.poll() is None, f"the 4-device child died: {log.read_text()[-3000:]}"
            assert not deadline.passed(), f"jaxnet {' '.join(argv)} ran past {deadline.limit():.0f} s on 4 devices"
        reply = child.stdout.readline()
        assert reply, f"the 4-device child died: {log.read_text()[-3000:]}"
        reply = json.loads(reply)
        return reply["code"], reply["err"].strip()

    yield run
    for child in started:
        child.stdin.close()
        child.wait(timeout=60)


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


@needs_fashion_mnist
def test_predict_reproduces_the_test_accuracy_from_a_npy_of_the_test_images(smoke_run, tmp_path, capsys):
    """`jaxnet predict` on the default experiment's run: raw test images in, logits out, and the
    run's own test accuracy (and loss) again, with no training data read (the statistics are in the run)."""
    import numpy as np

    from jaxnet.data import images

    x, y = images.load_idx_dataset(FASHION_MNIST)["test"]
    np.save(tmp_path / "test_images.npy", x)
    out = tmp_path / "logits.npy"
    argv = ["predict", "--workdir", str(smoke_run), "--input", str(tmp_path / "test_images.npy"), "--out", str(out)]
    assert cli.main(argv) == 0
    assert json.loads(capsys.readouterr().out)["shape"] == [10000, 10]
    logits = np.load(out)
    summary = json.loads((smoke_run / "summary.json").read_text())
    assert (logits.argmax(-1) == y).mean() == summary["test"]["accuracy"]  # every example, as evaluation had it
    shifted = logits.astype(np.float64) - logits.max(-1, keepdims=True)
    loss = np.mean(np.log(np.exp(shifted).sum(-1)) - shifted[np.arange(len(y)), y])
    assert loss == pytest.approx(summary["test"]["loss"], rel=1e-5)
    assert cli.main([*argv[:-1], str(tmp_path / "labels.npy"), "--argmax", "--batch-size", "333"]) == 0
    np.testing.assert_array_equal(np.load(tmp_path / "labels.npy"), logits.argmax(-1))


def bad(args: list[str], *message: str, devices: int = 1, marks: Any = ()) -> Any:
    """One row of a bad-input table: a command, the words its one-line error must contain, and how
    many (host-platform CPU) devices it runs on. ``{name}`` in an argument is one of the paths that
    :func:`make_places` prepares."""
    assert message, "a row names the words its error must contain"
    ident = " ".join(args) + (f" [{devices} devices]" if devices > 1 else "")
    return pytest.param(args, message, devices, id=ident, marks=marks)


SMOKE = "cnn_fashion_mnist:smoke"
UNLESS_ROOT = pytest.mark.skipif(os.geteuid() == 0, reason="root reads and writes whatever the permission bits say")

# Malformed commands, configs, data, workdirs and checkpoints. Each must end with exit code 2 and
# one line that names the problem, and change nothing (test below). The language-model rows are
# LM_BAD_INPUT in test_lm_cli.py.
BAD_INPUT = [
    # the command line and the experiment
    bad(["train", "no_such_experiment"], "unknown experiment 'no_such_experiment'"),
    bad(["train", "cnn_fashion_mnst:smoke"], "unknown experiment 'cnn_fashion_mnst'; did you mean cnn_fashion_mnist?"),
    bad(["train", "cnn_fashion_mnist:huge"], "has no variant 'huge'"),
    bad(["train", "{broken_experiment}"], "broken.py:2: ZeroDivisionError"),
    bad(["train", "{syntax_experiment}"], "syntax.py:1: SyntaxError"),
    bad(["train"], "the following arguments are required: experiment"),
    bad(["fly"], "invalid choice: 'fly'"),
    bad(["train", SMOKE, "--bogus"], "unrecognized arguments: --bogus"),
    bad(["plan", SMOKE, "--target", "h900"], "unknown --target 'h900'; known GPU kinds: a100, h100, h200"),
    bad(["plan", SMOKE, "--target", "h100", "--gpus", "0"], "--gpus 0: give a number of GPUs of at least 1"),
    bad(
        ["plan", SMOKE, "--target", "h100", "--gpus", "8", "mesh.data=2", "mesh.fsdp=2"],
        "the mesh data=2 x fsdp=2 x expert=1 x context=1 x tensor=1 uses 4 GPUs but --gpus is 8",
    ),
    bad(["plan", SMOKE], "the following arguments are required: --target"),
    # config keys and values
    bad(
        ["train", SMOKE, "optim.learning_rate=0.1"], "unknown config key 'optim.learning_rate'; did you mean optim.lr?"
    ),
    bad(
        ["train", SMOKE, "mesh.pipeline=2"],
        "unknown mesh axis 'pipeline'",
        "mesh.data, mesh.fsdp, mesh.expert, mesh.context, mesh.tensor",
    ),
    bad(["train", SMOKE, "model.colour=red"], "unknown config key 'model.colour'; the model keys are name, features"),
    bad(["train", SMOKE, "experiment=other"], "experiment cannot be overridden"),
    bad(["train", SMOKE, "optim.lr"], "override 'optim.lr' is not of the form key=value"),
    bad(["train", SMOKE, "train.steps=many"], "train.steps='many': expected an integer"),
    bad(["train", SMOKE, "train.batch_size=1.5"], "train.batch_size='1.5': expected an integer"),
    bad(["train", SMOKE, "optim.lr=fast"], "optim.lr='fast': expected a number"),
    bad(["train", SMOKE, "optim.name=lamb"], "optim.name='lamb' is not one of: adamw, sgd, lion, adafactor"),
    bad(["train", SMOKE, "optim.decay_mask=biases"], "optim.decay_mask='biases' is not one of: auto, matrices, all"),
    bad(
        ["train", SMOKE, "optim.schedule=warmup_cosine", "optim.warmup_steps=0"],
        "optim.schedule=warmup_cosine warms up over optim.warmup_steps, which is 0; set optim.warmup_steps=N",
    ),
    bad(["train", SMOKE, "train.progress=maybe"], "train.progress='maybe': expected true or false"),
    bad(["train", SMOKE, "train.batch_size=0"], "train.batch_size=0 must be >= 1"),
    bad(["train", SMOKE, "train.steps=-5"], "train.steps=-5 must be >= 1"),
    bad(["train", SMOKE, "model.hidden=0"], "model.hidden=0 must be >= 1"),
    bad(
        ["train", SMOKE, "model.width=64"],
        "model.width is not a key of model convnet (it belongs to lstm, transformer)",
    ),
    bad(["train", SMOKE, "model.name=vgg"], "model.name='vgg' is not one of: convnet, resnet, lstm, transformer"),
    bad(["train", SMOKE, "model.features=32,-4"], "model.features=32,-4: every entry must be >= 1"),
    bad(["train", SMOKE, "mesh.data=0"], "mesh.data=0: use a positive device count"),
    bad(["train", SMOKE, "optim.lr=nan"], "optim.lr='nan': expected a finite number"),
    bad(["train", SMOKE, "optim.lr=inf"], "optim.lr='inf': expected a finite number"),
    bad(["train", SMOKE, "optim.lr=-0.001"], "optim.lr=-0.001 must be >= 0.0"),
    bad(["train", SMOKE, "model.dropout=1.5"], "model.dropout=1.5 must be <= 0.95"),
    bad(["train", SMOKE, "train.steps=5"], "optim.warmup_steps=10 exceeds train.steps=5; lower optim.warmup_steps"),
    bad(["train", SMOKE, "model.name=resnet"], "one entry per ResNet stage"),
    bad(
        ["train", SMOKE, "train.keep_best=nope"],
        "train.keep_best: 'nope' is not a validation metric; the validation metrics are val/loss, val/accuracy",
    ),
    bad(["train", SMOKE, "train.keep_best=val/loss", "train.eval_every=0"], "train.eval_every=0 runs none before"),
    # devices: one here; several in a subprocess with --xla_force_host_platform_device_count
    bad(["train", SMOKE, "mesh.data=64"], "needs 64 devices but 1 device(s) are present"),
    bad(["train", SMOKE, "train.batch_size=30"], "train.batch_size=30 is not divisible by the 4 devices", devices=4),
    bad(
        ["train", SMOKE, "optim.grad_accum=4", "train.batch_size=8"],
        "train.batch_size / optim.grad_accum=2 is not divisible by the 4 devices",
        devices=4,
    ),
    bad(
        ["train", SMOKE, "mesh.data=3"],
        "mesh data=3 x fsdp=1 x expert=1 x context=1 x tensor=1 needs 3 devices but 4",
        devices=4,
    ),
    bad(
        ["train", SMOKE, "mesh.data=8"],
        "mesh data=8 x fsdp=1 x expert=1 x context=1 x tensor=1 needs 8 devices but 4",
        devices=4,
    ),
    bad(["train", SMOKE, "mesh.data=3", "mesh.fsdp=-1"], "set to 3 devices do not divide the 4 device(s)", devices=4),
    bad(
        ["train", SMOKE, "mesh.tensor=4", "model.hidden=250"],
        "['Dense_0']['bias'] has a dimension of 250, which the mesh cannot split 4 ways",
        devices=4,
    ),
    # data
    bad(["train", SMOKE, "data.dir=/no/such/dir"], "data directory /no/such/dir does not exist"),
    bad(["train", SMOKE, "data.dir={a_file}"], "notes.txt is a file, not a directory"),
    bad(["train", SMOKE, "data.dir={bad_magic}"], "is not an IDX file (magic number 08080808)"),
    bad(["train", SMOKE, "data.dir={truncated}"], "t10k-labels-idx1-ubyte has 47 bytes", "truncated or damaged"),
    bad(["train", SMOKE, "data.dir={idx_no_test}"], "has no t10k-images-idx3-ubyte(.gz)"),
    bad(["train", SMOKE, "data.val_size=60000"], "data.val_size=60000 leaves no training data"),
    bad(["train", SMOKE, "train.batch_size=100000"], "train.batch_size=100000 is larger than the 55000"),
    bad(["train", "resnet_cifar10:smoke"], "CIFAR-10 directory (none given) does not exist"),
    bad(
        ["train", "resnet_cifar10:smoke", "data.dir={cifar_shape}"],
        "data_batch_3: data has shape (40, 1024) and labels (40,); expected (N, 3072)",
    ),
    bad(["train", "resnet_cifar10:smoke", "data.dir={cifar_list}"], "data_batch_2 is not a CIFAR-10 batch"),
    bad(["train", "resnet_cifar10:smoke", "data.dir={cifar_no_test}"], "has no test_batch"),
    # workdirs and checkpoints
    bad(["train", SMOKE, "--workdir", "{run}/config.json"], "workdir", "config.json is a file"),
    bad(["train", SMOKE, "--workdir", "{run}/config.json/sub"], "cannot create workdir"),
    bad(["train", SMOKE, "--workdir", "{foreign}"], "is not a jaxnet run directory (it has thesis.tex)"),
    bad(["train", SMOKE, "--workdir", ""], "--workdir must name a run directory"),
    bad(
        ["train", "resnet_cifar10:smoke", "data.dir={cifar}", "--workdir", "{run}"],
        "holds a run of 'cnn_fashion_mnist:smoke', not 'resnet_cifar10:smoke'",
        "--adopt",
    ),
    bad(["train", SMOKE, "train.steps=30", "--workdir", "{run}"], "at step 60, past train.steps=30"),
    bad(
        ["train", SMOKE, "model.hidden=128", "--workdir", "{run}"],
        "params/Dense_0/bias has shape (256,) there but (128,) here",
    ),
    bad(["train", SMOKE, "optim.name=sgd", "train.steps=90", "--workdir", "{run}"], "it has no opt_state"),
    # fine-tuning from another run: checked before the new workdir is made
    bad(
        ["train", SMOKE, "train.init_from={run}", "model.hidden=128", "--workdir", "new"],
        "train.init_from=",
        "shapes differ: params/Dense_0/bias (256,) there, (128,) here",
    ),
    bad(["train", SMOKE, "train.init_from={foreign}", "--workdir", "new"], "notes has no checkpoints"),
    bad(["train", SMOKE, "optim.freeze=Conv_9", "--workdir", "new"], "optim.freeze='Conv_9' matches no parameter"),
    bad(["train", SMOKE, "--workdir", "{bad_config}"], "cannot read config", "config.json"),
    bad(["train", SMOKE, "--workdir", "{checkpoints_file}"], "checkpoints: it is a file, not a directory"),
    bad(
        ["eval", "--workdir", "{checkpoints_file}"],
        "checkpoints: it is a file, not a directory",
    ),
    bad(
        ["train", SMOKE, "--workdir", "{checkpoints_locked}"],
        "checkpoint directory",
        "checkpoints_locked/checkpoints: Permission denied",
        marks=UNLESS_ROOT,
    ),
    bad(["eval", "--workdir", "{run}/tb"], "not a run directory"),
    bad(["eval", "--workdir", "{foreign}"], "not a run directory"),
    bad(["eval", "--workdir", "{run}", "data.dir=/no/such/dir"], "does not exist"),
    bad(["eval", "--workdir", "{run}", "--step", "best"], "has no best checkpoint: train with train.keep_best"),
    bad(["eval", "--workdir", "{run}", "--step", "45"], "there is no checkpoint step 45", "(steps there: 30, 60)"),
    bad(["eval", "--workdir", "{run}", "--step", "bst"], "'bst' is not a checkpoint step: give a step number or best"),
    bad(["sample", "--workdir", "{run}"], "trained a convnet, not a language model"),
    bad(
        ["eval", "--workdir", "{run}", "model.hidden=128"],
        "does not fit this run",
        "pass that model, e.g. jaxnet.evaluate",
    ),
    bad(
        ["eval", "--workdir", "{own_model_run}"],
        "trained from Python with your own model MyCNN (module mine)",
        "jaxnet.evaluate(workdir, model=..., dataset=..., task=...)",
    ),
    # jaxnet predict: the run, the input file, where the outputs go
    bad(["predict", "--workdir", "{foreign}", "--input", "{images}", "--out", "o.npy"], "not a run directory"),
    bad(["predict", "--workdir", "{run}", "--input", "no.npy", "--out", "o.npy"], "--input no.npy does not exist"),
    bad(["predict", "--workdir", "{run}", "--input", "{a_file}", "--out", "o.npy"], "cannot read --input", ".npy"),
    bad(
        ["predict", "--workdir", "{run}", "--input", "{images_2d}", "--out", "o.npy"],
        "input 'image' has shape (3, 28, 28); the run was trained on uint8 (N, 28, 28, 1)",
    ),
    bad(
        ["predict", "--workdir", "{run}", "--input", "{images_float}", "--out", "o.npy"],
        "input 'image' is float32 (floating-point) but the run was trained on uint8",
        "jaxnet predict: --cast",
    ),
    bad(["predict", "--workdir", "{run}", "--input", "{images}", "--out", "no/o.npy"], "directory no does not exist"),
    bad(
        ["predict", "--workdir", "{run}", "--input", "{images}", "--out", "o.npy", "--step", "7"],
        "no checkpoint step 7",
    ),
    bad(
        ["predict", "--workdir", "{run}", "--input", "{images}", "--out", "o.npy", "--step", "best"],
        "has no best checkpoint: train with train.keep_best=METRIC",
    ),
    bad(
        ["predict", "--workdir", "{own_model_run}", "--input", "{images}", "--out", "o.npy"],
        "your own model MyCNN (module mine)",
        "jaxnet.load(workdir, model=...)",
    ),
    bad(["predict", "--workdir", "{run}", "--input", "{images}"], "the following arguments are required: --out"),
    # a user's own model, data and task (tests/test_library.py has the same through the Python API)
    bad(["train", SMOKE, "task=nope"], "unknown task 'nope'", "define task(cfg) in the experiment file"),
    bad(["train", SMOKE, "task=lm"], "task=lm does not fit image data", "use task=classification"),
    bad(["train", "{custom}:smoke", "model.hiden=64"], "unknown config key 'model.hiden'; did you mean model.hidden?"),
    bad(["train", "{custom}:smoke", "model.hidden=wide"], "model.hidden='wide': expected an integer"),
    bad(["train", "{custom}:smoke", "model.hidden=4"], "model.hidden=4 must be >= 8"),
    bad(["train", "{custom}:smoke", "train.batch_size=30"], "train.batch_size=30 is not divisible by the 4", devices=4),
    bad(["train", "{user_model_raises}"], "model Exploding failed on a batch of (x float32[1, 4]", "no weights here"),
    bad(["train", "{user_loss_vector}"], "the loss returns shape (2,), not a scalar", "jnp.mean"),
    bad(["train", "{user_metrics_list}"], "Task metrics must be a dict of name -> metric(outputs, batch) -> scalar"),
    bad(["train", "{user_data_lengths}"], "train split: arrays of different lengths (x has 8, y has 7)"),
    bad(["train", "{user_no_data}"], "user_no_data.py:", "FileNotFoundError", "measurements.npz"),
    bad(["train", "{user_one_output}"], "labels 'y' run 0..1, but model OneLogit has 1 output", "give the model 2"),
    bad(["train", "{user_negative_labels}"], "labels 'y' run -1..1, but class labels must be 0..N-1"),
    # jaxnet sweep's grid (tests/test_sweep.py has more through the Python API)
    bad(
        ["sweep", SMOKE, "optim.learning_rate=1e-3,2e-3"],
        "unknown config key 'optim.learning_rate'; did you mean optim.lr?",
    ),
    bad(["sweep", SMOKE, "optim.lr=1e-3,fast"], "optim.lr='fast': expected a number"),
    bad(["sweep", SMOKE, "optim.lr="], "optim.lr= has no values"),
    bad(["sweep", SMOKE, "seed=0,1", "seed=2,3"], "seed is given twice; give it once"),
    bad(
        ["sweep", SMOKE, "optim.lr=1,2,3", "seed=0,1,2", "--max-members", "8"],
        "the grid has 9 members, more than --max-members=8",
    ),
    bad(["sweep", SMOKE, "seed=0,1", "model.hidden=16,0"], "model.hidden=0 must be >= 1"),
    bad(["sweep", SMOKE, "seed=0,1", "parallel.sgd=async"], "jaxnet sweep trains synchronous SGD"),
    bad(["sweep", SMOKE, "seed=0,1", "train.keep_best=val/loss"], "train.keep_best is for jaxnet train"),
    bad(["sweep", SMOKE, "seed=0,1", "--members-at-once", "-1"], "--members-at-once=-1"),
    bad(
        ["sweep", SMOKE, "seed=0,1", "--workdir", "{old_sweep}"],
        "old_sweep holds a sweep of another grid (optim.lr=1e-3,2e-3); pass --add",
    ),
]

# An experiment file of a user's own: data(cfg), task(cfg) and model(cfg) beside get_config; {body}
# replaces one of them to make it wrong.
USER_EXPERIMENT = """
import flax.linen as nn
import jax.numpy as jnp
import numpy as np
import jaxnet


def data(cfg):
    x = np.ones((8, 4), np.float32)
    return jaxnet.data.arrays(train={{"x": x, "y": np.ones(8, np.float32)}})


class Linear(nn.Module):
    @nn.compact
    def __call__(self, x, train=False):
        return nn.Dense(2)(x)[:, 0]


def model(cfg):
    return Linear()


def task(cfg):
    return jaxnet.tasks.regression()


def get_config(variant):
    return jaxnet.apply_overrides(jaxnet.Config(), ["data.name=arrays", "train.batch_size=4", "train.steps=2"])

{body}
"""

USER_MISTAKES = {
    "user_model_raises": """
class Exploding(nn.Module):
    @nn.compact
    def __call__(self, x, train=False):
        raise ValueError("no weights here")


def model(cfg):
    return Exploding()
""",
    "user_loss_vector": """
def task(cfg):
    return jaxnet.Task(inputs="x", loss=lambda out, b: jnp.stack([out.mean(), out.max()]))
""",
    "user_metrics_list": """
def task(cfg):
    return jaxnet.Task(inputs="x", loss=lambda out, b: out.mean(), metrics=[lambda out, b: out.mean()])
""",
    "user_data_lengths": """
def data(cfg):
    return jaxnet.data.arrays(train={"x": np.ones((8, 4), np.float32), "y": np.ones(7, np.float32)})
""",
    "user_no_data": """
def data(cfg):
    return np.load("measurements.npz")
""",
    "user_one_output": """
class OneLogit(nn.Module):
    @nn.compact
    def __call__(self, x, train=False):
        return nn.Dense(1)(x)


def model(cfg):
    return OneLogit()


def data(cfg):
    return jaxnet.data.arrays(train={"x": np.ones((8, 4), np.float32), "y": np.arange(8) % 2})


def task(cfg):
    return jaxnet.tasks.classification(inputs="x", target="y")
""",
    "user_negative_labels": """
class ThreeLogits(nn.Module):
    @nn.compact
    def __call__(self, x, train=False):
        return nn.Dense(3)(x)


def model(cfg):
    return ThreeLogits()


def data(cfg):
    return jaxnet.data.arrays(train={"x": np.ones((8, 4), np.float32), "y": np.arange(8) % 3 - 1})


def task(cfg):
    return jaxnet.tasks.classification(inputs="x", target="y")
""",
}


def make_places(tmp_path: Path, run: Path, names: set[str]) -> dict[str, Path]:
    """The inputs the rows name, each made only when asked for: damaged data, damaged copies of a run."""
    import pickle
    import shutil

    import numpy as np

    def copy_of_run(name: str) -> Path:
        return Path(shutil.copytree(run, tmp_path / name))

    def cifar(name: str) -> Path:
        write_cifar_batches(tmp_path / name, per_batch=40)
        return tmp_path / name

    def bad_magic() -> Path:
        directory = write_idx_dir(tmp_path / "bad_magic", 50)
        (directory / "train-images-idx3-ubyte").write_bytes(b"\x08" * 100)
        return directory

    def truncated() -> Path:
        directory = write_idx_dir(tmp_path / "truncated", 50)
        labels = directory / "t10k-labels-idx1-ubyte"
        labels.write_bytes(labels.read_bytes()[:-11])
        return directory

    def idx_no_test() -> Path:
        directory = write_idx_dir(tmp_path / "idx_no_test", 50)
        (directory / "t10k-images-idx3-ubyte").unlink()
        return directory

    def cifar_shape() -> Path:
        directory = cifar("cifar_shape")
        wrong = {b"data": np.zeros((40, 1024), np.uint8), b"labels": [0] * 40}  # one channel, not three
        (directory / "data_batch_3").write_bytes(pickle.dumps(wrong))
        return directory

    def cifar_list() -> Path:
        directory = cifar("cifar_list")
        (directory / "data_batch_2").write_bytes(pickle.dumps([1, 2, 3]))
        return directory

    def cifar_no_test() -> Path:
        directory = cifar("cifar_no_test")
        (directory / "test_batch").unlink()
        return directory

    def a_file() -> Path:
        (tmp_path / "notes.txt").write_text("not a directory\n")
        return tmp_path / "notes.txt"

    def foreign() -> Path:
        (tmp_path / "notes").mkdir()
        (tmp_path / "notes" / "thesis.tex").write_text("precious")
        return tmp_path / "notes"

    def experiment(name: str, code: str) -> Path:
        (tmp_path / "experiments").mkdir(exist_ok=True)
        (tmp_path / "experiments" / name).write_text(code)
        return tmp_path / "experiments" / name

    def bad_config() -> Path:
        directory = copy_of_run("bad_config")
        (directory / "config.json").write_text('{"experiment": "cnn_fashion_mnist:smoke", ')
        return directory

    def checkpoints_file() -> Path:
        directory = copy_of_run("checkpoints_file")
        shutil.rmtree(directory / "checkpoints")
        (directory / "checkpoints").write_text("not a directory\n")
        return directory

    def own_model_run() -> Path:  # as a run of a user's CNN trained from Python on the built-in data records itself
        directory = copy_of_run("own_model_run")
        saved = json.loads((directory / "config.json").read_text())
        saved["_run"]["trained"]["model"] = {"class": "MyCNN", "module": "mine", "from": "python"}
        (directory / "config.json").write_text(json.dumps(saved))
        return directory

    def npy(name: str, array: Any) -> Path:
        np.save(tmp_path / f"{name}.npy", array)
        return tmp_path / f"{name}.npy"

    def old_sweep() -> Path:  # what jaxnet sweep reads first of a sweep it finds there
        (tmp_path / "old_sweep").mkdir()
        members = [{"name": "optim.lr=1e-3"}, {"name": "optim.lr=2e-3"}]
        record = {"members": members, "keys": {"optim.lr": ["1e-3", "2e-3"]}}
        (tmp_path / "old_sweep" / "sweep.json").write_text(json.dumps(record))
        return tmp_path / "old_sweep"

    def checkpoints_locked() -> Path:  # the test takes the permissions away once it has read every file
        return copy_of_run("checkpoints_locked")

    makers: dict[str, Any] = dict(
        cifar=lambda: cifar("cifar"),
        cifar_shape=cifar_shape,
        cifar_list=cifar_list,
        cifar_no_test=cifar_no_test,
        bad_magic=bad_magic,
        truncated=truncated,
        idx_no_test=idx_no_test,
        a_file=a_file,
        foreign=foreign,
        broken_experiment=lambda: experiment("broken.py", "def get_config(variant):\n    return 1 / 0\n"),
        syntax_experiment=lambda: experiment("syntax.py", "def get_config(variant:\n"),
        bad_config=bad_config,
        custom=lambda: ROOT / "examples" / "custom_experiment.py",
        **{
            name: (lambda name=name, body=body: experiment(f"{name}.py", USER_EXPERIMENT.format(body=body)))
            for name, body in USER_MISTAKES.items()
        },
        checkpoints_file=checkpoints_file,
        checkpoints_locked=checkpoints_locked,
        own_model_run=own_model_run,
        images=lambda: npy("images", np.zeros((3, 28, 28, 1), np.uint8)),
        images_2d=lambda: npy("images_2d", np.zeros((3, 28, 28), np.uint8)),
        images_float=lambda: npy("images_float", np.zeros((3, 28, 28, 1), np.float32)),
        old_sweep=old_sweep,
    )
    return {"run": run, **{name: makers[name]() for name in names if name in makers}}


def placeholders(args: list[str]) -> set[str]:
    """The ``{name}`` fields of ``args``."""
    return {name for a in args for _, name, _, _ in string.Formatter().parse(a) if name}


def tree(directory: Path) -> dict[str, str]:
    """Every file (by content hash) and folder under ``directory``."""
    return {
        str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "folder"
        for p in sorted(directory.rglob("*"))
        if "__pycache__" not in p.parts  # Python's own cache of the experiment files it imported
    }


@needs_fashion_mnist
@pytest.mark.parametrize("args, message, devices", BAD_INPUT)
def test_bad_input_is_one_line_exit_2_and_harms_nothing(
    smoke_run, four_devices, tmp_path, capsys, monkeypatch, args, message, devices
):
    """Each row exits with 2 and one line that names the problem, without a traceback, and leaves
    every file as it was: the real run it points at, the inputs it read, and the working directory,
    where no run directory appears."""
    places = make_places(tmp_path, smoke_run, placeholders(args))
    argv = [a.format(**places) for a in args]
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    before, before_all = snapshot(smoke_run), tree(tmp_path)
    locked = places["checkpoints_locked"] / "checkpoints" if "checkpoints_locked" in places else None
    if locked is not None:
        locked.chmod(0)
    try:
        if devices == 1:
            monkeypatch.chdir(cwd)
            code = cli.main(argv)
            err = capsys.readouterr().err.strip()
        else:  # the devices are fixed when JAX starts: another process
            assert devices == 4, "rows on more devices than 1 run on 4"
            code, err = four_devices(argv, cwd)
    finally:
        if locked is not None:
            locked.chmod(0o755)
    assert code == 2, err
    assert len(err.splitlines()) == 1 and err.startswith("jaxnet: error: ") and "Traceback" not in err, err
    for words in message:
        assert words in err
    assert snapshot(smoke_run) == before
    assert tree(tmp_path) == before_all


def test_bad_input_through_the_real_entry_point_has_no_traceback(tmp_path):
    result = jaxnet_command("train", "cnn_fashion_mnist:smoke", "train.lr=1", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "jaxnet: error: unknown config key 'train.lr'; did you mean optim.lr?"
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
    before = busy()
    result = jaxnet_command(
        "train", "resnet_cifar10:smoke", f"data.dir={tmp_path / 'cifar'}", "--workdir", "run", cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["complete"] and summary["step"] == 20
    # random pixels and labels: no accuracy to expect, but all 64 test examples were evaluated
    assert math.isfinite(summary["test"]["loss"]) and (64 * summary["test"]["accuracy"]).is_integer()
    # a smoke variant's promise: under 60 s on a quiet 2-core CPU, longer in proportion when others use the cores
    assert summary["wall_time_s"] < 60 * max(before, busy())


def run_block(block: str, cwd: Path) -> subprocess.CompletedProcess:
    result = run_patiently(
        [sys.executable, "-c", block],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
    )
    assert result.returncode == 0, result.stderr
    return result


@needs_fashion_mnist
def test_docs_library_example_runs(tmp_path):
    result = run_block(docblocks.block("library-example"), tmp_path)
    accuracy = float(re.search(r"test accuracy (0\.\d+)", result.stdout).group(1))
    assert accuracy > 0.6
    assert (tmp_path / "runs" / "mlp" / "summary.json").is_file()


def test_quickstart_trains_own_arrays_and_predicts(tmp_path):
    """The quickstart (README and Getting started): a user's MLP on a pattern no straight line separates reaches a
    test accuracy a linear model cannot (about 0.5), and the loaded run classifies two points the
    page names by the rule that made the labels."""
    result = run_block(docblocks.block("quickstart"), tmp_path)
    accuracy = float(re.search(r"test accuracy (0\.\d+)", result.stdout).group(1))
    assert accuracy > 0.95
    assert result.stdout.strip().splitlines()[-1] == "[1 0]"
    summary = json.loads((tmp_path / "runs" / "quickstart" / "summary.json").read_text())
    assert summary["complete"] and summary["test"]["accuracy"] == pytest.approx(accuracy, abs=5e-4)
    rerun = run_block(docblocks.block("quickstart"), tmp_path)  # a second run finds the first complete
    assert "complete" in rerun.stdout and rerun.stdout.strip().splitlines()[-1] == "[1 0]"

"""What the command and the runner tell a user: a quick --help and list, and messages that say
what happened (labels the model cannot output, a schedule extended, an empty validation split,
log lines without a progress bar, full metric names, the resolved config)."""

from __future__ import annotations

import json
import math
import re
import shutil
import sys
from pathlib import Path

import flax.linen as nn
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import cpu_env, run_patiently, tiny_config

import jaxnet
from jaxnet import catalog, cli, observe

ROOT = Path(__file__).resolve().parents[1]

HEAVY = ("jax", "jaxlib", "flax", "optax", "orbax", "numpy")

HELP_AND_LIST = f"""
import sys
from jaxnet.cli import main
try:
    main(["--help"])
except SystemExit:
    pass
main(["list"])
print([m for m in {HEAVY!r} if m in sys.modules])
"""


def test_help_and_list_import_no_jax_and_list_each_experiments_result_and_time():
    result = run_patiently(
        [sys.executable, "-c", HELP_AND_LIST], cwd=ROOT, env=cpu_env(), capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert lines[-1] == "[]"  # nothing heavy was imported
    assert "usage: jaxnet" in result.stdout
    at = next(i for i, line in enumerate(lines) if line.startswith("cnn_fashion_mnist "))
    assert lines[at].split(None, 1)[1] == "A small ConvNet on Fashion-MNIST: the default experiment."
    assert lines[at + 1].split()[:4] == ["result:", "92.13", "%", "test"]
    assert lines[at + 2].split()[:3] == ["time:", "50", "s"]


IMPORT_ONLY = """
import os, sys
import jaxnet
print(json.dumps({"jax": "jax" in sys.modules, "threads": os.environ.get("PJRT_NPROC")}))
cfg = jaxnet.Config()
print(json.dumps({"jax": "jax" in sys.modules, "config": type(cfg).__name__, "train": "train" in dir(jaxnet)}))
from jaxnet.sweep import expand  # binds the submodule jaxnet.sweep: the function keeps the name
import jaxnet.train.loop
print(json.dumps({"functions": [callable(f) for f in (jaxnet.sweep, jaxnet.train, jaxnet.sample)]}))
try:
    jaxnet.trian
except AttributeError as e:
    print(json.dumps({"error": str(e)}))
"""


def test_import_jaxnet_loads_jax_only_when_needed_and_still_sizes_the_cpu_client():
    env = {**cpu_env(8), "NPROC": "2"}
    env.pop("PJRT_NPROC", None)
    result = run_patiently(
        [sys.executable, "-c", "import json\n" + IMPORT_ONLY],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    first, second, functions, third = (json.loads(line) for line in result.stdout.strip().splitlines())
    assert first == {"jax": False, "threads": "16"}  # 8 simulated devices, twice the threads, before JAX
    assert second == {"jax": True, "config": "Config", "train": True}
    assert functions == {"functions": [True, True, True]}
    assert third == {"error": "module 'jaxnet' has no attribute 'trian'"}


DOCSTRING = """My experiment: a tiny MLP
on my arrays.

Command:  jaxnet train mine
Result:   0.91 accuracy; 0.88 with
          half the steps (see benchmarks/results/mine.json)
Time:     12 s on a laptop

More text.
"""


def test_an_experiment_docstring_gives_description_result_and_time():
    about = catalog.fields(DOCSTRING)
    assert about["description"] == "My experiment: a tiny MLP on my arrays."
    assert about["result"] == "0.91 accuracy; 0.88 with half the steps (see benchmarks/results/mine.json)"
    assert about["time"] == "12 s on a laptop"
    assert catalog.one_line(about["result"]) == "0.91 accuracy; 0.88 with half the steps"
    assert catalog.one_line(about["result"], width=30) == "0.91 accuracy"
    assert catalog.one_line("a (b; c, d) e, f", width=12) == "a"  # never inside the parenthesis
    assert catalog.one_line("x" * 20, width=10) == "xxxxxxx..."


def test_every_shipped_experiment_has_a_one_line_description_result_and_time():
    for name, path in catalog.experiment_files().items():
        if path.parent != ROOT / "experiments":
            continue
        about = catalog.summary(path)
        assert about.get("description") and about.get("result") and about.get("time"), name


class ThreeLogits(nn.Module):
    @nn.compact
    def __call__(self, x, train=False):
        return nn.Dense(3)(x.reshape(x.shape[0], -1))


def test_labels_beyond_the_models_outputs_stop_before_the_first_step(quadrants, tmp_path):
    """Four classes (0..3) and a model of three outputs: one line naming both, and no run directory."""
    with pytest.raises(jaxnet.UserError) as caught:
        jaxnet.train(tiny_config(), tmp_path / "run", model=ThreeLogits(), dataset=quadrants)
    assert str(caught.value).startswith(
        "labels 'label' run 0..3, but model ThreeLogits has 3 outputs (float32[1, 3]); task 'classification' needs "
        "one output per class: give the model 4 outputs"
    )
    assert not (tmp_path / "run").exists()


def test_label_range_reads_integer_arrays_only():
    data = jaxnet.data.arrays(
        train={"x": np.zeros((4, 2), np.float32), "y": np.array([2, 0, 1, 2]), "t": np.ones(4, np.float32)},
        val={"x": np.zeros((2, 2), np.float32), "y": np.array([5, 1]), "t": np.ones(2, np.float32)},
    )
    assert data.label_range("y") == (0, 5)
    assert data.label_range("t") is None  # float targets are not class labels


class Bits(nn.Module):
    @nn.compact
    def __call__(self, x, train=False):
        return nn.Dense(2)(x)


def test_without_a_progress_bar_the_log_lines_still_print_with_full_metric_names(tmp_path, capsys):
    """train.progress=false, arrays without a val split, a metric with a long name."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(32, 2)).astype(np.float32)
    task = jaxnet.Task(
        inputs="x",
        loss=lambda out, b: jnp.mean((out - b["y"]) ** 2),
        metrics={"hamming_accuracy": lambda out, b: jnp.mean((out > 0.5) == (b["y"] > 0.5))},
    )
    data = jaxnet.data.arrays(train={"x": x, "y": (x > 0).astype(np.float32)})
    cfg = jaxnet.apply_overrides(
        jaxnet.Config(experiment="quiet"),
        ["data.name=arrays", "train.steps=4", "train.batch_size=8", "train.log_every=2", "train.progress=false"],
    )
    jaxnet.train(cfg, tmp_path / "run", model=Bits(), dataset=data, task=task)
    lines = capsys.readouterr().out.splitlines()
    notes = [line for line in lines if line.startswith("note: ")]
    assert notes == [
        "note: the validation split is empty, so this run has no validation pass; give jaxnet.data.arrays(...) a "
        "val= split"
    ]
    logged = [line.split()[:5] for line in lines if line.startswith("step ")]
    assert [row[:3] + row[4:] for row in logged] == [
        ["step", "2/4", "loss", "hamming_accuracy"],
        ["step", "4/4", "loss", "hamming_accuracy"],
    ]


def shown_keys(out: str) -> dict[str, str]:
    """The value column of --show-config's key table, by key."""
    table = out.partition("\nkeys:\n")[2].splitlines()
    return {line[:24].strip(): line[42:].split("  ")[0].strip() for line in table}


def test_show_config_shows_the_experiments_values_and_what_auto_settings_become(capsys):
    assert cli.main(["train", "cnn_fashion_mnist:smoke", "optim.lr=0.01", "--show-config"]) == 0
    shown = shown_keys(capsys.readouterr().out)
    assert shown["train.steps"] == "60"  # the smoke variant's, not TrainConfig's 1000
    assert shown["optim.lr"] == "0.01"
    assert shown["optim.warmup_steps"] == "10"
    assert shown["model.dtype"] == "auto -> float32"  # the tests run on a CPU
    assert shown["task"] == "'' -> classification"
    assert shown["mesh.data"] == "-1 -> 1"
    assert shown["train.progress"] == "true"


OWN_EXPERIMENT = """
import flax.linen as nn
import jaxnet


class Wide(nn.Module):
    @nn.compact
    def __call__(self, x, train=False):
        return nn.Dense(10)(x.reshape(x.shape[0], -1))


def model(cfg):
    return Wide()


def get_config(variant):
    return jaxnet.apply_overrides(jaxnet.Config(), ["train.steps=7"])
"""


def test_show_config_names_the_keys_an_experiment_files_functions_replace(tmp_path, capsys):
    path = tmp_path / "own.py"
    path.write_text(OWN_EXPERIMENT)
    assert cli.main(["train", str(path), "--show-config"]) == 0
    shown = shown_keys(capsys.readouterr().out)
    assert shown["model.name"] == "convnet -> the experiment file's model(cfg)"
    assert shown["train.steps"] == "7"
    assert shown["data.name"] == "fashion_mnist"


def lrs(workdir: Path) -> dict[int, float]:
    return {r["step"]: r["lr"] for r in observe.read_metrics(workdir / "metrics.jsonl") if r["split"] == "train"}


def cosine(lr: float, step: int, steps: int) -> float:
    """optax's cosine decay to 0 at ``step`` of ``steps`` (an independent reference)."""
    return lr * 0.5 * (1 + math.cos(math.pi * min(step, steps) / steps))


def test_extending_a_completed_cosine_run_says_so_and_restarts_or_continues_its_schedule(quadrants, tmp_path, capsys):
    """12 cosine steps completed, then train.steps=16: by default the schedule begins again over
    the 4 new steps; with optim.extend=continue its final value (0) is held, also across a resume."""
    first = tmp_path / "restart"
    jaxnet.train(tiny_config(), first, dataset=quadrants)
    shutil.copytree(first, tmp_path / "continue")
    capsys.readouterr()

    jaxnet.train(tiny_config(train={"steps": 16}), first, dataset=quadrants)
    notes = [line for line in capsys.readouterr().out.splitlines() if line.startswith("warning: ")]
    assert notes == [
        "warning: train.steps 12 -> 16 extends a completed run whose cosine schedule ended at step 12; its learning "
        "rate begins again over the 4 new steps (optim.extend=continue holds its final value)"
    ]
    logged = lrs(first)
    for step in (2, 12):  # the completed run's own schedule, untouched
        assert logged[step] == pytest.approx(cosine(1e-2, step - 1, 12), rel=1e-5, abs=1e-9)  # float32
    for step in (14, 16):  # schedule step s uses the rate at s - 1; the new segment counts from 12
        assert logged[step] == pytest.approx(cosine(1e-2, step - 1 - 12, 4), rel=1e-5, abs=1e-9)  # float32
    assert json.loads((first / "config.json").read_text())["optim"]["extended_at"] == 12

    second = tmp_path / "continue"
    extend = {"steps": 16, "stop_after": 2}
    jaxnet.train(tiny_config(train=extend, optim={"extend": "continue"}), second, dataset=quadrants)
    assert "holds its final value 0 (optim.extend=restart begins it again)" in capsys.readouterr().out
    jaxnet.train(tiny_config(train={"steps": 16}, optim={"extend": "continue"}), second, dataset=quadrants)
    resumed = capsys.readouterr().out
    assert "warning: " not in resumed and "extended_at" not in resumed  # carried over, not a change
    assert lrs(second)[14] == lrs(second)[16] == 0.0
    assert json.loads((second / "summary.json").read_text())["complete"]


def test_an_extension_changes_nothing_before_it_and_nothing_for_a_run_never_extended():
    from jaxnet import optim
    from jaxnet.config import OptimConfig

    plain = OptimConfig(lr=1.0, warmup_steps=2)
    extended = OptimConfig(lr=1.0, warmup_steps=2, extended_at=6)
    steps = range(10)
    assert [float(optim.extended_schedule(plain, 10)(t)) for t in steps] == [
        float(optim.schedule(plain, 10)(t)) for t in steps
    ]
    assert [float(optim.extended_schedule(extended, 10)(t)) for t in range(6)] == [
        float(optim.schedule(plain, 6)(t)) for t in range(6)
    ]
    # restart: warmup (0.5, 1.0) and a cosine over the 2 steps left after it, from step 6 on
    after = [float(optim.extended_schedule(extended, 10)(t)) for t in range(6, 10)]
    assert after == pytest.approx([0.5, 1.0, 1.0, 0.5], rel=1e-6)


def short() -> jaxnet.Config:
    return tiny_config(train={"steps": 4, "eval_every": 0, "checkpoint_every": 0})


def test_a_sweep_of_another_grid_is_refused_unless_added_and_then_trains_only_new_members(quadrants, tmp_path):
    """Learning rates 0.01 and 0.03 (seed 0), then seeds 0 and 1 at 0.01: refused without add;
    with add only seed 1 trains (seed 0 at 0.01 is the old member "optim.lr=0.01"), and the table
    has both grids' members."""
    root = tmp_path / "s"
    jaxnet.sweep(short(), {"optim.lr": [0.01, 0.03]}, root, dataset=quadrants)
    before = {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}
    again = {"seed": [0, 1], "optim.lr": [0.01]}  # one value: a plain override
    with pytest.raises(jaxnet.UserError, match=r"holds a sweep of another grid \(optim.lr=0.01,0.03\); pass --add"):
        jaxnet.sweep(short(), again, root, dataset=quadrants)
    assert {p: p.read_bytes() for p in root.rglob("*") if p.is_file()} == before

    said = []
    record = jaxnet.sweep(short(), again, root, dataset=quadrants, add=True, say=said.append)
    assert [m["name"] for m in record["members"]] == ["optim.lr=0.01", "seed=1", "optim.lr=0.03"]
    assert [m["values"] for m in record["members"]] == [
        {"optim.lr": 0.01, "seed": 0},
        {"optim.lr": 0.01, "seed": 1},
        {"optim.lr": 0.03, "seed": 0},
    ]
    assert [line for line in said if line.startswith("program")] == ["program 1 of 1: seed=1"]
    assert not (root / "seed=0").exists()
    old_member = root / "optim.lr=0.01" / "checkpoints"
    assert {p: p.read_bytes() for p in old_member.rglob("*") if p.is_file()} == {
        p: b for p, b in before.items() if old_member in p.parents
    }
    table = (root / "sweep.md").read_text()
    assert "3 members" in table
    assert re.search(r"^\| 0\.01 \| 2 \| ", table, re.M) and re.search(r"^\| 0\.03 \| 1 \| ", table, re.M)

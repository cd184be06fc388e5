"""train.keep_best and jaxnet.early_stop: the best checkpoint outlives the newest-N rotation, an
early stop ends the run complete and evaluated on that checkpoint, and a resumed run keeps its best."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import signal
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
from conftest import MLP, arrays_config, linear_data

import jaxnet
from jaxnet import observe
from jaxnet.checkpoint import best_step
from jaxnet.train.best import direction


def halved(split: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {"x": split["x"], "y": 0.5 * split["y"]}


# The model learns y = x @ w from the training split, but the validation and test targets are half
# of that: their loss falls while the model's slope climbs towards one half, then rises again as it
# goes on to one. A U-shaped validation curve, the same on every run.
DATA = {"train": linear_data(256, 0), "val": halved(linear_data(64, 1)), "test": halved(linear_data(64, 2))}
SETTINGS = [
    "optim.lr=1e-2",
    "optim.schedule=constant",
    "optim.warmup_steps=0",
    "train.steps=200",
    "train.batch_size=16",
    "train.eval_batch_size=64",
    "train.log_every=5",
    "train.eval_every=5",
    "train.checkpoint_every=5",
    "train.keep_checkpoints=2",
]
PATIENCE = 3


def train(workdir: Path, *overrides: str, actions: list | None = None, stop: bool = True) -> tuple[dict, str]:
    """Train the MLP on :data:`DATA` (with early stopping on val/loss unless not ``stop``); the
    summary and what the run printed."""
    cfg = arrays_config("best", SETTINGS, *overrides)
    if stop:
        actions = [*(actions or []), jaxnet.early_stop("val/loss", patience=PATIENCE)]
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        summary = jaxnet.train(
            cfg,
            workdir,
            model=MLP(),
            dataset=jaxnet.data.arrays(**DATA),
            task=jaxnet.tasks.regression(),
            actions=actions,
        )
    return summary, printed.getvalue()


def val_losses(workdir: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in observe.read_metrics(workdir / "metrics.jsonl") if r["split"] == "val"}


def steps_on_disk(workdir: Path) -> list[int]:
    return sorted(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())


def test_mse(params: dict, split: dict[str, np.ndarray]) -> float:
    """The mean squared error of the MLP with ``params`` on ``split``, computed here in float64."""
    out = np.asarray(MLP().apply({"params": params}, split["x"]), np.float64)
    return float(np.mean((out - split["y"].astype(np.float64)) ** 2))


test_mse.__test__ = False  # a helper, not a test


@pytest.fixture(scope="module")
def stopped(tmp_path_factory) -> tuple[Path, dict, str]:
    """One run stopped early, shared by the tests below (they only read it)."""
    workdir = tmp_path_factory.mktemp("best") / "run"
    summary, printed = train(workdir)
    return workdir, summary, printed


def test_early_stop_ends_the_run_complete_and_evaluates_the_best_checkpoint(stopped):
    workdir, summary, printed = stopped
    losses = val_losses(workdir)
    best = min(losses, key=losses.get)
    end = best + PATIENCE * 5
    assert best == 20 and max(losses) == end  # the curve turns at step 20; three passes later it stops
    assert all(losses[s] > losses[best] for s in (25, 30, 35))
    assert summary["complete"] is True and summary["step"] == end and summary["steps_total"] == 200
    assert summary["stopped_early"] == {
        "step": end,
        "best_step": best,
        "metric": "val/loss",
        "value": losses[best],
        "patience": PATIENCE,
        "min_delta": 0.0,
    }
    assert summary["best"] == {"metric": "val/loss", "mode": "min", "step": best, "value": losses[best]}
    assert summary["evaluated_step"] == best
    # The rotation kept the two newest checkpoints, and the best one besides.
    assert steps_on_disk(workdir) == [best, end - 5, end]
    assert best_step(workdir) == best
    assert json.loads((workdir / "checkpoints" / "best.json").read_text())["value"] == losses[best]
    # val and test are those of the best checkpoint, as computed here from its saved parameters.
    params = jaxnet.load_params(workdir, step=best)
    np.testing.assert_allclose(summary["val"]["loss"], test_mse(params, DATA["val"]), rtol=1e-5)
    np.testing.assert_allclose(summary["test"]["mse"], test_mse(params, DATA["test"]), rtol=1e-5)
    assert summary["test"]["mse"] < test_mse(jaxnet.load_params(workdir), DATA["test"])  # the last state is worse
    again = jaxnet.evaluate(
        workdir, "test", model=MLP(), dataset=jaxnet.data.arrays(**DATA), task=jaxnet.tasks.regression(), step="best"
    )
    assert again["step"] == best and {k: again[k] for k in summary["test"]} == summary["test"]
    assert json.loads((workdir / "summary.json").read_text())["stopped_early"]["best_step"] == best
    assert f"stopped early at step {end} of 200: val/loss did not improve for 3 validation passes" in printed
    assert "run the same command again" not in printed


def test_rerunning_a_run_that_stopped_early_trains_no_further(stopped, tmp_path):
    workdir, summary, _ = stopped
    copy = Path(shutil.copytree(workdir, tmp_path / "again"))
    before = {p: p.read_bytes() for p in copy.rglob("*") if p.is_file()}
    again, printed = train(copy)
    assert "already complete" in printed and f"stopped early at step {summary['step']}" in printed
    assert again["test"] == summary["test"] and again["stopped_early"] == summary["stopped_early"]
    assert {p: p.read_bytes() for p in copy.rglob("*") if p.is_file()} == before


def ctrl_c_at(step: int) -> jaxnet.Action:
    """An action that sends this process SIGINT (Ctrl-C) after update ``step``."""
    return jaxnet.every(step, lambda loop: os.kill(os.getpid(), signal.SIGINT) if loop.step == step else None)


@pytest.mark.parametrize("how", ["stop_after", "ctrl_c"])
def test_a_resumed_run_keeps_its_best_so_far(stopped, tmp_path, how):
    """Interrupted after its best (step 20) and before the stop, the run resumes comparing with that
    best, stops where the uninterrupted run stopped, and reports the same numbers."""
    workdir, summary, _ = stopped
    if how == "stop_after":
        first, printed = train(tmp_path / "run", "train.stop_after=25")
        interrupted_at, kept = 25, [20, 25]
    else:  # the signal arrives after step 25's actions: the run stops after the next step
        first, printed = train(tmp_path / "run", actions=[ctrl_c_at(25)])
        interrupted_at, kept = 26, [20, 25, 26]  # the two newest, and the best
    assert first["complete"] is False and first["step"] == interrupted_at and "run the same command again" in printed
    assert steps_on_disk(tmp_path / "run") == kept
    assert best_step(tmp_path / "run") == 20
    resumed, _ = train(tmp_path / "run")
    for key in ("step", "complete", "best", "stopped_early", "evaluated_step"):
        assert resumed[key] == summary[key], key
    np.testing.assert_allclose(resumed["test"]["mse"], summary["test"]["mse"], rtol=1e-6)
    assert steps_on_disk(tmp_path / "run") == steps_on_disk(workdir)


def test_keep_best_alone_keeps_the_best_and_reports_the_last_state(tmp_path):
    """train.keep_best=val/r2 (higher is better) keeps the same checkpoint as the lowest loss; the run
    trains to its last step, whose val and test are the summary's, as in any run."""
    summary, printed = train(tmp_path / "run", "train.steps=40", "train.keep_best=val/r2", stop=False)
    losses = val_losses(tmp_path / "run")
    assert min(losses, key=losses.get) == 20
    assert summary["best"]["step"] == 20 and summary["best"]["mode"] == "max"
    assert summary["complete"] and summary["step"] == 40 and "stopped_early" not in summary
    assert "evaluated_step" not in summary
    assert steps_on_disk(tmp_path / "run") == [20, 35, 40]
    np.testing.assert_allclose(
        summary["test"]["mse"], test_mse(jaxnet.load_params(tmp_path / "run"), DATA["test"]), rtol=1e-5
    )
    assert f"best val/r2 {summary['best']['value']:.4g} at step 20 (checkpoint kept)" in printed


EXPERIMENT = """
import jaxnet
from conftest import MLP, arrays_config
from test_best import DATA, SETTINGS


def model(cfg):
    return MLP()


def data(cfg):
    return jaxnet.data.arrays(**DATA)


def task(cfg):
    return jaxnet.tasks.regression()


def actions(cfg):
    return [jaxnet.early_stop("min:val/mse", patience=2)]


def get_config(variant):
    return arrays_config("", SETTINGS)
"""


def test_an_experiment_files_actions_stop_early(tmp_path):
    path = tmp_path / "stopping.py"
    path.write_text(EXPERIMENT)
    with contextlib.redirect_stdout(io.StringIO()):
        summary = jaxnet.train(jaxnet.load_experiment(str(path)), tmp_path / "run")
    assert summary["stopped_early"]["step"] == 30 and summary["stopped_early"]["best_step"] == 20
    assert summary["best"]["metric"] == "val/mse" and summary["complete"]


@pytest.mark.parametrize(
    "name, mode",
    [
        ("val/loss", "min"),
        ("val/perplexity", "min"),
        ("val/bits_per_byte", "min"),
        ("val/hamming_loss", "min"),
        ("val/accuracy", "max"),
        ("val/top2", "max"),
        ("val/f1", "max"),
        ("val/r2", "max"),
        ("val/hamming", None),
        ("val/loss_accuracy_gap", None),
    ],
)
def test_the_name_of_a_metric_says_which_way_is_better(name, mode):
    assert direction(name) == mode


NO_VAL = {"train": DATA["train"], "test": DATA["test"]}
WITH_HAMMING = jaxnet.Task(
    inputs="x",
    loss=lambda out, b: jnp.mean((out - b["y"]) ** 2),
    metrics={"hamming": lambda out, b: jnp.mean(jnp.abs(out - b["y"]) > 0.5)},
)


@pytest.mark.parametrize(
    "overrides, stops, words",
    [
        (
            ["train.keep_best=nope"],
            [],
            "train.keep_best: 'nope' is not a validation metric; the validation metrics are val/loss, val/mse, "
            "val/mae, val/r2",
        ),
        (["train.keep_best=loss"], [], "did you mean val/loss?"),
        (["train.keep_best=train/loss"], [], "'train/loss' is not a validation metric"),
        (["train.keep_best=val/loss", "train.eval_every=0"], [], "train.eval_every=0 runs none before the end"),
        (["train.keep_best=val/loss"], ["no val"], "the data has no validation split"),
        (["train.keep_best=val/hamming"], ["hamming"], "cannot tell whether a lower or a higher val/hamming is better"),
        (
            ["train.keep_best=val/r2"],
            [{"metric": "val/loss", "patience": 3}],
            "early_stop('val/loss') watches min:val/loss but train.keep_best=val/r2",
        ),
        ([], [{"metric": "val/loss", "patience": 3}, {"metric": "val/r2", "patience": 3}], "2 early_stop actions"),
        ([], [{"metric": "min:val/r2", "patience": 3, "mode": "max"}], "the metric says min: but mode='max'"),
        ([], [{"metric": "val/loss", "patience": 0}], "patience=0): give a number of validation passes >= 1"),
        ([], [{"metric": "val/loss", "patience": 2, "min_delta": -1}], "min_delta=-1): give a number >= 0"),
    ],
)
def test_bad_keep_best_and_early_stop_are_one_line_before_anything_is_written(tmp_path, overrides, stops, words):
    cfg = arrays_config("best", SETTINGS, *overrides)
    data = NO_VAL if "no val" in stops else DATA
    task = WITH_HAMMING if "hamming" in stops else jaxnet.tasks.regression()
    with pytest.raises(jaxnet.UserError) as error:
        actions = [jaxnet.early_stop(**kwargs) for kwargs in stops if isinstance(kwargs, dict)]
        jaxnet.train(cfg, tmp_path / "run", model=MLP(), dataset=jaxnet.data.arrays(**data), task=task, actions=actions)
    assert words in str(error.value) and "\n" not in str(error.value)
    assert not (tmp_path / "run").exists()


def test_a_metric_unknown_until_the_first_validation_pass_is_named_there(tmp_path):
    """A task whose derived metrics cannot be found before evaluating (its finalize divides by the
    target's variance, zero on stand-in values) has the metric checked at the first pass."""

    def ratio(means):
        return {"ratio": means["mse"] / (means["_y2"] - means["_y"] ** 2)}

    task = jaxnet.Task(
        inputs="x",
        loss=lambda out, b: jnp.mean((out - b["y"]) ** 2),
        metrics={
            "mse": lambda out, b: jnp.mean((out - b["y"]) ** 2),
            "_y": lambda out, b: jnp.mean(b["y"]),
            "_y2": lambda out, b: jnp.mean(b["y"] ** 2),
        },
        finalize=ratio,
    )
    cfg = arrays_config("best", SETTINGS, "train.keep_best=min:val/rato")
    with pytest.raises(jaxnet.UserError) as error, contextlib.redirect_stdout(io.StringIO()):
        jaxnet.train(cfg, tmp_path / "run", model=MLP(), dataset=jaxnet.data.arrays(**DATA), task=task)
    assert str(error.value) == (
        "train.keep_best: 'min:val/rato' is not a validation metric; did you mean val/ratio? the validation metrics "
        "are val/loss, val/mse, val/ratio (min: or max: before a name says which way is better)"
    )
    assert list(val_losses(tmp_path / "run")) == [5]  # it stopped at the first pass


def test_a_run_stopped_early_before_its_summary_was_written_is_over_on_rerun(stopped, tmp_path):
    """Killed after the stop's checkpoint but before summary.json: the rerun takes no step, finds
    the patience spent, and writes the summary the run would have written."""
    workdir, summary, _ = stopped
    copy = Path(shutil.copytree(workdir, tmp_path / "again"))
    (copy / "summary.json").unlink()
    again, printed = train(copy)
    assert f"stopped early at step {summary['step']} of 200" in printed
    for key in ("step", "complete", "best", "stopped_early", "evaluated_step", "val", "test"):
        assert again[key] == summary[key], key
    assert "steps_per_s" not in again  # no step was taken
    assert steps_on_disk(copy) == steps_on_disk(workdir)

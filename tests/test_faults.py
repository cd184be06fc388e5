"""Faults injected into real runs: NaN losses, SIGTERM and SIGINT, SIGKILL at random moments
(including in the middle of writing a checkpoint), and what a rerun of the same command makes
of what is left.

The SIGKILL tests are slow (several runs per family) and marked ``slow``: ``scripts/test --all``.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import needs_fashion_mnist, patient, tiny_config
from test_cli import ROOT
from test_lm_cli import needs_ptb, needs_shakespeare

from jaxnet import Dataset, config, observe
from jaxnet.checkpoint import Checkpoints
from jaxnet.errors import UserError
from jaxnet.train.loop import Interrupts, Run, train

TIMINGS = ("steps_per_s", "examples_per_s", "tokens_per_s")


# --- Non-finite losses --------------------------------------------------------------------------


class PoisonableNet(nn.Module):
    """A small classifier whose logits are NaN for any batch holding an image brighter than
    ``threshold`` (after normalisation): a NaN that arrives with the data at a known step."""

    threshold: float

    @nn.compact
    def __call__(self, x: jnp.ndarray, train: bool = False) -> jnp.ndarray:
        logits = nn.Dense(4)(nn.relu(nn.Dense(16)(x.reshape(x.shape[0], -1))))
        return jnp.where(x.max() > self.threshold, jnp.nan, logits)


@pytest.fixture(scope="module")
def poisoned(quadrants) -> tuple[Dataset, PoisonableNet]:
    """The quadrants data with one training image set to 255 everywhere (brighter than any
    other), and the model that turns that image into a NaN loss."""
    x, y = quadrants.train
    x = x.copy()
    x[100] = 255
    data = Dataset(train=(x, y), val=quadrants.val, test=quadrants.test, num_classes=4, name="poisoned")
    threshold = float(((230 / 255 - data.mean) / data.std).max())  # clean pixels stay below 220
    return data, PoisonableNet(threshold)


def poisoned_steps(cfg: config.Config, data: Dataset, model: nn.Module) -> list[int]:
    """The updates (1-based) whose batch holds the poisoned image, read off the loader's batches."""
    run = Run(cfg, model=model, dataset=data)
    batches = run.train_batches(0)
    steps = zip(range(1, cfg.train.steps + 1), batches, strict=False)
    hits = [step for step, batch in steps if batch["image"].max() > model.threshold]
    batches.close()
    return hits


def test_nan_loss_stops_at_the_next_log_with_the_exact_step_and_no_checkpoint_after_it(poisoned, tmp_path):
    data, model = poisoned
    cfg = tiny_config(train={"steps": 16, "log_every": 8, "checkpoint_every": 2, "eval_every": 0})
    bad = poisoned_steps(cfg, data, model)
    assert len(bad) == 1 and bad[0] > 2, bad  # one epoch of 16 steps: the image is in one batch
    with pytest.raises(UserError) as error:
        train(cfg, tmp_path, model=model, dataset=data)
    message = str(error.value)
    last_good = (bad[0] - 1) // 2 * 2
    assert f"NaN or Inf at step {bad[0]}; the newest checkpoint is step {last_good}" in message
    assert "optim.lr" in message and "train.on_nonfinite=skip" in message
    ckpts = Checkpoints(tmp_path / "checkpoints", read_only=True)
    assert max(ckpts.all_steps()) == last_good  # nothing at or after the NaN was saved
    state = ckpts.restore(Run(cfg, model=model, dataset=data).abstract_state())
    ckpts.close()
    assert all(np.isfinite(leaf).all() for leaf in jax.tree.leaves(state.params))
    assert "NaN" not in (tmp_path / "metrics.jsonl").read_text()


def test_skip_rejects_the_update_inside_the_step_and_counts_it(poisoned, tmp_path):
    data, model = poisoned
    cfg = tiny_config(train={"steps": 16, "log_every": 4, "on_nonfinite": "skip"})
    bad = poisoned_steps(cfg, data, model)
    run = Run(cfg, model=model, dataset=data)
    state = run.init_state()
    batches = run.train_batches(0)
    for _ in range(bad[0] - 1):
        state, _ = run.train_step(state, next(batches))
    before = jax.device_get(state)
    after, metrics = jax.device_get(run.train_step(state, next(batches)))
    batches.close()
    assert int(metrics["nonfinite"]) == 1 and int(metrics["first_nonfinite"]) == bad[0]
    assert int(after.step) == bad[0]
    for name in ("params", "opt_state", "model_state"):
        for x, y in zip(jax.tree.leaves(getattr(before, name)), jax.tree.leaves(getattr(after, name)), strict=True):
            np.testing.assert_array_equal(x, y)

    summary = train(cfg, tmp_path, model=model, dataset=data)
    assert summary["complete"] and summary["skipped_updates"] == len(bad) == 1
    records = [r for r in observe.read_metrics(tmp_path / "metrics.jsonl") if r["split"] == "train"]
    assert [r["skipped"] for r in records] == [int(r["step"] - 4 < bad[0] <= r["step"]) for r in records]
    assert all(r["loss"] is not None and np.isfinite(r["loss"]) for r in records)  # averaged over kept updates
    assert np.isfinite(summary["test"]["loss"])


# --- SIGTERM and SIGINT -------------------------------------------------------------------------


def start(args: list[str], cwd: Path) -> subprocess.Popen:
    """``python -m jaxnet ARGS`` in the background, on the CPU, with its output piped."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    return subprocess.Popen(
        [sys.executable, "-m", "jaxnet", *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for_line(process: subprocess.Popen, prefix: str, timeout: float = 240) -> list[str]:
    """Read the process's stdout until a line starts with ``prefix``; returns the lines read."""
    lines, deadline = [], time.monotonic() + patient(timeout)
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            break
        lines.append(line)
        if line.startswith(prefix):
            return lines
    process.kill()
    raise AssertionError(f"no line starting {prefix!r} in {lines} ({process.stderr.read()})")


@needs_fashion_mnist
@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 0), (signal.SIGINT, 130)])
def test_signal_finishes_the_step_checkpoints_and_says_how_to_resume(tmp_path, sig, code):
    args = ["train", "cnn_fashion_mnist:smoke", "train.steps=2000", "--workdir", str(tmp_path / "run")]
    process = start(args, ROOT)
    try:
        wait_for_line(process, "step 20/2000")
        sent = time.monotonic()
        process.send_signal(sig)
        out, err = process.communicate(timeout=patient(60))
        took = time.monotonic() - sent
    finally:
        process.kill()
    assert process.returncode == code, err
    name = signal.Signals(sig).name
    last = out.strip().splitlines()[-1]
    assert last.startswith(f"{name} received: stopped at step ") and "run the same command again to resume" in last
    stopped = int(last.split("stopped at step ")[1].split()[0])
    assert 20 <= stopped < 2000
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["step"] == stopped and summary["interrupted_by"] == name and not summary["complete"]
    assert Checkpoints(tmp_path / "run" / "checkpoints", read_only=True).latest_step() == stopped
    assert observe.read_metrics(tmp_path / "run" / "metrics.jsonl")[-1]["step"] == stopped  # logs flushed
    print(f"{name}: exited {took:.2f} s after the signal")  # the bound the README documents
    assert took < patient(20)  # a busy machine stretches it, in proportion

    # The same command carries on from the checkpoint; what it resumes from does not depend on the
    # signal, so one of the two pays for the second run.
    resumed = start([*args[:2], "train.steps=40", *args[3:]], ROOT) if stopped < 40 and code == 0 else None
    if resumed is not None:
        out, err = resumed.communicate(timeout=patient(240))
        assert resumed.returncode == 0, err
        assert f"resuming {tmp_path / 'run'} from step {stopped}" in out


def test_first_sigint_asks_for_a_clean_stop_a_second_one_stops_at_once_and_handlers_come_back():
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    with Interrupts() as interrupts:
        assert not interrupts.stop_after(1) and interrupts.name is None
        os.kill(os.getpid(), signal.SIGINT)
        assert interrupts.stop_after(2) and interrupts.name == "SIGINT"
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before
    with Interrupts() as interrupts:
        os.kill(os.getpid(), signal.SIGTERM)
        assert interrupts.stop_after(1) and interrupts.name == "SIGTERM"


# --- SIGKILL at random moments ------------------------------------------------------------------

FAMILIES = {
    "cnn": pytest.param("cnn_fashion_mnist:smoke", marks=needs_fashion_mnist),
    "lstm": pytest.param("lstm_ptb_small:smoke", marks=needs_ptb),
    "transformer": pytest.param("transformer_shakespeare:smoke", marks=needs_shakespeare),
}
KILL_OVERRIDES = ["train.steps=120", "train.log_every=10", "train.checkpoint_every=10", "train.eval_every=40"]


def final_state(workdir: Path, experiment: str):
    cfg = config.load_experiment(experiment, KILL_OVERRIDES)
    ckpts = Checkpoints(workdir / "checkpoints", read_only=True)
    try:
        return ckpts.restore(Run(cfg).abstract_state())
    finally:
        ckpts.close()


def metrics_without_timings(workdir: Path) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in TIMINGS} for r in observe.read_metrics(workdir / "metrics.jsonl")]


def kill_when_saving(process: subprocess.Popen, checkpoints: Path, timeout: float) -> bool:
    """SIGKILL ``process`` as soon as a checkpoint is being written (orbax's temporary directory
    exists); False if the process ended first."""
    deadline = time.monotonic() + patient(timeout)
    while process.poll() is None and time.monotonic() < deadline:
        try:
            writing = any("tmp" in entry.name for entry in os.scandir(checkpoints))
        except FileNotFoundError:
            writing = False
        if writing:
            process.kill()
            return True
        time.sleep(0.0005)
    return False


@pytest.mark.slow
@pytest.mark.parametrize("experiment", list(FAMILIES.values()), ids=list(FAMILIES))
def test_sigkill_at_random_moments_then_the_same_command_ends_bit_identical(tmp_path, experiment):
    args = lambda name: ["train", experiment, *KILL_OVERRIDES, "--workdir", str(tmp_path / name)]
    whole = start(args("whole"), ROOT)
    wait_for_line(whole, "step ")  # the first train line: start-up is over
    training_started = time.monotonic()
    _, err = whole.communicate(timeout=patient(600))
    assert whole.returncode == 0, err
    training = time.monotonic() - training_started

    # Once in the middle of writing a checkpoint, then at three random moments of training; each
    # restart resumes, so each kill lands further on (at most 0.3 of the training time each).
    history = []
    process = start(args("killed"), ROOT)
    caught = kill_when_saving(process, tmp_path / "killed" / "checkpoints", timeout=300)
    process.communicate()
    history.append(("in save", caught, Checkpoints(tmp_path / "killed" / "checkpoints", read_only=True).all_steps()))
    seed = int.from_bytes(os.urandom(4), "little")
    rng = random.Random(seed)
    delays = [rng.uniform(0.0, 0.3) * training for _ in range(3)]
    print(f"kills {[round(d, 2) for d in delays]} s after the first train line (of {training:.1f} s; seed {seed})")
    for delay in delays:
        process = start(args("killed"), ROOT)
        wait_for_line(process, "step ")
        try:
            process.wait(timeout=delay)
        except subprocess.TimeoutExpired:
            process.kill()
        process.communicate()
        history.append((delay, Checkpoints(tmp_path / "killed" / "checkpoints", read_only=True).all_steps()))

    final = start(args("killed"), ROOT)
    out, err = final.communicate(timeout=patient(600))
    assert final.returncode == 0, f"{history}\n{err}"
    assert caught, "no checkpoint write was caught in progress"

    whole_state = final_state(tmp_path / "whole", experiment)
    killed_state = final_state(tmp_path / "killed", experiment)
    assert int(whole_state.step) == int(killed_state.step) == 120
    for x, y in zip(jax.tree.leaves(whole_state), jax.tree.leaves(killed_state), strict=True):
        np.testing.assert_array_equal(x, y)
    assert metrics_without_timings(tmp_path / "killed") == metrics_without_timings(tmp_path / "whole"), history
    whole_summary = json.loads((tmp_path / "whole" / "summary.json").read_text())
    killed_summary = json.loads((tmp_path / "killed" / "summary.json").read_text())
    assert killed_summary["test"] == whole_summary["test"]

"""Sharded runs on simulated CPU devices finish on a busy machine.

XLA's CPU client runs each device's part of a multi-device program on a thread of one pool, and
dispatches every call of a jitted function from that same pool, where a dispatch waits while its
device has 32 computations queued. With only as many threads as devices, a host that runs ahead
of busy cores (evaluation's many small programs) left a program's collectives waiting forever for
a part that had no thread, and XLA aborted the process after 40 s. Importing jaxnet gives the pool
twice as many threads as simulated devices (:func:`jaxnet.parallel.make_room_for_simulated_devices`).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import cpu_env, needs_fashion_mnist, run_patiently

from jaxnet import parallel

STUCK = "may be stuck"  # XLA's warning, 20 s into a collective that waits for a missing participant


@contextlib.contextmanager
def busy_cores(seconds: int):
    """Every core kept busy by another process meanwhile (each ends by itself after ``seconds``)."""
    burn = f"import time\nend = time.time() + {seconds}\nwhile time.time() < end: pass"
    burners = [subprocess.Popen([sys.executable, "-c", burn]) for _ in range(os.cpu_count() or 1)]
    try:
        yield
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()


MANY_EVALUATIONS = """
import jax, jaxnet, json, os
from jaxnet import config
from jaxnet.data.text import from_text
from jaxnet.train.loop import Run
assert jax.device_count() == 8
text = from_text("the quick brown fox jumps over the lazy dog. " * 2000, "char")
cfg = config.load_experiment("transformer_shakespeare:smoke", [
    "mesh.data=2", "mesh.fsdp=2", "mesh.tensor=2", "train.eval_batch_size=8", "data.seq_len=8"])
run = Run(cfg, dataset=text)
state = run.init_state()
print(json.dumps({"threads": os.environ.get("PJRT_NPROC"), "val": [run.evaluate(state, "val") for _ in range(2)]}))
"""


def test_many_evaluation_batches_on_eight_busy_devices_finish():
    """Two evaluations of ~70 batches each (an evaluation step and its sums per batch, never
    waiting for the devices) on a data x fsdp x tensor mesh while every core is busy: before the
    fix this aborted in a collective, now each gives the same loss."""
    with busy_cores(120):
        result = run_patiently(
            [sys.executable, "-c", MANY_EVALUATIONS], capture_output=True, text=True, env=cpu_env(8), timeout=300
        )
    assert result.returncode == 0, result.stderr[-3000:]
    assert STUCK not in result.stderr
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert int(out["threads"]) >= 16
    losses = [v["loss"] for v in out["val"]]
    assert losses[0] > 0 and losses == [losses[0]] * 2


@pytest.fixture
def fresh_cpu_client(monkeypatch):
    """As if JAX had not started its CPU client yet, with no thread count chosen by the user."""
    from jax._src import xla_bridge

    monkeypatch.setattr(xla_bridge, "backends_are_initialized", lambda: False)
    for name in ("PJRT_NPROC", "NPROC", "XLA_FLAGS"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_simulated_devices_get_twice_as_many_client_threads(fresh_cpu_client):
    fresh_cpu_client.setenv("XLA_FLAGS", "--xla_backend_optimization_level=0 --xla_force_host_platform_device_count=8")
    fresh_cpu_client.setenv("NPROC", "2")  # a 2-core reservation: XLA would size its pool to the 8 devices
    parallel.make_room_for_simulated_devices()
    assert os.environ["PJRT_NPROC"] == "16"


def test_more_cores_than_twice_the_devices_keep_xlas_thread_count(fresh_cpu_client):
    fresh_cpu_client.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=4")
    fresh_cpu_client.setenv("NPROC", "64")
    parallel.make_room_for_simulated_devices()
    assert os.environ["PJRT_NPROC"] == "64"


def test_client_threads_are_left_alone_without_simulated_devices(fresh_cpu_client):
    parallel.make_room_for_simulated_devices()
    assert "PJRT_NPROC" not in os.environ


def test_a_thread_count_already_set_is_raised_never_lowered(fresh_cpu_client):
    """A value inherited from a process that simulated fewer devices is raised; a larger one is kept."""
    fresh_cpu_client.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
    fresh_cpu_client.setenv("PJRT_NPROC", "8")
    parallel.make_room_for_simulated_devices()
    assert os.environ["PJRT_NPROC"] == "16"
    fresh_cpu_client.setenv("PJRT_NPROC", "40")
    parallel.make_room_for_simulated_devices()
    assert os.environ["PJRT_NPROC"] == "40"


def test_a_started_cpu_client_is_left_alone(monkeypatch):
    """Too late to size the pool once JAX has started its backends."""
    import jax

    jax.devices()
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
    monkeypatch.delenv("PJRT_NPROC", raising=False)
    parallel.make_room_for_simulated_devices()
    assert "PJRT_NPROC" not in os.environ


ROUNDS = 3
EXPERIMENTS = ["transformer_shakespeare:smoke", "cnn_fashion_mnist:smoke", "lstm_shakespeare:smoke"]


@pytest.mark.slow  # about 1-3 minutes per run on a busy 2-core machine, 9 runs
@needs_fashion_mnist
@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_the_eight_device_command_finishes_again_and_again_while_every_core_is_busy(tmp_path, experiment):
    """``jaxnet train EXP mesh.data=2 mesh.fsdp=2 mesh.tensor=2`` on 8 simulated devices, with its
    evaluations and checkpoints, three times in a row while other processes keep every core busy:
    each run completes (no abort, no hang) with its test metrics and final checkpoint."""
    command = [sys.executable, "-m", "jaxnet", "train", experiment, "mesh.data=2", "mesh.fsdp=2", "mesh.tensor=2"]
    with busy_cores(ROUNDS * 600):
        for round_ in range(ROUNDS):
            workdir = tmp_path / f"run{round_}"
            result = run_patiently(
                [*command, "--workdir", str(workdir)], capture_output=True, text=True, env=cpu_env(8), timeout=600
            )
            assert result.returncode == 0, (round_, result.stderr[-3000:])
            assert STUCK not in result.stderr, round_
            summary = json.loads((workdir / "summary.json").read_text())
            assert summary["complete"] and summary["test"]["loss"] > 0, round_
            saved = sorted(int(p.name) for p in Path(workdir, "checkpoints").iterdir() if p.name.isdigit())
            assert saved and saved[-1] == summary["steps_total"], round_


def test_a_tests_time_limit_stretches_with_the_load_and_still_stops_a_command(monkeypatch):
    """conftest.run_patiently, every subprocess's limit in the suite: a command that outlasts its
    quiet-machine limit is stopped there on a quiet machine, and finishes on one 20 times as busy."""
    import conftest

    slow = [sys.executable, "-c", "import time; time.sleep(3); print('done')"]
    monkeypatch.setattr(conftest, "busy", lambda: 1.0)
    with pytest.raises(subprocess.TimeoutExpired):
        conftest.run_patiently(slow, timeout=1)
    monkeypatch.setattr(conftest, "busy", lambda: 20.0)
    done = conftest.run_patiently(slow, timeout=1)
    assert done.returncode == 0 and done.stdout == "done\n"

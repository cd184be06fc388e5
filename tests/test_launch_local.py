"""scripts/launch_local.sh on a preemption notice (SIGTERM): its processes get the time to write
their preemption checkpoint, bounded and said on stderr, and are killed after it.

The processes here stand in for ``jaxnet train`` (``PYTHON`` names the program the launcher runs):
on TERM they take a few seconds to "write a checkpoint" and leave a file, as a real process
finishes its step and saves. tests/test_multiprocess.py runs the launcher on real training.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from conftest import patient

ROOT = Path(__file__).resolve().parents[1]
LAUNCH = ROOT / "scripts" / "launch_local.sh"

# Called as: PYTHON -m jaxnet train ARGS... --process-id I. SAVE_S is how long its checkpoint takes.
PROCESS = """#!/usr/bin/env bash
exec >/dev/null 2>&1  # its own sleep, left when it is killed, holds no pipe of the launcher's
id=${@: -1}
trap 'sleep "$SAVE_S"; echo saved > "$OUT/saved-$id"; exit 0' TERM
echo > "$OUT/started-$id"
while :; do sleep 0.05; done
"""


def launch(tmp_path: Path, save_s: float, **env: str) -> tuple[subprocess.CompletedProcess, float]:
    """Start two stand-in processes with the launcher, send it TERM once both run; its result and
    the seconds from TERM to its exit."""
    program = tmp_path / "python"
    program.write_text(PROCESS)
    program.chmod(0o755)
    environment = {**os.environ, "PYTHON": str(program), "JAXNET_PORT": "1", "OUT": str(tmp_path)}
    environment.update(SAVE_S=str(save_s), **env)
    launcher = subprocess.Popen(
        [str(LAUNCH), "2", "exp", "--workdir", "run"], env=environment, stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + patient(20)
    while not all((tmp_path / f"started-{i}").exists() for i in (0, 1)):
        assert time.monotonic() < deadline and launcher.poll() is None, "the processes did not start"
        time.sleep(0.05)
    sent = time.monotonic()
    launcher.send_signal(signal.SIGTERM)
    _, err = launcher.communicate(timeout=patient(90))
    return subprocess.CompletedProcess(launcher.args, launcher.returncode, "", err), time.monotonic() - sent


def test_on_term_the_processes_finish_their_checkpoint_before_anything_is_killed(tmp_path):
    # 3 s to save: longer than the 2 s after which the launcher used to kill them.
    result, took = launch(tmp_path, save_s=3)
    assert result.returncode == 143
    assert (tmp_path / "saved-0").exists() and (tmp_path / "saved-1").exists()
    assert result.stderr.strip().splitlines() == [
        "launch_local.sh: waiting up to 60 s for 2 processes to finish their preemption checkpoint"
    ]
    assert 3 <= took < patient(10)


def test_processes_still_running_after_the_bound_are_killed_and_it_says_so(tmp_path):
    result, took = launch(tmp_path, save_s=30, JAXNET_STOP_WAIT_S="1")
    assert result.returncode == 143
    assert not (tmp_path / "saved-0").exists() and not (tmp_path / "saved-1").exists()
    assert result.stderr.strip().splitlines() == [
        "launch_local.sh: waiting up to 1 s for 2 processes to finish their preemption checkpoint",
        "launch_local.sh: 2 processes still running after 1 s; killing them",
    ]
    assert 1 <= took < patient(5)


@pytest.mark.parametrize("value", ["soon", "-1"])
def test_a_bad_wait_is_a_one_line_error(tmp_path, value):
    result = subprocess.run(
        [str(LAUNCH), "2", "exp"], env={**os.environ, "JAXNET_STOP_WAIT_S": value}, capture_output=True, text=True
    )
    assert result.returncode == 2
    assert result.stderr.strip() == f"error: JAXNET_STOP_WAIT_S={value}: give a whole number of seconds"

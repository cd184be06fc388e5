"""jaxnet under the launchers clusters use: a real single-node Slurm started on this machine by
scripts/slurm/local_cluster.sh, and Open MPI 4's mpirun. Nothing is mocked: the committed batch
script (scripts/slurm/train.sbatch) is submitted with sbatch, preempted with scancel, its tasks
killed by PID, as a user would.

Where Slurm is not installed and this is not a root shell with apt-get (the CI machines are), the
scheduler tests are skipped with the reason. The launcher-reading tests at the end need neither.

Every run trains the same tiny model from one prepared byte-token corpus (20 steps) and is
compared with one process of 2 CPU devices: the run of 2 tasks of 1 device must reach the same
losses (rel 1e-5: gloo's all-reduce sums in another order than one process's devices).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import patient, run_patiently

ROOT = Path(__file__).resolve().parents[1]
CLUSTER = ROOT / "scripts" / "slurm" / "local_cluster.sh"
BATCH = ROOT / "scripts" / "slurm" / "train.sbatch"
EXPERIMENT = "transformer_shakespeare:smoke"
STEPS, LOG = 20, 5
# Few steps, one prepared corpus, evaluation of 64 predictions: the cost is JAX's start-up and
# compilation (the session's compilation cache serves every run after the first of its layout).
ARGS = [
    "data.name=tokens",
    "train.progress=false",
    "mesh.data=-1",
    f"train.steps={STEPS}",
    f"train.log_every={LOG}",
    "train.eval_every=10",
    "train.checkpoint_every=10",
    "train.eval_tokens=64",
]
# Lines the libraries print around jaxnet's own that `jaxnet train` keeps out unless --verbose.
THIRD_PARTY = ("[Gloo]", "Reached preemption sync point", "preemption_notifier", "SIGTERM caught", "WARNING:absl")
# Slow: five runs of 2 processes (a Slurm job, a preempted one started twice, a killed one, an
# mpirun) and one of 1, each mostly JAX's start-up and compilation: 72 s on the shared 2-core
# machine, plus the packages' installation on a fresh one (6 to 24 s with apt-get update).
pytestmark = pytest.mark.slow
FINAL = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE")


def _env(devices: int) -> dict[str, str]:
    from conftest import cpu_env

    return cpu_env(devices)


def _cannot_install() -> str | None:
    """Why Slurm and Open MPI cannot be had here, or None."""
    if not sys.platform.startswith("linux"):
        return "a single-node Slurm needs Linux"
    if all(shutil.which(p) for p in ("slurmctld", "slurmd", "sbatch", "munged", "mpirun")):
        return None
    if os.geteuid() != 0:
        return "Slurm and Open MPI are not installed, and installing them needs root (scripts/slurm/local_cluster.sh)"
    if not shutil.which("apt-get"):
        return "Slurm and Open MPI are not installed, and there is no apt-get to install them"
    return None


def _cluster(command: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([str(CLUSTER), command], capture_output=True, text=True, timeout=patient(timeout))


@pytest.fixture(scope="module")
def installed() -> None:
    """slurmctld, slurmd, sbatch, munged and mpirun on the path (installed with apt-get if missing)."""
    reason = _cannot_install()
    if reason:
        pytest.skip(reason)
    result = _cluster("install")
    if result.returncode == 3:  # the script says why this machine cannot have them
        pytest.skip(result.stderr.strip())
    assert result.returncode == 0, result.stderr


@pytest.fixture(scope="module")
def slurm(installed) -> dict[str, str]:
    """A running single-node Slurm (started here and stopped after, or one already running left
    as it was): the environment to submit jobs from."""
    running = _cluster("status").returncode == 0
    result = _cluster("start")
    assert result.returncode == 0, result.stderr
    conf = result.stdout.strip().splitlines()[-1].partition("=")[2]
    yield {**_env(1), "SLURM_CONF": conf, "JAXNET": f"{sys.executable} -m jaxnet", "EXPERIMENT": EXPERIMENT}
    if not running:
        stopped = _cluster("stop", timeout=60)
        assert stopped.returncode == 0, stopped.stderr


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """A byte-token corpus prepared once for every run of this file."""
    import numpy as np

    tmp = tmp_path_factory.mktemp("cluster-corpus")
    words = ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog."]
    rng = np.random.default_rng(1)
    for i in range(4):
        (tmp / f"doc{i}.txt").write_text(" ".join(rng.choice(words, 400)) + "\n")
    out = tmp / "corpus"
    command = [sys.executable, "-m", "jaxnet", "prepare", str(tmp), "--tokenizer", "byte", "--out", str(out)]
    command += ["--workers", "1", "--val-fraction", "0.2", "--test-fraction", "0.2", "--quiet"]
    result = run_patiently(command, capture_output=True, text=True, env=_env(1), timeout=120)
    assert result.returncode == 0, result.stderr
    return out


@pytest.fixture(scope="module")
def reference(corpus, tmp_path_factory) -> dict[tuple[int, str], float]:
    """The losses of one process with 2 CPU devices."""
    workdir = tmp_path_factory.mktemp("cluster-reference") / "run"
    command = [sys.executable, "-m", "jaxnet", "train", EXPERIMENT, *ARGS, f"data.path={corpus}", "--workdir"]
    result = run_patiently([*command, str(workdir)], capture_output=True, text=True, env=_env(2), timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    losses = _losses(workdir)
    assert (STEPS, "test") in losses and (10, "val") in losses
    return losses


def _losses(workdir: Path) -> dict[tuple[int, str], float]:
    lines = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    return {(r["step"], r["split"]): r["loss"] for r in lines}


def _same_losses(got: dict, expected: dict) -> None:
    assert got.keys() == expected.keys()
    for key, loss in expected.items():
        assert got[key] == pytest.approx(loss, rel=1e-5), key


def _submit(env: dict[str, str], workdir: Path, corpus: Path, *extra: str) -> tuple[str, Path]:
    """Submit the committed batch script for a run in ``workdir``; the job id and its output file."""
    output = workdir.parent / f"{workdir.name}.out"
    command = ["sbatch", "--parsable", f"--output={output}", str(BATCH), *ARGS, f"data.path={corpus}", *extra]
    result = run_patiently(
        command, capture_output=True, text=True, env={**env, "WORKDIR": str(workdir)}, cwd=workdir.parent, timeout=30
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip().split(";")[0], output


def _job(env: dict[str, str], job: str) -> dict[str, str]:
    """``scontrol show job``'s fields."""
    result = run_patiently(["scontrol", "show", "job", "-o", job], capture_output=True, text=True, env=env, timeout=30)
    assert result.returncode == 0, result.stderr
    return dict(field.split("=", 1) for field in result.stdout.split() if "=" in field)


def _wait(env: dict[str, str], job: str, until, seconds: float = 240) -> dict[str, str]:
    """Poll the job (every 0.2 s: sbatch --wait polls every 2 to 10 s) until ``until(fields)``."""
    deadline = time.monotonic() + patient(seconds)
    while True:
        fields = _job(env, job)
        if until(fields):
            return fields
        assert time.monotonic() < deadline, f"job {job} is still {fields.get('JobState')} after {seconds} s"
        time.sleep(0.2)


def _ended(fields: dict[str, str]) -> bool:
    return fields["JobState"] in FINAL


def _wait_for_line(output: Path, text: str, env: dict[str, str], job: str, seconds: float = 180) -> None:
    deadline = time.monotonic() + patient(seconds)
    while not (output.exists() and text in output.read_text()):
        fields = _job(env, job)
        assert not _ended(fields), f"job {job} ended ({fields['JobState']}) before printing {text!r}"
        assert time.monotonic() < deadline, f"no {text!r} in the job's output after {seconds} s"
        time.sleep(0.1)


def test_sbatch_of_the_committed_script_trains_like_one_process_with_as_many_devices(
    slurm, corpus, reference, tmp_path
):
    workdir = tmp_path / "train"
    job, output = _submit(slurm, workdir, corpus)
    fields = _wait(slurm, job, _ended)
    out = output.read_text()
    assert fields["JobState"] == "COMPLETED" and fields["ExitCode"] == "0:0", out[-3000:]
    _same_losses(_losses(workdir), reference)
    assert "on 2 cpu device(s)" in out and "data=2" in out
    assert out.count("test loss") == 1 and out.count("step 5/20") == 1  # process 0 alone prints
    assert json.loads((workdir / "summary.json").read_text())["environment"]["process_count"] == 2
    assert [t for t in THIRD_PARTY if t in out] == []


def test_scancel_term_checkpoints_the_job_requeues_itself_and_resumes_to_the_same_losses(
    slurm, corpus, reference, tmp_path
):
    workdir = tmp_path / "preempted"
    # 5 steps a call: the processes must agree on where to stop although the step count jumps by 5
    job, output = _submit(slurm, workdir, corpus, "train.steps_per_call=5")
    _wait_for_line(output, "mesh data=2", slurm, job)  # both processes joined and built the run
    cancel = subprocess.run(["scancel", "--signal=TERM", job], capture_output=True, text=True, env=slurm)
    assert cancel.returncode == 0, cancel.stderr
    # The batch script requeues the job, which starts again once the old credentials expire (10 s here)
    fields = _wait(slurm, job, lambda f: _ended(f) and f["Restarts"] == "1")
    out = output.read_text()
    assert fields["JobState"] == "COMPLETED" and fields["ExitCode"] == "0:0", out[-3000:]
    stopped = [line for line in out.splitlines() if line.startswith("SIGTERM received: stopped at step")]
    assert len(stopped) == 1, out
    step = int(stopped[0].split()[5])
    assert 1 <= step < STEPS
    assert f"requeueing job {job}" in out and "(restart 1)" in out
    assert f"from step {step}" in out  # the requeued job resumed from the preemption checkpoint
    losses = _losses(workdir)
    if step % LOG:  # the log interval it stopped in is logged in two parts, each the mean of its steps
        last, end = step - step % LOG, step - step % LOG + LOG
        before, after = losses.pop((step, "train")), losses[(end, "train")]
        losses[(end, "train")] = ((step - last) * before + (end - step) * after) / LOG
    _same_losses(losses, reference)
    assert [t for t in THIRD_PARTY if t in out] == []


def test_a_task_killed_outright_ends_the_job_at_once_with_a_line_naming_it(slurm, corpus, tmp_path):
    workdir = tmp_path / "killed"
    job, output = _submit(slurm, workdir, corpus)
    _wait_for_line(output, "mesh data=2", slurm, job)
    listed = run_patiently(["scontrol", "listpids", job], capture_output=True, text=True, env=slurm, timeout=30)
    tasks = {row.split()[4]: int(row.split()[0]) for row in listed.stdout.splitlines()[1:] if row.split()[2] == "0"}
    os.kill(tasks["1"], signal.SIGKILL)
    killed = time.monotonic()
    fields = _wait(slurm, job, _ended, seconds=60)
    took = time.monotonic() - killed
    out = output.read_text()
    assert fields["JobState"] == "FAILED" and fields["ExitCode"] != "0:0", out[-3000:]
    assert took < patient(20), f"the job took {took:.0f} s to end"
    stop = [line for line in out.splitlines() if "process 1 of 2 stopped unexpectedly" in line]
    assert stop and stop[0].startswith("jaxnet: error: [process 0 of 2] "), out[-3000:]
    assert "Traceback" not in out


def test_two_steps_of_one_job_running_at_once_get_their_own_coordinator_ports(slurm, tmp_path):
    where = f"{sys.executable} -c 'import os; from jaxnet.parallel import launchers; "
    where += 'print(os.environ["SLURM_STEP_ID"], launchers.find().coordinator)\''
    script = tmp_path / "steps.sbatch"
    script.write_text(
        f"#!/bin/bash\n#SBATCH --ntasks=2\nsrun -n 2 --overlap {where} &\nsrun -n 2 --overlap {where} &\nwait\n"
    )
    output = tmp_path / "steps.out"
    result = subprocess.run(
        ["sbatch", "--parsable", f"--output={output}", str(script)], capture_output=True, text=True, env=slurm
    )
    assert result.returncode == 0, result.stderr
    fields = _wait(slurm, result.stdout.strip().split(";")[0], _ended, seconds=60)
    assert fields["JobState"] == "COMPLETED", output.read_text()
    seen: dict[str, set[str]] = {}
    for line in output.read_text().splitlines():
        step, address = line.split()
        seen.setdefault(step, set()).add(address)
    assert sorted(seen) == ["0", "1"] and all(len(a) == 1 for a in seen.values())  # a step's tasks agree
    assert seen["0"] != seen["1"]
    assert all(a.startswith(f"{socket.gethostname().split('.')[0]}:") for s in seen.values() for a in s)


def test_mpirun_np_2_trains_like_one_process_with_as_many_devices(installed, corpus, reference, tmp_path):
    version = subprocess.run(["mpirun", "--version"], capture_output=True, text=True).stdout
    if "Open MPI) 4." not in version:
        pytest.skip(f"needs Open MPI 4's mpirun, not {version.splitlines()[0] if version else 'this one'}")
    workdir = tmp_path / "mpi"
    command = ["mpirun", "-np", "2", "--allow-run-as-root", "--oversubscribe", "--mca", "oob_tcp_if_include", "lo"]
    command += [sys.executable, "-m", "jaxnet", "train", EXPERIMENT, *ARGS, f"data.path={corpus}"]
    result = run_patiently(
        [*command, "--workdir", str(workdir)], capture_output=True, text=True, env=_env(1), timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    _same_losses(_losses(workdir), reference)
    assert result.stdout.count("test loss") == 1
    assert [t for t in THIRD_PARTY if t in result.stdout + result.stderr] == []

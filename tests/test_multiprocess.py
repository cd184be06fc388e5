"""Multi-process runs: 2 processes x 4 CPU devices, started by ``scripts/launch_local.sh`` and
talking over localhost (gloo), train exactly like 1 process with 8 devices, write one set of
logs, and leave checkpoints that a single process resumes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RUN = [
    "transformer_shakespeare:smoke",
    "data.name=text",
    "train.progress=false",
    "train.checkpoint_every=10",
    "mesh.data=-1",
    "mesh.fsdp=2",
]


def _env(devices: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
    env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    env["JAX_PLATFORMS"] = "cpu"
    env["PYTHON"] = sys.executable
    return env


def _losses(workdir: Path) -> dict[tuple[int, str], float]:
    lines = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    return {(r["step"], r["split"]): r["loss"] for r in lines}


def _run(command: list[str], devices: int) -> subprocess.CompletedProcess:
    """Run ``command`` with ``devices`` simulated CPU devices per process; it must succeed."""
    result = subprocess.run(command, capture_output=True, text=True, env=_env(devices), timeout=300, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("multiprocess")
    text = tmp / "fox.txt"
    text.write_text("the quick brown fox jumps over the lazy dog.\n" * 400)
    args = [*RUN, f"data.path={text}"]
    one_process = [sys.executable, "-m", "jaxnet", "train", *args]
    two_processes = [str(ROOT / "scripts" / "launch_local.sh"), "2", *args]
    one = _run([*one_process, "--workdir", str(tmp / "one")], 8)
    two = _run([*two_processes, "--workdir", str(tmp / "two")], 4)
    # Stopped after 20 steps by two processes, finished by one process with its own 8 devices.
    half = _run([*two_processes, "train.stop_after=20", "--workdir", str(tmp / "moved")], 4)
    rest = _run([*one_process, "--workdir", str(tmp / "moved")], 8)
    return {"one": (tmp / "one", one), "two": (tmp / "two", two), "half": (tmp / "moved", half), "rest": rest}


def test_two_processes_train_like_one_process_with_as_many_devices(runs):
    one_dir, one = runs["one"]
    two_dir, two = runs["two"]
    assert "on 8 cpu device(s)" in two.stdout and "data=4 x fsdp=2" in two.stdout
    expected, got = _losses(one_dir), _losses(two_dir)
    assert got.keys() == expected.keys() and (30, "test") in got
    for key, loss in expected.items():
        assert got[key] == pytest.approx(loss, rel=1e-5), key
    summary = json.loads((two_dir / "summary.json").read_text())
    assert summary["environment"]["process_count"] == 2 and summary["complete"]


def test_only_process_zero_prints_and_writes_logs(runs):
    _, two = runs["two"]
    # One process's output: each line once, not once per process.
    assert two.stdout.count("step 15: val loss") == 1
    assert two.stdout.count("test loss") == 1
    lines = (runs["two"][0] / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == len(set(lines)) == len((runs["one"][0] / "metrics.jsonl").read_text().splitlines())


def test_checkpoints_written_by_two_processes_resume_in_one(runs):
    moved, half = runs["half"]
    assert "stopped at step 20" in half.stdout
    assert "resuming" in runs["rest"].stdout
    expected, got = _losses(runs["one"][0]), _losses(moved)
    assert got[(30, "test")] == pytest.approx(expected[(30, "test")], rel=1e-5)


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--coordinator", "localhost:1"], "--num-processes, --process-id missing"),
        (["--coordinator", "nohostport", "--num-processes", "2", "--process-id", "0"], "expected HOST:PORT"),
        (["--coordinator", "localhost:1", "--num-processes", "2", "--process-id", "2"], "ids run from 0 to 1"),
    ],
)
def test_bad_multi_process_flags_are_one_line_errors(tmp_path, flags, message):
    result = subprocess.run(
        [sys.executable, "-m", "jaxnet", "train", "transformer_shakespeare:smoke", *flags, "--workdir", str(tmp_path)],
        capture_output=True,
        text=True,
        env=_env(1),
        timeout=120,
    )
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and message in result.stderr


def test_a_mesh_that_leaves_out_a_process_stops_every_process_at_once(tmp_path):
    text = tmp_path / "fox.txt"
    text.write_text("the quick brown fox jumps over the lazy dog.\n" * 50)
    result = subprocess.run(
        [str(ROOT / "scripts" / "launch_local.sh"), "2", *RUN, f"data.path={text}", "mesh.data=2", "mesh.fsdp=1"]
        + ["--workdir", str(tmp_path / "run")],
        capture_output=True,
        text=True,
        env=_env(2),
        timeout=120,
        cwd=ROOT,
    )
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if line.startswith("jaxnet: error:")]
    assert errors and all("must use all 4 devices of its 2 processes" in e for e in errors)
    assert "Traceback" not in result.stderr and not (tmp_path / "run").exists()


@pytest.mark.parametrize("parts", [2, 4])
def test_each_process_reads_exactly_its_rows_of_every_batch(parts):
    """Rows read piece by piece (one piece per process) put together are the whole batch, with
    augmentation drawn as for the whole batch."""
    import numpy as np

    from jaxnet.data import pipeline, text

    rng = np.random.default_rng(0)
    images, labels = rng.integers(0, 256, (100, 8, 8, 3), dtype=np.uint8), rng.integers(0, 10, 100)
    tokens = rng.integers(0, 50, 5000).astype(np.int32)
    size = 16
    pieces = [slice(i * size // parts, (i + 1) * size // parts) for i in range(parts)]
    stats = {"mean": np.zeros(3, np.float32), "std": np.ones(3, np.float32)}

    def image_batch(rows):
        batches = pipeline.train_batches(
            images, labels, batch_size=size, seed=3, start_step=5, do_augment=True, rows=rows, **stats
        )
        return next(batches)

    def text_batch(mode, rows):
        batches = text.train_batches(tokens, batch_size=size, seq_len=8, mode=mode, seed=3, start_step=7, rows=rows)
        return next(batches)

    for whole, part in [
        (image_batch(slice(None)), image_batch),
        (text_batch("stream", slice(None)), lambda rows: text_batch("stream", rows)),
        (text_batch("windows", slice(None)), lambda rows: text_batch("windows", rows)),
    ]:
        got = [part(rows) for rows in pieces]
        for key, value in whole.items():
            if np.ndim(value):
                np.testing.assert_array_equal(np.concatenate([g[key] for g in got]), value, err_msg=key)
            else:
                assert all(g[key] == value for g in got)

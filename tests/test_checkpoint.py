"""Checkpoints that survive corruption, kills and full disks: every test damages real files on disk
(or fills a real file-size limit) and checks what saving and restoring make of it."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import sys
import textwrap
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import run_patiently, tiny_config

from jaxnet.checkpoint import DAMAGED, MANIFEST, Checkpoints
from jaxnet.errors import UserError
from jaxnet.train import Run, train

ROOT = Path(__file__).resolve().parents[1]


def state_at(step: int, size: int = 64) -> dict:
    """A small train-state-like pytree whose every value depends on ``step``."""
    rng = np.random.default_rng(step)
    return {
        "params": {
            "w": jnp.asarray(rng.normal(size=(size, 32)).astype(np.float32)),
            "b": jnp.asarray(rng.normal(size=(32,)).astype(np.float32)),
        },
        "step": jnp.asarray(step, jnp.int32),
    }


def abstract(state: dict) -> dict:
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), state)


TARGET = abstract(state_at(0))


def save_steps(directory: Path, steps: list[int], keep: int | None = 3, size: int = 64) -> None:
    ckpts = Checkpoints(directory, keep=keep)
    try:
        for step in steps:
            ckpts.save(step, state_at(step, size))
    finally:
        ckpts.close()


def restore(directory: Path, target=TARGET, read_only: bool = False, **kwargs) -> tuple[dict, list[str]]:
    """The restored state and the lines ``restore`` said."""
    lines: list[str] = []
    ckpts = Checkpoints(directory, read_only=read_only)
    try:
        return ckpts.restore(target, say=lines.append, **kwargs), lines
    finally:
        ckpts.close()


def assert_identical(a, b) -> None:
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        assert np.asarray(x).dtype == np.asarray(y).dtype
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def snapshot(directory: Path) -> dict[str, str]:
    """Content hash of every file under ``directory``."""
    return {
        str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


def largest_array_file(step_dir: Path) -> Path:
    """The biggest file of the saved arrays (an OCDBT data file under ``state/``)."""
    return max((p for p in (step_dir / "state").rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def overwrite_middle(path: Path) -> None:
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 64] = np.random.default_rng(0).integers(0, 256, 64, dtype=np.uint8).tobytes()
    path.write_bytes(bytes(data))


DAMAGE = {
    "truncated": (truncate, r"file state/\S+ has \d+ bytes, expected \d+"),
    "deleted": (Path.unlink, r"file state/\S+ is missing"),
    "garbage": (overwrite_middle, r"file state/\S+ does not match its checksum"),
}


@pytest.mark.parametrize("damage", DAMAGE)
def test_damaged_newest_checkpoint_falls_back_and_is_moved_aside(tmp_path, damage):
    save_steps(tmp_path, [10, 20, 30])
    assert all((tmp_path / str(s) / MANIFEST).is_file() for s in (10, 20, 30))
    hurt, reason = DAMAGE[damage]
    hurt(largest_array_file(tmp_path / "30"))

    state, lines = restore(tmp_path)

    assert_identical(state, state_at(20))
    assert len(lines) == 1
    assert re.fullmatch(
        rf"checkpoint step 30 in {re.escape(str(tmp_path))} is damaged \({reason}\); falling back to step 20", lines[0]
    ), lines[0]
    assert (tmp_path / DAMAGED / "30" / "state").is_dir()  # kept for a post-mortem, not deleted
    assert Checkpoints(tmp_path, read_only=True).all_steps() == [10, 20]


def test_garbage_without_a_manifest_would_restore_silently(tmp_path):
    """Why the manifest: orbax alone restores a data file with bytes overwritten as wrong numbers."""
    save_steps(tmp_path, [10, 20])
    overwrite_middle(largest_array_file(tmp_path / "20"))
    (tmp_path / "20" / MANIFEST).unlink()
    state, lines = restore(tmp_path, read_only=True)
    assert lines == [] and int(state["step"]) == 20
    assert not np.array_equal(state["params"]["w"], state_at(20)["params"]["w"])


def test_checkpoint_without_manifest_restores_with_orbax_alone_and_is_sealed(tmp_path):
    save_steps(tmp_path, [10, 20])
    (tmp_path / "20" / MANIFEST).unlink()  # as if killed between orbax's commit and the seal
    state, lines = restore(tmp_path)
    assert lines == []
    assert_identical(state, state_at(20))
    assert (tmp_path / "20" / MANIFEST).is_file()  # sealed once it restored


def test_unsealed_checkpoint_that_orbax_cannot_read_falls_back(tmp_path):
    save_steps(tmp_path, [10, 20])
    (tmp_path / "20" / MANIFEST).unlink()
    truncate(largest_array_file(tmp_path / "20"))
    state, lines = restore(tmp_path)
    assert_identical(state, state_at(10))
    assert len(lines) == 1 and re.match(
        r"checkpoint step 20 in .* is damaged \(orbax cannot read it: .*\); falling", lines[0]
    )
    assert (tmp_path / DAMAGED / "20").is_dir()


def test_every_checkpoint_damaged_is_a_user_error_and_nothing_moves(tmp_path):
    save_steps(tmp_path, [10, 20])
    truncate(largest_array_file(tmp_path / "20"))
    (tmp_path / "10" / "state" / "_METADATA").unlink()
    before = snapshot(tmp_path)
    with pytest.raises(UserError) as error:
        restore(tmp_path)
    message = str(error.value)
    assert re.search(
        r"every checkpoint in .* is damaged \(step 20: file .* has \d+ bytes.*; step 10: file state/_METADATA is",
        message,
    )
    assert "nothing was moved" in message and "use a fresh --workdir" in message
    assert snapshot(tmp_path) == before
    assert not (tmp_path / DAMAGED).exists()


def test_read_only_restore_falls_back_and_moves_nothing(tmp_path):
    save_steps(tmp_path, [10, 20])
    overwrite_middle(largest_array_file(tmp_path / "20"))
    before = snapshot(tmp_path)
    state, lines = restore(tmp_path, read_only=True)
    assert_identical(state, state_at(10))
    assert len(lines) == 1 and "checkpoint step 20" in lines[0] and "falling back to step 10" in lines[0]
    assert snapshot(tmp_path) == before


def test_explicit_step_restores_it_or_names_it_when_damaged(tmp_path):
    save_steps(tmp_path, [10, 20])
    state, _ = restore(tmp_path, step=10)
    assert_identical(state, state_at(10))
    truncate(largest_array_file(tmp_path / "20"))
    before = snapshot(tmp_path)
    with pytest.raises(UserError, match=r"checkpoint step 20 in .* is damaged \(file .* has \d+ bytes"):
        restore(tmp_path, step=20)
    with pytest.raises(UserError, match=r"there is no checkpoint step 15 in .*\(steps there: 10, 20\)"):
        restore(tmp_path, step=15)
    assert snapshot(tmp_path) == before


def test_checkpoint_of_another_shape_is_a_user_error_not_a_fallback(tmp_path):
    save_steps(tmp_path, [10, 20])
    before = snapshot(tmp_path)
    lines: list[str] = []
    ckpts = Checkpoints(tmp_path)
    with pytest.raises(
        UserError, match=r"checkpoint step 20 in .* does not fit this run: params/w has shape \(64, 32\) "
    ):
        ckpts.restore(abstract(state_at(0, size=48)), say=lines.append)
    ckpts.close()
    assert lines == [] and snapshot(tmp_path) == before


def test_retention_keeps_the_newest_sealed_checkpoints(tmp_path):
    ckpts = Checkpoints(tmp_path, keep=2)
    for step in (1, 2, 3, 4, 5):
        ckpts.save(step, state_at(step))
    ckpts.wait()
    assert ckpts.all_steps() == [4, 5]
    assert all((tmp_path / str(s) / MANIFEST).is_file() for s in (4, 5))
    ckpts.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["4", "5"]  # no temporaries left either


def test_leftover_temporary_directory_of_a_killed_save_is_no_checkpoint(tmp_path):
    save_steps(tmp_path, [10, 20])
    partial = tmp_path / "30.orbax-checkpoint-tmp"  # how orbax 0.12 names a save in progress
    shutil.copytree(tmp_path / "20", partial)
    (partial / "commit_success.txt").unlink()
    truncate(largest_array_file(partial))

    state, lines = restore(tmp_path, read_only=True)
    assert_identical(state, state_at(20)) and lines == []
    assert Checkpoints(tmp_path, read_only=True).latest_step() == 20
    assert partial.exists()  # read-only: left alone
    ckpts = Checkpoints(tmp_path)  # a run that writes here cleans it up
    assert not partial.exists()
    ckpts.save(30, state_at(30))
    ckpts.close()
    assert_identical(restore(tmp_path)[0], state_at(30))


def test_a_quarantined_step_can_be_saved_again(tmp_path):
    save_steps(tmp_path, [10, 20])
    for attempt, moved_to in enumerate(["20", "20.1"]):
        truncate(largest_array_file(tmp_path / "20"))
        ckpts = Checkpoints(tmp_path)
        assert_identical(ckpts.restore(TARGET, say=lambda _: None), state_at(10))
        assert (tmp_path / DAMAGED / moved_to).is_dir()
        ckpts.save(20, state_at(21 + attempt))  # the resumed run reaches step 20 again
        ckpts.close()
        assert_identical(restore(tmp_path)[0], state_at(21 + attempt))


@pytest.mark.parametrize("read_only", [False, True])
def test_checkpoint_path_that_is_a_file_is_a_user_error_naming_it(tmp_path, read_only):
    path = tmp_path / "checkpoints"
    path.write_text("not a directory")
    with pytest.raises(UserError, match=rf"cannot use checkpoint directory {re.escape(str(path))}: it is a file"):
        Checkpoints(path, read_only=read_only)


def test_checkpoint_path_under_a_file_is_a_user_error_naming_it(tmp_path):
    (tmp_path / "run").write_text("not a directory")
    with pytest.raises(UserError, match=r"cannot use checkpoint directory .*run/checkpoints: Not a directory"):
        Checkpoints(tmp_path / "run" / "checkpoints")


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any directory")
def test_unreadable_checkpoint_directory_is_a_user_error_naming_it(tmp_path):
    save_steps(tmp_path / "checkpoints", [10])
    (tmp_path / "checkpoints").chmod(0)
    try:
        with pytest.raises(UserError, match=r"checkpoint directory .*checkpoints: Permission denied"):
            restore(tmp_path / "checkpoints", read_only=True)
    finally:
        (tmp_path / "checkpoints").chmod(0o755)


FULL_DISK_SCRIPT = """
import resource, signal, sys
# files may grow to 1 MiB; a write past that fails with EFBIG (File too large) instead of killing us
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
sys.path.insert(0, {tests!r})
from test_checkpoint import state_at
from jaxnet.checkpoint import Checkpoints
from jaxnet.errors import UserError

ckpts = Checkpoints({directory!r}, keep=2, asynchronous={asynchronous!r})
try:
    ckpts.save(30, state_at(30, size=32768))
    ckpts.wait()
    print("saved")
except UserError as e:
    print(f"jaxnet: error: {{e}}")
finally:
    ckpts.close()
"""


@pytest.mark.parametrize("asynchronous", [True, False])  # the failure surfaces from wait(), or from save()
def test_full_disk_while_saving_is_a_user_error_and_earlier_checkpoints_survive(tmp_path, asynchronous):
    save_steps(tmp_path, [10, 20], keep=2, size=32768)  # 4 MiB of float32 noise per checkpoint
    script = FULL_DISK_SCRIPT.format(tests=str(ROOT / "tests"), directory=str(tmp_path), asynchronous=asynchronous)
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    result = run_patiently(
        [sys.executable, "-c", textwrap.dedent(script)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == (
        f"jaxnet: error: no space left on device while saving checkpoint step 30 in {tmp_path} (File too large); "
        "the newest intact checkpoint is step 20; free space and run the same command again"
    ), result.stdout + result.stderr[-3000:]
    # orbax's logged tracebacks from its save threads are folded into that one line; what may be left is an
    # occasional "Event loop is closed" that tensorstore prints when a write completes after orbax gave up
    assert "ERROR:absl" not in result.stderr
    assert result.stderr.count("Traceback") <= result.stderr.count("RuntimeError: Event loop is closed")

    assert sorted(p.name for p in tmp_path.iterdir()) == ["10", "20"]  # no partial step 30, nothing pruned
    big = abstract(state_at(0, size=32768))
    assert_identical(restore(tmp_path, big)[0], state_at(20, size=32768))
    assert_identical(restore(tmp_path, big, step=10)[0], state_at(10, size=32768))


def final_state(workdir: Path, cfg, dataset):
    run = Run(cfg, dataset=dataset)
    ckpts = Checkpoints(workdir / "checkpoints", read_only=True)
    try:
        return jax.tree.map(np.asarray, ckpts.restore(run.abstract_state()))
    finally:
        ckpts.close()


def test_run_whose_newest_checkpoint_is_damaged_resumes_from_the_one_before_and_ends_identical(
    quadrants, tmp_path, capsys
):
    cfg = tiny_config(model={"dropout": 0.3})  # randomness per step must resume exactly too
    train(cfg, tmp_path / "whole", dataset=quadrants)  # checkpoints 4, 8 and 12
    shutil.copytree(tmp_path / "whole", tmp_path / "hurt")
    truncate(largest_array_file(tmp_path / "hurt" / "checkpoints" / "12"))
    capsys.readouterr()

    summary = train(cfg, tmp_path / "hurt", dataset=quadrants)

    out = capsys.readouterr().out
    assert re.search(r"checkpoint step 12 in .*hurt/checkpoints is damaged \(file .*\); falling back to step 8", out)
    assert re.search(r"resuming .*hurt from step 8", out)
    assert summary["complete"] and summary["step"] == 12
    assert (tmp_path / "hurt" / "checkpoints" / DAMAGED / "12").is_dir()
    assert Checkpoints(tmp_path / "hurt" / "checkpoints", read_only=True).all_steps() == [4, 8, 12]
    whole, resumed = final_state(tmp_path / "whole", cfg, quadrants), final_state(tmp_path / "hurt", cfg, quadrants)
    assert int(whole.step) == int(resumed.step) == cfg.train.steps
    assert_identical(whole, resumed)

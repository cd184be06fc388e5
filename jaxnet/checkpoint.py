"""Checkpoints with orbax: asynchronous saves, verified on disk, kept safely, restored with fallback.

Each checkpoint ``checkpoints/<step>/`` holds the train state. The data position needs no
record of its own: the order of training examples is a function of (seed, step), and the step
is part of the state.

Orbax writes a checkpoint into ``<step>.orbax-checkpoint-tmp`` and renames it to ``<step>`` once
every file is written (on a local file system; see ``orbax.checkpoint._src.path.atomicity``), so
a save that dies half-way leaves only a temporary directory, which is not a checkpoint. On top
of that:

* **Sealing.** Once orbax has committed a save (when the next save starts, in :meth:`Checkpoints.wait`
  and in :meth:`Checkpoints.close`), every file of the step directory is read back and its size
  and SHA-256 recorded in ``<step>/jaxnet_manifest.json`` (written atomically). A checkpoint with a
  manifest is *sealed*.
* **Retention.** Orbax deletes nothing. A checkpoint is deleted only once ``keep`` newer ones are
  sealed, so a failed or killed save never costs an earlier checkpoint.
* **Restore with fallback.** Restoring checks the newest checkpoint against its manifest (a
  checkpoint without one, such as one whose process was killed before sealing it, is tried with
  orbax alone), and falls back to the next older one if it is damaged, moving the damaged one
  aside into ``checkpoints/damaged/<step>``.
* **Failed writes.** A full disk (or any other failed write) while saving is a :class:`UserError`
  naming the step and the newest intact checkpoint; the partial step is removed.
* **The best checkpoint.** :meth:`Checkpoints.set_best` names one checkpoint the best (``train.keep_best``,
  :func:`jaxnet.early_stop`); it is recorded in ``best.json`` once sealed and never deleted by the
  rotation, until another takes its place. :func:`best_step` reads it.
"""

from __future__ import annotations

import contextlib
import errno
import gc
import hashlib
import json
import logging
import os
import re
import shutil
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from absl import logging as absl_logging

from jaxnet.errors import UserError
from jaxnet.models import base as model_base
from jaxnet.models.adapters import lora

MANIFEST = "jaxnet_manifest.json"
"""File in each sealed step directory: every other file's relative path, size and SHA-256."""

DAMAGED = "damaged"
"""Subdirectory of the checkpoint directory that damaged checkpoints are moved into."""

READ_ONLY_MISFIT = (
    "it was trained with another model (your own, from Python?) or config: pass that model, e.g. "
    "jaxnet.evaluate(workdir, model=..., dataset=..., task=...), or the key=value overrides it trained with"
)
"""The advice when a run being read (not trained) does not fit the model rebuilt for it."""

BEST = "best.json"
"""File in the checkpoint directory naming the best checkpoint; see :func:`best_step` for its format."""

_ORBAX_TMP = ".orbax-checkpoint-tmp"  # orbax's mark on a directory being written (a suffix, maybe + timestamp)
_DELETING = ".deleting-"  # prefix of a checkpoint being deleted: renamed first, so never half a checkpoint
_MANIFEST_FORMAT = "jaxnet-checkpoint-manifest/1"
_BEST_FORMAT = "jaxnet-best-checkpoint/1"
_SPACE_ERRNOS = {errno.ENOSPC, errno.EFBIG, errno.EDQUOT}
_OS_ERROR_CODE = re.compile(r"os_error_code='?(\d+)")
_SPACE_TEXTS = tuple(os.strerror(code) for code in sorted(_SPACE_ERRNOS))


class Checkpoints:
    """The checkpoints of one run directory.

    >>> ckpts = Checkpoints("runs/a/checkpoints", keep=3)          # doctest: +SKIP
    >>> ckpts.save(100, state)                                      # doctest: +SKIP
    >>> state = ckpts.restore(abstract_state)  # newest intact, placed as the target says  # doctest: +SKIP

    ``keep`` is how many sealed checkpoints to keep (None: all). ``read_only`` opens a run's
    checkpoints for evaluation: nothing is written, sealed, deleted or moved.
    """

    def __init__(
        self, directory: str | os.PathLike, keep: int | None = 3, asynchronous: bool = True, read_only: bool = False
    ):
        self.directory = Path(directory).absolute()
        self.keep = keep
        self.read_only = read_only
        self._pending: list[int] = []  # saves started and not yet sealed
        self._best = read_best(self.directory)  # the checkpoint the rotation keeps, whatever its age
        self._best_pending: dict[str, Any] | None = None  # a best whose checkpoint is not sealed yet
        self._primary = jax.process_index() == 0  # with several processes, process 0 alone changes the directory
        if self.directory.exists() and not self.directory.is_dir():
            raise UserError(
                f"cannot use checkpoint directory {self.directory}: it is a file, not a directory; "
                "move it away or use a fresh --workdir"
            )
        _quiet_orbax_write_failures()
        options = ocp.CheckpointManagerOptions(
            max_to_keep=None,  # retention is ours: see _prune
            create=not read_only,
            read_only=read_only,
            save_interval_steps=0 if read_only else 1,
            enable_async_checkpointing=asynchronous,
        )
        verbosity = absl_logging.get_verbosity()
        if read_only:  # orbax warns that a read-only manager is read-only; that is the point
            absl_logging.set_verbosity(absl_logging.ERROR)
        try:
            self._manager = ocp.CheckpointManager(
                self.directory,
                options=options,
                item_handlers={"state": ocp.StandardCheckpointHandler()},
            )
        except OSError as e:
            raise UserError(f"cannot use checkpoint directory {self.directory}: {_os_reason(e)}") from None
        finally:
            absl_logging.set_verbosity(verbosity)
        try:
            self._list_steps()  # an unreadable directory is an error now, not at the first save
        except UserError:
            self._manager.close()
            raise
        if not read_only and self._primary:
            self._remove_leftovers()

    def latest_step(self) -> int | None:
        """The newest complete checkpoint's step (which may yet turn out damaged), or None if there is none."""
        steps = self._list_steps()
        return steps[-1] if steps else None

    def all_steps(self) -> list[int]:
        """Steps of every complete checkpoint (committed by orbax, sealed or not), oldest first."""
        return self._list_steps()

    def save(self, step: int, state: Any) -> None:
        """Start saving ``state`` at ``step``; returns once the arrays are copied off the devices.

        The previous save is finished and sealed first. A failed write (full disk) is a
        :class:`UserError`, here or from :meth:`wait` or :meth:`close`.
        """
        self._settle()
        state = lora.without_base(state)  # a LoRA run saves its adapters; the base is rebuilt from train.init_from
        try:
            self._manager.save(
                step,
                args=ocp.args.Composite(state=ocp.args.StandardSave(state)),
                force=True,
            )
        except Exception as e:
            self._save_failed(step, e)
            raise
        self._pending.append(step)

    def best(self) -> dict[str, Any] | None:
        """The best checkpoint's record (see :func:`best_step`) as last recorded, or None."""
        return self._best

    def set_best(self, step: int, record: dict[str, Any]) -> None:
        """Name checkpoint ``step`` the best, with ``record`` (``metric``, ``mode``, ``value``) beside it.

        The step must be saved already, or saving (:meth:`save`): ``best.json`` is written once it is
        sealed, so it never names a checkpoint that is not on disk, and the rotation keeps that
        checkpoint from then on (the previous best becomes an ordinary one).
        """
        self._best_pending = {"format": _BEST_FORMAT, **record, "step": int(step)}
        if step not in self._pending:
            self._record_best()
            if not self.read_only and self._primary:
                self._prune()

    def _record_best(self) -> None:
        best, self._best_pending = self._best_pending, None
        if best is None:
            return
        if not self.read_only and self._primary:
            _write_atomically(self.directory / BEST, best)
        self._best = best

    def wait(self) -> None:
        """Block until every pending save is on disk, then seal it and delete checkpoints no longer kept."""
        self._settle()

    def close(self) -> None:
        """Finish, seal and prune pending saves, and release the manager's threads."""
        try:
            self._settle()
        finally:
            self._manager.close()

    def restore(self, target: Any, step: int | None = None, *, say: Callable[[str], Any] | None = print) -> Any:
        """Restore the newest intact checkpoint (or checkpoint ``step``) into the structure, shapes and placement of
        ``target``.

        ``target`` is a pytree of arrays or of ``jax.ShapeDtypeStruct`` with shardings. Without
        ``step``, a damaged checkpoint (files that do not match its manifest, or that orbax cannot
        read) is reported through ``say`` in one line and the next older one is tried; once one is
        restored, the damaged ones are moved into ``damaged/`` (unless read-only). If all are
        damaged, or the requested ``step`` is, that is a :class:`UserError` and nothing is moved.
        A checkpoint of another model or optimizer is a :class:`UserError` naming the array, not
        damage. A checkpoint an older jaxnet saved in a layout that changed since (a registered
        :class:`~jaxnet.models.base.Unpacked`: the Transformer's packed ``qkv`` kernel) is read in
        today's layout, which ``say`` reports in one line.
        """
        self._settle()
        steps = self._list_steps()
        if step is not None:
            if step not in steps:
                have = ", ".join(map(str, steps)) or "none"
                raise UserError(f"there is no checkpoint step {step} in {self.directory} (steps there: {have})")
            state, problem = self._try_restore(target, step, say)
            if problem is not None:
                raise UserError(
                    f"checkpoint step {step} in {self.directory} is damaged ({problem}); "
                    "restore another step, or use a fresh --workdir"
                )
            return state
        if not steps:
            raise UserError(f"no checkpoint in {self.directory}; train first with `jaxnet train`")
        damaged: list[tuple[int, str]] = []
        for i in range(len(steps) - 1, -1, -1):
            state, problem = self._try_restore(target, steps[i], say)
            if problem is None:
                self._set_aside([s for s, _ in damaged])
                return state
            damaged.append((steps[i], problem))
            if i > 0 and say is not None:
                say(
                    f"checkpoint step {steps[i]} in {self.directory} is damaged ({problem}); "
                    f"falling back to step {steps[i - 1]}"
                )
        which = "; ".join(f"step {s}: {p}" for s, p in damaged)
        raise UserError(
            f"every checkpoint in {self.directory} is damaged ({which}); nothing was moved. "
            f"Move {self.directory} away to train from scratch, or use a fresh --workdir"
        )

    # -- restoring -------------------------------------------------------------------------------

    def _try_restore(self, target: Any, step: int, say: Callable[[str], Any] | None) -> tuple[Any, str | None]:
        """The restored state and None, or None and why checkpoint ``step`` is damaged."""
        sealed = (self.directory / str(step) / MANIFEST).exists()
        problem = self.verify(step)
        if _disagree(problem):  # every process must take the same checkpoint
            return None, problem or "damaged as another process found"
        changes = self._check_fits(target, step)
        target = jax.tree.map(ocp.utils.to_shape_dtype_struct, target)
        try:
            with _quiet_orbax_coroutines():
                if changes:
                    restored = {"state": self._restore_changed(target, step)}
                else:
                    args = ocp.args.Composite(state=ocp.args.StandardRestore(target))
                    restored = self._manager.restore(step, args=args)
        except Exception as e:  # orbax and tensorstore raise many types for a damaged checkpoint
            problem = f"orbax cannot read it: {_root_cause(e)}"
        if problem is None and changes and say is not None:
            say(f"checkpoint step {step} in {self.directory}: {'; '.join(changes)}")
        if _disagree(problem):  # each process reads its own shards: one may fail where another does not
            return None, problem or "orbax cannot read it in another process"
        if not sealed and not self.read_only and self._primary:
            try:  # it restored, so it is complete: seal it, so that it counts for retention and damage shows
                self._seal(step)
            except OSError:
                pass  # only a missed chance; restoring worked
        return restored["state"], None

    def verify(self, step: int) -> str | None:
        """Why checkpoint ``step`` does not match its manifest (a missing, resized or changed file), or None.

        A checkpoint without a manifest (not sealed) has nothing to check against: None.
        """
        path = self.directory / str(step)
        try:
            manifest = json.loads((path / MANIFEST).read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as e:
            return f"its manifest {MANIFEST} cannot be read: {_os_reason(e) if isinstance(e, OSError) else e}"
        try:
            files = {str(name): (int(info["size"]), str(info["sha256"])) for name, info in manifest["files"].items()}
        except (KeyError, TypeError, ValueError, AttributeError):
            return f"its manifest {MANIFEST} is malformed"
        for name, (size, _) in files.items():  # sizes first: cheap, and most damage changes one
            try:
                found = (path / name).stat()
            except FileNotFoundError:
                return f"file {name} is missing"
            except OSError as e:
                return f"file {name} cannot be read: {_os_reason(e)}"
            if not (path / name).is_file():
                return f"{name} is not a file"
            if found.st_size != size:
                return f"file {name} has {found.st_size} bytes, expected {size}"
        for name, (_, digest) in files.items():
            try:
                actual = _sha256(path / name)
            except OSError as e:
                return f"file {name} cannot be read: {_os_reason(e)}"
            if actual != digest:
                return f"file {name} does not match its checksum"
        return None

    def _set_aside(self, steps: list[int]) -> None:
        """Move damaged checkpoints into ``damaged/`` (not when read-only), where orbax does not look."""
        if not steps or self.read_only:
            return
        if self._primary:
            for step in steps:
                source = self.directory / str(step)
                if not source.exists():
                    continue
                destination = self.directory / DAMAGED / str(step)
                n = 1
                while destination.exists():
                    destination = self.directory / DAMAGED / f"{step}.{n}"
                    n += 1
                try:
                    destination.parent.mkdir(exist_ok=True)
                    os.replace(source, destination)
                except OSError as e:
                    raise UserError(
                        f"cannot move the damaged checkpoint {source} aside ({_os_reason(e)}); "
                        "delete it and run the same command again"
                    ) from None
        _sync_processes("jaxnet: damaged checkpoints moved")
        self._manager.reload()  # orbax lists steps from memory; a moved step may be saved again

    def _restore_changed(self, target: Any, step: int) -> Any:
        """Checkpoint ``step``, saved in a layout that changed since (see :func:`changed_layout`), read
        as saved onto this process's first device, then in today's layout placed as ``target``
        (shape-dtype structs with shardings) says."""
        device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
        saved = self._manager.item_metadata(step)["state"]
        as_saved = jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=device), saved)
        restored = self._manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(as_saved)))
        flat, _ = model_base.migrate({_names(p): np.asarray(leaf) for p, leaf in _flat(restored["state"])})

        def place(path: tuple, want: jax.ShapeDtypeStruct) -> jax.Array:
            value = flat[_names(path)].astype(want.dtype)
            return jax.make_array_from_callback(want.shape, want.sharding, lambda index: value[index])

        return jax.tree_util.tree_map_with_path(place, target)

    def _check_fits(self, target: Any, step: int) -> list[str]:
        """Name the first array that is missing, extra or of another shape in the saved state.
        Returns the notes of the layout changes that make it fit (none: it fits as saved)."""
        try:
            saved = self._manager.item_metadata(step)["state"]
        except Exception:  # unreadable metadata: let restore report the damage
            return []
        if saved is None:
            return []
        flat = {_names(path): leaf for path, leaf in _flat(saved)}
        wanted_shapes = {_names(path): leaf.shape for path, leaf in _flat(target)}
        if not _same_shapes(flat, wanted_shapes):
            migrated, notes = model_base.migrate(flat)
            if notes and _same_shapes(migrated, wanted_shapes):
                return notes
            flat = migrated if notes else flat
        saved_shapes = {name: getattr(leaf, "shape", None) for name, leaf in flat.items()}
        where = f"checkpoint step {step} in {self.directory} does not fit this run"
        guess = lambda name: "parallel.sgd or parallel.workers" if name[0] == "workers" else "model or optimizer"
        # Training would write into the workdir; reading a run (evaluation) needs the model it trained.
        fix = READ_ONLY_MISFIT if self.read_only else "use a fresh --workdir"
        for name, shape in wanted_shapes.items():
            if name not in saved_shapes:
                raise UserError(f"{where}: it has no {'/'.join(name)} (another {guess(name)}?); {fix}")
            if saved_shapes[name] is not None and tuple(saved_shapes[name]) != tuple(shape):
                raise UserError(
                    f"{where}: {'/'.join(name)} has shape {tuple(saved_shapes[name])} there but {tuple(shape)} "
                    f"here; {fix}"
                )
        extra = sorted(set(saved_shapes) - set(wanted_shapes))
        if extra:
            raise UserError(
                f"{where}: it has {'/'.join(extra[0])}, which this run does not (another {guess(extra[0])}?); {fix}"
            )
        return []

    # -- saving ----------------------------------------------------------------------------------

    def _settle(self) -> None:
        """Wait for the pending save, seal it, and delete what is no longer kept."""
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        try:
            self._manager.wait_until_finished()
        except Exception as e:
            self._save_failed(pending[-1], e)
            raise
        best_saved = self._best_pending is not None and self._best_pending["step"] in pending
        if self.read_only or not self._primary:
            if best_saved:
                self._record_best()
            return
        for step in pending:
            try:
                self._seal(step)
            except OSError as e:
                self._save_failed(step, e)
                raise
        if best_saved:
            self._record_best()
        self._prune()

    def _seal(self, step: int) -> None:
        """Write the manifest of committed checkpoint ``step``: every file's size and SHA-256, read back from disk."""
        path = self.directory / str(step)
        if not path.is_dir():
            return
        files = {}
        for file in _files(path):
            name = file.relative_to(path).as_posix()
            files[name] = {"size": file.stat().st_size, "sha256": _sha256(file)}
        _write_atomically(path / MANIFEST, {"format": _MANIFEST_FORMAT, "step": step, "files": files})

    def _prune(self) -> None:
        """Delete every checkpoint older than the ``keep`` newest sealed ones, but the best."""
        if self.keep is None:
            return
        steps = self._list_steps()
        sealed = [s for s in steps if (self.directory / str(s) / MANIFEST).is_file()]
        if len(sealed) < self.keep:
            return
        best = self._best["step"] if self._best is not None else None
        doomed = [s for s in steps if s < sealed[-self.keep] and s != best]
        for step in doomed:
            try:
                _delete(self.directory / str(step))
            except OSError:
                pass  # tried again after the next save
        if doomed:
            self._manager.reload()

    def _save_failed(self, step: int, error: BaseException) -> None:
        """Turn a failed write while saving ``step`` into a :class:`UserError` (other errors are left to the
        caller to re-raise), removing what the save left behind."""
        failure = _write_failure(error)
        if failure is None:
            return
        space, reason = failure
        if self._primary:
            for leftover in self.directory.glob(f"{step}{_ORBAX_TMP}*"):
                _delete(leftover, rename=False)
            for leftover in (self.directory / str(step)).glob(f"{MANIFEST}.tmp*"):
                leftover.unlink(missing_ok=True)
        try:
            self._manager.reload()
        except Exception:  # the directory itself may be the problem; the error below says so
            pass
        intact = self._newest_intact(before=step)
        newest = (
            f"the newest intact checkpoint is step {intact}" if intact is not None else "there is no earlier checkpoint"
        )
        if space:
            raise UserError(
                f"no space left on device while saving checkpoint step {step} in {self.directory} ({reason}); "
                f"{newest}; free space and run the same command again"
            ) from None
        raise UserError(
            f"cannot write checkpoint step {step} in {self.directory} ({reason}); {newest}; "
            "fix that and run the same command again"
        ) from None

    def _newest_intact(self, before: int) -> int | None:
        """The newest checkpoint older than ``before`` that matches its manifest (or has none)."""
        try:
            steps = self._list_steps()
        except UserError:
            return None
        for step in reversed([s for s in steps if s < before]):
            if self.verify(step) is None:
                return step
        return None

    # -- the directory ---------------------------------------------------------------------------

    def _list_steps(self) -> list[int]:
        """Steps of the committed checkpoints on disk, oldest first, as orbax finds them (``<step>/`` directories)."""
        try:
            entries = list(os.scandir(self.directory))
        except FileNotFoundError:
            return []
        except OSError as e:
            raise UserError(f"cannot read checkpoint directory {self.directory}: {_os_reason(e)}") from None
        steps = []
        for entry in entries:
            if re.fullmatch(r"0|[1-9][0-9]*", entry.name) and entry.is_dir():
                steps.append(int(entry.name))
        return sorted(steps)

    def _remove_leftovers(self) -> None:
        """Remove orbax's temporary directories of interrupted saves, and checkpoints half deleted."""
        try:
            entries = list(os.scandir(self.directory))
        except OSError:
            return
        for entry in entries:
            if _ORBAX_TMP in entry.name or entry.name.startswith(_DELETING):
                try:
                    _delete(Path(entry.path), rename=False)
                except OSError:
                    pass  # orbax also removes its own when it saves the same step again


def _files(path: Path) -> list[Path]:
    """Every file under a step directory, in a fixed order, but its manifest and manifest temporaries."""
    found = []
    for root, dirs, names in os.walk(path):
        dirs.sort()
        for name in sorted(names):
            if Path(root) == path and name.startswith(MANIFEST):
                continue
            found.append(Path(root) / name)
    return found


def _sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _write_atomically(path: Path, content: Any) -> None:
    """Write JSON to ``path`` so that it is either absent or complete, even if the process dies."""
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "w") as f:
            json.dump(content, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    try:
        directory = os.open(path.parent, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(directory)
    except OSError:
        pass
    finally:
        os.close(directory)


def _delete(path: Path, rename: bool = True) -> None:
    """Delete a directory; first renamed (to a name no one takes for a checkpoint) if ``rename``."""
    if rename:
        doomed = path.with_name(f"{_DELETING}{path.name}")
        if doomed.exists():
            shutil.rmtree(doomed, ignore_errors=True)
        try:
            os.replace(path, doomed)
        except FileNotFoundError:
            return
        path = doomed
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def _root_cause(error: BaseException) -> str:
    """The first line of the innermost message in an exception's chain (tensorstore's, under orbax's)."""
    innermost, seen = error, {id(error)}
    cause = error.__cause__ or error.__context__
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if str(cause).strip():
            innermost = cause
        cause = cause.__cause__ or cause.__context__
    text = str(innermost).strip()
    line = text.splitlines()[0] if text else ""
    return f"{type(innermost).__name__}: {line[:300]}" if line else type(innermost).__name__


def _os_reason(error: OSError) -> str:
    return error.strerror or str(error) or type(error).__name__


def _write_failure(error: BaseException) -> tuple[bool, str] | None:
    """(whether out of space, the reason) if ``error`` is, or is caused by, a failed file-system write."""
    seen: set[int] = set()
    todo = [error]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno is not None:
            return e.errno in _SPACE_ERRNOS, _os_reason(e)
        found = _write_failure_text(str(e))
        if found is not None:
            return found
        todo += [e.__cause__, e.__context__, *getattr(e, "exceptions", ())]
    return None


def _write_failure_text(text: str) -> tuple[bool, str] | None:
    """Read a failed write out of a message, such as tensorstore's ``... [os_error_code='28']``."""
    match = _OS_ERROR_CODE.search(text)
    if match:
        code = int(match.group(1))
        return code in _SPACE_ERRNOS, os.strerror(code)
    for phrase in _SPACE_TEXTS:
        if phrase in text:
            return True, phrase
    return None


class _OrbaxWriteFailureFilter(logging.Filter):
    """Drop orbax's log records (tracebacks from its save threads) about a failed write: :class:`Checkpoints`
    reports that as one line."""

    def filter(self, record: logging.LogRecord) -> bool:
        if "orbax" not in record.pathname:
            return True
        text = record.getMessage()
        if record.exc_info and record.exc_info[1] is not None:
            text += f"\n{record.exc_info[1]}"
        return _write_failure_text(text) is None


_ORBAX_FILTER = _OrbaxWriteFailureFilter()


def _quiet_orbax_write_failures() -> None:
    logger = logging.getLogger("absl")
    if _ORBAX_FILTER not in logger.filters:
        logger.addFilter(_ORBAX_FILTER)


@contextlib.contextmanager
def _quiet_orbax_coroutines() -> Iterator[None]:
    """Silence "Exception ignored in: <coroutine ...>" from orbax's reads left behind when one read of a damaged
    checkpoint fails (the damage is reported in one line instead)."""
    previous = sys.unraisablehook

    def hook(unraisable: Any) -> None:
        code = getattr(unraisable.object, "cr_code", None)
        if code is None or "orbax" not in code.co_filename:
            previous(unraisable)

    sys.unraisablehook = hook
    try:
        yield
    except BaseException:
        gc.collect()  # the abandoned coroutines are reported when collected: now, while quiet
        raise
    finally:
        sys.unraisablehook = previous


def _sync_processes(name: str) -> None:
    """Wait until every process gets here (nothing to wait for in a single-process run)."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)


def _disagree(problem: str | None) -> bool:
    """Whether this process or any other found a problem (all processes must call this together)."""
    if jax.process_count() == 1:
        return problem is not None
    from jax.experimental import multihost_utils

    found = multihost_utils.process_allgather(np.asarray(problem is not None, dtype=np.int32))
    return bool(np.any(found))


def _flat(tree: Any) -> list:
    return jax.tree_util.tree_flatten_with_path(tree)[0]


def _same_shapes(saved: dict[tuple[str, ...], Any], wanted: dict[tuple[str, ...], tuple]) -> bool:
    """Whether saved leaves (by path) are exactly the wanted paths, of the wanted shapes (a saved
    leaf without a shape matches any)."""
    if saved.keys() != wanted.keys():
        return False
    shapes = ((getattr(leaf, "shape", None), wanted[name]) for name, leaf in saved.items())
    return all(have is None or tuple(have) == tuple(want) for have, want in shapes)


def changed_layout(tree: Any) -> tuple[Any, list[str]]:
    """``tree`` (a saved state or parameters as nested dicts and lists of arrays) in today's layout,
    and the notes of the changes that applied (:func:`jaxnet.models.base.migrate`; none: ``tree``
    itself)::

        params, notes = changed_layout(saved["params"])   # qkv -> query, key, value
    """
    flat = {_names(path): leaf for path, leaf in _flat(tree)}
    migrated, notes = model_base.migrate(flat)
    if not notes:
        return tree, []
    out = _copy_containers(tree)
    for name in flat.keys() - migrated.keys():
        *parents, leaf = name
        _node(out, parents).pop(leaf)
    for name in migrated.keys() - flat.keys():
        *parents, leaf = name
        _node(out, parents, create=True)[leaf] = migrated[name]
    return out, notes


def _copy_containers(tree: Any) -> Any:
    if isinstance(tree, dict):
        return {k: _copy_containers(v) for k, v in tree.items()}
    if isinstance(tree, list | tuple):
        return [_copy_containers(v) for v in tree]
    return tree


def _node(tree: Any, names: list[str], create: bool = False) -> Any:
    for name in names:
        if isinstance(tree, list):
            tree = tree[int(name)]
        elif create:
            tree = tree.setdefault(name, {})
        else:
            tree = tree[name]
    return tree


def _names(path: tuple) -> tuple[str, ...]:
    """A tree path as plain names, the same whether saved (dicts, lists) or live (attributes)."""
    names = []
    for key in path:
        for attr in ("key", "name", "idx"):
            if hasattr(key, attr):
                names.append(str(getattr(key, attr)))
                break
    return tuple(names)


def read_best(directory: str | os.PathLike) -> dict[str, Any] | None:
    """The record in ``directory/best.json`` (a checkpoint directory), or None if there is none or it
    cannot be read (a damaged record is rewritten at the next best)."""
    try:
        record = json.loads((Path(directory) / BEST).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("format") != _BEST_FORMAT or type(record.get("step")) is not int:
        return None
    return record


def best_step(workdir: str | os.PathLike) -> int | None:
    """The step of a run's best checkpoint, as ``train.keep_best`` or :func:`jaxnet.early_stop` chose
    it, or None if the run recorded none.

    The record is ``<workdir>/checkpoints/best.json``, written atomically once the checkpoint it names
    is sealed on disk::

        {"format": "jaxnet-best-checkpoint/1", "metric": "val/loss", "mode": "min", "step": 100, "value": 0.1234}

    ``metric`` is the validation metric compared, ``mode`` whether lower (``min``) or higher
    (``max``) is better, ``value`` its value at ``step``. The newest-N rotation never deletes that
    checkpoint::

        params = jaxnet.load_params("runs/mine", step=jaxnet.checkpoint.best_step("runs/mine"))
    """
    record = read_best(Path(workdir) / "checkpoints")
    return record["step"] if record is not None else None


def load_params(workdir: str | os.PathLike, step: int | str | None = None) -> Any:
    """A run's parameters, as a nested dict of numpy arrays named as in the checkpoint: those of
    checkpoint ``step`` (a number, or ``"best"``: see :func:`resolve_step`), or of the newest
    intact one. Needs neither the model nor its library
    (the shapes come from the checkpoint itself), so the weights of any run can be read anywhere::

        params = jaxnet.load_params("runs/mine")
        params["Dense_0"]["kernel"].shape   # (3, 16)

    ``"hf:PATH"`` reads a Hugging Face checkpoint directory instead, as the parameters of jaxnet's
    Transformer (:mod:`jaxnet.models.hf`; ``step`` does not apply)::

        params = jaxnet.load_params("hf:checkpoints/gpt2")
        params["block_0"]["attention"]["query"]["kernel"].shape   # (768, 12, 64)
    """
    from jaxnet.models import hf

    if hf.is_hf(workdir):
        if step is not None:
            raise UserError(f"{workdir} is a Hugging Face checkpoint, which has no steps; leave step unset")
        return hf.nested(hf.read(workdir).params())
    return load_state(workdir, step)["params"]


def resolve_step(workdir: str | os.PathLike, step: int | str | None) -> int | None:
    """``step`` as a checkpoint step: a number (or its digits) as it is, None (the newest) as it is,
    and ``"best"`` the step that ``checkpoints/best.json`` names (see :func:`best_step`, kept by
    ``train.keep_best``). A run without that file is a one-line :class:`UserError`."""
    if step is None or (isinstance(step, int) and not isinstance(step, bool)):
        return step
    if isinstance(step, str) and step.isdigit():
        return int(step)
    if step != "best":
        raise UserError(f"step {step!r}: expected a checkpoint step (a number), 'best', or none for the newest")
    directory = Path(workdir) / "checkpoints"
    record = read_best(directory)
    if record is None:
        if (directory / BEST).exists():
            raise UserError(f"{directory / BEST} cannot be read or names no checkpoint step; train on to rewrite it")
        raise UserError(f"{workdir} has no best checkpoint: train with train.keep_best=METRIC (e.g. val/loss)")
    return record["step"]


def load_state(workdir: str | os.PathLike, step: int | str | None = None) -> dict[str, Any]:
    """A run's whole saved train state (``step``, ``params``, ``opt_state``, ``model_state``, ...) as
    nested dicts of numpy arrays, from checkpoint ``step`` (a number or ``"best"``, see
    :func:`resolve_step`) or the newest one: what :func:`load_params`, :func:`jaxnet.load` and
    ``train.init_from`` read."""
    directory = Path(workdir) / "checkpoints"
    if not directory.exists():  # a file there is named by Checkpoints below
        raise UserError(f"{workdir} has no checkpoints; pass the run directory of a training run")
    step = resolve_step(workdir, step)
    ckpts = Checkpoints(directory, read_only=True)
    try:
        steps = ckpts.all_steps()
        at = step if step is not None else (steps[-1] if steps else None)
        if at is None or at not in steps:
            what = f"no checkpoint step {step}" if step is not None else "no checkpoint"
            raise UserError(f"{directory} has {what} (steps there: {', '.join(map(str, steps)) or 'none'})")
        # The saved shapes and dtypes, placed whole on this process's first device.
        device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
        saved = ckpts._manager.item_metadata(at)["state"]
        target = jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=device), saved)
        state = ckpts.restore(target, step)
    finally:
        ckpts.close()
    state, notes = changed_layout(jax.tree.map(np.asarray, state))
    if notes:  # said on stderr: what reads a run (jaxnet.load, predict, eval) may print its results on stdout
        print(f"checkpoint step {int(state['step'])} in {directory}: {'; '.join(notes)}", file=sys.stderr)
    return state

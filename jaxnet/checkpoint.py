"""Checkpoints with orbax: asynchronous saves, keep the newest K, restore onto any placement.

Each checkpoint ``checkpoints/<step>/`` holds the train state. The data position needs no
record of its own: the order of training examples is a function of (seed, step), and the step
is part of the state.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import jax
import orbax.checkpoint as ocp
from absl import logging as absl_logging

from jaxnet.errors import UserError


class Checkpoints:
    """The checkpoints of one run directory.

    >>> ckpts = Checkpoints("runs/a/checkpoints", keep=3)          # doctest: +SKIP
    >>> ckpts.save(100, state)                                      # doctest: +SKIP
    >>> state = ckpts.restore(abstract_state)  # newest, placed as the target says  # doctest: +SKIP
    """

    def __init__(self, directory: str | os.PathLike, keep: int = 3, asynchronous: bool = True, read_only: bool = False):
        self.directory = Path(directory).absolute()
        options = ocp.CheckpointManagerOptions(
            max_to_keep=None if read_only else keep,
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
        except PermissionError as e:
            raise UserError(f"cannot use checkpoint directory {self.directory}: {e.strerror}") from None
        finally:
            absl_logging.set_verbosity(verbosity)

    def latest_step(self) -> int | None:
        """The newest complete checkpoint's step, or None if there is none."""
        return self._manager.latest_step()

    def all_steps(self) -> list[int]:
        """Steps of every complete checkpoint, oldest first."""
        return sorted(self._manager.all_steps())

    def save(self, step: int, state: Any) -> None:
        """Start saving ``state`` at ``step``; returns once the arrays are copied off the devices."""
        self._manager.save(
            step,
            args=ocp.args.Composite(state=ocp.args.StandardSave(state)),
            force=True,
        )

    def restore(self, target: Any, step: int | None = None) -> Any:
        """Restore checkpoint ``step`` (default: newest) into the structure, shapes and placement of ``target``.

        ``target`` is a pytree of arrays or of ``jax.ShapeDtypeStruct`` with shardings. A checkpoint
        that does not fit it, or cannot be read, is a :class:`UserError` naming the problem.
        """
        step = self.latest_step() if step is None else step
        if step is None:
            raise UserError(f"no checkpoint in {self.directory}; train first with `jaxnet train`")
        self._check_fits(target, step)
        target = jax.tree.map(ocp.utils.to_shape_dtype_struct, target)
        try:
            restored = self._manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(target)))
        except Exception as e:  # orbax and tensorstore raise many types for a damaged checkpoint
            reason = str(e).strip().splitlines()[0][:200] if str(e).strip() else ""
            raise UserError(
                f"checkpoint step {step} in {self.directory} cannot be restored ({type(e).__name__}: {reason}); "
                f"delete {self.directory / str(step)} to fall back to an earlier one, or use a fresh --workdir"
            ) from None
        return restored["state"]

    def _check_fits(self, target: Any, step: int) -> None:
        """Name the first array that is missing, extra or of another shape in the saved state."""
        try:
            saved = self._manager.item_metadata(step)["state"]
        except Exception:  # unreadable metadata: let restore report the damage
            return
        if saved is None:
            return
        saved_shapes = {_names(path): getattr(leaf, "shape", None) for path, leaf in _flat(saved)}
        wanted_shapes = {_names(path): leaf.shape for path, leaf in _flat(target)}
        where = f"checkpoint step {step} in {self.directory} does not fit this run"
        for name, shape in wanted_shapes.items():
            if name not in saved_shapes:
                raise UserError(
                    f"{where}: it has no {'/'.join(name)} (another model or optimizer?); use a fresh --workdir"
                )
            if saved_shapes[name] is not None and tuple(saved_shapes[name]) != tuple(shape):
                raise UserError(
                    f"{where}: {'/'.join(name)} has shape {tuple(saved_shapes[name])} there but {tuple(shape)} "
                    "here; use a fresh --workdir"
                )
        extra = sorted(set(saved_shapes) - set(wanted_shapes))
        if extra:
            raise UserError(
                f"{where}: it has {'/'.join(extra[0])}, which this run does not (another model or optimizer?); "
                "use a fresh --workdir"
            )

    def wait(self) -> None:
        """Block until every pending save is on disk."""
        self._manager.wait_until_finished()

    def close(self) -> None:
        """Finish pending saves and release the manager's threads."""
        self._manager.close()


def _flat(tree: Any) -> list:
    return jax.tree_util.tree_flatten_with_path(tree)[0]


def _names(path: tuple) -> tuple[str, ...]:
    """A tree path as plain names, the same whether saved (dicts, lists) or live (attributes)."""
    names = []
    for key in path:
        for attr in ("key", "name", "idx"):
            if hasattr(key, attr):
                names.append(str(getattr(key, attr)))
                break
    return tuple(names)

"""Checkpoints with orbax: asynchronous saves, keep the newest K, restore onto any placement.

Each checkpoint ``checkpoints/<step>/`` holds the train state and a small JSON record of where
the data stream stands, so a resumed run continues with exactly the next batch.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import jax
import orbax.checkpoint as ocp

from jaxnet.errors import UserError


class Checkpoints:
    """The checkpoints of one run directory.

    >>> ckpts = Checkpoints("runs/a/checkpoints", keep=3)          # doctest: +SKIP
    >>> ckpts.save(100, state, {"data_step": 100})                  # doctest: +SKIP
    >>> state, meta = ckpts.restore(state)   # newest, placed like the given state  # doctest: +SKIP
    """

    def __init__(self, directory: str | os.PathLike, keep: int = 3, asynchronous: bool = True):
        self.directory = Path(directory).absolute()
        options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=True, enable_async_checkpointing=asynchronous)
        try:
            self._manager = ocp.CheckpointManager(
                self.directory,
                options=options,
                item_handlers={"state": ocp.StandardCheckpointHandler(), "meta": ocp.JsonCheckpointHandler()},
            )
        except PermissionError as e:
            raise UserError(f"cannot use checkpoint directory {self.directory}: {e.strerror}") from None

    def latest_step(self) -> int | None:
        """The newest complete checkpoint's step, or None if there is none."""
        return self._manager.latest_step()

    def all_steps(self) -> list[int]:
        """Steps of every complete checkpoint, oldest first."""
        return sorted(self._manager.all_steps())

    def save(self, step: int, state: Any, meta: dict[str, Any]) -> None:
        """Start saving ``state`` at ``step``; returns once the arrays are copied off the devices."""
        self._manager.save(
            step,
            args=ocp.args.Composite(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)),
            force=True,
        )

    def restore(self, like: Any, step: int | None = None) -> tuple[Any, dict[str, Any]]:
        """Restore checkpoint ``step`` (default: newest) with the structure and placement of ``like``."""
        step = self.latest_step() if step is None else step
        if step is None:
            raise UserError(f"no checkpoint in {self.directory}; train first with `jaxnet train`")
        self._check_shapes(like, step)
        target = jax.tree.map(ocp.utils.to_shape_dtype_struct, like)
        restored = self._manager.restore(
            step, args=ocp.args.Composite(state=ocp.args.StandardRestore(target), meta=ocp.args.JsonRestore())
        )
        return restored["state"], dict(restored["meta"])

    def _check_shapes(self, like: Any, step: int) -> None:
        """Name the first array whose saved shape differs from what the model expects."""
        try:
            saved = self._manager.item_metadata(step)["state"]
        except Exception:  # metadata is an optimisation of the error message, not a requirement
            return
        if saved is None:
            return
        saved_shapes = {_names(path): getattr(leaf, "shape", None) for path, leaf in _flat(saved)}
        for path, leaf in _flat(like):
            shape = saved_shapes.get(_names(path))
            if shape is not None and tuple(shape) != tuple(leaf.shape):
                name = "/".join(_names(path))
                raise UserError(
                    f"checkpoint step {step} in {self.directory} does not fit this model: {name} has shape "
                    f"{tuple(shape)} there but {tuple(leaf.shape)} here; use a fresh --workdir"
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

"""Fine-tuning: a new run starts from another run's parameters and model state (``train.init_from``).

Variables are matched by path, the tree path of each array joined by ``/`` with its collection in
front: ``params/Conv_0/kernel``, ``batch_stats/BatchNorm_0/mean`` (the names
:func:`jaxnet.load_params` nests under, with ``params/`` added). ``train.init_skip=REGEX`` leaves
the paths it matches freshly initialised (a new head); every other path must be in both runs with
the same shape. A carried ``carry`` collection (an LSTM's state between batches) belongs to the data
position, not to what was learned, and is never taken over.

>>> init = load(cfg, run, Path("runs/new"))   # doctest: +SKIP
>>> state = run.init_state(init)               # doctest: +SKIP
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import jax
import numpy as np

from jaxnet import checkpoint, parallel
from jaxnet.config import Config
from jaxnet.errors import UserError
from jaxnet.models.adapters.paths import joined

CARRIED = "carry"  # model state of the data position, left fresh


def parse(spec: str) -> tuple[Path, int | None]:
    """``RUN_DIR`` or ``RUN_DIR@STEP`` as ``(run directory, step or None)``."""
    directory, sep, step = spec.rpartition("@")
    if sep and step.isdigit():
        return Path(directory), int(step)
    if sep and not step.isdigit() and "/" not in step:
        raise UserError(f"train.init_from={spec!r}: expected RUN_DIR or RUN_DIR@STEP with STEP a number")
    return Path(spec), None


def resuming(workdir: Path) -> bool:
    """Whether ``workdir`` already has a checkpoint (a resumed run restores it, not ``train.init_from``)."""
    directory = workdir / "checkpoints"
    if not directory.is_dir():
        return False
    ckpts = checkpoint.Checkpoints(directory, read_only=True)
    try:
        return ckpts.latest_step() is not None
    finally:
        ckpts.close()


def variables(state: Any) -> dict[str, Any]:
    """The leaves of a train state (live, abstract or as saved) that fine-tuning carries over, by path."""
    get = (lambda k: state.get(k) or {}) if isinstance(state, dict) else (lambda k: getattr(state, k))
    tree = {"params": get("params"), **{k: v for k, v in dict(get("model_state")).items() if k != CARRIED}}
    return {joined(path): leaf for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


def load(cfg: Config, run: Any, workdir: Path) -> dict[str, np.ndarray] | None:
    """The values this run starts from, by path (see the module's docstring), or None when
    ``train.init_from`` is unset or ``workdir`` already has checkpoints to resume from.

    Everything is checked before anything is written: a source without checkpoints, a path on
    one side only, a shape that differs, an ``init_skip`` that matches nothing is a one-line
    :class:`UserError` naming them.
    """
    spec = cfg.train.init_from
    if not spec or resuming(workdir):
        return None
    source, step = parse(spec)
    if source.resolve() == workdir.resolve():
        raise UserError(f"train.init_from={spec} is this run's own workdir; name another run's directory")
    try:
        saved = checkpoint.load_state(source, step)
    except UserError as e:
        raise UserError(f"train.init_from={spec}: {e}") from None
    theirs = variables(saved)
    ours = variables(run.abstract_state())
    skip = re.compile(cfg.train.init_skip) if cfg.train.init_skip else None
    skipped = lambda name: skip is not None and skip.search(name) is not None
    if skip is not None and not any(skipped(n) for n in [*ours, *theirs]):
        raise UserError(
            f"train.init_skip={cfg.train.init_skip!r} matches no path of either run; the paths are {_some(list(ours))}"
        )
    missing = [n for n in ours if n not in theirs and not skipped(n)]
    extra = [n for n in theirs if n not in ours and not skipped(n)]
    if missing or extra:
        parts = [f"{source} lacks {_some(missing)}"] if missing else []
        parts += [f"this run lacks {_some(extra)}"] if extra else []
        raise UserError(
            f"train.init_from={spec} does not match this model: {'; '.join(parts)}; "
            "leave them fresh with train.init_skip=REGEX, or start from a run of the same model"
        )
    wrong = [
        f"{n} {tuple(theirs[n].shape)} there, {tuple(ours[n].shape)} here"
        for n in ours
        if not skipped(n) and tuple(theirs[n].shape) != tuple(ours[n].shape)
    ]
    if wrong:
        more = f" (and {len(wrong) - 3} more)" if len(wrong) > 3 else ""
        raise UserError(
            f"train.init_from={spec}: shapes differ: {'; '.join(wrong[:3])}{more}; "
            "leave them fresh with train.init_skip=REGEX"
        )
    taken = {n: theirs[n] for n in ours if not skipped(n)}
    if parallel.is_primary():
        fresh = len(ours) - len(taken)
        print(
            f"starting from {source} (step {int(saved['step'])}): {len(taken)} arrays taken over"
            + (f", {fresh} fresh (train.init_skip)" if fresh else "")
        )
    return taken


def _some(names: list[str], n: int = 4) -> str:
    """The first ``n`` of ``names``, comma-separated, with how many more there are."""
    more = f" and {len(names) - n} more" if len(names) > n else ""
    return ", ".join(names[:n]) + more

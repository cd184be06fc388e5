"""Experiment files: Python files with ``get_config(variant) -> Config``, found by name or path.

``load_experiment("NAME[:VARIANT]", overrides)`` finds ``NAME.py`` (:func:`experiment_dirs`),
runs it, calls its ``get_config(variant)``, validates the result and applies the overrides; an
error inside the file is one line naming the file and the line. The runner later looks in the
loaded module (:func:`experiment_module`) for its optional ``model(cfg)``, ``data(cfg)``,
``task(cfg)`` and ``actions(cfg)``.
"""

from __future__ import annotations

import difflib
import importlib.util
import sys
import traceback
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

from jaxnet.catalog import experiment_dirs, list_experiments
from jaxnet.config.overrides import apply_overrides
from jaxnet.config.schema import Config, validate
from jaxnet.errors import UserError


def _experiment_file(name: str) -> Path:
    if name.endswith(".py"):
        path = Path(name)
        if not path.is_file():
            raise UserError(f"experiment file {name} does not exist")
        return path
    for d in experiment_dirs():
        if (d / f"{name}.py").is_file():
            return d / f"{name}.py"
    known = list_experiments()
    near = difflib.get_close_matches(name, known, n=1)
    hint = f"did you mean {near[0]}? " if near else ""
    raise UserError(f"unknown experiment {name!r}; {hint}known: {', '.join(known) or 'none found'}")


_EXPERIMENT_MODULES: dict[str, types.ModuleType] = {}


def experiment_module(experiment: str) -> types.ModuleType | None:
    """The module :func:`load_experiment` most recently loaded for ``experiment`` (a
    ``cfg.experiment`` string, ``NAME`` or ``NAME:VARIANT``), or None.

    The runner looks in it for the experiment file's optional ``model(cfg)``, ``data(cfg)``,
    ``task(cfg)`` and ``actions(cfg)``.
    """
    return _EXPERIMENT_MODULES.get(experiment)


def load_experiment(spec: str, overrides: list[str] | None = None) -> Config:
    """Load ``NAME[:VARIANT]`` (or ``path/to/file.py[:VARIANT]``) and apply overrides.

    >>> cfg = load_experiment("cnn_fashion_mnist:smoke", ["optim.lr=0.01"])
    >>> cfg.optim.lr
    0.01
    """
    name, _, variant = spec.partition(":")
    variant = variant or "default"
    path = _experiment_file(name)
    module_spec = importlib.util.spec_from_file_location(f"jaxnet_experiment_{path.stem}", path)
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[module_spec.name] = module  # so its dataclasses' annotations resolve, as for an imported module
    _run_experiment_code(path, lambda: module_spec.loader.exec_module(module))
    if not callable(getattr(module, "get_config", None)):
        raise UserError(f"experiment file {path} has no get_config(variant) function")
    variants = getattr(module, "VARIANTS", ("default",))
    variants = (variants,) if isinstance(variants, str) else tuple(variants)
    if variant not in variants:
        raise UserError(f"experiment {path.stem} has no variant {variant!r}; variants: {', '.join(variants)}")
    cfg = _run_experiment_code(path, lambda: module.get_config(variant))
    if not isinstance(cfg, Config):
        raise UserError(f"{path}: get_config must return a jaxnet.Config, got {type(cfg).__name__}")
    cfg.experiment = path.stem if variant == "default" else f"{path.stem}:{variant}"
    _EXPERIMENT_MODULES[cfg.experiment] = module
    try:
        validate(cfg)
    except UserError as e:
        raise UserError(f"{path}: {e}") from None
    return apply_overrides(cfg, overrides or [])


def _run_experiment_code(path: Path, call: Callable[[], Any]) -> Any:
    """Run code from an experiment file, turning its errors into one line that points at the file."""
    try:
        return call()
    except UserError:
        raise
    except Exception as e:
        frames = [f for f in traceback.extract_tb(e.__traceback__) if Path(f.filename).resolve() == path.resolve()]
        line = e.lineno if isinstance(e, SyntaxError) else (frames[-1].lineno if frames else None)
        where = f"{path}:{line}" if line else str(path)
        raise UserError(f"{where}: {type(e).__name__}: {e}") from None

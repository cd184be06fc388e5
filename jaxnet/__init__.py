"""jaxnet: a small JAX training framework. Pure Flax models, one jitted step, a run directory.

>>> import jaxnet
>>> cfg = jaxnet.load_experiment("cnn_fashion_mnist:smoke", ["optim.lr=0.002"])  # doctest: +SKIP
>>> summary = jaxnet.train(cfg, "runs/smoke")                                     # doctest: +SKIP

Your own work: any JAX model (a Flax Linen or NNX module, an Equinox module, or
:class:`jaxnet.Model` of two pure functions), :func:`jaxnet.data.arrays`, a :class:`jaxnet.Task` (or one of
:mod:`jaxnet.tasks`) and periodic actions (:func:`jaxnet.every`)::

    summary = jaxnet.train(cfg, "runs/mine", model=MLP(), dataset=data, task=jaxnet.tasks.regression())
    y = jaxnet.load("runs/mine", model=MLP()).predict(x)     # a trained run's predictions (:func:`jaxnet.load`)
"""

import importlib
import sys
import types
from typing import Any

# First: the jaxnet command re-executes itself with its malloc settings before JAX loads, and
# XLA's CPU client gets room for simulated devices before anything starts it.
from jaxnet import _startup  # noqa: I001
from jaxnet.errors import UserError

_startup.make_room_for_simulated_devices()

# Everything else is imported when first used (`jaxnet.train`, `from jaxnet import Config`): the
# jaxnet command's --help and list, and a program that only reads a config, never load JAX.
_LAZY = {
    "Action": ("jaxnet.train.actions", "Action"),
    "Config": ("jaxnet.config", "Config"),
    "Dataset": ("jaxnet.data", "Dataset"),
    "Model": ("jaxnet.models.adapters", "Model"),
    "ModelConfig": ("jaxnet.config", "ModelConfig"),
    "Task": ("jaxnet.tasks", "Task"),
    "TextDataset": ("jaxnet.data", "TextDataset"),
    "apply_overrides": ("jaxnet.config", "apply_overrides"),
    "data": ("jaxnet.data", None),
    "evaluate": ("jaxnet.train", "evaluate"),
    "Trained": ("jaxnet.predict", "Trained"),
    "early_stop": ("jaxnet.train.best", "early_stop"),
    "every": ("jaxnet.train.actions", "every"),
    "generate": ("jaxnet.sample", "generate"),
    "load": ("jaxnet.predict", "load"),
    "load_experiment": ("jaxnet.config", "load_experiment"),
    "load_params": ("jaxnet.checkpoint", "load_params"),
    "models": ("jaxnet.models", None),
    "parallel": ("jaxnet.parallel", None),
    "plan": ("jaxnet.planner", "plan"),
    "sample": ("jaxnet.sample", "sample"),
    "sweep": ("jaxnet.sweep", "sweep"),
    "tasks": ("jaxnet.tasks", None),
    "train": ("jaxnet.train", "train"),
}


def __getattr__(name: str) -> Any:
    """The public names of :data:`_LAZY`, imported on first use."""
    if name not in _LAZY:
        raise AttributeError(f"module 'jaxnet' has no attribute {name!r}")
    module, attr = _LAZY[name]
    value = importlib.import_module(module)
    if attr is not None:
        value = getattr(value, attr)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


class _Package(types.ModuleType):
    """This package: when the import system binds a submodule that shares its name with a
    public function (``jaxnet.train``, ``jaxnet.sweep``, ``jaxnet.sample``) as an attribute, the
    function keeps the name, as when the package imported them all at once."""

    def __setattr__(self, name: str, value: Any) -> None:
        public = _LAZY.get(name, (None, None))
        if isinstance(value, types.ModuleType) and value.__name__ == public[0] and public[1] is not None:
            value = getattr(value, public[1])
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


__version__ = "0.1.0"

__all__ = [
    "Action",
    "Config",
    "Dataset",
    "Model",
    "ModelConfig",
    "Task",
    "TextDataset",
    "Trained",
    "UserError",
    "apply_overrides",
    "data",
    "early_stop",
    "evaluate",
    "every",
    "generate",
    "load",
    "load_experiment",
    "load_params",
    "models",
    "plan",
    "sample",
    "sweep",
    "tasks",
    "train",
]

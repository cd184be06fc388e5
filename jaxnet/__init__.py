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

# First: the jaxnet command re-executes itself with its malloc settings before JAX loads, and
# XLA's CPU client gets room for simulated devices before anything starts it.
from jaxnet import _startup  # noqa: I001
from jaxnet._lazy import lazy_package
from jaxnet.errors import UserError

_startup.make_room_for_simulated_devices()

# Everything else is imported when first used (`jaxnet.train`, `from jaxnet import Config`, a
# module such as `jaxnet.config`): the jaxnet command's --help and list, and a program that only
# reads a config, never load JAX.
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


lazy_package(__name__, _LAZY, submodules=True)


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

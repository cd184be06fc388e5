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

# First: the jaxnet command re-executes itself with its malloc settings before JAX loads.
from jaxnet import _startup  # noqa: F401, I001
from jaxnet import data, models, parallel, tasks
from jaxnet.checkpoint import load_params
from jaxnet.config import Config, ModelConfig, apply_overrides, load_experiment
from jaxnet.data import Dataset, TextDataset
from jaxnet.errors import UserError
from jaxnet.models.adapters import Model
from jaxnet.planner import plan
from jaxnet.predict import Trained, load
from jaxnet.sample import generate, sample
from jaxnet.sweep import sweep
from jaxnet.tasks import Task
from jaxnet.train import evaluate, train
from jaxnet.train.actions import Action, every
from jaxnet.train.best import early_stop

parallel.make_room_for_simulated_devices()  # before anything starts JAX's CPU client

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

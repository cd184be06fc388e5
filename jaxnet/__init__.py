"""jaxnet: a small JAX training framework. Pure Flax models, one jitted step, a run directory.

>>> import jaxnet
>>> cfg = jaxnet.load_experiment("cnn_fashion_mnist:smoke", ["optim.lr=0.002"])  # doctest: +SKIP
>>> summary = jaxnet.train(cfg, "runs/smoke")                                     # doctest: +SKIP

Your own work: any Flax module, :func:`jaxnet.data.arrays`, a :class:`jaxnet.Task` (or one of
:mod:`jaxnet.tasks`) and periodic actions (:func:`jaxnet.every`)::

    summary = jaxnet.train(cfg, "runs/mine", model=MLP(), dataset=data, task=jaxnet.tasks.regression())
"""

from jaxnet import data, models, tasks
from jaxnet.config import Config, ModelConfig, apply_overrides, load_experiment
from jaxnet.data import Dataset, TextDataset
from jaxnet.errors import UserError
from jaxnet.planner import plan
from jaxnet.sample import generate, sample
from jaxnet.sweep import sweep
from jaxnet.tasks import Task
from jaxnet.train import evaluate, train
from jaxnet.train.actions import Action, every

__version__ = "0.1.0"

__all__ = [
    "Action",
    "Config",
    "Dataset",
    "ModelConfig",
    "Task",
    "TextDataset",
    "UserError",
    "apply_overrides",
    "data",
    "evaluate",
    "every",
    "generate",
    "load_experiment",
    "models",
    "plan",
    "sample",
    "sweep",
    "tasks",
    "train",
]

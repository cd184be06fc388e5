"""jaxnet: a small JAX training framework. Pure Flax models, one jitted step, a run directory.

>>> import jaxnet
>>> cfg = jaxnet.load_experiment("cnn_fashion_mnist:smoke", ["optim.lr=0.002"])  # doctest: +SKIP
>>> summary = jaxnet.train(cfg, "runs/smoke")                                     # doctest: +SKIP
"""

from jaxnet.config import Config, ModelConfig, apply_overrides, load_experiment
from jaxnet.data import Dataset, TextDataset
from jaxnet.errors import UserError
from jaxnet.sample import generate, sample
from jaxnet.train import evaluate, train

__version__ = "0.1.0"

__all__ = [
    "Config",
    "Dataset",
    "ModelConfig",
    "TextDataset",
    "UserError",
    "apply_overrides",
    "evaluate",
    "generate",
    "load_experiment",
    "sample",
    "train",
]

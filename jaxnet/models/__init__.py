"""Model families: ``model.name`` in the config -> the family's config class -> a Flax Linen module.

A family is one file (or one package): a config dataclass (subclassing :class:`ModelConfig`, whose
fields are the family's ``model.*`` keys) whose ``build`` makes the module, the module itself, and
one line registering the config class under a name (:func:`register`). The family also owns its
FLOP count (:meth:`ModelConfig.forward_flops`) and the sharding rules of its own logical axis
names (:meth:`ModelConfig.axis_rules`). The built-in families are ``cnn.py`` (convnet, resnet),
``lstm.py`` and the ``transformer/`` package, imported below; Hugging Face checkpoints of the
Transformer come and go through ``hf/``. An experiment file registers its own family the same way,
and its keys are then set and checked like the built-in ones (``jaxnet train mine.py
model.hidden=128``)::

    @dataclass
    class MLPConfig(jaxnet.ModelConfig):
        hidden: int = jaxnet.config.field(64, "hidden units", low=1)

        def build(self, *, outputs, seq_len, batch_axis):
            return MLP(self.hidden, outputs)

    jaxnet.models.register("mlp", MLPConfig)

Image models are called as ``module.apply(variables, images, train=..., rngs=...)``, language
models as ``module.apply(variables, tokens, train=..., rngs=...)``; both return float32 logits.
Any Flax module with that call signature can be passed to :func:`jaxnet.train` directly instead,
as can a Flax NNX module, an Equinox module or :class:`jaxnet.Model` (:mod:`jaxnet.models.adapters`).
"""

from __future__ import annotations

import flax.linen as nn
import jax

from jaxnet.models.base import (
    BUILT_IN,
    INPUTS,
    REGISTRY,
    Build,
    Family,
    ModelConfig,
    family,
    field,
    model_config,
    register,
)
from jaxnet.models.cnn import ConvNet, ConvNetConfig, ResNet, ResNetConfig
from jaxnet.models.common import DTYPES
from jaxnet.models.lstm import LSTMConfig, LSTMLanguageModel
from jaxnet.models.transformer import TransformerConfig, TransformerLanguageModel, TransformerSpec


def resolve(cfg: ModelConfig, backend: str | None = None) -> ModelConfig:
    """``cfg`` with every ``auto`` replaced by what runs fastest on ``backend`` (JAX's default).

    On a GPU: bfloat16 compute (parameters and optimizer state stay ``param_dtype``, float32 by
    default), cuDNN's fused attention when the compute dtype is 16-bit and the head size suits it,
    and cuDNN's LSTM. On a CPU: float32, XLA's attention and the ``lax.scan`` LSTM. An explicit
    ``cudnn`` where it cannot run is a :class:`UserError`. Each family chooses its own settings
    (:meth:`ModelConfig.for_backend`).
    """
    if backend is None:
        backend = jax.default_backend()
        if backend == "gpu" and "rocm" in jax.devices()[0].client.platform_version.lower():
            backend = "rocm"  # an AMD GPU: no cuDNN (and its MIOpen LSTM orders the gates differently)
    return cfg.for_backend(backend)


def build(
    cfg: ModelConfig, num_classes: int, seq_len: int = 0, batch_axis: str | None = None, *, backend: str | None = None
) -> nn.Module:
    """The module of family ``cfg.name`` with ``num_classes`` outputs (the vocabulary size for
    language models); ``seq_len`` is the Transformer's context. ``batch_axis`` names the mesh
    axes a per-device (``shard_map``) model averages BatchNorm statistics over. ``auto`` settings
    are resolved for ``backend`` (JAX's default when None, see :func:`resolve`)."""
    return family(cfg.name).module(resolve(cfg, backend), num_classes, seq_len, batch_axis)


__all__ = [
    "BUILT_IN",
    "DTYPES",
    "INPUTS",
    "REGISTRY",
    "Build",
    "ConvNet",
    "ConvNetConfig",
    "Family",
    "LSTMConfig",
    "LSTMLanguageModel",
    "ModelConfig",
    "ResNet",
    "ResNetConfig",
    "TransformerConfig",
    "TransformerLanguageModel",
    "TransformerSpec",
    "build",
    "family",
    "field",
    "model_config",
    "register",
    "resolve",
]

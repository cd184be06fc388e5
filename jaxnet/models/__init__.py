"""Model registry: ``model.name`` in the config -> a Flax Linen module.

Image models are called as ``module.apply(variables, images, train=..., rngs=...)``, language
models as ``module.apply(variables, tokens, train=..., rngs=...)``; both return float32 logits.
Any Flax module with that call signature can be passed to :func:`jaxnet.train` directly instead.
"""

from __future__ import annotations

from collections.abc import Callable

import flax.linen as nn
import jax.numpy as jnp

from jaxnet.config import ModelConfig
from jaxnet.models.cnn import ConvNet, ResNet
from jaxnet.models.lstm import LSTMLanguageModel
from jaxnet.models.transformer import TransformerLanguageModel

# float64 needs JAX's 64-bit mode (JAX_ENABLE_X64=1); it is there for numerical checks.
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16, "float64": jnp.float64}

# Each entry: (model config, number of classes or vocabulary size, sequence length, mesh axes
# BatchNorm averages over per device) -> module.
REGISTRY: dict[str, Callable[..., nn.Module]] = {
    "convnet": lambda c, n, t, b: ConvNet(n, c.features, c.hidden, c.dropout, DTYPES[c.dtype], DTYPES[c.param_dtype]),
    "resnet": lambda c, n, t, b: ResNet(n, c.features, c.blocks, DTYPES[c.dtype], DTYPES[c.param_dtype], b),
    "lstm": lambda c, n, t, b: LSTMLanguageModel(
        n, c.layers, c.width, c.dropout, c.init_scale, c.tie_embeddings, DTYPES[c.dtype], DTYPES[c.param_dtype]
    ),
    "transformer": lambda c, n, t, b: TransformerLanguageModel(
        n,
        t,
        c.layers,
        c.width,
        c.heads,
        c.mlp_ratio,
        c.dropout,
        c.position,
        c.tie_embeddings,
        DTYPES[c.dtype],
        DTYPES[c.param_dtype],
    ),
}

LANGUAGE_MODELS = ("lstm", "transformer")


def build(cfg: ModelConfig, num_classes: int, seq_len: int = 0, batch_axis: str | None = None) -> nn.Module:
    """The module named by ``cfg.name`` with ``num_classes`` outputs (the vocabulary size for
    language models); ``seq_len`` is the Transformer's context. ``batch_axis`` names the mesh
    axes a per-device (``shard_map``) model averages BatchNorm statistics over."""
    return REGISTRY[cfg.name](cfg, num_classes, seq_len, batch_axis)


__all__ = ["ConvNet", "ResNet", "LSTMLanguageModel", "TransformerLanguageModel", "build", "REGISTRY"]

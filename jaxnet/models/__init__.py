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

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}

# Each entry: (model config, number of classes or vocabulary size, sequence length) -> module.
REGISTRY: dict[str, Callable[[ModelConfig, int, int], nn.Module]] = {
    "convnet": lambda c, n, _: ConvNet(n, c.features, c.hidden, c.dropout, DTYPES[c.dtype], DTYPES[c.param_dtype]),
    "resnet": lambda c, n, _: ResNet(n, c.features, c.blocks, DTYPES[c.dtype], DTYPES[c.param_dtype]),
    "lstm": lambda c, n, _: LSTMLanguageModel(
        n, c.layers, c.width, c.dropout, c.init_scale, c.tie_embeddings, DTYPES[c.dtype], DTYPES[c.param_dtype]
    ),
    "transformer": lambda c, n, t: TransformerLanguageModel(
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


def build(cfg: ModelConfig, num_classes: int, seq_len: int = 0) -> nn.Module:
    """The module named by ``cfg.name`` with ``num_classes`` outputs (the vocabulary size for
    language models); ``seq_len`` is the Transformer's context."""
    return REGISTRY[cfg.name](cfg, num_classes, seq_len)


__all__ = ["ConvNet", "ResNet", "LSTMLanguageModel", "TransformerLanguageModel", "build", "REGISTRY"]

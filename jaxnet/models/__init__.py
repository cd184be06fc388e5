"""Model registry: ``model.name`` in the config -> a Flax Linen module.

Every module is called as ``module.apply(variables, inputs, train=..., rngs=...)`` and returns
float32 logits. Any Flax module with that call signature can be passed to
:func:`jaxnet.train` directly instead.
"""

from __future__ import annotations

from collections.abc import Callable

import flax.linen as nn
import jax.numpy as jnp

from jaxnet.config import ModelConfig
from jaxnet.models.cnn import ConvNet, ResNet

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}

REGISTRY: dict[str, Callable[[ModelConfig, int], nn.Module]] = {
    "convnet": lambda c, n: ConvNet(n, c.features, c.hidden, c.dropout, DTYPES[c.dtype], DTYPES[c.param_dtype]),
    "resnet": lambda c, n: ResNet(n, c.features, c.blocks, DTYPES[c.dtype], DTYPES[c.param_dtype]),
}


def build(cfg: ModelConfig, num_classes: int) -> nn.Module:
    """The module named by ``cfg.name`` with ``num_classes`` outputs."""
    return REGISTRY[cfg.name](cfg, num_classes)


__all__ = ["ConvNet", "ResNet", "build", "REGISTRY"]

"""Convolutional image classifiers in Flax Linen, NHWC layout.

- :class:`ConvNet`: conv-relu-maxpool layers, then a dense hidden layer. Small and quick on a CPU.
- :class:`ResNet`: the CIFAR-style residual network of He et al. (2016): a 3x3 stem, stages of
  basic blocks (two 3x3 convolutions with BatchNorm), each stage after the first halving the
  resolution, then global average pooling. BatchNorm running statistics live in the
  ``batch_stats`` collection and are used when ``train=False``.

``dtype`` is the compute dtype and ``param_dtype`` the storage dtype of the parameters, so
``dtype=jnp.bfloat16, param_dtype=jnp.float32`` is bf16 compute with f32 master weights.
Every model maps ``(images, train)`` to float32 logits.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import flax.linen as nn
import jax.numpy as jnp

Dtype = Any


class ConvNet(nn.Module):
    """``[conv3x3 - relu - maxpool2]`` per entry of ``features``, then dense layers."""

    num_classes: int
    features: Sequence[int] = (32, 64)
    hidden: int = 256
    dropout: float = 0.0
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32

    @nn.compact
    def __call__(self, x: jnp.ndarray, train: bool = False) -> jnp.ndarray:
        x = x.astype(self.dtype)
        for width in self.features:
            x = nn.Conv(width, (3, 3), dtype=self.dtype, param_dtype=self.param_dtype)(x)
            x = nn.max_pool(nn.relu(x), (2, 2), strides=(2, 2))
        x = x.reshape(x.shape[0], -1)
        x = nn.Dropout(self.dropout, deterministic=not train)(x)
        x = nn.relu(nn.Dense(self.hidden, dtype=self.dtype, param_dtype=self.param_dtype)(x))
        x = nn.Dropout(self.dropout, deterministic=not train)(x)
        x = nn.Dense(self.num_classes, dtype=self.dtype, param_dtype=self.param_dtype)(x)
        return x.astype(jnp.float32)


class ResidualBlock(nn.Module):
    """Two 3x3 conv-BatchNorm layers and a shortcut (a 1x1 projection when the shape changes)."""

    features: int
    strides: int = 1
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32

    @nn.compact
    def __call__(self, x: jnp.ndarray, train: bool) -> jnp.ndarray:
        conv = lambda f, k, s: nn.Conv(  # noqa: E731
            f, (k, k), (s, s), use_bias=False, dtype=self.dtype, param_dtype=self.param_dtype
        )
        norm = lambda **kw: nn.BatchNorm(  # noqa: E731
            use_running_average=not train, momentum=0.9, dtype=self.dtype, param_dtype=self.param_dtype, **kw
        )
        y = nn.relu(norm()(conv(self.features, 3, self.strides)(x)))
        # Zero-initialised last scale: each block starts as the identity, which trains faster.
        y = norm(scale_init=nn.initializers.zeros)(conv(self.features, 3, 1)(y))
        if x.shape != y.shape:
            x = norm()(conv(self.features, 1, self.strides)(x))
        return nn.relu(x + y)


class ResNet(nn.Module):
    """CIFAR-style ResNet: ``features[i]`` channels and ``blocks[i]`` blocks in stage ``i``.

    ``features=(16, 32, 64), blocks=(3, 3, 3)`` is ResNet-20.
    """

    num_classes: int
    features: Sequence[int] = (16, 32, 64)
    blocks: Sequence[int] = (3, 3, 3)
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32

    @nn.compact
    def __call__(self, x: jnp.ndarray, train: bool = False) -> jnp.ndarray:
        x = x.astype(self.dtype)
        x = nn.Conv(self.features[0], (3, 3), use_bias=False, dtype=self.dtype, param_dtype=self.param_dtype)(x)
        x = nn.BatchNorm(use_running_average=not train, momentum=0.9, dtype=self.dtype, param_dtype=self.param_dtype)(x)
        x = nn.relu(x)
        for stage, (width, count) in enumerate(zip(self.features, self.blocks, strict=True)):
            for block in range(count):
                strides = 2 if stage > 0 and block == 0 else 1
                x = ResidualBlock(width, strides, self.dtype, self.param_dtype)(x, train)
        x = jnp.mean(x, axis=(1, 2))
        x = nn.Dense(self.num_classes, dtype=self.dtype, param_dtype=self.param_dtype)(x)
        return x.astype(jnp.float32)

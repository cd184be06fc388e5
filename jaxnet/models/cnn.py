"""Convolutional image classifiers in Flax Linen, NHWC layout.

- :class:`ConvNet`: conv-relu-maxpool layers, then a dense hidden layer. Small and quick on a CPU.
- :class:`ResNet`: the CIFAR-style residual network of He et al. (2016): a 3x3 stem, stages of
  basic blocks (two 3x3 convolutions with BatchNorm), each stage after the first halving the
  resolution, then global average pooling. BatchNorm running statistics live in the
  ``batch_stats`` collection and are used when ``train=False``.

``dtype`` is the compute dtype and ``param_dtype`` the storage dtype of the parameters, so
``dtype=jnp.bfloat16, param_dtype=jnp.float32`` is bf16 compute with f32 master weights.
Every model maps ``(images, train)`` to float32 logits (float64 if ``dtype`` is).

Parameters carry logical axis names for the parallelism rules: a kernel's input channels are
``embed`` (split for FSDP) and its output channels ``mlp`` (split for tensor parallelism); the
first convolution's 1 or 3 input channels and the classifier's outputs are never split.
Activations are marked ``(batch, ..., mlp)`` so the compiler keeps channels where the kernels are.

:class:`ConvNetConfig` and :class:`ResNetConfig` are their ``model.*`` config keys and make the
modules (``build``); the two lines at the end register them as ``convnet`` and ``resnet``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxnet.errors import UserError
from jaxnet.models.base import ModelConfig, field, register
from jaxnet.models.common import DTYPES, conv_for_members

Dtype = Any


@dataclass
class ConvNetConfig(ModelConfig):
    """``model.*`` keys of :class:`ConvNet`."""

    features: tuple[int, ...] = field((32, 64), "channels per conv layer", low=1)
    hidden: int = field(256, "width of the dense layer before the classifier", low=1)
    dropout: float = field(0.0, "dropout rate before the dense layers", low=0.0, high=0.95)

    def build(self, *, outputs: int, seq_len: int = 0, batch_axis: Any = None) -> ConvNet:
        """The :class:`ConvNet` this config describes (its dtypes resolved, see :func:`jaxnet.models.resolve`)."""
        return ConvNet(outputs, self.features, self.hidden, self.dropout, DTYPES[self.dtype], DTYPES[self.param_dtype])

    def forward_flops(self, *, batch: int, input_shape: tuple, outputs: int, causal: bool = True) -> float:
        """The convolutions (only the kernel positions that fall on the image) and the dense layers."""
        height, _, c_in = input_shape
        total, size = 0.0, height
        for c_out in self.features:
            total += conv_flops(batch, size, 3, c_in, c_out)
            size, c_in = size // 2, c_out
        flat = size * size * c_in
        return total + 2 * batch * (flat * self.hidden + self.hidden * outputs)


@dataclass
class ResNetConfig(ModelConfig):
    """``model.*`` keys of :class:`ResNet` (the defaults are ResNet-20)."""

    features: tuple[int, ...] = field((16, 32, 64), "channels per stage", low=1)
    blocks: tuple[int, ...] = field((3, 3, 3), "residual blocks per stage", low=1)

    def validate(self) -> None:
        if len(self.features) != len(self.blocks):
            raise UserError(
                f"model.features={self.features} and model.blocks={self.blocks} must have one entry "
                "per ResNet stage each"
            )

    def build(self, *, outputs: int, seq_len: int = 0, batch_axis: Any = None) -> ResNet:
        """The :class:`ResNet` this config describes; ``batch_axis`` names the mesh axes BatchNorm averages over."""
        return ResNet(outputs, self.features, self.blocks, DTYPES[self.dtype], DTYPES[self.param_dtype], batch_axis)

    def forward_flops(self, *, batch: int, input_shape: tuple, outputs: int, causal: bool = True) -> float:
        """The convolutions (projection shortcuts included) and the classifier."""
        height, _, channels = input_shape
        total, size = conv_flops(batch, height, 3, channels, self.features[0]), height
        c_in = self.features[0]
        for stage, (c_out, count) in enumerate(zip(self.features, self.blocks, strict=True)):
            for block in range(count):
                stride = 2 if stage > 0 and block == 0 else 1
                if c_in != c_out or stride > 1:
                    total += conv_flops(batch, size, 1, c_in, c_out, stride)  # projection shortcut
                total += conv_flops(batch, size, 3, c_in, c_out, stride)
                size = -(-size // stride)
                total += conv_flops(batch, size, 3, c_out, c_out)
                c_in = c_out
        return total + 2 * batch * c_in * outputs


def _taps(size: int, kernel: int, stride: int) -> int:
    """Kernel positions that land on the input, summed over the outputs of one axis of a 'SAME'
    convolution (positions over the zero padding multiply nothing and are not counted)."""
    out = -(-size // stride)
    pad = max((out - 1) * stride + kernel - size, 0) // 2
    return sum(1 for o in range(out) for t in range(kernel) if 0 <= o * stride + t - pad < size)


def conv_flops(batch: int, size: int, kernel: int, c_in: int, c_out: int, stride: int = 1) -> float:
    """FLOPs of a square 'SAME' convolution of a ``size`` x ``size`` input, counting only the kernel
    positions that fall on the image."""
    return 2 * batch * _taps(size, kernel, stride) ** 2 * c_in * c_out


_IMAGE_ACT = ("batch", None, None, "mlp")


def max_pool_2x2(x: jnp.ndarray) -> jnp.ndarray:
    """2x2 max pooling with stride 2 (an odd last row or column is dropped, as ``nn.max_pool`` does).

    The same values as ``nn.max_pool``, computed as the maximum of four strided views, with a
    gradient that is elementwise arithmetic: XLA's CPU backend runs both as parallel loops, where
    the reduce-window form's gradient (select-and-scatter) is a slow scalar loop (14x slower at
    the ConvNet's first pooling layer) and a reshape-and-max form spends its time in reductions
    (about 3x slower than this one for the first layer's forward and backward; see
    scripts/profile_conv.py). Where several inputs of a window tie for the maximum the gradient
    is shared equally between them (as JAX's gradient of ``max`` over axes does), rather than
    given to the first.

    The gradient finds each window's maximum by comparing ``x`` with the pooled values, so ``x``
    must come out bit for bit the same wherever XLA recomputes it inside a fused operation. A
    convolution's output plus a bias, then relu, does. A chain of multiply-adds fused into the
    pooling may not: XLA's CPU code contracts multiply-adds into FMAs, and a first layer written
    that way gave wrong gradients in the compiled step (the case is kept by
    ``test_the_compiled_train_step_has_the_gradients_of_op_by_op_execution`` in
    ``tests/test_cpu_conv.py``).
    """
    n, h, w, c = x.shape
    return _pool_2x2(x[:, : h - h % 2, : w - w % 2])


def _window_max(x: jnp.ndarray) -> jnp.ndarray:
    top = jnp.maximum(x[:, 0::2, 0::2], x[:, 0::2, 1::2])
    return jnp.maximum(top, jnp.maximum(x[:, 1::2, 0::2], x[:, 1::2, 1::2]))


def _upsample_2x2(y: jnp.ndarray) -> jnp.ndarray:
    """Each pixel of ``y`` repeated over its 2x2 window (NHWC)."""
    n, h, w, c = y.shape
    return jnp.broadcast_to(y[:, :, None, :, None], (n, h, 2, w, 2, c)).reshape(n, 2 * h, 2 * w, c)


@jax.custom_vjp
def _pool_2x2(x: jnp.ndarray) -> jnp.ndarray:
    return _window_max(x)


def _pool_2x2_forward(x: jnp.ndarray) -> tuple[jnp.ndarray, tuple]:
    y = _window_max(x)
    return y, (x, y)


def _pool_2x2_backward(saved: tuple, g: jnp.ndarray) -> tuple[jnp.ndarray]:
    x, y = saved
    winners = (x == _upsample_2x2(y)).astype(g.dtype)
    # The ties per window, summed in views rather than by a reduction (small integers: exact).
    ties = winners[:, 0::2, 0::2] + winners[:, 0::2, 1::2] + winners[:, 1::2, 0::2] + winners[:, 1::2, 1::2]
    return (winners * _upsample_2x2(g / ties),)


_pool_2x2.defvjp(_pool_2x2_forward, _pool_2x2_backward)


def _named(init: nn.initializers.Initializer, *names: str | None) -> nn.initializers.Initializer:
    return nn.with_logical_partitioning(init, names)


def _conv(features: int, kernel: int, strides: int = 1, *, first: bool = False, **kw: Any) -> nn.Conv:
    """A convolution whose kernel is named ``(None, None, embed, mlp)`` (``None`` inputs if ``first``)."""
    return nn.Conv(
        features,
        (kernel, kernel),
        (strides, strides),
        kernel_init=_named(nn.initializers.lecun_normal(), None, None, None if first else "embed", "mlp"),
        bias_init=_named(nn.initializers.zeros, "mlp"),
        conv_general_dilated=conv_for_members(),
        **kw,
    )


def _dense(features: int, hidden: bool, **kw: Any) -> nn.Dense:
    """A dense layer named ``(embed, mlp)``, or ``(embed, None)`` for the classifier (``hidden=False``)."""
    out = "mlp" if hidden else None
    return nn.Dense(
        features,
        kernel_init=_named(nn.initializers.lecun_normal(), "embed", out),
        bias_init=_named(nn.initializers.zeros, out),
        **kw,
    )


def _batch_norm(train: bool, dtype: Dtype, param_dtype: Dtype, axis_name: Any, **kw: Any) -> nn.BatchNorm:
    """BatchNorm over the global batch; ``axis_name`` names the devices to average over inside
    ``shard_map`` (under ``jit`` the batch is one global array and no name is needed)."""
    return nn.BatchNorm(
        use_running_average=not train,
        momentum=0.9,
        dtype=dtype,
        param_dtype=param_dtype,
        axis_name=axis_name,
        # statistics in float32 under bf16 (Flax's default), in float64 for float64 checks
        force_float32_reductions=jnp.finfo(dtype).bits < 64,
        scale_init=_named(kw.pop("scale_init", nn.initializers.ones), "mlp"),
        bias_init=_named(nn.initializers.zeros, "mlp"),
        **kw,
    )


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
        kw = {"dtype": self.dtype, "param_dtype": self.param_dtype}
        for i, width in enumerate(self.features):
            x = nn.with_logical_constraint(_conv(width, 3, first=i == 0, **kw)(x), _IMAGE_ACT)
            x = max_pool_2x2(nn.relu(x))
        x = x.reshape(x.shape[0], -1)
        x = nn.Dropout(self.dropout, deterministic=not train)(x)
        x = nn.relu(nn.with_logical_constraint(_dense(self.hidden, True, **kw)(x), ("batch", "mlp")))
        x = nn.Dropout(self.dropout, deterministic=not train)(x)
        x = _dense(self.num_classes, False, **kw)(x)
        return x.astype(jnp.promote_types(self.dtype, jnp.float32))


class ResidualBlock(nn.Module):
    """Two 3x3 conv-BatchNorm layers and a shortcut (a 1x1 projection when the shape changes)."""

    features: int
    strides: int = 1
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32
    batch_axis: Any = None

    @nn.compact
    def __call__(self, x: jnp.ndarray, train: bool) -> jnp.ndarray:
        kw = {"use_bias": False, "dtype": self.dtype, "param_dtype": self.param_dtype}
        norm = lambda **kw: _batch_norm(train, self.dtype, self.param_dtype, self.batch_axis, **kw)  # noqa: E731
        y = nn.relu(norm()(_conv(self.features, 3, self.strides, **kw)(x)))
        y = nn.with_logical_constraint(y, _IMAGE_ACT)
        # Zero-initialised last scale: each block starts as the identity, which trains faster.
        y = norm(scale_init=nn.initializers.zeros)(_conv(self.features, 3, **kw)(y))
        if x.shape != y.shape:
            x = norm()(_conv(self.features, 1, self.strides, **kw)(x))
        return nn.with_logical_constraint(nn.relu(x + y), _IMAGE_ACT)


class ResNet(nn.Module):
    """CIFAR-style ResNet: ``features[i]`` channels and ``blocks[i]`` blocks in stage ``i``.

    ``features=(16, 32, 64), blocks=(3, 3, 3)`` is ResNet-20. ``batch_axis`` names the mesh axes
    BatchNorm averages its statistics over when the model runs per device inside ``shard_map``
    (``parallel.mode=replicas``); under ``jit`` the statistics are global without it.
    """

    num_classes: int
    features: Sequence[int] = (16, 32, 64)
    blocks: Sequence[int] = (3, 3, 3)
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32
    batch_axis: Any = None

    @nn.compact
    def __call__(self, x: jnp.ndarray, train: bool = False) -> jnp.ndarray:
        x = x.astype(self.dtype)
        kw = {"dtype": self.dtype, "param_dtype": self.param_dtype}
        x = _conv(self.features[0], 3, first=True, use_bias=False, **kw)(x)
        x = nn.relu(_batch_norm(train, self.dtype, self.param_dtype, self.batch_axis)(x))
        for stage, (width, count) in enumerate(zip(self.features, self.blocks, strict=True)):
            for block in range(count):
                strides = 2 if stage > 0 and block == 0 else 1
                x = ResidualBlock(width, strides, self.dtype, self.param_dtype, self.batch_axis)(x, train)
        x = jnp.mean(x, axis=(1, 2))
        x = _dense(self.num_classes, False, **kw)(x)
        return x.astype(jnp.promote_types(self.dtype, jnp.float32))


register("convnet", ConvNetConfig, inputs="images")
register("resnet", ResNetConfig, inputs="images")

"""PyTorch twins of jaxnet's four Flax models and a small trainer, for the benchmark only. The
Transformer has two twins, the shapes benchmarks compare: GPT's (causal, multi-head, LayerNorm,
tanh GELU) and Llama's (RMSNorm, SwiGLU, grouped-query attention, rotary positions, no biases);
they are the peers a benchmark compares with, not a second home of every variant.

torch is an optional peer, never a dependency of jaxnet: this module imports without it, and
:func:`available` says whether it is there. Everything else raises a clear ``ImportError`` when
torch is missing.

Each model computes what its Flax counterpart in :mod:`jaxnet.models` computes (same layers,
shapes, parameter count and float32 math), so that :func:`load_flax_params` can copy a Flax
model's variables across and the logits agree to rounding. Layout conventions follow torch where
it is faster (NCHW convolutions fed a channels-last view, ``nn.LSTM``, fused attention), never
where it would change the result. Two deliberate differences, neither of which changes a logit
or a training loss:

- The LSTM's ``nn.LSTM`` has two bias vectors per layer where jaxnet's has one; the second
  (``bias_hh``) is frozen at zero (``requires_grad=False``) and left out of the optimizer, so the
  trainable parameters are the same.
- ``nn.BatchNorm2d`` updates its running variance with the unbiased batch variance, Flax with the
  biased one (a factor ``n / (n - 1)`` with ``n`` = batch x height x width, a few parts in 10^4
  on CIFAR); training-mode outputs are identical, running averages differ by that much.

:class:`Trainer` matches :func:`jaxnet.optim.build` (AdamW or SGD, the same schedule, global-norm
clipping) and the loss of :mod:`jaxnet.train.step` (mean cross-entropy, optional label smoothing).
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import math
import os
import subprocess
import sys
from typing import Any

import numpy as np

try:
    import torch
    import torch.nn.functional as F  # noqa: N812
    from torch import nn
except (ImportError, OSError) as _error:  # no torch, or a broken one: available() says None
    torch = F = None
    _IMPORT_ERROR: Exception | None = _error

    class nn:  # noqa: N801 - stands in for torch.nn so that the classes below can be defined
        """Placeholder for ``torch.nn`` when torch is not installed."""

        Module = object
else:
    _IMPORT_ERROR = None


def _image_model(model_cfg: Any) -> bool:
    from jaxnet.models import ConvNetConfig, ResNetConfig

    return isinstance(model_cfg, ConvNetConfig | ResNetConfig)


def _family(model_cfg: Any) -> str:
    """Which twin ``model_cfg`` (a built-in family's config) has: convnet, resnet, lstm or gpt."""
    from jaxnet.models import ConvNetConfig, LSTMConfig, ResNetConfig, TransformerConfig

    kinds = {ConvNetConfig: "convnet", ResNetConfig: "resnet", LSTMConfig: "lstm", TransformerConfig: "gpt"}
    for cls, kind in kinds.items():
        if isinstance(model_cfg, cls):
            return kind
    raise ValueError(f"no torch twin for model {model_cfg.name!r}; choose convnet, resnet, lstm or transformer")


def available() -> str | None:
    """torch's version string if torch can be imported, else None."""
    return None if torch is None else str(torch.__version__)


def _require() -> None:
    if torch is None:
        raise ImportError(
            f"jaxnet.bench.torch_peers needs PyTorch, which is not installed ({_IMPORT_ERROR}); "
            "install torch to benchmark against it"
        ) from _IMPORT_ERROR


def _lecun_normal_(weight: Any, fan_in: int) -> None:
    """Flax's ``lecun_normal``: a normal truncated at two standard deviations, variance 1 / fan_in."""
    std = math.sqrt(1.0 / fan_in) / 0.87962566103423978  # the truncated normal's std is 0.8796 of the untruncated
    nn.init.trunc_normal_(weight, 0.0, std, -2 * std, 2 * std)


# ---------------------------------------------------------------------------------------------
# Image models


class SameConv2d(nn.Module):
    """A 2-D convolution with XLA's ``SAME`` padding, as ``flax.linen.Conv`` pads by default.

    Where the total padding is odd (a 3x3 kernel with stride 2 on an even size) XLA puts the extra
    row and column at the end; ``nn.Conv2d`` only pads symmetrically, so that case pads explicitly.
    """

    def __init__(self, in_channels: int, out_channels: int, kernel: int, stride: int = 1, bias: bool = True):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel, stride, padding=0, bias=bias)
        self.kernel, self.stride = kernel, stride
        _lecun_normal_(self.conv.weight, in_channels * kernel * kernel)
        if bias:
            nn.init.zeros_(self.conv.bias)

    def _pads(self, size: int) -> tuple[int, int]:
        total = max((-(-size // self.stride) - 1) * self.stride + self.kernel - size, 0)
        return total // 2, total - total // 2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Convolve ``x`` (N, C, H, W)."""
        (top, bottom), (left, right) = self._pads(x.shape[-2]), self._pads(x.shape[-1])
        if top == bottom and left == right:
            return F.conv2d(x, self.conv.weight, self.conv.bias, self.stride, (top, left))
        return self.conv(F.pad(x, (left, right, top, bottom)))


def _linear(in_features: int, out_features: int, bias: bool = True) -> nn.Linear:
    """``nn.Linear`` initialised like jaxnet's dense layers (lecun normal, zero bias)."""
    layer = nn.Linear(in_features, out_features, bias=bias)
    _lecun_normal_(layer.weight, in_features)
    if bias:
        nn.init.zeros_(layer.bias)
    return layer


def _batch_norm(channels: int) -> nn.BatchNorm2d:
    """Flax's ``BatchNorm(momentum=0.9)`` (epsilon 1e-5) in torch's convention (momentum 0.1)."""
    return nn.BatchNorm2d(channels, eps=1e-5, momentum=0.1)


class ConvNet(nn.Module):
    """Twin of :class:`jaxnet.models.cnn.ConvNet`: ``[conv3x3 - relu - maxpool2]`` per feature, then dense layers."""

    def __init__(
        self, num_classes: int, features: tuple[int, ...], hidden: int, dropout: float, in_channels: int, size: int
    ):
        super().__init__()
        channels = (in_channels, *features)
        self.convs = nn.ModuleList(SameConv2d(a, b, 3) for a, b in zip(channels, features, strict=False))
        for _ in features:
            size //= 2  # each max-pool halves the image
        self.hidden = _linear(size * size * features[-1], hidden)
        self.output = _linear(hidden, num_classes)
        self.drop = nn.Dropout(dropout)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """Logits (N, classes) of ``images`` (N, H, W, C)."""
        x = images.permute(0, 3, 1, 2)  # an NCHW view of NHWC memory: channels_last as it stands
        for conv in self.convs:
            x = F.max_pool2d(F.relu(conv(x)), 2)
        x = self.drop(x.permute(0, 2, 3, 1).flatten(1))  # flattened in Flax's (H, W, C) order
        x = self.drop(F.relu(self.hidden(x)))
        return self.output(x)


class ResidualBlock(nn.Module):
    """Twin of :class:`jaxnet.models.cnn.ResidualBlock`: two 3x3 conv-BatchNorm layers and a shortcut."""

    def __init__(self, in_channels: int, features: int, stride: int):
        super().__init__()
        self.conv1 = SameConv2d(in_channels, features, 3, stride, bias=False)
        self.norm1 = _batch_norm(features)
        self.conv2 = SameConv2d(features, features, 3, bias=False)
        self.norm2 = _batch_norm(features)
        nn.init.zeros_(self.norm2.weight)  # each block starts as the identity, as in jaxnet
        self.project = in_channels != features or stride != 1
        if self.project:
            self.conv3 = SameConv2d(in_channels, features, 1, stride, bias=False)
            self.norm3 = _batch_norm(features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The block applied to ``x`` (N, C, H, W)."""
        y = F.relu(self.norm1(self.conv1(x)))
        y = self.norm2(self.conv2(y))
        if self.project:
            x = self.norm3(self.conv3(x))
        return F.relu(x + y)


class ResNet(nn.Module):
    """Twin of :class:`jaxnet.models.cnn.ResNet` (CIFAR-style, BatchNorm running averages in eval mode)."""

    def __init__(self, num_classes: int, features: tuple[int, ...], blocks: tuple[int, ...], in_channels: int):
        super().__init__()
        self.stem = SameConv2d(in_channels, features[0], 3, bias=False)
        self.stem_norm = _batch_norm(features[0])
        layers, channels = [], features[0]
        for stage, (width, count) in enumerate(zip(features, blocks, strict=True)):
            for block in range(count):
                layers.append(ResidualBlock(channels, width, 2 if stage > 0 and block == 0 else 1))
                channels = width
        self.blocks = nn.ModuleList(layers)
        self.output = _linear(channels, num_classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """Logits (N, classes) of ``images`` (N, H, W, C)."""
        x = F.relu(self.stem_norm(self.stem(images.permute(0, 3, 1, 2))))
        for block in self.blocks:
            x = block(x)
        return self.output(x.mean(dim=(2, 3)))


# ---------------------------------------------------------------------------------------------
# Language models


class LSTMLanguageModel(nn.Module):
    """Twin of :class:`jaxnet.models.lstm.LSTMLanguageModel` on ``nn.LSTM`` (batch first).

    embedding -> dropout -> [LSTM layer -> dropout] x layers -> output projection (or the
    transposed embedding when tied). ``nn.LSTM``'s hidden-to-hidden biases stay zero and frozen.
    """

    def __init__(
        self, vocab_size: int, layers: int, hidden: int, dropout: float, init_scale: float, tie_embeddings: bool
    ):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, hidden)
        self.lstm = nn.LSTM(hidden, hidden, layers, batch_first=True, dropout=dropout if layers > 1 else 0.0)
        self.drop = nn.Dropout(dropout)
        self.tie_embeddings = tie_embeddings
        self.output = None if tie_embeddings else _linear(hidden, vocab_size)
        with torch.no_grad():
            for name, p in self.lstm.named_parameters():
                if name.startswith("bias_hh"):
                    p.zero_()
                    p.requires_grad_(False)
                elif init_scale:
                    p.uniform_(-init_scale, init_scale)
                elif name.startswith("weight_ih"):
                    _lecun_normal_(p, p.shape[1])
                elif name.startswith("weight_hh"):
                    nn.init.orthogonal_(p)
                else:
                    p.zero_()
            if init_scale:
                for p in [self.embed.weight, *([] if tie_embeddings else self.output.parameters())]:
                    p.uniform_(-init_scale, init_scale)

    def forward(
        self, tokens: torch.Tensor, state: tuple[torch.Tensor, torch.Tensor] | None = None
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """Logits (B, T, V) of ``tokens`` (B, T) and the final ``(h, c)``, each (layers, B, H)."""
        x = self.drop(self.embed(tokens))
        # The recurrence runs in the parameters' dtype (float32) even under autocast, as jaxnet's cuDNN
        # LSTM does (the scan implementation keeps its state and sums in float32 too).
        dtype = self.lstm.weight_ih_l0.dtype
        with torch.autocast(x.device.type, enabled=False):
            if state is not None:
                state = (state[0].to(dtype), state[1].to(dtype))
            x, state = self.lstm(x.to(dtype), state)
        x = self.drop(x)
        logits = F.linear(x, self.embed.weight) if self.tie_embeddings else self.output(x)
        return logits, state


def _rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """jaxnet's rotary embedding of ``x`` (B, T, heads, head_dim): the two halves rotated as pairs, in float32."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half].float(), x[..., half:].float()
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).to(x.dtype)


class Block(nn.Module):
    """Twin of :class:`jaxnet.models.transformer.Block` in its GPT shape: pre-LayerNorm causal
    multi-head attention (queries, keys and values in one ``Linear``) and a tanh-GELU MLP."""

    def __init__(self, width: int, heads: int, mlp_ratio: int, dropout: float, rotary: bool, out_std: float):
        super().__init__()
        self.heads, self.rotary = heads, rotary
        self.norm_1 = nn.LayerNorm(width, eps=1e-6)  # Flax's LayerNorm epsilon
        self.qkv = nn.Linear(width, 3 * width)
        self.out = nn.Linear(width, width)
        self.norm_2 = nn.LayerNorm(width, eps=1e-6)
        self.mlp_in = nn.Linear(width, mlp_ratio * width)
        self.mlp_out = nn.Linear(mlp_ratio * width, width)
        self.drop = nn.Dropout(dropout)
        for layer, std in ((self.qkv, 0.02), (self.out, out_std), (self.mlp_in, 0.02), (self.mlp_out, out_std)):
            nn.init.normal_(layer.weight, 0.0, std)
            nn.init.zeros_(layer.bias)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor | None = None, sin: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The block applied to ``x`` (B, T, width); ``cos``, ``sin`` (1, T, 1, head_dim / 2) for rotary positions."""
        batch, length, width = x.shape
        qkv = self.qkv(self.norm_1(x)).view(batch, length, 3, self.heads, width // self.heads)
        q, k, v = qkv.unbind(2)
        if self.rotary:
            q, k = _rotary(q, cos, sin), _rotary(k, cos, sin)
        y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        x = x + self.drop(self.out(y.transpose(1, 2).reshape(batch, length, width)))
        y = self.mlp_out(F.gelu(self.mlp_in(self.norm_2(x)), approximate="tanh"))  # flax nn.gelu is the tanh form
        return x + self.drop(y)


class TransformerLanguageModel(nn.Module):
    """Twin of :class:`jaxnet.models.transformer.TransformerLanguageModel` in its GPT shape only (a
    causal decoder, multi-head attention, LayerNorm of epsilon 1e-6, tanh GELU): the peer the
    benchmark compares with, not a second implementation of every Transformer jaxnet builds."""

    def __init__(
        self,
        vocab_size: int,
        context: int,
        layers: int,
        width: int,
        heads: int,
        mlp_ratio: int,
        dropout: float,
        position: str,
        tie_embeddings: bool,
    ):
        super().__init__()
        self.context, self.position_kind, self.tie_embeddings = context, position, tie_embeddings
        self.embed = nn.Embedding(vocab_size, width)
        nn.init.normal_(self.embed.weight, 0.0, 0.02)
        self.position = nn.Parameter(torch.randn(context, width) * 0.02) if position == "learned" else None
        self.drop = nn.Dropout(dropout)
        out_std = 0.02 / math.sqrt(2 * layers)
        self.blocks = nn.ModuleList(
            Block(width, heads, mlp_ratio, dropout, position == "rotary", out_std) for _ in range(layers)
        )
        self.norm_out = nn.LayerNorm(width, eps=1e-6)
        self.output = None
        if not tie_embeddings:
            self.output = nn.Linear(width, vocab_size, bias=False)
            nn.init.normal_(self.output.weight, 0.0, 0.02)
        if position == "rotary":
            half = width // heads // 2
            freqs = 10000.0 ** (-torch.arange(half, dtype=torch.float32) / half)
            angles = torch.arange(context, dtype=torch.float32)[:, None] * freqs[None, :]
            self.register_buffer("cos", angles.cos(), persistent=False)
            self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Next-token logits (B, T, V) of ``tokens`` (B, T), T at most the context."""
        length = tokens.shape[1]
        x = self.embed(tokens)
        if self.position is not None:
            x = x + self.position[:length]
        x = self.drop(x)
        cos = sin = None
        if self.position_kind == "rotary":
            cos, sin = self.cos[None, :length, None].float(), self.sin[None, :length, None].float()
        for block in self.blocks:
            x = block(x, cos, sin)
        x = self.norm_out(x)
        return F.linear(x, self.embed.weight) if self.tie_embeddings else self.output(x)


class LlamaBlock(nn.Module):
    """Twin of :class:`jaxnet.models.transformer.Block` in Llama's shape: pre-RMSNorm causal
    attention with ``kv_heads`` key/value heads (each repeated for its query heads, as torchtitan
    does before ``scaled_dot_product_attention``), rotary positions, and a SwiGLU MLP; no biases."""

    def __init__(self, width: int, heads: int, kv_heads: int, head_dim: int, hidden: int, eps: float, out_std: float):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.norm_1, self.norm_2 = nn.RMSNorm(width, eps=eps), nn.RMSNorm(width, eps=eps)
        self.query = nn.Linear(width, heads * head_dim, bias=False)
        self.key = nn.Linear(width, kv_heads * head_dim, bias=False)
        self.value = nn.Linear(width, kv_heads * head_dim, bias=False)
        self.out = nn.Linear(heads * head_dim, width, bias=False)
        self.mlp_gate = nn.Linear(width, hidden, bias=False)
        self.mlp_in = nn.Linear(width, hidden, bias=False)
        self.mlp_out = nn.Linear(hidden, width, bias=False)
        for layer in (self.query, self.key, self.value, self.mlp_gate, self.mlp_in):
            nn.init.normal_(layer.weight, 0.0, 0.02)
        for layer in (self.out, self.mlp_out):
            nn.init.normal_(layer.weight, 0.0, out_std)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """The block applied to ``x`` (B, T, width) with rotary ``cos``, ``sin`` (1, T, 1, head_dim / 2)."""
        batch, length, _ = x.shape
        h = self.norm_1(x)
        q = _rotary(self.query(h).view(batch, length, self.heads, self.head_dim), cos, sin)
        k = _rotary(self.key(h).view(batch, length, self.kv_heads, self.head_dim), cos, sin)
        v = self.value(h).view(batch, length, self.kv_heads, self.head_dim)
        groups = self.heads // self.kv_heads
        k, v = (a.repeat_interleave(groups, dim=2) if groups > 1 else a for a in (k, v))
        y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        x = x + self.out(y.transpose(1, 2).reshape(batch, length, self.heads * self.head_dim))
        h = self.norm_2(x)
        return x + self.mlp_out(F.silu(self.mlp_gate(h)) * self.mlp_in(h))


class LlamaLanguageModel(nn.Module):
    """Twin of :class:`jaxnet.models.transformer.TransformerLanguageModel` in Llama's shape
    (``TransformerConfig.preset("llama")``: rotary positions of base ``rope_theta``, RMSNorm,
    SwiGLU, grouped-query attention, no biases; tied or untied output)."""

    def __init__(self, spec: Any):
        super().__init__()
        s = spec
        self.tie_embeddings = s.tie_embeddings
        self.embed = nn.Embedding(s.vocab, s.width)
        nn.init.normal_(self.embed.weight, 0.0, 0.02)
        self.blocks = nn.ModuleList(
            LlamaBlock(s.width, s.heads, s.kv_heads, s.head_dim, s.mlp_hidden, s.norm_eps, s.out_std)
            for _ in range(s.layers)
        )
        self.norm_out = nn.RMSNorm(s.width, eps=s.norm_eps)
        self.output = None
        if not s.tie_embeddings:
            self.output = nn.Linear(s.width, s.vocab, bias=False)
            nn.init.normal_(self.output.weight, 0.0, 0.02)
        half = s.head_dim // 2
        freqs = s.rope_theta ** (-torch.arange(half, dtype=torch.float32) / half)
        angles = torch.arange(s.context, dtype=torch.float32)[:, None] * freqs[None, :]
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Next-token logits (B, T, V) of ``tokens`` (B, T), T at most the context."""
        length = tokens.shape[1]
        cos, sin = self.cos[None, :length, None].float(), self.sin[None, :length, None].float()
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x, cos, sin)
        x = self.norm_out(x)
        return F.linear(x, self.embed.weight) if self.tie_embeddings else self.output(x)


def _llama_shaped(spec: Any) -> bool:
    """Whether a Transformer spec is the shape :class:`LlamaLanguageModel` computes."""
    return (
        spec.causal
        and spec.norm == "rms"
        and spec.mlp == "swiglu"
        and spec.bias == "none"
        and spec.position == "rotary"
        and spec.rope_scaling == "none"
        and spec.dropout == 0
        and spec.vocab_used in (0, spec.vocab)
    )


# ---------------------------------------------------------------------------------------------
# Building and loading


def build_model(
    model_cfg: Any, num_classes: int, seq_len: int = 0, *, image_shape: tuple[int, int, int] | None = None
) -> nn.Module:
    """The torch twin of ``jaxnet.models.build(model_cfg, num_classes, seq_len)``.

    ``model_cfg`` is a config of convnet, resnet, lstm or transformer (GPT-shaped: see
    :class:`TransformerLanguageModel`). Image models take NHWC
    float images; the ConvNet's dense layer depends on the image size, which ``image_shape``
    (H, W, C) gives (default: 28x28x1, Fashion-MNIST). ``seq_len`` is the Transformer's context.
    Parameters are ``model_cfg.param_dtype``; the compute dtype is the caller's (see
    :class:`Trainer`'s ``bf16``), so ``model_cfg.dtype`` is not read.
    """
    _require()
    c = model_cfg
    kind = _family(c)
    if kind == "convnet":
        height, width, channels = image_shape or (28, 28, 1)
        if height != width:
            raise ValueError(f"the torch ConvNet expects square images, got {height}x{width}")
        model = ConvNet(num_classes, tuple(c.features), c.hidden, c.dropout, channels, height)
    elif kind == "resnet":
        model = ResNet(num_classes, tuple(c.features), tuple(c.blocks), (image_shape or (32, 32, 3))[2])
    elif kind == "lstm":
        model = LSTMLanguageModel(num_classes, c.layers, c.width, c.dropout, c.init_scale, c.tie_embeddings)
    else:
        if seq_len < 1:
            raise ValueError("the Transformer needs seq_len >= 1 (its context)")
        spec = c.spec(num_classes, c.context or seq_len)
        if _llama_shaped(spec):
            return LlamaLanguageModel(spec).to(getattr(torch, c.param_dtype))
        different = [
            what
            for what, differs in (
                ("a bidirectional Transformer (model.causal=false)", not spec.causal),
                (f"model.norm_eps={spec.norm_eps} (the twin's LayerNorm has 1e-6)", spec.norm_eps != 1e-6),
                ("model.gelu=exact (the twin's GELU is the tanh form)", spec.gelu != "tanh"),
                ("grouped-query attention (kv_heads < heads)", spec.kv_heads != spec.heads),
                (f"model.norm={spec.norm} (the twin's is LayerNorm)", spec.norm != "layer"),
                (f"model.mlp={spec.mlp} (the twin's MLP is GELU)", spec.mlp != "gelu"),
                (f"model.bias={spec.bias} (the twin has every bias)", spec.bias != "all"),
                ("model.head_dim other than width / heads", spec.head_dim * spec.heads != spec.width),
                (f"model.rope_theta={spec.rope_theta} (the twin's is 10000)", spec.rope_theta != 10000.0),
                ("model.rope_scaling=llama3", spec.rope_scaling != "none"),
            )
            if differs
        ]
        if different:
            raise ValueError(
                f"no torch twin for {'; '.join(different)}: the torch Transformers are GPT- and Llama-shaped only"
            )
        model = TransformerLanguageModel(
            num_classes, seq_len, c.layers, c.width, c.heads, c.mlp_ratio, c.dropout, c.position, c.tie_embeddings
        )
    return model.to(getattr(torch, c.param_dtype))


def _conv_kernel(kernel: np.ndarray) -> np.ndarray:
    """Flax (kh, kw, in, out) -> torch (out, in, kh, kw)."""
    return kernel.transpose(3, 2, 0, 1)


def _pairs_image(model: Any, params: dict, stats: dict) -> list[tuple[Any, np.ndarray]]:
    """(torch tensor, value) pairs for the ConvNet and ResNet."""
    pairs: list[tuple[Any, np.ndarray]] = []
    if isinstance(model, ConvNet):
        for i, conv in enumerate(model.convs):
            p = params[f"Conv_{i}"]
            pairs += [(conv.conv.weight, _conv_kernel(p["kernel"])), (conv.conv.bias, p["bias"])]
        for layer, name in ((model.hidden, "Dense_0"), (model.output, "Dense_1")):
            pairs += [(layer.weight, params[name]["kernel"].T), (layer.bias, params[name]["bias"])]
        return pairs

    def norm(module: Any, p: dict, s: dict) -> None:
        pairs.extend([(module.weight, p["scale"]), (module.bias, p["bias"])])
        if s:
            pairs.extend([(module.running_mean, s["mean"]), (module.running_var, s["var"])])

    pairs.append((model.stem.conv.weight, _conv_kernel(params["Conv_0"]["kernel"])))
    norm(model.stem_norm, params["BatchNorm_0"], stats.get("BatchNorm_0"))
    for b, block in enumerate(model.blocks):
        p, s = params[f"ResidualBlock_{b}"], stats.get(f"ResidualBlock_{b}", {})
        for i in range(3 if block.project else 2):
            pairs.append((getattr(block, f"conv{i + 1}").conv.weight, _conv_kernel(p[f"Conv_{i}"]["kernel"])))
            norm(getattr(block, f"norm{i + 1}"), p[f"BatchNorm_{i}"], s.get(f"BatchNorm_{i}"))
    pairs += [(model.output.weight, params["Dense_0"]["kernel"].T), (model.output.bias, params["Dense_0"]["bias"])]
    return pairs


def _pairs_lstm(model: LSTMLanguageModel, params: dict) -> list[tuple[Any, np.ndarray]]:
    """(torch tensor, value) pairs for the LSTM: (in, 4, H) kernels -> (4H, in) in the same i, f, g, o order."""
    pairs = [(model.embed.weight, params["embed"]["embedding"])]
    for i in range(model.lstm.num_layers):
        p = params[f"lstm_{i}"]
        pairs += [
            (getattr(model.lstm, f"weight_ih_l{i}"), p["w_x"].reshape(p["w_x"].shape[0], -1).T),
            (getattr(model.lstm, f"weight_hh_l{i}"), p["w_h"].reshape(p["w_h"].shape[0], -1).T),
            (getattr(model.lstm, f"bias_ih_l{i}"), p["b"].reshape(-1)),
            (getattr(model.lstm, f"bias_hh_l{i}"), np.zeros(p["b"].size, p["b"].dtype)),
        ]
    if not model.tie_embeddings:
        pairs += [(model.output.weight, params["output"]["kernel"].T), (model.output.bias, params["output"]["bias"])]
    return pairs


def _pairs_llama(model: LlamaLanguageModel, params: dict) -> list[tuple[Any, np.ndarray]]:
    """(torch tensor, value) pairs for the Llama-shaped twin: each kernel flattened to (inputs,
    outputs), then transposed to ``Linear``'s (outputs, inputs)."""
    pairs = [(model.embed.weight, params["embed"]["embedding"])]
    for i, block in enumerate(model.blocks):
        p = params[f"block_{i}"]
        attention = p["attention"]
        width = attention["out"]["kernel"].shape[-1]
        for name in ("query", "key", "value"):
            pairs.append((getattr(block, name).weight, attention[name]["kernel"].reshape(width, -1).T))
        pairs.append((block.out.weight, attention["out"]["kernel"].reshape(-1, width).T))
        pairs += [(block.norm_1.weight, p["norm_1"]["scale"]), (block.norm_2.weight, p["norm_2"]["scale"])]
        pairs += [(getattr(block, name).weight, p[name]["kernel"].T) for name in ("mlp_gate", "mlp_in", "mlp_out")]
    pairs.append((model.norm_out.weight, params["norm_out"]["scale"]))
    if not model.tie_embeddings:
        pairs.append((model.output.weight, params["output"]["kernel"].T))
    return pairs


def _pairs_transformer(model: TransformerLanguageModel, params: dict) -> list[tuple[Any, np.ndarray]]:
    """(torch tensor, value) pairs for the Transformer: multi-axis kernels flattened (queries, keys and
    values side by side in the twin's one ``Linear``), then transposed."""
    if isinstance(model, LlamaLanguageModel):
        return _pairs_llama(model, params)
    pairs = [(model.embed.weight, params["embed"]["embedding"])]
    if model.position is not None:
        pairs.append((model.position, params["position"]))
    for i, block in enumerate(model.blocks):
        p = params[f"block_{i}"]
        attention = p["attention"]
        out = attention["out"]
        width = out["kernel"].shape[-1]
        qkv = [attention[name] for name in ("query", "key", "value")]
        pairs += [
            (block.qkv.weight, np.concatenate([a["kernel"].reshape(width, -1) for a in qkv], axis=1).T),
            (block.qkv.bias, np.concatenate([a["bias"].reshape(-1) for a in qkv])),
            (block.out.weight, out["kernel"].reshape(-1, width).T),
            (block.out.bias, out["bias"]),
        ]
        for name in ("norm_1", "norm_2"):
            pairs += [(getattr(block, name).weight, p[name]["scale"]), (getattr(block, name).bias, p[name]["bias"])]
        for name in ("mlp_in", "mlp_out"):
            pairs += [(getattr(block, name).weight, p[name]["kernel"].T), (getattr(block, name).bias, p[name]["bias"])]
    pairs += [(model.norm_out.weight, params["norm_out"]["scale"]), (model.norm_out.bias, params["norm_out"]["bias"])]
    if not model.tie_embeddings:
        pairs.append((model.output.weight, params["output"]["kernel"].T))
    return pairs


def load_flax_params(torch_model: Any, variables: dict, model_cfg: Any) -> None:
    """Copy a Flax model's variables into ``torch_model`` (from :func:`build_model`) in place.

    ``variables`` is the dict of ``model.init`` (boxed or unboxed): ``params``, and for the ResNet
    ``batch_stats`` (running averages; left as they are if absent). Other collections (the LSTM's
    ``carry``) are ignored. Kernels are transposed to torch's layouts; every shape is checked.
    """
    _require()
    import flax.linen

    variables = flax.linen.unbox(variables)

    def as_numpy(tree: Any) -> dict:
        return {k: as_numpy(v) if hasattr(v, "items") else np.asarray(v) for k, v in tree.items()}

    params = as_numpy(variables["params"])
    stats = as_numpy(variables.get("batch_stats", {}))
    kind = _family(model_cfg)
    if kind in ("convnet", "resnet"):
        pairs = _pairs_image(torch_model, params, stats)
    elif kind == "lstm":
        pairs = _pairs_lstm(torch_model, params)
    else:
        pairs = _pairs_transformer(torch_model, params)
    with torch.no_grad():
        for tensor, value in pairs:
            if tuple(tensor.shape) != value.shape:
                raise ValueError(
                    f"shape mismatch copying Flax variables: torch {tuple(tensor.shape)}, Flax {value.shape}"
                )
            tensor.copy_(torch.from_numpy(np.array(value, order="C")).to(tensor.dtype))  # a writable copy


# ---------------------------------------------------------------------------------------------
# Training


def _jax_backends_initialized() -> bool:
    try:
        from jax._src import xla_bridge

        return bool(xla_bridge.backends_are_initialized())
    except (ImportError, AttributeError):
        return False


def schedule_values(optim_cfg: Any, total_steps: int) -> np.ndarray:
    """``jaxnet.optim.schedule(optim_cfg, total_steps)`` at steps ``0 .. total_steps - 1``, as float64.

    Evaluated on JAX's CPU device. If JAX has not started its backends in this process, the values
    are computed in a child process instead (with ``JAX_PLATFORMS=cpu``): starting JAX's GPU backend
    here would reserve most of the GPU's memory that torch is about to use.
    """
    steps = max(int(total_steps), 1)
    if _jax_backends_initialized():
        import jax
        import jax.numpy as jnp

        from jaxnet.optim import schedule

        try:
            on_cpu = jax.default_device(jax.local_devices(backend="cpu")[0])
        except RuntimeError:  # JAX_PLATFORMS without cpu
            on_cpu = contextlib.nullcontext()
        with on_cpu:
            values = np.asarray(jax.jit(schedule(optim_cfg, steps))(jnp.arange(steps)), np.float64)  # one compile
        return np.broadcast_to(values, (steps,)).copy()
    code = (
        "import json, sys\n"
        "import jax, jax.numpy as jnp, numpy as np\n"
        "from jaxnet.config import OptimConfig\n"
        "from jaxnet.optim import schedule\n"
        "args = json.load(sys.stdin)\n"
        "values = jax.jit(schedule(OptimConfig(**args['cfg']), args['steps']))(jnp.arange(args['steps']))\n"
        "np.save(sys.stdout.buffer, np.broadcast_to(np.asarray(values, np.float64), (args['steps'],)))\n"
    )
    request = json.dumps({"cfg": dataclasses.asdict(optim_cfg), "steps": steps})
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # holds jaxnet/
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": path}
    done = subprocess.run(
        [sys.executable, "-c", code], input=request.encode(), capture_output=True, env=env, check=False
    )
    if done.returncode:
        raise RuntimeError(f"computing the learning-rate schedule failed:\n{done.stderr.decode(errors='replace')}")
    return np.load(io.BytesIO(done.stdout))


def decay_groups(model: Any, optim_cfg: Any) -> list[dict]:
    """The model's trainable parameters as torch parameter groups, weight decay off where
    :func:`jaxnet.optim.decay_mask` turns it off: biases and other vectors (norm scales) unless
    ``optim.decay_mask`` is ``all`` (or ``auto`` with SGD)."""
    rule = getattr(optim_cfg, "decay_mask", "all")
    rule = rule if rule != "auto" else ("all" if optim_cfg.name == "sgd" else "matrices")
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if rule == "all":
        return [{"params": [p for _, p in named]}]
    decayed = lambda name, p: p.ndim >= 2 and name.rsplit(".", 1)[-1] not in ("bias", "scale")
    return [
        {"params": [p for n, p in named if decayed(n, p)]},
        {"params": [p for n, p in named if not decayed(n, p)], "weight_decay": 0.0},
    ]


class Trainer:
    """Training loop state for one torch model, the twin of jaxnet's training step.

    The optimizer matches :func:`jaxnet.optim.build`: AdamW (``b1``, ``b2``, epsilon 1e-8,
    decoupled weight decay scaled by the learning rate, as ``optax.adamw`` and
    ``torch.optim.AdamW`` both do, on the parameters :func:`decay_groups` picks) or SGD
    (momentum, Nesterov, weight decay added to the gradient after clipping), with the learning
    rate of :func:`jaxnet.optim.schedule` set before each step, and global-norm clipping if
    ``optim_cfg.clip_norm``. The loss is the mean softmax cross-entropy with optional label
    smoothing. ``bf16=True`` runs forward and loss under
    ``torch.autocast(bfloat16)`` with float32 parameters, and on CUDA keeps image models in
    channels-last memory format (the NHWC inputs are channels-last already once permuted to NCHW).
    The LSTM carries its ``(h, c)`` state across steps and zeroes it on ``reset`` batches.
    """

    def __init__(
        self,
        model_cfg: Any,
        optim_cfg: Any,
        total_steps: int,
        num_classes: int,
        seq_len: int = 0,
        *,
        device: str = "cpu",
        bf16: bool = False,
        label_smoothing: float = 0.0,
        seed: int = 0,
        image_shape: tuple[int, int, int] | None = None,
    ):
        _require()
        if getattr(optim_cfg, "grad_accum", 1) != 1:
            raise ValueError("the torch Trainer does not accumulate gradients; use optim.grad_accum=1")
        if optim_cfg.name not in ("adamw", "sgd"):
            raise ValueError(f"the torch Trainer has AdamW and SGD, not optim.name={optim_cfg.name}")
        torch.manual_seed(seed)
        self.device = torch.device(device)
        self.bf16 = bf16
        self.label_smoothing = label_smoothing
        self.stateful = _family(model_cfg) == "lstm"
        model = build_model(model_cfg, num_classes, seq_len, image_shape=image_shape).to(self.device)
        if _image_model(model_cfg) and bf16 and self.device.type == "cuda":
            model = model.to(memory_format=torch.channels_last)
        self.model = model.train()
        self.params = [p for p in model.parameters() if p.requires_grad]
        cuda = self.device.type == "cuda"
        groups = decay_groups(model, optim_cfg)
        if optim_cfg.name == "sgd":
            self.optimizer = torch.optim.SGD(
                groups,
                lr=optim_cfg.lr,
                momentum=optim_cfg.momentum,
                nesterov=bool(optim_cfg.nesterov and optim_cfg.momentum),
                weight_decay=optim_cfg.weight_decay,
            )
        else:
            self.optimizer = torch.optim.AdamW(
                groups,
                lr=optim_cfg.lr,
                betas=(optim_cfg.b1, optim_cfg.b2),
                eps=1e-8,
                weight_decay=optim_cfg.weight_decay,
                fused=cuda or None,
            )
        self.lr = schedule_values(optim_cfg, total_steps)
        self.clip_norm = optim_cfg.clip_norm
        self.steps = 0
        self.state: tuple[torch.Tensor, torch.Tensor] | None = None
        self.last_loss: torch.Tensor | None = None

    def put(self, batch: dict) -> dict:
        """A numpy batch (``image``/``label`` or ``tokens``/``targets``/``reset``) as tensors on the device.

        Integer arrays become int64 on the device (after the transfer, which moves the smaller
        type); on CUDA the host copy is pinned so that the transfer runs asynchronously.
        """
        out = {}
        for key, value in batch.items():
            tensor = torch.from_numpy(np.require(value, requirements=("C", "W")))
            if self.device.type == "cuda":
                tensor = tensor.pin_memory()
            tensor = tensor.to(self.device, non_blocking=True)
            out[key] = tensor.long() if not tensor.is_floating_point() else tensor.float()
        return out

    def step(self, batch: dict) -> None:
        """One training update on a :meth:`put` batch, without waiting for the device."""
        for group in self.optimizer.param_groups:
            group["lr"] = float(self.lr[min(self.steps, len(self.lr) - 1)])
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16):
            if self.stateful:
                tokens, targets = batch["tokens"], batch["targets"]
                state = self.state
                if state is None:
                    shape = (self.model.lstm.num_layers, tokens.shape[0], self.model.lstm.hidden_size)
                    state = (torch.zeros(shape, device=self.device), torch.zeros(shape, device=self.device))
                elif "reset" in batch:
                    keep = (1 - batch["reset"]).to(state[0].dtype)  # on the device: no host sync
                    state = (state[0] * keep, state[1] * keep)
                logits, state = self.model(tokens, state)
                self.state = (state[0].detach(), state[1].detach())
            elif "tokens" in batch:
                tokens, targets = batch["tokens"], batch["targets"]
                logits = self.model(tokens)
            else:
                logits, targets = self.model(batch["image"]), batch["label"]
        loss = F.cross_entropy(
            logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1), label_smoothing=self.label_smoothing
        )
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if self.clip_norm:
            torch.nn.utils.clip_grad_norm_(self.params, self.clip_norm, foreach=True)
        self.optimizer.step()
        self.last_loss = loss.detach()
        self.steps += 1

    def loss(self) -> float:
        """The last step's loss (waits for the device)."""
        if self.last_loss is None:
            raise RuntimeError("no training step has run yet")
        return float(self.last_loss)

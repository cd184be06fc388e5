"""A GPT-style Transformer over tokens in Flax Linen: a causal decoder, or a bidirectional encoder.

token embedding (+ learned position embedding, or rotary positions inside attention) ->
dropout -> ``layers`` pre-LayerNorm blocks -> LayerNorm -> output projection (optionally the
transposed token embedding). A block is::

    x = x + dropout(attention(layernorm(x)))      # multi-head self-attention (causal by default)
    x = x + dropout(mlp(layernorm(x)))            # width -> mlp_ratio * width -> width, GELU

``causal=True`` (a language model) lets each position attend to itself and earlier positions;
``causal=False`` is a BERT-style encoder, every position attending to every other. Attention
goes through ``jax.nn.dot_product_attention``, the one call where a fused kernel plugs in:
``attention="cudnn"`` asks for cuDNN's fused (flash) attention, which needs an NVIDIA GPU and
bfloat16 or float16; ``"xla"`` is XLA's own softmax(QK^T)V, which runs anywhere;
``"xla_head_major"`` is the same attention with the heads moved ahead of time
(:func:`head_major_attention`), which XLA computes in about half the time on a CPU
(:func:`jaxnet.models.resolve` picks one for ``model.attention=auto``, by the backend the model
is built for, so a plan for a GPU compiled on a CPU gets the GPU's choice). ``remat=True``
recomputes each block's activations in the backward pass instead of keeping them: less memory
for long contexts, about a third more compute.
Weights start from N(0, 0.02), the output projections of each residual branch from
N(0, 0.02 / sqrt(2 * layers)) (GPT-2).

**Decoding.** ``decode=True`` keeps a key/value cache of ``context`` positions in the ``cache``
collection: each call appends its tokens' keys and values and attends to everything cached so
far, so generating token ``t`` costs one position, not ``t``. Positions past ``context`` do not
exist; :mod:`jaxnet.sample` slides the window. Only a causal model decodes.

Every parameter carries logical axis names (``vocab``, ``embed``, ``heads``, ``kv``, ``mlp``)
for the parallelism rules, and activations are marked where tensor parallelism splits them
(Megatron: queries, keys and values by head, the MLP's hidden units, the logits by vocabulary;
the residual stream whole on every tensor device). Without axis rules the marks do nothing.

:class:`TransformerConfig` holds the ``model.*`` config keys and makes the model (``build``);
the last line registers it as ``transformer``.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxnet.errors import UserError
from jaxnet.models.base import ModelConfig, field, has_cudnn, register
from jaxnet.models.common import DTYPES, lookup

Dtype = Any


@dataclass
class TransformerConfig(ModelConfig):
    """``model.*`` keys of :class:`TransformerLanguageModel`."""

    layers: int = field(2, "number of Transformer blocks", low=1)
    width: int = field(200, "model width (embedding size)", low=1)
    heads: int = field(4, "attention heads (must divide model.width)", low=1)
    mlp_ratio: int = field(4, "MLP hidden size as a multiple of model.width", low=1)
    dropout: float = field(0.0, "dropout rate (embeddings, attention and MLP outputs)", low=0.0, high=0.95)
    position: str = field("learned", "position encoding", choices=("learned", "rotary"))
    tie_embeddings: bool = field(False, "output layer shares the embedding matrix")
    causal: bool = field(True, "False = bidirectional encoder (BERT-style), every position attends to every other")
    attention: str = field(
        "auto",
        "attention kernel; auto = cuDNN's fused kernel on an NVIDIA GPU in bfloat16, XLA's with the heads "
        "moved first (xla_head_major) on a CPU, XLA's (jax.nn.dot_product_attention) otherwise",
        choices=("auto", "xla", "xla_head_major", "cudnn"),
    )
    remat: bool = field(False, "recompute each block's activations in the backward pass (less memory, more compute)")
    gelu: str = field(
        "tanh",
        "the MLP's GELU: tanh = the tanh approximation (GPT-2's gelu_new), exact = x * Phi(x) with erf",
        choices=("tanh", "exact"),
    )
    norm_eps: float = field(1e-6, "LayerNorm epsilon (GPT-2's is 1e-5)", low=0.0)
    context: int = field(
        0, "rows of the learned position table and positions a decoding cache holds (0 = data.seq_len)", low=0
    )
    vocab_used: int = field(
        0,
        "ids the model predicts: logits of ids at or above it (a vocabulary padded to a round size) are masked "
        "and never predicted (0 = every id)",
        low=0,
    )

    def validate(self) -> None:
        if self.width % self.heads:
            raise UserError(f"model.width={self.width} is not divisible by model.heads={self.heads}")
        if self.position == "rotary" and (self.width // self.heads) % 2:
            raise UserError(
                f"rotary positions need an even head size; model.width / model.heads = {self.width // self.heads}"
            )

    def for_backend(self, backend: str) -> TransformerConfig:
        """Also ``attention=auto``: cuDNN's fused kernel on an NVIDIA GPU when the compute dtype is
        bfloat16 and the head size suits it, :func:`head_major_attention` on a CPU (where XLA runs it
        in about half the time), XLA's ``jax.nn.dot_product_attention`` otherwise; an explicit
        ``cudnn`` where it cannot run is a :class:`UserError`."""
        cfg = super().for_backend(backend)
        head_dim = cfg.width // cfg.heads
        fused_ok = has_cudnn(backend) and cfg.dtype == "bfloat16" and head_dim % 8 == 0 and head_dim <= 128
        xla = "xla_head_major" if backend == "cpu" else "xla"
        attention = cfg.attention if cfg.attention != "auto" else ("cudnn" if fused_ok else xla)
        if attention == "cudnn" and not fused_ok:
            raise UserError(
                "model.attention=cudnn needs an NVIDIA GPU, model.dtype=bfloat16 and a head size (model.width / "
                f"model.heads) that is a multiple of 8 up to 128; here the backend is {backend}, the dtype {cfg.dtype} "
                f"and the head size {head_dim}. Use model.attention=auto"
            )
        return dataclasses.replace(cfg, attention=attention)

    def build(self, *, outputs: int, seq_len: int = 0, batch_axis: Any = None) -> TransformerLanguageModel:
        """The :class:`TransformerLanguageModel` this config describes over a vocabulary of ``outputs``
        tokens, with a context of ``seq_len`` (``auto`` settings resolved, see :func:`jaxnet.models.resolve`)."""
        if self.context and seq_len > self.context:
            raise UserError(
                f"data.seq_len={seq_len} is longer than model.context={self.context}, the positions the model has"
            )
        return TransformerLanguageModel(
            outputs,
            self.context or seq_len,
            self.layers,
            self.width,
            self.heads,
            self.mlp_ratio,
            self.dropout,
            self.position,
            self.tie_embeddings,
            DTYPES[self.dtype],
            DTYPES[self.param_dtype],
            attention=self.attention,
            remat=self.remat,
            causal=self.causal,
            gelu=self.gelu,
            norm_eps=self.norm_eps,
            vocab_used=self.vocab_used,
        )


def _normal(std: float, names: tuple) -> nn.initializers.Initializer:
    return nn.with_logical_partitioning(nn.initializers.normal(std), names)


class Projection(nn.Module):
    """``x @ kernel + bias`` contracting the last ``contract`` axes of ``x`` into ``features``.

    ``names`` are the logical names of the kernel's axes (inputs, then outputs). The kernel is
    created at its full shape (Flax's ``DenseGeneral`` creates it flat and reshapes, which its own
    logical-axis constraints reject), so its axes can be named and split.
    """

    features: tuple[int, ...]
    names: tuple[str | None, ...]
    contract: int = 1
    std: float = 0.02
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32

    @nn.compact
    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        shape = (*x.shape[x.ndim - self.contract :], *self.features)
        kernel = self.param("kernel", _normal(self.std, self.names), shape, self.param_dtype)
        out_names = self.names[self.contract :]
        bias = self.param(
            "bias", nn.with_logical_partitioning(nn.initializers.zeros, out_names), self.features, self.param_dtype
        )
        inputs = tuple(range(x.ndim - self.contract, x.ndim))
        y = jax.lax.dot_general(
            x.astype(self.dtype), kernel.astype(self.dtype), ((inputs, tuple(range(self.contract))), ((), ()))
        )
        return y + bias.astype(self.dtype)


def rotary(x: jnp.ndarray, positions: jnp.ndarray, base: float = 10000.0) -> jnp.ndarray:
    """Rotary position embedding of ``x`` (batch, time, heads, head_dim) at ``positions`` (time,).

    The two halves of the head dimension are rotated as pairs by angles ``position * base**(-2i/d)``,
    so the product of a rotated query and key depends only on their distance.
    """
    half = x.shape[-1] // 2
    freqs = base ** (-jnp.arange(half, dtype=jnp.float32) / half)
    angles = positions.astype(jnp.float32)[:, None] * freqs[None, :]
    cos, sin = jnp.cos(angles)[None, :, None, :], jnp.sin(angles)[None, :, None, :]
    x1, x2 = x[..., :half].astype(jnp.float32), x[..., half:].astype(jnp.float32)
    return jnp.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1).astype(x.dtype)


def head_major_attention(
    q: jnp.ndarray, k: jnp.ndarray, v: jnp.ndarray, is_causal: bool = True
) -> jnp.ndarray:
    """``jax.nn.dot_product_attention``'s XLA softmax(QK^T / sqrt(d))V on (batch, time, heads, head_dim)
    arrays, with the heads moved ahead of time first, equal to it up to float rounding.

    On a CPU, XLA runs this form's products and softmax (forward and backward) in about half the
    time of ``jax.nn.dot_product_attention``'s (scripts/profile_cpu.py).
    """
    logits_dtype = jnp.promote_types(q.dtype, jnp.float32)
    q, k, v = (jnp.swapaxes(a, 1, 2) for a in (q, k, v))  # (batch, heads, time, head_dim)
    logits = jnp.einsum("bnth,bnsh->bnts", q, k, preferred_element_type=logits_dtype)
    logits *= jnp.array(1.0 / math.sqrt(q.shape[-1]), logits.dtype)
    if is_causal:
        mask = jnp.tril(jnp.ones(logits.shape[-2:], bool))
        logits = jnp.where(mask, logits, jnp.asarray(0.7 * jnp.finfo(logits.dtype).min, logits.dtype))
    probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1).astype(k.dtype)
    return jnp.swapaxes(jnp.einsum("bnts,bnsh->bnth", probs, v), 1, 2)


def attention_fn(implementation: str) -> Any:
    """The attention function for ``implementation`` (``model.attention`` resolved for the backend
    the model is built for): :func:`head_major_attention` for ``"xla_head_major"``, else
    ``jax.nn.dot_product_attention`` with ``implementation`` as its own."""
    if implementation == "xla_head_major":
        return head_major_attention
    return functools.partial(jax.nn.dot_product_attention, implementation=implementation)


class SelfAttention(nn.Module):
    """Multi-head self-attention, causal unless ``causal=False``, with a key/value cache when
    ``decode=True`` (causal only)."""

    heads: int
    context: int
    rotary: bool = False
    out_std: float = 0.02
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32
    implementation: str = "xla"
    causal: bool = True

    @nn.compact
    def __call__(self, x: jnp.ndarray, positions: jnp.ndarray, decode: bool = False) -> jnp.ndarray:
        batch, length, width = x.shape
        head_dim = width // self.heads
        qkv = Projection(
            (3, self.heads, head_dim),
            ("embed", None, "heads", "kv"),
            dtype=self.dtype,
            param_dtype=self.param_dtype,
            name="qkv",
        )(x)
        qkv = nn.with_logical_constraint(qkv, ("batch", None, None, "heads", None))
        q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
        if self.rotary:
            q, k = rotary(q, positions), rotary(k, positions)
        if decode:
            if not self.causal:
                raise ValueError("decoding with a key/value cache needs a causal model (causal=True)")
            shape = (batch, self.context, self.heads, head_dim)
            cached_k = self.variable("cache", "key", jnp.zeros, shape, k.dtype)
            cached_v = self.variable("cache", "value", jnp.zeros, shape, v.dtype)
            start = positions[0]
            cached_k.value = jax.lax.dynamic_update_slice(cached_k.value, k, (0, start, 0, 0))
            cached_v.value = jax.lax.dynamic_update_slice(cached_v.value, v, (0, start, 0, 0))
            mask = jnp.arange(self.context)[None, :] <= positions[:, None]  # (query, key)
            out = jax.nn.dot_product_attention(q, cached_k.value, cached_v.value, mask=mask[None, None])
        else:
            out = attention_fn(self.implementation)(q, k, v, is_causal=self.causal)
        return Projection(
            (width,),
            ("heads", "kv", "embed"),
            contract=2,
            std=self.out_std,
            dtype=self.dtype,
            param_dtype=self.param_dtype,
            name="out",
        )(out)


class Block(nn.Module):
    """Pre-LayerNorm Transformer block: attention and MLP, each a residual branch with dropout."""

    heads: int
    context: int
    mlp_ratio: int = 4
    dropout: float = 0.0
    rotary: bool = False
    out_std: float = 0.02
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32
    attention: str = "xla"
    causal: bool = True
    gelu: str = "tanh"
    norm_eps: float = 1e-6

    @nn.compact
    def __call__(self, x: jnp.ndarray, positions: jnp.ndarray, train: bool, decode: bool) -> jnp.ndarray:
        width = x.shape[-1]
        norm = lambda name: nn.LayerNorm(
            epsilon=self.norm_eps,
            dtype=self.dtype,
            param_dtype=self.param_dtype,
            name=name,
            scale_init=nn.with_logical_partitioning(nn.initializers.ones, ("embed",)),
            bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("embed",)),
        )
        drop = nn.Dropout(self.dropout, deterministic=not train)
        y = SelfAttention(
            self.heads,
            self.context,
            self.rotary,
            self.out_std,
            self.dtype,
            self.param_dtype,
            self.attention,
            self.causal,
            name="attention",
        )(norm("norm_1")(x), positions, decode)
        x = x + drop(y)
        y = nn.Dense(
            self.mlp_ratio * width,
            dtype=self.dtype,
            param_dtype=self.param_dtype,
            name="mlp_in",
            kernel_init=_normal(0.02, ("embed", "mlp")),
            bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("mlp",)),
        )(norm("norm_2")(x))
        y = nn.with_logical_constraint(y, ("batch", None, "mlp"))
        y = nn.Dense(
            width,
            dtype=self.dtype,
            param_dtype=self.param_dtype,
            name="mlp_out",
            kernel_init=_normal(self.out_std, ("mlp", "embed")),
            bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("embed",)),
        )(nn.gelu(y, approximate=self.gelu == "tanh"))
        return nn.with_logical_constraint(x + drop(y), ("batch", None, None))


class TransformerLanguageModel(nn.Module):
    """Token ids (batch, time) -> logits (batch, time, vocab), float32: next-token logits when
    ``causal``, per-position logits of a bidirectional encoder otherwise.

    ``context`` is the longest sequence (and the size of the decoding cache). ``gelu`` is the
    MLP's activation (``"tanh"``: the tanh approximation, GPT-2's ``gelu_new``; ``"exact"``: with
    erf), ``norm_eps`` every LayerNorm's epsilon, and ``vocab_used`` (when above 0 and below
    ``vocab_size``) the ids that can be predicted: the logits of the padding ids above it are the
    dtype's lowest number, so a vocabulary padded to a round size (GPT-2's 50,257 to 50,304)
    never predicts them.
    """

    vocab_size: int
    context: int
    layers: int = 4
    width: int = 256
    heads: int = 4
    mlp_ratio: int = 4
    dropout: float = 0.0
    position: str = "learned"
    tie_embeddings: bool = True
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32
    attention: str = "xla"
    remat: bool = False
    causal: bool = True
    gelu: str = "tanh"
    norm_eps: float = 1e-6
    vocab_used: int = 0

    @nn.compact
    def __call__(self, tokens: jnp.ndarray, train: bool = False, decode: bool = False) -> jnp.ndarray:
        length = tokens.shape[1]
        if decode:
            index = self.variable("cache", "index", lambda: jnp.zeros((), jnp.int32))
            positions = index.value + jnp.arange(length)
            if not self.is_initializing():
                index.value = index.value + length
        else:
            positions = jnp.arange(length)
        embed = nn.Embed(
            self.vocab_size,
            self.width,
            dtype=self.dtype,
            param_dtype=self.param_dtype,
            name="embed",
            embedding_init=_normal(0.02, ("vocab", "embed")),
        )
        x = lookup(embed, tokens, self.dtype)
        if self.position == "learned":
            table = self.param("position", _normal(0.02, (None, "embed")), (self.context, self.width), self.param_dtype)
            x = x + jnp.take(table, positions, axis=0).astype(self.dtype)[None]
        x = nn.Dropout(self.dropout, deterministic=not train)(x)
        out_std = 0.02 / math.sqrt(2 * self.layers)
        # train and decode pick the code path: static arguments of the rematerialised call
        block = nn.remat(Block, static_argnums=(3, 4)) if self.remat else Block
        for i in range(self.layers):
            x = block(
                self.heads,
                self.context,
                self.mlp_ratio,
                self.dropout,
                self.position == "rotary",
                out_std,
                self.dtype,
                self.param_dtype,
                self.attention,
                self.causal,
                self.gelu,
                self.norm_eps,
                name=f"block_{i}",
            )(x, positions, train, decode)
        x = nn.LayerNorm(
            epsilon=self.norm_eps,
            dtype=self.dtype,
            param_dtype=self.param_dtype,
            name="norm_out",
            scale_init=nn.with_logical_partitioning(nn.initializers.ones, ("embed",)),
            bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("embed",)),
        )(x)
        if self.tie_embeddings:
            logits = embed.attend(x)
        else:
            logits = nn.Dense(
                self.vocab_size,
                use_bias=False,
                dtype=self.dtype,
                param_dtype=self.param_dtype,
                name="output",
                kernel_init=_normal(0.02, ("embed", "vocab")),
            )(x)
        logits = nn.with_logical_constraint(logits, ("batch", None, "vocab"))
        logits = logits.astype(jnp.promote_types(self.dtype, jnp.float32))
        if 0 < self.vocab_used < self.vocab_size:  # padding ids: never predicted, no gradient to their rows
            used = jnp.arange(self.vocab_size) < self.vocab_used
            logits = jnp.where(used, logits, jnp.finfo(logits.dtype).min)
        return logits


register("transformer", TransformerConfig, inputs="tokens")

"""A Transformer over tokens in Flax Linen: a causal decoder (GPT-2's shape or Llama's), or a
bidirectional encoder.

One frozen :class:`TransformerSpec` describes the whole model and every module takes it whole;
variants are presets of it (:data:`PRESETS`: ``char_gpt``, ``gpt2``, ``bert_encoder``, ``llama``,
``qwen2``, ``mistral``). The files:

* ``spec.py``: :class:`TransformerSpec` and :data:`PRESETS`;
* ``attention.py``: rotary positions, :func:`attend` (the one attention function, every kernel,
  grouped-query attention, an optional mask) and :class:`SelfAttention` with its key/value cache;
* ``model.py``: the block and :class:`TransformerLanguageModel` (features, unembedding, decoding),
  with the parameters' paths;
* this file: :class:`TransformerConfig`, the ``model.*`` keys, which become a spec in one place
  (:meth:`TransformerConfig.spec`), with what the family owns beside its module: its FLOP count,
  its sharding rules and the layout change of its saved checkpoints (the packed ``qkv`` kernel
  read as ``query``, ``key``, ``value``). The last lines register it as ``transformer``.

``causal=True`` (a language model) lets each position attend to itself and earlier positions;
``causal=False`` is a BERT-style encoder, every position attending to every other. Attention
goes through ``jax.nn.dot_product_attention``, the one call where a fused kernel plugs in:
``attention="cudnn"`` asks for cuDNN's fused (flash) attention, which needs an NVIDIA GPU and
bfloat16 or float16; ``"xla"`` is XLA's own softmax(QK^T)V, which runs anywhere;
``"xla_head_major"`` is the same attention with the heads moved ahead of time
(:func:`head_major_attention`), which XLA computes in about half the time on a CPU
(:func:`jaxnet.models.resolve` picks one for ``model.attention=auto``, by the backend the model
is built for, so a plan for a GPU compiled on a CPU gets the GPU's choice).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from jaxnet.errors import UserError
from jaxnet.models.base import ModelConfig, Unpacked, field, has_cudnn, register, register_migration
from jaxnet.models.common import DTYPES, MATMULS, REMAT, REMAT_ALIASES, Projection, mask_unused_vocab
from jaxnet.models.transformer.attention import (
    SelfAttention,
    attend,
    attention_fn,
    head_major_attention,
    rotary,
    segment_mask,
)
from jaxnet.models.transformer.model import Block, TransformerLanguageModel, norm
from jaxnet.models.transformer.spec import PRESETS, TransformerSpec, preset


@dataclass
class TransformerConfig(ModelConfig):
    """``model.*`` keys of :class:`TransformerLanguageModel`; :meth:`spec` makes them its spec."""

    layers: int = field(2, "number of Transformer blocks", low=1)
    width: int = field(200, "model width (embedding size)", low=1)
    heads: int = field(4, "attention heads (must divide model.width unless model.head_dim is set)", low=1)
    kv_heads: int = field(
        0,
        "key/value heads (0 = model.heads); fewer is grouped-query attention, each serving model.heads / "
        "model.kv_heads query heads (must divide model.heads)",
        low=0,
    )
    head_dim: int = field(0, "size of each attention head (0 = model.width / model.heads)", low=0)
    mlp_ratio: int = field(4, "MLP hidden size as a multiple of model.width (unless model.mlp_hidden is set)", low=1)
    mlp_hidden: int = field(0, "MLP hidden units (0 = model.mlp_ratio x model.width; Llama 3 8B: 14336)", low=0)
    mlp: str = field(
        "gelu",
        "the MLP: gelu = out(gelu(in(x))); swiglu = out(silu(gate(x)) * in(x)), Llama's",
        choices=("gelu", "swiglu"),
    )
    norm: str = field(
        "layer",
        "the normalisation: layer = LayerNorm (scale and bias); rms = RMSNorm (scale only)",
        choices=("layer", "rms"),
    )
    bias: str = field(
        "all",
        "which projections have a bias: all (GPT-2), qkv = only queries, keys and values (Qwen2), none (Llama)",
        choices=("all", "qkv", "none"),
    )
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
    remat: str = field(
        "none",
        "what each block keeps for the backward pass, the rest recomputed there (less memory, more compute): "
        "none = everything; full = its input only; dots = every matrix product's output; dots_no_batch = the "
        "projections' outputs (attention's products recomputed); minimal = the attention's output; offload = what "
        "dots_no_batch keeps, in host memory",
        choices=REMAT,
        aliases=REMAT_ALIASES,
    )
    matmul: str = field(
        "default",
        "how the projections of attention and the MLP multiply: default = in model.dtype; fp8 = float8 (e4m3 "
        "forward, e5m2 gradients, current scaling; an H100/H200 runs float8 GEMMs, a CPU simulates them), the "
        "parameters, optimizer, output layer and attention's own products unchanged",
        choices=MATMULS,
    )
    gelu: str = field(
        "tanh",
        "the MLP's GELU: tanh = the tanh approximation (GPT-2's gelu_new), exact = x * Phi(x) with erf",
        choices=("tanh", "exact"),
    )
    norm_eps: float = field(1e-6, "LayerNorm or RMSNorm epsilon (GPT-2's and Llama 3's are 1e-5)", low=0.0)
    rope_theta: float = field(10000.0, "rotary positions: the base of their frequencies (Llama 3: 500000)", low=1.0)
    rope_scaling: str = field(
        "none",
        "rotary positions: llama3 = rescale the frequencies as Llama 3.1 does (model.rope_factor, "
        "model.rope_low_freq_factor, model.rope_high_freq_factor, model.rope_original_context)",
        choices=("none", "llama3"),
    )
    rope_factor: float = field(8.0, "model.rope_scaling=llama3: the low frequencies are divided by it", low=1.0)
    rope_low_freq_factor: float = field(1.0, "model.rope_scaling=llama3: low-frequency factor", low=0.0)
    rope_high_freq_factor: float = field(4.0, "model.rope_scaling=llama3: high-frequency factor", low=0.0)
    rope_original_context: int = field(
        8192, "model.rope_scaling=llama3: the context the model was first trained at", low=1
    )
    context: int = field(
        0, "rows of the learned position table and positions a decoding cache holds (0 = data.seq_len)", low=0
    )
    vocab_used: int = field(
        0,
        "ids the model predicts: logits of ids at or above it (a vocabulary padded to a round size) are masked "
        "and never predicted (0 = every id)",
        low=0,
    )

    @classmethod
    def preset(cls, name: str, **keys: Any) -> TransformerConfig:
        """The config of variant ``name`` of :data:`PRESETS` with ``keys`` (sizes and the rest)::

        TransformerConfig.preset("gpt2", layers=12, width=768, heads=12)
        """
        return cls(**{**PRESETS[name], **keys})

    @property
    def head_size(self) -> int:
        """The size of one attention head: ``head_dim``, or ``width // heads``."""
        return self.head_dim or self.width // self.heads

    def validate(self) -> None:
        if not self.head_dim and self.width % self.heads:
            raise UserError(
                f"model.width={self.width} is not divisible by model.heads={self.heads}; change one, or set "
                "model.head_dim"
            )
        if self.kv_heads and (self.kv_heads > self.heads or self.heads % self.kv_heads):
            raise UserError(
                f"model.kv_heads={self.kv_heads} does not divide model.heads={self.heads}; give a divisor of it "
                "(0 = model.heads)"
            )
        if self.position == "rotary" and self.head_size % 2:
            raise UserError(f"rotary positions need an even head size; the head size is {self.head_size}")
        if self.rope_scaling == "llama3" and self.rope_high_freq_factor <= self.rope_low_freq_factor:
            raise UserError(
                f"model.rope_high_freq_factor={self.rope_high_freq_factor} must be above "
                f"model.rope_low_freq_factor={self.rope_low_freq_factor}"
            )

    def for_backend(self, backend: str) -> TransformerConfig:
        """Also ``attention=auto``: cuDNN's fused kernel on an NVIDIA GPU when the compute dtype is
        bfloat16 and the head size suits it, :func:`head_major_attention` on a CPU (where XLA runs it
        in about half the time), XLA's ``jax.nn.dot_product_attention`` otherwise; an explicit
        ``cudnn`` where it cannot run is a :class:`UserError`."""
        cfg = super().for_backend(backend)
        head_dim = cfg.head_size
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

    def spec(self, vocab: int, context: int) -> TransformerSpec:
        """The :class:`TransformerSpec` of these keys over ``vocab`` token ids and ``context``
        positions: the one place the ``model.*`` keys become the model's settings. ``auto``
        settings must be resolved first (:meth:`for_backend`); ``auto`` attention is XLA's."""
        dtype = "float32" if self.dtype == "auto" else self.dtype
        return TransformerSpec(
            vocab=vocab,
            context=context,
            layers=self.layers,
            width=self.width,
            heads=self.heads,
            kv_heads=self.kv_heads,
            head_dim=self.head_dim,
            mlp_hidden=self.mlp_hidden or self.mlp_ratio * self.width,
            mlp=self.mlp,
            norm=self.norm,
            bias=self.bias,
            dropout=self.dropout,
            position=self.position,
            tie_embeddings=self.tie_embeddings,
            causal=self.causal,
            attention="xla" if self.attention == "auto" else self.attention,
            remat=self.remat,
            matmul=self.matmul,
            gelu=self.gelu,
            norm_eps=self.norm_eps,
            rope_theta=self.rope_theta,
            rope_scaling=self.rope_scaling,
            rope_factor=self.rope_factor,
            rope_low_freq_factor=self.rope_low_freq_factor,
            rope_high_freq_factor=self.rope_high_freq_factor,
            rope_original_context=self.rope_original_context,
            vocab_used=self.vocab_used,
            dtype=DTYPES[dtype],
            param_dtype=DTYPES[self.param_dtype],
        )

    def build(self, *, outputs: int, seq_len: int = 0, batch_axis: Any = None) -> TransformerLanguageModel:
        """The :class:`TransformerLanguageModel` this config describes over a vocabulary of ``outputs``
        tokens, with a context of ``seq_len`` (``auto`` settings resolved, see :func:`jaxnet.models.resolve`)."""
        if self.context and seq_len > self.context:
            raise UserError(
                f"data.seq_len={seq_len} is longer than model.context={self.context}, the positions the model has"
            )
        return TransformerLanguageModel(self.spec(outputs, self.context or seq_len))

    def forward_flops(self, *, batch: int, input_shape: tuple, outputs: int, causal: bool = True) -> float:
        """:func:`transformer_flops` of this model on ``batch`` sequences of ``input_shape[0]`` tokens."""
        return transformer_flops(self.spec(outputs, input_shape[0]), batch=batch, causal=causal)

    def axis_rules(self, mesh_shape: dict[str, int]) -> tuple[tuple[str, Any], ...]:
        """Key/value heads split over ``tensor`` like the query heads where it divides them, whole
        on every tensor device otherwise (fewer key/value heads than tensor devices)."""
        kv_heads = self.kv_heads or self.heads
        return (("kv_heads", "tensor" if kv_heads % mesh_shape.get("tensor", 1) == 0 else None),)


def transformer_flops(spec: TransformerSpec, *, batch: int, causal: bool = True) -> float:
    """Forward FLOPs of :class:`TransformerLanguageModel` of ``spec`` on ``batch`` sequences of
    ``spec.context`` tokens (see :mod:`jaxnet.flops`): the projections (queries, keys and values
    of their own head counts, the output, the MLP: two matrices, three for SwiGLU), the attention
    scores and weighted values (only the pairs a causal model needs when ``causal`` and ``spec.causal``), the logits."""
    length = spec.context
    tokens = batch * length
    w, hd = spec.width, spec.head_dim
    attention = w * spec.heads * hd + 2 * w * spec.kv_heads * hd + spec.heads * hd * w
    mlp = (3 if spec.mlp == "swiglu" else 2) * w * spec.mlp_hidden  # SwiGLU: gate, in and out
    projections = 2 * tokens * (attention + mlp)
    pairs = length * (length + 1) / 2 if causal and spec.causal else length * length
    scores = 2 * 2 * batch * pairs * spec.heads * hd  # q.k and the weighted sum of v, over all heads
    logits = 2 * tokens * w * spec.vocab
    return spec.layers * (projections + scores) + logits


# The packed layout of jaxnet before queries, keys and values were kept apart.
_QKV = ("query", "key", "value")
_SPLIT = "attention's packed qkv kernel (jaxnet before 2026-11-25) read as separate query, key and value kernels"
register_migration(Unpacked(("qkv", "kernel"), tuple((n, "kernel") for n in _QKV), axis=-3, note=_SPLIT))
register_migration(Unpacked(("qkv", "bias"), tuple((n, "bias") for n in _QKV), axis=-3, note=_SPLIT))

register("transformer", TransformerConfig, inputs="tokens")

__all__ = [
    "PRESETS",
    "Block",
    "Projection",
    "SelfAttention",
    "TransformerConfig",
    "TransformerLanguageModel",
    "TransformerSpec",
    "attend",
    "attention_fn",
    "head_major_attention",
    "mask_unused_vocab",
    "norm",
    "preset",
    "rotary",
    "segment_mask",
    "transformer_flops",
]

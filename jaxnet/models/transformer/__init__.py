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
is built for, so a plan for a GPU compiled on a CPU gets the GPU's choice). On a CPU it runs in
as many pieces of the batch as there are cores
(:func:`~jaxnet.models.transformer.attention.cpu_pieces`: XLA runs each batched product of
attention on one thread), and so do the blocks where each row's numbers would be the same
(no dropout in training, no mixture of experts, not decoding): each piece all the way through
them, independently.
"""

from __future__ import annotations

import collections
import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np

from jaxnet.errors import UserError
from jaxnet.models.base import Unpacked, has_cudnn, register, register_migration
from jaxnet.models.common import DTYPES, Projection, mask_unused_vocab
from jaxnet.models.transformer.attention import (
    SelfAttention,
    attend,
    attention_fn,
    head_major_attention,
    rotary,
    segment_mask,
)
from jaxnet.models.transformer.model import Block, TransformerLanguageModel
from jaxnet.models.transformer.norms import norm
from jaxnet.models.transformer.spec import (
    PRESETS,
    Layer,
    SpecError,
    TransformerKeys,
    TransformerSpec,
    check,
    preset,
    spec_keys,
)

#: Keys of how a Transformer is computed or trained, or of its size in ids and positions, not
#: of the function it computes (:meth:`TransformerConfig.arithmetic`); ``mlp_ratio`` is in ``mlp_hidden``.
#: The keys of a mixture of experts (``mlp_pattern`` entry ``moe``).
MOE_KEYS = (
    "experts",
    "experts_per_token",
    "expert_hidden",
    "shared_experts",
    "router_renorm",
    "router_aux_loss",
    "router_z_loss",
    "capacity_factor",
    "expert_matmul",
)
HOW = (
    "dropout",
    "attention",
    "remat",
    "matmul",
    "vocab_used",
    "mlp_ratio",
    "router_aux_loss",
    "router_z_loss",
    "capacity_factor",
    "expert_matmul",
    "context_attention",
)


@dataclass
class TransformerConfig(TransformerKeys):
    """``model.*`` keys of :class:`TransformerLanguageModel` (declared in :class:`TransformerKeys`),
    with what the family owns beside its module; :meth:`spec` makes them its spec."""

    splits_sequence = True  # attention works across a sequence split over mesh.context (context.py)

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

    def for_backend(self, backend: str) -> TransformerConfig:
        """Also ``attention=auto``: cuDNN's fused kernel on an NVIDIA GPU when the compute dtype is
        bfloat16 and the head size suits it, :func:`head_major_attention` on a CPU (where XLA runs it
        in about half the time), XLA's ``jax.nn.dot_product_attention`` otherwise; soft-capped
        attention logits (``attention_softcap``) are XLA's everywhere (:meth:`unfused_because`). An
        explicit ``cudnn`` where it cannot run is a :class:`UserError`."""
        cfg = super().for_backend(backend)
        head_dim = cfg.head_size
        fused_ok = has_cudnn(backend) and cfg.dtype == "bfloat16" and head_dim % 8 == 0 and head_dim <= 128
        if cfg.attention_softcap and cfg.attention == "cudnn":
            raise UserError(f"model.attention=cudnn: {self.unfused_because()}; use model.attention=auto")
        fused_ok = fused_ok and not cfg.attention_softcap
        xla = "xla_head_major" if backend == "cpu" else "xla"
        attention = cfg.attention if cfg.attention != "auto" else ("cudnn" if fused_ok else xla)
        if attention == "cudnn" and not fused_ok:
            raise UserError(
                "model.attention=cudnn needs an NVIDIA GPU, model.dtype=bfloat16 and a head size (model.width / "
                f"model.heads) that is a multiple of 8 up to 128; here the backend is {backend}, the dtype {cfg.dtype} "
                f"and the head size {head_dim}. Use model.attention=auto"
            )
        matmul = cfg.expert_matmul if cfg.expert_matmul != "auto" else ("blocks" if backend == "cpu" else "ragged")
        return dataclasses.replace(cfg, attention=attention, expert_matmul=matmul)

    def unfused_because(self) -> str:
        """Why no fused attention kernel computes this model's attention ("" when one may): soft-capped
        logits, which neither cuDNN's kernel nor ``jax.nn.dot_product_attention`` computes (the
        attention then runs :func:`head_major_attention`, XLA's own), or a head size :meth:`for_backend`
        does not send to cuDNN (Gemma 3 12B's 256). ``jaxnet plan`` says it."""
        if self.attention_softcap:
            return (
                f"model.attention_softcap={self.attention_softcap:g} soft-caps the attention logits, which "
                "cuDNN's fused attention cannot; they are XLA's softmax(QK^T)V"
            )
        if self.head_size % 8 or self.head_size > 128:
            return (
                f"a head size of {self.head_size}, where jaxnet's cuDNN attention takes multiples of 8 up to 128; "
                "the attention is XLA's softmax(QK^T)V, its scores held whole"
            )
        return ""

    def spec(self, vocab: int, context: int) -> TransformerSpec:
        """The :class:`TransformerSpec` of these keys over ``vocab`` token ids and ``context``
        positions: the one place the ``model.*`` keys become the model's settings. ``auto``
        settings must be resolved first (:meth:`for_backend`); ``auto`` attention is XLA's."""
        dtype = "float32" if self.dtype == "auto" else self.dtype
        keys = {name: getattr(self, name) for name in spec_keys()}
        return TransformerSpec(
            vocab=vocab, context=context, **keys, dtype=DTYPES[dtype], param_dtype=DTYPES[self.param_dtype]
        )

    def arithmetic(self) -> dict[str, Any]:
        """The resolved spec's keys but those of how it is computed or trained (the kernel, the
        dtypes, dropout, rematerialisation) and its size in ids and positions."""
        spec = dataclasses.replace(self, attention="xla", dtype="float32").spec(vocab=1, context=1)
        out = {k: getattr(spec, k) for k in spec_keys() if k not in HOW}
        layers = [spec.layer(i) for i in range(spec.layers)]  # the patterns as each layer has them
        out["attention_pattern"] = tuple(layer.attention for layer in layers)
        out["mlp_pattern"] = tuple(layer.mlp for layer in layers)
        unused = []  # keys no layer uses
        if "dense" not in out["mlp_pattern"]:
            unused += ["mlp_hidden", "mlp", "gelu"]
        if "moe" not in out["mlp_pattern"]:
            unused += [k for k in MOE_KEYS if k not in HOW]
        if "local" not in out["attention_pattern"]:
            unused += ["window", "rope_local_theta"]
        if spec.rope_scaling != "llama3":
            unused += ["rope_low_freq_factor", "rope_high_freq_factor", "rope_original_context"]
        if spec.rope_scaling == "none":
            unused += ["rope_factor"]
        if spec.mlp == "swiglu":
            unused += ["gelu"]
        if spec.rope_local_theta == spec.rope_theta and spec.rope_scaling == "none":
            out["rope_local_theta"] = 0.0  # the local layers' base given, the same as the rest's
        return {k: v for k, v in out.items() if k not in unused}

    def active_parameters(self, params: Any) -> int:
        """The parameters each token computes with: every one but the experts it is not routed to
        (``experts_per_token / experts`` of each mixture's expert kernels)."""
        total = 0
        for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
            names = [str(getattr(k, "key", k)) for k in path]
            size = math.prod(np.shape(leaf))
            routed = len(names) >= 2 and names[-2] == "moe" and names[-1] in ("gate", "up", "down")
            total += size * self.experts_per_token // self.experts if routed else size
        return total

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
        on every tensor device otherwise (fewer key/value heads than tensor devices); an ``expert``
        axis that does not divide the experts, or a ``context`` axis under soft-capped attention, is a
        :class:`UserError`."""
        kv_heads = self.kv_heads or self.heads
        ways = mesh_shape.get("expert", 1)
        if ways > 1 and (not self.experts or self.experts % ways):
            raise UserError(
                f"mesh.expert={ways} does not divide model.experts={self.experts}; give an expert axis that divides "
                "the experts (or mesh.expert=1)"
            )
        if mesh_shape.get("context", 1) > 1 and self.attention_softcap:
            raise UserError(
                f"model.attention_softcap={self.attention_softcap} is not computed over a sequence split by "
                f"mesh.context={mesh_shape['context']}; use mesh.context=1 for a soft-capped model (Gemma 2)"
            )
        return (("kv_heads", "tensor" if kv_heads % mesh_shape.get("tensor", 1) == 0 else None),)


def transformer_flops(spec: TransformerSpec, *, batch: int, causal: bool = True) -> float:
    """Forward FLOPs of :class:`TransformerLanguageModel` of ``spec`` on ``batch`` sequences of
    ``spec.context`` tokens (see :mod:`jaxnet.flops`): the projections (queries, keys and values
    of their own head counts, the output, the MLP: two matrices, three for SwiGLU and GeGLU; a mixture
    layer's router, the k experts each token goes to and its shared experts), the attention scores and
    weighted values (only the pairs a causal model needs when ``causal`` and ``spec.causal``: a local
    layer's queries each see their window), the logits."""
    length = spec.context
    tokens = batch * length
    w, hd = spec.width, spec.head_dim
    attention = w * spec.heads * hd + 2 * w * spec.kv_heads * hd + spec.heads * hd * w
    dense = (3 if spec.mlp in ("swiglu", "geglu") else 2) * w * spec.mlp_hidden  # gated: gate, in and out
    routed = w * spec.experts + 3 * w * spec.expert_hidden * (spec.experts_per_token + spec.shared_experts)

    def pairs(window: int) -> float:
        if not (causal and spec.causal):
            return length * length
        if window and window < length:  # each query sees its last `window` positions
            return window * (window + 1) / 2 + (length - window) * window
        return length * (length + 1) / 2

    # each layer's projections and, over all heads, q.k and the weighted sum of v in its window
    layers = collections.Counter((spec.layer(i).window, spec.layer(i).mlp) for i in range(spec.layers))
    blocks = sum(
        count
        * (
            2 * tokens * (attention + (routed if mlp == "moe" else dense))
            + 2 * 2 * batch * pairs(window) * spec.heads * hd
        )
        for (window, mlp), count in layers.items()
    )
    logits = 2 * tokens * w * spec.vocab
    return blocks + logits


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
    "Layer",
    "SpecError",
    "TransformerConfig",
    "TransformerKeys",
    "TransformerLanguageModel",
    "TransformerSpec",
    "attend",
    "check",
    "attention_fn",
    "head_major_attention",
    "mask_unused_vocab",
    "norm",
    "preset",
    "rotary",
    "segment_mask",
    "transformer_flops",
]

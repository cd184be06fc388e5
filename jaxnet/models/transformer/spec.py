"""What a Transformer is: one frozen :class:`TransformerSpec` that every module of the model takes
whole, and the variants of it as presets (:data:`PRESETS`).

A setting of the model is one field here and one use where it acts; the ``model.*`` config keys
(:class:`~jaxnet.models.transformer.TransformerConfig`) become a spec in one place, and so does a
Hugging Face ``config.json`` (:mod:`jaxnet.models.hf`)::

    spec = TransformerSpec(vocab=84, context=128, layers=4, width=128, heads=4, **PRESETS["char_gpt"])
    model = TransformerLanguageModel(spec)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import jax.numpy as jnp

from jaxnet.models.common import MATMULS, REMAT

_LLAMA: dict[str, Any] = {
    "position": "rotary",
    "tie_embeddings": False,
    "causal": True,
    "norm": "rms",
    "mlp": "swiglu",
    "bias": "none",
    "norm_eps": 1e-5,
    "rope_theta": 10000.0,
}

#: Variants of the Transformer: the fields that make each what it is, sizes left to the caller.
#: ``char_gpt`` is jaxnet's own GPT (learned positions, tied embeddings, tanh GELU, LayerNorm
#: epsilon 1e-6); ``gpt2`` is OpenAI's (epsilon 1e-5), as its Hugging Face checkpoints hold it;
#: ``bert_encoder`` attends both ways, with rotary positions. ``llama`` is the decoder of Llama,
#: Mistral, SmolLM and TinyLlama: rotary positions, RMSNorm, a SwiGLU MLP, no biases, untied
#: output; ``qwen2`` is the same with biases on the queries, keys and values; ``mistral`` is
#: ``llama`` (its sliding window is not a preset: jaxnet attends over the whole context). The
#: sizes (``kv_heads``, ``mlp_hidden``, ``rope_theta``, rope scaling) are each checkpoint's own.
PRESETS: dict[str, dict[str, Any]] = {
    "char_gpt": {"position": "learned", "tie_embeddings": True, "causal": True, "gelu": "tanh", "norm_eps": 1e-6},
    "gpt2": {"position": "learned", "tie_embeddings": True, "causal": True, "gelu": "tanh", "norm_eps": 1e-5},
    "bert_encoder": {"position": "rotary", "causal": False},
    "llama": _LLAMA,
    "qwen2": {**_LLAMA, "bias": "qkv", "norm_eps": 1e-6},
    "mistral": _LLAMA,
}

#: What ``bias`` puts a bias on: every projection, or only the queries, keys and values (Qwen2), or none (Llama).
BIAS_GROUPS = {"all": ("qkv", "out", "mlp"), "qkv": ("qkv",), "none": ()}


@dataclass(frozen=True)
class TransformerSpec:
    """The whole of a Transformer language model (a causal decoder, or a bidirectional encoder).

    ``vocab`` rows of the token embedding (the data's vocabulary, maybe padded to a round size),
    of which the first ``vocab_used`` are ever predicted (0 = all); ``context`` positions (the
    learned position table and the decoding cache). ``layers`` blocks of ``width``, attention with
    ``heads`` query heads of ``head_dim`` (0 = ``width // heads``) and ``kv_heads`` key/value heads
    (0 = ``heads``; fewer is grouped-query attention, each key/value head serving
    ``heads // kv_heads`` query heads), an MLP of ``mlp_hidden`` units (0 = 4 x ``width``):
    ``mlp`` ``gelu`` (in, GELU, out) or ``swiglu`` (out(silu(gate) * in), Llama's). ``norm`` is
    ``layer`` (LayerNorm, scale and bias) or ``rms`` (RMSNorm, scale only), of epsilon
    ``norm_eps``; ``bias`` which projections have a bias (:data:`BIAS_GROUPS`). ``position`` is
    ``learned`` (a table added to the embeddings) or ``rotary`` (inside attention, of base
    ``rope_theta``; ``rope_scaling="llama3"`` rescales its frequencies as Llama 3.1 does, by
    ``rope_factor`` below ``rope_low_freq_factor`` and smoothly up to ``rope_high_freq_factor``
    wavelengths per ``rope_original_context`` positions); ``attention`` the kernel (``xla``,
    ``xla_head_major``, ``cudnn``, resolved for a backend); ``remat`` what each block keeps for the
    backward pass, the rest recomputed (:data:`~jaxnet.models.common.REMAT`: ``none``, ``full``,
    ``dots``, ``dots_no_batch``, ``minimal``, ``offload``); ``matmul`` how the projections of
    attention and the MLP multiply (``default``: in ``dtype``; ``fp8``: through float8, the output
    layer and attention's own products staying in ``dtype``); ``dtype`` the compute dtype,
    ``param_dtype`` the parameters'. A spec is hashable (a static argument of ``jit``).
    """

    vocab: int
    context: int
    layers: int = 4
    width: int = 256
    heads: int = 4
    kv_heads: int = 0
    head_dim: int = 0
    mlp_hidden: int = 0
    mlp: str = "gelu"
    norm: str = "layer"
    bias: str = "all"
    dropout: float = 0.0
    position: str = "learned"
    tie_embeddings: bool = True
    causal: bool = True
    attention: str = "xla"
    remat: str = "none"
    matmul: str = "default"
    gelu: str = "tanh"
    norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: str = "none"
    rope_factor: float = 8.0
    rope_low_freq_factor: float = 1.0
    rope_high_freq_factor: float = 4.0
    rope_original_context: int = 8192
    vocab_used: int = 0
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32

    def __post_init__(self) -> None:
        if not self.kv_heads:
            object.__setattr__(self, "kv_heads", self.heads)
        if not self.mlp_hidden:
            object.__setattr__(self, "mlp_hidden", 4 * self.width)
        if not self.head_dim:
            if self.width % self.heads:
                raise ValueError(f"width {self.width} is not divisible by heads {self.heads}")
            object.__setattr__(self, "head_dim", self.width // self.heads)
        if self.heads % self.kv_heads:
            raise ValueError(f"heads {self.heads} is not divisible by kv_heads {self.kv_heads}")
        if self.position == "rotary" and self.head_dim % 2:
            raise ValueError(f"rotary positions need an even head size; head_dim = {self.head_dim}")
        for name, value, allowed in (
            ("norm", self.norm, ("layer", "rms")),
            ("mlp", self.mlp, ("gelu", "swiglu")),
            ("bias", self.bias, tuple(BIAS_GROUPS)),
            ("rope_scaling", self.rope_scaling, ("none", "llama3")),
            ("remat", self.remat, REMAT),
            ("matmul", self.matmul, MATMULS),
        ):
            if value not in allowed:
                raise ValueError(f"{name}={value!r} is not one of {', '.join(allowed)}")

    def biased(self, group: str) -> bool:
        """Whether the projections of ``group`` (``qkv``, ``out``, ``mlp``) have a bias (:data:`BIAS_GROUPS`)."""
        return group in BIAS_GROUPS[self.bias]

    @property
    def rope_llama3(self) -> tuple[float, float, float, int] | None:
        """Llama 3.1's rescaling of the rotary frequencies (factor, low and high frequency factors,
        original context), or None."""
        if self.rope_scaling != "llama3":
            return None
        return (self.rope_factor, self.rope_low_freq_factor, self.rope_high_freq_factor, self.rope_original_context)

    @property
    def groups(self) -> int:
        """Query heads per key/value head (1: multi-head attention)."""
        return self.heads // self.kv_heads

    @property
    def out_std(self) -> float:
        """Initial scale of each residual branch's output projection (GPT-2: 0.02 / sqrt(2 layers))."""
        return 0.02 / math.sqrt(2 * self.layers)


def preset(name: str, **fields: Any) -> TransformerSpec:
    """The spec of variant ``name`` of :data:`PRESETS` with ``fields`` (sizes, vocabulary, context)::

    preset("gpt2", vocab=50257, context=1024, layers=12, width=768, heads=12)
    """
    return TransformerSpec(**{**PRESETS[name], **fields})

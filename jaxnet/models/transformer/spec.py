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

#: Variants of the Transformer: the fields that make each what it is, sizes left to the caller.
#: ``char_gpt`` is jaxnet's own GPT (learned positions, tied embeddings, tanh GELU, LayerNorm
#: epsilon 1e-6); ``gpt2`` is OpenAI's (epsilon 1e-5), as its Hugging Face checkpoints hold it;
#: ``bert_encoder`` attends both ways, with rotary positions.
PRESETS: dict[str, dict[str, Any]] = {
    "char_gpt": {"position": "learned", "tie_embeddings": True, "causal": True, "gelu": "tanh", "norm_eps": 1e-6},
    "gpt2": {"position": "learned", "tie_embeddings": True, "causal": True, "gelu": "tanh", "norm_eps": 1e-5},
    "bert_encoder": {"position": "rotary", "causal": False},
}


@dataclass(frozen=True)
class TransformerSpec:
    """The whole of a Transformer language model (a causal decoder, or a bidirectional encoder).

    ``vocab`` rows of the token embedding (the data's vocabulary, maybe padded to a round size),
    of which the first ``vocab_used`` are ever predicted (0 = all); ``context`` positions (the
    learned position table and the decoding cache). ``layers`` blocks of ``width``, attention with
    ``heads`` query heads and ``kv_heads`` key/value heads (0 = ``heads``; fewer is grouped-query
    attention, each key/value head serving ``heads // kv_heads`` query heads), an MLP of
    ``mlp_hidden`` units (0 = 4 x ``width``). ``position`` is ``learned`` (a table added to the
    embeddings) or ``rotary`` (inside attention); ``attention`` the kernel (``xla``,
    ``xla_head_major``, ``cudnn``, resolved for a backend); ``dtype`` the compute dtype,
    ``param_dtype`` the parameters'. A spec is hashable (a static argument of ``jit``).
    """

    vocab: int
    context: int
    layers: int = 4
    width: int = 256
    heads: int = 4
    kv_heads: int = 0
    mlp_hidden: int = 0
    dropout: float = 0.0
    position: str = "learned"
    tie_embeddings: bool = True
    causal: bool = True
    attention: str = "xla"
    remat: bool = False
    gelu: str = "tanh"
    norm_eps: float = 1e-6
    vocab_used: int = 0
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32

    def __post_init__(self) -> None:
        if not self.kv_heads:
            object.__setattr__(self, "kv_heads", self.heads)
        if not self.mlp_hidden:
            object.__setattr__(self, "mlp_hidden", 4 * self.width)
        if self.width % self.heads:
            raise ValueError(f"width {self.width} is not divisible by heads {self.heads}")
        if self.heads % self.kv_heads:
            raise ValueError(f"heads {self.heads} is not divisible by kv_heads {self.kv_heads}")
        if self.position == "rotary" and self.head_dim % 2:
            raise ValueError(f"rotary positions need an even head size; width / heads = {self.head_dim}")

    @property
    def head_dim(self) -> int:
        """Size of one attention head: ``width // heads``."""
        return self.width // self.heads

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

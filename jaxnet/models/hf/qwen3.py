"""Qwen3 (``model_type: qwen3``, ``Qwen3ForCausalLM``): Qwen2 without biases, with RMSNorm on each
head's queries and keys before the rotary positions.

jaxnet's Transformer in its ``qwen3`` preset (``llama`` with ``qk_norm``); the tensors are Llama's
(:mod:`jaxnet.models.hf.llama`) and two more per block::

    layers.N.self_attn.q_norm.weight [head_dim]   -> block_N/attention/query_norm/scale
    layers.N.self_attn.k_norm.weight [head_dim]   -> block_N/attention/key_norm/scale

``head_dim`` is its own (128 where ``config.json`` names none, as transformers' class has it), and
the sliding window is Qwen2's (the layers from ``max_window_layers`` on, with ``use_sliding_window``).
Biases on the attention's projections (``attention_bias: true``, on the output too) are refused.
"""

from __future__ import annotations

from typing import Any

from jaxnet.models.hf.llama import VECTOR, Qwen2
from jaxnet.models.hf.table import Rule


class Qwen3(Qwen2):
    """Qwen3's table (see the module's docstring)."""

    model_type = "qwen3"
    title = "Qwen3"
    architectures = ("Qwen3ForCausalLM",)
    preset = "qwen3"
    default_head_dim = 128

    def refused(self, config: dict[str, Any]) -> list[str]:
        refused = super().refused(config)
        if config.get("attention_bias"):
            refused.append("attention_bias=true (biases on the queries, keys, values and output but not the MLP)")
        return refused

    def config(self, keys: dict[str, Any], vocab: int, context: int) -> dict[str, Any]:
        return {**super().config(keys, vocab, context), "attention_bias": False}

    def rules(self, keys: dict[str, Any]) -> list[Rule]:
        b, n = "block_{i}/attention/", "layers.{i}.self_attn."
        norms = [
            Rule(f"{n}{q}_norm.weight", (f"{b}{name}_norm/scale",), VECTOR)
            for q, name in (("q", "query"), ("k", "key"))
        ]
        return super().rules(keys) + norms

"""Phi-3 and Phi-4 (``model_type: phi3``, ``Phi3ForCausalLM``): Llama's decoder whose files fuse the
queries, keys and values into one tensor, and the MLP's gate and up projections into another.

jaxnet's Transformer in its ``phi3`` preset (= ``llama``); a sliding window (Phi-3-mini-4k's 2,047)
is every layer's. The tensors are Llama's (:mod:`jaxnet.models.hf.llama`) but two, each holding
several of jaxnet's kernels side by side along its outputs (``Layout(inputs=1, transposed=True)``
with several parts, as transformers splits them)::

    layers.N.self_attn.qkv_proj.weight [(heads + 2 kv_heads) x hd, w] -> block_N/attention/query, key, value/kernel
    layers.N.mlp.gate_up_proj.weight [2 hidden, w]                    -> block_N/mlp_gate/kernel, block_N/mlp_in/kernel

Phi-3's ``longrope`` scaling (the 128k checkpoints) and a partial rotary factor (Phi-4-mini) are
refused in one line.
"""

from __future__ import annotations

from typing import Any

from jaxnet.models.hf.llama import LINEAR, Llama, every_layer_window, every_layer_window_config
from jaxnet.models.hf.table import Rule
from jaxnet.models.transformer import TransformerConfig

#: The files' fused tensors: each of jaxnet's kernels a part of one (in the files' order).
FUSED = {
    "self_attn.qkv_proj": ("attention/query", "attention/key", "attention/value"),
    "mlp.gate_up_proj": ("mlp_gate", "mlp_in"),
}


class Phi3(Llama):
    """Phi-3's table (see the module's docstring)."""

    model_type = "phi3"
    title = "Phi-3"
    architectures = ("Phi3ForCausalLM",)
    preset = "phi3"
    bias_keys = False

    def variant(self, config: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
        return every_layer_window(config, self.title)

    def variant_config(self, cfg: TransformerConfig) -> dict[str, Any]:
        # No padding id past a small vocabulary (transformers' default is 32,000); an export carries the source's
        return {**every_layer_window_config(cfg), "pad_token_id": None, "resid_pdrop": 0.0, "embd_pdrop": 0.0}

    def rules(self, keys: dict[str, Any]) -> list[Rule]:
        fused = {f"block_{{i}}/{name}/kernel" for names in FUSED.values() for name in names}
        rules = [r for r in super().rules(keys) if not set(r.model) & fused]
        for tensor, names in FUSED.items():
            rules.append(Rule(f"layers.{{i}}.{tensor}.weight", tuple(f"block_{{i}}/{n}/kernel" for n in names), LINEAR))
        return rules

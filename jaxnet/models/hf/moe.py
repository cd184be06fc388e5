"""Mixtures of experts: Mixtral (``model_type: mixtral``) and Qwen3-MoE (``qwen3_moe``).

Both are Llama's table (:mod:`jaxnet.models.hf.llama`: attention, norms, embeddings, rope) with
mixture layers (:mod:`jaxnet.models.transformer.moe`) in place of the dense MLP. The files hold
one tensor per expert; the model one stacked array per kind of kernel, so each rule stacks the
experts' tensors on the way in and splits them on the way out (``Rule(..., stack="experts")``)::

    Mixtral  layers.N.block_sparse_moe.gate.weight [E, w]           -> block_N/moe/router [w, E]
             layers.N.block_sparse_moe.experts.e.w1.weight [h, w]   -> block_N/moe/gate [E, w, h] (w3: up)
             layers.N.block_sparse_moe.experts.e.w2.weight [w, h]   -> block_N/moe/down [E, h, w]
    Qwen3    layers.N.mlp.gate.weight [E, w]                        -> block_N/moe/router [w, E]
             layers.N.mlp.experts.e.{gate,up,down}_proj.weight      -> block_N/moe/{gate,up,down}
             layers.N.self_attn.{q,k}_norm.weight [head_dim]        -> block_N/attention/{query,key}_norm/scale

Mixtral routes each token to its top-k experts with the softmax of their logits (the top-k of the
softmax, renormalised); Qwen3-MoE renormalises only with ``norm_topk_prob``, has query/key norms
and may keep some layers dense (``mlp_only_layers``, ``decoder_sparse_step``: an ``mlp_pattern``
naming each layer). ``router_aux_loss_coef`` becomes ``model.router_aux_loss``. A sliding window
(Mixtral's ``sliding_window`` shorter than the context) makes every layer ``local``.
"""

from __future__ import annotations

from typing import Any

from jaxnet.errors import UserError
from jaxnet.models.hf.llama import LINEAR, VECTOR, Llama
from jaxnet.models.hf.table import Rule


def layer_kinds(keys: dict[str, Any]) -> list[str]:
    """Each layer's MLP kind, ``mlp_pattern`` repeated over the layers."""
    pattern = tuple(keys.get("mlp_pattern") or ("dense",))
    return [pattern[i % len(pattern)] for i in range(int(keys["layers"]))]


class Mixtral(Llama):
    """Mixtral (``MixtralForCausalLM``): Llama with a mixture of experts in every layer."""

    model_type = "mixtral"
    title = "Mixtral"
    architectures = ("MixtralForCausalLM",)
    bias_keys = False
    #: config.json's names of the mixture (experts, top-k), and the file's names of its tensors.
    experts_key, top_k_key = "num_local_experts", "num_experts_per_tok"
    moe_prefix, router_name = "block_sparse_moe", "gate"
    expert_names = {"gate": "w1", "up": "w3", "down": "w2"}

    def refused(self, config: dict[str, Any]) -> list[str]:
        refused = super().refused(config)
        if not int(config.get(self.experts_key) or 0):
            refused.append(f"{self.experts_key}={config.get(self.experts_key)} (a mixture needs experts)")
        return refused

    def keys(self, config: dict[str, Any]) -> dict[str, Any]:
        keys = super().keys(config)
        keys.update(
            mlp_pattern=("moe",),
            experts=int(config.get(self.experts_key) or 0),
            experts_per_token=int(config.get(self.top_k_key, 2)),
            expert_hidden=int(config.get("intermediate_size", 14336)),
            router_renorm=True,
            router_aux_loss=float(config.get("router_aux_loss_coef", 0.001)),
        )
        return {**keys, **self.window(config, keys["context"])}

    def window(self, config: dict[str, Any], context: int) -> dict[str, Any]:
        """The attention keys of a sliding window shorter than the context (every layer local), if any."""
        window = config.get("sliding_window")
        if window is None or int(window) >= context:
            return {}
        return {"attention_pattern": ("local",), "window": int(window)}

    def config(self, keys: dict[str, Any], vocab: int, context: int) -> dict[str, Any]:
        out = super().config(keys, vocab, context)
        out.update(
            {
                self.experts_key: keys["experts"],
                self.top_k_key: keys["experts_per_token"],
                "intermediate_size": keys["expert_hidden"] or out["intermediate_size"],
                "router_aux_loss_coef": keys["router_aux_loss"],
                "sliding_window": keys["window"] if "local" in keys["attention_pattern"] else None,
            }
        )
        return out

    def mlp_rules(self, keys: dict[str, Any], layer: str = "{i}") -> list[Rule]:
        rules = []
        for i, kind in enumerate(layer_kinds(keys)):
            if kind != "moe":
                rules += super().mlp_rules(keys, str(i))
                continue
            b, n = f"block_{i}/moe/", f"layers.{i}.{self.moe_prefix}."
            rules.append(Rule(f"{n}{self.router_name}.weight", (b + "router",), LINEAR))
            for ours, theirs in self.expert_names.items():
                rules.append(Rule(f"{n}experts.{{e}}.{theirs}.weight", (b + ours,), LINEAR, stack="experts"))
        return rules


class Qwen3Moe(Mixtral):
    """Qwen3-MoE (``Qwen3MoeForCausalLM``): query/key norms, routing renormalised only with
    ``norm_topk_prob``, experts of ``moe_intermediate_size`` units, some layers dense."""

    model_type = "qwen3_moe"
    title = "Qwen3-MoE"
    architectures = ("Qwen3MoeForCausalLM",)
    moe_prefix, router_name = "mlp", "gate"
    expert_names = {"gate": "gate_proj", "up": "up_proj", "down": "down_proj"}

    def refused(self, config: dict[str, Any]) -> list[str]:
        config = {**config, self.experts_key: config.get(self.experts_key) or config.get("num_experts")}
        refused = super().refused(config)
        if config.get("attention_bias"):
            refused.append("attention_bias=true (jaxnet's Qwen3 has no attention biases)")
        if config.get("use_sliding_window"):
            refused.append("use_sliding_window=true")
        return refused

    def keys(self, config: dict[str, Any]) -> dict[str, Any]:
        config = {**config, self.experts_key: config.get(self.experts_key) or config.get("num_experts")}
        keys = super().keys(config)
        layers = keys["layers"]
        step = int(config.get("decoder_sparse_step") or 1)
        dense = {int(i) for i in config.get("mlp_only_layers") or ()}
        kinds = tuple("moe" if i not in dense and (i + 1) % step == 0 else "dense" for i in range(layers))
        keys.update(
            qk_norm=True,
            mlp_pattern=("moe",) if set(kinds) == {"moe"} else kinds,
            expert_hidden=int(config.get("moe_intermediate_size", 768)),
            router_renorm=bool(config.get("norm_topk_prob", False)),
        )
        return keys

    def window(self, config: dict[str, Any], context: int) -> dict[str, Any]:
        return {}  # refused above when switched on

    def config(self, keys: dict[str, Any], vocab: int, context: int) -> dict[str, Any]:
        out = super().config(keys, vocab, context)
        kinds = layer_kinds(keys)
        out.update(
            num_experts=keys["experts"],
            moe_intermediate_size=keys["expert_hidden"],
            intermediate_size=keys["mlp_hidden"] or keys["mlp_ratio"] * keys["width"],
            norm_topk_prob=keys["router_renorm"],
            decoder_sparse_step=1,
            mlp_only_layers=[i for i, kind in enumerate(kinds) if kind != "moe"],
            use_sliding_window=False,
            sliding_window=None,
            attention_bias=False,
        )
        if keys["window"] and "local" in keys["attention_pattern"]:
            raise UserError("Qwen3-MoE's sliding window is not written by jaxnet; this model has local layers")
        return out

    def rules(self, keys: dict[str, Any]) -> list[Rule]:
        n, b = "layers.{i}.self_attn.", "block_{i}/attention/"
        norms = [
            Rule(f"{n}{q}_norm.weight", (f"{b}{name}_norm/scale",), VECTOR)
            for q, name in (("q", "query"), ("k", "key"))
        ]
        return super().rules(keys) + norms

"""Gemma, Gemma 2 and Gemma 3 (text): ``GemmaForCausalLM``, ``Gemma2ForCausalLM``, ``Gemma3ForCausalLM``.

Each is jaxnet's Transformer in its preset of the same name (``gemma``, ``gemma2``, ``gemma3``):
Llama's decoder with a GeGLU MLP (``hidden_activation``: the tanh GELU), RMSNorm scales kept as the
files keep them, ``w``, and computed as ``1 + w`` (``model.norm_offset=1``: a bfloat16 run holds the
file's bytes, where a transform to ``1 + w`` would round them), the embeddings multiplied by
sqrt(width) and tied to the output, and a head size of its own (256 where ``config.json`` names
none). Gemma 2 adds norms after each branch, the attention scaled by ``query_pre_attn_scalar``,
soft-capped attention and output logits (``attn_logit_softcapping``, ``final_logit_softcapping``)
and local layers (``sliding_window``) alternating with global ones (``layer_types``); Gemma 3 adds
RMSNorm on each head's queries and keys, five local layers to one global
(``sliding_window_pattern``), each kind with its own rotary base (``rope_local_base_freq``, or
``rope_parameters`` by layer type) and linear rope scaling on the global ones, without soft-capping.

The tensors are Llama's (:mod:`jaxnet.models.hf.llama`), but Gemma 2's and 3's norms, four per
block::

    layers.N.input_layernorm.weight             -> block_N/norm_1/scale
    layers.N.post_attention_layernorm.weight    -> block_N/norm_1_post/scale   (Gemma 1: block_N/norm_2/scale)
    layers.N.pre_feedforward_layernorm.weight   -> block_N/norm_2/scale
    layers.N.post_feedforward_layernorm.weight  -> block_N/norm_2_post/scale
    layers.N.self_attn.q_norm.weight            -> block_N/attention/query_norm/scale   (Gemma 3; k_norm: key_norm)

The multimodal Gemma 3 (``Gemma3ForConditionalGeneration``, ``model_type: gemma3``) is refused in
one line (:data:`REFUSED`); so are bidirectional attention and attention biases.
"""

from __future__ import annotations

from typing import Any

from jaxnet.models.hf.llama import VECTOR, Llama, attention_layers, layer_types, rope
from jaxnet.models.hf.table import Rule
from jaxnet.models.transformer import TransformerConfig

#: ``hidden_activation`` -> ``model.gelu`` (Gemma 2 and 3; Gemma 1 reads ``gelu`` as the tanh GELU, as
#: transformers does).
GELU = {"gelu_pytorch_tanh": "tanh", "gelu_new": "tanh", "gelu_fast": "tanh", "gelu": "exact"}

#: Gemma architectures jaxnet does not read, by ``model_type``: why, in a line.
REFUSED = {
    "gemma3": "Gemma3ForConditionalGeneration, the multimodal Gemma 3 (a vision tower beside the text decoder); "
    "jaxnet reads the text-only Gemma3ForCausalLM (model_type gemma3_text)",
}


class Gemma(Llama):
    """Gemma 1's table (see the module's docstring); Gemma 2's and 3's subclass it."""

    model_type = "gemma"
    title = "Gemma"
    architectures = ("GemmaForCausalLM",)
    preset = "gemma"
    bias_keys = False
    default_head_dim = 256
    tied_by_default = True
    #: The ``hidden_activation`` names read, as ``model.gelu``.
    gelus = {**GELU, "gelu": "tanh"}

    def activation(self, config: dict[str, Any]) -> str:
        return config.get("hidden_activation") or config.get("hidden_act") or "gelu_pytorch_tanh"

    def refused(self, config: dict[str, Any]) -> list[str]:
        refused = []
        activation = self.activation(config)
        if activation not in self.gelus:
            refused.append(f"hidden_activation={activation!r} (jaxnet's GeGLU has {', '.join(self.gelus)})")
        for key, what in (
            ("attention_bias", "biases on the attention's projections"),
            ("use_bidirectional_attention", "bidirectional attention"),
            ("quantization_config", "quantized weights"),
        ):
            if config.get(key):
                refused.append(f"{key}={config[key]!r} ({what})")
        if config.get("attention_dropout"):
            refused.append(f"attention_dropout={config['attention_dropout']} (jaxnet drops no attention weights)")
        return refused

    def variant(self, config: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
        return {"gelu": self.gelus.get(self.activation(config), "tanh")}, []

    def variant_config(self, cfg: TransformerConfig) -> dict[str, Any]:
        return {"hidden_act": "gelu_pytorch_tanh" if cfg.gelu == "tanh" else "gelu"}


class Gemma2(Gemma):
    """Gemma 2's table (see the module's docstring)."""

    model_type = "gemma2"
    title = "Gemma 2"
    architectures = ("Gemma2ForCausalLM",)
    preset = "gemma2"
    gelus = GELU
    #: Soft-capping where config.json says nothing (transformers' defaults).
    softcaps = {"attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0}
    #: Which layers are local where config.json has no ``layer_types``: every ``pattern``-th is global.
    pattern = 2

    def variant(self, config: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
        keys, refused = super().variant(config)
        layers = int(config.get("num_hidden_layers", 26))
        every = int(config.get("sliding_window_pattern") or self.pattern)
        types = config.get("layer_types") or [
            "full_attention" if (i + 1) % every == 0 else "sliding_attention" for i in range(layers)
        ]
        windows, also = attention_layers(types, config.get("sliding_window", 4096), self.title)
        scalar = config.get("query_pre_attn_scalar", 256)
        head_dim = int(config.get("head_dim") or self.default_head_dim)
        if float(scalar) != int(scalar):
            also.append(f"query_pre_attn_scalar={scalar} (jaxnet's is a whole number)")
        caps = {k: config.get(k, default) for k, default in self.softcaps.items()}
        return {
            **keys,
            **windows,
            "attention_scale_dim": 0 if int(scalar) == head_dim else int(scalar),
            "attention_softcap": float(caps["attn_logit_softcapping"] or 0.0),
            "logit_softcap": float(caps["final_logit_softcapping"] or 0.0),
        }, refused + also

    def variant_config(self, cfg: TransformerConfig) -> dict[str, Any]:
        local = "local" in cfg.attention_pattern
        return {
            "hidden_activation": "gelu_pytorch_tanh" if cfg.gelu == "tanh" else "gelu",
            "query_pre_attn_scalar": cfg.attention_scale_dim or cfg.head_size,
            "attn_logit_softcapping": cfg.attention_softcap or None,
            "final_logit_softcapping": cfg.logit_softcap or None,
            "sliding_window": cfg.window if local else None,
            "layer_types": layer_types(cfg),
        }

    def rules(self, keys: dict[str, Any]) -> list[Rule]:
        b, n = "block_{i}/", "layers.{i}."
        norms = {
            "post_attention_layernorm": "norm_1_post",
            "pre_feedforward_layernorm": "norm_2",
            "post_feedforward_layernorm": "norm_2_post",
        }
        rules = [r for r in super().rules(keys) if r.file != n + "post_attention_layernorm.weight"]
        return rules + [Rule(f"{n}{name}.weight", (f"{b}{ours}/scale",), VECTOR) for name, ours in norms.items()]


class Gemma3Text(Gemma2):
    """Gemma 3's text decoder (``Gemma3ForCausalLM``; see the module's docstring)."""

    model_type = "gemma3_text"
    title = "Gemma 3"
    architectures = ("Gemma3ForCausalLM",)
    preset = "gemma3"
    softcaps = {"attn_logit_softcapping": None, "final_logit_softcapping": None}
    pattern = 6

    def rotary(self, config: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
        # rope_parameters by layer type (transformers 5), or rope_theta, rope_scaling and
        # rope_local_base_freq (4.x); the defaults of transformers' class where neither says
        config = {"rope_theta": 1000000.0, **config}
        params = config.get("rope_parameters") or {}
        nested = isinstance(params, dict) and any(isinstance(v, dict) for v in params.values())
        if nested:
            keys, refused = rope(config, params.get("full_attention") or {})
            local = params.get("sliding_attention") or {}
            if (local.get("rope_type") or "default") != "default":
                refused.append(f"rope type {local['rope_type']!r} on the sliding layers (jaxnet's are unscaled)")
            theta = local.get("rope_theta", config.get("rope_local_base_freq", 10000.0))
        else:
            keys, refused = rope(config)
            theta = config.get("rope_local_base_freq", 10000.0)
        return {**keys, "rope_local_theta": float(theta)}, refused

    def variant_config(self, cfg: TransformerConfig) -> dict[str, Any]:
        return {**super().variant_config(cfg), "rope_local_base_freq": cfg.rope_local_theta or cfg.rope_theta}

    def rules(self, keys: dict[str, Any]) -> list[Rule]:
        b, n = "block_{i}/attention/", "layers.{i}.self_attn."
        norms = [
            Rule(f"{n}{q}_norm.weight", (f"{b}{name}_norm/scale",), VECTOR)
            for q, name in (("q", "query"), ("k", "key"))
        ]
        return super().rules(keys) + norms


__all__ = ["REFUSED", "Gemma", "Gemma2", "Gemma3Text"]

"""Llama (``model_type: llama``, ``LlamaForCausalLM``) and its small variations, Qwen2 and Mistral.

All three are jaxnet's Transformer in its ``llama`` preset: rotary positions (half-split, as
jaxnet's own: the query and key weights need no permutation), RMSNorm, a SwiGLU MLP, no biases,
an untied output head unless ``tie_word_embeddings``; the sizes, grouped-query attention
(``num_key_value_heads``), ``head_dim``, ``rope_theta`` and Llama 3.1's rope scaling are each
checkpoint's own. Their ``Linear`` layers keep weights as ``[outputs, inputs]``:
``Layout(inputs=1, transposed=True)``. The tensors by name (``model.`` in front of all but
``lm_head.weight``)::

    embed_tokens.weight [vocab, width]                -> embed/embedding
    layers.N.input_layernorm.weight [width]           -> block_N/norm_1/scale
    layers.N.self_attn.q_proj.weight [heads x hd, w]  -> block_N/attention/query/kernel [w, heads, hd]
    layers.N.self_attn.k_proj.weight [kv x hd, w]     -> block_N/attention/key/kernel [w, kv_heads, hd]  (v_proj: value)
    layers.N.self_attn.o_proj.weight [w, heads x hd]  -> block_N/attention/out/kernel [heads, hd, w]
    layers.N.post_attention_layernorm.weight [width]  -> block_N/norm_2/scale
    layers.N.mlp.gate_proj.weight [hidden, w]         -> block_N/mlp_gate/kernel [w, hidden]
    layers.N.mlp.up_proj.weight [hidden, w]           -> block_N/mlp_in/kernel [w, hidden]
    layers.N.mlp.down_proj.weight [w, hidden]         -> block_N/mlp_out/kernel [hidden, w]
    norm.weight [width]                               -> norm_out/scale
    lm_head.weight [vocab, width]                     -> output/kernel [width, vocab] (untied only)

Qwen2 differs by biases on the queries, keys and values (``q_proj.bias`` ... -> ``query/bias``
[heads, hd]) and a sliding window it may switch on (refused: jaxnet attends over the whole
context); Mistral by the sliding window it names (refused when it is shorter than the context).
Each is a subclass declaring only that.

``config.json`` is read as transformers 4.x writes it (``rope_theta``, ``rope_scaling``) and as
5.x does (``rope_parameters``), and written as 4.x did, which both read. Whatever would change
the arithmetic and jaxnet does not compute (another activation, another rope type, a sliding
window, biases on the output but not the MLP, quantized weights) is refused in one line.
"""

from __future__ import annotations

from typing import Any

from jaxnet.errors import UserError
from jaxnet.models.hf.table import Layout, Rule, Table
from jaxnet.models.transformer import PRESETS, TransformerConfig

LINEAR, VECTOR = Layout(inputs=1, transposed=True), Layout(inputs=0)


def rope(config: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The rotary ``model.*`` keys of a ``config.json`` (``rope_parameters`` as transformers 5 writes
    it, or ``rope_theta`` and ``rope_scaling`` as 4.x did), and what of it jaxnet does not compute."""
    params = config.get("rope_parameters") or {}
    scaling = config.get("rope_scaling") or {}
    refused: list[str] = []
    if not isinstance(params, dict) or any(isinstance(v, dict) for v in params.values()):
        return {}, ["rope_parameters per layer type"]
    if not isinstance(scaling, dict):
        return {}, [f"rope_scaling={scaling!r}"]
    source = params if (params.get("rope_type") or params.get("type")) not in (None, "default") else scaling
    kind = source.get("rope_type") or source.get("type") or "default"
    theta = params.get("rope_theta", config.get("rope_theta", 10000.0))
    keys: dict[str, Any] = {"rope_theta": float(theta)}
    partial = params.get("partial_rotary_factor", config.get("partial_rotary_factor", 1.0))
    if partial not in (None, 1, 1.0):
        refused.append(f"partial_rotary_factor={partial}")
    if kind == "llama3":
        keys.update(
            rope_scaling="llama3",
            rope_factor=float(source["factor"]),
            rope_low_freq_factor=float(source["low_freq_factor"]),
            rope_high_freq_factor=float(source["high_freq_factor"]),
            rope_original_context=int(
                source.get("original_max_position_embeddings") or config.get("max_position_embeddings", 8192)
            ),
        )
    elif kind != "default":
        refused.append(f"rope type {kind!r} (jaxnet has default and llama3)")
    return keys, refused


class Llama(Table):
    """Llama's table (see the module's docstring); Qwen2's and Mistral's are small subclasses."""

    model_type = "llama"
    title = "Llama"
    prefix = "model."
    unprefixed = ("lm_head.weight",)
    # A buffer older transformers saved beside the weights: the rotary frequencies, which jaxnet computes.
    ignored = r"layers\.\d+\.self_attn\.rotary_emb\.inv_freq"
    architectures = ("LlamaForCausalLM",)
    preset = "llama"
    #: Whether config.json's ``attention_bias`` and ``mlp_bias`` are read (Llama); else the preset's biases hold.
    bias_keys = True

    def refused(self, config: dict[str, Any]) -> list[str]:
        """What of ``config`` changes the arithmetic in a way jaxnet does not compute (beyond rope)."""
        refused = []
        activation = config.get("hidden_act", "silu")
        if activation != "silu":
            refused.append(f"hidden_act={activation!r} (jaxnet's SwiGLU is silu)")
        if config.get("attention_dropout"):
            refused.append(f"attention_dropout={config['attention_dropout']} (jaxnet drops no attention weights)")
        if config.get("quantization_config"):
            refused.append("quantization_config (quantized weights)")
        if self.bias_keys and bool(config.get("attention_bias")) != bool(config.get("mlp_bias")):
            refused.append(
                f"attention_bias={bool(config.get('attention_bias'))} with mlp_bias={bool(config.get('mlp_bias'))} "
                "(jaxnet puts biases on every projection or on none)"
            )
        return refused

    def keys(self, config: dict[str, Any]) -> dict[str, Any]:
        width, heads = int(config.get("hidden_size", 4096)), int(config.get("num_attention_heads", 32))
        kv_heads = int(config.get("num_key_value_heads") or heads)
        head_dim = int(config.get("head_dim") or 0) or (width // heads if width % heads == 0 else 0)
        rotary, refused = rope(config)
        refused = self.refused(config) + refused
        if not head_dim:
            refused.append(f"hidden_size={width} not divisible by num_attention_heads={heads}, and no head_dim")
        if heads % kv_heads:
            refused.append(f"num_key_value_heads={kv_heads} not dividing num_attention_heads={heads}")
        if refused:
            raise UserError(
                f"this {self.title} config has {'; '.join(refused)}, which jaxnet's Transformer does not compute"
            )
        keys = {
            **PRESETS[self.preset],
            **rotary,
            "layers": int(config.get("num_hidden_layers", 32)),
            "width": width,
            "heads": heads,
            "kv_heads": kv_heads,
            "head_dim": head_dim if head_dim * heads != width else 0,
            "mlp_hidden": int(config.get("intermediate_size", 11008)),
            "norm_eps": float(config.get("rms_norm_eps", 1e-6)),
            "tie_embeddings": bool(config.get("tie_word_embeddings", False)),
            "context": int(config.get("max_position_embeddings", 2048)),
            "vocab": int(config.get("vocab_size", 32000)),
        }
        if self.bias_keys and config.get("attention_bias") and config.get("mlp_bias"):
            keys["bias"] = "all"
        return keys

    def config(self, keys: dict[str, Any], vocab: int, context: int) -> dict[str, Any]:
        cfg = TransformerConfig(**{k: v for k, v in keys.items() if k in TransformerConfig.__dataclass_fields__})
        llama3 = cfg.rope_scaling == "llama3"
        out = {
            "architectures": list(self.architectures),
            "model_type": self.model_type,
            "vocab_size": vocab,
            "hidden_size": cfg.width,
            "intermediate_size": cfg.mlp_hidden or cfg.mlp_ratio * cfg.width,
            "num_hidden_layers": cfg.layers,
            "num_attention_heads": cfg.heads,
            "num_key_value_heads": cfg.kv_heads or cfg.heads,
            "head_dim": cfg.head_size,
            "hidden_act": "silu",
            "max_position_embeddings": context,
            "rms_norm_eps": cfg.norm_eps,
            "rope_theta": cfg.rope_theta,
            "rope_scaling": {
                "rope_type": "llama3",
                "factor": cfg.rope_factor,
                "low_freq_factor": cfg.rope_low_freq_factor,
                "high_freq_factor": cfg.rope_high_freq_factor,
                "original_max_position_embeddings": cfg.rope_original_context,
            }
            if llama3
            else None,
            "tie_word_embeddings": cfg.tie_embeddings,
            "attention_dropout": 0.0,
            "initializer_range": 0.02,
            "use_cache": True,
        }
        if self.bias_keys:
            out.update(attention_bias=cfg.bias == "all", mlp_bias=cfg.bias == "all")
        return out

    def rules(self, keys: dict[str, Any]) -> list[Rule]:
        b, n = "block_{i}/", "layers.{i}."
        attention = {"q": "query", "k": "key", "v": "value", "o": "out"}
        rules = [
            Rule("embed_tokens.weight", ("embed/embedding",), Layout(inputs=1, vocab="rows")),
            Rule("norm.weight", ("norm_out/scale",), VECTOR),
            Rule(n + "input_layernorm.weight", (b + "norm_1/scale",), VECTOR),
            Rule(n + "post_attention_layernorm.weight", (b + "norm_2/scale",), VECTOR),
        ]
        for short, name in attention.items():
            layout = Layout(inputs=2, transposed=True) if short == "o" else LINEAR
            rules.append(Rule(f"{n}self_attn.{short}_proj.weight", (f"{b}attention/{name}/kernel",), layout))
            if keys["bias"] == "all" or (keys["bias"] == "qkv" and short != "o"):
                rules.append(Rule(f"{n}self_attn.{short}_proj.bias", (f"{b}attention/{name}/bias",), VECTOR))
        rules += self.mlp_rules(keys)
        if not keys["tie_embeddings"]:
            rules.append(Rule("lm_head.weight", ("output/kernel",), Layout(inputs=1, transposed=True, vocab="cols")))
        return rules

    def mlp_rules(self, keys: dict[str, Any], layer: str = "{i}") -> list[Rule]:
        """The dense MLP's rules of block ``layer`` (a number, or ``{i}``: every block)."""
        b, n, rules = f"block_{layer}/", f"layers.{layer}.", []
        for short, name in {"gate": "mlp_gate", "up": "mlp_in", "down": "mlp_out"}.items():
            rules.append(Rule(f"{n}mlp.{short}_proj.weight", (f"{b}{name}/kernel",), LINEAR))
            if keys["bias"] == "all":
                rules.append(Rule(f"{n}mlp.{short}_proj.bias", (f"{b}{name}/bias",), VECTOR))
        return rules

    def aliases(self, keys: dict[str, Any]) -> dict[str, str]:
        # A tied head written out anyway.
        return {"lm_head.weight": "embed_tokens.weight"} if keys["tie_embeddings"] else {}


class Qwen2(Llama):
    """Qwen2 (``Qwen2ForCausalLM``, Qwen2.5 too): Llama with biases on the queries, keys and values;
    its sliding window, when switched on, is refused."""

    model_type = "qwen2"
    title = "Qwen2"
    architectures = ("Qwen2ForCausalLM",)
    preset = "qwen2"
    bias_keys = False

    def refused(self, config: dict[str, Any]) -> list[str]:
        refused = super().refused(config)
        sliding = "sliding_attention" in (config.get("layer_types") or [])
        if config.get("use_sliding_window") or sliding:
            refused.append("use_sliding_window=true (jaxnet attends over the whole context)")
        return refused

    def config(self, keys: dict[str, Any], vocab: int, context: int) -> dict[str, Any]:
        return {**super().config(keys, vocab, context), "use_sliding_window": False, "sliding_window": None}


class Mistral(Llama):
    """Mistral (``MistralForCausalLM``): Llama; a sliding window shorter than the context is refused."""

    model_type = "mistral"
    title = "Mistral"
    architectures = ("MistralForCausalLM",)
    preset = "mistral"
    bias_keys = False

    def refused(self, config: dict[str, Any]) -> list[str]:
        refused = super().refused(config)
        window, context = config.get("sliding_window"), int(config.get("max_position_embeddings", 2048))
        if window is not None and int(window) < context:
            refused.append(
                f"sliding_window={window}, shorter than max_position_embeddings={context} (jaxnet attends over the "
                "whole context; set sliding_window to null in config.json if the model is used within it)"
            )
        return refused

    def config(self, keys: dict[str, Any], vocab: int, context: int) -> dict[str, Any]:
        return {**super().config(keys, vocab, context), "sliding_window": None}

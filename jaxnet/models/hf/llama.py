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
[heads, hd]) and a sliding window it may switch on (the layers from ``max_window_layers`` on attend
to the last ``sliding_window`` positions: ``model.attention_pattern`` and ``model.window``);
Mistral by the sliding window every layer has when it names one. Each is a subclass declaring
only that (:meth:`Llama.variant`, :meth:`Llama.variant_config`); Qwen3, Phi-3 and Gemma are
subclasses too, in files of their own.

``config.json`` is read as transformers 4.x writes it (``rope_theta``, ``rope_scaling``) and as
5.x does (``rope_parameters``, ``layer_types``), and written as 4.x did, which both read (with
``layer_types`` for 5.x). Whatever would change the arithmetic and jaxnet does not compute
(another activation, another rope type, biases on the output but not the MLP, quantized weights)
is refused in one line.
"""

from __future__ import annotations

from typing import Any

from jaxnet.errors import UserError
from jaxnet.models.hf.table import Layout, Rule, Table
from jaxnet.models.transformer import PRESETS, TransformerConfig
from jaxnet.models.transformer.spec import shortest_pattern

LINEAR, VECTOR = Layout(inputs=1, transposed=True), Layout(inputs=0)


def rope(config: dict[str, Any], params: dict[str, Any] | None = None) -> tuple[dict[str, Any], list[str]]:
    """The rotary ``model.*`` keys of a ``config.json`` (``rope_parameters`` as transformers 5 writes
    it, or ``rope_theta`` and ``rope_scaling`` as 4.x did), and what of it jaxnet does not compute.
    ``params`` stands for ``rope_parameters`` (one layer type's, Gemma 3's)."""
    params = (config.get("rope_parameters") or {}) if params is None else params
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
    elif kind == "linear":
        keys.update(rope_scaling="linear", rope_factor=float(source["factor"]))
    elif kind != "default":
        refused.append(f"rope type {kind!r} (jaxnet has default, linear and llama3)")
    return keys, refused


def rope_config(cfg: TransformerConfig) -> dict[str, Any] | None:
    """``rope_scaling`` of ``config.json`` (as transformers 4.x writes it) for a model's keys, or None."""
    if cfg.rope_scaling == "llama3":
        return {
            "rope_type": "llama3",
            "factor": cfg.rope_factor,
            "low_freq_factor": cfg.rope_low_freq_factor,
            "high_freq_factor": cfg.rope_high_freq_factor,
            "original_max_position_embeddings": cfg.rope_original_context,
        }
    if cfg.rope_scaling == "linear":
        return {"rope_type": "linear", "factor": cfg.rope_factor}
    return None


#: ``layer_types`` entries of transformers' configs -> jaxnet's attention kinds.
LAYER_TYPES = {"full_attention": "global", "sliding_attention": "local"}


def attention_layers(types: list[str], window: Any, title: str) -> tuple[dict[str, Any], list[str]]:
    """``attention_pattern`` and ``window`` of a ``layer_types`` list (``full_attention``,
    ``sliding_attention``) and a ``sliding_window``; and what of them jaxnet does not compute."""
    unknown = sorted({t for t in types if t not in LAYER_TYPES})
    if unknown:
        return {}, [f"layer_types {', '.join(map(str, unknown))} (jaxnet has {', '.join(LAYER_TYPES)})"]
    kinds = [LAYER_TYPES[t] for t in types]
    if "local" not in kinds:
        return {"attention_pattern": ("global",), "window": 0}, []
    if not window:
        return {}, [f"sliding layers without a sliding_window ({title})"]
    return {"attention_pattern": shortest_pattern(kinds), "window": int(window)}, []


def layer_types(cfg: TransformerConfig) -> list[str]:
    """``layer_types`` of a model's keys: each layer's ``full_attention`` or ``sliding_attention``."""
    names = {kind: name for name, kind in LAYER_TYPES.items()}
    pattern = cfg.attention_pattern
    return [names[pattern[i % len(pattern)]] for i in range(cfg.layers)]


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
    #: The head size of a config.json that names none (0: width / heads), as the architecture's config class has it.
    default_head_dim = 0
    #: Whether the output is tied to the embedding when config.json does not say (``tie_word_embeddings``).
    tied_by_default = False

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
        head_dim = int(config.get("head_dim") or self.default_head_dim) or (width // heads if width % heads == 0 else 0)
        rotary, refused = self.rotary(config)
        variant, also = self.variant(config)
        refused = self.refused(config) + refused + also
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
            "tie_embeddings": bool(config.get("tie_word_embeddings", self.tied_by_default)),
            "context": int(config.get("max_position_embeddings", 2048)),
            "vocab": int(config.get("vocab_size", 32000)),
            **variant,
        }
        if self.bias_keys and config.get("attention_bias") and config.get("mlp_bias"):
            keys["bias"] = "all"
        return keys

    def rotary(self, config: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
        """The rotary keys of ``config`` and what of them jaxnet does not compute (:func:`rope`)."""
        return rope(config)

    def variant(self, config: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
        """The keys a variation of Llama reads beyond Llama's (its windows, its norms), and what of
        its config jaxnet does not compute; Llama's own: none."""
        return {}, []

    def variant_config(self, cfg: TransformerConfig) -> dict[str, Any]:
        """The ``config.json`` entries of a variation's keys (:meth:`variant` read back)."""
        return {}

    def config(self, keys: dict[str, Any], vocab: int, context: int) -> dict[str, Any]:
        cfg = TransformerConfig(**{k: v for k, v in keys.items() if k in TransformerConfig.__dataclass_fields__})
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
            "rope_scaling": rope_config(cfg),
            "tie_word_embeddings": cfg.tie_embeddings,
            "attention_dropout": 0.0,
            "initializer_range": 0.02,
            "use_cache": True,
        }
        if self.bias_keys:
            out.update(attention_bias=cfg.bias == "all", mlp_bias=cfg.bias == "all")
        return {**out, **self.variant_config(cfg)}

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
    with ``use_sliding_window``, the layers from ``max_window_layers`` on attend to the last
    ``sliding_window`` positions (``layer_types`` where transformers 5 wrote it)."""

    model_type = "qwen2"
    title = "Qwen2"
    architectures = ("Qwen2ForCausalLM",)
    preset = "qwen2"
    bias_keys = False

    def variant(self, config: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
        layers = int(config.get("num_hidden_layers", 32))
        window = config.get("sliding_window") if config.get("use_sliding_window") else None
        types = config.get("layer_types")
        if not types:
            first = int(config.get("max_window_layers") or layers)
            types = ["sliding_attention" if window and i >= first else "full_attention" for i in range(layers)]
        return attention_layers(types, window, self.title)

    def variant_config(self, cfg: TransformerConfig) -> dict[str, Any]:
        # As transformers 4.x reads it too: the layers from max_window_layers on are local
        types = layer_types(cfg)
        first = next((i for i, t in enumerate(types) if t == "sliding_attention"), cfg.layers)
        local = first < cfg.layers
        return {
            "use_sliding_window": local,
            "sliding_window": cfg.window if local else None,
            "max_window_layers": first,
            "layer_types": ["full_attention"] * first + ["sliding_attention"] * (cfg.layers - first),
        }


def every_layer_window(config: dict[str, Any], title: str) -> tuple[dict[str, Any], list[str]]:
    """The keys of a ``sliding_window`` every layer has (Mistral's, Phi-3's; none: null)."""
    window = config.get("sliding_window")
    return attention_layers(["sliding_attention" if window else "full_attention"], window, title)


def every_layer_window_config(cfg: TransformerConfig) -> dict[str, Any]:
    """``sliding_window`` of a model whose layers are all local (its window), or null."""
    return {"sliding_window": cfg.window if set(cfg.attention_pattern) == {"local"} else None}


class Mistral(Llama):
    """Mistral (``MistralForCausalLM``): Llama whose layers attend to the last ``sliding_window``
    positions when it names one."""

    model_type = "mistral"
    title = "Mistral"
    architectures = ("MistralForCausalLM",)
    preset = "mistral"
    bias_keys = False

    def variant(self, config: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
        return every_layer_window(config, self.title)

    def variant_config(self, cfg: TransformerConfig) -> dict[str, Any]:
        return every_layer_window_config(cfg)

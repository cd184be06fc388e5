"""GPT-2 (``model_type: gpt2``, ``GPT2LMHeadModel``): the first architecture table.

GPT-2 is jaxnet's Transformer in its ``gpt2`` preset (learned positions, tied embeddings unless
``tie_word_embeddings`` is false, the tanh GELU ``gelu_new``, LayerNorm epsilon 1e-5), softmax
scaled by 1 / sqrt(head size), biases on every projection and a final LayerNorm. Its ``Conv1D``
layers keep their weights as ``[inputs, outputs]``, as jaxnet's kernels do; ``c_attn`` packs
queries, keys and values along its outputs. The tensors by name (``transformer.`` in front of all
but ``lm_head.weight``)::

    wte.weight [vocab, width]          -> embed/embedding (rows past GPT-2's vocabulary: padding)
    wpe.weight [positions, width]      -> position
    h.N.ln_1.weight / .bias            -> block_N/norm_1/scale / bias      (ln_2 -> norm_2)
    h.N.attn.c_attn.weight [w, 3w]     -> block_N/attention/query, key, value /kernel [w, heads, head size] each
    h.N.attn.c_attn.bias [3w]          -> block_N/attention/query, key, value /bias [heads, head size] each
    h.N.attn.c_proj.weight [w, w]      -> block_N/attention/out/kernel [heads, head size, w]
    h.N.mlp.c_fc.weight [w, 4w]        -> block_N/mlp_in/kernel            (c_proj -> mlp_out)
    ln_f.weight / .bias                -> norm_out/scale / bias
    lm_head.weight [vocab, width]      -> output/kernel [width, vocab] (untied models only)
"""

from __future__ import annotations

from typing import Any

from jaxnet.errors import UserError
from jaxnet.models.hf.table import Layout, Rule, Table
from jaxnet.models.transformer import PRESETS

#: GPT-2's activation names -> ``model.gelu``.
GELU = {"gelu_new": "tanh", "gelu_pytorch_tanh": "tanh", "gelu_fast": "tanh", "gelu": "exact"}

MATRIX, VECTOR = Layout(inputs=1), Layout(inputs=0)


class GPT2(Table):
    """GPT-2's table (see the module's docstring)."""

    model_type = "gpt2"
    title = "GPT-2"
    prefix = "transformer."
    unprefixed = ("lm_head.weight",)
    # Buffers an older transformers (and the published checkpoints) saved beside the weights: the
    # causal mask, which jaxnet computes instead.
    ignored = r"h\.\d+\.attn\.(bias|masked_bias)"
    architectures = ("GPT2LMHeadModel",)

    def keys(self, config: dict[str, Any]) -> dict[str, Any]:
        width, heads = int(config.get("n_embd", 768)), int(config.get("n_head", 12))
        inner = config.get("n_inner") or 4 * width
        activation = config.get("activation_function", "gelu_new")
        refused = []
        if activation not in GELU:
            refused.append(f"activation_function={activation!r} (jaxnet has {', '.join(GELU)})")
        if width % heads:
            refused.append(f"n_embd={width} not divisible by n_head={heads}")
        if config.get("scale_attn_by_inverse_layer_idx"):
            refused.append("scale_attn_by_inverse_layer_idx=true")
        if config.get("scale_attn_weights", True) is False:
            refused.append("scale_attn_weights=false")
        if config.get("add_cross_attention"):
            refused.append("add_cross_attention=true")
        if refused:
            raise UserError(f"this GPT-2 config has {'; '.join(refused)}, which jaxnet's Transformer does not compute")
        return {
            **PRESETS["gpt2"],
            "layers": int(config.get("n_layer", 12)),
            "width": width,
            "heads": heads,
            **({"mlp_ratio": int(inner) // width} if inner % width == 0 else {"mlp_hidden": int(inner)}),
            "tie_embeddings": bool(config.get("tie_word_embeddings", True)),
            "gelu": GELU[activation],
            "norm_eps": float(config.get("layer_norm_epsilon", 1e-5)),
            "context": int(config.get("n_positions", config.get("n_ctx", 1024))),
            "vocab": int(config.get("vocab_size", 50257)),
        }

    def config(self, keys: dict[str, Any], vocab: int, context: int) -> dict[str, Any]:
        return {
            "architectures": list(self.architectures),
            "model_type": self.model_type,
            "vocab_size": vocab,
            "n_positions": context,
            "n_embd": keys["width"],
            "n_layer": keys["layers"],
            "n_head": keys["heads"],
            "n_inner": keys["mlp_hidden"] or keys["mlp_ratio"] * keys["width"],
            "activation_function": {"tanh": "gelu_new", "exact": "gelu"}[keys["gelu"]],
            "layer_norm_epsilon": keys["norm_eps"],
            "resid_pdrop": keys["dropout"],
            "embd_pdrop": keys["dropout"],
            "attn_pdrop": 0.0,  # jaxnet drops the attention's output, not its weights
            "tie_word_embeddings": keys["tie_embeddings"],
            "scale_attn_weights": True,
            "initializer_range": 0.02,
            "bos_token_id": vocab - 1,
            "eos_token_id": vocab - 1,
            "torch_dtype": "float32",
        }

    def rules(self, keys: dict[str, Any]) -> list[Rule]:
        qkv = ("query", "key", "value")
        rules = [
            Rule("wte.weight", ("embed/embedding",), Layout(inputs=1, vocab="rows")),
            Rule("wpe.weight", ("position",), MATRIX),
            Rule("ln_f.weight", ("norm_out/scale",), VECTOR),
            Rule("ln_f.bias", ("norm_out/bias",), VECTOR),
        ]
        if not keys["tie_embeddings"]:
            rules.append(Rule("lm_head.weight", ("output/kernel",), Layout(inputs=1, transposed=True, vocab="cols")))
        b = "block_{i}/"
        return rules + [
            Rule("h.{i}.ln_1.weight", (b + "norm_1/scale",), VECTOR),
            Rule("h.{i}.ln_1.bias", (b + "norm_1/bias",), VECTOR),
            Rule("h.{i}.attn.c_attn.weight", tuple(f"{b}attention/{n}/kernel" for n in qkv), MATRIX),
            Rule("h.{i}.attn.c_attn.bias", tuple(f"{b}attention/{n}/bias" for n in qkv), VECTOR),
            Rule("h.{i}.attn.c_proj.weight", (b + "attention/out/kernel",), Layout(inputs=2)),
            Rule("h.{i}.attn.c_proj.bias", (b + "attention/out/bias",), VECTOR),
            Rule("h.{i}.ln_2.weight", (b + "norm_2/scale",), VECTOR),
            Rule("h.{i}.ln_2.bias", (b + "norm_2/bias",), VECTOR),
            Rule("h.{i}.mlp.c_fc.weight", (b + "mlp_in/kernel",), MATRIX),
            Rule("h.{i}.mlp.c_fc.bias", (b + "mlp_in/bias",), VECTOR),
            Rule("h.{i}.mlp.c_proj.weight", (b + "mlp_out/kernel",), MATRIX),
            Rule("h.{i}.mlp.c_proj.bias", (b + "mlp_out/bias",), VECTOR),
        ]

    def aliases(self, keys: dict[str, Any]) -> dict[str, str]:
        # A tied head written out anyway (an older save_pretrained, torch.save of the state dict).
        return {"lm_head.weight": "wte.weight"} if keys["tie_embeddings"] else {}

"""Qwen3, Gemma 1, 2 and 3, Phi-3, and Mistral and Qwen2 with a sliding window, in and out: jaxnet's
Transformer computes what transformers' Qwen3ForCausalLM, GemmaForCausalLM, Gemma2ForCausalLM,
Gemma3ForCausalLM, Phi3ForCausalLM, MistralForCausalLM and Qwen2ForCausalLM compute.

The reference is transformers itself (the ``reference`` extra), as in test_hf_llama.py (whose
tokenizer, reference logits and corpus this file reuses): random-weight models (every weight moved
by N(0, 0.1), so the norms' scales take part) saved by ``save_pretrained`` once per module in
float32, and in bfloat16 cut into several files. Every model with local layers has a window of 8
positions, shorter than the 64-token sequences compared and the 27 positions generated; Gemma 2's
soft-capping is strong here (attention logits capped at 2, output logits at 1.5) so that a model
that ignored it would be far off, and its attention is scaled by ``query_pre_attn_scalar=24``
rather than the head size; Gemma 3 has two local layers to one global, a linear rope scaling of 4 on
the global layer and a rotary base of 100 on the local ones. Tolerances are test_hf_llama's:
float32 rounding (|difference| <= 1e-5 + 1e-5 |logit|), for the bfloat16 files too (read exactly,
computed in float32 on both sides). PEFT (``peft``) adds exported adapters to the base transformers
loads.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import jax
import numpy as np
import pytest
from conftest import fails
from safetensors.numpy import load_file
from test_hf_llama import (
    ATOL,
    RTOL,
    learned_tokenizer,
    reference_logits,
    tokens_for,
    write_corpus_source,
    write_random,
)

import jaxnet
from jaxnet import cli
from jaxnet.models import hf
from jaxnet.models.adapters import lora
from jaxnet.sample import generate

torch = pytest.importorskip("torch", reason="the reference extra (torch, transformers) is not installed")
transformers = pytest.importorskip("transformers", reason="the reference extra (torch, transformers) is not installed")

WINDOW = 8
COMMON = dict(hidden_size=48, intermediate_size=80, num_hidden_layers=2, max_position_embeddings=64)

# Each: transformers' config and model classes, and the config's keywords.
MODELS = {
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, tie_word_embeddings=False,
        use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1)),  # layer 1 local
    "gemma": ("GemmaConfig", "GemmaForCausalLM", dict(num_attention_heads=4, num_key_value_heads=1, head_dim=16)),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", dict(
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=WINDOW, query_pre_attn_scalar=24,
        attn_logit_softcapping=2.0, final_logit_softcapping=1.5)),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", dict(
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=WINDOW, num_hidden_layers=3,
        layer_types=["sliding_attention", "sliding_attention", "full_attention"],
        rope_parameters={"full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 10000.0},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 100.0}})),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", dict(
        num_attention_heads=6, num_key_value_heads=2, sliding_window=WINDOW, pad_token_id=None)),
    "mistral-window": ("MistralConfig", "MistralForCausalLM", dict(
        num_attention_heads=6, num_key_value_heads=2, sliding_window=WINDOW)),
    "qwen2-window": ("Qwen2Config", "Qwen2ForCausalLM", dict(
        num_attention_heads=6, num_key_value_heads=3, use_sliding_window=True, sliding_window=WINDOW,
        max_window_layers=0)),  # every layer local
}  # fmt: skip
BF16 = ("qwen3", "gemma", "gemma2", "gemma3", "phi3", "mistral-window")


def save(directory: Path, name: str, tokenizer, bf16: bool = False) -> Path:
    config_class, model_class, keywords = MODELS[name]
    return write_random(directory, (config_class, model_class), {**COMMON, **keywords}, tokenizer, name, bf16)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    """Every model of MODELS in float32, those of BF16 also in bfloat16 over several files."""
    root = tmp_path_factory.mktemp("hf-dense")
    tokenizer = learned_tokenizer()
    saved = {name: save(root / name, name, tokenizer) for name in MODELS}
    return saved | {f"{name}-bf16": save(root / f"{name}-bf16", name, tokenizer, bf16=True) for name in BF16}


@pytest.mark.parametrize("name", [*MODELS, *(f"{n}-bf16" for n in BF16)])
def test_logits_equal_transformers_on_sequences_longer_than_the_window(checkpoints, name):
    directory = checkpoints[name]
    if name.endswith("-bf16"):
        index = json.loads((directory / "model.safetensors.index.json").read_text())
        assert len(set(index["weight_map"].values())) >= 3
    tokens = tokens_for(directory)  # 2 x 64 tokens
    expected = reference_logits(directory, tokens)  # float32 compute, bfloat16 weights upcast
    got = jaxnet.load(f"hf:{directory}").predict(tokens)
    assert got.shape == expected.shape == (2, 64, 300)
    np.testing.assert_allclose(got, expected, rtol=RTOL, atol=ATOL)


def test_each_family_reads_as_its_preset_with_its_own_settings(checkpoints):
    model = {name: hf.read(f"hf:{checkpoints[name]}").model() for name in MODELS}
    assert model["qwen3"].qk_norm and model["qwen3"].attention_pattern == ("global", "local")
    assert model["qwen3"].head_dim == 16 and model["qwen3"].window == WINDOW
    gemma = model["gemma"]
    assert (gemma.mlp, gemma.gelu, gemma.norm_offset, gemma.embed_scale, gemma.tie_embeddings) == (
        "geglu", "tanh", 1.0, True, True)  # fmt: skip
    gemma2 = model["gemma2"]
    assert gemma2.post_norms and gemma2.attention_pattern == ("local", "global")
    assert (gemma2.attention_softcap, gemma2.logit_softcap, gemma2.attention_scale_dim) == (2.0, 1.5, 24)
    gemma3 = model["gemma3"]
    assert gemma3.qk_norm and gemma3.attention_pattern == ("local", "local", "global")
    assert (gemma3.rope_scaling, gemma3.rope_factor, gemma3.rope_theta, gemma3.rope_local_theta) == (
        "linear", 4.0, 10000.0, 100.0)  # fmt: skip
    for name in ("phi3", "mistral-window", "qwen2-window"):
        assert (model[name].attention_pattern, model[name].window) == (("local",), WINDOW), name
    # Phi-3's fused tensors: queries, keys and values side by side along the outputs, gate then up
    tensors = load_file(str(checkpoints["phi3"] / "model.safetensors"))
    params = jaxnet.load_params(f"hf:{checkpoints['phi3']}")["block_1"]
    qkv = tensors["model.layers.1.self_attn.qkv_proj.weight"]  # [(6 + 2 + 2) x 8, 48]
    np.testing.assert_array_equal(params["attention"]["key"]["kernel"][:, 1], qkv[56:64].T)
    np.testing.assert_array_equal(params["attention"]["value"]["kernel"][:, 0], qkv[64:72].T)
    gate_up = tensors["model.layers.1.mlp.gate_up_proj.weight"]  # [2 x 80, 48]
    np.testing.assert_array_equal(params["mlp_gate"]["kernel"], gate_up[:80].T)
    np.testing.assert_array_equal(params["mlp_in"]["kernel"], gate_up[80:].T)
    # Gemma's norms are held as the file holds them (w, computed as 1 + w)
    gemma_file = load_file(str(checkpoints["gemma2"] / "model.safetensors"))
    norm = jaxnet.load_params(f"hf:{checkpoints['gemma2']}")["block_0"]["norm_1_post"]["scale"]
    np.testing.assert_array_equal(norm, gemma_file["model.layers.0.post_attention_layernorm.weight"])


@pytest.mark.parametrize("name", ["gemma2", "mistral-window", "gemma3"])
def test_greedy_generation_with_the_cache_equals_generate_past_the_window(checkpoints, name):
    directory = checkpoints[name]
    prompt = tokens_for(directory, rows=1, length=7, seed=3)
    trained = jaxnet.load(f"hf:{directory}")
    ours = generate(trained.model.module, trained.params, prompt, 20, temperature=0)
    model = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    model.generation_config.eos_token_id = None  # 20 tokens whatever they are, as ours
    with torch.no_grad():
        theirs = model.generate(torch.tensor(prompt), do_sample=False, max_new_tokens=20, pad_token_id=0)[0, 7:].numpy()
    assert len(theirs) == 20
    np.testing.assert_array_equal(ours, theirs)


def test_a_gemma2_finetune_exported_is_reproduced_by_transformers(checkpoints, tmp_path):
    """bfloat16 parameters (model.param_dtype): the norms' w held as the file's bytes, a bfloat16 export."""
    source, extra = checkpoints["gemma2"], ["model.param_dtype=bfloat16"]
    text = tmp_path / "text.txt"
    text.write_text(write_corpus_source(tmp_path / "src.jsonl").read_text()[:20_000])
    run = tmp_path / "run"
    assert cli.main(["train", "hf_finetune:smoke", f"train.init_from=hf:{source}", "train.steps=4",
                     "train.eval_every=4", "train.checkpoint_every=4", "train.progress=false", "data.name=text",
                     f"data.path={text}", *extra, "--workdir", str(run)]) == 0  # fmt: skip
    assert json.loads((run / "config.json").read_text())["data"]["seq_len"] == 32  # longer than the window
    tokens = tokens_for(source, length=32, seed=4)
    logits = jaxnet.load(run).predict(tokens)
    assert np.abs(logits - reference_logits(source, tokens)).max() > 1e-3  # fine-tuning moved the weights
    out = tmp_path / "exported"
    assert cli.main(["export", "--workdir", str(run), "--format", "hf", "--out", str(out)]) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["Gemma2ForCausalLM"] and config["torch_dtype"] == "bfloat16"
    np.testing.assert_allclose(reference_logits(out, tokens), logits, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("name", ["phi3", "gemma3", "qwen3"])
def test_an_export_is_read_by_transformers_as_the_same_model(checkpoints, tmp_path, name):
    """Each table written back (Phi-3's fused tensors joined again, Gemma 3's rope by layer type,
    Qwen3's windows as max_window_layers): transformers computes the logits jaxnet computes."""
    source = checkpoints[name]
    trained = jaxnet.load(f"hf:{source}")
    out = hf.export(tmp_path / "out", trained.params, trained.config.model, 64, source=f"hf:{source}")
    assert json.loads((out / "config.json").read_text())["architectures"] == [MODELS[name][1]]
    tokens = tokens_for(source, seed=5)
    np.testing.assert_allclose(reference_logits(out, tokens), trained.predict(tokens), rtol=RTOL, atol=ATOL)


def random_adapters(params, paths: list[str], rank: int, seed: int) -> dict:
    """Adapters {"a": (inputs..., rank), "b": (rank, outputs...)} of N(0, 0.1) on the kernels at ``paths``."""
    rng = np.random.default_rng(seed)
    adapters: dict = {}
    for path in paths:
        node, kernel = adapters, params
        for name in path.split("/"):
            kernel = kernel[name]
        contract = 2 if path.endswith("attention/out/kernel") else 1
        shape = np.shape(kernel)
        for name in path.split("/")[:-1]:
            node = node.setdefault(name, {})
        node["kernel"] = {
            "a": (0.1 * rng.normal(size=(*shape[:contract], rank))).astype(np.float32),
            "b": (0.1 * rng.normal(size=(rank, *shape[contract:]))).astype(np.float32),
        }
    return adapters


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("gpt2")
    config = transformers.GPT2Config(vocab_size=300, n_positions=64, n_embd=48, n_layer=2, n_head=4)
    torch.manual_seed(5)
    transformers.GPT2LMHeadModel(config).save_pretrained(directory)
    return directory


@pytest.mark.parametrize(
    "name, targets",
    [
        # the queries and values of Phi-3's fused qkv_proj (its keys not), its fused gate_up_proj whole
        ("phi3", ["attention/query", "attention/value", "attention/out", "mlp_gate", "mlp_in", "mlp_out"]),
        ("gpt2", ["attention/query", "attention/key", "attention/value", "attention/out"]),  # c_attn, a Conv1D
    ],
)
def test_adapters_of_fused_tensors_export_as_peft_adds_them(checkpoints, gpt2, tmp_path, name, targets):
    """A file tensor holding several kernels gets one adapter of their summed ranks, the parts' B on
    the diagonal: peft adds it to the base transformers loads and computes jaxnet's merged model."""
    peft = pytest.importorskip("peft")
    directory = gpt2 if name == "gpt2" else checkpoints[name]
    trained = jaxnet.load(f"hf:{directory}")
    paths = [f"block_{i}/{t}/kernel" for i in range(2) for t in targets]
    settings = lora.Settings(rank=4, alpha=8.0)
    adapters = random_adapters(trained.params, paths, settings.rank, seed=6)
    tokens = tokens_for(directory, length=32, seed=7)
    merged = lora.merge(trained.params, adapters, settings.scale)
    ours = np.asarray(trained.model.module.apply({"params": merged}, jax.numpy.asarray(tokens)))
    out = hf.export_peft(tmp_path / "adapters", adapters, trained.config.model, settings, source=f"hf:{directory}")
    config = json.loads((out / "adapter_config.json").read_text())
    fused = "model.layers.0.self_attn.qkv_proj" if name == "phi3" else "transformer.h.0.attn.c_attn"
    rank = 8 if name == "phi3" else 12  # queries and values; queries, keys and values
    assert [r for k, r in config["rank_pattern"].items() if fused.replace(".", r"\.") == k] == [rank]
    written = load_file(str(out / "adapter_model.safetensors"))
    assert written[f"base_model.model.{fused}.lora_A.weight"].shape == (rank, 48)
    base = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
    model = peft.PeftModel.from_pretrained(base, out).eval()
    with torch.no_grad():
        theirs = model(torch.tensor(tokens)).logits.float().numpy()
    assert np.abs(ours - reference_logits(directory, tokens)).max() > 1e-3  # the adapters change the logits
    np.testing.assert_allclose(theirs, ours, rtol=RTOL, atol=ATOL)


def test_a_config_as_transformers_4_wrote_it_reads_as_the_same_model(checkpoints, tmp_path):
    """Gemma 3's rope_theta, rope_local_base_freq, rope_scaling and sliding_window_pattern, and Qwen2's
    max_window_layers, without layer_types or rope_parameters: the same keys as transformers 5's."""
    cases = {
        "gemma3": {"rope_theta": 10000.0, "rope_local_base_freq": 100.0, "sliding_window_pattern": 3,
                   "rope_scaling": {"rope_type": "linear", "factor": 4.0}},
        "qwen3": {},  # its rope_theta, as rope_parameters has it
    }  # fmt: skip
    for name, old in cases.items():
        directory = tmp_path / name
        shutil.copytree(checkpoints[name], directory)
        config = json.loads((directory / "config.json").read_text())
        config.pop("layer_types")
        rope = config.pop("rope_parameters")
        old = old or {"rope_theta": rope["rope_theta"]}
        (directory / "config.json").write_text(json.dumps({**config, **old}))
        assert hf.read(f"hf:{directory}").keys == hf.read(f"hf:{checkpoints[name]}").keys, name


CASES = {  # the checkpoint, what config.json says, what the one line names
    "gemma3 multimodal": ("gemma3", {"model_type": "gemma3", "architectures": ["Gemma3ForConditionalGeneration"]},
                          "Gemma3ForConditionalGeneration, the multimodal Gemma 3"),
    "phi3 longrope": ("phi3", {"rope_parameters": {"rope_type": "longrope", "rope_theta": 1e4,
                                                   "short_factor": [1.0] * 4, "long_factor": [2.0] * 4}},
                      "rope type 'longrope'"),
    "phi3 partial rotary": ("phi3", {"rope_parameters": {"rope_type": "default", "rope_theta": 1e4,
                                                         "partial_rotary_factor": 0.75}}, "partial_rotary_factor=0.75"),
    "qwen3 attention bias": ("qwen3", {"attention_bias": True}, "attention_bias=true"),
    "gemma2 bidirectional": ("gemma2", {"use_bidirectional_attention": True}, "use_bidirectional_attention=True"),
    "gemma activation": ("gemma", {"hidden_act": "relu"}, "hidden_activation='relu'"),
    "gemma3 scaled local rope": ("gemma3", {"rope_parameters": {"full_attention": {"rope_type": "default",
                                 "rope_theta": 1e4}, "sliding_attention": {"rope_type": "linear", "factor": 2.0}}},
                                 "rope type 'linear' on the sliding layers"),
    "chunked layers": ("gemma2", {"layer_types": ["chunked_attention", "full_attention"]},
                       "layer_types chunked_attention"),
}  # fmt: skip


@pytest.mark.parametrize("case", CASES)
def test_what_jaxnet_does_not_compute_is_one_line_exit_2(checkpoints, tmp_path, capsys, case):
    name, changes, message = CASES[case]
    directory = tmp_path / "broken"
    shutil.copytree(checkpoints[name], directory)
    path = directory / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))
    err = fails(["sample", "--workdir", f"hf:{directory}", "--tokens", "2"], capsys)
    assert message in err


def test_a_model_a_table_cannot_hold_is_refused_by_name(checkpoints):
    gemma2 = hf.read(f"hf:{checkpoints['gemma2']}").model()
    why = " ".join(hf.refusals(hf.TABLES["llama"], gemma2))
    for key in ("attention_pattern", "attention_softcap", "logit_softcap", "norm_offset", "post_norms", "embed_scale"):
        assert f"model.{key}=" in why, key
    assert hf.refusals(hf.TABLES["gemma2"], gemma2) == []
    assert "model.qk_norm=true (Gemma 2: false)" in hf.refusals(hf.TABLES["gemma2"], hf.read(
        f"hf:{checkpoints['gemma3']}").model())  # fmt: skip
    mistral = hf.read(f"hf:{checkpoints['mistral-window']}").model()
    assert hf.table_for(mistral).model_type == "mistral"  # the first table that holds a window on every layer

"""Llama, Qwen2 and Mistral checkpoints in and out: jaxnet's Transformer in its llama presets computes
what transformers' LlamaForCausalLM, Qwen2ForCausalLM and MistralForCausalLM compute.

The reference is transformers itself (the ``reference`` extra): models of random weights (every
weight moved by N(0, 0.1) so the norms' scales take part) saved once per session by
``save_pretrained``, in float32 and in bfloat16 cut into several files (``max_shard_size``), with a
byte-level BPE tokenizer learned here from the shipped Shakespeare and saved beside them by
transformers' ``PreTrainedTokenizerFast`` (BOS put before a text by its post-processor; three end
ids in ``generation_config.json``, as Llama 3's). Tolerances:

* float32: jaxnet's logits equal transformers' to float32 rounding, |difference| <= 1e-5 +
  1e-5 |logit| (the largest seen is about 3e-6 on logits of magnitude 3);
* bfloat16 weights: read exactly, so computed in float32 they equal transformers' float32
  computation on the same weights to the same 1e-5; computed in bfloat16 on both sides, within
  0.1 (logits of magnitude about 3; transformers' own bfloat16 logits differ from its float32
  ones by about 0.03).

Bad input needs no torch where it can: those checkpoints are copies of a saved one, with their
``config.json`` or tensors changed.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import fails, run_patiently
from safetensors.numpy import load_file, save_file

import jaxnet
from jaxnet import cli
from jaxnet.errors import UserError
from jaxnet.models import TransformerConfig, hf
from jaxnet.sample import generate

torch = pytest.importorskip("torch", reason="the reference extra (torch, transformers) is not installed")
transformers = pytest.importorskip("transformers", reason="the reference extra (torch, transformers) is not installed")

RTOL = ATOL = 1e-5  # float32 rounding over two blocks of width 48
BF16_ATOL = 0.1  # bfloat16 compute on both sides (see the module's docstring)
SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>", "<|eom_id|>"]
COMMON = dict(hidden_size=48, intermediate_size=80, num_hidden_layers=2, max_position_embeddings=64)
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}

# Each: the transformers classes and the config's keywords. The llama3 rope scaling has an original
# context of 16, so positions up to 64 rotate at rescaled frequencies.
MODELS = {
    "llama-gqa-untied-llama3": (
        "Llama",
        dict(num_attention_heads=6, num_key_value_heads=2, rope_theta=500000.0, tie_word_embeddings=False,
             rope_scaling={**LLAMA3, "original_max_position_embeddings": 16}, rms_norm_eps=1e-5),
    ),
    "llama-tied": ("Llama", dict(num_attention_heads=4, num_key_value_heads=4, tie_word_embeddings=True)),
    "qwen2-qkv-bias": (
        "Qwen2", dict(num_attention_heads=6, num_key_value_heads=3, tie_word_embeddings=True, rope_theta=1e6)
    ),
    "mistral-head-dim": (
        "Mistral", dict(num_attention_heads=6, num_key_value_heads=2, head_dim=16, sliding_window=None)
    ),
}  # fmt: skip


def learned_tokenizer():
    """A byte-level BPE of 300 ids learned from 100 KB of the shipped Shakespeare, BOS before each
    text, as transformers' fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    from jaxnet.data import text

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator([text.shakespeare_works()[0][1][:100_000]], trainer)
    bos = tok.token_to_id(SPECIALS[0])
    tok.post_processor = processors.TemplateProcessing(
        single=f"{SPECIALS[0]} $A", pair=f"{SPECIALS[0]} $A {SPECIALS[0]} $B", special_tokens=[(SPECIALS[0], bos)]
    )
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=SPECIALS[0], eos_token=SPECIALS[1])


def write_random(
    directory: Path,
    classes: tuple[str, str],
    settings: dict,
    tokenizer,
    seed: str,
    bf16: bool = False,
    shard: str = "40KB",
) -> Path:
    """A random model of transformers' ``classes`` (config, model) of ``settings`` over
    ``tokenizer``'s ids, its weights moved off their initial values (seeded by the name ``seed``),
    saved by transformers with the tokenizer: float32 in one file, or bfloat16 over files of at most
    ``shard``."""
    config = getattr(transformers, classes[0])(
        vocab_size=len(tokenizer), bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        **settings,
    )  # fmt: skip
    torch.manual_seed(sum(map(ord, seed)))
    model = getattr(transformers, classes[1])(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    if bf16:
        model.to(torch.bfloat16).save_pretrained(directory, max_shard_size=shard)
    else:
        model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def save(directory: Path, name: str, tokenizer, bf16: bool = False) -> Path:
    kind, keywords = MODELS[name]
    write_random(directory, (f"{kind}Config", f"{kind}ForCausalLM"), {**COMMON, **keywords}, tokenizer, name, bf16)
    ends = [tokenizer.convert_tokens_to_ids(t) for t in SPECIALS[1:]]
    transformers.GenerationConfig(bos_token_id=tokenizer.bos_token_id, eos_token_id=ends).save_pretrained(directory)
    return directory


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    """Every model of MODELS saved in float32, and the first also in bfloat16 over several files."""
    root = tmp_path_factory.mktemp("hf-llama")
    tokenizer = learned_tokenizer()
    saved = {name: save(root / name, name, tokenizer) for name in MODELS}
    saved["llama-bf16-sharded"] = save(root / "bf16", "llama-gqa-untied-llama3", tokenizer, bf16=True)
    return saved


def reference_logits(directory: Path, tokens: np.ndarray, dtype=None) -> np.ndarray:
    model = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=dtype or torch.float32).eval()
    with torch.no_grad():
        return model(torch.tensor(tokens)).logits.float().numpy()


def tokens_for(directory: Path, rows: int = 2, length: int = 64, seed: int = 0) -> np.ndarray:
    vocab = json.loads((directory / "config.json").read_text())["vocab_size"]
    return np.random.default_rng(seed).integers(0, vocab, (rows, length))


@pytest.mark.parametrize("name", [*MODELS, "llama-bf16-sharded"])
def test_logits_equal_transformers(checkpoints, name):
    directory = checkpoints[name]
    tokens = tokens_for(directory)
    expected = reference_logits(directory, tokens)  # float32 compute, bfloat16 weights upcast
    got = jaxnet.load(f"hf:{directory}").predict(tokens)
    assert got.shape == expected.shape == (2, 64, 300)
    np.testing.assert_allclose(got, expected, rtol=RTOL, atol=ATOL)


def test_bfloat16_checkpoint_in_several_files_is_read_exactly_and_computes_in_bfloat16_as_transformers(checkpoints):
    directory = checkpoints["llama-bf16-sharded"]
    index = json.loads((directory / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) >= 3
    checkpoint = hf.read(f"hf:{directory}")
    params = hf.nested(checkpoint.params())
    as_saved = load_file(str(directory / index["weight_map"]["model.norm.weight"]))["model.norm.weight"]
    np.testing.assert_array_equal(params["norm_out"]["scale"], as_saved.astype(np.float32))
    tokens = tokens_for(directory, seed=1)
    model = dataclasses.replace(checkpoint.model(), dtype="bfloat16", param_dtype="bfloat16").build(outputs=300)
    bf16 = jax.tree.map(lambda a: jnp.asarray(a, jnp.bfloat16), params)
    ours = np.asarray(model.apply({"params": bf16}, jnp.asarray(tokens)))
    theirs = reference_logits(directory, tokens, dtype=torch.bfloat16)
    assert np.abs(ours - theirs).max() <= BF16_ATOL


def test_the_llama3_rope_scaling_is_computed_not_ignored(checkpoints):
    directory = checkpoints["llama-gqa-untied-llama3"]
    checkpoint = hf.read(f"hf:{directory}")
    model = checkpoint.model()
    assert (model.rope_scaling, model.rope_factor, model.rope_original_context, model.rope_theta) == (
        "llama3",
        8.0,
        16,
        500000.0,
    )
    assert (model.kv_heads, model.norm, model.mlp, model.bias, model.tie_embeddings) == (
        2,
        "rms",
        "swiglu",
        "none",
        False,
    )
    params = hf.nested(checkpoint.params())
    tokens = tokens_for(directory, seed=2)
    unscaled = dataclasses.replace(model, rope_scaling="none").build(outputs=300)
    plain = np.asarray(unscaled.apply({"params": params}, jnp.asarray(tokens)))
    assert np.abs(plain - reference_logits(directory, tokens)).max() > 1e-2  # without it the logits differ


def test_each_table_maps_its_names_onto_jaxnets_axes(checkpoints):
    tensors = load_file(str(checkpoints["qwen2-qkv-bias"] / "model.safetensors"))
    params = jaxnet.load_params(f"hf:{checkpoints['qwen2-qkv-bias']}")
    attention = params["block_1"]["attention"]
    assert attention["key"]["kernel"].shape == (48, 3, 8) and attention["key"]["bias"].shape == (3, 8)
    assert "bias" not in attention["out"] and "bias" not in params["block_1"]["mlp_in"]
    np.testing.assert_array_equal(
        attention["key"]["kernel"][:, 2], tensors["model.layers.1.self_attn.k_proj.weight"][16:24].T
    )
    np.testing.assert_array_equal(attention["query"]["bias"][5], tensors["model.layers.1.self_attn.q_proj.bias"][40:48])
    out = tensors["model.layers.1.self_attn.o_proj.weight"]  # [width, heads x head_dim]
    np.testing.assert_array_equal(attention["out"]["kernel"][4], out[:, 32:40].T)
    mistral = jaxnet.load_params(f"hf:{checkpoints['mistral-head-dim']}")["block_0"]
    assert mistral["attention"]["query"]["kernel"].shape == (48, 6, 16)  # head_dim 16: 96 query units for width 48
    assert mistral["mlp_gate"]["kernel"].shape == mistral["mlp_in"]["kernel"].shape == (48, 80)


@pytest.mark.parametrize(
    "name,penalty",
    [("llama-gqa-untied-llama3", 1.0), ("qwen2-qkv-bias", 1.0), ("mistral-head-dim", 1.0), ("llama-tied", 1.5)],
)
def test_greedy_generation_with_the_cache_equals_transformers_generate(checkpoints, name, penalty):
    directory = checkpoints[name]
    prompt = tokens_for(directory, rows=1, length=7, seed=3)
    trained = jaxnet.load(f"hf:{directory}")
    ours = generate(trained.model.module, trained.params, prompt, 20, temperature=0, repetition_penalty=penalty)
    model = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    model.generation_config.eos_token_id = None  # 20 tokens whatever they are, as ours
    with torch.no_grad():
        theirs = model.generate(
            torch.tensor(prompt), do_sample=False, max_new_tokens=20, pad_token_id=0, repetition_penalty=penalty
        )[0, 7:].numpy()
    assert len(theirs) == 20
    np.testing.assert_array_equal(ours, theirs)
    if penalty != 1.0:  # the guard changed what greedy decoding says, and repeats less
        plain = generate(trained.model.module, trained.params, prompt, 20, temperature=0)
        assert not np.array_equal(ours, plain)
        assert len(set(ours.tolist())) > len(set(plain.tolist()))
    with pytest.raises(UserError, match="--repetition-penalty 0.0: give a number > 0"):
        generate(trained.model.module, trained.params, prompt, 2, repetition_penalty=0.0)


def test_sample_with_the_checkpoints_tokenizer_stops_at_any_of_its_end_ids(checkpoints, tmp_path, capsys):
    source = checkpoints["llama-tied"]
    directory = tmp_path / "llama"
    shutil.copytree(source, directory)
    tok = jaxnet.tokenizers.get(f"hf:{directory}")
    assert len(tok.end_ids) == 3 and tok.before == (tok.bos_id,)
    trained = jaxnet.load(f"hf:{directory}")
    prompt = [*tok.before, *tok.encode_batch(["ROMEO:"])[0].tolist()]
    greedy = generate(trained.model.module, trained.params, np.asarray(prompt), 6, temperature=0).tolist()
    capsys.readouterr()
    assert cli.main(["sample", "--workdir", f"hf:{directory}", "--prompt", "ROMEO:", "--tokens", "6",
                     "--temperature", "0"]) == 0  # fmt: skip
    assert capsys.readouterr().out == "ROMEO:" + tok.decode(greedy) + "\n"
    # the third greedy token made the last of the end ids of generation_config.json: it stops there
    settings = json.loads((directory / "generation_config.json").read_text())
    settings["eos_token_id"] = [settings["eos_token_id"][0], greedy[2]]
    (directory / "generation_config.json").write_text(json.dumps(settings))
    assert greedy[2] in jaxnet.tokenizers.get(f"hf:{directory}").end_ids
    assert cli.main(["sample", "--workdir", f"hf:{directory}", "--prompt", "ROMEO:", "--tokens", "6",
                     "--temperature", "0"]) == 0  # fmt: skip
    assert capsys.readouterr().out == "ROMEO:" + tok.decode(greedy[:2]) + "\n"


def write_corpus_source(path: Path) -> Path:
    from jaxnet.data import text

    works = text.shakespeare_works()[1][1][:40_000]
    path.write_text("".join(json.dumps({"text": works[i : i + 2000]}) + "\n" for i in range(0, len(works), 2000)))
    return path


@pytest.mark.parametrize(
    "name, extra",
    [
        ("llama-gqa-untied-llama3", []),  # on a corpus prepared with its tokenizer
        ("qwen2-qkv-bias", ["model.param_dtype=bfloat16"]),  # bfloat16 parameters: a bfloat16 export
        ("mistral-head-dim", []),
    ],
)
def test_finetune_then_export_and_transformers_reproduces_the_logits(checkpoints, tmp_path, capsys, name, extra):
    source = checkpoints[name]
    run = tmp_path / "run"
    argv = ["train", "hf_finetune:smoke", f"train.init_from=hf:{source}", "train.steps=4", "train.eval_every=4",
            "train.checkpoint_every=4", "train.progress=false", *extra]  # fmt: skip
    if name.startswith("llama"):
        corpus = tmp_path / "corpus"
        src = write_corpus_source(tmp_path / "src.jsonl")
        assert cli.main(["prepare", str(src), "--tokenizer", f"hf:{source}", "--out", str(corpus), "--quiet"]) == 0
        argv += ["data.name=tokens", f"data.path={corpus}"]
    else:
        text = tmp_path / "text.txt"
        text.write_text(write_corpus_source(tmp_path / "src.jsonl").read_text()[:20_000])
        argv += ["data.name=text", f"data.path={text}"]
    assert cli.main([*argv, "--workdir", str(run)]) == 0
    saved = json.loads((run / "config.json").read_text())
    assert saved["model"]["norm"] == "rms" and saved["data"]["seq_len"] == 32
    tokens = tokens_for(source, length=32, seed=4)
    trained = jaxnet.load(run)
    logits = trained.predict(tokens)
    assert np.abs(logits - reference_logits(source, tokens)).max() > 1e-3  # fine-tuning moved the weights
    out = tmp_path / "exported"
    assert cli.main(["export", "--workdir", str(run), "--format", "hf", "--out", str(out)]) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == json.loads((source / "config.json").read_text())["architectures"]
    assert (out / "tokenizer.json").is_file() and (out / "generation_config.json").is_file()
    dtype = "bfloat16" if extra else "float32"
    assert config["torch_dtype"] == dtype
    written = load_file(str(out / "model.safetensors"))
    assert {str(a.dtype) for a in written.values()} == {dtype}
    np.testing.assert_allclose(reference_logits(out, tokens), logits, rtol=RTOL, atol=ATOL)
    capsys.readouterr()
    assert cli.main(["sample", "--workdir", str(run), "--prompt", "ROMEO:", "--tokens", "5", "--seed", "1"]) == 0
    assert capsys.readouterr().out.startswith("ROMEO:")


def test_an_export_cut_into_several_files_loads_in_transformers(checkpoints, tmp_path):
    directory = checkpoints["llama-gqa-untied-llama3"]
    trained = jaxnet.load(f"hf:{directory}")
    params = jax.tree.map(lambda a: jnp.asarray(a, jnp.bfloat16), trained.params)
    out = hf.export(
        tmp_path / "out", params, trained.config.model, 64, max_shard_bytes=20_000, source=f"hf:{directory}"
    )
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) >= 3
    tokens = tokens_for(directory, seed=5)
    ours = np.asarray(trained.model.module.apply({"params": jax.tree.map(lambda a: a.astype(jnp.float32), params)},
                                                 jnp.asarray(tokens)))  # fmt: skip
    np.testing.assert_allclose(reference_logits(out, tokens), ours, rtol=RTOL, atol=ATOL)


IMPORT_ON_TWO_DEVICES = """
import json, sys
import jax
from jaxnet import config
from jaxnet.train import init_from
from jaxnet.train.loop import Run
cfg = config.load_experiment("hf_finetune:smoke", ["train.init_from=hf:" + sys.argv[1], "mesh.fsdp=2",
      "data.name=text", "data.path=" + sys.argv[2]])
cfg = init_from.with_hf_shape(cfg)
run = Run(cfg)
values = init_from.load(cfg, run, __import__("pathlib").Path(sys.argv[3]))
target = init_from.variables(run.abstract_state())
out = {}
for name, value in values.items():
    assert isinstance(value, jax.Array) and value.sharding == target[name].sharding, name
    out[name] = [list(s.data.shape) for s in value.addressable_shards]
state = run.init_state(values)
print(json.dumps(out))
"""


def test_each_tensor_is_placed_on_the_runs_devices_as_it_is_read(checkpoints, tmp_path):
    from conftest import cpu_env

    text = tmp_path / "text.txt"
    text.write_text(write_corpus_source(tmp_path / "src.jsonl").read_text()[:5_000])
    directory = checkpoints["llama-gqa-untied-llama3"]
    result = run_patiently(
        [sys.executable, "-c", IMPORT_ON_TWO_DEVICES, str(directory), str(text), str(tmp_path / "run")],
        env=cpu_env(2), capture_output=True, text=True, timeout=300, cwd=Path(__file__).resolve().parents[1],
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    shards = json.loads(result.stdout.strip().splitlines()[-1])
    assert shards["params/embed/embedding"] == [[300, 24], [300, 24]]  # the width split over fsdp=2
    assert shards["params/block_0/mlp_gate/kernel"] == [[24, 80], [24, 80]]
    assert len(shards) == 3 + 2 * 9  # the embedding, the output head, the last norm; nine per block


# -- bad input -------------------------------------------------------------------------------


def broken(checkpoints, tmp_path: Path, name: str, config: dict | None = None, drop: str = "") -> Path:
    """A copy of checkpoint ``name`` with ``config`` merged into its config.json, or tensor ``drop`` removed."""
    directory = tmp_path / "broken"
    shutil.copytree(checkpoints[name], directory)
    if config:
        path = directory / "config.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), **config}))
    if drop:
        tensors = load_file(str(directory / "model.safetensors"))
        del tensors[drop]
        save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
    return directory


CASES = {
    "activation": ("llama-tied", {"hidden_act": "gelu"}, "", "hidden_act='gelu'"),
    "rope type": ("llama-tied", {"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4}}, "",
                  "rope type 'yarn'"),
    "attention bias only": ("llama-tied", {"attention_bias": True}, "", "attention_bias=True with mlp_bias=False"),
    "architecture": ("llama-tied", {"architectures": ["LlamaForSequenceClassification"]}, "",
                     "is a LlamaForSequenceClassification"),
    "missing tensor": ("llama-tied", None, "model.layers.1.mlp.up_proj.weight",
                       "the checkpoint lacks layers.1.mlp.up_proj.weight, which jaxnet's block_1/mlp_in/kernel needs"),
}  # fmt: skip


@pytest.mark.parametrize("case", CASES)
def test_a_checkpoint_jaxnet_does_not_compute_is_one_line_exit_2_and_nothing_written(
    checkpoints, tmp_path, capsys, case
):
    name, config, drop, message = CASES[case]
    directory = broken(checkpoints, tmp_path, name, config, drop)
    run = tmp_path / "run"
    err = fails(["train", "hf_finetune:smoke", f"train.init_from=hf:{directory}", "--workdir", str(run)], capsys)
    assert message in err
    assert not run.exists()
    assert message in fails(["sample", "--workdir", f"hf:{directory}", "--tokens", "2"], capsys)


def test_a_corpus_of_another_tokenizer_or_a_contradicting_key_is_refused(checkpoints, tmp_path, capsys):
    source = checkpoints["llama-tied"]
    corpus = tmp_path / "gpt2-corpus"
    src = write_corpus_source(tmp_path / "src.jsonl")
    assert cli.main(["prepare", str(src), "--tokenizer", "byte", "--out", str(corpus), "--quiet"]) == 0
    run = tmp_path / "run"
    base = ["train", "hf_finetune:smoke", f"train.init_from=hf:{source}", "--workdir", str(run)]
    err = fails([*base, "data.name=tokens", f"data.path={corpus}"], capsys)
    assert "prepared with another tokenizer than" in err and "--tokenizer hf:" in err
    err = fails([*base, "model.kv_heads=2"], capsys)
    assert "model.kv_heads=2 here, 4 in the checkpoint" in err
    assert not run.exists()
    # a checkpoint without tokenizer.json: the corpus cannot be checked, so it is refused unless told
    bare = tmp_path / "bare"
    shutil.copytree(source, bare, ignore=shutil.ignore_patterns("tokenizer*", "special_tokens_map.json"))
    argv = ["train", "hf_finetune:smoke", f"train.init_from=hf:{bare}", "data.name=tokens", f"data.path={corpus}"]
    err = fails([*argv, "--workdir", str(run)], capsys)
    assert f"{bare} has no tokenizer.json, so the data's tokenizer (byte) cannot be checked" in err
    assert "train.check_tokenizer=false" in err and not run.exists()
    from jaxnet.train import init_from

    told = jaxnet.load_experiment("hf_finetune:smoke", [*argv[2:], "train.check_tokenizer=false"])
    assert init_from.with_hf_shape(told).data.path == str(corpus)  # its ids fit: taken as it is


def test_the_config_keys_are_checked_and_kv_heads_split_over_tensor_where_they_divide():
    with pytest.raises(UserError, match="model.kv_heads=3 does not divide model.heads=4"):
        TransformerConfig(heads=4, width=32, kv_heads=3).validate()
    with pytest.raises(UserError, match="not divisible by model.heads=3; change one, or set model.head_dim"):
        TransformerConfig(heads=3, width=32).validate()
    TransformerConfig(heads=3, width=32, head_dim=16, position="rotary").validate()
    cfg = TransformerConfig(heads=8, kv_heads=2, width=64)
    assert cfg.axis_rules({"tensor": 2}) == (("kv_heads", "tensor"),)
    assert cfg.axis_rules({"tensor": 4}) == (("kv_heads", None),)  # 2 kv heads, 4 tensor devices: replicated
    assert TransformerConfig(heads=8, width=64).axis_rules({"tensor": 4}) == (("kv_heads", "tensor"),)


def test_swiglu_and_grouped_query_attention_are_counted_in_the_flops():
    from jaxnet.models.transformer import transformer_flops

    spec = TransformerConfig.preset("llama", layers=2, width=64, heads=8, kv_heads=2, mlp_hidden=96).spec(100, 16)
    w, hd, tokens = 64, 8, 3 * 16
    projections = 2 * tokens * (w * 8 * hd + 2 * w * 2 * hd + 8 * hd * w + 3 * w * 96)
    scores = 2 * 2 * 3 * (16 * 17 / 2) * 8 * hd
    assert transformer_flops(spec, batch=3) == 2 * (projections + scores) + 2 * tokens * w * 100

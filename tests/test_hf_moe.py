"""Mixtral and Qwen3-MoE checkpoints in and out: jaxnet's Transformer with mixture layers computes
what transformers' MixtralForCausalLM and Qwen3MoeForCausalLM compute, fine-tunes the same on one
device and with the experts split over two, and exports what transformers reads back.

As in tests/test_hf_llama.py: random weights (every weight moved by N(0, 0.1)) saved by
``save_pretrained``, float32, and Mixtral also in bfloat16 over several files; logits equal to
float32 rounding (|difference| <= 1e-5 + 1e-5 |logit|).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import cpu_env, fails
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
from jaxnet.sample import generate

torch = pytest.importorskip("torch", reason="the reference extra (torch, transformers) is not installed")
transformers = pytest.importorskip("transformers", reason="the reference extra (torch, transformers) is not installed")

COMMON = dict(hidden_size=32, num_hidden_layers=2, max_position_embeddings=64, num_attention_heads=4,
              num_key_value_heads=2, num_experts_per_tok=2)  # fmt: skip
MODELS = {
    "mixtral": ("Mixtral", dict(intermediate_size=24, num_local_experts=4, rope_theta=1e6)),
    # one dense layer (mlp_only_layers), top-k weights not renormalised, query/key norms, head_dim apart
    "qwen3-moe": (
        "Qwen3Moe",
        dict(intermediate_size=40, moe_intermediate_size=16, num_experts=4, head_dim=16, norm_topk_prob=False,
             mlp_only_layers=[1]),
    ),
}  # fmt: skip


def save(directory: Path, name: str, tokenizer, bf16: bool = False) -> Path:
    kind, keywords = MODELS[name]
    classes = (f"{kind}Config", f"{kind}ForCausalLM")
    return write_random(directory, classes, {**COMMON, **keywords}, tokenizer, name, bf16, shard="20KB")


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hf-moe")
    tokenizer = learned_tokenizer()
    saved = {name: save(root / name, name, tokenizer) for name in MODELS}
    saved["mixtral-bf16-sharded"] = save(root / "bf16", "mixtral", tokenizer, bf16=True)
    return saved


@pytest.mark.parametrize("name", [*MODELS, "mixtral-bf16-sharded"])
def test_logits_equal_transformers(checkpoints, name):
    directory = checkpoints[name]
    if name.endswith("sharded"):
        index = json.loads((directory / "model.safetensors.index.json").read_text())
        assert len(set(index["weight_map"].values())) >= 2
    tokens = tokens_for(directory)
    got = jaxnet.load(f"hf:{directory}").predict(tokens)
    np.testing.assert_allclose(got, reference_logits(directory, tokens), rtol=RTOL, atol=ATOL)


def test_each_experts_tensors_are_stacked_in_the_models_array(checkpoints):
    from safetensors.numpy import load_file

    directory = checkpoints["qwen3-moe"]
    tensors = load_file(str(directory / "model.safetensors"))
    params = jaxnet.load_params(f"hf:{directory}")
    moe = params["block_0"]["moe"]
    assert moe["gate"].shape == (4, 32, 16) and moe["down"].shape == (4, 16, 32) and moe["router"].shape == (32, 4)
    np.testing.assert_array_equal(moe["up"][3], tensors["model.layers.0.mlp.experts.3.up_proj.weight"].T)
    assert "moe" not in params["block_1"] and params["block_1"]["mlp_in"]["kernel"].shape == (32, 40)
    model = hf.read(f"hf:{directory}").model()
    assert (model.mlp_pattern, model.experts, model.router_renorm, model.qk_norm) == (("moe", "dense"), 4, False, True)


@pytest.mark.parametrize("name", list(MODELS))
def test_greedy_generation_with_the_cache_equals_transformers_generate(checkpoints, name):
    directory = checkpoints[name]
    prompt = tokens_for(directory, rows=1, length=7, seed=3)
    trained = jaxnet.load(f"hf:{directory}")
    ours = generate(trained.model.module, trained.params, prompt, 20, temperature=0)
    model = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    model.generation_config.eos_token_id = None
    with torch.no_grad():
        theirs = model.generate(torch.tensor(prompt), do_sample=False, max_new_tokens=20, pad_token_id=0)[0, 7:].numpy()
    np.testing.assert_array_equal(ours, theirs)


def finetune_argv(source: Path, text: Path, run: Path, *extra: str) -> list[str]:
    return ["train", "hf_finetune:smoke", f"train.init_from=hf:{source}", "train.steps=4", "train.eval_every=4",
            "train.checkpoint_every=4", "train.log_every=1", "train.progress=false", "data.name=text",
            f"data.path={text}", *extra, "--workdir", str(run)]  # fmt: skip


def losses(run: Path) -> list[float]:
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in records if r["split"] == "train"]


def test_a_finetune_splits_the_experts_over_two_devices_to_one_devices_losses_and_exports(checkpoints, tmp_path):
    source = checkpoints["mixtral"]
    text = tmp_path / "text.txt"
    text.write_text(write_corpus_source(tmp_path / "src.jsonl").read_text()[:20_000])
    one, two = tmp_path / "one", tmp_path / "two"
    assert cli.main(finetune_argv(source, text, one)) == 0
    argv = finetune_argv(source, text, two, "mesh.expert=2", "mesh.data=1")
    done = subprocess.run([sys.executable, "-m", "jaxnet", *argv], capture_output=True, text=True, env=cpu_env(2))
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads((two / "config.json").read_text())["mesh"]["expert"] == 2
    np.testing.assert_allclose(losses(two), losses(one), rtol=2e-5)
    record = json.loads((one / "metrics.jsonl").read_text().splitlines()[0])
    assert record["router_balance"] > 0 and record["moe/block_1/load_max"] >= 1.0  # the aux loss and the load
    assert sum(record[f"moe/block_0/expert_{e}"] for e in range(4)) == pytest.approx(1.0, rel=1e-5)
    out = tmp_path / "exported"
    assert cli.main(["export", "--workdir", str(one), "--format", "hf", "--out", str(out)]) == 0
    assert json.loads((out / "config.json").read_text())["architectures"] == ["MixtralForCausalLM"]
    tokens = tokens_for(source, length=32, seed=4)
    logits = jaxnet.load(one).predict(tokens)
    assert np.abs(logits - reference_logits(source, tokens)).max() > 1e-3  # fine-tuning moved the weights
    np.testing.assert_allclose(reference_logits(out, tokens), logits, rtol=RTOL, atol=ATOL)


def test_lora_adapts_the_attention_of_a_mixture_and_refuses_the_experts(checkpoints, tmp_path, capsys):
    source = checkpoints["qwen3-moe"]
    text = tmp_path / "text.txt"
    text.write_text(write_corpus_source(tmp_path / "src.jsonl").read_text()[:10_000])
    argv = finetune_argv(source, text, tmp_path / "lora", "train.lora_rank=2", "optim.lr=1e-3", "train.steps=2",
                         "train.eval_every=2", "train.checkpoint_every=2")  # fmt: skip
    assert cli.main(argv) == 0
    adapters = jaxnet.load(tmp_path / "lora").adapters
    assert set(adapters["block_0"]) == {"attention"}
    bad = finetune_argv(source, text, tmp_path / "bad", "train.lora_rank=2", "train.lora_targets=moe/gate")
    assert "LoRA adapts matrices" in fails(bad, capsys)
    assert not (tmp_path / "bad").exists()


def test_mixture_bad_input_is_one_line_exit_2(checkpoints, tmp_path, capsys):
    source = checkpoints["mixtral"]
    text = tmp_path / "text.txt"
    text.write_text("to be or not to be " * 200)
    assert "mesh.expert=3 does not divide model.experts=4" in fails(
        finetune_argv(source, text, tmp_path / "a", "mesh.expert=3"), capsys
    )
    odd = tmp_path / "odd"
    odd.mkdir()
    config = json.loads((source / "config.json").read_text())
    (odd / "config.json").write_text(json.dumps({**config, "num_experts_per_tok": 6}))
    (odd / "model.safetensors").write_bytes((source / "model.safetensors").read_bytes())
    assert "model.experts_per_token=6 is more than" in fails(
        ["sample", "--workdir", f"hf:{odd}", "--ids", "1,2"], capsys
    )
    (odd / "config.json").write_text(json.dumps({**config, "model_type": "deepseek_v3"}))
    assert "holds a deepseek_v3" in fails(["sample", "--workdir", f"hf:{odd}", "--ids", "1,2"], capsys)
    assert not (tmp_path / "a").exists()

"""LoRA adapters (train.lora_rank): trained alone on a frozen base, checkpointed alone, merged on export.

The base is a random-weight Llama written by transformers' ``save_pretrained`` (test_hf_llama's
fixtures: width 48, 2 blocks, tied embeddings so its queries, keys and values take the one stacked
product, and a grouped-query untied one that takes three). References: the base's own loss
(``jaxnet eval --workdir hf:PATH`` on the same batch), the bytes of the base as the file holds them,
transformers computing the merged export and peft computing the adapters on the base (float32
rounding: |difference| <= 1e-5 + 1e-5 |logit|), numpy for the optimizer state's size.
"""

from __future__ import annotations

import json
from pathlib import Path

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import fails
from test_hf_llama import ATOL, RTOL, learned_tokenizer, reference_logits, save, tokens_for

import jaxnet
from jaxnet import cli, config
from jaxnet.models.adapters import lora
from jaxnet.models.adapters.paths import joined
from jaxnet.train import loop as loop_lib
from jaxnet.train import step as step_lib

torch = pytest.importorskip("torch", reason="the reference extra (torch, transformers) is not installed")
transformers = pytest.importorskip("transformers", reason="the reference extra (torch, transformers) is not installed")

ARGS = ["train.lora_rank=4", "train.lora_alpha=8", "train.progress=false", "train.log_every=1"]


@pytest.fixture(scope="module")
def bases(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("lora-bases")
    tokenizer = learned_tokenizer()
    saved = {name: save(root / name, name, tokenizer) for name in ("llama-tied", "llama-gqa-untied-llama3")}
    text = root / "text.txt"  # 20 KB of Shakespeare: tokenized in a moment by every run
    text.write_text(jaxnet.data.text.shakespeare_works()[1][1][:20_000])
    return saved | {"text": text}


def smoke(bases: dict[str, Path]) -> list[str]:
    """hf_finetune:smoke's data: the small text file, tokenized with the checkpoint's tokenizer."""
    return ["data.name=text", f"data.path={bases['text']}"]


def lora_cfg(bases: dict[str, Path], base: Path, *extra: str) -> config.Config:
    return jaxnet.load_experiment("hf_finetune:smoke", [f"train.init_from=hf:{base}", *smoke(bases), *ARGS, *extra])


def first_loss(cfg: config.Config, workdir: Path) -> tuple[float, loop_lib.Run, object]:
    """The loss of training batch 0 under the state a run starts from (no update)."""
    from jaxnet.train import init_from

    cfg = init_from.with_hf_shape(cfg)
    run = loop_lib.Run(cfg)
    state = run.init_state(init_from.load(cfg, run, workdir))
    batch = run.put_batch(next(run.train_batches(0)))
    grad_fn = jax.jit(step_lib.make_grad_fn(run.model, run.task))
    (loss, _), _ = grad_fn(state.params, state.model_state, batch, jax.random.PRNGKey(0))
    return float(loss), run, state


@pytest.mark.parametrize("name", ["llama-tied", "llama-gqa-untied-llama3"])
def test_step_0_is_the_base_exactly_and_only_the_adapters_have_gradients_and_state(bases, tmp_path, name):
    base = bases[name]
    adapted, run, state = first_loss(lora_cfg(bases, base, "train.lora_targets=all"), tmp_path / "a")
    plain, _, plain_state = first_loss(
        jaxnet.load_experiment("hf_finetune:smoke", [f"train.init_from=hf:{base}", *smoke(bases)]), tmp_path / "b"
    )
    assert adapted == plain  # B = 0: the adapted model computes the base exactly
    adapters = state.params
    paths = lora.adapter_paths(adapters)
    assert len(paths) == 2 * (4 + 3)  # q, k, v, out, mlp_in, mlp_gate, mlp_out in each of 2 blocks
    a = adapters["block_0"]["attention"]["query"]["kernel"]["a"]
    assert a.shape == (48, 4) and float(jnp.abs(a).max()) <= 1 / np.sqrt(48)  # PEFT's kaiming uniform
    assert float(jnp.abs(a).max()) > 0.5 / np.sqrt(48)
    # gradients and optimizer state: the adapters' shapes only (AdamW: two moments of each, and a count)
    adapter_bytes = sum(x.nbytes for x in jax.tree.leaves(adapters))
    opt_bytes = sum(x.nbytes for x in jax.tree.leaves(state.opt_state))
    base_bytes = sum(x.nbytes for x in jax.tree.leaves(state.model_state[lora.BASE]))
    full_opt_bytes = sum(x.nbytes for x in jax.tree.leaves(plain_state.opt_state))
    assert adapter_bytes == 4 * sum(int(np.prod(x.shape)) for x in jax.tree.leaves(adapters))
    assert 2 * adapter_bytes <= opt_bytes <= 2 * adapter_bytes + 64
    assert opt_bytes < full_opt_bytes / 5 and adapter_bytes < base_bytes / 5
    # three updates: the base's bytes are what they were, the adapters moved
    before = jax.tree.map(lambda x: np.asarray(x).tobytes(), state.model_state[lora.BASE])
    b_before = np.asarray(a_b(state)["b"])
    for i in range(3):
        state, _ = run.train_step(state, run.put_batch(next(run.train_batches(i))))
    assert jax.tree.map(lambda x: np.asarray(x).tobytes(), state.model_state[lora.BASE]) == before
    assert not np.array_equal(np.asarray(a_b(state)["b"]), b_before)


def a_b(state) -> dict:
    return state.params["block_0"]["attention"]["query"]["kernel"]


def test_trains_only_the_adapters_resumes_exactly_and_exports_merged_and_as_peft(bases, tmp_path, capsys):
    import shutil

    from safetensors.numpy import load_file

    base = tmp_path / "base"
    shutil.copytree(bases["llama-tied"], base)
    argv = ["train", "hf_finetune:smoke", f"train.init_from=hf:{base}", *smoke(bases), *ARGS, "train.steps=8",
            "optim.lr=3e-2", "optim.warmup_steps=0", "train.eval_every=8", "train.checkpoint_every=4",
            "train.base_dtype=bfloat16"]  # fmt: skip
    whole = tmp_path / "whole"
    assert cli.main([*argv, "--workdir", str(whole)]) == 0
    losses = [r["loss"] for r in map(json.loads, (whole / "metrics.jsonl").open()) if r["split"] == "train"]
    assert np.mean(losses[-3:]) < losses[0] - 0.05, losses  # the loss falls
    # killed after step 4 (train.stop_after) and resumed: the same final loss
    parts = tmp_path / "parts"
    assert cli.main([*argv, "train.stop_after=4", "--workdir", str(parts)]) == 0
    assert cli.main([*argv, "--workdir", str(parts)]) == 0
    again = [r["loss"] for r in map(json.loads, (parts / "metrics.jsonl").open()) if r["split"] == "train"]
    assert again[-1] == losses[-1]
    # the checkpoint holds the adapters and their moments, not the base
    saved_state = jaxnet.checkpoint.load_state(whole)
    assert lora.BASE not in saved_state["model_state"]
    adapter_bytes = sum(x.nbytes for x in jax.tree.leaves(saved_state["params"]))
    assert adapter_bytes == 4 * 3072
    assert sum(x.nbytes for x in jax.tree.leaves(saved_state)) <= 3 * adapter_bytes + 64
    saved = json.loads((whole / "config.json").read_text())
    assert saved["_run"]["lora_base"]["init_from"] == f"hf:{base}" and len(saved["_run"]["lora_base"]["sha256"]) == 64
    # the base's bytes are the file's, untouched (held in bfloat16: the file's float32 rounded)
    trained = jaxnet.load(whole)
    restored = loop_lib.Run(trained.config).abstract_state()
    held = restored.model_state[lora.BASE]
    assert held["block_0"]["attention"]["query"]["kernel"].dtype == jnp.bfloat16
    assert held["block_0"]["norm_1"]["scale"].dtype == jnp.float32  # train.base_vectors=float32, the default
    tokens = tokens_for(base, length=32, seed=4)
    logits = trained.predict(tokens)
    assert np.abs(logits - reference_logits(base, tokens)).max() > 1e-3  # the adapters moved the outputs
    # merged export: transformers computes what jaxnet's adapted model computes
    merged = tmp_path / "merged"
    assert cli.main(["export", "--workdir", str(whole), "--format", "hf", "--out", str(merged)]) == 0
    np.testing.assert_allclose(reference_logits(merged, tokens), logits, rtol=RTOL, atol=ATOL)
    # PEFT export: peft adds the adapters to the base transformers loads, to the same logits
    peft = pytest.importorskip("peft")
    adapters = tmp_path / "adapters"
    assert cli.main(["export", "--workdir", str(whole), "--format", "peft", "--out", str(adapters)]) == 0
    tensors = load_file(str(adapters / "adapter_model.safetensors"))
    assert tensors["base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"].shape == (4, 48)
    assert tensors["base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"].shape == (48, 4)
    model = transformers.AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    # the base's matrices were held in bfloat16, its norms in float32: give peft's base the same bytes
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim >= 2:
                p.copy_(p.to(torch.bfloat16).float())
    model = peft.PeftModel.from_pretrained(model, adapters).eval()
    with torch.no_grad():
        theirs = model(torch.tensor(tokens)).logits.float().numpy()
    np.testing.assert_allclose(theirs, logits, rtol=RTOL, atol=ATOL)
    capsys.readouterr()
    assert cli.main(["sample", "--workdir", str(whole), "--prompt", "ROMEO:", "--tokens", "5", "--seed", "1"]) == 0
    assert capsys.readouterr().out.startswith("ROMEO:")
    # the base changes under the run: a resume and jaxnet.load refuse it in one line, before reading it
    from safetensors.numpy import save_file

    path = next(base.glob("*.safetensors"))
    changed = load_file(str(path))
    name = next(iter(changed))
    changed[name] = changed[name] + 1
    save_file(changed, str(path), metadata={"format": "pt"})
    err = fails([*argv[:3], *smoke(bases), *ARGS, "train.steps=10", "--workdir", str(whole)], capsys)
    assert "were trained on" in err and "weights have changed since" in err, err
    with pytest.raises(jaxnet.UserError, match="weights have changed since"):
        jaxnet.load(whole)


def test_bad_lora_input_is_one_line_exit_2(tmp_path, capsys):
    run = ["--workdir", str(tmp_path / "run")]
    smoke = ["train", "transformer_shakespeare:smoke", "train.progress=false"]
    assert "configures LoRA adapters, which are off" in fails([*smoke, "train.lora_targets=all", *run], capsys)
    assert "is not attention, all or a regular expression" in fails(
        [*smoke, "train.lora_rank=4", "train.lora_targets=(", *run], capsys
    )
    assert "matches no kernel of model" in fails(
        [*smoke, "train.lora_rank=4", "train.lora_targets=attention/nothing", *run], capsys
    )
    assert "set train.init_from" in fails([*smoke, "train.lora_rank=4", *run], capsys)
    assert "leave optim.freeze unset" in fails([*smoke, "train.lora_rank=4", "optim.freeze=embed", *run], capsys)
    # a model whose kernels the rule does not find: the ConvNet's have other names
    err = fails(["train", "cnn_fashion_mnist:smoke", "train.lora_rank=4", *run], capsys)
    assert "matches no kernel of model" in err and "Conv_0/kernel" in err
    assert not (tmp_path / "run").exists()


class MLP(nn.Module):
    @nn.compact
    def __call__(self, x, train=False):
        return nn.Dense(3)(nn.relu(nn.Dense(16)(x)))


def test_a_users_own_flax_model_takes_adapters_by_the_same_path_rule(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(256, 5)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int32) + (x[:, 1] > 0)
    data = jaxnet.data.arrays(train={"x": x, "y": y}, val={"x": x[:64], "y": y[:64]}, num_classes=3)
    task = jaxnet.tasks.classification(inputs="x", target="y")
    common = ["train.steps=20", "train.batch_size=32", "train.progress=false", "train.eval_every=20"]
    cfg = jaxnet.apply_overrides(jaxnet.Config(), common)
    jaxnet.train(cfg, tmp_path / "full", model=MLP(), dataset=data, task=task)
    adapted = jaxnet.apply_overrides(
        jaxnet.Config(),
        [*common, "optim.lr=1e-2", "train.lora_rank=2", "train.lora_targets=Dense_0/kernel",
         f"train.init_from={tmp_path / 'full'}"],
    )  # fmt: skip
    summary = jaxnet.train(adapted, tmp_path / "lora", model=MLP(), dataset=data, task=task)
    assert summary["param_count"] == 16 * 2 + 2 * 3  # A (16 x 2) and B (2 x 3) of Dense_0 (Dense(3), made first)
    trained = jaxnet.load(tmp_path / "lora", model=MLP())
    full = jaxnet.load_params(tmp_path / "full")
    pair = trained.adapters["Dense_0"]["kernel"]
    want = full["Dense_0"]["kernel"] + (1.0) * np.asarray(pair["a"]) @ np.asarray(pair["b"])  # alpha 0: scale 1
    np.testing.assert_allclose(trained.params["Dense_0"]["kernel"], want, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(trained.params["Dense_1"]["kernel"], full["Dense_1"]["kernel"])
    assert np.abs(np.asarray(pair["b"])).max() > 0
    # the saved run's outputs are the merged model's, as computed in training (evaluate restores the adapters)
    ours = jaxnet.evaluate(tmp_path / "lora", "val", model=MLP(), dataset=data, task=task)
    assert abs(ours["loss"] - summary["val"]["loss"]) < 1e-6


def test_base_dtype_keeps_norms_and_biases_float32_unless_told_and_old_runs_read_as_they_were_cast(tmp_path):
    base = {
        "block_0": {"attention": {"query": {"kernel": np.ones((4, 2, 2), np.float32), "bias": np.ones((2, 2))}}},
        "norm_out": {"scale": np.ones(4, np.float32)},
        "embed": {"embedding": np.ones((6, 4), np.float32)},
        "steps": np.ones((), np.int32),
    }
    kept = lora.cast_base(base, lora.Settings(rank=2, base_dtype="bfloat16"))
    dtypes = {joined(p): x.dtype for p, x in jax.tree_util.tree_flatten_with_path(kept)[0]}
    assert dtypes == {
        "block_0/attention/query/kernel": jnp.bfloat16,
        "block_0/attention/query/bias": jnp.float64,  # 2-D, but a bias: kept (and never narrowed)
        "norm_out/scale": jnp.float32,
        "embed/embedding": jnp.bfloat16,
        "steps": jnp.int32,
    }
    every = lora.cast_base(base, lora.Settings(rank=2, base_dtype="bfloat16", base_vectors="base_dtype"))
    assert {x.dtype for x in jax.tree.leaves(every)} == {jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.int32)}
    # a run saved before train.base_vectors existed held its whole base in base_dtype: read so
    cfg = config.apply_overrides(config.Config(), ["train.lora_rank=2", "train.base_dtype=bfloat16"])
    config.save(cfg, tmp_path / "config.json")
    tree = json.loads((tmp_path / "config.json").read_text())
    del tree["train"]["base_vectors"]
    (tmp_path / "config.json").write_text(json.dumps(tree))
    assert config.load(tmp_path / "config.json").train.base_vectors == "base_dtype"
    assert cfg.train.base_vectors == "float32"


def test_adapters_are_replicated_while_small_and_split_like_their_kernel_when_large(monkeypatch):
    from jaxnet import parallel
    from jaxnet.models import TransformerConfig, build

    module = build(TransformerConfig.preset("llama", layers=1, width=64, heads=4, mlp_hidden=96), 50, 16)
    model = lora.Lora(jaxnet.models.adapters.adapt(module), lora.Settings(rank=4, targets="all"))
    tokens = jnp.zeros((1, 16), jnp.int32)
    key = jax.random.PRNGKey(0)
    rules = lora.RULES + parallel.RULES

    def specs(path: str) -> tuple:
        variables = jax.eval_shape(lambda: model.init({"params": key, "dropout": key}, tokens))
        pair = variables["params"]
        for name in path.split("/"):
            pair = pair[name]
        return tuple(nn.logical_to_mesh_axes(pair[k].names, rules) for k in ("a", "b"))

    small = specs("block_0/mlp_in/kernel")
    assert small == (jax.sharding.PartitionSpec(None, None), jax.sharding.PartitionSpec(None, None))
    monkeypatch.setattr(lora, "LARGE", 256)  # A (64 x 4) and B (4 x 96) count as large
    a, b = specs("block_0/mlp_in/kernel")
    assert a == jax.sharding.PartitionSpec("fsdp", None) and b == jax.sharding.PartitionSpec(None, "tensor")
    a, b = specs("block_0/attention/out/kernel")  # (heads, head_dim, width): A over the heads, B over the width
    assert a == jax.sharding.PartitionSpec("tensor", None, None) and b == jax.sharding.PartitionSpec(None, "fsdp")

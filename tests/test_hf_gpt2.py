"""GPT-2 checkpoints in and out: jaxnet's Transformer computes what transformers' GPT2LMHeadModel computes.

The reference is transformers itself (the ``reference`` extra: torch and transformers): a
``GPT2LMHeadModel`` with random weights (its LayerNorm scales and biases moved off 1 and 0 so they
take part) saved by ``save_pretrained``. jaxnet's logits and next-token loss equal transformers'
to float32 rounding: |difference| <= 1e-5 + 1e-5 * |logit|, the loss within 1e-5 nats. The
checks of bad input need no torch: their checkpoints are written with safetensors alone.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import fails
from safetensors.numpy import load_file, save_file

import jaxnet
from jaxnet import cli
from jaxnet.models import hf
from jaxnet.predict import hf_model

RTOL = ATOL = 1e-5  # float32 rounding over a few blocks of width <= 48


def reference():
    """torch and transformers, or skip (they are the ``reference`` test extra)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    return torch, transformers


def save_gpt2(directory: Path, seed: int = 0, safetensors: bool = True, **shape) -> Path:
    """A random GPT2LMHeadModel of ``shape`` (GPT2Config keywords) saved by save_pretrained, dropout off."""
    torch, transformers = reference()
    vocab = shape.get("vocab_size", 61)
    config = transformers.GPT2Config(
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=vocab - 1, eos_token_id=vocab - 1, **shape
    )
    torch.manual_seed(seed)
    model = transformers.GPT2LMHeadModel(config).eval()
    with torch.no_grad():
        for p in model.parameters():  # scales and biases away from 1 and 0; all weights of a size that matters
            p.add_(0.1 * torch.randn_like(p))
    model.save_pretrained(directory)
    if not safetensors:  # the older layout: the state dict (tied lm_head.weight included) by torch.save
        (directory / "model.safetensors").unlink()
        torch.save(model.state_dict(), directory / "pytorch_model.bin")
    return directory


def hf_logits(directory: Path, tokens: np.ndarray) -> np.ndarray:
    torch, transformers = reference()
    model = transformers.GPT2LMHeadModel.from_pretrained(directory).eval()
    with torch.no_grad():
        return model(torch.tensor(tokens)).logits.numpy()


def next_token_loss(logits: np.ndarray, tokens: np.ndarray) -> float:
    """Mean cross-entropy of tokens[:, 1:] under logits[:, :-1], in float64 numpy."""
    z = logits[:, :-1].astype(np.float64)
    z = z - z.max(-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    return float(-np.take_along_axis(logp, tokens[:, 1:, None], -1).mean())


SHAPES = {
    "gpt2-like": dict(n_layer=2, n_embd=32, n_head=4, n_positions=16, vocab_size=61),
    "untied-exact-gelu": dict(
        n_layer=3,
        n_embd=48,
        n_head=6,
        n_positions=24,
        vocab_size=50,
        tie_word_embeddings=False,
        activation_function="gelu",
        layer_norm_epsilon=1e-3,
        n_inner=96,
    ),
    "one-head": dict(n_layer=1, n_embd=16, n_head=1, n_positions=8, vocab_size=33),
}


@pytest.mark.parametrize("name", SHAPES)
def test_logits_and_loss_equal_transformers_for_a_random_gpt2(tmp_path, name):
    shape = SHAPES[name]
    directory = save_gpt2(tmp_path / name, **shape)
    tokens = np.random.default_rng(1).integers(0, shape["vocab_size"], (3, shape["n_positions"]))
    expected = hf_logits(directory, tokens)
    got = jaxnet.load(f"hf:{directory}").predict(tokens)
    assert got.shape == expected.shape == (3, shape["n_positions"], shape["vocab_size"])
    np.testing.assert_allclose(got, expected, rtol=RTOL, atol=ATOL)
    assert abs(next_token_loss(got, tokens) - next_token_loss(expected, tokens)) < 1e-5
    # a shorter sequence than the context: the same first positions (causal)
    np.testing.assert_allclose(
        jaxnet.load(f"hf:{directory}").predict(tokens[:, :5]), expected[:, :5], rtol=RTOL, atol=ATOL
    )


def test_pytorch_model_bin_reads_as_safetensors_does(tmp_path):
    shape = SHAPES["gpt2-like"]
    directory = save_gpt2(tmp_path / "bin", safetensors=False, **shape)
    assert (directory / "pytorch_model.bin").is_file() and not (directory / "model.safetensors").exists()
    tokens = np.random.default_rng(2).integers(0, 61, (2, 16))
    np.testing.assert_allclose(
        jaxnet.load(f"hf:{directory}").predict(tokens), hf_logits(directory, tokens), rtol=RTOL, atol=ATOL
    )


def test_load_params_maps_conv1d_and_the_packed_qkv_onto_jaxnets_axes(tmp_path):
    directory = save_gpt2(tmp_path / "m", **SHAPES["gpt2-like"])
    tensors = load_file(str(directory / "model.safetensors"))
    params = jaxnet.load_params(f"hf:{directory}")
    attention = params["block_1"]["attention"]
    assert {n: attention[n]["kernel"].shape for n in ("query", "key", "value")} == dict.fromkeys(
        ("query", "key", "value"), (32, 4, 8)
    )
    c_attn = tensors["transformer.h.1.attn.c_attn.weight"]  # [in, q|k|v]
    keys_of_head_2 = c_attn[:, 32 + 2 * 8 : 32 + 3 * 8]
    np.testing.assert_array_equal(attention["key"]["kernel"][:, 2], keys_of_head_2)
    np.testing.assert_array_equal(
        params["block_0"]["attention"]["out"]["kernel"][3], tensors["transformer.h.0.attn.c_proj.weight"][24:32]
    )
    np.testing.assert_array_equal(params["position"], tensors["transformer.wpe.weight"])


def test_padded_vocabulary_is_never_predicted_and_leaves_the_real_logits_alone(tmp_path):
    shape = SHAPES["gpt2-like"]
    directory = save_gpt2(tmp_path / "m", **shape)
    tokens = np.random.default_rng(3).integers(0, 61, (2, 16))
    expected = hf_logits(directory, tokens)
    cfg, _, _ = hf_model(f"hf:{directory}")
    params = hf.nested(hf.read(f"hf:{directory}").params(rows=64))
    assert params["embed"]["embedding"].shape == (64, 32)
    assert not params["embed"]["embedding"][61:].any()
    model = jaxnet.models.build(cfg.model, 64, 16)  # model.vocab_used=61 from the checkpoint
    logits = np.asarray(model.apply({"params": params}, tokens))
    np.testing.assert_allclose(logits[..., :61], expected, rtol=RTOL, atol=ATOL)
    assert (logits[..., 61:] == np.finfo(np.float32).min).all()
    assert next_token_loss(logits, tokens) == pytest.approx(next_token_loss(expected, tokens), abs=1e-5)


def test_an_export_cut_into_several_files_loads_in_transformers_and_back(tmp_path):
    shape = dict(SHAPES["untied-exact-gelu"], n_layer=2)
    source = save_gpt2(tmp_path / "gpt2", **shape)
    trained = jaxnet.load(f"hf:{source}")
    out = hf.export(tmp_path / "out", trained.params, trained.config.model, context=24, max_shard_bytes=40_000)
    index = json.loads((out / "model.safetensors.index.json").read_text())
    files = sorted(p.name for p in out.glob("*.safetensors"))
    assert len(files) > 2 and files[0] == f"model-00001-of-{len(files):05d}.safetensors"
    assert sorted(set(index["weight_map"].values())) == files
    sizes = {f: (out / f).stat().st_size for f in files}
    assert all(size < 40_000 + 4_000 for f, size in sizes.items() if len(load_file(str(out / f))) > 1)
    total = sum(t.nbytes for f in files for t in load_file(str(out / f)).values())
    assert index["metadata"]["total_size"] == total
    tokens = np.random.default_rng(6).integers(0, shape["vocab_size"], (2, 24))
    expected = hf_logits(source, tokens)
    np.testing.assert_allclose(hf_logits(out, tokens), expected, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(jaxnet.load(f"hf:{out}").predict(tokens), expected, rtol=RTOL, atol=ATOL)


def test_a_bfloat16_checkpoint_in_several_files_imports_to_the_logits_transformers_computes_from_it(tmp_path):
    torch, transformers = reference()
    shape = SHAPES["gpt2-like"]
    source = save_gpt2(tmp_path / "f32", **shape)
    model = transformers.GPT2LMHeadModel.from_pretrained(source).to(torch.bfloat16)
    model.save_pretrained(tmp_path / "bf16", max_shard_size="20KB")
    assert (tmp_path / "bf16" / "model.safetensors.index.json").is_file()
    assert len(list((tmp_path / "bf16").glob("model-*.safetensors"))) > 2
    reference_model = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "bf16", dtype=torch.float32).eval()
    tokens = np.random.default_rng(7).integers(0, 61, (2, 16))
    with torch.no_grad():
        expected = reference_model(torch.tensor(tokens)).logits.numpy()  # the bf16 weights, in float32
    np.testing.assert_allclose(jaxnet.load(f"hf:{tmp_path / 'bf16'}").predict(tokens), expected, rtol=RTOL, atol=ATOL)


def test_tensors_are_checked_before_any_is_read_then_read_one_at_a_time(tmp_path, monkeypatch):
    from jaxnet.models.hf import files

    source = write_gpt2(tmp_path / "gpt2", n_layer=2)
    reads = []
    original = files.Tensors.read
    monkeypatch.setattr(files.Tensors, "read", lambda self, name, *a: reads.append(name) or original(self, name, *a))
    tensors = hf.read(f"hf:{source}").tensors()
    assert reads == []  # nothing read until asked for
    path, first = next(tensors)
    assert len(reads) == 1 and path == "embed/embedding" and first.shape == (20, 16)
    # every parameter once: embedding, positions, final norm (2), and 16 per block (2 norms, q/k/v, out, MLP)
    assert len(list(tensors)) + 1 == 4 + 2 * 16
    assert len(reads) == len(set(reads)) == 4 + 2 * 12  # each file tensor read once
    # a wrong shape anywhere stops the import before the first read
    tensors = load_file(str(source / "model.safetensors"))
    tensors["transformer.h.1.mlp.c_proj.bias"] = np.zeros(17, np.float32)
    save_file(tensors, str(source / "model.safetensors"))
    reads.clear()
    with pytest.raises(jaxnet.UserError, match="h.1.mlp.c_proj.bias has shape"):
        next(hf.read(f"hf:{source}").tensors())
    assert reads == []


def write_text(path: Path) -> Path:
    """A small UTF-8 text (its bytes below 245: UTF-8 never uses 0xF5-0xFF)."""
    rng = np.random.default_rng(0)
    words = ["the", "king", "queen", "speaks", "to", "a", "fool", "and", "é", "night"]
    path.write_text(" ".join(rng.choice(words, 6000)) + "\n")
    return path


def test_finetune_from_hf_then_export_and_transformers_reproduces_the_logits(tmp_path, capsys):
    shape = dict(n_layer=2, n_embd=32, n_head=4, n_positions=32, vocab_size=245)
    source = save_gpt2(tmp_path / "gpt2", **shape)
    text = write_text(tmp_path / "text.txt")
    run = tmp_path / "run"
    argv = ["train", "gpt2_finetune:smoke", f"train.init_from=hf:{source}", "data.name=text", f"data.path={text}"]
    assert cli.main([*argv, "--workdir", str(run)]) == 0
    saved = json.loads((run / "config.json").read_text())["model"]
    assert (saved["layers"], saved["width"], saved["context"], saved["vocab_used"]) == (2, 32, 32, 245)
    assert saved["norm_eps"] == 1e-5
    tokens = np.random.default_rng(4).integers(0, 245, (2, 32))
    trained = jaxnet.load(run)
    before = hf_logits(source, tokens)
    logits = trained.predict(tokens)
    assert logits.shape == (2, 32, 256)  # the bytes' vocabulary: 11 padding ids past GPT-2's 245
    assert (logits[..., 245:] == np.finfo(np.float32).min).all()
    assert np.abs(logits[..., :245] - before).max() > 1e-3  # fine-tuning moved the weights
    out = tmp_path / "exported"
    assert cli.main(["export", "--workdir", str(run), "--format", "hf", "--out", str(out)]) == 0
    # the source checkpoint's generation settings go with it (save_pretrained wrote them)
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "generation_config.json", "model.safetensors"]
    assert load_file(str(out / "model.safetensors"))["transformer.wte.weight"].shape == (245, 32)
    np.testing.assert_allclose(hf_logits(out, tokens), logits[..., :245], rtol=RTOL, atol=ATOL)
    # and the GPT-2 checkpoint samples before any training, from token ids
    capsys.readouterr()
    assert cli.main(["sample", "--workdir", f"hf:{source}", "--ids", "1,2,3", "--tokens", "6"]) == 0
    ids = [int(t) for t in capsys.readouterr().out.split()]
    assert len(ids) == 6 and all(0 <= t < 245 for t in ids)


# -- bad input: no torch needed ---------------------------------------------------------------


def write_gpt2(directory: Path, **overrides) -> Path:
    """A GPT-2 checkpoint written with safetensors alone: random tensors, named and shaped as GPT-2
    names and shapes them (transformers' GPT2LMHeadModel state dict: c_attn [w, 3w], c_fc [w, 4w], ...)."""
    config = {"model_type": "gpt2", "n_layer": 1, "n_embd": 16, "n_head": 2, "n_positions": 8, "vocab_size": 20}
    config |= overrides
    w, v, n = config["n_embd"], config["vocab_size"], config["n_positions"]
    shapes = {"wte.weight": (v, w), "wpe.weight": (n, w), "ln_f.weight": (w,), "ln_f.bias": (w,)}
    for i in range(config["n_layer"]):
        shapes |= {f"h.{i}.ln_{k}.{p}": (w,) for k in (1, 2) for p in ("weight", "bias")}
        shapes |= {
            f"h.{i}.attn.c_attn.weight": (w, 3 * w),
            f"h.{i}.attn.c_attn.bias": (3 * w,),
            f"h.{i}.attn.c_proj.weight": (w, w),
            f"h.{i}.attn.c_proj.bias": (w,),
            f"h.{i}.mlp.c_fc.weight": (w, 4 * w),
            f"h.{i}.mlp.c_fc.bias": (4 * w,),
            f"h.{i}.mlp.c_proj.weight": (4 * w, w),
            f"h.{i}.mlp.c_proj.bias": (w,),
        }
    rng = np.random.default_rng(0)
    tensors = {"transformer." + name: rng.normal(size=shape).astype(np.float32) for name, shape in shapes.items()}
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps(config))
    save_file(tensors, str(directory / "model.safetensors"))
    return directory


def train_argv(tmp_path: Path, source: Path, *extra: str) -> list[str]:
    text = write_text(tmp_path / "text.txt")
    return [
        "train", "gpt2_finetune:smoke", f"train.init_from=hf:{source}", "data.name=text", f"data.path={text}",
        "data.seq_len=8", *extra, "--workdir", str(tmp_path / "run"),
    ]  # fmt: skip


@pytest.mark.parametrize(
    "damage, message",
    [
        ("no weights", "has no weights (model.safetensors or pytorch_model.bin)"),
        ("gpt_neox", "holds a gpt_neox, not GPT-2, Llama, Qwen2, Mistral, Qwen3, Phi-3, Gemma, Gemma 2 or Gemma 3"),
        ("extra tensor", "GPT-2 tensor h.1.mlp.c_fc.weight (16, 64) has no place"),
        ("wrong shape", "GPT-2 tensor wpe.weight has shape (9, 16), but config.json makes it (8, 16)"),
        ("no config", "has no config.json"),
        ("missing tensor", "the checkpoint lacks h.0.mlp.c_fc.bias, which jaxnet's block_0/mlp_in/bias needs"),
    ],
)
def test_a_bad_checkpoint_is_one_line_exit_2_and_nothing_written(tmp_path, capsys, damage, message):
    source = write_gpt2(tmp_path / "gpt2", vocab_size=245)
    tensors = load_file(str(source / "model.safetensors"))
    if damage == "no weights":
        (source / "model.safetensors").unlink()
    elif damage == "gpt_neox":
        (source / "config.json").write_text(json.dumps({"model_type": "gpt_neox", "hidden_size": 16}))
    elif damage == "no config":
        (source / "config.json").unlink()
    else:
        if damage == "extra tensor":
            tensors["transformer.h.1.mlp.c_fc.weight"] = np.zeros((16, 64), np.float32)
        elif damage == "missing tensor":
            del tensors["transformer.h.0.mlp.c_fc.bias"]
        else:
            tensors["transformer.wpe.weight"] = np.zeros((9, 16), np.float32)
        save_file(tensors, str(source / "model.safetensors"))
    assert message in fails(train_argv(tmp_path, source), capsys)
    assert not (tmp_path / "run").exists()
    with pytest.raises(jaxnet.UserError, match=message.split(" (")[0].replace("(", r"\(")):
        jaxnet.load(f"hf:{source}")


def test_a_shape_the_experiment_contradicts_is_refused_naming_both(tmp_path, capsys):
    source = write_gpt2(tmp_path / "gpt2")
    err = fails(train_argv(tmp_path, source, "model.width=24", "model.heads=3"), capsys)
    assert "model.width=24 here, 16 in the checkpoint" in err and "model.heads=3 here, 2 in the checkpoint" in err
    err = fails([*train_argv(tmp_path, source)[:-2], "data.seq_len=9", "--workdir", str(tmp_path / "run")], capsys)
    assert "data.seq_len=9 is longer than the 8 positions" in err
    text = tmp_path / "text.txt"
    err = fails(
        ["train", "gpt2_small:smoke", f"train.init_from=hf:{source}", "data.name=text", f"data.path={text}",
         "--workdir", str(tmp_path / "run")],
        capsys,
    )  # fmt: skip
    # gpt2_small sets the width (64) and a default's layers (2): the width conflicts, the layers are taken
    assert "model.width=64 here, 16 in the checkpoint" in err and "model.layers" not in err
    assert not (tmp_path / "run").exists()


def test_a_gpt2_activation_jaxnet_does_not_compute_is_refused(tmp_path):
    source = write_gpt2(tmp_path / "gpt2")
    config = json.loads((source / "config.json").read_text())
    config |= {"activation_function": "relu", "scale_attn_by_inverse_layer_idx": True}
    (source / "config.json").write_text(json.dumps(config))
    with pytest.raises(jaxnet.UserError, match="activation_function='relu'.*scale_attn_by_inverse_layer_idx"):
        jaxnet.load_params(f"hf:{source}")


def test_pytorch_model_bin_without_torch_says_to_install_it_or_convert(tmp_path, monkeypatch):
    source = write_gpt2(tmp_path / "gpt2")
    (source / "model.safetensors").rename(source / "pytorch_model.bin")
    monkeypatch.setitem(__import__("sys").modules, "torch", None)  # import torch fails
    with pytest.raises(jaxnet.UserError, match="needs PyTorch to read: pip install torch, or convert it"):
        jaxnet.load_params(f"hf:{source}")


def test_data_with_ids_the_checkpoint_never_predicts_is_refused_before_training(tmp_path, capsys):
    source = write_gpt2(tmp_path / "gpt2")  # 20 ids; the text's bytes go up to 0xC3
    assert "data holds token id 195, past the 20 ids" in fails(train_argv(tmp_path, source), capsys)
    assert not (tmp_path / "run").exists()


def test_export_refuses_a_bad_format_and_a_non_empty_directory_and_writes_nothing(tmp_path, capsys):
    source = write_gpt2(tmp_path / "gpt2", vocab_size=245)
    run = tmp_path / "run"
    assert cli.main([*train_argv(tmp_path, source)[:-1], str(run), "train.steps=2", "train.log_every=1",
                     "train.eval_every=0", "train.checkpoint_every=0"]) == 0  # fmt: skip
    assert "invalid choice: 'onnx'" in fails(
        ["export", "--workdir", str(run), "--format", "onnx", "--out", str(tmp_path / "x")], capsys
    )
    full = tmp_path / "full"
    full.mkdir()
    (full / "keep.txt").write_text("mine")
    assert "is not empty" in fails(["export", "--workdir", str(run), "--format", "hf", "--out", str(full)], capsys)
    assert [p.name for p in full.iterdir()] == ["keep.txt"] and (full / "keep.txt").read_text() == "mine"
    assert not (tmp_path / "x").exists()
    # the round trip without torch: the exported checkpoint imports back to the same logits
    out = tmp_path / "out"
    assert cli.main(["export", "--workdir", str(run), "--format", "hf", "--out", str(out)]) == 0
    tokens = np.random.default_rng(5).integers(0, 245, (2, 8))
    np.testing.assert_allclose(
        jaxnet.load(f"hf:{out}").predict(tokens), jaxnet.load(run).predict(tokens)[..., :245], rtol=1e-6, atol=1e-6
    )
    # --format jax: jax.export's program of the same run (a text input of any length: symbolic dimensions)
    from jax import export as jax_export

    blob = tmp_path / "model.jax"
    assert cli.main(["export", "--workdir", str(run), "--format", "jax", "--out", str(blob)]) == 0
    exported = jax_export.deserialize(bytearray(blob.read_bytes()))
    np.testing.assert_allclose(
        np.asarray(exported.call(tokens.astype(np.int32))), jaxnet.load(run).predict(tokens), rtol=1e-6, atol=1e-6
    )
    assert "exists; give a new file name" in fails(
        ["export", "--workdir", str(run), "--format", "jax", "--out", str(blob)], capsys
    )
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # no temporary left


def test_a_model_gpt2_cannot_hold_is_refused():
    model = jaxnet.models.TransformerConfig(position="rotary")
    with pytest.raises(jaxnet.UserError, match=r"can hold this model \(GPT-2: model.position=rotary"):
        hf.convert({}, model, context=8)
    with pytest.raises(jaxnet.UserError, match="holds a Transformer; this run trained a lstm"):
        hf.convert({}, jaxnet.models.LSTMConfig(), context=8)

"""The gpt2_small experiment: GPT-2 small's shape and recipe, on a prepared corpus of GPT-2 tokens."""

from __future__ import annotations

from jaxnet import config
from jaxnet.train.loop import experiment_hooks


def test_gpt2_small_has_gpt2_smalls_shape_and_recipe():
    cfg = config.load_experiment("gpt2_small")
    m = cfg.model
    assert (m.name, m.layers, m.width, m.heads, m.mlp_ratio, m.tie_embeddings) == ("transformer", 12, 768, 12, 4, True)
    assert (m.dtype, m.attention) == ("auto", "auto")  # bf16 and cuDNN attention on a GPU
    assert cfg.data.seq_len == 1024 and cfg.train.batch_size == 64
    assert (cfg.optim.name, cfg.optim.lr, cfg.optim.b2, cfg.optim.weight_decay) == ("adamw", 6e-4, 0.95, 0.1)
    assert cfg.optim.warmup_steps == 200 and cfg.optim.end_lr_factor == 0.1


def test_gpt2_small_reads_a_prepared_gpt2_corpus_padded_to_50304(tmp_path):
    from jaxnet.data import prepare

    src = tmp_path / "text"
    src.mkdir()
    for i in range(4):
        (src / f"{i}.txt").write_text(f"Document {i}: to be, or not to be, that is the question. " * 30)
    prepare.prepare(str(src), "gpt2", tmp_path / "corpus", workers=1, progress=False, say=lambda _: None)
    for spec in ("gpt2_small", "gpt2_small:smoke"):
        cfg = config.load_experiment(spec, [f"data.path={tmp_path / 'corpus'}"])
        assert (cfg.data.name, cfg.data.vocab_size) == ("tokens", 50304)
        ds = experiment_hooks(cfg)["data"](cfg)
        assert ds.num_classes == 50304 and ds.tokenizer == "gpt2" and ds.vocab[50257] == "<unused 0>"
        assert ds.decode(ds.train[:5]).startswith("<|endoftext|>Document ")

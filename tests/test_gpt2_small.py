"""The gpt2_small experiment: GPT-2 small's shape and recipe, on the text the project ships."""

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


def test_gpt2_small_pads_the_byte_vocabulary_to_50304_and_smoke_keeps_the_bytes():
    full = config.load_experiment("gpt2_small")
    text = experiment_hooks(full)["data"](full)
    assert text.num_classes == 50304 and text.vocab[256] == "<unused 0>"
    smoke = config.load_experiment("gpt2_small:smoke")
    small = experiment_hooks(smoke)["data"](smoke)
    assert small.num_classes == 256 and len(small.train) == len(text.train)

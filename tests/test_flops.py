"""The analytic FLOP counts against XLA's own cost analysis of the compiled forward pass, and the
peak table that turns them into MFU."""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxnet import flops
from jaxnet.models import ConvNetConfig, LSTMConfig, ResNetConfig, TransformerConfig, build
from jaxnet.models.transformer import TransformerLanguageModel, TransformerSpec, transformer_flops

CASES = {
    "transformer": (TransformerConfig(layers=2, width=128, heads=4, mlp_ratio=4), 50, (4, 32)),
    # One time step: XLA counts the body of a scan once, however many steps it runs.
    "lstm": (LSTMConfig(layers=2, width=128), 50, (32, 1)),
    "convnet": (ConvNetConfig(features=(16, 32), hidden=64), 10, (4, 28, 28, 1)),
    # odd image size: strided convolutions with uneven padding
    "resnet": (ResNetConfig(features=(16, 32, 64), blocks=(2, 1, 1)), 10, (4, 15, 15, 3)),
}


def xla_forward_flops(model: nn.Module, x: jnp.ndarray) -> float:
    variables = nn.unbox(jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), x)))
    variables = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), variables)
    compiled = jax.jit(lambda v, x: model.apply(v, x)).lower(variables, x).compile()
    return compiled.cost_analysis()["flops"]


@pytest.mark.parametrize("name", list(CASES))
def test_analytic_count_matches_xla_cost_analysis(name):
    """XLA counts every product the compiled pass does (the full attention square: XLA's attention
    masks rather than skips) plus elementwise work, which is a few percent more."""
    cfg, vocab, shape = CASES[name]
    text = cfg.name in ("lstm", "transformer")
    model = build(cfg, vocab, shape[1] if text else 0)
    x = jnp.zeros(shape, jnp.int32 if text else jnp.float32)
    ours = flops.forward_flops(cfg, batch=shape[0], input_shape=shape[1:], vocab=vocab, causal=False)
    theirs = xla_forward_flops(model, x)
    assert ours <= theirs <= 1.04 * ours


def test_causal_attention_counts_only_the_pairs_it_needs():
    cfg, vocab, (batch, length) = CASES["transformer"]
    full = flops.forward_flops(cfg, batch=batch, input_shape=(length,), vocab=vocab, causal=False)
    causal = flops.forward_flops(cfg, batch=batch, input_shape=(length,), vocab=vocab)
    masked = np.triu(np.ones((length, length)), k=1).sum()  # (query, key) pairs a causal mask removes
    # two products (scores and weighted values) of `width` multiply-adds per pair, per layer and row
    assert full - causal == pytest.approx(2 * 2 * cfg.width * masked * batch * cfg.layers)
    assert flops.train_step_flops(cfg, batch=batch, input_shape=(length,), vocab=vocab) == 3 * causal
    encoder = dataclasses.replace(cfg, causal=False)  # a bidirectional model needs every pair
    assert flops.forward_flops(encoder, batch=batch, input_shape=(length,), vocab=vocab) == full


def test_grouped_query_attention_counts_the_key_value_projections_of_its_own_heads():
    """The count of a Transformer whose keys and values have half the query heads, against XLA's;
    it is below the multi-head count by exactly the key and value projections' missing half."""
    spec = TransformerSpec(vocab=50, context=32, layers=2, width=128, heads=4, kv_heads=2)
    model = TransformerLanguageModel(spec)
    ours = transformer_flops(spec, batch=4, causal=False)
    assert ours <= xla_forward_flops(model, jnp.zeros((4, 32), jnp.int32)) <= 1.04 * ours
    full = transformer_flops(dataclasses.replace(spec, kv_heads=4), batch=4, causal=False)
    assert full - ours == 2 * spec.layers * (4 * 32) * 2 * 128 * (2 * 32)  # k and v: 2 heads of 32 fewer


def test_peak_table_and_mfu():
    assert flops.peak_flops("NVIDIA H100 80GB HBM3") == 989e12
    assert flops.peak_flops("NVIDIA H100 PCIe") == 756e12
    assert flops.peak_flops("NVIDIA H200") == 989e12
    assert flops.peak_flops("NVIDIA H200", "float8") == flops.peak_flops("NVIDIA H100 80GB HBM3", "float8") == 1979e12
    assert flops.peak_flops("NVIDIA A100-SXM4-80GB", "float8") is None  # no float8 matrix units
    assert flops.peak_flops("cpu") is None and flops.mfu(1e12, 1.0, "cpu") is None
    assert flops.mfu(494.5e12, 2.0, "NVIDIA H100 80GB HBM3", devices=2) == pytest.approx(0.5)

"""The Transformer's CPU attention (heads moved ahead of time, then XLA's softmax(QK^T)V) is the
attention of ``jax.nn.dot_product_attention`` to float rounding, forward and backward, and it is
what the Transformer runs on a CPU."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxnet import models
from jaxnet.models.transformer import TransformerLanguageModel, TransformerSpec, attention_fn, head_major_attention
from jaxnet.models.transformer import attention as attention_lib

CONFIG = models.TransformerConfig(layers=1, width=16, heads=2)


def float64_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, causal: bool) -> np.ndarray:
    """The reference, in float64 with NumPy: softmax over keys of q.k / sqrt(d), then the weighted values."""
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    logits = np.einsum("btnh,bsnh->bnts", q, k) / np.sqrt(q.shape[-1])
    if causal:
        logits = np.where(np.tril(np.ones(logits.shape[-2:], bool)), logits, -np.inf)
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return np.einsum("bnts,bsnh->btnh", p, v)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("shape", [(2, 8, 2, 4), (3, 5, 1, 6), (1, 16, 4, 8)])
def test_head_major_attention_equals_jax_attention_to_rounding_in_value_and_gradient(shape, causal):
    rng = np.random.default_rng(0)
    q, k, v, g = (jnp.asarray(rng.normal(size=shape).astype(np.float32)) for _ in range(4))
    out, pull = jax.vjp(lambda q, k, v: head_major_attention(q, k, v, is_causal=causal), q, k, v)
    ref, ref_pull = jax.vjp(lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=causal), q, k, v)
    np.testing.assert_allclose(out, ref, rtol=0, atol=2e-6)
    np.testing.assert_allclose(out, float64_attention(q, k, v, causal), rtol=0, atol=2e-6)
    for grad, ref_grad in zip(pull(g), ref_pull(g), strict=True):
        np.testing.assert_allclose(grad, ref_grad, rtol=0, atol=1e-5)
        assert float(jnp.max(jnp.abs(ref_grad))) > 0.1  # the gradients compared are not all near zero


def test_causal_head_major_attention_ignores_later_positions():
    rng = np.random.default_rng(1)
    q, k, v = (jnp.asarray(rng.normal(size=(1, 6, 2, 4)).astype(np.float32)) for _ in range(3))
    changed = v.at[:, 4:].set(100.0)  # values of the last two positions only
    np.testing.assert_array_equal(head_major_attention(q, k, v)[:, :4], head_major_attention(q, k, changed)[:, :4])


def test_auto_attention_is_head_major_for_a_cpu_and_jax_for_a_gpu():
    """The choice follows the backend the model is built for, not the one this process runs on: a
    plan for a GPU compiled on a CPU gets jax.nn's attention."""
    assert models.resolve(CONFIG, "cpu").attention == "xla_head_major"
    assert models.resolve(CONFIG, "cuda").attention == "cudnn"  # bfloat16 there
    assert models.resolve(dataclasses.replace(CONFIG, dtype="float32"), "cuda").attention == "xla"
    assert attention_fn("xla_head_major") is head_major_attention
    assert attention_fn("xla").func is jax.nn.dot_product_attention


@pytest.mark.parametrize("pieces", [2, 3])
def test_attention_in_pieces_of_the_batch_is_the_whole_attention_with_its_masks(pieces):
    """Each piece of the batch attends whole for its rows: value and gradient equal the attention in
    one piece and the float64 reference, with a mask of one row per example (cut with the batch)
    and one shared by all (causal below)."""
    rng = np.random.default_rng(2)
    shape = (6, 8, 2, 4)
    q, k, v, g = (jnp.asarray(rng.normal(size=shape).astype(np.float32)) for _ in range(4))
    per_example = jnp.asarray(rng.random((6, 1, 8, 8)) < 0.7) | jnp.eye(8, dtype=bool)  # none empty
    shared = jnp.tril(jnp.ones((8, 8), bool))
    for mask in (per_example, shared):
        whole, whole_pull = jax.vjp(
            lambda q, k, v, m=mask: head_major_attention(q, k, v, is_causal=False, mask=m), q, k, v
        )
        cut, cut_pull = jax.vjp(
            lambda q, k, v, m=mask: attention_lib.in_pieces(head_major_attention, pieces, q, k, v, m, is_causal=False),
            q,
            k,
            v,
        )
        np.testing.assert_allclose(cut, whole, rtol=0, atol=1e-6)
        for a, b in zip(cut_pull(g), whole_pull(g), strict=True):
            np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)
    q64, k64, v64 = (np.asarray(a, np.float64) for a in (q, k, v))
    logits = np.einsum("btnh,bsnh->bnts", q64, k64) / 2.0
    logits = np.where(np.asarray(per_example), logits, -np.inf)
    p = np.exp(logits - logits.max(-1, keepdims=True))
    reference = np.einsum("bnts,bsnh->btnh", p / p.sum(-1, keepdims=True), v64)
    cut = attention_lib.in_pieces(head_major_attention, pieces, q, k, v, per_example, is_causal=False)
    np.testing.assert_allclose(cut, reference, rtol=0, atol=2e-6)


def test_cpu_pieces_are_the_largest_divisor_of_the_batch_up_to_xlas_cpu_threads(monkeypatch):
    monkeypatch.setenv("PJRT_NPROC", "4")  # the threads of XLA's CPU client
    assert [attention_lib.cpu_pieces(b) for b in (1, 2, 6, 7, 8, 32)] == [1, 2, 3, 1, 4, 4]
    # and up to a bound the caller gives (the blocks' pieces: model.MOST_BLOCK_PIECES)
    monkeypatch.setenv("PJRT_NPROC", "16")
    assert [attention_lib.cpu_pieces(b, most=4) for b in (6, 8, 32)] == [3, 4, 4]
    assert attention_lib.cpu_pieces(32) == 16
    monkeypatch.delenv("PJRT_NPROC")
    monkeypatch.setenv("NPROC", "3")  # a CPU reservation, as XLA reads it
    assert [attention_lib.cpu_pieces(b) for b in (6, 8)] == [3, 2]
    # under a mesh of several devices each device's work is its own: no pieces
    mesh = jax.sharding.AbstractMesh((2,), ("data",))
    with jax.sharding.use_abstract_mesh(mesh):
        assert attention_lib.cpu_pieces(8) == 1
    # a batch size left symbolic (a program exported for any batch) stays whole
    assert attention_lib.cpu_pieces(jax.export.symbolic_shape("batch")[0]) == 1


def test_the_transformer_on_a_cpu_attends_with_the_head_major_form(monkeypatch):
    calls = []

    def counting(*args, **kwargs):
        calls.append(args[0].shape)
        return head_major_attention(*args, **kwargs)

    monkeypatch.setattr(attention_lib, "head_major_attention", counting)
    monkeypatch.setenv("PJRT_NPROC", "2")
    model = TransformerLanguageModel(
        TransformerSpec(
            vocab=11, context=8, layers=2, width=16, heads=2, attention=models.resolve(CONFIG, "cpu").attention
        )
    )
    tokens = jnp.arange(16, dtype=jnp.int32).reshape(2, 8) % 11
    params = model.init(jax.random.key(0), tokens)
    logits = model.apply(params, tokens)
    assert logits.shape == (2, 8, 11)
    # two layers, once at init and once at apply, each in two pieces of the batch (two cores)
    assert calls == [(1, 8, 2, 8)] * 8


def _blocks_model(**keys) -> TransformerLanguageModel:
    spec = dict(vocab=11, context=8, layers=2, width=16, heads=2, attention=models.resolve(CONFIG, "cpu").attention)
    return TransformerLanguageModel(TransformerSpec(**{**spec, **keys}))


def test_the_blocks_run_in_pieces_of_the_batch_with_the_whole_batchs_numbers(monkeypatch):
    """On a CPU the blocks run on pieces of the batch, each all the way through (the attention inside
    is not cut again); packed rows keep their own positions and examples; the values are the whole
    batch's and the gradients equal its to rounding."""
    from jaxnet.models.transformer import model as model_lib

    calls = []

    def counting(*args, **kwargs):
        calls.append(args[0].shape[0])
        return head_major_attention(*args, **kwargs)

    monkeypatch.setattr(attention_lib, "head_major_attention", counting)
    monkeypatch.setenv("PJRT_NPROC", "2")
    model = _blocks_model()
    rng = np.random.default_rng(0)
    tokens = jnp.asarray(rng.integers(0, 11, (4, 8)), jnp.int32)
    segments = jnp.asarray([[1] * 8, [1] * 3 + [2] * 5, [1] * 6 + [0] * 2, [1, 1, 2, 2, 3, 3, 3, 3]], jnp.int32)
    positions = jnp.asarray(
        [list(range(8)), [0, 1, 2, 0, 1, 2, 3, 4], [0, 1, 2, 3, 4, 5, 0, 1], [0, 1, 0, 1, 0, 1, 2, 3]], jnp.int32
    )
    params = model.init(jax.random.key(0), tokens)["params"]

    def loss(p, **packed):
        return jnp.mean(jnp.square(model.apply({"params": p}, tokens, train=True, **packed)))

    for packed in ({}, {"segments": segments, "positions": positions}):
        calls.clear()
        value, grads = jax.value_and_grad(loss)(params, **packed)
        assert calls == [2] * 4  # two layers, each on two pieces of two rows
        with monkeypatch.context() as whole:
            whole.setattr(model_lib, "cpu_pieces", lambda batch, most=None: 1)
            whole.setattr(attention_lib, "cpu_pieces", lambda batch, most=None: 1)
            calls.clear()
            value_whole, grads_whole = jax.value_and_grad(loss)(params, **packed)
            assert calls == [4] * 2
        np.testing.assert_allclose(value, value_whole, rtol=1e-6)
        for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(grads_whole), strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-7)
    # each row alone, through the model, is its row of the batch: a reference that never meets the pieces
    logits = model.apply({"params": params}, tokens, segments=segments, positions=positions)
    for row in range(4):
        alone = model.apply({"params": params}, tokens[row : row + 1], segments=segments[row : row + 1],
                            positions=positions[row : row + 1])  # fmt: skip
        np.testing.assert_allclose(logits[row : row + 1], alone, rtol=1e-5, atol=1e-6)


def test_the_blocks_stay_whole_where_a_piece_would_compute_other_numbers(monkeypatch):
    from jaxnet.models.common import adapting
    from jaxnet.models.transformer import model as model_lib

    monkeypatch.setenv("PJRT_NPROC", "2")
    tokens = jnp.zeros((4, 8), jnp.int32)

    def pieces(model, train, decode=False):
        bound = model.bind(model.init(jax.random.key(0), tokens))
        return bound._batch_pieces(4, train, decode)

    assert pieces(_blocks_model(), train=True) == 2
    with monkeypatch.context() as many:  # more cores than MOST_BLOCK_PIECES: that many pieces
        many.setenv("PJRT_NPROC", "16")
        many.setattr(model_lib, "MOST_BLOCK_PIECES", 2)
        assert pieces(_blocks_model(), train=True) == 2
    # dropout draws its masks for the whole batch: whole in training, in pieces in evaluation
    assert pieces(_blocks_model(dropout=0.1), train=True) == 1
    assert pieces(_blocks_model(dropout=0.1), train=False) == 2
    with adapting(2.0, 0.05):  # a LoRA adapter's dropout likewise
        assert pieces(_blocks_model(), train=True) == 1
    with adapting(2.0, 0.0):
        assert pieces(_blocks_model(), train=True) == 2
    # a mixture of experts routes the batch's tokens together; decoding writes the cache
    assert pieces(_blocks_model(mlp_pattern=("dense", "moe"), experts=2, experts_per_token=1), train=False) == 1
    assert pieces(_blocks_model(), train=False, decode=True) == 1
    # under a mesh of several devices, no pieces
    with jax.sharding.use_abstract_mesh(jax.sharding.AbstractMesh((2,), ("data",))):
        assert pieces(_blocks_model(), train=True) == 1

"""The GPU fast path against the reference paths, on an NVIDIA GPU (skipped elsewhere).

Run with ``JAX_PLATFORMS=cuda python -m pytest -m gpu`` (``scripts/gpu_check.sh`` does).

- cuDNN's fused attention against XLA's, forward and gradients, in bfloat16: each is compared with
  XLA's attention in float32 on the same (bf16-rounded) inputs, and cuDNN's error must be small
  and no worse than twice XLA's own bf16 error;
- the whole Transformer with ``attention=cudnn`` against ``attention=xla``, same parameters;
- bfloat16 training against float32 training on the same batches: the loss curves stay within
  3 % (plus 0.02 nats) of each other at every step, and both fall by at least a quarter.

The cuDNN LSTM against the scan LSTM is ``tests/test_lstm_cudnn.py``.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxnet import Config, parallel
from jaxnet.data import text as text_lib
from jaxnet.models import TransformerConfig, TransformerLanguageModel, TransformerSpec
from jaxnet.train.loop import Run

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(jax.default_backend() != "gpu", reason="needs an NVIDIA GPU (JAX_PLATFORMS=cuda)"),
]


def rel_error(got, want) -> float:
    """Frobenius norm of the difference over that of ``want``, in float64."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


def attention(impl: str, dtype):
    def fn(q, k, v):
        return jax.nn.dot_product_attention(
            q.astype(dtype), k.astype(dtype), v.astype(dtype), is_causal=True, implementation=impl
        )

    return fn


def attention_and_grads(impl: str, dtype, q, k, v, r):
    """Causal attention's output and the gradients of ``sum(out * r)`` with respect to q, k, v."""
    fn = attention(impl, dtype)
    loss = lambda q, k, v: jnp.sum(fn(q, k, v).astype(jnp.float32) * r)  # noqa: E731
    out = jax.jit(fn)(q, k, v)
    grads = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v)
    return out, grads


@pytest.mark.parametrize("batch, length, heads, head_dim", [(2, 256, 8, 64), (4, 1024, 12, 64), (2, 128, 4, 128)])
def test_cudnn_attention_matches_xla_attention_in_bf16(batch, length, heads, head_dim):
    keys = jax.random.split(jax.random.PRNGKey(0), 4)
    shape = (batch, length, heads, head_dim)
    # bf16-rounded inputs, so that every path sees the same numbers
    q, k, v = (jax.random.normal(key, shape, jnp.float32).astype(jnp.bfloat16) for key in keys[:3])
    r = jax.random.normal(keys[3], shape, jnp.float32)
    want, want_grads = attention_and_grads("xla", jnp.float32, q, k, v, r)
    xla, xla_grads = attention_and_grads("xla", jnp.bfloat16, q, k, v, r)
    cudnn, cudnn_grads = attention_and_grads("cudnn", jnp.bfloat16, q, k, v, r)
    assert cudnn.dtype == jnp.bfloat16 and cudnn.shape == shape
    # cuDNN really ran: its program holds the fused-attention custom call
    assert "cudnn" in jax.jit(attention("cudnn", jnp.bfloat16)).lower(q, k, v).as_text().lower()

    forward = rel_error(cudnn, want)
    assert forward < 2e-2 and forward <= 2 * rel_error(xla, want) + 1e-3, forward
    np.testing.assert_allclose(np.asarray(cudnn, np.float32), np.asarray(xla, np.float32), atol=6e-2, rtol=0)
    for name, got, ref, bf16 in zip("qkv", cudnn_grads, want_grads, xla_grads, strict=True):
        error = rel_error(got, ref)
        assert error < 5e-2 and error <= 2 * rel_error(bf16, ref) + 5e-3, (name, error)
    # the comparison can fail: a wrong mask (no causality) is far off
    wrong = jax.nn.dot_product_attention(q, k, v, is_causal=False, implementation="cudnn")
    assert rel_error(wrong, want) > 0.2


def test_transformer_with_cudnn_attention_matches_xla_attention():
    vocab, context = 256, 128
    spec = TransformerSpec(vocab=vocab, context=context, layers=2, width=256, heads=4, dtype=jnp.bfloat16)
    models = {impl: TransformerLanguageModel(dataclasses.replace(spec, attention=impl)) for impl in ("xla", "cudnn")}
    tokens = jax.random.randint(jax.random.PRNGKey(1), (4, context), 0, vocab)
    params = models["xla"].init(jax.random.PRNGKey(2), tokens)["params"]

    def loss(model, p):
        logits = model.apply({"params": p}, tokens)
        return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), tokens[..., None], -1)), logits

    results = {
        impl: jax.jit(jax.value_and_grad(functools.partial(loss, m), has_aux=True))(params)
        for impl, m in models.items()
    }
    (loss_x, logits_x), grads_x = results["xla"]
    (loss_c, logits_c), grads_c = results["cudnn"]
    assert rel_error(logits_c, logits_x) < 2e-2
    assert abs(float(loss_c) - float(loss_x)) < 1e-2 * float(loss_x)
    scale = max(float(np.linalg.norm(np.asarray(w, np.float64))) for w in jax.tree.leaves(grads_x))
    for (path, g), w in zip(jax.tree_util.tree_flatten_with_path(grads_c)[0], jax.tree.leaves(grads_x), strict=True):
        name = jax.tree_util.keystr(path)
        if "['key']['bias']" in name:
            # softmax ignores a shift shared by a query's scores, so the keys' bias has no gradient:
            # both paths give rounding noise there, which no relative error can compare
            assert np.linalg.norm(np.asarray(g, np.float64)) < 1e-4 * scale, name
            assert np.linalg.norm(np.asarray(w, np.float64)) < 1e-4 * scale, name
            continue
        assert rel_error(g, w) < 5e-2, name


# ---------------------------------------------------------------------------------------------
# bf16 training against float32 on the same batches

STEPS, RTOL, ATOL = 200, 0.03, 0.02


def markov_text(vocab: int = 64, n: int = 1 << 17, seed: int = 0) -> text_lib.TextDataset:
    """Tokens from a random bigram chain (each row of its transition matrix a Dirichlet(0.1) draw):
    learnable within a few hundred steps, with an entropy floor well above zero."""
    rng = np.random.default_rng(seed)
    table = rng.dirichlet(np.full(vocab, 0.1), size=vocab).cumsum(axis=1)
    ids = np.zeros(n, np.int32)
    draws = rng.random(n)
    for i in range(1, n):
        ids[i] = min(np.searchsorted(table[ids[i - 1]], draws[i]), vocab - 1)
    return text_lib.TextDataset(train=ids, val=ids[:1024], test=ids[:1024], vocab=[f"<{i}>" for i in range(vocab)])


def train_losses(dtype: str, dataset: text_lib.TextDataset, steps: int = STEPS) -> np.ndarray:
    """Per-step training loss of a small Transformer computing in ``dtype`` (float32 parameters)."""
    cfg = Config(experiment="bf16-vs-f32")
    cfg.data.seq_len = 64
    cfg.model = TransformerConfig(layers=2, width=128, heads=4, dtype=dtype)
    cfg.optim.name, cfg.optim.lr, cfg.optim.warmup_steps = "adamw", 3e-3, 20
    cfg.train.batch_size, cfg.train.steps = 32, steps
    run = Run(cfg, dataset=dataset)
    state, losses = run.init_state(), []
    for _, batch in zip(range(steps), run.train_batches(0), strict=False):
        state, metrics = run.train_step(state, parallel.put_batch(batch, run.mesh))
        losses.append(metrics["loss"])
    return np.asarray(jax.device_get(losses), np.float64)


def test_bf16_training_follows_float32_training_on_the_same_batches():
    dataset = markov_text()
    f32, bf16 = train_losses("float32", dataset), train_losses("bfloat16", dataset)
    assert np.isfinite(f32).all() and np.isfinite(bf16).all()
    for curve in (f32, bf16):  # both learn, so that agreeing means something
        assert curve[-10:].mean() < 0.75 * curve[:10].mean()
    gap = np.abs(bf16 - f32)
    worst = int(np.argmax(gap - RTOL * f32))
    assert (gap <= RTOL * f32 + ATOL).all(), f"step {worst}: bf16 {bf16[worst]:.4f} vs float32 {f32[worst]:.4f}"

"""model.matmul=fp8: the Transformer's projections through float8 (e4m3 forward, e5m2 gradients,
current scaling), checked against numpy with ml_dtypes' own float8 rounding, and a short training
run in simulated float8 on the CPU against the same run in bfloat16."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from jaxnet import models
from jaxnet.models import TransformerConfig
from jaxnet.models.common import E4M3, fp8_matmul, fp8_quantize


def reference_quantize(x: np.ndarray, dtype: type) -> tuple[np.ndarray, float]:
    """float8 values of ``x`` scaled by max|x| / the format's largest number, with numpy and
    ml_dtypes' rounding (jax not involved), as float64, and the scale."""
    top = float(ml_dtypes.finfo(dtype).max)
    amax = np.float32(np.max(np.abs(x)))
    scale = np.float32(amax / np.float32(top)) if amax > 0 else np.float32(1.0)
    q = np.clip(x.astype(np.float32) / scale, -top, top).astype(dtype)
    return q.astype(np.float64), float(scale)


@pytest.mark.parametrize("dtype", [ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2])
def test_quantize_rounds_as_ml_dtypes_and_puts_the_maximum_on_the_largest_float8(dtype):
    x = np.random.default_rng(0).normal(size=(64, 48)).astype(np.float32) * 3.0
    q, scale = fp8_quantize(jnp.asarray(x), jnp.dtype(dtype))
    expected, expected_scale = reference_quantize(x, dtype)
    assert q.dtype == jnp.dtype(dtype)
    assert float(scale) == pytest.approx(expected_scale, rel=1e-7)
    np.testing.assert_array_equal(np.asarray(q, np.float64), expected)
    assert np.max(np.abs(expected)) == float(ml_dtypes.finfo(dtype).max)  # 448 for e4m3, 57344 for e5m2
    zeros, one = fp8_quantize(jnp.zeros((4, 4)), E4M3)
    assert float(one) == 1.0 and not np.any(np.asarray(zeros, np.float32))


@pytest.mark.parametrize("contract", [1, 2])
def test_fp8_matmul_and_its_gradients_equal_numpy_on_float8_rounded_operands(contract):
    """Forward: e4m3 x by e4m3 kernel; backward: the e5m2 gradient by the saved e4m3 operands, each
    product of float8 values summed exactly (float64 here, float32 accumulation there). Contracting
    two axes is the attention's output projection (heads, head size) -> width."""
    rng = np.random.default_rng(1)
    shape_x, shape_k = ((3, 5, 16), (16, 24)) if contract == 1 else ((3, 5, 4, 8), (4, 8, 24))
    x = rng.normal(size=shape_x).astype(np.float32)
    kernel = (rng.normal(size=shape_k) * 0.05).astype(np.float32)
    grad = rng.normal(size=(3, 5, 24)).astype(np.float32) * 1e-3

    y, pullback = jax.vjp(lambda a, b: fp8_matmul(a, b, contract), jnp.asarray(x), jnp.asarray(kernel))
    dx, dk = pullback(jnp.asarray(grad))

    (qx, sx), (qk, sk) = (
        reference_quantize(x, ml_dtypes.float8_e4m3fn),
        reference_quantize(kernel, ml_dtypes.float8_e4m3fn),
    )
    qg, sg = reference_quantize(grad, ml_dtypes.float8_e5m2)
    xs, ks, gs = qx * sx, qk * sk, qg * sg
    lead = x.ndim - contract
    axes = (list(range(lead, x.ndim)), list(range(contract)))
    np.testing.assert_allclose(np.asarray(y), np.tensordot(xs, ks, axes), rtol=1e-5, atol=1e-6)
    back = (list(range(lead, grad.ndim)), list(range(contract, kernel.ndim)))
    np.testing.assert_allclose(np.asarray(dx), np.tensordot(gs, ks, back), rtol=1e-5, atol=1e-9)
    np.testing.assert_allclose(np.asarray(dk), np.tensordot(xs, gs, (list(range(lead)),) * 2), rtol=1e-5, atol=1e-9)
    # and not the exact product: the operands were rounded to float8
    assert not np.allclose(np.asarray(y), np.tensordot(x, kernel, axes), rtol=1e-3, atol=0)


def dot_dtypes(fn, *args) -> list[str]:
    """The operand dtype of every dot_general in ``fn``'s jaxpr, sub-jaxprs (custom_vjp) included."""
    found = []

    def walk(jaxpr):
        for eqn in jaxpr.eqns:
            if eqn.primitive.name == "dot_general":
                found.append(str(eqn.invars[0].aval.dtype))
            for value in eqn.params.values():
                for sub in value if isinstance(value, tuple | list) else (value,):
                    inner = getattr(sub, "jaxpr", sub)
                    if hasattr(inner, "eqns"):
                        walk(inner)

    walk(jax.make_jaxpr(fn)(*args).jaxpr)
    return found


def test_only_the_projections_of_attention_and_the_mlp_go_through_float8(monkeypatch):
    """A Llama-shaped block (separate key/value heads, SwiGLU, untied output): queries, keys,
    values, attention's output and the three MLP matrices are float8 products; attention's two
    products and the output layer stay in the compute dtype, and so do the parameters."""
    monkeypatch.setenv("PJRT_NPROC", "1")  # the batch in one piece on a CPU: each product traced once
    cfg = TransformerConfig.preset("llama", layers=1, width=32, heads=4, kv_heads=2, dtype="bfloat16")
    fp8 = models.build(dataclasses.replace(cfg, attention="xla", matmul="fp8"), 40, 16)
    tokens = jnp.zeros((2, 16), jnp.int32)
    params = jax.eval_shape(fp8.init, jax.random.PRNGKey(0), tokens)["params"]  # shapes are all it needs
    assert {str(p.dtype) for p in jax.tree.leaves(params)} == {"float32"}
    dtypes = dot_dtypes(lambda p: fp8.apply({"params": p}, tokens), params)
    assert sorted(dtypes) == ["bfloat16"] * 3 + ["float8_e4m3fn"] * 7
    plain = models.build(dataclasses.replace(cfg, attention="xla"), 40, 16)
    assert sorted(dot_dtypes(lambda p: plain.apply({"params": p}, tokens), params)) == ["bfloat16"] * 10


def test_a_short_run_in_simulated_fp8_stays_within_0_05_nats_of_bfloat16():
    """20 AdamW steps of a one-block Transformer in bfloat16 on a learnable sequence task (ids
    counting up by 1 to 3 from a random start), once with the projections in float8: every step's
    loss within 0.05 nats of the bfloat16 run's (measured: at most about 0.004), and both learn."""
    import optax

    vocab, length, rows = 32, 32, 16

    def batch(i):
        r = np.random.default_rng(i)
        start, stride = r.integers(0, vocab, (rows, 1)), r.integers(1, 4, (rows, 1))
        return jnp.asarray((start + stride * np.arange(length)) % vocab)

    losses = {}
    for matmul in ("default", "fp8"):
        cfg = TransformerConfig(layers=1, width=64, heads=4, dtype="bfloat16", attention="xla", matmul=matmul)
        model = models.build(cfg, vocab, length)
        params = jax.jit(model.init)(jax.random.PRNGKey(1), batch(0))["params"]
        optimizer = optax.adamw(3e-3)

        def loss(p, tokens, model=model):
            logits = model.apply({"params": p}, tokens)[:, :-1].astype(jnp.float32)
            return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), tokens[:, 1:, None], -1))

        @jax.jit
        def step(p, state, tokens, loss=loss, optimizer=optimizer):
            value, grads = jax.value_and_grad(loss)(p, tokens)
            updates, state = optimizer.update(grads, state, p)
            return optax.apply_updates(p, updates), state, value

        state, losses[matmul] = optimizer.init(params), []
        for i in range(20):
            params, state, value = step(params, state, batch(i))
            losses[matmul].append(float(value))
    bf16, fp8 = np.array(losses["default"]), np.array(losses["fp8"])
    assert np.max(np.abs(fp8 - bf16)) < 0.05
    assert fp8[-1] < 0.6 * fp8[0] and bf16[-1] < 0.6 * bf16[0]
    assert not np.array_equal(fp8, bf16)  # the float8 run did round its operands

"""The ConvNet's CPU speed-ups keep its numbers: max pooling as strided views (the same values and
gradients as pooling by reduction) and convolutions compiled onto XLA's own kernels (the same
convolution as XLA's default, to rounding)."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import tiny_config
from jax import lax

from jaxnet import xla_options
from jaxnet.models.cnn import max_pool_2x2
from jaxnet.train.loop import Run


def reduce_max_pool(x: jnp.ndarray) -> jnp.ndarray:
    """The reference: crop to even sizes, then JAX's max over each window's two axes."""
    n, h, w, c = x.shape
    x = x[:, : h - h % 2, : w - w % 2]
    return x.reshape(n, h // 2, 2, w // 2, 2, c).max(axis=(2, 4))


@pytest.mark.parametrize("shape", [(2, 6, 6, 3), (3, 7, 5, 2), (1, 28, 28, 4)])
def test_max_pool_equals_pooling_by_reduction_in_value_and_gradient_with_ties(shape):
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.integers(-2, 3, shape).astype(np.float32))  # small integers: many tied windows
    y, pull = jax.vjp(max_pool_2x2, x)
    g = jnp.asarray(rng.normal(size=y.shape).astype(np.float32))
    ref_y, ref_pull = jax.vjp(reduce_max_pool, x)
    np.testing.assert_array_equal(y, nn.max_pool(x, (2, 2), (2, 2)))
    np.testing.assert_array_equal(y, ref_y)
    np.testing.assert_array_equal(pull(g)[0], ref_pull(g)[0])  # ties share the gradient equally, bitwise


def test_max_pool_gradient_splits_a_three_way_tie_in_thirds():
    x = jnp.array([5.0, 5.0, 5.0, 1.0]).reshape(1, 2, 2, 1)
    grad = jax.grad(lambda x: max_pool_2x2(x).sum())(x)
    np.testing.assert_allclose(grad.reshape(-1), [1 / 3, 1 / 3, 1 / 3, 0.0], rtol=1e-7)


def test_max_pool_of_stacked_members_under_vmap_is_each_members_pooling():
    rng = np.random.default_rng(1)
    x = jnp.asarray(rng.normal(size=(3, 2, 4, 4, 2)).astype(np.float32))
    grads = jax.vmap(jax.grad(lambda x: (max_pool_2x2(x) ** 2).sum()))(x)
    for i in range(3):
        np.testing.assert_array_equal(grads[i], jax.grad(lambda x: (reduce_max_pool(x) ** 2).sum())(x[i]))


CASES = [  # (input NHWC, kernel HWIO, strides, padding)
    ((4, 12, 12, 1), (3, 3, 1, 8), (1, 1), "SAME"),
    ((4, 10, 10, 8), (3, 3, 8, 16), (1, 1), "SAME"),
    ((2, 9, 11, 4), (3, 3, 4, 6), (2, 2), "SAME"),
    ((2, 8, 8, 4), (3, 3, 4, 5), (1, 1), "VALID"),
    ((2, 8, 8, 6), (1, 1, 6, 4), (2, 2), ((0, 1), (1, 0))),
]


@pytest.mark.parametrize("lhs, rhs, strides, padding", CASES)
def test_convolution_compiled_with_jaxnets_cpu_options_equals_xlas_default_to_rounding(lhs, rhs, strides, padding):
    options = xla_options.compiler_options()
    if options is None:
        pytest.skip("not a CPU, or this jaxlib lacks the option")
    rng = np.random.default_rng(2)
    x = jnp.asarray(rng.normal(size=lhs).astype(np.float32))
    w = jnp.asarray(rng.normal(size=rhs).astype(np.float32))
    dn = ("NHWC", "HWIO", "NHWC")

    def loss(x, w):  # forward, and both gradients of a loss that weighs every output differently
        y = lax.conv_general_dilated(x, w, strides, padding, dimension_numbers=dn)
        return (y * jnp.cos(jnp.arange(y.size, dtype=y.dtype).reshape(y.shape))).sum(), y

    program = jax.jit(jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)).lower(x, w)
    ours, default = program.compile(compiler_options=options), program.compile()
    entry = lambda compiled: compiled.as_text().split("\nENTRY")[1]  # noqa: E731
    # XLA's default wraps convolutions in YNNPACK fusions; ours leaves all three (forward, both
    # gradients) to XLA's own kernels, in the program's entry.
    assert entry(ours).count(" convolution(") == 3
    (_, y), grads = ours(x, w)
    (_, ref_y), ref_grads = default(x, w)
    # float64 on the host: an independent check of the forward pass
    ref64 = lax.conv_general_dilated(np.float64(x), np.float64(w), strides, padding, dimension_numbers=dn)
    np.testing.assert_allclose(y, ref64, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(y, ref_y, rtol=1e-5, atol=1e-5)
    for a, b in zip(grads, ref_grads, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-4)


def test_cpu_options_step_aside_for_the_users_xla_flags(monkeypatch):
    if jax.default_backend() != "cpu":
        pytest.skip("CPU only")
    assert xla_options.compiler_options() == {
        "xla_cpu_experimental_ynn_fusion_type": "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT,LIBRARY_FUSION_TYPE_REDUCE"
    }
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_experimental_ynn_fusion_type=")
    assert xla_options.compiler_options() is None


def test_the_runners_train_and_eval_steps_compile_their_convolutions_outside_ynnpack_on_a_cpu(quadrants):
    if xla_options.compiler_options() is None:
        pytest.skip("not a CPU, or this jaxlib lacks the option")
    run = Run(tiny_config(), dataset=quadrants)
    state = run.init_state()
    batch = run.put_batch(next(run.train_batches(0)))
    train_text = run.train_step.lower(state, batch).compile().as_text().split("\nENTRY")[1]
    assert train_text.count(" convolution(") == 2  # forward and kernel gradient (the images need none)
    eval_text = run.eval_step.lower(state, batch, {}).compile().as_text().split("\nENTRY")[1]
    assert eval_text.count(" convolution(") == 1


def test_the_compiled_train_step_has_the_gradients_of_op_by_op_execution(quadrants):
    """The max pool's gradient compares the pooled layer's input with the pooled maximum, so XLA
    must compute that input the same way in every fused operation that recomputes it. A first
    layer written as multiply-adds of shifted views of the image broke this: XLA's CPU code
    contracts multiply-adds into FMAs, fusions recomputed the layer with different roundings, and
    the compiled step's first-layer gradients were wrong on these images (few distinct pixel
    values, many ties) with dropout on: gradient norm 1.238 against 1.268 op by op. This is that
    case; the norm is compared (the weights after one Adam step move by the sign of each
    gradient, which rounding may flip where a gradient is near zero)."""
    if jax.default_backend() != "cpu":
        pytest.skip("a CPU compilation property")
    cfg = tiny_config(model={"dropout": 0.25, "features": (4, 4)}, train={"steps_per_call": 1})
    cfg.seed = 1
    run = Run(cfg, dataset=quadrants)
    batch = run.put_batch(next(run.train_batches(0)))
    _, compiled = run.train_step(run.init_state(), batch)
    with jax.disable_jit():
        _, eager = run.train_step(run.init_state(), batch)
    np.testing.assert_allclose(compiled["loss"], eager["loss"], rtol=1e-5)
    np.testing.assert_allclose(compiled["grad_norm"], eager["grad_norm"], rtol=1e-5)  # 2.4 % off when wrong

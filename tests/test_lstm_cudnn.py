"""The cuDNN LSTM path (``impl="cudnn"``) against the ``lax.scan`` recurrence and plain numpy.

``jax.experimental.rnn.lstm`` runs only on an NVIDIA GPU, so most tests here run the cuDNN path
with JAX's pure-JAX reference of it (``rnn.lstm_ref``, same flat weight layout) in its place:
that checks the weight packing, gate order, state handling and gradients of everything around
the kernel. The last test runs the real kernel and is skipped unless JAX's backend is a GPU
(conftest.py defaults to the CPU: run it with ``JAX_PLATFORMS=cuda``).
"""

from __future__ import annotations

import contextlib
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import rnn

from jaxnet.models import lstm as lstm_mod
from jaxnet.models.lstm import (
    LSTMLanguageModel,
    LSTMLayer,
    cudnn_lstm_reference,
    lstm_cudnn,
    lstm_scan,
    pack_cudnn_weights,
)

TOL = {"rtol": 1e-5, "atol": 1e-5}


@pytest.fixture
def full_float32_matmuls():
    """float32 products in full precision: on a GPU, XLA's default is TF32 (about 1e-3 relative),
    which these float32 comparisons at 1e-5 would read as a wrong kernel; a CPU is unaffected."""
    with jax.default_matmul_precision("highest"):
        yield


BATCH, TIME, FEATURES, HIDDEN = 3, 6, 5, 7


def random_layer(seed: int, batch: int = BATCH, time: int = TIME, features: int = FEATURES, hidden: int = HIDDEN):
    """x, w_x, w_h, b, h0, c0 as float32 numpy arrays, scaled so that the gates are not saturated."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(batch, time, features))
    w_x = rng.normal(size=(features, 4, hidden)) / np.sqrt(features)
    w_h = rng.normal(size=(hidden, 4, hidden)) / np.sqrt(hidden)
    b = 0.5 * rng.normal(size=(4, hidden))
    h0 = rng.uniform(-0.8, 0.8, size=(batch, hidden))
    c0 = rng.normal(size=(batch, hidden))
    return tuple(a.astype(np.float32) for a in (x, w_x, w_h, b, h0, c0))


def scan_layer(x, w_x, w_h, b, h0, c0, dtype=jnp.float32):
    """The scan path as LSTMLayer computes it: input projection then :func:`lstm_scan`."""
    acc = jnp.promote_types(dtype, jnp.float32)
    x_proj = jnp.einsum("btf,fgk->btgk", x.astype(dtype), w_x.astype(dtype), preferred_element_type=acc) + b
    return lstm_scan(x_proj, w_h, h0, c0, dtype)


cudnn_ref_layer = functools.partial(lstm_cudnn, dtype=jnp.float32, rnn_fn=cudnn_lstm_reference)


def np_lstm(x, w_x, w_h, b, h, c):
    """Independent float64 loop over time, one gate at a time, gates i, f, g, o along axis 1 of the weights."""
    x, w_x, w_h, b, h, c = (np.asarray(a, np.float64) for a in (x, w_x, w_h, b, h, c))
    sigmoid = lambda v: 1.0 / (1.0 + np.exp(-v))
    outputs = []
    for t in range(x.shape[1]):
        gate = [x[:, t] @ w_x[:, k, :] + h @ w_h[:, k, :] + b[k] for k in range(4)]
        c = sigmoid(gate[1]) * c + sigmoid(gate[0]) * np.tanh(gate[2])
        h = sigmoid(gate[3]) * np.tanh(c)
        outputs.append(h)
    return np.stack(outputs, axis=1), h, c


# ---------------------------------------------------------------------------------------------
# The weight layout


def test_packed_weights_have_cudnns_length_and_layout():
    _, w_x, w_h, b, _, _ = random_layer(0)
    weights = pack_cudnn_weights(jnp.asarray(w_x), jnp.asarray(w_h), jnp.asarray(b))
    assert weights.shape == (rnn.get_num_params_in_lstm(FEATURES, HIDDEN, 1, False),)
    assert weights.dtype == jnp.float32
    w_ih, w_hh, b_ih, b_hh = rnn.unpack_lstm_weights(weights, FEATURES, HIDDEN, 1, False)
    assert w_ih[0].shape == (4 * HIDDEN, FEATURES) and w_hh[0].shape == (4 * HIDDEN, HIDDEN)
    for gate in range(4):  # cuDNN's gate order (i, f, g, o) is ours: gate k is rows k*H:(k+1)*H
        rows = slice(gate * HIDDEN, (gate + 1) * HIDDEN)
        np.testing.assert_array_equal(w_ih[0][rows], w_x[:, gate, :].T)
        np.testing.assert_array_equal(w_hh[0][rows], w_h[:, gate, :].T)
        np.testing.assert_array_equal(b_ih[0][rows], b[gate])
    np.testing.assert_array_equal(b_hh[0], 0.0)


# ---------------------------------------------------------------------------------------------
# (a) Forward: cuDNN layout through rnn.lstm_ref == lstm_scan == numpy


@pytest.mark.usefixtures("full_float32_matmuls")
def test_cudnn_path_with_the_reference_kernel_matches_scan_and_numpy():
    args = random_layer(1)
    out, (h, c) = jax.jit(cudnn_ref_layer)(*map(jnp.asarray, args))
    want_out, (want_h, want_c) = jax.jit(scan_layer)(*map(jnp.asarray, args))
    np_out, np_h, np_c = np_lstm(*args)
    assert out.shape == (BATCH, TIME, HIDDEN) and out.dtype == h.dtype == c.dtype == jnp.float32
    for got, scan, ref in ((out, want_out, np_out), (h, want_h, np_h), (c, want_c, np_c)):
        np.testing.assert_allclose(got, scan, **TOL)
        np.testing.assert_allclose(got, ref, **TOL)
        np.testing.assert_allclose(scan, ref, **TOL)
    np.testing.assert_allclose(out[:, -1], h, **TOL)
    # the initial state matters, so the comparison can fail
    zero_out, _ = jax.jit(cudnn_ref_layer)(*map(jnp.asarray, args[:4]), jnp.zeros_like(h), jnp.zeros_like(c))
    assert np.abs(np.asarray(zero_out) - np_out).max() > 1e-2


@pytest.mark.usefixtures("full_float32_matmuls")
def test_gate_order_matters():
    """Swapping two gates' weights changes the result: the agreement above pins the order down."""
    x, w_x, w_h, b, h0, c0 = random_layer(2)
    perm = [0, 1, 3, 2]  # g <-> o, as MIOpen's order would
    out, _ = jax.jit(cudnn_ref_layer)(*map(jnp.asarray, (x, w_x[:, perm], w_h[:, perm], b[perm], h0, c0)))
    want, _, _ = np_lstm(x, w_x, w_h, b, h0, c0)
    assert np.abs(np.asarray(out) - want).max() > 1e-2


# ---------------------------------------------------------------------------------------------
# (b) Gradients


@pytest.mark.usefixtures("full_float32_matmuls")
def test_cudnn_path_gradients_match_the_scan_path():
    args = tuple(map(jnp.asarray, random_layer(3)))
    rng = np.random.default_rng(4)
    shapes = [(BATCH, TIME, HIDDEN), (BATCH, HIDDEN), (BATCH, HIDDEN)]
    r_out, r_h, r_c = (jnp.asarray(rng.normal(size=shape), jnp.float32) for shape in shapes)

    def loss(layer_fn, x, w_x, w_h, b, h0, c0):  # a random linear function of everything the layer returns
        out, (h, c) = layer_fn(x, w_x, w_h, b, h0, c0)
        return jnp.sum(out * r_out) + jnp.sum(h * r_h) + jnp.sum(c * r_c)

    grad = lambda fn: jax.jit(jax.grad(functools.partial(loss, fn), argnums=tuple(range(6))))
    got, want = grad(cudnn_ref_layer)(*args), grad(scan_layer)(*args)
    for name, g, w in zip(("x", "w_x", "w_h", "b", "h0", "c0"), got, want, strict=True):
        assert g.shape == w.shape, name
        assert np.abs(np.asarray(w)).max() > 1e-3, name  # non-trivial gradients
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5, err_msg=name)


# ---------------------------------------------------------------------------------------------
# (c) The whole model: impl="cudnn" (reference kernel) == impl="scan"

VOCAB, LAYERS, MODEL_HIDDEN = 13, 2, 8


@pytest.fixture
def reference_kernel(monkeypatch):
    """Point the "cudnn" implementation at rnn.lstm_ref for the duration of a test."""
    monkeypatch.setattr(lstm_mod, "_RNN_FN", cudnn_lstm_reference)


def test_language_model_cudnn_impl_matches_scan_over_consecutive_calls(reference_kernel, full_float32_matmuls):
    models = {
        impl: LSTMLanguageModel(VOCAB, LAYERS, MODEL_HIDDEN, init_scale=0.3, impl=impl) for impl in ("scan", "cudnn")
    }
    rng = np.random.default_rng(5)
    tokens = rng.integers(0, VOCAB, size=(2, 3, 5)).astype(np.int32)  # two consecutive batches
    init = {impl: jax.jit(model.init)(jax.random.PRNGKey(0), tokens[0]) for impl, model in models.items()}
    jax.tree.map(np.testing.assert_array_equal, init["cudnn"], init["scan"])  # same parameters, same carry
    variables = init["scan"]
    params = variables["params"]
    assert "carry" in variables
    carry0 = jax.tree.map(lambda a: jnp.asarray(rng.normal(size=a.shape), jnp.float32), variables["carry"])

    results = {}
    for impl, model in models.items():
        apply = jax.jit(functools.partial(model.apply, mutable=("carry",)))
        first, state = apply({"params": params, "carry": carry0}, tokens[0])
        second, state = apply({"params": params, **state}, tokens[1])
        fresh = jax.jit(model.apply)({"params": params}, tokens[1])  # no carry collection: zeros
        results[impl] = (first, second, fresh, state["carry"])

    for got, want in zip(results["cudnn"], results["scan"], strict=True):
        jax.tree.map(lambda g, w: np.testing.assert_allclose(g, w, **TOL), got, want)
    first, second, fresh, carry = results["cudnn"]
    assert first.shape == (3, 5, VOCAB) and first.dtype == jnp.float32
    assert jax.tree.map(lambda a: (a.shape, a.dtype), carry) == jax.tree.map(lambda a: (a.shape, a.dtype), carry0)
    assert np.abs(np.asarray(second) - np.asarray(fresh)).max() > 1e-2  # the carried state was used


def test_cudnn_impl_without_a_gpu_or_hook_and_bad_settings_raise():
    x = jnp.zeros((2, 3, 4))
    layer = LSTMLayer(5, impl="cudnn")
    if jax.default_backend() != "gpu":
        with pytest.raises(RuntimeError, match="NVIDIA GPU"):
            jax.eval_shape(layer.init, jax.random.PRNGKey(0), x)
    with pytest.raises(ValueError, match="impl"):
        jax.eval_shape(LSTMLayer(5, impl="fused").init, jax.random.PRNGKey(0), x)
    with pytest.raises(ValueError, match="float32"):
        lstm_cudnn(x, jnp.zeros((4, 4, 5)), jnp.zeros((5, 4, 5)), jnp.zeros((4, 5)), *jnp.zeros((2, 2, 5)), jnp.float64)


# ---------------------------------------------------------------------------------------------
# (d) The real cuDNN kernel (GPU only)


@pytest.mark.skipif(jax.default_backend() != "gpu", reason="jax.experimental.rnn.lstm needs an NVIDIA GPU")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_real_cudnn_kernel_matches_the_scan_path(dtype):
    """On a GPU: LSTMLayer with impl="cudnn" (rnn.lstm) against impl="scan", outputs, carry and gradients.

    float32 runs both at "highest" matmul precision (no TF32) and compares tightly; bfloat16 compares
    the scan path's bfloat16 products with cuDNN's float32/TF32 ones, so loosely.
    """
    assert lstm_mod._RNN_FN is None
    dtype = jnp.dtype(dtype)
    tol = {"rtol": 1e-4, "atol": 1e-4} if dtype == jnp.float32 else {"rtol": 0.0, "atol": 5e-2}
    batch, time, features, hidden = 4, 16, 24, 32
    x, w_x, w_h, b, h0, c0 = map(jnp.asarray, random_layer(6, batch, time, features, hidden))
    variables = {"params": {"w_x": w_x, "w_h": w_h, "b": b}, "carry": {"h": h0, "c": c0}}
    rng = np.random.default_rng(7)
    w_out = jnp.asarray(rng.normal(size=(batch, time, hidden)), jnp.float32)

    def run(impl):
        layer = LSTMLayer(hidden, dtype=dtype, impl=impl)

        def loss(params, x):
            out, state = layer.apply({**variables, "params": params}, x.astype(dtype), mutable=("carry",))
            h, c = state["carry"]["h"], state["carry"]["c"]
            return jnp.sum(out.astype(jnp.float32) * w_out) + jnp.sum(h) + jnp.sum(c), (out, state["carry"])

        (_, aux), grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1), has_aux=True))(variables["params"], x)
        return aux, grads

    # float32: no TF32 on either side; bfloat16: cuDNN allows TF32 itself, the scan path multiplies in bfloat16
    precision = jax.default_matmul_precision("highest") if dtype == jnp.float32 else contextlib.nullcontext()
    with precision:
        (out, carry), grads = run("cudnn")
        (want_out, want_carry), want_grads = run("scan")
    assert out.dtype == dtype and carry["h"].dtype == carry["c"].dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(out, np.float32), np.asarray(want_out, np.float32), **tol)
    for name in ("h", "c"):
        np.testing.assert_allclose(carry[name], want_carry[name], **tol, err_msg=name)
    grad_rtol = 1e-4 if dtype == jnp.float32 else 5e-2  # relative error of each whole gradient
    flat_got, flat_want = jax.tree_util.tree_flatten_with_path(grads)[0], jax.tree.leaves(want_grads)
    for (path, g), w in zip(flat_got, flat_want, strict=True):
        g, w = np.asarray(g, np.float64), np.asarray(w, np.float64)
        assert np.linalg.norm(g - w) <= grad_rtol * np.linalg.norm(w), jax.tree_util.keystr(path)

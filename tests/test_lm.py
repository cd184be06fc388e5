"""Language models against independent references: the LSTM against plain numpy, its hidden state
carried across calls and training steps, and greedy sampling with the carried state against full
forward passes. The Transformer's are in test_transformer.py (which uses the helpers here), the
text corpora and batching in test_text_data.py.
"""

from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxnet.data.text import eval_batches
from jaxnet.models import lstm as lstm_lib
from jaxnet.models.lstm import LSTMLanguageModel, LSTMLayer, lstm_scan, output_product
from jaxnet.sample import generate
from jaxnet.train import state as state_lib
from jaxnet.train.step import make_eval_step, make_train_step

TOL = {"rtol": 1e-5, "atol": 1e-5}


@functools.cache
def jitted(model: nn.Module, **kwargs):
    """``model.apply`` compiled once per model and keyword arguments (eager Flax is slow on a CPU)."""
    return jax.jit(functools.partial(model.apply, **kwargs))


def param_shapes(model: nn.Module, *args, **kwargs):
    """Shapes of the model's parameters, without running its initialisers (their compilation is slow)."""
    shapes = jax.eval_shape(functools.partial(model.init, **kwargs), jax.random.PRNGKey(0), *args)
    return jax.tree.map(lambda s: s.shape, nn.unbox(shapes)["params"])


def random_params(model: nn.Module, *args, seed: int = 0, uniform: float = 0.0, std: float = 0.02, **kwargs):
    """Random float32 parameters for ``model``: uniform in [-uniform, uniform] when given (the
    LSTM's init_scale scheme), else N(0, std) with LayerNorm scales 1 and biases 0 (the GPT init)."""
    rng = np.random.default_rng(seed)

    def draw(path, shape) -> np.ndarray:
        name = path[-1].key
        if uniform:
            return rng.uniform(-uniform, uniform, size=shape).astype(np.float32)
        if name in ("scale", "bias"):
            return np.full(shape, 1.0 if name == "scale" else 0.0, np.float32)
        return rng.normal(0.0, std, size=shape).astype(np.float32)

    shapes = param_shapes(model, *args, **kwargs)
    return jax.tree_util.tree_map_with_path(draw, shapes, is_leaf=lambda s: isinstance(s, tuple))


def np_tree(tree):
    return jax.tree.map(lambda a: np.asarray(a, np.float64), nn.unbox(tree))


def scaled(params, factor: float):
    return jax.tree.map(lambda p: p * factor, params)


# ---------------------------------------------------------------------------------------------
# Plain numpy references (float64)


def np_sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def np_lstm(x, w_x, w_h, b, h, c):
    """The LSTM equations step by step: z = x W_x + h W_h + b split into gates i, f, g, o.

    ``x`` (batch, time, in), ``w_x`` (in, 4, hidden), ``w_h`` (hidden, 4, hidden), ``b`` (4, hidden).
    Returns the outputs (batch, time, hidden) and the final h, c.
    """
    n_in, _, hidden = w_x.shape
    wx, wh, bias = w_x.reshape(n_in, 4 * hidden), w_h.reshape(hidden, 4 * hidden), b.reshape(4 * hidden)
    outputs = []
    for t in range(x.shape[1]):
        z = x[:, t] @ wx + h @ wh + bias
        i, f, g, o = np.split(z, 4, axis=1)
        c = np_sigmoid(f) * c + np_sigmoid(i) * np.tanh(g)
        h = np_sigmoid(o) * np.tanh(c)
        outputs.append(h)
    return np.stack(outputs, axis=1), h, c


def np_lstm_lm(params, tokens, carry, layers: int, tied: bool):
    """Embedding lookup, ``layers`` LSTM layers from ``carry``, output projection; logits and final carry."""
    p = np_tree(params)
    x = p["embed"]["embedding"][np.asarray(tokens)]
    final = {}
    for i in range(layers):
        name = f"lstm_{i}"
        layer = p[name]
        x, h, c = np_lstm(x, layer["w_x"], layer["w_h"], layer["b"], carry[name]["h"], carry[name]["c"])
        final[name] = {"h": h, "c": c}
    logits = x @ p["embed"]["embedding"].T if tied else x @ p["output"]["kernel"] + p["output"]["bias"]
    return logits, final


def np_softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def np_cross_entropy(logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    logits = np.asarray(logits, np.float64)
    m = logits.max(-1, keepdims=True)
    logz = (m + np.log(np.exp(logits - m).sum(-1, keepdims=True)))[..., 0]
    return logz - np.take_along_axis(logits, np.asarray(targets)[..., None], -1)[..., 0]


# ---------------------------------------------------------------------------------------------
# Shared tiny models

VOCAB, HIDDEN, LAYERS = 23, 12, 2


def lstm_model(tied: bool = False) -> LSTMLanguageModel:
    return LSTMLanguageModel(VOCAB, layers=LAYERS, hidden=HIDDEN, init_scale=0.5, tie_embeddings=tied)


@pytest.fixture(scope="module")
def lstm_params():
    return {
        tied: random_params(lstm_model(tied), jnp.zeros((1, 1), jnp.int32), seed=1, uniform=0.5)
        for tied in (False, True)
    }


def random_carry(batch: int, seed: int, scale: float = 0.7) -> dict:
    rng = np.random.default_rng(seed)
    return {
        f"lstm_{i}": {k: (scale * rng.normal(size=(batch, HIDDEN))).astype(np.float32) for k in ("h", "c")}
        for i in range(LAYERS)
    }


def zero_carry(batch: int) -> dict:
    return {f"lstm_{i}": {k: np.zeros((batch, HIDDEN), np.float32) for k in ("h", "c")} for i in range(LAYERS)}


def random_tokens(shape, seed: int, vocab: int = VOCAB) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, vocab, size=shape).astype(np.int32)


def assert_tree_close(got, want, **tol) -> None:
    jax.tree.map(lambda g, w: np.testing.assert_allclose(np.asarray(g), np.asarray(w), **tol), got, want)


def max_tree_diff(a, b) -> float:
    return max(jax.tree.leaves(jax.tree.map(lambda x, y: float(np.abs(np.asarray(x) - np.asarray(y)).max()), a, b)))


# ---------------------------------------------------------------------------------------------
# 1. LSTM against numpy


def test_lstm_scan_matches_the_numpy_recurrence():
    rng = np.random.default_rng(0)
    batch, time, hidden = 3, 6, 5
    x_proj = rng.normal(size=(batch, time, 4, hidden)).astype(np.float32)
    w_h = (0.6 * rng.normal(size=(hidden, 4, hidden))).astype(np.float32)
    h0, c0 = rng.normal(size=(2, batch, hidden)).astype(np.float32)
    outputs, (h, c) = lstm_scan(jnp.asarray(x_proj), jnp.asarray(w_h), jnp.asarray(h0), jnp.asarray(c0))
    # x_proj is the input half already: feed it through an identity input matrix and no bias
    identity = np.eye(4 * hidden).reshape(4 * hidden, 4, hidden)
    want, want_h, want_c = np_lstm(
        x_proj.reshape(batch, time, 4 * hidden).astype(np.float64), identity, w_h, np.zeros((4, hidden)), h0, c0
    )
    assert outputs.shape == (batch, time, hidden)
    np.testing.assert_allclose(outputs, want, **TOL)
    np.testing.assert_allclose(h, want_h, **TOL)
    np.testing.assert_allclose(c, want_c, **TOL)
    np.testing.assert_allclose(outputs[:, -1], h, **TOL)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_lstm_scans_written_out_gradients_equal_jaxs_differentiation_of_the_loop(dtype):
    """lstm_scan's backward pass is written by hand; the reference here is JAX differentiating a
    plain forward loop of the LSTM equations (written in this test), with gradients flowing in
    through every output and through the final ``(h, c)``."""
    rng = np.random.default_rng(2)
    batch, time, hidden = 3, 7, 5
    x_proj, w_h = rng.normal(size=(batch, time, 4, hidden)), 0.6 * rng.normal(size=(hidden, 4, hidden))
    h0, c0 = rng.normal(size=(2, batch, hidden))
    weights = [rng.normal(size=s) for s in ((batch, time, hidden), (batch, hidden), (batch, hidden))]
    compute = jnp.dtype(dtype)

    def plain(x_proj, w_h, h0, c0):
        h, c, outputs = h0, c0, []
        for t in range(time):
            z = x_proj[:, t] + jnp.einsum(
                "bh,hgk->bgk", h.astype(compute), w_h.astype(compute), preferred_element_type=jnp.float32
            )
            c = jax.nn.sigmoid(z[:, 1]) * c + jax.nn.sigmoid(z[:, 0]) * jnp.tanh(z[:, 2])
            h = jax.nn.sigmoid(z[:, 3]) * jnp.tanh(c)
            outputs.append(h)
        return jnp.stack(outputs, 1), (h, c)

    def loss(fn, *args):
        outputs, (h, c) = fn(*args)
        return jnp.sum(outputs * weights[0]) + jnp.sum(h * weights[1]) + jnp.sum(jnp.sin(c) * weights[2])

    args = [jnp.asarray(a, jnp.float32) for a in (x_proj, w_h, h0, c0)]
    argnums = (1, 2, 3, 4)  # the arrays, after the function
    value, grads = jax.value_and_grad(loss, argnums)(lambda *a: lstm_scan(*a, dtype=compute), *args)
    want_value, want_grads = jax.value_and_grad(loss, argnums)(plain, *args)
    tol = {"rtol": 1e-5, "atol": 1e-5} if dtype == "float32" else {"rtol": 0.03, "atol": 0.03}
    np.testing.assert_allclose(value, want_value, **tol)
    for got, want in zip(grads, want_grads, strict=True):
        assert got.dtype == want.dtype == jnp.float32
        np.testing.assert_allclose(got, want, **tol)


def test_lstm_layer_matches_numpy_from_zero_and_from_a_given_carry():
    layer = LSTMLayer(hidden=7, init_scale=0.5)
    rng = np.random.default_rng(1)
    x = rng.normal(size=(2, 5, 4)).astype(np.float32)
    params = random_params(layer, x, uniform=0.5)
    p = np_tree(params)
    assert p["w_x"].shape == (4, 4, 7) and p["w_h"].shape == (7, 4, 7) and p["b"].shape == (4, 7)
    assert np.abs(p["b"]).max() > 0.1  # init_scale gives non-trivial biases

    want0, _, _ = np_lstm(x.astype(np.float64), p["w_x"], p["w_h"], p["b"], np.zeros((2, 7)), np.zeros((2, 7)))
    np.testing.assert_allclose(jitted(layer)({"params": params}, x), want0, **TOL)

    h0, c0 = rng.normal(size=(2, 2, 7)).astype(np.float32)
    out, new = jitted(layer, mutable=("carry",))({"params": params, "carry": {"h": h0, "c": c0}}, x)
    want, want_h, want_c = np_lstm(x.astype(np.float64), p["w_x"], p["w_h"], p["b"], h0, c0)
    np.testing.assert_allclose(out, want, **TOL)
    np.testing.assert_allclose(new["carry"]["h"], want_h, **TOL)
    np.testing.assert_allclose(new["carry"]["c"], want_c, **TOL)
    assert np.abs(want - want0).max() > 1e-2  # the carry matters, so the comparison can fail


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_lstm_language_model_logits_and_final_carry_match_numpy(lstm_params, tied):
    model, params = lstm_model(tied), lstm_params[tied]
    assert ("output" in params) != tied
    tokens = random_tokens((3, 7), seed=2)
    carry = random_carry(3, seed=3)
    logits, new = jitted(model, mutable=("carry",))({"params": params, "carry": carry}, tokens)
    want, want_carry = np_lstm_lm(params, tokens, carry, LAYERS, tied)
    assert logits.shape == (3, 7, VOCAB) and logits.dtype == jnp.float32
    np.testing.assert_allclose(logits, want, **TOL)
    assert_tree_close(new["carry"], want_carry, **TOL)

    # without a carry collection the model starts from zeros
    want_zero, _ = np_lstm_lm(params, tokens, zero_carry(3), LAYERS, tied)
    np.testing.assert_allclose(jitted(model)({"params": params}, tokens), want_zero, **TOL)
    assert np.abs(want_zero - want).max() > 1e-2


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_output_products_gradients_match_numpy(dtype):
    """output_product's backward pass is written by hand (the kernel's gradient in the kernel's
    order); the reference is numpy in float64: d x = g kernel^T, d kernel = x^T g over the leading axes."""
    rng = np.random.default_rng(5)
    x, kernel, weight = rng.normal(size=(3, 7, 6)), rng.normal(size=(6, 11)), rng.normal(size=(3, 7, 11))
    compute = jnp.dtype(dtype)

    def loss(x, kernel):
        return jnp.sum(jnp.sin(output_product(x.astype(compute), kernel.astype(compute)).astype(jnp.float32)) * weight)

    value, (dx, dk) = jax.value_and_grad(loss, (0, 1))(jnp.asarray(x, jnp.float32), jnp.asarray(kernel, jnp.float32))
    logits = x @ kernel
    g = np.cos(logits) * weight
    tol = {"rtol": 1e-5, "atol": 1e-5} if dtype == "float32" else {"rtol": 0.05, "atol": 0.3}
    np.testing.assert_allclose(value, np.sum(np.sin(logits) * weight), **tol)
    np.testing.assert_allclose(dx, g @ kernel.T, **tol)
    np.testing.assert_allclose(dk, np.einsum("bth,btv->hv", x, g), **tol)
    # the cotangents come back in the operands' own dtype
    _, pullback = jax.vjp(output_product, jnp.asarray(x, compute), jnp.asarray(kernel, compute))
    assert [c.dtype for c in pullback(jnp.ones((3, 7, 11), compute))] == [compute, compute]


def test_lstm_language_models_gradients_equal_those_of_jaxs_own_output_product(lstm_params, monkeypatch):
    """The untied model's output layer goes through output_product; every parameter's gradient of
    a loss equals the one with the layer's plain ``dot_general`` differentiated by JAX."""
    model, params = lstm_model(False), lstm_params[False]
    tokens, targets = random_tokens((3, 7), seed=6), random_tokens((3, 7), seed=7)

    def loss(params):
        logits = model.apply({"params": params}, tokens)
        return optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()

    # the layer's own backward pass makes the kernel's gradient in (hidden, vocab) order with one
    # product; JAX's makes it (vocab, hidden) and transposes it
    ours, jaxs = f"f32[{HIDDEN},{VOCAB}] = dot_general", f"f32[{VOCAB},{HIDDEN}] = dot_general"
    got = jax.jit(jax.grad(loss))(params)
    program = str(jax.make_jaxpr(jax.grad(loss))(params))
    assert ours in program and jaxs not in program
    monkeypatch.setattr(lstm_lib, "_output_dot_general", jax.lax.dot_general)
    program = str(jax.make_jaxpr(jax.grad(loss))(params))
    assert jaxs in program and ours not in program
    want = jax.jit(jax.grad(loss))(params)
    assert_tree_close(got, want, **TOL)
    assert np.abs(np.asarray(got["output"]["kernel"])).max() > 1e-3


# ---------------------------------------------------------------------------------------------
# 2. Carried state across calls and training steps


def test_lstm_split_calls_with_carried_state_equal_one_call(lstm_params):
    model, params = lstm_model(), lstm_params[False]
    tokens = random_tokens((3, 11), seed=4)
    apply = jitted(model, mutable=("carry",))
    whole, whole_carry = apply({"params": params, "carry": zero_carry(3)}, tokens)
    first, carry = apply({"params": params, "carry": zero_carry(3)}, tokens[:, :4])
    second, carry = apply({"params": params, **carry}, tokens[:, 4:])
    np.testing.assert_allclose(np.concatenate([first, second], axis=1), whole, **TOL)
    assert_tree_close(carry, whole_carry, **TOL)
    # the second half differs when started from zeros instead
    fresh = jitted(model)({"params": params}, tokens[:, 4:])
    assert np.abs(np.asarray(fresh) - np.asarray(whole[:, 4:])).max() > 1e-2


@pytest.fixture(scope="module")
def lstm_train_state():
    """A fresh TrainState for batches of 3 rows, with plain SGD."""
    model = LSTMLanguageModel(VOCAB, layers=LAYERS, hidden=HIDDEN, init_scale=0.3)
    return model, state_lib.create(model, optax.sgd(0.5), sample_input=jnp.zeros((3, 1), jnp.int32), seed=0)


def test_train_step_stores_the_final_carry_of_each_batch_and_resets_on_reset(lstm_train_state):
    batch_size, seq_len = 3, 6
    model, state = lstm_train_state
    assert jax.tree.map(np.shape, state.model_state["carry"]) == jax.tree.map(np.shape, zero_carry(batch_size))
    for leaf in jax.tree.leaves(state.params):  # init_scale 0.3: uniform in [-0.3, 0.3], biases included
        assert np.abs(leaf).max() <= 0.3 and np.abs(leaf).max() > 0.2
    train_step = jax.jit(make_train_step(model, optax.sgd(0.5)))
    apply_fn = jitted(model, mutable=("carry",))
    apply = lambda params, carry, tokens: apply_fn({"params": params, "carry": carry}, tokens)

    for k, reset in enumerate([1, 0, 0, 1, 0]):
        tokens = random_tokens((batch_size, seq_len + 1), seed=10 + k)
        batch = {"tokens": tokens[:, :-1], "targets": tokens[:, 1:], "reset": np.asarray(reset, np.int32)}
        params, carry = state.params, state.model_state["carry"]
        state, metrics = train_step(state, batch)

        logits_prev, continued = apply(params, carry, batch["tokens"])
        logits_zero, restarted = apply(params, zero_carry(batch_size), batch["tokens"])
        expected, logits = (restarted, logits_zero) if reset else (continued, logits_prev)
        assert_tree_close(state.model_state["carry"], expected["carry"], rtol=1e-5, atol=1e-6)
        loss = np_cross_entropy(np.asarray(logits), batch["targets"]).mean()
        np.testing.assert_allclose(metrics["loss"], loss, rtol=1e-5)
        if k > 0:  # a non-zero carry came in: continuing and restarting differ, so the check can fail
            assert max_tree_diff(continued, restarted) > 1e-3
        # the stored carry was computed with the parameters before this step's update
        _, with_new_params = apply(state.params, zero_carry(batch_size) if reset else carry, batch["tokens"])
        assert max_tree_diff(with_new_params["carry"], expected["carry"]) > 1e-5
    assert int(state.step) == 5


def test_a_fresh_train_state_starts_from_a_zero_carry(lstm_train_state):
    _, state = lstm_train_state
    assert_tree_close(state.model_state["carry"], zero_carry(3), rtol=0, atol=0)


def test_stream_evaluation_with_carried_state_equals_one_pass_over_each_stream(lstm_params, lstm_train_state):
    model, params = lstm_model(), lstm_params[False]
    tokens = random_tokens(53, seed=5)
    batch_size, seq_len = 3, 5
    state = lstm_train_state[1].replace(params=params)
    eval_step = jax.jit(make_eval_step(model))
    carry = {"carry": zero_carry(batch_size)}  # as the training loop starts an evaluation
    batches = list(eval_batches(tokens, batch_size=batch_size, seq_len=seq_len, mode="stream"))
    totals = {"loss": 0.0, "accuracy": 0.0, "count": 0.0}
    for batch in batches:
        sums, carry = eval_step(state, batch, carry)
        totals = {k: totals[k] + float(sums[k]) for k in totals}
    # reference: each stream (row) in one call from zeros, then the masked sums
    x = np.concatenate([b["tokens"] for b in batches], axis=1)
    y = np.concatenate([b["targets"] for b in batches], axis=1)
    m = np.concatenate([b["mask"] for b in batches], axis=1)
    logits, _ = np_lstm_lm(params, x, zero_carry(batch_size), LAYERS, tied=False)
    assert totals["count"] == len(tokens) - 1
    np.testing.assert_allclose(totals["loss"], (np_cross_entropy(logits, y) * m).sum(), rtol=1e-5)
    # per-row accuracies weighted by each row's token count add up to the number of hits
    np.testing.assert_allclose(totals["accuracy"], ((logits.argmax(-1) == y) * m).sum(), rtol=1e-6)


# ---------------------------------------------------------------------------------------------
# 5. Sampling


def greedy_reference(model, params, prompt, num_tokens: int, context: int | None) -> list[int]:
    """Argmax of a full forward pass over the text so far; with a context, the window restarts on
    the last context // 2 tokens when it would outgrow the context (as jaxnet.sample documents).

    The text is zero-padded to one fixed length (one compilation); the models are causal, so the
    padding after the last token does not change its logits (checked in test_transformer.py).
    """
    text, start = list(prompt), 0
    length = context if context is not None else len(prompt) + num_tokens
    for _ in range(num_tokens):
        if context is not None and len(text) - start > context:
            start = len(text) - context // 2
        window = text[start:]
        buffer = np.zeros((1, length), np.int32)
        buffer[0, : len(window)] = window
        logits = np.asarray(jitted(model)({"params": params}, buffer))
        text.append(int(np.argmax(logits[0, len(window) - 1])))
    return text[len(prompt) :]


def test_lstm_greedy_generation_with_carried_state_equals_full_forward_greedy(lstm_params):
    model, params = lstm_model(), scaled(lstm_params[False], 3.0)
    prompt = np.array([1, 4, 8, 2], np.int32)
    want = greedy_reference(model, params, prompt, 12, None)
    assert len(set(want)) > 1
    assert generate(model, params, prompt, 12, temperature=0.0).tolist() == want

"""ConvNet and ResNet: shapes, dtypes, a numpy reference forward pass, BatchNorm and dropout."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxnet.models import ConvNetConfig, ResNetConfig, build
from jaxnet.models.cnn import ConvNet, ResNet

BN_EPS = 1e-5  # flax.linen.BatchNorm's default epsilon


def images(shape: tuple[int, ...], seed: int = 0, loc: float = 0.0, scale: float = 1.0) -> np.ndarray:
    return np.random.default_rng(seed).normal(loc, scale, size=shape).astype(np.float32)


def dtypes(tree) -> set:
    return {leaf.dtype for leaf in jax.tree.leaves(tree)}


# ---------------------------------------------------------------------------------------------
# Plain numpy reference layers (float64)


def np_conv3x3_same(x: np.ndarray, kernel: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
    """Cross-correlation with a 3x3 kernel (kh, kw, in, out), zero padding 1 on every side."""
    n, h, w, _ = x.shape
    padded = np.pad(x.astype(np.float64), ((0, 0), (1, 1), (1, 1), (0, 0)))
    out = np.zeros((n, h, w, kernel.shape[-1]))
    for i in range(h):
        for j in range(w):
            window = padded[:, i : i + 3, j : j + 3, :]  # (n, 3, 3, in)
            out[:, i, j, :] = np.einsum("nabc,abco->no", window, kernel.astype(np.float64))
    return out if bias is None else out + bias


def np_maxpool2(x: np.ndarray) -> np.ndarray:
    n, h, w, c = x.shape
    out = np.empty((n, h // 2, w // 2, c))
    for i in range(h // 2):
        for j in range(w // 2):
            out[:, i, j, :] = x[:, 2 * i : 2 * i + 2, 2 * j : 2 * j + 2, :].max(axis=(1, 2))
    return out


def np_relu(x: np.ndarray) -> np.ndarray:
    return np.maximum(x, 0.0)


def np_convnet(params: dict, x: np.ndarray, num_layers: int) -> np.ndarray:
    p = jax.tree.map(np.asarray, params)
    for layer in range(num_layers):
        conv = p[f"Conv_{layer}"]
        x = np_maxpool2(np_relu(np_conv3x3_same(x, conv["kernel"], conv["bias"])))
    x = x.reshape(len(x), -1)
    x = np_relu(x @ p["Dense_0"]["kernel"] + p["Dense_0"]["bias"])
    return x @ p["Dense_1"]["kernel"] + p["Dense_1"]["bias"]


# ---------------------------------------------------------------------------------------------
# Shared tiny models (initialising compiles the random initialisers, the slow part on a CPU)

CONVNET = ConvNet(10, features=(2, 3), hidden=5)
RESNET = ResNet(10, features=(4, 8), blocks=(1, 1))


@pytest.fixture(scope="module")
def convnet_variables():
    return nn.unbox(CONVNET.init(jax.random.PRNGKey(0), jnp.zeros((1, 8, 8, 1))))


@pytest.fixture(scope="module")
def resnet_variables():
    return nn.unbox(RESNET.init(jax.random.PRNGKey(0), jnp.zeros((1, 8, 8, 3))))


# ---------------------------------------------------------------------------------------------
# Shapes and dtypes


@pytest.mark.parametrize("name", ["convnet", "resnet"])
def test_models_give_float32_logits_and_keep_float32_params_when_computing_in_bfloat16(
    name, convnet_variables, resnet_variables
):
    model, variables = {"convnet": (CONVNET, convnet_variables), "resnet": (RESNET, resnet_variables)}[name]
    x = images((3, 8, 8, 1 if name == "convnet" else 3))
    assert dtypes(variables) == {jnp.dtype(jnp.float32)}
    logits = model.apply(variables, x)
    assert logits.shape == (3, 10) and logits.dtype == jnp.float32

    bf16 = model.clone(dtype=jnp.bfloat16, param_dtype=jnp.float32)
    bf16_shapes = nn.unbox(jax.eval_shape(bf16.init, jax.random.PRNGKey(0), x))
    assert jax.tree.map(lambda a: (a.shape, a.dtype), bf16_shapes) == jax.tree.map(
        lambda a: (a.shape, a.dtype), variables
    )
    bf16_logits = bf16.apply(variables, x)
    assert bf16_logits.shape == (3, 10) and bf16_logits.dtype == jnp.float32
    # same parameters, so bf16 compute gives nearly the same logits, but not bit-identical ones
    scale = float(jnp.abs(logits).max())
    assert scale > 0.01
    np.testing.assert_allclose(bf16_logits, logits, atol=0.05 * scale + 1e-3)
    assert not np.array_equal(np.asarray(bf16_logits), np.asarray(logits))


def test_bfloat16_param_dtype_stores_bfloat16_params(convnet_variables):
    model = CONVNET.clone(param_dtype=jnp.bfloat16)
    shapes = nn.unbox(jax.eval_shape(model.init, jax.random.PRNGKey(0), jnp.zeros((1, 8, 8, 1))))
    assert dtypes(shapes["params"]) == {jnp.dtype(jnp.bfloat16)}
    bf16_variables = jax.tree.map(lambda v: v.astype(jnp.bfloat16), convnet_variables)
    assert model.apply(bf16_variables, images((2, 8, 8, 1))).dtype == jnp.float32


# ---------------------------------------------------------------------------------------------
# ConvNet against the numpy reference


def test_convnet_forward_matches_a_numpy_reference(convnet_variables):
    model = CONVNET
    x = images((2, 8, 8, 1), seed=1)
    params = convnet_variables["params"]
    assert jax.tree.map(np.shape, params) == {
        "Conv_0": {"bias": (2,), "kernel": (3, 3, 1, 2)},
        "Conv_1": {"bias": (3,), "kernel": (3, 3, 2, 3)},
        "Dense_0": {"bias": (5,), "kernel": (12, 5)},  # 8x8 -> 4x4 -> 2x2, times 3 channels
        "Dense_1": {"bias": (10,), "kernel": (5, 10)},
    }
    # the biases start at zero; give them values so the reference checks they are used
    rng = np.random.default_rng(2)
    params = jax.tree_util.tree_map_with_path(
        lambda path, v: jnp.asarray(rng.normal(0, 0.3, v.shape), jnp.float32) if path[-1].key == "bias" else v,
        params,
    )
    logits = model.apply({"params": params}, x)
    expected = np_convnet(params, x, num_layers=2)
    assert np.abs(expected).max() > 0.1  # a non-trivial output
    np.testing.assert_allclose(np.asarray(logits), expected, rtol=1e-4, atol=1e-4)
    # the reference is sensitive to the layout it checks: flipping the first kernel changes the result
    flipped = jax.tree.map(lambda v: v, params)
    flipped["Conv_0"]["kernel"] = jnp.flip(params["Conv_0"]["kernel"], axis=(0, 1))
    assert not np.allclose(np.asarray(model.apply({"params": flipped}, x)), expected, atol=1e-3)


def test_convnet_dropout_is_random_in_train_mode_and_off_in_eval_mode(convnet_variables):
    model = CONVNET.clone(dropout=0.5)
    x = images((4, 8, 8, 1), seed=3)
    variables = convnet_variables
    k1, k2 = jax.random.PRNGKey(1), jax.random.PRNGKey(2)
    train1 = model.apply(variables, x, train=True, rngs={"dropout": k1})
    train1_again = model.apply(variables, x, train=True, rngs={"dropout": k1})
    train2 = model.apply(variables, x, train=True, rngs={"dropout": k2})
    np.testing.assert_array_equal(train1, train1_again)
    assert float(jnp.abs(train1 - train2).max()) > 1e-3
    eval1 = model.apply(variables, x, train=False, rngs={"dropout": k1})
    eval2 = model.apply(variables, x, train=False, rngs={"dropout": k2})
    eval_no_rng = model.apply(variables, x, train=False)
    np.testing.assert_array_equal(eval1, eval2)
    np.testing.assert_array_equal(eval1, eval_no_rng)
    assert float(jnp.abs(train1 - eval1).max()) > 1e-3
    # eval mode is exactly the dropout-free network
    no_dropout = model.clone(dropout=0.0).apply(variables, x, train=True)
    np.testing.assert_allclose(eval1, no_dropout, rtol=1e-6, atol=1e-6)


# ---------------------------------------------------------------------------------------------
# ResNet BatchNorm


@pytest.fixture(scope="module")
def resnet_setup(resnet_variables):
    x = images((6, 8, 8, 3), seed=4, loc=2.0, scale=0.5)  # a known, non-zero mean and std
    return RESNET, x, resnet_variables


def test_resnet_train_mode_normalises_the_stem_over_the_batch_and_updates_stats_with_momentum_0_9(resnet_setup):
    model, x, variables = resnet_setup
    params = variables["params"]
    assert set(variables) == {"params", "batch_stats"}
    stats0 = variables["batch_stats"]["BatchNorm_0"]
    np.testing.assert_array_equal(stats0["mean"], np.zeros(4))
    np.testing.assert_array_equal(stats0["var"], np.ones(4))

    logits, mutated = model.apply(
        variables, x, train=True, mutable=["batch_stats", "intermediates"], capture_intermediates=True
    )
    updates, inter = mutated["batch_stats"], mutated["intermediates"]
    assert logits.shape == (6, 10)

    # the stem convolution, recomputed in numpy with the same kernel (no bias)
    conv = np_conv3x3_same(x, np.asarray(params["Conv_0"]["kernel"]))
    np.testing.assert_allclose(inter["Conv_0"]["__call__"][0], conv, rtol=1e-4, atol=1e-4)
    batch_mean, batch_var = conv.mean(axis=(0, 1, 2)), conv.var(axis=(0, 1, 2))
    assert np.abs(batch_mean).max() > 0.05  # the stem output really has a non-zero mean to track

    # the stem BatchNorm output is normalised per channel over (batch, height, width)
    normed = np.asarray(inter["BatchNorm_0"]["__call__"][0], np.float64)
    np.testing.assert_allclose(normed.mean(axis=(0, 1, 2)), np.zeros(4), atol=1e-5)
    np.testing.assert_allclose(normed.var(axis=(0, 1, 2)), batch_var / (batch_var + BN_EPS), rtol=1e-4)
    np.testing.assert_allclose(normed, (conv - batch_mean) / np.sqrt(batch_var + BN_EPS), rtol=1e-4, atol=1e-4)

    # first update from mean 0, var 1 with momentum 0.9
    new = updates["BatchNorm_0"]
    np.testing.assert_allclose(new["mean"], 0.1 * batch_mean, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(new["var"], 0.9 * 1.0 + 0.1 * batch_var, rtol=1e-5, atol=1e-6)
    # every BatchNorm in the network updated its statistics
    for path, leaf in jax.tree_util.tree_leaves_with_path(updates):
        before = variables["batch_stats"]
        for key in path:
            before = before[key.key]
        assert not np.allclose(leaf, before), jax.tree_util.keystr(path)


def test_resnet_running_mean_approaches_the_data_mean_geometrically(resnet_setup):
    model, x, variables = resnet_setup
    conv = np_conv3x3_same(x, np.asarray(variables["params"]["Conv_0"]["kernel"]))
    batch_mean, batch_var = conv.mean(axis=(0, 1, 2)), conv.var(axis=(0, 1, 2))
    state = variables
    for k in range(1, 4):
        _, updates = model.apply(state, x, train=True, mutable=["batch_stats"])
        state = {"params": variables["params"], **updates}
        stem = state["batch_stats"]["BatchNorm_0"]
        np.testing.assert_allclose(stem["mean"], (1 - 0.9**k) * batch_mean, rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(stem["var"], 0.9**k + (1 - 0.9**k) * batch_var, rtol=1e-4, atol=1e-6)


@pytest.fixture(scope="module")
def trained_resnet(resnet_setup):
    """The ResNet after a few train-mode steps, so its running statistics are far from (0, 1)."""
    model, x, variables = resnet_setup
    state = variables
    for _ in range(5):
        _, updates = model.apply(state, x, train=True, mutable=["batch_stats"])
        state = {"params": variables["params"], **updates}
    return model, x, state


def test_resnet_eval_mode_is_deterministic_and_normalises_with_running_statistics(trained_resnet):
    model, x, variables = trained_resnet
    out1 = model.apply(variables, x, train=False)
    out2 = model.apply(variables, x, train=False)
    np.testing.assert_array_equal(out1, out2)
    _, inter = model.apply(variables, x, train=False, capture_intermediates=True, mutable=["intermediates"])
    conv = np.asarray(inter["intermediates"]["Conv_0"]["__call__"][0], np.float64)
    normed = np.asarray(inter["intermediates"]["BatchNorm_0"]["__call__"][0], np.float64)
    stats = jax.tree.map(np.asarray, variables["batch_stats"]["BatchNorm_0"])
    bn = jax.tree.map(np.asarray, variables["params"]["BatchNorm_0"])
    expected = (conv - stats["mean"]) / np.sqrt(stats["var"] + BN_EPS) * bn["scale"] + bn["bias"]
    np.testing.assert_allclose(normed, expected, rtol=1e-4, atol=1e-4)
    # ... which is not the batch normalisation train mode does
    assert np.abs(normed.mean(axis=(0, 1, 2))).max() > 0.05
    # eval mode does not touch the statistics
    _, unchanged = model.apply(variables, x, train=False, mutable=["batch_stats"])
    for a, b in zip(jax.tree.leaves(unchanged), jax.tree.leaves(variables["batch_stats"]), strict=True):
        np.testing.assert_array_equal(a, b)


def test_resnet_train_and_eval_mode_give_different_outputs(trained_resnet):
    model, x, variables = trained_resnet
    train_out, _ = model.apply(variables, x, train=True, mutable=["batch_stats"])
    eval_out = model.apply(variables, x, train=False)
    assert float(jnp.abs(train_out - eval_out).max()) > 1e-3


def test_resnet_eval_mode_has_no_cross_example_leakage(trained_resnet):
    model, x, variables = trained_resnet
    perm = np.array([3, 0, 5, 1, 4, 2])
    out = np.asarray(model.apply(variables, x, train=False))
    permuted = np.asarray(model.apply(variables, x[perm], train=False))
    np.testing.assert_allclose(permuted, out[perm], rtol=1e-5, atol=1e-5)
    # one example alone gives the same logits as inside the batch
    alone = np.asarray(model.apply(variables, x[2:3], train=False))
    np.testing.assert_allclose(alone, out[2:3], rtol=1e-5, atol=1e-5)
    # whereas in train mode changing one example changes the others' outputs (batch statistics)
    changed = x.copy()
    changed[0] += 3.0
    train_a, _ = model.apply(variables, x, train=True, mutable=["batch_stats"])
    train_b, _ = model.apply(variables, changed, train=True, mutable=["batch_stats"])
    assert float(jnp.abs(train_a[1:] - train_b[1:]).max()) > 1e-4
    eval_b = np.asarray(model.apply(variables, changed, train=False))
    np.testing.assert_allclose(eval_b[1:], out[1:], rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------------------------
# Registry


def test_build_resnet_from_config_uses_its_features_and_blocks(resnet_variables):
    model = build(ResNetConfig(features=(4, 8), blocks=(1, 1)), 10)
    assert isinstance(model, ResNet)
    assert tuple(model.features) == (4, 8) and tuple(model.blocks) == (1, 1) and model.num_classes == 10
    x = images((2, 16, 16, 3), seed=6)
    params = nn.unbox(jax.eval_shape(model.init, jax.random.PRNGKey(0), x))["params"]
    assert sorted(k for k in params if k.startswith("ResidualBlock")) == ["ResidualBlock_0", "ResidualBlock_1"]
    assert params["ResidualBlock_1"]["Conv_0"]["kernel"].shape == (3, 3, 4, 8)
    assert params["ResidualBlock_1"]["Conv_2"]["kernel"].shape == (1, 1, 4, 8)  # the projection shortcut
    assert "Conv_2" not in params["ResidualBlock_0"]  # same shape: identity shortcut
    assert params["Dense_0"]["kernel"].shape == (8, 10)
    variables = resnet_variables  # the same structure, as initialised by an identical ResNet
    assert jax.tree.structure(params) == jax.tree.structure(variables["params"])
    logits, _ = model.apply(variables, x, train=True, mutable=["batch_stats"])
    assert logits.shape == (2, 10) and logits.dtype == jnp.float32
    assert bool(jnp.all(jnp.isfinite(logits)))
    convnet = build(ConvNetConfig(features=(2, 3), hidden=5, dropout=0.25), 10)
    assert isinstance(convnet, ConvNet) and convnet.dropout == 0.25 and tuple(convnet.features) == (2, 3)

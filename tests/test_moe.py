"""The mixture-of-experts MLP: its grouped matmul, its routing and output against a plain numpy
loop over experts, its load-balancing loss against transformers', capacity dropping, and expert
parallelism equal to one device."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxnet.errors import UserError
from jaxnet.models import TransformerConfig
from jaxnet.models.transformer import TransformerLanguageModel, TransformerSpec
from jaxnet.models.transformer.moe import MoE, grouped_matmul

SPEC = dict(vocab=40, context=8, layers=1, width=12, heads=2, mlp="swiglu", norm="rms", position="rotary")


def np_silu(x):
    return x / (1 + np.exp(-x))


def np_softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


@pytest.mark.parametrize("impl", ["ragged", "blocks"])
def test_the_grouped_matmul_multiplies_each_groups_rows_by_its_matrix(impl):
    r = np.random.default_rng(0)
    sizes = np.array([3, 0, 7, 1, 5])  # an empty group; 4 rows past the groups give zeros
    x = r.normal(size=(20, 6)).astype(np.float32)
    w = r.normal(size=(5, 6, 3)).astype(np.float32)
    want = np.zeros((20, 3), np.float32)
    start = 0
    for g, n in enumerate(sizes):
        want[start : start + n] = x[start : start + n] @ w[g]
        start += n
    got = grouped_matmul(jnp.asarray(x), jnp.asarray(w), jnp.asarray(sizes), impl)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def moe_reference(x, p, k, renorm, shared=None):
    """Each token through its top-k experts, one expert at a time, in numpy (float64)."""
    x = np.asarray(x, np.float64).reshape(-1, x.shape[-1])
    probs = np_softmax(x @ p["router"])
    out = np.zeros_like(x)
    for t in range(len(x)):
        top = np.argsort(-probs[t], kind="stable")[:k]
        weights = probs[t, top] / (probs[t, top].sum() if renorm else 1.0)
        for e, wgt in zip(top, weights, strict=True):
            out[t] += wgt * (np_silu(x[t] @ p["gate"][e]) * (x[t] @ p["up"][e])) @ p["down"][e]
    if shared is not None:
        out += (np_silu(x @ shared[0]) * (x @ shared[1])) @ shared[2]
    return out, probs


@pytest.mark.parametrize("renorm,shared", [(True, 0), (False, 1)])
def test_a_mixture_layer_equals_a_plain_loop_over_its_experts(renorm, shared):
    spec = TransformerSpec(
        **SPEC, mlp_pattern=("moe",), experts=4, experts_per_token=2, expert_hidden=5, router_renorm=renorm,
        shared_experts=shared,
    )  # fmt: skip
    layer = MoE(spec)
    h = jax.random.normal(jax.random.key(0), (2, 8, 12))
    params = nn.unbox(layer.init(jax.random.key(1), h))["params"]
    p = {k: np.asarray(v, np.float64) for k, v in params.items()}
    y, collected = layer.apply({"params": params}, h, mutable=["losses", "stats"])
    sh = (p["shared_gate"], p["shared_up"], p["shared_down"]) if shared else None
    want, probs = moe_reference(h, p, 2, renorm, sh)
    np.testing.assert_allclose(np.asarray(y).reshape(-1, 12), want, rtol=2e-5, atol=2e-5)
    # the load-balancing loss: experts * sum_e (tokens that chose e / tokens) * mean probability of e
    top = np.argsort(-probs, axis=-1, kind="stable")[:, :2]
    chose = np.stack([(top == e).any(-1) for e in range(4)], -1).mean(0)
    balance = 4 * np.sum(chose * probs.mean(0))
    assert float(collected["losses"]["router_balance"]) == pytest.approx(0.01 * balance, rel=1e-5)
    assert float(collected["stats"]["moe/block_0/load_max"]) == pytest.approx(4 * chose.max() / 2, rel=1e-6)


@pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="needs the reference extra")
def test_the_load_balancing_loss_is_mixtrals():
    import torch
    from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func

    spec = TransformerSpec(**SPEC, mlp_pattern=("moe",), experts=6, experts_per_token=2, router_aux_loss=1.0)
    layer = MoE(spec)
    h = jax.random.normal(jax.random.key(2), (3, 8, 12))
    params = nn.unbox(layer.init(jax.random.key(3), h))["params"]
    _, collected = layer.apply({"params": params}, h, mutable=["losses"])
    logits = np.asarray(h).reshape(-1, 12) @ np.asarray(params["router"])
    theirs = load_balancing_loss_func((torch.tensor(logits),), num_experts=6, top_k=2)
    assert float(collected["losses"]["router_balance"]) == pytest.approx(float(theirs), rel=1e-5)


def test_a_capacity_drops_an_experts_assignments_past_it_and_counts_them():
    common = dict(**SPEC, mlp_pattern=("moe",), experts=4, experts_per_token=2, expert_hidden=5)
    h = jax.random.normal(jax.random.key(4), (2, 8, 12))
    dropless = MoE(TransformerSpec(**common))
    params = nn.unbox(dropless.init(jax.random.key(5), h))["params"]
    full = dropless.apply({"params": params}, h)
    capped, collected = MoE(TransformerSpec(**common, capacity_factor=0.5)).apply(
        {"params": params}, h, mutable=["stats"]
    )
    # 16 tokens x 2 = 32 assignments, 8 an expert evenly: a capacity of 4 each keeps at most 16
    dropped = float(collected["stats"]["moe/block_0/dropped"])
    assert 0.5 <= dropped < 1.0
    changed = np.abs(np.asarray(capped) - np.asarray(full)).reshape(16, -1).max(-1) > 1e-6
    assert 0 < changed.sum() <= 16


def test_bad_mixture_settings_are_one_line_errors():
    with pytest.raises(UserError, match="model.experts_per_token=5 is more than model.experts=4"):
        TransformerConfig(mlp_pattern=("moe",), experts=4, experts_per_token=5).validate()
    with pytest.raises(UserError, match="moe layers but model.experts=0"):
        TransformerConfig(mlp_pattern=("moe",)).validate()


EXPERT_PARALLEL = textwrap.dedent(
    """
    import os
    os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
    import dataclasses
    import flax.linen as nn, jax, jax.numpy as jnp, numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P
    from jaxnet import parallel
    from jaxnet.config import MeshConfig
    from jaxnet.models.transformer import TransformerLanguageModel, TransformerSpec

    spec = TransformerSpec(vocab=40, context=8, layers=2, width=16, heads=2, mlp="swiglu", norm="rms",
                           position="rotary", mlp_pattern=("moe", "dense"), experts=4, experts_per_token=2,
                           expert_hidden=8, mlp_hidden=24, shared_experts=1, router_z_loss=1e-3)
    model = TransformerLanguageModel(spec)
    tokens = jax.random.randint(jax.random.key(0), (8, 8), 0, 40)
    params = nn.unbox(model.init(jax.random.key(1), tokens))["params"]

    def loss(params, tokens):
        out, extra = model.apply({"params": params}, tokens, mutable=["losses", "stats"])
        return jnp.mean(jax.nn.logsumexp(out, -1)) + sum(jax.tree.leaves(extra["losses"]))

    want, want_grads = jax.jit(jax.value_and_grad(loss))(params, tokens)  # one compile, not one an operation
    boxed = jax.eval_shape(lambda: model.init(jax.random.key(1), tokens))
    # a capacity no device can exceed (each expert at most every token once): the buffers drop nothing
    roomy = TransformerLanguageModel(dataclasses.replace(spec, capacity_factor=2.0))
    # expert beside FSDP, beside tensor, and beside data with the fixed buffers: each axis with the
    # expert axis once (each case is a compile of the whole step: the suite's budget pays for three)
    cases = [(model, (1, 2, 2, 1)), (model, (1, 1, 2, 2)), (roomy, (2, 1, 2, 1))]
    for model, sizes in cases:
        mesh = parallel.make_mesh(MeshConfig(**dict(zip(("data", "fsdp", "expert", "tensor"), sizes))))
        shardings = nn.logical_to_mesh_sharding(nn.get_partition_spec(boxed), mesh, parallel.RULES)["params"]
        step = jax.jit(parallel.under_rules(jax.value_and_grad(loss), mesh, parallel.RULES))
        split = NamedSharding(mesh, P(parallel.BATCH_AXES))
        got, grads = step(jax.device_put(params, shardings), jax.device_put(tokens, split))
        assert abs(float(got) - float(want)) < 1e-5, (sizes, float(got), float(want))
        for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(want_grads)):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6)
        if sizes[2] > 1:  # each device its experts
            assert grads["block_0"]["moe"]["gate"].sharding.spec[0] in ("expert", ("expert",))
    print("ok")
    """
)


def test_experts_split_over_devices_give_one_devices_loss_and_gradients():
    done = subprocess.run([sys.executable, "-c", EXPERT_PARALLEL], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]


def test_a_model_of_mixture_layers_trains_through_the_aux_loss_channel():
    spec = TransformerSpec(**SPEC, mlp_pattern=("moe",), experts=4, experts_per_token=2)
    model = TransformerLanguageModel(spec)
    tokens = jax.random.randint(jax.random.key(6), (2, 8), 0, 40)
    params = nn.unbox(model.init(jax.random.key(7), tokens))["params"]
    # evaluation: the model's outputs alone, no loss collected
    assert model.apply({"params": params}, tokens).shape == (2, 8, 40)
    assert set(params["block_0"]["moe"]) == {"router", "gate", "up", "down"}


def test_flops_and_active_parameters_count_the_routed_experts_only():
    from jaxnet.models.transformer import transformer_flops

    common = dict(vocab=40, context=8, layers=2, width=16, heads=2, mlp="swiglu", norm="rms", position="rotary")
    moe = TransformerSpec(**common, mlp_pattern=("moe",), experts=8, experts_per_token=2, expert_hidden=6)
    # 2 experts of 6 units a token: the products of one SwiGLU of 12 units, plus the router's 16 x 8
    dense = TransformerSpec(**common, mlp_hidden=12)
    tokens = 3 * 8
    assert transformer_flops(moe, batch=3) == transformer_flops(dense, batch=3) + 2 * 2 * tokens * 16 * 8
    cfg = TransformerConfig(**{k: v for k, v in common.items() if k not in ("vocab", "context")},
                            mlp_pattern=("moe",), experts=8, experts_per_token=2, expert_hidden=6)  # fmt: skip
    params = nn.unbox(TransformerLanguageModel(moe).init(jax.random.key(0), jnp.zeros((1, 8), jnp.int32)))["params"]
    total = sum(np.size(x) for x in jax.tree.leaves(params))
    experts = sum(np.size(params[f"block_{i}"]["moe"][k]) for i in range(2) for k in ("gate", "up", "down"))
    assert cfg.active_parameters(params) == total - experts + experts * 2 // 8


def test_a_runs_router_aux_loss_replaces_the_models_coefficient():
    from jaxnet import config
    from jaxnet.train.loop import Run

    cfg = config.load_experiment("moe_shakespeare:smoke", ["train.router_aux_loss=0.5", "data.seq_len=16"])
    assert cfg.model.router_aux_loss == 0.01 and Run(cfg).model.module.spec.router_aux_loss == 0.5

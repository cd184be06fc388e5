"""Context parallelism (``mesh.context``): a row's sequence split over devices gives the same numbers
as one device.

One subprocess on 8 simulated CPU devices, in float64 so that a real fault (a key seen that should
not be, a chunk out of place, a gradient summed twice) stands out by many orders of magnitude:

* the attention across devices (ring and all-gather) against a dense softmax(QK^T)V written here,
  for causal and bidirectional attention, packed rows' segments, a local window, grouped-query
  attention, blocks smaller than a device's chunk, and key/value heads fewer than the tensor
  devices;
* a Llama-shaped Transformer (grouped-query attention, Llama 3's rope scaling), its loss and
  gradients with ``mesh.context`` 1, 2, and 4 beside ``mesh.fsdp=2``, for plain rows and for packed
  rows whose examples cross the devices' chunk boundaries.

Each layout is a compilation, most of this test's time, so the cases are few and each checks much.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from conftest import cpu_env, fails

from jaxnet import config
from jaxnet.errors import UserError
from jaxnet.models.transformer import context

SCRIPT = r"""
import json
import jaxnet  # noqa: F401  (the CPU client's threads, before JAX starts)
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxnet import config, parallel
from jaxnet.data.text import from_text
from jaxnet.models.transformer import context
from jaxnet.train.step import make_grad_fn
from jaxnet.train.loop import Run

assert jax.device_count() == 8 and jax.config.read("jax_enable_x64")
out = {"attention": {}, "model": {}}
rng = np.random.default_rng(0)


def dense(q, k, v, segments, causal, window):
    # softmax(QK^T / sqrt(d))V with every mask spelled out, each query head on its key/value head
    b, n, heads, d = q.shape
    k, v = (jnp.repeat(a, heads // a.shape[2], axis=2) for a in (k, v))
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(d)
    i = np.arange(n)
    seen = np.ones((n, n), bool)
    if causal:
        seen &= i[None, :] <= i[:, None]
    if window:
        seen &= i[None, :] > i[:, None] - window
    seen = np.broadcast_to(seen, (b, 1, n, n))
    if segments is not None:
        seen = seen & (segments[:, None, :, None] == segments[:, None, None, :])
    probs = jax.nn.softmax(jnp.where(seen, scores, -jnp.inf), axis=-1)
    return jnp.einsum("bhqk,bkhd->bqhd", probs, v)


def packed_segments(rows, length):
    # 3 to 5 examples a row, then padding (segment 0): boundaries fall inside devices' chunks
    segments = np.zeros((rows, length), np.int32)
    positions = np.zeros((rows, length), np.int32)
    for r in range(rows):
        cuts = np.sort(rng.choice(np.arange(2, length - 2), rng.integers(2, 5), replace=False))
        ends = [*cuts, length - 1 - r % 2]
        start = 0
        for number, end in enumerate(ends, 1):
            segments[r, start:end] = number
            positions[r, start:end] = np.arange(end - start)
            start = end
    return segments, positions


AXES = ("data", "fsdp", "context", "tensor")
RULES = (("batch", ("data", "fsdp")), ("length", "context"), ("heads", "tensor"))
CASES = {  # name: (context, tensor, kv_heads, causal, window, segments, how, block)
    "ring causal window packed gqa blocks": (4, 1, 2, True, 11, True, "ring", 2),
    "gather causal packed gqa blocks": (4, 1, 2, True, 0, True, "gather", 2),
    "ring bidirectional unpacked, kv heads fewer than tensor devices": (2, 2, 1, False, 0, False, "ring", 4),
}
length, heads, head_dim = 32, 4, 8
for name, (ways, tensor, kv_heads, causal, window, packed, how, block) in CASES.items():
    mesh = Mesh(np.asarray(jax.devices()[: ways * tensor]).reshape(1, 1, ways, tensor), AXES)
    whole = NamedSharding(mesh, PartitionSpec())
    q, k, v = (jax.device_put(rng.normal(size=(2, length, h, head_dim)), whole) for h in (heads, kv_heads, kv_heads))
    segments = packed_segments(2, length)[0] if packed else None
    order = context.balanced_order(length, ways)
    back = np.argsort(order)
    rules = RULES + (("kv_heads", "tensor" if kv_heads % tensor == 0 else None),)  # as the Transformer's

    def split(q, k, v):
        with jax.sharding.use_abstract_mesh(mesh.abstract_mesh), nn.logical_axis_rules(rules):
            seg = None if segments is None else jnp.asarray(segments)[:, order]
            o = context.attention(q[:, order], k[:, order], v[:, order], causal=causal, window=window,
                                  segments=seg, how=how, block=block)
            return o[:, back]

    weights = rng.normal(size=q.shape)

    @jax.jit
    def out_and_grads(q, k, v):  # each way, the output and the gradients of a weighted sum of it
        def one(fn):
            o, pull = jax.vjp(fn, q, k, v)
            return o, pull(weights)
        return one(split), one(lambda q, k, v: dense(q, k, v, segments, causal, window))

    (got, grads), (want, want_grads) = out_and_grads(q, k, v)
    out["attention"][name] = {
        "out": float(jnp.max(jnp.abs(got - want))),
        "grads": [float(jnp.max(jnp.abs(a - b))) for a, b in zip(grads, want_grads)],
        "scale": float(jnp.max(jnp.abs(want))),
    }

# The model: Llama's block, grouped-query attention, Llama 3's rope scaling (its original context
# shorter than the rows, so that the rescaled frequencies act). One block: a second costs a second
# compilation's worth of time and adds nothing the first does not check.
text = from_text("the quick brown fox jumps over the lazy dog. " * 50, "char")
base = config.load_experiment("transformer_shakespeare:smoke", [
    "model.position=rotary", "model.norm=rms", "model.mlp=swiglu", "model.bias=none", "model.tie_embeddings=false",
    "model.layers=1", "model.width=32", "model.heads=4", "model.kv_heads=2", "model.rope_theta=500000",
    "model.rope_scaling=llama3", "model.rope_original_context=8", f"data.seq_len={length}", "train.batch_size=4",
    "model.dtype=float64", "model.param_dtype=float64",
])
tokens = rng.integers(0, 20, (4, length + 1)).astype(np.int32)
plain = {"tokens": tokens[:, :-1], "targets": tokens[:, 1:]}
segments, positions = packed_segments(4, length)
packed = {**plain, "segments": segments, "positions": positions, "mask": (segments > 0).astype(np.float64)}
params = None
LAYOUTS = {  # name: (mesh, model.context_attention)
    "one": ({}, "auto"),
    "context2": ({"context": 2}, "ring"),
    "fsdp2 context4": ({"fsdp": 2, "context": 4}, "ring"),
}
for name, (mesh, how) in LAYOUTS.items():
    sizes = {"data": 1, "fsdp": 1, "context": 1, "tensor": 1, **mesh}
    cfg = config.apply_overrides(base, [f"mesh.{a}={n}" for a, n in sizes.items()] + [f"model.context_attention={how}"])
    run = Run(cfg, dataset=text)
    if params is None:
        params = jax.device_get(run.init_state().params)
    grad_fn = make_grad_fn(run.model, run.task)

    def both(params, plain, packed):
        return [grad_fn(params, {}, batch, jax.random.key(0)) for batch in (plain, packed)]

    step = jax.jit(parallel.under_rules(both, run.mesh, run.rules))
    placed = jax.device_put(params, run.state_shardings.params)
    results = step(placed, parallel.put_batch(plain, run.mesh), parallel.put_batch(packed, run.mesh))
    out["model"][name] = {
        kind: {"loss": float(loss), "grads": [np.asarray(g).ravel().tolist() for g in jax.tree.leaves(grads)]}
        for kind, ((loss, _), grads) in zip(("plain", "packed"), results)
    }
print("RESULTS" + json.dumps(out))
"""


@pytest.fixture(scope="module")
def eight_devices() -> dict:
    env = {**cpu_env(8), "JAX_ENABLE_X64": "1"}
    result = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.split("RESULTS", 1)[1])


def test_attention_across_devices_is_the_dense_attention(eight_devices):
    """Ring and all-gather, every mask, grouped heads, small blocks: float64 rounding from a dense softmax."""
    cases = eight_devices["attention"]
    assert len(cases) == 3
    for name, case in cases.items():
        assert case["scale"] > 0.1, name
        assert case["out"] < 1e-12, name
        assert max(case["grads"]) < 1e-12, name


@pytest.mark.parametrize("layout", ["context2", "fsdp2 context4"])
@pytest.mark.parametrize("rows", ["plain", "packed"])
def test_loss_and_gradients_with_the_sequence_split_match_one_device(eight_devices, layout, rows):
    """The Llama-shaped model's loss and every gradient, the sequence split 2 ways, and 4 ways beside
    fsdp=2, equal one device's. One device's attention takes its softmax in float32 even in
    a float64 model, so it agrees to float32 rounding; the split layouts, all float64, agree with each
    other to float64 rounding."""
    one, split = eight_devices["model"]["one"][rows], eight_devices["model"][layout][rows]
    assert split["loss"] == pytest.approx(one["loss"], rel=1e-6)
    for a, b in zip(one["grads"], split["grads"], strict=True):
        assert np.allclose(b, a, rtol=1e-5, atol=1e-7)
    if layout != "context2":
        first = eight_devices["model"]["context2"][rows]
        assert split["loss"] == pytest.approx(first["loss"], rel=1e-13)
        for a, b in zip(first["grads"], split["grads"], strict=True):
            assert np.allclose(b, a, rtol=1e-10, atol=1e-13)


def test_packed_rows_change_the_numbers(eight_devices):
    """The packed comparison is not vacuous: segments and positions change the loss and gradients."""
    one = eight_devices["model"]["one"]
    assert abs(one["plain"]["loss"] - one["packed"]["loss"]) > 1e-5  # a model at its start: losses near log(vocab)
    gaps = [
        np.max(np.abs(np.subtract(a, b))) for a, b in zip(one["plain"]["grads"], one["packed"]["grads"], strict=True)
    ]
    assert max(gaps) > 1e-3


def test_balanced_order_gives_each_device_a_chunk_from_each_end():
    order = context.balanced_order(24, 3)
    assert sorted(order.tolist()) == list(range(24))
    pieces = order.reshape(3, 2, 4)  # device, its two chunks, positions
    for device in range(3):
        assert pieces[device, 0].tolist() == list(range(4 * device, 4 * device + 4))
        assert pieces[device, 1].tolist() == list(range(4 * (5 - device), 4 * (5 - device) + 4))
    # Causal attention: every device's queries see the same number of keys.
    seen = [sum(i + 1 for i in order[8 * d : 8 * d + 8]) for d in range(3)]
    assert len(set(seen)) == 1


def test_sequences_the_context_axis_cannot_split_are_one_line_errors(capsys):
    err = fails(["train", "llama_shakespeare:smoke", "mesh.context=3", "data.seq_len=32"], capsys)
    assert "data.seq_len=32 cannot be split over mesh.context=3" in err and "data.seq_len=30 or 36" in err
    with pytest.raises(UserError, match="model.name=lstm"):
        config.load_experiment("lstm_shakespeare:smoke", ["mesh.context=2"])
    with pytest.raises(UserError, match="parallel.mode=replicas"):
        config.load_experiment("llama_shakespeare:smoke", ["mesh.context=2", "parallel.mode=replicas"])
    with pytest.raises(UserError, match="a sequence of 20 tokens cannot be split over mesh.context=4"):
        context.balanced_order(20, 4)

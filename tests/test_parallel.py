"""The device mesh on 8 simulated CPU devices: data, FSDP and tensor parallelism give the same
training as one device, and FSDP really divides the memory of parameters and optimizer state.

The layouts are compared in float64: summing in another order then changes results by ~1e-16,
so any real difference (a missing or doubled reduction, a misplaced shard) stands out by many
orders of magnitude, where float32 rounding, grown over 20 steps and amplified by Adam's
division by sqrt(v) for near-zero gradients, can reach 1e-3 and hide it."""

from __future__ import annotations

import json
import os
import re
import sys

import jax
import pytest
from conftest import run_patiently

from jaxnet import config, parallel
from jaxnet.config import MeshConfig
from jaxnet.errors import UserError

EIGHT_DEVICES = """
import os, sys, json
os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
os.environ["JAX_ENABLE_X64"] = "1"
import jax, numpy as np
from jaxnet import config, parallel
from jaxnet.data import Dataset
from jaxnet.data.text import from_text
from jaxnet.train.loop import Run

assert jax.device_count() == 8


def packed_attention(params):
    # A Transformer's queries, keys and values stacked per layer as they were saved before they were
    # kept apart, so the first 64 numbers compared are the query bias's, as they were: the key bias
    # alone is rounding noise that Adam magnifies (it shifts every score of a query alike, which the
    # softmax ignores), different in each layout.
    if not isinstance(params, dict):
        return params
    out = {k: packed_attention(v) for k, v in params.items()}
    if {"query", "key", "value"} <= out.keys():
        parts = [out.pop(n) for n in ("query", "key", "value")]
        out["qkv"] = {k: np.stack([np.asarray(p[k]) for p in parts], axis=-3) for k in parts[0]}
    return out


text = from_text("the quick brown fox jumps over the lazy dog. " * 200, "char")
rng = np.random.default_rng(0)
images = lambda n: (rng.integers(0, 256, (n, 16, 16, 3), dtype=np.uint8), rng.integers(0, 10, n))
colour = Dataset(train=images(64), val=images(16), test=images(16), num_classes=10)
results = {}
for experiment, (overrides, layouts) in json.loads(sys.argv[1]).items():
    base = config.load_experiment(experiment, overrides + ["model.dtype=float64", "model.param_dtype=float64"])
    dataset = {"lstm": text, "transformer": text}.get(base.model.name, colour)
    out = {}
    for name, mesh in {"one": {}, "data8": {"data": 8}, "fsdp8": {"data": 1, "fsdp": 8},
                       "d2f2t2": {"data": 2, "fsdp": 2, "tensor": 2}, "replicas": {"data": 8}}.items():
        if name not in ["one", *layouts]:
            continue
        sizes = {"data": 1, "fsdp": 1, "tensor": 1, **mesh}
        mode = "replicas" if name == "replicas" else "sharded"
        cfg = config.apply_overrides(base, [f"mesh.{k}={v}" for k, v in sizes.items()] + [f"parallel.mode={mode}"])
        run = Run(cfg, dataset=dataset)
        state = run.init_state()
        batches = run.train_batches(0)
        losses = []
        for _ in range(20):
            state, metrics = run.train_step(state, parallel.put_batch(next(batches), run.mesh))
            losses.append(float(metrics["loss"]))
        abstract = run.abstract_state()
        out[name] = {
            "losses": losses,
            "params": [np.asarray(x).ravel()[:64].tolist()
                       for x in jax.tree.leaves(packed_attention(jax.device_get(state.params)))],
            "batch_stats": [np.asarray(x).ravel()[:64].tolist()
                            for x in jax.tree.leaves(jax.device_get(state.model_state.get("batch_stats", {})))],
            "bytes": parallel.bytes_per_device((abstract.params, abstract.opt_state)),
            "compiles": run.train_step._cache_size(),
        }
    results[experiment] = out
print("RESULTS" + json.dumps(results))
"""

LAYOUTS = ["data8", "fsdp8", "d2f2t2", "replicas"]
FAMILIES = {  # experiment: (overrides, the layouts compared with one device)
    # BatchNorm: its statistics must be those of the whole batch, whichever device holds which rows.
    "resnet_cifar10:smoke": (["train.batch_size=16", "model.features=8,16", "model.blocks=1,1"], LAYOUTS),
    "lstm_shakespeare:smoke": (["train.batch_size=16", "data.seq_len=8", "model.width=32"], LAYOUTS),
    "transformer_shakespeare:smoke": (
        ["train.batch_size=16", "data.seq_len=16", "model.width=64", "model.heads=4"],
        LAYOUTS,
    ),
    # The ResNet has the ConvNet's convolutions; what is the ConvNet's alone (max pooling, the hidden
    # dense layer split over `tensor`) is checked on the layout using all three axes (on the colour
    # images: a compilation per layout is most of this fixture's time).
    "cnn_fashion_mnist:smoke": (["train.batch_size=16", "model.dropout=0.0"], ["d2f2t2"]),
}
CASES = [(experiment, layout) for experiment, (_, layouts) in FAMILIES.items() for layout in layouts]


@pytest.fixture(scope="module")
def eight_device_runs():
    """A family's runs on every layout, one subprocess a family (each about a minute on a quiet
    2-core machine), run when a test first asks for it: a time limit per family follows its work,
    and the load (:func:`conftest.run_patiently`)."""
    env = dict(os.environ)  # the tests' XLA flags too; the script adds its devices
    done: dict[str, dict] = {}

    def runs(experiment: str) -> dict:
        if experiment not in done:
            family = json.dumps({experiment: FAMILIES[experiment]})
            result = run_patiently([sys.executable, "-c", EIGHT_DEVICES, family], timeout=300, env=env)
            assert result.returncode == 0, result.stderr[-3000:]
            done.update(json.loads(result.stdout.split("RESULTS", 1)[1]))
        return done[experiment]

    return runs


@pytest.mark.parametrize("experiment,mesh", CASES)
def test_twenty_steps_on_a_mesh_match_one_device(eight_device_runs, experiment, mesh):
    """Every layout, and the per-device ``replicas`` mode (shard_map + pmean), is the same SGD."""
    one, other = eight_device_runs(experiment)["one"], eight_device_runs(experiment)[mesh]
    assert other["losses"] == pytest.approx(one["losses"], rel=1e-9)
    for a, b in zip(one["params"] + one["batch_stats"], other["params"] + other["batch_stats"], strict=True):
        # Up to 1e-5 here and there: a few float32 constants remain in float64 models (normalisation
        # epsilons, rotary angles), and at the tests' LLVM optimisation level 0 (conftest) each layout
        # computes them with its own code. The LSTM partitioning fault that float64 exposed was 1e-2.
        assert b == pytest.approx(a, rel=1e-5, abs=1e-8)
    assert other["compiles"] == 1


def test_the_resnet_keeps_batchnorm_statistics(eight_device_runs):
    """The BatchNorm comparison above is not vacuous: the statistics exist and moved from their start."""
    stats = eight_device_runs("resnet_cifar10:smoke")["one"]["batch_stats"]
    assert len(stats) >= 4 and any(abs(v) > 1e-3 for leaf in stats for v in leaf)


def test_fsdp_divides_the_transformers_parameter_and_optimizer_memory(eight_device_runs):
    runs = eight_device_runs("transformer_shakespeare:smoke")
    assert runs["fsdp8"]["bytes"] <= runs["one"]["bytes"] / 6
    assert runs["data8"]["bytes"] == runs["one"]["bytes"]  # data parallelism replicates


@pytest.mark.parametrize(
    "mesh, devices, message",
    [
        (MeshConfig(data=3), 8, "needs 3 devices but 8 device(s)"),
        (MeshConfig(data=-1, fsdp=3), 8, "do not divide the 8 device(s)"),
        (MeshConfig(data=-1, fsdp=-1), 8, "only one mesh axis can be -1"),
        (MeshConfig(data=4, fsdp=4), 8, "needs 16 devices"),
    ],
)
def test_a_mesh_that_does_not_fit_the_devices_is_a_one_line_error(mesh, devices, message):
    with pytest.raises(UserError, match=re.escape(message)):
        parallel.mesh_shape(mesh, devices)


def test_mesh_sizes_resolve_the_rest_of_the_devices():
    ones = {"expert": 1, "context": 1}
    assert parallel.mesh_shape(MeshConfig(data=-1, fsdp=2, tensor=2), 8) == {"data": 2, "fsdp": 2, "tensor": 2, **ones}
    assert parallel.mesh_shape(MeshConfig(data=2, fsdp=-1, tensor=1), 8) == {"data": 2, "fsdp": 4, "tensor": 1, **ones}
    assert parallel.mesh_shape(MeshConfig(data=2, context=-1), 8) == {
        "data": 2,
        "fsdp": 1,
        "tensor": 1,
        "expert": 1,
        "context": 4,
    }


def test_a_layer_the_mesh_cannot_split_names_the_array():
    """Sharding rules applied to a 6-unit hidden layer on a 4-way tensor axis."""
    import flax.linen as nn
    import jax.numpy as jnp

    from jaxnet.models import TransformerLanguageModel, TransformerSpec

    model = TransformerLanguageModel(TransformerSpec(vocab=10, context=8, layers=1, width=12, heads=3, mlp_hidden=12))
    boxed = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), jnp.zeros((1, 8), jnp.int32)))
    # a pretend mesh of 4 tensor devices: only the shape matters for the check
    fake = type("FakeMesh", (), {"shape": {"data": 1, "fsdp": 1, "tensor": 4}})()
    specs = nn.logical_to_mesh(nn.get_partition_spec(boxed), parallel.RULES)
    shardings = jax.tree.map(
        lambda s: type("S", (), {"spec": s})(), specs, is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec)
    )
    with pytest.raises(UserError, match=r"dimension of 3, which the mesh cannot split 4 ways \(mesh.tensor=4\)"):
        parallel.check_divisible(nn.unbox(boxed), shardings, fake)


def test_bad_mesh_through_the_config():
    with pytest.raises(UserError, match="mesh.fsdp=0"):
        config.load_experiment("transformer_shakespeare:smoke", ["mesh.fsdp=0"])


REMESH = """
import os, sys, json, pathlib, shutil
os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
from jaxnet import config
from jaxnet.data.text import from_text
from jaxnet.train.loop import train
text = from_text("the quick brown fox jumps over the lazy dog. " * 200, "char")
base = config.load_experiment("transformer_shakespeare:smoke", [
    "train.batch_size=16", "data.seq_len=16", "model.width=64", "train.steps=12", "train.checkpoint_every=6",
    "train.eval_every=0", "train.log_every=2", "train.progress=false", "model.dropout=0.0"])
def mesh(data, fsdp, tensor):
    return config.apply_overrides(base, [f"mesh.data={data}", f"mesh.fsdp={fsdp}", f"mesh.tensor={tensor}"])
d = pathlib.Path(sys.argv[1])
train(mesh(1, 1, 1), d / "whole", dataset=text)
train(config.apply_overrides(mesh(8, 1, 1), ["train.stop_after=6"]), d / "a", dataset=text)
shutil.copytree(d / "a", d / "b")
train(mesh(1, 4, 2), d / "a", dataset=text)  # saved on data=8, resumed on fsdp=4 x tensor=2
train(mesh(1, 1, 1), d / "b", dataset=text)  # ... and on one device
"""


def test_a_run_resumes_on_a_different_mesh(tmp_path):
    """Checkpointed on data=8, resumed on fsdp=4 x tensor=2 and on 1 device: the same losses as an
    uninterrupted single-device run, step by step."""
    env = dict(os.environ)  # the tests' XLA flags too; the script adds its devices
    result = run_patiently([sys.executable, "-c", REMESH, str(tmp_path)], timeout=600, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.count("resuming") == 2 and "mesh.fsdp 1 -> 4" in result.stdout
    assert "mesh.data 8 -> 1" in result.stdout

    def losses(name):
        lines = [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
        return {(r["step"], r["split"]): r["loss"] for r in lines}

    whole = losses("whole")
    assert len(whole) == 8  # 6 train lines, val and test
    for moved in ("a", "b"):
        got = losses(moved)
        assert got.keys() == whole.keys()
        for key, loss in whole.items():
            assert got[key] == pytest.approx(loss, rel=1e-5), (moved, key)

"""The device mesh on 8 simulated CPU devices: data, FSDP and tensor parallelism give the same
training as one device, and FSDP really divides the memory of parameters and optimizer state."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import jax
import pytest

from jaxnet import config, parallel
from jaxnet.config import MeshConfig
from jaxnet.errors import UserError

EIGHT_DEVICES = """
import os, sys, json
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
import jax, numpy as np
from jaxnet import config, parallel
from jaxnet.data.text import from_text
from jaxnet.train.loop import Run

assert jax.device_count() == 8
text = from_text("the quick brown fox jumps over the lazy dog. " * 200, "char")
results = {}
for experiment, overrides in json.loads(sys.argv[1]).items():
    base = config.load_experiment(experiment, overrides)
    dataset = text if base.model.name in ("lstm", "transformer") else None
    out = {}
    for name, mesh in {"one": {}, "data8": {"data": 8}, "fsdp8": {"data": 1, "fsdp": 8},
                       "d2f2t2": {"data": 2, "fsdp": 2, "tensor": 2}}.items():
        sizes = {"data": 1, "fsdp": 1, "tensor": 1, **mesh}
        cfg = config.apply_overrides(base, [f"mesh.{k}={v}" for k, v in sizes.items()])
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
            "params": [np.asarray(x).ravel()[:64].tolist() for x in jax.tree.leaves(jax.device_get(state.params))],
            "bytes": parallel.bytes_per_device((abstract.params, abstract.opt_state)),
            "compiles": run.train_step._cache_size(),
        }
    results[experiment] = out
print("RESULTS" + json.dumps(results))
"""

FAMILIES = {
    "cnn_fashion_mnist:smoke": ["train.batch_size=16", "model.dropout=0.0"],
    "lstm_shakespeare:smoke": ["train.batch_size=16", "data.seq_len=8", "model.width=32"],
    "transformer_shakespeare:smoke": ["train.batch_size=16", "data.seq_len=16", "model.width=64", "model.heads=4"],
}


@pytest.fixture(scope="module")
def eight_device_runs():
    from conftest import FASHION_MNIST

    families = {k: v for k, v in FAMILIES.items() if FASHION_MNIST is not None or not k.startswith("cnn")}
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    result = subprocess.run(
        [sys.executable, "-c", EIGHT_DEVICES, json.dumps(families)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.split("RESULTS", 1)[1])


@pytest.mark.parametrize("experiment", list(FAMILIES))
@pytest.mark.parametrize("mesh", ["data8", "fsdp8", "d2f2t2"])
def test_twenty_steps_on_a_mesh_match_one_device(eight_device_runs, experiment, mesh):
    if experiment not in eight_device_runs:
        pytest.skip("Fashion-MNIST not installed")
    one, other = eight_device_runs[experiment]["one"], eight_device_runs[experiment][mesh]
    assert other["losses"] == pytest.approx(one["losses"], rel=2e-5, abs=2e-6)
    for a, b in zip(one["params"], other["params"], strict=True):
        assert b == pytest.approx(a, rel=1e-4, abs=2e-6)
    assert other["compiles"] == 1


def test_fsdp_divides_the_transformers_parameter_and_optimizer_memory(eight_device_runs):
    runs = eight_device_runs["transformer_shakespeare:smoke"]
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
    assert parallel.mesh_shape(MeshConfig(data=-1, fsdp=2, tensor=2), 8) == {"data": 2, "fsdp": 2, "tensor": 2}
    assert parallel.mesh_shape(MeshConfig(data=2, fsdp=-1, tensor=1), 8) == {"data": 2, "fsdp": 4, "tensor": 1}


def test_a_layer_the_mesh_cannot_split_names_the_array():
    """Sharding rules applied to a 6-unit hidden layer on a 4-way tensor axis."""
    import flax.linen as nn
    import jax.numpy as jnp

    from jaxnet.models import TransformerLanguageModel

    model = TransformerLanguageModel(10, 8, layers=1, width=12, heads=3, mlp_ratio=1)
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
import os, sys, json, pathlib
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
from jaxnet import config
from jaxnet.data.text import from_text
from jaxnet.train.loop import train
text = from_text("the quick brown fox jumps over the lazy dog. " * 200, "char")
base = config.load_experiment("transformer_shakespeare:smoke", [
    "train.batch_size=16", "data.seq_len=16", "model.width=64", "train.steps=12", "train.checkpoint_every=6",
    "train.eval_every=0", "train.progress=false", "model.dropout=0.0"])
d = pathlib.Path(sys.argv[1])
whole = train(config.apply_overrides(base, ["mesh.data=1"]), d / "whole", dataset=text)
train(config.apply_overrides(base, ["mesh.data=1", "mesh.fsdp=8", "train.stop_after=6"]), d / "moved", dataset=text)
moved = train(config.apply_overrides(base, ["mesh.data=2", "mesh.fsdp=2", "mesh.tensor=2"]), d / "moved", dataset=text)
print("RESULT" + json.dumps([whole["test"]["loss"], moved["test"]["loss"]]))
"""


def test_a_run_resumes_on_a_different_mesh(tmp_path):
    """Checkpointed under fsdp=8, resumed on data=2 x fsdp=2 x tensor=2: the same run as one device."""
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    result = subprocess.run(
        [sys.executable, "-c", REMESH, str(tmp_path)], capture_output=True, text=True, env=env, timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "resuming" in result.stdout and "mesh.fsdp 8 -> 2" in result.stdout
    whole, moved = json.loads(result.stdout.split("RESULT", 1)[1])
    assert moved == pytest.approx(whole, rel=1e-5)

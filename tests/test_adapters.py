"""Any JAX model trains like a Linen module: a Flax NNX module, an Equinox module and two pure
functions (jaxnet.Model), given the same initial weights as a Linen MLP, train to the same losses,
resume exactly after a stop, evaluate, and fail in one line on bad input."""

from __future__ import annotations

import json

import equinox as eqx
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import jaxnet

HIDDEN = 8


def classes(n: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 4)).astype(np.float32)
    return {"x": x, "y": (x[:, 0] + x[:, 1] > 0).astype(np.int32) + (x[:, 2] > 1).astype(np.int32)}


DATA = jaxnet.data.arrays(train=classes(64, 0), val=classes(16, 1), test=classes(24, 2))
TASK = jaxnet.tasks.classification(inputs="x", target="y")
SETTINGS = [
    "data.name=arrays",
    "optim.lr=3e-2",
    "train.steps=6",
    "train.batch_size=8",
    "train.eval_batch_size=8",
    "train.log_every=1",
    "train.eval_every=3",
    "train.checkpoint_every=3",
    "train.progress=false",
]


def config(*extra: str) -> jaxnet.Config:
    return jaxnet.apply_overrides(jaxnet.Config(experiment="adapters"), [*SETTINGS, *extra])


class LinenMLP(nn.Module):
    @nn.compact
    def __call__(self, x, train=False):
        return nn.Dense(3, name="out")(nn.relu(nn.Dense(HIDDEN, name="hidden")(x)))


def linen_params() -> dict:
    """The Linen MLP's initial parameters for the run's seed (as the trainer makes them)."""
    init_rng, _ = jax.random.split(jax.random.PRNGKey(0))
    return LinenMLP().init({"params": init_rng, "dropout": init_rng}, jnp.zeros((1, 4)))["params"]


class NNXMLP(nnx.Module):
    def __init__(self, params: dict):
        rngs = nnx.Rngs(0)
        self.hidden = nnx.Linear(4, HIDDEN, rngs=rngs)
        self.out = nnx.Linear(HIDDEN, 3, rngs=rngs)
        for name in ("hidden", "out"):
            getattr(self, name).kernel.value = params[name]["kernel"]
            getattr(self, name).bias.value = params[name]["bias"]

    def __call__(self, x):
        return self.out(nnx.relu(self.hidden(x)))


class EqxMLP(eqx.Module):
    hidden: eqx.nn.Linear
    out: eqx.nn.Linear

    def __init__(self, params: dict):
        keys = jax.random.split(jax.random.PRNGKey(0))
        hidden, out = eqx.nn.Linear(4, HIDDEN, key=keys[0]), eqx.nn.Linear(HIDDEN, 3, key=keys[1])
        # Equinox's Linear holds the weight as (out, in), Linen's Dense kernel as (in, out).
        put = lambda layer, p: eqx.tree_at(lambda m: (m.weight, m.bias), layer, (p["kernel"].T, p["bias"]))
        self.hidden, self.out = put(hidden, params["hidden"]), put(out, params["out"])

    def __call__(self, x, key=None):
        assert x.shape == (4,), "called on one example"
        return self.out(jax.nn.relu(self.hidden(x)))


def functions_mlp(params: dict) -> jaxnet.Model:
    def init(rng, x):
        return jax.tree.map(jnp.asarray, params)

    def apply(p, x, train, rng):
        h = jax.nn.relu(x @ p["hidden"]["kernel"] + p["hidden"]["bias"])
        return h @ p["out"]["kernel"] + p["out"]["bias"]

    return jaxnet.Model(init=init, apply=apply)


KINDS = {
    "nnx": NNXMLP,
    "equinox": EqxMLP,
    "functions": functions_mlp,
}


def train_losses(workdir) -> list[float]:
    rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in rows if r["split"] == "train"]


@pytest.fixture(scope="module")
def linen_run(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("linen") / "run"
    summary = jaxnet.train(config(), workdir, model=LinenMLP(), dataset=DATA, task=TASK)
    return workdir, summary


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_same_weights_train_to_the_same_losses_as_linen_and_resume_exactly(kind, linen_run, tmp_path):
    linen_dir, linen_summary = linen_run
    model = KINDS[kind](linen_params())
    summary = jaxnet.train(config(), tmp_path / "whole", model=model, dataset=DATA, task=TASK)
    expected = train_losses(linen_dir)
    assert len(expected) == 6
    np.testing.assert_allclose(train_losses(tmp_path / "whole"), expected, rtol=2e-6, atol=1e-7)
    np.testing.assert_allclose(summary["test"]["loss"], linen_summary["test"]["loss"], rtol=2e-6)
    assert summary["model"] == {"nnx": "NNXMLP", "equinox": "EqxMLP", "functions": "Model"}[kind]

    # Stopped after 3 steps, then resumed from the checkpoint: the same losses, bit for bit.
    jaxnet.train(config("train.stop_after=3"), tmp_path / "resumed", model=model, dataset=DATA, task=TASK)
    jaxnet.train(config(), tmp_path / "resumed", model=model, dataset=DATA, task=TASK)
    assert train_losses(tmp_path / "resumed") == train_losses(tmp_path / "whole")

    params = jaxnet.load_params(tmp_path / "whole")
    final = jaxnet.load_params(tmp_path / "resumed")
    assert jax.tree.map(np.shape, params) == jax.tree.map(np.shape, final)
    assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(final), strict=True))
    evaluated = jaxnet.evaluate(tmp_path / "whole", "test", model=model, dataset=DATA, task=TASK)
    assert evaluated["loss"] == pytest.approx(summary["test"]["loss"], rel=1e-6)

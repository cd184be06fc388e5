"""Losses a model adds to its task's (a router's load balance): minimised with it, logged by name,
left out of evaluation's loss."""

from __future__ import annotations

import json

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import jaxnet
from jaxnet.errors import UserError
from jaxnet.models.common import add_loss
from jaxnet.train import state as state_lib
from jaxnet.train.step import make_train_step

COEF = 0.5


class Pulled(nn.Module):
    """A linear classifier that adds a pull of its kernel towards zero, as a model adds a loss."""

    name_of_loss: str = "pull"

    @nn.compact
    def __call__(self, x, train: bool = False):
        dense = nn.Dense(3)
        out = dense(x)
        add_loss(self, self.name_of_loss, COEF * jnp.sum(dense.variables["params"]["kernel"] ** 2))
        return out


def data(n: int = 64):
    r = np.random.default_rng(0)
    x = r.normal(size=(n, 4)).astype(np.float32)
    return x, (x[:, 0] > 0).astype(np.int32)


def test_an_added_loss_is_minimised_with_the_tasks_and_logged_by_its_name():
    x, y = data(8)
    model, task = Pulled(), jaxnet.tasks.classification(inputs="x")
    tx = optax.sgd(0.1)
    state = state_lib.create(jaxnet.models.adapters.adapt(model), tx, (jnp.asarray(x),), seed=0)
    assert set(state.model_state) == set()  # the variables never hold the added losses
    step = jax.jit(make_train_step(jaxnet.models.adapters.adapt(model), tx, task=task))
    new, metrics = step(state, {"x": x, "label": y})

    # the reference: plain JAX, the cross-entropy of the outputs plus the pull, written out
    def objective(params):
        logits = x @ params["Dense_0"]["kernel"] + params["Dense_0"]["bias"]
        ce = -jnp.mean(jax.nn.log_softmax(logits)[np.arange(8), y])
        return ce + COEF * jnp.sum(params["Dense_0"]["kernel"] ** 2), ce

    (want, ce), grads = jax.value_and_grad(objective, has_aux=True)(state.params)
    np.testing.assert_allclose(metrics["loss"], want, rtol=1e-6)
    np.testing.assert_allclose(metrics["pull"], want - ce, rtol=1e-6)
    want_params = jax.tree.map(lambda p, g: p - 0.1 * g, state.params, grads)
    for got, ref in zip(jax.tree.leaves(new.params), jax.tree.leaves(want_params), strict=True):
        np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-7)


def test_a_run_logs_the_added_loss_and_evaluates_the_tasks_alone(tmp_path):
    x, y = data()
    part = lambda a, b: {"x": x[a:b], "label": y[a:b]}
    cfg = jaxnet.Config()
    cfg.data.name, cfg.train.steps, cfg.train.batch_size, cfg.train.log_every = "arrays", 4, 16, 2
    cfg.train.trackers = ()
    task = jaxnet.tasks.classification(inputs="x")
    summary = jaxnet.train(
        cfg,
        tmp_path / "run",
        model=Pulled(),
        dataset=jaxnet.data.arrays(train=part(0, 48), val=part(48, 64)),
        task=task,
    )
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["split"] == "train"]
    assert train and all(r["pull"] > 0 and r["loss"] > r["pull"] for r in train)
    trained = jaxnet.load(tmp_path / "run", model=Pulled())
    logits = trained.predict(x[48:])
    ce = -np.mean(jax.nn.log_softmax(logits)[np.arange(16), y[48:]])
    assert summary["val"]["loss"] == pytest.approx(float(ce), rel=1e-5)  # the task's loss, no pull
    assert "pull" not in summary["val"]


def test_an_added_loss_named_like_a_metric_is_refused_in_one_line():
    x, y = data(8)
    model, task = Pulled(name_of_loss="accuracy"), jaxnet.tasks.classification(inputs="x")
    tx = optax.sgd(0.1)
    state = state_lib.create(jaxnet.models.adapters.adapt(model), tx, (jnp.asarray(x),), seed=0)
    with pytest.raises(UserError, match="adds a loss or figure named 'accuracy', which is also a metric"):
        make_train_step(jaxnet.models.adapters.adapt(model), tx, task=task)(state, {"x": x, "label": y})

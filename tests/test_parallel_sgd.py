"""Asynchronous and local SGD (``parallel.sgd=async|local``) against a plain numpy reference of
delayed and periodically averaged SGD on a linear softmax classifier, against synchronous SGD
where they must agree, and through the runner (stop, resume, compare)."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from conftest import tiny_config

from jaxnet import config
from jaxnet.errors import UserError
from jaxnet.train import state as state_lib
from jaxnet.train.loop import Run, train
from jaxnet.train.step import DELAY_STREAM, delay, make_async_train_step, make_local_train_step, make_train_step

FEATURES, CLASSES, BATCH, LR = 6, 3, 12, 0.5


class Linear(nn.Module):
    """Logits = x W + b: a model whose gradient numpy computes in two lines."""

    @nn.compact
    def __call__(self, x: jnp.ndarray, train: bool = False) -> jnp.ndarray:
        return nn.Dense(CLASSES)(x.reshape(x.shape[0], -1))


def batches(steps: int, seed: int = 0) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [
        {
            "image": rng.normal(size=(BATCH, FEATURES)).astype(np.float32),
            "label": rng.integers(0, CLASSES, BATCH).astype(np.int32),
        }
        for _ in range(steps)
    ]


def numpy_grad(w: np.ndarray, b: np.ndarray, x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Gradient of the mean softmax cross-entropy of x W + b."""
    logits = x @ w + b
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    p[np.arange(len(y)), y] -= 1.0
    return x.T @ p / len(y), p.mean(0)


def numpy_delayed_sgd(w0, b0, data, workers: int, delays: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """Update u (from 1) applies the gradient of worker (u-1) % W's rows (w, w+W, ...) of its step's
    batch, computed on the parameters after update u - 1 - delays[u-1]."""
    versions = [(w0.astype(np.float64), b0.astype(np.float64))]
    for u in range(1, len(data) * workers + 1):
        step, worker = divmod(u - 1, workers)
        x, y = data[step]["image"][worker::workers], data[step]["label"][worker::workers]
        gw, gb = numpy_grad(*versions[u - 1 - delays[u - 1]], x.astype(np.float64), y)
        w, b = versions[-1]
        versions.append((w - LR * gw, b - LR * gb))
    return versions[-1]


def run_steps(step_fn, state, data):
    step_fn = jax.jit(step_fn)
    for batch in data:
        state, _ = step_fn(state, batch)
    return state


def initial(sgd: str = "sync", workers: int = 1, staleness: int = 0, tx=None):
    return state_lib.create(
        Linear(),
        tx or optax.sgd(LR),
        jnp.zeros((1, FEATURES)),
        seed=0,
        sgd=sgd,
        workers=workers,
        staleness=staleness,
    )


def kernel_and_bias(state) -> tuple[np.ndarray, np.ndarray]:
    dense = state.params["Dense_0"]
    return np.asarray(dense["kernel"]), np.asarray(dense["bias"])


def test_async_with_one_worker_and_no_staleness_is_synchronous_sgd():
    data = batches(8)
    sync = run_steps(make_train_step(Linear(), optax.sgd(LR)), initial(), data)
    async_ = run_steps(
        make_async_train_step(Linear(), optax.sgd(LR), workers=1, staleness=0),
        initial("async", 1, 0),
        data,
    )
    for x, y in zip(jax.tree.leaves(sync.params), jax.tree.leaves(async_.params), strict=True):
        np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("workers, staleness", [(1, 2), (3, 2), (2, 5)])
def test_the_gradient_of_update_t_is_taken_on_the_parameters_of_update_t_minus_k(workers, staleness):
    data = batches(6)
    state = initial("async", workers, staleness)
    w0, b0 = kernel_and_bias(state)
    step = make_async_train_step(Linear(), optax.sgd(LR), workers=workers, staleness=staleness)
    got = kernel_and_bias(run_steps(step, state, data))
    delays = [min(staleness, u - 1) for u in range(1, len(data) * workers + 1)]
    expected = numpy_delayed_sgd(w0, b0, data, workers, delays)
    for g, e in zip(got, expected, strict=True):
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-6)
    # and staleness matters: the synchronous result is different
    fresh = numpy_delayed_sgd(w0, b0, data, workers, [0] * len(delays))
    assert not np.allclose(got[0], fresh[0], rtol=1e-3)


def test_random_delays_stay_within_the_staleness_and_depend_only_on_the_seed():
    rng, other = jax.random.PRNGKey(1), jax.random.PRNGKey(2)
    draws = [int(delay(rng, jnp.int32(u), 4, True)) for u in range(1, 200)]
    assert all(0 <= d <= min(4, u - 1) for u, d in zip(range(1, 200), draws, strict=True))
    assert set(draws[10:]) == {0, 1, 2, 3, 4}  # every delay occurs
    assert draws == [int(delay(rng, jnp.int32(u), 4, True)) for u in range(1, 200)]
    assert draws != [int(delay(other, jnp.int32(u), 4, True)) for u in range(1, 200)]

    # The step applies exactly these delays (the reference replays them).
    data, workers = batches(5), 2
    state = initial("async", workers, 4)
    w0, b0 = kernel_and_bias(state)
    step = make_async_train_step(Linear(), optax.sgd(LR), workers=workers, staleness=4, randomised=True)
    got = kernel_and_bias(run_steps(step, state, data))
    delay_rng = jax.random.fold_in(state.rng, DELAY_STREAM)
    delays = [int(delay(delay_rng, jnp.int32(u), 4, True)) for u in range(1, len(data) * workers + 1)]
    for g, e in zip(got, numpy_delayed_sgd(w0, b0, data, workers, delays), strict=True):
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-6)


def test_local_sgd_averaging_every_step_is_synchronous_data_parallel_sgd():
    tx = optax.sgd(LR, momentum=0.9)
    data = batches(8)
    sync = run_steps(make_train_step(Linear(), tx), initial(tx=tx), data)
    local = run_steps(make_local_train_step(Linear(), tx, workers=4, local_steps=1), initial("local", 4, tx=tx), data)
    for x, y in zip(jax.tree.leaves(sync.params), jax.tree.leaves(local.params), strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)


def test_local_sgd_copies_drift_apart_and_meet_every_h_steps():
    workers, period = 3, 3
    step = jax.jit(make_local_train_step(Linear(), optax.sgd(LR), workers=workers, local_steps=period))
    state = initial("local", workers)
    w, b = kernel_and_bias(state)
    for i, batch in enumerate(batches(6), start=1):
        state, _ = step(state, batch)
        copies = np.asarray(state.workers["params"]["Dense_0"]["kernel"])
        np.testing.assert_allclose(np.asarray(state.params["Dense_0"]["kernel"]), copies.mean(0), rtol=1e-6)
        if i % period:
            assert not np.allclose(copies[0], copies[1])
        else:
            assert all(np.array_equal(copies[0], c) for c in copies[1:])
    # numpy: each worker does plain SGD on its rows; the copies are averaged after steps 3 and 6
    data = batches(6)
    copies = [(w.astype(np.float64), b.astype(np.float64)) for _ in range(workers)]
    for i, batch in enumerate(data, start=1):
        copies = [
            (cw - LR * gw, cb - LR * gb)
            for k, (cw, cb) in enumerate(copies)
            for gw, gb in [
                numpy_grad(cw, cb, batch["image"][k::workers].astype(np.float64), batch["label"][k::workers])
            ]
        ]
        if i % period == 0:
            mean = (np.mean([c[0] for c in copies], 0), np.mean([c[1] for c in copies], 0))
            copies = [mean] * workers
    for g, e in zip(kernel_and_bias(state), copies[0], strict=True):
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "sgd",
    [
        {"sgd": "async", "workers": 4, "staleness": 3, "delay": "random"},
        {"sgd": "local", "workers": 4, "local_steps": 3},
    ],
)
def test_runs_stopped_and_resumed_end_bit_identical(quadrants, tmp_path, sgd):
    """The workers' state (parameter history, per-worker copies) is checkpointed with the rest."""
    whole = train(tiny_config(parallel=sgd), tmp_path / "whole", dataset=quadrants)
    train(tiny_config(parallel=sgd, train={"stop_after": 6}), tmp_path / "split", dataset=quadrants)
    resumed = train(tiny_config(parallel=sgd), tmp_path / "split", dataset=quadrants)
    assert resumed["val"] == whole["val"] and resumed["test"] == whole["test"]

    def final(workdir):
        from jaxnet.checkpoint import Checkpoints

        ckpts = Checkpoints(workdir / "checkpoints", read_only=True)
        try:
            return ckpts.restore(Run(tiny_config(parallel=sgd), dataset=quadrants).abstract_state())
        finally:
            ckpts.close()

    for x, y in zip(
        jax.tree.leaves(final(tmp_path / "whole")), jax.tree.leaves(final(tmp_path / "split")), strict=True
    ):
        np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["parallel.staleness=2"], "parallel.staleness=2 needs parallel.sgd=async or parallel.sgd=local"),
        (["parallel.sgd=async", "parallel.workers=5"], "not divisible by parallel.workers=5"),
        (["parallel.sgd=local", "parallel.mode=replicas"], "use parallel.mode=sharded"),
        (["parallel.sgd=async", "optim.grad_accum=2"], "cannot be combined with optim.grad_accum=2"),
        (["parallel.sgd=local", "parallel.staleness=1"], "local SGD uses parallel.local_steps"),
    ],
)
def test_settings_that_do_not_fit_together_are_named(overrides, message):
    with pytest.raises(UserError, match=message.replace("(", r"\(").replace(")", r"\)")):
        config.load_experiment("cnn_fashion_mnist:smoke", ["train.batch_size=64", *overrides])


def test_resuming_with_another_sgd_mode_names_it_and_moves_nothing(quadrants, tmp_path):
    train(tiny_config(train={"steps": 4}), tmp_path, dataset=quadrants)
    before = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    with pytest.raises(UserError, match=r"it has no workers/history/.* \(another parallel.sgd or parallel.workers\?\)"):
        train(tiny_config(parallel={"sgd": "async", "workers": 2, "staleness": 1}), tmp_path, dataset=quadrants)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == before

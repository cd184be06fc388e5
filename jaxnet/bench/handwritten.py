"""The yardstick for the runner's overhead: the shortest honest ``jax.jit`` training loop.

It trains the same Flax module with the same optax optimizer on the same data as the runner,
but with nothing of the runner around it: no mesh, no shardings, no prefetch thread, no metric
sums, no checkpoints. Batches are cut from the host arrays in the loop itself, the way a
minimal script does it, and the loss is read every ``log_every`` steps (as the runner reads its
metrics). What the runner does beyond this is its overhead.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from functools import partial
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxnet import models, optim, xla_options
from jaxnet.config import Config


def _image_batches(x: np.ndarray, y: np.ndarray, batch: int, mean: np.ndarray, std: np.ndarray) -> Iterator:
    rng = np.random.default_rng(0)
    while True:
        order = rng.permutation(len(x))
        for i in range(0, len(x) - batch + 1, batch):
            idx = order[i : i + batch]
            yield (x[idx].astype(np.float32) / 255.0 - mean) / std, y[idx]


def _stream_batches(tokens: np.ndarray, batch: int, seq_len: int) -> Iterator:
    per_row = (len(tokens) - 1) // batch
    inputs = tokens[: batch * per_row].reshape(batch, per_row)
    targets = tokens[1 : batch * per_row + 1].reshape(batch, per_row)
    while True:
        for t in range(0, per_row - seq_len + 1, seq_len):
            yield inputs[:, t : t + seq_len], targets[:, t : t + seq_len]


def _window_batches(tokens: np.ndarray, batch: int, seq_len: int) -> Iterator:
    rng = np.random.default_rng(0)
    offsets = np.arange(seq_len)
    while True:
        starts = rng.integers(0, len(tokens) - seq_len - 1, size=batch)
        idx = starts[:, None] + offsets
        yield tokens[idx], tokens[idx + 1]


class Loop:
    """A compiled step and a batch source for ``cfg``'s model on ``dataset``; :meth:`run` times it."""

    def __init__(self, cfg: Config, dataset: Any, batching: str = "examples"):
        text = batching != "examples"
        num_classes = dataset.num_classes
        self.model = models.build(cfg.model, num_classes, cfg.data.seq_len)
        self.tx, _ = optim.build(cfg.optim, cfg.train.steps)
        batch = cfg.train.batch_size
        if batching == "stream":
            self.batches = _stream_batches(dataset.train, batch, cfg.data.seq_len)
        elif batching == "windows":
            self.batches = _window_batches(dataset.train, batch, cfg.data.seq_len)
        else:
            self.batches = _image_batches(*dataset.train, batch, dataset.mean, dataset.std)
        sample = jnp.zeros((batch, 1), jnp.int32) if text else jnp.zeros((1, *dataset.train[0].shape[1:]))
        key = jax.random.PRNGKey(cfg.seed)
        variables = dict(nn.unbox(self.model.init({"params": key, "dropout": key}, sample, train=False)))
        self.params = variables.pop("params")
        self.extra = variables  # batch_stats, or the LSTM's carried state
        self.opt_state = self.tx.init(self.params)
        self.key = key
        self.smoothing = cfg.train.label_smoothing

        model, tx, smoothing = self.model, self.tx, self.smoothing
        mutable = list(self.extra)

        def loss_fn(params: Any, extra: dict, x: jnp.ndarray, y: jnp.ndarray, key: jax.Array) -> tuple:
            logits, extra = model.apply(
                {"params": params, **extra}, x, train=True, rngs={"dropout": key}, mutable=mutable
            )
            labels = optax.smooth_labels(jax.nn.one_hot(y, logits.shape[-1]), smoothing) if smoothing else None
            if labels is None:
                loss = optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), y)
            else:
                loss = optax.softmax_cross_entropy(logits.astype(jnp.float32), labels)
            return loss.mean(), dict(extra)

        # The runner's compiler options: what this yardstick measures is the runner's overhead.
        @partial(jax.jit, donate_argnums=(0, 1, 2), compiler_options=xla_options.compiler_options())
        def step(params: Any, opt_state: Any, extra: dict, x: jnp.ndarray, y: jnp.ndarray, key: jax.Array) -> tuple:
            (loss, extra), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, extra, x, y, key)
            updates, opt_state = tx.update(grads, opt_state, params)
            return optax.apply_updates(params, updates), opt_state, extra, loss

        self.step = step
        self.count = 0

    def run(self, steps: int, log_every: int) -> float:
        """Train ``steps`` steps; returns their wall time in seconds (everything on the device done)."""
        start = time.perf_counter()
        loss = None
        for i in range(steps):
            x, y = next(self.batches)
            key = jax.random.fold_in(self.key, self.count)
            self.params, self.opt_state, self.extra, loss = self.step(
                self.params, self.opt_state, self.extra, jnp.asarray(x), jnp.asarray(y), key
            )
            self.count += 1
            if (i + 1) % log_every == 0:
                float(loss)
        jax.block_until_ready((self.params, loss))
        return time.perf_counter() - start

"""Pure training and evaluation steps for classification.

``train_step(state, batch) -> (state, metrics)`` and ``eval_step(state, batch) -> sums`` are
plain functions of their arguments; the runner jit-compiles each once. A batch is a dict with
``image`` (float inputs) and ``label`` (int classes); evaluation batches also carry ``mask``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from jaxnet.train.state import TrainState

Batch = dict[str, jnp.ndarray]
Metrics = dict[str, jnp.ndarray]


def cross_entropy(logits: jnp.ndarray, labels: jnp.ndarray, label_smoothing: float = 0.0) -> jnp.ndarray:
    """Per-example softmax cross-entropy in float32, with optional label smoothing."""
    logits = logits.astype(jnp.float32)
    targets = jax.nn.one_hot(labels, logits.shape[-1])
    if label_smoothing:
        targets = targets * (1.0 - label_smoothing) + label_smoothing / logits.shape[-1]
    return optax.softmax_cross_entropy(logits, targets)


def make_train_step(
    model: nn.Module,
    tx: optax.GradientTransformation,
    *,
    grad_accum: int = 1,
    label_smoothing: float = 0.0,
) -> Callable[[TrainState, Batch], tuple[TrainState, Metrics]]:
    """Build ``train_step``: forward, backward, one optimizer update.

    With ``grad_accum > 1`` the batch is split into that many micro-batches whose gradients are
    averaged in float32 (a ``lax.scan``, so memory holds one micro-batch of activations). The
    update equals one step on the whole batch, except that BatchNorm normalises each micro-batch
    separately and updates its running statistics once per micro-batch.
    Micro-batch ``i`` takes rows ``i, i + k, i + 2k, ...`` (k = ``grad_accum``): with the batch
    split across devices, every device then keeps computing on its own rows.
    """

    def loss_fn(params: Any, model_state: dict, batch: Batch, rng: jax.Array) -> tuple[jnp.ndarray, tuple]:
        logits, new_model_state = model.apply(
            {"params": params, **model_state},
            batch["image"],
            train=True,
            rngs={"dropout": rng},
            mutable=list(model_state),
        )
        loss = cross_entropy(logits, batch["label"], label_smoothing).mean()
        correct = jnp.mean(jnp.argmax(logits, -1) == batch["label"])
        return loss, (dict(new_model_state), correct)

    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

    def train_step(state: TrainState, batch: Batch) -> tuple[TrainState, Metrics]:
        rng = jax.random.fold_in(state.rng, state.step)
        if grad_accum == 1:
            (loss, (model_state, accuracy)), grads = grad_fn(state.params, state.model_state, batch, rng)
        else:
            micro_batches = jax.tree.map(lambda x: x.reshape(-1, grad_accum, *x.shape[1:]).swapaxes(0, 1), batch)

            def micro_step(carry: tuple, inputs: tuple) -> tuple:
                grads_sum, model_state = carry
                index, micro_batch = inputs
                (loss, (model_state, accuracy)), grads = grad_fn(
                    state.params, model_state, micro_batch, jax.random.fold_in(rng, index)
                )
                grads_sum = jax.tree.map(lambda total, g: total + g.astype(jnp.float32), grads_sum, grads)
                return (grads_sum, model_state), (loss, accuracy)

            zeros = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), state.params)
            (grads, model_state), (losses, accuracies) = jax.lax.scan(
                micro_step, (zeros, state.model_state), (jnp.arange(grad_accum), micro_batches)
            )
            grads = jax.tree.map(lambda g, p: (g / grad_accum).astype(p.dtype), grads, state.params)
            loss, accuracy = losses.mean(), accuracies.mean()

        updates, opt_state = tx.update(grads, state.opt_state, state.params)
        new_state = state.replace(
            step=state.step + 1,
            params=optax.apply_updates(state.params, updates),
            opt_state=opt_state,
            model_state=model_state,
        )
        return new_state, {"loss": loss, "accuracy": accuracy, "grad_norm": optax.global_norm(grads)}

    return train_step


def make_eval_step(model: nn.Module) -> Callable[[TrainState, Batch], Metrics]:
    """Build ``eval_step``: sums of loss and correct predictions over the unmasked examples.

    Sums (not means) so that batches add up exactly to the metric over the whole split.
    """

    def eval_step(state: TrainState, batch: Batch) -> Metrics:
        logits = model.apply({"params": state.params, **state.model_state}, batch["image"], train=False)
        mask = batch["mask"]
        return {
            "loss": jnp.sum(cross_entropy(logits, batch["label"]) * mask),
            "correct": jnp.sum((jnp.argmax(logits, -1) == batch["label"]) * mask),
            "count": jnp.sum(mask),
        }

    return eval_step

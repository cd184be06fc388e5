"""Pure training and evaluation steps for classification and language modelling.

``train_step(state, batch) -> (state, metrics)`` and ``eval_step(state, batch, carry) -> (sums,
carry)`` are plain functions of their arguments; the runner jit-compiles each once. A batch is
a dict with either ``image`` (float inputs) and ``label`` (int classes), or ``tokens`` and
next-token ``targets`` (int, batch x time); evaluation batches also carry ``mask``.

A model that keeps state across batches (the LSTM) holds it in the ``carry`` collection of
``state.model_state``; a batch with ``reset`` = 1 (the first of an epoch) starts it from zeros.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from jaxnet.train.state import TrainState

Batch = dict[str, jnp.ndarray]
Metrics = dict[str, jnp.ndarray]

NO_STEP = 2**31 - 1  # ``first_nonfinite`` of an interval in which every update was finite


@functools.partial(jax.jit, donate_argnums=0)
def accumulate(total: Metrics, new: Metrics) -> Metrics:
    """Running totals of train-step metrics, on the device: sums, except ``first_nonfinite`` (the minimum)."""
    return {k: jnp.minimum(total[k], v) if k == "first_nonfinite" else total[k] + v for k, v in new.items()}


def cross_entropy(logits: jnp.ndarray, labels: jnp.ndarray, label_smoothing: float = 0.0) -> jnp.ndarray:
    """Per-example softmax cross-entropy in float32, with optional label smoothing."""
    logits = logits.astype(jnp.promote_types(logits.dtype, jnp.float32))
    if not label_smoothing:  # no one-hot matrix: it costs as much as the softmax for a 10k vocabulary
        return optax.softmax_cross_entropy_with_integer_labels(logits, labels)
    targets = jax.nn.one_hot(labels, logits.shape[-1])
    targets = targets * (1.0 - label_smoothing) + label_smoothing / logits.shape[-1]
    return optax.softmax_cross_entropy(logits, targets)


def hits(logits: jnp.ndarray, labels: jnp.ndarray) -> jnp.ndarray:
    """1.0 where the label's logit is the largest (a tie for the largest counts), else 0.0.

    The same as ``argmax(logits) == labels`` except on exact ties, and cheaper: one max over the
    classes (which the softmax also needs) instead of an index search over a large vocabulary.
    """
    label_logit = jnp.take_along_axis(logits, labels[..., None], axis=-1)[..., 0]
    return (label_logit >= logits.max(-1)).astype(jnp.float32)


def inputs_and_targets(batch: Batch) -> tuple[jnp.ndarray, jnp.ndarray]:
    """``(image, label)`` of an image batch or ``(tokens, targets)`` of a text batch."""
    if "tokens" in batch:
        return batch["tokens"], batch["targets"]
    return batch["image"], batch["label"]


def reset_carry(model_state: dict, reset: jnp.ndarray) -> dict:
    """``model_state`` with its ``carry`` collection zeroed where ``reset`` is true."""
    if "carry" not in model_state:
        return model_state
    carry = jax.tree.map(lambda c: jnp.where(reset, jnp.zeros_like(c), c), model_state["carry"])
    return {**model_state, "carry": carry}


def make_train_step(
    model: nn.Module,
    tx: optax.GradientTransformation,
    *,
    grad_accum: int = 1,
    label_smoothing: float = 0.0,
    axis_name: str | tuple[str, ...] | None = None,
    skip_nonfinite: bool = False,
) -> Callable[[TrainState, Batch], tuple[TrainState, Metrics]]:
    """Build ``train_step``: forward, backward, one optimizer update.

    With ``grad_accum > 1`` the batch is split into that many micro-batches whose gradients are
    averaged in float32 (a ``lax.scan``, so memory holds one micro-batch of activations). The
    update equals one step on the whole batch, except that BatchNorm normalises each micro-batch
    separately and updates its running statistics once per micro-batch.
    Micro-batch ``i`` takes rows ``i, i + k, i + 2k, ...`` (k = ``grad_accum``): with the batch
    split across devices, every device then keeps computing on its own rows.

    ``axis_name`` makes it the per-device step of ``parallel.mode=replicas`` (run inside
    ``jax.shard_map`` over those mesh axes): each device computes the gradient of its own rows,
    the gradients and metrics are averaged with ``lax.pmean`` and every device applies the same
    update. Each device draws its own dropout masks.

    Metrics: ``loss``, ``accuracy`` and ``grad_norm`` (0 for a step whose loss or gradient norm
    is NaN or Inf), ``nonfinite`` (1 for such a step) and ``first_nonfinite`` (the number of such
    an update, else :data:`NO_STEP`); add them up with :func:`accumulate`. With
    ``skip_nonfinite`` such an update is rejected inside the step: parameters, optimizer and
    model state stay as they were and only the step counter moves on.
    """

    def loss_fn(params: Any, model_state: dict, batch: Batch, rng: jax.Array) -> tuple[jnp.ndarray, tuple]:
        inputs, targets = inputs_and_targets(batch)
        logits, new_model_state = model.apply(
            {"params": params, **model_state},
            inputs,
            train=True,
            rngs={"dropout": rng},
            mutable=list(model_state),
        )
        loss = cross_entropy(logits, targets, label_smoothing).mean()
        correct = jnp.mean(hits(logits, targets))
        return loss, (dict(new_model_state), correct)

    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

    def train_step(state: TrainState, batch: Batch) -> tuple[TrainState, Metrics]:
        rng = jax.random.fold_in(state.rng, state.step)
        params = state.params
        if axis_name is not None:
            rng = jax.random.fold_in(rng, jax.lax.axis_index(axis_name))
            # Differentiate this device's copy: its gradient is then the gradient of its own rows,
            # averaged across devices explicitly below.
            params = jax.lax.pcast(params, axis_name, to="varying")
        model_state = state.model_state
        if "reset" in batch:
            model_state = reset_carry(model_state, batch["reset"])
        if grad_accum == 1:
            (loss, (model_state, accuracy)), grads = grad_fn(params, model_state, batch, rng)
        else:
            batch = {k: v for k, v in batch.items() if k != "reset"}
            micro_batches = jax.tree.map(lambda x: x.reshape(-1, grad_accum, *x.shape[1:]).swapaxes(0, 1), batch)

            def micro_step(carry: tuple, inputs: tuple) -> tuple:
                grads_sum, model_state = carry
                index, micro_batch = inputs
                (loss, (model_state, accuracy)), grads = grad_fn(
                    params, model_state, micro_batch, jax.random.fold_in(rng, index)
                )
                grads_sum = jax.tree.map(lambda total, g: total + g.astype(total.dtype), grads_sum, grads)
                return (grads_sum, model_state), (loss, accuracy)

            zeros = jax.tree.map(lambda p: jnp.zeros_like(p, jnp.promote_types(p.dtype, jnp.float32)), params)
            (grads, model_state), (losses, accuracies) = jax.lax.scan(
                micro_step, (zeros, model_state), (jnp.arange(grad_accum), micro_batches)
            )
            grads = jax.tree.map(lambda g, p: (g / grad_accum).astype(p.dtype), grads, state.params)
            loss, accuracy = losses.mean(), accuracies.mean()
        if axis_name is not None:
            grads, loss, accuracy = jax.lax.pmean((grads, loss, accuracy), axis_name)

        updates, opt_state = tx.update(grads, state.opt_state, state.params)
        grad_norm = optax.global_norm(grads)
        finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
        new_state = state.replace(
            step=state.step + 1,
            params=optax.apply_updates(state.params, updates),
            opt_state=opt_state,
            model_state=model_state,
        )
        if skip_nonfinite:
            keep = lambda new, old: jax.tree.map(lambda n, o: jnp.where(finite, n, o), new, old)
            new_state = new_state.replace(
                params=keep(new_state.params, state.params),
                opt_state=keep(new_state.opt_state, state.opt_state),
                model_state=keep(new_state.model_state, state.model_state),
            )
        zero_unless_finite = lambda x: jnp.where(finite, x, jnp.zeros_like(x))
        metrics = {
            "loss": zero_unless_finite(loss),
            "accuracy": zero_unless_finite(accuracy),
            "grad_norm": zero_unless_finite(grad_norm),
            "nonfinite": (~finite).astype(jnp.int32),
            "first_nonfinite": jnp.where(finite, NO_STEP, state.step + 1).astype(jnp.int32),
        }
        return new_state, metrics

    return train_step


def make_eval_step(model: nn.Module) -> Callable[[TrainState, Batch, dict], tuple[Metrics, dict]]:
    """Build ``eval_step``: sums of loss and correct predictions over the unmasked examples.

    Sums (not means) so that batches add up exactly to the metric over the whole split.
    ``carry`` replaces the model's carried-state collections (``{"carry": ...}`` for a stateful
    LSTM walking a stream, ``{}`` otherwise) and is returned updated.
    """

    def eval_step(state: TrainState, batch: Batch, carry: dict) -> tuple[Metrics, dict]:
        inputs, targets = inputs_and_targets(batch)
        variables = {"params": state.params, **state.model_state, **carry}
        if carry:
            logits, carry = model.apply(variables, inputs, train=False, mutable=list(carry))
            carry = dict(carry)
        else:
            logits = model.apply(variables, inputs, train=False)
        mask = batch["mask"]
        sums = {
            "loss": jnp.sum(cross_entropy(logits, targets) * mask),
            "correct": jnp.sum(hits(logits, targets) * mask),
            "count": jnp.sum(mask),
        }
        return sums, carry

    return eval_step

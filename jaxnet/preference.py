"""Preference objectives: a model trained on pairs of a preferred (chosen) and a rejected reply to
the same prompt (``train.objective``, a corpus of ``jaxnet prepare preference``).

A batch holds ``B`` pairs as arrays of shape ``(B, 2, T)``: ``tokens``, ``targets`` and ``mask``,
row 0 of each pair the prompt and the chosen reply, row 1 the prompt and the rejected one, ``mask``
1 on the targets that are the reply's tokens (the prompt and padding count in no log-probability).
The model sees the pairs' ``2B`` sequences in one batch (:meth:`PreferenceTask.model_inputs`), and a
sequence's log-probability is the sum over its reply's tokens of ``log p(token | what precedes it)``
(:func:`sequence_logps`).

**DPO** (Rafailov et al. 2023, the sigmoid loss): with ``pi`` the model's and ``ref`` the reference
model's log-probabilities of a pair's chosen (``c``) and rejected (``r``) replies,

    reward_c = beta * (pi_c - ref_c),   reward_r = beta * (pi_r - ref_r),   m = reward_c - reward_r,
    loss = -(1 - e) * log sigmoid(m) - e * log sigmoid(-m)

with ``e`` the label smoothing (conservative DPO, Mitchell 2023: the probability that a pair's
preference is flipped; 0 by default). The reference is the model the run starts from; the train
step computes its log-probabilities on each batch (:class:`~jaxnet.tasks.Task`'s ``reference``):
under LoRA the base with the adapters off, else a frozen copy of the starting weights
(:mod:`jaxnet.models.adapters.reference`). At the start both are the same model: every reward is 0
and the loss is ln 2.

**SimPO** (Meng, Xia and Chen 2024), reference-free: the length-normalised log-probabilities
``a_c = pi_c / |c|`` and ``a_r = pi_r / |r|`` (``|c|`` the reply's tokens) and a target margin
``gamma``,

    m = beta * (a_c - a_r) - gamma,   loss = -(1 - e) * log sigmoid(m) - e * log sigmoid(-m)

**Metrics**, named as TRL names them, each a mean over the pairs: ``rewards/chosen`` and
``rewards/rejected`` (DPO: ``beta * (pi - ref)``; SimPO: ``beta * a``, as TRL's CPO trainer logs
them), ``rewards/margins`` (their difference), ``rewards/accuracies`` (the fraction of pairs whose
chosen reward is the larger), ``logps/chosen`` and ``logps/rejected`` (DPO: the summed
log-probabilities; SimPO: the per-token means). Evaluation averages every pair of a split once.

>>> task = dpo(beta=0.1)                        # doctest: +SKIP
>>> loss, metrics = task.train_values(logits, batch)   # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp

from jaxnet.errors import UserError
from jaxnet.tasks import Task

Batch = Mapping[str, Any]

OBJECTIVES = ("dpo", "simpo")
#: The batch entry the train step adds from the reference model: its log-probabilities, (pairs, 2).
REFERENCE_LOGPS = "reference_logps"
#: The metrics of every objective, in the order they are logged (the first is shown on the progress bar).
METRICS = (
    "rewards/accuracies",
    "rewards/chosen",
    "rewards/rejected",
    "rewards/margins",
    "logps/chosen",
    "logps/rejected",
)


def as_rows(x: jax.Array) -> jax.Array:
    """Pairs ``(B, 2, ...)`` as the ``2B`` rows the model is called on: pair ``i``'s chosen
    sequence is row ``2i``, its rejected one row ``2i + 1``.

    >>> as_rows(jnp.zeros((3, 2, 5))).shape
    (6, 5)
    """
    return x.reshape(-1, *x.shape[2:])


def sequence_logps(logits: jax.Array, targets: jax.Array, mask: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The log-probability of each sequence's masked targets, summed, and how many there are:
    ``logits`` ``(..., T, V)`` (any float dtype; computed in float32), ``targets`` and ``mask``
    ``(..., T)``; returns two arrays of shape ``(...)``.

    >>> logits = jnp.log(jnp.array([[[0.5, 0.5], [0.25, 0.75]]]))
    >>> logps, n = sequence_logps(logits, jnp.array([[0, 1]]), jnp.array([[1.0, 1.0]]))
    >>> round(float(logps[0]), 4), float(n[0])   # log 0.5 + log 0.75
    (-0.9808, 2.0)
    """
    logits = logits.astype(jnp.promote_types(logits.dtype, jnp.float32))
    picked = jnp.take_along_axis(logits, targets[..., None].astype(jnp.int32), axis=-1)[..., 0]
    token_logps = picked - jax.nn.logsumexp(logits, axis=-1)
    mask = mask.astype(token_logps.dtype)
    return jnp.sum(jnp.where(mask > 0, token_logps, 0.0) * mask, axis=-1), jnp.sum(mask, axis=-1)


def sigmoid_loss(margin: jax.Array, smoothing: float = 0.0) -> jax.Array:
    """``-(1 - e) log sigmoid(m) - e log sigmoid(-m)`` of each margin ``m`` (``e`` = ``smoothing``).

    >>> round(float(sigmoid_loss(jnp.zeros(()))), 6)   # ln 2
    0.693147
    """
    loss = -jax.nn.log_sigmoid(margin)
    if smoothing:
        loss = (1.0 - smoothing) * loss - smoothing * jax.nn.log_sigmoid(-margin)
    return loss


def dpo_values(policy: jax.Array, reference: jax.Array, beta: float, smoothing: float = 0.0) -> dict[str, jax.Array]:
    """DPO's loss and metrics of each pair (module docstring) from the summed log-probabilities of
    the model (``policy``) and of the reference, both ``(pairs, 2)`` (chosen, rejected).

    >>> v = dpo_values(jnp.array([[-3.0, -5.0]]), jnp.array([[-4.0, -4.0]]), beta=0.5)
    >>> float(v["rewards/margins"][0]), float(v["rewards/accuracies"][0])
    (1.0, 1.0)
    """
    rewards = beta * (policy - reference)
    margin = rewards[:, 0] - rewards[:, 1]
    return {
        "loss": sigmoid_loss(margin, smoothing),
        **_metrics(rewards, margin, policy),
    }


def simpo_values(
    policy: jax.Array, counts: jax.Array, beta: float, gamma: float, smoothing: float = 0.0
) -> dict[str, jax.Array]:
    """SimPO's loss and metrics of each pair (module docstring) from the model's summed
    log-probabilities ``(pairs, 2)`` and the replies' token counts ``(pairs, 2)``.

    >>> v = simpo_values(jnp.array([[-2.0, -6.0]]), jnp.array([[2.0, 3.0]]), beta=2.0, gamma=1.0)
    >>> float(v["rewards/margins"][0])   # 2 * (-1 - (-2))
    2.0
    """
    mean = policy / jnp.maximum(counts, 1.0)
    rewards = beta * mean
    margin = rewards[:, 0] - rewards[:, 1]
    return {
        "loss": sigmoid_loss(margin - gamma, smoothing),
        **_metrics(rewards, margin, mean),
    }


def _metrics(rewards: jax.Array, margin: jax.Array, logps: jax.Array) -> dict[str, jax.Array]:
    values = {
        "rewards/accuracies": (rewards[:, 0] > rewards[:, 1]).astype(jnp.float32),
        "rewards/chosen": rewards[:, 0],
        "rewards/rejected": rewards[:, 1],
        "rewards/margins": margin,
        "logps/chosen": logps[:, 0],
        "logps/rejected": logps[:, 1],
    }
    return {k: jax.lax.stop_gradient(v) for k, v in values.items()}


@dataclasses.dataclass(frozen=True)
class PreferenceTask(Task):
    """A :class:`~jaxnet.tasks.Task` over pairs (module docstring). ``per_pair(logits, batch) -> {name:
    (pairs,)}`` gives the loss and every metric of each pair, the logits ``(pairs, 2, T, V)``; the
    training loss and metrics are their means over the batch, an evaluation's their means over every
    pair of the split (a pair of padding, whose mask is all 0, counts in none)."""

    per_pair: Callable[[jax.Array, Batch], dict[str, jax.Array]] | None = None

    def model_inputs(self, batch: Batch) -> tuple[Any, ...]:
        """The pairs' sequences as rows (:func:`as_rows`), in the order of ``inputs``."""
        return tuple(as_rows(batch[k]) for k in self.inputs)

    def _pairs(self, outputs: Any, batch: Batch) -> dict[str, jax.Array]:
        assert self.per_pair is not None
        logits = outputs.reshape(-1, 2, *outputs.shape[1:])
        return self.per_pair(logits, batch)

    def train_values(self, outputs: Any, batch: Batch) -> tuple[jax.Array, dict[str, jax.Array]]:
        """The mean loss and metrics over the batch's pairs."""
        values = {k: jnp.mean(v) for k, v in self._pairs(outputs, batch).items()}
        return values.pop("loss"), values

    def eval_sums(self, outputs: Any, batch: Batch) -> dict[str, jax.Array]:
        """The loss and every metric summed over the batch's pairs, and ``count``, their number (a
        pair of padding left out)."""
        values = self._pairs(outputs, batch)
        real = (jnp.sum(batch["mask"][:, 0], axis=-1) > 0).astype(jnp.float32)
        sums = {k: jnp.sum(jnp.where(real > 0, v.astype(jnp.float32), 0.0)) for k, v in values.items()}
        sums["count"] = jnp.sum(real)
        return sums


def _task(name: str, per_pair: Callable, reference: Callable | None) -> PreferenceTask:
    def mean_of(key: str) -> Callable[[Any, Batch], jax.Array]:
        return lambda outputs, batch: jnp.mean(per_pair(outputs.reshape(-1, 2, *outputs.shape[1:]), batch)[key])

    return PreferenceTask(
        inputs="tokens",
        loss=mean_of("loss"),
        metrics={k: mean_of(k) for k in METRICS},  # the contract's; train_values computes them together
        name=name,
        reference=reference,
        per_pair=per_pair,
    )


def reference_logps(outputs: Any, batch: Batch) -> dict[str, jax.Array]:
    """The batch entry a DPO step adds from the reference model's logits (the ``reference`` of its
    task): :data:`REFERENCE_LOGPS`, the summed log-probabilities of the pairs' replies ``(pairs, 2)``."""
    logits = outputs.reshape(-1, 2, *outputs.shape[1:])
    return {REFERENCE_LOGPS: sequence_logps(logits, batch["targets"], batch["mask"])[0]}


def dpo(beta: float = 0.1, label_smoothing: float = 0.0) -> PreferenceTask:
    """Sigmoid DPO over pairs (module docstring), against the reference model the steps run beside
    the model (its log-probabilities added to each batch by the task's ``reference``).

    >>> task = dpo(beta=0.1)
    >>> task.name, task.reference is not None
    ('dpo', True)
    """

    def per_pair(logits: jax.Array, batch: Batch) -> dict[str, jax.Array]:
        policy, _ = sequence_logps(logits, batch["targets"], batch["mask"])
        return dpo_values(policy, batch[REFERENCE_LOGPS], beta, label_smoothing)

    return _task("dpo", per_pair, reference_logps)


def simpo(beta: float = 2.0, gamma: float = 1.0, label_smoothing: float = 0.0) -> PreferenceTask:
    """SimPO over pairs (module docstring): no reference model.

    >>> task = simpo(beta=2.0, gamma=1.0)
    >>> task.name, task.reference is None
    ('simpo', True)
    """

    def per_pair(logits: jax.Array, batch: Batch) -> dict[str, jax.Array]:
        policy, counts = sequence_logps(logits, batch["targets"], batch["mask"])
        return simpo_values(policy, counts, beta, gamma, label_smoothing)

    return _task("simpo", per_pair, None)


def from_config(cfg: Any) -> PreferenceTask:
    """The objective ``train.objective`` names (dpo when unset) with its ``train.*`` settings; a
    built-in ``task`` other than these is a one-line error (a preference corpus is trained on pairs)."""
    t = cfg.train
    objective = t.objective or "dpo"
    if cfg.task and cfg.task not in OBJECTIVES:
        raise UserError(
            f"task={cfg.task} does not fit a preference corpus (pairs of a chosen and a rejected reply); leave task "
            f"unset and choose train.objective={' or train.objective='.join(OBJECTIVES)}"
        )
    if t.label_smoothing >= 0.5:
        raise UserError(
            f"train.label_smoothing={t.label_smoothing} on a preference corpus is the probability that a pair's "
            "preference is flipped: give a value below 0.5 (e.g. 0.1)"
        )
    if cfg.parallel.sgd != "sync":
        raise UserError(f"a preference objective trains with synchronous SGD; parallel.sgd={cfg.parallel.sgd} is not")
    if objective == "simpo":
        return simpo(t.simpo_beta, t.simpo_gamma, t.label_smoothing)
    return dpo(t.dpo_beta, t.label_smoothing)


__all__ = [
    "METRICS",
    "OBJECTIVES",
    "PreferenceTask",
    "REFERENCE_LOGPS",
    "as_rows",
    "dpo",
    "dpo_values",
    "from_config",
    "reference_logps",
    "sequence_logps",
    "sigmoid_loss",
    "simpo",
    "simpo_values",
]

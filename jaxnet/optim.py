"""Optimizer and learning-rate schedule from the config, all from optax.

>>> tx, schedule = build(OptimConfig(name="sgd", lr=0.1, warmup_steps=100), total_steps=1000)
>>> round(float(schedule(49)), 6)
0.05
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax.core import meta

from jaxnet.config import OptimConfig
from jaxnet.errors import UserError
from jaxnet.models.adapters.paths import joined


def schedule(cfg: OptimConfig, total_steps: int) -> optax.Schedule:
    """Linear warmup to ``cfg.lr`` over ``warmup_steps`` steps (step ``t`` < warmup gets
    ``lr * (t + 1) / warmup_steps``), then cosine decay to ``lr * end_lr_factor``, constant, or
    step decay (:func:`step_decay`)."""
    if cfg.schedule == "constant":
        main = optax.constant_schedule(cfg.lr)
    elif cfg.schedule == "step":
        # Counted from the end of warmup, like every schedule joined after it.
        main = step_decay(cfg.lr, cfg.decay_start - cfg.warmup_steps, cfg.decay_every, cfg.decay_factor)
    else:
        main = optax.cosine_decay_schedule(cfg.lr, max(total_steps - cfg.warmup_steps, 1), cfg.end_lr_factor)
    if cfg.warmup_steps == 0:
        return main
    # Starts at lr / warmup_steps, not 0: an update with a zero learning rate would be wasted.
    warmup = optax.linear_schedule(cfg.lr / cfg.warmup_steps, cfg.lr, cfg.warmup_steps - 1)
    return optax.join_schedules([warmup, main], [cfg.warmup_steps])


def extended_schedule(cfg: OptimConfig, total_steps: int) -> optax.Schedule:
    """:func:`schedule` over ``total_steps``; for a run extended after completing at step
    ``cfg.extended_at``, that run's schedule up to there, then (``cfg.extend``) the schedule again
    over the new steps (``restart``) or its final value held (``continue``)."""
    at = cfg.extended_at
    if not at or at >= total_steps:
        return schedule(cfg, total_steps)
    before = schedule(cfg, at)
    after = schedule(cfg, total_steps - at) if cfg.extend == "restart" else optax.constant_schedule(before(at))
    return optax.join_schedules([before, after], [at])


def step_decay(lr: float, start: int, every: int, factor: float) -> optax.Schedule:
    """``lr`` before step ``start``, then ``lr * factor**(1 + (t - start) // every)``: the schedule of
    Zaremba et al. (2014), where the rate halves at the start of every epoch after the fourth."""

    def fn(t: jnp.ndarray) -> jnp.ndarray:
        t = jnp.asarray(t)
        decays = jnp.where(t >= start, 1 + (t - start) // every, 0)
        return lr * jnp.asarray(factor, jnp.float32) ** decays.astype(jnp.float32)

    return fn


def off(value: Any) -> bool:
    """Whether a hyperparameter switches its part off: a concrete zero. A traced value (a member
    of a ``jaxnet sweep`` batch, whose group holds no zero) is on."""
    return not isinstance(value, jax.core.Tracer) and not value


def build(
    cfg: OptimConfig, total_steps: int, updates_per_step: int = 1
) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """The optax transformation (clipping, then the optimizer) and its schedule (of the step).

    With ``updates_per_step > 1`` (asynchronous SGD applies one update per simulated worker in
    each step) the optimizer is called that many times a step; its learning rate still follows
    the schedule by step, so warmup and decay last as many steps as in a synchronous run.
    The numbers of ``cfg`` (lr, momentum, b1, b2, weight_decay, end_lr_factor, clip_norm) may be
    traced arrays: a sweep builds each member's optimizer inside its vmapped step.
    """
    by_step = extended_schedule(cfg, total_steps)
    lr = by_step if updates_per_step == 1 else (lambda count: by_step(count // updates_per_step))
    if cfg.name == "sgd":
        opt = optax.chain(
            optax.identity() if off(cfg.weight_decay) else optax.add_decayed_weights(cfg.weight_decay),
            optax.sgd(lr, momentum=None if off(cfg.momentum) else cfg.momentum, nesterov=cfg.nesterov),
        )
    else:
        opt = optax.adamw(lr, b1=cfg.b1, b2=cfg.b2, weight_decay=cfg.weight_decay)
    if not off(cfg.clip_norm):
        opt = optax.chain(optax.clip_by_global_norm(cfg.clip_norm), opt)
    if cfg.freeze:
        # Frozen parameters are masked out of the optimizer (no moments kept for them), and their
        # update is zero, so they stay bitwise what they started as. Clipping sees only the others.
        opt = optax.partition({"train": opt, "frozen": optax.set_to_zero()}, freeze_labels(cfg.freeze))
    return opt, by_step


def param_path(path: tuple) -> str:
    """A parameter's name as ``optim.freeze`` and ``train.init_skip`` match it: its tree path joined by
    ``/`` under ``params/`` (``params/Conv_0/kernel``), as :func:`jaxnet.load_params` nests it."""
    return "/".join(("params", joined(path))) if path else "params"


def check_freeze(pattern: str, params: Any) -> None:
    """A :class:`UserError` if ``optim.freeze=pattern`` matches none of ``params`` (a misspelt name
    would otherwise train everything)."""
    if not pattern:
        return
    rx = re.compile(pattern)
    names = _names(params)
    matched = [name for name in names if rx.search(name)]
    if not matched:
        shown = ", ".join(names[:8]) + (", ..." if len(names) > 8 else "")
        raise UserError(f"optim.freeze={pattern!r} matches no parameter; the parameters are {shown}")


def freeze_labels(pattern: str) -> Callable[[Any], Any]:
    """The labels ``optax.partition`` takes: ``frozen`` for each parameter ``pattern`` matches, else ``train``."""
    rx = re.compile(pattern)

    def labels(params: Any) -> Any:
        # A parameter boxed with its logical axis names is one leaf here, named without the box.
        return jax.tree_util.tree_map_with_path(
            lambda path, _: "frozen" if rx.search(param_path(path)) else "train", params, is_leaf=_is_box
        )

    return labels


def _names(params: Any) -> list[str]:
    return [param_path(p) for p, _ in jax.tree_util.tree_flatten_with_path(params, is_leaf=_is_box)[0]]


def _is_box(x: Any) -> bool:
    return isinstance(x, meta.AxisMetadata)

"""Optimizer and learning-rate schedule from the config, all from optax.

>>> tx, schedule = build(OptimConfig(name="sgd", lr=0.1, warmup_steps=100), total_steps=1000)
>>> round(float(schedule(49)), 6)
0.05
"""

from __future__ import annotations

import inspect
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
    """The learning rate of each step.

    ``cosine``, ``linear``, ``constant`` and ``step`` start with a linear warmup to ``cfg.lr``
    over ``warmup_steps`` steps (step ``t`` < warmup gets ``lr * (t + 1) / warmup_steps``), then
    decay by a cosine or a straight line to ``lr * end_lr_factor`` at the last step, stay
    constant, or decay in steps (:func:`step_decay`). ``warmup_cosine`` is
    ``optax.warmup_cosine_decay_schedule``: the warmup starts at 0 (step 0 updates nothing) and
    reaches ``lr`` at step ``warmup_steps``, one step later than ``cosine``'s, then the same cosine.
    """
    decay_steps = max(total_steps - cfg.warmup_steps, 1)
    if cfg.schedule == "warmup_cosine":
        # optax.warmup_cosine_decay_schedule, written out: optax's own compares the peak with 0, which
        # a sweep member's traced learning rate cannot answer.
        warmup = optax.linear_schedule(0.0, cfg.lr, cfg.warmup_steps)
        cosine = optax.cosine_decay_schedule(cfg.lr, decay_steps, cfg.end_lr_factor)
        return optax.join_schedules([warmup, cosine], [cfg.warmup_steps])
    if cfg.schedule == "constant":
        main = optax.constant_schedule(cfg.lr)
    elif cfg.schedule == "step":
        # Counted from the end of warmup, like every schedule joined after it.
        main = step_decay(cfg.lr, cfg.decay_start - cfg.warmup_steps, cfg.decay_every, cfg.decay_factor)
    elif cfg.schedule == "linear":
        main = optax.linear_schedule(cfg.lr, cfg.lr * cfg.end_lr_factor, decay_steps)
    else:
        main = optax.cosine_decay_schedule(cfg.lr, decay_steps, cfg.end_lr_factor)
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


#: Your own optimizer: an optax transformation, or a function of the learning-rate schedule returning one.
UserOptimizer = optax.GradientTransformation | Callable[[optax.Schedule], optax.GradientTransformation]

#: The settings of the built-in optimizers, which an optimizer of your own replaces.
BUILT_IN_KEYS = ("name", "momentum", "nesterov", "b1", "b2", "weight_decay", "decay_mask")
#: The settings of the schedule, which a fixed transformation (its own learning rate) does not read.
SCHEDULE_KEYS = ("lr", "schedule", "warmup_steps", "end_lr_factor", "decay_start", "decay_every", "decay_factor")


def build(
    cfg: OptimConfig, total_steps: int, updates_per_step: int = 1, optimizer: UserOptimizer | None = None
) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """The optax transformation (clipping, then the optimizer) and its schedule (of the step).

    With ``updates_per_step > 1`` (asynchronous SGD applies one update per simulated worker in
    each step) the optimizer is called that many times a step; its learning rate still follows
    the schedule by step, so warmup and decay last as many steps as in a synchronous run.
    The numbers of ``cfg`` (lr, momentum, b1, b2, weight_decay, end_lr_factor, clip_norm) may be
    traced arrays: a sweep builds each member's optimizer inside its vmapped step.

    ``optimizer`` (yours: an ``optax.GradientTransformation``, or a function of the schedule
    returning one, ``lambda lr: optax.lion(lr)``) replaces ``cfg.name`` and the built-in
    optimizers' settings (:data:`BUILT_IN_KEYS`). What jaxnet still wraps around it is only what
    the config asks for: clipping to ``clip_norm`` if it is > 0 (before your transformation sees
    the gradients) and ``freeze`` (frozen parameters are masked out of it: it keeps no state for
    them and they get a zero update). A function of the schedule gets the schedule of ``cfg``
    (lr, schedule, warmup); a transformation carries its own learning rate. Gradient accumulation
    and ``train.on_nonfinite=skip`` act in the step, around any optimizer.
    """
    by_step = extended_schedule(cfg, total_steps)
    lr = by_step if updates_per_step == 1 else (lambda count: by_step(count // updates_per_step))
    opt = built_in(cfg, lr) if optimizer is None else custom(optimizer, lr)
    if not off(cfg.clip_norm):
        opt = optax.chain(optax.clip_by_global_norm(cfg.clip_norm), opt)
    if cfg.freeze:
        # Frozen parameters are masked out of the optimizer (no moments kept for them), and their
        # update is zero, so they stay bitwise what they started as. Clipping sees only the others.
        opt = optax.partition({"train": opt, "frozen": optax.set_to_zero()}, freeze_labels(cfg.freeze))
    return opt, by_step


def built_in(cfg: OptimConfig, lr: optax.Schedule) -> optax.GradientTransformation:
    """The optimizer ``cfg.name`` names, at learning rate ``lr``, its weight decay on the
    parameters :func:`decay_mask` picks."""
    decay = not off(cfg.weight_decay)
    # No mask without decay: the transformation is then the one jaxnet built before masks existed.
    mask = decay_mask(cfg) if decay else None
    if cfg.name == "sgd":
        return optax.chain(
            optax.add_decayed_weights(cfg.weight_decay, mask) if decay else optax.identity(),
            optax.sgd(lr, momentum=None if off(cfg.momentum) else cfg.momentum, nesterov=cfg.nesterov),
        )
    if cfg.name == "lion":
        return optax.lion(lr, b1=cfg.b1, b2=cfg.b2, weight_decay=cfg.weight_decay, mask=mask)
    if cfg.name == "adafactor":
        return optax.adafactor(lr, weight_decay_rate=cfg.weight_decay if decay else None, weight_decay_mask=mask)
    return optax.adamw(lr, b1=cfg.b1, b2=cfg.b2, weight_decay=cfg.weight_decay, mask=mask)


#: Parameter names that weight decay skips under ``optim.decay_mask=matrices`` whatever their rank.
NO_DECAY_NAMES = ("bias", "scale")


def decay_mask(cfg: OptimConfig) -> Callable[[Any], Any] | None:
    """Which parameters weight decay acts on: None for all of them (``optim.decay_mask=all``, and
    ``auto`` for SGD, whose decay is an L2 term as in the classic ResNet recipes), else a function
    of the parameters giving True for the matrices (``matrices``, and ``auto`` for adamw, lion and
    adafactor): parameters of 2 or more dimensions not named bias or scale, so biases, norm
    scales and other vectors keep their size, as in GPT-2's and nanoGPT's recipes.
    """
    rule = cfg.decay_mask if cfg.decay_mask != "auto" else ("all" if cfg.name == "sgd" else "matrices")
    if rule == "all":
        return None

    def decayed(path: tuple, x: Any) -> bool:
        value = x.value if _is_box(x) else x
        name = joined(path[-1:]) if path else ""
        return len(getattr(value, "shape", ())) >= 2 and name not in NO_DECAY_NAMES

    # A parameter boxed with its logical axis names is one leaf here, as in freeze_labels.
    return lambda params: jax.tree_util.tree_map_with_path(decayed, params, is_leaf=_is_box)


def custom(optimizer: UserOptimizer, lr: optax.Schedule) -> optax.GradientTransformation:
    """Your optimizer as a transformation: itself, or what it returns given the schedule ``lr``."""
    if isinstance(optimizer, optax.GradientTransformation):
        return optimizer
    if not callable(optimizer):
        raise UserError(
            f"optimizer is a {type(optimizer).__name__}; pass an optax.GradientTransformation (optax.lion(1e-4)) or "
            "a function of the learning-rate schedule returning one (lambda lr: optax.lion(lr)); for a built-in "
            "optimizer set optim.name"
        )
    tx = optimizer(lr)
    if not isinstance(tx, optax.GradientTransformation):
        raise UserError(
            f"optimizer {describe(optimizer)} returned a {type(tx).__name__}, not an optax.GradientTransformation; "
            "return one, e.g. lambda lr: optax.lion(lr)"
        )
    return tx


def reads_schedule(optimizer: UserOptimizer | None) -> bool:
    """Whether the learning rate follows the config's schedule (the built-in optimizers and a
    function of the schedule) rather than a fixed transformation's own."""
    return not isinstance(optimizer, optax.GradientTransformation)


def unused(cfg: OptimConfig, optimizer: UserOptimizer | None) -> list[str]:
    """The ``optim.*`` keys set away from their defaults that ``optimizer`` leaves unread (none for
    the built-in optimizers): printed as a notice, and refused as swept keys by ``jaxnet sweep``."""
    if optimizer is None:
        return []
    names = BUILT_IN_KEYS + (() if reads_schedule(optimizer) else SCHEDULE_KEYS)
    default = type(cfg)()
    return [f"optim.{k}" for k in names if _differs(getattr(cfg, k), getattr(default, k))]


def _differs(value: Any, default: Any) -> bool:
    return isinstance(value, jax.core.Tracer) or value != default


def describe(optimizer: Any) -> str:
    """A name for ``optimizer`` for config.json and messages: a function's module and name (a
    lambda's source line), a transformation's optax parts (``chain(scale_by_lion, ...)``)."""
    if isinstance(optimizer, optax.GradientTransformation):
        return _parts(optimizer.init)
    name = f"{getattr(optimizer, '__module__', '')}.{getattr(optimizer, '__qualname__', type(optimizer).__name__)}"
    if getattr(optimizer, "__name__", "") == "<lambda>":
        try:
            source = inspect.getsource(optimizer).strip()
        except (OSError, TypeError):
            return name
        return _expression(source[source.find("lambda") :].split("\n")[0])[:120]
    return name.lstrip(".")


def _expression(text: str) -> str:
    """The expression ``text`` starts with: up to a comment, or a comma or bracket that closes
    something opened before it (``lambda lr: optax.lion(lr)),`` -> ``lambda lr: optax.lion(lr)``)."""
    depth = 0
    for i, c in enumerate(text):
        if c in "([{":
            depth += 1
        elif c in ")]}" or (c in ",#" and depth == 0):
            if depth == 0:
                return text[:i].strip()
            depth -= 1
    return text.strip()


def _parts(init: Any, depth: int = 0) -> str:
    """``chain(scale_by_lion, add_decayed_weights, ...)``: the optax functions that made an
    ``init``, read from its name and the inits it closes over (best effort)."""
    name = getattr(init, "__qualname__", type(init).__name__).split(".<locals>")[0]
    inner = []
    for cell in getattr(init, "__closure__", None) or ():
        try:
            content = cell.cell_contents
        except ValueError:
            continue
        items = content if isinstance(content, tuple | list) else (content,)
        inner += [i for i in items if ".<locals>" in getattr(i, "__qualname__", "")]
    inner = [i for i in inner if _parts(i, 3) != name]  # a helper of the same transformation
    if inner and depth < 3:
        return f"{name}({', '.join(_parts(i, depth + 1) for i in inner)})"
    return name


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

"""Keep the best checkpoint (``train.keep_best=METRIC``) and stop early (:func:`early_stop`).

A watched metric is a validation metric, ``val/NAME``: after every validation pass
(``train.eval_every``) its value is compared with the best so far, and a better one is saved as a
checkpoint at that step (if that step is not saved anyway) and named the best in
``checkpoints/best.json`` (:func:`jaxnet.checkpoint.best_step`). The newest-N rotation
(``train.keep_checkpoints``) never deletes it, and a resumed run (after Ctrl-C, a preemption or
``train.stop_after``) goes on comparing with the same best.

Whether lower or higher is better follows from the metric's name (:func:`direction`, the one
place that decides it); ``min:`` or ``max:`` before the name says it for any other metric::

    jaxnet train cnn_fashion_mnist train.eval_every=100 train.keep_best=val/accuracy
    jaxnet.early_stop("max:val/top2", patience=5)
"""

from __future__ import annotations

import difflib
import math
import re
from dataclasses import dataclass
from typing import Any

from jaxnet.errors import UserError
from jaxnet.models.adapters.lora import BASE as lora_base
from jaxnet.train.actions import Action, Checkpoint, Loop, Validate

# Words in a metric's name that say which way is better: ``val/bits_per_byte`` is lower-better
# (``bits``), ``val/top2`` higher-better (``top``, its digits aside). A name with words of
# neither kind, or of both, needs ``min:`` or ``max:``.
LOWER_IS_BETTER = frozenset(
    "loss losses error errors err nll perplexity ppl bpc bits mse mae rmse mape msle wer cer cost distance".split()
)
HIGHER_IS_BETTER = frozenset(
    "accuracy acc f1 precision recall auc auroc r2 iou dice top bleu rouge map score correlation".split()
)
MODES = ("min", "max")


def direction(name: str) -> str | None:
    """``min`` if a lower value of the metric ``name`` is better, ``max`` if a higher one is, None
    if its name does not say (then write ``min:NAME`` or ``max:NAME``).

    >>> direction("val/loss"), direction("val/accuracy"), direction("val/top2"), direction("val/hamming")
    ('min', 'max', 'max', None)
    """
    words = [w for w in re.split(r"[^a-z0-9]+", name.lower()) if w]
    lower = any(w in LOWER_IS_BETTER or w.rstrip("0123456789") in LOWER_IS_BETTER for w in words)
    higher = any(w in HIGHER_IS_BETTER or w.rstrip("0123456789") in HIGHER_IS_BETTER for w in words)
    if lower == higher:
        return None
    return "min" if lower else "max"


@dataclass(frozen=True)
class Watch:
    """A validation metric to watch: ``name`` as the val metrics call it, and ``mode`` (min or max)."""

    name: str
    mode: str

    @property
    def metric(self) -> str:
        """``val/NAME``, as written in ``train.keep_best`` and best.json."""
        return f"val/{self.name}"


def parse(spec: str, mode: str | None, where: str, names: list[str] | None) -> Watch:
    """The :class:`Watch` of ``[min:|max:]val/NAME``; ``names`` are the validation metrics, if known
    before the first validation pass. ``where`` names the setting in errors."""
    head, colon, rest = spec.partition(":")
    prefix = head if colon and head in MODES else None
    metric = rest if prefix else spec
    if mode is not None and mode not in MODES:
        raise UserError(f"{where}: mode={mode!r}; give 'min' (lower is better), 'max' or None (from the name)")
    if prefix and mode and prefix != mode:
        raise UserError(f"{where}: the metric says {prefix}: but mode={mode!r}; give one")
    split, slash, name = metric.partition("/")
    if not slash or split != "val" or not name or (names is not None and name not in names):
        raise unknown_metric(spec, where, names)
    mode = prefix or mode or direction(name)
    if mode is None:
        raise UserError(
            f"{where}: cannot tell whether a lower or a higher {metric} is better; write min:{metric} or max:{metric}"
        )
    return Watch(name, mode)


def unknown_metric(spec: str, where: str, names: list[str] | None) -> UserError:
    """The one-line error for a watched metric that the validation passes do not report."""
    if names is None:
        return UserError(f"{where}: {spec!r} is not a validation metric; write val/NAME, e.g. val/loss")
    choices = [f"val/{n}" for n in names]
    bare = spec.rpartition(":")[2].rpartition("/")[2]
    near = difflib.get_close_matches(bare, names, n=1)
    hint = f"did you mean val/{near[0]}? " if near else ""
    return UserError(
        f"{where}: {spec!r} is not a validation metric; {hint}the validation metrics are {', '.join(choices)} "
        "(min: or max: before a name says which way is better)"
    )


def val_metric_names(task: Any) -> list[str] | None:
    """The names of ``task``'s validation metrics (its loss, its metrics, what it derives from them),
    found without evaluating; None if its ``finalize`` cannot be run on stand-in values."""
    means = {"loss": 1.0, **dict.fromkeys(task.metrics, 1.0)}
    try:
        return list(task.summarize(means))
    except Exception:  # a user's finalize on made-up means: the names are then checked at the first pass
        return None


class EarlyStop(Action):
    """Stop the run once the watched validation metric has not improved for ``patience`` passes.

    Made by :func:`early_stop`; the runner binds it to the run's best-checkpoint record.
    """

    def __init__(self, metric: str, patience: int, min_delta: float = 0.0, mode: str | None = None):
        if not isinstance(patience, int) or isinstance(patience, bool) or patience < 1:
            raise UserError(f"early_stop({metric!r}, patience={patience!r}): give a number of validation passes >= 1")
        if not isinstance(min_delta, (int, float)) or isinstance(min_delta, bool) or not min_delta >= 0:
            raise UserError(f"early_stop({metric!r}, min_delta={min_delta!r}): give a number >= 0")
        if not isinstance(metric, str):
            raise UserError(f"early_stop(metric={metric!r}): give a validation metric's name, e.g. 'val/loss'")
        self.metric, self.patience, self.min_delta, self.mode = metric, patience, float(min_delta), mode
        self.name = f"early_stop({metric!r})"
        self.best: Best | None = None
        self.stopped_at: int | None = None

    def bind(self, best: Best) -> None:
        """Watch ``best`` (the runner calls this before the first step)."""
        self.best, self.stopped_at = best, None

    def due(self, loop: Loop) -> bool:
        return self.best is not None and self.best.checked == loop.step and loop.step > loop.start

    def begin(self, loop: Loop) -> None:
        if self.best is None:
            raise UserError(f"{self.name} is for jaxnet.train and jaxnet train (not a sweep)")
        # A run stopped early whose final evaluation was interrupted: it is over, whatever is rerun.
        best = self.best
        if loop.start and best.step is not None and best.passes_without_gain(loop.start) >= self.patience:
            self._stop(loop)

    def __call__(self, loop: Loop) -> None:
        if self.best is not None and self.best.passes_without_gain(loop.step) >= self.patience:
            self._stop(loop)

    def _stop(self, loop: Loop) -> None:
        self.stopped_at = loop.step
        loop.stop()


def early_stop(metric: str, patience: int, min_delta: float = 0.0, mode: str | None = None) -> EarlyStop:
    """An action that ends the run, as complete, once validation ``metric`` has not improved by more
    than ``min_delta`` for ``patience`` validation passes in a row (``train.eval_every`` steps apart).

    The best checkpoint is kept (it implies ``train.keep_best=metric``), and the run's final val and
    test metrics in summary.json are those of the best checkpoint, with ``stopped_early`` saying
    where it stopped. Rerunning a run that stopped early says it is complete and trains no further.
    ``mode`` (``"min"`` or ``"max"``, or ``min:``/``max:`` before the metric) is needed only for a
    metric whose name does not say which way is better (:func:`jaxnet.train.best.direction`)::

        jaxnet.train(cfg, "runs/a", actions=[jaxnet.early_stop("val/loss", patience=3)])

    An experiment file returns it from ``actions(cfg)`` for ``jaxnet train FILE.py``.
    """
    return EarlyStop(metric, patience, min_delta, mode)


class Plan:
    """What a run keeps and stops on: the watched metric, and the early-stop action, if any."""

    def __init__(self, watch: Watch, stop: EarlyStop | None, eval_every: int, where: str, spec: str):
        self.watch, self.stop, self.eval_every = watch, stop, eval_every
        self.where, self.spec = where, spec  # the setting and the metric as written, for errors


def plan(cfg: Any, run: Any, actions: list[Action]) -> Plan | None:
    """Check ``train.keep_best`` and any :func:`early_stop` among ``actions`` against the run
    before anything is written: one watched metric, validation passes to compare, a validation
    split, a metric the passes report. None if the run keeps no best."""
    stops = [a for a in actions if isinstance(a, EarlyStop)]
    if len(stops) > 1:
        raise UserError(f"{len(stops)} early_stop actions ({', '.join(s.name for s in stops)}); give one")
    stop = stops[0] if stops else None
    if not cfg.train.keep_best and stop is None:
        return None
    names = val_metric_names(run.task)
    watch = parse(cfg.train.keep_best, None, "train.keep_best", names) if cfg.train.keep_best else None
    where, spec = ("train.keep_best", cfg.train.keep_best) if watch is not None else (stop.name, stop.metric)
    if stop is not None:
        stop_watch = parse(stop.metric, stop.mode, stop.name, names)
        if watch is not None and stop_watch != watch:
            raise UserError(
                f"{stop.name} watches {stop_watch.mode}:{stop_watch.metric} but train.keep_best="
                f"{cfg.train.keep_best}; the best checkpoint is the one early stopping keeps: give one metric"
            )
        watch = stop_watch
    assert watch is not None
    if not cfg.train.eval_every:
        raise UserError(
            f"{where} compares validation passes, but train.eval_every=0 runs none before the end; "
            "set train.eval_every=STEPS"
        )
    if not run.dataset.size("val"):
        raise UserError(f"{where} watches {watch.metric}, but the data has no validation split; give it one")
    return Plan(watch, stop, cfg.train.eval_every, where, spec)


class Best:
    """The best value of the watched metric so far and its step, recorded through the run's
    :class:`jaxnet.checkpoint.Checkpoints` (so a resumed run compares with the same best)."""

    def __init__(self, plan: Plan, ckpts: Any, start: int):
        self.watch, self.ckpts, self.every, self.plan = plan.watch, ckpts, plan.eval_every, plan
        self.stop = plan.stop
        self.min_delta = plan.stop.min_delta if plan.stop is not None else 0.0
        self.use_best = plan.stop is not None  # early stopping evaluates the best checkpoint at the end
        self.step: int | None = None
        self.value: float | None = None
        self.checked: int | None = None  # the step of the latest comparison
        record = ckpts.best()
        # A record of another metric, or of a step past the restored one (an older checkpoint was
        # restored in its place), is not this run's best so far: the best is found again.
        if (
            record is not None
            and record.get("metric") == self.watch.metric
            and record.get("mode") == self.watch.mode
            and isinstance(record.get("value"), (int, float))
            and record["step"] <= start
            and record["step"] in ckpts.all_steps()
        ):
            self.step, self.value = record["step"], float(record["value"])
        if self.stop is not None:
            self.stop.bind(self)

    @property
    def stopped_early(self) -> bool:
        """Whether early stopping ended the run."""
        return self.stop is not None and self.stop.stopped_at is not None

    def improves(self, value: float) -> bool:
        """Whether ``value`` beats the best so far by more than ``min_delta`` (a NaN never does)."""
        if not math.isfinite(value):
            return False
        if self.value is None:
            return True
        if self.watch.mode == "min":
            return value < self.value - self.min_delta
        return value > self.value + self.min_delta

    def passes_without_gain(self, step: int) -> int:
        """Validation passes up to ``step`` since the best one (since the start if none was finite)."""
        return (step - (self.step or 0)) // self.every

    def consider(self, step: int, val: dict[str, float]) -> bool:
        """Compare the validation metrics at ``step`` with the best; True if they are the new best
        (whose checkpoint the caller saves, if it has not)."""
        if self.watch.name not in val:
            raise unknown_metric(self.plan.spec, self.plan.where, list(val))
        self.checked = step
        value = float(val[self.watch.name])
        if not self.improves(value):
            return False
        self.step, self.value = step, value
        return True

    def record(self) -> dict[str, Any]:
        """The best so far as summary.json and best.json give it."""
        return {"metric": self.watch.metric, "mode": self.watch.mode, "step": self.step, "value": self.value}

    def save(self) -> None:
        """Name the current best in best.json (its checkpoint saved or saving)."""
        self.ckpts.set_best(self.step, {"metric": self.watch.metric, "mode": self.watch.mode, "value": self.value})


class KeepBest(Action):
    """After each validation pass: a better value of the watched metric is saved as a checkpoint at
    that step and named the best."""

    def __init__(self, best: Best, validate: Validate, checkpoint: Checkpoint):
        self.best, self.validate, self.checkpoint = best, validate, checkpoint

    def due(self, loop: Loop) -> bool:
        return self.validate.last is not None and self.validate.last[0] == loop.step

    def __call__(self, loop: Loop) -> None:
        step, val = self.validate.last
        if self.best.consider(step, val):
            self.checkpoint.save(loop)
            self.best.save()


def final_metrics(best: Best, run: Any, loop: Loop, log: Any) -> dict[str, Any]:
    """The summary fields of a run that keeps its best checkpoint, at its end (its last step or
    an early stop): val and test metrics, ``best``, and ``stopped_early`` with the step it stopped.

    At the last step the final state's validation is one more candidate for the best. With early
    stopping the val and test metrics are those of the best checkpoint (``evaluated_step``);
    otherwise those of the final state, as in any run.
    """
    end, stop = loop.end, best.stop
    stopped = best.stopped_early and end < run.cfg.train.steps
    val: dict[str, float] = {}
    if not stopped:
        val = run.evaluate(loop.state, "val")
        if val:
            log.write(end, "val", val)
        if val and best.consider(end, val):
            best.save()  # the last step's checkpoint is sealed already
    fields: dict[str, Any] = {}
    state = loop.state
    if best.use_best and best.step is not None and best.step != end:
        base = loop.state.model_state.get(lora_base)  # a LoRA run's frozen base: not in its checkpoints
        state = run.restore(best.ckpts, best.step, say=None, base=base)
        val = run.evaluate(state, "val")
        fields["evaluated_step"] = best.step
    elif not val:  # stopped early with no finite value to keep: the final state, as it is
        val = run.evaluate(state, "val")
    test = run.evaluate(state, "test")
    if test:
        log.write(end, "test", test)
    fields.update({"val": val, "test": test} if test else {"val": val})
    if best.step is not None:
        fields["best"] = best.record()
    if stopped:
        fields["complete"] = True
        fields["stopped_early"] = {
            "step": end,
            "best_step": best.step,
            "metric": best.watch.metric,
            "value": best.value,
            "patience": stop.patience,
            "min_delta": stop.min_delta,
        }
    return fields


def describe(summary: dict[str, Any]) -> str | None:
    """The printed line about the best checkpoint and an early stop, or None."""
    best, stopped = summary.get("best"), summary.get("stopped_early")
    kept = f"best {best['metric']} {best['value']:.4g} at step {best['step']}" if best else "no finite best"
    if stopped:
        evaluated = "its checkpoint" if best else "the last state"
        return (
            f"stopped early at step {stopped['step']} of {summary['steps_total']}: {stopped['metric']} did not "
            f"improve for {stopped['patience']} validation passes; {kept}, {evaluated} evaluated below"
        )
    return f"{kept} (checkpoint kept)" if best else None

"""Periodic actions: everything the runner does around the step, as small objects.

The loop core (:func:`jaxnet.train.loop.run_loop`) only steps; after every step it calls each
action that is due, in order. An action is due every ``every`` steps, and after the last step
with ``at_end``. An action that is not due costs one integer comparison: no host
synchronisation. Actions see the run through a :class:`Loop` view: ``step`` (updates done),
``state``, ``workdir``, ``log(...)``, ``note(...)``, ``stop()``.

Your own action is a function of the view with an ``every``, e.g. text samples every 500 steps::

    jaxnet.train(cfg, "runs/a", actions=[jaxnet.every(500, lambda loop: loop.log({"norm": norm(loop.state)}))])
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax

from jaxnet.errors import UserError
from jaxnet.observe import headline

# Train-step metrics that are counts or step numbers, not per-step values to average.
COUNTS = ("nonfinite", "first_nonfinite")


def nonfinite_error(first: int, last_good: int, workdir: Path) -> UserError:
    """The error that stops a run whose loss or gradient became NaN or Inf at update ``first``."""
    newest = f"the newest checkpoint is step {last_good}" if last_good else "there is no checkpoint yet"
    return UserError(
        f"the loss or gradient became NaN or Inf at step {first}; {newest} in {workdir}. Likely causes: a "
        "learning rate too high (lower optim.lr or add optim.warmup_steps), exploding gradients (set "
        "optim.clip_norm), or NaN/Inf in the data; or set train.on_nonfinite=skip to skip such updates"
    )


class Action:
    """Something done after a step: every ``every`` steps (0 = never), and after the last step
    of the invocation with ``at_end``. Override :meth:`__call__`; ``begin`` runs once before the
    first step, ``finish`` once after the last one when the run ended without an error."""

    every: int = 0
    at_end: bool = False

    def due(self, loop: Loop) -> bool:
        """Whether to act after update ``loop.step``."""
        return bool(self.every and loop.step % self.every == 0) or (self.at_end and loop.step == loop.end)

    def begin(self, loop: Loop) -> None:
        """Before the first step of this invocation."""

    def __call__(self, loop: Loop) -> None:
        """After a step at which the action is due."""

    def finish(self, loop: Loop) -> None:
        """After the last step, when no error ended the run."""

    def close(self, loop: Loop) -> None:
        """After the loop, whatever happened (release what ``begin`` took)."""


class Every(Action):
    """``fn(loop)`` every ``every`` steps (and after the last one with ``at_end``)."""

    def __init__(self, every: int, fn: Callable[[Loop], Any], at_end: bool = False):
        if not isinstance(every, int) or isinstance(every, bool) or every < 1:
            raise UserError(f"an action's every={every!r}: give a number of steps >= 1")
        if not callable(fn):
            raise UserError(f"every({every}, {fn!r}): the action must be a function of the loop view")
        self.every, self.fn, self.at_end = every, fn, at_end
        self.name = getattr(fn, "__name__", type(fn).__name__)

    def __call__(self, loop: Loop) -> None:
        self.fn(loop)


def every(steps: int, fn: Callable[[Loop], Any], at_end: bool = False) -> Every:
    """An action calling ``fn(loop)`` every ``steps`` steps; see :class:`Loop` for what it sees."""
    return Every(steps, fn, at_end)


def as_action(obj: Any) -> Action:
    """An :class:`Action` from an action, or any callable with an ``every`` attribute."""
    if isinstance(obj, Action):
        return obj
    if callable(obj) and hasattr(obj, "every"):
        return Every(obj.every, obj, bool(getattr(obj, "at_end", False)))
    raise UserError(f"action {obj!r} has no 'every'; wrap it as jaxnet.every(STEPS, fn) or give it an every attribute")


class Loop:
    """What an action sees of a running loop.

    ``step``: updates done so far. ``state``: the train state after them (on the devices; reading
    a value waits for the device). ``end``: the step this invocation stops at. ``workdir``,
    ``run`` (the :class:`jaxnet.train.loop.Run`: config, model, data, task).
    """

    def __init__(self, run: Any, workdir: Path, state: Any, start: int, end: int, log: Any, progress: Any, skip: bool):
        self.run, self.cfg, self.workdir = run, run.cfg, workdir
        self.state, self.start, self.step, self.end = state, start, start, end
        self._log, self.progress, self.skip = log, progress, skip
        self.sums: Any = None  # the train metrics since the last log line, summed on the device
        self.interval_steps = 0
        self.interval_start = time.perf_counter()
        self.paused = 0.0  # seconds spent in evaluations: not part of the step time
        self.saved_step = start
        self._totals: tuple[int, dict] | None = None

    def log(self, values: dict[str, float], split: str = "train") -> None:
        """Write ``values`` at the current step to metrics.jsonl and TensorBoard."""
        self._log.write(self.step, split, {k: float(v) if hasattr(v, "dtype") else v for k, v in values.items()})

    def note(self, message: str) -> None:
        """Print a line (above the progress bar)."""
        self.progress.note(message)

    def stop(self) -> None:
        """End the run after this step, with a checkpoint; the same command resumes it."""
        self.end = self.step

    def totals(self) -> dict[str, Any]:
        """The summed train metrics since the last log line, on the host (the host waits for the
        device here). A NaN or Inf loss among them stops the run unless updates are skipped."""
        if self._totals is None or self._totals[0] != self.step:
            totals = jax.device_get(self.sums)
            bad = int(totals["nonfinite"])
            if bad and not self.skip:
                raise nonfinite_error(int(totals["first_nonfinite"]), self.saved_step, self.workdir)
            self._totals = (self.step, totals)
        return self._totals[1]

    def timed(self, fn: Callable[[], Any]) -> Any:
        """``fn()``, its time left out of the steps' time (for evaluations). The steps already
        dispatched finish first: JAX runs them asynchronously, and their time is the steps' (waited
        for inside ``fn``, it made the speed of an interval with an evaluation in it look faster:
        13.3 steps/s against 7-9 in benchmarks/results/train-lstm_ptb_small-cpu-2026-11-21.json)."""
        jax.block_until_ready(self.state)
        started = time.perf_counter()
        try:
            return fn()
        finally:
            spent = time.perf_counter() - started
            self.paused += spent
            self.interval_start += spent


class StopOnSignal(Action):
    """SIGTERM / SIGINT received: end the run after this call of the step (with a checkpoint).

    The processes of a multi-process run agree where to stop by counting calls, not updates: JAX's
    preemption sync point is one number every process must pass exactly, and with several steps
    a call (``train.steps_per_call``) the update count jumps over it."""

    every = 1

    def __init__(self, interrupts: Any):
        self.interrupts = interrupts
        self.calls = 0  # calls of this invocation: every process takes the same ones

    def __call__(self, loop: Loop) -> None:
        self.calls += 1
        if self.interrupts.stop_after(self.calls):
            loop.stop()


class Profile(Action):
    """Trace updates A to B (``profile.steps=A-B``) for TensorBoard's profiler and Perfetto."""

    every = 1

    def __init__(self, first: int, last: int):
        self.first, self.last, self.tracing = first, last, False

    def _start_if_next_is_traced(self, loop: Loop) -> None:
        if not self.tracing and self.first <= loop.step + 1 <= self.last and loop.step < loop.end:
            jax.profiler.start_trace(str(loop.workdir / "profile"), create_perfetto_trace=True)
            self.tracing = True

    def begin(self, loop: Loop) -> None:
        self._start_if_next_is_traced(loop)

    def __call__(self, loop: Loop) -> None:
        if self.tracing and loop.step >= self.last:
            jax.block_until_ready(loop.state)
            jax.profiler.stop_trace()
            self.tracing = False
            where = loop.workdir / "profile"
            loop.note(
                f"trace of updates {max(self.first, loop.start + 1)}-{loop.step} written to {where}: "
                f"`tensorboard --logdir {where}` (profile plugin), or open its "
                "plugins/profile/*/perfetto_trace.json.gz at ui.perfetto.dev"
            )
        elif loop.step < loop.end:
            self._start_if_next_is_traced(loop)

    def close(self, loop: Loop) -> None:
        if self.tracing:
            jax.profiler.stop_trace()


def interval_values(totals: dict[str, Any], steps: int, skip: bool, task: Any) -> dict[str, float]:
    """The mean train metrics of ``steps`` updates from their summed ``totals`` (updates with a
    NaN or Inf loss left out, NaN if every one was), ``skipped`` when such updates are skipped,
    and what the task derives from them."""
    bad = int(totals["nonfinite"])
    finite_steps = steps - bad
    values = {k: float(v) / max(finite_steps, 1) for k, v in totals.items() if k not in COUNTS}
    if not finite_steps:  # every update of the interval was skipped: nothing to average
        values = dict.fromkeys(values, float("nan"))
    if skip:
        values["skipped"] = bad
    return task.summarize(values)


class LogTrain(Action):
    """Every ``train.log_every`` steps and at the end: the interval's mean train metrics, the
    learning rate and the speed, to metrics.jsonl, TensorBoard and the progress bar."""

    at_end = True

    def __init__(self, every: int, lr_schedule: Callable | None, batch_size: int, tokens_per_example: int = 0):
        self.every, self.lr_schedule = every, lr_schedule
        self.batch_size, self.tokens_per_example = batch_size, tokens_per_example

    def __call__(self, loop: Loop) -> None:
        values = interval_values(loop.totals(), loop.interval_steps, loop.skip, loop.run.task)
        now = time.perf_counter()
        rate = loop.interval_steps / (now - loop.interval_start)
        if self.lr_schedule is not None:  # None: an optax transformation of the user's, its rate its own
            values["lr"] = float(self.lr_schedule(loop.step - 1))
        values.update(steps_per_s=rate, examples_per_s=rate * self.batch_size)
        if self.tokens_per_example:
            values["tokens_per_s"] = values["examples_per_s"] * self.tokens_per_example
        seen = getattr(loop.run.dataset, "seen", None)
        if seen is not None:  # a mixture: the tokens read from each corpus so far (from the step alone)
            values.update(seen(loop.cfg, loop.step))
        loop.log(values)
        shown = {"loss": values["loss"]}
        first_metric = next((k for k in loop.run.task.metrics if not k.startswith("_")), None)
        if first_metric is not None:
            shown[first_metric] = values[first_metric]
        loop.progress.update(loop.step, {**shown, "steps/s": rate})
        loop.sums, loop.interval_steps = None, 0
        loop.interval_start = now


class Validate(Action):
    """Every ``train.eval_every`` steps (not at the run's last step, which evaluates anyway): the
    validation metrics; ``stop_when(step, metrics)`` returning True ends the run there."""

    def __init__(self, every: int, steps: int, stop_when: Callable[[int, dict], bool] | None = None):
        self.every, self.steps, self.stop_when = every, steps, stop_when
        self.last: tuple[int, dict[str, float]] | None = None  # (step, metrics) of the latest pass, for keep_best

    def due(self, loop: Loop) -> bool:
        return super().due(loop) and loop.step != self.steps

    def __call__(self, loop: Loop) -> None:
        val = loop.timed(lambda: loop.run.evaluate(loop.state, "val"))
        self.last = (loop.step, val)
        if val:
            loop.log(val, "val")
            loop.note(f"step {loop.step}: {headline(val, 'val')}")
            if self.stop_when is not None and self.stop_when(loop.step, val):
                loop.stop()


class Checkpoint(Action):
    """Every ``train.checkpoint_every`` steps, and after the last step: an orbax checkpoint
    (asynchronous), never of a state past a NaN or Inf loss that stops the run."""

    def __init__(self, every: int, ckpts: Any):
        self.every, self.ckpts = every, ckpts

    def due(self, loop: Loop) -> bool:
        # The last step is saved by finish(); a step saved already (the best so far) is not saved twice.
        return super().due(loop) and loop.step != loop.end and loop.saved_step != loop.step

    def __call__(self, loop: Loop) -> None:
        self.save(loop)

    def save(self, loop: Loop) -> None:
        """Save the state after this step now, unless it is saved already."""
        if loop.saved_step == loop.step:
            return
        loop.totals()  # a NaN among the steps since the last log line stops the run before it is saved
        self._save(loop)

    def finish(self, loop: Loop) -> None:
        if loop.end > loop.saved_step:
            self._save(loop)
        self.ckpts.wait()

    def _save(self, loop: Loop) -> None:
        self.ckpts.save(loop.step, loop.state)
        loop.saved_step = loop.step


__all__ = ["Action", "Every", "Loop", "as_action", "every"]

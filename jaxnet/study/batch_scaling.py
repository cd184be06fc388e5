"""Batch-size scaling: how many steps (and examples) a model needs to reach a target validation
metric as the batch grows, and where doubling the batch stops halving the steps.

    jaxnet study batch-scaling cnn_fashion_mnist batch=32,64,128,256,512,1024 --target 0.9

**Method.** For each batch size ``b`` the experiment trains in its own run directory
(``WORKDIR/b<b>/``, the runner's output in ``WORKDIR/b<b>.log``) with

- ``train.batch_size=b`` and the learning rate scaled from the experiment's own ``b0`` and
  ``lr0`` (after any ``key=value`` overrides) by ``--lr-rule``: ``linear`` ``lr0 * b / b0``
  (Goyal et al., 2017), ``sqrt`` ``lr0 * sqrt(b / b0)`` (Krizhevsky, 2014; Hoffer et al., 2017), or
  ``none``;
- the schedule fixed in *examples*, not steps, whatever the rule: warmup lasts
  ``warmup_steps * b0`` examples (``warmup_steps * b0 / b`` steps), a ``step`` schedule's
  ``decay_start`` and ``decay_every`` are scaled by ``b0 / b`` likewise, and the cosine decay
  runs over the whole budget ``--max-examples`` (default: the experiment's own
  ``train.steps * b0``), rounded up to the evaluation grid;
- a validation pass every ``--eval-examples`` examples, the same grid of examples for every
  batch size (so it must be a multiple of every ``b``; by default about 16 passes per budget).

A run stops at the first validation pass whose metric reaches ``--target`` (accuracy >= target
for image classifiers; perplexity, bits per character or bits per byte <= target for language
models: whichever the runner reports for the data). That step is its *steps to target* and
``step * b`` its *examples to target*; both are exact to one grid interval (``--eval-examples``
examples). A batch size that spends its budget without reaching the target is recorded with
``null``, not dropped.

**Perfect scaling and the critical batch size.** Perfect scaling, anchored at the smallest batch
``b_a`` that reached the target, is ``S(b_a) * b_a / b`` steps: doubling the batch halves the
steps, and examples to target stay constant. A batch size's *slowdown* is its steps over the
perfect-scaling steps (= its examples over ``b_a``'s examples). The **critical batch size** is
the largest ``b`` such that it and every batch size between ``b_a`` and it reached the target
with a slowdown of at most ``--tolerance`` (default 2: twice the examples of perfect scaling,
the point McCandlish et al. (2018) call the critical batch); the first batch size past it is
where the measured curve *departs* from the line.

**Reuse.** Rerunning the study with the same settings reuses every finished point (a run that
reached the target, or spent its budget) and resumes an interrupted one from its checkpoint;
a run directory made with other settings (another budget or rule) is refused rather than mixed.
Writes ``WORKDIR/batch_scaling.json`` and ``WORKDIR/batch_scaling.png``.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from jaxnet import config as config_lib
from jaxnet.errors import UserError
from jaxnet.study import common

LR_RULES = ("linear", "sqrt", "none")
SMOKE_MAX_EXAMPLES = 2048


@dataclasses.dataclass
class Options:
    """What ``jaxnet study batch-scaling`` was asked to do."""

    experiment: str
    batches: list[int]
    target: float | None = None
    lr_rule: str = "linear"
    max_examples: int | None = None
    eval_examples: int | None = None
    tolerance: float = 2.0
    smoke: bool = False
    workdir: str | None = None
    overrides: list[str] = dataclasses.field(default_factory=list)
    command: str | None = None
    say: Callable[[str], None] = print


# ---------------------------------------------------------------------------------------------
# Pure pieces: the learning-rate rule, the per-batch config, the scaling analysis


def scaled_lr(lr0: float, b0: int, b: int, rule: str) -> float:
    """The learning rate for batch ``b`` from ``lr0`` at ``b0`` by ``rule``.

    >>> scaled_lr(0.1, 128, 512, "linear"), scaled_lr(0.1, 128, 512, "sqrt"), scaled_lr(0.1, 128, 512, "none")
    (0.4, 0.2, 0.1)
    """
    if rule == "linear":
        return lr0 * b / b0
    if rule == "sqrt":
        return lr0 * math.sqrt(b / b0)
    if rule == "none":
        return lr0
    raise UserError(f"--lr-rule {rule!r} is not one of: {', '.join(LR_RULES)}")


def example_grid(batches: Sequence[int], max_examples: int, eval_examples: int | None) -> tuple[int, int]:
    """``(eval_examples, budget)``: the examples between validation passes (a multiple of every
    batch size) and the budget rounded up to a whole number of passes.

    >>> example_grid([64, 128, 256], 10_000, None)
    (512, 10240)
    """
    lcm = math.lcm(*batches)
    if eval_examples is None:
        eval_examples = lcm * max(1, round(max_examples / 16 / lcm))
    elif eval_examples % lcm:
        raise UserError(
            f"--eval-examples {eval_examples} is not a multiple of every batch size ({lcm} is the smallest "
            "that is); every batch size is evaluated on the same grid of examples"
        )
    return eval_examples, eval_examples * max(1, math.ceil(max_examples / eval_examples))


def point_overrides(base: config_lib.Config, b: int, rule: str, eval_examples: int, budget: int) -> list[str]:
    """The overrides that turn the experiment's config ``base`` into the run for batch size ``b``."""
    b0, o, t = base.train.batch_size, base.optim, base.train
    steps = budget // b
    eval_steps = eval_examples // b
    scale = b0 / b  # steps of b0 per step of b: keeps schedule lengths fixed in examples
    overrides = [
        f"train.batch_size={b}",
        f"optim.lr={scaled_lr(o.lr, b0, b, rule)!r}",
        f"optim.warmup_steps={min(steps, round(o.warmup_steps * scale))}",
        f"train.steps={steps}",
        f"train.eval_every={eval_steps}",
        f"train.checkpoint_every={eval_steps if t.checkpoint_every else 0}",
        f"train.log_every={t.log_every if eval_steps % t.log_every == 0 else eval_steps}",
        "train.progress=false",
    ]
    if o.schedule == "step":
        overrides += [
            f"optim.decay_start={round(o.decay_start * scale)}",
            f"optim.decay_every={max(1, round(o.decay_every * scale))}",
        ]
    return overrides


def scaling_analysis(batches: Sequence[int], steps: Sequence[int | None], tolerance: float = 2.0) -> dict[str, Any]:
    """Perfect scaling, slowdowns and the critical batch size from measured steps to target.

    ``steps[i]`` is the steps batch size ``batches[i]`` needed (None: never reached). Perfect
    scaling is anchored at the smallest batch that reached the target. Returns ``anchor``,
    ``perfect_steps`` and ``slowdown`` (measured / perfect, None where not reached) per batch,
    ``critical_batch`` (the largest batch such that it and every batch from the anchor up to it
    reached the target within ``tolerance`` times perfect scaling) and ``departs_at`` (the first
    batch past it, or None)::

        >>> r = scaling_analysis([64, 128, 256, 512], [1000, 520, 300, 400])
        >>> r["perfect_steps"], r["critical_batch"], r["departs_at"]
        ([1000.0, 500.0, 250.0, 125.0], 256, 512)
    """
    order = sorted(range(len(batches)), key=lambda i: batches[i])
    bs = [batches[i] for i in order]
    ss = [steps[i] for i in order]
    reached = [i for i, s in enumerate(ss) if s is not None]
    result: dict[str, Any] = {
        "batches": bs,
        "steps": ss,
        "tolerance": tolerance,
        "anchor": None,
        "perfect_steps": [None] * len(bs),
        "slowdown": [None] * len(bs),
        "critical_batch": None,
        "departs_at": None,
    }
    if not reached:
        return result
    a = reached[0]
    anchor_steps, anchor_batch = ss[a], bs[a]
    result["anchor"] = anchor_batch
    result["perfect_steps"] = [anchor_steps * anchor_batch / b for b in bs]
    result["slowdown"] = [None if s is None else s / p for s, p in zip(ss, result["perfect_steps"], strict=True)]
    for i in range(a, len(bs)):
        slowdown = result["slowdown"][i]
        if slowdown is None or slowdown > tolerance:
            result["departs_at"] = bs[i]
            break
        result["critical_batch"] = bs[i]
    return result


def first_reached(curve: Sequence[tuple[int, float]], metric: str, target: float) -> tuple[int, float] | None:
    """The first ``(step, value)`` of a validation curve that meets ``target``, or None."""
    return next(((s, v) for s, v in curve if common.meets(metric, v, target)), None)


# ---------------------------------------------------------------------------------------------
# Running the study


def _default_target(metric: str, smoke: bool) -> float:
    if metric == "accuracy":
        return 0.5 if smoke else 0.9
    raise UserError(
        f"this experiment is judged by validation {metric}; pass the value to reach with --target "
        f"(e.g. --target {'150' if metric == 'perplexity' else '2.0'})"
    )


def run(opts: Options) -> dict[str, Any]:
    """Train every batch size (reusing finished runs), then analyse; returns the study's record."""
    if opts.lr_rule not in LR_RULES:
        raise UserError(f"--lr-rule {opts.lr_rule!r} is not one of: {', '.join(LR_RULES)}")
    if opts.tolerance <= 1:
        raise UserError(f"--tolerance {opts.tolerance}: must be above 1 (1 = perfect scaling exactly)")
    spec = opts.experiment + (":smoke" if opts.smoke and ":" not in opts.experiment else "")
    base = config_lib.load_experiment(spec, opts.overrides)
    if opts.smoke:
        base = common.smoke_settings(base)
    metric = common.headline_metric(base)
    target = opts.target if opts.target is not None else _default_target(metric, opts.smoke)
    max_examples = opts.max_examples or (SMOKE_MAX_EXAMPLES if opts.smoke else base.train.steps * base.train.batch_size)
    if max_examples < 1:
        raise UserError(f"--max-examples {max_examples}: must be positive")
    eval_examples, budget = example_grid(opts.batches, max_examples, opts.eval_examples)
    configs = {}
    for b in opts.batches:  # every config is checked before anything trains
        try:
            configs[b] = config_lib.apply_overrides(base, point_overrides(base, b, opts.lr_rule, eval_examples, budget))
        except UserError as e:
            raise UserError(f"batch={b}: {e}") from None
    workdir = common.study_workdir(opts.workdir, f"batch-scaling-{spec}")
    for b, cfg in configs.items():
        common.check_reusable(workdir / f"b{b}", cfg)
    opts.say(
        f"batch-scaling {spec}: validation {metric} {'>=' if common.higher_is_better(metric) else '<='} {target}, "
        f"base batch {base.train.batch_size} at lr {base.optim.lr:g}, {opts.lr_rule} rule, budget {budget:,} "
        f"examples, a validation pass every {eval_examples:,} examples; runs in {workdir}"
    )
    dataset = common.load_dataset(base)
    points = [_run_point(b, cfg, workdir, dataset, metric, target, opts.say) for b, cfg in configs.items()]
    analysis = scaling_analysis(
        [p["batch_size"] for p in points], [p["steps_to_target"] for p in points], opts.tolerance
    )
    for p, perfect, slowdown in zip(points, analysis["perfect_steps"], analysis["slowdown"], strict=True):
        p["perfect_steps"], p["slowdown"] = perfect, slowdown
    return {
        "kind": "study-batch-scaling",
        "experiment": spec,
        "overrides": opts.overrides,
        "metric": metric,
        "higher_is_better": common.higher_is_better(metric),
        "target": target,
        "lr_rule": opts.lr_rule,
        "base_batch_size": base.train.batch_size,
        "base_lr": base.optim.lr,
        "base_warmup_steps": base.optim.warmup_steps,
        "budget_examples": budget,
        "eval_every_examples": eval_examples,
        "tolerance": opts.tolerance,
        "critical_batch_rule": (
            f"largest batch b such that b and every batch from the anchor (the smallest that reached the target) "
            f"up to b reached the target in at most {opts.tolerance:g}x the steps of perfect scaling "
            "(steps halve when the batch doubles)"
        ),
        "anchor_batch": analysis["anchor"],
        "critical_batch": analysis["critical_batch"],
        "departs_at": analysis["departs_at"],
        "points": points,
        "environment": common.environment(opts.command),
        "workdir": str(workdir),
    }


def _run_point(
    b: int, cfg: config_lib.Config, workdir: Path, dataset: Any, metric: str, target: float, say: Callable
) -> dict[str, Any]:
    run_dir = workdir / f"b{b}"
    hit = first_reached(common.val_curve(run_dir, metric), metric, target)
    summary = _summary(run_dir)
    reused = hit is not None or bool(summary and summary.get("complete"))
    started = time.perf_counter()
    if not reused:
        summary = common.train_quietly(
            cfg,
            run_dir,
            workdir / f"b{b}.log",
            dataset=dataset,
            stop_when=lambda step, val: common.meets(metric, val.get(metric), target),
        )
        if summary.get("interrupted_by"):
            raise KeyboardInterrupt
    curve = common.val_curve(run_dir, metric)
    hit = first_reached(curve, metric, target)
    point = {
        "batch_size": b,
        "lr": cfg.optim.lr,
        "warmup_steps": cfg.optim.warmup_steps,
        "budget_steps": cfg.train.steps,
        "steps_to_target": hit[0] if hit else None,
        "examples_to_target": hit[0] * b if hit else None,
        "reached": hit is not None,
        "val_at_target": hit[1] if hit else None,
        "final_val": curve[-1][1] if curve else None,
        "final_step": curve[-1][0] if curve else None,
        "val_curve": [[s, v] for s, v in curve],
        "steps_per_s": (summary or {}).get("steps_per_s"),
        "wall_time_s": (summary or {}).get("wall_time_s"),
        "reused": reused,
        "workdir": str(run_dir),
    }
    outcome = (
        f"reached {metric} {hit[1]:.4g} at step {hit[0]:,} ({hit[0] * b:,} examples)"
        if hit
        else f"did not reach the target in {cfg.train.steps:,} steps (best {_best(curve, metric)})"
    )
    took = "reused" if reused else f"{time.perf_counter() - started:.0f} s"
    say(f"batch {b:>6}: lr {cfg.optim.lr:.4g}: {outcome} [{took}]")
    return point


def _summary(run_dir: Path) -> dict[str, Any] | None:
    import json

    try:
        return json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return None


def _best(curve: Sequence[tuple[int, float]], metric: str) -> str:
    if not curve:
        return "no validation pass"
    pick = max if common.higher_is_better(metric) else min
    return f"{pick(v for _, v in curve):.4g}"


# ---------------------------------------------------------------------------------------------
# Reporting


def report(record: dict[str, Any]) -> str:
    """The table of batch sizes and the answer, as printed."""
    rows = [
        ("batch", "lr", "warmup", "steps to target", "examples to target", "x perfect", f"final val {record['metric']}")
    ]
    for p in record["points"]:
        rows.append(
            (
                p["batch_size"],
                f"{p['lr']:.4g}",
                p["warmup_steps"],
                common.fmt(p["steps_to_target"]) if p["reached"] else "not reached",
                common.fmt(p["examples_to_target"]) if p["reached"] else "-",
                "-" if p["slowdown"] is None else f"{p['slowdown']:.2f}",
                common.fmt(p["final_val"]),
            )
        )
    return common.table(rows) + "\n" + answer(record)


def answer(record: dict[str, Any]) -> str:
    """One sentence: the critical batch size by the study's rule, and where the curve departs."""
    tol = record["tolerance"]
    if record["anchor_batch"] is None:
        return (
            f"no batch size reached validation {record['metric']} {record['target']} within "
            f"{record['budget_examples']:,} examples: no critical batch size (raise --max-examples or ease --target)"
        )
    crit, departs = record["critical_batch"], record["departs_at"]
    text = (
        f"critical batch size: {crit} (the largest batch whose steps to target stay within {tol:g}x of perfect "
        f"scaling from batch {record['anchor_batch']}, as do all batches between)"
    )
    if departs is None:
        return text + "; the measured curve stays within that band up to the largest batch tried"
    point = next(p for p in record["points"] if p["batch_size"] == departs)
    how = f"{point['slowdown']:.2f}x perfect" if point["reached"] else "never reached the target"
    return text + f"; the curve departs at batch {departs} ({how})"


def plot(record: dict[str, Any], path: Path) -> None:
    """Steps to target and examples to target against batch size (log-log), with perfect scaling."""
    plt = common.pyplot()
    points = record["points"]
    hit = [p for p in points if p["reached"]]
    missed = [p for p in points if not p["reached"]]
    tol = record["tolerance"]
    fig, (ax_steps, ax_examples) = plt.subplots(1, 2, figsize=(11, 4.5))
    for ax, key in ((ax_steps, "steps_to_target"), (ax_examples, "examples_to_target")):
        if hit:
            ax.plot([p["batch_size"] for p in hit], [p[key] for p in hit], "o-", color="C0", label="measured")
        if missed:  # drawn at the budget: the target lies somewhere above
            budget = [p["budget_steps"] * (1 if key == "steps_to_target" else p["batch_size"]) for p in missed]
            ax.plot([p["batch_size"] for p in missed], budget, "x", color="C3", ms=10, label="not reached (budget)")
    if record["anchor_batch"] is not None:
        bs = [p["batch_size"] for p in points if p["batch_size"] >= record["anchor_batch"]]
        perfect = [p["perfect_steps"] for p in points if p["batch_size"] >= record["anchor_batch"]]
        ax_steps.plot(bs, perfect, "--", color="k", label="perfect scaling (steps halve per doubling)")
        ax_steps.plot(bs, [tol * s for s in perfect], ":", color="gray", label=f"{tol:g}x perfect")
        anchor_examples = next(p["examples_to_target"] for p in points if p["batch_size"] == record["anchor_batch"])
        ax_examples.axhline(anchor_examples, ls="--", color="k", label="perfect scaling (same examples)")
        ax_examples.axhline(tol * anchor_examples, ls=":", color="gray", label=f"{tol:g}x perfect")
        for ax in (ax_steps, ax_examples):
            if record["critical_batch"] is not None:
                ax.axvline(
                    record["critical_batch"], color="C2", alpha=0.6, label=f"critical batch {record['critical_batch']}"
                )
            if record["departs_at"] is not None:
                ax.axvline(
                    record["departs_at"], color="C3", alpha=0.3, ls="-.", label=f"departs at {record['departs_at']}"
                )
    for ax, name in ((ax_steps, "steps to target"), (ax_examples, "examples to target")):
        ax.set_xscale("log", base=2)
        ax.set_xticks([p["batch_size"] for p in points], [str(p["batch_size"]) for p in points])
        ax.minorticks_off()
        ax.set_yscale("log")
        ax.set_xlabel("batch size")
        ax.set_ylabel(name)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
    sign = ">=" if record["higher_is_better"] else "<="
    fig.suptitle(
        f"{record['experiment']}: validation {record['metric']} {sign} {record['target']:g}, "
        f"lr rule {record['lr_rule']} (base {record['base_lr']:g} at batch {record['base_batch_size']})"
    )
    common.save_figure(fig, path)


def main(opts: Options) -> dict[str, Any]:
    """Run the study, print the table and the answer, write the JSON and the PNG."""
    record = run(opts)
    common.write_outputs(record, "batch_scaling", plot, report(record), opts.say)
    return record

"""Asynchronous SGD: how stale gradients slow learning, per update and in modelled wall-clock time,
against synchronous SGD on the same batches.

    jaxnet study async cnn_fashion_mnist staleness=0,1,2,4,8,16 workers=4

**Method.** The experiment trains once per staleness ``K`` with ``parallel.sgd=async
parallel.staleness=K parallel.workers=W``: each step splits its batch of ``b`` into ``W`` worker
shards of ``b / W`` and applies ``W`` sequential updates, update ``u`` using a gradient computed
on the parameters after update ``u - 1 - K`` (so ``updates = steps * W``; see
:func:`jaxnet.train.step.make_async_train_step`). A ``parallel.sgd=sync`` baseline trains the
same steps with one update per step from the whole batch. Every run is in its own directory
(``WORKDIR/async-k<K>/``, ``WORKDIR/sync/``; the runner's output in ``WORKDIR/<run>.log``) and is
reused when the study is rerun with the same settings. Validation passes come every
``train.eval_every`` steps (by default about 8 per run, unless set with an override).

**The wall-clock model.** Nothing here runs on ``W`` machines, so time is modelled from two
quantities:

- ``t_c``, the compute time of one worker's gradient on ``b / W`` examples: the sync baseline's
  measured time per step (the median over its logged training intervals, the whole batch on this
  machine) divided by ``W``;
- ``t_comm``, the time of one exchange with the parameter server or the all-reduce: ``--comm-ms``,
  or by default sending a float32 gradient and receiving float32 parameters over a 10 Gbit/s link,
  ``2 * 4 * P / 1.25e9`` seconds for ``P`` parameters (a ring all-reduce moves about as much).

Workers' compute times vary: each takes ``t_c * (1 + s * E)`` with ``E`` exponential of mean 1 and
``s`` = ``--jitter`` (default 0.2). Synchronous SGD waits for the slowest of ``W`` workers, whose
expected time is ``t_c * (1 + s * H_W)`` (``H_W`` = 1 + 1/2 + ... + 1/W), then exchanges: one
update costs ``t_c * (1 + s * H_W) + t_comm``. Asynchronous workers never wait: each delivers an
update every ``t_c * (1 + s) + t_comm`` on average, so ``W`` updates arrive per such interval and
one costs ``(t_c * (1 + s) + t_comm) / W``. The plot's time axis is updates times that cost.

**Limits.** The staleness is a fixed ``K`` (or with ``parallel.delay=random`` a uniform draw), not
the delay distribution real workers produce; the model has no contention at a parameter server,
no bandwidth shared between workers and no failures; and ``t_c`` comes from this machine. What
it can show is the algorithmic cost of staleness (updates needed) and, under the stated model, the
trade-off against synchronous SGD's waiting; it cannot show real speed-ups.

Writes ``WORKDIR/async.json`` and ``WORKDIR/async.png``.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from jaxnet import config as config_lib
from jaxnet.errors import UserError
from jaxnet.study import common

DEFAULT_WORKERS = 4
LINK_BYTES_PER_S = 1.25e9  # 10 Gbit/s
SMOKE_STEPS = 16


@dataclasses.dataclass
class Options:
    """What ``jaxnet study async`` was asked to do."""

    experiment: str
    staleness: list[int]
    workers: int | None = None
    comm_ms: float | None = None
    jitter: float = 0.2
    smoke: bool = False
    workdir: str | None = None
    overrides: list[str] = dataclasses.field(default_factory=list)
    command: str | None = None
    say: Callable[[str], None] = print


def harmonic(n: int) -> float:
    """``1 + 1/2 + ... + 1/n``: the expected maximum of ``n`` exponential variables of mean 1.

    >>> round(harmonic(4), 4)
    2.0833
    """
    return sum(1 / k for k in range(1, n + 1))


def seconds_per_update(sgd: str, workers: int, t_compute: float, t_comm: float, jitter: float) -> float:
    """Modelled wall-clock seconds per update (see the module docstring).

    >>> seconds_per_update("sync", 4, 0.010, 0.002, 0.0), seconds_per_update("async", 4, 0.010, 0.002, 0.0)
    (0.012, 0.003)
    """
    if sgd == "sync":
        return t_compute * (1 + jitter * harmonic(workers)) + t_comm
    return (t_compute * (1 + jitter) + t_comm) / workers


def default_comm_seconds(param_count: int) -> float:
    """Send a float32 gradient and receive float32 parameters over a 10 Gbit/s link."""
    return 2 * 4 * param_count / LINK_BYTES_PER_S


def run(opts: Options) -> dict[str, Any]:
    """Train the sync baseline and every staleness (reusing finished runs); returns the study's record."""
    if "parallel.sgd" not in config_lib.keys():
        raise UserError("this jaxnet has no parallel.sgd setting yet: asynchronous SGD is not available")
    spec = opts.experiment + (":smoke" if opts.smoke and ":" not in opts.experiment else "")
    workers = opts.workers or DEFAULT_WORKERS
    given = {o.partition("=")[0].strip() for o in opts.overrides}
    for key in ("parallel.sgd", "parallel.staleness", "parallel.workers"):
        if key in given:
            raise UserError(f"{key} is set by the study (staleness=... workers=...); leave it out of the overrides")
    extra = [f"train.steps={SMOKE_STEPS}"] if opts.smoke and "train.steps" not in given else []
    base = config_lib.load_experiment(spec, [*extra, *opts.overrides])
    if opts.smoke:
        base = common.smoke_settings(base)
    if "train.eval_every" not in given:
        every = max(1, base.train.steps // (4 if opts.smoke else 8))
        checkpoints = f"train.checkpoint_every={every if base.train.checkpoint_every else 0}"
        base = config_lib.apply_overrides(base, [f"train.eval_every={every}", checkpoints])
    metric = common.headline_metric(base)
    plans = [("sync", 0, ["parallel.sgd=sync"])] + [
        (f"async-k{k}", k, ["parallel.sgd=async", f"parallel.staleness={k}", f"parallel.workers={workers}"])
        for k in opts.staleness
    ]
    configs = {}
    for name, _, overrides in plans:
        try:
            configs[name] = config_lib.apply_overrides(base, [*overrides, "train.progress=false"])
        except UserError as e:
            raise UserError(f"{name}: {e}") from None
    workdir = common.study_workdir(opts.workdir, f"async-{spec}")
    for name, cfg in configs.items():
        common.check_reusable(workdir / name, cfg)
    opts.say(
        f"async {spec}: {workers} workers, staleness {','.join(map(str, opts.staleness))} and a sync baseline, "
        f"{base.train.steps} steps of {base.train.batch_size}, validation {metric}; runs in {workdir}"
    )
    dataset = common.load_dataset(base)
    runs = [_run_one(name, k, configs[name], workdir, dataset, metric, opts.say) for name, k, _ in plans]
    sync = runs[0]
    if not sync["steps_per_s"]:
        raise UserError(f"the sync baseline in {workdir / 'sync'} has no measured step time; delete it and rerun")
    t_compute = 1 / sync["steps_per_s"] / workers
    t_comm = opts.comm_ms / 1000 if opts.comm_ms is not None else default_comm_seconds(sync["param_count"])
    for r in runs:
        r["seconds_per_update"] = seconds_per_update(r["sgd"], workers, t_compute, t_comm, opts.jitter)
        r["curve"] = [
            {
                "step": s,
                "updates": s * r["updates_per_step"],
                "modelled_s": s * r["updates_per_step"] * r["seconds_per_update"],
                metric: v,
            }
            for s, v in r.pop("val_curve")
        ]
        r["modelled_total_s"] = r["curve"][-1]["modelled_s"] if r["curve"] else None
    return {
        "kind": "study-async",
        "experiment": spec,
        "overrides": opts.overrides,
        "metric": metric,
        "higher_is_better": common.higher_is_better(metric),
        "workers": workers,
        "batch_size": base.train.batch_size,
        "steps": base.train.steps,
        "model": {
            "t_compute_s": t_compute,
            "t_comm_s": t_comm,
            "t_comm_source": "--comm-ms"
            if opts.comm_ms is not None
            else "float32 gradient out and parameters in over 10 Gbit/s",
            "jitter": opts.jitter,
            "sync_seconds_per_update": "t_c * (1 + jitter * H_W) + t_comm",
            "async_seconds_per_update": "(t_c * (1 + jitter) + t_comm) / W",
        },
        "runs": runs,
        "environment": common.environment(opts.command),
        "workdir": str(workdir),
    }


def _run_one(
    name: str, k: int, cfg: config_lib.Config, workdir: Path, dataset: Any, metric: str, say: Callable
) -> dict[str, Any]:
    import json

    run_dir = workdir / name
    try:
        summary = json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        summary = None
    reused = bool(summary and summary.get("complete"))
    started = time.perf_counter()
    if not reused:
        summary = common.train_quietly(cfg, run_dir, workdir / f"{name}.log", dataset=dataset)
        if summary.get("interrupted_by"):
            raise KeyboardInterrupt
    curve = common.val_curve(run_dir, metric)
    sgd = cfg.parallel.sgd
    result = {
        "name": name,
        "sgd": sgd,
        "staleness": k if sgd == "async" else None,
        "updates_per_step": cfg.parallel.workers if sgd == "async" else 1,
        "steps_per_s": common.measured_steps_per_s(run_dir) or summary.get("steps_per_s"),
        "param_count": summary.get("param_count"),
        "final_val": curve[-1][1] if curve else None,
        "val_curve": curve,
        "wall_time_s": summary.get("wall_time_s"),
        "reused": reused,
        "workdir": str(run_dir),
    }
    took = "reused" if reused else f"{time.perf_counter() - started:.0f} s"
    final = "no validation pass" if not curve else f"final val {metric} {curve[-1][1]:.4g}"
    say(f"{name:>10}: {final} after {cfg.train.steps * result['updates_per_step']:,} updates [{took}]")
    return result


def report(record: dict[str, Any]) -> str:
    """The table of runs as printed."""
    metric = record["metric"]
    pick = max if record["higher_is_better"] else min
    rows = [("run", "updates", f"final val {metric}", f"best val {metric}", "ms / update (model)", "modelled time")]
    for r in record["runs"]:
        values = [p[metric] for p in r["curve"]]
        rows.append(
            (
                r["name"],
                f"{r['curve'][-1]['updates']:,}" if r["curve"] else "-",
                common.fmt(r["final_val"]),
                common.fmt(pick(values) if values else None),
                f"{1000 * r['seconds_per_update']:.3g}",
                "-" if r["modelled_total_s"] is None else f"{r['modelled_total_s']:.3g} s",
            )
        )
    m = record["model"]
    return common.table(rows) + (
        f"\nmodel: t_c {1000 * m['t_compute_s']:.3g} ms per worker gradient, t_comm {1000 * m['t_comm_s']:.3g} ms, "
        f"jitter {m['jitter']:g}, {record['workers']} workers"
    )


def plot(record: dict[str, Any], path: Path) -> None:
    """Validation metric against updates and against modelled wall-clock time, one line per run."""
    plt = common.pyplot()
    metric = record["metric"]
    fig, (ax_updates, ax_time) = plt.subplots(1, 2, figsize=(11, 4.5))
    for i, r in enumerate(record["runs"]):
        if not r["curve"]:
            continue
        style = dict(color="k", ls="--", lw=2) if r["sgd"] == "sync" else dict(color=f"C{i % 10}")
        label = "sync" if r["sgd"] == "sync" else f"async, staleness {r['staleness']}"
        values = [p[metric] for p in r["curve"]]
        ax_updates.plot([p["updates"] for p in r["curve"]], values, marker="o", ms=3, label=label, **style)
        ax_time.plot([p["modelled_s"] for p in r["curve"]], values, marker="o", ms=3, label=label, **style)
    for ax, name in ((ax_updates, "updates"), (ax_time, "modelled wall-clock time (s)")):
        ax.set_xlabel(name)
        ax.set_ylabel(f"validation {metric}")
        if metric == "perplexity":
            ax.set_yscale("log")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    m = record["model"]
    fig.suptitle(
        f"{record['experiment']}: {record['workers']} workers, batch {record['batch_size']}; model t_c "
        f"{1000 * m['t_compute_s']:.3g} ms, t_comm {1000 * m['t_comm_s']:.3g} ms, jitter {m['jitter']:g}"
    )
    common.save_figure(fig, path)


def main(opts: Options) -> dict[str, Any]:
    """Run the study, print the table, write ``async.json`` and ``async.png``."""
    record = run(opts)
    common.write_outputs(record, "async", plot, report(record), opts.say)
    return record

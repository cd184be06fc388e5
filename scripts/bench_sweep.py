"""A batched sweep against the same runs one after another: wall time from start to finish
(compilation, steps, evaluation and checkpoints included), per experiment.

    python scripts/bench_sweep.py                      # 8 members of cnn_fashion_mnist and transformer_shakespeare
    python scripts/bench_sweep.py --members 8,32 --steps 300

Each experiment's grid is learning rates x seeds (``--members`` of them); both sides get the same
data object (loaded once) and the same settings: ``--steps`` updates, evaluation and a checkpoint
at the end only. The runs one after another are ``jaxnet.train`` calls, as a shell loop over
``jaxnet train`` would make them, less the process start. Writes
benchmarks/results/sweep-speed-<platform>-<date>.json and prints the table.

    python scripts/bench_sweep.py --per-step --steps 5  # one step: a run's, vmapped, looped

``--per-step`` times one train step instead (milliseconds per member-step and the fresh memory
touched per call, from minor page faults) three ways, each compiled once, warmed up by one call
and timed over ``--steps`` calls: the run's own step, the members vmapped all at once, and the
members one after another in a loop inside the program (``--members-at-once 1``); writes
benchmarks/results/sweep-step-<platform>-<date>.json. :func:`jaxnet.sweep.members_at_once` bases
its CPU default on it.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import io
import json
import resource
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

LRS = (5e-4, 1e-3, 2e-3, 4e-3, 8e-3, 1.6e-2, 3.2e-2, 6.4e-2)


def grid(members: int) -> dict[str, list]:
    """``members`` configurations: learning rates x seeds (2 seeds, or 4 from 32 members up)."""
    seeds = 2 if members < 32 else 4
    if members % seeds or members // seeds > len(LRS):
        raise SystemExit(f"--members {members}: give an even number up to {2 * len(LRS)}, or a multiple of 4 to 32")
    return {"optim.lr": list(LRS[: members // seeds]), "seed": list(range(seeds))}


def measure(experiment: str, members: int, steps: int, workdir: Path, alone_runs: int = 0) -> dict:
    import jaxnet
    from jaxnet import config
    from jaxnet.study import common
    from jaxnet.sweep import expand, parse

    settings = [
        f"train.steps={steps}",
        "train.eval_every=0",
        "train.checkpoint_every=0",
        "train.progress=false",
        f"train.log_every={max(steps // 4, 1)}",
        "optim.warmup_steps=0",
    ]
    base = config.load_experiment(experiment, settings)
    dataset = common.load_dataset(base)
    g = grid(members)
    quiet = io.StringIO()
    started = time.perf_counter()
    with contextlib.redirect_stdout(quiet):
        record = jaxnet.sweep(base, g, workdir / "batched", dataset=dataset, say=lambda _: None)
    batched = time.perf_counter() - started
    tokens = [f"{k}={','.join(str(v) for v in vs)}" for k, vs in g.items()]
    runs = expand(base, parse(tokens)[0])
    timed = runs[: alone_runs or len(runs)]
    started = time.perf_counter()
    with contextlib.redirect_stdout(quiet):
        for m in timed:
            jaxnet.train(m.cfg, workdir / "one-by-one" / m.name, dataset=dataset)
    one_by_one = (time.perf_counter() - started) * len(runs) / len(timed)
    timing = record["timings"][0]
    return {
        "experiment": experiment,
        "members": members,
        "steps": steps,
        "batch_size": base.train.batch_size,
        "grid": g,
        "batched_wall_s": round(batched, 2),
        "one_by_one_wall_s": round(one_by_one, 2),
        "one_by_one_runs_timed": len(timed),  # fewer than members: the rest taken to cost the same
        "speedup": round(one_by_one / batched, 3),
        "members_at_once": timing["members_at_once"],  # vmapped together; the program loops over the rest
        "batched_compile_s": timing["compile_time_s"],
        "batched_steps_per_s": timing["steps_per_s"],
        "member_steps_per_s_batched": round(timing["steps_per_s"] * members, 2) if timing["steps_per_s"] else None,
    }


def timed(step, state, batches: list) -> tuple[float, float]:
    """Seconds and minor page faults per call of ``step`` over ``batches[1:]`` (``batches[0]`` warms up)."""
    import jax

    state, metrics = step(state, batches[0])
    jax.block_until_ready(metrics)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    started = time.perf_counter()
    for batch in batches[1:]:
        state, metrics = step(state, batch)
    jax.block_until_ready((state, metrics))
    calls = len(batches) - 1
    seconds = time.perf_counter() - started
    return seconds / calls, (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults) / calls


def measure_steps(experiment: str, members: int, steps: int) -> list[dict]:
    """``--per-step``: a run's step, the members vmapped all at once, and the members in a loop."""
    from jaxnet import config
    from jaxnet.study import common
    from jaxnet.sweep import Population, expand, parse
    from jaxnet.train.loop import Run

    base = config.load_experiment(experiment, ["train.progress=false", "optim.warmup_steps=0"])
    dataset = common.load_dataset(base)
    tokens = [f"optim.lr={','.join(str(1e-3 * (i + 1)) for i in range(members // 2))}", "seed=0,1"]
    group = expand(base, parse(tokens)[0])
    rows = []
    for name, at_once in (("run's own step", None), ("vmapped all at once", 0), ("loop, one at a time", 1)):
        # a run and a population provide the same train_batches, put_batch, init_state and train_step
        one = (
            Run(group[0].cfg, dataset=dataset)
            if at_once is None
            else Population(group, dataset=dataset, at_once=at_once)
        )
        size = 1 if at_once is None else one.size
        stream = iter(one.train_batches(0))
        batches = [one.put_batch(next(stream)) for _ in range(steps + 1)]
        seconds, faults = timed(one.train_step, one.init_state(), batches)
        rows.append(
            {
                "experiment": experiment,
                "step": name,
                "members": size,
                "members_at_once": 1 if at_once is None else one.at_once,
                "ms_per_call": round(seconds * 1e3, 1),
                "ms_per_member_step": round(seconds * 1e3 / size, 1),
                "fresh_mib_per_call": round(faults * resource.getpagesize() / 2**20, 1),
            }
        )
        print(
            f"{experiment}: {name:22s} {rows[-1]['ms_per_member_step']:8.1f} ms per member-step, "
            f"{rows[-1]['fresh_mib_per_call']:7.1f} MiB of fresh pages per call",
            flush=True,
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--experiments", default="cnn_fashion_mnist,transformer_shakespeare")
    parser.add_argument("--members", default="8", help="comma-separated member counts, e.g. 8,32")
    parser.add_argument("--steps", type=int, default=200, help="steps of each run (--per-step: timed calls)")
    parser.add_argument("--per-step", action="store_true", help="time one train step three ways instead")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    parser.add_argument(
        "--alone-runs", type=int, default=0, help="time only this many runs one by one and scale (0 = all of them)"
    )
    args = parser.parse_args()

    import jax

    from jaxnet import observe

    rows = []
    if args.per_step:
        for experiment in args.experiments.split(","):
            rows += measure_steps(experiment, int(args.members.split(",")[0]), args.steps)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            for experiment in args.experiments.split(","):
                for members in (int(m) for m in args.members.split(",")):
                    row = measure(
                        experiment,
                        members,
                        args.steps,
                        Path(tmp) / f"{experiment}-{members}",
                        args.alone_runs,
                    )
                    rows.append(row)
                    print(
                        f"{experiment}: {members} members x {args.steps} steps: batched {row['batched_wall_s']:.1f} s, "
                        f"one by one {row['one_by_one_wall_s']:.1f} s, speed-up {row['speedup']:.2f}x "
                        f"({row['members_at_once']} member(s) per vmapped step)",
                        flush=True,
                    )
    platform = jax.devices()[0].platform
    kind = "sweep-step" if args.per_step else "sweep-speed"
    record = {
        "kind": kind,
        "command": " ".join(["python", *sys.argv]),
        "date": datetime.date.today().isoformat(),
        "device": jax.devices()[0].device_kind if platform != "cpu" else observe.cpu_model(),
        "device_count": jax.device_count(),
        "environment": observe.environment(),
        "rows": rows,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{kind}-{platform}-{record['date']}.json"
    path.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()

"""Where a CPU step's time goes, operation by operation, and how each peer uses the cores.

    python scripts/profile_ops.py                       # lstm transformer: the families behind PyTorch
    python scripts/profile_ops.py cnn lstm transformer --steps 10 --rounds 2

For each family, in fresh processes:

1. **XLA's trace** (``jax.profiler``) of the runner's compiled step: the time of every operation
   (a "thunk" of XLA's CPU runtime) summed per step, grouped by what runs it: YNNPACK's matrix
   products, XLA's own (Eigen) products, YNNPACK's reductions, XLA's loop fusions (elementwise
   work, its own reductions, transposes), copies; with the ten costliest operations named by the
   model code they come from (the HLO ``op_name``).
2. **Use of the cores**: the step's wall time with every core and with one (``taskset``), for
   jaxnet's compiled step and for the PyTorch peer (``jaxnet/bench/torch_peers.py``), alternating.
   A peer that gains less from the second core loses on a machine whose single core is slower.

Writes ``benchmarks/results/cpu-ops-<date>.json`` with the device, versions, load and date.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import glob
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def _case(family: str, overrides: tuple[str, ...] = ()):
    from jaxnet import bench
    from jaxnet import config as config_lib

    case = bench.CASES[family]
    cfg = config_lib.apply_overrides(bench.case_config(case, smoke=False), list(overrides))
    return cfg, bench.case_dataset(case, cfg)


def trace(family: str, steps: int) -> dict:
    """XLA's per-operation times of ``steps`` steps of ``family``'s compiled step (this process)."""
    import jax
    from jax.profiler import ProfileData

    from jaxnet.data import pipeline
    from jaxnet.train.loop import Run

    cfg, dataset = _case(family)
    run = Run(cfg, dataset=dataset)
    state = run.init_state()
    batches = pipeline.prefetch(((1, b) for b in run.train_batches(0)), cfg.data.prefetch, run.put_call)
    _, batch = next(batches)
    compiled = run.train_step.lower(state, batch).compile()
    for _ in range(5):
        state, metrics = compiled(state, batch)
    jax.block_until_ready(metrics)
    with tempfile.TemporaryDirectory() as directory:
        jax.profiler.start_trace(directory)
        for _ in range(steps):
            state, metrics = compiled(state, batch)
        jax.block_until_ready(metrics)
        jax.profiler.stop_trace()
        profile = ProfileData.from_file(sorted(glob.glob(f"{directory}/**/*.xplane.pb", recursive=True))[-1])
    # each instruction of the optimised program: its kind, its shape, the model code it came from
    ops, bodies, current = {}, {}, None
    for line in compiled.as_text().splitlines():
        head = re.match(r"^%?([\w.\-]+) \(.*\) -> .* \{", line)
        if head:
            current = head.group(1)
            bodies[current] = ""
            continue
        if current is not None:
            bodies[current] += line + "\n"
        m = re.match(r"\s*(?:ROOT )?%?([\w.\-]+) = (\S+) ([\w\-]+)\(", line)
        if m:
            source = re.search(r'op_name="([^"]*)"', line)
            calls = re.search(r"calls=%?([\w.\-]+)", line)
            ops[m.group(1)] = {
                "shape": m.group(2),
                "opcode": m.group(3),
                "source": re.sub(r"^jit\([\w]+\)/", "", source.group(1)) if source else "",
                "calls": calls.group(1) if calls else None,
            }
    per_op = collections.Counter()
    for plane in profile.planes:
        for line in plane.lines:
            for event in line.events:
                if event.name in ops:
                    per_op[event.name] += event.duration_ns

    def group(name: str) -> str:
        op = ops[name]
        body = bodies.get(op["calls"] or "", "")
        if name.startswith("ynn_fusion"):
            return "YNNPACK matrix products" if " dot(" in body else "YNNPACK reductions"
        if op["opcode"] in ("dot", "convolution") or " dot(" in body or " convolution(" in body:
            return "XLA (Eigen) matrix products and convolutions"
        if "reduce-window(" in body:
            return "XLA reduce-window (split reductions)"
        if op["opcode"] == "copy":
            return "copies"
        return "XLA loop fusions (elementwise, reductions, transposes)"

    groups = collections.Counter()
    for name, ns in per_op.items():
        groups[group(name)] += ns
    ms = lambda ns: round(ns / 1e6 / steps, 2)  # noqa: E731
    top = [
        {"op": name, "ms": ms(ns), "group": group(name), "shape": ops[name]["shape"], "source": ops[name]["source"]}
        for name, ns in per_op.most_common(10)
    ]
    return {
        "operations_ms_per_step": ms(sum(per_op.values())),
        "operations": len(per_op),
        "groups_ms_per_step": {k: ms(v) for k, v in groups.most_common()},
        "costliest": top,
    }


def timed(
    family: str, peer: str, steps: int, overrides: tuple[str, ...] = (), usage: bool = False, warmup: int = 3
) -> Any:
    """Milliseconds per step of ``peer`` ("jaxnet": the runner's compiled step; "torch") (this process),
    over ``steps`` steps after ``warmup`` untimed ones, with config ``overrides`` (``key=value``) on
    the case's. With ``usage``, a dict: those milliseconds and, per step, the process's user and
    kernel CPU milliseconds and its voluntary context switches (a thread that went to sleep
    waiting), the CPU it used (200 % = two cores busy all along), from ``getrusage`` around the
    timed steps, and the process's peak resident memory (MiB) at the end."""
    import itertools
    import resource
    import time

    cfg, dataset = _case(family, overrides)
    from jaxnet.train.loop import Run

    run = Run(cfg, dataset=dataset)
    host = list(itertools.islice(run.train_batches(0), 4))
    if peer == "torch":
        import torch

        from jaxnet import models
        from jaxnet.bench import torch_peers

        torch.set_num_threads(len(os.sched_getaffinity(0)))
        trainer = torch_peers.Trainer(
            models.resolve(cfg.model),
            cfg.optim,
            cfg.train.steps,
            dataset.num_classes,
            cfg.data.seq_len,
            device="cpu",
            bf16=False,
            label_smoothing=cfg.train.label_smoothing,
            seed=cfg.seed,
            **({} if run.text else {"image_shape": tuple(dataset.train[0].shape[1:])}),
        )
        batches = [trainer.put(b) for b in host]
        step = lambda i: trainer.step(batches[i % len(batches)])  # noqa: E731
        wait = lambda: None  # noqa: E731
    else:
        import jax

        from jaxnet import parallel

        placed = [parallel.put_batch(b, run.mesh) for b in host]
        holder = {"state": run.init_state()}
        compiled = run.train_step.lower(holder["state"], placed[0]).compile()

        def step(i: int) -> None:
            holder["state"], holder["metrics"] = compiled(holder["state"], placed[i % len(placed)])

        wait = lambda: jax.block_until_ready(holder["state"])  # noqa: E731
    for i in range(warmup):
        step(i)
    wait()
    before, start = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    for i in range(steps):
        step(i)
    wait()
    wall, after = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_SELF)
    if not usage:
        return wall / steps * 1e3
    user, system = after.ru_utime - before.ru_utime, after.ru_stime - before.ru_stime
    return {
        "ms_per_step": round(wall / steps * 1e3, 2),
        "user_ms_per_step": round(user / steps * 1e3, 2),
        "kernel_ms_per_step": round(system / steps * 1e3, 2),
        "voluntary_switches_per_step": round((after.ru_nvcsw - before.ru_nvcsw) / steps, 1),
        "cpu_percent": round(100 * (user + system) / wall, 1),
        "peak_resident_mib": round(after.ru_maxrss / 1024),  # ru_maxrss is in KiB on Linux
    }


def fresh_process(code: str, cores: int, what: str, env: dict[str, str] | None = None) -> Any:
    """What ``code``, run by a fresh Python process on ``cores`` cores (``taskset`` below all of them)
    with ``env`` on top of this one's and the allocator settings the jaxnet command adds to that
    (``jaxnet._startup.environment``: ``JAXNET_MALLOC=glibc`` in ``env`` keeps glibc's malloc), prints
    as JSON after ``RESULT ``; ``what`` names it in the error if it prints none."""
    sys.path.insert(0, str(ROOT))
    from jaxnet import _startup  # imports no JAX

    env = {**os.environ, **(env or {})}
    env = _startup.environment(env) or env  # as the jaxnet command runs
    command = [sys.executable, "-c", code]
    if cores < (os.cpu_count() or 1):
        command = ["taskset", "-c", ",".join(str(c) for c in range(cores)), *command]
    out = subprocess.run(command, env=env, capture_output=True, text=True, cwd=ROOT)
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise RuntimeError(f"{what} on {cores} core(s) failed:\n{out.stderr[-3000:]}")


def child(what: str, family: str, steps: int, cores: int) -> dict | float:
    """Run ``what`` (trace, jaxnet, torch) for ``family`` in a fresh process on ``cores`` cores."""
    code = (
        f"import sys, json; sys.path.insert(0, {str(ROOT / 'scripts')!r}); import profile_ops as p; "
        f"r = p.trace({family!r}, {steps}) if {what!r} == 'trace' else p.timed({family!r}, {what!r}, {steps}); "
        "print('RESULT', json.dumps(r))"
    )
    return fresh_process(code, cores, f"{what} of {family}")


def record_head(kind: str, what: str) -> dict:
    """The head of a results record: ``kind``, ``what`` was measured, the command, the date, the
    device and CPU model, the versions of JAX and PyTorch (None when not installed) and the load now."""
    import jax
    import jaxlib

    from jaxnet import observe

    try:
        import torch

        torch_version = torch.__version__
    except ImportError:
        torch_version = None
    return {
        "kind": kind,
        "what": what,
        "command": "python " + " ".join(sys.argv),
        "date": datetime.date.today().isoformat(),
        "device": f"cpu ({os.cpu_count() or 1} cores)",
        "cpu_model": observe.cpu_model(),
        "versions": {"jax": jax.__version__, "jaxlib": jaxlib.__version__, "torch": torch_version},
        "load_average_start": round(os.getloadavg()[0], 2),
    }


def write_record(record: dict, out: str | Path, name: str) -> Path:
    """Write ``record`` (a :func:`record_head` with the results added) as ``out/name``, with the
    load average now as its ``load_average_end``; returns the path written."""
    record["load_average_end"] = round(os.getloadavg()[0], 2)
    path = Path(out) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2) + "\n")
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("families", nargs="*", default=["lstm", "transformer"])
    parser.add_argument("--steps", type=int, default=10, help="timed steps per measurement")
    parser.add_argument("--rounds", type=int, default=2, help="alternations of the core-use measurements")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    args = parser.parse_args()
    cores = os.cpu_count() or 1
    record = record_head(
        "cpu-ops",
        "XLA's per-operation trace of each family's compiled step, and the step on every core and on one "
        "for jaxnet and the PyTorch peer (medians of alternating rounds, each a fresh process)",
    )
    record["families"] = {}
    torch_version = record["versions"]["torch"]
    peers = ["jaxnet"] + (["torch"] if torch_version else [])
    for family in args.families:
        print(f"{family}: XLA's trace ...", flush=True)
        entry = {"trace": child("trace", family, args.steps, cores)}
        times = {(p, c): [] for p in peers for c in (cores, 1)}
        for r in range(args.rounds):
            for key in times:
                times[key].append(round(child(key[0], family, args.steps, key[1]), 2))
                print(f"  round {r + 1}: {key[0]:6s} on {key[1]} core(s): {times[key][-1]} ms", flush=True)
        median = {f"{p} on {c} core(s)": statistics.median(v) for (p, c), v in times.items()}
        entry["ms_per_step"] = median
        entry["rounds"] = {f"{p} on {c} core(s)": v for (p, c), v in times.items()}
        entry["speedup_from_all_cores"] = {
            p: round(median[f"{p} on 1 core(s)"] / median[f"{p} on {cores} core(s)"], 2) for p in peers
        }
        if "torch" in peers:
            entry["jaxnet_over_torch"] = {
                f"{c} core(s)": round(median[f"torch on {c} core(s)"] / median[f"jaxnet on {c} core(s)"], 3)
                for c in (cores, 1)
            }
        record["families"][family] = entry
        print(json.dumps({k: v for k, v in entry.items() if k not in ("trace", "rounds")}), flush=True)
    out = write_record(record, args.out, f"cpu-ops-{record['date']}.json")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()

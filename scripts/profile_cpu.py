"""Where a CPU train step's time goes: page faults, kernel vs user time and cores used per step,
for each family, under allocator and XLA settings given as environment variables.

    python scripts/profile_cpu.py                          # cnn lstm transformer, each setting, 2 rounds
    python scripts/profile_cpu.py cnn --steps 40 --rounds 3
    python scripts/profile_cpu.py cnn --setting plain --setting tuned

Each (family, setting) is measured in a fresh process (allocator settings such as
``GLIBC_TUNABLES`` are read once when a process starts), in alternation over the rounds. A
process builds the runner's ``Run`` for the family's standard experiment, compiles its step,
runs a warm-up, then times ``--steps`` steps fed by the runner's own input pipeline (prefetch
thread and all), reading ``getrusage`` before and after: minor page faults per step, user and
system CPU seconds per step, and CPU used as a percentage of one core (200 % = both cores of a
2-core machine). Page faults and the user/system split do not depend much on the machine's
load; wall-clock figures do, so the load average is recorded beside them. The results go to
``benchmarks/results/cpu-profile-<date>[-<tag>].json``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# name -> the environment a measured process starts with. "plain": none of these; "hugetlb": what
# the jaxnet command sets (jaxnet/_startup.py); the others were tried against it.
SETTINGS = {
    "plain": {},
    "hugetlb": {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"},
    "keep": {"GLIBC_TUNABLES": "glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=4294967296"},
    "nommap": {"GLIBC_TUNABLES": "glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=4294967296"},
    "xnnpack": {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1", "XLA_FLAGS": "--xla_cpu_use_xnnpack=true"},
    "onednn": {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1", "XLA_FLAGS": "--xla_cpu_use_onednn=true"},
    # every dot, convolution and reduction on XLA's own (Eigen) kernels, none on YNNPACK
    "eigen": {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1", "XLA_FLAGS": "--xla_cpu_experimental_ynn_fusion_type="},
    # YNNPACK for the matrix products alone: reductions on XLA's own loops too
    "ynn_dots": {
        "GLIBC_TUNABLES": "glibc.malloc.hugetlb=1",
        "XLA_FLAGS": "--xla_cpu_experimental_ynn_fusion_type=LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT",
    },
    # the batch split over one simulated CPU device per core (mesh.data = cores): see OVERRIDES
    "devices": {
        "GLIBC_TUNABLES": "glibc.malloc.hugetlb=1",
        "XLA_FLAGS": f"--xla_force_host_platform_device_count={os.cpu_count() or 1}",
    },
    "keep_hugetlb": {
        "GLIBC_TUNABLES": "glibc.malloc.hugetlb=1:glibc.malloc.mmap_threshold=33554432:"
        "glibc.malloc.trim_threshold=4294967296"
    },
}

# name -> config overrides a setting adds
OVERRIDES = {"devices": (f"mesh.data={os.cpu_count() or 1}",)}


def child(family: str, steps: int, steps_per_call: int, overrides: tuple[str, ...] = ()) -> dict:
    """Measure ``steps`` steps of ``family`` in this process (see the module docstring).

    ``family`` is a ``jaxnet bench`` case, or an experiment name (for a tree whose bench does not
    list it: the same config as a case of it, evaluation and checkpoints off). ``overrides`` are
    config ``key=value`` settings on top. Besides the times: the peak resident memory of the timed
    steps (the process's high-water mark reset after the warm-up, so compilation and start-up do
    not count), XLA's temporary bytes of the compiled step, and the losses of the warm-up steps."""
    import resource
    import time

    import jax

    from jaxnet import bench
    from jaxnet import config as config_lib
    from jaxnet.data import pipeline
    from jaxnet.train.loop import Run
    from jaxnet.train.step import metric_zeros

    if family in bench.CASES:
        case = bench.CASES[family]
        cfg = bench.case_config(case, smoke=False)
        dataset = bench.case_dataset(case, cfg)
    else:
        from jaxnet import data
        from jaxnet.train.loop import experiment_hooks

        quiet = ["train.eval_every=0", "train.checkpoint_every=0", "train.progress=false"]
        cfg = config_lib.load_experiment(family, quiet)
        hooks = experiment_hooks(cfg)
        dataset = hooks["data"](cfg) if "data" in hooks else data.load(cfg.data)
    cfg = config_lib.apply_overrides(cfg, list(overrides))
    k = steps_per_call
    if k > 1:
        cfg = config_lib.apply_overrides(cfg, [f"train.steps_per_call={steps_per_call}", f"train.log_every={50 * k}"])
    run = Run(cfg, dataset=dataset)
    state = run.init_state()
    source = run.call_batches(0, 10**9) if k > 1 else ((1, b) for b in run.train_batches(0))
    batches = pipeline.prefetch(source, cfg.data.prefetch, run.put_call)
    try:
        _, batch = next(batches)
        if k > 1:
            one = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape[1:], x.dtype), batch)
            zeros = metric_zeros(jax.eval_shape(run.train_step, state, one)[1])
            program = run.train_calls.lower(state, batch, zeros).compile()
            compiled = lambda state, batch: program(state, batch, zeros)  # noqa: E731
        else:
            program = compiled = run.train_step.lower(state, batch).compile()
        warm = max(3, 10 // k)
        losses = []
        for _ in range(warm):
            state, metrics = compiled(state, batch)
            _, batch = next(batches)
            losses.append(float(metrics["loss"]))
        jax.block_until_ready(metrics)
        calls = max(1, steps // k)
        peak_reset = reset_peak_rss()
        before, start = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        for i in range(calls):
            state, metrics = compiled(state, batch)
            _, batch = next(batches)
            if (i + 1) % max(1, 50 // k) == 0:  # the host reads the loss every 50 steps, as the runner logs
                jax.block_until_ready(metrics)
        jax.block_until_ready((state, metrics))
        wall = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_SELF)
        peak = status_kib("VmHWM")
    finally:
        batches.close()
    n = calls * k
    user, system = after.ru_utime - before.ru_utime, after.ru_stime - before.ru_stime
    return {
        "steps": n,
        "ms_per_step": round(1000 * wall / n, 2),
        "minor_faults_per_step": round((after.ru_minflt - before.ru_minflt) / n, 1),
        "user_ms_per_step": round(1000 * user / n, 2),
        "system_ms_per_step": round(1000 * system / n, 2),
        "cpu_percent": round(100 * (user + system) / wall, 1),
        "load_average": os.getloadavg()[0],
        # the steps' own peak (reset after the warm-up), or the process's since it started
        "peak_rss_mib": None if peak is None else round(peak / 1024, 1),
        "peak_rss_of": "timed steps" if peak_reset else "whole process",
        "xla_temp_mib": round(program.memory_analysis().temp_size_in_bytes / 2**20, 1),
        "warmup_losses": losses,
    }


def status_kib(field: str) -> int | None:
    """A field of /proc/self/status in KiB (VmHWM: peak resident memory, VmRSS: resident now)."""
    try:
        for line in open("/proc/self/status"):
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


def reset_peak_rss() -> bool:
    """Reset the process's peak resident memory to what is resident now (Linux: 5 to
    /proc/self/clear_refs); False where that is not possible."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def measure(family: str, setting: str, steps: int, steps_per_call: int) -> dict:
    """One fresh process measuring ``family`` under ``setting``."""
    env = {**os.environ, **SETTINGS[setting]}
    for key in ("GLIBC_TUNABLES", "XLA_FLAGS", "JAXNET_CPU_DEFAULTS_APPLIED"):
        if key not in SETTINGS[setting]:
            env.pop(key, None)
    code = f"import sys; sys.path.insert(0, {str(ROOT / 'scripts')!r}); import profile_cpu, json; "
    overrides = OVERRIDES.get(setting, ())
    code += f"print('RESULT', json.dumps(profile_cpu.child({family!r}, {steps}, {steps_per_call}, {overrides!r})))"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=ROOT)
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise RuntimeError(f"{family} / {setting} failed:\n{out.stderr[-3000:]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("families", nargs="*", default=["cnn", "lstm", "transformer"])
    parser.add_argument("--setting", action="append", choices=sorted(SETTINGS), help="default: all")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps-per-call", type=int, action="append", help="default: 1")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    parser.add_argument("--tag", default="", help="added to the file name: cpu-profile-DATE-TAG.json")
    args = parser.parse_args()
    settings = args.setting or list(SETTINGS)
    ks = args.steps_per_call or [1]
    import jax
    import jaxlib

    from jaxnet import observe

    record = {
        "kind": "cpu-profile",
        "what": "per-step CPU profile of the runner's compiled step fed by its input pipeline",
        "command": "python " + " ".join(sys.argv),
        "date": datetime.date.today().isoformat(),
        "device": f"cpu ({os.cpu_count()} cores)",
        "cpu_model": observe.cpu_model(),
        "versions": {"jax": jax.__version__, "jaxlib": jaxlib.__version__, "python": sys.version.split()[0]},
        "machine_shared": "yes: other jobs ran on the same cores; wall-clock figures are noisy, faults and the "
        "user/system split much less so",
        "settings": {s: SETTINGS[s] for s in settings},
        "results": {},
    }
    runs = {(f, s, k): [] for f in args.families for s in settings for k in ks}
    for r in range(args.rounds):
        for key in runs:
            result = measure(key[0], key[1], args.steps, key[2])
            runs[key].append(result)
            print(f"round {r + 1}: {key[0]:12s} {key[1]:10s} K={key[2]:<3d} {result}", flush=True)
    for (family, setting, k), results in runs.items():
        median = {
            m: statistics.median(x[m] for x in results) for m in results[0] if isinstance(results[0][m], (int, float))
        }
        name = f"{family}/{setting}" + (f"/K={k}" if len(ks) > 1 else "")
        record["results"][name] = {"median": median, "rounds": results}
    out = Path(args.out) / f"cpu-profile-{record['date']}{'-' + args.tag if args.tag else ''}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()

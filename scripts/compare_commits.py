"""A train step's time under two commits of jaxnet, measured in alternation on this machine.

    python scripts/compare_commits.py ce45d3e HEAD                       # transformer_shakespeare, 5 rounds
    python scripts/compare_commits.py ce45d3e HEAD --family transformer --rounds 3 --steps 40
    python scripts/compare_commits.py ee7950e HEAD --family gpt2_shakespeare --tag blockwise-loss
    python scripts/compare_commits.py HEAD HEAD --family gpt2_shakespeare --before-set train.loss_from=logits

Each commit's tree is written to a temporary directory (``git archive``); each measurement is a
fresh process importing jaxnet from one of them, which builds the runner's ``Run`` for the
family's standard experiment (``jaxnet bench``'s cases, full size), compiles its step, warms up
and times ``--steps`` steps fed by the runner's input pipeline (``scripts/profile_cpu.py``'s
child, with the allocator setting the jaxnet command uses). The commits alternate, round by
round (A B A B ...), so the machine's load falls on both alike; the medians of wall and user CPU
time per step and their ratios go to ``benchmarks/results/compare-commits-<date>[-<tag>].json``,
with each side's peak resident memory during the timed steps, XLA's temporary bytes of the
compiled step and the losses of the warm-up steps (the same batches on both sides). A family is a
``jaxnet bench`` case or, for a commit whose bench lacks it, an experiment of that name;
``--before-set`` / ``--after-set`` add config settings to one side (one commit against itself
with a setting changed).
On a machine other jobs load, user CPU time is the figure to compare: wall time also holds the
waits for cores taken by others.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

from profile_cpu import SETTINGS  # noqa: E402


def tree(commit: str, into: Path) -> tuple[str, Path]:
    """The full hash of ``commit`` and its tree written under ``into``."""
    full = subprocess.run(["git", "rev-parse", commit], cwd=ROOT, check=True, capture_output=True, text=True)
    sha = full.stdout.strip()
    path = into / sha[:12]
    path.mkdir(parents=True)
    archive = subprocess.run(["git", "archive", sha], cwd=ROOT, check=True, capture_output=True)
    subprocess.run(["tar", "-x", "-C", str(path)], input=archive.stdout, check=True)
    return sha, path


def measure(source: Path, family: str, steps: int, overrides: tuple[str, ...] = (), steps_per_call: int = 1) -> dict:
    """One fresh process timing ``family``'s step with jaxnet imported from ``source``, ``steps_per_call``
    steps a call."""
    env = {**os.environ, **SETTINGS["hugetlb"], "PYTHONPATH": str(source)}
    for key in ("XLA_FLAGS", "JAXNET_CPU_DEFAULTS_APPLIED"):
        env.pop(key, None)
    code = f"import sys; sys.path.insert(0, {str(ROOT / 'scripts')!r}); import profile_cpu, json, jaxnet; "
    code += f"assert jaxnet.__file__.startswith({str(source)!r}), jaxnet.__file__; "
    child = f"profile_cpu.child({family!r}, {steps}, {steps_per_call}, {tuple(overrides)!r})"
    code += f"print('RESULT', json.dumps({child}))"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=source)
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise RuntimeError(f"{family} at {source} failed:\n{out.stderr[-3000:]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("before")
    parser.add_argument("after")
    parser.add_argument("--family", action="append", help="a jaxnet bench case (default: transformer)")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps-per-call", type=int, default=1, help="steps in one compiled call (default 1)")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    parser.add_argument("--tag", default="", help="added to the file name: compare-commits-DATE-TAG.json")
    parser.add_argument("--before-set", action="append", default=[], help="KEY=VALUE config setting, before only")
    parser.add_argument("--after-set", action="append", default=[], help="KEY=VALUE config setting, after only")
    args = parser.parse_args()
    families = args.family or ["transformer"]
    import jax
    import jaxlib

    from jaxnet import observe

    with tempfile.TemporaryDirectory() as tmp:
        sides = {"before": tree(args.before, Path(tmp) / "before"), "after": tree(args.after, Path(tmp) / "after")}
        settings = {"before": tuple(args.before_set), "after": tuple(args.after_set)}
        runs: dict[tuple[str, str], list[dict]] = {(f, side): [] for f in families for side in sides}
        for r in range(args.rounds):
            for family in families:
                order = list(sides) if r % 2 == 0 else list(sides)[::-1]
                for side in order:
                    result = measure(sides[side][1], family, args.steps, settings[side], args.steps_per_call)
                    runs[family, side].append(result)
                    print(
                        f"round {r + 1}: {family:12s} {side:6s} {result['ms_per_step']} ms, "
                        f"user {result['user_ms_per_step']} ms, peak RSS {result.get('peak_rss_mib')} MiB, "
                        f"load {result['load_average']:.2f}",
                        flush=True,
                    )
    results = {}
    for family in families:
        median = lambda key, side, f=family: statistics.median(x[key] for x in runs[f, side])  # noqa: E731
        medians = {side: median("ms_per_step", side) for side in sides}
        before, after = runs[family, "before"], runs[family, "after"]
        paired = [round(a["ms_per_step"] / b["ms_per_step"], 3) for a, b in zip(after, before, strict=True)]
        user = {side: median("user_ms_per_step", side) for side in sides}
        results[family] = {
            "median_ms_per_step": medians,
            # CPU time is the work itself; wall time also holds the waits for cores other jobs took
            "median_user_cpu_ms_per_step": user,
            "user_cpu_after_over_before": round(user["after"] / user["before"], 3),
            "after_over_before": round(medians["after"] / medians["before"], 3),
            # each round's two measurements ran back to back: their ratio cancels most of the load
            "paired_after_over_before": paired,
            "median_paired_ratio": statistics.median(paired),
            "rounds": {side: runs[family, side] for side in sides},
        }
        if all("peak_rss_mib" in x for x in before + after):
            results[family]["median_peak_rss_mib"] = {side: median("peak_rss_mib", side) for side in sides}
            results[family]["xla_temp_mib"] = {side: runs[family, side][0]["xla_temp_mib"] for side in sides}
            results[family]["warmup_losses"] = {side: runs[family, side][0]["warmup_losses"] for side in sides}
        print(
            f"{family}: before {medians['before']} ms, after {medians['after']} ms, "
            f"median paired ratio {statistics.median(paired)}; user CPU before {user['before']} ms, "
            f"after {user['after']} ms",
            flush=True,
        )
    record = {
        "kind": "compare-commits",
        "what": "a train step's wall time (ms) under two commits, fresh processes in alternation; the step of the "
        "runner fed by its input pipeline (scripts/profile_cpu.py's child)",
        "command": "python " + " ".join(sys.argv),
        "date": datetime.date.today().isoformat(),
        "device": f"cpu ({os.cpu_count()} cores)",
        "cpu_model": observe.cpu_model(),
        "versions": {"jax": jax.__version__, "jaxlib": jaxlib.__version__, "python": sys.version.split()[0]},
        "machine_shared": "yes: other jobs ran on the same cores; compare the two commits' medians, not absolutes",
        "commits": {side: sha for side, (sha, _) in sides.items()},
        "settings": settings,
        "steps_per_call": args.steps_per_call,
        "results": results,
    }
    out = Path(args.out) / f"compare-commits-{record['date']}{'-' + args.tag if args.tag else ''}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()

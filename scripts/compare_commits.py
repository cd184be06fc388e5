"""A train step's time under two commits of jaxnet, measured in alternation on this machine.

    python scripts/compare_commits.py ce45d3e HEAD                       # transformer_shakespeare, 5 rounds
    python scripts/compare_commits.py ce45d3e HEAD --family transformer --rounds 3 --steps 40

Each commit's tree is written to a temporary directory (``git archive``); each measurement is a
fresh process importing jaxnet from one of them, which builds the runner's ``Run`` for the
family's standard experiment (``jaxnet bench``'s cases, full size), compiles its step, warms up
and times ``--steps`` steps fed by the runner's input pipeline (``scripts/profile_cpu.py``'s
child, with the allocator setting the jaxnet command uses). The commits alternate, round by
round (A B A B ...), so the machine's load falls on both alike; the medians of wall and user CPU
time per step and their ratios go to ``benchmarks/results/compare-commits-<date>[-<tag>].json``.
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
    path.mkdir()
    archive = subprocess.run(["git", "archive", sha], cwd=ROOT, check=True, capture_output=True)
    subprocess.run(["tar", "-x", "-C", str(path)], input=archive.stdout, check=True)
    return sha, path


def measure(source: Path, family: str, steps: int) -> dict:
    """One fresh process timing ``family``'s step with jaxnet imported from ``source``."""
    env = {**os.environ, **SETTINGS["hugetlb"], "PYTHONPATH": str(source)}
    for key in ("XLA_FLAGS", "JAXNET_CPU_DEFAULTS_APPLIED"):
        env.pop(key, None)
    code = f"import sys; sys.path.insert(0, {str(ROOT / 'scripts')!r}); import profile_cpu, json, jaxnet; "
    code += f"assert jaxnet.__file__.startswith({str(source)!r}), jaxnet.__file__; "
    code += f"print('RESULT', json.dumps(profile_cpu.child({family!r}, {steps}, 1)))"
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
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    parser.add_argument("--tag", default="", help="added to the file name: compare-commits-DATE-TAG.json")
    args = parser.parse_args()
    families = args.family or ["transformer"]
    import jax
    import jaxlib

    from jaxnet import observe

    with tempfile.TemporaryDirectory() as tmp:
        commits = dict(tree(c, Path(tmp)) for c in (args.before, args.after))
        names = dict(zip(commits, ("before", "after"), strict=True))
        runs: dict[tuple[str, str], list[dict]] = {(f, sha): [] for f in families for sha in commits}
        for r in range(args.rounds):
            for family in families:
                order = list(commits) if r % 2 == 0 else list(commits)[::-1]
                for sha in order:
                    result = measure(commits[sha], family, args.steps)
                    runs[family, sha].append(result)
                    print(f"round {r + 1}: {family:12s} {names[sha]:6s} {result['ms_per_step']} ms", flush=True)
    results = {}
    for family in families:
        medians = {names[sha]: statistics.median(x["ms_per_step"] for x in runs[family, sha]) for sha in commits}
        before, after = (runs[family, sha] for sha in commits)
        paired = [round(a["ms_per_step"] / b["ms_per_step"], 3) for a, b in zip(after, before, strict=True)]
        user = {names[sha]: statistics.median(x["user_ms_per_step"] for x in runs[family, sha]) for sha in commits}
        results[family] = {
            "median_ms_per_step": medians,
            # CPU time is the work itself; wall time also holds the waits for cores other jobs took
            "median_user_cpu_ms_per_step": user,
            "user_cpu_after_over_before": round(user["after"] / user["before"], 3),
            "after_over_before": round(medians["after"] / medians["before"], 3),
            # each round's two measurements ran back to back: their ratio cancels most of the load
            "paired_after_over_before": paired,
            "median_paired_ratio": statistics.median(paired),
            "rounds": {names[sha]: runs[family, sha] for sha in commits},
        }
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
        "commits": {names[sha]: sha for sha in commits},
        "results": results,
    }
    out = Path(args.out) / f"compare-commits-{record['date']}{'-' + args.tag if args.tag else ''}.json"
    out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()

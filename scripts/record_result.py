"""Train an experiment in a fresh run directory, timed from outside, and save the result.

    python scripts/record_result.py cnn_fashion_mnist [key=value ...] [--keep DIR]

Runs ``jaxnet train`` as a separate process (so the wall time includes start-up, data loading
and compilation, as a user sees it), then writes
``benchmarks/results/train-<experiment>-<platform>-<date>.json`` with the test metrics, the
times, the command, the device and the library versions, plus the run's curves (``.png``) and
its ``metrics.jsonl`` (``.metrics.jsonl``). ``scripts/update_docs.py`` turns these
files into the README's results table.
"""

from __future__ import annotations

import datetime
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from jaxnet import observe

ROOT = Path(__file__).resolve().parents[1]


def write_result(filename: str, record: dict) -> Path:
    """Write ``record`` as benchmarks/results/FILENAME (indented JSON) and return its path."""
    out = ROOT / "benchmarks" / "results" / filename
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=2) + "\n")
    return out


def device_name(env: dict) -> str:
    """The device of a run's environment record, with the CPU's model name on a CPU."""
    return env["device"] if env["platform"] != "cpu" else f"{env['cpu_count']}-core CPU ({observe.cpu_model()})"


def main(argv: list[str]) -> int:
    """Train ``argv[0]`` with overrides ``argv[1:]`` and write its results file; returns the exit code."""
    if not argv:
        print(__doc__)
        return 2
    keep = None
    if "--keep" in argv:  # train in DIR (which must not exist yet) and leave the run there, e.g. to sample
        at = argv.index("--keep")
        if at + 1 >= len(argv):
            print("--keep needs a directory", file=sys.stderr)
            return 2
        keep = Path(argv[at + 1]).absolute()
        argv = argv[:at] + argv[at + 2 :]
        if keep.exists():
            print(f"--keep {keep}: already exists; give a new directory", file=sys.stderr)
            return 2
    experiment, overrides = argv[0], argv[1:]
    scratch = Path(tempfile.mkdtemp(prefix="jaxnet-record-"))
    workdir = keep or scratch / "run"
    command = ["jaxnet", "train", experiment, *overrides, "--workdir", str(workdir)]
    load_start, started = os.getloadavg()[0], time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "jaxnet", *command[1:]], cwd=ROOT)
    wall = time.perf_counter() - started
    if result.returncode != 0:
        shutil.rmtree(scratch, ignore_errors=True)
        return result.returncode
    summary = json.loads((workdir / "summary.json").read_text())
    env = summary["environment"]
    date = datetime.date.today().isoformat()
    record = {
        "kind": "training",
        "experiment": experiment,
        "overrides": overrides,
        "command": " ".join(command[:-2]),
        "date": date,
        "device": device_name(env),
        "platform": env["platform"],
        "wall_time_s": round(wall, 1),
        # 1-minute load averages at the start and the end: on a shared machine, how busy it was.
        "load_average": [round(load_start, 2), round(os.getloadavg()[0], 2)],
        "test": summary.get("test", {}),
        "val": summary.get("val", {}),
        "steps": summary["step"],
        "compile_time_s": summary["compile_time_s"],
        "examples_per_s": summary.get("examples_per_s"),
        "tokens_per_s": summary.get("tokens_per_s"),
        "param_count": summary["param_count"],
        "task": summary.get("task"),
        "versions": env["versions"],
        "python": env["python"],
        "git_commit": env["git_commit"],
    }
    name = Path(experiment.split(":")[0]).stem + "".join(f"-{v}" for v in experiment.split(":")[1:])
    out = write_result(f"train-{name}-{env['platform']}-{date}.json", record)
    shutil.copy(workdir / "curves.png", out.with_suffix(".png"))
    shutil.copy(workdir / "metrics.jsonl", out.with_suffix(".metrics.jsonl"))  # for comparison plots
    shutil.rmtree(scratch, ignore_errors=True)
    metric = next((k for k in ("perplexity", "bpc", "accuracy") if k in record["test"]), "loss")
    print(
        f"wrote {out.relative_to(ROOT)}: test {metric} {record['test'].get(metric, float('nan')):.4f} in {wall:.0f} s"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

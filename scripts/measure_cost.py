"""Measure what a full training run would cost without running it to the end.

    python scripts/measure_cost.py lstm_ptb_medium [--steps 200] [key=value ...]

Trains the first ``--steps`` steps of the experiment (``train.stop_after``) in a scratch
directory and writes ``benchmarks/results/cost-<experiment>-<platform>-<date>.json`` with the
measured steps/s (compilation excluded), the compile time and the projected time of the whole
run's training steps (periodic validation passes and checkpoints not included), with the device
and library versions. For experiments too long for the machine at hand.
"""

from __future__ import annotations

import argparse
import datetime
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from record_result import ROOT, device_name, write_result


def main(argv: list[str]) -> int:
    """Run the measurement and write the cost file; returns the exit code."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("experiment")
    parser.add_argument("overrides", nargs="*")
    parser.add_argument("--steps", type=int, default=200, help="steps to time (after the first, compiled one)")
    args = parser.parse_args(argv)
    if args.steps < 2:
        parser.error("--steps must be at least 2 (the first step is compilation)")
    scratch = Path(tempfile.mkdtemp(prefix="jaxnet-cost-"))
    workdir = scratch / "run"
    overrides = [*args.overrides, f"train.stop_after={args.steps}", "train.eval_every=0", "train.progress=false"]
    result = subprocess.run(
        [sys.executable, "-m", "jaxnet", "train", args.experiment, *overrides, "--workdir", str(workdir)], cwd=ROOT
    )
    if result.returncode != 0:
        shutil.rmtree(scratch, ignore_errors=True)
        return result.returncode
    summary = json.loads((workdir / "summary.json").read_text())
    config = json.loads((workdir / "config.json").read_text())
    env = summary["environment"]
    steps_total = summary["steps_total"]
    record = {
        "kind": "cost",
        "experiment": args.experiment,
        "command": f"python scripts/measure_cost.py {args.experiment} --steps {args.steps}",
        "date": datetime.date.today().isoformat(),
        "device": device_name(env),
        "platform": env["platform"],
        "steps_measured": summary["step"],
        "steps_total": steps_total,
        "steps_per_s": summary["steps_per_s"],
        "tokens_per_s": summary.get("tokens_per_s"),
        "compile_time_s": summary["compile_time_s"],
        "param_count": summary["param_count"],
        "projected_hours": round(steps_total / summary["steps_per_s"] / 3600, 1),
        "batch_size": config["train"]["batch_size"],
        "versions": env["versions"],
        "python": env["python"],
        "git_commit": env["git_commit"],
    }
    name = Path(args.experiment.split(":")[0]).stem
    out = write_result(f"cost-{name}-{env['platform']}-{record['date']}.json", record)
    shutil.rmtree(scratch, ignore_errors=True)
    print(f"wrote {out.relative_to(ROOT)}: {record['steps_per_s']} steps/s, full run ~{record['projected_hours']} h")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

"""Generate text from a trained run and save it as a results file, for the README.

    python scripts/record_sample.py RUN_DIR [--prompt "ROMEO:"] [--tokens 500] [--temperature 0.8] [--seed 0]

Runs ``jaxnet sample`` on ``RUN_DIR`` (e.g. one kept by ``record_result.py --keep``) and writes
``benchmarks/results/sample-<experiment>-<platform>-<date>.json`` with the command, the text, the
checkpoint step and the run's validation result.
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
from pathlib import Path

from record_result import ROOT, write_result


def main(argv: list[str]) -> int:
    """Sample and write the results file; returns the exit code."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workdir", type=Path)
    parser.add_argument("--prompt", default="ROMEO:")
    parser.add_argument("--tokens", type=int, default=500)
    parser.add_argument("--temperature", type=float, default=0.8)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    summary = json.loads((args.workdir / "summary.json").read_text())
    options = ["--prompt", args.prompt, "--tokens", str(args.tokens), "--temperature", str(args.temperature)]
    options += ["--seed", str(args.seed)]
    result = subprocess.run(
        [sys.executable, "-m", "jaxnet", "sample", "--workdir", str(args.workdir), *options],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        print(result.stderr, file=sys.stderr)
        return result.returncode
    experiment = summary["experiment"]
    workdir_name = f"runs/{experiment.replace(':', '-')}"
    quoted = " ".join(f'"{o}"' if " " in o or ":" in o else o for o in options)
    env = summary["environment"]
    record = {
        "kind": "sample",
        "experiment": experiment,
        "command": f"jaxnet sample --workdir {workdir_name} {quoted}",
        "date": datetime.date.today().isoformat(),
        "platform": env["platform"],
        "checkpoint_step": summary["step"],
        "val": summary.get("val", {}),
        "text": result.stdout[:-1] if result.stdout.endswith("\n") else result.stdout,
        "versions": env["versions"],
        "git_commit": env["git_commit"],
    }
    out = write_result(f"sample-{experiment}-{env['platform']}-{record['date']}.json", record)
    print(f"wrote {out.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

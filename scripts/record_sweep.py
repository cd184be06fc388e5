"""Run a sweep in a fresh directory, timed from outside, and save its record for the README.

    python scripts/record_sweep.py cnn_fashion_mnist optim.lr=5e-4,1e-3,2e-3,4e-3,8e-3 seed=0,1,2

Runs ``jaxnet sweep`` as a separate process (start-up, data loading and compilation included),
then copies its ``sweep.json`` (every member's metrics and curve, the timings, the device and the
library versions), ``sweep.md`` and ``sweep.png`` to
``benchmarks/results/sweep-<experiment>-<platform>-<date>.{json,md,png}``, adding the wall time.
``scripts/update_docs.py`` puts the table and the plot in the README.
"""

from __future__ import annotations

import datetime
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str]) -> int:
    if not argv or argv[0].startswith("-"):
        print(__doc__)
        return 2
    experiment = argv[0]
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp) / "sweep"
        command = [sys.executable, "-m", "jaxnet", "sweep", *argv, "train.progress=false", "--workdir", str(workdir)]
        started = time.time()
        result = subprocess.run(command, cwd=ROOT)
        wall = time.time() - started
        if result.returncode != 0:
            return result.returncode
        record = json.loads((workdir / "sweep.json").read_text())
        record["wall_time_s"] = round(wall, 1)
        record["command"] = "jaxnet sweep " + " ".join(argv)
        platform = record["environment"]["platform"]
        date = datetime.date.today().isoformat()
        stem = f"sweep-{experiment.replace(':', '-')}-{platform}-{date}"
        out = ROOT / "benchmarks" / "results"
        for member in record["members"]:
            member["workdir"] = Path(member["workdir"]).name  # the temporary directory is gone
        record["workdir"] = "(temporary)"
        (out / f"{stem}.json").write_text(json.dumps(record, indent=2) + "\n")
        shutil.copy(workdir / "sweep.md", out / f"{stem}.md")
        shutil.copy(workdir / "sweep.png", out / f"{stem}.png")
        print(f"wrote benchmarks/results/{stem}.json, .md and .png ({wall / 60:.1f} min)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

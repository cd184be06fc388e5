"""llama_shakespeare at 8 times its sequence, the sequence split over 4 simulated CPU devices
(``mesh.context=4``), against the same run on one device: the same losses, step by step.

    python scripts/context_demo.py [--steps 20] [--batch 2] [--seq-len 1024]

Each layout is trained by ``jaxnet train`` in a process of its own (1 CPU device; 4 simulated
ones for ``mesh.context=4``, once with the keys and values passed round a ring and once
gathered), every step's loss logged; the script writes
``benchmarks/results/context-llama_shakespeare-cpu-<date>.json`` with the commands, the losses,
the largest difference from one device's, the wall times, the device and the library versions.
The run is short (a CPU at 1,024 tokens a row): it shows that splitting the sequence changes no
number, not what the model learns.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

from record_result import device_name, write_result  # noqa: E402


def train(overrides: list[str], devices: int, workdir: Path) -> tuple[list[float], float, dict]:
    """``jaxnet train llama_shakespeare OVERRIDES`` on ``devices`` simulated CPU devices: every
    step's loss, the wall time and the run's environment record."""
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env["JAX_PLATFORMS"] = "cpu"
    if devices > 1:
        env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    command = [sys.executable, "-m", "jaxnet", "train", "llama_shakespeare", *overrides, "--workdir", str(workdir)]
    started = time.perf_counter()
    subprocess.run(command, cwd=ROOT, env=env, check=True)
    wall = time.perf_counter() - started
    rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    losses = [row["loss"] for row in rows if row.get("split", "train") == "train" and "loss" in row and "step" in row]
    summary = json.loads((workdir / "summary.json").read_text())
    return losses, wall, summary["environment"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq-len", type=int, default=1024, help="8 x llama_shakespeare's 128")
    args = parser.parse_args()
    common = [
        f"data.seq_len={args.seq_len}",
        f"train.batch_size={args.batch}",
        f"train.steps={args.steps}",
        "train.log_every=1",
        "train.eval_every=0",
        "train.checkpoint_every=0",
        f"train.eval_tokens={4 * args.seq_len}",
        "train.eval_batch_size=4",
        f"optim.warmup_steps={max(1, args.steps // 4)}",
    ]
    layouts = {
        "one device": ([], 1),
        "mesh.context=4, ring": (["mesh.data=1", "mesh.context=4", "model.context_attention=ring"], 4),
        "mesh.context=4, gather": (["mesh.data=1", "mesh.context=4", "model.context_attention=gather"], 4),
    }
    runs, environment = {}, None
    with tempfile.TemporaryDirectory(prefix="jaxnet-context-") as scratch:
        for i, (name, (overrides, devices)) in enumerate(layouts.items()):
            losses, wall, environment = train(common + overrides, devices, Path(scratch) / f"run{i}")
            runs[name] = {
                "command": " ".join(["jaxnet train llama_shakespeare", *common, *overrides]),
                "devices": devices,
                "losses": losses,
                "wall_time_s": round(wall, 1),
            }
            print(f"{name}: {len(losses)} losses, last {losses[-1]:.6f}, {wall:.0f} s", flush=True)
    one = runs["one device"]["losses"]
    for run in runs.values():
        run["max_abs_difference_from_one_device"] = max(abs(a - b) for a, b in zip(one, run["losses"], strict=True))
    date = datetime.date.today().isoformat()
    record = {
        "kind": "context parallelism, CPU",
        "what": f"llama_shakespeare at data.seq_len={args.seq_len} (8 x its 128), the sequence split over 4 "
        "simulated CPU devices against one device; every step's training loss",
        "date": date,
        "device": device_name(environment),
        "python": environment["python"],
        "versions": environment["versions"],
        "git_commit": environment["git_commit"],
        "steps": args.steps,
        "batch": args.batch,
        "seq_len": args.seq_len,
        "runs": runs,
    }
    path = write_result(f"context-llama_shakespeare-cpu-{date}.json", record)
    print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Write the committed plan records: every shipped experiment compiled for one H100, gpt2_small on
1 and 8 H100s (fsdp=8) and on one H200, and the families `jaxnet study devices` compares on one H200,
from this CPU-only machine (XLA deviceless compilation).

    JAX_PLATFORMS=cpu python scripts/record_plans.py            # all records, then the README table
    JAX_PLATFORMS=cpu python scripts/record_plans.py gpt2       # only gpt2_small's (or: others, devices, or one NAME)

Each record is benchmarks/results/plan-<experiment>-<target>[x<gpus>]-<date>.json: the dict of
`jaxnet.plan` plus the command that reproduces it and the date. Memory, FLOPs, bytes and kernels
come from the compiled program; the step time is a PREDICTION (a roofline bound), not measured.
Needs the CUDA plugin wheels in jaxnet.planner.plan_dir() (scripts/test installs them; see README), or
installed beside jaxnet.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import shlex
import subprocess
import sys
from pathlib import Path

os.environ["JAX_PLATFORMS"] = "cpu"

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
# The plan wheels' own directory (the rule of jaxnet.planner.plan_dir), before JAX is imported: JAX
# binds the CUDA plugin at import.
sys.path.insert(0, os.environ.get("JAXNET_PLAN_DIR") or os.path.join(sys.prefix, "jaxnet-plan"))

import numpy as np  # noqa: E402

from jaxnet import config, planner  # noqa: E402
from jaxnet.data import Dataset  # noqa: E402
from jaxnet.errors import UserError  # noqa: E402

GPT2 = [
    ("gpt2_small", ["--max-batch"], "h100", 1),
    ("gpt2_small", ["mesh.fsdp=8", "--tokens", "10e9", "--price", "3"], "h100", 8),
    ("gpt2_small", [], "h200", 1),
]
# The families `jaxnet study devices` compares, also on an H200: its predicted GPU column.
DEVICES = [(name, [], "h200", 1) for name in ("cnn_fashion_mnist", "lstm_ptb_small", "transformer_shakespeare")]
# Experiments whose shape comes from a checkpoint that is not shipped (a Hugging Face GPT-2): not planned.
UNPLANNED = {"gpt2_finetune"}
# The options of jaxnet plan a record may carry after its overrides, and the keyword of jaxnet.plan each sets.
OPTIONS = {"--tokens": "tokens", "--epochs": "epochs", "--price": "price"}


def cifar10_shaped(cfg: config.Config) -> Dataset:
    """Zero images of CIFAR-10's shape and classes: a plan needs only shapes, and the CIFAR-10
    files are not on every machine."""
    rows = max(cfg.train.batch_size, 16)
    split = (np.zeros((rows, 32, 32, 3), np.uint8), np.zeros(rows, np.int64))
    return Dataset(train=split, val=split, test=split, num_classes=10)


# Experiments whose data may be absent here, planned on placeholder data of the same shapes.
PLACEHOLDERS = {"resnet_cifar10": cifar10_shaped}


def records(which: str) -> list[tuple[str, list[str], str, int]]:
    if which == "gpt2":
        return GPT2
    if which == "gpt2-max-batch":
        return GPT2[:1]
    if which == "devices":
        return DEVICES
    if which in config.list_experiments():
        return [(which, [], "h100", 1)]
    others = [(name, [], "h100", 1) for name in config.list_experiments() if name not in {"gpt2_small", *UNPLANNED}]
    return others + DEVICES if which == "others" else GPT2 + others + DEVICES


def main(argv: list[str]) -> int:
    date = datetime.date.today().isoformat()
    out = ROOT / "benchmarks" / "results"
    for name, overrides, target, gpus in records(argv[0] if argv else "all"):
        max_batch = "--max-batch" in overrides
        overrides = [o for o in overrides if o != "--max-batch"]
        options = {}
        while overrides and overrides[-2:-1] and overrides[-2] in OPTIONS:
            options[OPTIONS[overrides[-2]]] = float(overrides[-1])
            overrides = overrides[:-2]
        flags = [x for k, v in options.items() for x in (f"--{k}", f"{v:g}")]
        command = shlex.join(["jaxnet", "plan", name, *overrides, "--target", target, "--gpus", str(gpus), *flags])
        command += " --max-batch" if max_batch else ""
        print(command, flush=True)
        cfg = config.load_experiment(name, overrides)
        try:
            report = planner.plan(cfg, target, gpus, max_batch=max_batch, **options)
        except UserError as e:
            if name not in PLACEHOLDERS:
                raise
            report = planner.plan(cfg, target, gpus, dataset=PLACEHOLDERS[name](cfg), **options)
            report["caveats"].insert(0, f"planned on zero data of the dataset's shapes: {e}")
        report.update(
            command=command,
            date=date,
            host=f"{platform.node()} ({os.cpu_count()} CPUs, shared), compiling for {gpus} x {report['device_kind']}",
        )
        suffix = f"{target}x{gpus}" if gpus > 1 else target
        path = out / f"plan-{name}-{suffix}-{date}.json"
        path.write_text(json.dumps(report, indent=2) + "\n")
        print(planner.describe(report), flush=True)
        print(f"  wrote {path.relative_to(ROOT)}", flush=True)
    subprocess.run([sys.executable, str(ROOT / "scripts" / "update_docs.py")], check=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

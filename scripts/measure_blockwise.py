"""The language models' training step with the whole logits and with the blockwise loss, planned for GPUs.

    python scripts/measure_blockwise.py                  # gpt2_small on 1 and 8 H100s, llama3_8b on 8
    python scripts/measure_blockwise.py --no-max-batch   # the same without the search for the largest batch
    python scripts/measure_blockwise.py gpt2_small       # one experiment

For each plan (an experiment, its overrides, a target and a number of GPUs) ``jaxnet plan`` compiles
the train step twice on this CPU (deviceless, as `jaxnet plan` always does): with
``train.loss_from=logits`` (the model's whole logits, then the cross-entropy: what jaxnet did before
the blockwise loss) and ``train.loss_from=features`` (jaxnet.blockwise: the output layer and the
cross-entropy in blocks of tokens, the default), and with ``--max-batch`` searches the largest
batch that fits each way. Recorded per plan and way: temporaries and total memory per device, XLA's
bytes and FLOPs per step, kernels per step, the PREDICTED step (the largest of the compute, memory,
launch and communication bounds, which one named) and the EXPECTED step, and the largest batch.
Written to ``benchmarks/results/blockwise-plans-<date>.json``; ``scripts/update_docs.py`` renders it
on docs/performance.md. An experiment that is not registered here (``llama3_8b`` before the Llama
family lands) is skipped and named in the file.

Needs the CUDA plugin wheels of ``jaxnet plan`` (see docs/plan.md, "Installing the plan wheels").
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import sys
import time
from pathlib import Path

os.environ["JAX_PLATFORMS"] = "cpu"
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, os.environ.get("JAXNET_PLAN_DIR") or os.path.join(sys.prefix, "jaxnet-plan"))

from jaxnet import config, planner  # noqa: E402

#: (experiment, overrides, target, GPUs, whether to search the largest batch). The search is a
#: dozen compiles, minutes each on a shared 2-core CPU: made where the batch is the question.
PLANS = [
    ("gpt2_small", [], "h100", 1, True),
    ("gpt2_small", ["mesh.fsdp=8"], "h100", 8, False),
    ("llama3_8b", ["mesh.fsdp=8"], "h100", 8, True),  # as scripts/record_plans.py plans it
    ("llama3_8b", ["mesh.fsdp=8", "model.remat=true"], "h100", 8, False),
]
WAYS = {"logits": "train.loss_from=logits", "blockwise": "train.loss_from=features"}


def figures(report: dict) -> dict:
    """What the comparison keeps of a plan report."""
    m, p = report["memory"], report["prediction"]
    out = {
        "fits": report["fits"],
        "temp_bytes": m["temp"],
        "total_bytes": m["total"],
        "bytes_per_step": report["bytes_per_step"]["per_device"],
        "flops_per_step": report["flops_per_step"]["per_device"],
        "kernels_per_step": p.get("kernels_per_step"),
        "predicted_step_s": p["predicted_step_s"],
        "bound": p["bound"],
        "compute_s": p["compute_s"],
        "memory_s": p["memory_s"],
        "launch_s": p["launch_s"],
        "communication_s": p["communication_s"],
        "expected_step_s": p.get("expected_step_s"),
        "compile_s": report["compile_s"],
    }
    if "max_batch_size" in report:
        out["max_batch"] = report["max_batch_size"]["batch_size"]
        out["max_batch_memory_bytes"] = report["max_batch_size"]["memory_at"]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("experiments", nargs="*", help="only these (default: every plan above)")
    parser.add_argument("--no-max-batch", action="store_true", help="skip the search for the largest batch")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    args = parser.parse_args()
    known = set(config.list_experiments())
    date = datetime.date.today().isoformat()
    rows, skipped = [], {}
    for name, overrides, target, gpus, search in PLANS:
        search = search and not args.no_max_batch
        if args.experiments and name not in args.experiments:
            continue
        if name not in known:
            skipped[name] = "not an experiment of this checkout yet"
            print(f"{name}: skipped ({skipped[name]})", flush=True)
            continue
        row = {"experiment": name, "overrides": overrides, "target": target}
        for way, setting in WAYS.items():
            cfg = config.load_experiment(name, [*overrides, setting])
            flags = ["--target", target] + (["--gpus", str(gpus)] if gpus else [])
            command = shlex.join(["jaxnet", "plan", name, *overrides, setting, *flags])
            command += " --max-batch" if search else ""
            print(command, flush=True)
            start = time.perf_counter()
            report = planner.plan(cfg, target, gpus, max_batch=search, say=lambda line: print(line, flush=True))
            row.update(gpus=report["gpus"], mesh=report["mesh"], batch_size=report["batch_size"])
            row[way] = figures(report) | {"command": command, "seconds": round(time.perf_counter() - start, 1)}
            print(planner.describe(report), flush=True)
        rows.append(row)
        write(args, date, rows, skipped)  # after each plan: a long run stopped early keeps what it did


def write(args: argparse.Namespace, date: str, rows: list[dict], skipped: dict) -> None:
    """The plans so far to ``benchmarks/results/blockwise-plans-<date>.json``, with the machine's load."""
    versions = planner._versions()
    record = {
        "kind": "blockwise-plans",
        "date": date,
        "command": "python " + " ".join(sys.argv),
        "host": f"{platform.node()} ({os.cpu_count()} CPUs, shared), compiling for GPUs it does not have",
        "versions": versions,
        "label": "memory, bytes, FLOPs and kernels from the compiled programs; steps PREDICTED (bounds) and "
        "EXPECTED (the bound over an efficiency fitted on published runs), not measured",
        "ways": {
            "logits": "train.loss_from=logits: the whole logits, then the cross-entropy",
            "blockwise": "train.loss_from=features (the default): jaxnet.blockwise",
        },  # fmt: skip
        "load_average_at_write": [round(x, 2) for x in os.getloadavg()],
        "skipped": skipped,
        "plans": rows,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"blockwise-plans-{date}.json"
    path.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {path}", flush=True)


if __name__ == "__main__":
    main()

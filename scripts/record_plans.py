"""Write the committed plan records: the published runs the expected step is fitted on and checked
against, every shipped experiment compiled for one H100, gpt2_small on 1 and 8 H100s (fsdp=8) and on
one H200, llama3_8b on 8 H100s (fsdp=8) with and without model.remat, and the families `jaxnet study
devices` compares on one H200, llama3_8b with LoRA rank 16 on 1 and 2 H100s, qwen3_8b and gemma3_12b
on 8 H100s (fsdp=8), from this CPU-only machine
(XLA deviceless compilation).

    python scripts/record_plans.py              # all records (the published runs first), then the docs' tables
    python scripts/record_plans.py published    # only the published runs, the fit and its table
    python scripts/record_plans.py gpt2         # only gpt2_small's (or: llama, lora, dense, context, moe, others,
                                                # devices, context:LABEL, dense:NAME[-LABEL] or moe:NAME-LABEL for
                                                # one of those groups, or one NAME)
    python scripts/record_plans.py spread       # the published runs' spread of the expected step, from the table

Each record is benchmarks/results/plan-<experiment>-<target>[x<gpus>][-<label>]-<date>.json: the dict of
`jaxnet.plan` plus the command that reproduces it and the date (a record of an earlier date for the
same plan is removed). Memory, FLOPs, bytes and kernels come from the compiled program; the step
time is a PREDICTION (a roofline bound), not measured, and the expected step an estimate from it.

`published` plans every run of jaxnet/targets/published_runs.json whose model jaxnet can build
(plan-published-<id>-<date>.json; a run it cannot build yet is recorded as pending, with the reason),
fits the efficiency on the runs of role "fit" (jaxnet.planner.fit_efficiency: one number for all plans),
writes it to jaxnet/targets/expected.json (what jaxnet plan's expected step uses), recomputes every
record's expected step with it, and writes benchmarks/results/plan-published-runs-<date>.json, the
table of published step against expected and bound on docs/plan.md.

Needs the CUDA plugin wheels in jaxnet.planner.plan_dir() (scripts/test installs them; see README), or
installed beside jaxnet.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import platform
import re
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

from jaxnet import config, plan_estimate, planner  # noqa: E402
from jaxnet.data import Dataset  # noqa: E402
from jaxnet.errors import UserError  # noqa: E402

GPT2 = [
    ("gpt2_small", ["--max-batch"], "h100", 1),
    ("gpt2_small", ["mesh.fsdp=8", "--tokens", "10e9", "--price", "3"], "h100", 8),
    ("gpt2_small", [], "h200", 1),
]
# Llama 3 8B on a node of 8 H100s: the largest batch of 8,192-token sequences with and without
# recomputing each block's activations, and the time and cost of 1 B tokens at $3 per GPU-hour (at
# one sequence a GPU, and at the largest batch that fits with remat).
LLAMA = [
    ("llama3_8b", ["mesh.fsdp=8", "--max-batch", "--tokens", "1e9", "--price", "3"], "h100", 8),
    (
        "llama3_8b",
        ["mesh.fsdp=8", "model.remat=true", "--max-batch", "--tokens", "1e9", "--price", "3"],
        "h100",
        8,
        "remat",
    ),
    # the largest batch the search above found with remat and the whole logits (7 sequences a GPU; with the
    # blockwise loss it finds 104, 13 a GPU): its step, time and cost
    (
        "llama3_8b",
        ["mesh.fsdp=8", "model.remat=true", "train.batch_size=56", "--tokens", "1e9", "--price", "3"],
        "h100",
        8,
        "remat-b56",
    ),
]
# The same node with the projections in float8 (model.matmul=fp8): its float8 GEMMs counted, their
# FLOPs at the float8 peak, one sequence a GPU.
LLAMA.append(("llama3_8b", ["mesh.fsdp=8", "model.matmul=fp8", "--tokens", "1e9", "--price", "3"], "h100", 8, "fp8"))
# LoRA rank 16 on the attention and MLP of Llama 3 8B, its base frozen in bfloat16, with remat: on one
# H100 and on two (fsdp=2), the largest batch of 8,192-token sequences beside the full fine-tune above.
LORA = ["train.lora_rank=16", "train.lora_alpha=32", "train.lora_targets=all", "train.base_dtype=bfloat16"]
LLAMA += [
    ("llama3_8b", [*LORA, "model.remat=true", "--max-batch", "--tokens", "1e9", "--price", "3"], "h100", 1, "lora16"),
    (
        "llama3_8b",
        ["mesh.fsdp=2", *LORA, "model.remat=true", "--max-batch", "--tokens", "1e9", "--price", "3"],
        "h100",
        2,
        "lora16",
    ),
]
# The dense families fine-tuned most beside Llama, on the same node and batch as llama3_8b: Qwen3 8B
# (the largest batch), and Gemma 3 12B's text decoder at one sequence a GPU and, recomputing each
# block, at the largest batch (each compile of these takes 10 to 20 minutes on a shared 2-core CPU).
GOAL = ["--tokens", "1e9", "--price", "3"]
DENSE = [
    ("qwen3_8b", ["mesh.fsdp=8", "--max-batch", *GOAL], "h100", 8),
    ("gemma3_12b", ["mesh.fsdp=8", *GOAL], "h100", 8),
    ("gemma3_12b", ["mesh.fsdp=8", "model.remat=true", "--max-batch", *GOAL], "h100", 8, "remat"),
]
# Long context: Llama 3.1 8B (Llama 3 8B with its rope scaling) at 131,072 tokens a row on a node of
# 8 H100s, the sequence split over the GPUs (mesh.context, parameters and optimizer state split over
# them too) with every block recomputed, one row a step; beside it the splits of context x FSDP (FSDP
# splits the batch: one row for each of its GPUs); and 32,768 tokens a row.
LONG = ["model.rope_scaling=llama3", "model.remat=full", "train.eval_batch_size=1", "--tokens", "1e9", "--price", "3"]
CONTEXT = [
    (
        "llama3_8b",
        ["data.seq_len=131072", "mesh.data=1", "mesh.context=8", "train.batch_size=1", *LONG],
        "h100",
        8,
        "128k-context8",
    ),
    (
        "llama3_8b",
        ["data.seq_len=131072", "mesh.data=1", "mesh.fsdp=2", "mesh.context=4", "train.batch_size=2", *LONG],
        "h100",
        8,
        "128k-fsdp2-context4",
    ),
    (
        "llama3_8b",
        ["data.seq_len=131072", "mesh.data=1", "mesh.fsdp=4", "mesh.context=2", "train.batch_size=4", *LONG],
        "h100",
        8,
        "128k-fsdp4-context2",
    ),
    (
        "llama3_8b",
        ["data.seq_len=32768", "mesh.data=1", "mesh.context=8", "train.batch_size=1", *LONG],
        "h100",
        8,
        "32k-context8",
    ),
    (
        "llama3_8b",
        ["data.seq_len=32768", "mesh.data=1", "mesh.fsdp=4", "mesh.context=2", "train.batch_size=4", *LONG],
        "h100",
        8,
        "32k-fsdp4-context2",
    ),
]
# Mixtures of experts on the same node: Qwen3-30B-A3B trained whole (float32 weights and AdamW state,
# 61 GB a GPU before activations) with every block recomputed, its experts split by FSDP alone and by
# expert x FSDP; Mixtral 8x7B, whose 46.7 B parameters and AdamW state in float32 (747 GB with the
# gradients) no 8 x 80 GB hold, whole (to say so) and with LoRA on a bfloat16 base. A fixed capacity
# (1.25): dropless routing's ragged_dot is computed densely per expert by XLA on a GPU.
MOE_COMMON = ["model.remat=true", "model.capacity_factor=1.25"]
MOE = [
    ("qwen3_30b_a3b", ["mesh.fsdp=8", *MOE_COMMON, *GOAL], "h100", 8, "fsdp8"),
    ("qwen3_30b_a3b", ["mesh.fsdp=2", "mesh.expert=4", *MOE_COMMON, *GOAL], "h100", 8, "fsdp2-expert4"),
    ("mixtral_8x7b", ["mesh.fsdp=4", "mesh.expert=2", *MOE_COMMON, *GOAL], "h100", 8, "fsdp4-expert2"),
    (
        "mixtral_8x7b",
        ["mesh.fsdp=4", "mesh.expert=2", *MOE_COMMON, "train.lora_rank=16", "train.base_dtype=bfloat16", *GOAL],
        "h100",
        8,
        "fsdp4-expert2-lora16",
    ),
]
# The families `jaxnet study devices` compares, also on an H200: its predicted GPU column.
DEVICES = [(name, [], "h200", 1) for name in ("cnn_fashion_mnist", "lstm_ptb_small", "transformer_shakespeare")]
# Experiments whose shape comes from a checkpoint that is not shipped (a Hugging Face GPT-2): not planned.
UNPLANNED = {"gpt2_finetune", "hf_finetune"}
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


def write(path: Path, record: dict) -> None:
    """``record`` as JSON at ``path``, removing the records of earlier dates for the same plan."""
    stem = path.name[: -len("YYYY-MM-DD.json")]
    for old in path.parent.glob(f"{stem}*.json"):
        if old != path and re.fullmatch(re.escape(stem) + r"\d{4}-\d{2}-\d{2}\.json", old.name):
            old.unlink()
    path.write_text(json.dumps(record, indent=2) + "\n")


def published(date: str) -> dict:
    """Plan each published run jaxnet can build, fit the efficiency on the fit runs, and write the
    records, jaxnet/targets/expected.json and the table's results file."""
    runs = json.loads((ROOT / "jaxnet" / "targets" / "published_runs.json").read_text())
    out = ROOT / "benchmarks" / "results"
    reports: dict[str, dict] = {}
    pending: dict[str, str] = {}
    for run in runs["runs"]:
        j = run["jaxnet"]
        command = shlex.join(
            ["jaxnet", "plan", j["experiment"], *j["overrides"], "--target", j["target"], "--gpus", str(j["gpus"])]
            + (["--nodes", str(j["nodes"])] if j.get("nodes") else [])
        )
        print(f"{run['id']}: {command}", flush=True)
        try:
            cfg = config.load_experiment(j["experiment"], j["overrides"])
            report = planner.plan(cfg, j["target"], j["gpus"], nodes=j.get("nodes"))
        except UserError as e:
            pending[run["id"]] = str(e)
            print(f"  pending: {e}", flush=True)
            continue
        report.update(command=command, date=date, host=host(report), published_run=run["id"])
        reports[run["id"]] = report
    fit_runs = [r for r in runs["runs"] if r["role"] == "fit"]
    missing = [r["id"] for r in fit_runs if r["id"] not in reports]
    if missing:
        raise SystemExit(f"the fit runs {missing} could not be planned: {[pending[m] for m in missing]}")
    fit = planner.fit_efficiency([(r["id"], reports[r["id"]], r["published"]["step_s"]) for r in fit_runs])
    fit.update(
        kind="expected-step-fit",
        date=date,
        method="expected_step_s = max(compute_s, memory_s, launch_s) / efficiency + the communication XLA cannot "
        "overlap (jaxnet.planner.expected_step); efficiency = the median over the fit runs of the efficiency at "
        "which that gives the published step (jaxnet.planner.fit_efficiency)",
        source="jaxnet/targets/published_runs.json, planned by scripts/record_plans.py published",
        versions=next(iter(reports.values()))["versions"],
    )
    (ROOT / "jaxnet" / "targets" / planner.FIT_FILE).write_text(json.dumps(fit, indent=2) + "\n")
    planner.load_fit.cache_clear()
    rows = []
    for run in runs["runs"]:
        row = {k: run[k] for k in ("id", "role", "project", "model", "gpus", "parallelism", "batch", "precision")}
        row.update(compile=run["compile"], published=run["published"], source=run["source"], jaxnet=run["jaxnet"])
        report = reports.get(run["id"])
        if report is None:
            row.update(status="pending", reason=pending[run["id"]])
            rows.append(row)
            continue
        report["prediction"].update(planner.expectation(report, fit))
        write(out / f"plan-published-{run['id']}-{date}.json", report)
        p, published_s = report["prediction"], run["published"]["step_s"]
        needs = planner.solve_efficiency(p, report["communication"], published_s)
        row.update(
            status="fitted" if run["role"] == "fit" else "validated",
            record=f"benchmarks/results/plan-published-{run['id']}-{date}.json",
            command=report["command"],
            fits=report["fits"],
            bound=p["bound"],
            bound_step_s=p["predicted_step_s"],
            compute_s=p["compute_s"],
            memory_s=p["memory_s"],
            launch_s=p["launch_s"],
            communication_s=p["communication_s"],
            exposed_communication_s=p["exposed_communication_s"],
            expected_step_s=p["expected_step_s"],
            published_step_s=published_s,
            ratio_expected_to_published=p["expected_step_s"] / published_s,
            ratio_bound_to_published=p["predicted_step_s"] / published_s,
            efficiency_this_run_needs=needs if math.isfinite(needs) else None,
        )
        rows.append(row)
    fit["spread"] = plan_estimate.published_spread(rows)  # how far the expected step fell from the published ones
    (ROOT / "jaxnet" / "targets" / planner.FIT_FILE).write_text(json.dumps(fit, indent=2) + "\n")
    planner.load_fit.cache_clear()
    summary = {
        "kind": "published-runs-vs-plan",
        "date": date,
        "host": f"{platform.node()} ({os.cpu_count()} CPUs, shared), compiling for GPUs it does not have",
        "versions": fit["versions"],
        "fit": {k: fit[k] for k in ("efficiency", "fitted_on", "per_run", "method")},
        "excluded": runs["excluded"],
        "rows": rows,
        "label": "published: the run's own figure (measured by its authors); bound and expected: PREDICTED by "
        "jaxnet plan on this CPU, not measured",
    }
    write(out / f"plan-published-runs-{date}.json", summary)
    return summary


def spread() -> dict:
    """The spread of the newest committed published-runs table (:func:`published`'s) written into
    jaxnet/targets/expected.json beside its fit, without planning anything again."""
    table = sorted((ROOT / "benchmarks" / "results").glob("plan-published-runs-*.json"))[-1]
    path = ROOT / "jaxnet" / "targets" / planner.FIT_FILE
    fit = json.loads(path.read_text())
    fit["spread"] = plan_estimate.published_spread(json.loads(table.read_text())["rows"])
    fit["spread"]["source"] = str(table.relative_to(ROOT))
    path.write_text(json.dumps(fit, indent=2) + "\n")
    print(f"wrote {path.relative_to(ROOT)}: spread {fit['spread']['low']:+.2%} .. {fit['spread']['high']:+.2%}")
    return fit


def host(report: dict) -> str:
    """This machine, as a record names it."""
    machine = f"{platform.node()} ({os.cpu_count()} CPUs, shared)"
    return f"{machine}, compiling for {report['gpus']} x {report['device_kind']}"


def records(which: str) -> list[tuple]:
    if which == "gpt2":
        return GPT2
    if which == "llama":
        return LLAMA
    if which == "lora":
        return [r for r in LLAMA if "train.lora_rank=16" in r[1]]
    if which == "gpt2-max-batch":
        return GPT2[:1]
    if which == "devices":
        return DEVICES
    if which == "dense":
        return DENSE
    if which == "context":
        return CONTEXT
    if which == "moe":
        return MOE
    if which.startswith("moe:"):  # one of them by its experiment and label, e.g. moe:qwen3_30b_a3b-fsdp8
        return [r for r in MOE if f"{r[0]}-{r[4]}" == which.partition(":")[2]]
    if which.startswith("dense:"):  # one of them by its record's name, e.g. dense:gemma3_12b-remat
        return [r for r in DENSE if "-".join([r[0], *r[4:]]) == which.partition(":")[2]]
    if which.startswith("context:"):  # one of them by its label, e.g. context:128k-context8
        return [r for r in CONTEXT if r[4] == which.partition(":")[2]]
    if which in config.list_experiments():
        return [(which, [], "h100", 1)]
    own = {"gpt2_small", "llama3_8b", "qwen3_8b", "gemma3_12b", "qwen3_30b_a3b", "mixtral_8x7b", *UNPLANNED}
    others = [(name, [], "h100", 1) for name in config.list_experiments() if name not in own]
    return others + DEVICES if which == "others" else GPT2 + LLAMA + DENSE + CONTEXT + MOE + others + DEVICES


def main(argv: list[str]) -> int:
    date = datetime.date.today().isoformat()
    out = ROOT / "benchmarks" / "results"
    which = argv[0] if argv else "all"
    if which == "spread":
        spread()
        return 0
    if which in ("published", "all"):
        published(date)
    for name, overrides, target, gpus, *label in records(which) if which != "published" else []:
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
        report.update(command=command, date=date, host=host(report))
        suffix = (f"{target}x{gpus}" if gpus > 1 else target) + "".join(f"-{x}" for x in label)
        path = out / f"plan-{name}-{suffix}-{date}.json"
        write(path, report)
        print(planner.describe(report), flush=True)
        print(f"  wrote {path.relative_to(ROOT)}", flush=True)
    subprocess.run([sys.executable, str(ROOT / "scripts" / "update_docs.py")], check=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

"""Train the mixture demo and record it: per-corpus curves, tokens read, the speaker task's scores.

    python scripts/record_mixture.py [key=value ...] [--keep DIR]
    python scripts/record_mixture.py --plot benchmarks/results/mixture_shakespeare-cpu-DATE.json

Runs ``jaxnet train mixture_shakespeare`` as a separate process from the repository's root (the
corpora and the task file are made there on first use), then writes
``benchmarks/results/mixture_shakespeare-<platform>-<date>.json`` (the command, device, library
versions, date, load average, and per validation step the mixed and per-corpus losses, the tokens
read from each corpus and the task's acc / acc_norm) and a plot beside it (``.png``): validation
loss per corpus, the share of tokens read from each against its weight, and the task's scores.
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
EXPERIMENT = "mixture_shakespeare"
TASK = "speakers_lear"


def series(metrics: list[dict], split: str, key: str) -> list[list[float]]:
    """``[step, value]`` of ``key`` in the records of ``split``."""
    return [[r["step"], r[key]] for r in metrics if r["split"] == split and r.get(key) is not None]


def plot(record: dict, out: Path) -> None:
    """Three panels: validation loss per corpus and mixed; each corpus's share of the tokens read so
    far with its weight; the task's acc and acc_norm with chance."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    names = list(record["weights"])
    for name in names:
        steps, loss = zip(*record["val"][f"{name}/loss"], strict=True)
        axes[0].plot(steps, loss, marker="o", ms=3, label=name)
    steps, loss = zip(*record["val"]["loss"], strict=True)
    axes[0].plot(steps, loss, "k--", label="both (all validation bytes)")
    axes[0].set(title="validation loss per corpus", xlabel="step", ylabel="nats per byte")
    totals = {0: dict.fromkeys(names, 0)}
    for name in names:
        for step, tokens in record["train"][f"tokens/{name}"]:
            totals.setdefault(step, {})[name] = tokens
    steps = sorted(totals)
    for name in names:  # each log interval's share: the tokens read between two log lines
        share = [
            (totals[b][name] - totals[a][name]) / (sum(totals[b].values()) - sum(totals[a].values()))
            for a, b in zip(steps, steps[1:], strict=False)
        ]
        line = axes[1].step(steps[1:], share, where="pre", label=f"{name}: share of the interval's tokens")[0]
        weights = [w[names.index(name)] for w in record["weight_at"]]
        axes[1].step([w for w, *_ in record["weight_steps"]], weights, where="post", ls=":", color=line.get_color())
    axes[1].set(title="tokens read by corpus per log interval (dotted: weight)", xlabel="step", ylim=(0, 1))
    for key in ("acc", "acc_norm"):
        steps, value = zip(*record["val"][f"{TASK}/{key}"], strict=True)
        axes[2].plot(steps, value, marker="o", ms=3, label=key)
    axes[2].axhline(0.25, color="grey", ls=":", label="chance (4 choices)")
    axes[2].set(title=f"{TASK}: who speaks next ({record['task_rows']} rows)", xlabel="step", ylim=(0, 1))
    for ax in axes:
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    fig.suptitle(f"{EXPERIMENT}: {record['device']}, {record['date']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main(argv: list[str]) -> int:
    """Train with overrides ``argv`` and write the results file and its plot; returns the exit code.
    ``--plot FILE.json`` draws the plot of a results file again, without training."""
    if argv[:1] == ["--plot"]:
        path = Path(argv[1])
        plot(json.loads(path.read_text()), path.with_suffix(".png"))
        return 0
    keep = None
    if "--keep" in argv:
        at = argv.index("--keep")
        keep = Path(argv[at + 1]).absolute()
        argv = argv[:at] + argv[at + 2 :]
    scratch = Path(tempfile.mkdtemp(prefix="jaxnet-mixture-"))
    workdir = keep or scratch / "run"
    command = ["jaxnet", "train", EXPERIMENT, *argv, "train.progress=false"]
    load_start, started = os.getloadavg()[0], time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "jaxnet", *command[1:], "--workdir", str(workdir)], cwd=ROOT)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        return done.returncode
    summary = json.loads((workdir / "summary.json").read_text())
    metrics = observe.read_metrics(workdir / "metrics.jsonl")
    config = json.loads((workdir / "config.json").read_text())
    env = summary["environment"]
    names = list(summary["mixture"])
    first = [summary["mixture"][n]["weight"] for n in names]
    schedule = [(0, first)]
    for entry in config["data"]["mixture_schedule"]:
        step, _, weights = entry.partition(":")
        values = [float(w) for w in weights.split("/")]
        schedule.append((int(step), [w / sum(values) for w in values]))
    schedule.append((summary["step"], schedule[-1][1]))
    val_keys = ["loss", *(f"{n}/loss" for n in names), f"{TASK}/acc", f"{TASK}/acc_norm"]
    date = datetime.date.today().isoformat()
    task_rows = sum(1 for _ in open(ROOT / "tasks" / f"{TASK}.jsonl"))
    device = env["device"] if env["platform"] != "cpu" else f"{env['cpu_count']}-core CPU ({observe.cpu_model()})"
    record = {
        "kind": "mixture",
        "experiment": EXPERIMENT,
        "command": " ".join(command),
        "date": date,
        "device": device,
        "platform": env["platform"],
        "wall_time_s": round(wall, 1),
        "load_average": [round(load_start, 2), round(os.getloadavg()[0], 2)],
        "steps": summary["step"],
        "weights": dict(zip(names, first, strict=True)),
        "weight_steps": [[s] for s, _ in schedule],
        "weight_at": [w for _, w in schedule],
        "mixture": summary["mixture"],
        "task_rows": task_rows,
        "val": {k: series(metrics, "val", k) for k in val_keys},
        "train": {f"tokens/{n}": series(metrics, "train", f"tokens/{n}") for n in names},
        "final_val": summary.get("val", {}),
        "final_test": summary.get("test", {}),
        "versions": env["versions"],
        "python": env["python"],
        "git_commit": env["git_commit"],
    }
    out = ROOT / "benchmarks" / "results" / f"{EXPERIMENT}-{env['platform']}-{date}.json"
    out.write_text(json.dumps(record, indent=2) + "\n")
    plot(record, out.with_suffix(".png"))
    shutil.rmtree(scratch, ignore_errors=True)
    final = summary["val"]
    print(
        f"wrote {out.relative_to(ROOT)}: val loss {final['loss']:.4f} "
        + ", ".join(f"{n} {final[f'{n}/loss']:.4f}" for n in names)
        + f"; {TASK} acc {final[f'{TASK}/acc']:.3f} acc_norm {final[f'{TASK}/acc_norm']:.3f} in {wall:.0f} s"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

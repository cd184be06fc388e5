"""GPU against CPU: training throughput of the three standard families (the ConvNet, the LSTM and
the Transformer at their experiment shapes) on each device, and the GPU's speed-up, read from
committed ``jaxnet bench`` results; nothing is measured here.

    jaxnet study devices [--results benchmarks/results] [--workdir runs/study-devices]

**Where the numbers come from.** Every ``<device>-<date>.json`` of ``jaxnet bench`` in
``--results`` (smoke runs skipped) gives, per family, the runner's examples/s (and tokens/s for
the language models) on one device. Per family the study takes the newest GPU record; its CPU
figure is the one measured beside it by ``jaxnet bench --compare-devices`` (same machine, same
session) when that record has one, else the newest CPU record. The speed-up is GPU examples/s
over CPU examples/s, shown only where both exist: with CPU results alone the study says so in
one line and shows the CPU column; it never estimates a GPU figure. Each cell names the file it
came from in the JSON. The two devices may use different compute dtypes (``model.dtype=auto``:
bfloat16 on a GPU, float32 on a CPU), as a user running the same command would get; both dtypes
are recorded.

**Predicted GPU figures.** Beside the measured columns, each family gets the examples/s that the
committed ``jaxnet plan`` records (``plan-<experiment>-<target>-<date>.json`` in ``--results``, one
GPU, the experiment's own settings) predict for an H100 and an H200: the largest of the compute,
memory and kernel-launch bounds of the step compiled for that GPU on a CPU-only machine. They are
**predictions, not measurements**, labelled so in the table, the JSON and the plot; the measured
GPU column stays empty until a GPU run is committed.

Writes ``WORKDIR/devices.json`` and ``WORKDIR/devices.png`` (examples/s per family and device,
log scale, the speed-up over each GPU bar).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from jaxnet.errors import UserError
from jaxnet.study import common

FAMILIES = ("cnn", "lstm", "transformer")
# The experiment whose shapes each family's bench case uses, planned for the predicted column.
EXPERIMENTS = {"cnn": "cnn_fashion_mnist", "lstm": "lstm_ptb_small", "transformer": "transformer_shakespeare"}
PLAN_TARGETS = ("h100", "h200")


@dataclasses.dataclass
class Options:
    """Where the bench results are, and where the study writes."""

    results: str = "benchmarks/results"
    workdir: str | None = None
    command: str | None = None
    say: Callable[[str], None] = print


def load_bench_records(results: Path) -> list[dict[str, Any]]:
    """Every non-smoke ``jaxnet bench`` record in ``results``, oldest first, each with ``_file``."""
    if not results.is_dir():
        raise UserError(f"--results {results} is not a directory of jaxnet bench results")
    records = []
    for path in sorted(results.glob("*.json")):
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(record, dict) and record.get("kind") == "benchmark" and not record.get("smoke"):
            record["_file"] = str(path)
            records.append(record)
    records.sort(key=lambda r: (r.get("environment", {}).get("date") or "", r["_file"]))
    return records


def _cell(case: dict[str, Any], record: dict[str, Any], file: str) -> dict[str, Any]:
    env = record.get("environment", {})
    name = env.get("device", "?")
    if env.get("platform") == "cpu":
        name = f"{env.get('cpu_count', '?')}-core CPU ({env.get('cpu') or 'unknown'})"
    return {
        "examples_per_s": case.get("examples_per_s"),
        "tokens_per_s": case.get("tokens_per_s"),
        "step_time_ms": case.get("step_time_ms"),
        "dtype": case.get("dtype"),
        "batch_size": case.get("batch_size"),
        "device": name,
        "date": (env.get("date") or "")[:10],
        "jax": env.get("versions", {}).get("jax"),
        "file": file,
    }


def load_plan_predictions(results: Path) -> dict[str, dict[str, dict[str, Any]]]:
    """Per family and target (``h100``, ``h200``): the newest committed ``jaxnet plan`` record of the
    family's experiment on one GPU with the experiment's own settings, as a predicted cell."""
    out: dict[str, dict[str, dict[str, Any]]] = {family: {} for family in FAMILIES}
    for family, experiment in EXPERIMENTS.items():
        for target in PLAN_TARGETS:
            for path in sorted(results.glob(f"plan-{experiment}-{target}-*.json")):  # dated names: newest last
                try:
                    record = json.loads(path.read_text())
                except (OSError, ValueError):
                    continue
                prediction = record.get("prediction") or {}
                if record.get("gpus") != 1 or not prediction.get("examples_per_s"):
                    continue
                out[family][target] = {
                    "examples_per_s": prediction["examples_per_s"],
                    "tokens_per_s": prediction.get("tokens_per_s"),
                    "step_time_ms": 1e3 * prediction["predicted_step_s"],
                    "bound": prediction.get("bound"),
                    "dtype": record.get("compute_dtype"),
                    "device": record.get("device_kind", target),
                    "date": record.get("date"),
                    "file": str(path),
                    "label": "PREDICTED by jaxnet plan (a bound), not measured",
                }
    return out


def device_table(
    records: list[dict[str, Any]], predicted: dict[str, dict[str, dict[str, Any]]] | None = None
) -> dict[str, dict[str, Any]]:
    """Per family: ``cpu`` and ``gpu`` cells (or None), ``speedup`` (GPU / CPU examples/s, or None)
    and ``predicted`` (per plan target, a predicted cell with its ``speedup_over_cpu``)."""
    rows: dict[str, dict[str, Any]] = {}
    for family in FAMILIES:
        gpu = cpu = None
        for record in records:  # oldest first: the newest wins
            platform = record.get("environment", {}).get("platform")
            case = record.get("cases", {}).get(family)
            if not case or not case.get("examples_per_s"):
                continue
            if platform == "gpu":
                gpu = _cell(case, record, record["_file"])
                paired = (record.get("cpu_record") or {}).get("cases", {}).get(family)
                if paired and paired.get("examples_per_s"):
                    cpu_paired = _cell(paired, record["cpu_record"], record["_file"] + " (cpu_record)")
                    gpu["paired_cpu"] = cpu_paired
            elif platform == "cpu":
                cpu = _cell(case, record, record["_file"])
        if gpu is not None and "paired_cpu" in gpu:
            cpu = gpu.pop("paired_cpu")
        speedup = None
        if gpu and cpu:
            speedup = round(gpu["examples_per_s"] / cpu["examples_per_s"], 2)
        guesses = {t: dict(c) for t, c in ((predicted or {}).get(family) or {}).items()}
        for cell in guesses.values():
            cell["speedup_over_cpu"] = round(cell["examples_per_s"] / cpu["examples_per_s"], 1) if cpu else None
        rows[family] = {"cpu": cpu, "gpu": gpu, "speedup": speedup, "predicted": guesses}
    return rows


def report(rows: dict[str, dict[str, Any]]) -> str:
    """The table as printed: examples/s (tokens/s) per device and the speed-up."""
    have_gpu = any(r["gpu"] for r in rows.values())
    targets = [t for t in PLAN_TARGETS if any(t in r.get("predicted", {}) for r in rows.values())]
    head = ["family", "CPU examples/s (measured)", "CPU tokens/s"]
    if have_gpu:
        head += ["GPU examples/s (measured)", "GPU tokens/s", "GPU / CPU"]
    for target in targets:
        head += [f"{target.upper()} examples/s (PREDICTED)", f"{target.upper()} / CPU (PREDICTED)"]
    lines = [head]
    for family, r in rows.items():
        cpu, gpu = r["cpu"] or {}, r["gpu"] or {}
        line = [family, common.fmt(cpu.get("examples_per_s")), common.fmt(cpu.get("tokens_per_s"))]
        if have_gpu:
            line += [
                common.fmt(gpu.get("examples_per_s")),
                common.fmt(gpu.get("tokens_per_s")),
                "-" if r["speedup"] is None else f"{r['speedup']:.1f}x",
            ]
        for target in targets:
            cell = r.get("predicted", {}).get(target) or {}
            ratio = cell.get("speedup_over_cpu")
            bound = f" ({cell['bound']}-bound)" if cell.get("bound") else ""
            line += [common.fmt(cell.get("examples_per_s")) + bound, "-" if ratio is None else f"{ratio:,.0f}x"]
        lines.append(line)
    devices = sorted(
        {
            f"{side.upper()}: {r[side]['device']} ({r[side]['dtype']}, {r[side]['date']})"
            for r in rows.values()
            for side in ("cpu", "gpu")
            if r[side]
        }
    )
    text = common.table(lines) + ("\n" + "; ".join(devices) if devices else "")
    if targets:
        text += (
            "\nPREDICTED columns: jaxnet plan's bound for the step compiled for that GPU on a CPU-only machine "
            "(the largest of the compute, memory and kernel-launch bounds), not a measurement"
        )
    return text


def plot(rows: dict[str, dict[str, Any]], path: Path) -> None:
    """Bars of examples/s per family, CPU beside GPU, log scale, the speed-up above each GPU bar."""
    plt = common.pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    families = list(rows)
    targets = [t for t in PLAN_TARGETS if any(t in rows[f].get("predicted", {}) for f in families)]
    width = 0.8 / (2 + len(targets))
    for k, (side, color) in enumerate((("cpu", "C0"), ("gpu", "C1"))):
        offset = (k - (1 + len(targets)) / 2) * width
        xs = [i + offset for i, f in enumerate(families) if rows[f][side]]
        ys = [rows[f][side]["examples_per_s"] for f in families if rows[f][side]]
        if xs:
            device = next(rows[f][side]["device"] for f in families if rows[f][side])
            ax.bar(xs, ys, width, color=color, label=f"{side.upper()}: {device} (measured)")
    for k, target in enumerate(targets, start=2):
        offset = (k - (1 + len(targets)) / 2) * width
        have = [(i, rows[f]["predicted"][target]) for i, f in enumerate(families) if target in rows[f]["predicted"]]
        xs, ys = [i + offset for i, _ in have], [cell["examples_per_s"] for _, cell in have]
        ax.bar(xs, ys, width, color=f"C{k}", hatch="//", alpha=0.6, label=f"{target.upper()}: PREDICTED by jaxnet plan")
    for i, f in enumerate(families):
        if rows[f]["speedup"] is not None:
            ax.annotate(
                f"{rows[f]['speedup']:.1f}x",
                (i + (1 - (1 + len(targets)) / 2) * width, rows[f]["gpu"]["examples_per_s"]),
                ha="center",
                va="bottom",
                fontsize=9,
            )
    ax.set_xticks(range(len(families)), families)
    ax.set_yscale("log")
    ax.set_ylabel("training examples/s (jaxnet runner)")
    have_gpu = any(r["gpu"] for r in rows.values())
    ax.set_title("GPU against CPU" if have_gpu else "measured CPU; GPU only predicted (no GPU results yet)")
    ax.grid(alpha=0.3, axis="y", which="both")
    ax.legend(fontsize=8)
    common.save_figure(fig, path)


def main(opts: Options) -> dict[str, Any]:
    """Build the table from the results files, print it, write ``devices.json`` and ``devices.png``."""
    results = Path(opts.results)
    records = load_bench_records(results)
    if not records:
        raise UserError(f"no jaxnet bench results in {results}; run `jaxnet bench` first")
    rows = device_table(records, load_plan_predictions(results))
    if not any(r["gpu"] for r in rows.values()):
        opts.say(
            f"no GPU results in {results}: the measured GPU column is empty (run `jaxnet bench --compare-devices` on "
            "a GPU); the H100/H200 columns are jaxnet plan's predictions"
        )
    workdir = common.study_workdir(opts.workdir, "devices")
    record = {
        "kind": "study-devices",
        "results": str(results),
        "files": [r["_file"] for r in records],
        "families": rows,
        "environment": common.environment(opts.command),
    }
    common.write_json(workdir / "devices.json", record)
    plot(rows, workdir / "devices.png")
    opts.say(report(rows))
    opts.say(f"wrote {common.relpath(workdir / 'devices.json')} and {common.relpath(workdir / 'devices.png')}")
    return record

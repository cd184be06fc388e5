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


def device_table(records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per family: ``cpu`` and ``gpu`` cells (or None) and ``speedup`` (GPU / CPU examples/s, or None)."""
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
        rows[family] = {"cpu": cpu, "gpu": gpu, "speedup": speedup}
    return rows


def report(rows: dict[str, dict[str, Any]]) -> str:
    """The table as printed: examples/s (tokens/s) per device and the speed-up."""
    have_gpu = any(r["gpu"] for r in rows.values())
    head = ["family", "CPU examples/s", "CPU tokens/s"]
    if have_gpu:
        head += ["GPU examples/s", "GPU tokens/s", "GPU / CPU"]
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
        lines.append(line)
    devices = sorted(
        {
            f"{side.upper()}: {r[side]['device']} ({r[side]['dtype']}, {r[side]['date']})"
            for r in rows.values()
            for side in ("cpu", "gpu")
            if r[side]
        }
    )
    return common.table(lines) + ("\n" + "; ".join(devices) if devices else "")


def plot(rows: dict[str, dict[str, Any]], path: Path) -> None:
    """Bars of examples/s per family, CPU beside GPU, log scale, the speed-up above each GPU bar."""
    plt = common.pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    families = list(rows)
    width = 0.38
    for offset, side, color in ((-width / 2, "cpu", "C0"), (width / 2, "gpu", "C1")):
        xs = [i + offset for i, f in enumerate(families) if rows[f][side]]
        ys = [rows[f][side]["examples_per_s"] for f in families if rows[f][side]]
        if xs:
            device = next(rows[f][side]["device"] for f in families if rows[f][side])
            ax.bar(xs, ys, width, color=color, label=f"{side.upper()}: {device}")
    for i, f in enumerate(families):
        if rows[f]["speedup"] is not None:
            ax.annotate(
                f"{rows[f]['speedup']:.1f}x",
                (i + width / 2, rows[f]["gpu"]["examples_per_s"]),
                ha="center",
                va="bottom",
                fontsize=9,
            )
    ax.set_xticks(range(len(families)), families)
    ax.set_yscale("log")
    ax.set_ylabel("training examples/s (jaxnet runner)")
    have_gpu = any(r["gpu"] for r in rows.values())
    ax.set_title("GPU against CPU" if have_gpu else "CPU only: no GPU results yet")
    ax.grid(alpha=0.3, axis="y", which="both")
    ax.legend(fontsize=8)
    common.save_figure(fig, path)


def main(opts: Options) -> dict[str, Any]:
    """Build the table from the results files, print it, write ``devices.json`` and ``devices.png``."""
    results = Path(opts.results)
    records = load_bench_records(results)
    if not records:
        raise UserError(f"no jaxnet bench results in {results}; run `jaxnet bench` first")
    rows = device_table(records)
    if not any(r["gpu"] for r in rows.values()):
        opts.say(
            f"no GPU results in {results}: only the CPU column is shown (run `jaxnet bench --compare-devices` on a GPU)"
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

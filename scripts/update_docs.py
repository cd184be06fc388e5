"""Regenerate the tables and plots the docs pages and the README show, from benchmarks/results/*.json.

python scripts/update_docs.py          # rewrite every generated block in README.md and docs/*.md
python scripts/update_docs.py --check  # exit 1 if any of them is out of date

A generated block sits between ``<!-- NAME:begin ... -->`` and ``<!-- NAME:end -->`` in whichever
page shows it (NAME is a key of :data:`BLOCKS`); a link into benchmarks/results is written relative
to the page (``docs/results`` is a link to ``benchmarks/results``, so the site serves the files).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMPARISON = "shakespeare-lstm-vs-transformer.png"


def quoted(metrics: dict, task: str | None = None) -> str:
    """The figure people quote for a split: perplexity, nats and bits per character, or accuracy
    (of the masked tokens, with their loss, for masked LM)."""
    if task == "masked_lm":
        return f"{100 * metrics['accuracy']:.2f} % of masked chars, {metrics['loss']:.3f} nats"
    if "perplexity" in metrics:
        return f"perplexity {metrics['perplexity']:.1f}"
    if "bpc" in metrics:
        return f"{metrics['loss']:.3f} nats ({metrics['bpc']:.3f} bits/char)"
    return f"{100 * metrics['accuracy']:.2f} % accuracy"


def training_table(results: list[dict]) -> str:
    """A markdown table with one row per training results file."""
    lines = [
        "| experiment | test | validation | wall time | steps | throughput | device | versions | date | file |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        v = r["versions"]
        versions = f"jax {v['jax']}, flax {v['flax']}, optax {v['optax']}"
        if r.get("tokens_per_s"):
            throughput = f"{r['tokens_per_s']:,.0f} tokens/s"
        else:
            throughput = f"{r.get('examples_per_s') or 0:,.0f} examples/s"
        lines.append(
            f"| `{r['command']}` | {quoted(r['test'], r.get('task'))} | {quoted(r['val'], r.get('task'))} "
            f"| {r['wall_time_s'] / 60:.1f} min "
            f"| {r['steps']} | {throughput} | {r['device']} | {versions} | {r['date']} "
            f"| [{r['_file']}]({r['_file']}) |"
        )
    return "\n".join(lines)


def cost_table(results: list[dict]) -> str:
    """A markdown table of measured costs of runs too long to finish here."""
    lines = [
        "| experiment | measured | projected full run | device | versions | date | file |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        v = r["versions"]
        lines.append(
            f"| `jaxnet train {r['experiment']}` | {r['steps_per_s']:.2f} steps/s over {r['steps_measured']} steps "
            f"({r.get('tokens_per_s') or 0:,.0f} tokens/s) | {r['steps_total']:,} steps = {r['projected_hours']} h "
            f"| {r['device']} | jax {v['jax']}, flax {v['flax']} | {r['date']} | [{r['_file']}]({r['_file']}) |"
        )
    return "\n".join(lines)


def load_results() -> list[dict]:
    """Every results file, with its path relative to the repository as ``_file``."""
    results = []
    for path in sorted((ROOT / "benchmarks" / "results").glob("*.json")):
        record = json.loads(path.read_text())
        record["_file"] = str(path.relative_to(ROOT))
        results.append(record)
    return results


def mib(n: int) -> str:
    return "n/a" if n < 0 else f"{n / 2**20:,.2f}"


def render_memory() -> str:
    """Tables of per-device memory under each mesh layout, one per ``memory`` results file."""
    body = []
    for r in (r for r in load_results() if r.get("kind") == "memory"):
        m, v = r["model"], r["versions"]
        one = r["rows"][0]
        body += [
            f"**{r['name']}**: {m['name']} with {m['layers']} layers, width {m['width']}, {m['heads']} heads, "
            f"batch {r['shape']['batch_size']} x {r['shape']['seq_len']} tokens, float32; {r['devices']}, "
            f"jax {v['jax']}, {r['date']} (`{r['command']}`, [{r['_file']}]({r['_file']})). MiB per device:",
            "",
            "| layout | parameters | optimizer state | activations and temporaries "
            "| parameters + optimizer vs 1 device |",
            "|---|---|---|---|---|",
        ]
        for row in r["rows"]:
            share = (row["params"] + row["opt_state"]) / (one["params"] + one["opt_state"])
            body.append(
                f"| {row['layout']} | {mib(row['params'])} | {mib(row['opt_state'])} | {mib(row['activations'])} "
                f"| {share:.3f} |"
            )
        body.append("")
    return "\n".join(body).rstrip() or "No memory results recorded yet."


def render() -> str:
    """The generated part of the README: the results tables and plots."""
    results = load_results()
    training = [r for r in results if r.get("kind") == "training"]
    body = [
        "Measured by `python scripts/record_result.py EXPERIMENT` (wall time of the whole `jaxnet train` "
        "process: start-up, data loading, compilation, training, final evaluation; environment already set up)."
    ]
    body += ["", training_table(training)] if training else ["", "No results recorded yet."]
    notes = [r for r in training if r.get("note")]
    if notes:
        body += [""] + [f"- `{r['experiment']}`: {r['note']}" for r in notes]
    costs = [r for r in results if r.get("kind") == "cost"]
    if costs:
        body += [
            "",
            "Runs too long to finish on this machine, timed over their first steps by "
            "`python scripts/measure_cost.py EXPERIMENT` and projected to the full schedule:",
            "",
            cost_table(costs),
        ]
    comparison = ROOT / "benchmarks" / "results" / COMPARISON
    if comparison.is_file():
        body += [
            "",
            "Shakespeare, one task for both families (the same characters and 4,096 per step, AdamW with "
            "cosine decay for both, learning rates tuned per family; "
            "drawn by `python scripts/plot_comparison.py` from the runs' committed `.metrics.jsonl`):",
            "",
            f"![LSTM and Transformer on Shakespeare](benchmarks/results/{COMPARISON})",
        ]
    for r in (r for r in results if r.get("kind") == "sample"):
        body += [
            "",
            f"Text from the {r['experiment']} run above (step {r['checkpoint_step']}), "
            f"written by `python scripts/record_sample.py` ([{r['_file']}]({r['_file']})):",
            "",
            "```text",
            f"$ {r['command']}",
            r["text"],
            "```",
        ]
    for r in training:
        plot = Path(r["_file"]).with_suffix(".png")
        if (ROOT / plot).is_file():
            body += ["", f"![{r['experiment']} training curves]({plot})"]
    return "\n".join(body)


def _fmt(x: float | None, digits: int = 1) -> str:
    if x is None:
        return "-"
    return f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.{digits}f}"


def _met(value: float | None, target: float, lower_is_better: bool = False) -> str:
    if value is None:
        return "not measured"
    ok = value <= target if lower_is_better else value >= target
    return "met" if ok else "**not met**"


def _oversubscribed(r: dict, env: dict) -> bool:
    """Whether a CPU bench ran with more runnable jobs than twice the cores (a shared machine)."""
    load = r.get("load_average") or {}
    return env["platform"] == "cpu" and max(load.get("start", [0])[0], load.get("end", [0])[0]) > 2 * env["cpu_count"]


def _load_note(r: dict, env: dict) -> str:
    load = r.get("load_average")
    if not load or env["platform"] != "cpu":
        return ""
    note = f" Load average (1 min) at start and end: {load['start'][0]} and {load['end'][0]}"
    if _oversubscribed(r, env):
        return note + (
            ": the machine was oversubscribed by other jobs, and the peers lose very unequally to that "
            "(PyTorch's OpenMP threads far more than XLA's pool), so its jaxnet / PyTorch ratios are not judged."
        )
    return note + "."


def bench_tables(r: dict) -> list[str]:
    """The speed table and the targets table of one ``jaxnet bench`` results file."""
    env, v = r["environment"], r["environment"]["versions"]
    gpu = env["platform"] != "cpu"
    device = env["device"] if gpu else f"{env['cpu_count']}-core CPU ({env['cpu']})"
    body = [
        f"**{device}**, jax {v['jax']}, flax {v['flax']}, torch {v.get('torch') or 'not installed'}, "
        f"{env['date'][:10]}: `{r['command']}`, medians of {r['rounds']} alternating rounds "
        f"([{r['_file']}]({r['_file']})).{_load_note(r, env)}",
        "",
        "| family | shape | dtype | step | examples/s | tokens/s | compile | TFLOP/s | MFU "
        "| runner / hand-written | pipeline / resident | jaxnet / PyTorch |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, c in r["cases"].items():
        ratios = c["ratios"]
        mfu = "-" if c.get("mfu") is None else f"{100 * c['mfu']:.1f} %"
        body.append(
            f"| {name} | {c['what']} | {c['dtype']} | {c['step_time_ms']:.1f} ms | {_fmt(c.get('examples_per_s'))} "
            f"| {_fmt(c.get('tokens_per_s'))} | {c['compile_time_s']:.1f} s | {c['tflops']:.3f} | {mfu} "
            f"| {_fmt(ratios.get('runner/handwritten'), 3)} | {_fmt(ratios.get('pipeline/resident'), 3)} "
            f"| {_fmt(ratios.get('jaxnet/torch'), 3)} |"
        )
    body += ["", "| target | " + " | ".join(r["cases"]) + " |", "|---|" + "---|" * len(r["cases"])]
    targets = [
        ("runner / hand-written loop >= 0.97", "runner/handwritten", 0.97),
        ("real input pipeline / resident batches >= 0.95", "pipeline/resident", 0.95),
        (f"jaxnet / PyTorch >= 1.0 ({'GPU' if gpu else 'this CPU'})", "jaxnet/torch", 1.0),
    ]
    for label, key, target in targets:
        unjudged = key == "jaxnet/torch" and _oversubscribed(r, env)
        cells = [
            f"{_fmt(c['ratios'].get(key), 3)} {'not judged' if unjudged else _met(c['ratios'].get(key), target)}"
            for c in r["cases"].values()
        ]
        body.append(f"| {label} | " + " | ".join(cells) + " |")
    if not gpu:
        cells = [f"{c['compile_time_s']:.1f} s {_met(c['compile_time_s'], 30, True)}" for c in r["cases"].values()]
        body.append("| compile time of the first step < 30 s | " + " | ".join(cells) + " |")
    if "gpt2" in r["cases"] and gpu:
        c = r["cases"]["gpt2"]
        body += ["", f"GPT-2-small shape MFU {100 * (c['mfu'] or 0):.1f} % (target 45 %): {_met(c['mfu'], 0.45)}."]
    if r.get("compare_devices"):
        body += ["", "| family | CPU examples/s | GPU examples/s | GPU / CPU |", "|---|---|---|---|"]
        for f, row in r["compare_devices"].items():
            body.append(
                f"| {f} | {_fmt(row['cpu_examples_per_s'])} | {_fmt(row['gpu_examples_per_s'])} "
                f"| {row['speedup']:.1f}x |"
            )
    return body + [""]


def render_bench() -> str:
    """The performance section's tables, one set per ``jaxnet bench`` results file (smoke runs left out)."""
    runs = [r for r in load_results() if r.get("kind") == "benchmark" and not r.get("smoke")]
    body = []
    for r in runs:
        body += bench_tables(r)
    if not any(r["environment"]["platform"] == "gpu" for r in runs):
        body.append(
            "No GPU results yet: the GPU targets (MFU >= 45 % for the GPT-2-small shape in bf16 on one H100/H200, "
            "the LSTM's tokens/s and the ResNet's images/s against PyTorch's cuDNN LSTM and channels-last bf16 "
            "ResNet, the CPU-versus-GPU table of `jaxnet bench --compare-devices`) are still to be measured."
        )
    return "\n".join(body).rstrip() or "No benchmark results recorded yet."


def roofline_tables(r: dict) -> list[str]:
    """The roofline table (and its plot) of one results file that holds rooflines."""
    env, v, peaks = r["environment"], r["environment"]["versions"], r["device_peaks"]
    gpu = env["platform"] != "cpu"
    device = env["device"] if gpu else f"{env['cpu_count']}-core CPU ({env['cpu']})"
    flops = ", ".join(f"{d} {p / 1e12:.3g} TFLOP/s" for d, p in peaks["peak_flops"].items() if p) or "unknown"
    bandwidth = peaks.get("memory_bandwidth")
    body = [
        f"**{device}**, jax {v['jax']}, {env['date'][:10]}: `{r['command']}` ([{r['_file']}]({r['_file']})). "
        f"Peaks: {flops}, memory {f'{bandwidth / 1e9:,.0f} GB/s' if bandwidth else 'unknown'}"
        f"{f', ridge point {peaks_ridge(peaks)} FLOP/byte' if peaks_ridge(peaks) else ''} ({peaks['source']})."
        + (
            f" Load average (1 min) at start and end: {r['load_average']['start'][0]} and "
            f"{r['load_average']['end'][0]}, others' work on a shared machine."
            if r.get("load_average")
            else ""
        ),
        "",
        "| family | shape | dtype | GFLOP / step | MB / step | FLOP / byte | bound | achieved TFLOP/s "
        "| of the roofline |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, c in r["cases"].items():
        roof = c.get("roofline")
        if not roof:
            continue
        fraction = "-" if roof.get("fraction") is None else f"{100 * roof['fraction']:.0f} %"
        achieved = "-" if not roof.get("achieved_flops") else f"{roof['achieved_flops'] / 1e12:.3f}"
        body.append(
            f"| {name} | {c['what']} | {c['dtype']} | {roof['flops_per_step'] / 1e9:,.2f} "
            f"| {roof['bytes_per_step'] / 1e6:,.0f} | {roof['intensity']:.2f} | {roof.get('bound', '-')} "
            f"| {achieved} | {fraction} |"
        )
    stem = Path(r["_file"]).stem.removeprefix("roofline-")
    plot = Path(r["_file"]).with_name(f"roofline-{stem}.png")
    if (ROOT / plot).is_file():
        body += ["", f"![roofline of the training steps on {device}]({plot.as_posix()})"]
    return body + [""]


def peaks_ridge(peaks: dict) -> str:
    """The ridge point(s) in FLOP per byte, one per compute dtype with a known peak."""
    bandwidth = peaks.get("memory_bandwidth")
    known = {d: p for d, p in peaks["peak_flops"].items() if p}
    if not bandwidth or not known:
        return ""
    return ", ".join(f"{p / bandwidth:.1f}" + (f" ({d})" if len(known) > 1 else "") for d, p in known.items())


def render_roofline() -> str:
    """The roofline tables, one per results file with rooflines (``jaxnet bench --roofline``, or a
    full bench run that recorded the device's peaks); smoke runs left out."""
    runs = [
        r
        for r in load_results()
        if r.get("kind") in ("roofline", "benchmark") and r.get("device_peaks") and not r.get("smoke")
    ]
    body = []
    for r in runs:
        body += roofline_tables(r)
    return "\n".join(body).rstrip() or "No roofline results recorded yet."


def render_sweep() -> str:
    """Each recorded sweep's table and plot (scripts/record_sweep.py), and the batched-against-one-by-one
    timings (scripts/bench_sweep.py)."""
    body = []
    results = load_results()
    for r in (r for r in results if r.get("kind") == "sweep"):
        env = r["environment"]
        device = env["device"] if env["platform"] != "cpu" else f"{env['cpu_count']}-core CPU"
        table = (ROOT / Path(r["_file"]).with_suffix(".md")).read_text().strip()
        # a recording paused (SIGSTOP) to free the machine: its wall time less the pause
        minutes = (r["wall_time_s"] - r.get("stopped_s", 0)) / 60
        body += [
            f"`{r['command']}` ({len(r['members'])} members in {len(r['programs'])} program(s), "
            f"{minutes:.0f} min on a {device}"
            + (f" not counting {r['stopped_s'] / 60:.0f} min it was stopped" if r.get("stopped_s") else "")
            + f", jax {env['versions']['jax']}, {env['date'][:10]}; "
            f"[record]({r['_file']})):",
            "",
            table,
            "",
            f"![sweep]({Path(r['_file']).with_suffix('.png')})",
            "",
        ]
    for r in (r for r in results if r.get("kind") == "sweep-speed"):
        body += [
            f"Batched against one by one (`{r['command']}`; {r['device']}, jax "
            f"{r['environment']['versions']['jax']}, {r['date']}; [record]({r['_file']})):",
            "",
            "| experiment | members | per vmapped step | steps | batched | one by one | speed-up "
            "| member-steps/s batched |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for row in r["rows"]:
            body.append(
                f"| {row['experiment']} | {row['members']} | {row.get('members_at_once', row['members'])} "
                f"| {row['steps']} | {row['batched_wall_s']:.1f} s "
                f"| {row['one_by_one_wall_s']:.1f} s | {row['speedup']:.2f}x | {row['member_steps_per_s_batched']} |"
            )
        body.append("")
    for r in (r for r in results if r.get("kind") == "sweep-step"):
        body += [
            f"One train step, a sweep's against a run's (`{r['command']}`; {r['device']}, jax "
            f"{r['environment']['versions']['jax']}, {r['date']}; [record]({r['_file']})):",
            "",
            "| experiment | step | members | ms per member-step | fresh MiB touched per call |",
            "|---|---|---|---|---|",
        ]
        for row in r["rows"]:
            body.append(
                f"| {row['experiment']} | {row['step']} | {row['members']} | {row['ms_per_member_step']:.1f} "
                f"| {row['fresh_mib_per_call']:.0f} |"
            )
        body.append("")
    return "\n".join(body).rstrip() or "No sweep recorded yet."


def _latest(results: list[dict], **match: str) -> dict | None:
    """The newest results file (by date, then file name) whose fields equal ``match``."""
    found = [r for r in results if all(r.get(k) == v for k, v in match.items()) and not r.get("smoke")]
    date = lambda r: r.get("date") or r.get("environment", {}).get("date", "")  # noqa: E731
    return max(found, key=lambda r: (date(r)[:10], r["_file"]), default=None)


def _profile_rows(r: dict) -> list[dict]:
    """The rows of a ``scripts/profile_cpu.py`` file: family, setting, steps per call and the medians."""
    rows = []
    for name, result in r["results"].items():
        family, setting, *k = name.split("/")
        rows.append({"family": family, "setting": setting, "k": int(k[0][2:]) if k else 1, **result["median"]})
    return rows


# jaxnet / PyTorch before issue 25: measured on this machine then, and in the committed file of another.
BEFORE_TORCH = {
    "cnn": "0.51 (issue 25); 0.82 (cpu-2026-11-21.json)",
    "lstm": "0.78 (cpu-2026-11-21.json)",
    "transformer": "0.74 (cpu-2026-11-21.json)",
}


def render_cpu() -> str:
    """The CPU profiles per step (scripts/profile_cpu.py) and the CPU targets, met or not."""
    results = load_results()
    profiles = [r for r in results if r.get("kind") == "cpu-profile"]
    if not profiles:
        return "No CPU profile recorded yet."
    body = []
    for r in profiles:
        body += [
            f"**{r['device']} ({r['cpu_model']})**, jax {r['versions']['jax']}, {r['date']}: `{r['command']}`, "
            f"medians of the rounds, each (family, setting) a fresh process, in alternation "
            f"([{r['_file']}]({r['_file']})). The machine was shared with other jobs (load average in the table): "
            "milliseconds and CPU % are noisy, page faults and the user/kernel split much less so.",
            "",
            "| family | malloc / XLA setting | steps per call | ms / step | minor page faults / step "
            "| user CPU ms / step | kernel CPU ms / step | CPU used | load average |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for row in _profile_rows(r):
            body.append(
                f"| {row['family']} | {row['setting']} | {row['k']} | {row['ms_per_step']:.1f} "
                f"| {row['minor_faults_per_step']:,.0f} | {row['user_ms_per_step']:.1f} "
                f"| {row['system_ms_per_step']:.1f} | {row['cpu_percent']:.0f} % | {row['load_average']:.1f} |"
            )
        body.append("")
    # The targets: from the newest profile that measured the ConvNet with and without the command's setting.
    both = lambda r: {"plain", "hugetlb"} <= {x["setting"] for x in _profile_rows(r) if x["family"] == "cnn"}  # noqa: E731
    rows = _profile_rows(([r for r in profiles if both(r)] or profiles)[-1])
    cnn = {(x["setting"], x["k"]): x for x in rows if x["family"] == "cnn"}
    default, plain = cnn.get(("hugetlb", 1)), cnn.get(("plain", 1))
    faults = default and default["minor_faults_per_step"]
    cpu = default and default["cpu_percent"]
    load = _fmt(default and default["load_average"])
    body += [
        "| target (2-core CPU; not judged where the machine had more than two runnable jobs per core) "
        "| before | now | |",
        "|---|---|---|---|",
        f"| minor page faults per step, default ConvNet < 2,000 | {_fmt(plain and plain['minor_faults_per_step'])} "
        f"| {_fmt(faults, 0)} | {_met(faults, 2000, True)} |",
        f"| CPU used during steps >= 180 %, default ConvNet | 114 % (issue 25) | {_fmt(cpu, 0)} % (load {load}) "
        f"| {'not judged' if default and default['load_average'] > 4 else _met(cpu, 180)} |",
    ]
    for family in ("lstm", "transformer"):  # the issue measured the ConvNet; the others are shown beside it
        other = next((x for x in rows if x["family"] == family and (x["setting"], x["k"]) == ("hugetlb", 1)), None)
        if other is not None:
            busy = other["load_average"] > 4
            body.append(
                f"| CPU used during steps >= 180 %, {family} | - | {_fmt(other['cpu_percent'], 0)} % "
                f"(load {_fmt(other['load_average'])}) | {'not judged' if busy else _met(other['cpu_percent'], 180)} |"
            )
    bench = _latest([b for b in results if b.get("environment", {}).get("platform") == "cpu"], kind="benchmark")
    if bench is not None:
        for family in ("cnn", "lstm", "transformer"):
            ratio = bench["cases"].get(family, {}).get("ratios", {}).get("jaxnet/torch")
            busy = _oversubscribed(bench, bench["environment"])
            load = f", load {bench['load_average']['start'][0]}" if busy else ""
            body.append(
                f"| `jaxnet bench` jaxnet / PyTorch, {family}, >= 1.0 | {BEFORE_TORCH[family]} | {_fmt(ratio, 2)} "
                f"([{bench['_file']}]({bench['_file']}){load}) | {'not judged' if busy else _met(ratio, 1.0)} |"
            )
    run = _latest(results, kind="training", experiment="cnn_fashion_mnist")
    if run is not None:
        ok = run["wall_time_s"] <= 120 and run["test"]["accuracy"] >= 0.92
        load = max(run.get("load_average") or [0])
        verdict = "met" if ok else f"not judged (load {load})" if load > 4 else "**not met**"  # 4: 2 jobs per core
        body.append(
            f"| `./scripts/train` wall time <= 120 s for >= 92 % test | 292-335 s (issue 25) "
            f"| {run['wall_time_s']:.0f} s, {100 * run['test']['accuracy']:.2f} % ([{run['_file']}]({run['_file']})) "
            f"| {verdict} |"
        )
    return "\n".join(body)


def largest(r: dict) -> str:
    """The --max-batch result of a plan record: the size that fits and the next that does not."""
    b = r.get("max_batch_size")
    if not b:
        return "-"
    return (
        f"{b['batch_size']} ({b['memory_at'] / 2**30:.1f} GiB); {b['next_size']} does not "
        f"({b['memory_at_next'] / 2**30:.1f} GiB), {b['compiles']} compiles"
    )


BOUNDS = ("compute", "memory", "launch", "communication")
PUB = "plan-published-"
MEASURED = "plan-vs-measured-"  # a GPU's measurements against the plans (render_plan_vs_measured)


def input_rate(record: dict) -> str:
    """A plan record's predicted input rate per host: tokens/s for a language model, else examples/s."""
    rate = record.get("input_rate") or {}
    if rate.get("tokens_per_s_per_host"):
        return f"{rate['tokens_per_s_per_host'] / 1e6:,.2f} M tokens/s"
    if rate.get("examples_per_s_per_host"):
        return f"{rate['examples_per_s_per_host']:,.0f} examples/s"
    return "-"


def render_plan() -> str:
    """The plans compiled for GPUs on a CPU-only machine (benchmarks/results/plan-*.json): per
    device memory and verdict from the compiled program, FLOPs from XLA's cost analysis, the
    kernels launched per step, and the step time (the largest of the compute, memory and launch
    bounds, which one named), MFU and input rate per host as the PREDICTIONS they are."""
    files = [
        f
        for f in sorted((ROOT / "benchmarks" / "results").glob("plan-*.json"))
        if not f.name.startswith((PUB, MEASURED))
    ]
    if not files:
        return "No plan records yet: `python scripts/record_plans.py` writes them."
    rows = [json.loads(f.read_text()) | {"_file": f"benchmarks/results/{f.name}"} for f in files]
    first = {"gpt2_small": 0, "llama3_8b": 1}  # the multi-GPU plans first, side by side
    rows.sort(key=lambda r: (first.get(r["experiment"], 2), r["experiment"], r["target"], r["gpus"], r["command"]))
    lines = [
        "| command | GPUs | batch | fits | memory per device (args + temp) | GFLOP/step per device | "
        "kernels/step | **expected** step | **predicted** step (bound) | compute / memory / launch / communication "
        "bounds | **predicted** MFU bound | **predicted** input per host | cuDNN attention | matmuls | collectives "
        "| compile | largest batch that fits (`--max-batch`) | file |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        m, p, k = r["memory"], r["prediction"], r["kernels"]
        attention = k["cudnn_attention"]
        collectives = ", ".join(f"{n} {c['count']}" for n, c in k["collectives"].items()) or "-"
        matmuls = ", ".join(f"{d} {n}" for d, n in k["matmul_dtypes"].items()) or "-"
        mfu = f"{100 * p['mfu_bound']:.0f} %" if p.get("mfu_bound") else "-"
        kernels = f"{p['kernels_per_step']:,}" if p.get("kernels_per_step") is not None else "-"
        three = " / ".join("-" if p.get(f"{b}_s") is None else f"{1e3 * p[f'{b}_s']:.2f}" for b in BOUNDS) + " ms"
        expected = f"{1e3 * p['expected_step_s']:.2f} ms" if p.get("expected_step_s") else "-"
        lines.append(
            f"| `{r['command']}` | {r['gpus']} x {r['target'].upper()} | {r['batch_size']} "
            f"| {'yes' if r['fits'] else '**no**'} "
            f"| {m['total'] / 2**30:.2f} GiB of {m['device'] / 2**30:.1f} ({m['arguments'] / 2**30:.2f} + "
            f"{m['temp'] / 2**30:.2f}) "
            f"| {r['flops_per_step']['per_device'] / 1e9:,.1f} | {kernels} | {expected} "
            f"| {1e3 * p['predicted_step_s']:.2f} ms ({p['bound']}) | {three} | {mfu} | {input_rate(r)} "
            f"| {attention['forward']} fwd + {attention['backward']} bwd | {matmuls} | {collectives} "
            f"| {r['compile_s']:.0f} s | {largest(r)} | [{Path(r['_file']).name}]({r['_file']}) |"
        )
    v = rows[0]["versions"]
    lines.append("")
    lines.append(
        f"Compiled on a shared 2-core CPU with no GPU (jax {v['jax']}, jax-cuda12-plugin {v['jax-cuda12-plugin']}, "
        f"cuDNN {v['nvidia-cudnn-cu12']}; {rows[0]['date']}). Memory, FLOPs, kernels and collectives are read "
        "from the compiled program; the step time, MFU and input rate are **predictions**, not measurements: "
        "the step is the largest of four bounds, FLOPs / the data-sheet peak, XLA's bytes accessed / the "
        "bandwidth, the kernels launched per step x the launch cost in jaxnet/targets (3.25 us, a "
        "published measurement cited there) and the collectives over the target's links; the bound that wins is "
        "named. The **expected** step is the compute/memory/launch bound divided by the efficiency fitted on "
        "published runs (the table above) plus the communication XLA did not schedule to overlap. Not known "
        "without a GPU: autotuned gemm tiles, cuDNN workspaces (memory is a lower bound), measured step time and "
        "measured compute/communication overlap. The LSTMs are planned on their lax.scan path (the cuDNN LSTM "
        "cannot be traced without a GPU). Compile times are this CPU's, under load."
    )
    return "\n".join(lines)


def _ms(seconds: float) -> str:
    return f"{1e3 * seconds:,.0f} ms" if seconds >= 0.01 else f"{1e3 * seconds:.2f} ms"


def render_published() -> str:
    """Published measured runs against jaxnet plan's expected step and bound for the same
    configuration (the newest benchmarks/results/plan-published-runs-*.json, written by
    scripts/record_plans.py published): which run the efficiency was fitted on, which it was only
    checked against, and which wait for a model jaxnet cannot build yet."""
    files = sorted((ROOT / "benchmarks" / "results").glob(f"{PUB}runs-*.json"))
    if not files:
        return "No published-runs record yet: `python scripts/record_plans.py published` writes it."
    r = json.loads(files[-1].read_text())
    rel = f"benchmarks/results/{files[-1].name}"
    lines = [
        "| run (source) | model | GPUs | parallelism, batch | published step | `jaxnet plan` of the same configuration "
        "| **predicted** bound | bound / published | **expected** | expected / published | role |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in r["rows"]:
        src = row["source"]
        link = f"[{row['project']}](https://github.com/{src['repo']}/blob/{src['commit']}/{src['path']})"
        published = f"{_ms(row['published']['step_s'])} ({row['published']['text']})"
        j = row["jaxnet"]
        command = " ".join(
            ["jaxnet plan", j["experiment"], *j["overrides"], "--target", j["target"], "--gpus", str(j["gpus"])]
            + (["--nodes", str(j["nodes"])] if j.get("nodes") else [])
        )
        cells = [link, row["model"].split(":")[0], row["gpus"], f"{row['parallelism']}; {row['batch']}", published]
        cells.append(f"`{command}`")
        if row["status"] == "pending":
            reason = row["reason"].split(";")[0]
            cells += [f"pending: jaxnet cannot plan it yet ({reason})", "-", "-", "-", "not planned yet"]
        else:
            off = row["ratio_expected_to_published"]
            cells += [
                f"{_ms(row['bound_step_s'])} ({row['bound']}) [record]({row['record']})",
                f"{row['ratio_bound_to_published']:.2f}",
                _ms(row["expected_step_s"]),
                f"{off:.2f} ({100 * (off - 1):+.0f} %)",
                "**fitted**" if row["status"] == "fitted" else "validated (not fitted)",
            ]
        lines.append("| " + " | ".join(cells) + " |")
    fit, v = r["fit"], r["versions"]
    excluded = "; ".join(f"{e['id']} ({e['text']}): {e['why']}" for e in r["excluded"])
    needs = [row["efficiency_this_run_needs"] for row in r["rows"] if row.get("efficiency_this_run_needs")]
    lines += [
        "",
        f"Efficiency {fit['efficiency']:.3f}, fitted on {', '.join(fit['fitted_on'])}; each planned run alone would "
        f"need between {min(needs):.3f} and {max(needs):.3f} (`efficiency_this_run_needs` in the record), the spread "
        "of the method on these runs. The published figures are the "
        "runs' own; the bound and the expected step are **predictions** of `jaxnet plan` compiled on a CPU "
        f"(jax {v['jax']}, jax-cuda12-plugin {v['jax-cuda12-plugin']}; {r['date']}; [{files[-1].name}]({rel})), "
        f"not measurements. Left out: {excluded}.",
    ]
    return "\n".join(lines)


def headline() -> str:
    """The README's table: the newest training record of each experiment, one line each."""
    newest: dict[str, dict] = {}
    for r in load_results():
        if r.get("kind") == "training" and "test" in r and "experiment" in r and "wall_time_s" in r:
            if r["experiment"] not in newest or r["date"] >= newest[r["experiment"]]["date"]:
                newest[r["experiment"]] = r
    lines = ["| experiment | test | wall time | device | date | record |", "|---|---|---|---|---|---|"]
    for name in sorted(newest):
        r = newest[name]
        lines.append(
            f"| `{r['command']}` | {quoted(r['test'], r.get('task'))} | {r['wall_time_s'] / 60:.1f} min "
            f"| {r['device']} | {r['date']} | [{Path(r['_file']).name}]({r['_file']}) |"
        )
    return "\n".join(lines)


def _rate(x: float | None) -> str:
    return "-" if x is None else f"{x:,.0f}" if x >= 100 else f"{x:.1f}"


def render_devices() -> str:
    """GPU against CPU per family: the newest `jaxnet study devices` record, measured columns beside
    the H100/H200 examples/s that jaxnet plan predicts, each labelled."""
    files = sorted((ROOT / "benchmarks" / "results" / "studies").glob("devices-*.json"))
    if not files:
        return "No `jaxnet study devices` record yet."
    # the newest by the date inside (the names start with the device, which does not sort by time)
    path = max(files, key=lambda f: (json.loads(f.read_text())["environment"]["date"], f.name))
    r = json.loads(path.read_text())
    rel = str(path.relative_to(ROOT))
    env = r["environment"]
    targets = [t for t in ("h100", "h200") if any(t in f.get("predicted", {}) for f in r["families"].values())]
    head = ["family", "CPU examples/s (measured)", "GPU examples/s (measured)", "GPU / CPU (measured)"]
    head += [f"{t.upper()} examples/s (**predicted**)" for t in targets]
    head += [f"{t.upper()} / CPU (**predicted**)" for t in targets]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    devices: dict[str, list[str]] = {}  # each measured device: the families measured on it
    for family, row in r["families"].items():
        cpu, gpu = row.get("cpu") or {}, row.get("gpu") or {}
        for side in (cpu, gpu):
            if side.get("device"):
                devices.setdefault(f"{side['device']}, {side.get('dtype')}, {side.get('date')}", []).append(family)
        measured_gpu = _rate(gpu.get("examples_per_s")) if gpu else "not measured yet"
        speedup = f"{row['speedup']:,.1f}x" if row.get("speedup") else "-"
        cells = [family, _rate(cpu.get("examples_per_s")), measured_gpu, speedup]
        predicted = row.get("predicted", {})
        cells += [
            f"{_rate(predicted[t]['examples_per_s'])} ({predicted[t]['bound']}-bound)" if t in predicted else "-"
            for t in targets
        ]
        cells += [
            f"{predicted[t]['speedup_over_cpu']:,.0f}x" if predicted.get(t, {}).get("speedup_over_cpu") else "-"
            for t in targets
        ]
        lines.append("| " + " | ".join(cells) + " |")
    png = rel.replace(".json", ".png")
    return "\n".join(
        [
            f"`{env['command']}` ({env['date'][:10]}, jax {env['versions']['jax']}; "
            f"[record]({rel})): the measured columns from the newest committed `jaxnet bench` records (a GPU "
            "record's CPU figure is the one `--compare-devices` measured beside it on the GPU machine, else the "
            "newest CPU record), the predicted columns from the committed `jaxnet plan` records of each family's "
            "experiment on one GPU (the largest of the compute, memory and kernel-launch bounds of the step compiled "
            "for that GPU on a CPU-only machine). **The predicted columns are not measurements**; a family's measured "
            "GPU column fills in when a `jaxnet bench` record of it from a GPU is committed. Measured on: "
            + "; ".join(f"{d} ({', '.join(fs)})" for d, fs in devices.items())
            + ".",
            "",
            *lines,
            "",
            f"![GPU against CPU, measured and predicted]({png})",
        ]
    )


def render_import_memory() -> str:
    """The host memory of importing a Hugging Face checkpoint (the newest
    benchmarks/results/import-memory-*.json, written by scripts/measure_import.py)."""
    files = sorted((ROOT / "benchmarks" / "results").glob("import-memory-*.json"))
    if not files:
        return "No import measurement yet: `python scripts/measure_import.py` writes it."
    r = json.loads(files[-1].read_text())
    rel = f"benchmarks/results/{files[-1].name}"
    lines = [
        "| checkpoint (bfloat16) | files | parameters placed | **held beyond them, placed as read** (jaxnet) "
        "| held beyond them, gathered first | import time (placed) |",
        "|---|---|---|---|---|---|",
    ]
    for row in r["rows"]:
        placed, gathered = row["placed"], row["gathered"]
        lines.append(
            f"| {row['checkpoint_bytes'] / 1e9:.2f} GB ({row['layers']} blocks) | {row['files']} "
            f"| {placed['placed_bytes'] / 1e9:.2f} GB | **{placed['overhead'] / 1e6:,.0f} MB** "
            f"| {gathered['overhead'] / 1e6:,.0f} MB | {placed['seconds']:.1f} s |"
        )
    v = r["versions"]
    growth = r["checkpoint_growth"] / 1e9
    lines += [
        "",
        f"From the smaller checkpoint to the larger ({growth:.2f} GB more), what jaxnet's import holds beyond the "
        f"parameters grows by {r['overhead_placed_growth'] / 1e6:,.0f} MB; the largest tensor is "
        f"{r['largest_tensor_bytes_bf16'] / 1e6:,.0f} MB in bfloat16. Peak resident memory (VmHWM) of a fresh "
        "process, reset just before the import, minus the resident memory before it and the bytes placed; "
        f"{r['device']}; jax {v['jax']}, safetensors {v['safetensors']}; {r['date']}; `{r['command']}` "
        f"([{files[-1].name}]({rel})).",
    ]
    return "\n".join(lines)


def render_open_models_result() -> str:
    """llama_shakespeare and gemma_shakespeare beside gpt2_shakespeare (their newest training records)."""
    results = load_results()
    names = ("gpt2_shakespeare", "llama_shakespeare", "gemma_shakespeare")
    rows = [_latest(results, kind="training", experiment=n) for n in names]
    rows = [r for r in rows if r is not None]
    if len(rows) < 2:
        return "Not recorded yet: `python scripts/record_result.py llama_shakespeare` writes it."
    return training_table(rows)


#: The dense models planned on 8 H100s beside gpt2_small, in the order of their table.
LARGE_DENSE = ("llama3_8b", "qwen3_8b", "gemma3_12b")


def render_llama_plan() -> str:
    """llama3_8b's, qwen3_8b's and gemma3_12b's plans on 8 H100s (with and without model.remat) beside
    gpt2_small's on the same node."""
    files = [
        f
        for f in sorted((ROOT / "benchmarks" / "results").glob("plan-*.json"))
        if not f.name.startswith((PUB, MEASURED))
    ]
    rows = []
    for f in files:
        r = json.loads(f.read_text())
        if r.get("lora") or r.get("context"):
            continue  # LoRA's and long-context plans: tables of their own (render_lora_plan, render_context_plan)
        if r.get("experiment") in LARGE_DENSE or (r.get("experiment") == "gpt2_small" and r.get("gpus") == 8):
            rows.append(r | {"_file": f"benchmarks/results/{f.name}"})
    if not rows:
        return "No plan of llama3_8b yet: `python scripts/record_plans.py llama` writes them."
    order = {name: i for i, name in enumerate(LARGE_DENSE)}
    rows.sort(key=lambda r: (order.get(r["experiment"], len(order)), r["command"]))
    lines = [
        "| command | parameters | tokens a step | fits | memory per device | largest batch that fits "
        "(`--max-batch`) | **expected** step | **predicted** step (bound) | **predicted** MFU bound "
        "| goal: **expected** time, GPU-hours, cost | compile |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        m, p, g = r["memory"], r["prediction"], r.get("goal") or {}
        tokens = r["input_rate"].get("tokens_per_step")
        cost = f", ${g['cost_usd']:,.0f}" if g.get("cost_usd") is not None else ""
        goal = f"{g['goal']}: {g['wall_s'] / 3600:,.1f} h, {g['gpu_hours']:,.0f} GPU-h{cost}" if g else "-"
        mfu = f"{100 * p['mfu_bound']:.0f} %" if p.get("mfu_bound") else "-"
        lines.append(
            f"| `{r['command']}` | {r['parameters'] / 1e9:.2f} B | {tokens:,} | {'yes' if r['fits'] else '**no**'} "
            f"| {m['total'] / 2**30:.1f} GiB of {m['device'] / 2**30:.1f} | {largest(r)} "
            f"| {1e3 * p['expected_step_s']:,.0f} ms | {1e3 * p['predicted_step_s']:,.0f} ms ({p['bound']}) | {mfu} "
            f"| {goal} | {r['compile_s']:.0f} s ([record]({r['_file']})) |"
        )
    v = rows[0]["versions"]
    lines += [
        "",
        f"Compiled on a shared 2-core CPU with no GPU (jax {v['jax']}, jax-cuda12-plugin {v['jax-cuda12-plugin']}; "
        f"{rows[0]['date']}); the step, MFU, time and cost are **predictions** (the bound) and **estimates** (the "
        "expected step: the bound over the efficiency fitted on published runs, [Planning for GPUs](plan.md)), not "
        "measurements; the cost is at $3 per GPU-hour, for the tokens a step of each row's batch (8 sequences of "
        "8,192 tokens is one per GPU); the largest batch is a search over compiles (`--max-batch`). Memory is "
        "what XLA's compiled program says (cuDNN workspaces not counted).",
    ]
    return "\n".join(lines)


MOE_PLANNED = ("qwen3_30b_a3b", "mixtral_8x7b")


def render_moe_plan() -> str:
    """The mixtures of experts' plans on 8 H100s (qwen3_30b_a3b, mixtral_8x7b): the expert x FSDP
    split, total and active parameters, memory per device, the largest batch, the expected step and
    the all-to-all traffic XLA compiled, beside the time and cost of 1B tokens."""
    rows = []
    for f in sorted((ROOT / "benchmarks" / "results").glob("plan-*.json")):
        r = json.loads(f.read_text())
        if r.get("experiment") in MOE_PLANNED and r.get("gpus", 1) > 1:
            rows.append(r | {"_file": f"benchmarks/results/{f.name}"})
    if not rows:
        return "No plan of a mixture of experts yet: `python scripts/record_plans.py moe` writes them."
    rows.sort(key=lambda r: (MOE_PLANNED.index(r["experiment"]), r["command"]))
    lines = [
        "| command | parameters (active a token) | mesh | tokens a step | fits | memory per device: parameters, "
        "frozen base, optimizer state, temporaries = total | largest batch that fits (`--max-batch`) "
        "| **expected** step | **expected** tokens/s | all-to-all a step (compiled) | goal: **expected** time, cost "
        "| compile |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    gib = lambda n: f"{n / 2**30:.1f}"  # noqa: E731
    for r in rows:
        m, p, g = r["memory"], r["prediction"], r.get("goal") or {}
        tokens = r["input_rate"].get("tokens_per_step")
        mesh = " x ".join(f"{a}={n}" for a, n in r["mesh"].items() if n > 1) or "one device"
        a2a = r["kernels"]["collectives"].get("all-to-all") or {}
        a2a_text = f"{a2a['count']} ops, {a2a['bytes'] / 2**30:.2f} GiB" if a2a.get("bytes") else "-"
        if r.get("lora"):  # the model is the frozen base; the trained parameters are the adapters
            size = f"{r['frozen_parameters'] / 1e9:.1f} B frozen + {r['parameters'] / 1e6:.1f} M LoRA"
        else:
            size = f"{r['parameters'] / 1e9:.1f} B ({(r.get('active_parameters') or r['parameters']) / 1e9:.2f} B)"
        cost = f", ${g['cost_usd']:,.0f}" if g.get("cost_usd") is not None else ""
        goal = f"{g['goal']}: {g['wall_s'] / 3600:,.1f} h{cost}" if g and r["fits"] else "-"
        step = p.get("expected_step_s")
        rate = f"{tokens / step:,.0f}" if step and tokens and r["fits"] else "-"
        lines.append(
            f"| `{r['command']}` | {size} | {mesh} | {tokens:,} "
            f"| {'yes' if r['fits'] else '**no**'} | {gib(m['params'])}, {gib(m.get('frozen_base', 0))}, "
            f"{gib(m['opt_state'])}, {gib(m['temp'])} = **{gib(m['total'])}** of {gib(m['usable'])} GiB "
            f"| {largest(r)} | {1e3 * step:,.0f} ms | {rate} | {a2a_text} | {goal} "
            f"| {r['compile_s']:.0f} s ([record]({r['_file']})) |"
        )
    v = rows[0]["versions"]
    lines += [
        "",
        f"Compiled on a shared 2-core CPU with no GPU (jax {v['jax']}, jax-cuda12-plugin {v['jax-cuda12-plugin']}; "
        f"{max(r['date'] for r in rows)}); the step, tokens/s, time and cost are **estimates** (the bound over the "
        "efficiency fitted on published dense runs: a mixture's routing and all-to-all may fall further below it), "
        "not measurements; the cost at $3 per GPU-hour. Memory is what XLA's compiled program says per device "
        "(usable = 90 % of the GPU). A fixed capacity of 1.25 (`model.capacity_factor`): XLA on a GPU computes "
        "dropless routing's ragged_dot densely, expert by expert, which no plan of these sizes holds.",
    ]
    return "\n".join(lines)


def render_context_plan() -> str:
    """llama3_8b's long-context plans on 8 H100s: the sequence split over mesh.context (beside FSDP),
    the expected step and tokens/s, and context parallelism's traffic as predicted and as compiled."""
    rows = []
    for f in sorted((ROOT / "benchmarks" / "results").glob("plan-llama3_8b-*.json")):
        r = json.loads(f.read_text())
        if r.get("context"):
            rows.append(r | {"_file": f"benchmarks/results/{f.name}"})
    if not rows:
        return "No long-context plan yet: `python scripts/record_plans.py context` writes them."
    rows.sort(key=lambda r: (-r["seq_len"], r["mesh"].get("fsdp", 1), r["command"]))
    lines = [
        "| tokens a row | mesh | rows a step | fits | memory per device (args + temp) | **expected** step "
        "| **expected** tokens/s | **predicted** step (bound) | context traffic a step, predicted / compiled "
        "| communication bound | **predicted** MFU bound | goal: **expected** time, cost | compile | record |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        m, p, c, g = r["memory"], r["prediction"], r["context"], r.get("goal") or {}
        mesh = " x ".join(f"{a}={n}" for a, n in r["mesh"].items() if n > 1)
        compiled = sum((found or {}).get("bytes", 0) for found in c["compiled"].values())
        kinds = "+".join(k for k, found in c["compiled"].items() if found)
        tokens_s = p.get("expected_tokens_per_s") or (
            r["input_rate"]["tokens_per_step"] / p["expected_step_s"] if p.get("expected_step_s") else None
        )
        cost = f", ${g['cost_usd']:,.0f}" if g.get("cost_usd") is not None else ""
        goal = f"{g['goal']}: {g['wall_s'] / 3600:,.1f} h{cost}" if g else "-"
        mfu = f"{100 * p['mfu_bound']:.0f} %" if p.get("mfu_bound") else "-"
        lines.append(
            f"| {r['seq_len']:,} | {mesh} ({c['attention']}) | {r['batch_size']} | {'yes' if r['fits'] else '**no**'} "
            f"| {m['total'] / 2**30:.1f} GiB of {m['device'] / 2**30:.1f} ({m['arguments'] / 2**30:.1f} + "
            f"{m['temp'] / 2**30:.1f}) | {1e3 * p['expected_step_s']:,.0f} ms "
            f"| {tokens_s:,.0f} | {1e3 * p['predicted_step_s']:,.0f} ms ({p['bound']}) "
            f"| {c['predicted_bytes'] / 2**30:.2f} GiB / {compiled / 2**30:.2f} GiB ({kinds}) "
            f"| {1e3 * p['communication_s']:,.0f} ms | {mfu} | {goal} | {r['compile_s']:.0f} s "
            f"| [{Path(r['_file']).name}]({r['_file']}) |"
        )
    v = rows[0]["versions"]
    lines += [
        "",
        f"Compiled on a shared 2-core CPU with no GPU (jax {v['jax']}, jax-cuda12-plugin {v['jax-cuda12-plugin']}; "
        f"{rows[0]['date']}), each row's command in its record; every step, rate, time and cost is a "
        "**prediction** (the bound) or an **estimate** (the expected step: the bound over the efficiency fitted on "
        "published runs), not a measurement; the cost at $3 per GPU-hour. Context traffic: the bytes of context "
        "parallelism's collectives a device sends in a step as `jaxnet plan` predicts them from the shapes, and what "
        "the compiled step's collectives of those kinds carry (gathered: FSDP's all-gathers and reduce-scatters "
        "are counted there too); their time is in the communication bound. Attention inside each device is XLA's "
        "blockwise attention (cuDNN's fused kernel is not used across devices), so the memory bound is pessimistic "
        "against a fused kernel.",
    ]
    return "\n".join(lines)


def render_context_demo() -> str:
    """scripts/context_demo.py: llama_shakespeare with the sequence split over 4 simulated CPU devices
    (ring and gather) against one device, step by step."""
    r = _latest(load_results(), kind="context parallelism, CPU")
    if r is None:
        return "No run yet: `python scripts/context_demo.py` writes one."
    lines = [
        "| layout | CPU devices | first loss | last loss | largest difference from one device, any step | wall time |",
        "|---|---|---|---|---|---|",
    ]
    for name, run in r["runs"].items():
        lines.append(
            f"| {name} | {run['devices']} | {run['losses'][0]:.6f} | {run['losses'][-1]:.6f} "
            f"| {run['max_abs_difference_from_one_device']:.1e} | {run['wall_time_s']:.0f} s |"
        )
    v = r["versions"]
    lines += [
        "",
        f"{r['steps']} steps of {r['batch']} rows of {r['seq_len']:,} tokens, every step's training loss; "
        f"{r['device']}, simulated devices (`--xla_force_host_platform_device_count`); jax {v['jax']}, "
        f"flax {v['flax']}; {r['date']}, commit {_short_commit(r['git_commit'])}. Each command is in "
        f"[the record]({r['_file']}); the wall times are this shared CPU's, under load.",
    ]
    return "\n".join(lines)


def render_lora_plan() -> str:
    """llama3_8b with LoRA adapters on 1 and 2 H100s beside the full fine-tune on 8: memory per device."""
    files = [f for f in sorted((ROOT / "benchmarks" / "results").glob("plan-llama3_8b-*.json"))]
    rows = []
    for f in files:
        r = json.loads(f.read_text())
        if r.get("lora") or "--max-batch" in r["command"]:
            rows.append(r | {"_file": f"benchmarks/results/{f.name}"})
    if not any(r.get("lora") for r in rows):
        return "No LoRA plan of llama3_8b yet: `python scripts/record_plans.py lora` writes them."
    rows.sort(key=lambda r: (r["gpus"], "remat" not in r["command"]))
    gib = lambda n: f"{n / 2**30:.1f}"  # noqa: E731
    lines = [
        "| command | GPUs | trained parameters | frozen base | memory per device (GiB): trained parameters, "
        "frozen base, optimizer state, temporaries = total of usable | fits | largest batch of 8,192-token sequences "
        "(`--max-batch`) | loss | **expected** step | compile |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    losses = {"blockwise": "blockwise", "logits": "whole logits", None: "not recorded"}
    for r in rows:
        m, p = r["memory"], r["prediction"]
        frozen = (
            f"{r['frozen_parameters'] / 1e9:.2f} B ({r['lora']['base_dtype'] or 'float32'})" if r.get("lora") else "-"
        )
        trained = r["parameters"]
        lines.append(
            f"| `{r['command']}` | {r['gpus']} | {trained / 1e9:.3f} B | {frozen} "
            f"| {gib(m['params'])}, {gib(m.get('frozen_base', 0))}, {gib(m['opt_state'])}, {gib(m['temp'])} "
            f"= **{gib(m['total'])}** of {gib(m['usable'])} | {'yes' if r['fits'] else '**no**'} | {largest(r)} "
            f"| {losses[r.get('loss')]} | {1e3 * p['expected_step_s']:,.0f} ms | {r['compile_s']:.0f} s "
            f"([record]({r['_file']})) |"
        )
    v = rows[0]["versions"]
    lines += [
        "",
        f"Compiled on a shared 2-core CPU with no GPU (jax {v['jax']}, jax-cuda12-plugin {v['jax-cuda12-plugin']}; "
        f"{max(r['date'] for r in rows)}): memory is what XLA's compiled program says per device (cuDNN workspaces not "
        "counted; usable = 90 % of the GPU); the step is an **estimate** ([Planning for GPUs](plan.md)), not a "
        "measurement. Each row at the batch it was planned with (8 sequences, the experiment's); the largest batch "
        "is a search over compiles. *loss*: where the training loss comes from (`train.loss_from=auto`: blockwise, "
        "the whole logits never held; records made before plans said so: not recorded).",
    ]
    return "\n".join(lines)


def _short_commit(commit: str) -> str:
    """A git commit's first 7 hex digits; anything else (e.g. "not a git checkout") whole."""
    return commit[:7] if all(c in "0123456789abcdef" for c in commit) else commit


def render_blockwise() -> str:
    """The blockwise loss against the whole logits: the plans of scripts/measure_blockwise.py, the
    CPU step of scripts/compare_commits.py (tag ``blockwise``) and the nanoGPT side by side."""
    results = load_results()
    body = []
    plans = _latest(results, kind="blockwise-plans")
    if plans:
        v = plans["versions"]
        body += [
            "| plan | way | temporaries per device | memory per device | bytes per step | **predicted** step "
            "(bound: compute / memory) | largest batch (`--max-batch`) |",
            "|---|---|---|---|---|---|---|",
        ]
        for row in plans["plans"]:
            what = " ".join([row["experiment"], *row["overrides"], f"--target {row['target']} --gpus {row['gpus']}"])
            for way in ("logits", "blockwise"):
                w = row[way]
                bounds = f"{1e3 * w['compute_s']:,.1f} / {1e3 * w['memory_s']:,.1f} ms"
                biggest = w.get("max_batch", "-")
                lines = (
                    f"| `{what}` | {way} | {w['temp_bytes'] / 1e9:,.1f} GB | {w['total_bytes'] / 2**30:,.1f} GiB "
                    f"| {w['bytes_per_step'] / 1e9:,.0f} GB | {1e3 * w['predicted_step_s']:,.1f} ms ({w['bound']}: "
                    f"{bounds}) | {biggest} |"
                )
                body.append(lines)
        body += [
            "",
            f"Compiled on a shared 2-core CPU with no GPU (jax {v['jax']}, jax-cuda12-plugin "
            f"{v.get('jax-cuda12-plugin', '?')}; {plans['date']}), batch as each experiment sets it: "
            f"`{plans['command']}` "
            f"([{plans['_file']}]({plans['_file']})). Memory and bytes from XLA's compiled programs; the steps are "
            "**predictions** (the larger of the bounds), not measurements. *logits*: `train.loss_from=logits`; "
            "*blockwise*: the default.",
            "",
        ]
    tagged = [r for r in results if r.get("kind") == "compare-commits" and "-blockwise" in r["_file"]]
    for cpu in tagged:  # every run of the comparison, none picked over another
        r = cpu["results"]["gpt2_shakespeare"]
        loads = [x["load_average"] for side in r["rounds"].values() for x in side]
        rss, temp, ms = r["median_peak_rss_mib"], r["xla_temp_mib"], r["median_ms_per_step"]
        user = r["median_user_cpu_ms_per_step"]
        losses = r["warmup_losses"]
        diff = max(abs(a - b) for a, b in zip(losses["before"], losses["after"], strict=True))
        body += [
            "| `gpt2_shakespeare` step on the CPU | before (whole logits) | after (blockwise) | after / before |",
            "|---|---|---|---|",
            f"| wall time per step, median | {ms['before']:,.0f} ms | {ms['after']:,.0f} ms "
            f"| {r['after_over_before']:.3f} (paired rounds: {r['median_paired_ratio']:.3f}) |",
            f"| user CPU time per step, median | {user['before']:,.0f} ms | {user['after']:,.0f} ms "
            f"| {r['user_cpu_after_over_before']:.3f} |",
            f"| peak resident memory of the timed steps, median | {rss['before']:,.0f} MiB | {rss['after']:,.0f} MiB "
            f"| {rss['after'] / rss['before']:.3f} |",
            f"| XLA's temporaries of the compiled step | {temp['before']:,.0f} MiB | {temp['after']:,.0f} MiB "
            f"| {temp['after'] / temp['before']:.3f} |",
            "",
            f"{len(r['rounds']['before'])} rounds in alternation, fresh processes, {cpu['device']} "
            f"({cpu['cpu_model']}), jax {cpu['versions']['jax']}, {cpu['date']}, load average (1 min) "
            f"{min(loads):.1f} to {max(loads):.1f} (others' work on a shared machine): `{cpu['command']}`, before "
            f"{cpu['commits']['before'][:7]}, after {cpu['commits']['after'][:7]} "
            f"([{cpu['_file']}]({cpu['_file']})). The warm-up steps' losses on the same batches differ by at most "
            f"{diff:.1e} ({len(losses['before'])} steps).",
            "",
        ]
    nano = _latest(results, kind="nanogpt-side-by-side")
    if nano:
        m, v = nano["medians"], nano["versions"]
        body += [
            f"| {nano['steps']} steps of the same GPT on the same train.bin / val.bin | wall time | training steps' "
            "time | median step | final validation loss (nats per token) |",
            "|---|---|---|---|---|",
        ]
        for name in ("nanogpt", "jaxnet"):
            x = m[name]
            body.append(
                f"| {name} | {x['wall_s']:,.0f} s | {x['train_s']:,.0f} s | {x['median_step_ms']:,.0f} ms "
                f"| {x['val_loss']:.3f} |"
            )
        loads = nano["load_average"]
        plot = Path(nano["_file"]).with_suffix(".png").as_posix()
        body += [
            "",
            f"{nano['device']} ({nano['cpu']}), jax {v['jax']}, torch {v['torch']}, "
            f"nanoGPT {_short_commit(v['nanogpt_commit'])}, "
            f"{nano['date']}, {len(nano['runs']['jaxnet'])} round(s), load average (1 min) {loads['min']:.1f} to "
            f"{loads['max']:.1f}: `{nano['command']}` ([{nano['_file']}]({nano['_file']})). {nano['differences']}.",
            "",
            f"![nanoGPT and jaxnet side by side on the CPU]({plot})",
        ]
    return "\n".join(body).rstrip() or "Not recorded yet: `python scripts/measure_blockwise.py` writes the plans."


def render_plan_vs_measured() -> str:
    """jaxnet plan's predictions against a GPU's measurements of the same configs (the newest
    benchmarks/results/plan-vs-measured-*.json made on a GPU, written by scripts/gpu_check.sh
    --only plan) and that GPU check's tests and smokes (gpu-check-*.json)."""
    results = ROOT / "benchmarks" / "results"
    files = [f for f in sorted(results.glob("plan-vs-measured-*.json")) if "DRY" not in f.read_text()]
    if not files:
        return "Not measured on a GPU yet: `bash scripts/gpu_check.sh --only plan` on one writes it."
    r = json.loads(files[-1].read_text())
    lines = [
        "| experiment (batch) | compiled memory: planned → measured | peak in use | bound (planned) "
        "| expected step | **measured step** | measured / expected | MFU measured |",
        "|---|---|---|---|---|---|---|---|",
    ]
    made_with = set()
    for name, row in r["configs"].items():
        if "measured" not in row or "predicted" not in row:
            lines.append(f"| {name} | not compared: {row.get('error') or row.get('no_prediction')} | | | | | | |")
            continue
        m, p, ratio = row["measured"], row["predicted"], row["ratio_measured_to_predicted"]
        made_with.add(", ".join(f"{k} {v}" for k, v in p.get("made_with", {}).items()))
        lines.append(
            f"| {name} ({m['batch_size']}) | {p['memory_total'] / 2**30:.2f} → "
            f"{m['memory_analysis']['total'] / 2**30:.2f} GiB (x{ratio['memory_analysis_total']}) "
            f"| {m['peak_bytes_in_use'] / 2**30:.2f} GiB | {p['bound']}, {_ms(p['step_s'])} "
            f"| {_ms(p['expected_step_s'])} | **{_ms(m['median_step_s'])}** | x{ratio['median_step_s_to_expected']} "
            f"| {100 * p['compute_s'] / m['median_step_s']:.1f} % |"
        )
    facts = r.get("facts") or {}
    gpu = (facts.get("gpus") or [r["device_kind"]])[0].split(",")
    versions = ", ".join(f"{k} {facts[k]}" for k in ("jax", "jax-cuda13-plugin", "flax") if k in facts)
    lines += [
        "",
        f"Measured on one {gpu[0]} (driver {gpu[1].strip() if len(gpu) > 1 else '?'}; {versions}; {r['date']}): "
        f"the median of {r['steps_timed']} calls of the runner's jitted train step on one device-resident batch; "
        f"memory from the compiled program and the device's peak bytes in use; MFU is the plan's compute bound "
        f"(XLA's FLOPs at the data-sheet bf16 peak) over the measured step. Planned on a CPU without a GPU "
        f"({'; '.join(sorted(made_with))}), the committed plan records. `{r['command']}` "
        f"([{files[-1].name}](benchmarks/results/{files[-1].name})).",
    ]
    # the GPU check of the plan comparison's own day (a later check may have run other parts only)
    checks = sorted(results.glob(f"gpu-check-*-{r['date'][:10]}.json"))
    if checks:
        c = json.loads(checks[-1].read_text())
        lines += [
            "",
            f"The same GPU check's tests: {c.get('tests', {}).get('note', 'not run')}; smokes (every experiment's "
            f"smoke variant, checked to resolve to bf16 with cuDNN attention and LSTM): "
            f"{c.get('smokes', {}).get('note', 'not run')}; "
            f"bench: {c.get('bench', {}).get('note') or c.get('bench', {}).get('status', 'not run')} "
            f"([{checks[-1].name}](benchmarks/results/{checks[-1].name})).",
        ]
    return "\n".join(lines)


def _tokens(x: float | None) -> str:
    return "-" if not x else f"{x:,.0f}"


def render_speed() -> str:
    """jaxnet against PyTorch on one GPU (the newest benchmarks/results/speed-*.json measured on a
    GPU, written by scripts/gpu_check.sh --only setup,facts,speed), with jaxnet plan's expected step
    of each row beside it; before a GPU run, the plan's rows alone (planned-speed-rows-*.json)."""
    results = ROOT / "benchmarks" / "results"
    measured = [f for f in sorted(results.glob("speed-*.json")) if json.loads(f.read_text()).get("mode") == "gpu"]
    planned = sorted(results.glob("planned-speed-rows-*.json"))
    lines = []
    if measured:
        r = json.loads(measured[-1].read_text())
        lines += [
            "| row | batch x sequence | jaxnet step | jaxnet tokens/s | jaxnet MFU | PyTorch step | PyTorch tokens/s "
            "| PyTorch MFU | jaxnet / PyTorch tokens/s | plan: **expected** step (bound) | measured / expected |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for name, row in r["rows"].items():
            if "jaxnet" not in row:
                lines.append(f"| {name} | {row.get('status', '?')} | | | | | | | | | |")
                continue
            cells = []
            for side in ("jaxnet", "torch"):
                s = row.get(side) or {}
                if "median_step_s" in s:
                    mfu = f"{100 * s['mfu']:.1f} %" if s.get("mfu") else "-"
                    cells += [_ms(s["median_step_s"]), _tokens(s["tokens_per_s"]), mfu]
                else:
                    cells += [s.get("status", "-"), "", ""]
            ratio = row.get("jaxnet_over_torch_tokens_per_s")
            plan = row.get("plan") or {}
            expected = f"{_ms(plan['expected_step_s'])} ({plan['bound']})" if plan.get("expected_step_s") else "-"
            over = row.get("jaxnet_measured_over_expected")
            lines.append(
                f"| {name} | {row['batch']} x {row['seq_len']} | {' | '.join(cells)} "
                f"| {f'{ratio:.2f}' if ratio else '-'} | {expected} | {f'x{over:.2f}' if over else '-'} |"
            )
        facts = r.get("facts") or {}
        v = r.get("versions") or {}
        gpu = (facts.get("gpus") or [r["device_kind"]])[0].split(",")
        versions = ", ".join(
            f"{k} {v[k]}" for k in ("jax", "jax-cuda13-plugin", "flax", "torch", "torchao") if v.get(k)
        )
        lines += [
            "",
            f"Measured on one {gpu[0]} (driver {gpu[1].strip() if len(gpu) > 1 else '?'}; {versions}; {r['date']}): "
            f"{r['timing']}. MFU: jaxnet.flops' count of the step over the step time and {r['peak_source']} "
            f"({(r.get('peak_flops') or 0) / 1e12:.0f} TFLOP/s), for the float8 rows too. The expected step is "
            f"jaxnet plan's on a CPU without a GPU ({planned[-1].name if planned else 'no plan record'}). "
            f"`{r.get('command', 'bash scripts/gpu_check.sh --only setup,facts,speed')}` "
            f"([{measured[-1].name}](benchmarks/results/{measured[-1].name})).",
        ]
    else:
        lines.append(
            "Not measured on a GPU yet: `bash scripts/gpu_check.sh --only setup,facts,speed` on one writes it."
        )
    if planned:
        p = json.loads(planned[-1].read_text())
        targets = sorted({t for plans in p["rows"].values() for t in plans})
        lines += [
            "",
            "What `jaxnet plan` expects of the same rows (**predictions**, compiled on a CPU without a GPU):",
            "",
            "| row | "
            + " | ".join(f"{t.upper()}: **expected** step, MFU (bound)" for t in targets)
            + " | float8 GEMMs |",
            "|---|" + "---|" * len(targets) + "---|",
        ]
        for name, plans in p["rows"].items():
            cells = []
            for t in targets:
                x = plans.get(t) or {}
                mfu = f", {100 * x['expected_mfu']:.0f} %" if x.get("expected_mfu") else ""
                cells.append(f"{_ms(x['expected_step_s'])}{mfu} ({x['bound']})" if x.get("expected_step_s") else "-")
            dtypes = next(iter(plans.values()))["matmul_dtypes"]
            fp8 = sum(n for d, n in dtypes.items() if d.startswith("f8"))
            lines.append(f"| {name} | {' | '.join(cells)} | {fp8 or '-'} of {sum(dtypes.values())} |")
        v = p["versions"]
        lines += [
            "",
            f"`{p['command']}` (jax {v['jax']}, jax-cuda12-plugin {v['jax-cuda12-plugin']}; {p['date']}; "
            f"[{planned[-1].name}](benchmarks/results/{planned[-1].name})). {p['label']}.",
        ]
    return "\n".join(lines)


def render_search() -> str:
    """The committed plan search (benchmarks/results/searched-*.json, scripts/record_search.py)
    beside the hand-chosen plans it is compared with."""
    files = sorted((ROOT / "benchmarks" / "results").glob("searched-*.json"))
    if not files:
        return "No search recorded yet: `python scripts/record_search.py` writes it."
    r = json.loads(files[-1].read_text())
    lines = [
        "| mesh | `model.remat` | batch (the other sizes that fit) | memory per device | first batch that does not fit "
        "| FLOPs a token (recompute) | **expected** step (bound) | **expected** tokens/s | compiles |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for c in [r["best"], *r["runners_up"], *[c for c in r["candidates"] if not c["fits"]]]:
        mesh = " x ".join(f"{a}={n}" for a, n in c["mesh"].items() if n > 1) or "1"
        if not c["fits"]:
            lines.append(f"| {mesh} | `{c['remat']}` | does not fit | | | | | | |")
            continue
        share = c.get("recompute_fraction")
        recompute = f" (+{100 * share:.0f} %)" if share else ""
        nxt = f"{c['next_size']} ({c['memory_at_next'] / 2**30:.1f} GiB)" if c.get("memory_at_next") else "-"
        best = "**" if c is r["best"] else ""
        others = [  # every size compiled that fits is ranked: the largest is not always the fastest
            f"{size}: {_tokens(rate)} tokens/s"
            for size, rate in (c.get("sizes_fitting") or {}).items()
            if int(size) != c["batch_size"]
        ]
        batch = f"{best}{c['batch_size']}{best}" + (f" ({', '.join(others)})" if others else "")
        lines.append(
            f"| {mesh} | {best}`{c['remat']}`{best} | {batch} | {c['memory'] / 2**30:.1f} GiB "
            f"| {nxt} | {c['flops_per_token'] / 1e9:.1f} GFLOP{recompute} "
            f"| {_ms(c['expected_step_s'])} ({c['bound']}) | {best}{_tokens(c['tokens_per_s'])}{best} "
            f"| {c['compiles']} |"
        )
    lines += ["", "The hand-chosen plans committed before it (the same model, node and mesh):", ""]
    lines += ["| command | batch | **expected** step | **expected** tokens/s |", "|---|---|---|---|"]
    for h in r["hand_chosen"]:
        lines.append(
            f"| `{h['command']}` | {h['batch_size']} | {_ms(h['expected_step_s'])} "
            f"| {_tokens(h['expected_tokens_per_s'])} |"
        )
    ratio = r.get("search_over_hand_chosen")
    v = r["versions"]
    lines += [
        "",
        f"`{r['jaxnet_command']}`, recorded by `{r['command']}`: {r['compiles']} compiles, {r['compile_s'] / 60:.0f} "
        f"min of compiling ({r['wall_s'] / 60:.0f} min in all) on {r['host']} (jax {v['jax']}, jax-cuda12-plugin "
        f"{v['jax-cuda12-plugin']}; {r['date']}; [{files[-1].name}](benchmarks/results/{files[-1].name})). The "
        f"search's best is x{ratio:.2f} the best hand-chosen plan's expected tokens/s. {r['label']}."
        if ratio
        else "",
    ]
    return "\n".join(lines)


BLOCKS = {
    "headline": headline,
    "results": render,
    "memory": render_memory,
    "bench": render_bench,
    "roofline": render_roofline,
    "cpu": render_cpu,
    "sweep": render_sweep,
    "plan": render_plan,
    "published": render_published,
    "devices": render_devices,
    "import-memory": render_import_memory,
    "open-models-result": render_open_models_result,
    "llama-plan": render_llama_plan,
    "lora-plan": render_lora_plan,
    "moe-plan": render_moe_plan,
    "context-plan": render_context_plan,
    "context-demo": render_context_demo,
    "blockwise": render_blockwise,
    "plan-vs-measured": render_plan_vs_measured,
    "speed": render_speed,
    "search": render_search,
}


def pages() -> list[Path]:
    """The files that may hold generated blocks: the README and every docs page."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def regenerate(text: str, page: Path) -> str:
    """``text`` with every generated block it holds rendered anew, links relative to ``page``."""
    for name, render_block in BLOCKS.items():
        begin, end = f"<!-- {name}:begin", f"<!-- {name}:end -->"
        if begin not in text:
            continue
        head, rest = text.split(begin, 1)
        marker_line, _, tail = rest.partition("\n")
        _, end_tail = tail.split(end, 1)
        block = render_block()
        if page.parent != ROOT:
            block = block.replace("](benchmarks/results/", "](results/")
        text = f"{head}{begin}{marker_line}\n{block}\n{end}{end_tail}"
    return text


def main(argv: list[str]) -> int:
    """Rewrite (or with --check, compare) every generated block; returns the exit code."""
    stale, seen = [], set()
    for page in pages():
        text = page.read_text()
        seen.update(name for name in BLOCKS if f"<!-- {name}:begin" in text)
        new = regenerate(text, page)
        if new != text:
            stale.append(page.relative_to(ROOT))
            if "--check" not in argv:
                page.write_text(new)
    missing = set(BLOCKS) - seen
    if missing:
        print(f"no page shows the generated blocks {sorted(missing)}", file=sys.stderr)
        return 1
    if "--check" in argv and stale:
        print("out of date: " + ", ".join(map(str, stale)) + " (run python scripts/update_docs.py)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

"""Regenerate the README's generated sections (results, memory per device) from benchmarks/results/*.json.

python scripts/update_readme.py          # rewrite README.md
python scripts/update_readme.py --check  # exit 1 if README.md is out of date
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMPARISON = "shakespeare-lstm-vs-transformer.png"


def quoted(metrics: dict) -> str:
    """The figure people quote for a split: perplexity, nats and bits per character, or accuracy."""
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
            f"| `{r['command']}` | {quoted(r['test'])} | {quoted(r['val'])} | {r['wall_time_s'] / 60:.1f} min "
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
            "```",
            f"$ {r['command']}",
            r["text"],
            "```",
        ]
    for r in training:
        plot = Path(r["_file"]).with_suffix(".png")
        if (ROOT / plot).is_file():
            body += ["", f"![{r['experiment']} training curves]({plot})"]
    return "\n".join(body)


BLOCKS = {"results": render, "memory": render_memory}


def main(argv: list[str]) -> int:
    """Rewrite (or with --check, compare) the README's generated sections; returns the exit code."""
    readme = ROOT / "README.md"
    text = readme.read_text()
    new = text
    for name, render_block in BLOCKS.items():
        begin, end = f"<!-- {name}:begin", f"<!-- {name}:end -->"
        head, rest = new.split(begin, 1)
        marker_line, _, tail = rest.partition("\n")
        _, end_tail = tail.split(end, 1)
        new = f"{head}{begin}{marker_line}\n{render_block()}\n{end}{end_tail}"
    if "--check" in argv:
        return 0 if new == text else 1
    readme.write_text(new)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

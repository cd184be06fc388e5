"""Regenerate the README's results table from benchmarks/results/*.json.

python scripts/update_readme.py          # rewrite README.md
python scripts/update_readme.py --check  # exit 1 if README.md is out of date
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BEGIN, END = "<!-- results:begin", "<!-- results:end -->"


def training_table(results: list[dict]) -> str:
    """A markdown table with one row per training results file."""
    lines = [
        "| experiment | test accuracy | wall time | steps | examples/s | device | versions | date | file |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        v = r["versions"]
        versions = f"jax {v['jax']}, flax {v['flax']}, optax {v['optax']}"
        lines.append(
            f"| `{r['command']}` | {100 * r['test']['accuracy']:.2f} % | {r['wall_time_s'] / 60:.1f} min "
            f"| {r['steps']} | {r.get('examples_per_s') or 0:.0f} | {r['device']} | {versions} | {r['date']} "
            f"| [{r['_file']}]({r['_file']}) |"
        )
    return "\n".join(lines)


def render() -> str:
    """The generated part of the README: the results tables and plots."""
    results = []
    for path in sorted((ROOT / "benchmarks" / "results").glob("*.json")):
        record = json.loads(path.read_text())
        record["_file"] = str(path.relative_to(ROOT))
        results.append(record)
    training = [r for r in results if r.get("kind") == "training"]
    body = [
        "Measured by `python scripts/record_result.py EXPERIMENT` (wall time of the whole `jaxnet train` "
        "process: start-up, data loading, compilation, training, final evaluation; environment already set up)."
    ]
    body += ["", training_table(training)] if training else ["", "No results recorded yet."]
    for r in training:
        plot = Path(r["_file"]).with_suffix(".png")
        if (ROOT / plot).is_file():
            body += ["", f"![{r['experiment']} training curves]({plot})"]
    return "\n".join(body)


def main(argv: list[str]) -> int:
    """Rewrite (or with --check, compare) the README's generated section; returns the exit code."""
    readme = ROOT / "README.md"
    text = readme.read_text()
    head, rest = text.split(BEGIN, 1)
    marker_line, _, tail = rest.partition("\n")
    _, end_tail = tail.split(END, 1)
    new = f"{head}{BEGIN}{marker_line}\n{render()}\n{END}{end_tail}"
    if "--check" in argv:
        return 0 if new == text else 1
    readme.write_text(new)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

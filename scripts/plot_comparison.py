"""Draw the LSTM and the Transformer on Shakespeare in one plot, from committed results.

    python scripts/plot_comparison.py

Reads the newest ``benchmarks/results/train-{lstm,transformer}_shakespeare-*.metrics.jsonl``
(written by ``scripts/record_result.py``) and writes
``benchmarks/results/shakespeare-lstm-vs-transformer.png``: training and validation bits per
character against steps (both models see the same number of characters per step) and against
wall-clock time.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from jaxnet import observe  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
EXPERIMENTS = ("lstm_shakespeare", "transformer_shakespeare")


def newest(experiment: str) -> tuple[dict, list[dict]] | None:
    """The newest results record of ``experiment`` and its metrics, or None."""
    found = []
    for path in RESULTS.glob(f"train-{experiment}-*.metrics.jsonl"):
        record = json.loads(path.with_name(path.name.replace(".metrics.jsonl", ".json")).read_text())
        if record["experiment"] == experiment and record["platform"] == "cpu":  # the default variant, one device kind
            found.append((record["date"], record, path))
    if not found:
        return None
    _, record, path = max(found, key=lambda f: f[0])
    return record, observe.read_metrics(path)


def main() -> int:
    """Write the comparison plot; returns the exit code."""
    runs = {e: newest(e) for e in EXPERIMENTS}
    missing = [e for e, r in runs.items() if r is None]
    if missing:
        print(f"no recorded run of {', '.join(missing)}; run scripts/record_result.py first", file=sys.stderr)
        return 2
    fig, (by_step, by_time) = plt.subplots(1, 2, figsize=(11, 4))
    for (experiment, (record, metrics)), color in zip(runs.items(), ("tab:blue", "tab:orange"), strict=True):
        name = f"{experiment.split('_')[0].upper()} ({record['param_count'] / 1e6:.2f} M params)"
        train = [r for r in metrics if r["split"] == "train" and r.get("bpc") is not None]
        val = [r for r in metrics if r["split"] == "val"]
        # seconds since the start of training, from each logging interval's measured speed
        elapsed, clock, last = [], 0.0, 0
        for r in train:
            clock += (r["step"] - last) / r["steps_per_s"] if r.get("steps_per_s") else 0.0
            elapsed.append(clock / 60)
            last = r["step"]
        minutes = dict(zip((r["step"] for r in train), elapsed, strict=True))
        by_step.plot(
            [r["step"] for r in train], [r["bpc"] for r in train], color=color, alpha=0.5, label=f"{name} train"
        )
        by_step.plot([r["step"] for r in val], [r["bpc"] for r in val], "o-", color=color, label=f"{name} validation")
        by_time.plot(elapsed, [r["bpc"] for r in train], color=color, alpha=0.5, label=f"{name} train")
        by_time.plot(
            [minutes.get(r["step"], elapsed[-1]) for r in val],
            [r["bpc"] for r in val],
            "o-",
            color=color,
            label=f"{name} validation",
        )
    for ax, xlabel in ((by_step, "step (32 x 128 characters)"), (by_time, "training time, minutes (excl. evaluation)")):
        ax.set_xlabel(xlabel)
        ax.set_ylabel("bits per character")
        ax.set_ylim(top=4.0)
        ax.grid(alpha=0.3)
    by_step.legend(fontsize=8)
    device = runs[EXPERIMENTS[0]][0]["device"]
    fig.suptitle(f"Character-level Shakespeare: LSTM vs Transformer ({device})", fontsize=10)
    fig.tight_layout()
    out = RESULTS / "shakespeare-lstm-vs-transformer.png"
    fig.savefig(out, dpi=100)
    print(f"wrote {out.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

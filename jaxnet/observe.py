"""What a run tells the outside world: metrics.jsonl (and through it the trackers), a progress bar, curves.png.

``metrics.jsonl`` has one JSON object per line: ``{"step": 500, "split": "val", "loss": ...}``.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import platform
import shlex
import subprocess
import sys
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm


class MetricsLog:
    """Appends metrics to ``metrics.jsonl`` and hands each record to the run's trackers
    (:mod:`jaxnet.train.trackers`: TensorBoard under ``tb/``, MLflow).

    When a run resumes at ``resume_step``, lines the interrupted run wrote after that step are
    dropped, and so are evaluation lines at that step when ``final`` (the resumed run is about
    to evaluate it again). Resumed at a checkpoint that falls on a logging step, the file then
    holds the same lines and values as an uninterrupted run's (timings aside); resumed between
    logging steps, it keeps the
    stopped run's line at the stop, and the next line averages only the steps since. Each
    tracker's ``begin`` then gets the lines kept.
    """

    def __init__(
        self, workdir: str | os.PathLike, resume_step: int = 0, final: bool = False, trackers: Sequence[Any] = ()
    ):
        self.path = Path(workdir) / "metrics.jsonl"
        kept: list[str] = []
        if resume_step and self.path.exists():
            for line in self.path.read_text().splitlines():
                record = _record(line)
                if record is None or record["step"] > resume_step:
                    continue
                if record["step"] == resume_step and final and record.get("split") != "train":
                    continue
                kept.append(line)
            self.path.write_text("".join(line + "\n" for line in kept))
        elif not resume_step:
            self.path.write_text("")
        self._file = open(self.path, "a")
        self.trackers = list(trackers)
        records = [r for r in map(_record, kept) if r is not None]
        for tracker in self.trackers:
            tracker.begin(records)

    def write(self, step: int, split: str, values: dict[str, float]) -> None:
        """Record ``values`` for ``split`` (train, val or test) at ``step``."""
        # JSON has no NaN or Infinity: write null, which every reader understands
        values = {k: v if not isinstance(v, float) or math.isfinite(v) else None for k, v in values.items()}
        self._file.write(json.dumps({"step": step, "split": split, **values}) + "\n")
        self._file.flush()
        for tracker in self.trackers:
            tracker.write(step, split, values)

    def close(self) -> None:
        """Flush and close the file and the trackers."""
        self._file.close()
        for tracker in self.trackers:
            tracker.close()


def _record(line: str) -> dict[str, Any] | None:
    """One metrics line, or None for a line that is not a complete record (e.g. half-written by a killed run)."""
    try:
        record = json.loads(line)
    except ValueError:
        return None
    if not isinstance(record, dict) or not isinstance(record.get("step"), int | float):
        return None
    return record


def read_metrics(path: str | os.PathLike) -> list[dict[str, Any]]:
    """All complete records of a ``metrics.jsonl`` file."""
    return [r for r in map(_record, Path(path).read_text().splitlines()) if r is not None]


class Quiet:
    """Stands in for :class:`MetricsLog` and :class:`Progress` in the processes of a multi-process
    run other than process 0, which alone writes logs and prints progress."""

    def write(self, *args: Any) -> None:
        """Do nothing."""

    def update(self, *args: Any) -> None:
        """Do nothing."""

    def note(self, *args: Any) -> None:
        """Do nothing."""

    def close(self) -> None:
        """Do nothing."""


class Progress:
    """A progress bar on a terminal; one plain line per update otherwise (logs, CI, or with
    ``enabled`` False: ``train.progress=false`` hides the bar, never the lines)."""

    def __init__(self, total: int, initial: int, enabled: bool = True):
        self.enabled = enabled
        self.interactive = enabled and sys.stderr.isatty()
        self.total = total
        self._bar = tqdm(total=total, initial=initial, unit="step", dynamic_ncols=True) if self.interactive else None

    def update(self, step: int, values: dict[str, float]) -> None:
        """Move to ``step`` and show ``values`` (loss, accuracy, steps/s)."""
        text = "  ".join(f"{k} {_fmt(v)}" for k, v in values.items())
        if self._bar is not None:
            self._bar.update(step - self._bar.n)
            self._bar.set_postfix_str(text, refresh=True)
        else:
            print(f"step {step}/{self.total}  {text}", flush=True)

    def note(self, message: str) -> None:
        """Print a line without breaking the bar."""
        if self._bar is not None:
            self._bar.write(message)
        else:
            print(message, flush=True)

    def close(self) -> None:
        """Remove the bar from the screen's live area."""
        if self._bar is not None:
            self._bar.close()


def headline(metrics: dict[str, float], split: str) -> str:
    """The metric people quote: perplexity (word LM), bits per character (char LM) or accuracy;
    otherwise the loss and every other metric of the task."""
    if "perplexity" in metrics:
        return f"{split} perplexity {metrics['perplexity']:.2f}  {split} loss {metrics['loss']:.4f}"
    if "bpc" in metrics:
        return f"{split} loss {metrics['loss']:.4f} nats ({metrics['bpc']:.4f} bits per character)"
    if "bits_per_byte" in metrics:
        return f"{split} loss {metrics['loss']:.4f} nats ({metrics['bits_per_byte']:.4f} bits per byte)"
    if "accuracy" in metrics:
        return f"{split} accuracy {metrics['accuracy']:.4f}  {split} loss {metrics['loss']:.4f}"
    others = "".join(f"  {split} {k} {v:.4g}" for k, v in metrics.items() if k != "loss")
    return f"{split} loss {metrics['loss']:.4g}{others}"


def _fmt(value: float) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


# Record fields that are bookkeeping, not a task's metric.
NOT_PLOTTED = {"step", "split", "loss", "lr", "grad_norm", "steps_per_s", "examples_per_s", "tokens_per_s", "skipped"}

SPLIT_STYLE = {"train": dict(color="C0"), "val": dict(color="C1"), "test": dict(color="C2", marker="*", markersize=12)}


def plot_curves(metrics_path: str | os.PathLike, out_path: str | os.PathLike, title: str = "") -> None:
    """Draw loss and the headline metric against step, one line per split, into a PNG.

    The second panel is perplexity (word-level language models), bits per character
    (character-level ones) or accuracy (classifiers), whichever the log has; for another task,
    the first metric its evaluations report (e.g. mse for regression).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series: dict[tuple[str, str], list[tuple[int, float]]] = defaultdict(list)
    records = read_metrics(metrics_path)
    names = {k for r in records for k in r}
    metric = next((m for m in ("perplexity", "bpc", "bits_per_byte", "accuracy", "r2") if m in names), None)
    if metric is None:  # a task's own metrics: the first one its evaluations report
        evaluated = [k for r in records if r.get("split") != "train" for k in r]
        metric = next((k for k in evaluated if k not in NOT_PLOTTED), "accuracy")
    for record in records:
        for name in ("loss", metric):
            if isinstance(record.get(name), int | float):
                series[(name, record.get("split", "?"))].append((record["step"], record[name]))
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, name in zip(axes, ("loss", metric), strict=True):
        for split, style in SPLIT_STYLE.items():
            points = series.get((name, split))
            if not points:
                continue
            steps, values = zip(*points, strict=True)
            marker = style.get("marker", "o" if len(points) < 30 else None)
            ax.plot(steps, values, **{**style, "marker": marker}, label=f"{split} {values[-1]:.4g}")
        ax.set_xlabel("step")
        ax.set_ylabel(name)
        ax.grid(alpha=0.3)
        ax.legend()
    axes[0].set_yscale("log")
    if metric == "perplexity":
        axes[1].set_yscale("log")
    fig.suptitle(title or Path(metrics_path).parent.name)
    fig.tight_layout()
    fig.savefig(out_path, dpi=100)
    plt.close(fig)


def environment() -> dict[str, Any]:
    """Devices, library versions, git commit, command line and date: what a result needs to be reproducible."""
    import importlib.metadata as md

    import jax

    versions = {}
    for package in ("jaxnet", "jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "numpy"):
        try:
            versions[package] = md.version(package)
        except md.PackageNotFoundError:
            versions[package] = None
    device = jax.devices()[0]
    return {
        "platform": device.platform,
        "device": device.device_kind,
        "device_count": jax.device_count(),
        "process_count": jax.process_count(),
        "cpu_count": os.cpu_count(),
        "python": sys.version.split()[0],
        "versions": versions,
        "git_commit": _git_commit(),
        "devices": [f"{d.platform}:{d.id} {d.device_kind}" for d in jax.devices()[:64]],
        "command": _command_line(),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }


def _command_line() -> str | None:
    """How this process was started, e.g. ``jaxnet train cnn_fashion_mnist optim.lr=0.01``."""
    if not sys.argv or not sys.argv[0]:
        return None
    program = Path(sys.argv[0]).name
    if program == "__main__.py":  # python -m jaxnet
        program = f"python -m {Path(sys.argv[0]).parent.name}"
    return shlex.join([program, *sys.argv[1:]])


def cpu_model(cpuinfo: str | None = None) -> str:
    """The CPU's model name, from /proc/cpuinfo where there is one (or the text ``cpuinfo``), with
    its family, model and widest vector instructions: a virtual machine often names only the
    maker's line ("AMD EPYC"), which holds CPUs of 2-fold different speeds::

        AMD EPYC (family 25, model 17, AVX-512)
    """
    try:
        text = Path("/proc/cpuinfo").read_text() if cpuinfo is None else cpuinfo
    except OSError:
        text = ""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() and key.strip() not in fields:
            fields[key.strip()] = value.strip()
        if not line.strip() and fields:  # the first processor is enough
            break
    if "model name" not in fields:
        return platform.processor() or "unknown"
    flags = set(fields.get("flags", "").split())
    vector = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "AVX" if "avx" in flags else ""
    details = [f"family {fields['cpu family']}" if "cpu family" in fields else "",
               f"model {fields['model']}" if "model" in fields else "", vector]  # fmt: skip
    details = [d for d in details if d]
    return fields["model name"] + (f" ({', '.join(details)})" if details else "")


def _git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=Path(__file__).parent,
            capture_output=True,
            text=True,
            timeout=5,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def write_json(path: str | os.PathLike, data: dict[str, Any]) -> None:
    """Write ``data`` as indented JSON, atomically (a reader never sees half a file)."""
    path = Path(path)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    tmp.replace(path)

"""What the studies share: parsing ``name=1,2,4`` lists, training one point of a study in its own
run directory (reusing it when the study is rerun), the metric a run is judged by, the
environment record, and writing the JSON and the table.

>>> split_arguments(["batch=64,128", "optim.lr=0.1"], ("batch",))
({'batch': '64,128'}, ['optim.lr=0.1'])
>>> parse_int_list("batch", "64,128")
[64, 128]
"""

from __future__ import annotations

import contextlib
import datetime
import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from jaxnet import config as config_lib
from jaxnet.errors import UserError

# Settings that may change between invocations of a study without making a reused run another run.
_FREE_KEYS = {"train.progress", "train.stop_after", "train.trackers", "data.prefetch", "data.dir", "data.path"}


def split_arguments(tokens: Sequence[str], names: Sequence[str]) -> tuple[dict[str, str], list[str]]:
    """Separate the study's own ``name=value`` arguments (``batch=64,128``) from config overrides.

    Returns ``({name: value}, overrides)``; a name given twice is an error.
    """
    own: dict[str, str] = {}
    overrides: list[str] = []
    for token in tokens:
        key, sep, value = token.partition("=")
        if sep and key.strip() in names:
            if key.strip() in own:
                raise UserError(f"{key.strip()}= is given twice; give it once, e.g. {key.strip()}=1,2,4")
            own[key.strip()] = value.strip()
        else:
            overrides.append(token)
    return own, overrides


def parse_int_list(name: str, text: str, low: int = 1) -> list[int]:
    """``"64,128,256"`` as ``[64, 128, 256]``: integers >= ``low``, no repeats, in increasing order."""
    example = f"{name}=64,128,256" if name == "batch" else f"{name}=0,1,2,4"
    items = [t.strip() for t in text.split(",")]
    if not text.strip() or any(not t for t in items):
        raise UserError(f"{name}={text!r}: expected a comma-separated list of integers, e.g. {example}")
    values = []
    for item in items:
        try:
            value = int(item.replace("_", ""))
        except ValueError:
            raise UserError(f"{name}={text!r}: {item!r} is not an integer (expected e.g. {example})") from None
        if value < low:
            raise UserError(f"{name}={text!r}: every entry must be >= {low}, got {value}")
        values.append(value)
    if len(set(values)) != len(values):
        raise UserError(f"{name}={text!r}: an entry is repeated; give each value once")
    return sorted(values)


def parse_int(name: str, text: str, low: int = 1) -> int:
    """One integer argument ``name=text``, at least ``low``."""
    if "," in text:
        raise UserError(f"{name}={text!r}: expected one integer, e.g. {name}=4")
    return parse_int_list(name, text, low)[0]


# ---------------------------------------------------------------------------------------------
# The metric a study judges a run by


def headline_metric(cfg: config_lib.Config) -> str:
    """The validation metric the runner reports for ``cfg``'s data: ``perplexity`` (word-level
    text), ``bpc`` (characters), ``bits_per_byte`` (bytes) or ``accuracy`` (images)."""
    if cfg.data.name not in ("ptb", "shakespeare", "text"):
        return "accuracy"
    from jaxnet import tokenizers

    return tokenizers.kind_of(cfg.data.tokenizer or config_lib.default_tokenizer(cfg.data.name)).metric


def higher_is_better(metric: str) -> bool:
    """Accuracy rises as a model learns; perplexity, bits per character and loss fall."""
    return metric == "accuracy"


def meets(metric: str, value: float | None, target: float) -> bool:
    """Whether ``value`` of ``metric`` has reached ``target`` (>= for accuracy, <= otherwise)."""
    if value is None or not math.isfinite(value):
        return False
    return value >= target if higher_is_better(metric) else value <= target


def val_curve(workdir: Path, metric: str) -> list[tuple[int, float]]:
    """``(step, value)`` of ``metric`` at every validation pass logged in ``workdir/metrics.jsonl``."""
    from jaxnet import observe

    path = workdir / "metrics.jsonl"
    if not path.exists():
        return []
    return [
        (int(r["step"]), float(r[metric]))
        for r in observe.read_metrics(path)
        if r.get("split") == "val" and isinstance(r.get(metric), int | float)
    ]


# ---------------------------------------------------------------------------------------------
# Training one point of a study


def run_key(cfg: config_lib.Config) -> str:
    """What two configs must share to be the same run: every key but those free to change
    between invocations (the progress bar, trackers, where the data lies, ...)."""
    flat = config_lib.flatten(cfg.to_dict())
    return json.dumps({k: v for k, v in flat.items() if k not in _FREE_KEYS}, sort_keys=True, default=str)


def check_reusable(workdir: Path, cfg: config_lib.Config) -> None:
    """Refuse to continue a run in ``workdir`` whose saved config differs from ``cfg`` (another
    batch size, learning rate or budget would silently mix two runs' checkpoints)."""
    saved = workdir / "config.json"
    if not saved.exists():
        return
    old = config_lib.flatten(config_lib.load(saved).to_dict())
    new = config_lib.flatten(cfg.to_dict())
    changed = [k for k in new if k not in _FREE_KEYS and old.get(k) != new[k]]
    if changed:
        k = changed[0]
        raise UserError(
            f"{workdir} holds a run with {k}={old.get(k)}, but this study needs {k}={new[k]}"
            f"{f' (and {len(changed) - 1} more changes)' if len(changed) > 1 else ''}; "
            "pass a fresh --workdir, or delete that run directory"
        )


def train_quietly(
    cfg: config_lib.Config,
    workdir: Path,
    log_path: Path,
    *,
    dataset: Any = None,
    stop_when: Callable[[int, dict[str, float]], bool] | None = None,
) -> dict[str, Any]:
    """Train (or resume) ``cfg`` in ``workdir`` with the runner's own lines going to ``log_path``."""
    from jaxnet.train import train

    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "a") as log, contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
        return train(cfg, workdir, dataset=dataset, stop_when=stop_when)


def load_dataset(cfg: config_lib.Config) -> Any:
    """The experiment's data, loaded once and shared by every run of a study."""
    from jaxnet import data as data_lib

    return data_lib.load(cfg.data)


def study_workdir(workdir: str | None, name: str) -> Path:
    """``--workdir`` or ``runs/study-NAME``, created; refuses a file."""
    path = Path(workdir) if workdir else Path("runs") / f"study-{name.replace(':', '-')}"
    if path.exists() and not path.is_dir():
        raise UserError(f"--workdir {path} is a file; pass a directory")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"cannot create {path}: {e.strerror}; pass another --workdir") from None
    return path


# ---------------------------------------------------------------------------------------------
# Outputs


def environment(command: str | None) -> dict[str, Any]:
    """Device, library versions, date and the study's command line, for the study's JSON."""
    from jaxnet import observe

    env = observe.environment()
    env["cpu"] = observe.cpu_model()
    if command:
        env["command"] = command
    env["date"] = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    return env


def write_json(path: Path, record: dict[str, Any]) -> None:
    """Indented JSON, atomically; NaN and infinities become null."""
    from jaxnet import observe

    observe.write_json(path, json.loads(json.dumps(record, default=float), parse_constant=lambda _: None))


def pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Any, path: Path) -> None:
    """Lay out ``fig``, write it to ``path`` as a PNG and free it."""
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    pyplot().close(fig)


def write_outputs(
    record: dict[str, Any], stem: str, plot: Callable[[dict[str, Any], Path], None], report: str, say: Callable
) -> None:
    """Write ``record`` to ``WORKDIR/STEM.json`` and its plot to ``WORKDIR/STEM.png`` (WORKDIR is
    ``record["workdir"]``), then print ``report`` and where the files went."""
    workdir = Path(record["workdir"])
    write_json(workdir / f"{stem}.json", record)
    plot(record, workdir / f"{stem}.png")
    say(report)
    say(f"wrote {relpath(workdir / f'{stem}.json')} and {relpath(workdir / f'{stem}.png')}")


def table(rows: Sequence[Sequence[Any]]) -> str:
    """Left-aligned plain-text columns; the first row is the header."""
    cells = [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(cells[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells)


def fmt(value: float | None, digits: int = 4) -> str:
    """A number for a table, ``-`` for none: ``12,345`` from 1000 up, else ``digits`` significant."""
    if value is None:
        return "-"
    if isinstance(value, int) or abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.{digits}g}"


def smoke_settings(cfg: config_lib.Config) -> config_lib.Config:
    """For ``--smoke``: a checkpoint only at the end, and image models validated on 1,000 held-out
    images instead of 5,000 (faster passes)."""
    overrides = ["train.checkpoint_every=0"]
    if cfg.data.name in ("fashion_mnist", "mnist", "cifar10") and cfg.data.val_size > 1000:
        overrides.append("data.val_size=1000")
    return config_lib.apply_overrides(cfg, overrides)


def measured_steps_per_s(workdir: Path) -> float | None:
    """The median steps/s of a run's logged training intervals (evaluations and checkpoints excluded)."""
    import statistics

    from jaxnet import observe

    path = workdir / "metrics.jsonl"
    if not path.exists():
        return None
    rates = [r["steps_per_s"] for r in observe.read_metrics(path) if r.get("split") == "train" and r.get("steps_per_s")]
    return statistics.median(rates) if rates else None


def relpath(path: Path) -> str:
    """``path`` relative to the current directory where it is below it."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)

"""Trackers: where a run's log records go besides ``metrics.jsonl`` (``train.trackers``).

A tracker receives exactly the records :class:`jaxnet.observe.MetricsLog` writes to
``metrics.jsonl``, when it writes them: the host already holds those values, so a tracker adds no
host synchronisation, and on a step with no record it costs nothing. ``tensorboard`` writes
``tb/`` (TensorBoard event files); ``mlflow`` logs to an MLflow tracking store::

    jaxnet train cnn_fashion_mnist train.trackers=tensorboard,mlflow

MLflow's store is ``MLFLOW_TRACKING_URI`` when set, else a SQLite store inside the run directory
(``mlflow/mlflow.db``, artifacts in ``mlflow/artifacts``; ``mlflow ui --backend-store-uri
sqlite:///RUN/mlflow/mlflow.db`` shows it). The run gets the flattened config as parameters, every
record as metrics ``SPLIT/NAME`` at its step, the summary's speeds and sizes as ``summary/NAME``,
and ``config.json``, ``summary.json`` and ``curves.png`` as artifacts. The run's id is kept in
``mlflow/run.json``: a resumed run continues the same MLflow run, and a step MLflow already has
is not logged again, so MLflow holds each line of ``metrics.jsonl`` once.

A tracker is an object with ``begin(records)`` (the lines ``metrics.jsonl`` keeps when the run
starts or resumes), ``write(step, split, values)``, ``close()``, and ``finish(workdir, summary,
status)`` once ``summary.json`` and ``curves.png`` are written.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from jaxnet import config as config_lib
from jaxnet.config import Config
from jaxnet.errors import UserError

NAMES = ("tensorboard", "mlflow")

# Summary fields logged to MLflow as metrics (``summary/NAME``): how fast and how big the run was.
SUMMARY_METRICS = (
    "steps_per_s",
    "examples_per_s",
    "tokens_per_s",
    "compile_time_s",
    "wall_time_s",
    "param_count",
    "skipped_updates",
)

MLFLOW_DIR = "mlflow"  # in the run directory: run.json, and the local store when no MLFLOW_TRACKING_URI


def names(cfg: Config) -> list[str]:
    """The trackers ``cfg.train.trackers`` names, each once (a single name may be a string)."""
    given = cfg.train.trackers
    return list(dict.fromkeys((given,) if isinstance(given, str) else given))


def check(cfg: Config) -> None:
    """A one-line :class:`UserError` if a tracker ``cfg`` asks for is unknown or cannot run here
    (called before any file is written)."""
    wanted = names(cfg)
    unknown = [n for n in wanted if n not in NAMES]
    if unknown:
        raise UserError(f"train.trackers: {unknown[0]!r} is not one of: {', '.join(NAMES)}")
    if "mlflow" not in wanted:
        return
    # MLflow's local store is SQLite through SQLAlchemy, which mlflow-skinny leaves out
    needed = ["mlflow"] + (["sqlalchemy", "alembic"] if not os.environ.get("MLFLOW_TRACKING_URI") else [])
    missing = [m for m in needed if importlib.util.find_spec(m) is None]
    if missing:
        raise UserError(
            f"train.trackers names mlflow, but {' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} not "
            "installed: pip install 'jaxnet[mlflow]' (or drop mlflow from train.trackers)"
        )


def build(
    cfg: Config, workdir: Path, resume_step: int, *, store: Path | None = None, parent: str | None = None
) -> list[Any]:
    """The trackers ``cfg.train.trackers`` names for the run in ``workdir``, resumed at
    ``resume_step`` (0: a fresh start). ``store`` (default: the run directory) holds MLflow's local
    store; ``parent`` is the MLflow run the run is logged under (a sweep's)."""
    check(cfg)
    trackers: list[Any] = []
    for name in names(cfg):
        if name == "tensorboard":
            trackers.append(TensorBoard(workdir, resume_step))
        elif name == "mlflow":
            trackers.append(MLflow(cfg, workdir, resume_step, store=store, parent=parent))
    return trackers


def summary_fields(trackers: list[Any]) -> dict[str, Any]:
    """What ``summary.json`` records of the trackers (MLflow's store and run id)."""
    fields: dict[str, Any] = {}
    for t in trackers:
        fields.update(t.summary_fields())
    return fields


def finish(trackers: list[Any], workdir: Path, summary: dict[str, Any] | None, status: str = "FINISHED") -> None:
    """Tell every tracker the invocation ended: ``FINISHED`` or ``KILLED`` (by a signal) after
    ``summary.json`` and ``curves.png`` are written, or ``FAILED`` with no ``summary``."""
    for t in trackers:
        t.finish(workdir, summary, status)


def summary_writer() -> type:
    """tensorboardX's ``SummaryWriter``, imported without PyTorch where PyTorch is not imported yet.

    tensorboardX's writer module imports torch whenever it is installed, only so that it can take
    torch tensors, which jaxnet never passes: with PyTorch installed that import was most of a
    run's start-up (about 5 s of 6 on a busy 2-core machine; 0.8 s without). ``import torch``
    fails while tensorboardX loads, and works again afterwards."""
    if "torch" in sys.modules:
        from tensorboardX import SummaryWriter
    else:
        sys.modules["torch"] = None  # type: ignore[assignment]  # `import torch` raises ImportError
        try:
            from tensorboardX import SummaryWriter
        finally:
            if sys.modules.get("torch", ...) is None:
                del sys.modules["torch"]
    return SummaryWriter


class TensorBoard:
    """``tb/``: one scalar ``SPLIT/NAME`` per metric of each record (tensorboardX)."""

    def __init__(self, workdir: Path, resume_step: int):
        self.workdir, self.resume_step = Path(workdir), resume_step
        self._writer: Any = None

    def begin(self, records: list[dict[str, Any]]) -> None:
        SummaryWriter = summary_writer()  # noqa: N806 (a class)
        tb_dir = self.workdir / "tb"
        if not self.resume_step:  # a restart from scratch: events of the abandoned attempt would mislead
            shutil.rmtree(tb_dir, ignore_errors=True)
        # TensorBoard hides events past purge_step written before it: those of the interrupted run
        self._writer = SummaryWriter(str(tb_dir), purge_step=self.resume_step or None)

    def write(self, step: int, split: str, values: dict[str, Any]) -> None:
        for name, value in values.items():
            if value is not None:
                self._writer.add_scalar(f"{split}/{name}", value, step)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()

    def summary_fields(self) -> dict[str, Any]:
        return {}

    def finish(self, workdir: Path, summary: dict[str, Any] | None, status: str) -> None:
        pass


def _param_text(value: Any) -> str:
    """A config value as it is written on the command line (``32,64`` for a tuple)."""
    return ",".join(map(str, value)) if isinstance(value, list | tuple) else str(value)


class MLflow:
    """An MLflow run holding the run's config, metrics, summary and files.

    The run directory's ``mlflow/run.json`` names the store and the run: the same command on the
    same directory continues that run. A fresh start in a directory whose MLflow run was
    abandoned (stopped before its first checkpoint) deletes that run, as TensorBoard's events of
    it are deleted.
    """

    artifacts = ("config.json", "summary.json", "curves.png")

    def __init__(
        self,
        cfg: Config,
        workdir: Path,
        resume_step: int,
        *,
        store: Path | None = None,
        parent: str | None = None,
        artifacts: tuple[str, ...] | None = None,
    ):
        from mlflow.tracking import MlflowClient

        self.cfg, self.workdir, self.resume_step, self.parent = cfg, Path(workdir), resume_step, parent
        self.artifacts = artifacts if artifacts is not None else self.artifacts
        self.state_path = self.workdir / MLFLOW_DIR / "run.json"
        self.local = not os.environ.get("MLFLOW_TRACKING_URI")
        local_dir = (Path(store) if store is not None else self.workdir).resolve() / MLFLOW_DIR
        if self.local:
            local_dir.mkdir(parents=True, exist_ok=True)
            self.tracking_uri = f"sqlite:///{local_dir / 'mlflow.db'}"
        else:
            self.tracking_uri = os.environ["MLFLOW_TRACKING_URI"]
        self.artifact_root = (local_dir / "artifacts").as_uri() if self.local else None
        self.client = MlflowClient(tracking_uri=self.tracking_uri)
        self.run_id = ""
        self.ended = False  # finished with its summary: a later error (a sweep's other member's) leaves it be
        self.logged: dict[str, set[int]] = {}  # metric key -> the steps MLflow has of it

    def begin(self, records: list[dict[str, Any]]) -> None:
        run_id = self._saved_run()
        if run_id and not self.resume_step:
            self.client.delete_run(run_id)
            run_id = ""
        if run_id:
            self.client.update_run(run_id, status="RUNNING")
            data = self.client.get_run(run_id).data
            for key in data.metrics:
                self.logged[key] = {m.step for m in self.client.get_metric_history(run_id, key)}
            have = set(data.params)
        else:
            tags = {"mlflow.parentRunId": self.parent} if self.parent else None
            run = self.client.create_run(self._experiment_id(), run_name=self.workdir.name, tags=tags)
            run_id, have = run.info.run_id, set()
            self.state_path.parent.mkdir(parents=True, exist_ok=True)
            self.state_path.write_text(json.dumps({"tracking_uri": self.tracking_uri, "run_id": run_id}) + "\n")
        self.run_id = run_id
        # MLflow keeps a parameter's first value: a setting changed on resume is in config.json's artifact
        from mlflow.entities import Param

        params = config_lib.flatten(self.cfg.to_dict())
        self._log_batch(params=[Param(k, _param_text(v)) for k, v in params.items() if k not in have])
        # lines of metrics.jsonl that MLflow lacks: the whole history when mlflow joins a run midway
        metrics = []
        for record in records:
            split = record.get("split", "train")
            values = {k: v for k, v in record.items() if k not in ("step", "split")}
            metrics += self._metrics(int(record["step"]), split, values)
        self._log_batch(metrics=metrics)

    def _saved_run(self) -> str:
        """The id of this directory's MLflow run in the current store, or '' if it has none there."""
        try:
            saved = json.loads(self.state_path.read_text())
        except (OSError, ValueError):
            return ""
        if not isinstance(saved, dict) or saved.get("tracking_uri") != self.tracking_uri:
            return ""
        from mlflow.exceptions import MlflowException

        try:
            run = self.client.get_run(str(saved.get("run_id")))
        except MlflowException:
            return ""
        return run.info.run_id if run.info.lifecycle_stage == "active" else ""

    def _experiment_id(self) -> str:
        name = os.environ.get("MLFLOW_EXPERIMENT_NAME") or self.cfg.experiment or "jaxnet"
        experiment = self.client.get_experiment_by_name(name)
        if experiment is not None:
            return experiment.experiment_id
        return self.client.create_experiment(name, artifact_location=self.artifact_root)

    def _metrics(self, step: int, split: str, values: dict[str, Any]) -> list[Any]:
        """MLflow metrics of one record, leaving out what MLflow has at this step and nulls."""
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        out = []
        for name, value in values.items():
            key = f"{split}/{name}"
            if not isinstance(value, int | float) or step in self.logged.setdefault(key, set()):
                continue
            self.logged[key].add(step)
            out.append(Metric(key, float(value), now, step))
        return out

    def _log_batch(self, metrics: list[Any] = (), params: list[Any] = ()) -> None:
        """Log in batches of MLflow's limits (1000 metrics, 100 parameters a call)."""
        for i in range(0, len(metrics), 1000):
            self.client.log_batch(self.run_id, metrics=metrics[i : i + 1000])
        for i in range(0, len(params), 100):
            self.client.log_batch(self.run_id, params=params[i : i + 100])

    def write(self, step: int, split: str, values: dict[str, Any]) -> None:
        self._log_batch(metrics=self._metrics(step, split, values))

    def close(self) -> None:
        pass

    def summary_fields(self) -> dict[str, Any]:
        return {"mlflow": {"tracking_uri": self.tracking_uri, "run_id": self.run_id}}

    def finish(self, workdir: Path, summary: dict[str, Any] | None, status: str) -> None:
        if not self.run_id or self.ended:
            return
        if summary is None:  # an error is ending the run: it, not a failure to say so, is what the user sees
            with contextlib.suppress(Exception):
                self.client.set_terminated(self.run_id, status=status)
            return
        numbers = {k: summary[k] for k in SUMMARY_METRICS if isinstance(summary.get(k), int | float)}
        self.write(int(summary.get("step", 0)), "summary", numbers)
        for name in self.artifacts:
            if (Path(workdir) / name).is_file():
                self.client.log_artifact(self.run_id, str(Path(workdir) / name))
        self.client.set_terminated(self.run_id, status=status)
        self.ended = True


def sweep_parent(cfg: Config, root: Path) -> MLflow | None:
    """The MLflow run a sweep's members are logged under (their runs' parent), if ``cfg`` asks for
    MLflow: created in ``root`` (its local store is the members' too), or continued there. It
    holds the base config and, at the end, ``sweep.json``, ``sweep.md`` and ``sweep.png``."""
    if "mlflow" not in names(cfg):
        return None
    check(cfg)
    # resume_step=-1: never a restart, so an earlier invocation's parent run is continued
    parent = MLflow(cfg, root, -1, artifacts=("sweep.json", "sweep.md", "sweep.png"))
    parent.begin([])
    return parent

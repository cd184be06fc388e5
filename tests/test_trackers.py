"""Trackers (train.trackers): MLflow holds the same metric history as metrics.jsonl, once per step,
across a failed invocation and its resume, in one MLflow run; a sweep's members are runs under
one parent; a tracker that is unknown or not installed is one line before anything is written."""

from __future__ import annotations

import importlib.util
import json
import math

import pytest
from conftest import MLP, arrays_config, linear_data

import jaxnet
from jaxnet import observe
from jaxnet.train import trackers as trackers_lib

mlflow = pytest.importorskip("mlflow")
from mlflow.tracking import MlflowClient  # noqa: E402

DATA = {"train": linear_data(128, 0), "val": linear_data(32, 1), "test": linear_data(32, 2)}
SETTINGS = [
    "optim.lr=1e-2",
    "train.steps=40",
    "train.batch_size=16",
    "train.eval_batch_size=32",
    "train.log_every=10",
    "train.eval_every=20",
    "train.checkpoint_every=20",
    "train.trackers=tensorboard,mlflow",
]
TIMINGS = ("steps_per_s", "examples_per_s")  # differ between an invocation and its resume
STORE_SETTINGS = ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME")  # a developer's own: not for these tests


def config(*extra: str) -> jaxnet.Config:
    return arrays_config("tracked", SETTINGS, *extra)


def train(workdir, *extra, actions=()):
    task = jaxnet.tasks.regression(inputs="x", target="y")
    data = jaxnet.data.arrays(**DATA)
    return jaxnet.train(config(*extra), workdir, model=MLP(), dataset=data, task=task, actions=list(actions))


def jsonl_history(workdir) -> dict[str, list[tuple[int, float]]]:
    """metrics.jsonl as MLflow keys: ``SPLIT/NAME`` -> [(step, value)] in file order."""
    history: dict[str, list[tuple[int, float]]] = {}
    for record in observe.read_metrics(workdir / "metrics.jsonl"):
        for name, value in record.items():
            if name not in ("step", "split") and value is not None:
                history.setdefault(f"{record['split']}/{name}", []).append((record["step"], float(value)))
    return history


@pytest.fixture(scope="module")
def resumed(tmp_path_factory):
    """A run whose first invocation fails at step 30 (after logging it, checkpointed at 20), then
    resumed to the end: the resume truncates metrics.jsonl to step 20 and logs step 30 again."""
    workdir = tmp_path_factory.mktemp("mlflow") / "run"

    def fail_at_30(loop):
        raise RuntimeError("stop here")

    with pytest.MonkeyPatch.context() as env:
        for name in STORE_SETTINGS:
            env.delenv(name, raising=False)
        with pytest.raises(RuntimeError, match="stop here"):
            train(workdir, actions=[jaxnet.every(30, fail_at_30)])
        first = json.loads((workdir / trackers_lib.MLFLOW_DIR / "run.json").read_text())
        client = MlflowClient(first["tracking_uri"])
        status_after_failure = client.get_run(first["run_id"]).info.status
        summary = train(workdir)
    return workdir, first, status_after_failure, summary, client


def test_mlflow_reads_back_the_metric_history_of_metrics_jsonl_once_per_step(resumed):
    workdir, first, _, summary, client = resumed
    expected = jsonl_history(workdir)
    assert [s for s, _ in expected["train/loss"]] == [10, 20, 30, 40] and "test/r2" in expected
    run = client.get_run(first["run_id"])
    assert set(run.data.metrics) >= set(expected)
    for key, points in expected.items():
        logged = sorted((m.step, m.value) for m in client.get_metric_history(first["run_id"], key))
        assert [s for s, _ in logged] == [s for s, _ in points], key  # each step once: 30 not logged twice
        if key.rpartition("/")[2] not in TIMINGS:
            assert logged == points, key  # the resumed run recomputes step 30 bitwise
    assert run.data.metrics["summary/param_count"] == summary["param_count"]


def test_a_resumed_run_continues_the_same_mlflow_run_and_summary_json_names_it(resumed):
    workdir, first, status_after_failure, summary, client = resumed
    assert status_after_failure == "FAILED"
    assert summary["mlflow"] == {"tracking_uri": first["tracking_uri"], "run_id": first["run_id"]}
    assert json.loads((workdir / "summary.json").read_text())["mlflow"]["run_id"] == first["run_id"]
    assert first["tracking_uri"] == f"sqlite:///{workdir.resolve() / 'mlflow' / 'mlflow.db'}"
    run = client.get_run(first["run_id"])
    assert run.info.status == "FINISHED"
    assert len(client.search_runs([run.info.experiment_id])) == 1
    assert run.data.params["optim.lr"] == "0.01" and run.data.params["train.trackers"] == "tensorboard,mlflow"
    artifacts = {a.path for a in client.list_artifacts(first["run_id"])}
    assert artifacts == {"config.json", "summary.json", "curves.png"}
    assert (workdir / "mlflow" / "artifacts").is_dir()
    assert list((workdir / "tb").glob("events.out.tfevents.*"))  # TensorBoard as before, beside MLflow


def test_an_unknown_tracker_is_one_line():
    with pytest.raises(jaxnet.UserError, match=r"train.trackers=tensorboard,wandb: 'wandb' is not one of"):
        jaxnet.apply_overrides(jaxnet.Config(), ["train.trackers=tensorboard,wandb"])


def test_mlflow_not_installed_is_one_line_before_anything_is_written(tmp_path, monkeypatch):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "mlflow" else find_spec(name, *a))
    with pytest.raises(jaxnet.UserError, match=r"mlflow is not installed: pip install 'jaxnet\[mlflow\]'") as info:
        train(tmp_path / "run")
    assert "\n" not in str(info.value)
    assert not (tmp_path / "run").exists()


def test_a_sweep_logs_each_member_as_an_mlflow_run_under_one_parent(tmp_path, monkeypatch):
    for name in STORE_SETTINGS:
        monkeypatch.delenv(name, raising=False)
    task = jaxnet.tasks.regression(inputs="x", target="y")
    record = jaxnet.sweep(
        config("train.steps=10", "train.eval_every=0", "train.checkpoint_every=0"),
        {"optim.lr": [0.01, 0.03]},
        tmp_path / "sweep",
        model=MLP(),
        dataset=jaxnet.data.arrays(**DATA),
        task=task,
        say=lambda *_: None,
    )
    parent = json.loads((tmp_path / "sweep" / "mlflow" / "run.json").read_text())
    client = MlflowClient(parent["tracking_uri"])
    for member in record["members"]:
        summary = json.loads((tmp_path / "sweep" / member["name"] / "summary.json").read_text())
        run = client.get_run(summary["mlflow"]["run_id"])
        assert summary["mlflow"]["tracking_uri"] == parent["tracking_uri"]
        assert run.data.tags["mlflow.parentRunId"] == parent["run_id"]
        loss = [m.value for m in client.get_metric_history(run.info.run_id, "test/loss")]
        assert len(loss) == 1 and math.isclose(loss[0], member["test"]["loss"], rel_tol=1e-12)
    parent_artifacts = {a.path for a in client.list_artifacts(parent["run_id"])}
    assert parent_artifacts == {"sweep.json", "sweep.md", "sweep.png"}


def test_mlflow_added_midway_gets_the_whole_history_in_the_store_mlflow_tracking_uri_names(tmp_path, monkeypatch):
    uri = f"sqlite:///{tmp_path / 'shared.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "team")
    monkeypatch.chdir(tmp_path)  # MLflow puts a new experiment's artifacts in ./mlruns of a store it is given
    workdir = tmp_path / "run"
    train(workdir, "train.trackers=tensorboard", "train.stop_after=20")
    assert not (workdir / "mlflow").exists()
    summary = train(workdir)
    assert summary["mlflow"]["tracking_uri"] == uri and not (workdir / "mlflow" / "mlflow.db").exists()
    client = MlflowClient(uri)
    run = client.get_run(summary["mlflow"]["run_id"])
    assert client.get_experiment(run.info.experiment_id).name == "team"
    for key in ("train/loss", "val/loss", "test/r2"):
        logged = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, key))
        assert logged == jsonl_history(workdir)[key], key  # steps 10 and 20 from metrics.jsonl, the rest as logged
    assert [s for s, _ in jsonl_history(workdir)["train/loss"]] == [10, 20, 30, 40]

"""Training: the loss and schedule against closed forms, the step, determinism and exact resume."""

from __future__ import annotations

import json
import math
import os
import re
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import run_patiently, tiny_config

from jaxnet import Dataset, config, observe, optim, parallel
from jaxnet.checkpoint import Checkpoints
from jaxnet.config import OptimConfig
from jaxnet.errors import UserError
from jaxnet.train import Run, train
from jaxnet.train.step import cross_entropy


def final_params(workdir, cfg, dataset):
    run = Run(cfg, dataset=dataset)
    ckpts = Checkpoints(workdir / "checkpoints", read_only=True)
    try:
        state = ckpts.restore(run.abstract_state())
    finally:
        ckpts.close()
    return int(state.step), jax.tree.map(np.asarray, state)


def train_metrics(workdir):
    return [r for r in observe.read_metrics(workdir / "metrics.jsonl") if r["split"] == "train"]


def test_cross_entropy_matches_numpy_with_label_smoothing():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(5, 7)).astype(np.float32)
    labels = rng.integers(0, 7, size=5)
    log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    targets = np.full((5, 7), 0.1 / 7) + 0.9 * np.eye(7)[labels]
    expected = -(targets * log_probs).sum(-1)
    np.testing.assert_allclose(cross_entropy(jnp.asarray(logits), jnp.asarray(labels), 0.1), expected, rtol=1e-5)


def test_schedule_is_linear_warmup_then_cosine_to_the_end_factor():
    cfg = OptimConfig(lr=0.2, warmup_steps=10, end_lr_factor=0.1)
    schedule = optim.schedule(cfg, total_steps=110)
    assert float(schedule(0)) == pytest.approx(0.02)  # the first update already moves
    assert float(schedule(5)) == pytest.approx(0.12)
    assert float(schedule(9)) == pytest.approx(0.2)
    for t in (10, 35, 60, 110):
        expected = 0.02 + (0.2 - 0.02) * 0.5 * (1 + math.cos(math.pi * (t - 10) / 100))
        assert float(schedule(t)) == pytest.approx(expected, rel=1e-5)


def test_training_lowers_the_loss_and_learns_the_task(quadrants, tmp_path):
    summary = train(tiny_config(train={"steps": 40}), tmp_path, dataset=quadrants)
    losses = [r["loss"] for r in train_metrics(tmp_path)]
    assert losses[-1] < 0.5 * losses[0]
    assert summary["test"]["accuracy"] > 0.9  # chance is 0.25


def test_same_seed_gives_identical_results_and_another_seed_does_not(quadrants, tmp_path):
    cfg = tiny_config(model={"dropout": 0.3})
    train(cfg, tmp_path / "a", dataset=quadrants)
    train(cfg, tmp_path / "b", dataset=quadrants)
    cfg.seed = 1
    train(cfg, tmp_path / "c", dataset=quadrants)
    _, a = final_params(tmp_path / "a", cfg, quadrants)
    _, b = final_params(tmp_path / "b", cfg, quadrants)
    _, c = final_params(tmp_path / "c", cfg, quadrants)
    for x, y in zip(jax.tree.leaves(a.params), jax.tree.leaves(b.params), strict=True):
        np.testing.assert_array_equal(x, y)
    assert any(
        not np.array_equal(x, z) for x, z in zip(jax.tree.leaves(a.params), jax.tree.leaves(c.params), strict=True)
    )
    assert [r["loss"] for r in train_metrics(tmp_path / "a")] == [r["loss"] for r in train_metrics(tmp_path / "b")]


@pytest.mark.parametrize(
    "model",
    [
        {"name": "convnet", "dropout": 0.3},  # randomness per step must resume exactly
        {"name": "resnet", "features": (4, 8), "blocks": (1, 1)},  # BatchNorm state must be restored
    ],
)
def test_stopped_and_resumed_run_ends_identical_to_an_uninterrupted_one(quadrants, tmp_path, model):
    cfg = tiny_config(model=model, optim={"name": "sgd", "lr": 0.05}, data={"augment": True})
    train(cfg, tmp_path / "whole", dataset=quadrants)
    step_a, whole = final_params(tmp_path / "whole", cfg, quadrants)
    whole_log = train_metrics(tmp_path / "whole")
    for stop_after in (4, 5):  # at a checkpoint, and between checkpoints
        resumed_dir = tmp_path / f"resumed-{stop_after}"
        cfg.train.stop_after = stop_after
        first = train(cfg, resumed_dir, dataset=quadrants)
        assert first["step"] == stop_after and not first["complete"]
        cfg.train.stop_after = 0
        second = train(cfg, resumed_dir, dataset=quadrants)
        assert second["complete"]

        step_b, resumed = final_params(resumed_dir, cfg, quadrants)
        assert step_a == step_b == cfg.train.steps
        for x, y in zip(jax.tree.leaves(whole), jax.tree.leaves(resumed), strict=True):
            np.testing.assert_array_equal(x, y)
        # the logs read as one run: the same steps (plus one line where the first invocation
        # stopped between two log steps) and the same losses wherever a log interval did not
        # straddle the stop
        resumed_log = train_metrics(resumed_dir)
        extra = {stop_after} if stop_after % cfg.train.log_every else set()
        assert [r["step"] for r in resumed_log if r["step"] not in extra] == [r["step"] for r in whole_log]
        straddled = {stop_after - stop_after % 2 + 2} if extra else set()
        resumed_by_step = {r["step"]: r for r in resumed_log}
        for a in whole_log:
            if a["step"] not in straddled:
                assert resumed_by_step[a["step"]]["loss"] == a["loss"]


def test_gradient_accumulation_matches_one_big_batch(quadrants, tmp_path):
    cfg = tiny_config(train={"steps": 3, "checkpoint_every": 0, "eval_every": 0})
    train(cfg, tmp_path / "one", dataset=quadrants)
    cfg.optim.grad_accum = 4
    train(cfg, tmp_path / "four", dataset=quadrants)
    cfg.optim.grad_accum_mode = "parallel"  # the micro-batches as independent operations: the same update
    train(cfg, tmp_path / "four_parallel", dataset=quadrants)
    _, one = final_params(tmp_path / "one", cfg, quadrants)
    _, four = final_params(tmp_path / "four", cfg, quadrants)
    _, side_by_side = final_params(tmp_path / "four_parallel", cfg, quadrants)
    for x, y, z in zip(*(jax.tree.leaves(s.params) for s in (one, four, side_by_side)), strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(z, y, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("mode, loops", [("sequential", 1), ("parallel", 0)])
def test_parallel_gradient_accumulation_compiles_without_the_micro_batch_loop(quadrants, mode, loops):
    cfg = tiny_config(optim={"grad_accum": 2, "grad_accum_mode": mode})
    run = Run(cfg, dataset=quadrants)
    batch = next(iter(run.train_batches(0)))
    text = run.train_step.lower(run.init_state(), parallel.put_batch(batch, run.mesh)).as_text()
    assert len(re.findall(r"stablehlo.while", text)) == loops


def test_bfloat16_compute_keeps_float32_parameters(quadrants, tmp_path):
    cfg = tiny_config(model={"dtype": "bfloat16"}, train={"steps": 20})
    summary = train(cfg, tmp_path, dataset=quadrants)
    _, state = final_params(tmp_path, cfg, quadrants)
    assert {x.dtype for x in jax.tree.leaves(state.params)} == {np.dtype("float32")}
    assert summary["test"]["accuracy"] > 0.5


def test_run_directory_has_every_artifact(quadrants, tmp_path):
    summary = train(tiny_config(), tmp_path, dataset=quadrants)
    for name in ("config.json", "metrics.jsonl", "summary.json", "curves.png"):
        assert (tmp_path / name).is_file(), name
    assert list((tmp_path / "tb").glob("events.out.tfevents.*"))
    assert Checkpoints(tmp_path / "checkpoints").all_steps() == [4, 8, 12]
    splits = {r["split"] for r in observe.read_metrics(tmp_path / "metrics.jsonl")}
    assert splits == {"train", "val", "test"}
    assert summary["param_count"] == 4 * 9 + 4 + (4 * 4 * 4) * 16 + 16 + 16 * 4 + 4
    assert summary["examples_per_s"] > 0 and summary["environment"]["versions"]["jax"]


TENSORBOARD_WITHOUT_TORCH = """
import importlib.util, sys
from jaxnet.train.trackers import TensorBoard
board = TensorBoard(sys.argv[1], 0)
board.begin([])
board.write(3, "train", {"loss": 0.5})
board.close()
print("torch imported:", "torch" in sys.modules)
if importlib.util.find_spec("torch") is not None:
    import torch  # importable again afterwards
    print("torch after:", torch.ones(2).sum().item())
"""


def test_tensorboard_events_are_written_without_importing_pytorch(tmp_path):
    """tensorboardX imports PyTorch whenever it is installed (seconds of every run's start):
    jaxnet's TensorBoard tracker loads it without, and leaves ``import torch`` working."""
    import struct

    from tensorboardX.proto.event_pb2 import Event

    done = run_patiently([sys.executable, "-c", TENSORBOARD_WITHOUT_TORCH, str(tmp_path)], timeout=60)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "torch imported: False" in done.stdout
    if "torch after:" in done.stdout:
        assert "torch after: 2.0" in done.stdout
    (path,) = (tmp_path / "tb").glob("events.out.tfevents.*")
    data, scalars = path.read_bytes(), []
    while data:  # TFRecord framing: length (8 bytes), its CRC (4), the record, its CRC (4)
        (length,) = struct.unpack("<Q", data[:8])
        event = Event.FromString(data[12 : 12 + length])
        scalars += [(event.step, v.tag, v.simple_value) for v in event.summary.value]
        data = data[16 + length :]
    assert scalars == [(3, "train/loss", 0.5)]


def test_config_and_summary_record_versions_devices_and_the_command(quadrants, tmp_path):
    summary = train(tiny_config(), tmp_path, dataset=quadrants)
    saved = json.loads((tmp_path / "config.json").read_text())
    for record in (saved["_run"], summary["environment"]):
        versions = record["versions"]
        for package in ("jaxnet", "jax", "jaxlib", "flax", "optax", "orbax-checkpoint"):
            assert versions[package] and versions[package][0].isdigit(), package
        assert len(record["devices"]) == jax.device_count() and record["devices"][0].startswith("cpu:0")
        assert record["command"] and record["date"]
        if (Path(__file__).parents[1] / ".git").exists():
            assert re.fullmatch(r"[0-9a-f]{40}", record["git_commit"])
    assert config.load(tmp_path / "config.json") == tiny_config()  # the record is not part of the config


def test_train_step_compiles_once_per_invocation_including_a_resume(quadrants, tmp_path, caplog):
    """Evaluation, checkpointing, logging and a restored state must not trigger recompilation."""
    cfg = tiny_config(train={"stop_after": 6})
    with jax.log_compiles(True), caplog.at_level("WARNING"):
        train(cfg, tmp_path, dataset=quadrants)
        cfg.train.stop_after = 0
        train(cfg, tmp_path, dataset=quadrants)
    compiles = [r.getMessage() for r in caplog.records if "Compiling" in r.getMessage()]
    assert sum("train_step" in m for m in compiles) == 2, compiles
    assert sum("eval_step" in m for m in compiles) == 2, compiles


def test_finishing_a_run_whose_summary_was_lost_evaluates_once(quadrants, tmp_path):
    cfg = tiny_config()
    train(cfg, tmp_path, dataset=quadrants)
    (tmp_path / "summary.json").unlink()  # as if killed between the last checkpoint and the summary
    summary = train(cfg, tmp_path, dataset=quadrants)
    final_evals = [(r["split"], r["step"]) for r in observe.read_metrics(tmp_path / "metrics.jsonl") if r["step"] == 12]
    assert sorted(final_evals) == [("test", 12), ("train", 12), ("val", 12)]
    assert summary["complete"] and "test" in summary


def test_diverging_loss_stops_the_run_with_the_step_and_no_nan_in_the_logs(quadrants, tmp_path):
    cfg = tiny_config(optim={"name": "sgd", "lr": 1e6, "momentum": 0.0})
    with pytest.raises(UserError, match=r"loss or gradient became NaN or Inf at step \d+; there is no checkpoint yet"):
        train(cfg, tmp_path, dataset=quadrants)
    text = (tmp_path / "metrics.jsonl").read_text()
    assert "NaN" not in text and "Infinity" not in text


def test_every_checkpoint_damaged_is_a_user_error_that_moves_nothing(quadrants, tmp_path):
    cfg = tiny_config()
    train(cfg, tmp_path, dataset=quadrants)
    for step in ("4", "8", "12"):
        for path in (tmp_path / "checkpoints" / step / "state").rglob("*"):
            if path.is_file() and path.parent.name == "d":
                path.write_bytes(b"garbage")
    (tmp_path / "summary.json").unlink()
    before = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    with pytest.raises(UserError, match=r"every checkpoint in .* is damaged \(step 12: .*step 8: .*step 4: "):
        train(cfg, tmp_path, dataset=quadrants)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == before


def test_resume_ignores_a_malformed_metrics_line(quadrants, tmp_path):
    cfg = tiny_config(train={"stop_after": 4})
    train(cfg, tmp_path, dataset=quadrants)
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": null, "split": "train"}\n{"step": 3, "spl')
    cfg.train.stop_after = 0
    assert train(cfg, tmp_path, dataset=quadrants)["complete"]
    steps = [r["step"] for r in observe.read_metrics(tmp_path / "metrics.jsonl") if r["split"] == "train"]
    assert steps == [2, 4, 6, 8, 10, 12]


def test_empty_validation_split_is_skipped(tmp_path):
    from conftest import bright_quadrant_data

    empty = (np.zeros((0, 8, 8, 1), np.uint8), np.zeros(0, np.int32))
    dataset = Dataset(train=bright_quadrant_data(256, 0), val=empty, test=bright_quadrant_data(64, 2), num_classes=4)
    summary = train(tiny_config(), tmp_path, dataset=dataset)
    assert "val" not in summary and summary["test"]["accuracy"] > 0.25


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda t: (t[0][..., 0], t[1]), "expected uint8 (N, height, width, channels)"),
        (lambda t: (t[0].astype(np.float32), t[1]), "expected uint8"),
        (lambda t: (t[0], t[1] + 4), "labels range over 4..7; expected 0..3"),
        (lambda t: (t[0], t[1][:-1]), "inputs but"),
    ],
)
def test_dataset_rejects_malformed_arrays(change, message):
    from conftest import bright_quadrant_data

    good = bright_quadrant_data(16, 0)
    with pytest.raises(UserError, match=re.escape(message)):
        Dataset(train=good, val=good, test=change(good), num_classes=4)


def test_dataset_statistics_match_numpy_and_survive_a_constant_channel():
    from conftest import bright_quadrant_data

    x, y = bright_quadrant_data(64, 0)
    x = np.concatenate([x, np.full_like(x, 7)], axis=-1)  # second channel constant
    dataset = Dataset(train=(x, y), val=(x, y), test=(x, y), num_classes=4)
    pixels = x.astype(np.float64) / 255
    np.testing.assert_allclose(dataset.mean, pixels.mean(axis=(0, 1, 2)), rtol=1e-6)
    np.testing.assert_allclose(dataset.std[0], pixels[..., 0].std(), rtol=1e-5)
    assert dataset.std[1] == 1.0


MULTI_DEVICE_SCRIPT = """
import os, sys
os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2"
sys.path.insert(0, {tests!r})
import jax, numpy as np
from conftest import bright_quadrant_data, tiny_config
from jaxnet import Dataset
from jaxnet.train import Run, train

assert jax.device_count() == 2
data = Dataset(train=bright_quadrant_data(256, 0), val=bright_quadrant_data(5, 1),
               test=bright_quadrant_data(7, 2), num_classes=4)
cfg = tiny_config(optim={{"grad_accum": 4}})
run = Run(cfg, dataset=data)
state = run.init_state()
batch = {{"image": np.zeros((32, 8, 8, 1), np.float32), "label": np.zeros(32, np.int32)}}
from jaxnet import parallel
hlo = run.train_step.lower(state, parallel.put_batch(batch, run.mesh)).compile().as_text()
print("ALL_GATHER" if "all-gather" in hlo else "NO_ALL_GATHER")
summary = train(cfg, {workdir!r}, dataset=data)
print("TEST", summary["test"]["accuracy"], "VAL", summary["val"]["accuracy"])
"""


def test_two_devices_accumulate_without_gathering_the_batch_and_evaluate_odd_splits(tmp_path):
    script = MULTI_DEVICE_SCRIPT.format(tests=str(Path(__file__).parent), workdir=str(tmp_path / "run"))
    env = dict(os.environ)  # the tests' XLA flags too; the script adds its devices
    result = run_patiently([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "NO_ALL_GATHER" in result.stdout
    accuracies = re.search(r"TEST ([\d.]+) VAL ([\d.]+)", result.stdout)
    assert accuracies is not None  # odd-sized splits (7 and 5 examples) evaluated on 2 devices

"""Fine-tuning: a run starts from another run's parameters and model state (train.init_from),
leaves a new head fresh (train.init_skip), trains only part of the network (optim.freeze), resumes
bit for bit from its own checkpoints, and refuses mismatched runs in one line without writing."""

from __future__ import annotations

import json
import shutil

import flax.linen as nn
import jax
import numpy as np
import pytest
from conftest import arrays_config

import jaxnet
from jaxnet.checkpoint import load_state
from jaxnet.train import init_from
from jaxnet.train.loop import Run

HIDDEN = 8


class Net(nn.Module):
    """A body (its kernel boxed with logical axis names, as the built-in models' are), BatchNorm and a head."""

    outputs: int = 3
    extra: bool = False
    norm: bool = True

    @nn.compact
    def __call__(self, x, train=False):
        kernel = nn.with_logical_partitioning(nn.initializers.lecun_normal(), (None, "mlp"))
        h = nn.relu(nn.Dense(HIDDEN, kernel_init=kernel, name="body")(x))
        if self.extra:
            h = nn.Dense(HIDDEN, name="extra")(h)
        if self.norm:
            h = nn.BatchNorm(use_running_average=not train, name="norm")(h)
        return nn.Dense(self.outputs, name="head")(h)


def points(n: int, seed: int, classes: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(loc=1.0, size=(n, 4)).astype(np.float32)
    y = (x[:, 0] + x[:, 1] > 2).astype(np.int32)
    if classes == 3:
        y += (x[:, 2] > 2).astype(np.int32)
    return {"x": x, "y": y}


def dataset(classes: int):
    return jaxnet.data.arrays(train=points(64, 0, classes), test=points(24, 2, classes))


TASK = jaxnet.tasks.classification(inputs="x", target="y")
SETTINGS = [
    "optim.lr=3e-2",
    "optim.weight_decay=1e-2",  # decay would move a frozen parameter if the mask let it through
    "train.steps=4",
    "train.batch_size=8",
    "train.eval_batch_size=8",
    "train.log_every=1",
    "train.checkpoint_every=2",
]


def config(*extra: str) -> jaxnet.Config:
    return arrays_config("finetune", SETTINGS, *extra)


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """A trained three-class run: what the tests start from."""
    workdir = tmp_path_factory.mktemp("finetune") / "source"
    jaxnet.train(config(), workdir, model=Net(3), dataset=dataset(3), task=TASK)
    return workdir


def finetune(source, *extra: str) -> jaxnet.Config:
    """Two classes instead of three: the body from ``source``, a fresh head, the body frozen."""
    return config(f"train.init_from={source}", "train.init_skip=head", "optim.freeze=body", *extra)


def train_losses(workdir) -> list[float]:
    rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in rows if r["split"] == "train"]


def test_frozen_parameters_stay_bitwise_the_source_runs_while_the_others_train(source, tmp_path):
    jaxnet.train(finetune(source), tmp_path / "ft", model=Net(2), dataset=dataset(2), task=TASK)
    before, after = jaxnet.load_params(source), jaxnet.load_params(tmp_path / "ft")
    np.testing.assert_array_equal(after["body"]["kernel"], before["body"]["kernel"])
    np.testing.assert_array_equal(after["body"]["bias"], before["body"]["bias"])
    assert not np.array_equal(after["norm"]["scale"], before["norm"]["scale"])  # taken over, then trained
    init_rng, _ = jax.random.split(jax.random.PRNGKey(0))  # the trainer's initialisation key for seed 0
    fresh = nn.unbox(Net(2).init({"params": init_rng}, np.zeros((1, 4), np.float32)))["params"]
    assert not np.array_equal(after["head"]["kernel"], fresh["head"]["kernel"])
    # No optimizer state for the frozen body: AdamW's two moments cover the norm and head only.
    opt_sizes = sum(x.size for x in jax.tree.leaves(load_state(tmp_path / "ft")["opt_state"]) if x.ndim)
    assert opt_sizes == 2 * (2 * HIDDEN + HIDDEN * 2 + 2)
    saved = json.loads((tmp_path / "ft" / "config.json").read_text())
    assert (saved["train"]["init_from"], saved["train"]["init_skip"], saved["optim"]["freeze"]) == (
        str(source),
        "head",
        "body",
    )


def test_init_skip_leaves_the_head_as_a_fresh_init_and_takes_the_rest_from_the_source(source, tmp_path):
    cfg = config(f"train.init_from={source}", "train.init_skip=head")
    run = Run(cfg, model=Net(2), dataset=dataset(2), task=TASK)
    started = jax.device_get(run.init_state(init_from.load(cfg, run, tmp_path / "new")))
    fresh = jax.device_get(run.init_state())
    saved = load_state(source)
    for name in ("kernel", "bias"):
        np.testing.assert_array_equal(started.params["head"][name], fresh.params["head"][name])
        np.testing.assert_array_equal(started.params["body"][name], saved["params"]["body"][name])
        assert not np.array_equal(started.params["body"][name], fresh.params["body"][name])
    stats = started.model_state["batch_stats"]["norm"]
    np.testing.assert_array_equal(stats["mean"], saved["model_state"]["batch_stats"]["norm"]["mean"])
    assert not np.array_equal(stats["mean"], fresh.model_state["batch_stats"]["norm"]["mean"])
    assert not (tmp_path / "new").exists()


def test_a_resumed_finetuning_run_is_bitwise_the_uninterrupted_one_and_needs_no_source(source, tmp_path):
    jaxnet.train(finetune(source), tmp_path / "whole", model=Net(2), dataset=dataset(2), task=TASK)
    copy = shutil.copytree(source, tmp_path / "copy")
    stopped = finetune(copy, "train.stop_after=2")
    jaxnet.train(stopped, tmp_path / "resumed", model=Net(2), dataset=dataset(2), task=TASK)
    shutil.rmtree(copy)  # a resume restores the run's own checkpoint, not train.init_from again
    jaxnet.train(finetune(copy), tmp_path / "resumed", model=Net(2), dataset=dataset(2), task=TASK)
    assert train_losses(tmp_path / "resumed") == train_losses(tmp_path / "whole")
    whole, resumed = jaxnet.load_params(tmp_path / "whole"), jaxnet.load_params(tmp_path / "resumed")
    assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(whole), jax.tree.leaves(resumed), strict=True))


BAD = [
    ([], Net(2), r"shapes differ: params/head/bias \(3,\) there, \(2,\) here; params/head/kernel \(8, 3\) there"),
    (["train.init_skip=head"], Net(3, extra=True), r"does not match this model: .* lacks params/extra/bias, "),
    (["train.init_skip=head"], Net(3, norm=False), r"this run lacks batch_stats/norm/mean, batch_stats/norm/var, "),
    (["train.init_skip=Conv_0"], Net(3), r"train.init_skip='Conv_0' matches no path of either run; the paths are"),
    (["optim.freeze=Conv_0"], Net(3), r"optim.freeze='Conv_0' matches no parameter; the parameters are params/body"),
    (["optim.freeze=(body"], Net(3), r"optim.freeze='\(body' is not a regular expression"),
]


@pytest.mark.parametrize("extra, model, message", BAD, ids=[m for _, _, m in BAD])
def test_a_mismatched_source_is_one_line_and_writes_nothing(source, tmp_path, extra, model, message):
    with pytest.raises(jaxnet.UserError, match=message):
        cfg = config(f"train.init_from={source}", *extra)
        # data the model can output (labels beyond its outputs are refused before the source is read)
        jaxnet.train(cfg, tmp_path / "new", model=model, dataset=dataset(model.outputs), task=TASK)
    assert not (tmp_path / "new").exists()


def test_a_source_without_the_checkpoint_asked_for_is_one_line_and_writes_nothing(source, tmp_path):
    (tmp_path / "empty").mkdir()
    for spec, message in [
        (tmp_path / "empty", r"train.init_from=.*empty: .*empty has no checkpoints"),
        (f"{source}@3", r"has no checkpoint step 3 \(steps there: 2, 4\)"),
    ]:
        with pytest.raises(jaxnet.UserError, match=message):
            cfg = config(f"train.init_from={spec}")
            jaxnet.train(cfg, tmp_path / "new", model=Net(3), dataset=dataset(3), task=TASK)
        assert not (tmp_path / "new").exists()
    with pytest.raises(jaxnet.UserError, match="train.init_skip names parameters to leave fresh, which needs"):
        jaxnet.train(config("train.init_skip=head"), tmp_path / "new", model=Net(3), dataset=dataset(3), task=TASK)


def test_a_sweep_refuses_init_from_rather_than_ignoring_it(source, tmp_path):
    with pytest.raises(jaxnet.UserError, match="jaxnet sweep starts every member fresh; train.init_from is for"):
        jaxnet.sweep(
            config(f"train.init_from={source}"),
            {"optim.lr": [1e-2, 3e-2]},
            tmp_path / "sweep",
            model=Net(3),
            dataset=dataset(3),
            task=TASK,
            say=lambda *_: None,
        )
    assert not (tmp_path / "sweep").exists()

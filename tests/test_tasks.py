"""Tasks: built-in losses and metrics against plain numpy, exact split metrics over padded
batches, masked-LM corruption, and one-line errors for a task that does not fit."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxnet import tasks
from jaxnet.errors import UserError


def split_sums(task: tasks.Task, outputs: np.ndarray, batch: dict, batch_size: int) -> dict[str, float]:
    """The task's split metrics from evaluation batches of ``batch_size`` rows, the last one padded
    with garbage rows that ``mask`` 0 must exclude."""
    n = len(outputs)
    totals: dict[str, float] = {}
    for start in range(0, n, batch_size):
        rows = slice(start, start + batch_size)
        out, b = outputs[rows], {k: v[rows] for k, v in batch.items()}
        mask = np.ones(len(out), np.float32)
        pad = batch_size - len(out)
        if pad:  # padding full of large values: it would show if it counted
            out = np.concatenate([out, np.full((pad, *out.shape[1:]), 1e3, out.dtype)])
            b = {k: np.concatenate([v, np.full((pad, *v.shape[1:]), 7, v.dtype)]) for k, v in b.items()}
            mask = np.concatenate([mask, np.zeros(pad, np.float32)])
        sums = jax.jit(task.eval_sums)(jnp.asarray(out), {**b, "mask": mask})
        for k, v in sums.items():
            totals[k] = totals.get(k, 0.0) + float(v)
    count = totals.pop("count")
    return task.summarize({k: v / count for k, v in totals.items()})


def test_regression_split_metrics_equal_numpy_over_padded_batches():
    rng = np.random.default_rng(0)
    y = rng.normal(3.0, 2.0, size=37).astype(np.float32)
    pred = (y + rng.normal(0, 1.0, size=37)).astype(np.float32)
    got = split_sums(tasks.regression(), pred, {"x": np.zeros((37, 2), np.float32), "y": y}, batch_size=8)
    err = pred.astype(np.float64) - y
    r2 = 1 - (err**2).sum() / ((y - y.mean()) ** 2).sum()
    assert set(got) == {"loss", "mse", "mae", "r2"}
    np.testing.assert_allclose(got["mse"], (err**2).mean(), rtol=1e-5)
    np.testing.assert_allclose(got["loss"], (err**2).mean(), rtol=1e-5)
    np.testing.assert_allclose(got["mae"], np.abs(err).mean(), rtol=1e-5)
    np.testing.assert_allclose(got["r2"], r2, rtol=1e-4)


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def test_classification_split_metrics_equal_numpy_and_smoothing_only_trains():
    rng = np.random.default_rng(1)
    logits = rng.normal(size=(29, 5)).astype(np.float32)
    labels = rng.integers(0, 5, 29).astype(np.int32)
    task = tasks.classification(label_smoothing=0.2)
    got = split_sums(task, logits, {"image": np.zeros((29, 1), np.float32), "label": labels}, batch_size=6)
    ce = -log_softmax(logits)[np.arange(29), labels]
    np.testing.assert_allclose(got["loss"], ce.mean(), rtol=1e-5)  # evaluation: no smoothing
    np.testing.assert_allclose(got["accuracy"], (logits.argmax(-1) == labels).mean())
    smoothed = 0.8 * ce + 0.2 * (-log_softmax(logits).mean(-1))
    loss, _ = task.train_values(jnp.asarray(logits), {"label": labels})
    np.testing.assert_allclose(loss, smoothed.mean(), rtol=1e-5)


def test_lm_loss_counts_each_unmasked_token_once():
    rng = np.random.default_rng(2)
    logits = rng.normal(size=(4, 6, 7)).astype(np.float32)
    targets = rng.integers(0, 7, (4, 6)).astype(np.int32)
    mask = (rng.random((4, 6)) < 0.7).astype(np.float32)
    mask[2] = 0  # a row with nothing to predict weighs nothing
    sums = tasks.lm().eval_sums(jnp.asarray(logits), {"tokens": targets, "targets": targets, "mask": mask})
    ce = -np.take_along_axis(log_softmax(logits), targets[..., None], -1)[..., 0]
    assert float(sums["count"]) == mask.sum()
    np.testing.assert_allclose(float(sums["loss"]), (ce * mask).sum(), rtol=1e-5)
    np.testing.assert_allclose(float(sums["accuracy"]), ((logits.argmax(-1) == targets) * mask).sum(), rtol=1e-5)


def test_lm_over_padded_example_batches_averages_over_tokens_not_examples():
    # A user's own token arrays: evaluation pads the last batch with whole rows and marks real
    # examples with one mask value each; every token of a real example counts once.
    rng = np.random.default_rng(4)
    logits = rng.normal(size=(11, 5, 7)).astype(np.float32)
    targets = rng.integers(0, 7, (11, 5)).astype(np.int32)
    got = split_sums(tasks.lm(), logits, {"tokens": targets, "targets": targets}, batch_size=4)
    ce = -np.take_along_axis(log_softmax(logits), targets[..., None], -1)[..., 0]
    np.testing.assert_allclose(got["loss"], ce.mean(), rtol=1e-5)
    np.testing.assert_allclose(got["accuracy"], (logits.argmax(-1) == targets).mean(), rtol=1e-6)
    loss, _ = tasks.lm().train_values(jnp.asarray(logits), {"targets": targets, "mask": np.ones(11, np.float32)})
    np.testing.assert_allclose(loss, ce.mean(), rtol=1e-5)  # a mask per example covers its tokens in training too


def test_masked_lm_with_one_mask_value_per_example_never_chooses_padding_rows():
    tokens = np.random.default_rng(5).integers(0, 20, (6, 40)).astype(np.int32)
    mask = np.array([1, 1, 1, 1, 0, 0], np.float32)
    out = tasks.masked_lm(20, mask_rate=0.5).transform({"tokens": tokens, "mask": mask}, np.random.default_rng(0))
    assert out["mask"].shape == (6, 40)
    assert not out["mask"][4:].any() and out["mask"][:4].mean() == pytest.approx(0.5, abs=0.1)


def test_a_declared_weight_is_what_evaluation_averages_with():
    # A user's task of one value per example whose examples stand for different numbers of items.
    task = tasks.Task(inputs="x", loss=lambda out, b: jnp.mean(out), weight=lambda b: b["n"] * b["mask"])
    out = np.array([1.0, 2.0, 4.0], np.float32)
    n = np.array([1.0, 3.0, 0.0], np.float32)
    got = split_sums(task, out, {"x": out, "n": n}, batch_size=2)
    assert got["loss"] == pytest.approx((1.0 * 1 + 2.0 * 3) / 4)


def test_masked_lm_corrupts_15_percent_80_10_10_and_predicts_the_originals():
    vocab = 50
    rng = np.random.default_rng(3)
    tokens = rng.integers(0, vocab, (200, 100)).astype(np.int32)
    valid = np.ones(tokens.shape, np.float32)
    valid[:, 90:] = 0  # padding is never chosen
    task = tasks.masked_lm(vocab, mask_rate=0.15)
    out = task.transform({"tokens": tokens, "targets": tokens + 1, "mask": valid}, np.random.default_rng(7))
    chosen = out["mask"] > 0
    np.testing.assert_array_equal(out["targets"], tokens)
    assert not chosen[:, 90:].any()
    assert abs(chosen[:, :90].mean() - 0.15) < 0.01
    masked = out["tokens"] == vocab
    assert not masked[~chosen].any() and (out["tokens"][~chosen] == tokens[~chosen]).all()
    kept = chosen & (out["tokens"] == tokens)
    replaced = chosen & ~masked & ~kept
    assert abs(masked[chosen].mean() - 0.8) < 0.02
    assert abs(replaced[chosen].mean() - 0.1 * (1 - 1 / vocab)) < 0.015  # a random token may equal the original
    assert abs(kept[chosen].mean() - (0.1 + 0.1 / vocab)) < 0.015
    again = task.transform({"tokens": tokens, "targets": tokens, "mask": valid}, np.random.default_rng(7))
    np.testing.assert_array_equal(again["tokens"], out["tokens"])  # a pure function of the random stream
    assert task.extra_inputs == 1


@pytest.mark.parametrize(
    "task, words",
    [
        (tasks.Task(inputs="x", loss=lambda out, b: (out - b["y"]) ** 2), "the loss returns shape (4,), not a scalar"),
        (
            tasks.Task(inputs="x", loss=lambda out, b: jnp.mean(out), metrics={"err": lambda out, b: out - b["y"]}),
            "metric 'err' returns shape (4,), not a scalar",
        ),
        (tasks.Task(inputs="x", loss=lambda out, b: jnp.mean(out - b["target"])), "reads batch key 'target'"),
        (tasks.Task(inputs="x", loss=lambda out, b: jnp.mean(out @ b["y"][None])), "fail on the outputs of Net"),
    ],
)
def test_a_task_that_does_not_fit_is_one_line_before_anything_runs(task, words):
    outputs = jax.ShapeDtypeStruct((4,), jnp.float32)
    batch = {"x": np.zeros((4, 3), np.float32), "y": np.zeros(4, np.float32)}
    with pytest.raises(UserError) as info:
        tasks.check(task, "Net", outputs, batch)
    assert words in str(info.value) and "\n" not in str(info.value)


def test_unknown_task_names_the_nearest_and_a_task_needs_a_loss():
    with pytest.raises(UserError, match="unknown task 'regresion'; did you mean regression?"):
        tasks.from_name("regresion")
    with pytest.raises(UserError, match="is not a function"):
        tasks.Task(inputs="x", loss=3)
    with pytest.raises(UserError, match="cannot be named 'loss'"):
        tasks.Task(inputs="x", loss=jnp.mean, metrics={"loss": jnp.mean})

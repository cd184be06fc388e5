"""Runs on a user's own arrays. Evaluation averages each metric over the units it is defined on
(tokens for a token task, examples for a classifier), checked against an independent computation:
numpy's mean over the outputs of ``jaxnet.load(...).predict`` on the same split, with a last batch
that needs padding; and ``jaxnet sample`` on a run of token ids without a vocabulary."""

from __future__ import annotations

import json

import flax.linen as nn
import numpy as np
import pytest

import jaxnet


class Classifier(nn.Module):
    @nn.compact
    def __call__(self, x, train=False):
        return nn.Dense(3)(nn.relu(nn.Dense(16)(x)))


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def numpy_metrics(logits: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    """Cross-entropy and accuracy averaged over every label position (a token or an example)."""
    ce = -np.take_along_axis(log_softmax(logits), labels[..., None], -1)[..., 0]
    return {"loss": float(ce.mean()), "accuracy": float((logits.argmax(-1) == labels).mean())}


@pytest.fixture(scope="module")
def token_run(tmp_path_factory):
    """A tiny GPT trained on a user's own token arrays: 37 validation windows in batches of 16 (the
    last one padded with 11 empty rows), 21 test windows."""
    rng = np.random.default_rng(0)
    seq, vocab = 8, 13
    windows = rng.integers(0, vocab, (122, seq + 1)).astype(np.int32)
    windows[:, 1::2] = (windows[:, 0:-1:2] + 1) % vocab  # something to learn: every other token
    part = lambda a, b: {"tokens": windows[a:b, :-1], "targets": windows[a:b, 1:]}
    data = jaxnet.data.arrays(train=part(0, 64), val=part(64, 101), test=part(101, 122), num_classes=vocab)
    cfg = jaxnet.load_experiment(
        "transformer_shakespeare:smoke",
        [
            "data.name=arrays",
            f"data.seq_len={seq}",
            "model.layers=1",
            "model.width=16",
            "model.heads=2",
            "train.steps=6",
            "train.batch_size=8",
            "train.eval_batch_size=16",
            "train.eval_every=3",
            "train.checkpoint_every=3",
            "train.log_every=3",
            "train.keep_best=val/loss",
            "train.progress=false",
        ],
    )
    workdir = tmp_path_factory.mktemp("runs") / "lm"
    summary = jaxnet.train(cfg, workdir, dataset=data, task=jaxnet.tasks.lm())
    return workdir, data, summary, part


def test_token_task_on_arrays_reports_the_mean_over_tokens(token_run):
    workdir, data, summary, part = token_run
    trained = jaxnet.load(workdir)
    for split, rows in (("val", (64, 101)), ("test", (101, 122))):
        batch = part(*rows)
        want = numpy_metrics(trained.predict({"tokens": batch["tokens"]}), batch["targets"])
        assert summary[split]["loss"] == pytest.approx(want["loss"], abs=1e-5)
        assert summary[split]["accuracy"] == pytest.approx(want["accuracy"], abs=1e-6)
    # Not the old figure: the per-example sums (seq_len times the mean) that the first run showed.
    assert summary["val"]["loss"] < np.log(13) + 0.5
    again = jaxnet.evaluate(workdir, "val", dataset=data, task=jaxnet.tasks.lm())
    assert again["loss"] == pytest.approx(summary["val"]["loss"], abs=1e-6)


def test_best_checkpoint_record_and_logged_validation_are_per_token(token_run):
    workdir, _, summary, part = token_run
    lines = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    logged = [r["loss"] for r in lines if r["split"] == "val"]
    assert len(logged) == 2 and all(v < np.log(13) + 0.5 for v in logged)  # every validation, not only the last
    record = json.loads((workdir / "checkpoints" / "best.json").read_text())
    best = jaxnet.load(workdir, step="best")
    assert best.step == record["step"]
    batch = part(64, 101)
    want = numpy_metrics(best.predict({"tokens": batch["tokens"]}), batch["targets"])
    assert record["value"] == pytest.approx(want["loss"], abs=1e-5)
    assert min(logged) == pytest.approx(want["loss"], abs=1e-5)


def test_classifier_on_arrays_reports_the_mean_over_examples(tmp_path):
    rng = np.random.default_rng(1)
    x = rng.normal(size=(160, 3)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int32) + (x[:, 1] > 0).astype(np.int32)  # 3 classes
    part = lambda a, b: {"x": x[a:b], "label": y[a:b]}
    data = jaxnet.data.arrays(train=part(0, 96), val=part(96, 133), test=part(133, 160))

    cfg = jaxnet.Config()
    cfg.data.name = "arrays"
    cfg.train.steps, cfg.train.batch_size, cfg.train.eval_batch_size = 6, 16, 16
    cfg.train.eval_every = cfg.train.checkpoint_every = cfg.train.log_every = 3
    cfg.train.progress = False
    task = jaxnet.tasks.classification(inputs="x")
    summary = jaxnet.train(cfg, tmp_path / "clf", model=Classifier(), dataset=data, task=task)
    trained = jaxnet.load(tmp_path / "clf", model=Classifier())
    for split, rows in (("val", (96, 133)), ("test", (133, 160))):  # 37 and 27 examples: padded last batches
        batch = part(*rows)
        want = numpy_metrics(trained.predict(batch["x"]), batch["label"])
        assert summary[split]["loss"] == pytest.approx(want["loss"], abs=1e-5)
        assert summary[split]["accuracy"] == pytest.approx(want["accuracy"], abs=1e-6)


def test_sample_on_a_run_of_token_ids_from_python_says_what_it_lacks_and_the_call_works(token_run, capsys):
    from jaxnet import cli

    workdir = token_run[0]
    assert cli.main(["sample", "--workdir", str(workdir)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f"jaxnet: error: {workdir} was trained on token ids given from Python (arrays), so it has no vocab.json to "
        "turn a prompt into ids and ids into text; generate ids from Python: trained = jaxnet.load(workdir); "
        "jaxnet.generate(trained.model.module, trained.params, prompt_ids, 200), then decode them with the "
        "tokenizer that made your ids"
    )
    trained = jaxnet.load(workdir)  # the call the message gives
    ids = jaxnet.generate(trained.model.module, trained.params, np.array([1, 2, 3]), 20)
    assert ids.shape == (20,) and 0 <= ids.min() and ids.max() < 13

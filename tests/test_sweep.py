"""``jaxnet sweep``: members of one vmapped program end like runs trained alone, a stopped sweep
resumes exactly, shape keys split the grid into programs, and the outputs a user reads."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace

import jax
import numpy as np
import pytest
from conftest import needs_fashion_mnist, tiny_config

import jaxnet
from jaxnet import config, observe
from jaxnet.checkpoint import Checkpoints
from jaxnet.data.text import from_text
from jaxnet.errors import UserError
from jaxnet.sweep import expand, parse, programs
from jaxnet.train import record as run_record
from jaxnet.train.loop import Run, train

TIMINGS = ("steps_per_s", "examples_per_s", "tokens_per_s")


def final_params(workdir: Path, dataset) -> list[np.ndarray]:
    """The parameters of a run directory's newest checkpoint."""
    run = Run(config.load(workdir / "config.json"), dataset=dataset)
    ckpts = Checkpoints(workdir / "checkpoints", read_only=True)
    try:
        state = ckpts.restore(run.abstract_state(), say=lambda _: None)
    finally:
        ckpts.close()
    return [np.asarray(x) for x in jax.tree.leaves(packed_attention(jax.device_get(state.params)))]


def packed_attention(params: dict) -> dict:
    """A Transformer's queries, keys and values stacked into one array per layer, as they were saved
    before they were kept apart, so they are compared at the tolerance of the three together: the
    key bias alone is rounding noise (it shifts every score of a query alike, which the softmax
    ignores), as large in a member as alone."""
    if not isinstance(params, dict):
        return params
    out = {k: packed_attention(v) for k, v in params.items()}
    if {"query", "key", "value"} <= out.keys():
        parts = [out.pop(n) for n in ("query", "key", "value")]
        out["qkv"] = {k: np.stack([np.asarray(p[k]) for p in parts], axis=-3) for k in parts[0]}
    return out


def lines(workdir: Path) -> list[dict]:
    """metrics.jsonl without its timings."""
    return [{k: v for k, v in r.items() if k not in TIMINGS} for r in observe.read_metrics(workdir / "metrics.jsonl")]


def assert_like_alone(member: dict, dataset, alone_root: Path) -> None:
    """A member's parameters and logged losses against its configuration trained by jaxnet.train."""
    workdir = Path(member["workdir"])
    cfg = config.load(workdir / "config.json")
    alone = alone_root / member["name"]
    train(cfg, alone, dataset=dataset)
    for got, want in zip(final_params(workdir, dataset), final_params(alone, dataset), strict=True):
        # float32 summed in another order; Adam's division by sqrt(v) magnifies that for the few
        # parameters whose gradients are near zero (to ~1e-6 absolute, for weights of ~1e-2)
        np.testing.assert_allclose(got, want, rtol=2e-4, atol=1e-3 * float(np.abs(want).max()) + 1e-7)
    mine, theirs = lines(workdir), lines(alone)
    assert [(r["step"], r["split"]) for r in mine] == [(r["step"], r["split"]) for r in theirs]
    for a, b in zip(mine, theirs, strict=True):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-4), (member["name"], a["step"], a["split"])


def test_image_members_train_like_alone_and_a_stopped_sweep_resumes_bit_identical(quadrants, tmp_path):
    cfg = tiny_config(model={"dropout": 0.25})
    grid = {"optim.lr": [0.01, 0.03], "seed": [0, 1]}
    run = lambda name, *extra: jaxnet.sweep(  # noqa: E731
        cfg, grid, tmp_path / name, overrides=list(extra), dataset=quadrants
    )
    half = run("stopped", "train.stop_after=6")
    assert [m["step"] for m in half["members"]] == [6] * 4 and not any(m["complete"] for m in half["members"])
    resumed = run("stopped")
    whole = run("whole")
    assert len(whole["programs"]) == 1 and len(whole["programs"][0]) == 4  # one compiled program
    # a model with convolutions: its members vmapped all at once by default, on a CPU too
    assert whole["timings"][0]["members_at_once"] == 4
    for a, b in zip(resumed["members"], whole["members"], strict=True):
        assert a["complete"] and a["name"] == b["name"]
        for x, y in zip(
            final_params(Path(a["workdir"]), quadrants), final_params(Path(b["workdir"]), quadrants), strict=True
        ):
            np.testing.assert_array_equal(x, y)
        assert lines(Path(a["workdir"])) == lines(Path(b["workdir"]))
    # another learning rate and another seed: each member is its own run
    first, last = whole["members"][0], whole["members"][-1]
    assert first["values"] == {"optim.lr": 0.01, "seed": 0} and last["values"] == {"optim.lr": 0.03, "seed": 1}
    for member in (first, last):
        assert_like_alone(member, quadrants, tmp_path / "alone")
    assert (
        final_params(Path(first["workdir"]), quadrants)[0].tolist()
        != final_params(Path(whole["members"][1]["workdir"]), quadrants)[0].tolist()
    )  # seed 1 is not seed 0


def test_language_model_members_with_dropout_train_like_alone(tmp_path):
    text = from_text("the quick brown fox jumps over the lazy dog. " * 60, "char")
    cfg = config.load_experiment(
        "transformer_shakespeare:smoke",
        [
            "data.seq_len=8",
            "train.batch_size=4",
            "train.steps=8",
            "train.log_every=2",
            "train.eval_every=4",
            "train.checkpoint_every=4",
            "train.progress=false",
            "model.width=32",
            "model.heads=2",
            "model.dropout=0.1",
            "data.prefetch=0",
            "optim.weight_decay=0.01",
        ],
    )
    # vmapped two at a time, the program looping over the pairs (the CPU's default here is 1 at a time)
    record = jaxnet.sweep(cfg, ["optim.lr=1e-3,3e-3", "seed=0,5"], tmp_path / "s", dataset=text, members_at_once=2)
    assert len(record["programs"]) == 1 and len(record["members"]) == 4
    assert record["timings"][0]["members_at_once"] == 2
    members = {m["name"]: m for m in record["members"]}
    assert_like_alone(members["optim.lr=3e-3-seed=5"], text, tmp_path / "alone")
    assert record["metric"] == "bpc" and record["configs"][0]["val_n"] == 2
    for member in record["members"]:  # what a run alone writes, so sample and export read a member alike
        assert json.loads((Path(member["workdir"]) / "vocab.json").read_text()) == run_record.vocab(text)


def test_a_runs_vocab_json_keeps_a_chat_corpus_template():
    """Runs and sweep members write vocab.json with the one function: a chat corpus's template kept."""
    chat = SimpleNamespace(tokenizer="hf:/ckpt", vocab=["a", "b"], chat_template="{{ messages }}")
    assert run_record.vocab(chat) == {"tokenizer": "hf:/ckpt", "chat_template": "{{ messages }}", "vocab": ["a", "b"]}
    plain = SimpleNamespace(tokenizer="char", vocab=["a"])
    assert run_record.vocab(plain) == {"tokenizer": "char", "vocab": ["a"]}


def test_keys_that_change_the_program_split_the_grid():
    base = tiny_config()
    swept, fixed = parse(["model.features=4;4,8", "optim.lr=0.1,0.2", "optim.clip_norm=0,1", "train.steps=5"])
    assert swept == {"model.features": ["4", "4,8"], "optim.lr": ["0.1", "0.2"], "optim.clip_norm": ["0", "1"]}
    assert fixed == ["train.steps=5"]
    members = expand(base, swept)
    groups = programs(members)
    # 2 feature tuples x clipping on/off: 4 programs, each of the 2 learning rates
    assert [len(g) for g in groups] == [2, 2, 2, 2]
    assert all(len({m.cfg.optim.lr for m in g}) == 2 for g in groups)
    assert [len(g) for g in programs(members, per_program=1)] == [1] * 8
    assert members[0].name == "model.features=4-optim.lr=0.1-optim.clip_norm=0"


@pytest.mark.parametrize(
    "tokens, message",
    [  # the rest of the bad grids are rows of test_cli.py's bad-input table
        (["optim.lr=0.1,"], "has an empty value"),
        (["optim.lr=0.1,0.1"], "lists the value 0.1 twice"),
        (["seed=1"], "nothing to sweep"),
        ({"optim.lr": []}, "optim.lr has no values"),
        (["optim.lr=0.1,0.2", "train.steps_per_call=1,2"], "jaxnet sweep runs one step per call"),
    ],
)
def test_bad_grids_are_one_line_errors(tokens, message, tmp_path):
    with pytest.raises(UserError, match=re.escape(message)):
        jaxnet.sweep(tiny_config(), tokens, tmp_path / "sweep")
    assert not (tmp_path / "sweep").exists()


def test_a_diverging_member_is_reported_and_the_others_finish(quadrants, tmp_path):
    cfg = tiny_config(optim={"name": "sgd", "momentum": 0.0})
    # one member after another in a loop inside the program: the diverging one leaves the other alone
    record = jaxnet.sweep(cfg, {"optim.lr": [0.05, 1e30]}, tmp_path / "s", dataset=quadrants, members_at_once=1)
    assert record["timings"][0]["members_at_once"] == 1
    fine, bad = record["members"]
    assert_like_alone(fine, quadrants, tmp_path / "alone")
    assert fine["complete"] and fine["diverged_at_step"] is None and fine["test"]["accuracy"] > 0.25
    assert bad["complete"] and 1 <= bad["diverged_at_step"] <= 2  # the first update makes the weights huge
    assert record["configs"][0]["values"] == {"optim.lr": 0.05}  # the finite one ranks first
    assert "| 1e+30 | 1 | diverged | diverged |" in (tmp_path / "s" / "sweep.md").read_text()


@needs_fashion_mnist
def test_cli_sweep_writes_member_runs_table_and_plot_and_a_rerun_prints_the_table(tmp_path):
    from test_cli import jaxnet_command

    args = [
        "sweep",
        "cnn_fashion_mnist:smoke",
        "optim.lr=1e-3,3e-3",
        "seed=0,1",
        "train.steps=20",
        "model.features=8",
        "model.hidden=32",
        "train.eval_every=10",
        "train.checkpoint_every=10",
        "train.progress=false",
        "--workdir",
        "s",
    ]
    first = jaxnet_command(*args, cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    root = tmp_path / "s"
    record = json.loads((root / "sweep.json").read_text())
    assert record["batched"] == ["optim.lr", "seed"] and len(record["members"]) == 4
    assert [len(c["members"]) for c in record["configs"]] == [2, 2]  # two seeds per learning rate
    best = record["configs"][0]
    assert best["val_mean"] >= record["configs"][1]["val_mean"]  # best accuracy first
    table = (root / "sweep.md").read_text()
    assert "| optim.lr | seeds | val accuracy | test accuracy |" in table and table in first.stdout + "\n"
    assert (root / "sweep.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    member = root / "optim.lr=1e-3-seed=1"
    for name in ("config.json", "metrics.jsonl", "summary.json", "curves.png"):
        assert (member / name).is_file(), name
    summary = json.loads((member / "summary.json").read_text())
    assert summary["complete"] and summary["step"] == 20 and summary["sweep"]["members_in_program"] == 4
    assert {(r["split"], r["step"]) for r in observe.read_metrics(member / "metrics.jsonl")} >= {
        ("val", 10),
        ("val", 20),
        ("test", 20),
        ("train", 20),
    }
    evaluated = jaxnet_command("eval", "--workdir", str(member), cwd=tmp_path)  # an ordinary run directory
    assert evaluated.returncode == 0, evaluated.stderr
    assert json.loads(evaluated.stdout.strip().splitlines()[-1])["accuracy"] == summary["test"]["accuracy"]
    again = jaxnet_command(*args, cwd=tmp_path)
    assert again.returncode == 0 and "program 1" not in again.stdout and table.strip() in again.stdout

"""data.mixture: corpora mixed by weight, batches a pure function of (seed, step), resumable after SIGKILL.

The row rule's arithmetic (a sum of floors, the points below a bound) is checked against brute-force
counting; the rows' corpora against the weights and the schedule; the windows against a pass that
reads every window once; and one tiny run (two byte-level corpora, 0.8/0.2, 200 steps) against its
log, its summary and a copy of it killed with SIGKILL and resumed.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import cpu_env, fails, patient, said

from jaxnet import config, observe
from jaxnet.data import mixture, tokens
from jaxnet.data.prepare import prepare
from jaxnet.errors import UserError

ROOT = Path(__file__).resolve().parents[1]
TIMINGS = ("steps_per_s", "examples_per_s", "tokens_per_s")
WORDS = {
    "plays": "the king is dead long live the king my lord and lady good night sweet prince".split(),
    "code": "def return import class for while if else print value none true false self".split(),
}


def write_corpus(root: Path, name: str, tokenizer: str = "byte") -> Path:
    rng = np.random.default_rng(len(name))
    source = root / f"src-{name}"
    source.mkdir()
    words = WORDS["plays" if "plays" in name else "code"]
    for d in range(12):
        (source / f"doc{d}.txt").write_text(" ".join(rng.choice(words, 700)))
    prepare(str(source), tokenizer, root / name, workers=1, progress=False, say=lambda *_: None)
    return root / name


@pytest.fixture(scope="module")
def corpora(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("mixture")
    rng = np.random.default_rng(0)
    rows = []  # which word follows: one of the plays' words or one of the code's
    for _ in range(12):
        words = rng.choice(WORDS["plays"], 6).tolist()
        choices = [" " + words[-1], " " + str(rng.choice(WORDS["code"]))]
        rows.append({"context": " ".join(words[:-1]), "choices": choices, "gold": 0})
    (root / "which.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return {
        "plays": write_corpus(root, "plays"),
        "code": write_corpus(root, "code"),
        "code-char": write_corpus(root, "code-char", tokenizer="char"),
        "task": root / "which.jsonl",
    }


def run_args(corpora: dict[str, Path], *extra: str) -> list[str]:
    return [
        "gpt2_shakespeare:smoke",
        f"data.mixture={corpora['plays']}:0.8,{corpora['code']}:0.2",
        "data.vocab_size=0",
        "train.steps=200",
        "train.log_every=10",
        "train.eval_every=100",
        "train.checkpoint_every=50",
        "train.progress=false",
        f"train.eval_tasks={corpora['task']}",
        *extra,
    ]


# --- the row rule's arithmetic ------------------------------------------------------------------


def test_floor_sum_and_points_below_a_bound_equal_counting_them():
    rng = np.random.default_rng(0)
    for _ in range(200):
        n, m = int(rng.integers(0, 60)), int(rng.integers(1, 50))
        a, b = int(rng.integers(0, 200)), int(rng.integers(0, 200))
        assert mixture.floor_sum(n, m, a, b) == sum((a * i + b) // m for i in range(n))
    for rows, bound, offset in ((0, 5, 1), (5000, mixture.Q // 3, 77), (4096, 1, 0), (777, mixture.Q - 1, 2**30)):
        assert mixture.below(rows, bound, offset) == sum(
            (mixture.P * r + offset) % mixture.Q < bound for r in range(rows)
        )


def test_rows_follow_the_weights_and_the_counts_before_a_step_add_up():
    plan = mixture.Plan([(0, (0.8, 0.2)), (120, (0.3, 0.7))], batch_size=8, seed=3)
    per_step = np.array([np.bincount(plan.sources(s), minlength=2) for s in range(200)])
    assert (per_step.sum(1) == 8).all()
    for step in (0, 1, 57, 120, 121, 199, 200):
        assert plan.before(step).tolist() == per_step[:step].sum(0).tolist()
    # within a few rows of the weights over any stretch: here the first 120 steps, then the rest
    first, rest = per_step[:120].sum(0) / 960, per_step[120:].sum(0) / 640
    assert abs(first[0] - 0.8) < 0.01 and abs(rest[0] - 0.3) < 0.01, (first, rest)
    assert plan.weights_at(119) == pytest.approx((0.8, 0.2)) and plan.weights_at(120) == pytest.approx((0.3, 0.7))
    # a weight of 0 from a step on leaves that corpus out from that very step
    off = mixture.Plan([(0, (0.5, 0.5)), (10, (1.0, 0.0))], batch_size=4, seed=0)
    assert all((off.sources(s) == 0).all() for s in range(10, 40))
    assert any((off.sources(s) == 1).any() for s in range(10))


def test_the_count_of_a_billion_rows_is_a_sum_of_floors_not_a_loop():
    plan = mixture.Plan([(0, (0.7, 0.3))], batch_size=1024, seed=1)
    started = time.perf_counter()
    counts = plan.before(10**6)  # 1.024e9 rows
    assert time.perf_counter() - started < patient(1.0)
    assert counts.sum() == 1024 * 10**6
    assert abs(counts[0] / counts.sum() - 0.7) < 1e-6


# --- batches -------------------------------------------------------------------------------------


def mixed(corpora, *overrides: str):
    cfg = config.load_experiment("gpt2_shakespeare:smoke", [*run_args(corpora)[1:], *overrides])
    return cfg, tokens.load(cfg.data)


def test_batches_are_a_function_of_seed_and_step_and_each_process_reads_its_rows(corpora):
    cfg, ds = mixed(corpora)
    whole = [b for _, b in zip(range(60), ds.train_batches(cfg, 0), strict=False)]
    resumed = [b for _, b in zip(range(23), ds.train_batches(cfg, 37), strict=False)]
    for a, b in zip(whole[37:], resumed, strict=True):
        np.testing.assert_array_equal(a["tokens"], b["tokens"])
    halves = [next(tokens.load(cfg.data).train_batches(cfg, 41, rows)) for rows in (slice(0, 2), slice(2, 4))]
    np.testing.assert_array_equal(np.concatenate([h["tokens"] for h in halves]), whole[41]["tokens"])
    np.testing.assert_array_equal(whole[5]["targets"][:, :-1], whole[5]["tokens"][:, 1:])
    other = next(tokens.load(cfg.data).train_batches(config.apply_overrides(cfg, ["seed=1"]), 41))
    assert not np.array_equal(other["tokens"], whole[41]["tokens"])


def test_a_pass_reads_every_window_of_a_corpus_once_then_the_next_pass_begins(corpora):
    cfg, ds = mixed(corpora, "data.mixture_end=cycle", "train.batch_size=64")
    seq = cfg.data.seq_len
    n = ds.windows(seq)[1]  # the small share: code
    plan = ds.plan(cfg)
    steps = next(s for s in range(10_000) if plan.before(s)[1] >= 2 * n)
    code = np.asarray(ds.parts[1][1].train[0 : len(ds.parts[1][1].train)])
    rows = []
    for step, batch in zip(range(steps), ds.train_batches(cfg, 0), strict=False):
        rows += [row for row, src in zip(batch["tokens"], plan.sources(step), strict=True) if src == 1]
    first_pass = np.array(rows[:n])
    assert len({r.tobytes() for r in first_pass}) == n  # no window twice in one pass
    where: dict[bytes, set[int]] = {}
    for s, w in enumerate(np.lib.stride_tricks.sliding_window_view(code, seq)):
        where.setdefault(w.tobytes(), set()).add(s % seq)
    # one pass's windows share their boundaries (a text may repeat a window elsewhere): none overlap
    assert set.intersection(*(where[r.tobytes()] for r in first_pass))
    second = np.array(rows[n : 2 * n])
    assert not np.array_equal(first_pass, second)  # a new order (and boundaries) for the next pass
    assert len({r.tobytes() for r in second}) == n


def test_mixture_end_stop_ends_the_run_where_a_corpus_runs_out_and_says_so(corpora):
    cfg, ds = mixed(corpora, "data.mixture_end=stop", "train.steps=5000")
    said = []
    shorter = mixture.end_of_data(cfg, tokens.load, said.append)
    windows, plan = ds.windows(cfg.data.seq_len), ds.plan(cfg)
    step = shorter.train.steps
    assert step < 5000 and "runs out at step" in said[0] and "data.mixture_end=stop" in said[0]
    assert (plan.before(step) <= windows).all() and (plan.before(step + 1) > windows).any()
    cycling = config.apply_overrides(cfg, ["data.mixture_end=cycle"])
    assert mixture.end_of_data(cycling, tokens.load, said.append).train.steps == 5000


@pytest.mark.parametrize(
    "mix, message",
    [
        ("{plays}:0.8,{missing}:0.2", "is not a directory"),
        ("{plays}:0.8,{code}:0", "a weight must be a number > 0"),
        ("{plays}:0.8,{code}:-1", "a weight must be a number > 0"),
        ("{plays}:0.8,{code}", "is not DIR:WEIGHT"),
        ("{plays}:0.8,{code-char}:0.2", "was prepared with another tokenizer"),
        ("{plays}:0.5,{plays}:0.5", "two corpora are named plays"),
    ],
)
def test_bad_mixtures_are_one_line_and_exit_2(corpora, tmp_path, capsys, mix, message):
    paths = {k: str(v) for k, v in corpora.items()} | {"missing": str(tmp_path / "nowhere")}
    mix = mix.replace("{code-char}", paths["code-char"]).format(**paths)
    args = run_args(corpora)
    args[1] = f"data.mixture={mix}"
    err = fails(["train", *args, "--workdir", str(tmp_path / "run")], capsys)
    assert message in err
    assert not (tmp_path / "run").exists()  # refused before anything was written


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["data.mixture_schedule=100:0.5/0.5"], "needs data.mixture"),
        (["data.mixture=a:1,b:1", "data.mixture_schedule=100:0.5"], "has 1 weights for the 2 corpora"),
        (["data.mixture=a:1,b:1", "data.mixture_schedule=100:0/0"], "not all 0"),
        (["data.mixture=a:1,b:1", "data.mixture_schedule=100:1/1,50:1/1"], "list steps in order"),
        (["data.mixture=a:1,b:1", "data.name=shakespeare"], "set data.name=tokens"),
    ],
)
def test_bad_mixture_keys_are_refused_with_the_fix(overrides, message):
    with pytest.raises(UserError, match=message):
        config.load_experiment("gpt2_shakespeare:smoke", overrides)


# --- one run: its log, its summary, and SIGKILL -------------------------------------------------


def jaxnet_process(args: list[str]) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "jaxnet", "train", *args],
        cwd=ROOT,
        env={**cpu_env(), "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def train_records(workdir: Path) -> list[dict]:
    return [
        {k: v for k, v in r.items() if k not in TIMINGS}
        for r in observe.read_metrics(workdir / "metrics.jsonl")
        if r["split"] == "train"
    ]


def test_a_two_corpus_run_reads_its_weights_reports_each_corpus_and_resumes_after_sigkill_exactly(
    corpora, tmp_path, capsys
):
    out = said(["train", *run_args(corpora), "--workdir", str(tmp_path / "whole")], capsys)
    assert "mixture of 2 corpora: plays 0.8" in out and "passes over each corpus" in out
    killed = jaxnet_process([*run_args(corpora), "--workdir", str(tmp_path / "killed")])
    deadline = time.monotonic() + patient(600)
    while not (tmp_path / "killed" / "checkpoints" / "50").exists() and killed.poll() is None:
        assert time.monotonic() < deadline, "no checkpoint in 10 minutes"
        time.sleep(0.005)
    killed.kill()  # SIGKILL, mid-run
    killed.communicate()
    assert killed.returncode == -9 and not (tmp_path / "killed" / "summary.json").exists()
    out = said(["train", *run_args(corpora), "--workdir", str(tmp_path / "killed")], capsys)  # the same command
    assert "resuming" in out

    summary = json.loads((tmp_path / "whole" / "summary.json").read_text())
    again = json.loads((tmp_path / "killed" / "summary.json").read_text())
    assert train_records(tmp_path / "killed") == train_records(tmp_path / "whole")  # losses and batches alike
    assert again["val"] == summary["val"] and again["test"] == summary["test"]

    last = train_records(tmp_path / "whole")[-1]
    assert last["step"] == 200
    fraction = last["tokens/plays"] / (last["tokens/plays"] + last["tokens/code"])
    assert abs(fraction - 0.8) < 0.02, fraction
    assert last["tokens/plays"] + last["tokens/code"] == 200 * 4 * 32  # every row's 32 predicted tokens
    assert summary["mixture"]["plays"]["fraction"] == pytest.approx(fraction)
    val = summary["val"]
    assert {"loss", "plays/loss", "code/loss", "plays/bits_per_byte"} <= set(val)
    # the mixed loss is over both corpora's validation tokens together: between the two
    assert min(val["plays/loss"], val["code/loss"]) < val["loss"] < max(val["plays/loss"], val["code/loss"])
    assert {"which/acc", "which/acc_norm", "tasks/acc"} <= set(val)  # train.eval_tasks, at each validation
    at_100 = [r for r in observe.read_metrics(tmp_path / "whole" / "metrics.jsonl") if r["split"] == "val"][0]
    assert at_100["step"] == 100 and 0 <= at_100["which/acc"] <= 1
    scored = json.loads(
        said(["eval", "--workdir", str(tmp_path / "whole"), "--task", str(corpora["task"]), "--json"], capsys)
    )
    assert scored["tasks"]["which"]["acc_norm"] == val["which/acc_norm"]  # jaxnet eval --task: the loop's numbers
    events = b"".join(p.read_bytes() for p in (tmp_path / "whole" / "tb").glob("events*"))
    assert b"train/tokens/plays" in events and b"val/code/loss" in events  # TensorBoard's tags


def test_an_experiment_file_gives_the_mixture_and_its_schedule_as_lists(tmp_path):
    path = tmp_path / "mine.py"
    path.write_text(
        "from jaxnet.config import Config\n"
        "from jaxnet.models import TransformerConfig\n"
        "def get_config(variant='default'):\n"
        "    cfg = Config()\n"
        "    cfg.data.name, cfg.data.seq_len = 'tokens', 16\n"
        "    cfg.model = TransformerConfig()\n"
        "    cfg.data.mixture = ['corpora/web:0.7', 'corpora/code:0.3']\n"
        "    cfg.data.mixture_schedule = ['500:0.5/0.5', '900:0.2/0.8']\n"
        "    return cfg\n"
    )
    cfg = config.load_experiment(str(path))
    assert config.mixture_sources(cfg) == [("corpora/web", 0.7), ("corpora/code", 0.3)]
    assert config.mixture_schedule(cfg) == [(500, (0.5, 0.5)), (900, (0.2, 0.8))]
    config.save(cfg, tmp_path / "config.json")  # and config.json reads back the same
    assert config.load(tmp_path / "config.json").data.mixture_schedule == ("500:0.5/0.5", "900:0.2/0.8")

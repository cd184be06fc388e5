"""Token shards read by several processes: a 2-process run (``scripts/launch_local.sh``) trains
from ``jaxnet prepare``'s shards like 1 process with as many devices, each process reading only
its rows of every training and evaluation batch; a run stopped on 1 process and resumed on 2 sees
the same global batches as the uninterrupted run and ends with its losses.

What each process reads is recorded by a ``sitecustomize`` put on the processes' path (it wraps
:class:`jaxnet.data.tokens.TokenDataset`'s batch makers and the shard reads when that module is
imported; see tests/multiprocess_runs.py), and checked against batches computed here with numpy
from the shard files."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import multiprocess_runs
import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
SEED, BATCH, SEQ, STEPS, STOP, EVAL_TOKENS = 0, 8, 32, 30, 12, 300
RUN = [
    "transformer_shakespeare:smoke",
    "data.name=tokens",
    "train.progress=false",
    f"train.eval_tokens={EVAL_TOKENS}",
    "train.eval_batch_size=4",  # 10 evaluation windows: 3 batches, each process holding 2 rows of each
    "mesh.data=-1",
]

# Recorded per process in $JAXNET_TEST_SPY/process-ID.jsonl: every training batch (step, rows,
# tokens, the token indices read to make it) and every evaluation batch (split, index, rows,
# tokens, mask, indices read).
SPY = r"""
def _install(tokens):
    import numpy as np

    shards = tokens.shards_lib.ShardedTokens
    getitem, read = shards.__getitem__, shards.read

    def seen(indices):
        if getattr(_LOCAL, "reads", None) is not None:
            _LOCAL.reads.append(np.asarray(indices, np.int64).ravel())

    def spy_getitem(self, index):
        if isinstance(index, slice):
            start, stop, _ = index.indices(len(self))
            seen(np.arange(start, stop))
        else:
            seen(index)
        return getitem(self, index)

    def spy_read(self, start, stop):
        seen(np.arange(start, max(start, stop)))
        return read(self, start, stop)

    windows = shards.windows

    def spy_windows(self, starts, length):
        seen(np.asarray(starts, np.int64)[:, None] + np.arange(length))
        return windows(self, starts, length)

    shards.__getitem__, shards.read, shards.windows = spy_getitem, spy_read, spy_windows

    def recorded(batches, record):
        i = 0
        while True:
            _LOCAL.reads = []
            try:
                batch = next(batches)
            except StopIteration:
                return
            finally:
                reads, _LOCAL.reads = _LOCAL.reads, None
            read = np.unique(np.concatenate(reads)) if reads else np.zeros(0, np.int64)
            _log({**record(i), "tokens": batch["tokens"].tolist(), "mask": batch.get("mask", np.ones(1)).tolist(),
                  "read": read.tolist()})
            i += 1
            yield batch

    cls = tokens.TokenDataset
    train, evaluate = cls.train_batches, cls.eval_batches

    def train_batches(self, cfg, start_step, rows=slice(None)):
        span = [rows.start, rows.stop]
        return recorded(train(self, cfg, start_step, rows), lambda i: {"kind": "train", "step": start_step + i,
                                                                       "rows": span})

    def eval_batches(self, cfg, split, batch_size, rows=slice(None)):
        span = list(rows.indices(batch_size)[:2])
        return recorded(evaluate(self, cfg, split, batch_size, rows), lambda i: {"kind": "eval", "split": split,
                                                                                 "index": i, "rows": span})

    cls.train_batches, cls.eval_batches = train_batches, eval_batches

"""


_run, _records = multiprocess_runs.run, multiprocess_runs.records


def _global_batches(spy: Path) -> dict[int, np.ndarray]:
    """The global training batch of each step that every process made, its rows put together in
    row order from the processes that made them."""
    pieces: dict[int, list[tuple[int, list]]] = {}
    for records in _records(spy).values():
        for r in records:
            if r["kind"] == "train":
                pieces.setdefault(r["step"], []).append((r["rows"][0], r["tokens"]))
    processes = len(_records(spy))
    return {
        step: np.concatenate([np.asarray(t) for _, t in sorted(p)]) for step, p in pieces.items() if len(p) == processes
    }


def _losses(workdir: Path) -> dict[tuple[int, str], float]:
    lines = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    return {(r["step"], r["split"]): r["loss"] for r in lines}


def _split_ids(corpus: Path, split: str) -> np.ndarray:
    """A split's token ids read with numpy from its llm.c shards (header: 256 int32, then uint16)."""
    manifest = json.loads((corpus / "corpus.json").read_text())
    parts = []
    for shard in manifest["splits"][split]["shards"]:
        raw = (corpus / shard["file"]).read_bytes()
        header = np.frombuffer(raw[:1024], np.int32)
        assert header[0] == 20240520 and header[1] == 1
        parts.append(np.frombuffer(raw[1024:], np.uint16)[: header[2]])
    return np.concatenate(parts).astype(np.int32)


def _window_offsets(n_tokens: int, step: int) -> np.ndarray:
    """Where the rows of training batch ``step`` start: drawn from (seed, step), the documented rule
    of window batching (jaxnet.data.text.window_batch)."""
    return np.random.default_rng([SEED, 2, step]).integers(0, n_tokens - SEQ, size=BATCH)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tokens-multiprocess")
    multiprocess_runs.write_spy(tmp / "site", "jaxnet.data.tokens", SPY)
    docs = tmp / "docs"
    docs.mkdir()
    words = ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog.", "\u00e9t\u00e9"]
    rng = np.random.default_rng(1)
    for i in range(6):
        (docs / f"doc{i}.txt").write_text(" ".join(rng.choice(words, 400)) + "\n")
    corpus = tmp / "corpus"
    prepare = [sys.executable, "-m", "jaxnet", "prepare", str(docs), "--tokenizer", "byte", "--out", str(corpus)]
    prepare += ["--workers", "1", "--shard-tokens", "3000", "--quiet"]
    prepare += ["--val-fraction", "0.2", "--test-fraction", "0.2"]
    _run(prepare, 1, tmp / "spy-prepare")
    args = [*RUN, f"data.path={corpus}", f"seed={SEED}"]
    one_process = [sys.executable, "-m", "jaxnet", "train", *args]
    two_processes = [str(ROOT / "scripts" / "launch_local.sh"), "2", *args]
    out = {"corpus": corpus}
    out["one"] = _run([*one_process, "--workdir", str(tmp / "one")], 2, tmp / "spy-one")
    out["two"] = _run([*two_processes, "--workdir", str(tmp / "two")], 1, tmp / "spy-two")
    out["half"] = _run([*one_process, f"train.stop_after={STOP}", "--workdir", str(tmp / "moved")], 2, tmp / "spy-half")
    out["rest"] = _run([*two_processes, "--workdir", str(tmp / "moved")], 1, tmp / "spy-rest")
    out["tmp"] = tmp
    return out


@pytest.mark.slow  # 4 training runs and a prepare in subprocesses: 35 to 60 s on the shared 2-core machine
def test_two_processes_train_from_shards_like_one_and_each_reads_only_its_rows(runs):
    tmp, corpus = runs["tmp"], runs["corpus"]
    assert "on 2 cpu device(s)" in runs["two"].stdout and "data=2" in runs["two"].stdout
    expected, got = _losses(tmp / "one"), _losses(tmp / "two")
    assert got.keys() == expected.keys() and (STEPS, "test") in got and (15, "val") in got
    for key, loss in expected.items():  # float32 reduction order: gloo's all-reduce against one process's
        assert got[key] == pytest.approx(loss, rel=1e-5), key

    train = _split_ids(corpus, "train")
    assert len(json.loads((corpus / "corpus.json").read_text())["splits"]["train"]["shards"]) == 3
    one, two = _global_batches(tmp / "spy-one"), _global_batches(tmp / "spy-two")
    assert set(range(STEPS)) <= set(one) and set(range(STEPS)) <= set(two)
    for step in range(STEPS):
        offsets = _window_offsets(len(train), step)
        reference = train[offsets[:, None] + np.arange(SEQ)]  # numpy over the shard files
        np.testing.assert_array_equal(one[step], reference, err_msg=f"step {step}")
        np.testing.assert_array_equal(two[step], reference, err_msg=f"step {step}")

    records = _records(tmp / "spy-two")
    assert sorted(records) == [0, 1]
    for process, mine in ((0, slice(0, BATCH // 2)), (1, slice(BATCH // 2, BATCH))):
        batches = [r for r in records[process] if r["kind"] == "train"]
        assert batches and all(r["rows"] == [mine.start, mine.stop] for r in batches)
        for r in batches:  # exactly the tokens of its rows' windows (inputs and next-token targets)
            offsets = _window_offsets(len(train), r["step"])[mine]
            wanted = np.unique(offsets[:, None] + np.arange(SEQ + 1))
            np.testing.assert_array_equal(r["read"], wanted, err_msg=f"process {process} step {r['step']}")

    # Evaluation: each process reads only the windows of its rows, and together they are the
    # first EVAL_TOKENS predictions of the split in windows of SEQ.
    for split in ("val", "test"):
        ids = _split_ids(corpus, split)
        n = min(EVAL_TOKENS, len(ids) - 1)
        covered = np.zeros(0, np.int64)
        for process in (0, 1):
            batches = [r for r in records[process] if r["kind"] == "eval" and r["split"] == split]
            assert batches, (process, split)
            for r in batches:
                rows = r["rows"]
                assert rows[1] - rows[0] == len(r["tokens"])
                rows_per_batch = 2 * len(r["tokens"])
                first = (r["index"] * rows_per_batch + rows[0]) * SEQ
                last = min((r["index"] * rows_per_batch + rows[1]) * SEQ, n)
                wanted = np.arange(first, last + 1) if last > first else np.zeros(0, np.int64)
                np.testing.assert_array_equal(r["read"], wanted, err_msg=f"process {process} {split}")
                tokens = np.asarray(r["tokens"]).ravel()
                np.testing.assert_array_equal(tokens[: max(0, last - first)], ids[first:last])
                assert np.asarray(r["mask"]).sum() == max(0, last - first)
                covered = np.concatenate([covered, wanted[:-1]])
        np.testing.assert_array_equal(np.unique(covered), np.arange(n))  # every prediction once, by someone
        evaluations = sum(r["kind"] == "eval" and r["split"] == split and r["index"] == 0 for r in records[0])
        assert evaluations == {"val": 2, "test": 1}[split] and len(covered) == n * evaluations


@pytest.mark.slow  # shares the runs above
def test_stopped_on_one_process_resumed_on_two_sees_the_same_global_batches_and_loss(runs):
    tmp = runs["tmp"]
    assert f"stopped at step {STOP}" in runs["half"].stdout
    assert f"from step {STOP}" in runs["rest"].stdout and "(2 cpu device(s))" in runs["rest"].stdout
    assert json.loads((tmp / "moved" / "summary.json").read_text())["environment"]["process_count"] == 2
    one, half, rest = (_global_batches(tmp / f"spy-{k}") for k in ("one", "half", "rest"))
    assert set(range(STOP)) <= set(half) and set(range(STOP, STEPS)) <= set(rest)
    assert min(rest) == STOP  # the resumed run starts at the checkpoint's step, both processes
    for step in range(STEPS):
        seen = half[step] if step < STOP else rest[step]
        np.testing.assert_array_equal(seen, one[step], err_msg=f"step {step}")
    assert len(_records(tmp / "spy-rest")) == 2
    expected, got = _losses(tmp / "one"), _losses(tmp / "moved")
    assert got[(STEPS, "test")] == pytest.approx(expected[(STEPS, "test")], rel=1e-5)
    assert got[(STEPS, "train")] == pytest.approx(expected[(STEPS, "train")], rel=1e-5)


def test_evaluation_rows_read_apart_make_the_whole_batches(tmp_path, monkeypatch):
    """What each of 2 or 4 processes reads of an evaluation batch, put together, is the batch one
    process makes, and each reads only the tokens of its windows."""
    from jaxnet.config import Config, DataConfig
    from jaxnet.data import shards, text, tokens

    rng = np.random.default_rng(2)
    d = tmp_path / "corpus"
    d.mkdir()
    val = rng.integers(0, 300, 77).astype(np.uint16)
    (d / "train.bin").write_bytes(rng.integers(0, 300, 500).astype(np.uint16).tobytes())
    (d / "val.bin").write_bytes(val.tobytes())
    cfg = Config()
    cfg.data = DataConfig(name="tokens", path=str(d), seq_len=5, format="nanogpt")  # GPT-2 ids
    ds = tokens.load(cfg.data)
    whole = list(text.eval_batches(val.astype(np.int32), batch_size=4, seq_len=5, mode="windows"))
    reads = []
    real = shards.ShardedTokens.__getitem__
    monkeypatch.setattr(shards.ShardedTokens, "__getitem__", lambda self, i: reads.append(i) or real(self, i))
    for parts in (2, 4):
        pieces = []
        for p in range(parts):
            rows = slice(p * 4 // parts, (p + 1) * 4 // parts)
            reads.clear()
            pieces.append(list(ds.eval_batches(cfg, "val", 4, rows=rows)))
            assert len(reads) == 4
            for i, index in enumerate(reads):  # batch i: windows i*4 + rows, each 5 predictions + 1
                start = (i * 4 + rows.start) * 5
                assert index == slice(start, min((i * 4 + rows.stop) * 5, 76) + 1)
        assert len(pieces[0]) == len(whole) == 4
        for i, batch in enumerate(whole):
            for key in ("tokens", "targets", "mask"):
                np.testing.assert_array_equal(np.concatenate([p[i][key] for p in pieces]), batch[key], err_msg=key)

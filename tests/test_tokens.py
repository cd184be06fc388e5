"""data.name=tokens: memory-mapped shards give the in-memory text's batches, each process reads
only its rows, nanoGPT's and llm.c's files are read as those projects write them, bad input is
one line with exit 2."""

from __future__ import annotations

import json
import pickle

import numpy as np
import psutil
import pytest

from jaxnet import cli
from jaxnet.config import Config, DataConfig
from jaxnet.data import shards, text, tokenizers, tokens
from jaxnet.errors import UserError


def llmc_write(path, ids):
    """llm.c's write_datafile: 256 int32 header (magic, version, count), then uint16 tokens."""
    header = np.zeros(256, np.int32)
    header[0], header[1], header[2] = 20240520, 1, len(ids)
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(np.asarray(ids, np.uint16).tobytes())


def llmc_dir(tmp_path, train_parts, val):
    d = tmp_path / "fineweb"
    d.mkdir()
    for i, part in enumerate(train_parts, 1):
        llmc_write(d / f"fineweb_train_{i:06d}.bin", part)
    llmc_write(d / "fineweb_val_000000.bin", val)
    return d


def cfg_for(path, **data):
    cfg = Config()
    cfg.data = DataConfig(name="tokens", path=str(path), seq_len=8, **data)
    cfg.train.batch_size, cfg.train.eval_batch_size, cfg.seed = 6, 3, 5
    return cfg


def test_window_batches_over_shards_equal_the_in_memory_texts_and_each_process_reads_its_rows(tmp_path, monkeypatch):
    rng = np.random.default_rng(0)
    parts = [rng.integers(0, 50257, n) for n in (37, 5, 60)]  # windows cross shard boundaries
    d = llmc_dir(tmp_path, parts, rng.integers(0, 50257, 30))
    cfg = cfg_for(d)
    ds = tokens.load(cfg.data)
    whole = np.concatenate(parts).astype(np.int32)
    assert len(ds.train) == 102 and ds.tokenizer == "gpt2" and ds.num_classes == 50257
    ours = ds.train_batches(cfg, start_step=3)
    theirs = text.train_batches(whole, batch_size=6, seq_len=8, mode="windows", seed=5, start_step=3)
    for _ in range(5):
        a, b = next(ours), next(theirs)
        np.testing.assert_array_equal(a["tokens"], b["tokens"])
        np.testing.assert_array_equal(a["targets"], b["targets"])
    read = []
    real = shards.ShardedTokens.__getitem__
    spy = lambda self, i: read.append(np.asarray(i)) or real(self, i)
    monkeypatch.setattr(shards.ShardedTokens, "__getitem__", spy)
    real_windows = shards.ShardedTokens.windows  # rows read as contiguous copies
    spy_windows = lambda self, s, n: read.append(np.asarray(s)[:, None] + np.arange(n)) or real_windows(self, s, n)
    monkeypatch.setattr(shards.ShardedTokens, "windows", spy_windows)
    rows = next(ds.train_batches(cfg, start_step=9, rows=slice(3, 6)))
    full = text.window_batch(whole, 6, 8, 5, 9)
    np.testing.assert_array_equal(rows["tokens"], full["tokens"][3:6])
    touched = np.unique(np.concatenate([r.ravel() for r in read]))
    offsets = np.random.default_rng([5, 2, 9]).integers(0, len(whole) - 8, size=6)
    mine = np.unique(np.concatenate([np.arange(o, o + 9) for o in offsets[3:6]]))
    np.testing.assert_array_equal(touched, mine)  # this process's rows only


def test_evaluation_streams_the_first_eval_tokens_as_the_in_memory_text_evaluates_them(tmp_path):
    rng = np.random.default_rng(1)
    val = rng.integers(0, 50257, 50)
    d = llmc_dir(tmp_path, [rng.integers(0, 50257, 40)], val)
    for cap, n in ((0, 49), (20, 20)):
        cfg = cfg_for(d)
        cfg.train.eval_tokens = cap
        ds = tokens.load(cfg.data)
        ours = list(ds.eval_batches(cfg, "val", 3))
        theirs = list(text.eval_batches(val[: n + 1].astype(np.int32), batch_size=3, seq_len=8, mode="windows"))
        assert len(ours) == len(theirs) and sum(b["mask"].sum() for b in ours) == n
        for a, b in zip(ours, theirs, strict=True):
            for k in ("tokens", "targets", "mask"):
                np.testing.assert_array_equal(a[k], b[k])
    assert ds.size("test") == 0 and "no test split" in ds.describe()


def test_nanogpt_train_bin_with_meta_pkl_is_read_as_nanogpt_writes_it(tmp_path):
    d = tmp_path / "shakespeare_char"
    d.mkdir()
    chars = sorted(set("hello world\n"))
    stoi = {c: i for i, c in enumerate(chars)}
    ids = np.array([stoi[c] for c in "hello world\n" * 10], np.uint16)
    ids[:100].tofile(d / "train.bin")  # as nanoGPT's prepare.py: np.array(ids, dtype=np.uint16).tofile(...)
    ids[100:].tofile(d / "val.bin")
    with open(d / "meta.pkl", "wb") as f:
        pickle.dump({"vocab_size": len(chars), "itos": dict(enumerate(chars)), "stoi": stoi}, f)
    ds = tokens.load(DataConfig(name="tokens", path=str(d)))
    assert ds.vocab == chars and ds.tokenizer == "char" and len(ds.train) == 100 and len(ds.val) == 20
    assert ds.decode(ds.train[0:11]) == "hello world"
    padded = tokens.load(DataConfig(name="tokens", path=str(d), format="nanogpt", vocab_size=64))
    assert padded.num_classes == 64
    (d / "meta.pkl").unlink()  # a GPT-2 set: no meta.pkl
    assert tokens.load(DataConfig(name="tokens", path=str(d))).num_classes == 50257


def test_resident_memory_does_not_grow_with_the_corpus(tmp_path):
    d = tmp_path / "big"
    d.mkdir()
    n = 48 * 2**20  # 96 MB of uint16 tokens
    np.memmap(d / "train.bin", np.uint16, "w+", shape=(n,))[:] = 7
    np.zeros(1000, np.uint16).tofile(d / "val.bin")
    tokenizers.gpt2_vocab()  # the vocabulary's strings are no part of the corpus
    proc = psutil.Process()
    before = proc.memory_info().rss
    cfg = cfg_for(d, format="nanogpt", vocab_size=50304)
    ds = tokens.load(cfg.data)
    batches = ds.train_batches(cfg, 0)
    for _ in range(50):
        next(batches)
    assert len(ds.train) == n and ds.train.max_id() == 7  # read whole, in chunks, and let go
    assert proc.memory_info().rss - before < 16 * 2**20


def test_bad_corpora_are_one_line_with_exit_2_and_nothing_written(tmp_path, capsys):
    d = llmc_dir(tmp_path, [np.arange(100)], np.arange(50))
    small = tmp_path / "small"
    small.mkdir()
    np.arange(100, dtype=np.uint16).tofile(small / "train.bin")
    np.arange(50, dtype=np.uint16).tofile(small / "val.bin")
    with open(small / "meta.pkl", "wb") as f:
        pickle.dump({"vocab_size": 20, "itos": {i: chr(65 + i) for i in range(20)}}, f)
    cut = tmp_path / "cut"
    cut.mkdir()
    shards.write_shard(cut / "train_000000.bin", np.arange(100, dtype=np.uint16))
    shards.write_shard(cut / "val_000000.bin", np.arange(30, dtype=np.uint16))
    entry = lambda f, n: {"tokens": n, "documents": 1, "max_id": 99, "shards": [{"file": f, "tokens": n, "sha256": ""}]}
    manifest = {
        "format": "jaxnet-corpus/1", "settings": {}, "tokenizer": {"name": "byte", "vocab_size": 257, "eot_id": 256},
        "splits": {"train": entry("train_000000.bin", 90), "val": entry("val_000000.bin", 30),
                   "test": {"tokens": 0, "documents": 0, "max_id": None, "shards": []}},
    }  # fmt: skip
    (cut / "corpus.json").write_text(json.dumps(manifest))
    cases = {
        "beyond the 20 ids of its tokenizer": [f"data.path={small}", "data.vocab_size=0"],
        "corpus.json says 90": [f"data.path={cut}"],
        "smaller than the vocabulary": [f"data.path={d}", "data.vocab_size=1000"],
        "no corpus.json": [f"data.path={tmp_path}"],
    }
    for i, (message, overrides) in enumerate(cases.items()):
        work = tmp_path / f"run{i}"
        assert cli.main(["train", "gpt2_shakespeare:smoke", *overrides, "--workdir", str(work)]) == 2
        err = capsys.readouterr().err.strip()
        assert message in err and err.startswith("jaxnet: error:") and "\n" not in err, err
        assert not work.exists()


@pytest.mark.slow  # two runs with a 50,304-token softmax: 20 s alone, minutes on a loaded 2-core machine
def test_train_on_tokens_then_resume_on_another_tokenizer_is_refused(tmp_path, capsys):
    d = llmc_dir(tmp_path, [np.arange(300) % 50257], np.arange(60))
    work = tmp_path / "run"
    base = ["train", "gpt2_shakespeare:smoke", "train.steps=2", "train.eval_every=0", "train.checkpoint_every=0",
            "optim.warmup_steps=1", "train.log_every=1", "--workdir", str(work)]  # fmt: skip
    assert cli.main([*base, f"data.path={d}"]) == 0
    saved = json.loads((work / "vocab.json").read_text())
    assert saved["tokenizer"] == "gpt2" and len(saved["vocab"]) == 50304
    chars = tmp_path / "chars"
    chars.mkdir()
    (np.arange(300) % 20).astype(np.uint16).tofile(chars / "train.bin")
    np.arange(20, dtype=np.uint16).tofile(chars / "val.bin")
    with open(chars / "meta.pkl", "wb") as f:
        pickle.dump({"vocab_size": 20, "itos": {i: chr(65 + i) for i in range(20)}}, f)
    before = {p: p.stat().st_mtime_ns for p in work.rglob("*")}
    capsys.readouterr()
    assert cli.main([*base, "train.steps=4", f"data.path={chars}"]) == 2
    err = capsys.readouterr().err.strip()
    assert "vocabulary does not match" in err and "\n" not in err
    assert {p: p.stat().st_mtime_ns for p in work.rglob("*")} == before


def test_open_shard_rejects_what_is_not_a_shard(tmp_path):
    p = tmp_path / "x.bin"
    np.zeros(300, np.int32).tofile(p)
    with pytest.raises(UserError, match="not an llm.c token shard"):
        shards.open_shard(p)


def test_windows_read_rows_across_shards_with_few_files_open(tmp_path, monkeypatch):
    """Rows read with pread equal numpy's slices of the concatenated ids, across several shard
    boundaries, with uint16 and uint32 shards, while at most OPEN_FILES files stay open."""
    monkeypatch.setattr(shards, "OPEN_FILES", 2)
    rng = np.random.default_rng(3)
    parts = [rng.integers(0, 60000, n).astype(np.uint16) for n in (3, 1, 7, 2)] + [
        rng.integers(70000, 100000, 10).astype(np.uint32)
    ]
    for i, part in enumerate(parts):
        shards.write_shard(tmp_path / f"train_{i:06d}.bin", part)
    t = shards.ShardedTokens([shards.open_shard(tmp_path / f"train_{i:06d}.bin") for i in range(len(parts))])
    whole = np.concatenate([p.astype(np.int64) for p in parts])
    starts = np.arange(len(whole) - 6 + 1)[::-1]  # every start, last first: each file opened again
    got = t.windows(starts, 6)
    assert got.dtype == np.int32 and got.shape == (len(starts), 6)
    np.testing.assert_array_equal(got, whole[starts[:, None] + np.arange(6)])
    assert len(t._fds) <= 2
    with pytest.raises(IndexError):
        t.windows(np.array([len(whole) - 5]), 6)


def _tree(path):
    """Every file under ``path`` with its size and modification time (what a refusal must not change)."""
    return {p: (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(path.rglob("*"))} if path.exists() else None


def test_a_given_data_path_that_is_not_a_corpus_is_one_line_exit_2_and_nothing_is_prepared(tmp_path, capsys):
    unfinished = tmp_path / "unfinished"
    unfinished.mkdir()
    (unfinished / "prepare-progress.json").write_text(json.dumps({"settings": {"source": "other"}}))
    empty = tmp_path / "empty"
    empty.mkdir()
    cases = {
        "missing": ([f"data.path={tmp_path / 'no-such-corpus'}"], "does not exist"),
        "missing, nanogpt": ([f"data.path={tmp_path / 'no-such-nanogpt'}", "data.format=nanogpt"], "does not exist"),
        "not a corpus, nanogpt": ([f"data.path={empty}", "data.format=nanogpt"], "train.bin is missing"),
        "unfinished": ([f"data.path={unfinished}"], "unfinished jaxnet prepare"),
    }
    for i, (overrides, message) in enumerate(cases.values()):
        before = {p: _tree(p) for p in (tmp_path / "no-such-corpus", tmp_path / "no-such-nanogpt", empty, unfinished)}
        work = tmp_path / f"run{i}"
        assert cli.main(["train", "gpt2_shakespeare:smoke", *overrides, "--workdir", str(work)]) == 2
        out, err = capsys.readouterr()
        assert message in err and err.startswith("jaxnet: error:") and err.count("\n") == 1, err
        assert "preparing" not in out + err
        assert {p: _tree(p) for p in before} == before and not work.exists()


def test_only_the_experiments_own_default_corpus_is_prepared_on_first_use_and_it_says_so(tmp_path, monkeypatch):
    src = tmp_path / "src"
    src.mkdir()
    for i in range(5):
        (src / f"doc{i}.txt").write_text(f"document {i}: " + "some words. " * 20)
    monkeypatch.chdir(tmp_path)
    said = []
    cfg = DataConfig(name="tokens", path="corpora/mine")
    scratch = tmp_path / "scratch"  # what jaxnet plan does: the corpus prepared aside, nothing under corpora/
    with tokens.prepared_in(scratch):
        aside = tokens.load_or_prepare(cfg, str(src), "byte", say=said.append, default="corpora/mine")
    assert said == [f"preparing {src} with the byte tokenizer in a temporary directory (not into corpora/mine)"]
    assert (scratch / "mine" / "corpus.json").is_file() and not (tmp_path / "corpora").exists()
    said.clear()
    ds = tokens.load_or_prepare(cfg, str(src), "byte", say=said.append, default="corpora/mine")
    assert np.array_equal(ds.train, aside.train)
    assert said[0] == f"preparing {src} with the byte tokenizer into corpora/mine (once: the experiment's default)"
    assert (tmp_path / "corpora/mine/corpus.json").is_file() and len(ds.train) > 100
    said.clear()
    tokens.load_or_prepare(cfg, str(src), "byte", say=said.append, default="corpora/mine")
    assert said == []  # ready: loaded as it is
    with pytest.raises(UserError, match="does not exist"):
        other = DataConfig(name="tokens", path="corpora/other")
        tokens.load_or_prepare(other, str(src), "byte", default="corpora/mine")
    assert not (tmp_path / "corpora/other").exists()


def test_with_several_processes_process_0_alone_prepares_and_the_others_wait_for_its_corpus_json(tmp_path, monkeypatch):
    import threading

    src = tmp_path / "src"
    src.mkdir()
    for i in range(5):
        (src / f"doc{i}.txt").write_text(f"document {i}: " + "some words. " * 20)
    out = tmp_path / "corpora/mine"
    prepared = []
    real_prepare = tokens.prepare_lib.prepare
    monkeypatch.setattr(tokens.prepare_lib, "prepare", lambda *a, **k: prepared.append(a) or real_prepare(*a, **k))
    monkeypatch.setattr(tokens, "_process", lambda: (1, 2))
    monkeypatch.setattr(tokens, "WAIT_POLL_S", 0.01)
    said = []
    later = threading.Timer(0.3, lambda: real_prepare(str(src), "byte", out, workers=1, progress=False, say=print))
    later.start()  # process 0, elsewhere
    cfg = DataConfig(name="tokens", path=str(out))
    ds = tokens.load_or_prepare(cfg, str(src), "byte", say=said.append, default=str(out))
    later.join()
    assert prepared == [] and len(ds.train) > 100
    assert said == [f"waiting for process 0 to prepare {src} into {out}"]


def test_ids_beyond_the_tokenizers_vocabulary_are_a_damaged_file_even_within_a_padded_vocabulary(tmp_path, capsys):
    for i, largest in enumerate((50300, 60000)):  # GPT-2 ids (no meta.pkl) padded to 50,304, and beyond that
        d = tmp_path / f"nano{i}"
        d.mkdir()
        np.asarray([*range(100), largest], np.uint16).tofile(d / "train.bin")
        np.arange(50, dtype=np.uint16).tofile(d / "val.bin")
        with pytest.raises(UserError) as e:
            tokens.load(cfg_for(d, vocab_size=50304).data)
        assert str(e.value) == (
            f"the train split of nano{i} holds token id {largest}, beyond the 50,257 ids of its tokenizer (gpt2): "
            f"{d / 'train.bin'} is damaged or was written with another tokenizer"
        )
    chars = tmp_path / "chars"
    chars.mkdir()
    np.asarray([0, 1, 2, 25], np.uint16).tofile(chars / "train.bin")
    np.arange(3, dtype=np.uint16).tofile(chars / "val.bin")
    with open(chars / "meta.pkl", "wb") as f:
        pickle.dump({"vocab_size": 20, "itos": {i: chr(65 + i) for i in range(20)}}, f)
    with pytest.raises(UserError, match="holds token id 25, beyond the 20 ids of its tokenizer"):
        tokens.load(cfg_for(chars, vocab_size=32).data)

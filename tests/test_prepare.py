"""jaxnet prepare: llm.c's shard layout read back with plain numpy, documents held out whole,
atomic shard writes, resume after a kill, slices and their merge, bad input."""

from __future__ import annotations

import gzip
import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
from conftest import patient, run_patiently

from jaxnet import cli
from jaxnet.data import prepare as prep
from jaxnet.data import shards, tokenizers
from jaxnet.errors import UserError

DOCS = [
    "First document. Ünïcödé café — 東京 🙂\n",
    "Second: the quick brown fox jumps over the lazy dog.\n" * 3,
    "Third document has <|endoftext|> written in it, as plain text.",
    "Fourth, a longer one. " * 20,
    "Fifth: numbers 123 456 and it's fine.",
    "Sixth document.\n\nWith paragraphs.\n",
    "Seventh and last of the text files.",
]
JSONL = ["eighth from jsonl", "ninth from jsonl: ½ ¾", "tenth"]


def corpus_dir(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for i, d in enumerate(DOCS):
        (src / f"doc{i}.txt").write_text(d, encoding="utf-8")
    with gzip.open(src / "more.jsonl.gz", "wt", encoding="utf-8") as f:
        for t in JSONL:
            f.write(json.dumps({"text": t, "id": 1}) + "\n\n")
    return src


def read_llmc(path):
    """A shard as llm.c's dataloader reads it: 256 int32 header, then uint16 tokens."""
    raw = path.read_bytes()
    header = np.frombuffer(raw[:1024], np.int32)
    assert header[0] == 20240520 and header[1] == 1
    tokens = np.frombuffer(raw[1024:], np.uint16)
    assert len(tokens) == header[2]
    return tokens


def split_stream(out, split):
    manifest = json.loads((out / "corpus.json").read_text())
    parts = [read_llmc(out / s["file"]) for s in manifest["splits"][split]["shards"]]
    return np.concatenate(parts) if parts else np.zeros(0, np.uint16)


def expected(split_of, texts, split):
    ids = []
    for s, t in zip(split_of, texts, strict=True):
        if s == split:
            ids += [tokenizers.EOT_ID, *tokenizers.encode(t)]
    return np.asarray(ids, np.uint16)


def test_prepare_writes_llmc_shards_of_each_whole_document_held_out_by_document(tmp_path):
    src = corpus_dir(tmp_path)
    out = tmp_path / "out"
    kw = dict(workers=1, shard_tokens=40, val_fraction=0.1, test_fraction=0.1, progress=False, say=lambda _: None)
    m = prep.prepare(str(src), "gpt2", out, **kw)
    texts = [*DOCS, *JSONL]  # files in name order: doc*.txt, then more.jsonl.gz
    split_of = prep.assign_splits(len(texts), 0.1, 0.1)
    assert split_of.count("val") == 1 and split_of.count("test") == 1
    for split in ("train", "val", "test"):
        np.testing.assert_array_equal(split_stream(out, split), expected(split_of, texts, split))
        assert m["splits"][split]["documents"] == split_of.count(split)
    train = m["splits"]["train"]
    assert [s["tokens"] for s in train["shards"][:-1]] == [40] * (len(train["shards"]) - 1)  # exact shard size
    for s in train["shards"]:
        assert s["sha256"] == hashlib.sha256((out / s["file"]).read_bytes()).hexdigest()
    assert m["tokenizer"]["files"] == tokenizers.FILE_SHA256 and m["eot_id"] == 50256 and m["vocab_size"] == 50257
    assert train["max_id"] == int(split_stream(out, "train").max())
    assert not list(out.glob("*.partial")) and not list(out.glob("prepare-progress*"))


@pytest.mark.parametrize("tokenizer", ["gpt2", "char", "byte"])
def test_prepare_with_two_workers_writes_the_same_bytes(tmp_path, monkeypatch, tokenizer):
    src = corpus_dir(tmp_path)
    monkeypatch.setattr(prep, "TASK_DOCS", 2)  # many tasks, finishing out of order
    kw = dict(shard_tokens=50, progress=False, say=lambda _: None, val_fraction=0.1, test_fraction=0.1)
    prep.prepare(str(src), tokenizer, tmp_path / "one", workers=1, **kw)
    prep.prepare(str(src), tokenizer, tmp_path / "two", workers=2, **kw)
    files = sorted(p.name for p in (tmp_path / "one").iterdir())
    assert files == sorted(p.name for p in (tmp_path / "two").iterdir())
    for f in files:
        assert (tmp_path / "one" / f).read_bytes() == (tmp_path / "two" / f).read_bytes(), f


def test_the_default_worker_count_takes_no_more_cores_than_other_work_leaves_idle_and_says_so(tmp_path, monkeypatch):
    import os

    from jaxnet.tokenizers import workers

    probe = workers.Probe()
    busy, how = probe.others(os.cpu_count())
    assert 0 <= busy <= os.cpu_count() + 0.5 and how.startswith("over the last ")  # this machine's /proc/stat
    monkeypatch.setattr(workers.Probe, "others", lambda self, cores: (self.busy, "over the last 0.4 s"))
    for busy, cores, most, count in ((0.3, 2, 2, 2), (0.9, 2, 2, 2), (1.2, 2, 2, 1), (7.0, 2, 2, 1), (3.5, 16, 16, 13)):
        probe.busy = busy
        assert workers.default_workers(most, probe, cores)[0] == count, (busy, cores, most)
    probe.busy = 1.94
    assert workers.default_workers(2, probe, 2) == (
        1,
        "1 worker, not 2: other work kept 1.9 of the 2 cores busy (over the last 0.4 s), and on busy cores more "
        "workers only share them (--workers 2 starts them anyway)",
    )
    assert workers.default_workers(1, probe, 2) == (1, "")  # nothing to lower: not said
    src = corpus_dir(tmp_path)
    monkeypatch.setattr(prep, "BYTES_PER_WORKER", 1)  # the text alone would allow a worker per core
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    kw = dict(shard_tokens=50, progress=False, val_fraction=0.1, test_fraction=0.1)
    for busy, count in ((1.94, 1), (0.2, 2)):
        monkeypatch.setattr(workers.Probe, "busy", busy, raising=False)
        said: list[str] = []
        m = prep.prepare(str(src), "byte", tmp_path / f"at-{busy}", say=said.append, **kw)
        assert m["workers"] == count and said[-1].endswith(f"with {count} worker(s))"), said
        assert ("other work kept 1.9 of the 2 cores busy" in said[0]) == (count == 1), said
    for f in sorted(p.name for p in (tmp_path / "at-1.94").iterdir()):  # the same ids either way
        assert (tmp_path / "at-1.94" / f).read_bytes() == (tmp_path / "at-0.2" / f).read_bytes(), f


def test_in_order_has_this_process_encode_while_the_pools_workers_are_full():
    """The parent encodes a task whenever the pool's workers hold two each, the results come back in
    the tasks' order whoever made them, and the source is read at most ``ahead`` tasks ahead."""
    import threading
    import time
    from concurrent.futures import ThreadPoolExecutor

    read, yielded, makers, gate = [], [], [], threading.Event()

    def tasks():
        for i in range(12):
            assert len(read) - len(yielded) <= 4, "read more than ahead tasks ahead of what was yielded"
            read.append(i)
            yield i

    def there(i):
        gate.wait(5)  # the first worker tasks stay in hand until the parent has done one itself
        time.sleep(0.005)
        return ("there", i)

    def here(i):
        gate.set()
        return ("here", i)

    with ThreadPoolExecutor(1) as pool:
        for task, result in prep.in_order(pool, tasks(), lambda i: (i,), here, there, 4, "died"):
            yielded.append(task)
            makers.append(result[0])
            assert result[1] == task
    assert yielded == read == list(range(12))
    assert makers[:3] == ["there", "there", "here"]  # two in the worker's hand, the third done here
    assert makers.count("there") >= 2 and makers.count("here") >= 1


class _SlowToUnpickle:
    """Unpickled by calling ``time.sleep(0.6)``: a worker slow to read its start-up arguments."""

    def __reduce__(self):
        import time

        return (time.sleep, (0.6,))


# In a worker: what it imported of JAX, flax and jaxnet.data, and its BLAS threads (the task is the
# builtin eval, which a worker unpickles without importing anything of the tests).
WORKER_STATE = (
    "([m for m in __import__('sys').modules if m.split('.')[0] in ('jax', 'jaxlib', 'flax') "
    "or m.startswith('jaxnet.data')], __import__('os').environ.get('OPENBLAS_NUM_THREADS'))"
)


def test_a_worker_reads_its_tokenizer_from_a_file_and_imports_nothing_of_jax():
    """The first task is handed over at once though the worker takes 0.6 s to read its arguments
    (through the pipe a spawned process starts from, this process waited until the child had read
    them all: 0.1 s for GPT-2's encoding, time it could encode in); a prepare worker holds one BLAS
    thread, has imported nothing of JAX or jaxnet.data, and encodes as this process does."""
    import time

    from jaxnet import tokenizers as toks
    from jaxnet.tokenizers import base, workers

    filler = b"x" * (1 << 20)  # past a pipe's 64 KiB: a writer waits for its reader
    with workers.worker_pool(1, slice, (_SlowToUnpickle(), filler)) as pool:  # slice: any two arguments
        started = time.perf_counter()
        first = pool.submit(eval, "1 + 1")
        handed = time.perf_counter() - started
        assert first.result(timeout=patient(60)) == 2
    assert handed < 0.3, f"the first task waited {handed:.2f} s for the worker to read its arguments"
    gpt2 = toks.get("gpt2", "--tokenizer")
    texts = ["Hello world", DOCS[0], DOCS[2]]
    with workers.worker_pool(1, base.worker_init, (gpt2,)) as pool:
        assert pool.submit(eval, WORKER_STATE).result(timeout=patient(60)) == ([], "1")
        block, sizes = pool.submit(base.worker_encode, texts, np.dtype(np.uint16)).result(timeout=patient(60))
    here = gpt2.encode_documents(texts, np.uint16)
    assert block.tolist() == here[0].tolist() and sizes.tolist() == here[1].tolist()


@pytest.mark.parametrize("where", ["in a shard's write", "after a shard, before the progress file"])
def test_a_killed_prepare_continues_to_the_same_shards_and_leaves_no_half_shard_whole(tmp_path, monkeypatch, where):
    src = corpus_dir(tmp_path)
    kw = dict(shard_tokens=30, progress=False, say=lambda _: None, val_fraction=0.1, test_fraction=0.1, workers=1)
    prep.prepare(str(src), "byte", tmp_path / "whole", **kw)
    out = tmp_path / "killed"
    real_write, real_json = shards.atomic_write, prep.write_json
    calls = {"n": 0}

    def dying_write(path, write):
        calls["n"] += str(path).endswith(".bin")  # shards only
        if calls["n"] == 4 and where == "in a shard's write":  # dies with the file half written

            def half(f):
                f.write(b"\0" * 1024 + b"\1" * 7)
                raise KeyboardInterrupt

            return real_write(path, half)
        return real_write(path, write)

    def dying_json(path, record):
        if where != "in a shard's write" and calls["n"] == 4:
            raise KeyboardInterrupt
        return real_json(path, record)

    monkeypatch.setattr(shards, "atomic_write", dying_write)
    monkeypatch.setattr(prep, "write_json", dying_json)
    with pytest.raises(KeyboardInterrupt):
        prep.prepare(str(src), "byte", out, **kw)
    assert not (out / "corpus.json").exists()
    progress = json.loads((out / "prepare-progress.json").read_text())
    assert sum(len(s["shards"]) for s in progress["splits"].values()) == 3  # three whole shards recorded
    if where == "in a shard's write":
        (partial,) = out.glob("*.bin.partial")
        assert not partial.with_name(partial.name.removesuffix(".partial")).exists()
    # A loader refuses the unfinished directory in one line.
    from jaxnet.config import DataConfig
    from jaxnet.data import tokens

    with pytest.raises(UserError, match="unfinished jaxnet prepare"):
        tokens.load(DataConfig(name="tokens", path=str(out)))
    monkeypatch.undo()
    prep.prepare(str(src), "byte", out, **kw)
    names = sorted(p.name for p in (tmp_path / "whole").iterdir())
    assert names == sorted(p.name for p in out.iterdir())
    for f in names:
        if f.endswith(".bin"):
            assert (out / f).read_bytes() == (tmp_path / "whole" / f).read_bytes(), f
    a, b = (json.loads((d / "corpus.json").read_text()) for d in (out, tmp_path / "whole"))
    assert a["splits"] == b["splits"]


def test_a_shard_written_from_pieces_is_the_shard_of_their_concatenation(tmp_path):
    pieces = [np.arange(5, dtype=np.uint32), np.zeros(0, np.uint32), np.arange(70_000, 70_003, dtype=np.uint32)]
    a = shards.write_shard(tmp_path / "a.bin", pieces)
    b = shards.write_shard(tmp_path / "b.bin", np.concatenate(pieces))
    data = (tmp_path / "a.bin").read_bytes()
    assert a == b == hashlib.sha256(data).hexdigest() and data == (tmp_path / "b.bin").read_bytes()
    assert np.frombuffer(data[:12], "<i4").tolist() == [20240801, 7, 8] and len(data) == 1024 + 8 * 4
    with pytest.raises(ValueError, match="all alike"):
        shards.write_shard(tmp_path / "c.bin", [np.arange(2, dtype=np.uint16), np.arange(2, dtype=np.uint32)])


def test_the_heap_is_frozen_for_a_prepare_and_a_callers_freeze_is_kept():
    import gc

    assert gc.get_freeze_count() == 0
    with prep.frozen_heap():
        assert gc.get_freeze_count() > 0
    assert gc.get_freeze_count() == 0
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        with prep.frozen_heap():
            pass
        # still frozen (an unfreeze would leave 0) and not frozen again on top (more): a frozen
        # object that another thread frees meanwhile leaves the count, so not always equal
        assert 0 < gc.get_freeze_count() <= frozen
    finally:
        gc.unfreeze()


def test_a_cut_shard_is_refused_by_its_header_and_by_the_manifest(tmp_path):
    path = tmp_path / "x_train_000000.bin"
    shards.write_shard(path, np.arange(100, dtype=np.uint16))
    assert shards.open_shard(path).count == 100
    with pytest.raises(UserError, match="manifest|corpus.json says 99"):
        shards.open_shard(path, expected_tokens=99)
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(UserError, match="holds 95 tokens but its header says 100"):
        shards.open_shard(path)


def test_slices_prepared_apart_merge_into_the_whole_corpus(tmp_path):
    src = corpus_dir(tmp_path)
    kw = dict(shard_tokens=1000, progress=False, say=lambda _: None, val_fraction=0.1, test_fraction=0.1, workers=1)
    prep.prepare(str(src), "gpt2", tmp_path / "whole", **kw)
    out = tmp_path / "sliced"
    for i in range(3):
        prep.prepare(str(src), "gpt2", out, shard=(i, 3), **kw)
    with pytest.raises(UserError):
        prep.merge(tmp_path / "whole")
    m = prep.merge(out, say=lambda _: None)
    whole = json.loads((tmp_path / "whole" / "corpus.json").read_text())
    for split in ("train", "val", "test"):
        np.testing.assert_array_equal(split_stream(out, split), split_stream(tmp_path / "whole", split))
        assert m["splits"][split]["documents"] == whole["splits"][split]["documents"]


def test_prepare_bad_input_is_one_line_and_exit_2(tmp_path, capsys):
    (tmp_path / "bad.jsonl").write_text('{"body": "no text field"}\n')
    (tmp_path / "one.txt").write_text("only one document")
    cases = [
        ["prepare", str(tmp_path / "nothing*"), "--out", str(tmp_path / "o1")],
        ["prepare", str(tmp_path / "bad.jsonl"), "--out", str(tmp_path / "o2")],
        ["prepare", str(tmp_path / "one.txt"), "--out", str(tmp_path / "o3")],
        ["prepare", "shakespeare", "--out", str(tmp_path / "o4"), "--shard", "3/2"],
        ["prepare", "--merge", "--out", str(tmp_path)],
    ]
    for argv in cases:
        assert cli.main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("jaxnet: error:") and "\n" not in err, err
    assert not (tmp_path / "o2" / "corpus.json").exists()
    for bad in ['{"text": "two"} {"text": "values"}', '["text"]', '{"text": 3}', "{text: 1}"]:
        (tmp_path / "rows.jsonl").write_text('{"text": "fine"}\n\n' + bad + "\n")  # refused as json.loads would
        with pytest.raises(UserError, match="rows.jsonl:3 is not a JSON object with a string field 'text'"):
            list(prep.Source(str(tmp_path / "rows.jsonl")).texts(0))


# ---------------------------------------------------------------------------------------------
# One text file: cut at paragraph ends


def reference_pieces(data: bytes, size: int) -> list[bytes]:
    """The cutting rule written over the whole file at once: a piece ends after the first blank
    line at or after ``size`` bytes, else after the first line end, else at ``2 * size`` bytes
    moved back to the start of a UTF-8 character."""
    pieces, pos = [], 0
    while pos < len(data):
        rest = data[pos:]
        if len(rest) <= size:
            end = len(rest)
        else:
            blank, line = rest.find(b"\n\n", size - 2), rest.find(b"\n", size - 1)
            if blank != -1 and blank + 2 <= 2 * size:
                end = blank + 2
            elif line != -1 and line + 1 <= 2 * size:
                end = line + 1
            elif len(rest) <= 2 * size:
                end = len(rest)
            else:
                end = 2 * size
                while rest[end] & 0xC0 == 0x80:
                    end -= 1
        pieces.append(rest[:end])
        pos += end
    return pieces


def input_txt(tmp_path, chars=200_000):
    """nanoGPT's input.txt road: one file of the shipped Shakespeare, paragraphs between speeches."""
    from jaxnet.data import text

    body = "".join(t for _, t in text.shakespeare_works())[:chars] + "Ünïcödé end 東京.\n"
    path = tmp_path / "input.txt"
    path.write_text(body, encoding="utf-8")
    return path


@pytest.mark.parametrize("tokenizer", ["gpt2", "byte"])
def test_one_text_file_is_cut_at_paragraph_ends_and_each_piece_keeps_the_ids_it_has_alone(
    tmp_path, monkeypatch, tokenizer
):
    path = input_txt(tmp_path)
    from jaxnet.data import sources

    monkeypatch.setattr(sources, "READ_BLOCK", 5000)  # cuts found across the blocks the file is read in
    kw = dict(cut_bytes=8192, shard_tokens=20_000, progress=False, say=lambda _: None, val_fraction=0.05)
    m = prep.prepare(str(path), tokenizer, tmp_path / "one", workers=1, **kw)
    pieces = reference_pieces(path.read_bytes(), 8192)
    assert b"".join(pieces) == path.read_bytes() and all(p.endswith(b"\n\n") for p in pieces[:-1])
    assert m["settings"]["cut"]["bytes"] == 8192 and m["settings"]["documents"] == len(pieces) > 20
    split_of = prep.assign_splits(len(pieces), 0.05, 0.01)
    for split in ("train", "val", "test"):
        want = []
        for s, piece in zip(split_of, pieces, strict=True):
            if s == split:  # each piece alone: the end-of-text id, then its ids
                ids = tokenizers.encode(piece.decode()) if tokenizer == "gpt2" else list(piece)
                want += [m["eot_id"], *ids]
        np.testing.assert_array_equal(split_stream(tmp_path / "one", split), want)
        assert m["splits"][split]["documents"] == split_of.count(split)
    prep.prepare(str(path), tokenizer, tmp_path / "two", workers=2, **kw)  # the pieces spread over workers
    for f in sorted(p.name for p in (tmp_path / "one").iterdir()):
        assert (tmp_path / "one" / f).read_bytes() == (tmp_path / "two" / f).read_bytes(), f


def test_a_file_without_line_ends_is_cut_between_characters(tmp_path):
    from jaxnet.data import sources

    body = ("東京 🙂 é" * 3000).encode()  # multi-byte characters, no line end at all
    (tmp_path / "long.txt").write_bytes(body)
    offsets = sources.cut_offsets(tmp_path / "long.txt", 1000)
    pieces = [body[a:b] for a, b in zip(offsets[:-1], offsets[1:], strict=True)]
    assert pieces == reference_pieces(body, 1000) and b"".join(pieces) == body
    assert all(len(p) <= 2000 for p in pieces) and "".join(p.decode() for p in pieces) == body.decode()


def test_too_little_text_to_cut_is_one_line_naming_the_pieces(tmp_path, capsys):
    (tmp_path / "small.txt").write_text("a paragraph.\n\nanother one.\n\nand a third.\n")
    assert cli.main(["prepare", str(tmp_path / "small.txt"), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "1 document(s), and cut at paragraph ends into pieces of about 65,536 bytes it gives 1" in err
    assert err.count("\n") == 1 and not (tmp_path / "o").exists()
    assert cli.main(["prepare", str(tmp_path / "small.txt"), "--out", str(tmp_path / "o"), "--cut-bytes", "8"]) == 0


# ---------------------------------------------------------------------------------------------
# Parquet


def write_parquet(path, texts, row_group_size=2, compression="snappy", **columns):
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({"id": list(range(len(texts))), "text": texts, **columns})
    pq.write_table(table, path, row_group_size=row_group_size, compression=compression)


def test_parquet_files_are_read_row_by_row_in_their_text_column(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    a = [f"row {i}: " + "words and more words. " * (i + 1) for i in range(7)]
    b = ["Ünïcödé parquet row", "last row"]
    write_parquet(src / "a.parquet", a, row_group_size=3)
    write_parquet(src / "b.parquet", b, body=["other column", "x"])
    with gzip.open(src / "c.jsonl.gz", "wt", encoding="utf-8") as f:
        f.write(json.dumps({"text": "from jsonl"}) + "\n")
    out = tmp_path / "out"
    m = prep.prepare(str(src), "gpt2", out, val_fraction=0.1, test_fraction=0.1, progress=False, say=lambda _: None)
    texts = [*a, *b, "from jsonl"]
    assert m["settings"]["documents"] == len(texts) and "cut" not in m["settings"]
    split_of = prep.assign_splits(len(texts), 0.1, 0.1)
    for split in ("train", "val", "test"):
        np.testing.assert_array_equal(split_stream(out, split), expected(split_of, texts, split))
    write_parquet(src / "b.parquet", ["a", "b", "c"], body=["first body", "second", "third"])
    m2 = prep.prepare(str(src / "b.parquet"), "byte", tmp_path / "body", text_field="body", progress=False,
                      say=lambda _: None, val_fraction=0.25, test_fraction=0.25)  # fmt: skip
    got = np.concatenate([split_stream(tmp_path / "body", s) for s in ("train", "val", "test")])
    assert sorted(bytes(got[got != 256].astype(np.uint8)).decode()) == sorted("first bodysecondthird")
    assert m2["settings"]["text_field"] == "body" and (got == 256).sum() == 3


def test_bad_parquet_is_one_line_and_exit_2(tmp_path, capsys):
    import pyarrow as pa
    import pyarrow.parquet as pq

    write_parquet(tmp_path / "ok.parquet", ["a", "b", "c", "d"])
    pq.write_table(pa.table({"text": [1, 2, 3, 4]}), tmp_path / "numbers.parquet")
    pq.write_table(pa.table({"text": ["a", None, "c", "d"]}), tmp_path / "holes.parquet")
    (tmp_path / "junk.parquet").write_bytes(b"not parquet at all")
    cases = {
        (str(tmp_path / "ok.parquet"), "--text-field", "body"): "has no column 'body' (its columns: id, text)",
        (str(tmp_path / "numbers.parquet"),): "column 'text' holds int64, not text",
        (str(tmp_path / "holes.parquet"),): "row group 0 has 1 row(s) with no text in column 'text'",
        (str(tmp_path / "junk.parquet"),): "cannot read",
    }
    for i, (args, message) in enumerate(cases.items()):
        out = tmp_path / f"o{i}"
        assert cli.main(["prepare", *args, "--out", str(out), "--val-fraction", "0.25", "--test-fraction", "0.25"]) == 2
        err = capsys.readouterr().err
        assert message in err and err.startswith("jaxnet: error:") and err.count("\n") == 1, err
        assert not (out / "corpus.json").exists()


def test_reading_parquet_holds_a_row_group_not_the_file(tmp_path):
    """Arrow's memory pool in a fresh process that reads every row of a file of 40 row groups,
    then of one 4 times as long: its peak does not grow with the file. (Holding the files would
    take 8 and 32 MB; the peaks measured 0.9 and 0.9-1.3 MB: the pool's own rounding moves by a
    few hundred kB from run to run.)"""
    import sys

    texts = [f"row {i} " + "x" * 20_000 for i in range(400)]
    write_parquet(tmp_path / "one.parquet", texts, row_group_size=10, compression="none")
    write_parquet(tmp_path / "four.parquet", texts * 4, row_group_size=10, compression="none")
    script = f"""
import os, pyarrow as pa
from jaxnet.data.sources import Source
for name in ("one", "four"):
    n = sum(len(t) for t in Source("{tmp_path}/" + name + ".parquet").texts(0))
    print(n, os.path.getsize("{tmp_path}/" + name + ".parquet"), pa.default_memory_pool().max_memory())
"""
    result = run_patiently([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    (chars1, size1, peak1), (chars4, size4, peak4) = (map(int, line.split()) for line in result.stdout.splitlines())
    assert chars1 == sum(map(len, texts)) and chars4 == 4 * chars1 and size1 > 8_000_000
    assert peak1 < size1 / 4 and peak4 < size1 / 4 and peak4 <= 2 * peak1, (peak1, peak4, size1)


def test_the_prepare_command_imports_nothing_of_jax(tmp_path):
    """``jaxnet prepare``, with workers or of the shipped works, imports no JAX, optax or flax
    (importing jaxnet.data once cost 0.7 s of them before every prepare)."""
    import sys

    src = corpus_dir(tmp_path)
    argv = ["prepare", str(src), "--tokenizer", "gpt2", "--out", str(tmp_path / "out"), "--workers", "2",
            "--val-fraction", "0.1", "--test-fraction", "0.1", "--quiet"]  # fmt: skip
    shipped = ["prepare", "shakespeare", "--tokenizer", "byte", "--out", str(tmp_path / "works"), "--workers", "1",
               "--quiet"]  # fmt: skip
    code = f"""
import json, sys
sys.path.insert(0, {str(Path(__file__).resolve().parents[1])!r})
if __name__ == "__main__":
    from jaxnet import cli
    import jaxnet.data.chat, jaxnet.data.shards
    status = cli.main({argv!r}) + cli.main({shipped!r})
    print(json.dumps([status, sorted(m for m in sys.modules if m.split(".")[0] in ("jax", "jaxlib", "flax", "optax"))]))
"""
    script = tmp_path / "prepare_only.py"
    script.write_text(code)
    result = run_patiently([sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert json.loads(result.stdout.strip().splitlines()[-1]) == [0, []], result.stderr[-2000:]
    assert (tmp_path / "out" / "corpus.json").exists() and (tmp_path / "works" / "corpus.json").exists()


def test_a_script_without_a_main_guard_gets_one_line_about_the_spawned_workers(tmp_path):
    """Spawned workers import the script that started them: without ``if __name__ == "__main__":``
    each would start a prepare of its own, and Python stops them; the script gets one line."""
    import sys

    corpus_dir(tmp_path)
    script = tmp_path / "unguarded.py"
    script.write_text(f"""
import sys
sys.path.insert(0, {str(Path(__file__).resolve().parents[1])!r})
from jaxnet.data import prepare
from jaxnet.errors import UserError
try:
    prepare.prepare({str(tmp_path / "src")!r}, "byte", {str(tmp_path / "out")!r}, workers=2, progress=False,
                    val_fraction=0.1, test_fraction=0.1)
except UserError as e:
    print("ERROR", e)
""")
    result = run_patiently([sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    last = result.stdout.strip().splitlines()[-1]
    assert last.startswith("ERROR a jaxnet prepare worker process died") and "__main__" in last, result.stdout
    assert not (tmp_path / "out" / "corpus.json").exists()

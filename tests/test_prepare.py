"""jaxnet prepare: llm.c's shard layout read back with plain numpy, documents held out whole,
atomic shard writes, resume after a kill, slices and their merge, bad input."""

from __future__ import annotations

import gzip
import hashlib
import json

import numpy as np
import pytest

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


def test_prepare_with_two_workers_writes_the_same_bytes(tmp_path):
    src = corpus_dir(tmp_path)
    kw = dict(shard_tokens=50, progress=False, say=lambda _: None, val_fraction=0.1, test_fraction=0.1)
    prep.prepare(str(src), "gpt2", tmp_path / "one", workers=1, **kw)
    prep.prepare(str(src), "gpt2", tmp_path / "two", workers=2, **kw)
    files = sorted(p.name for p in (tmp_path / "one").iterdir())
    assert files == sorted(p.name for p in (tmp_path / "two").iterdir())
    for f in files:
        assert (tmp_path / "one" / f).read_bytes() == (tmp_path / "two" / f).read_bytes(), f


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

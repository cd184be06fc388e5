"""``jaxnet prepare chat``: conversations rendered with a checkpoint's chat template into token
shards, with the assistant's tokens marked for the loss.

**Input.** JSONL (``.jsonl``, ``.jsonl.gz``) or Parquet files, a row per conversation, either
``{"messages": [{"role": ..., "content": ...}, ...]}`` (roles ``system``, ``user``, ``assistant``,
``tool``; other keys of a message are handed to the template as they are) or
``{"prompt": ..., "completion": ...}`` (two strings, a user turn and the assistant's reply; or two
lists of messages, the completion's being the assistant's). Every row is checked before anything is
written: a malformed line (by its number), a ``messages`` of the wrong type, an unknown role, or a
file with no assistant turn in any of its conversations is a one-line error.

**Rendering.** The conversations are rendered by the template of ``--tokenizer hf:DIR``
(:mod:`jaxnet.tokenizers.chat`: the ids equal transformers' ``apply_chat_template``), or by a
template given with ``--chat-template FILE``; the assistant's tokens (its replies and each one's
end-of-turn token) come from the template's ``{% generation %}`` blocks, else from rendering the
conversation's prefixes. A conversation without one is kept (it is context nobody trains on: it
counts in no loss) and counted; a corpus in which no token would be trained is refused, and what
was written removed.

**Splits.** ``--val FILE`` and ``--test FILE`` hold conversations out; without them
``val_fraction`` and ``test_fraction`` of the training files' conversations are drawn by a fixed
seed (at least one each).

**Layout** (beside the plain corpus's: the same ``corpus.json``, the same token shards). Each
split is a series of shards of whole conversations, each ending at the first conversation
boundary at or after ``shard_tokens`` tokens:
``{split}_{i:06d}.bin``, the token ids in llm.c's layout; ``{split}_{i:06d}.mask``, one byte per
token, 1 where the token is the assistant's; ``{split}_{i:06d}.lengths``, each conversation's
token count (uint32, little-endian). ``corpus.json`` has ``"kind": "chat"`` and a ``chat`` record:
the template's text and sha256, where it came from, how the assistant's tokens were found, and per
split the trained tokens and the conversations without any. Training reads it with
``data.name=tokens`` and packs the conversations into rows (:mod:`jaxnet.data.packing`).

>>> prepare_chat(["chats.jsonl"], "hf:checkpoints/my-llama", "corpora/chats")   # doctest: +SKIP
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from jaxnet import tokenizers
from jaxnet.data import packing as packing_lib
from jaxnet.data import shards as shards_lib
from jaxnet.data.prepare import AHEAD, FORMAT, SPLIT_SEED, SPLITS, frozen_heap, in_order, read_manifest, write_json
from jaxnet.errors import UserError
from jaxnet.tokenizers import chat as chat_lib
from jaxnet.tokenizers.workers import worker_pool

ROLES = ("system", "user", "assistant", "tool")
SUFFIXES = (".jsonl", ".jsonl.gz", ".parquet")
SHARD_TOKENS = 100_000_000
TASK_CONVERSATIONS = 256  # conversations handed to a worker at a time
CONVERSATIONS_PER_WORKER = 10_000  # workers=0: a worker per this many at most (a start: ~0.15 s of a core)
SEQ_LENS = (512, 1024, 2048, 4096)  # the row lengths whose padding prepare reports
PROGRESS = "prepare-progress.json"


# ---------------------------------------------------------------------------------------------
# Reading conversations


def chat_files(source: str, flag: str = "FILE") -> list[str]:
    """The files a FILE argument names: a file, a glob pattern or a directory (its ``.jsonl``,
    ``.jsonl.gz`` and ``.parquet`` files, recursively), sorted."""
    import glob as globlib

    path = Path(source)
    if path.is_dir():
        found = [p for p in path.rglob("*") if p.is_file() and p.name.endswith(SUFFIXES)]
    elif path.is_file():
        found = [path]
    else:
        found = [Path(p) for p in globlib.glob(source, recursive=True) if Path(p).is_file()]
    if not found:
        raise UserError(f"{flag} {source} names no conversations: give .jsonl, .jsonl.gz or .parquet files")
    bad = [p for p in found if not p.name.endswith(SUFFIXES)]
    if bad:
        raise UserError(f"{bad[0]} is not .jsonl, .jsonl.gz or .parquet; conversations are read from those")
    return sorted(str(p) for p in found)


def rows(path: str) -> Iterator[tuple[str, Any]]:
    """``(where, row)`` of each conversation of a file: ``where`` is ``FILE:LINE`` (JSONL) or
    ``FILE row N`` (Parquet); a line that is not JSON is a one-line error naming it."""
    if path.endswith(".parquet"):
        yield from _parquet_rows(path)
        return
    try:
        f = gzip.open(path, "rt", encoding="utf-8") if path.endswith(".gz") else open(path, encoding="utf-8")
    except OSError as e:
        raise UserError(f"cannot read {path}: {e.strerror}") from None
    with f:
        try:
            for number, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    yield f"{path}:{number}", json.loads(line)
                except ValueError as e:
                    raise UserError(f"{path}:{number} is not a line of JSON ({e})") from None
        except (UnicodeDecodeError, EOFError, gzip.BadGzipFile) as e:
            raise UserError(f"cannot read {path}: {e}") from None


def _parquet_rows(path: str) -> Iterator[tuple[str, Any]]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise UserError("reading Parquet needs pyarrow; run `pip install pyarrow`") from None
    try:
        pf = pq.ParquetFile(path)
    except Exception as e:  # noqa: BLE001 - pyarrow's message says what is wrong with the file
        raise UserError(f"cannot read {path} as Parquet: {e}") from None
    names = pf.schema_arrow.names
    columns = ["messages"] if "messages" in names else [c for c in ("prompt", "completion") if c in names]
    if columns != ["messages"] and len(columns) != 2:
        raise UserError(f"{path} has neither a messages column nor prompt and completion (its columns: {names[:8]})")
    row = 0
    for g in range(pf.metadata.num_row_groups):
        for record in pf.read_row_group(g, columns=columns).to_pylist():
            yield f"{path} row {row}", record
            row += 1


def messages_of(row: Any, where: str) -> list[dict[str, Any]]:
    """The messages of a row (module docstring), checked; a one-line error naming ``where``.

    >>> messages_of({"prompt": "Hi", "completion": "Hello"}, "x:1")
    [{'role': 'user', 'content': 'Hi'}, {'role': 'assistant', 'content': 'Hello'}]
    """
    if not isinstance(row, dict):
        what = type(row).__name__
        raise UserError(f"{where} is a JSON {what}, not an object with messages (or prompt and completion)")
    if "messages" in row:
        return _checked(row["messages"], where, "messages")
    if "prompt" in row and "completion" in row:
        prompt, completion = row["prompt"], row["completion"]
        if isinstance(prompt, str) and isinstance(completion, str):
            return [{"role": "user", "content": prompt}, {"role": "assistant", "content": completion}]
        if isinstance(prompt, list) and isinstance(completion, list):
            reply = _checked(completion, where, "completion")
            if any(m["role"] != "assistant" for m in reply):
                raise UserError(f"{where}: the completion's messages must be the assistant's")
            return _checked(prompt, where, "prompt") + reply
        kinds = f"{type(prompt).__name__} and {type(completion).__name__}"
        raise UserError(f"{where}: prompt and completion must be two strings or two lists of messages, not {kinds}")
    raise UserError(f"{where} has neither messages nor prompt and completion; keys: {', '.join(sorted(row)[:8])}")


def _checked(messages: Any, where: str, field: str) -> list[dict[str, Any]]:
    if not isinstance(messages, list) or not messages:
        what = "an empty list" if isinstance(messages, list) else f"a {type(messages).__name__}"
        raise UserError(f'{where}: {field} must be a list of {{"role", "content"}} objects, not {what}')
    for i, m in enumerate(messages, 1):
        if not isinstance(m, dict) or "role" not in m or "content" not in m:
            raise UserError(f'{where}: {field} item {i} is not a {{"role", "content"}} object')
        if m["role"] not in ROLES:
            raise UserError(f"{where}: message {i} has role {m['role']!r}; the roles are {', '.join(ROLES)}")
        if not isinstance(m["content"], str):
            raise UserError(f"{where}: message {i}'s content is a {type(m['content']).__name__}, not text")
    return messages


def survey(path: str) -> tuple[int, int]:
    """Every row of a file checked: its conversations and its assistant turns."""
    conversations = turns = 0
    for where, row in rows(path):
        turns += sum(m["role"] == "assistant" for m in messages_of(row, where))
        conversations += 1
    return conversations, turns


# ---------------------------------------------------------------------------------------------
# Encoding (in this process or in worker processes)

# ---------------------------------------------------------------------------------------------
# Preparing


def _draw(n: int, fractions: dict[str, float], seed: int) -> list[str]:
    """The split of each of ``n`` conversations: of each split in ``fractions`` that fraction (at
    least one) drawn by a fixed permutation, the rest train."""
    counts = {s: max(1, round(f * n)) for s, f in fractions.items()}
    if sum(counts.values()) >= n:
        raise UserError(
            f"{n} conversation(s) cannot give {' and '.join(f'a {s}' for s in counts)} conversation and training "
            "ones; give more, or --val FILE and --test FILE"
        )
    order = np.random.default_rng(seed).permutation(n)
    out, at = ["train"] * n, 0
    for split, count in counts.items():
        for i in order[at : at + count]:
            out[i] = split
        at += count
    return out


def prepare_chat(
    files: Sequence[str],
    tokenizer: str,
    out: str | os.PathLike,
    *,
    val: str | None = None,
    test: str | None = None,
    chat_template: str | None = None,
    val_fraction: float = 0.01,
    test_fraction: float = 0.01,
    seed: int = SPLIT_SEED,
    shard_tokens: int = SHARD_TOKENS,
    workers: int = 0,
    seq_lens: Sequence[int] = SEQ_LENS,
    progress: bool = True,
    say: Any = print,
) -> dict[str, Any]:
    """Render, tokenize and write the conversations of ``files`` (see the module docstring);
    returns the manifest. Run again after a kill, it continues; after it finished, it returns the
    manifest it wrote. ``workers`` processes render and tokenize (1: this process alone; 0: one per
    core, but no more than one per 10,000 conversations).

    >>> prepare_chat(["chats.jsonl"], "hf:ckpt", "corpora/chats", val="held_out.jsonl")  # doctest: +SKIP
    """
    if tokenizers.kind_of(tokenizer, "--tokenizer", tokenizers.PREPARE_CHOICES).kind != "hf":
        raise UserError(
            f"jaxnet prepare chat needs --tokenizer hf:DIR (the checkpoint whose chat template renders the "
            f"conversations), not {tokenizer}"
        )
    tok = tokenizers.get(tokenizer, "--tokenizer")
    tok.check_model()
    template = chat_lib.load(tok.directory, chat_template)
    if shard_tokens < 1:
        raise UserError(f"--shard-tokens {shard_tokens}: give a positive number")
    for name, f in (("--val-fraction", val_fraction), ("--test-fraction", test_fraction)):
        if not 0 < f < 0.5:
            raise UserError(f"{name} {f}: give a fraction in (0, 0.5)")
    if not files:
        raise UserError("jaxnet prepare chat needs FILE...: .jsonl, .jsonl.gz or .parquet files of conversations")
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} is a file; give a directory")
    pool_files = [f for source in files for f in chat_files(source)]
    fixed = {s: chat_files(v, f"--{s}") for s, v in (("val", val), ("test", test)) if v}
    every = pool_files + [f for s in ("val", "test") for f in fixed.get(s, ())]
    counts = {}
    for f in every:  # everything checked before anything is written
        conversations, turns = survey(f)
        if not turns:
            raise UserError(
                f"{f} has no assistant turn in any of its {conversations} conversation(s): nothing in it would be "
                "trained or evaluated; give conversations with the assistant's replies"
            )
        counts[f] = conversations
    pooled = sum(counts[f] for f in pool_files)
    drawn = _draw(pooled, {s: x for s, x in (("val", val_fraction), ("test", test_fraction)) if s not in fixed}, seed)
    settings = {
        "kind": "chat",
        "source": [os.path.abspath(f) for f in pool_files],
        "val": [os.path.abspath(f) for f in fixed.get("val", ())],
        "test": [os.path.abspath(f) for f in fixed.get("test", ())],
        "tokenizer": tok.name,
        "chat_template_sha256": template.sha256,
        "conversations": pooled,
        "val_fraction": val_fraction if "val" not in fixed else None,
        "test_fraction": test_fraction if "test" not in fixed else None,
        "seed": seed,
        "shard_tokens": shard_tokens,
    }
    manifest_path = out / "corpus.json"
    if manifest_path.exists():
        manifest = read_manifest(manifest_path)
        if manifest.get("settings") != settings:
            raise UserError(f"{manifest_path} was prepared from other input or settings; use a fresh --out")
        say(f"already prepared: {manifest_path}")
        return manifest
    progress_path = out / PROGRESS
    empty = lambda: {"shards": [], "done": 0, "trained": 0, "untrained": 0}
    state: dict[str, Any] = {"settings": settings, "splits": {s: empty() for s in SPLITS}}
    if progress_path.exists():
        state = read_manifest(progress_path)
        if state.get("settings") != settings:
            raise UserError(
                f"{out} holds an unfinished prepare of other input or settings ({progress_path.name}); run that "
                "command again to finish it, or use a fresh --out"
            )
        say(f"continuing the prepare in {out}")
    created = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    dtype = shards_lib.token_dtype(tok.vocab_size)

    def conversations() -> Iterator[tuple[str, int, str, list]]:
        """``(split, position in the split, where, messages)`` of each conversation still to encode."""
        position = dict.fromkeys(SPLITS, 0)
        g = 0
        sources = [(f, None) for f in pool_files] + [(f, s) for s in ("val", "test") for f in fixed.get(s, ())]
        for f, split_of_file in sources:
            for where, row in rows(f):
                split = split_of_file or drawn[g]
                g += split_of_file is None
                k = position[split]
                position[split] += 1
                if k >= state["splits"][split]["done"]:
                    yield split, k, where, messages_of(row, where)

    def tasks() -> Iterator[list]:
        batch: list = []
        for item in conversations():
            batch.append(item)
            if len(batch) >= TASK_CONVERSATIONS:
                yield batch
                batch = []
        if batch:
            yield batch

    buffers: dict[str, list] = {s: [] for s in SPLITS}  # (ids, mask, lengths) blocks not yet in a shard
    pending = dict.fromkeys(SPLITS, 0)
    written: list[Path] = []

    def flush(split: str, final: bool) -> None:
        """Write the shards the buffer fills: each ends at the first conversation boundary at or
        after ``shard_tokens`` tokens (so the layout does not depend on how conversations were
        batched), and with ``final`` the rest."""
        while buffers[split] and (pending[split] >= shard_tokens or final):
            st = state["splits"][split]
            ids, mask, lengths = (np.concatenate(parts) for parts in zip(*buffers[split], strict=True))
            ends = np.cumsum(lengths.astype(np.int64))
            k = int(np.searchsorted(ends, shard_tokens)) + 1 if ends[-1] >= shard_tokens else len(lengths)
            n = int(ends[k - 1])
            stem = f"{split}_{len(st['shards']):06d}"
            files = {"tokens": f"{stem}.bin", "mask": f"{stem}.mask", "lengths": f"{stem}.lengths"}
            entry = {"file": files["tokens"], "tokens": n, "conversations": k}
            entry["sha256"] = shards_lib.write_shard(out / files["tokens"], ids[:n])
            for key, array in (("mask", mask[:n]), ("lengths", lengths[:k].astype("<u4"))):
                entry[key] = {"file": files[key], "sha256": _write_flat(out / files[key], array)}
            written.extend(out / f for f in files.values())
            st["shards"].append(entry)
            st["done"] += k
            st["trained"] += int(mask[:n].sum())
            trained = np.concatenate([[0], np.cumsum(mask[:n], dtype=np.int64)])
            st["untrained"] += int(np.sum(trained[ends[:k]] == trained[np.concatenate([[0], ends[: k - 1]])]))
            buffers[split] = [(ids[n:], mask[n:], lengths[k:])] if k < len(lengths) else []
            pending[split] -= n
            write_json(progress_path, state)

    if not workers:
        workers = max(1, min(os.cpu_count() or 1, sum(counts.values()) // CONVERSATIONS_PER_WORKER))
    bar = _progress_bar(progress)
    started, total = time.perf_counter(), 0
    # this process renders and tokenizes too (prepare.in_order)
    initargs = (tok, template.source, template.variables, template.origin)
    with worker_pool(workers - 1, chat_lib.worker_init, initargs) as pool, frozen_heap():
        try:
            for batch, (ids, mask, lengths) in _in_order(pool, tok, template, tasks(), dtype, AHEAD * max(1, workers)):
                ends = np.cumsum(lengths.astype(np.int64))
                first = 0
                for last in range(1, len(batch) + 1):  # each run of one split's conversations
                    if last < len(batch) and batch[last][0] == batch[first][0]:
                        continue
                    split = batch[first][0]
                    a, b = (int(ends[first - 1]) if first else 0), int(ends[last - 1])
                    buffers[split].append((ids[a:b], mask[a:b], lengths[first:last]))
                    pending[split] += b - a
                    first = last
                    flush(split, final=False)
                total += len(ids)
                bar.update(len(ids))
            if pool is not None:  # every task is done: the workers exit while the last shards are written
                pool.shutdown(wait=False)
            for split in SPLITS:
                flush(split, final=True)
        except BaseException:
            bar.leave = False
            raise
        finally:
            bar.close()
    trained = {s: state["splits"][s]["trained"] for s in SPLITS}
    if not trained["train"]:
        for f in written:
            f.unlink(missing_ok=True)
        progress_path.unlink(missing_ok=True)
        if created and not any(out.iterdir()):
            out.rmdir()
        raise UserError(
            f"{template.origin} marks no token of the training conversations as the assistant's: nothing would be "
            "trained; check that the conversations have the assistant's replies, or give a template with "
            "{% generation %} blocks (--chat-template FILE)"
        )
    manifest = _manifest(out, settings, state, tok, template, dtype)
    lengths = _lengths(out, manifest["splits"]["train"])
    manifest["chat"]["packing"] = packing_lib.padding_table(lengths, tuple(seq_lens))
    write_json(manifest_path, manifest)
    progress_path.unlink(missing_ok=True)
    seconds = time.perf_counter() - started
    for s in SPLITS:
        e = manifest["splits"][s]
        untrained = e["untrained_conversations"]
        say(
            f"{s}: {e['documents']:,} conversations, {e['tokens']:,} tokens, {e['trained_tokens']:,} of them the "
            f"assistant's" + (f"; {untrained:,} conversation(s) with none (context only)" if untrained else "")
        )
    for row in manifest["chat"]["packing"]:
        say(
            f"packed into rows of data.seq_len={row['seq_len']}: {row['rows']:,} rows, padding "
            f"{100 * row['padding']:.1f} %" + (f", {row['overlong']:,} longer than a row" if row["overlong"] else "")
        )
    how = "its generation blocks" if template.marked else "rendering prefixes"
    say(f"wrote {manifest_path} ({total / max(seconds, 1e-9):,.0f} tokens/s; assistant tokens from {how})")
    return manifest


def _manifest(out: Path, settings: dict, state: dict, tok: Any, template: Any, dtype: np.dtype) -> dict[str, Any]:
    splits = {}
    for s in SPLITS:
        st = state["splits"][s]
        found = [shards_lib.open_shard(out / x["file"], x["tokens"]) for x in st["shards"]]
        splits[s] = {
            "tokens": sum(x["tokens"] for x in st["shards"]),
            "documents": st["done"],
            "trained_tokens": st["trained"],
            "untrained_conversations": st["untrained"],
            "max_id": shards_lib.ShardedTokens(found).max_id() if found else None,
            "shards": st["shards"],
        }
    record = tok.record()
    return {
        "format": FORMAT,
        "kind": "chat",
        "settings": settings,
        "tokenizer": record,
        "vocab_size": record["vocab_size"],
        "eot_id": record["eot_id"],
        "dtype": dtype.name,
        "chat": {
            "template": template.source,
            "template_sha256": template.sha256,
            "template_origin": template.origin,
            "assistant_tokens": "generation blocks" if template.marked else "prefixes",
            "roles": list(ROLES),
        },
        "splits": splits,
    }


def _write_flat(path: Path, array: np.ndarray) -> str:
    """``array``'s bytes as a file of its own, written atomically; returns their sha256."""
    data = np.ascontiguousarray(array).tobytes()
    shards_lib.atomic_write(path, lambda f: f.write(data))
    return hashlib.sha256(data).hexdigest()


def _lengths(out: Path, split: dict[str, Any]) -> np.ndarray:
    parts = [np.fromfile(out / x["lengths"]["file"], "<u4") for x in split["shards"]]
    return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, np.int64)


def _in_order(pool: Any, tok: Any, template: Any, tasks: Iterator[list], dtype: np.dtype, ahead: int) -> Iterator:
    """``(task, (ids, mask, lengths))`` for each task in order, at most ``ahead`` at once in workers."""
    convs = lambda task: ([(where, messages) for _, _, where, messages in task], dtype)  # noqa: E731
    here = lambda conversations, dtype: chat_lib.encode_conversations(tok, template, conversations, dtype)  # noqa: E731
    died = "a jaxnet prepare worker process died (out of memory, or killed); run the same command again to continue"
    yield from in_order(pool, tasks, convs, here, chat_lib.worker_encode, ahead, died)


def _progress_bar(enabled: bool) -> Any:
    from tqdm import tqdm

    return tqdm(unit="tok", unit_scale=True, desc="tokens", disable=not enabled, mininterval=1.0, smoothing=0.1)


__all__ = ["ROLES", "chat_files", "messages_of", "prepare_chat", "rows", "survey"]

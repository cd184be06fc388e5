"""``jaxnet prepare preference``: pairs of a preferred (chosen) and a rejected reply to the same
prompt, tokenized into shards for preference tuning (``train.objective=dpo|simpo``,
:mod:`jaxnet.preference`).

**Input.** JSONL (``.jsonl``, ``.jsonl.gz``) or Parquet files, a row per pair, in TRL's two shapes:

- **conversational**: ``{"prompt": [messages], "chosen": [messages], "rejected": [messages]}``, the
  prompt a conversation (``system``, ``user``, ``assistant`` turns) and each reply the assistant's
  turn(s) after it. Rendered with the chat template of ``--tokenizer hf:DIR`` (or ``--chat-template
  FILE``), as ``jaxnet prepare chat`` renders (:mod:`jaxnet.tokenizers.chat`: the ids of
  transformers' ``apply_chat_template``).
- **plain text**: ``{"prompt": "...", "chosen": "...", "rejected": "..."}``: the prompt and a reply
  written one after the other, as the tokenizer encodes a text (an ``hf`` tokenizer's BOS before
  it), the end-of-text id after the reply (unless it ends with it). Any tokenizer of a fixed
  vocabulary: ``hf:DIR``, ``gpt2`` or ``byte``.

A pair is two sequences: the prompt followed by the chosen reply, and by the rejected one. As TRL
tokenizes a pair, the prompt alone (a conversation: with the template's generation prompt) is
tokenized too, and a sequence's reply is what follows the longest run of ids the prompt shares with
both sequences: the loss and the log-probabilities count those tokens only (a conversation's reply
with its end-of-turn token and whatever the template writes after it).

**What is left out, and said.** A row missing ``prompt``, ``chosen`` or ``rejected``, a reply that
is empty (or encodes to nothing after the prompt), or a chosen reply equal to the rejected one is
counted by its reason and left out; a file with no usable pair is refused. A line that is not
JSON, a row that is not an object, fields of the wrong type or messages of an unknown role are a
one-line error naming the row. Nothing is written until every file has been read. A pair longer
than a training row (``data.seq_len``) is dropped or truncated when a run reads the corpus, by its
``data.overlong`` rule, and counted in the run's first line; prepare prints how many pairs are
longer than rows of a few lengths (``--seq-lens``).

**Splits.** ``--val FILE`` and ``--test FILE`` hold pairs out; without them ``val_fraction`` and
``test_fraction`` of the training files' usable pairs are drawn by a fixed seed (at least one each).

**Layout.** Each split is shards of whole pairs, each pair's chosen sequence then its rejected one:
``{split}_{i:06d}.bin`` (the ids, llm.c's layout), ``{split}_{i:06d}.mask`` (a byte per token, 1 on
the reply's) and ``{split}_{i:06d}.lengths`` (each sequence's token count, uint32). ``corpus.json``
says ``"kind": "preference"``, with a ``preference`` record: the template (text, sha256, origin)
where one rendered the pairs, the rows of each shape, the rows left out by reason. Training reads it
with ``data.name=tokens`` (:mod:`jaxnet.data.pairs`).

>>> prepare_preference(["pairs.jsonl"], "hf:checkpoints/my-llama", "corpora/pairs")   # doctest: +SKIP
"""

from __future__ import annotations

import gzip
import json
import os
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from jaxnet import tokenizers
from jaxnet.data import shards as shards_lib
from jaxnet.data.chat import _checked, _draw, _write_flat, chat_files
from jaxnet.data.prepare import FORMAT, SPLIT_SEED, SPLITS, read_manifest, write_json
from jaxnet.errors import UserError
from jaxnet.tokenizers import chat as chat_lib

FIELDS = ("prompt", "chosen", "rejected")
SHARD_TOKENS = 100_000_000
SEQ_LENS = (512, 1024, 2048, 4096)  # the row lengths whose overlong pairs prepare reports
#: The reasons a row is left out, as counted in corpus.json and said.
REASONS = {"missing": "a field missing", "empty": "an empty reply", "same": "chosen equal to rejected"}
PLAIN_TOKENIZERS = ("hf", "gpt2", "byte")  # the plain-text shape: any tokenizer of a fixed vocabulary


# ---------------------------------------------------------------------------------------------
# Reading pairs


def rows(path: str) -> Iterator[tuple[str, Any]]:
    """``(where, row)`` of each pair of a file (``FILE:LINE`` or ``FILE row N``); a line that is not
    JSON is a one-line error naming it."""
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
    columns = [c for c in FIELDS if c in pf.schema_arrow.names]
    if not columns:
        raise UserError(
            f"{path} has none of the columns prompt, chosen and rejected (its: {pf.schema_arrow.names[:8]})"
        )
    row = 0
    for g in range(pf.metadata.num_row_groups):
        for record in pf.read_row_group(g, columns=columns).to_pylist():
            yield f"{path} row {row}", {k: v for k, v in record.items() if v is not None}
            row += 1


def pair_of(row: Any, where: str) -> tuple[str, tuple[Any, Any, Any]] | str:
    """A row checked: ``("conversational" | "text", (prompt, chosen, rejected))``, or the reason it
    is left out (a key of :data:`REASONS`); a row of the wrong form is a one-line error naming ``where``.

    >>> pair_of({"prompt": "The sky is", "chosen": " blue.", "rejected": " green."}, "x:1")[0]
    'text'
    >>> pair_of({"prompt": "Hi", "chosen": "", "rejected": "Yo"}, "x:2")
    'empty'
    """
    if not isinstance(row, dict):
        raise UserError(f"{where} is a JSON {type(row).__name__}, not an object with prompt, chosen and rejected")
    if any(row.get(k) is None for k in FIELDS):
        return "missing"
    prompt, chosen, rejected = (row[k] for k in FIELDS)
    if all(isinstance(x, str) for x in (prompt, chosen, rejected)):
        if not chosen.strip() or not rejected.strip():
            return "empty"
        return "same" if chosen == rejected else ("text", (prompt, chosen, rejected))
    if all(isinstance(x, list) for x in (prompt, chosen, rejected)):
        if not prompt:
            raise UserError(f"{where}: prompt is an empty list; give the conversation before the reply")
        prompt = _checked(prompt, where, "prompt")
        replies = []
        for name, reply in (("chosen", chosen), ("rejected", rejected)):
            if not reply:
                return "empty"
            reply = _checked(reply, where, name)
            if any(m["role"] != "assistant" for m in reply):
                raise UserError(f"{where}: the {name} messages must be the assistant's")
            if not any(m["content"].strip() for m in reply):
                return "empty"
            replies.append(reply)
        return "same" if replies[0] == replies[1] else ("conversational", (prompt, *replies))
    kinds = ", ".join(type(x).__name__ for x in (prompt, chosen, rejected))
    raise UserError(
        f"{where}: prompt, chosen and rejected must be three strings or three lists of messages, not {kinds}"
    )


# ---------------------------------------------------------------------------------------------
# Tokenizing


def _shared(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading ids ``a`` and ``b`` have in common."""
    n = min(len(a), len(b))
    differ = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(differ[0]) if len(differ) else n


class Encoder:
    """Texts of pairs to ids: ``tok`` (a tokenizer of :mod:`jaxnet.tokenizers`), ``template`` (a
    :class:`~jaxnet.tokenizers.chat.ChatTemplate`, or None where no row is conversational)."""

    def __init__(self, tok: Any, template: chat_lib.ChatTemplate | None):
        self.tok, self.template = tok, template
        added = getattr(tok, "added", ((), ()))  # an hf tokenizer: what transformers adds around a text
        self.before, self.after = list(added[0]), list(added[1])

    def texts(self, shape: str, pair: tuple[Any, Any, Any], where: str) -> tuple[list[str], bool]:
        """The three texts of a pair (the prompt, then it with each reply) and whether they are
        encoded as a text is (the plain shape: special ids around it, the end-of-text id after a reply)."""
        prompt, chosen, rejected = pair
        if shape == "text":
            return [prompt, prompt + chosen, prompt + rejected], True
        if self.template is None:
            raise UserError(
                f"{where} is a conversation, which needs a chat template: give --tokenizer hf:DIR of a chat model "
                "(or --chat-template FILE)"
            )
        try:
            return [
                self.template.render(prompt, add_generation_prompt=True),
                self.template.render(prompt + chosen),
                self.template.render(prompt + rejected),
            ], False
        except UserError as e:
            raise UserError(f"{where}: {e}") from None

    def encode(self, batch: Sequence[tuple[str, str, tuple]]) -> list[tuple[list[int], int, list[int], int] | None]:
        """For each ``(where, shape, pair)``: the chosen sequence's ids and where its reply starts,
        and the rejected one's; None where a reply encodes to nothing after the prompt."""
        texts, plain = [], []
        for where, shape, pair in batch:
            three, is_plain = self.texts(shape, pair, where)
            texts.extend(three)
            plain.append(is_plain)
        ids = [a.tolist() for a in self.tok.encode_batch(texts, np.int64)]
        eot = self.tok.eot_id
        out: list[tuple[list[int], int, list[int], int] | None] = []
        for k, is_plain in enumerate(plain):
            prompt, chosen, rejected = ids[3 * k : 3 * k + 3]
            if is_plain:
                ended = lambda x: x + [eot] if eot is not None and (not x or x[-1] != eot) else x  # noqa: E731
                prompt = self.before + prompt + self.after
                chosen = self.before + ended(chosen) + self.after
                rejected = self.before + ended(rejected) + self.after
            start = min(_shared(prompt, chosen), _shared(prompt, rejected))
            out.append(None if start >= len(chosen) or start >= len(rejected) else (chosen, start, rejected, start))
        return out


# ---------------------------------------------------------------------------------------------
# Preparing


def prepare_preference(
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
    seq_lens: Sequence[int] = SEQ_LENS,
    progress: bool = True,
    say: Any = print,
) -> dict[str, Any]:
    """Read, check, tokenize and write the pairs of ``files`` (see the module docstring); returns the
    manifest (run again on a finished ``out``, it returns the manifest it wrote).

    >>> prepare_preference(["pairs.jsonl"], "hf:ckpt", "corpora/pairs", val="held_out.jsonl")  # doctest: +SKIP
    """
    kind = tokenizers.kind_of(tokenizer, "--tokenizer", tokenizers.PREPARE_CHOICES).kind
    if kind not in PLAIN_TOKENIZERS:
        raise UserError(
            f"jaxnet prepare preference needs a tokenizer of a fixed vocabulary: hf:DIR (a checkpoint's, whose chat "
            f"template renders conversations), gpt2 or byte; not {tokenizer}"
        )
    if not files:
        raise UserError("jaxnet prepare preference needs FILE...: .jsonl, .jsonl.gz or .parquet files of pairs")
    if shard_tokens < 1:
        raise UserError(f"--shard-tokens {shard_tokens}: give a positive number")
    for name, f in (("--val-fraction", val_fraction), ("--test-fraction", test_fraction)):
        if not 0 < f < 0.5:
            raise UserError(f"{name} {f}: give a fraction in (0, 0.5)")
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} is a file; give a directory")
    tok = tokenizers.get(tokenizer, "--tokenizer")
    pool_files = [f for source in files for f in chat_files(source)]
    fixed = {s: chat_files(v, f"--{s}") for s, v in (("val", val), ("test", test)) if v}

    # Every row of every file read and checked before anything is written.
    kept: dict[str, list] = {}
    skipped: Counter = Counter()
    shapes: Counter = Counter()
    for f in pool_files + [f for s in ("val", "test") for f in fixed.get(s, ())]:
        usable = []
        for where, row in rows(f):
            found = pair_of(row, where)
            if isinstance(found, str):
                skipped[found] += 1
            else:
                usable.append((where, *found))
                shapes[found[0]] += 1
        if not usable:
            raise UserError(
                f"{f} has no usable pair ({_reasons(skipped) or 'no rows'}); give rows with a prompt, a chosen and a "
                "rejected reply that differ"
            )
        kept[f] = usable
    template = None
    if shapes["conversational"]:
        if kind != "hf":
            raise UserError(
                f"the pairs are conversations, which need a chat template: give --tokenizer hf:DIR of a chat model, "
                f"not {tokenizer}"
            )
        template = chat_lib.load(tok.directory, chat_template)
    elif chat_template is not None:
        raise UserError("--chat-template renders conversations, and every pair here is plain text; leave it out")
    pooled = sum(len(kept[f]) for f in pool_files)
    drawn = _draw(pooled, {s: x for s, x in (("val", val_fraction), ("test", test_fraction)) if s not in fixed}, seed)
    settings = {
        "kind": "preference",
        "source": [os.path.abspath(f) for f in pool_files],
        "val": [os.path.abspath(f) for f in fixed.get("val", ())],
        "test": [os.path.abspath(f) for f in fixed.get("test", ())],
        "tokenizer": tok.name,
        "chat_template_sha256": template.sha256 if template is not None else None,
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

    by_split: dict[str, list] = {s: [] for s in SPLITS}
    g = 0
    for f in pool_files:
        for item in kept[f]:
            by_split[drawn[g]].append(item)
            g += 1
    for s, names in fixed.items():
        for f in names:
            by_split[s].extend(kept[f])
    encoder = Encoder(tok, template)
    started = time.perf_counter()
    bar = _progress_bar(progress, sum(len(v) for v in by_split.values()))
    encoded: dict[str, list] = {}
    try:
        for s in SPLITS:
            encoded[s] = []
            items = by_split[s]
            for at in range(0, len(items), 256):
                batch = items[at : at + 256]
                for pair in encoder.encode(batch):
                    if pair is None:
                        skipped["empty"] += 1  # a reply of no tokens after the prompt
                    else:
                        encoded[s].append(pair)
                bar.update(len(batch))
    finally:
        bar.close()
    if not encoded["train"]:
        raise UserError(f"no training pair is left ({_reasons(skipped)}); give pairs whose replies differ")

    dtype = shards_lib.token_dtype(tok.vocab_size)
    created = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    splits = {}
    try:
        for s in SPLITS:
            splits[s] = _write_split(out, s, encoded[s], dtype, shard_tokens)
    except BaseException:
        if created:
            for p in out.iterdir():
                p.unlink()
            out.rmdir()
        raise
    record = tok.record()
    longest = np.asarray([max(len(c), len(r)) for c, _, r, _ in encoded["train"]], np.int64)
    manifest = {
        "format": FORMAT,
        "kind": "preference",
        "settings": settings,
        "tokenizer": record,
        "vocab_size": record["vocab_size"],
        "eot_id": record["eot_id"],
        "dtype": dtype.name,
        "preference": {
            "template": template.source if template is not None else None,
            "template_sha256": template.sha256 if template is not None else None,
            "template_origin": template.origin if template is not None else None,
            "shapes": dict(shapes),
            "skipped": {k: skipped[k] for k in REASONS},
            "overlong": [{"seq_len": n, "pairs": int(np.sum(longest - 1 > n))} for n in seq_lens],
        },
        "splits": splits,
    }
    write_json(manifest_path, manifest)
    for s in SPLITS:
        e = splits[s]
        say(f"{s}: {e['pairs']:,} pairs, {e['tokens']:,} tokens, {e['trained_tokens']:,} of them the replies'")
    if sum(skipped.values()):
        say(f"left out: {_reasons(skipped)}")
    for row in manifest["preference"]["overlong"]:
        if row["pairs"]:
            say(f"data.seq_len={row['seq_len']}: {row['pairs']:,} training pairs longer than a row (data.overlong)")
    how = f"rendered with {template.origin}" if template is not None else "as plain text"
    seconds = time.perf_counter() - started
    say(f"wrote {manifest_path} ({sum(shapes.values()):,} pairs {how}, {seconds:.1f} s)")
    return manifest


def _reasons(skipped: Counter) -> str:
    """The rows left out, by reason: ``2 with a field missing, 1 with an empty reply``."""
    return ", ".join(f"{skipped[k]:,} with {REASONS[k]}" for k in REASONS if skipped[k])


def _write_split(out: Path, split: str, pairs: list, dtype: np.dtype, shard_tokens: int) -> dict[str, Any]:
    """The shards of a split's pairs (module docstring), each ending at the first pair boundary at or
    after ``shard_tokens`` tokens; the split's manifest entry."""
    entry: dict[str, Any] = {"pairs": len(pairs), "tokens": 0, "documents": 2 * len(pairs), "trained_tokens": 0}
    shards, start, largest = [], 0, None
    while start < len(pairs):
        end, n = start, 0
        while end < len(pairs) and n < shard_tokens:
            n += len(pairs[end][0]) + len(pairs[end][2])
            end += 1
        sequences, masks = [], []
        for chosen, at, rejected, at_too in pairs[start:end]:
            for ids, reply in ((chosen, at), (rejected, at_too)):
                sequences.append(ids)
                masks.append((np.arange(len(ids)) >= reply).astype(np.uint8))
        ids = np.concatenate([np.asarray(q, np.int64) for q in sequences])
        mask = np.concatenate(masks)
        lengths = np.asarray([len(q) for q in sequences], "<u4")
        stem = f"{split}_{len(shards):06d}"
        shard = {"file": f"{stem}.bin", "tokens": len(ids), "sequences": len(sequences), "pairs": end - start}
        shard["sha256"] = shards_lib.write_shard(out / shard["file"], ids.astype(dtype))
        shard["mask"] = {"file": f"{stem}.mask", "sha256": _write_flat(out / f"{stem}.mask", mask)}
        shard["lengths"] = {"file": f"{stem}.lengths", "sha256": _write_flat(out / f"{stem}.lengths", lengths)}
        shards.append(shard)
        entry["tokens"] += len(ids)
        entry["trained_tokens"] += int(mask.sum())
        largest = max(largest or 0, int(ids.max()))
        start = end
    entry["max_id"] = largest
    entry["shards"] = shards
    return entry


def _progress_bar(enabled: bool, total: int) -> Any:
    from tqdm import tqdm

    return tqdm(total=total, unit="pair", desc="pairs", disable=not enabled, mininterval=1.0)


__all__ = ["FIELDS", "REASONS", "Encoder", "pair_of", "prepare_preference", "rows"]

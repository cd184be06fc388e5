"""Tokenizers behind one interface, in one registry: ``char``, ``word``, ``byte``, ``gpt2`` and
``hf:DIR`` (a Hugging Face checkpoint's ``tokenizer.json``).

Every road that turns text into ids or ids into text asks this package by name: the in-memory
text datasets, ``jaxnet prepare`` and the token corpora it writes, ``jaxnet sample``, the
studies' metric. The choices are listed once, here (:data:`CHOICES`, :data:`PREPARE_CHOICES`),
and the config schema and the command line read them. The interface is
:class:`~jaxnet.tokenizers.base.Tokenizer`.

>>> tok = get("gpt2")
>>> tok.encode_batch(["Hello world"])[0].tolist(), tok.before, tok.metric
([15496, 995], (50256,), 'perplexity')
>>> tok.decode([15496, 995])
'Hello world'
>>> get("hf:checkpoints/my-llama").end_ids                          # doctest: +SKIP
(128001, 128008, 128009)

A corpus keeps its tokenizer's :meth:`~jaxnet.tokenizers.base.Tokenizer.record` in
``corpus.json``; :func:`from_record` rebuilds the tokenizer from it (checking that an ``hf``
directory's ``tokenizer.json`` is still the one it was prepared with) and :func:`check_fits`
refuses a model or checkpoint whose vocabulary the corpus's ids do not fit.

This package imports no JAX and nothing of jaxnet but its errors, so the config schema and
``jaxnet prepare``'s workers can use it.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from jaxnet.errors import UserError
from jaxnet.tokenizers.base import EOT, Tokenizer, metric_value
from jaxnet.tokenizers.gpt2 import GPT2
from jaxnet.tokenizers.hf import HF
from jaxnet.tokenizers.simple import Byte, Char, Word

#: The registry: each kind's class.
KINDS: dict[str, type[Tokenizer]] = {cls.kind: cls for cls in (Char, Word, Byte, GPT2, HF)}
#: A kind whose name takes an argument, as ``hf:DIR``: its spelling in the choices.
ARGUMENT = {"hf": "DIR"}
#: What ``data.tokenizer`` accepts.
CHOICES: tuple[str, ...] = tuple(f"{k}:{ARGUMENT[k]}" if k in ARGUMENT else k for k in KINDS)
#: What ``jaxnet prepare --tokenizer`` accepts.
PREPARE_CHOICES: tuple[str, ...] = tuple(c for c in CHOICES if KINDS[c.partition(":")[0]].preparable)


def kind_of(name: str, what: str = "data.tokenizer", choices: tuple[str, ...] = CHOICES) -> type[Tokenizer]:
    """The class a tokenizer name stands for, without building it (no files read); a one-line
    error naming ``what`` and the ``choices`` for any other name.

    >>> kind_of("hf:checkpoints/x").metric, kind_of("char").metric
    ('perplexity', 'bpc')
    """
    kind, colon, argument = name.partition(":")
    allowed = {c.partition(":")[0] for c in choices}
    if kind not in KINDS or kind not in allowed or bool(colon) != (kind in ARGUMENT) or (colon and not argument):
        raise UserError(f"{what}={name!r} is not one of: {', '.join(choices)}")
    return KINDS[kind]


def get(name: str, what: str = "data.tokenizer") -> Tokenizer:
    """The tokenizer ``name`` names (``hf:DIR`` reads ``DIR``'s files; each is built once).

    >>> get("byte").vocab_size
    257
    """
    cls = kind_of(name, what)
    if cls is HF:
        directory = os.path.abspath(os.path.expanduser(name.partition(":")[2]))
        file = Path(directory) / "tokenizer.json"
        stamp = (file.stat().st_mtime_ns, file.stat().st_size) if file.is_file() else None
        return _hf(directory, stamp) if stamp else HF(directory)
    return _plain(name)


@functools.cache
def _plain(name: str) -> Tokenizer:
    return KINDS[name]()


@functools.cache
def _hf(directory: str, stamp: tuple[int, int]) -> HF:
    return HF(directory)


def from_record(record: Mapping[str, Any]) -> Tokenizer:
    """The tokenizer a corpus was prepared with, from ``corpus.json``'s ``tokenizer`` record; an
    ``hf`` tokenizer only if its ``tokenizer.json`` is still the file the corpus was made with.

    >>> from_record({"name": "char", "vocab": ["a", "b", EOT]}).encode_batch(["ba"])[0].tolist()
    [1, 0]
    """
    name = str(record.get("name", ""))
    cls = kind_of(name, "corpus.json's tokenizer")
    if cls is Char:
        vocab = list(record["vocab"])
        return Char(vocab[:-1] if vocab and vocab[-1] == EOT else vocab)
    tok = get(name, "corpus.json's tokenizer")
    want = (record.get("files") or {}).get("tokenizer.json")
    if isinstance(tok, HF) and want and want != tok.sha256:
        raise UserError(
            f"{tok.directory / 'tokenizer.json'} has changed since the corpus was prepared with it (sha256 "
            f"{tok.sha256[:12]}..., not {want[:12]}...); prepare the corpus again"
        )
    return tok


def vocabulary_of(record: Mapping[str, Any]) -> list[str]:
    """The token strings of a tokenizer record's ids, by id (a learned vocabulary: the record's own)."""
    if "vocab" in record:
        return list(record["vocab"])
    return from_record(record).corpus_vocab()


def check_fits(record: Mapping[str, Any], vocab_size: int, checkpoint: str | os.PathLike | None = None) -> None:
    """Refuse a model whose vocabulary the ids of a corpus do not fit.

    ``record`` is the corpus's tokenizer (``corpus.json``'s ``tokenizer``, or a dataset's
    ``tokenizer_record``); ``vocab_size`` the model's number of ids (a checkpoint's
    ``config.json`` ``vocab_size``). With ``checkpoint``, a directory holding a ``tokenizer.json``,
    every id of the corpus must also mean the same token there: the same file (by sha256), or the
    same token string for each id. A one-line :class:`UserError` names the first misfit.

    >>> check_fits(get("gpt2").record(), 50304)
    >>> check_fits(get("gpt2").record(), 32000)
    Traceback (most recent call last):
    jaxnet.errors.UserError: the corpus's tokenizer (gpt2) has 50,257 ids, more than the model's 32,000 ...
    """
    name, size = str(record.get("name", "?")), int(record.get("vocab_size") or len(record.get("vocab", ())))
    if size > vocab_size:
        raise UserError(
            f"the corpus's tokenizer ({name}) has {size:,} ids, more than the model's {vocab_size:,}; prepare the "
            "corpus with the checkpoint's own tokenizer (--tokenizer hf:DIR)"
        )
    if checkpoint is None or not (Path(checkpoint) / "tokenizer.json").is_file():
        return
    theirs = HF(checkpoint)
    if (record.get("files") or {}).get("tokenizer.json") == theirs.sha256:
        return
    ours, strings = vocabulary_of(record), theirs.strings()
    for i, token in enumerate(ours):
        if i >= len(strings) or strings[i] != token:
            there = repr(strings[i]) if i < len(strings) else "no token"
            raise UserError(
                f"the corpus was prepared with another tokenizer than {checkpoint}'s: its id {i} is {token!r}, "
                f"the checkpoint's is {there}; prepare it with --tokenizer hf:{checkpoint}"
            )


__all__ = [
    "CHOICES",
    "EOT",
    "KINDS",
    "PREPARE_CHOICES",
    "Byte",
    "Char",
    "GPT2",
    "HF",
    "Tokenizer",
    "Word",
    "check_fits",
    "from_record",
    "get",
    "kind_of",
    "metric_value",
    "vocabulary_of",
]

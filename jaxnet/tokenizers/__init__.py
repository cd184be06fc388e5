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

Importing this package reads no file and imports nothing but jaxnet's errors (the classes and
numpy load when a tokenizer is first asked for), so the config schema and the command line's
``--help`` can read the choices.
"""

from __future__ import annotations

import functools
import importlib
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from jaxnet.errors import UserError

#: The end-of-text token's string, as GPT-2 (and llm.c's shards) spell it.
EOT = "<|endoftext|>"

#: The registry: kind -> (module, class, the argument its name takes, whether ``jaxnet prepare``
#: writes corpora with it: words are a vocabulary learned from a training split, in memory only).
REGISTRY: dict[str, tuple[str, str, str, bool]] = {
    "char": ("jaxnet.tokenizers.simple", "Char", "", True),
    "word": ("jaxnet.tokenizers.simple", "Word", "", False),
    "byte": ("jaxnet.tokenizers.simple", "Byte", "", True),
    "gpt2": ("jaxnet.tokenizers.gpt2", "GPT2", "", True),
    "hf": ("jaxnet.tokenizers.hf", "HF", "DIR", True),
}
#: What ``data.tokenizer`` accepts.
CHOICES: tuple[str, ...] = tuple(f"{k}:{arg}" if arg else k for k, (_, _, arg, _) in REGISTRY.items())
#: What ``jaxnet prepare --tokenizer`` accepts.
PREPARE_CHOICES: tuple[str, ...] = tuple(c for c in CHOICES if REGISTRY[c.partition(":")[0]][3])


def kind_of(name: str, what: str = "data.tokenizer", choices: tuple[str, ...] = CHOICES) -> Any:
    """The class (a :class:`~jaxnet.tokenizers.base.Tokenizer`) a tokenizer name stands for, without
    building it (no files read); a one-line
    error naming ``what`` and the ``choices`` for any other name.

    >>> kind_of("hf:checkpoints/x").metric, kind_of("char").metric
    ('perplexity', 'bpc')
    """
    kind, colon, argument = name.partition(":")
    allowed = {c.partition(":")[0] for c in choices}
    takes = bool(REGISTRY[kind][2]) if kind in REGISTRY else False
    if kind not in allowed or bool(colon) != takes or (colon and not argument):
        raise UserError(f"{what}={name!r} is not one of: {', '.join(choices)}")
    module, cls, _, _ = REGISTRY[kind]
    return getattr(importlib.import_module(module), cls)


def get(name: str, what: str = "data.tokenizer") -> Any:
    """The tokenizer ``name`` names, built once (``hf:DIR`` reads ``DIR``'s files, again when
    its ``tokenizer.json`` or a file its special ids come from changes).

    >>> get("byte").vocab_size
    257
    """
    cls = kind_of(name, what)
    kind, _, argument = name.partition(":")
    if not argument:
        return _built(kind, "", None)
    directory = os.path.abspath(os.path.expanduser(argument))
    files = [
        Path(directory) / n
        for n in ("tokenizer.json", "tokenizer_config.json", "config.json", "generation_config.json")
    ]
    if not files[0].is_file():
        return cls(directory)  # its own one-line error
    stamp = tuple((f.stat().st_mtime_ns, f.stat().st_size) if f.is_file() else None for f in files)
    return _built(kind, directory, stamp)


@functools.cache
def _built(kind: str, argument: str, stamp: tuple | None) -> Any:
    cls = kind_of(kind + (f":{argument}" if argument else ""))
    return cls(argument) if argument else cls()


def from_record(record: Mapping[str, Any]) -> Any:
    """The tokenizer a corpus was prepared with, from ``corpus.json``'s ``tokenizer`` record (a
    learned vocabulary from the record itself; an ``hf`` tokenizer only if its ``tokenizer.json``
    is still the file the corpus was made with).

    >>> from_record({"name": "char", "vocab": ["a", "b", EOT]}).encode_batch(["ba"])[0].tolist()
    [1, 0]
    """
    return kind_of(str(record.get("name", "")), "corpus.json's tokenizer").from_record(record)


def vocabulary_of(record: Mapping[str, Any]) -> list[str]:
    """The token strings of a tokenizer record's ids, by id: its own ``vocab`` where it keeps one
    (a learned vocabulary), else the tokenizer's.

    >>> vocabulary_of({"name": "char", "vocab": ["a", "b", EOT]})
    ['a', 'b', '<|endoftext|>']
    """
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
    jaxnet.errors.UserError: the corpus's tokenizer (gpt2) has 50,257 ids, more than the model's 32,000; ...
    """
    name = str(record.get("name", "?"))
    size = int(record.get("vocab_size") or len(record.get("vocab", ())))
    if size > vocab_size:
        own = checkpoint is not None and name == f"hf:{Path(checkpoint).expanduser().resolve()}"
        raise UserError(
            f"the corpus's tokenizer ({name}) has {size:,} ids, more than the model's {vocab_size:,}; "
            + (
                "it is the checkpoint's own tokenizer.json, which does not fit its model (config.json's vocab_size): "
                "put the tokenizer the checkpoint was trained with into its directory and prepare the corpus again"
                if own
                else "prepare the corpus with the checkpoint's own tokenizer (--tokenizer hf:DIR)"
            )
        )
    if checkpoint is None or not (Path(checkpoint) / "tokenizer.json").is_file():
        return
    theirs = get(f"hf:{checkpoint}")
    if (record.get("files") or {}).get("tokenizer.json") == getattr(theirs, "sha256", None):
        return
    ours, strings = vocabulary_of(record), theirs.corpus_vocab()
    for i, token in enumerate(ours):
        if i >= len(strings) or strings[i] != token:
            there = repr(strings[i]) if i < len(strings) else "no token"
            raise UserError(
                f"the corpus was prepared with another tokenizer than {checkpoint}'s: its id {i} is {token!r}, "
                f"the checkpoint's is {there}; prepare it with --tokenizer hf:{checkpoint}"
            )


def metric_value(metric: str, loss: float) -> float:
    """``metric`` (a tokenizer's :attr:`~jaxnet.tokenizers.base.Tokenizer.metric`) of a mean loss
    in nats per token.

    >>> round(metric_value("bpc", math.log(2)), 6), round(metric_value("perplexity", 0.0), 6)
    (1.0, 1.0)
    """
    if metric == "perplexity":
        return math.exp(min(loss, 700.0))
    return loss / math.log(2)


_CLASSES = {cls: (module, cls) for module, cls, _, _ in REGISTRY.values()}


def __getattr__(name: str) -> Any:
    """The tokenizer classes (``Char``, ``Word``, ``Byte``, ``GPT2``, ``HF``), imported on first use."""
    if name not in _CLASSES:
        raise AttributeError(f"module 'jaxnet.tokenizers' has no attribute {name!r}")
    module, cls = _CLASSES[name]
    return getattr(importlib.import_module(module), cls)


__all__ = [
    "CHOICES",
    "EOT",
    "PREPARE_CHOICES",
    "REGISTRY",
    "check_fits",
    "from_record",
    "get",
    "kind_of",
    "metric_value",
    "vocabulary_of",
]

"""The interface every tokenizer has (:class:`Tokenizer`), and what is common to them.

Two roads use a tokenizer:

- **in memory** (``data.name=text``, ``shakespeare``, ``ptb``): a text becomes token strings
  (:meth:`Tokenizer.pieces`), the splits' strings a vocabulary (:meth:`Tokenizer.vocabulary`),
  and each string its index in it. A character or word vocabulary is learned from the text; a
  byte, GPT-2 or ``tokenizer.json`` vocabulary is fixed.
- **on disk** (``jaxnet prepare``, ``data.name=tokens``): documents are encoded in batches
  (:meth:`Tokenizer.encode_batch`) and written with :attr:`Tokenizer.before` and
  :attr:`Tokenizer.after` around each (how documents are separated); ``corpus.json`` keeps
  :meth:`Tokenizer.record`, from which :func:`jaxnet.tokenizers.from_record` rebuilds it.

Decoding (:meth:`Tokenizer.decode`), how a continuation joins a prompt (:meth:`Tokenizer.join`),
where an unprompted sample starts (:meth:`Tokenizer.start_id`) and the per-token metric beside
the loss (:attr:`Tokenizer.metric`) serve both roads.

This module imports no JAX: ``jaxnet prepare``'s workers and the config schema use it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

from jaxnet.errors import UserError
from jaxnet.tokenizers import EOT as EOT


class Tokenizer:
    """Text to token ids and back, with the ids that separate documents.

    Subclasses set the class attributes and override what differs; an instance is named as the
    config names it (:attr:`name`: ``char``, ``word``, ``byte``, ``gpt2``, ``hf:/abs/dir``).

    >>> from jaxnet import tokenizers
    >>> tok = tokenizers.get("byte")
    >>> tok.encode_batch(["hé"])[0].tolist(), tok.before, tok.after
    ([104, 195, 169], (256,), ())
    """

    #: The registry's key: ``char``, ``word``, ``byte``, ``gpt2``, ``hf``.
    kind: ClassVar[str] = ""
    #: The per-token metric reported beside the loss: ``bpc``, ``bits_per_byte`` or ``perplexity``.
    metric: ClassVar[str] = "perplexity"
    #: Whether files are read as raw bytes (any file, UTF-8 or not) rather than as UTF-8 text.
    reads_bytes: ClassVar[bool] = False

    name: str = ""
    #: Ids of the corpus vocabulary (``jaxnet prepare``'s ids are all below it).
    vocab_size: int = 0
    #: The end-of-text id (``None``: the tokenizer has none).
    eot_id: int | None = None
    #: Every id that ends a text (a sampler may stop at any); the end-of-text id first.
    end_ids: tuple[int, ...] = ()
    #: The beginning-of-text id, if the tokenizer has one.
    bos_id: int | None = None
    #: Ids written before and after each document of a prepared corpus.
    before: tuple[int, ...] = ()
    after: tuple[int, ...] = ()

    # ---- the in-memory road

    def pieces(self, text: str | bytes) -> list[str]:
        """``text`` as token strings."""
        raise NotImplementedError

    def vocabulary(self, splits: Sequence[Sequence[str]]) -> list[str]:
        """The vocabulary of the token strings of the train, validation and test splits."""
        raise NotImplementedError

    def lookup(self, pieces: Sequence[str], index: Mapping[str, int]) -> np.ndarray:
        """The ids of token strings from the vocabulary's ``index`` (every piece is in it)."""
        return np.asarray([index[t] for t in pieces], np.int32)

    def encode_prompt(self, text: str, index: Mapping[str, int]) -> np.ndarray:
        """Token ids of a prompt; a token outside the vocabulary is a one-line error."""
        return known_ids(self.pieces(text), index)

    def decode(self, ids: Sequence[int] | np.ndarray, vocab: Sequence[str]) -> str:
        """Text of token ids; ``vocab`` is the run's vocabulary (learned ones decode through it)."""
        return "".join(vocab[int(i)] for i in ids)

    def join(self, prompt: str, continuation: str) -> str:
        """A prompt and the decoded text that continues it, as one text."""
        return prompt + continuation

    def start_id(self, index: Mapping[str, int]) -> int:
        """Where a sample without a prompt starts: the start of a line."""
        return index.get("\n", 0)

    # ---- the on-disk road

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> Tokenizer:
        """The tokenizer a ``corpus.json`` record describes (see :func:`jaxnet.tokenizers.from_record`)."""
        from jaxnet import tokenizers

        return tokenizers.get(str(record["name"]), "corpus.json's tokenizer")

    def fit(self, texts: Any) -> Tokenizer:
        """This tokenizer ready for ``texts`` (an iterable of documents): a fixed vocabulary
        needs nothing; a character vocabulary is learned from them."""
        return self

    def encode_batch(self, texts: Sequence[str | bytes], dtype: Any = np.uint32) -> list[np.ndarray]:
        """The ids of each text, in ``dtype``, without separators."""
        raise NotImplementedError

    def check_separates(self) -> None:
        """A one-line error if documents could not be told apart in a prepared corpus (no ids
        between them)."""
        if not self.before and not self.after:
            raise UserError(
                f"{self.name} has no end-of-text token (eos_token in tokenizer_config.json, eos_token_id in "
                "config.json or generation_config.json) and adds nothing before a text: documents would run "
                "together; name an eos_token in tokenizer_config.json"
            )

    def check_model(self) -> None:
        """A one-line error if the model this tokenizer comes with has fewer ids than it (only a
        checkpoint's tokenizer knows its model: the others have none to check)."""

    def encode_documents(self, texts: Sequence[str | bytes], dtype: Any = np.uint32) -> tuple[np.ndarray, np.ndarray]:
        """The texts one after another as a prepared corpus holds them (each one :attr:`before`,
        its ids, :attr:`after`), in ``dtype``, and each one's length: one array for a whole batch,
        so that a batch of short documents costs one allocation, not one each.

        >>> from jaxnet import tokenizers
        >>> block, lengths = tokenizers.get("byte").encode_documents(["hi", "a"], np.uint16)
        >>> block.tolist(), lengths.tolist()
        ([256, 104, 105, 256, 97], [3, 2])
        """
        before, after = np.asarray(self.before, np.uint32), np.asarray(self.after, np.uint32)
        ids = self.encode_batch(texts)
        parts = [part for a in ids for part in (before, a, after)]
        block = np.concatenate(parts).astype(dtype, copy=False) if parts else np.zeros(0, dtype)
        lengths = np.fromiter((len(a) for a in ids), np.int64, len(ids)) + len(before) + len(after)
        return block, lengths

    def record(self) -> dict[str, Any]:
        """What ``corpus.json`` keeps of the tokenizer (enough to rebuild and check it)."""
        return {
            "name": self.name,
            "vocab_size": self.vocab_size,
            "eot_id": self.eot_id,
            "end_ids": list(self.end_ids),
            "bos_id": self.bos_id,
            "before": list(self.before),
            "after": list(self.after),
        }

    def corpus_vocab(self) -> list[str]:
        """The token strings of a prepared corpus's ids, by id."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<tokenizer {self.name}: {self.vocab_size:,} ids>"


def known_ids(tokens: Sequence[str], index: Mapping[str, int]) -> np.ndarray:
    """The ids of ``tokens`` in ``index``; any token outside it is a one-line error naming it."""
    unknown = [t for t in tokens if t not in index]
    if unknown:
        shown = ", ".join(repr(t) for t in dict.fromkeys(unknown[:5]))
        raise UserError(f"the text has {len(unknown)} token(s) outside this model's vocabulary ({shown})")
    return np.asarray([index[t] for t in tokens], np.int32)


def text_only(text: str | bytes, name: str) -> str:
    """``text`` when it is a ``str``; raw bytes are a one-line error for a tokenizer of text."""
    if isinstance(text, bytes):
        raise UserError(f"data.tokenizer={name} needs text; raw bytes need data.tokenizer=byte")
    return text


# A worker process of jaxnet prepare: the tokenizer object itself, pickled (a GPT-2 tokenizer with
# its encoding, so that a worker starts in a fraction of a second), then batches of documents.
# (Threads sharing one process encoded more slowly with two than with one here, tiktoken's own
# included: benchmarks/results/prepare-cpu-*.json.) This module imports nothing heavier than
# numpy, and so does a worker: it starts in jaxnet.tokenizers.workers, and its task functions live
# here and in jaxnet.tokenizers.chat, never under jaxnet.data (whose package imports JAX, 0.6 s a
# process).
_WORKER: Tokenizer | None = None


def worker_init(tokenizer: Tokenizer) -> None:
    """Keep the corpus's tokenizer for :func:`worker_encode`."""
    global _WORKER
    _WORKER = tokenizer


def worker_encode(texts: Sequence[str | bytes], dtype: Any) -> tuple[np.ndarray, np.ndarray]:
    """:meth:`Tokenizer.encode_documents` in a worker process started by :func:`worker_init`."""
    assert _WORKER is not None, "worker_init first"
    return _WORKER.encode_documents(texts, dtype)

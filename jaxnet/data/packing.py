"""Packing: whole examples (conversations, documents) placed side by side in rows of ``seq_len``
positions, so short examples do not leave most of a row to padding.

An example of ``n`` tokens fills ``n - 1`` positions of a row (its tokens but the last are inputs,
its tokens but the first are targets). :func:`pack` places the examples by **best fit
decreasing**: longest first, each into the open row with the least room left that still holds
it, else a new row. It is deterministic (ties broken by example order), needs no window, and
leaves little padding when most examples are short against the row (the printed padding fraction
says how little). An example longer than a row is dropped or cut to the row's length
(``data.overlong=drop|truncate``, counted). Rows are numbered by the first example they hold, so
an evaluation capped to its first rows sees about the split's first examples.

A row of a batch (:func:`assemble`) carries ``tokens``, ``targets``, ``mask`` (1 where a target
is trained: the assistant's tokens of a conversation, every token of a document; 0 on padding),
``segments`` (1, 2, ... for the examples of the row in order, 0 for padding) and ``positions``
(restarting at 0 at each example). A model attends only within a segment
(:func:`jaxnet.models.transformer.attention.segment_mask`) and places each token at its
position, so an example packed with others computes what it computes alone.

Training batch ``step`` takes rows ``step * B ... step * B + B - 1`` of an endless sequence of
epochs, each epoch every row once in an order drawn from ``(seed, epoch)``: a pure function of
``(seed, step)``, and a process reads only the examples of its own rows.

>>> p = pack(np.array([5, 3, 9, 2]), seq_len=8)
>>> p.rows, [p.items(r).tolist() for r in range(p.rows)], round(p.padding, 3)
(2, [[0, 1, 3], [2]], 0.062)
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from jaxnet.errors import UserError

OVERLONG = ("drop", "truncate")
ROW_SEED = 3  # stream of np.random.default_rng([seed, ROW_SEED, epoch]): the row order of an epoch


@dataclass(frozen=True)
class Packing:
    """Examples placed in rows: row ``r`` holds items ``starts[r]:starts[r + 1]``, item ``i`` the
    first ``length[i]`` tokens of example ``example[i]``, in order."""

    seq_len: int
    starts: np.ndarray
    example: np.ndarray
    length: np.ndarray
    examples: int  # examples offered (of any length)
    dropped: int  # longer than a row, left out (data.overlong=drop)
    truncated: int  # longer than a row, cut to it (data.overlong=truncate)
    too_short: int  # one token: nothing to predict
    lost_tokens: int  # tokens of dropped or truncated examples not in any row

    @property
    def rows(self) -> int:
        return len(self.starts) - 1

    @property
    def filled(self) -> int:
        """Positions holding an example's token."""
        return int(np.sum(self.length - 1))

    @property
    def padding(self) -> float:
        """The fraction of the rows' positions that are padding."""
        return 1.0 - self.filled / (self.rows * self.seq_len) if self.rows else 0.0

    def items(self, row: int) -> np.ndarray:
        """The examples of row ``row``, in order."""
        return self.example[self.starts[row] : self.starts[row + 1]]

    def describe(self) -> str:
        """One line: rows, padding, what was left out."""
        parts = [f"{self.examples:,} examples packed into {self.rows:,} rows of {self.seq_len}"]
        parts.append(f"padding {100 * self.padding:.1f} %")
        if self.dropped:
            parts.append(f"{self.dropped:,} longer than a row dropped ({self.lost_tokens:,} tokens)")
        if self.truncated:
            parts.append(f"{self.truncated:,} longer than a row truncated ({self.lost_tokens:,} tokens cut)")
        if self.too_short:
            parts.append(f"{self.too_short:,} of one token left out")
        return ", ".join(parts)


def pack(lengths: np.ndarray, seq_len: int, overlong: str = "drop") -> Packing:
    """Place examples of ``lengths`` tokens in rows of ``seq_len`` positions, best fit decreasing
    (module docstring).

    >>> pack(np.array([20, 4]), seq_len=8, overlong="truncate").length.tolist()
    [9, 4]
    """
    if overlong not in OVERLONG:
        raise UserError(f"data.overlong={overlong}: choose drop or truncate")
    if seq_len < 1:
        raise UserError(f"data.seq_len={seq_len}: packing needs rows of at least one position")
    lengths = np.asarray(lengths, np.int64)
    over = lengths - 1 > seq_len
    short = lengths < 2
    keep = ~short & (~over if overlong == "drop" else True)
    used = np.minimum(lengths, seq_len + 1)
    lost = int(np.sum(lengths[over] - (0 if overlong == "drop" else seq_len + 1)))
    index = np.flatnonzero(keep)
    sizes = used[index] - 1
    order = index[np.argsort(-sizes, kind="stable")]  # longest first, ties in example order
    row_of = np.empty(len(order), np.int64)
    open_rows: list[list[int]] = [[] for _ in range(seq_len + 1)]  # rows by the room they have left
    rooms: list[int] = []  # the sorted rooms some open row has
    count = 0
    for i, size in enumerate((used[order] - 1).tolist()):
        k = bisect.bisect_left(rooms, size)
        if k < len(rooms):
            room = rooms[k]
            row = open_rows[room].pop()
            if not open_rows[room]:
                del rooms[k]
        else:
            row, room = count, seq_len
            count += 1
        left = room - size
        if left:
            if not open_rows[left]:
                bisect.insort(rooms, left)
            open_rows[left].append(row)
        row_of[i] = row
    # Rows numbered by the first example they hold; items of a row in the order they were placed.
    first = np.full(count, np.iinfo(np.int64).max)
    np.minimum.at(first, row_of, order)
    renumber = np.empty(count, np.int64)
    renumber[np.argsort(first, kind="stable")] = np.arange(count)
    rows = renumber[row_of]
    by_row = np.argsort(rows, kind="stable")
    starts = np.zeros(count + 1, np.int64)
    np.add.at(starts, rows + 1, 1)
    return Packing(
        seq_len=seq_len,
        starts=np.cumsum(starts),
        example=order[by_row],
        length=used[order[by_row]],
        examples=len(lengths),
        dropped=int(np.sum(over)) if overlong == "drop" else 0,
        truncated=int(np.sum(over)) if overlong == "truncate" else 0,
        too_short=int(np.sum(short)),
        lost_tokens=lost,
    )


def epoch_rows(rows: int, seed: int, step: int, batch_size: int) -> np.ndarray:
    """The rows of training batch ``step``: positions ``step * batch_size ...`` of the epochs one
    after another, each epoch every row once in the order drawn from ``(seed, epoch)``.

    >>> epoch_rows(4, seed=0, step=1, batch_size=3).shape
    (3,)
    """
    where = step * batch_size + np.arange(batch_size, dtype=np.int64)
    epochs = where // rows
    out = np.empty(batch_size, np.int64)
    for e in np.unique(epochs):
        mine = epochs == e
        out[mine] = np.random.default_rng([seed, ROW_SEED, int(e)]).permutation(rows)[where[mine] % rows]
    return out


Fetch = Callable[[int, int], tuple[np.ndarray, np.ndarray | None]]


def assemble(packing: Packing, rows: np.ndarray, fetch: Fetch) -> dict[str, np.ndarray]:
    """The batch of packed rows ``rows`` (-1: a row of padding): ``fetch(example, n)`` gives the
    example's first ``n`` token ids and which of them are trained (None: all).

    >>> p = pack(np.array([3, 2]), seq_len=4)
    >>> b = assemble(p, np.array([0]), lambda e, n: (np.arange(n) + 10 * e, None))
    >>> b["tokens"].tolist(), b["targets"].tolist(), b["segments"].tolist(), b["positions"].tolist()
    ([[0, 1, 10, 0]], [[1, 2, 11, 0]], [[1, 1, 2, 0]], [[0, 1, 0, 0]])
    """
    size, width = len(rows), packing.seq_len
    tokens = np.zeros((size, width), np.int32)
    targets = np.zeros((size, width), np.int32)
    mask = np.zeros((size, width), np.float32)
    segments = np.zeros((size, width), np.int32)
    positions = np.zeros((size, width), np.int32)
    for b, row in enumerate(np.asarray(rows).tolist()):
        if row < 0:
            continue
        at = 0
        for k in range(int(packing.starts[row]), int(packing.starts[row + 1])):
            n = int(packing.length[k])
            ids, trained = fetch(int(packing.example[k]), n)
            span = slice(at, at + n - 1)
            tokens[b, span], targets[b, span] = ids[:-1], ids[1:]
            mask[b, span] = 1.0 if trained is None else trained[1:]
            segments[b, span] = k - int(packing.starts[row]) + 1
            positions[b, span] = np.arange(n - 1)
            at += n - 1
    return {"tokens": tokens, "targets": targets, "mask": mask, "segments": segments, "positions": positions}


def padding_table(lengths: np.ndarray, seq_lens: tuple[int, ...], overlong: str = "drop") -> list[dict]:
    """For each row length: rows, padding fraction and examples too long, of packing ``lengths``
    (``jaxnet prepare chat`` prints it, so a ``data.seq_len`` can be chosen)."""
    out = []
    for seq_len in seq_lens:
        p = pack(lengths, seq_len, overlong)
        out.append(
            {"seq_len": seq_len, "rows": p.rows, "padding": round(p.padding, 4), "overlong": p.dropped + p.truncated}
        )
    return out


__all__ = ["OVERLONG", "Packing", "assemble", "epoch_rows", "pack", "padding_table"]

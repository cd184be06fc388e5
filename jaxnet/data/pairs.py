"""A preference corpus of ``jaxnet prepare preference`` (``"kind": "preference"``), read with
``data.name=tokens``: batches of pairs for ``train.objective=dpo|simpo`` (:mod:`jaxnet.preference`).

A batch of ``B`` pairs (``train.batch_size`` counts pairs, as TRL's batch size does) is ``tokens``,
``targets`` and ``mask`` of shape ``(B, 2, data.seq_len)``: row 0 of a pair its prompt and chosen
reply, row 1 its prompt and rejected reply, each padded alone (pairs are not packed together), and
``mask`` 1 on the targets that are the reply's tokens. A sequence of ``n`` tokens fills ``n - 1``
positions; a pair with a sequence longer than that is dropped (``data.overlong=drop``), or both its
sequences are cut to the row (``truncate``; a pair whose cut leaves a reply no token is dropped), and
the run's first line counts them.

Training batch ``step`` takes pairs ``step * B ... step * B + B - 1`` of an endless sequence of
epochs, each every usable pair once in an order drawn from ``(seed, epoch)``
(:func:`jaxnet.data.packing.epoch_rows`), so a run resumes exactly and a process reads only its own
pairs. Evaluation walks a split's usable pairs in order (its first ``train.eval_tokens / (2 *
data.seq_len)`` when capped), the last batch filled with pairs of padding that count in no metric.

>>> ds = load(Path("corpora/pairs"), manifest, cfg.data)         # doctest: +SKIP
>>> ds.describe()                                                 # doctest: +SKIP
'1,200 training pairs (...) of hf:... tokens, vocabulary 32,000'
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from jaxnet.data import packing as packing_lib
from jaxnet.data import shards as shards_lib
from jaxnet.data.text import TextDataset
from jaxnet.errors import UserError

SPLITS = ("train", "val", "test")


@dataclass(frozen=True)
class Usable:
    """The pairs of a split a run trains or evaluates on at its ``data.seq_len``: ``pairs`` (indices
    into the split), ``lengths`` ``(len(pairs), 2)`` (the tokens of each sequence it uses, cut to the
    row), and how many were ``dropped`` or ``truncated``."""

    pairs: np.ndarray
    lengths: np.ndarray
    dropped: int
    truncated: int

    def describe(self, seq_len: int) -> str:
        parts = [f"{len(self.pairs):,} pairs in rows of {seq_len}"]
        if self.dropped:
            parts.append(f"{self.dropped:,} longer dropped (data.overlong)")
        if self.truncated:
            parts.append(f"{self.truncated:,} longer truncated (data.overlong)")
        return ", ".join(parts)


class PreferenceDataset(TextDataset):
    """The pairs of a preference corpus by split (see the module's docstring): each split's token ids
    (:class:`~jaxnet.data.shards.ShardedTokens`, read as batches need them), the reply masks, each
    sequence's length, and ``preference``, the corpus.json record of how they were made."""

    #: Sequences a training example (a pair) holds: the throughput counts both.
    sequences_per_example = 2

    def __init__(
        self,
        splits: dict[str, shards_lib.ShardedTokens],
        masks: dict[str, shards_lib.ShardedTokens],
        lengths: dict[str, np.ndarray],
        vocab: list[str],
        record: dict[str, Any],
        name: str,
        preference: dict[str, Any],
    ):
        self.train, self.val, self.test = (splits[s] for s in SPLITS)
        self.masks, self._lengths = masks, lengths
        self.vocab, self.tokenizer, self.name, self.record = vocab, record["name"], name, dict(record)
        self.preference = preference
        self.chat_template = preference.get("template")  # conversational pairs: what sample --chat renders by
        if len(set(vocab)) != len(vocab):
            raise UserError(f"the vocabulary of {name} has repeated tokens")
        self.index = {t: i for i, t in enumerate(vocab)}
        self._usable: dict[tuple, Usable] = {}
        self._fitted = ""
        self._starts = {s: np.concatenate([[0], np.cumsum(self._lengths[s])]) for s in SPLITS}

    @property
    def tokenizer_record(self) -> dict[str, Any]:
        """The corpus's tokenizer as ``corpus.json`` records it (:func:`jaxnet.tokenizers.check_fits`)."""
        return dict(self.record)

    def pairs(self, split: str) -> int:
        """Pairs in ``split`` (of any length)."""
        return len(self._lengths[split]) // 2

    def size(self, split: str) -> int:
        """Pairs in ``split``."""
        return self.pairs(split)

    def describe(self) -> str:
        """One line for the run's first message (with what fits a row, once :meth:`check` ran)."""
        shapes = ", ".join(f"{n:,} {k}" for k, n in sorted(self.preference.get("shapes", {}).items()))
        return (
            f"{self.pairs('train'):,} training preference pairs ({shapes}; {len(self.train):,} {self.tokenizer} "
            f"tokens), vocabulary {len(self.vocab):,}{self._fitted}"
        )

    def _check_batching(self, cfg: Any) -> None:
        if cfg.data.batching:
            raise UserError(
                f"data.batching={cfg.data.batching}: {self.name} is a preference corpus, trained on pairs each "
                "sequence in a row of its own; leave data.batching unset"
            )

    def usable(self, cfg: Any, split: str) -> Usable:
        """The pairs of ``split`` at ``data.seq_len`` under ``data.overlong`` (computed once)."""
        key = (split, cfg.data.seq_len, cfg.data.overlong)
        if key not in self._usable:
            self._usable[key] = self._fit(split, cfg.data.seq_len, cfg.data.overlong)
        return self._usable[key]

    def _fit(self, split: str, seq_len: int, overlong: str) -> Usable:
        if overlong not in packing_lib.OVERLONG:
            raise UserError(f"data.overlong={overlong}: choose drop or truncate")
        lengths = self._lengths[split].reshape(-1, 2)
        over = np.any(lengths - 1 > seq_len, axis=1)
        keep = ~over
        used = np.minimum(lengths, seq_len + 1)
        dropped = truncated = 0
        if overlong == "truncate":
            masks = (self.masks or {}).get(split)
            for p in np.flatnonzero(over):  # a cut that leaves a reply no target: nothing to compare
                at = self._starts[split][2 * p : 2 * p + 2]
                left = [masks.read(int(a) + 1, int(a) + int(n)).sum() for a, n in zip(at, used[p], strict=True)]
                keep[p] = min(left) > 0
            truncated = int(np.sum(over & keep))
            dropped = int(np.sum(over & ~keep))
        else:
            dropped = int(np.sum(over))
        pairs = np.flatnonzero(keep)
        return Usable(pairs, used[pairs], dropped, truncated)

    def check(self, cfg: Any) -> None:
        """One-line errors for a batch the training pairs cannot fill; the fit said in :meth:`describe`."""
        self._check_batching(cfg)
        u = self.usable(cfg, "train")
        if not len(u.pairs):
            raise UserError(
                f"no training pair of {self.name} fits a row of data.seq_len={cfg.data.seq_len} "
                f"({u.describe(cfg.data.seq_len)}); raise data.seq_len or set data.overlong=truncate"
            )
        self._fitted = f"; {u.describe(cfg.data.seq_len)}"

    def sample(self, cfg: Any) -> dict[str, np.ndarray]:
        """A batch of one pair of one position: the shapes the model and the task are checked on."""
        zeros = np.zeros((1, 2, 1), np.int32)
        return {"tokens": zeros, "targets": zeros, "mask": zeros.astype(np.float32)}

    def default_task(self, cfg: Any) -> Any:
        """The preference objective ``train.objective`` names (:func:`jaxnet.preference.from_config`)."""
        from jaxnet import preference

        return preference.from_config(cfg)

    def _assemble(self, split: str, u: Usable, chosen: np.ndarray, seq_len: int) -> dict[str, np.ndarray]:
        """The batch of usable pairs ``chosen`` (positions in ``u``; -1: a pair of padding)."""
        size = len(chosen)
        tokens = np.zeros((size, 2, seq_len), np.int32)
        targets = np.zeros((size, 2, seq_len), np.int32)
        mask = np.zeros((size, 2, seq_len), np.float32)
        ids, masks, starts = getattr(self, split), (self.masks or {})[split], self._starts[split]
        for b, k in enumerate(np.asarray(chosen).tolist()):
            if k < 0:
                continue
            pair = int(u.pairs[k])
            for j in range(2):
                at, n = int(starts[2 * pair + j]), int(u.lengths[k, j])
                seq = ids.read(at, at + n)
                tokens[b, j, : n - 1], targets[b, j, : n - 1] = seq[:-1], seq[1:]
                mask[b, j, : n - 1] = masks.read(at + 1, at + n)
        return {"tokens": tokens, "targets": targets, "mask": mask}

    def train_batches(self, cfg: Any, start_step: int, rows: slice = slice(None)) -> Iterator[dict[str, np.ndarray]]:
        """Endless training batches of pairs from ``start_step`` on (module docstring); only rows ``rows``."""
        u = self.usable(cfg, "train")
        step = start_step
        while True:
            chosen = packing_lib.epoch_rows(len(u.pairs), cfg.seed, step, cfg.train.batch_size)[rows]
            yield self._assemble("train", u, chosen, cfg.data.seq_len)
            step += 1

    def _eval_pairs(self, cfg: Any, split: str) -> int:
        n = len(self.usable(cfg, split).pairs)
        cap = -(-cfg.train.eval_tokens // (2 * cfg.data.seq_len)) if cfg.train.eval_tokens else n
        return min(n, cap)

    def eval_rows(self, cfg: Any, split: str) -> int:
        """Pairs of an evaluation batch of ``split`` (0 = no usable pair)."""
        return min(cfg.train.eval_batch_size, self._eval_pairs(cfg, split))

    def eval_batches(
        self, cfg: Any, split: str, batch_size: int, rows: slice = slice(None)
    ) -> Iterator[dict[str, np.ndarray]]:
        """The usable pairs of ``split`` in order, ``batch_size`` a batch (the last filled with pairs
        of padding); only rows ``rows`` of each."""
        u, total = self.usable(cfg, split), self._eval_pairs(cfg, split)
        for first in range(0, total, batch_size):
            chosen = np.arange(first, first + batch_size)
            chosen[chosen >= total] = -1
            yield self._assemble(split, u, chosen[rows], cfg.data.seq_len)


def load(path: Path, manifest: dict[str, Any], vocab: list[str]) -> PreferenceDataset:
    """The preference corpus at ``path`` whose ``corpus.json`` is ``manifest`` (each file's size
    checked against it), its ids named by ``vocab``."""
    splits, masks, lengths = {}, {}, {}
    for s in SPLITS:
        files, flags, counts = [], [], []
        for x in manifest["splits"][s]["shards"]:
            files.append(shards_lib.open_shard(path / x["file"], x["tokens"]))
            mask = shards_lib.open_flat(path / x["mask"]["file"], np.uint8)
            if mask.count != x["tokens"]:
                raise UserError(
                    f"{mask.path} holds {mask.count:,} bytes but corpus.json says {x['tokens']:,} tokens; prepare the "
                    "corpus again"
                )
            flags.append(mask)
            try:
                counts.append(np.fromfile(path / x["lengths"]["file"], "<u4").astype(np.int64))
            except OSError as e:
                raise UserError(f"cannot read {path / x['lengths']['file']}: {e}; prepare the corpus again") from None
            if len(counts[-1]) != x["sequences"] or counts[-1].sum() != x["tokens"] or x["sequences"] % 2:
                raise UserError(
                    f"{path / x['lengths']['file']} does not hold the {x['sequences']:,} sequence lengths of "
                    f"{x['file']}; prepare the corpus again"
                )
        splits[s] = shards_lib.ShardedTokens(files)
        masks[s] = shards_lib.ShardedTokens(flags)
        lengths[s] = np.concatenate(counts) if counts else np.zeros(0, np.int64)
        largest, ids = manifest["splits"][s]["max_id"], int(manifest["tokenizer"]["vocab_size"])
        if largest is not None and largest >= ids:
            raise UserError(
                f"the {s} split of {path.name} holds token id {largest}, beyond the {ids:,} ids of its tokenizer: "
                "its shards are damaged or were written with another tokenizer; prepare the corpus again"
            )
    return PreferenceDataset(splits, masks, lengths, vocab, manifest["tokenizer"], path.name, manifest["preference"])


__all__ = ["PreferenceDataset", "Usable", "load"]

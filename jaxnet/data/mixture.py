"""``data.mixture``: several prepared corpora of one tokenizer, mixed by weight, resumable exactly.

``data.mixture=DIR_A:0.7,DIR_B:0.3`` trains on windows of ``data.seq_len`` tokens drawn from each
corpus (jaxnet prepare's, nanoGPT's or llm.c's directories, as ``data.name=tokens`` reads them) so
that, over the run, each corpus's share of the rows follows its weight (weights are normalised);
``data.mixture_schedule=STEP:W1/W2,...`` changes the weights from a step on.

**Which corpus a row comes from.** Row ``r`` of the run (row ``j`` of batch ``step`` is
``r = step * batch + j``) is given a point ``x_r = (P * r + offset) mod Q`` of a golden-ratio
sequence (``offset`` from the seed), and belongs to the corpus whose slice of ``[0, Q)`` holds it:
slices as wide as the weights. The points of any run of consecutive rows spread evenly over the
slices, so every stretch of rows, a batch included, holds each corpus in its proportion to within
a few rows, and how many of the first ``R`` rows each corpus has is a sum of floors
(:func:`floor_sum`) computed in a few dozen operations however large ``R`` is. So batch ``step``
is a pure function of ``(seed, step)``: a resumed run reads the batches an uninterrupted one
would, and each process of a multi-host run reads only its rows.

**Which window.** A corpus of ``N`` training tokens is cut into ``n = (N - T) // T`` windows of
``T + 1`` tokens (``T = data.seq_len``); its ``k``-th row overall reads window ``perm_e[k % n]`` of
pass ``e = k // n``, each pass in its own order drawn from ``(seed, corpus, e)``, its window
boundaries shifted by a draw in ``[0, T)``. A corpus whose ``n`` windows have all been read
**runs out**: ``data.mixture_end=cycle`` starts its next pass; ``stop`` ends the run at that step
(``train.steps`` becomes it, said when the run starts, so the learning-rate schedule ends there).

**Logs.** Each training log line holds ``tokens/NAME``, the tokens read so far from each corpus
(``NAME`` is its directory's name); validation reports the loss over every corpus's validation
tokens together (the first ``train.eval_tokens`` predictions of each) and ``NAME/loss`` per corpus.

>>> cfg = jaxnet.apply_overrides(jaxnet.load_experiment("gpt2_shakespeare"),
...     ["data.mixture=corpora/shakespeare-gpt2:0.8,corpora/ptb-gpt2:0.2"])   # doctest: +SKIP
>>> tokens.load(cfg.data).describe()                                            # doctest: +SKIP
'mixture of 2 corpora: shakespeare-gpt2 0.8 (1,482,404 tokens), ptb-gpt2 0.2 (1,046,400 tokens), gpt2'
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from jaxnet.config import DataConfig, batching, mixture_schedule, mixture_sources
from jaxnet.data import text as text_lib
from jaxnet.errors import UserError

Q = 1 << 31  # the points' range: weights are resolved to 1 / Q
P = int(round((math.sqrt(5) - 1) / 2 * Q)) | 1  # the golden-ratio step, odd so that every point is met
MIX_STREAM = 5  # default_rng([seed, MIX_STREAM, ...]) draws the offset and each pass's order


def floor_sum(n: int, m: int, a: int, b: int) -> int:
    """``sum(floor((a * i + b) / m) for i in range(n))`` for integers ``n >= 0``, ``m >= 1``,
    ``a, b >= 0``, in O(log m) steps (Euclid's reduction of the lattice points under a line).

    >>> floor_sum(10, 7, 3, 2) == sum((3 * i + 2) // 7 for i in range(10))
    True
    """
    total = 0
    while n > 0:
        if a >= m:
            total += n * (n - 1) // 2 * (a // m)
            a %= m
        if b >= m:
            total += n * (b // m)
            b %= m
        top = a * n + b
        if top < m:
            break
        n, b, m, a = top // m, top % m, a, m
    return total


def below(rows: int, bound: int, offset: int) -> int:
    """How many of the points ``x_r = (P * r + offset) mod Q`` of rows ``0 .. rows - 1`` are below
    ``bound`` (``0 <= bound <= Q``).

    >>> below(1000, Q // 4, 12345) == sum((P * r + 12345) % Q < Q // 4 for r in range(1000))
    True
    """
    if bound <= 0 or rows <= 0:
        return 0
    if bound >= Q:
        return rows
    # (x mod Q) < L exactly when floor(x / Q) - floor((x - L) / Q) == 1
    return floor_sum(rows, Q, P, offset) - floor_sum(rows, Q, P, offset - bound + Q) + rows


def bounds_of(weights: tuple[float, ...]) -> np.ndarray:
    """The corpora's slices of ``[0, Q)``: ``k + 1`` integer bounds, as wide as the normalised weights.

    >>> bounds_of((3.0, 1.0)).tolist() == [0, 3 * Q // 4, Q]
    True
    """
    w = np.asarray(weights, np.float64)
    edges = np.round(np.cumsum(w / w.sum()) * Q).astype(np.int64)
    edges[-1] = Q
    return np.concatenate([[0], edges])


class Plan:
    """Which corpus each row of a run comes from, and how many rows each corpus gave before a
    step: the weights by step (``data.mixture`` from step 0, then each ``data.mixture_schedule``
    entry), the batch size and the seed.

    >>> plan = Plan([(0, (0.8, 0.2))], batch_size=8, seed=0)
    >>> plan.sources(3).shape, plan.before(200).sum()
    ((8,), 1600)
    """

    def __init__(self, segments: list[tuple[int, tuple[float, ...]]], batch_size: int, seed: int):
        self.starts = [s for s, _ in segments]
        self.weights = [tuple(w) for _, w in segments]
        self.bounds = [bounds_of(w) for w in self.weights]
        self.batch_size = batch_size
        self.offset = int(np.random.default_rng([seed, MIX_STREAM]).integers(Q))

    def segment(self, step: int) -> int:
        """Index of the weights in force at ``step``."""
        return max(i for i, s in enumerate(self.starts) if s <= step)

    def weights_at(self, step: int) -> tuple[float, ...]:
        """The normalised weights of batch ``step``."""
        w = np.asarray(self.weights[self.segment(step)])
        return tuple((w / w.sum()).tolist())

    def sources(self, step: int) -> np.ndarray:
        """The corpus of each row of batch ``step``."""
        rows = step * self.batch_size + np.arange(self.batch_size, dtype=np.int64)
        points = (P * (rows % Q) + self.offset) % Q  # < 2**62: exact in int64
        return np.searchsorted(self.bounds[self.segment(step)][1:], points, side="right")

    def before(self, step: int) -> np.ndarray:
        """Rows each corpus gave to batches ``0 .. step - 1``."""
        counts = np.zeros(len(self.bounds[0]) - 1, np.int64)
        edges = [*self.starts[1:], None]
        for start, end, bounds in zip(self.starts, edges, self.bounds, strict=True):
            if start >= step:
                break
            first, last = start * self.batch_size, min(step, end if end is not None else step) * self.batch_size
            under = np.array([below(last, int(b), self.offset) - below(first, int(b), self.offset) for b in bounds])
            counts += np.diff(under)
        return counts

    def runs_out(self, windows: list[int], limit: int) -> tuple[int, int] | None:
        """``(step, corpus)``: the first batch at or before ``limit`` that needs a row beyond the first
        pass of a corpus of ``windows[corpus]`` windows; None if none does."""
        found = None
        for i, n in enumerate(windows):
            if self.before(limit + 1)[i] <= n:
                continue
            low, high = 0, limit  # the first step whose batch (rows before step + 1) passes n
            while low < high:
                mid = (low + high) // 2
                if self.before(mid + 1)[i] > n:
                    high = mid
                else:
                    low = mid + 1
            if found is None or low < found[0]:
                found = (low, i)
        return found


class MixtureDataset(text_lib.TextDataset):
    """Prepared corpora of one tokenizer read as one training stream by weight (see the module's
    docstring); each keeps its own validation and test splits, evaluated apart and together.

    ``parts``: ``(name, TokenDataset)`` per corpus, in ``data.mixture``'s order.
    """

    def __init__(self, parts: list[tuple[str, Any]], weights: list[float]):
        self.parts, self.mixture_weights = parts, weights
        first = parts[0][1]
        self.vocab, self.tokenizer, self.name = first.vocab, first.tokenizer, "mixture"
        self.record, self.index = first.record, first.index
        self._orders: dict[tuple, tuple[int, np.ndarray]] = {}
        self._plan: tuple[tuple, Plan] | None = None

    @property
    def train(self) -> Any:  # the first corpus's, for code that asks a text dataset for its array
        return self.parts[0][1].train

    @property
    def tokenizer_record(self) -> dict[str, Any]:
        """The corpora's tokenizer as ``corpus.json`` records it."""
        return dict(self.record)

    def describe(self) -> str:
        """One line for the run's first message: each corpus with its weight and training tokens."""
        total = sum(self.mixture_weights)
        shown = ", ".join(
            f"{name} {w / total:.3g} ({len(part.train):,} tokens)"
            for (name, part), w in zip(self.parts, self.mixture_weights, strict=True)
        )
        return f"mixture of {len(self.parts)} corpora: {shown}, {self.tokenizer} tokens, vocabulary {len(self.vocab):,}"

    def size(self, split: str) -> int:
        """Tokens of ``split`` over every corpus."""
        return sum(part.size(split) for _, part in self.parts)

    def plan(self, cfg: Any) -> Plan:
        """The rows' corpora for ``cfg``'s weights, batch size and seed (built once per setting)."""
        key = (cfg.data.mixture, cfg.data.mixture_schedule, cfg.train.batch_size, cfg.seed)
        if self._plan is None or self._plan[0] != key:
            segments = [(0, tuple(self.mixture_weights)), *mixture_schedule(cfg)]
            self._plan = (key, Plan(segments, cfg.train.batch_size, cfg.seed))
        return self._plan[1]

    def windows(self, seq_len: int) -> list[int]:
        """Windows of ``seq_len + 1`` tokens in one pass over each corpus's training split."""
        return [(len(part.train) - seq_len) // seq_len for _, part in self.parts]

    def check(self, cfg: Any) -> None:
        """One-line errors for a corpus too short for one window, or batching other than windows."""
        if batching(cfg) != "windows":
            raise UserError(f"data.mixture reads windows; data.batching={batching(cfg)} is not supported with it")
        for (name, part), n in zip(self.parts, self.windows(cfg.data.seq_len), strict=True):
            if n < 1:
                raise UserError(
                    f"data.mixture: {name} has {len(part.train):,} training tokens, fewer than two windows of "
                    f"data.seq_len={cfg.data.seq_len}; lower data.seq_len or give a larger corpus"
                )

    def first_pass(self, cfg: Any) -> str:
        """A line saying where each corpus's first pass ends within ``train.steps`` and what then happens."""
        plan, steps, windows = self.plan(cfg), cfg.train.steps, self.windows(cfg.data.seq_len)
        read = plan.before(steps)
        parts = []
        for (name, _), n, rows in zip(self.parts, windows, read, strict=True):
            parts.append(f"{name} {rows / n:.2f}" + (" (runs out)" if rows > n else ""))
        what = "starts another pass" if cfg.data.mixture_end == "cycle" else "ends the run"
        return (
            f"data.mixture: passes over each corpus in {steps} steps: {', '.join(parts)}; a corpus that runs out "
            f"{what} (data.mixture_end={cfg.data.mixture_end})"
        )

    def _order(self, source: int, epoch: int, seed: int, windows: int, seq_len: int) -> tuple[int, np.ndarray]:
        """The window boundaries' shift and the order of the windows of one pass over a corpus."""
        key = (source, epoch, seed, windows, seq_len)
        if key not in self._orders:
            if len(self._orders) >= 2 * len(self.parts):  # the passes now read, and their neighbours
                self._orders.pop(next(iter(self._orders)))
            rng = np.random.default_rng([seed, MIX_STREAM, source, epoch])
            shift = int(rng.integers(seq_len))
            dtype = np.int32 if windows < 2**31 else np.int64
            self._orders[key] = (shift, rng.permutation(windows).astype(dtype))
        return self._orders[key]

    def train_batches(self, cfg: Any, start_step: int, rows: slice = slice(None)) -> Iterator[dict[str, np.ndarray]]:
        """Endless training batches from ``start_step`` on, only rows ``rows`` of each: batch
        ``step``'s rows from the corpora :meth:`Plan.sources` names, each row the next window of
        its corpus's pass order."""
        plan, seq_len, batch_size = self.plan(cfg), cfg.data.seq_len, cfg.train.batch_size
        windows = self.windows(seq_len)
        taken = plan.before(start_step)  # rows each corpus gave before this step
        mine = np.zeros(batch_size, bool)
        mine[rows] = True
        step = start_step
        while True:
            sources = plan.sources(step)
            block = np.zeros((batch_size, seq_len + 1), np.int32)
            for i in np.unique(sources):
                at = np.flatnonzero(sources == i)
                ordinal = taken[i] + np.arange(len(at))  # this corpus's rows so far, in row order
                keep = mine[at]
                if keep.any():
                    block[at[keep]] = self._read(i, ordinal[keep], windows[i], seq_len, cfg.seed)
                taken[i] += len(at)
            block = block[rows]
            x, y = np.ascontiguousarray(block[:, :-1]), np.ascontiguousarray(block[:, 1:])
            yield {"tokens": x, "targets": y, "reset": np.asarray(1, np.int32)}
            step += 1

    def _read(self, source: int, ordinals: np.ndarray, windows: int, seq_len: int, seed: int) -> np.ndarray:
        """The windows a corpus's ``ordinals``-th rows read (``seq_len + 1`` tokens each)."""
        starts = np.empty(len(ordinals), np.int64)
        epochs = ordinals // windows
        for e in np.unique(epochs):
            shift, order = self._order(source, int(e), seed, windows, seq_len)
            pick = epochs == e
            starts[pick] = shift + order[ordinals[pick] % windows].astype(np.int64) * seq_len
        return self.parts[source][1].train.windows(starts, seq_len + 1)

    def eval_rows(self, cfg: Any, split: str) -> int:
        """Rows of an evaluation batch (every corpus is evaluated in batches of this many)."""
        return max((part.eval_rows(cfg, split) for _, part in self.parts), default=0)

    def eval_batches(
        self, cfg: Any, split: str, batch_size: int, rows: slice = slice(None)
    ) -> Iterator[dict[str, np.ndarray]]:
        """Each corpus's evaluation batches of ``split`` one after another (every corpus's first
        ``train.eval_tokens`` predictions)."""
        for _, part in self.parts:
            if part.size(split) and part.eval_rows(cfg, split):
                yield from part.eval_batches(cfg, split, batch_size, rows)

    def seen(self, cfg: Any, step: int) -> dict[str, int]:
        """``tokens/NAME``: the training tokens read from each corpus by batches ``0 .. step - 1``
        (``data.seq_len`` predicted tokens a row)."""
        rows = self.plan(cfg).before(step)
        return {f"tokens/{name}": int(n) * cfg.data.seq_len for (name, _), n in zip(self.parts, rows, strict=True)}

    def summary(self, cfg: Any, step: int) -> dict[str, Any]:
        """summary.json's ``mixture``: per corpus its weights (first and at ``step``), the tokens read
        and their fraction of all read."""
        plan, seen = self.plan(cfg), self.seen(cfg, step)
        total = max(sum(seen.values()), 1)
        first, last = plan.weights_at(0), plan.weights_at(max(step - 1, 0))
        out = {}
        for i, (name, _) in enumerate(self.parts):
            tokens = seen[f"tokens/{name}"]
            out[name] = {"weight": first[i], "weight_at_end": last[i], "tokens": tokens, "fraction": tokens / total}
        return out


def same_tokenizer(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two corpora's tokenizer records give every id the same meaning: the same tokenizer
    kind and ids (and the same ``tokenizer.json`` or learned vocabulary where there is one)."""
    keys = ("vocab_size", "eot_id", "before", "after")
    if a.get("name", "").partition(":")[0] != b.get("name", "").partition(":")[0]:
        return False
    if any(a.get(k) != b.get(k) for k in keys):
        return False
    if (a.get("files") or {}) != (b.get("files") or {}):
        return False
    return a.get("vocab") == b.get("vocab")


def load(cfg: DataConfig, load_corpus: Any) -> MixtureDataset:
    """The corpora ``cfg.mixture`` names, each read by ``load_corpus(DataConfig)`` as
    ``data.name=tokens`` reads one (:func:`jaxnet.data.tokens.load`, which calls this); a missing
    directory, two corpora of one name, or corpora of different tokenizers are one-line errors."""
    from jaxnet.config import Config

    holder = Config()
    holder.data = cfg
    entries = mixture_sources(holder)
    parts: list[tuple[str, Any]] = []
    for path, _ in entries:
        where = Path(path)
        if not where.is_dir():
            raise UserError(
                f"data.mixture: {path} is not a directory; give corpora prepared by jaxnet prepare "
                f"(jaxnet prepare SOURCE --out {path})"
            )
        part = load_corpus(DataConfig(name="tokens", path=path, format=cfg.format, vocab_size=cfg.vocab_size))
        name = where.resolve().name
        if any(name == n for n, _ in parts):
            raise UserError(
                f"data.mixture: two corpora are named {name}; their logs are keyed by the directory's name, so "
                "rename one"
            )
        if getattr(part, "preference", None) is not None:
            raise UserError(f"data.mixture: {path} is a preference corpus (pairs); mix plain corpora")
        if part.chat is not None:
            raise UserError(f"data.mixture: {path} is a chat corpus (packed conversations); mix plain corpora")
        if parts and not same_tokenizer(parts[0][1].record, part.record):
            first = parts[0][1]
            raise UserError(
                f"data.mixture: {path} was prepared with another tokenizer ({part.record.get('name')}, "
                f"{len(part.vocab):,} ids) than {entries[0][0]} ({first.record.get('name')}, {len(first.vocab):,} "
                "ids); prepare every corpus with the same --tokenizer"
            )
        parts.append((name, part))
    return MixtureDataset(parts, [w for _, w in entries])


def end_of_data(cfg: Any, load_data: Any, say: Any = print) -> Any:
    """``cfg`` itself, or with ``data.mixture_end=stop`` where a corpus runs out before
    ``train.steps``, a copy whose ``train.steps`` is the step it runs out at (said in one line);
    ``load_data(cfg.data)`` reads the mixture (:func:`jaxnet.data.load`)."""
    if not cfg.data.mixture or cfg.data.mixture_end != "stop":
        return cfg
    from jaxnet import config as config_lib

    dataset = load_data(cfg.data)
    dataset.check(cfg)
    found = dataset.plan(cfg).runs_out(dataset.windows(cfg.data.seq_len), cfg.train.steps - 1)
    if found is None:
        return cfg
    step, source = found
    name = dataset.parts[source][0]
    if step < 1:
        raise UserError(
            f"data.mixture: {name} runs out in the first batch (data.mixture_end=stop); lower train.batch_size or "
            "data.seq_len, or use data.mixture_end=cycle"
        )
    say(
        f"data.mixture: {name} runs out at step {step} of train.steps={cfg.train.steps}; data.mixture_end=stop ends "
        f"the run there (train.steps={step})"
    )
    return config_lib.apply_overrides(cfg, [f"train.steps={step}"])

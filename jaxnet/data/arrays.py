"""A user's own data: named splits of arrays (or of indexable datasets) that yield dict batches.

>>> data = arrays(train={"x": x, "y": y}, val={"x": xv, "y": yv}, test={"x": xt, "y": yt})  # doctest: +SKIP
>>> jaxnet.train(cfg, "runs/mine", model=MyModel(), dataset=data, task=jaxnet.tasks.regression())  # doctest: +SKIP

Batches are dicts with the split's keys. Training batch ``step`` holds the examples a permutation
drawn from ``(seed, epoch)`` puts there (:func:`jaxnet.data.pipeline.batch_indices`), so a
resumed run sees exactly the batches an uninterrupted one would. Evaluation batches walk a split
in order; the last one is padded with zeros and carries ``mask`` (1 = a real example), so the
padding never counts (a task's metrics are averaged over its own units: tokens for a token
task). Arrays are taken as they are (normalise them yourself), except that 64-bit numbers
become 32-bit, as JAX computes by default.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from jaxnet.data import pipeline
from jaxnet.errors import UserError

SPLITS = ("train", "val", "test")


class _Indexable:
    """A split given as an object with ``len()`` and ``[i]`` returning a dict of arrays (e.g. a
    grain ``MapDataset`` or a PyTorch-style dataset): rows are gathered and stacked per batch."""

    def __init__(self, source: Any, split: str):
        self.source, self.split = source, split
        try:
            first = source[0] if len(source) else None
        except Exception as e:
            raise UserError(f"{split} split: reading item 0 of {type(source).__name__} failed: {e}") from None
        if first is not None and not isinstance(first, Mapping):
            raise UserError(
                f"{split} split: {type(source).__name__}[0] is a {type(first).__name__}; "
                "items must be dicts of arrays, e.g. {'x': ..., 'y': ...}"
            )
        self.keys = tuple(first) if first is not None else ()
        self.spec = {k: (np.shape(v), _dtype(np.asarray(v))) for k, v in (first or {}).items()}

    def __len__(self) -> int:
        return len(self.source)

    def take(self, idx: np.ndarray) -> dict[str, np.ndarray]:
        """Items ``idx`` stacked per key; a one-line error for an item unlike item 0 (a key missing,
        another shape), which stacking would report without saying which."""
        columns: dict[str, list[np.ndarray]] = {k: [] for k in self.keys}
        for i in idx:
            item = self.source[int(i)]
            for key in self.keys:
                if not isinstance(item, Mapping) or key not in item:
                    raise UserError(
                        f"{self.split} split: item {int(i)} has no {key!r} (item 0 has {', '.join(self.keys)}); "
                        "give every item the same keys"
                    )
                value = np.asarray(item[key])
                if value.shape != self.spec[key][0]:
                    raise UserError(
                        f"{self.split} split: item {int(i)}'s {key!r} has shape {value.shape} but item 0's has "
                        f"{self.spec[key][0]}; give every item the same shape (pad or crop them)"
                    )
                columns[key].append(value)
        return {k: np.stack(v).astype(self.spec[k][1]) for k, v in columns.items()}


class _Arrays:
    """A split given as a dict of arrays with one row per example."""

    def __init__(self, columns: Mapping[str, Any], split: str):
        if not columns:
            raise UserError(f"{split} split is an empty dict; give it arrays, e.g. {{'x': x, 'y': y}}")
        self.columns = {}
        for key, value in columns.items():
            if not isinstance(key, str):
                raise UserError(f"{split} split: key {key!r} is not a string; name each array, e.g. 'x'")
            array = np.asarray(value)
            if array.ndim == 0:
                raise UserError(f"{split} split: {key!r} is a scalar; every array needs one row per example")
            if array.dtype == object:
                raise UserError(f"{split} split: {key!r} is not a numeric array (dtype object)")
            self.columns[key] = array.astype(_dtype(array), copy=False)
        lengths = {k: len(v) for k, v in self.columns.items()}
        if len(set(lengths.values())) > 1:
            shown = ", ".join(f"{k} has {n}" for k, n in lengths.items())
            raise UserError(
                f"{split} split: arrays of different lengths ({shown}); give every array one row per example"
            )
        self.keys = tuple(self.columns)
        self.spec = {k: (v.shape[1:], v.dtype) for k, v in self.columns.items()}

    def __len__(self) -> int:
        return len(next(iter(self.columns.values())))

    def take(self, idx: np.ndarray) -> dict[str, np.ndarray]:
        return {k: v[idx] for k, v in self.columns.items()}


def _dtype(array: np.ndarray) -> np.dtype:
    if array.dtype == np.float64:
        return np.dtype(np.float32)
    if array.dtype == np.int64:
        return np.dtype(np.int32)
    if array.dtype == np.uint64:
        return np.dtype(np.uint32)
    return array.dtype


def _split(source: Any, split: str) -> _Arrays | _Indexable:
    if isinstance(source, Mapping):
        return _Arrays(source, split)
    if hasattr(source, "__len__") and hasattr(source, "__getitem__"):
        return _Indexable(source, split)
    raise UserError(
        f"{split} split is a {type(source).__name__}; expected a dict of arrays or a dataset with len() and [i]"
    )


class ArrayDataset:
    """Named splits (``train``, and optionally ``val`` and ``test``) of the user's own data.

    Build it with :func:`arrays`. ``num_classes`` is only used by the built-in models (pass it if
    you train one of them on your data).
    """

    def __init__(self, train: Any, val: Any = None, test: Any = None, *, num_classes: int = 0, name: str = "arrays"):
        self.name, self.num_classes = name, num_classes
        given = {"train": train, "val": val, "test": test}
        self.splits = {s: _split(v, s) for s, v in given.items() if v is not None}
        reference = self.splits["train"]
        if len(reference) == 0:
            raise UserError("the train split is empty; give it at least one example per batch")
        for split, data in self.splits.items():
            if data.keys and set(data.keys) != set(reference.keys):
                raise UserError(
                    f"{split} split has keys {', '.join(data.keys)} but train has {', '.join(reference.keys)}; "
                    "give every split the same arrays"
                )
            for key, (shape, _) in data.spec.items():
                if shape != reference.spec[key][0]:
                    raise UserError(
                        f"{split} split: {key!r} examples have shape {shape} but train's have "
                        f"{reference.spec[key][0]}; give every split examples of the same shape"
                    )

    def __len__(self) -> int:
        return len(self.splits["train"])

    def describe(self) -> str:
        """One line for the run's first message."""
        keys = ", ".join(f"{k} {d}{list(s)}" for k, (s, d) in self.splits["train"].spec.items())
        return f"{len(self):,} training examples ({keys})"

    def size(self, split: str) -> int:
        """Examples in ``split`` (0 if it was not given)."""
        return len(self.splits[split]) if split in self.splits else 0

    def sample(self, cfg: Any) -> dict[str, np.ndarray]:
        """One training example as a batch of one: the shapes the model is initialised with."""
        return self.splits["train"].take(np.arange(1))

    def label_range(self, key: str) -> tuple[int, int] | None:
        """The smallest and largest integer ``key`` over the splits given as arrays (None if no
        split holds it as integers; a dataset read item by item is not scanned)."""
        given = [d.columns.get(key) for d in self.splits.values() if isinstance(d, _Arrays) and len(d)]
        columns = [c for c in given if c is not None and np.issubdtype(c.dtype, np.integer)]
        if not columns:
            return None
        return min(int(c.min()) for c in columns), max(int(c.max()) for c in columns)

    def check(self, cfg: Any) -> None:
        """One-line errors for a batch size the data cannot fill."""
        if cfg.train.batch_size > len(self):
            raise UserError(f"train.batch_size={cfg.train.batch_size} is larger than the {len(self)} training examples")

    def train_batches(self, cfg: Any, start_step: int, rows: slice = slice(None)) -> Iterator[dict[str, np.ndarray]]:
        """Endless training batches from ``start_step`` on; only rows ``rows`` of each."""
        step, train = start_step, self.splits["train"]
        while True:
            yield train.take(pipeline.batch_indices(len(train), cfg.train.batch_size, cfg.seed, step)[rows])
            step += 1

    def default_task(self, cfg: Any) -> Any:
        """The built-in task ``cfg.task`` names; your own data has no implied task."""
        from jaxnet import tasks

        if not cfg.task:
            raise UserError(
                "your data has no default task: pass task=jaxnet.tasks.regression(...) (or classification, or your "
                "own jaxnet.Task) to jaxnet.train, define task(cfg) in the experiment file, or set task=NAME"
            )
        return tasks.from_name(cfg.task, **tasks.loss_settings(cfg))

    def eval_rows(self, cfg: Any, split: str) -> int:
        """Rows of an evaluation batch of ``split`` before rounding to the devices (0 = empty split)."""
        return min(cfg.train.eval_batch_size, self.size(split))

    def eval_batches(self, cfg: Any, split: str, batch_size: int) -> Iterator[dict[str, np.ndarray]]:
        """Every example of ``split`` once, in order, in batches of ``batch_size`` rows; the last one
        padded with zeros and ``mask`` 0."""
        data = self.splits[split]
        n = len(data)
        for start in range(0, n, batch_size):
            idx = np.arange(start, min(start + batch_size, n))
            batch = data.take(idx)
            mask = batch.pop("mask", np.ones(len(idx), np.float32)).astype(np.float32)
            pad = batch_size - len(idx)
            if pad:
                batch = {k: np.concatenate([v, np.zeros((pad, *v.shape[1:]), v.dtype)]) for k, v in batch.items()}
                mask = np.concatenate([mask, np.zeros((pad, *mask.shape[1:]), np.float32)])
            yield {**batch, "mask": mask}


def arrays(
    train: Any, val: Any = None, test: Any = None, *, num_classes: int = 0, name: str = "arrays"
) -> ArrayDataset:
    """Your own data as named splits, each a dict of arrays with one row per example (any dtype
    and shape), or a dataset with ``len()`` and ``[i]`` returning such a dict::

        data = jaxnet.data.arrays(train={"x": Xtr, "y": ytr}, val={"x": Xva, "y": yva})

    ``val`` and ``test`` are optional; without ``val`` there is no validation pass.
    """
    return ArrayDataset(train, val, test, num_classes=num_classes, name=name)


__all__ = ["ArrayDataset", "arrays"]

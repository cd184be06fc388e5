"""Batching on the host: deterministic order, augmentation, normalisation, prefetch.

The order of training examples is a pure function of (seed, epoch, step), so a run resumed at
step ``s`` sees exactly the batches an uninterrupted run would have seen, with no iterator
state to save beyond the step number.
"""

from __future__ import annotations

import functools
import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np

VALIDATION_SEED = 20240601  # fixed, so every run of an experiment validates on the same examples


def split_validation(x: np.ndarray, y: np.ndarray, val_size: int) -> tuple[tuple, tuple]:
    """Hold out ``val_size`` examples chosen by a fixed shuffle (independent of the run seed)."""
    order = np.random.default_rng(VALIDATION_SEED).permutation(len(x))
    train, val = np.sort(order[val_size:]), np.sort(order[:val_size])
    return (x[train], y[train]), (x[val], y[val])


def steps_per_epoch(num_examples: int, batch_size: int) -> int:
    """Full batches per pass over the data (the last partial batch is dropped)."""
    return num_examples // batch_size


def batch_indices(num_examples: int, batch_size: int, seed: int, step: int) -> np.ndarray:
    """Indices of the examples in training batch ``step``.

    Each epoch is a fresh permutation drawn from ``(seed, epoch)``; batch ``step`` is slice
    ``step % steps_per_epoch`` of it.
    """
    per_epoch = steps_per_epoch(num_examples, batch_size)
    epoch, index = divmod(step, per_epoch)
    return _epoch_order(num_examples, seed, epoch)[index * batch_size : (index + 1) * batch_size]


@functools.lru_cache(maxsize=2)
def _epoch_order(num_examples: int, seed: int, epoch: int) -> np.ndarray:
    order = np.random.default_rng([seed, epoch]).permutation(num_examples)
    order.flags.writeable = False  # shared by every batch of the epoch
    return order


def augment(
    images: np.ndarray, rng: np.random.Generator, padding: int = 4, rows: slice = slice(None), total: int = 0
) -> np.ndarray:
    """Random crop from a zero-padded image plus a random horizontal flip (NHWC uint8).

    ``images`` may be rows ``rows`` of a batch of ``total`` examples: the draws are made for the
    whole batch and the ones of these rows used, so every process of a multi-process run augments
    its rows exactly as a single process would.
    """
    n, h, w, _ = images.shape
    total = total or n
    padded = np.pad(images, ((0, 0), (padding, padding), (padding, padding), (0, 0)))
    dy, dx = rng.integers(0, 2 * padding + 1, size=(2, total))[:, rows]
    flip = (rng.random(total) < 0.5)[rows]
    rows = dy[:, None] + np.arange(h)[None, :]
    cols = dx[:, None] + np.arange(w)[None, :]
    out = padded[np.arange(n)[:, None, None], rows[:, :, None], cols[:, None, :]]
    out[flip] = out[flip, :, ::-1]
    return out


def normalize(images: np.ndarray, mean: np.ndarray, std: np.ndarray) -> np.ndarray:
    """uint8 pixels to float32, standardised per channel."""
    return (images.astype(np.float32) / 255.0 - mean) / std


def train_batches(
    x: np.ndarray,
    y: np.ndarray,
    *,
    batch_size: int,
    seed: int,
    start_step: int,
    mean: np.ndarray,
    std: np.ndarray,
    do_augment: bool = False,
    rows: slice = slice(None),
) -> Iterator[dict[str, np.ndarray]]:
    """Endless training batches ``{"image", "label"}`` from step ``start_step`` on.

    ``rows`` selects the rows of every batch this process feeds to its devices (all of them in a
    single-process run); only those examples are read.
    """
    rows = slice(rows.start or 0, batch_size if rows.stop is None else rows.stop)
    step = start_step
    while True:
        idx = batch_indices(len(x), batch_size, seed, step)[rows]
        images = x[idx]
        if do_augment:
            images = augment(images, np.random.default_rng([seed, 1, step]), rows=rows, total=batch_size)
        yield {"image": normalize(images, mean, std), "label": y[idx]}
        step += 1


def eval_batches(
    x: np.ndarray, y: np.ndarray, *, batch_size: int, mean: np.ndarray, std: np.ndarray
) -> Iterator[dict[str, np.ndarray]]:
    """Every example once, in order, in batches of one fixed shape.

    The last batch (or the only one, for a split smaller than ``batch_size``) is padded to
    ``batch_size`` and carries a ``mask`` (1 = real example), so evaluation compiles once whatever
    the split size.
    """
    for start in range(0, len(x), batch_size):
        images, labels = x[start : start + batch_size], y[start : start + batch_size]
        mask = np.ones(len(labels), np.float32)
        pad = batch_size - len(labels)
        if pad:
            images = np.concatenate([images, np.zeros((pad, *images.shape[1:]), images.dtype)])
            labels = np.concatenate([labels, np.zeros(pad, labels.dtype)])
            mask = np.concatenate([mask, np.zeros(pad, np.float32)])
        yield {"image": normalize(images, mean, std), "label": labels, "mask": mask}


def prefetch(batches: Iterable[Any], size: int, place: Callable[[Any], Any] = lambda b: b) -> Iterator[Any]:
    """Prepare and ``place`` (e.g. ``jax.device_put``) up to ``size`` batches ahead on a thread.

    With ``size=0`` batches are prepared in the caller's thread. Errors in the producer are
    raised in the consumer.
    """
    if size <= 0:
        yield from map(place, batches)
        return
    buffer: queue.Queue = queue.Queue(maxsize=size)
    stop = threading.Event()
    done = object()

    def offer(item: Any) -> bool:
        while not stop.is_set():
            try:
                buffer.put(item, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for batch in batches:
                if stop.is_set() or not offer(place(batch)):
                    return
            offer(done)
        except BaseException as e:  # handed to the consumer, which re-raises it
            offer(e)

    thread = threading.Thread(target=produce, name="jaxnet-prefetch", daemon=True)
    thread.start()
    try:
        while True:
            item = buffer.get()
            if item is done:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        # Join rather than abandon the thread: one killed inside a device copy at interpreter
        # exit takes the process down with it.
        stop.set()
        thread.join()

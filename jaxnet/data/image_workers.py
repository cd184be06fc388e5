"""Per-row work on images (:class:`BatchWork`), run in this process or in grain's worker processes
(:func:`run_batches`).

A training row's random numbers come from ``(seed, step, row)``, ``row`` its position in the
global batch, so a batch is a pure function of ``(seed, step)``: the same on resume and on any
number of processes, each process decoding only its rows. With ``data.workers=N`` the work runs in
N grain worker processes (``MapDataset.mp_prefetch``), each taking every N-th batch; the workers
run with ``JAX_PLATFORMS=cpu`` and never start an accelerator. A worker that dies is a one-line
error naming the file it was reading.

>>> batches = run_batches(work, count=10, workers=2)      # doctest: +SKIP
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from jaxnet.data import pipeline
from jaxnet.data.image_decode import CorruptImage, center, check_size, decode, random_resized_crop
from jaxnet.data.image_records import FileSource, RecordSource
from jaxnet.errors import UserError

AUGMENT_STREAM = 3  # random numbers of a training row: default_rng([seed, AUGMENT_STREAM, step, row])


_STATUS: Any = None  # in a worker: the file it writes the name of the image it is reading into


def _worker_init(status_dir: str, index: int, count: int) -> None:
    """Run first in each grain worker process: keep it off any accelerator (grain imports JAX, and
    a spawned process would otherwise start the GPU backend on first use), and open the file that
    names the image it reads, for the message if it dies."""
    global _STATUS
    os.environ["JAX_PLATFORMS"] = "cpu"
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    if "jax" in sys.modules:
        sys.modules["jax"].config.update("jax_platforms", "cpu")
    _STATUS = open(os.path.join(status_dir, f"worker-{os.getpid()}"), "w")  # noqa: SIM115 - lives with the process


def _reading(name: str) -> None:
    if _STATUS is not None:
        _STATUS.seek(0)
        _STATUS.write(name + "\n")
        _STATUS.truncate()
        _STATUS.flush()


class BatchWork:
    """Rows ``rows`` of batch ``k`` (training step ``start + k``, or evaluation batch ``k``) as uint8
    images and labels: a picklable function of the batch number, for grain's ``MapDataset.map``.

    Training: the rows' examples are :func:`~jaxnet.data.pipeline.batch_indices` of the step; with
    ``augment`` a random resized crop and flip from ``default_rng([seed, 3, step, row])``, else the
    evaluation transform. Evaluation: rows ``rows`` of examples ``k*batch .. (k+1)*batch`` in order,
    the last batch padded with zeros, ``mask`` 0. With ``skip_corrupt`` an unreadable training image is replaced by
    the next readable example of the source (a pure function of the data, so the batch is still
    the same on every process count) and an evaluation one masked out; ``skipped`` names them, once per
    time met.
    """

    def __init__(
        self,
        source: FileSource | RecordSource,
        *,
        size: int,
        channels: int,
        batch_size: int,
        rows: slice,
        train: bool,
        seed: int = 0,
        start: int = 0,
        augment: bool = False,
        skip_corrupt: bool = False,
        upscale: bool = False,
    ):
        self.source, self.size, self.channels, self.batch_size = source, size, channels, batch_size
        self.rows, self.train, self.seed, self.start = rows, train, seed, start
        self.augment, self.skip_corrupt, self.upscale = augment, skip_corrupt, upscale

    def image(self, i: int, rng: np.random.Generator | None) -> np.ndarray:
        """Example ``i`` decoded and transformed (augmented with ``rng`` if given)."""
        name = self.source.name(i) if isinstance(self.source, FileSource) else f"record {i}"
        _reading(name)
        try:
            image = decode(self.source.read(i), name, self.channels)
        except CorruptImage as e:
            if isinstance(self.source, RecordSource):  # name the image the record holds; still skippable
                raise CorruptImage(e.what.replace(name, self.source.name(i), 1)) from None
            raise
        except UserError as e:
            if isinstance(self.source, RecordSource):
                raise UserError(str(e).replace(name, self.source.name(i), 1)) from None
            raise
        if rng is not None:
            return random_resized_crop(image, self.size, rng)
        check_size(
            image, self.size, self.source.name(i) if isinstance(self.source, RecordSource) else name, self.upscale
        )
        return center(image, self.size)

    def __call__(self, k: int) -> dict[str, np.ndarray]:
        size, c, n = self.size, self.channels, len(self.source)
        if self.train:
            step = self.start + int(k)
            idx = pipeline.batch_indices(n, self.batch_size, self.seed, step)[self.rows]
            positions = range(self.rows.start or 0, (self.rows.start or 0) + len(idx))
            mask = np.ones(len(idx), np.float32)
        else:  # rows ``rows`` of evaluation batch k: examples k * batch_size + rows, padding past the end
            first = int(k) * self.batch_size
            start, stop = self.rows.start or 0, self.batch_size if self.rows.stop is None else self.rows.stop
            idx = np.arange(first + start, min(first + stop, n))
            positions = range(len(idx))
            mask = np.ones(stop - start, np.float32)
            mask[len(idx) :] = 0
        images = np.zeros((len(mask), size, size, c), np.uint8)
        labels = np.zeros(len(mask), np.int32)
        skipped: list[str] = []
        for j, (i, row) in enumerate(zip(idx, positions, strict=True)):
            i = int(i)
            for tries in range(n):
                rng = (
                    np.random.default_rng([self.seed, AUGMENT_STREAM, step, row])
                    if self.train and self.augment
                    else None
                )
                try:
                    images[j] = self.image(i, rng)
                    labels[j] = self.source.labels[i]
                    break
                except CorruptImage:
                    if not self.skip_corrupt or tries == n - 1:
                        raise
                    skipped.append(self.source.name(i))
                    if not self.train:
                        mask[j] = 0
                        break
                    i = (i + 1) % n  # the next example stands in for the unreadable one
        _reading("")
        names = np.asarray(skipped, dtype=str) if skipped else np.zeros(0, "<U1")  # fixed-width text: no objects
        return {"image": images, "label": labels, "mask": mask, "skipped": names}


def default_workers() -> int:
    """``data.workers=-1``: the cores left after the training process's own, at least 1."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return max(1, cores - 1)


def _parse_flags() -> None:
    """grain reads absl flags, which a program that is not an absl app has not parsed."""
    from absl import flags

    if not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()


def run_batches(work: Any, count: int, workers: int, buffer: int = 2) -> Iterator[dict[str, np.ndarray]]:
    """``work(0), work(1), ... work(count - 1)`` in order, computed in ``workers`` grain worker
    processes (each takes every ``workers``-th, ``buffer`` ahead) or, with 0, here.

    A worker killed (out of memory, a signal) is a :class:`UserError` naming the file it was
    reading; an error raised in a worker (a corrupt image) comes back as it was raised.
    """
    if workers <= 0:
        for k in range(count):
            yield work(k)
        return
    import atexit
    import functools

    import grain

    _parse_flags()
    atexit.unregister(_release_shared_memory)
    atexit.register(_release_shared_memory)
    status = tempfile.mkdtemp(prefix="jaxnet-loader-")
    ds = grain.MapDataset.range(count).map(work)
    ds = ds.to_iter_dataset(grain.ReadOptions(num_threads=0, prefetch_buffer_size=0))
    ds = ds.mp_prefetch(
        grain.MultiprocessingOptions(num_workers=workers, per_worker_buffer_size=buffer),
        worker_init_fn=functools.partial(_worker_init, status),
    )
    it = iter(ds)
    batch = None
    try:
        while True:
            try:
                batch = next(it)
            except StopIteration:
                return
            except RuntimeError as e:
                if "terminated unexpectedly" not in str(e):
                    raise
                raise UserError(_dead_worker_message(status, str(e))) from None
            yield {k: np.array(v) for k, v in batch.items()}  # copies out of grain's shared memory
    finally:
        close = getattr(it, "close", None)
        if close is not None:
            close()
        del it, ds, batch  # the last batch too: an error's traceback keeps this frame alive
        import gc

        gc.collect()  # grain's shared memory of batches still in flight, freed now rather than at exit
        for f in Path(status).glob("worker-*"):
            f.unlink(missing_ok=True)
        try:
            os.rmdir(status)
        except OSError:
            pass


def _release_shared_memory() -> None:
    """At exit: unlink the shared memory of batches that grain's workers had sent when a loader
    stopped early (an error, the end of training). grain's prefetch threads still hold the last
    of them and never end, so their arrays are never deleted, and Python's resource tracker would
    print "There appear to be N leaked shared_memory objects" after jaxnet's own last line."""
    import gc

    from grain.multiprocessing import SharedMemoryArray

    for obj in gc.get_objects():
        if type(obj) is SharedMemoryArray and obj._unlink_on_del and obj.shm is not None:  # type(): no __class__ hooks
            obj._unlink_on_del = False  # its own deletion, if it ever comes, only closes it
            try:
                obj.shm.unlink()  # which also tells the resource tracker it is gone
            except FileNotFoundError:
                pass


def _dead_worker_message(status: str, error: str) -> str:
    code = error.split("exit code ")[-1].split(".")[0] if "exit code" in error else "?"
    reading = []
    for f in sorted(Path(status).glob("worker-*")):
        pid = int(f.name.split("-")[1])
        try:
            os.kill(pid, 0)
            continue  # alive
        except ProcessLookupError:
            pass
        except PermissionError:
            continue
        name = f.read_text().strip()
        reading.append(name or "(between images)")
    where = f" while reading {', '.join(reading)}" if reading else ""
    return (
        f"a data worker process died (exit code {code}){where}; if it ran out of memory lower data.workers or "
        "train.batch_size, if that file is damaged remove it (data.workers=0 decodes in this process)"
    )

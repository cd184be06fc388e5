"""Images read from files at any size: an image folder (``data.name=folder``) or ArrayRecord shards
(``data.name=arrayrecord``), decoded a batch at a time, optionally in grain's worker processes.

The three parts of a dataset on disk (see ARCHITECTURE.md):

- a **source** with a length and random access: :class:`FileSource` (one image file per example)
  or :class:`RecordSource` (records of ArrayRecord shards, laid out as :func:`pack_record` writes
  them);
- the **index rule** of the in-memory images, :func:`jaxnet.data.pipeline.batch_indices`: batch
  ``step`` holds the examples an epoch permutation drawn from ``(seed, epoch)`` puts there;
- per-row **work**, :class:`BatchWork`: read, decode (Pillow), resize or randomly crop, flip. A
  training row's random numbers come from ``(seed, step, row)``, ``row`` its position in the
  global batch, so a batch is a pure function of ``(seed, step)``: the same on resume and on any
  number of processes, each process decoding only its rows. Nothing else is state: no grain
  iterator state needs saving, a resumed run rebuilds its loader at the step it starts from.

With ``data.workers=N`` the work runs in N grain worker processes (``MapDataset.mp_prefetch``),
each taking every N-th batch; the workers run with ``JAX_PLATFORMS=cpu`` and never start an
accelerator. A worker that dies is a one-line error naming the file it was reading.

>>> ds = load(DataConfig(name="folder", path="pets", image_size=64))   # doctest: +SKIP
>>> ds.describe()                                                        # doctest: +SKIP
'3,680 training images of 37 classes (64x64x3, from files), 1 worker process'
"""

from __future__ import annotations

import glob as glob_lib
import io
import json
import os
import struct
import sys
import tempfile
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from jaxnet import tasks
from jaxnet.data import pipeline
from jaxnet.errors import UserError

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm", ".pgm")
"""File names (case-insensitive) read as images; other files in a class folder are ignored."""

GREY_MODES = ("1", "L", "LA", "I", "I;16", "F")
"""Pillow modes read as one channel; every other mode is colour (three channels, RGB)."""

SPLITS = ("train", "val", "test")
SAMPLE_SIZE = 1000
"""Training images (a fixed sample) the channel count, common size and normalisation statistics
are read from."""

AUGMENT_STREAM = 3  # random numbers of a training row: default_rng([seed, AUGMENT_STREAM, step, row])
CROP_SCALE = (0.08, 1.0)  # random resized crop: fraction of the image's area, and aspect ratios (Inception's)
CROP_RATIO = (3 / 4, 4 / 3)

RECORD_MAGIC = b"JXI1"
RECORD_HEADER = struct.Struct("<4sIH")  # magic, label, length of the name
MANIFEST = "images.json"
FORMAT = "jaxnet-images/1"


class CorruptImage(UserError):
    """An image file that cannot be read or decoded (skipped, counted, with ``data.skip_corrupt``)."""


# ---------------------------------------------------------------------------------------------
# Decoding and the per-row transforms (pure functions of the bytes and the random numbers)


def decode(data: bytes, name: str, channels: int) -> np.ndarray:
    """Encoded image bytes to uint8 ``(height, width, channels)``.

    ``channels=3``: any colour mode becomes RGB (palette, CMYK, alpha dropped) and greyscale is
    repeated into three channels, as torchvision's ImageFolder does. ``channels=1``: greyscale
    modes only; a colour image is an error naming it. A file Pillow cannot read is an error naming it.

    >>> decode(open("cat.png", "rb").read(), "cat.png", 3).shape     # doctest: +SKIP
    (375, 500, 3)
    """
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as image:
            image.load()
            if channels == 1 and image.mode not in GREY_MODES:
                raise UserError(
                    f"{name} is a colour image ({image.mode}) but the dataset's images are greyscale (1 channel): "
                    "mixed channel counts; convert it to greyscale (or the others to colour)"
                )
            converted = image.convert("L" if channels == 1 else "RGB")
    except UserError:
        raise
    except Exception as e:  # Pillow raises OSError, SyntaxError, ValueError, DecompressionBombError ...
        raise CorruptImage(
            f"{name} is not a readable image ({type(e).__name__}: {str(e)[:120]}); replace or remove it, or set "
            "data.skip_corrupt=true to skip unreadable images"
        ) from None
    array = np.asarray(converted, np.uint8)
    return array[..., None] if array.ndim == 2 else array


def _pil(image: np.ndarray) -> Any:
    from PIL import Image

    return Image.fromarray(image[..., 0] if image.shape[-1] == 1 else image)


def _array(image: Any, channels: int) -> np.ndarray:
    array = np.asarray(image, np.uint8)
    return array[..., None] if channels == 1 else array


def check_size(image: np.ndarray, size: int, name: str, upscale: bool) -> None:
    """A one-line error if ``image`` is smaller than ``size`` on its short side and ``upscale`` is off."""
    if not upscale and min(image.shape[:2]) < size:
        h, w = image.shape[:2]
        raise UserError(
            f"{name} is {w}x{h}, smaller than data.image_size={size}; remove it, lower data.image_size, or set "
            "data.upscale=true to enlarge small images"
        )


def center(image: np.ndarray, size: int) -> np.ndarray:
    """Evaluation's transform: resize so the short side is ``size`` (bilinear), then crop the central
    ``size`` x ``size``. An image already ``size`` x ``size`` is returned as it is."""
    h, w, c = image.shape
    if (h, w) == (size, size):
        return image
    if min(h, w) != size:
        scale = size / min(h, w)
        nh, nw = max(size, round(h * scale)), max(size, round(w * scale))
        image = _array(_pil(image).resize((nw, nh), resample=2), c)  # 2 = BILINEAR
        h, w = nh, nw
    top, left = (h - size) // 2, (w - size) // 2
    return image[top : top + size, left : left + size]


def random_crop_box(height: int, width: int, rng: np.random.Generator) -> tuple[int, int, int, int]:
    """A random resized crop's box ``(left, top, right, bottom)``: an area of 8-100 % of the image at
    an aspect ratio of 3/4-4/3 (log-uniform), up to ten tries, else the central crop of the
    nearest allowed ratio (the rule of torchvision's ``RandomResizedCrop``)."""
    area = height * width
    log_ratio = np.log(CROP_RATIO)
    for _ in range(10):
        target = area * rng.uniform(*CROP_SCALE)
        ratio = float(np.exp(rng.uniform(*log_ratio)))
        w = int(round(np.sqrt(target * ratio)))
        h = int(round(np.sqrt(target / ratio)))
        if 0 < w <= width and 0 < h <= height:
            top = int(rng.integers(0, height - h + 1))
            left = int(rng.integers(0, width - w + 1))
            return left, top, left + w, top + h
    ratio = width / height
    if ratio < CROP_RATIO[0]:
        w, h = width, int(round(width / CROP_RATIO[0]))
    elif ratio > CROP_RATIO[1]:
        h, w = height, int(round(height * CROP_RATIO[1]))
    else:
        w, h = width, height
    top, left = (height - h) // 2, (width - w) // 2
    return left, top, left + w, top + h


def random_resized_crop(image: np.ndarray, size: int, rng: np.random.Generator) -> np.ndarray:
    """Training's augmentation: a random crop (:func:`random_crop_box`) resized to ``size`` x ``size``
    (bilinear), flipped left-right with probability 1/2; every draw from ``rng``."""
    c = image.shape[-1]
    box = random_crop_box(image.shape[0], image.shape[1], rng)
    out = _array(_pil(image).resize((size, size), resample=2, box=box), c)
    return out[:, ::-1] if rng.random() < 0.5 else out


# ---------------------------------------------------------------------------------------------
# Sources


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


# ---------------------------------------------------------------------------------------------
# Per-row work, run in-process or in grain's workers


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
    the same on every process count) and an evaluation one masked out; ``skipped`` counts them.
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
        except UserError as e:
            if isinstance(self.source, RecordSource):  # name the image the record holds
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
        skipped = 0
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
                    skipped += 1
                    if not self.train:
                        mask[j] = 0
                        break
                    i = (i + 1) % n  # the next example stands in for the unreadable one
        _reading("")
        return {"image": images, "label": labels, "mask": mask, "skipped": np.asarray(skipped, np.int32)}


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
    import functools

    import grain

    _parse_flags()
    status = tempfile.mkdtemp(prefix="jaxnet-loader-")
    ds = grain.MapDataset.range(count).map(work)
    ds = ds.to_iter_dataset(grain.ReadOptions(num_threads=0, prefetch_buffer_size=0))
    ds = ds.mp_prefetch(
        grain.MultiprocessingOptions(num_workers=workers, per_worker_buffer_size=buffer),
        worker_init_fn=functools.partial(_worker_init, status),
    )
    it = iter(ds)
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
        del it, ds
        import gc

        gc.collect()  # grain's shared memory of batches still in flight, freed now rather than at exit
        for f in Path(status).glob("worker-*"):
            f.unlink(missing_ok=True)
        try:
            os.rmdir(status)
        except OSError:
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


# ---------------------------------------------------------------------------------------------
# The dataset


class ImageFiles:
    """Images on disk (an image folder or ArrayRecord shards) per split, with their class names, image
    size, channel count and normalisation statistics: what a :class:`jaxnet.data.Dataset` offers the
    trainer, read a batch at a time. Build one with :func:`load_folder` or :func:`load_arrayrecord`."""

    image_files = True  # the inputs record (jaxnet.train.record) says how raw image files are prepared

    def __init__(
        self,
        splits: dict[str, FileSource | RecordSource],
        classes: list[str],
        cfg: Any,
        name: str,
        origin: str,
    ):
        self.train, self.val, self.test = (splits[s] for s in SPLITS)
        self.classes, self.num_classes, self.name, self.origin = classes, len(classes), name, origin
        self.workers = default_workers() if cfg.workers < 0 else cfg.workers
        self.skip_corrupt, self.upscale = cfg.skip_corrupt, cfg.upscale
        self.skipped = 0
        sample = _sample(len(self.train))
        self.channels, shape = self._probe(sample)
        if cfg.image_size:
            self.image_size = cfg.image_size
        elif shape is None:
            raise UserError(
                f"the images of {name} differ in size; set data.image_size=N (images are resized to N on their "
                "short side and cropped to N x N)"
            )
        elif shape[0] != shape[1]:
            raise UserError(
                f"the images of {name} are {shape[1]}x{shape[0]}, not square; set data.image_size=N (resized to N on "
                "the short side, cropped to N x N)"
            )
        else:
            self.image_size = shape[0]
        if cfg.mean or cfg.std:
            mean, std = _floats(cfg.mean, "data.mean"), _floats(cfg.std, "data.std")
            if len(mean) != self.channels or len(std) != self.channels or min(std, default=0) <= 0:
                raise UserError(
                    f"data.mean={cfg.mean} and data.std={cfg.std}: give {self.channels} comma-separated values each "
                    "(pixels scaled to 0..1), std above 0; or neither, to compute them from the images"
                )
            self.mean, self.std = np.asarray(mean, np.float32), np.asarray(std, np.float32)
            self.stats_from = "given"
        else:
            self.mean, self.std = self._statistics(sample)
            self.stats_from = f"{len(sample)} training images"

    def _probe(self, sample: np.ndarray) -> tuple[int, tuple[int, int] | None]:
        """Channel count and the common ``(height, width)`` (None if they differ) of the sample,
        from the images' headers (a record is decoded). Mixed channel counts are an error."""
        from PIL import Image

        grey, colour, shapes = None, None, set()
        for i in sample:
            i = int(i)
            name = self.train.name(i) if isinstance(self.train, FileSource) else f"record {i}"
            try:
                with Image.open(io.BytesIO(self.train.read(i))) as image:
                    mode, size = image.mode, image.size
            except UserError:
                raise
            except Exception as e:
                if self.skip_corrupt:
                    continue
                raise UserError(
                    f"{self.train.name(i)} is not a readable image ({type(e).__name__}); replace or remove it, or set "
                    "data.skip_corrupt=true to skip unreadable images"
                ) from None
            if mode in GREY_MODES:
                grey = grey or name
            else:
                colour = colour or (name, mode)
            shapes.add((size[1], size[0]))
        if grey and colour:
            raise UserError(
                f"mixed channel counts: {grey} is greyscale, {colour[0]} is colour ({colour[1]}); convert the images "
                "to one kind (e.g. all RGB)"
            )
        if not shapes:
            raise UserError(f"none of the sampled training images of {self.name} could be read")
        return (1 if grey else 3), (next(iter(shapes)) if len(shapes) == 1 else None)

    def _statistics(self, sample: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per-channel mean and std (pixels scaled to 0..1) of the sample as evaluation prepares it."""
        work = BatchWork(
            self.train.subset(sample),
            size=self.image_size,
            channels=self.channels,
            batch_size=len(sample),
            rows=slice(None),
            train=False,
            skip_corrupt=self.skip_corrupt,
            upscale=self.upscale,
        )
        batch = work(0)
        x = batch["image"][batch["mask"] > 0].astype(np.float64) / 255.0
        mean, std = x.mean(axis=(0, 1, 2)), x.std(axis=(0, 1, 2))
        return mean.astype(np.float32), np.where(std > 0, std, 1.0).astype(np.float32)

    # The trainer's interface (as jaxnet.data.Dataset's)

    def describe(self) -> str:
        """One line for the run's first message."""
        workers = f"{self.workers} worker process{'es' * (self.workers != 1)}" if self.workers else "decoded in-process"
        return (
            f"{len(self.train):,} training images of {self.num_classes} classes "
            f"({self.image_size}x{self.image_size}x{self.channels}, {self.origin}), {workers}"
        )

    def size(self, split: str) -> int:
        """Examples in ``split``."""
        return len(getattr(self, split))

    def label_range(self, key: str) -> tuple[int, int] | None:
        """The smallest and largest label over every split (None for another ``key``)."""
        labels = [s.labels for s in (self.train, self.val, self.test) if len(s)]
        if key != "label" or not labels:
            return None
        return min(int(y.min()) for y in labels), max(int(y.max()) for y in labels)

    def sample(self, cfg: Any) -> dict[str, np.ndarray]:
        """A batch of one zero image: the shapes the model is initialised with."""
        return {
            "image": np.zeros((1, self.image_size, self.image_size, self.channels), np.float32),
            "label": np.zeros(1, np.int32),
        }

    def check(self, cfg: Any) -> None:
        """One-line errors for a batch size the data cannot fill."""
        if cfg.train.batch_size > len(self.train):
            raise UserError(
                f"train.batch_size={cfg.train.batch_size} is larger than the {len(self.train)} training images"
            )

    def default_task(self, cfg: Any) -> tasks.Task:
        """Classification, unless ``cfg.task`` names another task."""
        return tasks.builtin(cfg, "classification", ("classification",), "image")

    def _work(self, split: str, **kw: Any) -> BatchWork:
        return BatchWork(
            getattr(self, split),
            size=self.image_size,
            channels=self.channels,
            skip_corrupt=self.skip_corrupt,
            upscale=self.upscale,
            **kw,
        )

    def _finish(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        skipped = int(batch.pop("skipped"))
        if skipped:
            self.skipped += skipped
            warnings.warn(
                f"skipped {skipped} unreadable image(s) (data.skip_corrupt=true), {self.skipped} so far", stacklevel=2
            )
        batch["image"] = pipeline.normalize(batch["image"], self.mean, self.std)
        return batch

    def train_batches(self, cfg: Any, start_step: int, rows: slice = slice(None)) -> Iterator[dict[str, np.ndarray]]:
        """Endless normalised training batches from ``start_step`` on; only rows ``rows`` of each,
        which is all this process decodes."""
        rows = slice(rows.start or 0, cfg.train.batch_size if rows.stop is None else rows.stop)
        work = self._work(
            "train",
            batch_size=cfg.train.batch_size,
            rows=rows,
            train=True,
            seed=cfg.seed,
            start=start_step,
            augment=cfg.data.augment,
        )
        for batch in run_batches(work, 1 << 62, self.workers):
            batch.pop("mask")
            yield self._finish(batch)

    def eval_rows(self, cfg: Any, split: str) -> int:
        """Rows of an evaluation batch of ``split`` before rounding to the devices (0 = empty split)."""
        return min(cfg.train.eval_batch_size, self.size(split))

    def eval_batches(
        self, cfg: Any, split: str, batch_size: int, rows: slice = slice(None)
    ) -> Iterator[dict[str, np.ndarray]]:
        """Every example of ``split`` once, in order, normalised, in padded batches of ``batch_size``
        (``mask`` 0 on padding and on an unreadable image skipped with ``data.skip_corrupt``); only
        rows ``rows`` of each, which is all this process decodes."""
        work = self._work(split, batch_size=batch_size, rows=rows, train=False)
        count = -(-self.size(split) // batch_size)
        for batch in run_batches(work, count, min(self.workers, count)):
            yield self._finish(batch)

    def inputs_record(self) -> dict[str, Any]:
        """What ``inputs.json`` records of the images, so raw image files are prepared as in evaluation."""
        return {
            "classes": self.classes,
            "size": self.image_size,
            "channels": self.channels,
            "resize": "short side to size (bilinear), then the central size x size",
            "statistics": self.stats_from,
        }


def _floats(text: str, key: str) -> list[float]:
    try:
        return [float(v) for v in text.replace(" ", "").split(",") if v]
    except ValueError:
        raise UserError(f"{key}={text}: expected comma-separated numbers, e.g. 0.5,0.5,0.5") from None


def _sample(n: int, size: int = SAMPLE_SIZE) -> np.ndarray:
    """The fixed sample of training images (independent of the run's seed), sorted."""
    if n <= size:
        return np.arange(n)
    return np.sort(np.random.default_rng(pipeline.VALIDATION_SEED).permutation(n)[:size])


def _is_image(path: Path) -> bool:
    return path.suffix.lower() in IMAGE_SUFFIXES and path.is_file()


def list_folder(
    root: Path, classes: list[str] | None = None, what: str = ""
) -> tuple[list[str], np.ndarray, list[str]]:
    """The image files of a class-per-subdirectory folder, sorted: ``(relative names, labels,
    classes)``; ``classes`` (sorted subdirectory names) are found unless given."""
    where = what or str(root)
    subdirs = sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    if classes is None:
        if not subdirs:
            loose = [p for p in root.iterdir() if _is_image(p)]
            if loose:
                raise UserError(
                    f"{where} has image files but no class subdirectories; put each class's images in a subdirectory "
                    "named after the class (e.g. DIR/cat/1.jpg, DIR/dog/2.jpg)"
                )
            raise UserError(
                f"{where} is empty: no class subdirectories; put each class's images in a subdirectory named after "
                "the class (e.g. DIR/cat/1.jpg)"
            )
        classes = subdirs
    else:
        unknown = [d for d in subdirs if d not in classes]
        if unknown:
            raise UserError(f"{where} has class {unknown[0]!r}, which train/ lacks; give every class training images")
    names, labels = [], []
    for label, cls in enumerate(classes):
        directory = root / cls
        if not directory.is_dir():
            continue
        files = sorted(
            str(p.relative_to(root)) for p in directory.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file()
        )
        names += files
        labels += [label] * len(files)
    if not names:
        raise UserError(
            f"{where} has class subdirectories but no image files ({', '.join(IMAGE_SUFFIXES[:3])} ...) in them"
        )
    return names, np.asarray(labels, np.int32), classes


def folder_splits(path: Path) -> tuple[dict[str, FileSource | None], list[str]]:
    """The splits of an image folder: ``train/`` (``val/``, ``test/``) if it has them, else all of it
    as training images; a split it lacks is None."""
    if not path.is_dir():
        what = "is a file" if path.exists() else "does not exist"
        raise UserError(f"data.path={path} {what}; give a directory with one subdirectory of images per class")
    if (path / "train").is_dir():
        names, labels, classes = list_folder(path / "train")
        splits: dict[str, FileSource | None] = {"train": FileSource(str(path / "train"), names, labels)}
        for split, alias in (("val", "validation"), ("test", "")):
            directory = path / split if (path / split).is_dir() else path / alias if alias else None
            if directory is not None and directory.is_dir():
                n, y, _ = list_folder(directory, classes)
                splits[split] = FileSource(str(directory), n, y)
            else:
                splits[split] = None
        return splits, classes
    names, labels, classes = list_folder(path)
    return {"train": FileSource(str(path), names, labels), "val": None, "test": None}, classes


def _with_validation(splits: dict[str, Any], val_size: int, empty: Any) -> dict[str, Any]:
    """Hold out ``val_size`` training examples (the in-memory datasets' fixed-seed rule) when there
    is no validation split."""
    train = splits["train"]
    if splits["val"] is None:
        if val_size >= len(train):
            raise UserError(f"data.val_size={val_size} leaves no training data ({len(train)} images); lower it")
        order = np.random.default_rng(pipeline.VALIDATION_SEED).permutation(len(train))
        splits["train"], splits["val"] = (
            train.subset(np.sort(order[val_size:])),
            train.subset(np.sort(order[:val_size])),
        )
    if splits["test"] is None:
        splits["test"] = empty
    return splits


def load_folder(cfg: Any) -> ImageFiles:
    """``data.name=folder``: the image folder at ``cfg.path`` (a :class:`~jaxnet.config.DataConfig`).

    One subdirectory per class (sorted names are the label ids); ``train/``, ``val/`` (or
    ``validation/``) and ``test/`` subdirectories if present, else every image is a training image
    and ``data.val_size`` of them are held out for validation by the fixed-seed rule of the
    in-memory datasets.
    """
    if not cfg.path:
        raise UserError("data.name=folder needs data.path=DIR, a directory with one subdirectory of images per class")
    path = Path(cfg.path).expanduser()
    splits, classes = folder_splits(path)
    empty = FileSource(str(path), [], np.zeros(0, np.int32))
    splits = _with_validation(splits, cfg.val_size, empty)
    return ImageFiles(splits, classes, cfg, path.name, "from files")


def load_arrayrecord(cfg: Any) -> ImageFiles:
    """``data.name=arrayrecord``: ``cfg.path`` is a directory ``jaxnet prepare images`` wrote (its
    ``images.json`` names the classes and each split's shards and labels) or a glob pattern of
    ArrayRecord shards of training records (their labels read from every record once; validation
    held out as for a folder without ``val/``)."""
    if not cfg.path:
        raise UserError("data.name=arrayrecord needs data.path=DIR (from jaxnet prepare images) or a glob of shards")
    path = Path(cfg.path).expanduser()
    if path.is_dir():
        manifest_path = path / MANIFEST
        if not manifest_path.is_file():
            raise UserError(
                f"data.path={path} has no {MANIFEST}; pack a folder with jaxnet prepare images DIR --out {path} "
                "(run it again to finish an interrupted one), or give a glob of .arrayrecord shards"
            )
        manifest = read_manifest(manifest_path)
        splits: dict[str, Any] = {}
        for split in SPLITS:
            entry = manifest["splits"].get(split)
            if not entry or not entry["records"]:
                splits[split] = None
                continue
            labels = np.load(path / entry["labels"])
            if len(labels) != entry["records"]:
                raise UserError(
                    f"{path / entry['labels']} holds {len(labels)} labels, {MANIFEST} says {entry['records']}"
                )
            splits[split] = RecordSource([str(path / s["file"]) for s in entry["shards"]], labels)
        if splits["train"] is None:
            raise UserError(f"{path} has no training records; pack a folder with training images")
        classes = list(manifest["classes"])
        name = path.name
    else:
        files = sorted(glob_lib.glob(str(path)))
        if not files:
            raise UserError(f"data.path={cfg.path} matches no files; give jaxnet prepare images' --out DIR or a glob")
        import grain

        source = grain.sources.ArrayRecordDataSource(files)
        labels = np.asarray([unpack_record(source[i], f"record {i} of {files[0]}")[0] for i in range(len(source))])
        if not len(labels):
            raise UserError(f"data.path={cfg.path}: the shards hold no records")
        classes = [str(c) for c in range(int(labels.max()) + 1)]
        splits = {"train": RecordSource(files, labels), "val": None, "test": None}
        name = Path(files[0]).parent.name or "arrayrecord"
    empty = RecordSource(splits["train"].paths, np.zeros(0, np.int32), np.zeros(0, np.int64))
    splits = _with_validation(splits, cfg.val_size, empty)
    return ImageFiles(splits, classes, cfg, name, "ArrayRecord")


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


def read_image_files(paths: Sequence[str | os.PathLike], size: int, channels: int, upscale: bool = True) -> np.ndarray:
    """Image files as uint8 ``(N, size, size, channels)``, prepared as evaluation prepares them
    (:func:`decode`, then :func:`center`): what ``jaxnet predict`` gives a run trained on images."""
    out = np.zeros((len(paths), size, size, channels), np.uint8)
    for j, p in enumerate(paths):
        try:
            data = Path(p).read_bytes()
        except OSError as e:
            raise UserError(f"cannot read {p}: {e.strerror}") from None
        image = decode(data, str(p), channels)
        check_size(image, size, str(p), upscale)
        out[j] = center(image, size)
    return out


def image_paths(path: Path) -> list[Path]:
    """An image file, or every image file under a directory (sorted by path)."""
    if path.is_file():
        return [path]
    files = sorted(p for p in path.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())
    if not files:
        raise UserError(f"--input {path} holds no image files ({', '.join(IMAGE_SUFFIXES)})")
    return files

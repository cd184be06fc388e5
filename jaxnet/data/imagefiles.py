"""Images read from files at any size: an image folder (``data.name=folder``) or ArrayRecord shards
(``data.name=arrayrecord``), decoded a batch at a time, optionally in grain's worker processes.

The three parts of a dataset on disk (see ARCHITECTURE.md), one file each:

- a **source** with a length and random access (:mod:`jaxnet.data.image_records`):
  :class:`FileSource` (one image file per example) or :class:`RecordSource` (records of
  ArrayRecord shards, laid out as :func:`pack_record` writes them);
- the **index rule** of the in-memory images, :func:`jaxnet.data.pipeline.batch_indices`: batch
  ``step`` holds the examples an epoch permutation drawn from ``(seed, epoch)`` puts there;
- per-row **work** (:mod:`jaxnet.data.image_workers`), :class:`BatchWork`: read, decode
  (:mod:`jaxnet.data.image_decode`, Pillow), resize or randomly crop, flip, in this process or in
  grain's workers. Nothing else is state: no grain iterator state needs saving, a resumed run
  rebuilds its loader at the step it starts from.

This file is the dataset (:class:`ImageFiles`) and its loaders (:func:`load_folder`,
:func:`load_arrayrecord`); the names of the other three files are importable from it too.

>>> ds = load(DataConfig(name="folder", path="pets", image_size=64))   # doctest: +SKIP
>>> ds.describe()                                                        # doctest: +SKIP
'3,680 training images of 37 classes (64x64x3, from files), 1 worker process'
"""

from __future__ import annotations

import glob as glob_lib
import io
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from jaxnet import tasks
from jaxnet.data import pipeline
from jaxnet.data.image_decode import (  # noqa: F401 - the names this module has always offered
    CROP_RATIO,
    CROP_SCALE,
    GREY_MODES,
    IMAGE_SUFFIXES,
    CorruptImage,
    center,
    check_size,
    decode,
    image_paths,
    random_crop_box,
    random_resized_crop,
    read_image_files,
)
from jaxnet.data.image_records import (  # noqa: F401
    FORMAT,
    MANIFEST,
    RECORD_HEADER,
    RECORD_MAGIC,
    FileSource,
    RecordSource,
    pack_record,
    read_manifest,
    unpack_record,
)
from jaxnet.data.image_workers import AUGMENT_STREAM, BatchWork, default_workers, run_batches  # noqa: F401
from jaxnet.errors import UserError

SPLITS = ("train", "val", "test")
SAMPLE_SIZE = 1000
"""Training images (a fixed sample) the channel count, common size and normalisation statistics
are read from."""


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
        self.skipped = 0  # times an unreadable image was met
        self.skipped_files: set[str] = set()
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
        for name in batch.pop("skipped").tolist():
            self.skipped += 1
            if name not in self.skipped_files:  # each file once, however often a batch meets it
                self.skipped_files.add(name)
                count = len(self.skipped_files)
                print(
                    f"jaxnet: warning: skipping {name}: not a readable image (data.skip_corrupt=true); "
                    f"{count} file{'s' * (count != 1)} so far",
                    file=sys.stderr,
                    flush=True,
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


def _with_validation(splits: dict[str, Any], val_size: int, empty: Any, what: str = "the folder") -> dict[str, Any]:
    """Hold out ``val_size`` training examples (the in-memory datasets' fixed-seed rule) when there
    is no validation split."""
    train = splits["train"]
    if splits["val"] is None:
        if val_size >= len(train):
            where = "no val/ directory" if what == "the folder" else "no validation records"
            raise UserError(
                f"data.val_size={val_size} leaves no training images ({what} has {len(train):,} and {where}); "
                f"hold out fewer, e.g. data.val_size={max(1, len(train) // 10)} (a tenth), or give a val/ directory"
            )
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
    splits = _with_validation(splits, cfg.val_size, empty, "the shards")
    return ImageFiles(splits, classes, cfg, name, "ArrayRecord")

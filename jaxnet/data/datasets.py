"""Image datasets held in memory by name (Fashion-MNIST, MNIST, CIFAR-10), the :class:`Dataset`
they come as, and :func:`load`, which reads any dataset a config names (text, token files and image
files through their own modules).

>>> ds = load(DataConfig(name="fashion_mnist"))       # doctest: +SKIP
>>> ds.train[0].shape, ds.num_classes                  # doctest: +SKIP
((55000, 28, 28, 1), 10)
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from jaxnet import tasks
from jaxnet.config import Config, DataConfig, default_tokenizer
from jaxnet.data import imagefiles, images, pipeline, text, tokens
from jaxnet.data.imagefiles import ImageFiles
from jaxnet.data.pipeline import split_validation
from jaxnet.data.text import TextDataset
from jaxnet.errors import UserError

Split = tuple[np.ndarray, np.ndarray]


@dataclass
class Dataset:
    """Images (uint8 NHWC) and int labels per split, with the statistics to normalise them.

    Build one from your own arrays to train on them with :func:`jaxnet.train`:
    ``Dataset(train=(x, y), val=(xv, yv), test=(xt, yt), num_classes=10)``.
    """

    train: Split
    val: Split
    test: Split
    num_classes: int
    name: str = "arrays"

    def __post_init__(self) -> None:
        shape = np.shape(self.train[0])[1:]
        for split in ("train", "val", "test"):
            x, y = (np.asarray(a) for a in getattr(self, split))
            if len(x) != len(y):
                raise UserError(f"{split} split has {len(x)} inputs but {len(y)} labels")
            if x.dtype != np.uint8 or x.ndim != 4 or x.shape[1:] != shape:
                raise UserError(
                    f"{split} images are {x.dtype} {x.shape}; expected uint8 (N, height, width, channels) "
                    f"with the training images' {shape}"
                )
            if len(y) and (y.min() < 0 or y.max() >= self.num_classes):
                raise UserError(f"{split} labels range over {y.min()}..{y.max()}; expected 0..{self.num_classes - 1}")
            setattr(self, split, (x, y.astype(np.int32)))
        if len(self.train[0]) == 0:
            raise UserError("the training split is empty")
        # Per-channel statistics of the training images only, so no test information leaks in.
        # Sums in float64 over uint8 pixels: exact, and without a float copy of the whole set.
        x = self.train[0]
        count = x.size // x.shape[-1]
        mean = x.sum(axis=(0, 1, 2), dtype=np.float64) / count
        mean_sq = np.einsum("nhwc,nhwc->c", x, x, dtype=np.float64) / count
        std = np.sqrt(np.maximum(mean_sq - mean**2, 0.0))
        self.mean = (mean / 255.0).astype(np.float32)
        self.std = np.where(std > 0, std / 255.0, 1.0).astype(np.float32)  # a constant channel stays finite

    def describe(self) -> str:
        """One line for the run's first message."""
        return f"{len(self.train[0]):,} training examples"

    def size(self, split: str) -> int:
        """Examples in ``split``."""
        return len(getattr(self, split)[0])

    def label_range(self, key: str) -> tuple[int, int] | None:
        """The smallest and largest label over every split (None for another ``key``)."""
        labels = [y for _, y in (self.train, self.val, self.test) if len(y)]
        if key != "label" or not labels:
            return None
        return min(int(y.min()) for y in labels), max(int(y.max()) for y in labels)

    def sample(self, cfg: Config) -> dict[str, np.ndarray]:
        """A batch of one zero image: the shapes the model is initialised with."""
        return {"image": np.zeros((1, *self.train[0].shape[1:]), np.float32), "label": np.zeros(1, np.int32)}

    def check(self, cfg: Config) -> None:
        """One-line errors for a batch size the data cannot fill."""
        if cfg.train.batch_size > len(self.train[0]):
            raise UserError(
                f"train.batch_size={cfg.train.batch_size} is larger than the {len(self.train[0])} training examples"
            )

    def default_task(self, cfg: Config) -> tasks.Task:
        """Classification, unless ``cfg.task`` names another task."""
        return tasks.builtin(cfg, "classification", ("classification",), "image")

    def train_batches(self, cfg: Config, start_step: int, rows: slice = slice(None)) -> Iterator[dict[str, np.ndarray]]:
        """Endless normalised (and, with ``data.augment``, augmented) batches from ``start_step`` on;
        only rows ``rows`` of each."""
        return pipeline.train_batches(
            *self.train,
            batch_size=cfg.train.batch_size,
            seed=cfg.seed,
            start_step=start_step,
            mean=self.mean,
            std=self.std,
            do_augment=cfg.data.augment,
            rows=rows,
        )

    def eval_rows(self, cfg: Config, split: str) -> int:
        """Rows of an evaluation batch of ``split`` before rounding to the devices (0 = empty split)."""
        return min(cfg.train.eval_batch_size, self.size(split))

    def eval_batches(self, cfg: Config, split: str, batch_size: int) -> Iterator[dict[str, np.ndarray]]:
        """Every example of ``split`` once, normalised, in padded batches of ``batch_size``."""
        x, y = getattr(self, split)
        return pipeline.eval_batches(x, y, batch_size=batch_size, mean=self.mean, std=self.std)


def _load_mnist(directory: str) -> dict[str, Split]:
    if not directory:
        raise UserError("MNIST has no standard location here; pass data.dir=DIR with the four *-ubyte(.gz) files")
    return images.load_idx_dataset(directory)


LOADERS = {
    "fashion_mnist": lambda d: images.load_idx_dataset(images.find_fashion_mnist(d)),
    "mnist": _load_mnist,
    "cifar10": images.load_cifar10,
}


TEXT_LOADERS = {
    "ptb": lambda c: text.load_ptb(c.tokenizer or default_tokenizer("ptb")),
    "shakespeare": lambda c: text.load_shakespeare(c.tokenizer or default_tokenizer("shakespeare")),
    "text": lambda c: text.load_file(c.path, c.tokenizer or default_tokenizer("text")),
    "tokens": tokens.load,  # token files on disk (jaxnet prepare, nanoGPT, llm.c), memory-mapped
}

FILE_LOADERS = {
    "folder": imagefiles.load_folder,  # an image folder, a subdirectory per class, decoded a batch at a time
    "arrayrecord": imagefiles.load_arrayrecord,  # image records of ArrayRecord shards (jaxnet prepare images)
}


def load(cfg: DataConfig) -> Dataset | TextDataset | ImageFiles:
    """Read the dataset named by ``cfg.name``.

    Image datasets hold out ``cfg.val_size`` training examples for validation; text datasets
    come with their own validation split (see :mod:`jaxnet.data.text`).
    """
    if cfg.mixture:  # several corpora by weight (jaxnet.data.mixture)
        return tokens.load(cfg)
    if cfg.name in TEXT_LOADERS:
        return TEXT_LOADERS[cfg.name](cfg)
    if cfg.name in FILE_LOADERS:
        return FILE_LOADERS[cfg.name](cfg)
    if cfg.name not in LOADERS:  # data.name=arrays: data given from Python, which no file holds
        raise UserError(
            f"data.name={cfg.name} is data given from Python or an experiment file's data(cfg), which jaxnet cannot "
            "load by name; pass it again: dataset=jaxnet.data.arrays(...) to jaxnet.train or jaxnet.evaluate"
        )
    splits = LOADERS[cfg.name](cfg.dir)
    x, y = splits["train"]
    if cfg.val_size >= len(x):
        raise UserError(f"data.val_size={cfg.val_size} leaves no training data ({len(x)} examples)")
    train, val = split_validation(x, y, cfg.val_size)
    num_classes = int(max(y.max(), splits["test"][1].max())) + 1
    return Dataset(train=train, val=val, test=splits["test"], num_classes=num_classes, name=cfg.name)


__all__ = ["FILE_LOADERS", "LOADERS", "TEXT_LOADERS", "Dataset", "Split", "load"]

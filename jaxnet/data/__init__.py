"""Datasets by name, held as host numpy arrays; see :mod:`jaxnet.data.pipeline` for batching.

>>> ds = load(DataConfig(name="fashion_mnist"))       # doctest: +SKIP
>>> ds.train[0].shape, ds.num_classes                  # doctest: +SKIP
((55000, 28, 28, 1), 10)

The names below are imported when first used, as in :mod:`jaxnet`: the data road that needs no
JAX (``jaxnet prepare``, ``jaxnet prepare chat`` and their worker processes, the token shards)
imports its own modules without it, where importing this package once cost 0.7 s of JAX and
optax before a prepare started.
"""

from __future__ import annotations

from jaxnet._lazy import lazy_package

_LAZY = {
    "ArrayDataset": ("jaxnet.data.arrays", "ArrayDataset"),
    "Dataset": ("jaxnet.data.datasets", "Dataset"),
    "FILE_LOADERS": ("jaxnet.data.datasets", "FILE_LOADERS"),
    "ImageFiles": ("jaxnet.data.imagefiles", "ImageFiles"),
    "LOADERS": ("jaxnet.data.datasets", "LOADERS"),
    "Split": ("jaxnet.data.datasets", "Split"),
    "TEXT_LOADERS": ("jaxnet.data.datasets", "TEXT_LOADERS"),
    "TextDataset": ("jaxnet.data.text", "TextDataset"),
    "TokenDataset": ("jaxnet.data.tokens", "TokenDataset"),
    "arrays": ("jaxnet.data.arrays", "arrays"),
    "load": ("jaxnet.data.datasets", "load"),
    "split_validation": ("jaxnet.data.pipeline", "split_validation"),
}


lazy_package(__name__, _LAZY, submodules=True)

__all__ = [
    "ArrayDataset",
    "Dataset",
    "ImageFiles",
    "TextDataset",
    "TokenDataset",
    "arrays",
    "load",
    "LOADERS",
    "TEXT_LOADERS",
    "FILE_LOADERS",
]

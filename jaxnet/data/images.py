"""Image-classification datasets read from their original files into host numpy arrays.

- IDX (MNIST, Fashion-MNIST), gzipped or not: http-free, read from a directory.
- CIFAR-10 python-pickle batches (``data_batch_1..5``, ``test_batch``) from a directory.

Images come back as ``uint8`` NHWC arrays, labels as ``int32``. Each loader returns
``{"train": (x, y), "test": (x, y)}``; the validation split is carved out by the pipeline.
"""

from __future__ import annotations

import gzip
import os
import pickle
import zlib
from pathlib import Path

import numpy as np

from jaxnet.errors import UserError

IDX_DTYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: np.int16, 0x0C: np.int32, 0x0D: np.float32, 0x0E: np.float64}

FASHION_MNIST_HELP = (
    "install it with `apt-get install -y dataset-fashion-mnist` (as root), run ./scripts/train "
    "which does it for you, or pass data.dir=DIR with the four *-ubyte(.gz) files"
)
FASHION_MNIST_DIRS = (
    "/usr/share/datasets/fashion-mnist",
    # where scripts/train unpacks the Debian package when it cannot install it as root
    "~/.local/share/jaxnet/datasets/usr/share/datasets/fashion-mnist",
)


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """Read one IDX file (the MNIST format), gzipped or not, checking its header.

    The header is two zero bytes, a type code, the number of dimensions, then one big-endian
    uint32 per dimension; the data follow in big-endian order.
    """
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as f:
            raw = f.read()
    except (OSError, EOFError, zlib.error) as e:  # gzip: EOFError if truncated, zlib.error if corrupted
        raise UserError(f"cannot read IDX file {path}: {e}; the file is damaged, reinstall it") from None
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in IDX_DTYPES:
        raise UserError(
            f"{path} is not an IDX file (magic number {raw[:4].hex() or 'missing'}); "
            "expected the MNIST/Fashion-MNIST *-ubyte files"
        )
    dtype = np.dtype(IDX_DTYPES[raw[2]]).newbyteorder(">")
    ndim = raw[3]
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise UserError(f"{path} is truncated: its header needs {header} bytes, the file has {len(raw)}")
    shape = tuple(int(d) for d in np.frombuffer(raw, ">u4", count=ndim, offset=4))
    expected = header + int(np.prod(shape)) * dtype.itemsize
    if len(raw) != expected:
        raise UserError(
            f"{path} has {len(raw)} bytes but its header {shape} needs {expected}; "
            "the file is truncated or damaged, reinstall it"
        )
    return np.frombuffer(raw, dtype, offset=header).reshape(shape).astype(dtype.newbyteorder("="))


def _idx_file(directory: Path, stem: str) -> Path:
    for name in (f"{stem}.gz", stem):
        if (directory / name).is_file():
            return directory / name
    raise UserError(f"{directory} has no {stem}(.gz); {FASHION_MNIST_HELP}")


def load_idx_dataset(directory: str | os.PathLike) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Load an MNIST-format dataset (``train-images-idx3-ubyte`` etc.) from ``directory``."""
    directory = Path(directory).expanduser()
    if directory.exists() and not directory.is_dir():
        raise UserError(f"data directory {directory} is a file, not a directory; {FASHION_MNIST_HELP}")
    if not directory.is_dir():
        raise UserError(f"data directory {directory} does not exist; {FASHION_MNIST_HELP}")
    splits = {}
    for split, prefix in (("train", "train"), ("test", "t10k")):
        images = read_idx(_idx_file(directory, f"{prefix}-images-idx3-ubyte"))
        labels = read_idx(_idx_file(directory, f"{prefix}-labels-idx1-ubyte"))
        if images.ndim != 3 or labels.ndim != 1 or len(images) != len(labels):
            raise UserError(
                f"{directory}: {split} images {images.shape} and labels {labels.shape} do not match; "
                "expected (N, rows, cols) images and N labels"
            )
        splits[split] = (images[..., None].astype(np.uint8), labels.astype(np.int32))
    return splits


def find_fashion_mnist(directory: str = "") -> Path:
    """The Fashion-MNIST directory: ``directory`` if given, else the first standard location."""
    if directory:
        return Path(directory).expanduser()
    for candidate in FASHION_MNIST_DIRS:
        path = Path(candidate).expanduser()
        if path.is_dir():
            return path
    raise UserError(f"Fashion-MNIST not found in {' or '.join(FASHION_MNIST_DIRS)}; {FASHION_MNIST_HELP}")


def load_cifar10(directory: str | os.PathLike) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Load CIFAR-10 from the python-pickle batches in ``directory``.

    Each batch is a pickled dict with ``data`` (N x 3072 uint8, channel-major 3x32x32) and
    ``labels`` (N ints); the dict keys may be bytes, as the original files have them.
    """
    directory = Path(directory).expanduser() if directory else None
    help_text = "pass data.dir=DIR pointing at the extracted cifar-10-batches-py folder"
    if directory is not None and directory.exists() and not directory.is_dir():
        raise UserError(f"CIFAR-10 directory {directory} is a file, not a directory; {help_text}")
    if directory is None or not directory.is_dir():
        raise UserError(f"CIFAR-10 directory {directory or '(none given)'} does not exist; {help_text}")

    def read_batch(name: str) -> tuple[np.ndarray, np.ndarray]:
        path = directory / name
        if not path.is_file():
            raise UserError(f"{directory} has no {name}; {help_text}")
        try:
            with open(path, "rb") as f:
                batch = pickle.load(f, encoding="bytes")
        except Exception as e:  # a damaged pickle can raise almost anything
            raise UserError(f"cannot read CIFAR batch {path}: {type(e).__name__}: {e}") from None
        if not isinstance(batch, dict):
            raise UserError(
                f"{path} is not a CIFAR-10 batch: it holds a {type(batch).__name__}, not a dict with 'data' and "
                f"'labels'; {help_text}"
            )
        batch = {k.decode() if isinstance(k, bytes) else k: v for k, v in batch.items()}
        if "data" not in batch or "labels" not in batch:
            raise UserError(f"{path} is not a CIFAR-10 batch: it has no 'data' and 'labels' entries; {help_text}")
        data, labels = np.asarray(batch["data"]), np.asarray(batch["labels"])
        if data.ndim != 2 or data.shape[1] != 3072 or labels.ndim != 1 or len(data) != len(labels):
            raise UserError(
                f"{path}: data has shape {data.shape} and labels {labels.shape}; expected (N, 3072) uint8 rows "
                "(3x32x32, channel-major) and N labels, as in the python version of CIFAR-10; re-extract the batches"
            )
        if data.dtype != np.uint8 and (
            not np.issubdtype(data.dtype, np.integer) or (data.size and (data.min() < 0 or data.max() > 255))
        ):
            raise UserError(f"{path}: data is {data.dtype}, not uint8 pixel values 0..255; re-extract the batches")
        if not np.issubdtype(labels.dtype, np.integer):
            raise UserError(f"{path}: labels are {labels.dtype}, not integer class numbers; re-extract the batches")
        images = data.astype(np.uint8).reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
        return images, labels.astype(np.int32)

    train = [read_batch(f"data_batch_{i}") for i in range(1, 6)]
    return {
        "train": (np.concatenate([x for x, _ in train]), np.concatenate([y for _, y in train])),
        "test": read_batch("test_batch"),
    }

"""Image files decoded and transformed: pure functions of the bytes and the random numbers.

:func:`decode` turns an image file's bytes into a uint8 ``(height, width, channels)`` array
(Pillow); :func:`center` is evaluation's transform (short side resized, central square),
:func:`random_resized_crop` training's augmentation; :func:`read_image_files` prepares raw files as
evaluation does, for ``jaxnet predict``.

>>> center(decode(open("cat.png", "rb").read(), "cat.png", 3), 64).shape     # doctest: +SKIP
(64, 64, 3)
"""

from __future__ import annotations

import io
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from jaxnet.errors import UserError

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm", ".pgm")
"""File names (case-insensitive) read as images; other files in a class folder are ignored."""

GREY_MODES = ("1", "L", "LA", "I", "I;16", "F")
"""Pillow modes read as one channel; every other mode is colour (three channels, RGB)."""

CROP_SCALE = (0.08, 1.0)  # random resized crop: fraction of the image's area, and aspect ratios (Inception's)
CROP_RATIO = (3 / 4, 4 / 3)


SKIP_ADVICE = "replace or remove it, or set data.skip_corrupt=true to skip unreadable images"


class CorruptImage(UserError):
    """An image file that cannot be read or decoded (skipped, counted, with ``data.skip_corrupt``):
    ``what`` says which and why, the message adds what a training run can do about it."""

    def __init__(self, what: str, advice: str = SKIP_ADVICE):
        super().__init__(f"{what}; {advice}")
        self.what = what


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
        raise CorruptImage(f"{name} is not a readable image ({type(e).__name__}: {str(e)[:120]})") from None
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


def read_image_files(paths: Sequence[str | os.PathLike], size: int, channels: int, upscale: bool = True) -> np.ndarray:
    """Image files as uint8 ``(N, size, size, channels)``, prepared as evaluation prepares them
    (:func:`decode`, then :func:`center`): what ``jaxnet predict`` gives a run trained on images."""
    out = np.zeros((len(paths), size, size, channels), np.uint8)
    for j, p in enumerate(paths):
        try:
            data = Path(p).read_bytes()
        except OSError as e:
            raise UserError(f"cannot read {p}: {e.strerror}") from None
        try:
            image = decode(data, str(p), channels)
        except CorruptImage as e:  # predict reads every file it is given: no option to skip one
            raise UserError(f"{e.what}; replace it, or remove it from --input") from None
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

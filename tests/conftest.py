"""Shared test fixtures: small datasets built in memory, and tiny configs that train in seconds."""

from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import numpy as np
import pytest

from jaxnet import Config, Dataset, config


def _installed_fashion_mnist() -> Path | None:
    """Where jaxnet finds Fashion-MNIST (system-wide or per user), if it is installed."""
    from jaxnet.data.images import find_fashion_mnist
    from jaxnet.errors import UserError

    try:
        return find_fashion_mnist()
    except UserError:
        return None


FASHION_MNIST = _installed_fashion_mnist()
needs_fashion_mnist = pytest.mark.skipif(
    FASHION_MNIST is None, reason="Fashion-MNIST not installed (scripts/test installs it)"
)


def bright_quadrant_data(n: int, seed: int, size: int = 8) -> tuple[np.ndarray, np.ndarray]:
    """Noise images with one brighter quadrant; the label is which quadrant (4 classes)."""
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 100, size=(n, size, size, 1)).astype(np.uint8)
    y = rng.integers(0, 4, size=n).astype(np.int32)
    half = size // 2
    for i, label in enumerate(y):
        r, c = divmod(int(label), 2)
        x[i, r * half : (r + 1) * half, c * half : (c + 1) * half] += 120
    return x, y


@pytest.fixture(scope="session")
def quadrants() -> Dataset:
    """A learnable 4-class dataset of 8x8 images: 512 train, 128 val, 128 test."""
    return Dataset(
        train=bright_quadrant_data(512, 0),
        val=bright_quadrant_data(128, 1),
        test=bright_quadrant_data(128, 2),
        num_classes=4,
        name="quadrants",
    )


def tiny_config(**sections: dict) -> Config:
    """A config for a tiny ConvNet on :func:`quadrants`: 12 steps, logs every 2, no progress bar."""
    cfg = Config(experiment="tiny")
    cfg.model.features = (4,)
    cfg.model.hidden = 16
    cfg.optim.lr = 1e-2
    cfg.train.steps = 12
    cfg.train.batch_size = 32
    cfg.train.eval_batch_size = 64
    cfg.train.log_every = 2
    cfg.train.eval_every = 4
    cfg.train.checkpoint_every = 4
    cfg.train.progress = False
    cfg.data.prefetch = 2
    name = sections.get("model", {}).get("name", cfg.model.name)
    if name != cfg.model.name:  # another family: its config class, with its defaults
        cfg.model = config.model_config(name)
    for section, values in sections.items():
        for key, value in values.items():
            setattr(getattr(cfg, section), key, value)
    return cfg

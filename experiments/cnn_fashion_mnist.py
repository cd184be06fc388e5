"""A small ConvNet on Fashion-MNIST: the default experiment.

Command:  jaxnet train cnn_fashion_mnist      (or ./scripts/train, which also installs the data)
Result:   92.13 % test accuracy (published reference for a 2-layer CNN: 91-92 %)
Time:     50 s on a 2-core CPU, start to finish, with convolutions on every core and five steps
          per call (benchmarks/results/train-cnn_fashion_mnist-cpu-2026-11-23.json); 3.5 minutes
          before the CPU work (benchmarks/results/train-cnn_fashion_mnist-cpu-2026-11-21.json)

Two 3x3 conv layers (32 and 64 channels) with max-pooling, a 256-unit dense layer, dropout 0.25
as the only regulariser; Adam with warmup and cosine decay; 2,150 steps of 128 = 5 epochs of
the 55,000 training images (5,000 are held out for validation).

Steps run five to a compiled call (``train.steps_per_call=0``, auto, picks the most up to 8 that
divide the log, evaluation and checkpoint intervals under 100 steps).

Variants: ``smoke`` trains 60 steps on the same data in a few seconds, for tests. ``folder`` trains
the same model on the same images read as PNG files from class folders (``data.name=folder``),
decoded in a grain worker process: write them first with ``python scripts/write_image_folder.py``.
"""

from jaxnet.config import Config
from jaxnet.models import ConvNetConfig

VARIANTS = ("default", "smoke", "folder")


def get_config(variant: str = "default") -> Config:
    """The config of ``variant`` (one of VARIANTS)."""
    cfg = Config()
    cfg.data.name = "fashion_mnist"
    cfg.model = ConvNetConfig(features=(32, 64), hidden=256, dropout=0.25)
    cfg.optim.name = "adamw"
    cfg.optim.lr = 2e-3
    cfg.optim.warmup_steps = 200
    cfg.train.steps = 2150
    cfg.train.batch_size = 128
    cfg.train.log_every = 50
    cfg.train.eval_every = 500
    cfg.train.checkpoint_every = 500
    cfg.train.steps_per_call = 0  # auto: 5 steps per compiled call here (faster on a CPU); 1 in a sweep
    if variant == "folder":  # the same images as PNG files (scripts/write_image_folder.py)
        cfg.data.name = "folder"
        cfg.data.path = "data/fashion-mnist-png"
    if variant == "smoke":
        cfg.optim.warmup_steps = 10
        cfg.train.steps = 60
        cfg.train.log_every = 10
        cfg.train.eval_every = 30
        cfg.train.checkpoint_every = 30
    return cfg

"""ResNet-20 on CIFAR-10 with crop-and-flip augmentation.

Command:  jaxnet train resnet_cifar10 data.dir=/path/to/cifar-10-batches-py
Data:     the standard python-pickle batches (data_batch_1..5, test_batch); CIFAR-10 cannot be
          installed from the package registries, so the directory is yours to supply.
Result:   not yet measured with jaxnet; He et al. (2016) report 91.25 % test accuracy with this recipe
Time:     not measured: a 2-hour run needs about 8 steps/s, far more than a 2-core CPU manages; a GPU
          is the place for it

The recipe of He et al. (2016): 64k steps of 128, SGD with momentum 0.9, learning rate 0.1,
weight decay 1e-4.

Variants: ``smoke`` trains a two-stage ResNet for 20 steps, for tests.
"""

from jaxnet.config import Config
from jaxnet.models import ResNetConfig

VARIANTS = ("default", "smoke")


def get_config(variant: str = "default") -> Config:
    """The config of ``variant`` (one of VARIANTS)."""
    cfg = Config()
    cfg.data.name = "cifar10"
    cfg.data.augment = True
    cfg.model = ResNetConfig(features=(16, 32, 64), blocks=(3, 3, 3))  # ResNet-20
    cfg.optim.name = "sgd"
    cfg.optim.lr = 0.1
    cfg.optim.momentum = 0.9
    cfg.optim.weight_decay = 1e-4
    cfg.optim.warmup_steps = 400
    cfg.train.steps = 64_000
    cfg.train.batch_size = 128
    cfg.train.eval_every = 2000
    cfg.train.checkpoint_every = 2000
    if variant == "smoke":
        cfg.data.val_size = 100
        cfg.model.features = (8, 16)
        cfg.model.blocks = (1, 1)
        cfg.optim.warmup_steps = 5
        cfg.train.steps = 20
        cfg.train.batch_size = 32
        cfg.train.eval_batch_size = 100
        cfg.train.log_every = 10
        cfg.train.eval_every = 10
        cfg.train.checkpoint_every = 10
    return cfg

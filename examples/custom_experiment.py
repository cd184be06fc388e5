"""An experiment file that brings its own model, data, loss and metric to the jaxnet runner.

Command:  jaxnet train examples/custom_experiment.py            (smoke: examples/custom_experiment.py:smoke)
Data:     scikit-learn's bundled handwritten digits (1,797 of 8x8 pixels; 1,297 train, 250
          validation, 250 test by a fixed shuffle)
Result:   see the docstring of get_config (test accuracy of the default variant)
Time:     about a minute on a 2-core CPU (smoke: under 20 s)

Everything a built-in experiment has comes with it: ``key=value`` overrides, including this file's
own model keys (``model.hidden=256``, checked like the built-in ones), checkpoints and exact resume,
metrics.jsonl, TensorBoard, curves.png, and the device mesh (``mesh.fsdp=8`` shards the MLP's
weights, whose axes are named below).

The runner looks for these functions beside ``get_config``: ``model(cfg)`` (not needed here: the
model is registered, so ``model.name`` builds it), ``data(cfg)``, ``task(cfg)`` and ``actions(cfg)``.
"""

from dataclasses import dataclass

import flax.linen as nn
import jax.numpy as jnp
import numpy as np
import optax
from sklearn.datasets import load_digits

import jaxnet

VARIANTS = ("default", "smoke")
FOCAL_GAMMA = 2.0  # how much the loss discounts examples the model already gets right


@dataclass
class ResidualMLPConfig(jaxnet.ModelConfig):
    """A residual MLP over flattened pixels."""

    hidden: int = jaxnet.config.field(128, "width of the residual blocks", low=8)
    blocks: int = jaxnet.config.field(2, "residual blocks", low=1)
    dropout: float = jaxnet.config.field(0.1, "dropout inside each block", low=0.0, high=0.9)

    def build(self, *, outputs, seq_len, batch_axis):
        """The module this config describes, with ``outputs`` classes."""
        return ResidualMLP(outputs, self.hidden, self.blocks, self.dropout)


class ResidualMLP(nn.Module):
    """Pixels -> width ``hidden`` -> ``blocks`` x (LayerNorm, Dense, GELU, Dense, + input) -> classes.
    Weight axes are named (``embed``, ``mlp``) so the mesh can shard them."""

    classes: int
    hidden: int
    blocks: int
    dropout: float

    @nn.compact
    def __call__(self, pixels, train=False):
        def dense(features, axes):
            init = nn.with_logical_partitioning(nn.initializers.lecun_normal(), axes)
            return nn.Dense(features, kernel_init=init)

        x = dense(self.hidden, (None, "embed"))(pixels.reshape(len(pixels), -1))
        for _ in range(self.blocks):
            y = dense(self.hidden, ("embed", "mlp"))(nn.LayerNorm()(x))
            y = nn.Dropout(self.dropout, deterministic=not train)(nn.gelu(y))
            x = x + dense(self.hidden, ("mlp", "embed"))(y)
        return dense(self.classes, ("embed", None))(nn.LayerNorm()(x))


jaxnet.models.register("residual_mlp", ResidualMLPConfig)


def get_config(variant: str = "default") -> jaxnet.Config:
    """Default: 1,500 steps of 64. Smoke: 60 steps, for tests."""
    cfg = jaxnet.Config()
    cfg.data.name = "arrays"
    cfg.model = ResidualMLPConfig(name="residual_mlp")
    cfg.optim.lr = 2e-3
    cfg.optim.warmup_steps = 50
    cfg.train.batch_size = 64
    cfg.train.eval_batch_size = 256
    cfg.train.steps = 1500
    cfg.train.log_every = 50
    cfg.train.eval_every = 250
    cfg.train.checkpoint_every = 250
    if variant == "smoke":
        cfg.optim.warmup_steps = 5
        cfg.train.steps = 60
        cfg.train.log_every = 10
        cfg.train.eval_every = 20
        cfg.train.checkpoint_every = 20
    return cfg


def data(cfg: jaxnet.Config) -> jaxnet.data.ArrayDataset:
    """The digits as float pixels in [0, 1] and integer labels, split by a fixed shuffle."""
    digits = load_digits()
    pixels = (digits.images / 16.0).astype(np.float32)[..., None]
    order = np.random.default_rng(0).permutation(len(pixels))
    train, val, test = np.split(order, [1297, 1547])
    split = lambda idx: {"pixels": pixels[idx], "digit": digits.target[idx].astype(np.int32)}
    return jaxnet.data.arrays(train=split(train), val=split(val), test=split(test), num_classes=10)


def focal_loss(logits, batch):
    """Cross-entropy scaled by (1 - p_true)^gamma (Lin et al. 2017): confident hits count less."""
    log_p = jnp.take_along_axis(nn.log_softmax(logits), batch["digit"][:, None], axis=-1)[:, 0]
    return jnp.mean(-((1 - jnp.exp(log_p)) ** FOCAL_GAMMA) * log_p)


def task(cfg: jaxnet.Config) -> jaxnet.Task:
    """The focal loss, with accuracy and the rate at which the true digit is among the top two."""
    return jaxnet.Task(
        inputs="pixels",
        loss=focal_loss,
        metrics={
            "accuracy": lambda logits, b: jnp.mean(jnp.argmax(logits, -1) == b["digit"]),
            "top2": lambda logits, b: jnp.mean(jnp.any(jnp.argsort(logits, -1)[:, -2:] == b["digit"][:, None], -1)),
        },
        name="focal_digits",
    )


def actions(cfg: jaxnet.Config) -> list:
    """Log the parameters' global norm every 20 steps (a custom scalar beside the built-in ones)."""
    return [jaxnet.every(20, lambda loop: loop.log({"param_norm": optax.global_norm(loop.state.params)}))]

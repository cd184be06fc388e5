"""Model registry: ``model.name`` in the config -> a Flax Linen module.

Image models are called as ``module.apply(variables, images, train=..., rngs=...)``, language
models as ``module.apply(variables, tokens, train=..., rngs=...)``; both return float32 logits.
Any Flax module with that call signature can be passed to :func:`jaxnet.train` directly instead.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxnet.config import ModelConfig
from jaxnet.errors import UserError
from jaxnet.models.cnn import ConvNet, ResNet
from jaxnet.models.lstm import LSTMLanguageModel
from jaxnet.models.transformer import TransformerLanguageModel

# float64 needs JAX's 64-bit mode (JAX_ENABLE_X64=1); it is there for numerical checks.
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16, "float64": jnp.float64}

# Each entry: (model config, number of classes or vocabulary size, sequence length, mesh axes
# BatchNorm averages over per device) -> module.
REGISTRY: dict[str, Callable[..., nn.Module]] = {
    "convnet": lambda c, n, t, b: ConvNet(n, c.features, c.hidden, c.dropout, DTYPES[c.dtype], DTYPES[c.param_dtype]),
    "resnet": lambda c, n, t, b: ResNet(n, c.features, c.blocks, DTYPES[c.dtype], DTYPES[c.param_dtype], b),
    "lstm": lambda c, n, t, b: LSTMLanguageModel(
        n,
        c.layers,
        c.width,
        c.dropout,
        c.init_scale,
        c.tie_embeddings,
        DTYPES[c.dtype],
        DTYPES[c.param_dtype],
        impl=c.lstm_impl,
    ),
    "transformer": lambda c, n, t, b: TransformerLanguageModel(
        n,
        t,
        c.layers,
        c.width,
        c.heads,
        c.mlp_ratio,
        c.dropout,
        c.position,
        c.tie_embeddings,
        DTYPES[c.dtype],
        DTYPES[c.param_dtype],
        attention=c.attention,
        remat=c.remat,
    ),
}

LANGUAGE_MODELS = ("lstm", "transformer")


def resolve(cfg: ModelConfig, backend: str | None = None) -> ModelConfig:
    """``cfg`` with every ``auto`` replaced by what runs fastest on ``backend`` (JAX's default).

    On a GPU: bfloat16 compute (parameters and optimizer state stay ``param_dtype``, float32 by
    default), cuDNN's fused attention when the compute dtype is 16-bit and the head size suits it,
    and cuDNN's LSTM. On a CPU: float32, XLA's attention and the ``lax.scan`` LSTM. An explicit
    ``cudnn`` where it cannot run is a :class:`UserError`.
    """
    if backend is None:
        backend = jax.default_backend()
        if backend == "gpu" and "rocm" in jax.devices()[0].client.platform_version.lower():
            backend = "rocm"  # an AMD GPU: no cuDNN (and its MIOpen LSTM orders the gates differently)
    gpu = backend in ("gpu", "cuda")
    dtype = cfg.dtype if cfg.dtype != "auto" else ("float32" if backend == "cpu" else "bfloat16")
    head_dim = cfg.width // cfg.heads if cfg.heads else 0
    fused_ok = gpu and dtype == "bfloat16" and head_dim % 8 == 0 and head_dim <= 128
    attention = cfg.attention if cfg.attention != "auto" else ("cudnn" if fused_ok else "xla")
    lstm_impl = cfg.lstm_impl if cfg.lstm_impl != "auto" else ("cudnn" if gpu else "scan")
    if cfg.name == "transformer" and attention == "cudnn" and not fused_ok:
        raise UserError(
            "model.attention=cudnn needs an NVIDIA GPU, model.dtype=bfloat16 and a head size (model.width / "
            f"model.heads) that is a multiple of 8 up to 128; here the backend is {backend}, the dtype {dtype} and "
            f"the head size {head_dim}. Use model.attention=auto"
        )
    if cfg.name == "lstm" and lstm_impl == "cudnn" and not gpu:
        raise UserError(
            f"model.lstm_impl=cudnn needs an NVIDIA GPU (the backend here is {backend}); use model.lstm_impl=auto"
        )
    return dataclasses.replace(cfg, dtype=dtype, attention=attention, lstm_impl=lstm_impl)


def build(cfg: ModelConfig, num_classes: int, seq_len: int = 0, batch_axis: str | None = None) -> nn.Module:
    """The module named by ``cfg.name`` with ``num_classes`` outputs (the vocabulary size for
    language models); ``seq_len`` is the Transformer's context. ``batch_axis`` names the mesh
    axes a per-device (``shard_map``) model averages BatchNorm statistics over. ``auto`` settings
    are resolved for JAX's default backend (:func:`resolve`)."""
    cfg = resolve(cfg)
    return REGISTRY[cfg.name](cfg, num_classes, seq_len, batch_axis)


__all__ = ["ConvNet", "ResNet", "LSTMLanguageModel", "TransformerLanguageModel", "build", "resolve", "REGISTRY"]

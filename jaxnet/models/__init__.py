"""Model registry: ``model.name`` in the config -> the family's config class and a Flax Linen module.

A family is a config dataclass (subclassing :class:`jaxnet.config.ModelConfig`, whose fields are
the family's ``model.*`` keys) and a ``build`` function making the module from it, registered
once with :func:`register`. The built-in families are registered at the end of this file; an
experiment file registers its own the same way, and its keys are then set and checked like
the built-in ones (``jaxnet train mine.py model.hidden=128``)::

    @dataclass
    class MLPConfig(jaxnet.ModelConfig):
        hidden: int = jaxnet.config.field(64, "hidden units", low=1)

    jaxnet.models.register("mlp", MLPConfig, lambda cfg, n, seq_len, batch_axis: MLP(cfg.hidden, n))

Image models are called as ``module.apply(variables, images, train=..., rngs=...)``, language
models as ``module.apply(variables, tokens, train=..., rngs=...)``; both return float32 logits.
Any Flax module with that call signature can be passed to :func:`jaxnet.train` directly instead.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax

from jaxnet.config import ModelConfig, _unknown_model, model_keys
from jaxnet.errors import UserError
from jaxnet.models.cnn import ConvNet, ConvNetConfig, ResNet, ResNetConfig, build_convnet, build_resnet
from jaxnet.models.common import DTYPES
from jaxnet.models.lstm import LSTMConfig, LSTMLanguageModel, build_lstm
from jaxnet.models.transformer import TransformerConfig, TransformerLanguageModel, build_transformer

#: ``build(model_cfg, num_classes, seq_len, batch_axis) -> module``: ``num_classes`` is the number
#: of classes or the vocabulary size, ``seq_len`` the context of a sequence model, ``batch_axis``
#: the mesh axes a per-device (``shard_map``) model averages BatchNorm statistics over.
Build = Callable[[Any, int, int, Any], nn.Module]

INPUTS = ("tokens", "images", "any")


@dataclasses.dataclass(frozen=True)
class Family:
    """A registered model family: its config class, its module factory and what it reads."""

    name: str
    config: type[ModelConfig]
    build: Build
    inputs: str  # "tokens", "images" or "any"


REGISTRY: dict[str, Family] = {}
BUILT_IN = ("convnet", "resnet", "lstm", "transformer")


def register(name: str, config_cls: type[ModelConfig], build: Build, inputs: str = "any") -> None:
    """Make ``model.name=NAME`` select ``config_cls`` (its fields are the ``model.*`` keys) and
    ``build(model_cfg, num_classes, seq_len, batch_axis)`` make the module.

    ``inputs`` says what the model reads: ``"tokens"`` (language models, trained on text data),
    ``"images"``, or ``"any"`` (not checked against the data). Registering a name again replaces
    it (an experiment file loaded twice), except the built-in names.

    >>> register("mlp", MLPConfig, lambda cfg, n, seq_len, batch_axis: MLP(cfg.hidden, n))  # doctest: +SKIP
    """
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"model name {name!r} must be a Python identifier, e.g. 'mlp'")
    if name in BUILT_IN and name in REGISTRY:
        raise ValueError(f"{name} is a built-in model; register yours under another name")
    model_keys(config_cls)  # a dataclass subclassing ModelConfig, every field with a default and a settable type
    if not callable(build):
        raise TypeError(f"build for model {name} must be callable: (model_cfg, num_classes, seq_len, batch_axis)")
    if inputs not in INPUTS:
        raise ValueError(f"inputs={inputs!r} for model {name}: expected one of {', '.join(INPUTS)}")
    REGISTRY[name] = Family(name, config_cls, build, inputs)


def family(name: str) -> Family:
    """The registered family ``name``; an unknown name is a :class:`UserError` naming the nearest."""
    if name not in REGISTRY:
        raise _unknown_model(name)
    return REGISTRY[name]


def resolve(cfg: ModelConfig, backend: str | None = None) -> ModelConfig:
    """``cfg`` with every ``auto`` replaced by what runs fastest on ``backend`` (JAX's default).

    On a GPU: bfloat16 compute (parameters and optimizer state stay ``param_dtype``, float32 by
    default), cuDNN's fused attention when the compute dtype is 16-bit and the head size suits it,
    and cuDNN's LSTM. On a CPU: float32, XLA's attention and the ``lax.scan`` LSTM. An explicit
    ``cudnn`` where it cannot run is a :class:`UserError`. Only the fields the family has change.
    """
    if backend is None:
        backend = jax.default_backend()
        if backend == "gpu" and "rocm" in jax.devices()[0].client.platform_version.lower():
            backend = "rocm"  # an AMD GPU: no cuDNN (and its MIOpen LSTM orders the gates differently)
    gpu = backend in ("gpu", "cuda")
    dtype = cfg.dtype if cfg.dtype != "auto" else ("float32" if backend == "cpu" else "bfloat16")
    changes: dict[str, Any] = {"dtype": dtype}
    if isinstance(cfg, TransformerConfig):
        head_dim = cfg.width // cfg.heads
        fused_ok = gpu and dtype == "bfloat16" and head_dim % 8 == 0 and head_dim <= 128
        changes["attention"] = cfg.attention if cfg.attention != "auto" else ("cudnn" if fused_ok else "xla")
        if changes["attention"] == "cudnn" and not fused_ok:
            raise UserError(
                "model.attention=cudnn needs an NVIDIA GPU, model.dtype=bfloat16 and a head size (model.width / "
                f"model.heads) that is a multiple of 8 up to 128; here the backend is {backend}, the dtype {dtype} "
                f"and the head size {head_dim}. Use model.attention=auto"
            )
    if isinstance(cfg, LSTMConfig):
        changes["lstm_impl"] = cfg.lstm_impl if cfg.lstm_impl != "auto" else ("cudnn" if gpu else "scan")
        if changes["lstm_impl"] == "cudnn" and not gpu:
            raise UserError(
                f"model.lstm_impl=cudnn needs an NVIDIA GPU (the backend here is {backend}); use model.lstm_impl=auto"
            )
    return dataclasses.replace(cfg, **changes)


def build(
    cfg: ModelConfig, num_classes: int, seq_len: int = 0, batch_axis: str | None = None, *, backend: str | None = None
) -> nn.Module:
    """The module of family ``cfg.name`` with ``num_classes`` outputs (the vocabulary size for
    language models); ``seq_len`` is the Transformer's context. ``batch_axis`` names the mesh
    axes a per-device (``shard_map``) model averages BatchNorm statistics over. ``auto`` settings
    are resolved for ``backend`` (default: JAX's default backend; see :func:`resolve`)."""
    return family(cfg.name).build(resolve(cfg, backend), num_classes, seq_len, batch_axis)


register("convnet", ConvNetConfig, build_convnet, inputs="images")
register("resnet", ResNetConfig, build_resnet, inputs="images")
register("lstm", LSTMConfig, build_lstm, inputs="tokens")
register("transformer", TransformerConfig, build_transformer, inputs="tokens")

__all__ = [
    "BUILT_IN",
    "DTYPES",
    "REGISTRY",
    "ConvNet",
    "ConvNetConfig",
    "Family",
    "LSTMConfig",
    "LSTMLanguageModel",
    "ResNet",
    "ResNetConfig",
    "TransformerConfig",
    "TransformerLanguageModel",
    "build",
    "family",
    "register",
    "resolve",
]

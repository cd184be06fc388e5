"""What every model family stands on: :class:`ModelConfig`, :func:`field`, and the registry.

A family is one file: a config dataclass subclassing :class:`ModelConfig` (its fields are the
family's ``model.*`` keys, its :meth:`~ModelConfig.build` makes the Flax module) and the module,
then one line, ``register(name, ConfigClass)``. The config schema (:mod:`jaxnet.config`) and
the model files both import this module; it imports neither, so each can be read and tested
alone.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from jaxnet.errors import UserError


def field(default: Any, doc: str, *, low: float | None = None, high: float | None = None, choices: tuple = ()) -> Any:
    """A config field with its description and the range of values it accepts.

    ``low`` and ``high`` are inclusive bounds for numbers (and for every item of a tuple). The
    type comes from the annotation: ``bool``, ``int``, ``float``, ``str`` or ``tuple[T, ...]``::

        @dataclass
        class MLPConfig(ModelConfig):
            hidden: int = field(64, "hidden units", low=1)
    """
    meta = {"doc": doc, "low": low, "high": high, "choices": choices}
    if isinstance(default, tuple):
        return dataclasses.field(default_factory=lambda: default, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def has_cudnn(backend: str) -> bool:
    """Whether JAX platform ``backend`` is an NVIDIA GPU, where cuDNN's kernels run (``rocm``, an
    AMD GPU, is not)."""
    return backend in ("gpu", "cuda")


@dataclass
class ModelConfig:
    """The fields every model family shares; each family's config subclasses it beside its module.

    ``dtype=bfloat16`` with ``param_dtype=float32`` is mixed precision. A family's config adds its
    own fields (with :func:`field`), its cross-field checks (:meth:`validate`) and how to make its
    module (:meth:`build`), and is registered by :func:`register`; ``name`` is filled in from there.
    """

    name: str = field("", "model family: a registered model (see jaxnet.models.register)")
    dtype: str = field(
        "auto",
        "compute dtype: auto = bfloat16 on a GPU or TPU, float32 on a CPU (float64 needs JAX_ENABLE_X64=1; for "
        "numerical checks)",
        choices=("auto", "float32", "bfloat16", "float64"),
    )
    param_dtype: str = field(
        "float32", "parameter dtype (float64 needs JAX_ENABLE_X64=1)", choices=("float32", "bfloat16", "float64")
    )

    def __post_init__(self) -> None:
        if not self.name:
            self.name = registered_name(type(self))

    def validate(self) -> None:
        """Checks that involve more than one field of the model (each field's own range is checked already)."""

    def build(self, *, outputs: int, seq_len: int = 0, batch_axis: Any = None) -> Any:
        """The Flax module this config describes, its ``auto`` settings already resolved
        (:meth:`for_backend`). ``outputs`` is the number of classes or the vocabulary size,
        ``seq_len`` the context of a sequence model, ``batch_axis`` the mesh axes a per-device
        (``shard_map``) model averages BatchNorm statistics over. Every family overrides it::

            def build(self, *, outputs, seq_len, batch_axis):
                return MLP(self.hidden, outputs)
        """
        raise NotImplementedError(f"{type(self).__name__} does not define build(self, *, outputs, seq_len, batch_axis)")

    def for_backend(self, backend: str) -> ModelConfig:
        """A copy with every ``auto`` setting replaced by what runs fastest on ``backend`` (a JAX
        platform name: ``cpu``, ``gpu``, ``rocm``, ``tpu``): here the compute dtype, float32 on a
        CPU and bfloat16 elsewhere. A family with ``auto`` settings of its own extends it, calling
        ``super().for_backend(backend)`` first."""
        dtype = self.dtype if self.dtype != "auto" else ("float32" if backend == "cpu" else "bfloat16")
        return dataclasses.replace(self, dtype=dtype)


# ---------------------------------------------------------------------------------------------
# Leaves: every settable key of a config dataclass, its type and its limits.

_SCALARS = (bool, int, float, str)


@functools.cache
def leaves(cls: type, prefix: str = "") -> dict[str, dataclasses.Field]:
    """The settable fields of config dataclass ``cls`` by dotted key (``prefix`` + name), nested
    dataclasses flattened, each field's ``type`` resolved from its annotation."""
    try:
        hints = typing.get_type_hints(cls)
    except NameError as e:
        raise TypeError(f"config class {cls.__name__}: cannot resolve an annotation ({e})") from None
    out: dict[str, dataclasses.Field] = {}
    for f in dataclasses.fields(cls):
        f.type = hints[f.name]
        if dataclasses.is_dataclass(f.type):
            out.update(leaves(f.type, f"{prefix}{f.name}."))
        else:
            out[f"{prefix}{f.name}"] = f
    return out


def _supported(typ: Any) -> bool:
    if typ in _SCALARS:
        return True
    args = typing.get_args(typ)
    return typing.get_origin(typ) is tuple and len(args) == 2 and args[1] is Ellipsis and args[0] in _SCALARS


@functools.cache
def model_keys(cls: type) -> dict[str, dataclasses.Field]:
    """The keys of a model family's config class: ``model.name``, the family's own fields, then
    the shared dtypes. A field without a default or of a type overrides cannot parse is a
    ``TypeError`` (config types are bool, int, float, str and ``tuple[T, ...]`` of those)."""
    if not (isinstance(cls, type) and issubclass(cls, ModelConfig) and dataclasses.is_dataclass(cls)):
        raise TypeError(f"{cls!r} is not a dataclass subclassing jaxnet.config.ModelConfig")
    fields = leaves(cls, "model.")
    for f in fields.values():
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise TypeError(f"{cls.__name__}.{f.name} needs a default value (use jaxnet.config.field)")
        if not _supported(f.type):
            raise TypeError(
                f"{cls.__name__}.{f.name}: type {f.type} cannot be set from the command line; use bool, int, "
                "float, str or tuple[T, ...] of those"
            )
    shared = [k for k in leaves(ModelConfig, "model.") if k != "model.name"]
    order = ["model.name", *(k for k in fields if k not in shared and k != "model.name"), *shared]
    return {k: fields[k] for k in order}


# ---------------------------------------------------------------------------------------------
# The registry: model.name -> family.

#: A module factory in the older form ``build(model_cfg, num_classes, seq_len, batch_axis)``,
#: still accepted by :func:`register` beside a config class without a :meth:`ModelConfig.build`.
Build = Callable[[Any, int, int, Any], Any]

INPUTS = ("tokens", "images", "any")


@dataclasses.dataclass(frozen=True)
class Family:
    """A registered model family: its config class, what it reads, and (older form) its module factory."""

    name: str
    config: type[ModelConfig]
    build: Build | None  # None: the config's own build method makes the module
    inputs: str  # "tokens", "images" or "any"

    def module(self, cfg: ModelConfig, outputs: int, seq_len: int, batch_axis: Any) -> Any:
        """The module of resolved config ``cfg`` (see :meth:`ModelConfig.build` for the arguments)."""
        if self.build is not None:
            return self.build(cfg, outputs, seq_len, batch_axis)
        return cfg.build(outputs=outputs, seq_len=seq_len, batch_axis=batch_axis)


REGISTRY: dict[str, Family] = {}
BUILT_IN = ("convnet", "resnet", "lstm", "transformer")


def register(name: str, config_cls: type[ModelConfig], build: Build | None = None, inputs: str = "any") -> None:
    """Make ``model.name=NAME`` select ``config_cls``: its fields are the ``model.*`` keys and its
    :meth:`~ModelConfig.build` makes the module.

    ``inputs`` says what the model reads: ``"tokens"`` (language models, trained on text data),
    ``"images"``, or ``"any"`` (not checked against the data). Registering a name again replaces
    it (an experiment file loaded twice), except the built-in names. The older form passes the
    module factory instead, ``register(name, ConfigClass, build)`` with
    ``build(model_cfg, num_classes, seq_len, batch_axis)``.

    >>> register("mlp", MLPConfig, inputs="images")  # doctest: +SKIP
    """
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"model name {name!r} must be a Python identifier, e.g. 'mlp'")
    if name in BUILT_IN and name in REGISTRY:
        raise ValueError(f"{name} is a built-in model; register yours under another name")
    model_keys(config_cls)  # a dataclass subclassing ModelConfig, every field with a default and a settable type
    if build is None and config_cls.build is ModelConfig.build:
        raise TypeError(
            f"{config_cls.__name__} for model {name} needs a build(self, *, outputs, seq_len, batch_axis) method "
            "returning its module"
        )
    if build is not None and not callable(build):
        raise TypeError(f"build for model {name} must be callable: (model_cfg, num_classes, seq_len, batch_axis)")
    if inputs not in INPUTS:
        raise ValueError(f"inputs={inputs!r} for model {name}: expected one of {', '.join(INPUTS)}")
    REGISTRY[name] = Family(name, config_cls, build, inputs)


def family(name: str) -> Family:
    """The registered family ``name``; an unknown name is a :class:`UserError` naming the nearest."""
    if name not in REGISTRY:
        raise unknown_model(name)
    return REGISTRY[name]


def registered_name(cls: type) -> str:
    """The name ``cls`` is registered under, or ``""``."""
    return next((name for name, family in REGISTRY.items() if family.config is cls), "")


def unknown_model(name: str) -> UserError:
    """The error for ``model.name=NAME`` that no family is registered under."""
    known = list(REGISTRY)
    if not name:
        return UserError(
            "model.name is empty: the model config's class is not registered; call "
            "jaxnet.models.register(name, ConfigClass, build) before using it"
        )
    near = difflib.get_close_matches(name, known, n=3, cutoff=0.5)
    hint = f"; did you mean {' or '.join(near)}?" if near else " (jaxnet.models.register adds one)"
    return UserError(f"model.name={name!r} is not one of: {', '.join(known)}{hint}")


def model_config(name: str) -> ModelConfig:
    """A config of the registered model family ``name`` with its defaults.

    >>> model_config("transformer").heads   # doctest: +SKIP
    4
    """
    return family(name).config(name=name)

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
import math
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from jaxnet.errors import UserError


def field(
    default: Any,
    doc: str,
    *,
    low: float | None = None,
    high: float | None = None,
    choices: tuple = (),
    aliases: dict | None = None,
) -> Any:
    """A config field with its description and the range of values it accepts.

    ``low`` and ``high`` are inclusive bounds for numbers (and for every item of a tuple). The
    type comes from the annotation: ``bool``, ``int``, ``float``, ``str`` or ``tuple[T, ...]``.
    ``aliases`` are older spellings still accepted, each read as the value it maps to (from the
    command line, a saved ``config.json`` or Python), e.g. a key that was ``true``/``false`` before
    it named choices::

        @dataclass
        class MLPConfig(ModelConfig):
            hidden: int = field(64, "hidden units", low=1)
            remat: str = field("none", "recompute", choices=("none", "full"), aliases={True: "full", False: "none"})
    """
    meta = {"doc": doc, "low": low, "high": high, "choices": choices, "aliases": dict(aliases or {})}
    if isinstance(default, tuple):
        return dataclasses.field(default_factory=lambda: default, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def has_cudnn(backend: str) -> bool:
    """Whether JAX platform ``backend`` is an NVIDIA GPU, where cuDNN's kernels run (``rocm``, an
    AMD GPU, is not)."""
    return backend in ("gpu", "cuda")


# ---------------------------------------------------------------------------------------------
# Checked sections: setting an attribute from Python is checked as a key=value override is.


class Checked:
    """A config dataclass whose attributes are checked when set, from Python as on the command
    line: an unknown name is a :class:`UserError` naming the nearest keys (``cfg.optim.learning_rate
    = 0.5``: did you mean optim.lr?), a value of the wrong type one naming the field and the type
    it takes (``cfg.train.steps = "20"``). An int given to a float field is stored as a float, an
    integral float to an int field as an int, a list to a tuple field as a tuple. Dataclass
    construction and :func:`dataclasses.replace` go through the same check; a traced scalar (a
    sweep member's number inside its vmapped step) passes as it is; an unknown keyword to the
    constructor (``OptimConfig(learning_rate=0.1)``) gets the same "did you mean". Ranges, choices and checks
    across fields stay with validation (``jaxnet.config.validate``, run by ``jaxnet.train``).
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        # Before the dataclass's __init__, whose TypeError for an unknown keyword names no key.
        types = _attribute_types(cls)
        for name in kwargs if types is not None else ():
            if name not in types:
                raise unknown_attribute(cls, name, registered_name(cls))
        return super().__new__(cls)

    def __setattr__(self, name: str, value: Any) -> None:
        types = _attribute_types(type(self))
        if types is not None:
            if name not in types:
                raise unknown_attribute(type(self), name, getattr(self, "name", ""))
            value = unalias(value, _fields(type(self))[name])
            value = checked_value(f"{_prefix(type(self))}{name}", value, types[name])
        object.__setattr__(self, name, value)


@functools.cache
def _fields(cls: type) -> dict[str, dataclasses.Field]:
    """The fields of dataclass ``cls`` by name."""
    return {f.name: f for f in dataclasses.fields(cls)}


@functools.cache
def _attribute_types(cls: type) -> dict[str, Any] | None:
    """Each field of config class ``cls`` and its resolved type (None: not resolvable, unchecked)."""
    if not dataclasses.is_dataclass(cls):
        return None
    try:
        hints = typing.get_type_hints(cls)
    except NameError:
        return None
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def unalias(value: Any, f: dataclasses.Field) -> Any:
    """``value`` as field ``f`` reads it: an older spelling among its ``aliases`` (a bool, or a string
    compared without case) is the value it maps to; anything else is returned unchanged.

    >>> unalias("True", dataclasses.field(metadata={"aliases": {True: "full", "true": "full"}}))
    'full'
    """
    aliases = f.metadata.get("aliases") or {}
    if not aliases:
        return value
    if isinstance(value, bool | np.bool_):
        return aliases.get(bool(value), value)
    if isinstance(value, str):
        return aliases.get(value.strip().lower(), value)
    return value


def checked_value(key: str, value: Any, typ: Any) -> Any:
    """``value`` as a field of type ``typ`` holds it, or a :class:`UserError` naming ``key`` and the type."""
    if isinstance(typ, type) and dataclasses.is_dataclass(typ):
        if isinstance(value, typ):
            return value
        article = "an" if typ.__name__[0] in "AEIOU" else "a"
        raise UserError(f"{key} must be {article} {typ.__name__}; got a {type(value).__name__}")
    if typing.get_origin(typ) is tuple:
        args = typing.get_args(typ)
        if not (len(args) == 2 and args[1] is Ellipsis):
            return value
        if isinstance(value, str) or not isinstance(value, tuple | list):
            example = (value,) if isinstance(value, args[0]) else ()
            raise UserError(
                f"{key}={value!r}: expected a tuple of {_PLURALS.get(args[0], args[0])}"
                + (f", e.g. {example!r}" if example else "")
            )
        return tuple(checked_value(key, v, args[0]) for v in value)
    if typ not in _SCALARS:
        return value
    if _traced_scalar(value):
        return value
    if typ is bool and isinstance(value, bool | np.bool_):
        return bool(value)
    if typ is int and isinstance(value, int | np.integer) and not isinstance(value, bool | np.bool_):
        return int(value)
    if typ is int and isinstance(value, float | np.floating) and float(value).is_integer():
        return int(value)  # 1e4 steps
    if typ is float and isinstance(value, int | float | np.integer | np.floating) and not isinstance(value, bool):
        return float(value)
    if typ is str and isinstance(value, str):
        return value
    raise UserError(f"{key}={value!r}: expected {_TYPE_NAMES[typ]} (got {type(value).__name__})")


_TYPE_NAMES = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}
_PLURALS = {bool: "booleans", int: "integers", float: "numbers", str: "strings"}


def _traced_scalar(value: Any) -> bool:
    """A JAX array of shape () (a traced sweep number): checked by the program that reads it."""
    return (
        not isinstance(value, np.generic | np.ndarray)
        and getattr(value, "shape", None) == ()
        and hasattr(value, "dtype")
    )


#: The root config class (jaxnet.config.Config), registered by the schema that defines it, so a
#: section can name its keys (``optim.lr``) and suggest keys of the other sections.
_ROOT: list[type] = []


def set_root(cls: type) -> None:
    """Register ``cls`` as the config whose sections are checked (:class:`Checked`)."""
    _ROOT[:] = [cls]


def _prefix(cls: type) -> str:
    if issubclass(cls, ModelConfig):
        return "model."
    for f in dataclasses.fields(_ROOT[0]) if _ROOT else ():
        if (_attribute_types(_ROOT[0]) or {}).get(f.name) is cls:
            return f"{f.name}."
    return ""


def unknown_attribute(cls: type, name: str, model_name: str = "") -> UserError:
    """The error for setting attribute ``name`` that config class ``cls`` does not have (a model
    config's family is ``model_name``): the same as for the key on the command line."""
    model = cls if issubclass(cls, ModelConfig) else None
    known: dict[str, Any] = {}
    for key in leaves(_ROOT[0]) if _ROOT else leaves(cls, _prefix(cls)):
        if not key.startswith("model."):
            known[key] = None
    for family in [model] if model is not None else [f.config for f in REGISTRY.values()]:
        known.update(dict.fromkeys(model_keys(family)))
    return unknown_key(f"{_prefix(cls)}{name}", list(known), model_name)


# Names people bring from other frameworks.
ALIASES = {
    "learning_rate": "optim.lr",
    "lr": "optim.lr",
    "epochs": "train.steps",
    "max_steps": "train.steps",
    "batch": "train.batch_size",
    "bs": "train.batch_size",
    "wd": "optim.weight_decay",
    "optimizer": "optim.name",
    "arch": "model.name",
    "dataset": "data.name",
}


def key_owners(key: str) -> list[str]:
    """The registered model families that have ``key`` (``model.LEAF``)."""
    return [name for name, family in REGISTRY.items() if key in model_keys(family.config)]


def unknown_key(key: str, known: list[str], model_name: str) -> UserError:
    """The error for config key ``key`` that is not among the ``known`` keys of a config whose
    model is ``model_name``: the nearest keys (a misspelling, the right name in another section,
    a name from another framework), or the keys there are."""
    section, _, leaf = key.rpartition(".")
    siblings = [k for k in known if k.rpartition(".")[0] == section] if section else []
    if section == "mesh":  # a mesh key is an axis name; list them all rather than guess
        return UserError(
            f"unknown mesh axis {leaf!r} in {key}; the mesh axes are {', '.join(siblings)} "
            "(set the ones you use to a device count)"
        )
    if section == "model" and key_owners(key):  # a key of another model family
        own = [k.partition(".")[2] for k in siblings if k != "model.name"]
        return UserError(
            f"{key} is not a key of model {model_name} (it belongs to {', '.join(key_owners(key))}); "
            f"the {model_name} keys are {', '.join(own)}"
        )
    near = [k for k in known if k.rsplit(".", 1)[-1] == leaf]  # right name, wrong section
    if leaf in ALIASES:
        near.append(ALIASES[leaf])
    if siblings:  # a known section: a misspelt name in it (the shared section name would match anything)
        names = [k.rpartition(".")[2] for k in siblings]
        near += [f"{section}.{m}" for m in difflib.get_close_matches(leaf, names, n=3, cutoff=0.6)]
    else:
        near += difflib.get_close_matches(key, known, n=3, cutoff=0.6)
    near = list(dict.fromkeys(near))[:3]
    if near:
        hint = f"; did you mean {' or '.join(near)}?"
    elif siblings:
        hint = f"; the {section} keys are {', '.join(k.rpartition('.')[2] for k in siblings)}"
    else:
        top = [k for k in known if "." not in k and k != "experiment"]
        sections = [f"{s}.*" for s in dict.fromkeys(k.partition(".")[0] for k in known if "." in k)]
        hint = f"; the keys are {', '.join(top + sections)} (see `jaxnet train EXP --show-config`)"
    return UserError(f"unknown config key {key!r}{hint}")


def _leaves(tree: Any) -> list:
    import jax

    return jax.tree.leaves(tree)


#: The keys every family has that say how a model is computed, not what (:meth:`ModelConfig.arithmetic`).
_HOW = ("name", "dtype", "param_dtype")


@dataclass
class ModelConfig(Checked):
    """The fields every model family shares; each family's config subclasses it beside its module.

    ``dtype=bfloat16`` with ``param_dtype=float32`` is mixed precision. A family's config adds its
    own fields (with :func:`field`), its cross-field checks (:meth:`validate`) and how to make its
    module (:meth:`build`), and is registered by :func:`register`; ``name`` is filled in from there.
    """

    #: The model carries a state from one batch to the next (an LSTM's hidden state): its text
    #: batches are contiguous streams by default, and gradients cannot be accumulated over
    #: micro-batches (the state is per batch row). A class attribute, not a config key.
    carries_state: typing.ClassVar[bool] = False
    #: The model's attention works across pieces of each row's sequence held by different devices
    #: (``mesh.context`` > 1, context parallelism: the Transformer). A class attribute, not a config key.
    splits_sequence: typing.ClassVar[bool] = False

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

    def forward_flops(self, *, batch: int, input_shape: tuple, outputs: int, causal: bool = True) -> float | None:
        """The matrix-product FLOPs of one forward pass of this family's model on ``batch`` inputs
        of ``input_shape`` (``(seq_len,)`` for a language model, ``(height, width, channels)`` for
        images) with ``outputs`` classes or tokens, counted as :mod:`jaxnet.flops` says; None when
        the family has no count (throughput is then reported without MFU). ``causal`` counts only
        the attention pairs a causal model needs. A family that knows its arithmetic overrides it::

            def forward_flops(self, *, batch, input_shape, outputs, causal=True):
                return 2 * batch * (input_shape[0] * self.hidden + self.hidden * outputs)
        """
        return None

    def active_parameters(self, params: Any) -> int:
        """How many of ``params`` (this model's parameter tree, arrays or shapes) each example
        computes with: all of them by default; a mixture of experts only its routed experts'."""
        return int(sum(math.prod(np.shape(x)) for x in _leaves(params)))

    def arithmetic(self) -> dict[str, Any]:
        """The keys that decide what this model computes (not how: kernels, dtypes, dropout,
        rematerialisation), each resolved: two configs of equal arithmetic compute the same function
        of the same parameters (a checkpoint format can hold a model when the config it writes reads
        back to the same arithmetic). Every key but the dtypes by default; a family with keys of
        another kind overrides it."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in _HOW}

    def axis_rules(self, mesh_shape: dict[str, int]) -> tuple[tuple[str, Any], ...]:
        """Logical axis names of this family's parameters and activations that the shared table
        (:data:`jaxnet.parallel.RULES`) does not place, each with the mesh axis (or None: whole on
        every device) it goes to on a mesh of ``mesh_shape`` (``{"data": 2, "fsdp": 1, "tensor":
        4}``). They come before the shared rules. None by default::

            def axis_rules(self, mesh_shape):
                return (("experts", "tensor" if self.experts % mesh_shape["tensor"] == 0 else None),)
        """
        return ()


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
# Layouts that changed: arrays saved by an older jaxnet, read as today's.


@dataclass(frozen=True)
class Unpacked:
    """A parameter an older jaxnet saved packed, now kept as several: a saved array whose path
    ends with ``old`` holds, along ``axis``, the arrays whose paths end with each of ``new``
    instead (the rest of the path the same). ``note`` says what changed, once, when it is read.
    Optimizer moments mirror the parameters' paths and are read the same way::

        Unpacked(("qkv", "kernel"), (("query", "kernel"), ("key", "kernel"), ("value", "kernel")), axis=-3,
                 note="attention's packed qkv kernel split into query, key and value")
    """

    old: tuple[str, ...]
    new: tuple[tuple[str, ...], ...]
    axis: int
    note: str

    def matches(self, path: tuple[str, ...], shape: tuple[int, ...]) -> bool:
        """Whether an array saved at ``path`` of ``shape`` is one this change unpacks."""
        ndim = len(shape)
        return path[-len(self.old) :] == self.old and -ndim <= self.axis < ndim and shape[self.axis] == len(self.new)

    def unpack(self, path: tuple[str, ...], leaf: Any) -> dict[tuple[str, ...], Any]:
        """Today's arrays by path from the saved ``leaf`` at ``path`` (an array, or metadata with a
        ``shape`` and ``dtype``, unpacked into :class:`Shaped` ones)."""
        stem = path[: -len(self.old)]
        if not hasattr(leaf, "__array__"):  # metadata: only the shapes
            shape = tuple(d for j, d in enumerate(leaf.shape) if j != self.axis % len(leaf.shape))
            return {stem + name: Shaped(shape, leaf.dtype) for name in self.new}
        array = np.asarray(leaf)
        return {stem + name: np.take(array, i, axis=self.axis) for i, name in enumerate(self.new)}


class Shaped(typing.NamedTuple):
    """The shape and dtype of an array not read (what :meth:`Unpacked.unpack` makes of metadata)."""

    shape: tuple[int, ...]
    dtype: Any


#: Every layout change a family has registered (:func:`register_migration`).
MIGRATIONS: list[Unpacked] = []


def register_migration(change: Unpacked) -> None:
    """Read arrays an older jaxnet saved in ``change``'s layout as today's (checkpoints, resumed
    runs, ``train.init_from``, :func:`jaxnet.load`)."""
    if change not in MIGRATIONS:
        MIGRATIONS.append(change)


def migrate(flat: dict[tuple[str, ...], Any]) -> tuple[dict[tuple[str, ...], Any], list[str]]:
    """``flat`` (saved leaves by path: arrays, or metadata with a shape and dtype) in today's layout,
    and the notes of the changes that applied (each once). Leaves no change matches are kept."""
    out: dict[tuple[str, ...], Any] = {}
    notes: list[str] = []
    for path, leaf in flat.items():
        shape = tuple(getattr(leaf, "shape", ()) or ())
        change = next((c for c in MIGRATIONS if c.matches(path, shape)), None)
        if change is None:
            out[path] = leaf
            continue
        out.update(change.unpack(path, leaf))
        if change.note not in notes:
            notes.append(change.note)
    return out, notes


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

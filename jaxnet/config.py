"""Typed experiment configuration: nested dataclasses, ``key=value`` overrides, validation.

An experiment is a Python file with ``get_config(variant) -> Config`` (see experiments/).
Every value a user can set is a typed field with a one-line description, so
``jaxnet train EXP --show-config`` can list them and overrides are checked against them::

    cfg = load_experiment("cnn_fashion_mnist:smoke")
    cfg = apply_overrides(cfg, ["optim.lr=0.05", "train.steps=300", "model.dropout=0.1"])

The sections are below, except the model's: each model family owns its config (a subclass of
:class:`ModelConfig` beside its module, registered in :mod:`jaxnet.models`), so the ``model.*``
keys are those of the family ``cfg.model`` is, and ``model.name=X`` switches family.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import importlib.util
import json
import math
import os
import sys
import traceback
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
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


@dataclass
class DataConfig:
    """Which dataset, where it is, and how batches are made from it."""

    name: str = field(
        "fashion_mnist",
        "dataset ('arrays' = data given from Python or by an experiment file's data(cfg))",
        choices=("fashion_mnist", "mnist", "cifar10", "ptb", "shakespeare", "text", "arrays"),
    )
    dir: str = field("", "directory holding the dataset files ('' = the standard location)")
    path: str = field("", "text file to train a language model on (data.name=text)")
    tokenizer: str = field(
        "",
        "text tokenizer ('' = the dataset's own: word for ptb, char for shakespeare and text)",
        choices=("", "char", "word", "byte"),
    )
    seq_len: int = field(0, "language models: tokens per sequence (BPTT length or context)", low=0)
    batching: str = field(
        "",
        "language models: 'stream' = contiguous streams carrying state across batches (LSTM), 'windows' = "
        "random windows ('' = stream for lstm, windows otherwise)",
        choices=("", "stream", "windows"),
    )
    val_size: int = field(5000, "image datasets: training examples held out for validation", low=0)
    augment: bool = field(False, "random crop (4 px padding) and horizontal flip")
    prefetch: int = field(2, "batches prepared ahead of the step on a background thread", low=0)
    mask_rate: float = field(
        0.15,
        "masked_lm: fraction of tokens chosen for prediction (80 % become a mask token, 10 % a random token, "
        "10 % stay)",
        low=0.01,
        high=0.5,
    )


@dataclass
class ModelConfig:
    """The fields every model family shares; each family's config subclasses it beside its module.

    ``dtype=bfloat16`` with ``param_dtype=float32`` is mixed precision. A family's config adds its
    own fields (with :func:`field`) and its cross-field checks (:meth:`validate`), and is
    registered with its module by :func:`jaxnet.models.register`; ``name`` is filled in from there.
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
            self.name = _registered_name(type(self))

    def validate(self) -> None:
        """Checks that involve more than one field of the model (each field's own range is checked already)."""


@dataclass
class OptimConfig:
    """Optimizer, learning-rate schedule, clipping and gradient accumulation."""

    name: str = field("adamw", "optimizer", choices=("adamw", "sgd"))
    lr: float = field(1e-3, "peak learning rate", low=0.0)
    momentum: float = field(0.9, "SGD momentum (0 = plain SGD)", low=0.0, high=0.999)
    nesterov: bool = field(False, "Nesterov momentum for SGD")
    b1: float = field(0.9, "AdamW first-moment decay", low=0.0, high=0.9999)
    b2: float = field(0.999, "AdamW second-moment decay", low=0.0, high=0.99999)
    weight_decay: float = field(
        0.0, "AdamW: decoupled, scaled by the learning rate; SGD: L2 term added to the gradient", low=0.0
    )
    schedule: str = field(
        "cosine",
        "learning-rate schedule after warmup ('step': multiply by decay_factor every decay_every steps "
        "from step decay_start on)",
        choices=("cosine", "constant", "step"),
    )
    decay_start: int = field(0, "step schedule: first step with a decayed learning rate", low=0)
    decay_every: int = field(1, "step schedule: steps between decays", low=1)
    decay_factor: float = field(0.5, "step schedule: learning-rate multiplier per decay", low=0.0, high=1.0)
    warmup_steps: int = field(0, "linear warmup from 0 to lr over this many steps", low=0)
    end_lr_factor: float = field(
        0.0, "final learning rate of the cosine schedule, as a fraction of lr", low=0.0, high=1.0
    )
    clip_norm: float = field(0.0, "clip gradients to this global norm (0 = off)", low=0.0)
    grad_accum: int = field(1, "split each batch into this many micro-batches and average their gradients", low=1)


@dataclass
class TrainConfig:
    """Length of the run, batch sizes, and how often to log, evaluate and checkpoint."""

    steps: int = field(1000, "optimizer updates in the whole run", low=1)
    batch_size: int = field(128, "examples per optimizer update (global, across devices)", low=1)
    eval_batch_size: int = field(1000, "examples (images, or text sequences / streams) per evaluation batch", low=1)
    log_every: int = field(50, "steps between training-metric logs (when the host waits for the device)", low=1)
    eval_every: int = field(0, "steps between validation passes (0 = only at the end)", low=0)
    checkpoint_every: int = field(500, "steps between checkpoints (0 = only at the end)", low=0)
    keep_checkpoints: int = field(3, "checkpoints kept on disk (the newest ones)", low=1)
    stop_after: int = field(0, "end this invocation after this many steps; rerun to resume (0 = off)", low=0)
    steps_per_call: int = field(
        1,
        "steps run by one compiled call (a lax.scan over that many batches): one dispatch and host round trip per "
        "call; log_every, eval_every and checkpoint_every must be multiples of it",
        low=1,
    )
    label_smoothing: float = field(0.0, "label smoothing of the cross-entropy", low=0.0, high=1.0)
    progress: bool = field(True, "show a progress bar")
    on_nonfinite: str = field(
        "stop",
        "a NaN or Inf loss or gradient: stop the run (naming the step), or skip that update inside the step",
        choices=("stop", "skip"),
    )


@dataclass
class MeshConfig:
    """How the devices are arranged."""

    data: int = field(-1, "devices along the data-parallel axis (-1 = the rest of the devices)", low=-1)
    fsdp: int = field(
        1, "devices that split the batch and shard parameters and optimizer state (-1 = the rest)", low=-1
    )
    tensor: int = field(1, "devices that split attention heads and hidden units (-1 = the rest)", low=-1)


@dataclass
class ParallelConfig:
    """How the devices of the mesh cooperate on a step."""

    mode: str = field(
        "sharded",
        "sharded: one program over the whole mesh, the compiler places the work (jit + NamedSharding); "
        "replicas: a whole model copy per device, gradients averaged with pmean (shard_map)",
        choices=("sharded", "replicas"),
    )
    sgd: str = field(
        "sync",
        "sync: one update per step from the whole batch; async: parallel.workers simulated workers, one update "
        "each per step, from parameters parallel.staleness updates old (Hogwild-style); local: workers update "
        "their own copies and average them every parallel.local_steps steps",
        choices=("sync", "async", "local"),
    )
    workers: int = field(1, "async/local: simulated workers; each takes batch_size / workers rows of a step", low=1)
    staleness: int = field(0, "async: how many updates old the parameters are that a worker's gradient uses", low=0)
    delay: str = field(
        "fixed",
        "async: fixed = every gradient is parallel.staleness updates old; random = a draw from 0..staleness per "
        "update (deterministic given the seed), for workers of unequal speed",
        choices=("fixed", "random"),
    )
    local_steps: int = field(1, "local: steps between averaging the workers' copies (H)", low=1)


@dataclass
class ProfileConfig:
    """Tracing a few steps for TensorBoard's profiler or Perfetto."""

    steps: str = field(
        "", "trace updates A to B (e.g. 10-20) into WORKDIR/profile for TensorBoard or Perfetto ('' = off)"
    )


@dataclass
class Config:
    """Everything that defines a run. Saved as ``config.json`` in the run directory."""

    experiment: str = field("", "experiment[:variant] this config came from")
    seed: int = field(0, "seed for initialisation, data order, dropout and augmentation", low=0)
    task: str = field(
        "",
        "what the model is trained to do: '' = the data's own (classification for images, lm for text); "
        "classification, lm, masked_lm, regression, or a task an experiment file defines",
    )
    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    model: ModelConfig = dataclasses.field(default_factory=lambda: model_config(DEFAULT_MODEL))
    optim: OptimConfig = dataclasses.field(default_factory=OptimConfig)
    train: TrainConfig = dataclasses.field(default_factory=TrainConfig)
    mesh: MeshConfig = dataclasses.field(default_factory=MeshConfig)
    parallel: ParallelConfig = dataclasses.field(default_factory=ParallelConfig)
    profile: ProfileConfig = dataclasses.field(default_factory=ProfileConfig)

    def to_dict(self) -> dict[str, Any]:
        """The config as nested dicts of plain values, ready for ``json.dumps`` (the model section
        holds its family's keys only)."""
        tree = dataclasses.asdict(self)
        tree["model"] = {k.partition(".")[2]: tree["model"][k.partition(".")[2]] for k in model_keys(type(self.model))}
        return tree


# ---------------------------------------------------------------------------------------------
# Model families. The registry is jaxnet.models.REGISTRY; that package imports JAX, so it is
# imported here only when a family is looked up.

DEFAULT_MODEL = "convnet"


def _families() -> dict[str, Any]:
    """The registered model families by name (each with ``config``, ``build`` and ``inputs``)."""
    from jaxnet import models

    return models.REGISTRY


def _registered_name(cls: type) -> str:
    return next((name for name, family in _families().items() if family.config is cls), "")


def _unknown_model(name: str) -> UserError:
    known = list(_families())
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
    families = _families()
    if name not in families:
        raise _unknown_model(name)
    return families[name].config(name=name)


# ---------------------------------------------------------------------------------------------
# Leaves: every settable key, its type and its limits.

_SCALARS = (bool, int, float, str)


@functools.cache
def _leaves(cls: type, prefix: str = "") -> dict[str, dataclasses.Field]:
    try:
        hints = typing.get_type_hints(cls)
    except NameError as e:
        raise TypeError(f"config class {cls.__name__}: cannot resolve an annotation ({e})") from None
    out: dict[str, dataclasses.Field] = {}
    for f in dataclasses.fields(cls):
        f.type = hints[f.name]
        if dataclasses.is_dataclass(f.type):
            out.update(_leaves(f.type, f"{prefix}{f.name}."))
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
    leaves = _leaves(cls, "model.")
    for f in leaves.values():
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise TypeError(f"{cls.__name__}.{f.name} needs a default value (use jaxnet.config.field)")
        if not _supported(f.type):
            raise TypeError(
                f"{cls.__name__}.{f.name}: type {f.type} cannot be set from the command line; use bool, int, "
                "float, str or tuple[T, ...] of those"
            )
    shared = [k for k in _leaves(ModelConfig, "model.") if k != "model.name"]
    order = ["model.name", *(k for k in leaves if k not in shared and k != "model.name"), *shared]
    return {k: leaves[k] for k in order}


def keys(cfg: Config | None = None) -> dict[str, dataclasses.Field]:
    """Every settable key of ``cfg`` (default ``Config()``): the sections' and its model family's.

    >>> "model.heads" in keys(load_experiment("transformer_shakespeare"))   # doctest: +SKIP
    True
    """
    cfg = cfg if cfg is not None else Config()
    out: dict[str, dataclasses.Field] = {}
    for key, f in _leaves(Config).items():
        if key == "model.name":
            out.update(model_keys(type(cfg.model)))
        elif not key.startswith("model."):
            out[key] = f
    return out


def describe(cfg: Config | None = None) -> str:
    """One line per settable key of ``cfg`` (default ``Config()``): name, type, default and what it does."""
    cfg = cfg if cfg is not None else Config()
    lines = []
    for key, f in keys(cfg).items():
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        choices = f.metadata.get("choices")
        if key == "model.name":
            default, choices = cfg.model.name, tuple(_families())
        type_name = getattr(f.type, "__name__", str(f.type).replace("typing.", ""))
        shown = f" {{{'|'.join(choices)}}}" if choices else ""
        lines.append(f"{key:24s} {type_name:16s} {default!s:14s} {f.metadata.get('doc', '')}{shown}")
    return "\n".join(lines)


def _parse(key: str, value: Any, typ: Any) -> Any:
    """Convert ``value`` (a string from the command line, or a JSON value) to ``typ``."""

    def fail(expected: str) -> UserError:
        return UserError(f"{key}={value!r}: expected {expected}")

    if typ is bool:
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in ("1", "true", "yes", "on"):
            return True
        if text in ("0", "false", "no", "off"):
            return False
        raise fail("true or false")
    if typ is int:
        if isinstance(value, bool):
            raise fail("an integer")
        if isinstance(value, int):
            return value
        try:
            number = float(str(value).replace("_", ""))
        except ValueError:
            raise fail("an integer") from None
        if not number.is_integer():
            raise fail("an integer")
        return int(number)
    if typ is float:
        try:
            number = float(value) if not isinstance(value, bool) else math.nan
        except (TypeError, ValueError):
            raise fail("a number") from None
        if not math.isfinite(number):
            raise fail("a finite number")
        return number
    if typ is str:
        if not isinstance(value, str):
            raise fail("a string")
        return value
    if typing.get_origin(typ) is tuple:
        (item_type, _) = typing.get_args(typ)
        if isinstance(value, str):
            text = value.strip().strip("()[]")
            items = [v for v in (s.strip() for s in text.split(",")) if v]
        elif isinstance(value, (list, tuple)):
            items = list(value)
        else:
            raise fail("a comma-separated list")
        if not items:
            raise fail("a non-empty comma-separated list, e.g. 32,64")
        return tuple(_parse(key, v, item_type) for v in items)
    raise TypeError(f"config field {key} has unsupported type {typ}")


def _check(key: str, value: Any, f: dataclasses.Field) -> None:
    choices, low, high = f.metadata.get("choices"), f.metadata.get("low"), f.metadata.get("high")
    if choices and value not in choices:
        raise UserError(f"{key}={value!r} is not one of: {', '.join(choices)}")
    every = ": every entry " if isinstance(value, tuple) else " "
    for v in value if isinstance(value, tuple) else (value,):
        if low is not None and v < low:
            raise UserError(f"{key}={_show(value)}{every}must be >= {low}")
        if high is not None and v > high:
            raise UserError(f"{key}={_show(value)}{every}must be <= {high}")


def _show(value: Any) -> str:
    """A value as it is written on the command line: ``32,0`` for a tuple, ``1.5`` for a number."""
    return ",".join(map(str, value)) if isinstance(value, tuple) else repr(value)


# Names people bring from other frameworks.
_ALIASES = {
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


def _owners(key: str) -> list[str]:
    """The registered model families that have ``key`` (``model.LEAF``)."""
    return [name for name, family in _families().items() if key in model_keys(family.config)]


def _unknown_key(cfg: Config, key: str) -> UserError:
    known = keys(cfg)
    section, _, leaf = key.rpartition(".")
    siblings = [k for k in known if k.rpartition(".")[0] == section] if section else []
    if section == "mesh":  # a mesh key is an axis name; list them all rather than guess
        return UserError(
            f"unknown mesh axis {leaf!r} in {key}; the mesh axes are {', '.join(siblings)} "
            "(set the ones you use to a device count)"
        )
    if section == "model" and _owners(key):  # a key of another model family
        own = [k.partition(".")[2] for k in siblings if k != "model.name"]
        return UserError(
            f"{key} is not a key of model {cfg.model.name} (it belongs to {', '.join(_owners(key))}); "
            f"the {cfg.model.name} keys are {', '.join(own)}"
        )
    near = [k for k in known if k.rsplit(".", 1)[-1] == leaf]  # right name, wrong section
    if leaf in _ALIASES:
        near.append(_ALIASES[leaf])
    if siblings:  # a known section: a misspelt name in it (the shared section name would match anything)
        leaves = [k.rpartition(".")[2] for k in siblings]
        near += [f"{section}.{m}" for m in difflib.get_close_matches(leaf, leaves, n=3, cutoff=0.6)]
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


def _switch_model(cfg: Config, name: str) -> None:
    """Make ``cfg.model`` a config of family ``name``, keeping the values of the fields both
    families have (same name and type: dtype, dropout, width, ...)."""
    if name == cfg.model.name:
        return
    old, new = cfg.model, model_config(name)
    old_keys = model_keys(type(old))
    for key, f in model_keys(type(new)).items():
        if key != "model.name" and key in old_keys and old_keys[key].type == f.type:
            setattr(new, f.name, getattr(old, f.name))
    cfg.model = new


def _set(cfg: Config, key: str, value: Any, saved: bool = False) -> None:
    if key == "model.name":
        _switch_model(cfg, _parse(key, value, str))
        return
    known = keys(cfg)
    if key not in known:
        if saved and key.startswith("model.") and _owners(key):
            return  # a saved config from before per-family model configs holds every family's keys
        raise _unknown_key(cfg, key)
    f = known[key]
    value = _parse(key, value, f.type)
    _check(key, value, f)
    *path, leaf = key.split(".")
    node = cfg
    for part in path:
        node = getattr(node, part)
    setattr(node, leaf, value)


def apply_overrides(cfg: Config, overrides: list[str]) -> Config:
    """Return a copy of ``cfg`` with ``key=value`` strings applied, each parsed and checked.

    ``model.name=X`` is applied first wherever it stands: it makes the model a config of family X
    (keeping the values of the fields both families have), whose keys the other ``model.*``
    overrides then set.
    """
    cfg = from_dict(cfg.to_dict())
    pairs = []
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UserError(f"override {item!r} is not of the form key=value (e.g. optim.lr=0.05)")
        if key.strip() == "experiment":
            raise UserError("experiment cannot be overridden; name the experiment as the first argument instead")
        pairs.append((key.strip(), value))
    for key, value in sorted(pairs, key=lambda pair: pair[0] != "model.name"):  # stable: the rest keep their order
        _set(cfg, key, value)
    validate(cfg)
    return cfg


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dicts to one dict with dotted keys: ``{"optim": {"lr": 1}}`` -> ``{"optim.lr": 1}``."""
    flat: dict[str, Any] = {}
    for k, v in tree.items():
        if isinstance(v, dict):
            flat.update(flatten(v, f"{prefix}{k}."))
        else:
            flat[f"{prefix}{k}"] = v
    return flat


def from_dict(tree: dict[str, Any], saved: bool = False) -> Config:
    """Build a checked Config from nested plain values (e.g. a saved ``config.json``).

    ``model.name`` picks the model family (its defaults fill the keys the tree leaves out).
    ``saved=True`` reads a saved config: model keys of other families are dropped, as config.json
    files written before each family had its own config hold every family's keys.
    """
    cfg = Config()
    flat = flatten(tree)
    if "model.name" in flat:
        cfg.model = model_config(_parse("model.name", flat.pop("model.name"), str))
    for key, value in flat.items():
        _set(cfg, key, value, saved)
    return cfg


TEXT_DATA = ("ptb", "shakespeare", "text")
IMAGE_DATA = ("fashion_mnist", "mnist", "cifar10")


def validate(cfg: Config) -> None:
    """Checks that involve more than one value, or that every field check would miss."""
    families = _families()
    if cfg.model.name not in families:
        raise _unknown_model(cfg.model.name)
    family = families[cfg.model.name]
    if type(cfg.model) is not family.config:
        raise UserError(
            f"model.name={cfg.model.name} is a {family.config.__name__}, but the config's model is a "
            f"{type(cfg.model).__name__}: set cfg.model = {family.config.__name__}(...) rather than cfg.model.name "
            f"(or register {type(cfg.model).__name__} under a name of its own)"
        )
    for key, f in keys(cfg).items():
        node: Any = cfg
        for part in key.split("."):
            node = getattr(node, part)
        _check(key, node, f)
    if cfg.train.batch_size % cfg.optim.grad_accum:
        raise UserError(
            f"train.batch_size={cfg.train.batch_size} is not divisible by "
            f"optim.grad_accum={cfg.optim.grad_accum}; pick a batch size that is a multiple of it"
        )
    if cfg.optim.warmup_steps > cfg.train.steps:
        raise UserError(
            f"optim.warmup_steps={cfg.optim.warmup_steps} exceeds train.steps={cfg.train.steps}; "
            "lower optim.warmup_steps or raise train.steps"
        )
    for axis in ("data", "fsdp", "tensor"):
        if getattr(cfg.mesh, axis) == 0:
            raise UserError(f"mesh.{axis}=0: use a positive device count or -1 for the rest of the devices")
    text_data = cfg.data.name in TEXT_DATA
    if family.inputs != "any" and cfg.data.name in TEXT_DATA + IMAGE_DATA and text_data != (family.inputs == "tokens"):
        token_models = [name for name, f in families.items() if f.inputs == "tokens"]
        raise UserError(
            f"model.name={cfg.model.name} cannot train on data.name={cfg.data.name}; language models "
            f"({', '.join(token_models)}) need text data ({', '.join(TEXT_DATA)}) and image models need image data"
        )
    if text_data and cfg.data.seq_len < 1:
        raise UserError("language models need data.seq_len >= 1 (tokens per training sequence)")
    if cfg.data.name == "text" and not cfg.data.path:
        raise UserError("data.name=text needs data.path=FILE, the text file to train on")
    cfg.model.validate()
    if cfg.model.name == "lstm" and cfg.optim.grad_accum > 1:
        raise UserError("optim.grad_accum > 1 cannot be used with model.name=lstm (its carried state is per batch row)")
    if "float64" in (cfg.model.dtype, cfg.model.param_dtype):
        import jax

        if not jax.config.read("jax_enable_x64"):
            raise UserError("model.dtype=float64 needs JAX's 64-bit mode: run with JAX_ENABLE_X64=1")
    profile_steps(cfg)
    _check_steps_per_call(cfg)
    if cfg.parallel.mode == "replicas" and (cfg.mesh.fsdp != 1 or cfg.mesh.tensor != 1):
        raise UserError(
            f"parallel.mode=replicas keeps a whole model on every device, so it needs mesh.fsdp=1 and "
            f"mesh.tensor=1 (got mesh.fsdp={cfg.mesh.fsdp}, mesh.tensor={cfg.mesh.tensor})"
        )
    _check_sgd(cfg)


def _check_steps_per_call(cfg: Config) -> None:
    """Logs, evaluations and checkpoints fall between calls of ``train.steps_per_call`` steps."""
    t = cfg.train
    k = t.steps_per_call
    for key in ("log_every", "eval_every", "checkpoint_every"):
        value = getattr(t, key)
        if value % k:
            lower, higher = value // k * k, -(-value // k) * k
            fits = f"{lower} or {higher}" if lower else str(higher)
            raise UserError(
                f"train.{key}={value} is not a multiple of train.steps_per_call={k}: set train.{key}={fits}, "
                f"or a train.steps_per_call that divides {value}"
            )


def _check_sgd(cfg: Config) -> None:
    """Asynchronous and local SGD: settings that fit together."""
    p = cfg.parallel
    if p.sgd == "sync":
        defaults = {"workers": 1, "staleness": 0, "local_steps": 1}
        changed = [f"parallel.{k}={getattr(p, k)}" for k, v in defaults.items() if getattr(p, k) != v]
        if changed:
            raise UserError(f"{', '.join(changed)} needs parallel.sgd=async or parallel.sgd=local")
        return
    if p.mode != "sharded":
        raise UserError(f"parallel.sgd={p.sgd} simulates its workers inside one step: use parallel.mode=sharded")
    if cfg.optim.grad_accum != 1:
        raise UserError(f"parallel.sgd={p.sgd} cannot be combined with optim.grad_accum={cfg.optim.grad_accum}")
    if cfg.train.batch_size % p.workers:
        raise UserError(
            f"train.batch_size={cfg.train.batch_size} is not divisible by parallel.workers={p.workers}; "
            "each worker takes an equal share of the batch"
        )
    if p.sgd == "local" and p.staleness:
        raise UserError("parallel.staleness is for parallel.sgd=async; local SGD uses parallel.local_steps")
    if p.sgd == "async" and p.local_steps != 1:
        raise UserError("parallel.local_steps is for parallel.sgd=local; asynchronous SGD uses parallel.staleness")


def profile_steps(cfg: Config) -> tuple[int, int] | None:
    """The updates ``profile.steps=A-B`` asks to trace, as ``(A, B)`` (1-based, inclusive), or None."""
    text = cfg.profile.steps.strip()
    if not text:
        return None
    first, sep, last = text.partition("-")
    if not (sep and first.strip().isdigit() and last.strip().isdigit()):
        raise UserError(f"profile.steps={text!r}: expected A-B, the first and last update to trace, e.g. 10-20")
    a, b = int(first), int(last)
    if not 1 <= a <= b <= cfg.train.steps:
        raise UserError(f"profile.steps={text}: needs 1 <= A <= B <= train.steps={cfg.train.steps}")
    return a, b


def batching(cfg: Config) -> str:
    """How a language model's batches are made: the explicit ``data.batching`` or the model's default."""
    return cfg.data.batching or ("stream" if cfg.model.name == "lstm" else "windows")


RUN_KEY = "_run"  # config.json's record of how the run was launched; not part of the config


def save(cfg: Config, path: str | os.PathLike, run: dict[str, Any] | None = None) -> None:
    """Write the resolved config as indented JSON, atomically.

    ``run`` (versions, devices, command line) is kept under ``"_run"``; :func:`load` ignores it.
    """
    tree = cfg.to_dict()
    if run is not None:
        tree[RUN_KEY] = run
    path = Path(path)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(tree, indent=2) + "\n")
    tmp.replace(path)


def load(path: str | os.PathLike) -> Config:
    """Read a ``config.json`` written by :func:`save`."""
    try:
        tree = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise UserError(f"cannot read config {path}: {e}") from None
    if not isinstance(tree, dict):
        raise UserError(f"{path} is not a jaxnet config (expected a JSON object)")
    tree.pop(RUN_KEY, None)
    try:
        return from_dict(tree, saved=True)
    except UserError as e:
        raise UserError(f"{path}: {e}") from None


# ---------------------------------------------------------------------------------------------
# Experiments: files with get_config(variant).


def experiment_dirs() -> list[Path]:
    """Where experiment names are looked up, in order.

    ``$JAXNET_EXPERIMENTS`` (colon-separated), ``./experiments``, then the experiments/ folder
    next to the installed package (a source checkout).
    """
    dirs = [Path(p) for p in os.environ.get("JAXNET_EXPERIMENTS", "").split(os.pathsep) if p]
    dirs += [Path.cwd() / "experiments", Path(__file__).resolve().parents[1] / "experiments"]
    unique: list[Path] = []
    for d in dirs:
        if d.is_dir() and d.resolve() not in [u.resolve() for u in unique]:
            unique.append(d)
    return unique


def list_experiments() -> list[str]:
    """Names of the experiments found in :func:`experiment_dirs`."""
    names = {p.stem for d in experiment_dirs() for p in d.glob("*.py") if not p.stem.startswith("_")}
    return sorted(names)


def _experiment_file(name: str) -> Path:
    if name.endswith(".py"):
        path = Path(name)
        if not path.is_file():
            raise UserError(f"experiment file {name} does not exist")
        return path
    for d in experiment_dirs():
        if (d / f"{name}.py").is_file():
            return d / f"{name}.py"
    known = list_experiments()
    near = difflib.get_close_matches(name, known, n=1)
    hint = f"did you mean {near[0]}? " if near else ""
    raise UserError(f"unknown experiment {name!r}; {hint}known: {', '.join(known) or 'none found'}")


_EXPERIMENT_MODULES: dict[str, types.ModuleType] = {}


def experiment_module(experiment: str) -> types.ModuleType | None:
    """The module :func:`load_experiment` most recently loaded for ``experiment`` (a
    ``cfg.experiment`` string, ``NAME`` or ``NAME:VARIANT``), or None.

    The runner looks in it for the experiment file's optional ``model(cfg)``, ``data(cfg)``,
    ``task(cfg)`` and ``actions(cfg)``.
    """
    return _EXPERIMENT_MODULES.get(experiment)


def load_experiment(spec: str, overrides: list[str] | None = None) -> Config:
    """Load ``NAME[:VARIANT]`` (or ``path/to/file.py[:VARIANT]``) and apply overrides.

    >>> cfg = load_experiment("cnn_fashion_mnist:smoke", ["optim.lr=0.01"])
    >>> cfg.optim.lr
    0.01
    """
    name, _, variant = spec.partition(":")
    variant = variant or "default"
    path = _experiment_file(name)
    module_spec = importlib.util.spec_from_file_location(f"jaxnet_experiment_{path.stem}", path)
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[module_spec.name] = module  # so its dataclasses' annotations resolve, as for an imported module
    _run_experiment_code(path, lambda: module_spec.loader.exec_module(module))
    if not callable(getattr(module, "get_config", None)):
        raise UserError(f"experiment file {path} has no get_config(variant) function")
    variants = getattr(module, "VARIANTS", ("default",))
    variants = (variants,) if isinstance(variants, str) else tuple(variants)
    if variant not in variants:
        raise UserError(f"experiment {path.stem} has no variant {variant!r}; variants: {', '.join(variants)}")
    cfg = _run_experiment_code(path, lambda: module.get_config(variant))
    if not isinstance(cfg, Config):
        raise UserError(f"{path}: get_config must return a jaxnet.Config, got {type(cfg).__name__}")
    cfg.experiment = path.stem if variant == "default" else f"{path.stem}:{variant}"
    _EXPERIMENT_MODULES[cfg.experiment] = module
    try:
        validate(cfg)
    except UserError as e:
        raise UserError(f"{path}: {e}") from None
    return apply_overrides(cfg, overrides or [])


def _run_experiment_code(path: Path, call: Callable[[], Any]) -> Any:
    """Run code from an experiment file, turning its errors into one line that points at the file."""
    try:
        return call()
    except UserError:
        raise
    except Exception as e:
        frames = [f for f in traceback.extract_tb(e.__traceback__) if Path(f.filename).resolve() == path.resolve()]
        line = e.lineno if isinstance(e, SyntaxError) else (frames[-1].lineno if frames else None)
        where = f"{path}:{line}" if line else str(path)
        raise UserError(f"{where}: {type(e).__name__}: {e}") from None

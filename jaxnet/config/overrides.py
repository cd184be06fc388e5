"""Values into a checked :class:`~jaxnet.config.schema.Config`, and back: ``key=value`` overrides,
nested plain values (:func:`from_dict`) and the run directory's ``config.json`` (:func:`save`,
:func:`load`).

Each value is parsed to its field's type and checked against its limits; an unknown key is a
:class:`UserError` that names the nearest known keys::

    cfg = apply_overrides(cfg, ["optim.lr=0.05", "train.steps=300", "model.dropout=0.1"])
"""

from __future__ import annotations

import json
import math
import os
import typing
from pathlib import Path
from typing import Any

from jaxnet.config.schema import Config, check_field, keys, validate
from jaxnet.errors import UserError
from jaxnet.models import base as model_base
from jaxnet.models.base import model_config, model_keys


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
        if not items and isinstance(value, str):  # a list from config.json or Python may be empty, as set
            raise fail("a non-empty comma-separated list, e.g. 32,64")
        return tuple(_parse(key, v, item_type) for v in items)
    raise TypeError(f"config field {key} has unsupported type {typ}")


def _unknown_key(cfg: Config, key: str) -> UserError:
    return model_base.unknown_key(key, list(keys(cfg)), cfg.model.name)


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
        if saved and key.startswith("model.") and model_base.key_owners(key):
            return  # a saved config from before per-family model configs holds every family's keys
        raise _unknown_key(cfg, key)
    f = known[key]
    value = _parse(key, model_base.unalias(value, f), f.type)
    check_field(key, value, f)
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
    if saved and flat.get("train.base_dtype") and "train.base_vectors" not in flat:
        flat["train.base_vectors"] = "base_dtype"  # saved before the key: its LoRA base was cast whole
    if "model.name" in flat:
        cfg.model = model_config(_parse("model.name", flat.pop("model.name"), str))
    for key, value in flat.items():
        _set(cfg, key, value, saved)
    return cfg


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

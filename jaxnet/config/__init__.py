"""Typed experiment configuration: nested dataclasses, ``key=value`` overrides, validation.

An experiment is a Python file with ``get_config(variant) -> Config`` (see experiments/).
Every value a user can set is a typed field with a one-line description, so
``jaxnet train EXP --show-config`` can list them and overrides are checked against them::

    cfg = load_experiment("cnn_fashion_mnist:smoke")
    cfg = apply_overrides(cfg, ["optim.lr=0.05", "train.steps=300", "model.dropout=0.1"])

Three files, one job each, whose names this package gathers: :mod:`~jaxnet.config.schema` (the
sections, their keys and the checks across them), :mod:`~jaxnet.config.overrides` (``key=value``
strings, plain values and ``config.json`` into a checked Config) and
:mod:`~jaxnet.config.experiments` (finding and loading experiment files). The model section's
keys come from the model family (:mod:`jaxnet.models`), and ``model.name=X`` switches family.
"""

from jaxnet.config.experiments import (
    _run_experiment_code,
    experiment_dirs,
    experiment_module,
    list_experiments,
    load_experiment,
)
from jaxnet.config.overrides import RUN_KEY, apply_overrides, flatten, from_dict, load, save
from jaxnet.config.schema import (
    DEFAULT_MODEL,
    IMAGE_DATA,
    TEXT_DATA,
    Config,
    DataConfig,
    MeshConfig,
    OptimConfig,
    ParallelConfig,
    ProfileConfig,
    TrainConfig,
    batching,
    default_tokenizer,
    describe,
    keys,
    mixture_schedule,
    mixture_sources,
    profile_steps,
    settings_in_effect,
    steps_per_call,
    validate,
)
from jaxnet.models.base import ModelConfig, field, model_config, model_keys

__all__ = [
    "DEFAULT_MODEL",
    "IMAGE_DATA",
    "RUN_KEY",
    "TEXT_DATA",
    "Config",
    "DataConfig",
    "MeshConfig",
    "ModelConfig",
    "OptimConfig",
    "ParallelConfig",
    "ProfileConfig",
    "TrainConfig",
    "_run_experiment_code",
    "apply_overrides",
    "batching",
    "default_tokenizer",
    "describe",
    "experiment_dirs",
    "experiment_module",
    "field",
    "flatten",
    "from_dict",
    "keys",
    "list_experiments",
    "load",
    "load_experiment",
    "model_config",
    "mixture_schedule",
    "mixture_sources",
    "model_keys",
    "profile_steps",
    "save",
    "settings_in_effect",
    "steps_per_call",
    "validate",
]

"""What a run directory records about what it trained, so that it can be used without the training data.

Two records, written at the start of training:

* ``inputs.json``: what the model is called on and how raw inputs become model inputs, so that
  :func:`jaxnet.load` predicts without reloading the training set. For each model input (in the
  order the model takes them) its batch key, the shape of one example (``null`` for a dimension
  of any size, such as a text's length) and the dtype given to the model (for token ids also
  ``ids``, how many there are); for images the per-channel ``mean`` and ``std`` of the training
  images that :func:`jaxnet.data.pipeline.normalize` applies (``(x / 255 - mean) / std``); and
  ``outputs``, the output count a built-in model was built with. A text run's vocabulary is in
  ``vocab.json``. A run on image files (``data.name=folder`` or ``arrayrecord``) also records
  ``image_files``: the class names (label ids in order), the image size and channel count, and
  how a raw image file becomes the model's input (``jaxnet predict --input`` of image files).
* ``trained`` under ``_run`` in ``config.json``: where the model, data and task came from (the
  config, an experiment file, or Python arguments), the model's class and module, the task's name
  and the data's kind (``built-in``, ``arrays`` or ``dataset``), so that ``jaxnet eval`` and
  ``jaxnet predict`` can say what they cannot rebuild and what to call instead.

>>> record = read_inputs(Path("runs/cnn_fashion_mnist"))   # doctest: +SKIP
>>> record["inputs"][0]                                      # doctest: +SKIP
{'key': 'image', 'shape': [28, 28, 1], 'dtype': 'uint8'}
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from jaxnet import data as data_lib
from jaxnet.config import RUN_KEY
from jaxnet.data import text as text_lib
from jaxnet.errors import UserError
from jaxnet.tasks import BUILT_IN

INPUTS = "inputs.json"
"""The file of a run directory that says what the model takes (see the module's docstring)."""

FORMAT = "jaxnet-inputs/1"

PYTHON, EXPERIMENT_FILE, CONFIG = "python", "experiment file", "config"
"""Where a run's model, data or task came from."""


def inputs(run: Any) -> dict[str, Any]:
    """The ``inputs.json`` record of a :class:`~jaxnet.train.loop.Run` (see the module's docstring)."""
    dataset, keys = run.dataset, run.task.inputs
    record: dict[str, Any] = {"format": FORMAT, "inputs": [], "normalize": None}
    given = dict(zip(keys, run.task.model_inputs(run.sample), strict=True))  # as the model is called (pairs as rows)
    for key in keys:
        value = np.asarray(given[key])
        if isinstance(dataset, data_lib.Dataset) and key == "image":
            # The images as the data holds them; predict normalises them as training did.
            spec = {"shape": list(dataset.train[0].shape[1:]), "dtype": str(dataset.train[0].dtype)}
            record["normalize"] = {"key": key, "mean": dataset.mean.tolist(), "std": dataset.std.tolist()}
        elif isinstance(dataset, data_lib.ImageFiles) and key == "image":
            # Raw images prepared as evaluation prepares them (resized, center-cropped), then normalised.
            spec = {"shape": [dataset.image_size, dataset.image_size, dataset.channels], "dtype": "uint8"}
            record["normalize"] = {"key": key, "mean": dataset.mean.tolist(), "std": dataset.std.tolist()}
            record["image_files"] = dataset.inputs_record()
        elif isinstance(dataset, text_lib.TextDataset):
            # Any length of text; ids below the vocabulary's size (and a task's extra ids, such as a mask token).
            spec = {"shape": [None] * (value.ndim - 1), "dtype": str(value.dtype)}
            spec["ids"] = dataset.num_classes + run.task.extra_inputs
        else:
            spec = {"shape": list(value.shape[1:]), "dtype": str(value.dtype)}
        record["inputs"].append({"key": key, **spec})
    record["outputs"] = int(getattr(dataset, "num_classes", 0) or 0) + run.task.extra_inputs
    return record


VOCAB = "vocab.json"
"""The file of a language model's run directory that turns its ids back into text (and text into them)."""


def vocab(dataset: Any) -> dict[str, Any]:
    """The ``vocab.json`` record of a text dataset: its tokenizer, its vocabulary and, for a chat
    corpus, the chat template it was rendered with (what ``jaxnet sample --chat`` renders prompts by).

    >>> ids = np.zeros(4, np.int32)
    >>> vocab(text_lib.TextDataset(ids, ids, ids, ["a", "b"], "char"))
    {'tokenizer': 'char', 'vocab': ['a', 'b']}
    """
    template = {"chat_template": t} if (t := getattr(dataset, "chat_template", None)) else {}
    return {"tokenizer": dataset.tokenizer, **template, "vocab": dataset.vocab}


def read_inputs(workdir: Path) -> dict[str, Any]:
    """A run's ``inputs.json``, checked; a one-line :class:`UserError` if it is missing or malformed."""
    path = Path(workdir) / INPUTS
    try:
        record = json.loads(path.read_text())
    except FileNotFoundError:
        raise UserError(
            f"{workdir} has no {INPUTS}: it was trained by a jaxnet that did not record its inputs; "
            "train it again with this version"
        ) from None
    except (OSError, ValueError) as e:
        raise UserError(f"cannot read {path}: {e}") from None
    malformed = UserError(f"{path} is malformed; train the run again to rewrite it")
    try:
        norm = record["normalize"]
        well_formed = (
            record["format"] == FORMAT
            and all(isinstance(s["key"], str) and isinstance(s["shape"], list) for s in record["inputs"])
            and (norm is None or len(norm["mean"]) == len(norm["std"]))
        )
        for spec in record["inputs"]:
            np.dtype(spec["dtype"])
    except (KeyError, TypeError, ValueError):
        raise malformed from None
    if not well_formed:
        raise malformed
    return record


def trained(run: Any, *, model: Any = None, dataset: Any = None, task: Any = None) -> dict[str, Any]:
    """Where the model, data and task of ``run`` came from, for ``config.json`` (see the module's
    docstring); ``model``, ``dataset`` and ``task`` are what was passed to :func:`jaxnet.train`."""

    def source(given: Any, hook: str) -> str:
        return PYTHON if given is not None else EXPERIMENT_FILE if hook in run.hooks else CONFIG

    made = model if model is not None else getattr(run.model, "module", run.model)
    if isinstance(run.dataset, data_lib.ArrayDataset):
        kind = "arrays"
    elif dataset is None and "data" not in run.hooks:
        kind = "built-in"
    else:
        kind = "dataset"
    return {
        "model": {
            "class": run.model.name if made is run.model else type(made).__name__,
            "module": type(made).__module__,
            "from": source(model, "model"),
        },
        "data": {
            "kind": kind,
            "name": getattr(run.dataset, "name", type(run.dataset).__name__),
            "from": source(dataset, "data"),
        },
        "task": {"name": run.task.name, "from": source(task, "task")},
    }


def from_python(config_path: Path, *, model: Any = None, dataset: Any = None, task: Any = None) -> list[str]:
    """What the run of ``config_path`` was given from Python that is not given again here: e.g.
    ``["model MLP (module train_mlp)", "data (arrays)"]``; empty for a run jaxnet can rebuild."""
    try:
        record = json.loads(Path(config_path).read_text())[RUN_KEY]["trained"]
    except (OSError, ValueError, KeyError, TypeError):
        return []  # a run from before the record: nothing known
    missing = []
    if model is None and record.get("model", {}).get("from") == PYTHON:
        m = record["model"]
        missing.append(f"model {m.get('class')} (module {m.get('module')})")
    if dataset is None and record.get("data", {}).get("from") == PYTHON:
        missing.append(f"data ({record['data'].get('kind')})")
    # A built-in task given from Python is rebuilt by name (on built-in data its batch keys are fixed).
    if task is None and record.get("task", {}).get("from") == PYTHON and record["task"].get("name") not in BUILT_IN:
        missing.append(f"task {record['task'].get('name')}")
    return missing

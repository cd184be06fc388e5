"""Hugging Face checkpoints in and out of jaxnet's Transformer: the one place that reads or writes
their tensors.

A checkpoint is a directory as ``transformers``' ``save_pretrained`` writes it: ``config.json``
and the weights in ``model.safetensors``, several files named by ``model.safetensors.index.json``,
or ``pytorch_model.bin`` (which needs PyTorch). jaxnet never downloads one. ``hf:PATH`` names one
wherever a run directory is accepted: ``train.init_from``, :func:`jaxnet.load`,
:func:`jaxnet.load_params`, ``jaxnet sample --workdir``; ``jaxnet export --format hf`` writes one.

The pieces: ``files.py`` reads tensors one at a time and writes shards; ``table.py`` is what an
architecture table is, with the converter every table shares; one file per architecture family
holds its tables (``gpt2.py``; ``llama.py``: Llama, and Qwen2 and Mistral as small variations of
it; ``qwen3.py``, ``phi3.py`` and ``gemma.py``: Qwen3, Phi-3 and Phi-4, Gemma 1, 2 and 3, variations
of Llama's too). This facade is what the rest of jaxnet calls::

    checkpoint = hf.read("hf:checkpoints/gpt2")      # config.json read, its table found
    checkpoint.model()                                 # its model.* config (TransformerConfig)
    for path, array in checkpoint.tensors():           # each parameter as it is read
        ...                                            # ("block_0/attention/query/kernel", array)
    hf.export("out/gpt2", params, run_model_config)    # a run written back as GPT-2

**Adding an architecture** is one file: a :class:`~jaxnet.models.hf.table.Table` subclass (its
``model_type``, the config both ways, the rules with templated names and layouts) registered in
:data:`TABLES`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from jaxnet import models
from jaxnet.errors import UserError
from jaxnet.models.base import ModelConfig
from jaxnet.models.hf import files, gemma
from jaxnet.models.hf.gemma import Gemma, Gemma2, Gemma3Text
from jaxnet.models.hf.gpt2 import GPT2
from jaxnet.models.hf.llama import Llama, Mistral, Qwen2
from jaxnet.models.hf.moe import Mixtral, Qwen3Moe
from jaxnet.models.hf.phi3 import Phi3
from jaxnet.models.hf.qwen3 import Qwen3
from jaxnet.models.hf.table import Table, check, file_tensors, fill

PREFIX = "hf:"
"""How ``train.init_from``, :func:`jaxnet.load` and :func:`jaxnet.load_params` name a checkpoint directory."""

#: Every architecture jaxnet reads and writes, by ``config.json``'s ``model_type``.
TABLES: dict[str, Table] = {
    table.model_type: table
    for table in (
        GPT2(),
        Llama(),
        Qwen2(),
        Mistral(),
        Mixtral(),
        Qwen3Moe(),
        Qwen3(),
        Phi3(),
        Gemma(),
        Gemma2(),
        Gemma3Text(),
    )
}

#: Architectures jaxnet knows and does not read, by ``model_type``: what each is and what it reads instead.
REFUSED: dict[str, str] = {**gemma.REFUSED}


def is_hf(spec: Any) -> bool:
    """Whether ``spec`` names a Hugging Face checkpoint directory (``hf:PATH``)."""
    return isinstance(spec, str | os.PathLike) and str(spec).startswith(PREFIX)


def hf_dir(spec: str | os.PathLike) -> Path:
    """The directory of ``hf:PATH`` (a path without the prefix is taken as it is)."""
    path = str(spec)[len(PREFIX) :] if is_hf(spec) else str(spec)
    if not path:
        raise UserError(f"{spec!r} names no directory; give hf:PATH, a directory that save_pretrained wrote")
    return Path(path).expanduser()


def _titles() -> str:
    titles = [t.title for t in TABLES.values()]
    return ", ".join(titles[:-1]) + " or " + titles[-1]


def read_config(directory: Path) -> tuple[Table, dict[str, Any]]:
    """The table and the ``config.json`` of a checkpoint directory (one-line :class:`UserError` for a
    directory that is not one, or of an architecture jaxnet does not read)."""
    if not directory.is_dir():
        what = "is a file" if directory.exists() else "does not exist"
        raise UserError(f"hf:{directory} {what}; give a directory that transformers' save_pretrained wrote")
    path = directory / "config.json"
    try:
        config = json.loads(path.read_text())
    except FileNotFoundError:
        raise UserError(f"hf:{directory} has no config.json; give a directory that save_pretrained wrote") from None
    except (OSError, ValueError) as e:
        raise UserError(f"cannot read {path}: {e}") from None
    if not isinstance(config, dict):
        raise UserError(f"{path} is not a JSON object; give the config.json that save_pretrained wrote")
    kind = config.get("model_type")
    if kind in REFUSED:
        raise UserError(f"hf:{directory} holds a {REFUSED[kind]} (config.json model_type={kind!r})")
    if kind not in TABLES:
        names = ", ".join(f"{t.title} (model_type {t.model_type})" for t in TABLES.values())
        raise UserError(
            f"hf:{directory} holds a {kind or 'model of no model_type'}, not {_titles()} (config.json "
            f"model_type={kind!r}); jaxnet reads {names} checkpoints only"
        )
    table = TABLES[kind]
    named = config.get("architectures") or []
    if isinstance(named, list) and named and not set(named) & set(table.architectures):
        raise UserError(
            f"hf:{directory} is a {', '.join(map(str, named))} (config.json architectures); jaxnet reads "
            f"{' and '.join(table.architectures)} of model_type {kind}, a language model's head"
        )
    return table, config


class Checkpoint:
    """A Hugging Face checkpoint directory: its ``config.json`` read, its architecture's table found,
    its tensors not read until :meth:`tensors` (see :func:`read`); the weight files' headers are
    read once, when first needed, for every check and read after.

    ``keys`` are the ``model.*`` keys of the model (of the table's family) that computes what it
    computes, ``vocab`` its vocabulary and ``context`` its positions.
    """

    def __init__(self, directory: Path):
        self.directory = directory
        self.table, self.config = read_config(directory)
        keys = self.table.keys(self.config)
        self.vocab: int = keys.pop("vocab")
        self.context: int = keys["context"]
        self.keys: dict[str, Any] = keys
        self._files: files.Tensors | None = None

    @property
    def files(self) -> files.Tensors:
        """The weight files' tensors by name (their headers read on first use, once)."""
        if self._files is None:
            self._files = files.Tensors(self.directory)
        return self._files

    def model(self) -> ModelConfig:
        """The ``model.*`` config of this checkpoint's model, of the table's family (its ids the ones it predicts)."""
        return self.table.model(dict(self.keys), self.vocab)

    def shapes(self, rows: int) -> dict[str, tuple[int, ...]]:
        """The parameter shapes (by path) of this checkpoint's model with ``rows`` token ids, from
        the model itself (``jax.eval_shape`` of its ``init``)."""
        return dict(param_shapes(self.model(), rows, self.context))

    def tensors(self, rows: int | None = None, dtype: Any = np.float32) -> Iterator[tuple[str, np.ndarray]]:
        """Every parameter of this checkpoint's Transformer (path, array of ``dtype``; None: as
        the file holds it, e.g. bfloat16), each read from the files as it is handed out, all of
        them checked before the first is read (see :func:`jaxnet.models.hf.table.fill`). ``rows``
        (default the checkpoint's vocabulary) is the model's vocabulary: the rows past the
        checkpoint's are zeros (padding, never predicted: ``model.vocab_used``)."""
        rows = self.vocab if rows is None else rows
        if rows < self.vocab:
            raise UserError(
                f"the data's vocabulary has {rows} ids, fewer than this {self.table.title}'s {self.vocab}; tokenize "
                "with the checkpoint's tokenizer (GPT-2's: data.tokenizer=gpt2)"
            )
        return fill(self.table, self.keys, self.files, self.shapes(rows), self.vocab, dtype)

    def check(self) -> None:
        """Every check :meth:`tensors` makes before reading (names, shapes; see
        :func:`jaxnet.models.hf.table.check`), without reading any tensor: a bad checkpoint is
        refused before a run loads its data."""
        check(self.table, self.keys, self.files, self.shapes(self.vocab), self.vocab)

    def params(self, rows: int | None = None) -> dict[str, np.ndarray]:
        """:meth:`tensors` gathered, by path (``block_0/attention/query/kernel``)."""
        return dict(self.tensors(rows))


def param_shapes(model: ModelConfig, rows: int, context: int) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """(path, shape) of every parameter of the language model ``model`` (a ``model.*`` config) over
    ``rows`` token ids and ``context`` positions, from ``jax.eval_shape`` of its ``init`` (traced
    once per model)."""
    key = (repr(model), rows, context)  # a model config is a mutable dataclass: its repr is its value
    if key not in _SHAPES:
        module = models.build(model, rows, context, backend="cpu")
        tokens = jax.ShapeDtypeStruct((1, 1), jnp.int32)
        variables = jax.eval_shape(lambda t: module.init(jax.random.PRNGKey(0), t), tokens)
        flat = jax.tree_util.tree_flatten_with_path(nn.unbox(variables)["params"])[0]
        _SHAPES[key] = tuple(("/".join(str(k.key) for k in path), tuple(leaf.shape)) for path, leaf in flat)
    return _SHAPES[key]


_SHAPES: dict[tuple, tuple] = {}


def read(spec: str | os.PathLike) -> Checkpoint:
    """The checkpoint ``hf:PATH`` (or a directory) names, its config read and checked, its tensors
    not yet::

        checkpoint = read("hf:checkpoints/gpt2")
        params = nested(checkpoint.params())
    """
    return Checkpoint(hf_dir(spec))


def nested(flat: dict[str, Any]) -> dict[str, Any]:
    """``{"a/b": x}`` as ``{"a": {"b": x}}``: the nesting Flax's parameters have."""
    tree: dict[str, Any] = {}
    for path, value in flat.items():
        *parents, leaf = path.split("/")
        node = tree
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return tree


def refusals(table: Table, model: ModelConfig) -> list[str]:
    """Why ``table`` cannot hold a run's model (its ``model.*`` config), none when it can: the
    ``config.json`` the table writes for the model, read back, must give a model of the same
    arithmetic (:meth:`~jaxnet.models.base.ModelConfig.arithmetic`); each key that comes back
    otherwise is named, with the value the architecture has instead."""
    if table.family != model.name:
        return [f"it holds a {table.family}, not a {model.name}"]
    try:
        back = table.keys(table.config(_keys(model), 2, 2))
    except UserError as e:  # the architecture refuses what it would read
        return [str(e)]
    back.pop("vocab", None)
    theirs = table.model(back, 0).arithmetic()
    ours = model.arithmetic()
    # a key only one side uses differs by the pattern that uses it, which is named
    differ = [k for k, v in ours.items() if k in theirs and theirs[k] != v]
    return [f"model.{k}={_shown(ours[k])} ({table.title}: {_shown(theirs.get(k))})" for k in differ]


def _shown(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    return ",".join(map(str, value)) if isinstance(value, tuple) else str(value)


def table_for(model: Any, prefer: str | None = None) -> Table:
    """The table a run's model (its ``model.*`` config) is written with: the table of model type
    ``prefer`` (the architecture the run started from) if it can hold it, else the first that can,
    or a one-line :class:`UserError` saying why none can (:func:`refusals`)."""
    tables = [t for t in TABLES.values() if t.family == model.name]
    if not tables:
        raise UserError(f"a Hugging Face {_titles()} checkpoint holds a Transformer; this run trained a {model.name}")
    reasons = {}
    for table in sorted(tables, key=lambda t: t.model_type != prefer):
        reasons[table.title] = refusals(table, model)
        if not reasons[table.title]:
            return table
    why = "; ".join(f"{title}: {', '.join(r)}" for title, r in reasons.items())
    raise UserError(f"no Hugging Face architecture jaxnet writes can hold this model ({why})")


def _keys(model: ModelConfig) -> dict[str, Any]:
    return {f.name: getattr(model, f.name) for f in dataclasses.fields(model)}


#: What a checkpoint directory holds beside its weights that an export carries over from the
#: directory a run started from: its tokenizer and its generation settings (end ids).
CARRIED_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "generation_config.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",
)
#: ``config.json`` entries an export carries over from the directory a run started from (the
#: special ids, which jaxnet's keys do not hold).
CARRIED_KEYS = ("bos_token_id", "eos_token_id", "pad_token_id")


def convert(
    params: Any, model: ModelConfig, context: int, prefer: str | None = None
) -> tuple[dict[str, Any], Iterator]:
    """The ``config.json`` and the file tensors (an iterator of (name, array)) of a run's
    Transformer parameters ``params`` (nested dicts, on the host or a device) and its ``model.*``
    config ``model`` with ``context`` positions, as architecture ``prefer`` (a ``model_type``)
    when it can hold the model. The tensors are bfloat16 when every parameter is, else float32;
    the vocabulary's padding rows past ``model.vocab_used`` are dropped. A model no table can hold
    is a one-line :class:`UserError`."""
    table = table_for(model, prefer)
    keys = _keys(model)
    rows = np.shape(params["embed"]["embedding"])[0]
    vocab = model.vocab_used if 0 < model.vocab_used < rows else rows
    bf16 = all(np.dtype(getattr(x, "dtype", np.float32)) == jnp.bfloat16 for x in jax.tree.leaves(params))
    dtype = jnp.bfloat16 if bf16 else np.float32

    def get(path: str) -> np.ndarray:
        node = params
        for name in path.split("/"):
            node = node[name]
        return np.asarray(jax.device_get(node))

    config = {**table.config(keys, vocab, context), "torch_dtype": "bfloat16" if bf16 else "float32"}
    return config, file_tensors(table, keys, get, vocab, dtype)


def export(
    directory: str | os.PathLike,
    params: Any,
    model: ModelConfig,
    context: int,
    *,
    max_shard_bytes: int = files.MAX_SHARD_BYTES,
    source: str | os.PathLike | None = None,
    tokenizer_files: dict[str, bytes] | None = None,
    special_ids: dict[str, Any] | None = None,
) -> Path:
    """Write a run's Transformer (parameters ``params``, ``model.*`` config ``model``, ``context``
    positions) as a Hugging Face checkpoint in ``directory`` (new or empty), in shards of at most
    ``max_shard_bytes``, whole or not at all (see :func:`convert` and :func:`jaxnet.models.hf.files.write`).
    ``source`` is the checkpoint directory the run started from (or whose tokenizer it read): its
    architecture is written when it can hold the model, and its tokenizer files
    (:data:`CARRIED_FILES`) and special ids (:data:`CARRIED_KEYS`) are carried over, unless
    ``tokenizer_files`` (file name -> bytes) and ``special_ids`` (``config.json`` entries) are
    given in their place (:func:`jaxnet.tokenizers.export.export_files`)::

        export("out/gpt2", trained.params, trained.config.model, context=1024)
    """
    prefer, carried, extra = None, {}, {}
    if source is not None:
        origin = hf_dir(source)
        try:
            theirs = json.loads((origin / "config.json").read_text())
        except (OSError, ValueError):
            theirs = {}
        prefer = theirs.get("model_type") if isinstance(theirs, dict) else None
        carried = {k: theirs[k] for k in CARRIED_KEYS if isinstance(theirs, dict) and theirs.get(k) is not None}
        extra = {name: origin / name for name in CARRIED_FILES if (origin / name).is_file()}
    if tokenizer_files is not None:
        extra, carried = dict(tokenizer_files), {**carried, **(special_ids or {})}
    config, tensors = convert(params, model, context, prefer)
    config.update(carried)
    return files.write(directory, config, tensors, max_shard_bytes=max_shard_bytes, extra=extra)


def export_peft(
    directory: str | os.PathLike, adapters: Any, model: ModelConfig, settings: Any, *, source: Any = None
) -> Path:
    """Write a LoRA run's adapters (``adapters``: nested ``{... kernel: {"a": A, "b": B}}``; ``settings``:
    its :class:`jaxnet.models.adapters.lora.Settings`) as PEFT writes them, into ``directory`` (new or
    empty): ``adapter_config.json`` and ``adapter_model.safetensors``, each adapter under the name of
    the layer it adapts (``base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight``:
    ``A`` transposed, ``(rank, inputs)``; ``lora_B``: ``(outputs, rank)``), so that
    ``peft.PeftModel.from_pretrained(base, directory)`` adds them to the checkpoint ``source``::

        export_peft("out/adapters", trained.adapters, trained.config.model, trained.lora, source="hf:base")

    A file tensor that holds several of jaxnet's kernels side by side (Phi-3's ``qkv_proj``, GPT-2's
    ``c_attn``) gets one adapter whose rank is the sum of its parts': ``A`` the parts' ``A`` stacked,
    ``B`` theirs on the diagonal (zeros where a part has none), so its product is each part's
    product in its own rows, exactly; PEFT's ``rank_pattern`` and ``alpha_pattern`` give it that
    rank and the same scale. GPT-2's ``Conv1D`` layers are written with ``fan_in_fan_out``.
    """
    from jaxnet.models.adapters.lora import adapter_paths
    from jaxnet.models.adapters.paths import leaves_at

    prefer = None
    if source is not None:
        try:
            prefer = json.loads((hf_dir(source) / "config.json").read_text()).get("model_type")
        except (OSError, ValueError, AttributeError):
            prefer = None
    table = table_for(model, prefer)
    keys = _keys(model)
    by_path = {path: rule for rule in _expanded_rules(table, keys) for path in rule.model}
    adapted: dict[str, Any] = {}  # file tensor -> its rule, in the adapters' order
    for path in adapter_paths(adapters):
        rule = by_path.get(path)
        if rule is None or rule.layout.vocab or rule.stack or not rule.file.endswith(".weight"):
            raise UserError(
                f"the adapter of {path} has no PEFT equivalent (its tensor: {rule.file if rule else 'none'}); "
                "export the merged model with --format hf"
            )
        adapted.setdefault(rule.file, rule)
    if len({rule.layout.transposed for rule in adapted.values()}) > 1:
        raise UserError(
            f"{table.title}'s adapted layers are both Linear and Conv1D, which one PEFT adapter file cannot say; "
            "export the merged model with --format hf"
        )

    paths = set(adapter_paths(adapters))

    def widths(rule: Any) -> list[int]:
        """The outputs of each kernel a file tensor holds, from the model's shapes."""
        shapes = dict(param_shapes(model, max(getattr(model, "vocab_used", 0), 2), 2))
        return [int(np.prod(shapes[path][rule.layout.inputs :])) for path in rule.model]

    tensors, modules, ranks, alphas = {}, [], {}, {}
    for file, rule in adapted.items():
        module = table.file_name(file)[: -len(".weight")]
        parts = []  # (A as (rank, inputs), B as (outputs, rank)) of each adapted kernel, None for the others
        for path in rule.model:
            node = leaves_at([tuple(path.split("/"))], adapters)[0] if path in paths else None
            if node is None:
                parts.append(None)
                continue
            a, b = (np.asarray(jax.device_get(node[x]), np.float32) for x in "ab")
            parts.append((a.reshape(-1, a.shape[-1]).T, b.reshape(b.shape[0], -1).T))
        outputs = [p[1].shape[0] for p in parts] if all(parts) else widths(rule)
        rank = sum(p[0].shape[0] for p in parts if p)
        lora_a = np.concatenate([p[0] for p in parts if p], axis=0)
        lora_b = np.zeros((sum(outputs), rank), np.float32)
        row = col = 0
        for p, width in zip(parts, outputs, strict=True):
            if p:
                lora_b[row : row + width, col : col + p[1].shape[1]] = p[1]
                col += p[1].shape[1]
            row += width
        tensors[f"base_model.model.{module}.lora_A.weight"] = np.ascontiguousarray(lora_a)
        tensors[f"base_model.model.{module}.lora_B.weight"] = lora_b
        modules.append(module)
        if rank != settings.rank:  # several parts: their ranks summed, the scale kept (alpha / rank)
            ranks[module] = rank
            alphas[module] = (settings.alpha or settings.rank) * rank / settings.rank
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": str(hf_dir(source)) if source is not None else None,
        "r": settings.rank,
        "lora_alpha": settings.alpha or settings.rank,
        "lora_dropout": settings.dropout,
        "target_modules": "(" + "|".join(re.escape(m) for m in modules) + ")",
        "rank_pattern": {re.escape(m): r for m, r in ranks.items()},
        "alpha_pattern": {re.escape(m): a for m, a in alphas.items()},
        "bias": "none",
        "fan_in_fan_out": not next(iter(adapted.values())).layout.transposed if adapted else False,
        "inference_mode": True,
        "init_lora_weights": True,
        "use_rslora": False,
        "use_dora": False,
        "modules_to_save": None,
    }
    return files.write_adapters(directory, config, tensors)


def _expanded_rules(table: Table, keys: dict[str, Any]) -> list:
    return [r for rule in table.rules(keys) for r in rule.expand(keys["layers"])]


__all__ = [
    "PREFIX",
    "TABLES",
    "Checkpoint",
    "convert",
    "export",
    "export_peft",
    "hf_dir",
    "is_hf",
    "nested",
    "read",
    "refusals",
    "table_for",
]

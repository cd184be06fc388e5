"""Fine-tuning: a new run starts from another run's parameters and model state (``train.init_from``).

Variables are matched by path, the tree path of each array joined by ``/`` with its collection in
front: ``params/Conv_0/kernel``, ``batch_stats/BatchNorm_0/mean`` (the names
:func:`jaxnet.load_params` nests under, with ``params/`` added). ``train.init_skip=REGEX`` leaves
the paths it matches freshly initialised (a new head); every other path must be in both runs with
the same shape. A carried ``carry`` collection (an LSTM's state between batches) belongs to the data
position, not to what was learned, and is never taken over.

``train.init_from=hf:PATH`` starts from a Hugging Face checkpoint instead (a directory
``save_pretrained`` wrote, read through :mod:`jaxnet.models.hf`): :func:`with_hf_shape` gives the
Transformer that checkpoint's shape before the run is built, and :func:`load` takes its tensors
onto the Transformer's paths as they are read (the vocabulary padded with masked rows where the
data's is larger). A corpus must have been tokenized with the checkpoint's own tokenizer when the
checkpoint has one (``tokenizer.json``; :func:`jaxnet.tokenizers.check_fits`).

Every value is placed on the run's devices as it is read, split as the run splits that
parameter (:func:`place`), so the host never holds more than one tensor of the source at a time:
a sharded run of a large model never gathers it whole on one host.

>>> cfg = with_hf_shape(cfg)                   # doctest: +SKIP
>>> init = load(cfg, run, Path("runs/new"))   # doctest: +SKIP
>>> state = run.init_state(init)               # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import numpy as np

from jaxnet import checkpoint, parallel, tokenizers
from jaxnet.config import Config
from jaxnet.errors import UserError
from jaxnet.models import hf
from jaxnet.models.adapters import lora
from jaxnet.models.adapters.paths import joined
from jaxnet.models.adapters.reference import REFERENCE

CARRIED = "carry"  # model state of the data position, left fresh


@dataclass
class Start:
    """Where a run starts (``train.init_from``), read and checked once before the run is built
    (:func:`prepare`): the run's config with the checkpoint's shape taken and a LoRA base's step
    pinned, the Hugging Face checkpoint (its ``config.json`` and weight files' headers read once;
    None for a jaxnet run or a fresh start) and a LoRA run's record of its base (None otherwise)."""

    cfg: Config
    checkpoint: hf.Checkpoint | None = None
    base: dict[str, str] | None = None

    def load(self, run: Any, workdir: Path) -> dict[str, jax.Array] | None:
        """:func:`load` of this start, its checkpoint not read again."""
        return load(self.cfg, run, workdir, self.checkpoint)


def prepare(cfg: Config, workdir: Path) -> Start:
    """The one pass over ``train.init_from`` before a run is built: a Hugging Face checkpoint read
    and its shape taken (:func:`with_hf_shape`), the config checked (``jaxnet.config.validate``),
    a LoRA base from a run pinned to a step (:func:`pin_lora_base`) and its weights' hash checked
    against what ``workdir`` recorded (:func:`check_base`). Its :meth:`Start.load` takes the values
    once the run exists::

        start = prepare(cfg, workdir)
        run = Run(start.cfg)
        state = run.init_state(start.load(run, workdir))
    """
    from jaxnet import config as config_lib

    spec = cfg.train.init_from
    checkpoint = hf.read(spec) if hf.is_hf(spec) else None
    cfg = with_hf_shape(cfg, checkpoint)
    config_lib.validate(cfg)
    cfg = pin_lora_base(cfg, workdir)
    base = check_base(cfg, workdir) if cfg.train.lora_rank and cfg.train.init_from else None
    return Start(cfg, checkpoint, base)


def with_hf_shape(cfg: Config, pretrained: hf.Checkpoint | None = None) -> Config:
    """``cfg`` with the Transformer's shape taken from the Hugging Face checkpoint ``train.init_from=hf:PATH``
    names (layers, width, heads, MLP ratio, GELU, LayerNorm epsilon, positions, tied embeddings,
    vocabulary); ``cfg`` itself when ``init_from`` names no such checkpoint.

    A ``model.*`` value left at the Transformer's default takes the checkpoint's; one the experiment
    or an override set to something else is a one-line :class:`UserError` naming both. ``data.seq_len``
    0 becomes the checkpoint's context; a longer one than it has is refused. A token corpus
    (``data.name=tokens``) of ``data.vocab_size`` 0 is padded to the checkpoint's vocabulary, and
    one prepared with another tokenizer than the checkpoint's is refused before it is opened.
    ``pretrained`` is the checkpoint already read, if it is.
    """
    spec = cfg.train.init_from
    if not hf.is_hf(spec):
        return cfg
    pretrained = pretrained or hf.read(spec)
    family = pretrained.table.family
    if cfg.model.name != family:
        raise UserError(
            f"train.init_from={spec} is a Hugging Face {pretrained.table.title} checkpoint, a {family}; set "
            f"model.name={family}"
        )
    try:
        pretrained.check()  # its tensors' names and shapes, before the run loads its data
    except UserError as e:
        raise UserError(f"train.init_from={spec}: {e}") from None
    theirs_model = pretrained.model()
    fields = {k: getattr(theirs_model, k) for k in (*pretrained.keys, "vocab_used")}
    defaults = type(cfg.model)()
    taken, conflicts = {}, []
    for key, theirs in fields.items():
        ours = getattr(cfg.model, key)
        if ours == theirs:
            continue
        if ours == getattr(defaults, key):
            taken[key] = theirs
        else:
            conflicts.append(f"model.{key}={ours} here, {theirs} in the checkpoint")
    if conflicts:
        raise UserError(
            f"train.init_from={spec} contradicts this experiment: {'; '.join(conflicts)}; leave those keys unset "
            "(the checkpoint's shape is taken) or start from a checkpoint of this shape"
        )
    model = dataclasses.replace(cfg.model, **taken)
    context = fields["context"]
    if cfg.data.seq_len > context:
        raise UserError(
            f"data.seq_len={cfg.data.seq_len} is longer than the {context} positions of train.init_from={spec}; "
            f"set data.seq_len={context} or less"
        )
    data = dataclasses.replace(cfg.data, seq_len=cfg.data.seq_len or context)
    if data.name == "tokens":
        _check_corpus(data.path, pretrained, spec, cfg.train.check_tokenizer)
        if not data.vocab_size:  # the model has every id of the checkpoint (a tokenizer may use fewer)
            data = dataclasses.replace(data, vocab_size=pretrained.vocab)
    return dataclasses.replace(cfg, model=model, data=data)


def _check_corpus(path: str, pretrained: hf.Checkpoint, spec: str, check: bool = True) -> None:
    """Refuse a corpus made by ``jaxnet prepare`` with another tokenizer than the checkpoint's (or
    more ids than it has), from its ``corpus.json``, before anything is opened."""
    manifest = Path(path) / "corpus.json" if path else None
    if manifest is None or not manifest.is_file():
        return  # another layout, or no corpus yet: the dataset's own record is checked in load()
    from jaxnet.data import prepare

    record = prepare.read_manifest(manifest).get("tokenizer")
    if isinstance(record, dict):
        _fits(record, pretrained, spec, check)


def _implied_gpt2(record: dict[str, Any], pretrained: hf.Checkpoint) -> bool:
    """Whether the data is in GPT-2's tokens and the checkpoint a GPT-2 of GPT-2's 50,257 ids: the
    pairing a GPT-2 directory without ``tokenizer.json`` is read with everywhere (``jaxnet sample``)."""
    return record.get("name") == "gpt2" and pretrained.table.model_type == "gpt2" and pretrained.vocab == 50257


def _fits(
    record: dict[str, Any], pretrained: hf.Checkpoint, spec: str, check: bool = True, in_memory: bool = False
) -> None:
    """:func:`jaxnet.tokenizers.check_fits` of the data's tokenizer record against the checkpoint
    (its vocabulary, and its ``tokenizer.json``), naming ``train.init_from``. With ``check``
    (``train.check_tokenizer``) a checkpoint without ``tokenizer.json`` is refused unless the
    pairing is GPT-2's own; without it, only a prepared corpus's size is checked (ids in memory are
    checked one by one in :func:`load`)."""
    has_tokenizer = (pretrained.directory / "tokenizer.json").is_file()
    if check and not has_tokenizer and not _implied_gpt2(record, pretrained):
        raise UserError(
            f"train.init_from={spec}: {pretrained.directory} has no tokenizer.json, so the data's tokenizer "
            f"({record.get('name', '?')}) cannot be checked against the checkpoint's; save the checkpoint's "
            "tokenizer into that directory (tokenizer.save_pretrained) and tokenize the data with it (--tokenizer "
            "hf:DIR), or set train.check_tokenizer=false if the data is tokenized otherwise on purpose"
        )
    if not check and in_memory:
        return
    try:
        tokenizers.check_fits(record, pretrained.vocab, pretrained.directory if has_tokenizer and check else None)
    except UserError as e:
        raise UserError(f"train.init_from={spec}: {e}") from None


def parse(spec: str) -> tuple[Path, int | None]:
    """``RUN_DIR`` or ``RUN_DIR@STEP`` as ``(run directory, step or None)``."""
    directory, sep, step = spec.rpartition("@")
    if sep and step.isdigit():
        return Path(directory), int(step)
    if sep and not step.isdigit() and "/" not in step:
        raise UserError(f"train.init_from={spec!r}: expected RUN_DIR or RUN_DIR@STEP with STEP a number")
    return Path(spec), None


def resuming(workdir: Path) -> bool:
    """Whether ``workdir`` already has a checkpoint (a resumed run restores it, not ``train.init_from``)."""
    directory = workdir / "checkpoints"
    if not directory.is_dir():
        return False
    ckpts = checkpoint.Checkpoints(directory, read_only=True)
    try:
        return ckpts.latest_step() is not None
    finally:
        ckpts.close()


def variables(state: Any) -> dict[str, Any]:
    """The leaves of a train state (live, abstract or as saved) that fine-tuning carries over, by path
    (a DPO run's frozen reference copy is not one: it is its starting weights, not what it learnt)."""
    get = (lambda k: state.get(k) or {}) if isinstance(state, dict) else (lambda k: getattr(state, k))
    left = (CARRIED, REFERENCE)
    tree = {"params": get("params"), **{k: v for k, v in dict(get("model_state")).items() if k not in left}}
    return {joined(path): leaf for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


def _references(state: Any) -> dict[str, Any]:
    """A full DPO run's frozen reference leaves, by the path of the parameter each copies
    (``params/...``): what ``train.init_from`` fills with the same values as the parameters."""
    frozen = dict(state.model_state).get(REFERENCE, {})
    return {"params/" + joined(path): leaf for path, leaf in jax.tree_util.tree_flatten_with_path(frozen)[0]}


def load(cfg: Config, run: Any, workdir: Path, pretrained: hf.Checkpoint | None = None) -> dict[str, jax.Array] | None:
    """The values this run starts from, by path (see the module's docstring), or None when
    ``train.init_from`` is unset or ``workdir`` already has checkpoints to resume from;
    ``pretrained`` is the Hugging Face checkpoint already read, if it is.

    Everything is checked before anything is written: a source without checkpoints, a path on
    one side only, a shape that differs, an ``init_skip`` that matches nothing is a one-line
    :class:`UserError` naming them.
    """
    spec = cfg.train.init_from
    adapted = getattr(run, "lora", None) is not None
    if adapted and not spec:
        raise UserError(
            "train.lora_rank trains adapters on a trained model: set train.init_from=hf:PATH (a Hugging Face "
            "checkpoint) or RUN_DIR[@STEP] (a jaxnet run)"
        )
    if not spec or (resuming(workdir) and not adapted):  # a LoRA run's checkpoints hold no base: always read
        return None
    abstract = run.abstract_state()
    ours = variables(abstract)
    references = _references(abstract)  # a full DPO run: its reference starts as the parameters do
    if adapted:  # the base is the source's parameters; the adapters (params here) start fresh
        ours = {
            "params/" + n[len(lora.BASE) + 1 :] if n.startswith(lora.BASE + "/") else n: v
            for n, v in ours.items()
            if not n.startswith("params/")
        }
    if hf.is_hf(spec):
        pretrained = pretrained or hf.read(spec)
        source = pretrained.directory
        embedding = ours.get("params/embed/embedding")
        rows = None if embedding is None else embedding.shape[0]
        try:
            shapes = {f"params/{path}": shape for path, shape in pretrained.shapes(rows or pretrained.vocab).items()}
            # as the file holds them (bfloat16, often): place() makes each the run's dtype
            values = ((f"params/{path}", value) for path, value in pretrained.tensors(rows, dtype=None))
        except UserError as e:
            raise UserError(f"train.init_from={spec}: {e}") from None
        record = getattr(run.dataset, "tokenizer_record", None)
        in_memory = isinstance(getattr(run.dataset, "train", None), np.ndarray)
        if isinstance(record, dict):
            _fits(record, pretrained, spec, cfg.train.check_tokenizer, in_memory)
        _check_ids(run.dataset, pretrained.vocab, spec)  # ids in memory: each one the checkpoint predicts
        origin = f"{pretrained.table.title} checkpoint {source}"
    else:
        source, step = parse(spec)
        if source.resolve() == workdir.resolve():
            raise UserError(f"train.init_from={spec} is this run's own workdir; name another run's directory")
        try:
            saved = checkpoint.load_state(source, step)
        except UserError as e:
            raise UserError(f"train.init_from={spec}: {e}") from None
        found = variables(saved)
        shapes = {n: tuple(np.shape(v)) for n, v in found.items()}
        values = iter(found.items())
        origin = f"{source} (step {int(saved['step'])})"
    skip = re.compile(cfg.train.init_skip) if cfg.train.init_skip else None
    skipped = lambda name: skip is not None and skip.search(name) is not None
    if skip is not None and not any(skipped(n) for n in [*ours, *shapes]):
        raise UserError(
            f"train.init_skip={cfg.train.init_skip!r} matches no path of either run; the paths are {_some(list(ours))}"
        )
    missing = [n for n in ours if n not in shapes and not skipped(n)]
    extra = [n for n in shapes if n not in ours and not skipped(n)]
    if missing or extra:
        parts = [f"{source} lacks {_some(missing)}"] if missing else []
        parts += [f"this run lacks {_some(extra)}"] if extra else []
        raise UserError(
            f"train.init_from={spec} does not match this model: {'; '.join(parts)}; "
            "leave them fresh with train.init_skip=REGEX, or start from a run of the same model"
        )
    wrong = [
        f"{n} {tuple(shapes[n])} there, {tuple(ours[n].shape)} here"
        for n in ours
        if not skipped(n) and tuple(shapes[n]) != tuple(ours[n].shape)
    ]
    if wrong:
        more = f" (and {len(wrong) - 3} more)" if len(wrong) > 3 else ""
        raise UserError(
            f"train.init_from={spec}: shapes differ: {'; '.join(wrong[:3])}{more}; "
            "leave them fresh with train.init_skip=REGEX"
        )
    taken = {}
    try:
        for name, value in values:  # read one at a time, placed, let go
            if name in ours and not skipped(name):
                taken[name] = place(value, ours[name])
                if name in references:
                    taken[REFERENCE + name[len("params") :]] = place(value, references[name])
    except UserError as e:
        raise UserError(f"train.init_from={spec}: {e}") from None
    if parallel.is_primary():
        count = len([n for n in taken if not n.startswith(REFERENCE + "/")])
        fresh = len(ours) - count
        print(
            f"{'the frozen base is' if adapted else 'starting from'} {origin}: {count} arrays taken over"
            + (f", {fresh} fresh (train.init_skip)" if fresh else "")
            + (" (and copied as the frozen reference)" if references else ""),
            file=sys.stderr if adapted else sys.stdout,
        )
    if adapted:
        taken = {lora.BASE + n[len("params") :] if n.startswith("params/") else n: v for n, v in taken.items()}
    return taken


BASE_RECORD = "lora_base"
"""The key of a LoRA run's record of its base (``train.init_from`` and its hash) in config.json's run record."""


def pin_lora_base(cfg: Config, workdir: Path) -> Config:
    """A LoRA run starting from ``RUN_DIR`` without a step: ``cfg`` with ``train.init_from=RUN_DIR@STEP``,
    the step the run's base was first read from (recorded in its config.json) or else that run's
    newest, so a resume rebuilds the same base whatever the other run did since."""
    spec = cfg.train.init_from
    if not cfg.train.lora_rank or not spec or hf.is_hf(spec) or parse(spec)[1] is not None:
        return cfg
    recorded = _recorded_base(workdir)
    if recorded is not None and recorded.get("init_from", "").startswith(spec + "@"):
        pinned = recorded["init_from"]
    else:
        directory = Path(spec) / "checkpoints"
        if not directory.is_dir():
            raise UserError(f"train.init_from={spec} has no checkpoints; pass the run directory of a training run")
        ckpts = checkpoint.Checkpoints(directory, read_only=True)
        try:
            steps = ckpts.all_steps()
        finally:
            ckpts.close()
        if not steps:
            raise UserError(f"train.init_from={spec} has no checkpoint; train it first")
        pinned = f"{spec}@{steps[-1]}"
    return dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, init_from=pinned))


def _recorded_base(workdir: Path) -> dict[str, Any] | None:
    """The base a LoRA run in ``workdir`` recorded (its config.json's run record), or None."""
    from jaxnet.config import RUN_KEY

    try:
        record = json.loads((Path(workdir) / "config.json").read_text()).get(RUN_KEY, {}).get(BASE_RECORD)
    except (OSError, ValueError, AttributeError):
        return None
    return record if isinstance(record, dict) else None


def fingerprint(spec: str) -> str:
    """The SHA-256 of the weights ``train.init_from=spec`` names: a Hugging Face directory's
    ``*.safetensors`` / ``*.bin`` files, or the files of a run's checkpoint ``RUN_DIR@STEP``, by name and content."""
    if hf.is_hf(spec):
        directory = hf.hf_dir(spec)
        paths = sorted(p for p in directory.iterdir() if p.suffix in (".safetensors", ".bin") and p.is_file())
    else:
        source, step = parse(spec)
        directory = source / "checkpoints" / str(step)
        paths = sorted(p for p in directory.rglob("*") if p.is_file())
    if not paths:
        raise UserError(f"train.init_from={spec}: no weights in {directory}; name a checkpoint that holds them")
    digest = hashlib.sha256()
    for path in paths:
        digest.update(str(path.relative_to(directory)).encode() + b"\0")
        with path.open("rb") as f:
            while chunk := f.read(1 << 22):
                digest.update(chunk)
    return digest.hexdigest()


def check_base(cfg: Config, workdir: Path) -> dict[str, str]:
    """The record of a LoRA run's base (``init_from`` and :func:`fingerprint`); a one-line
    :class:`UserError` when ``workdir`` recorded another base, or the same one whose weights changed."""
    spec = cfg.train.init_from
    record = {"init_from": spec, "sha256": fingerprint(spec)}
    recorded = _recorded_base(workdir)
    if recorded is not None and recorded != record:
        what = (
            f"train.init_from={recorded.get('init_from')}"
            if recorded.get("init_from") != spec
            else f"{spec} whose weights have changed since (sha256 {str(recorded.get('sha256'))[:12]}... then, "
            f"{record['sha256'][:12]}... now)"
        )
        raise UserError(
            f"the LoRA adapters in {workdir} were trained on {what}; restore that base or use a fresh --workdir"
        )
    return record


def place(value: Any, target: Any) -> jax.Array:
    """``value`` (a host array) as the run holds the leaf ``target`` (a ``jax.ShapeDtypeStruct``
    with its sharding): in its dtype, each device given only its own slice, so nothing but the
    slices outlives ``value``::

        array = place(np.zeros((8, 4), np.float32), jax.ShapeDtypeStruct((8, 4), jnp.float32, sharding=s))
    """
    host = np.asarray(value, target.dtype)
    sharding = getattr(target, "sharding", None)
    if sharding is None:
        return jax.device_put(host)
    return jax.make_array_from_callback(tuple(target.shape), sharding, lambda index: host[index])


def _check_ids(dataset: Any, vocab: int, spec: str) -> None:
    """The data's token ids are ids the GPT-2 predicts: an id past its vocabulary (a padding id,
    never predicted) as a target would make the loss infinite."""
    for split in ("train", "val", "test"):
        tokens = getattr(dataset, split, None)
        if isinstance(tokens, np.ndarray) and tokens.dtype.kind in "iu" and tokens.size and tokens.max() >= vocab:
            raise UserError(
                f"the {split} data holds token id {int(tokens.max())}, past the {vocab} ids of train.init_from={spec}, "
                "which it never predicts; tokenize with the checkpoint's tokenizer (GPT-2's: data.tokenizer=gpt2)"
            )


def _some(names: list[str], n: int = 4) -> str:
    """The first ``n`` of ``names``, comma-separated, with how many more there are."""
    more = f" and {len(names) - n} more" if len(names) > n else ""
    return ", ".join(names[:n]) + more

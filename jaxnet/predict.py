"""Predict with a trained run: :func:`load` turns a run directory into a :class:`Trained` model.

The model is rebuilt from the run's ``config.json`` (or is the one you pass), its variables come
from a checkpoint (through :func:`jaxnet.checkpoint.load_state`, as :func:`jaxnet.load_params`
reads them), and raw inputs become model inputs as in training, from the run's ``inputs.json``
(:mod:`jaxnet.train.record`): images are normalised with the training images' mean and std, so
nothing reloads the training set. Prediction runs in evaluation mode (no dropout, BatchNorm's
running statistics), jit-compiled, in batches::

    trained = jaxnet.load("runs/cnn_fashion_mnist")
    logits = trained.predict(images)            # uint8 (N, 28, 28, 1) -> float32 (N, 10)

On the command line: ``jaxnet predict --workdir RUN --input x.npy --out logits.npy``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from jaxnet import checkpoint, models, xla_options
from jaxnet import config as config_lib
from jaxnet.config import Config
from jaxnet.data import imagefiles, pipeline
from jaxnet.errors import UserError
from jaxnet.models import adapters
from jaxnet.models.adapters import lora
from jaxnet.models.adapters.paths import joined
from jaxnet.train import init_from, record
from jaxnet.train import loop as loop_lib

CARRIED = init_from.CARRIED  # an LSTM's state between batches: fresh zeros for every batch predicted

EXPORT_FORMATS = ("jax", "hf", "peft")
"""What :meth:`Trained.export` and ``jaxnet export`` write: StableHLO (jax.export), a Hugging Face
checkpoint (LoRA adapters merged into it), or a LoRA run's adapters alone as PEFT writes them."""


class Trained:
    """A trained model with its run's preprocessing, made by :func:`load`.

    ``config`` is the run's :class:`jaxnet.Config`, ``params`` and ``model_state`` (e.g.
    BatchNorm's ``batch_stats``) its variables as nested dicts of arrays, ``step`` the checkpoint's
    step, ``model`` the model behind jaxnet's seam (``model.apply(variables, *inputs, train=False)``)
    and ``inputs`` what the model takes (the run's ``inputs.json``)::

        trained = jaxnet.load("runs/mine", model=MLP())
        y = trained.predict({"x": x})               # or trained.predict(x): the model takes one input
        trained.export("mlp.jax")                    # runs without jaxnet (see export)
    """

    adapters: Any = None
    """A LoRA run's adapters (``train.lora_rank``), already merged into ``params``; None otherwise."""
    lora: Any = None
    """A LoRA run's settings; None otherwise."""

    def __init__(
        self,
        *,
        workdir: Path,
        config: Config,
        model: Any,
        params: Any,
        model_state: dict[str, Any],
        step: int,
        inputs: dict[str, Any],
    ):
        self.workdir, self.config, self.model, self.step, self.inputs = workdir, config, model, step, inputs
        self.params = jax.device_put(params)  # on the device once, not with every batch
        self.model_state = jax.device_put(model_state)
        self._forward = jax.jit(self.forward, compiler_options=xla_options.compiler_options())  # as training's steps

    def __repr__(self) -> str:
        keys = ", ".join(s["key"] for s in self.inputs["inputs"])
        return f"Trained({self.model.name} from {self.workdir} at step {self.step}, inputs: {keys})"

    def forward(self, params: Any, model_state: dict[str, Any], *inputs: Any) -> Any:
        """The model's outputs for model inputs (already preprocessed), in evaluation mode: pure, jit-able."""
        variables = {"params": params, **model_state}
        if CARRIED in model_state:
            return self.model.apply(variables, *inputs, train=False, mutable=[CARRIED])[0]
        return self.model.apply(variables, *inputs, train=False)

    def preprocess(self, inputs: Any, *, cast: bool = False) -> tuple[np.ndarray, ...]:
        """``inputs`` as the model takes them in training: checked against the run's record (shape of
        an example, dtype), cast as training cast them, and images normalised with the training
        images' statistics (:func:`jaxnet.data.pipeline.normalize`). ``inputs`` is an array (a
        model of one input), a tuple of arrays in the model's order, or a dict by batch key.

        An input of another width of the same kind (int64 ids for int32, float64 for float32) is
        converted; one of another kind (integers for a model trained on floats, floats for
        uint8 images) is an error naming both dtypes unless ``cast=True`` converts it (integer
        targets only from whole numbers in range)."""
        specs = self.inputs["inputs"]
        keys = [s["key"] for s in specs]
        if isinstance(inputs, Mapping):
            absent = [k for k in keys if k not in inputs]
            if absent:
                raise UserError(f"the inputs have no {absent[0]!r}; the model takes {', '.join(keys)}")
            given = [inputs[k] for k in keys]
        elif isinstance(inputs, (tuple, list)) and len(specs) > 1:
            given = list(inputs)
        else:
            given = [inputs]
        if len(given) != len(specs):
            raise UserError(f"the model takes {len(specs)} inputs ({', '.join(keys)}); got {len(given)}")
        prepared = []
        for spec, value in zip(specs, given, strict=True):
            x = _checked(np.asarray(value), spec, cast)
            stats = _normalized(self.inputs, spec)
            prepared.append(x if stats is None else pipeline.normalize(x, *stats))
        lengths = {len(x) for x in prepared}
        if len(lengths) > 1:
            raise UserError(f"the inputs have different numbers of examples ({', '.join(map(str, lengths))})")
        return tuple(prepared)

    def predict(self, inputs: Any, batch_size: int | None = None, *, cast: bool = False) -> Any:
        """The model's outputs (for a classifier, logits) for every example of ``inputs`` (see
        :meth:`preprocess`, and for ``cast`` an input of another dtype kind than training's),
        as numpy arrays, computed ``batch_size`` examples at a time (default: the run's
        ``train.eval_batch_size``); the last batch is padded, so one program serves all::

            trained.predict(x)                     # x as the run trained on it (inputs.json)
            trained.predict(x_int, cast=True)      # integers to a run trained on float32: converted
        """
        xs = self.preprocess(inputs, cast=cast)
        n = len(xs[0])
        if n == 0:
            raise UserError("the inputs hold no examples; give at least one")
        if batch_size is not None and batch_size < 1:
            raise UserError(f"batch_size={batch_size}: give a number of examples of at least 1")
        size = min(batch_size or self.config.train.eval_batch_size, n)
        state = self._state_for(size)
        pieces = []
        for start in range(0, n, size):
            batch = [x[start : start + size] for x in xs]
            real = len(batch[0])
            if real < size:
                batch = [np.concatenate([b, np.zeros((size - real, *b.shape[1:]), b.dtype)]) for b in batch]
            out = self._forward(self.params, state, *batch)
            pieces.append(jax.tree.map(lambda o, real=real: o[:real], out))  # on the device: no wait per batch
        return jax.tree.map(lambda *parts: np.concatenate(parts), *jax.device_get(pieces))

    def export(
        self,
        path: str | os.PathLike,
        *,
        format: str = "jax",
        platforms: tuple[str, ...] | None = None,
        chat_template: str | None = None,
    ) -> Path:
        """Write the model out in ``format``:

        ``"jax"``: the whole inference function, from raw inputs (as :meth:`predict` takes them) to
        outputs, with the weights inside, as serialized StableHLO (:mod:`jax.export`), for any
        batch size, in the file ``path``. It runs with JAX alone, without jaxnet or the model's code::

            from jax import export
            with open("model.jax", "rb") as f:
                exported = export.deserialize(bytearray(f.read()))
            logits = exported.call(images)     # uint8 (N, 28, 28, 1), any N

        ``platforms`` (default: this machine's, e.g. ``("cpu",)``) are those it can run on.

        ``"hf"``: a Transformer as a Hugging Face checkpoint (GPT-2's) in the directory ``path`` (new
        or empty): ``config.json`` and ``model.safetensors`` (several files and
        ``model.safetensors.index.json`` above 5 GB), the vocabulary's padding rows dropped
        (:mod:`jaxnet.models.hf`), which ``transformers.GPT2LMHeadModel.from_pretrained(path)``
        loads. Beside the weights go the run's tokenizer files (a checkpoint's own, or GPT-2's
        ``tokenizer.json``), with its chat template (the chat corpus's it was fine-tuned on, or
        ``chat_template``: Jinja text) and ``generation_config.json``
        (:mod:`jaxnet.tokenizers.export`), so transformers' text-generation pipeline chats with it.
        Both formats are written whole or not at all.
        """
        if format not in EXPORT_FORMATS:
            raise UserError(f"format={format!r}: expected one of {', '.join(EXPORT_FORMATS)}")
        if format == "hf":
            return self._export_hf(Path(path), chat_template)
        if chat_template is not None:
            raise UserError("a chat template goes with format='hf' (a Hugging Face checkpoint's tokenizer files)")
        if format == "peft":
            return self._export_peft(Path(path))
        from jax import export as jax_export

        specs = self.inputs["inputs"]
        # Every symbolic dimension from one scope: jax.export refuses to mix scopes in one function.
        names = ["batch"] + [f"d{i}_{j}" for i, s in enumerate(specs) for j, d in enumerate(s["shape"]) if d is None]
        symbols = dict(zip(names, jax_export.symbolic_shape(", ".join(names)), strict=True))
        batch = symbols["batch"]
        args = []
        for i, spec in enumerate(specs):
            dims = [d if d is not None else symbols[f"d{i}_{j}"] for j, d in enumerate(spec["shape"])]
            args.append(jax.ShapeDtypeStruct((batch, *dims), np.dtype(spec["dtype"])))
        params, model_state = self.params, self.model_state

        def infer(*raw: jnp.ndarray) -> Any:
            xs = list(raw)
            for i, spec in enumerate(specs):
                stats = _normalized(self.inputs, spec)
                if stats is not None:  # traced: the exported program takes raw inputs
                    xs[i] = pipeline.normalize(xs[i], *map(jnp.asarray, stats))
            rows = xs[0].shape[0]
            state = _with_carry(model_state, rows, jnp.zeros)
            return self.forward(params, state, *xs)

        try:
            exported = jax_export.export(jax.jit(infer), platforms=platforms)(*args)
        except Exception as e:  # a model whose shapes need a fixed batch size, an unknown platform, ...
            message = (str(e).strip().splitlines() or [""])[0]
            raise UserError(f"cannot export {self.model.name}: {type(e).__name__}: {message[:300]}") from None
        try:
            blob = exported.serialize()
        except ImportError:  # jax serializes with flatbuffers, which it does not require
            raise UserError("exporting needs the flatbuffers package: pip install 'jaxnet[export]'") from None
        path = Path(path)
        if path.is_dir():
            raise UserError(f"{path} is a directory; give a file name such as {path / 'model.jax'}")
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        try:
            tmp.write_bytes(blob)
            os.replace(tmp, path)
        except OSError as e:
            tmp.unlink(missing_ok=True)
            raise UserError(f"cannot write {path}: {e.strerror}") from None
        return path

    def _export_hf(self, path: Path, chat_template: str | None = None) -> Path:
        from jaxnet.models import hf
        from jaxnet.tokenizers.export import export_files

        model = self.config.model
        context = getattr(model, "context", 0) or self.config.data.seq_len  # the position table's rows
        # The checkpoint the run started from, else the one whose tokenizer it read: its
        # architecture, tokenizer files and special ids go with the export.
        source = next((s for s in (self.config.train.init_from, self.config.data.tokenizer) if hf.is_hf(s)), None)
        if source is not None and not hf.hf_dir(source).is_dir():
            source = None  # moved or deleted since: the weights alone
        tokenizer, template = run_tokenizer(self.workdir, self.config)
        files = ids = None
        if tokenizer is not None:
            files, ids = export_files(tokenizer, chat_template=chat_template or template, context=context)
        elif chat_template is not None:
            raise UserError(
                f"{self.workdir} has no tokenizer for a chat template to go with (no vocab.json naming gpt2 or hf:DIR)"
            )
        kw = dict(source=source, tokenizer_files=files or None, special_ids=ids)
        return hf.export(path, self.params, model, context, **kw)

    def _export_peft(self, path: Path) -> Path:
        from jaxnet.models import hf

        if getattr(self, "lora", None) is None:
            raise UserError(
                f"{self.workdir} trained no LoRA adapters (train.lora_rank); --format peft writes adapters alone, "
                "use --format hf for the whole model"
            )
        source = self.config.train.init_from
        return hf.export_peft(
            path, self.adapters, self.config.model, self.lora, source=source if hf.is_hf(source) else None
        )

    def _state_for(self, rows: int) -> dict[str, Any]:
        """The model state for batches of ``rows`` examples: a carried state is fresh zeros of that many rows."""
        return _with_carry(self.model_state, rows, lambda shape, dtype: jax.device_put(np.zeros(shape, dtype)))


def _normalized(inputs: dict[str, Any], spec: dict[str, Any]) -> tuple[np.ndarray, np.ndarray] | None:
    """The (mean, std) training normalised input ``spec`` with, or None if it took it raw."""
    norm = inputs["normalize"]
    if norm is None or norm["key"] != spec["key"]:
        return None
    return np.asarray(norm["mean"], np.float32), np.asarray(norm["std"], np.float32)


def _with_carry(model_state: dict[str, Any], rows: int, zeros: Any) -> dict[str, Any]:
    if CARRIED not in model_state:
        return model_state
    carry = jax.tree.map(lambda c: zeros((rows, *c.shape[1:]), c.dtype), model_state[CARRIED])
    return {**model_state, CARRIED: carry}


KINDS = {"b": "boolean", "i": "integer", "u": "integer", "f": "floating-point"}
"""The dtype kinds an input may have, by numpy's ``dtype.kind``; within one, any width is converted."""


def _checked(x: np.ndarray, spec: dict[str, Any], cast: bool = False) -> np.ndarray:
    """``x`` (a batch of one input) checked against its record and cast to the dtype the model was
    trained on: silently within a kind (int64 -> int32), only with ``cast`` across kinds."""
    key, shape, dtype = spec["key"], tuple(spec["shape"]), np.dtype(spec["dtype"])
    wanted = "(N, " + ", ".join("any" if d is None else str(d) for d in shape) + ")"
    if x.ndim != len(shape) + 1 or any(d is not None and d != got for d, got in zip(shape, x.shape[1:], strict=True)):
        raise UserError(f"input {key!r} has shape {x.shape}; the run was trained on {dtype} {wanted}")
    if "ids" in spec and x.size and (x.min() < 0 or x.max() >= spec["ids"]):
        raise UserError(
            f"input {key!r} holds ids {x.min()}..{x.max()}; the run's vocabulary has ids 0..{spec['ids'] - 1}"
        )
    if x.dtype == dtype:
        return x
    if x.dtype.kind not in KINDS:
        raise UserError(f"input {key!r} is {x.dtype}, not numbers; the run was trained on {dtype} {wanted}")
    if KINDS[x.dtype.kind] != KINDS.get(dtype.kind):
        if not cast:
            raise UserError(
                f"input {key!r} is {x.dtype} ({KINDS[x.dtype.kind]}) but the run was trained on {dtype} {wanted}; "
                f"convert it (x.astype('{dtype}')) or pass cast=True (jaxnet predict: --cast) to convert it here"
            )
        if dtype.kind in "iu" and x.dtype.kind == "f" and x.size and not np.array_equal(x, np.round(x)):
            raise UserError(
                f"input {key!r} holds non-integer values (e.g. {x[x != np.round(x)].flat[0]}) "
                f"that cannot become the {dtype} the run was trained on; round them first"
            )
    if dtype.kind in "iu" and x.size:
        info = np.iinfo(dtype)
        low, high = x.min(), x.max()
        if low < info.min or high > info.max:
            raise UserError(
                f"input {key!r} holds values {low}..{high}, outside {dtype}'s {info.min}..{info.max} it was trained on"
            )
    return x.astype(dtype)


def load(workdir: str | os.PathLike, step: int | str | None = None, *, model: Any = None) -> Trained:
    """A trained run, ready to predict: the newest checkpoint of ``workdir`` (or checkpoint ``step``,
    or ``"best"``, the one ``train.keep_best`` kept), its config and its preprocessing.

    The model is rebuilt from the run's config (a built-in model, or an experiment file's
    ``model(cfg)``); a run of your own model from Python needs ``model`` again (any model
    :func:`jaxnet.train` takes: Flax Linen or NNX, Equinox, :class:`jaxnet.Model`)::

        trained = jaxnet.load("runs/cnn_fashion_mnist", step="best")
        labels = trained.predict(images).argmax(-1)

    ``"hf:PATH"`` loads a Hugging Face checkpoint directory (``save_pretrained``'s) as jaxnet's
    Transformer, before any training (:mod:`jaxnet.models.hf`)::

        logits = jaxnet.load("hf:checkpoints/gpt2").predict(tokens)   # int (N, T) -> (N, T, 50257)
    """
    from jaxnet.models import hf

    if hf.is_hf(workdir):
        if step is not None or model is not None:
            raise UserError(f"{workdir} is a Hugging Face checkpoint: it has no steps and its own model")
        return load_hf(workdir)
    workdir = Path(workdir)
    config_path = workdir / "config.json"
    if not config_path.is_file():
        raise UserError(f"{workdir} is not a run directory (no config.json); pass the --workdir of a training run")
    if model is None:
        # Only the model matters here: prediction needs neither the data nor the task.
        missing = record.from_python(config_path, model=None, dataset=False, task=False)
        if missing:
            raise UserError(
                f"{workdir} was trained from Python with your own {missing[0]}, which jaxnet cannot rebuild from "
                "the run directory; pass it: jaxnet.load(workdir, model=...)"
            )
    inputs = record.read_inputs(workdir)
    loop_lib.load_experiment_file(config_path)
    cfg = config_lib.load(config_path)
    if model is None:
        hooks = loop_lib.experiment_hooks(cfg)
        model = (
            hooks["model"](cfg) if "model" in hooks else models.build(cfg.model, inputs["outputs"], cfg.data.seq_len)
        )
    adapted = adapters.adapt(model)
    saved = checkpoint.load_state(workdir, step)
    settings = lora.Settings.of(cfg.train)
    adapter_params = None
    if settings is not None:  # adapters: merged into the base they were trained on
        adapter_params = saved["params"]
        saved = {**saved, "params": _lora_base(workdir, cfg, adapted, inputs)}
    variables = _variables(workdir, adapted, inputs, saved)
    params = variables.pop("params")
    if settings is not None:
        if settings.base_dtype:  # the base as training held it
            params = jax.tree.map(np.asarray, lora.cast_base(params, settings))
        params = jax.tree.map(np.asarray, lora.merge(params, adapter_params, settings.scale))
    trained = Trained(
        workdir=workdir,
        config=cfg,
        model=adapted,
        params=params,
        model_state=variables,
        step=int(saved["step"]),
        inputs=inputs,
    )
    trained.adapters, trained.lora = adapter_params, settings
    return trained


def _lora_base(workdir: Path, cfg: Config, model: Any, inputs: dict[str, Any]) -> dict[str, Any]:
    """The frozen base of a LoRA run (nested parameters), from its ``train.init_from``, checked
    against the hash the run recorded (:func:`jaxnet.train.init_from.check_base`)."""
    from jaxnet.models import hf

    init_from.check_base(cfg, workdir)
    spec = cfg.train.init_from
    if not hf.is_hf(spec):
        source, at = init_from.parse(spec)
        return checkpoint.load_params(source, at)
    template = _template(workdir, model, inputs)
    rows = template["params"]["embed"]["embedding"].shape[0]
    return hf.nested(dict(hf.read(spec).tensors(rows)))


def _template(workdir: Path, model: Any, inputs: dict[str, Any]) -> Any:
    """The shapes of ``model``'s variables (``jax.eval_shape`` of its init on the run's inputs)."""
    sample = []
    for spec in inputs["inputs"]:
        x = np.zeros((1, *[1 if d is None else d for d in spec["shape"]]), spec["dtype"])
        sample.append(x if _normalized(inputs, spec) is None else x.astype(np.float32))
    key = jax.random.PRNGKey(0)
    try:
        return nn.unbox(jax.eval_shape(lambda: model.init({"params": key, "dropout": key}, *sample, train=False)))
    except Exception as e:
        message = (str(e).strip().splitlines() or [""])[0]
        raise UserError(
            f"model {model.name} failed on the inputs {workdir} was trained on: {type(e).__name__}: {message[:300]}; "
            "pass the model the run trained"
        ) from None


def hf_model(spec: Any, context: int | None = None) -> tuple[Config, Any, dict[str, Any]]:
    """The config, Flax module and parameters (nested, each placed on the device as it is read) of
    the model (of the checkpoint's family) holding the Hugging Face checkpoint ``hf:PATH`` (or the
    :class:`jaxnet.models.hf.Checkpoint` already read); its vocabulary is the checkpoint's, its
    context the checkpoint's positions, or ``context`` when fewer are needed and no parameter's
    shape depends on them (rotary positions, no table: the decoding cache is then that long)."""
    import dataclasses

    from jaxnet.models import hf

    checkpoint = spec if isinstance(spec, hf.Checkpoint) else hf.read(spec)
    params = hf.nested({path: jax.device_put(value) for path, value in checkpoint.tensors()})  # each placed as read
    cfg = Config()
    cfg.model = checkpoint.model()
    cfg.data.seq_len = checkpoint.context
    if context and context < checkpoint.context:
        shorter = dataclasses.replace(cfg.model, context=context)
        vocab, full = checkpoint.vocab, checkpoint.context
        if hf.param_shapes(shorter, vocab, context) == hf.param_shapes(cfg.model, vocab, full):
            cfg.model, cfg.data.seq_len = shorter, context
    cfg.train.init_from = f"{hf.PREFIX}{checkpoint.directory}"
    cfg.train.eval_batch_size = 32
    return cfg, models.build(cfg.model, checkpoint.vocab, cfg.data.seq_len), params


def load_hf(spec: str | os.PathLike) -> Trained:
    """:func:`load` of ``"hf:PATH"``: a Hugging Face checkpoint as a :class:`Trained` Transformer taking
    token ids (N, T) of any length up to its context."""
    cfg, module, params = hf_model(spec)
    vocab = params["embed"]["embedding"].shape[0]
    inputs = {
        "format": record.FORMAT,
        "inputs": [{"key": "tokens", "shape": [None], "dtype": "int32", "ids": vocab}],
        "normalize": None,
        "outputs": vocab,
    }
    return Trained(
        workdir=Path(str(spec)),
        config=cfg,
        model=adapters.adapt(module),
        params=params,
        model_state={},
        step=0,
        inputs=inputs,
    )


def _variables(workdir: Path, model: Any, inputs: dict[str, Any], saved: dict[str, Any]) -> dict[str, Any]:
    """The model's variables, in the structure its ``init`` makes, filled from a saved state by path."""
    template = _template(workdir, model, inputs)
    found = init_from.variables(saved)
    flat, treedef = jax.tree_util.tree_flatten_with_path(dict(template))
    leaves, lacks, wrong = [], [], []
    for path, leaf in flat:
        name = joined(path)
        if name.split("/")[0] == CARRIED:
            leaves.append(np.zeros(leaf.shape, leaf.dtype))
        elif name not in found:
            lacks.append(name)
        elif tuple(found[name].shape) != tuple(leaf.shape):
            wrong.append(f"{name} {tuple(found[name].shape)} there, {tuple(leaf.shape)} here")
        else:
            leaves.append(np.asarray(found[name], leaf.dtype))
    extra = sorted(set(found) - {joined(p) for p, _ in flat})
    problems = [f"the checkpoint lacks {lacks[0]}"] if lacks else []
    problems += [f"shapes differ: {wrong[0]}"] if wrong else []
    problems += [f"the model lacks {extra[0]}"] if extra else []
    if problems:
        raise UserError(
            f"the checkpoint of {workdir} does not fit model {model.name}: {'; '.join(problems)}; "
            "pass the model the run trained, e.g. jaxnet.load(workdir, model=...)"
        )
    return dict(jax.tree_util.tree_unflatten(treedef, leaves))


def run_tokenizer(workdir: str | os.PathLike, cfg: Config) -> tuple[str | None, str | None]:
    """The tokenizer a run's ids are in (``gpt2``, ``hf:DIR``, ...) and the chat template it was
    fine-tuned with (Jinja text), as its ``vocab.json`` remembers them (the corpus's tokenizer and
    template, or the data's); where there is none, the checkpoint it started from (``hf:DIR``). A
    directory moved or deleted since gives None.

    >>> run_tokenizer("runs/hf_finetune", jaxnet.load("runs/hf_finetune").config)   # doctest: +SKIP
    ('hf:/home/me/checkpoints/SmolLM-135M', None)
    """
    from jaxnet.models import hf

    name = template = None
    try:
        saved = json.loads((Path(workdir) / "vocab.json").read_text())
        name, template = saved.get("tokenizer"), saved.get("chat_template")
    except (OSError, ValueError, AttributeError):
        pass
    if not isinstance(name, str) or not name:
        name = next((s for s in (cfg.train.init_from, cfg.data.tokenizer) if hf.is_hf(s)), None)
    if name is not None and hf.is_hf(name) and not hf.hf_dir(name).is_dir():
        name = None
    return name, template if isinstance(template, str) else None


def export_run(
    workdir: str | os.PathLike,
    out: str | os.PathLike,
    format: str,
    *,
    step: int | str | None = None,
    chat_template: str | os.PathLike | None = None,
) -> str:
    """``jaxnet export``: write run ``workdir`` (checkpoint ``step``, default the newest) to ``out`` in
    ``format`` (see :meth:`Trained.export`), with the chat template in the file ``chat_template``
    (format hf). ``out`` and the template are checked before the run is loaded. Returns the line to
    print."""
    from jaxnet.tokenizers import chat as chat_lib

    out = Path(out)
    if format not in EXPORT_FORMATS:
        raise UserError(f"--format {format}: expected one of {', '.join(EXPORT_FORMATS)}")
    template = None
    if chat_template is not None:
        if format != "hf":
            raise UserError("--chat-template goes with --format hf (a Hugging Face checkpoint's tokenizer files)")
        try:
            template = Path(chat_template).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise UserError(f"--chat-template {chat_template}: cannot read it ({e})") from None
        chat_lib.ChatTemplate(template, origin=f"the chat template {chat_template}")  # it compiles
    if format in ("hf", "peft") and out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UserError(f"--out {out} {'is not empty' if out.is_dir() else 'is a file'}; give a new or empty directory")
    if format == "jax" and out.exists():
        raise UserError(f"--out {out} exists; give a new file name (nothing is overwritten)")
    if not out.parent.is_dir():
        raise UserError(f"--out {out}: directory {out.parent} does not exist")
    trained = load(workdir, step)
    from jaxnet.models import hf

    families = sorted({t.family for t in hf.TABLES.values()})
    if format in ("hf", "peft") and trained.config.model.name not in families:
        raise UserError(
            f"{workdir} trained a {trained.config.model.name}; a Hugging Face checkpoint (--format hf) holds a "
            f"{' or '.join(families)}. Use --format jax"
        )
    written = trained.export(out, format=format, chat_template=template)
    return json.dumps({"step": trained.step, "format": format, "out": str(written)})


def _image_files(workdir: Path, input_path: Path) -> np.ndarray:
    """Raw image files (one, or every image under a directory, sorted by path) as the uint8 images a
    run on images takes: decoded, resized on the short side and center-cropped to the run's size
    (:func:`jaxnet.data.imagefiles.read_image_files`), as its evaluation prepared them."""
    specs = record.read_inputs(workdir)["inputs"]
    shape = specs[0]["shape"] if len(specs) == 1 else None
    if shape is None or len(shape) != 3 or shape[0] != shape[1] or shape[2] not in (1, 3):
        raise UserError(f"{workdir} was not trained on square images (its inputs: {specs}); give a .npy file")
    return imagefiles.read_image_files(imagefiles.image_paths(input_path), shape[0], shape[2])


OUTPUTS = ("logits", "probs", "argmax")
"""What ``jaxnet predict`` writes: the model's outputs, their softmax, or the index of the largest."""


def predict_file(
    workdir: str | os.PathLike,
    input_path: str | os.PathLike,
    out_path: str | os.PathLike,
    *,
    step: int | str | None = None,
    batch_size: int | None = None,
    output: str = "logits",
    cast: bool = False,
) -> str:
    """``jaxnet predict``: the model's outputs for the array in the ``.npy`` file ``input_path``
    (raw inputs, as the training data held them; ``cast`` converts another dtype kind, see
    :meth:`Trained.preprocess`), or for an image file or every image file under a directory
    (sorted by path) of a run trained on images, written to ``out_path`` as ``.npy``. Every
    input is checked before anything is computed. Returns the line to print."""
    if output not in OUTPUTS:
        raise AssertionError(output)
    input_path, out_path = Path(input_path), Path(out_path)
    if batch_size is not None and batch_size < 1:
        raise UserError(f"--batch-size {batch_size}: give a number of examples of at least 1")
    images = input_path.is_dir() or input_path.suffix.lower() in imagefiles.IMAGE_SUFFIXES
    if not input_path.exists() or (not images and not input_path.is_file()):
        raise UserError(f"--input {input_path} does not exist; give a .npy file (numpy.save), an image or a directory")
    if not images:
        try:
            x = np.load(input_path, allow_pickle=False)
        except (OSError, ValueError, EOFError) as e:
            message = (str(e).strip().splitlines() or [""])[0]
            raise UserError(f"cannot read --input {input_path} as a .npy array: {message[:200]}") from None
        if not isinstance(x, np.ndarray):
            raise UserError(f"--input {input_path} is an .npz archive; give one array in a .npy file (numpy.save)")
    else:
        x = _image_files(Path(workdir), input_path)
    if out_path.is_dir():
        raise UserError(f"--out {out_path} is a directory; give a file name such as {out_path / 'outputs.npy'}")
    if not out_path.parent.is_dir():
        raise UserError(f"--out {out_path}: directory {out_path.parent} does not exist")
    trained = load(workdir, step)
    outputs = trained.predict(x, batch_size, cast=cast)
    if not isinstance(outputs, (np.ndarray, jax.Array)):
        raise UserError(f"model {trained.model.name} returns {type(outputs).__name__}, not one array; use jaxnet.load")
    if output == "probs":
        outputs = np.asarray(jax.nn.softmax(jnp.asarray(outputs, jnp.float32), axis=-1))
    elif output == "argmax":
        outputs = np.asarray(outputs).argmax(-1).astype(np.int32)
    tmp = out_path.with_name(f".{out_path.name}.tmp-{os.getpid()}.npy")
    try:
        np.save(tmp, outputs)
        os.replace(tmp, out_path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise UserError(f"cannot write --out {out_path}: {e.strerror}") from None
    return json.dumps(
        {"step": trained.step, "examples": len(x), "output": output, "shape": list(outputs.shape), "out": str(out_path)}
    )

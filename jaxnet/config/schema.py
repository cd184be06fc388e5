"""The config schema: each section's typed fields, the keys they make, and the checks across them.

A :class:`Config` is nested dataclasses, one per section (``data``, ``model``, ``optim``,
``train``, ``mesh``, ``parallel``, ``profile``). Every value a user can set is a typed field with
a one-line description (:func:`field`), so ``jaxnet train EXP --show-config`` can list them
(:func:`describe`) and every value is checked against them (:func:`validate` adds the checks
that involve more than one value).

The model section is not here: each model family owns its config (a subclass of
:class:`~jaxnet.models.base.ModelConfig` beside its module, registered in :mod:`jaxnet.models`),
so the ``model.*`` keys are those of the family ``cfg.model`` is.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass
from typing import Any

from jaxnet import tokenizers
from jaxnet.errors import UserError
from jaxnet.models import base as model_base
from jaxnet.models.base import Checked, ModelConfig, field, leaves, model_config, model_keys

# The most steps per call train.steps_per_call=0 (auto) picks: five steps per call ran the CPU
# ConvNet 14 % faster than one (benchmarks/results/conv-cpu-2026-11-23-candidates-under-load.json);
# a step with convolutions is unrolled in its call, so its compile grows with it (others stay in a loop).
AUTO_STEPS_PER_CALL = 8
# Auto's K divides every interval shorter than this; a longer one (an epoch of 2,323 steps) is
# reached by a few single steps before its boundary, at most K - 1 in this many steps.
AUTO_LONG_INTERVAL = 100


@dataclass
class DataConfig(Checked):
    """Which dataset, where it is, and how batches are made from it."""

    name: str = field(
        "fashion_mnist",
        "dataset ('arrays' = data given from Python or by an experiment file's data(cfg))",
        choices=(
            "fashion_mnist",
            "mnist",
            "cifar10",
            "ptb",
            "shakespeare",
            "text",
            "tokens",
            "folder",
            "arrayrecord",
            "arrays",
        ),
    )
    dir: str = field("", "directory holding the dataset files ('' = the standard location)")
    path: str = field(
        "",
        "text file to train a language model on (data.name=text), a token corpus directory (data.name=tokens), an "
        "image folder with a subdirectory per class (data.name=folder), or jaxnet prepare images' directory or a glob "
        "of ArrayRecord shards (data.name=arrayrecord)",
    )
    format: str = field(
        "",
        "data.name=tokens: the directory's layout ('' = found from its files: corpus.json = jaxnet prepare's, "
        "train.bin = nanoGPT's, *_train_*.bin = llm.c's)",
        choices=("", "jaxnet", "nanogpt", "llmc"),
    )
    vocab_size: int = field(
        0,
        "data.name=tokens: the model's vocabulary, padded with unused ids beyond the corpus's (0 = the corpus's: "
        "corpus.json's, nanoGPT's meta.pkl, else GPT-2's 50,257)",
        low=0,
    )
    tokenizer: str = field(
        "",
        "text tokenizer ('' = the dataset's own: word for ptb, char for shakespeare and text; gpt2 = GPT-2's "
        "byte-level BPE, 50,257 tokens; hf:DIR = the tokenizer.json of a Hugging Face checkpoint directory)",
        choices=("", *tokenizers.CHOICES),
    )
    seq_len: int = field(0, "language models: tokens per sequence (BPTT length or context)", low=0)
    batching: str = field(
        "",
        "language models: 'stream' = contiguous streams carrying state across batches (LSTM), 'windows' = "
        "random windows, 'packed' = a corpus's whole examples packed into rows, none attending to another "
        "(data.name=tokens; a chat corpus always is) ('' = stream for lstm, windows otherwise)",
        choices=("", "stream", "windows", "packed"),
    )
    overlong: str = field(
        "drop",
        "data.batching=packed: an example longer than data.seq_len is dropped, or truncated to it (counted and said)",
        choices=("drop", "truncate"),
    )
    val_size: int = field(5000, "image datasets: training examples held out for validation", low=0)
    augment: bool = field(
        False,
        "random crop (4 px padding) and horizontal flip; image files (folder, arrayrecord): random resized crop, flip",
    )
    image_size: int = field(
        0,
        "folder, arrayrecord: images are resized to this on their short side and cropped square (0 = the images' own "
        "size, when they all share one)",
        low=0,
    )
    workers: int = field(
        -1,
        "folder, arrayrecord: grain worker processes decoding images (-1 = the cores left after the training "
        "process's own, at least 1; 0 = decode in the training process)",
        low=-1,
    )
    skip_corrupt: bool = field(
        False, "folder, arrayrecord: skip unreadable images (counted) instead of stopping with an error naming it"
    )
    upscale: bool = field(
        False, "folder, arrayrecord: enlarge images smaller than data.image_size instead of stopping with an error"
    )
    mean: str = field(
        "",
        "folder, arrayrecord: per-channel mean of the pixels scaled to 0..1, comma-separated, e.g. 0.485,0.456,0.406 "
        "('' = computed from a fixed sample of training images)",
    )
    std: str = field("", "folder, arrayrecord: per-channel std, as data.mean ('' = computed)")
    prefetch: int = field(2, "batches prepared ahead of the step on a background thread", low=0)
    mixture: tuple[str, ...] = field(
        (),
        "data.name=tokens: corpora of one tokenizer mixed by weight, DIR:WEIGHT,... (weights normalised; each batch's "
        "rows drawn so each corpus's share of tokens follows its weight; data.path is then not read)",
    )
    mixture_schedule: tuple[str, ...] = field(
        (),
        "data.mixture: new weights from a step on, STEP:W1/W2/...,... in data.mixture's order (0 leaves a corpus out)",
    )
    mixture_end: str = field(
        "cycle",
        "data.mixture: a corpus whose windows have all been read starts another pass in a new order (cycle), or the "
        "run ends at that step (stop: train.steps becomes it, said at the start)",
        choices=("cycle", "stop"),
    )
    mask_rate: float = field(
        0.15,
        "masked_lm: fraction of tokens chosen for prediction (80 % become a mask token, 10 % a random token, "
        "10 % stay)",
        low=0.01,
        high=0.5,
    )


@dataclass
class OptimConfig(Checked):
    """Optimizer, learning-rate schedule, clipping and gradient accumulation."""

    name: str = field(
        "adamw",
        "optimizer, from optax (lion reads b1 and b2, its paper's are 0.9 and 0.99; adafactor keeps optax's "
        "defaults); jaxnet.train(optimizer=...) or an experiment file's optimizer(cfg) gives your own",
        choices=("adamw", "sgd", "lion", "adafactor"),
    )
    lr: float = field(1e-3, "peak learning rate", low=0.0)
    momentum: float = field(0.9, "SGD momentum (0 = plain SGD)", low=0.0, high=0.999)
    nesterov: bool = field(False, "Nesterov momentum for SGD")
    b1: float = field(0.9, "AdamW and Lion first-moment decay", low=0.0, high=0.9999)
    b2: float = field(0.999, "AdamW and Lion second-moment decay", low=0.0, high=0.99999)
    weight_decay: float = field(
        0.0,
        "AdamW, Lion, Adafactor: decoupled, scaled by the learning rate; SGD: L2 term added to the gradient",
        low=0.0,
    )
    decay_mask: str = field(
        "auto",
        "parameters weight decay acts on: matrices = those of 2+ dimensions not named bias or scale (no biases or "
        "norm scales); all; auto = matrices for adamw, lion and adafactor, all for sgd",
        choices=("auto", "matrices", "all"),
    )
    schedule: str = field(
        "cosine",
        "learning-rate schedule after warmup ('step': multiply by decay_factor every decay_every steps "
        "from step decay_start on; 'warmup_cosine': optax.warmup_cosine_decay_schedule, its warmup from 0 rather "
        "than lr / warmup_steps)",
        choices=("cosine", "constant", "step", "linear", "warmup_cosine"),
    )
    decay_start: int = field(0, "step schedule: first step with a decayed learning rate", low=0)
    decay_every: int = field(1, "step schedule: steps between decays", low=1)
    decay_factor: float = field(0.5, "step schedule: learning-rate multiplier per decay", low=0.0, high=1.0)
    warmup_steps: int = field(
        0, "linear warmup to lr over this many steps (from lr / warmup_steps; from 0 for warmup_cosine)", low=0
    )
    end_lr_factor: float = field(
        0.0, "final learning rate of the cosine and linear schedules, as a fraction of lr", low=0.0, high=1.0
    )
    extend: str = field(
        "restart",
        "a completed run resumed with a larger train.steps, where the schedule depends on train.steps (cosine): "
        "restart = the schedule, warmup included, begins again over the new steps; continue = the old schedule's "
        "final learning rate is held",
        choices=("restart", "continue"),
    )
    extended_at: int = field(
        0, "set when a completed run is extended: the step its schedule ended at (0 = never extended)", low=0
    )
    clip_norm: float = field(0.0, "clip gradients to this global norm (0 = off)", low=0.0)
    grad_accum: int = field(1, "split each batch into this many micro-batches and average their gradients", low=1)
    grad_accum_mode: str = field(
        "sequential",
        "how the micro-batches of optim.grad_accum run: sequential = one after another (a lax.scan: the memory of one "
        "micro-batch's activations); parallel = as independent operations, which XLA's CPU runtime runs side by side "
        "on its threads (the memory of all of them): on a CPU, optim.grad_accum=<cores> optim.grad_accum_mode=parallel "
        "can be the faster step (docs/performance.md)",
        choices=("sequential", "parallel"),
    )
    freeze: str = field(
        "",
        "regex: parameters whose path (e.g. params/Conv_0/kernel, searched anywhere in it) matches get no update "
        "and no optimizer state ('' = train all)",
    )


@dataclass
class TrainConfig(Checked):
    """Length of the run, batch sizes, and how often to log, evaluate and checkpoint."""

    steps: int = field(1000, "optimizer updates in the whole run", low=1)
    batch_size: int = field(128, "examples per optimizer update (global, across devices)", low=1)
    eval_batch_size: int = field(1000, "examples (images, or text sequences / streams) per evaluation batch", low=1)
    log_every: int = field(50, "steps between training-metric logs (when the host waits for the device)", low=1)
    eval_every: int = field(0, "steps between validation passes (0 = only at the end)", low=0)
    eval_tokens: int = field(
        1 << 20,
        "data.name=tokens: next-token predictions per evaluation of a split, its first ones (nanoGPT's eval_iters; "
        "0 = the whole split); in-memory text is always evaluated whole",
        low=0,
    )
    eval_tasks: tuple[str, ...] = field(
        (),
        "benchmark tasks scored at each validation pass: JSONL files of multiple-choice rows (context, choices, gold) "
        "or of log-likelihood rows (context, continuation), e.g. tasks/a.jsonl,tasks/b.jsonl",
    )
    checkpoint_every: int = field(500, "steps between checkpoints (0 = only at the end)", low=0)
    keep_checkpoints: int = field(3, "checkpoints kept on disk (the newest ones)", low=1)
    keep_best: str = field(
        "",
        "[min:|max:]val/METRIC: also keep the checkpoint with the best value of that validation metric (lower or "
        "higher from its name: losses, errors, perplexity lower; accuracy, f1, r2 higher), in checkpoints/best.json",
    )
    stop_after: int = field(0, "end this invocation after this many steps; rerun to resume (0 = off)", low=0)
    init_from: str = field(
        "",
        "RUN_DIR[@STEP]: start from that run's parameters and model state (its newest checkpoint, or STEP), "
        "matched by path such as params/Conv_0/kernel; a resume continues from this run's own checkpoints",
    )
    init_skip: str = field(
        "", "regex: with train.init_from, paths it matches (searched anywhere) keep their fresh initialisation"
    )
    check_tokenizer: bool = field(
        True,
        "with train.init_from=hf:DIR, refuse data not tokenized by DIR's own tokenizer.json (GPT-2's for a GPT-2 "
        "checkpoint of 50,257 ids without one), and a DIR without tokenizer.json whose data cannot be checked; "
        "false = only that the data's ids fit the checkpoint (data tokenized otherwise on purpose)",
    )
    steps_per_call: int = field(
        1,
        "steps run by one compiled call (a lax.scan over that many batches): one dispatch and host round trip per "
        "call; logs, evaluations, checkpoints and actions still fall on their steps (single steps lead up to one "
        f"a call would pass). 0 = auto: the largest number up to {AUTO_STEPS_PER_CALL} that divides every interval "
        f"shorter than {AUTO_LONG_INTERVAL} steps (1 in a sweep)",
        low=0,
    )
    label_smoothing: float = field(
        0.0,
        "label smoothing of the cross-entropy; with train.objective=dpo|simpo, the probability that a pair's "
        "preference is flipped (conservative DPO: -(1-e) log sigmoid(m) - e log sigmoid(-m) of the margin m)",
        low=0.0,
        high=1.0,
    )
    objective: str = field(
        "",
        "what a preference corpus (jaxnet prepare preference) is trained to: dpo (sigmoid DPO against the "
        "starting weights: under LoRA the base with the adapters off, else a frozen copy of them) or simpo "
        "(reference-free: length-normalised log-probabilities and a target margin) ('' = the data's: dpo for a "
        "preference corpus)",
        choices=("", "dpo", "simpo"),
    )
    dpo_beta: float = field(0.1, "train.objective=dpo: beta, the weight of the log-probability ratios", low=0.0)
    simpo_beta: float = field(2.0, "train.objective=simpo: beta, the weight of the mean log-probabilities", low=0.0)
    simpo_gamma: float = field(1.0, "train.objective=simpo: gamma, the target reward margin", low=0.0)
    z_loss: float = field(
        0.0,
        "weight of PaLM's z-loss, z * logsumexp(logits)^2 per predicted token, added to the training loss of the "
        "cross-entropy tasks (0 = off; evaluation reports the cross-entropy alone)",
        low=0.0,
    )
    router_aux_loss: float = field(
        -1.0,
        "coefficient of a mixture of experts' load-balancing loss for this run (-1 = the model's "
        "model.router_aux_loss, a checkpoint's router_aux_loss_coef)",
        low=-1.0,
    )
    loss_from: str = field(
        "auto",
        "where the cross-entropy tasks' training loss is computed from: features = the model's final hidden states "
        "and output layer, the logits made and reduced in blocks and never held whole (jaxnet.blockwise); logits = "
        "the model's outputs; auto = features where the model offers them (the Transformer), else logits. "
        "Evaluation, predict and sampling always see the logits",
        choices=("auto", "features", "logits"),
    )
    loss_block: int = field(
        0,
        "train.loss_from=features: tokens of one device per block (whole positions of its rows); 0 = automatic "
        "(a block's float32 logits near 64 MiB on a CPU, 1 GiB on a GPU)",
        low=0,
    )
    progress: bool = field(True, "show a progress bar on a terminal (false: plain log lines)")
    trackers: tuple[str, ...] = field(
        ("tensorboard",),
        "where the log records go besides metrics.jsonl: tensorboard (tb/), mlflow (MLFLOW_TRACKING_URI, else a "
        "store in the run directory; pip install 'jaxnet[mlflow]'), e.g. tensorboard,mlflow",
        choices=("tensorboard", "mlflow"),
    )
    lora_rank: int = field(
        0,
        "LoRA: rank of the low-rank adapters trained on a frozen base (train.init_from); only the adapters get "
        "gradients, optimizer state and checkpoints (0 = off: every parameter trains)",
        low=0,
    )
    lora_alpha: float = field(
        0.0, "LoRA: the adapters' product is scaled by lora_alpha / lora_rank (0 = lora_rank: scale 1)", low=0.0
    )
    lora_dropout: float = field(
        0.0, "LoRA: dropout on the adapters' inputs in training (the Transformer's projections)", low=0.0, high=0.99
    )
    lora_targets: str = field(
        "",
        "LoRA: which kernels get adapters: attention (the queries, keys, values and attention output), all (and "
        "the MLP), or a regex searched in parameter paths such as block_0/mlp_in/kernel ('' = attention)",
    )
    base_dtype: str = field(
        "",
        "LoRA: the dtype the frozen base is held in (bfloat16 halves its memory); the adapters and their "
        "optimizer stay float32; a full train.objective=dpo run: the dtype of its frozen reference copy "
        "('' = model.param_dtype)",
        choices=("", "float32", "bfloat16"),
    )
    base_vectors: str = field(
        "float32",
        "LoRA with train.base_dtype: float32 keeps the base's norm scales and biases in float32 (a vanishing part "
        "of its memory, the part whose rounding the model feels most); base_dtype casts them too, as loading the "
        "whole model in bfloat16 does",
        choices=("float32", "base_dtype"),
    )
    on_nonfinite: str = field(
        "stop",
        "a NaN or Inf loss or gradient: stop the run (naming the step), or skip that update inside the step",
        choices=("stop", "skip"),
    )


@dataclass
class MeshConfig(Checked):
    """How the devices are arranged."""

    data: int = field(-1, "devices along the data-parallel axis (-1 = the rest of the devices)", low=-1)
    fsdp: int = field(
        1, "devices that split the batch and shard parameters and optimizer state (-1 = the rest)", low=-1
    )
    expert: int = field(
        1,
        "devices that split a mixture's experts (must divide model.experts) and the batch; tokens travel to "
        "their experts and back by all-to-all (-1 = the rest)",
        low=-1,
    )
    context: int = field(
        1,
        "devices that split each row's sequence (context parallelism: the Transformer's attention works across "
        "them; data.seq_len a multiple of 2 x mesh.context; -1 = the rest)",
        low=-1,
    )
    tensor: int = field(1, "devices that split attention heads and hidden units (-1 = the rest)", low=-1)


@dataclass
class ParallelConfig(Checked):
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
class ProfileConfig(Checked):
    """Tracing a few steps for TensorBoard's profiler or Perfetto."""

    steps: str = field(
        "", "trace updates A to B (e.g. 10-20) into WORKDIR/profile for TensorBoard or Perfetto ('' = off)"
    )


@dataclass
class Config(Checked):
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


DEFAULT_MODEL = "convnet"
model_base.set_root(Config)  # so a section can name its keys and suggest the other sections' (Checked)


def keys(cfg: Config | None = None) -> dict[str, dataclasses.Field]:
    """Every settable key of ``cfg`` (default ``Config()``): the sections' and its model family's.

    >>> "model.heads" in keys(load_experiment("transformer_shakespeare"))   # doctest: +SKIP
    True
    """
    cfg = cfg if cfg is not None else Config()
    out: dict[str, dataclasses.Field] = {}
    for key, f in leaves(Config).items():
        if key == "model.name":
            out.update(model_keys(type(cfg.model)))
        elif not key.startswith("model."):
            out[key] = f
    return out


def describe(cfg: Config | None = None, in_effect: dict[str, str] | None = None) -> str:
    """One line per settable key of ``cfg`` (default ``Config()``): name, type, its value in ``cfg``
    (followed by ``-> X`` where ``in_effect`` says what a setting left to jaxnet becomes, see
    :func:`settings_in_effect`) and what it does."""
    cfg = cfg if cfg is not None else Config()
    in_effect = in_effect or {}
    lines = []
    for key, f in keys(cfg).items():
        value: Any = cfg
        for part in key.split("."):
            value = getattr(value, part)
        choices = f.metadata.get("choices")
        if key == "model.name":
            choices = tuple(model_base.REGISTRY)
        type_name = getattr(f.type, "__name__", str(f.type).replace("typing.", ""))
        shown = f" {{{'|'.join(choices)}}}" if choices else ""
        text = _as_typed(value)
        if key in in_effect:
            text += f" -> {in_effect[key]}"
        lines.append(f"{key:24s} {type_name:16s} {text:16s}  {f.metadata.get('doc', '')}{shown}")
    return "\n".join(lines)


def settings_in_effect(
    cfg: Config, backend: str, mesh_sizes: dict[str, int] | None = None, hooks: Any = ()
) -> dict[str, str]:
    """What the settings ``cfg`` leaves to jaxnet become (``auto`` and ``''`` values on
    ``backend``, mesh axes of -1 given ``mesh_sizes``), and the keys an experiment file's
    ``hooks`` (the names of its ``model``, ``data`` and ``task`` functions) stand in for."""
    out: dict[str, str] = {}
    model = cfg.model.for_backend(backend)
    for key in model_keys(type(cfg.model)):
        name = key.partition(".")[2]
        if getattr(model, name) != getattr(cfg.model, name):
            out[key] = _as_typed(getattr(model, name))
    text = cfg.data.name in TEXT_DATA
    if not cfg.task and cfg.data.name in TEXT_DATA + IMAGE_DATA:
        out["task"] = "lm" if text else "classification"
    if text and not cfg.data.tokenizer and cfg.data.name != "tokens":  # a corpus says its own
        out["data.tokenizer"] = default_tokenizer(cfg.data.name)
    if text and not cfg.data.batching:
        out["data.batching"] = batching(cfg) + (" (packed for a chat corpus)" if cfg.data.name == "tokens" else "")
    for axis, size in (mesh_sizes or {}).items():
        if getattr(cfg.mesh, axis) == -1:
            out[f"mesh.{axis}"] = str(size)
    for hook, key in (("model", "model.name"), ("data", "data.name"), ("task", "task")):
        if hook in hooks:
            out[key] = f"the experiment file's {hook}(cfg)"
    return out


def check_field(key: str, value: Any, f: dataclasses.Field) -> None:
    """A :class:`UserError` unless ``value`` is one of field ``f``'s choices and within its limits."""
    choices, low, high = f.metadata.get("choices"), f.metadata.get("low"), f.metadata.get("high")
    if choices and isinstance(value, tuple):
        unknown = [v for v in value if v not in choices]
        if unknown:
            raise UserError(f"{key}={_show(value)}: {unknown[0]!r} is not one of: {', '.join(choices)}")
    elif choices and value not in choices and not _takes_argument(value, choices):
        raise UserError(f"{key}={value!r} is not one of: {', '.join(choices)}")
    every = ": every entry " if isinstance(value, tuple) else " "
    for v in value if isinstance(value, tuple) else (value,):
        if isinstance(v, float) and not math.isfinite(v):  # set from Python: the command line refuses it when parsing
            raise UserError(f"{key}={_show(value)}{every}must be a finite number")
        if low is not None and v < low:
            raise UserError(f"{key}={_show(value)}{every}must be >= {low}")
        if high is not None and v > high:
            raise UserError(f"{key}={_show(value)}{every}must be <= {high}")


def _takes_argument(value: Any, choices: tuple) -> bool:
    """Whether ``value`` is a choice spelled ``KIND:ARG`` in ``choices`` (``hf:DIR``) with its argument."""
    kind, colon, argument = str(value).partition(":")
    return bool(colon and argument) and any(str(c).startswith(f"{kind}:") for c in choices)


def default_tokenizer(dataset: str) -> str:
    """The tokenizer of a text dataset when ``data.tokenizer`` is left empty: ``word`` for PTB, else ``char``.

    >>> default_tokenizer("ptb"), default_tokenizer("shakespeare")
    ('word', 'char')
    """
    return "word" if dataset == "ptb" else "char"


def _as_typed(value: Any) -> str:
    """A value as ``key=value`` on the command line takes it: ``32,64``, ``true``, ``adamw``, ``''``."""
    if isinstance(value, tuple):
        return ",".join(map(str, value)) or "''"
    if isinstance(value, bool):
        return str(value).lower()
    return str(value) if value != "" else "''"


def _show(value: Any) -> str:
    """A value as it is written on the command line: ``32,0`` for a tuple, ``1.5`` for a number."""
    return ",".join(map(str, value)) if isinstance(value, tuple) else repr(value)


TEXT_DATA = ("ptb", "shakespeare", "text", "tokens")
IMAGE_DATA = ("fashion_mnist", "mnist", "cifar10")


def validate(cfg: Config) -> None:
    """Checks that involve more than one value, or that every field check would miss."""
    families = model_base.REGISTRY
    if cfg.model.name not in families:
        raise model_base.unknown_model(cfg.model.name)
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
        check_field(key, node, f)
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
    if cfg.optim.schedule == "warmup_cosine" and cfg.optim.warmup_steps < 1:
        raise UserError(
            "optim.schedule=warmup_cosine warms up over optim.warmup_steps, which is 0; set optim.warmup_steps=N "
            "(or optim.schedule=cosine for no warmup)"
        )
    for axis in ("data", "fsdp", "expert", "context", "tensor"):
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
    if cfg.data.batching == "packed" and cfg.data.name != "tokens":
        raise UserError(
            f"data.batching=packed packs a prepared corpus's documents (data.name=tokens), not data.name="
            f"{cfg.data.name}; prepare it with jaxnet prepare and train with data.name=tokens data.path=DIR"
        )
    _check_mixture(cfg)
    cfg.model.validate()
    if cfg.model.carries_state and cfg.optim.grad_accum > 1:
        raise UserError(
            f"optim.grad_accum > 1 cannot be used with model.name={cfg.model.name} (its carried state is per batch row)"
        )
    if "float64" in (cfg.model.dtype, cfg.model.param_dtype):
        import jax

        if not jax.config.read("jax_enable_x64"):
            raise UserError("model.dtype=float64 needs JAX's 64-bit mode: run with JAX_ENABLE_X64=1")
    profile_steps(cfg)
    _check_context(cfg, text_data)
    if cfg.parallel.mode == "replicas" and (cfg.mesh.fsdp != 1 or cfg.mesh.tensor != 1 or cfg.mesh.expert != 1):
        raise UserError(
            f"parallel.mode=replicas keeps a whole model on every device, so it needs mesh.fsdp=1, mesh.expert=1 "
            f"and mesh.tensor=1 (got mesh.fsdp={cfg.mesh.fsdp}, mesh.expert={cfg.mesh.expert}, "
            f"mesh.tensor={cfg.mesh.tensor})"
        )
    _check_sgd(cfg)
    _check_fine_tuning(cfg)
    _check_objective(cfg)


def _check_objective(cfg: Config) -> None:
    """A preference objective's keys: its pairs train with synchronous SGD, its label smoothing below
    one half (a pair flipped more often than not is the other preference)."""
    t = cfg.train
    if not t.objective:
        return
    if cfg.parallel.sgd != "sync":
        raise UserError(
            f"train.objective={t.objective} trains with synchronous SGD; parallel.sgd={cfg.parallel.sgd} is not"
        )
    if t.label_smoothing >= 0.5:
        raise UserError(
            f"train.label_smoothing={t.label_smoothing} with train.objective={t.objective} is the probability that a "
            "pair's preference is flipped: give a value below 0.5 (e.g. 0.1)"
        )


MIXTURE_EXAMPLE = "e.g. data.mixture=corpora/web:0.7,corpora/code:0.3"


def mixture_sources(cfg: Config) -> list[tuple[str, float]]:
    """``data.mixture`` as (directory, weight) pairs, each weight a number > 0 (not yet normalised).

    >>> cfg = Config(); cfg.data.mixture = ("corpora/a:3", "corpora/b:1")
    >>> mixture_sources(cfg)
    [('corpora/a', 3.0), ('corpora/b', 1.0)]
    """
    out = []
    for entry in cfg.data.mixture:
        path, colon, weight = entry.rpartition(":")
        if not colon or not path.strip():
            raise UserError(f"data.mixture entry {entry!r} is not DIR:WEIGHT; {MIXTURE_EXAMPLE}")
        try:
            w = float(weight)
        except ValueError:
            raise UserError(
                f"data.mixture entry {entry!r}: its weight {weight!r} is not a number; {MIXTURE_EXAMPLE}"
            ) from None
        if not (math.isfinite(w) and w > 0):
            raise UserError(
                f"data.mixture entry {entry!r}: a weight must be a number > 0 (leave a corpus out rather than weigh "
                "it 0; data.mixture_schedule may set 0 from a step on)"
            )
        out.append((path.strip(), w))
    return out


def mixture_schedule(cfg: Config) -> list[tuple[int, tuple[float, ...]]]:
    """``data.mixture_schedule`` as (step, weights) pairs in step order: from ``step`` on, the
    corpora of ``data.mixture`` (in its order) are drawn by these weights (>= 0, not all 0).

    >>> cfg = Config(); cfg.data.mixture = ("a:1", "b:1"); cfg.data.mixture_schedule = ("100:0.2/0.8",)
    >>> mixture_schedule(cfg)
    [(100, (0.2, 0.8))]
    """
    count, out = len(cfg.data.mixture), []
    for entry in cfg.data.mixture_schedule:
        step, colon, weights = entry.partition(":")
        example = f"e.g. data.mixture_schedule=1000:{'/'.join(['0.5'] * max(count, 2))}"
        if not colon or not step.strip().isdigit() or int(step) < 1:
            raise UserError(f"data.mixture_schedule entry {entry!r} is not STEP:W1/W2/... with STEP >= 1; {example}")
        try:
            values = tuple(float(w) for w in weights.split("/"))
        except ValueError:
            raise UserError(f"data.mixture_schedule entry {entry!r}: its weights are not numbers; {example}") from None
        if len(values) != count:
            raise UserError(
                f"data.mixture_schedule entry {entry!r} has {len(values)} weights for the {count} corpora of "
                f"data.mixture; give one per corpus, in its order ({example})"
            )
        if not all(math.isfinite(w) and w >= 0 for w in values) or not sum(values) > 0:
            raise UserError(f"data.mixture_schedule entry {entry!r}: weights must be >= 0 and not all 0")
        if out and int(step) <= out[-1][0]:
            raise UserError(f"data.mixture_schedule: step {int(step)} follows step {out[-1][0]}; list steps in order")
        out.append((int(step), values))
    return out


def _check_mixture(cfg: Config) -> None:
    """The mixture keys fit together and parse (the corpora themselves are read with the data)."""
    d = cfg.data
    if not d.mixture:
        set_alone = (("mixture_schedule", bool(d.mixture_schedule)), ("mixture_end", d.mixture_end != "cycle"))
        given = [k for k, v in set_alone if v]
        if given:
            raise UserError(f"data.{given[0]} needs data.mixture=DIR:WEIGHT,... ({MIXTURE_EXAMPLE})")
        return
    if d.name != "tokens":
        raise UserError(
            f"data.mixture mixes prepared corpora (jaxnet prepare), which data.name=tokens reads; data.name is "
            f"{d.name}: set data.name=tokens"
        )
    if batching(cfg) != "windows":
        raise UserError(
            f"data.mixture draws windows of data.seq_len tokens from each corpus; data.batching={batching(cfg)} is not "
            "supported with it: use data.batching=windows (a Transformer)"
        )
    mixture_sources(cfg)
    mixture_schedule(cfg)


def _check_context(cfg: Config, text_data: bool) -> None:
    """``mesh.context`` other than 1 needs a model whose attention splits the sequence, the sharded
    mode, and (for a size given) a sequence length it can split."""
    ways = cfg.mesh.context
    if ways == 1:
        return
    if not type(cfg.model).splits_sequence:
        raise UserError(
            f"mesh.context={ways} splits each row's sequence over devices, which model.name={cfg.model.name} cannot "
            "work across (the Transformer can); use mesh.context=1"
        )
    if cfg.parallel.mode == "replicas":
        raise UserError(f"parallel.mode=replicas keeps whole rows on every device; use mesh.context=1, not {ways}")
    if text_data and ways > 1:
        from jaxnet.models.transformer import context

        context.check_length(cfg.data.seq_len, ways, "data.seq_len")


def _check_fine_tuning(cfg: Config) -> None:
    """The regexes of ``optim.freeze`` and ``train.init_skip`` compile; ``init_skip`` has something to skip."""
    for key, value in (("optim.freeze", cfg.optim.freeze), ("train.init_skip", cfg.train.init_skip)):
        try:
            re.compile(value)
        except re.error as e:
            raise UserError(f"{key}={value!r} is not a regular expression ({e}); e.g. {key}=Dense_1") from None
    if cfg.train.init_skip and not cfg.train.init_from:
        raise UserError("train.init_skip names parameters to leave fresh, which needs train.init_from=RUN_DIR")
    _check_lora(cfg)


def _check_lora(cfg: Config) -> None:
    """The LoRA keys fit together: targets, alpha, dropout or a base dtype need a rank; a target
    regex compiles; the adapters train with synchronous SGD."""
    t = cfg.train
    if not t.lora_rank:
        frozen_copy = t.objective == "dpo"  # a full DPO run's reference is a frozen copy, held in base_dtype
        given = [
            f"train.{k}={getattr(t, k)}"
            for k, off in (
                ("lora_targets", ""),
                ("lora_alpha", 0.0),
                ("lora_dropout", 0.0),
                ("base_dtype", ""),
                ("base_vectors", "float32"),
            )
            if getattr(t, k) != off and not (k == "base_dtype" and frozen_copy)
        ]
        if given:
            raise UserError(
                f"{', '.join(given)} configures LoRA adapters, which are off: set train.lora_rank=R (e.g. 16)"
            )
        return
    if t.lora_targets not in ("", "attention", "all"):
        try:
            re.compile(t.lora_targets)
        except re.error as e:
            raise UserError(
                f"train.lora_targets={t.lora_targets!r} is not attention, all or a regular expression ({e})"
            ) from None
    if cfg.parallel.sgd != "sync":
        raise UserError(f"train.lora_rank trains adapters with synchronous SGD; parallel.sgd={cfg.parallel.sgd} is not")
    if cfg.optim.freeze:
        raise UserError(
            "train.lora_rank already freezes everything but the adapters; leave optim.freeze unset "
            "(train.lora_targets chooses the adapted kernels)"
        )


def steps_per_call(cfg: Config, everies: tuple[int, ...] = ()) -> int:
    """The steps of one compiled call: ``train.steps_per_call``, or where it is 0 (auto) the
    largest number up to :data:`AUTO_STEPS_PER_CALL` that divides the log, evaluation and
    checkpoint intervals and ``everies`` (periodic actions' intervals) shorter than
    :data:`AUTO_LONG_INTERVAL` steps. For example ``log_every=50, eval_every=500`` gives 5, and
    ``log_every=200, eval_every=2323`` gives 8: the runner reaches step 2323 by single steps from
    2320 (:func:`jaxnet.train.loop.call_sizes`)."""
    t = cfg.train
    if t.steps_per_call:
        return t.steps_per_call
    intervals = [n for n in (t.log_every, t.eval_every, t.checkpoint_every, *everies) if 0 < n < AUTO_LONG_INTERVAL]
    return next(k for k in range(AUTO_STEPS_PER_CALL, 0, -1) if all(n % k == 0 for n in intervals))


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
    return cfg.data.batching or ("stream" if cfg.model.carries_state else "windows")

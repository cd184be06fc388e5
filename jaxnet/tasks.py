"""Tasks: what a model is trained to do, as a loss and metrics over ``(outputs, batch)``.

A task names the batch keys the model reads, a loss (a scalar: the mean over the batch) and a
dict of metrics (scalars, means over the batch). The train and eval steps are generic over it,
so the built-in tasks below are instances of the same contract a user writes::

    task = jaxnet.Task(
        inputs="x",
        loss=lambda out, b: jnp.mean((out - b["y"]) ** 2),
        metrics={"mae": lambda out, b: jnp.mean(jnp.abs(out - b["y"]))},
    )

Evaluation is exact over a whole split: the loss and every metric are computed for each
example on its own (a batch of one) and averaged with the example's weight, the number of units
its values are means over: the task's ``weight`` (the built-in tasks count their labels, so a
token task averages over tokens and a classifier over examples), else its ``mask`` summed, else 1.
Padding (``mask`` 0, per example or per position) never counts, and a split of any size gives
the same numbers as one pass over it.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxnet import blockwise, optim
from jaxnet.errors import UserError
from jaxnet.models.common import Head

Batch = Mapping[str, Any]
Fn = Callable[[Any, Batch], jnp.ndarray]


@dataclasses.dataclass(frozen=True)
class Task:
    """A loss and metrics over ``(outputs, batch)``, and the batch keys the model is called on.

    ``inputs``: the batch key (or keys, passed in order) given to ``model.apply``. ``loss``: a
    scalar, the mean over the batch, minimised in training. ``metrics``: name -> a scalar mean
    over the batch, logged in training and evaluation. ``eval_loss``: the loss reported in
    evaluation if it differs (e.g. without label smoothing). ``weight``: per-example weight of a
    batch in evaluation, the number of units the example's loss and metrics are means over (e.g.
    its predicted tokens, :func:`positions`; zero for padding); by default ``mask`` summed over
    each example (1 per real example for data with one mask value per example) or 1.
    ``finalize``: derives metrics from the split means (e.g. R^2 from the mean squared error and
    the target's variance); names starting with ``_`` are helpers it may consume.
    ``transform``: a host-side ``(batch, rng) -> batch`` applied to every batch before it goes to
    the devices (masked-LM corruption). ``extra_inputs``: input ids beyond the data's
    vocabulary the model must embed (masked-LM's mask token). ``labels``: the batch key of
    integer class labels that index the outputs' last axis; they are checked against the
    model's number of outputs before the first step. ``keyword_inputs``: batch keys given to the
    model by name when a batch has them (``model(*inputs, segments=..., positions=...)``): the
    language-model tasks name ``segments`` and ``positions``, which rows of packed examples carry
    (:mod:`jaxnet.data.packing`), so any model that takes them keeps its examples apart.
    ``from_features``: the training loss and metrics computed from the model's final hidden states
    and output layer instead of its outputs, ``(features, head, batch) -> (loss, metrics)`` with the
    same values as ``loss`` and ``metrics`` on the logits (the built-in label tasks:
    :func:`jaxnet.blockwise.cross_entropy`, which never holds the whole logits); the train step uses
    it for a model that offers them (:func:`jaxnet.models.adapters.features_apply`), giving the
    model the same ``keyword_inputs``, and ``loss`` on the outputs for any other.
    ``reference``: ``(outputs, batch) -> {key: array}``, entries the steps add to each batch from a
    reference model's outputs on it (the weights the run started from, never differentiated) before
    the loss and metrics read it: DPO's reference log-probabilities (:mod:`jaxnet.preference`).
    """

    inputs: str | tuple[str, ...]
    loss: Fn
    metrics: Mapping[str, Fn] = dataclasses.field(default_factory=dict)
    name: str = "custom"
    eval_loss: Fn | None = None
    weight: Callable[[Batch], jnp.ndarray] | None = None
    finalize: Callable[[dict[str, float]], dict[str, float]] | None = None
    transform: Callable[[dict[str, np.ndarray], np.random.Generator], dict[str, np.ndarray]] | None = None
    extra_inputs: int = 0
    labels: str | None = None
    keyword_inputs: tuple[str, ...] = ()
    from_features: Callable[[jnp.ndarray, Head, Batch], tuple[jnp.ndarray, dict[str, jnp.ndarray]]] | None = None
    reference: Callable[[Any, Batch], dict[str, jnp.ndarray]] | None = None

    def __post_init__(self) -> None:
        keys = (self.inputs,) if isinstance(self.inputs, str) else tuple(self.inputs)
        if not keys or not all(isinstance(k, str) for k in keys):
            raise UserError(f"Task inputs={self.inputs!r}: expected a batch key or a tuple of batch keys, e.g. 'x'")
        object.__setattr__(self, "inputs", keys)
        if not callable(self.loss):
            raise UserError(f"Task loss={self.loss!r} is not a function; expected loss(outputs, batch) -> scalar")
        if not isinstance(self.metrics, Mapping) or not all(callable(f) for f in self.metrics.values()):
            raise UserError("Task metrics must be a dict of name -> metric(outputs, batch) -> scalar")
        if "loss" in self.metrics:
            raise UserError("Task metrics cannot be named 'loss' (the loss is always logged as 'loss')")

    def model_inputs(self, batch: Batch) -> tuple[Any, ...]:
        """The arrays of ``batch`` the model is called on, in order."""
        return tuple(batch[k] for k in self.inputs)

    def model_keywords(self, batch: Batch) -> dict[str, Any]:
        """The arrays of ``batch`` the model is given by name: those of ``keyword_inputs`` it has.

        >>> lm().model_keywords({"tokens": 1, "segments": 2})
        {'segments': 2}
        """
        return {k: batch[k] for k in self.keyword_inputs if k in batch}

    def train_values(self, outputs: Any, batch: Batch) -> tuple[jnp.ndarray, dict[str, jnp.ndarray]]:
        """The training loss and the metrics of one batch."""
        return self.loss(outputs, batch), {k: f(outputs, batch) for k, f in self.metrics.items()}

    def eval_sums(self, outputs: Any, batch: Batch) -> dict[str, jnp.ndarray]:
        """Weighted sums of the loss and every metric over the examples of ``batch``, and ``count``
        (the sum of the weights), so batches add up to exact means over a split."""
        rows = jax.tree.leaves(outputs)[0].shape[0]
        per_row = {k: v for k, v in batch.items() if jnp.ndim(v) and jnp.shape(v)[0] == rows}
        loss = self.eval_loss or self.loss
        fns = {"loss": loss, **self.metrics}

        def one(out: Any, row: dict) -> dict[str, jnp.ndarray]:
            out1 = jax.tree.map(lambda x: x[None], out)
            row1 = {**batch, **jax.tree.map(lambda x: x[None], row)}
            return {k: jnp.asarray(f(out1, row1), jnp.float32) for k, f in fns.items()}

        values = jax.vmap(one)(outputs, per_row)
        if self.weight is not None:
            w = jnp.asarray(self.weight(batch), jnp.float32)
        elif "mask" in batch and jnp.ndim(batch["mask"]) >= 1:
            w = jnp.asarray(batch["mask"], jnp.float32).reshape(rows, -1).sum(-1)
        else:
            w = jnp.ones((rows,), jnp.float32)
        sums = {k: jnp.sum(jnp.where(w > 0, v * w, 0.0)) for k, v in values.items()}
        sums["count"] = jnp.sum(w)
        return sums

    def summarize(self, means: dict[str, float]) -> dict[str, float]:
        """The reported metrics of a split from its means: ``finalize`` applied, helpers dropped."""
        if self.finalize is not None:
            means = {**means, **self.finalize(dict(means))}
        return {k: v for k, v in means.items() if not k.startswith("_")}


# ---------------------------------------------------------------------------------------------
# Losses and metrics the built-in tasks share.


def cross_entropy(
    logits: jnp.ndarray, labels: jnp.ndarray, label_smoothing: float = 0.0, z_loss: float = 0.0
) -> jnp.ndarray:
    """Per-example softmax cross-entropy in float32, with optional label smoothing (spread over the
    ids a padded vocabulary uses: those :func:`~jaxnet.models.common.mask_unused_vocab` masked get
    none) and PaLM's z-loss, ``z_loss * logsumexp(logits)**2`` added."""
    logits = logits.astype(jnp.promote_types(logits.dtype, jnp.float32))
    if optim.off(label_smoothing):  # no one-hot matrix: it costs as much as the softmax for a 10k vocabulary
        loss = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
    else:
        used = logits > jnp.finfo(logits.dtype).min
        targets = jax.nn.one_hot(labels, logits.shape[-1]) * (1.0 - label_smoothing)
        targets = targets + used * (label_smoothing / jnp.sum(used, axis=-1, keepdims=True))
        loss = optax.softmax_cross_entropy(logits, targets)
    if not optim.off(z_loss):
        loss = loss + z_loss * jax.nn.logsumexp(logits, axis=-1) ** 2
    return loss


def hits(logits: jnp.ndarray, labels: jnp.ndarray) -> jnp.ndarray:
    """1.0 where the label's logit is the largest (a tie for the largest counts), else 0.0.

    The same as ``argmax(logits) == labels`` except on exact ties, and cheaper: one max over the
    classes (which the softmax also needs) instead of an index search over a large vocabulary.
    """
    label_logit = jnp.take_along_axis(logits, labels[..., None], axis=-1)[..., 0]
    return (label_logit >= logits.max(-1)).astype(jnp.float32)


def expand_mask(mask: Any, shape: tuple[int, ...]) -> Any:
    """``mask`` (one value per example, or per position: the leading axes of ``shape``) spread over
    an array of ``shape``, so that a mask of one value per example covers all of its positions.

    Numpy broadcasting aligns trailing axes, which would pair an example's mask ``(rows,)`` with
    the positions ``(rows, length)`` wrongly; this aligns leading axes::

        expand_mask(np.array([1, 0]), (2, 3))   # [[1, 1, 1], [0, 0, 0]]
    """
    xp = jnp if isinstance(mask, jax.Array) else np
    extra = len(shape) - xp.ndim(mask)
    if extra < 0:
        raise UserError(
            f"the batch's mask has shape {tuple(xp.shape(mask))}, more axes than the values it masks {tuple(shape)}; "
            "give one mask value per example or per position"
        )
    return xp.broadcast_to(xp.reshape(mask, (*xp.shape(mask), *(1,) * extra)), shape)


def _masked_mean(values: jnp.ndarray, batch: Batch) -> jnp.ndarray:
    """Mean of ``values`` over the positions ``batch["mask"]`` marks (all of them without one); a
    mask of one value per example marks all of the example's positions."""
    if "mask" not in batch:
        return values.mean()
    mask = expand_mask(jnp.asarray(batch["mask"]), values.shape).astype(values.dtype)
    return jnp.sum(values * mask) / jnp.maximum(jnp.sum(mask), 1.0)


def positions(batch: Batch, key: str) -> jnp.ndarray:
    """How many positions of ``batch[key]`` each example has that count (``mask`` marks them: one
    value per example or per position): the evaluation weight of a task whose metrics are means
    over those positions, e.g. the predicted tokens of a language model, one per example for a
    classifier."""
    labels = jnp.asarray(batch[key])
    rows = labels.shape[0]
    if "mask" in batch:
        counted = expand_mask(jnp.asarray(batch["mask"], jnp.float32), labels.shape)
    else:
        counted = jnp.ones(labels.shape, jnp.float32)
    return counted.reshape(rows, -1).sum(-1)


#: ``loss_from`` of the built-in label tasks: where their training loss is computed from.
LOSS_FROM = ("auto", "features", "logits")


def _label_task(
    name: str,
    inputs: str,
    target: str,
    label_smoothing: float,
    z_loss: float = 0.0,
    loss_from: str = "auto",
    loss_block: int = 0,
    **extra: Any,
) -> Task:
    if loss_from not in LOSS_FROM:
        raise UserError(f"loss_from={loss_from!r}: choose one of {', '.join(LOSS_FROM)}")

    def loss(logits: jnp.ndarray, batch: Batch) -> jnp.ndarray:
        return _masked_mean(cross_entropy(logits, batch[target], label_smoothing, z_loss), batch)

    def plain_loss(logits: jnp.ndarray, batch: Batch) -> jnp.ndarray:
        return _masked_mean(cross_entropy(logits, batch[target]), batch)

    def accuracy(logits: jnp.ndarray, batch: Batch) -> jnp.ndarray:
        return _masked_mean(hits(logits, batch[target]), batch)

    def from_features(features: jnp.ndarray, head: Head, batch: Batch) -> tuple[jnp.ndarray, dict[str, jnp.ndarray]]:
        labels = batch[target]
        weights = expand_mask(jnp.asarray(batch["mask"], jnp.float32), labels.shape) if "mask" in batch else None
        loss_sum, hit_sum = blockwise.cross_entropy(
            features, head, labels, weights, label_smoothing=label_smoothing, z_loss=z_loss, block=loss_block
        )
        count = jnp.maximum(jnp.sum(weights), 1.0) if weights is not None else labels.size
        return loss_sum / count, {"accuracy": hit_sum / count}

    return Task(
        inputs=inputs,
        loss=loss,
        metrics={"accuracy": accuracy},
        name=name,
        eval_loss=None if optim.off(label_smoothing) and optim.off(z_loss) else plain_loss,
        weight=lambda batch: positions(batch, target),  # the loss and accuracy are means over the labels
        labels=target,
        from_features=None if loss_from == "logits" else from_features,
        **extra,
    )


def classification(
    inputs: str = "image",
    target: str = "label",
    label_smoothing: float = 0.0,
    *,
    z_loss: float = 0.0,
    loss_from: str = "auto",
    loss_block: int = 0,
) -> Task:
    """Softmax cross-entropy over integer classes; ``accuracy`` metric. ``z_loss``, ``loss_from``
    and ``loss_block`` as for :func:`lm`."""
    return _label_task("classification", inputs, target, label_smoothing, z_loss, loss_from, loss_block)


#: The batch keys of packed rows a language model is given by name (see :class:`Task`).
PACKED_INPUTS = ("segments", "positions")


def lm(
    label_smoothing: float = 0.0,
    per_token: Callable[[float], dict[str, float]] | None = None,
    *,
    z_loss: float = 0.0,
    loss_from: str = "auto",
    loss_block: int = 0,
) -> Task:
    """Next-token language modelling: cross-entropy of ``targets`` given ``tokens`` at every
    position (``mask`` marks the positions that count); ``accuracy`` of the next token.
    ``per_token(mean loss)`` adds metrics such as perplexity or bits per character. Packed rows'
    ``segments`` and ``positions`` go to the model by name.

    ``z_loss``: PaLM's ``z_loss * logsumexp(logits)**2`` added to each position's training loss
    (evaluation reports the cross-entropy alone). ``loss_from``: ``auto`` computes the training
    loss from the model's final hidden states and output layer in blocks, never holding the whole
    logits (:func:`jaxnet.blockwise.cross_entropy`), where the model offers them (the Transformer),
    from its logits otherwise; ``features`` the same (a model that cannot is an error when the run
    is built); ``logits`` always from the logits. ``loss_block``: tokens of one device per block (0 =
    automatic). Evaluation, ``predict`` and sampling always see the logits::

        task = jaxnet.tasks.lm(z_loss=1e-4, loss_block=2048)
    """
    finalize = (lambda means: per_token(means["loss"])) if per_token is not None else None
    return _label_task(
        "lm",
        "tokens",
        "targets",
        label_smoothing,
        z_loss,
        loss_from,
        loss_block,
        finalize=finalize,
        keyword_inputs=PACKED_INPUTS,
    )


def masked_lm(
    vocab_size: int,
    mask_rate: float = 0.15,
    label_smoothing: float = 0.0,
    *,
    z_loss: float = 0.0,
    loss_from: str = "auto",
    loss_block: int = 0,
) -> Task:
    """BERT's masked language modelling over token windows.

    ``mask_rate`` of the positions are chosen; of those 80 % become the mask token (id
    ``vocab_size``), 10 % a random token and 10 % stay as they are; the model predicts the
    original token at the chosen positions only (``mask``). The corruption is drawn on the host
    from the batch's own random stream, so it is the same on a resumed run. ``z_loss``,
    ``loss_from`` and ``loss_block`` as for :func:`lm`.
    """

    def corrupt(batch: dict[str, np.ndarray], rng: np.random.Generator) -> dict[str, np.ndarray]:
        tokens = batch["tokens"]
        valid = expand_mask(batch["mask"] > 0, tokens.shape) if "mask" in batch else np.ones(tokens.shape, bool)
        draw = rng.random(tokens.shape)
        chosen = (draw < mask_rate) & valid
        kind = rng.random(tokens.shape)
        random_tokens = rng.integers(0, vocab_size, size=tokens.shape, dtype=tokens.dtype)
        corrupted = np.where(chosen & (kind < 0.8), vocab_size, tokens)
        corrupted = np.where(chosen & (kind >= 0.8) & (kind < 0.9), random_tokens, corrupted).astype(tokens.dtype)
        out = {k: v for k, v in batch.items() if k not in ("tokens", "targets", "mask", "reset")}
        return {**out, "tokens": corrupted, "targets": tokens, "mask": chosen.astype(np.float32)}

    return _label_task(
        "masked_lm",
        "tokens",
        "targets",
        label_smoothing,
        z_loss,
        loss_from,
        loss_block,
        transform=corrupt,
        extra_inputs=1,
        keyword_inputs=PACKED_INPUTS,
    )


def regression(inputs: str = "x", target: str = "y") -> Task:
    """Mean squared error against a float target; ``mse``, ``mae`` and ``r2`` metrics.

    R^2 = 1 - MSE / Var(target) over the whole split, from the split means of the squared error,
    the target and its square (exact, whatever the batch size).
    """

    def error(out: jnp.ndarray, batch: Batch) -> jnp.ndarray:
        y = batch[target]
        return out.reshape(y.shape).astype(jnp.float32) - y.astype(jnp.float32)

    def mse(out: jnp.ndarray, batch: Batch) -> jnp.ndarray:
        return jnp.mean(error(out, batch) ** 2)

    def r2(means: dict[str, float]) -> dict[str, float]:
        variance = means["_y2"] - means["_y"] ** 2
        return {"r2": 1.0 - means["mse"] / variance if variance > 0 else float("nan")}

    return Task(
        inputs=inputs,
        loss=mse,
        metrics={
            "mse": mse,
            "mae": lambda out, b: jnp.mean(jnp.abs(error(out, b))),
            "_y": lambda out, b: jnp.mean(b[target].astype(jnp.float32)),
            "_y2": lambda out, b: jnp.mean(b[target].astype(jnp.float32) ** 2),
        },
        name="regression",
        finalize=r2,
    )


BUILT_IN = ("classification", "lm", "masked_lm", "regression")


def from_name(
    name: str,
    *,
    vocab_size: int = 0,
    mask_rate: float = 0.15,
    label_smoothing: float = 0.0,
    per_token: Callable[[float], dict[str, float]] | None = None,
    z_loss: float = 0.0,
    loss_from: str = "auto",
    loss_block: int = 0,
) -> Task:
    """The built-in task ``name`` set up for the data (``vocab_size`` for masked_lm, ``per_token``
    metrics for lm) and the loss settings (see :func:`lm`)."""
    loss = dict(z_loss=z_loss, loss_from=loss_from, loss_block=loss_block)
    if name == "classification":
        return classification(label_smoothing=label_smoothing, **loss)
    if name == "lm":
        return lm(label_smoothing, per_token, **loss)
    if name == "masked_lm":
        return masked_lm(vocab_size, mask_rate, label_smoothing, **loss)
    if name == "regression":
        return regression()
    near = difflib.get_close_matches(name, BUILT_IN, n=1)
    hint = f"did you mean {near[0]}? " if near else ""
    raise UserError(
        f"unknown task {name!r}; {hint}the tasks are {', '.join(BUILT_IN)}, or define task(cfg) in the experiment file"
    )


def loss_settings(cfg: Any) -> dict[str, Any]:
    """The ``train.*`` keys of the built-in tasks' loss: ``label_smoothing``, ``z_loss``,
    ``loss_from`` and ``loss_block``, as :func:`from_name` takes them."""
    t = cfg.train
    return dict(label_smoothing=t.label_smoothing, z_loss=t.z_loss, loss_from=t.loss_from, loss_block=t.loss_block)


def builtin(cfg: Any, default: str, allowed: tuple[str, ...], kind: str, **kwargs: Any) -> Task:
    """The built-in task ``cfg.task`` names (``default`` if unset), if it suits data of ``kind``."""
    name = cfg.task or default
    if cfg.train.objective:  # a preference corpus's task comes from jaxnet.preference, not from here
        raise UserError(
            f"train.objective={cfg.train.objective} trains on pairs of a chosen and a rejected reply, which "
            f"data.name={cfg.data.name} does not hold: prepare them with jaxnet prepare preference FILE... --out DIR "
            "and train with data.name=tokens data.path=DIR"
        )
    if name in BUILT_IN and name not in allowed:
        raise UserError(
            f"task={name} does not fit {kind} data (data.name={cfg.data.name}); use task={' or task='.join(allowed)}"
        )
    return from_name(name, **loss_settings(cfg), **kwargs)


def for_batch(batch: Batch) -> Task:
    """The task a built-in batch implies: next-token LM for ``tokens``, classification otherwise."""
    return lm() if "tokens" in batch else classification()


def check_inputs(task: Task, batch: Batch) -> None:
    """A one-line error if the batch lacks a key the task feeds to the model."""
    for key in task.inputs:
        if key not in batch:
            raise UserError(
                f"task {task.name!r} feeds batch key {key!r} to the model, but the data has only "
                f"{', '.join(sorted(batch))}; set the task's inputs= to one of them"
            )


def check(task: Task, model_name: str, outputs: Any, batch: Batch) -> None:
    """One-line errors for a task that does not fit the data or the model's outputs, found by
    tracing the loss and metrics on abstract values (nothing runs)."""
    check_inputs(task, batch)

    abstract_batch = {k: jax.ShapeDtypeStruct(np.shape(v), np.asarray(v).dtype) for k, v in batch.items()}
    if task.reference is not None:  # what the steps add from the reference model (its outputs are shaped as ours)
        abstract_batch = {**abstract_batch, **jax.eval_shape(task.reference, outputs, abstract_batch)}
    try:
        loss, metrics = jax.eval_shape(task.train_values, outputs, abstract_batch)
    except KeyError as e:
        raise UserError(
            f"task {task.name!r}: its loss or a metric reads batch key {e.args[0]!r}, which the data lacks "
            f"(it has {', '.join(sorted(batch))})"
        ) from None
    except UserError:
        raise
    except Exception as e:  # a shape or type error inside the user's function, found before any step
        message = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise UserError(
            f"task {task.name!r}: its loss or metrics fail on the outputs of {model_name} "
            f"({_shapes(outputs)}): {type(e).__name__}: {message}"
        ) from None
    if jnp.shape(loss) != ():
        raise UserError(
            f"task {task.name!r}: the loss returns shape {tuple(jnp.shape(loss))}, not a scalar; "
            "return the mean over the batch (e.g. jnp.mean(...))"
        )
    if not isinstance(metrics, dict):
        raise UserError(f"task {task.name!r}: metrics must be a dict of name -> scalar function")
    for name, value in metrics.items():
        if jnp.shape(value) != ():
            raise UserError(
                f"task {task.name!r}: metric {name!r} returns shape {tuple(jnp.shape(value))}, not a scalar; "
                "return the mean over the batch"
            )


def check_labels(task: Task, model_name: str, outputs: Any, batch: Batch, dataset: Any) -> None:
    """A one-line error if the data's class labels (``task.labels``) fall outside the model's
    outputs, which would otherwise train to NaN. The range comes from the dataset's
    ``label_range(key)`` (the labels are in memory; data that cannot say cheaply is not checked)."""
    key = task.labels
    leaves = jax.tree.leaves(outputs)
    label_range = getattr(dataset, "label_range", None)
    if key is None or key not in batch or len(leaves) != 1 or label_range is None:
        return
    if leaves[0].ndim != np.ndim(batch[key]) + 1:  # not one output per class: the task's own checks apply
        return
    span = label_range(key)
    if span is None:
        return
    low, high = span
    outputs_n = leaves[0].shape[-1] - task.extra_inputs
    if low < 0:
        raise UserError(
            f"labels {key!r} run {low}..{high}, but class labels must be 0..N-1 (one output of the model per class); "
            "relabel them"
        )
    if high >= outputs_n:
        plural = "output" if outputs_n == 1 else "outputs"
        raise UserError(
            f"labels {key!r} run {low}..{high}, but model {model_name} has {outputs_n} {plural} ({_shapes(outputs)}); "
            f"task {task.name!r} needs one output per class: give the model {high + 1} outputs "
            f"(a built-in model: num_classes={high + 1})"
        )


def _shapes(tree: Any) -> str:
    return ", ".join(f"{x.dtype}{list(x.shape)}" for x in jax.tree.leaves(tree))


__all__ = [
    "BUILT_IN",
    "LOSS_FROM",
    "Task",
    "check",
    "check_inputs",
    "check_labels",
    "classification",
    "cross_entropy",
    "builtin",
    "expand_mask",
    "for_batch",
    "from_name",
    "hits",
    "lm",
    "loss_settings",
    "masked_lm",
    "positions",
    "regression",
]

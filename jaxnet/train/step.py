"""Pure training and evaluation steps, generic over the task (:mod:`jaxnet.tasks`).

``train_step(state, batch) -> (state, metrics)`` and ``eval_step(state, batch, carry) -> (sums,
carry)`` are plain functions of their arguments; the runner jit-compiles each once. A batch is
a dict of arrays; the task says which keys the model reads and computes the loss and metrics
from the model's outputs and the batch. Without a task, a batch with ``tokens`` is next-token
language modelling and any other is classification of ``image`` by ``label``.

A model that keeps state across batches (the LSTM) holds it in the ``carry`` collection of
``state.model_state``; a batch with ``reset`` = 1 (the first of an epoch) starts it from zeros.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from jaxnet import tasks
from jaxnet.errors import UserError
from jaxnet.models import adapters
from jaxnet.models.common import LOSSES, STATS, added_losses
from jaxnet.tasks import Task, cross_entropy, hits  # noqa: F401  (re-exported)
from jaxnet.train.state import TrainState

Batch = dict[str, jnp.ndarray]
Metrics = dict[str, jnp.ndarray]

#: What every train step logs beside the task's metrics (:func:`step_metrics`).
STEP_METRICS = ("loss", "grad_norm", "nonfinite", "first_nonfinite")
NO_STEP = 2**31 - 1  # ``first_nonfinite`` of an interval in which every update was finite
DELAY_STREAM = 2**31 - 1  # random delays use fold_in(rng, this): a number no step's keys use


def add_metrics(total: Metrics, new: Metrics) -> Metrics:
    """Running totals of metric dicts (train steps, evaluation batches): sums, except
    ``first_nonfinite`` (the minimum)."""
    return {k: jnp.minimum(total[k], v) if k == "first_nonfinite" else total[k] + v for k, v in new.items()}


accumulate = functools.partial(jax.jit, donate_argnums=0)(add_metrics)
accumulate.__doc__ = "Running totals of metric dicts, on the device (:func:`add_metrics`, jitted, ``total`` donated)."


def metric_zeros(metrics: Metrics) -> Metrics:
    """Totals of no steps, shaped like ``metrics``: zeros, and :data:`NO_STEP` for ``first_nonfinite``."""
    return {k: jnp.full(v.shape, NO_STEP if k == "first_nonfinite" else 0, v.dtype) for k, v in metrics.items()}


def make_summed_step(
    train_step: Callable[[TrainState, Batch], tuple[TrainState, Metrics]],
) -> Callable[[TrainState, Batch, Metrics], tuple[TrainState, Metrics]]:
    """Build ``summed_step(state, batch, totals) -> (state, totals + metrics)``: one ``train_step``
    with its metrics added to the running ``totals`` in the same program, as :func:`accumulate`
    would add them (start from :func:`metric_zeros`).

    The runner steps with this one when it runs one step per call: the totals then cost no
    program of their own. A separate :func:`accumulate` after every step is one more dispatch and
    one more wake-up of the CPU's threads, between steps: the LSTM benchmark case's runner ran
    at 0.93 of the hand-written loop with it and 0.985 without (``jaxnet bench``, 2 cores,
    benchmarks/results/cpu-2026-11-28-avx512-evening-9rounds.json and ``-night.json``).
    """

    def summed_step(state: TrainState, batch: Batch, totals: Metrics) -> tuple[TrainState, Metrics]:
        state, metrics = train_step(state, batch)
        return state, add_metrics(totals, metrics)

    summed_step.__name__ = summed_step.__qualname__ = "train_step"  # the program's name in JAX's logs
    return summed_step


def make_multi_step(
    train_step: Callable[[TrainState, Batch], tuple[TrainState, Metrics]],
) -> Callable[[TrainState, Batch, Metrics], tuple[TrainState, Metrics]]:
    """Build ``multi_step(state, batches, totals) -> (state, totals)``: ``train_step`` on each batch
    along the leading axis of ``batches`` in turn, in one program (a ``lax.scan``), so K steps cost
    one dispatch and one host round trip (``train.steps_per_call``).

    Each step's metrics are added to ``totals`` in step order, exactly as calling ``train_step``
    K times and adding its metrics up with :func:`accumulate` does; start from
    :func:`metric_zeros`. For example, 4 steps on 4 stacked batches::

        multi_step = jax.jit(make_multi_step(train_step))
        state, totals = multi_step(state, stacked, metric_zeros(metrics))
    """

    summed_step = make_summed_step(train_step)

    def multi_step(state: TrainState, batches: Batch, totals: Metrics) -> tuple[TrainState, Metrics]:
        def one(carry: tuple, batch: Batch) -> tuple:
            state, totals = carry
            return summed_step(state, batch, totals), None

        # Unrolled where the step convolves: XLA on a CPU runs a convolution inside a while loop
        # many times slower than in straight-line code (the ConvNet's 5-step call: 690 against 32 ms
        # a step), at the cost of K times the compile. Other steps stay in the loop, which runs as
        # fast and compiles once (the Transformer case's 5-step call: 186-189 ms a step either way,
        # 4 s to compile against 13 s unrolled). One trial by hand each, on the 2-core EPYC.
        first = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape[1:], x.dtype), batches)
        unroll = convolves(summed_step, state, first, totals)
        (state, totals), _ = jax.lax.scan(one, (state, totals), batches, unroll=unroll)
        return state, totals

    return multi_step


def convolves(fn: Callable[..., Any], *args: Any) -> bool:
    """Whether ``fn(*args)`` computes a convolution (``args`` may be tracers: only shapes are read).

    Reads the printed jaxpr, which shows the programs nested in it too (jit, scan, custom
    derivatives), rather than walking equations: the parameters that hold nested jaxprs differ
    from one primitive and JAX version to another."""
    shapes = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), args)
    return "conv_general_dilated" in str(jax.make_jaxpr(fn)(*shapes))


def task_of(task: Task | None, batch: Batch) -> Task:
    """``task``, or the built-in one a batch implies (:func:`jaxnet.tasks.for_batch`)."""
    return task if task is not None else tasks.for_batch(batch)


def reset_carry(model_state: dict, reset: jnp.ndarray) -> dict:
    """``model_state`` with its ``carry`` collection zeroed where ``reset`` is true."""
    if "carry" not in model_state:
        return model_state
    carry = jax.tree.map(lambda c: jnp.where(reset, jnp.zeros_like(c), c), model_state["carry"])
    return {**model_state, "carry": carry}


def with_reference(task: Task, reference: Callable | None, variables: dict, batch: Batch) -> Batch:
    """``batch`` with the entries ``task.reference`` takes from the reference model's outputs on it
    (:func:`jaxnet.models.adapters.reference_apply`), never differentiated; ``batch`` itself for a
    task without a reference."""
    if task.reference is None:
        return batch
    if reference is None:
        raise UserError(
            f"task {task.name!r} compares the model with a reference model, which this model does not keep: wrap it "
            "in jaxnet.models.adapters.reference.Reference (the runner does) or train LoRA adapters"
        )
    outputs = reference(variables, *task.model_inputs(batch), **task.model_keywords(batch))
    return {**batch, **jax.lax.stop_gradient(task.reference(outputs, batch))}


def make_grad_fn(model: nn.Module, task: Task | None = None) -> Callable:
    """``grad_fn(params, model_state, batch, rng) -> ((loss, (model_state, metrics)), grads)``:
    the task's loss of ``batch`` in training mode, its metrics, and the gradient of the loss with
    respect to ``params``.

    A task with ``from_features`` on a model that offers its final hidden states and output layer
    (:func:`jaxnet.models.adapters.features_apply`: the Transformer) computes them from those,
    never holding the whole logits (the built-in cross-entropy tasks by default); any other pair,
    from the model's outputs.

    Losses the model adds (:func:`jaxnet.models.common.add_loss`: a router's load balance) are
    added to the task's, and each is a metric of its name; the loss returned (and logged as
    ``loss``) is their sum, the objective. Figures it reports (:func:`~jaxnet.models.common.add_stat`)
    are metrics too."""
    features_apply = adapters.features_apply(model)
    reference = adapters.reference_apply(model)

    def loss_fn(params: Any, model_state: dict, batch: Batch, rng: jax.Array) -> tuple[jnp.ndarray, tuple]:
        t = task_of(task, batch)
        variables = {"params": params, **model_state}
        batch = with_reference(t, reference, variables, batch)
        mutable = [*model_state, LOSSES, STATS]
        kwargs = dict(**t.model_keywords(batch), train=True, rngs={"dropout": rng}, mutable=mutable)
        if t.from_features is not None and features_apply is not None:
            (features, head), new_model_state = features_apply(variables, *t.model_inputs(batch), **kwargs)
            loss, metrics = t.from_features(features, head, batch)
        else:
            outputs, new_model_state = model.apply(variables, *t.model_inputs(batch), **kwargs)
            loss, metrics = t.train_values(outputs, batch)
        new_model_state = dict(new_model_state)
        added = added_losses(new_model_state.pop(LOSSES, {}))
        stats = added_losses(new_model_state.pop(STATS, {}))
        clash = [name for name in [*added, *stats] if name in metrics or name in STEP_METRICS]
        if clash:
            raise UserError(
                f"the model adds a loss or figure named {clash[0]!r}, which is also a metric of task {t.name!r}; "
                "give it another name"
            )
        if added:
            loss = loss + sum(added.values())
        metrics = {**metrics, **added, **stats}
        return loss, (new_model_state, metrics)

    return jax.value_and_grad(loss_fn, has_aux=True)


def split_rows(batch: Batch, parts: int) -> Batch:
    """Split every array of ``batch`` into ``parts`` groups of rows along a new leading axis: group
    ``i`` holds rows ``i, i + parts, i + 2 * parts, ...``, so with the batch split across devices
    every device keeps computing on its own rows."""
    return jax.tree.map(lambda x: x.reshape(-1, parts, *x.shape[1:]).swapaxes(0, 1), batch)


def join_rows(groups: Any) -> Any:
    """The inverse of :func:`split_rows`."""
    return jax.tree.map(lambda x: x.swapaxes(0, 1).reshape(-1, *x.shape[2:]), groups)


def is_finite(loss: jnp.ndarray, grad_norm: jnp.ndarray) -> jnp.ndarray:
    """Whether an update is usable: its loss and gradient norm are neither NaN nor infinite."""
    return jnp.isfinite(loss) & jnp.isfinite(grad_norm)


def keep_if(finite: jnp.ndarray, new: Any, old: Any) -> Any:
    """``new`` where ``finite``, else ``old``, leaf by leaf (an update rejected inside the step)."""
    return jax.tree.map(lambda n, o: jnp.where(finite, n, o), new, old)


def step_metrics(loss: jnp.ndarray, metrics: Metrics, grad_norm: jnp.ndarray, step: jnp.ndarray) -> Metrics:
    """The metrics of one train step (see :func:`make_train_step`); ``step`` is the state's step
    before the update. Loss, the task's metrics and gradient norm are zeroed if the loss or the
    gradient norm is not finite."""
    finite = is_finite(loss, grad_norm)
    zero_unless_finite = lambda x: jnp.where(finite, x, jnp.zeros_like(x)).astype(jnp.float32)
    return {
        "loss": zero_unless_finite(loss),
        **{k: zero_unless_finite(v) for k, v in metrics.items()},
        "grad_norm": zero_unless_finite(grad_norm),
        "nonfinite": (~finite).astype(jnp.int32),
        "first_nonfinite": jnp.where(finite, NO_STEP, step + 1).astype(jnp.int32),
    }


def make_train_step(
    model: nn.Module,
    tx: optax.GradientTransformation,
    *,
    grad_accum: int = 1,
    task: Task | None = None,
    axis_name: str | tuple[str, ...] | None = None,
    skip_nonfinite: bool = False,
    accum_parallel: bool = False,
) -> Callable[[TrainState, Batch], tuple[TrainState, Metrics]]:
    """Build ``train_step``: forward, backward, one optimizer update.

    With ``grad_accum > 1`` the batch is split into that many micro-batches whose gradients are
    averaged in float32 (a ``lax.scan``, so memory holds one micro-batch of activations). The
    update equals one step on the whole batch, except that BatchNorm normalises each micro-batch
    separately and updates its running statistics once per micro-batch.
    Micro-batch ``i`` takes rows ``i, i + k, i + 2k, ...`` (k = ``grad_accum``): with the batch
    split across devices, every device then keeps computing on its own rows.
    ``accum_parallel`` unrolls the scan: the micro-batches' gradients become independent operations,
    which XLA's CPU runtime runs side by side on its threads (one micro-batch's batched products,
    such as attention's, run on one thread each), at the memory of all of them; the same numbers.

    ``axis_name`` makes it the per-device step of ``parallel.mode=replicas`` (run inside
    ``jax.shard_map`` over those mesh axes): each device computes the gradient of its own rows,
    the gradients and metrics are averaged with ``lax.pmean`` and every device applies the same
    update. Each device draws its own dropout masks.

    Metrics: ``loss``, the task's metrics and ``grad_norm`` (0 for a step whose loss or gradient norm
    is NaN or Inf), ``nonfinite`` (1 for such a step) and ``first_nonfinite`` (the number of such
    an update, else :data:`NO_STEP`); add them up with :func:`accumulate`. With
    ``skip_nonfinite`` such an update is rejected inside the step: parameters, optimizer and
    model state stay as they were and only the step counter moves on.
    """

    grad_fn = make_grad_fn(model, task)

    def train_step(state: TrainState, batch: Batch) -> tuple[TrainState, Metrics]:
        rng = jax.random.fold_in(state.rng, state.step)
        params = state.params
        if axis_name is not None:
            rng = jax.random.fold_in(rng, jax.lax.axis_index(axis_name))
            # Differentiate this device's copy: its gradient is then the gradient of its own rows,
            # averaged across devices explicitly below.
            params = jax.lax.pcast(params, axis_name, to="varying")
        model_state = state.model_state
        if "reset" in batch:
            model_state = reset_carry(model_state, batch["reset"])
        if grad_accum == 1:
            (loss, (model_state, metrics)), grads = grad_fn(params, model_state, batch, rng)
        else:
            batch = {k: v for k, v in batch.items() if k != "reset"}
            micro_batches = split_rows(batch, grad_accum)

            def micro_step(carry: tuple, inputs: tuple) -> tuple:
                grads_sum, model_state = carry
                index, micro_batch = inputs
                (loss, (model_state, metrics)), grads = grad_fn(
                    params, model_state, micro_batch, jax.random.fold_in(rng, index)
                )
                grads_sum = jax.tree.map(lambda total, g: total + g.astype(total.dtype), grads_sum, grads)
                return (grads_sum, model_state), (loss, metrics)

            zeros = jax.tree.map(lambda p: jnp.zeros_like(p, jnp.promote_types(p.dtype, jnp.float32)), params)
            (grads, model_state), (losses, metrics) = jax.lax.scan(
                micro_step,
                (zeros, model_state),
                (jnp.arange(grad_accum), micro_batches),
                unroll=grad_accum if accum_parallel else 1,
            )
            grads = jax.tree.map(lambda g, p: (g / grad_accum).astype(p.dtype), grads, state.params)
            loss, metrics = losses.mean(), jax.tree.map(jnp.mean, metrics)
        if axis_name is not None:
            grads, loss, metrics = jax.lax.pmean((grads, loss, metrics), axis_name)

        updates, opt_state = tx.update(grads, state.opt_state, state.params)
        grad_norm = optax.global_norm(grads)
        new_state = state.replace(
            step=state.step + 1,
            params=optax.apply_updates(state.params, updates),
            opt_state=opt_state,
            model_state=model_state,
        )
        if skip_nonfinite:
            finite = is_finite(loss, grad_norm)
            new_state = new_state.replace(
                params=keep_if(finite, new_state.params, state.params),
                opt_state=keep_if(finite, new_state.opt_state, state.opt_state),
                model_state=keep_if(finite, new_state.model_state, state.model_state),
            )
        return new_state, step_metrics(loss, metrics, grad_norm, state.step)

    return train_step


def delay(rng: jax.Array, update: jnp.ndarray, staleness: int, randomised: bool) -> jnp.ndarray:
    """How many updates old the parameters are on which the gradient of ``update`` (1-based) is
    computed under asynchronous SGD: ``staleness``, or with ``randomised`` a draw from 0 ..
    ``staleness`` that depends only on ``rng`` and ``update``; never more than ``update - 1``
    (there is nothing older than the initial parameters)."""
    if randomised:
        drawn = jax.random.randint(jax.random.fold_in(rng, update), (), 0, staleness + 1)
    else:
        drawn = jnp.asarray(staleness)
    return jnp.minimum(drawn, update - 1).astype(jnp.int32)


def _split_carry(model_state: dict, workers: int) -> tuple[dict, Any]:
    """``model_state`` without its ``carry`` collection, and the carry's rows split per worker."""
    shared = {k: v for k, v in model_state.items() if k != "carry"}
    return shared, split_rows(model_state["carry"], workers) if "carry" in model_state else None


def make_async_train_step(
    model: nn.Module,
    tx: optax.GradientTransformation,
    *,
    workers: int,
    staleness: int,
    randomised: bool = False,
    task: Task | None = None,
    skip_nonfinite: bool = False,
) -> Callable[[TrainState, Batch], tuple[TrainState, Metrics]]:
    """Build the train step of asynchronous SGD with ``workers`` simulated workers.

    The model of asynchrony: each step splits its batch into ``workers`` shards (rows as in
    :func:`split_rows`) and applies one update per shard, in worker order, to the shared
    parameters. Update ``u`` (counted from 1 over the whole run, ``workers`` per step) applies
    the gradient of its shard computed on the parameters as they were ``d`` updates earlier,
    after update ``u - 1 - d``, where ``d`` = :func:`delay` (``staleness``, or with
    ``randomised`` a deterministic draw from 0 .. ``staleness``, which models workers of unequal
    speed). No update waits for another: a worker's gradient is as stale as the slowest read
    allows. ``staleness = workers - 1`` is what equally fast workers sharing the parameters
    without locks would see. With one worker and no staleness it is synchronous SGD.

    The last ``staleness + 1`` versions of the parameters are kept in ``state.workers["history"]``
    (version ``v`` in slot ``v % (staleness + 1)``), so a resumed run continues exactly. BatchNorm
    statistics are shared and updated by every worker in turn; an LSTM's carried state is split
    by rows like the batch. Metrics are the means over the step's updates; with
    ``skip_nonfinite`` an update whose loss or gradient is not finite is rejected.
    """
    grad_fn = make_grad_fn(model, task)
    slots = staleness + 1

    def train_step(state: TrainState, batch: Batch) -> tuple[TrainState, Metrics]:
        rng = jax.random.fold_in(state.rng, state.step)
        delay_rng = jax.random.fold_in(state.rng, DELAY_STREAM)
        model_state = state.model_state
        if "reset" in batch:
            model_state = reset_carry(model_state, batch["reset"])
        shared, carries = _split_carry(model_state, workers)
        shards = split_rows({k: v for k, v in batch.items() if k != "reset"}, workers)

        def update(carry: tuple, inputs: tuple) -> tuple:
            params, opt_state, shared, history = carry
            worker, shard, worker_carry = inputs
            u = state.step * workers + worker + 1
            version = u - 1 - delay(delay_rng, u, staleness, randomised)
            stale = jax.tree.map(lambda h: h[version % slots], history)
            worker_state = shared if worker_carry is None else {**shared, "carry": worker_carry}
            worker_rng = rng if workers == 1 else jax.random.fold_in(rng, worker)
            (loss, (worker_state, metrics)), grads = grad_fn(stale, worker_state, shard, worker_rng)
            updates, new_opt_state = tx.update(grads, opt_state, params)
            new_params = optax.apply_updates(params, updates)
            grad_norm = optax.global_norm(grads)
            new_carry = worker_state.pop("carry", None)
            if skip_nonfinite:
                finite = is_finite(loss, grad_norm)
                new_params, new_opt_state = (
                    keep_if(finite, new_params, params),
                    keep_if(finite, new_opt_state, opt_state),
                )
                worker_state = keep_if(finite, worker_state, shared)
                if new_carry is not None:
                    new_carry = keep_if(finite, new_carry, worker_carry)
            history = jax.tree.map(lambda h, p: h.at[u % slots].set(p), history, new_params)
            return (new_params, new_opt_state, worker_state, history), (loss, metrics, grad_norm, new_carry)

        (params, opt_state, shared, history), (losses, metrics, norms, carries) = jax.lax.scan(
            update,
            (state.params, state.opt_state, shared, state.workers["history"]),
            (jnp.arange(workers), shards, carries),
            unroll=True,  # a few workers: straight-line code runs several times faster than a loop on CPU
        )
        model_state = shared if carries is None else {**shared, "carry": join_rows(carries)}
        new_state = state.replace(
            step=state.step + 1,
            params=params,
            opt_state=opt_state,
            model_state=model_state,
            workers={"history": history},
        )
        return new_state, step_metrics(losses.mean(), jax.tree.map(jnp.mean, metrics), norms.mean(), state.step)

    return train_step


def make_local_train_step(
    model: nn.Module,
    tx: optax.GradientTransformation,
    *,
    workers: int,
    local_steps: int,
    task: Task | None = None,
    skip_nonfinite: bool = False,
) -> Callable[[TrainState, Batch], tuple[TrainState, Metrics]]:
    """Build the train step of local SGD (periodic averaging) with ``workers`` simulated workers.

    Each worker keeps its own copy of the parameters and optimizer state
    (``state.workers["params"]`` and ``["opt_state"]``, stacked along a leading worker axis) and
    takes one update per step on its shard of the batch (rows as in :func:`split_rows`), without
    communicating. Every ``local_steps`` steps the copies (parameters and optimizer moments) are
    replaced by their mean: one exchange instead of one per step. ``state.params`` is always the
    mean of the copies, the model that is evaluated and checkpointed for ``jaxnet eval``. With
    ``local_steps=1`` and an optimizer that is linear in the gradient (SGD with or without
    momentum, no clipping) this is synchronous data-parallel SGD on the whole batch.

    BatchNorm statistics are computed per worker and averaged every step; an LSTM's carried
    state is split by rows like the batch. With ``skip_nonfinite`` a worker whose update is not
    finite keeps its copy.
    """
    grad_fn = make_grad_fn(model, task)

    def train_step(state: TrainState, batch: Batch) -> tuple[TrainState, Metrics]:
        rng = jax.random.fold_in(state.rng, state.step)
        model_state = state.model_state
        if "reset" in batch:
            model_state = reset_carry(model_state, batch["reset"])
        shared, carries = _split_carry(model_state, workers)
        shards = split_rows({k: v for k, v in batch.items() if k != "reset"}, workers)

        def one_worker(params: Any, opt_state: Any, shard: Batch, carry: Any, worker: jnp.ndarray) -> tuple:
            worker_state_before = shared if carry is None else {**shared, "carry": carry}
            (loss, (worker_state, metrics)), grads = grad_fn(
                params, worker_state_before, shard, jax.random.fold_in(rng, worker)
            )
            updates, new_opt_state = tx.update(grads, opt_state, params)
            new_params = optax.apply_updates(params, updates)
            grad_norm = optax.global_norm(grads)
            if skip_nonfinite:  # this worker's copy, optimizer state and statistics stay as they were
                finite = is_finite(loss, grad_norm)
                new_params, new_opt_state = (
                    keep_if(finite, new_params, params),
                    keep_if(finite, new_opt_state, opt_state),
                )
                worker_state = keep_if(finite, worker_state, worker_state_before)
            return new_params, new_opt_state, worker_state, loss, metrics, grad_norm

        carry_axis = None if carries is None else 0
        params, opt_state, worker_states, losses, metrics, norms = jax.vmap(
            one_worker, in_axes=(0, 0, 0, carry_axis, 0)
        )(state.workers["params"], state.workers["opt_state"], shards, carries, jnp.arange(workers))

        mean = lambda tree: jax.tree.map(lambda x: x.mean(0).astype(x.dtype) if _floating(x) else x[0], tree)
        average_now = (state.step + 1) % local_steps == 0
        spread = lambda tree: jax.tree.map(lambda x: jnp.broadcast_to(x, (workers, *x.shape)), tree)
        exchange = lambda tree: jax.tree.map(lambda a, b: jnp.where(average_now, a, b), spread(mean(tree)), tree)
        params, opt_state = exchange(params), exchange(opt_state)
        new_carry = worker_states.pop("carry", None)
        model_state = mean(worker_states)
        if new_carry is not None:
            model_state["carry"] = join_rows(new_carry)
        new_state = state.replace(
            step=state.step + 1,
            params=mean(params),
            opt_state=state.opt_state,  # unused: each worker has its own
            model_state=model_state,
            workers={"params": params, "opt_state": opt_state},
        )
        return new_state, step_metrics(losses.mean(), jax.tree.map(jnp.mean, metrics), norms.mean(), state.step)

    return train_step


def _floating(x: jnp.ndarray) -> bool:
    return jnp.issubdtype(x.dtype, jnp.floating)


def make_eval_step(
    model: nn.Module, task: Task | None = None
) -> Callable[[TrainState, Batch, dict], tuple[Metrics, dict]]:
    """Build ``eval_step``: weighted sums of the task's loss and metrics over the batch's examples
    and their total weight ``count`` (see :meth:`jaxnet.tasks.Task.eval_sums`).

    Sums (not means) so that batches add up exactly to the metric over the whole split.
    ``carry`` replaces the model's carried-state collections (``{"carry": ...}`` for a stateful
    LSTM walking a stream, ``{}`` otherwise) and is returned updated.
    """

    reference = adapters.reference_apply(model)

    def eval_step(state: TrainState, batch: Batch, carry: dict) -> tuple[Metrics, dict]:
        t = task_of(task, batch)
        variables = {"params": state.params, **state.model_state, **carry}
        batch = with_reference(t, reference, variables, batch)
        if carry:
            outputs, carry = model.apply(
                variables, *t.model_inputs(batch), **t.model_keywords(batch), train=False, mutable=list(carry)
            )
            carry = dict(carry)
        else:
            outputs = model.apply(variables, *t.model_inputs(batch), **t.model_keywords(batch), train=False)
        return t.eval_sums(outputs, batch), carry

    return eval_step

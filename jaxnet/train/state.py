"""The training state: one pytree holding everything a step reads and writes."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import optax

from jaxnet.models.adapters.paths import joined


class TrainState(flax.struct.PyTreeNode):
    """Step counter, parameters, optimizer state, non-trainable model state and the base RNG.

    ``model_state`` holds every Flax collection other than ``params`` (e.g. ``batch_stats``).
    ``rng`` is the run's base key; a step draws its randomness with ``fold_in(rng, step)``, so
    nothing random depends on how many times the state was saved and restored.
    """

    step: jnp.ndarray
    params: Any
    opt_state: optax.OptState
    model_state: dict
    rng: jnp.ndarray
    workers: dict = flax.struct.field(default_factory=dict)
    """State of simulated workers: ``{}`` for synchronous SGD; ``history`` (the last versions of
    the parameters) for asynchronous SGD; ``params`` and ``opt_state`` (one copy per worker) for
    local SGD. See :mod:`jaxnet.train.step`."""


def create(
    model: Any,
    tx: optax.GradientTransformation,
    sample_input: jnp.ndarray | tuple[jnp.ndarray, ...],
    seed: int,
    *,
    unbox: bool = True,
    sgd: str = "sync",
    workers: int = 1,
    staleness: int = 0,
    init: dict[str, Any] | None = None,
    keywords: dict[str, Any] | None = None,
) -> TrainState:
    """Initialise the model on ``sample_input`` (a batch of shape (1, ...), or a tuple of such
    batches for a model called on several inputs) and the optimizer.

    A ``carry`` collection (state carried across batches) gets the sample's batch size. With
    ``unbox=False`` the parameters and the optimizer moments keep their logical-axis boxes
    (for :func:`jaxnet.parallel.state_shardings`). ``sgd`` = ``async`` adds ``staleness + 1``
    copies of the initial parameters (the versions asynchronous workers read), ``local`` one
    copy of the parameters and optimizer state per worker. ``init`` (``train.init_from``) maps
    variable paths (``params/Conv_0/kernel``, ``batch_stats/...``) to values that replace the
    fresh ones, before the optimizer state and the workers' copies are made from them.
    ``keywords`` are sample inputs the model takes by name (a task's ``keyword_inputs``).
    """
    init_rng, run_rng = jax.random.split(jax.random.PRNGKey(seed))
    inputs = sample_input if isinstance(sample_input, tuple) else (sample_input,)
    variables = model.init({"params": init_rng, "dropout": init_rng}, *inputs, **(keywords or {}), train=False)
    variables = dict(nn.unbox(variables) if unbox else variables)
    if init:
        variables = _replaced(variables, init)
    params = variables.pop("params")
    plain = nn.unbox(params)
    copies = lambda tree, n: jax.tree.map(lambda x: jnp.broadcast_to(x, (n, *x.shape)), tree)
    if sgd == "async":
        extra = {"history": copies(plain, staleness + 1)}
    elif sgd == "local":
        extra = {"params": copies(plain, workers), "opt_state": copies(tx.init(plain), workers)}
    else:
        extra = {}
    return TrainState(
        step=jnp.zeros((), jnp.int32),
        params=params,
        opt_state=tx.init(params),
        model_state=variables,
        rng=run_rng,
        workers=extra,
    )


def _replaced(variables: dict, init: dict[str, Any]) -> dict:
    """``variables`` with each leaf whose path ``init`` names replaced by that value (in the leaf's dtype)."""
    flat, treedef = jax.tree_util.tree_flatten_with_path(variables)
    leaves = [jnp.asarray(init[joined(p)], x.dtype) if joined(p) in init else x for p, x in flat]
    return dict(jax.tree_util.tree_unflatten(treedef, leaves))


def param_count(params: Any) -> int:
    """Number of scalar parameters."""
    return sum(int(x.size) for x in jax.tree.leaves(params))

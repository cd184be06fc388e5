"""A Flax NNX module behind the model seam: split into pure state, merged back for each call.

The module comes with its parameters already made (by its constructor, from its own
``nnx.Rngs``), so ``init`` hands those over and ignores its key: ``seed`` does not change an
NNX model's initial weights. ``nnx.Param`` leaves are the trainable parameters; ``nnx.BatchStat``
leaves are the model state the trainer carries (as Linen's ``batch_stats``); everything else
(RNG streams, other variables) stays as the module holds it. Each call merges a fresh copy,
switches it to ``model.train()`` or ``model.eval()``, and reseeds its RNG streams from the step's
key, so dropout draws from the module's ``nnx.Rngs`` and a resumed run draws the same masks.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
from flax import nnx

from jaxnet.models.adapters.paths import leaves_at, names, nested

PARAMS, STATE = "params", "batch_stats"


class Split:
    """One kind of NNX variable of a module: its state's structure and its leaves' names, to turn
    the state into a nested dict of arrays and back without touching the module."""

    def __init__(self, state: nnx.State):
        self.state = state
        self.treedef = jax.tree.structure(state)
        self.names = names(state.to_pure_dict())
        self.variables = jax.tree.leaves(state, is_leaf=lambda x: isinstance(x, nnx.Variable))
        assert len(self.names) == len(self.variables) == self.treedef.num_leaves

    def to_dict(self, leaves: list | None = None) -> dict:
        return nested(self.names, jax.tree.leaves(self.state) if leaves is None else leaves)

    def from_dict(self, tree: dict) -> nnx.State:
        return jax.tree.unflatten(self.treedef, leaves_at(self.names, tree))


class NNX:
    """An ``nnx.Module`` under the seam's convention (see the module's docstring)."""

    is_jaxnet_adapter = True

    def __init__(self, module: nnx.Module):
        self.name = type(module).__name__
        self.graphdef, params, stats, self.rest = nnx.split(module, nnx.Param, nnx.BatchStat, ...)
        self.params, self.stats = Split(params), Split(stats)
        self.streams = sorted({node.tag for _, node in nnx.iter_graph(module) if isinstance(node, nnx.RngStream)})

    def _boxed_params(self) -> dict:
        """The parameters, in Linen's logical-axis boxes where NNX metadata names their axes."""

        def box(variable: Any, value: Any) -> Any:
            axes = getattr(variable, "sharding_names", None) or getattr(variable, "sharding", None)
            if isinstance(axes, tuple) and len(axes) == value.ndim and all(isinstance(n, str | None) for n in axes):
                return nn.LogicallyPartitioned(value, axes)
            return value

        values = jax.tree.leaves(self.params.state)
        return self.params.to_dict([box(v, x) for v, x in zip(self.params.variables, values, strict=True)])

    def init(self, rngs: dict[str, Any], *inputs: Any, train: bool = False, **keywords: Any) -> dict[str, Any]:
        """The module's own parameters (boxed where it names their axes) and batch statistics."""
        variables = {PARAMS: self._boxed_params()}
        if self.stats.names:
            variables[STATE] = self.stats.to_dict()
        return variables

    def apply(
        self,
        variables: dict[str, Any],
        *inputs: Any,
        train: bool,
        rngs: dict | None = None,
        mutable: Any = False,
        **keywords: Any,
    ) -> Any:
        """Outputs of the merged module in train or eval mode, and with ``mutable`` its new batch statistics."""
        params = self.params.from_dict(variables[PARAMS])
        stats = self.stats.from_dict(variables[STATE]) if self.stats.names else self.stats.state
        module = nnx.merge(self.graphdef, params, stats, self.rest, copy=True)
        if train:
            module.train()
        else:
            module.eval()
        key = (rngs or {}).get("dropout")
        if key is not None and self.streams:
            nnx.reseed(module, **{tag: jax.random.fold_in(key, i) for i, tag in enumerate(self.streams)})
        outputs = module(*inputs, **keywords)
        if mutable is False:
            return outputs
        if not self.stats.names:
            return outputs, {}
        return outputs, {STATE: self.stats.to_dict(jax.tree.leaves(nnx.state(module, nnx.BatchStat)))}

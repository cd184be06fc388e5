"""An Equinox module behind the model seam, following Equinox's convention.

``__call__(self, *inputs, key=None)`` takes one example: the adapter vmaps it over the batch,
gives every example its own ``key`` in training and calls ``eqx.nn.inference_mode(model)`` with
``key=None`` in evaluation. The trainable parameters are the leaves ``eqx.is_inexact_array``
selects (as a nested dict named by their paths); everything else stays static, as the module
holds it. The module comes with its weights made, so ``init`` ignores its key (``seed`` does not
change an Equinox model's initial weights). Equinox's own stateful layers (``eqx.nn.State``,
e.g. its BatchNorm) are not supported.
"""

from __future__ import annotations

from typing import Any

import equinox as eqx
import jax
import numpy as np

from jaxnet.errors import UserError
from jaxnet.models.adapters.paths import leaves_at, names, nested


class Equinox:
    """An ``eqx.Module`` under the seam's convention (see the module's docstring)."""

    is_jaxnet_adapter = True

    def __init__(self, module: eqx.Module):
        self.name = type(module).__name__
        params, self.static = eqx.partition(module, eqx.is_inexact_array)
        self.treedef = jax.tree.structure(params)
        self.names = names(params)
        self.initial = jax.tree.leaves(params)

    def init(self, rngs: dict[str, Any], *inputs: Any, train: bool = False, **keywords: Any) -> dict[str, Any]:
        """The module's own inexact arrays, as ``params``."""
        return {"params": nested(self.names, self.initial)}

    def apply(
        self,
        variables: dict[str, Any],
        *inputs: Any,
        train: bool,
        rngs: dict | None = None,
        mutable: Any = False,
        **keywords: Any,
    ) -> Any:
        """The module vmapped over the batch (``keywords`` too, each example's own): per-example
        keys in training, inference mode and ``key=None`` in evaluation."""
        params = jax.tree.unflatten(self.treedef, leaves_at(self.names, variables["params"]))
        module = eqx.nn.inference_mode(eqx.combine(params, self.static), value=not train)
        key = (rngs or {}).get("dropout") if train else None
        rows = np.shape(inputs[0])[0]
        try:
            if key is None:
                outputs = jax.vmap(lambda kw, *x: module(*x, **kw, key=None))(keywords, *inputs)
            else:
                keys = jax.random.split(key, rows)
                outputs = jax.vmap(lambda k, kw, *x: module(*x, **kw, key=k))(keys, keywords, *inputs)
        except UserError:
            raise
        except Exception as e:
            shapes = ", ".join(f"{np.dtype(x.dtype)}{list(np.shape(x)[1:])}" for x in inputs)
            message = (str(e).strip().splitlines() or [""])[0]
            raise UserError(
                f"Equinox model {self.name} failed on one example ({shapes}): {type(e).__name__}: {message}; "
                "an Equinox module is called on ONE example, __call__(self, *inputs, key=None), and jaxnet vmaps it "
                "over the batch"
            ) from None
        return outputs if mutable is False else (outputs, {})

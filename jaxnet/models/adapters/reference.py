"""A frozen copy of a model's starting weights beside the weights being trained: the reference model
of a full (not LoRA) DPO run (:mod:`jaxnet.preference`).

:class:`Reference` wraps any model behind jaxnet's seam. Its variables are the inner model's, plus
the collection :data:`REFERENCE`: a copy of the parameters as they are at the start (the values
``train.init_from`` gives them, else their fresh initialisation), in ``train.base_dtype`` when it is
set. The trainer carries the collection in the train state without differentiating or updating it
(it is no ``params``), and checkpoints it, so a resumed run and ``jaxnet eval`` use the same
reference. :meth:`Reference.apply` computes the model being trained, :meth:`Reference.reference` the
same model on the frozen copy.

What it costs: one more copy of the parameters (in ``base_dtype``; split across the mesh as the
parameters are) and one more forward pass a step, without its activations kept for a backward pass.
Under LoRA no copy is needed: the reference is the frozen base with the adapters off
(:meth:`jaxnet.models.adapters.lora.Lora.reference`)::

    model = Reference(adapters.adapt(module), dtype="bfloat16")
    variables = model.init(rngs, tokens)            # {"params": ..., "reference": a frozen copy}
    logits = model.reference(variables, tokens)     # the starting model's outputs
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

REFERENCE = "reference"
"""The collection that holds a full DPO run's frozen reference parameters in its train state."""


class Reference:
    """A model with a frozen copy of its starting parameters (see the module's docstring)."""

    is_jaxnet_adapter = True

    def __init__(self, inner: Any, dtype: str = ""):
        self.inner = inner
        self.dtype = dtype
        self.name = inner.name

    def init(self, rngs: Any, *inputs: Any, train: bool = False, **keywords: Any) -> dict[str, Any]:
        """The inner model's variables, and :data:`REFERENCE`: a copy of its parameters (in ``dtype``)."""
        variables = dict(self.inner.init(rngs, *inputs, train=train, **keywords))
        dtype = jnp.dtype(self.dtype) if self.dtype else None
        cast = lambda x: x.astype(dtype) if dtype is not None and jnp.issubdtype(x.dtype, jnp.floating) else x  # noqa: E731
        return {**variables, REFERENCE: jax.tree.map(cast, variables["params"])}

    def apply(
        self,
        variables: dict[str, Any],
        *inputs: Any,
        train: bool,
        rngs: dict | None = None,
        mutable: Any = False,
        **keywords: Any,
    ) -> Any:
        """The inner model's outputs on ``params``; with ``mutable``, its updated collections and the
        reference as it was."""
        variables = dict(variables)
        frozen = variables.pop(REFERENCE)
        inner_mutable = mutable if isinstance(mutable, bool) else [c for c in mutable if c != REFERENCE]
        out = self.inner.apply(variables, *inputs, train=train, rngs=rngs, mutable=inner_mutable, **keywords)
        if mutable is False:
            return out
        outputs, state = out
        return outputs, {**{k: v for k, v in dict(state).items() if k != "params"}, REFERENCE: frozen}

    def reference(self, variables: dict[str, Any], *inputs: Any, **keywords: Any) -> Any:
        """The inner model's outputs on the frozen copy, in evaluation mode (no dropout)."""
        rest = {k: v for k, v in variables.items() if k not in ("params", REFERENCE)}
        return self.inner.apply({"params": variables[REFERENCE], **rest}, *inputs, train=False, **keywords)


__all__ = ["REFERENCE", "Reference"]

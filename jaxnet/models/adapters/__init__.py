"""The model seam: whatever library a model comes from, the trainer sees one pure pair.

``init(rngs, *inputs, train=False) -> variables`` makes the variables from a batch of sample
inputs: ``{"params": trainable parameters, **model state}`` (model state such as BatchNorm's
``batch_stats`` is carried by the trainer from step to step). ``apply(variables, *inputs,
train, rngs=None, mutable=False)`` computes the outputs of a batch; ``rngs`` is
``{"dropout": key}`` in training, and with ``mutable`` (anything but False) it returns
``(outputs, new model state)``. Inputs a task gives by name (``keywords``: packed rows'
``segments`` and ``positions``) pass to the model by name. This is Flax Linen's own convention, so a Linen module passes
through unchanged; each other kind of model is one small adapter in this package:

* a Flax Linen module (:mod:`~jaxnet.models.adapters.linen`),
* a Flax NNX module (:mod:`~jaxnet.models.adapters.nnx`),
* an Equinox module, called on one example (:mod:`~jaxnet.models.adapters.equinox`),
* two pure functions, :class:`jaxnet.Model` (:mod:`~jaxnet.models.adapters.functions`).

A Linen module may also offer its final hidden states and its output layer apart, for a loss that
never holds the whole logits (:func:`features_apply`).

>>> model = adapt(MLP())           # doctest: +SKIP
>>> variables = model.init({"params": key, "dropout": key}, x[:1])  # doctest: +SKIP
>>> model.apply(variables, x, train=False)                           # doctest: +SKIP
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any, Protocol

from jaxnet.errors import UserError
from jaxnet.models.adapters.functions import Functions, Model
from jaxnet.models.adapters.linen import Linen

ACCEPTED = "a Flax Linen module, a Flax NNX module, an Equinox module or jaxnet.Model(init=..., apply=...)"


class Adapted(Protocol):
    """What the trainer calls: see the module's docstring."""

    name: str

    def init(self, rngs: dict[str, Any], *inputs: Any, train: bool = False, **keywords: Any) -> dict[str, Any]: ...

    def apply(
        self,
        variables: dict[str, Any],
        *inputs: Any,
        train: bool,
        rngs: dict | None = None,
        mutable: Any = False,
        **keywords: Any,
    ) -> Any: ...


def adapt(model: Any) -> Adapted:
    """``model`` behind the seam: a Linen module, an NNX module, an Equinox module or a
    :class:`Model` (an already adapted model is returned as it is). Anything else is a one-line
    :class:`~jaxnet.errors.UserError` naming what is accepted."""
    import flax.linen as nn

    if isinstance(model, (Linen, Functions)) or getattr(model, "is_jaxnet_adapter", False):
        return model
    if isinstance(model, nn.Module):
        return Linen(model)
    if isinstance(model, Model):
        return Functions(model)
    from flax import nnx

    if isinstance(model, nnx.Module):
        from jaxnet.models.adapters.nnx import NNX

        return NNX(model)
    eqx = sys.modules.get("equinox")  # an Equinox module exists only once its user imported equinox
    if eqx is not None and isinstance(model, eqx.Module):
        from jaxnet.models.adapters.equinox import Equinox

        return Equinox(model)
    raise UserError(f"model is a {type(model).__name__}; pass {ACCEPTED}")


#: The methods a Linen module defines to offer its features and output layer apart.
FEATURES_SEAM = ("features", "unembed", "head")


def features_apply(model: Any) -> Callable[..., Any] | None:
    """``apply(variables, *inputs, train, rngs=None, mutable=False) -> (features, head)`` of a model
    that offers its final hidden states and its output layer apart, else None.

    A Flax Linen module (bare or behind :func:`adapt`) offers them when its class defines the
    methods ``features(*inputs, train=False, **keywords)`` (the final hidden states; ``keywords``
    are the task's inputs by name, e.g. packed rows' ``segments``), ``unembed(features)``
    (their logits) and ``head()`` (the output layer as a :class:`~jaxnet.models.common.Head`), as
    the Transformer does; its outputs must be ``unembed(features(*inputs, **keywords))``. A loss then
    computes the logits in pieces (:func:`jaxnet.blockwise.cross_entropy`)::

        apply = features_apply(model)
        features, head = apply(variables, tokens, train=False)
    """
    import flax.linen as nn

    offered = getattr(model, "features_apply", None)
    if getattr(model, "is_jaxnet_adapter", False) and callable(offered):  # a wrapper (LoRA) asks what it wraps
        return offered()
    module = model.module if isinstance(model, Linen) else model
    if not isinstance(module, nn.Module):
        return None
    if not all(callable(getattr(type(module), name, None)) for name in FEATURES_SEAM):
        return None
    return functools.partial(module.apply, method=_features_and_head)


def reference_apply(model: Any) -> Callable[..., Any] | None:
    """``apply(variables, *inputs, **keywords) -> outputs`` of the reference model a wrapper keeps
    beside the model being trained (its starting weights, in evaluation mode), else None: LoRA's
    base with the adapters off (:meth:`jaxnet.models.adapters.lora.Lora.reference`), or a frozen copy
    (:class:`jaxnet.models.adapters.reference.Reference`). A DPO step asks it for the reference's
    log-probabilities::

        logits = reference_apply(model)(variables, tokens)
    """
    method = getattr(model, "reference", None)
    return method if callable(method) else None


def _features_and_head(module: Any, *inputs: Any, train: bool = False, **keywords: Any) -> tuple[Any, Any]:
    return module.features(*inputs, train=train, **keywords), module.head()


__all__ = ["ACCEPTED", "FEATURES_SEAM", "Adapted", "Model", "adapt", "features_apply", "reference_apply"]

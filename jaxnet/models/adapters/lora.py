"""LoRA: low-rank adapters trained on a frozen base (``train.lora_rank``).

A chosen kernel ``W`` (inputs x outputs) of the base model computes ``x W + s * x A B`` with ``A``
(inputs x rank), ``B`` (rank x outputs) and ``s = lora_alpha / lora_rank``. ``A`` starts as PEFT
draws it (``kaiming_uniform_(a=sqrt(5))``: uniform within 1 / sqrt(inputs)) and ``B`` at zeros, so the
adapted model computes exactly the base model until the first update.

:class:`Lora` wraps any model behind jaxnet's seam. Its variables are the adapters as ``params``
(what the trainer differentiates, updates and checkpoints) and the base's parameters as the
collection :data:`BASE` (carried by the trainer, never differentiated, left out of checkpoints and
rebuilt from ``train.init_from``). Which kernels are adapted is one rule over parameter paths
(:func:`targets`), the same for the built-in Transformer and a model of your own:

* a kernel of a :class:`~jaxnet.models.common.Projection` (every linear layer of the Transformer)
  gets its adapter through the :data:`~jaxnet.models.common.LORA` collection, and the layer adds the
  low-rank term itself (:meth:`~jaxnet.models.common.Projection.adapter`): the base kernel's
  product is unchanged, no merged kernel is formed, and ``lora_dropout`` applies;
* any other matrix (a Flax ``nn.Dense`` kernel, ``(inputs, outputs)``) is merged, ``W + s A B``,
  before the model is called.

Adapters are float32 whatever the base's dtype (``train.base_dtype``). They are split across the
mesh as their base kernel is along its inputs (``A``) or outputs (``B``) when one of them has at
least :data:`LARGE` elements, and replicated otherwise (the rank axis is never split)::

    settings = Settings(rank=16, alpha=32)
    model = Lora(adapters.adapt(module), settings)
    variables = model.init(rngs, tokens)        # {"params": adapters, "lora_base": the base}
    merged = merge(base_params, adapters_params, settings.scale)   # for export
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxnet.errors import UserError
from jaxnet.models.adapters.paths import joined, leaves_at
from jaxnet.models.common import LORA, Projection, adapting

BASE = "lora_base"
"""The collection that holds the frozen base parameters of a LoRA run's train state."""

ATTENTION = r"attention/(query|key|value|out)/kernel$"
ALL = r"(attention/(query|key|value|out)|mlp_(in|gate|out))/kernel$"
LARGE = 1 << 20
"""Adapters with at least this many elements (A or B) are split like their base kernel."""
RANK_AXIS = "lora_rank"
RULES = ((RANK_AXIS, None),)
"""The logical axis rule of the adapters' rank axis: never split."""


@dataclasses.dataclass(frozen=True)
class Settings:
    """A run's LoRA keys (``train.lora_*``, ``train.base_dtype``)."""

    rank: int
    alpha: float = 0.0
    dropout: float = 0.0
    targets: str = ""
    base_dtype: str = ""
    base_vectors: str = "float32"

    @property
    def scale(self) -> float:
        """``alpha / rank`` (1 when ``alpha`` is 0)."""
        return self.alpha / self.rank if self.alpha else 1.0

    @property
    def pattern(self) -> str:
        """The regex of the adapted kernels' paths."""
        return {"": ATTENTION, "attention": ATTENTION, "all": ALL}.get(self.targets, self.targets)

    @classmethod
    def of(cls, train: Any) -> Settings | None:
        """The settings of a ``TrainConfig`` (None when ``lora_rank`` is 0)."""
        if not train.lora_rank:
            return None
        t = train
        return cls(t.lora_rank, t.lora_alpha, t.lora_dropout, t.lora_targets, t.base_dtype, t.base_vectors)


def targets(params: Any, settings: Settings, model: str) -> list[str]:
    """The paths of the parameters ``settings`` adapts: those of 2 or more dimensions whose path
    the targets' regex finds. None found is a one-line :class:`UserError` listing the kernels there are::

        targets(params, Settings(rank=8, targets="all"), "TransformerLanguageModel")
        # ['block_0/attention/key/kernel', ..., 'block_1/mlp_out/kernel']
    """
    flat = jax.tree_util.tree_flatten_with_path(nn.unbox(params))[0]
    pattern = re.compile(settings.pattern)
    found = [joined(p) for p, x in flat if len(getattr(x, "shape", ())) >= 2 and pattern.search(joined(p))]
    if not found:
        matrices = [joined(p) for p, x in flat if len(getattr(x, "shape", ())) >= 2]
        shown = ", ".join(matrices[:4]) + (f" and {len(matrices) - 4} more" if len(matrices) > 4 else "")
        what = f"train.lora_targets={settings.targets}" if settings.targets else "train.lora_targets (attention)"
        raise UserError(
            f"{what} matches no kernel of model {model} (its kernels: {shown or 'none'}); "
            "set train.lora_targets=REGEX searched in those paths"
        )
    return found


def _get(tree: Any, path: str) -> Any:
    return leaves_at([tuple(path.split("/"))], tree)[0]


def _set(tree: dict, path: str, value: Any) -> None:
    *parents, leaf = path.split("/")
    for name in parents:
        tree = tree.setdefault(name, {})
    tree[leaf] = value


def _copy(tree: Any) -> Any:
    """A copy of the nested dicts of ``tree`` (the arrays shared)."""
    return {k: _copy(v) for k, v in tree.items()} if isinstance(tree, dict) else tree


def adapter_paths(adapters: Any) -> list[str]:
    """The kernel paths an adapters tree (``{... kernel: {"a": A, "b": B}}``) holds adapters for."""
    names = (joined(p) for p, _ in jax.tree_util.tree_flatten_with_path(adapters)[0])
    return sorted({n.rpartition("/")[0] for n in names})


def merge(base: Any, adapters: Any, scale: float, paths: list[str] | None = None) -> dict:
    """``base`` (nested parameters) with each adapted kernel (or those at ``paths``) replaced by
    ``W + scale * A B`` in float32 (a copy; ``base`` is left as it is)::

        params = merge(base, state.params, Settings(rank=8, alpha=16).scale)
    """
    merged = _copy(nn.unbox(base))
    for path in adapter_paths(adapters) if paths is None else paths:
        kernel, pair = _get(merged, path), _get(adapters, path)
        delta = jnp.tensordot(jnp.asarray(pair["a"], jnp.float32), jnp.asarray(pair["b"], jnp.float32), axes=1)
        _set(merged, path, jnp.asarray(kernel, jnp.float32) + scale * delta)
    return merged


class Lora:
    """A model with LoRA adapters on the kernels ``settings`` targets (see the module's docstring):
    the seam's ``init`` and ``apply``, its variables ``{"params": adapters, BASE: base, ...}``."""

    is_jaxnet_adapter = True

    def __init__(self, inner: Any, settings: Settings):
        self.inner = inner
        self.settings = settings
        self.name = inner.name
        self.found: dict[str, bool] = {}  # kernel path -> adapted inside its Projection (else merged)

    def init(self, rngs: Any, *inputs: Any, train: bool = False, **keywords: Any) -> dict[str, Any]:
        """The base model's variables, its parameters moved to :data:`BASE` (in ``base_dtype``; the
        norms' scales and the biases kept float32 unless ``base_vectors`` says otherwise), and fresh
        adapters as ``params``."""
        projections: dict[str, int] = {}
        called: set[str] = set()  # projections whose product runs through __call__ (and so adds the adapter)

        def record(next_fun: Any, args: Any, kwargs: Any, context: Any) -> Any:
            module = context.module
            if isinstance(module, Projection):
                path = "/".join(module.scope.path)
                projections[path] = module.contract
                if context.method_name == "__call__":
                    called.add(path)
            return next_fun(*args, **kwargs)

        with nn.intercept_methods(record):
            variables = dict(self.inner.init(rngs, *inputs, train=train, **keywords))
        base = variables.pop("params")
        rank = self.settings.rank
        key = rngs["params"] if isinstance(rngs, dict) else rngs
        adapters: dict = {}
        found = {}
        for i, path in enumerate(targets(base, self.settings, self.name)):
            leaf = _get(base, path)
            shape = tuple(nn.unbox(leaf).shape)
            module = path.rpartition("/")[0]
            # A projection whose kernel is only read as an array (the Transformer's output layer, for
            # its head()) gets its adapter merged into the kernel, so every road through it sees it.
            inside = module in called and path.endswith("/kernel")
            projection = module in projections and path.endswith("/kernel")
            if not projection and len(shape) != 2:
                raise UserError(
                    f"train.lora_targets matches {path} of shape {shape}; LoRA adapts matrices (a Dense kernel, "
                    "inputs x outputs) and the Transformer's projections: narrow train.lora_targets"
                )
            contract = projections[module] if projection else 1
            inputs_shape, outputs_shape = shape[:contract], shape[contract:]
            bound = 1.0 / math.sqrt(math.prod(inputs_shape))  # PEFT's kaiming_uniform_(a=sqrt(5))
            a = jax.random.uniform(jax.random.fold_in(key, i), (*inputs_shape, rank), jnp.float32, -bound, bound)
            b = jnp.zeros((rank, *outputs_shape), jnp.float32)
            names = getattr(leaf, "names", None)
            large = names is not None and max(a.size, b.size) >= LARGE
            a_names = (*(names[:contract] if large else (None,) * contract), RANK_AXIS)
            b_names = (RANK_AXIS, *(names[contract:] if large else (None,) * len(outputs_shape)))
            _set(adapters, path, {"a": nn.LogicallyPartitioned(a, a_names), "b": nn.LogicallyPartitioned(b, b_names)})
            found[path] = inside
        self.found = found
        if self.settings.base_dtype:
            base = cast_base(base, self.settings)
        return {"params": adapters, BASE: base, **variables}

    def apply(
        self,
        variables: dict[str, Any],
        *inputs: Any,
        train: bool,
        rngs: dict | None = None,
        mutable: Any = False,
        **keywords: Any,
    ) -> Any:
        """The base model's outputs with the adapters added; with ``mutable``, its updated
        collections and the base as it was."""
        return self._apply(self.inner.apply, variables, inputs, train, rngs, mutable, keywords)

    def features_apply(self) -> Any:
        """``apply(variables, *inputs, train, rngs=None, mutable=False) -> (features, head)`` of the
        adapted model, when the model it wraps offers its final hidden states and output layer apart
        (:func:`jaxnet.models.adapters.features_apply`: the Transformer), else None. The adapters
        are in both (an adapted output kernel merged into the head), so a loss computed from them
        in pieces (:func:`jaxnet.blockwise.cross_entropy`) equals the loss of :meth:`apply`'s logits::

            apply = Lora(adapters.adapt(module), Settings(rank=8)).features_apply()
            features, head = apply(variables, tokens, train=False)
        """
        from jaxnet.models.adapters import features_apply

        inner = features_apply(self.inner)
        if inner is None:
            return None
        return lambda variables, *inputs, train, rngs=None, mutable=False, **keywords: self._apply(
            inner, variables, inputs, train, rngs, mutable, keywords
        )

    def _apply(
        self, call: Any, variables: dict[str, Any], inputs: tuple, train: bool, rngs: Any, mutable: Any, keywords: dict
    ) -> Any:
        """``call`` (the wrapped model's ``apply``, or its features' and head's) on the base with
        the adapters: merged into kernels outside a projection's product, handed to the others."""
        variables = dict(variables)
        adapters, base = variables.pop("params"), variables.pop(BASE)
        if not self.found:  # a model applied without init: every adapted kernel merged
            self.found = dict.fromkeys(adapter_paths(adapters), False)
        lora: dict = {}
        merged = [p for p, inside in self.found.items() if not inside]  # kernels outside a Projection
        params = merge(base, adapters, self.settings.scale, merged) if merged else base
        for path, inside in self.found.items():
            if inside:
                _set(lora, path, _get(adapters, path))
        inner_mutable = mutable if isinstance(mutable, bool) else [c for c in mutable if c != BASE]
        with adapting(self.settings.scale, self.settings.dropout if train else 0.0):
            out = call(
                {"params": params, LORA: lora, **variables},
                *inputs,
                train=train,
                rngs=rngs,
                mutable=inner_mutable,
                **keywords,
            )
        if mutable is False:
            return out
        outputs, state = out
        state = {k: v for k, v in dict(state).items() if k not in ("params", LORA)}
        return outputs, {**state, BASE: base}

    def reference(self, variables: dict[str, Any], *inputs: Any, **keywords: Any) -> Any:
        """The base model's outputs with the adapters off, in evaluation mode: the reference model of a
        LoRA DPO run (:mod:`jaxnet.preference`), computed from the frozen base the run holds anyway,
        with no second copy of the weights::

            logits = model.reference(variables, tokens)   # what the base alone computes
        """
        variables = {k: v for k, v in variables.items() if k != "params"}
        base = variables.pop(BASE)
        return self.inner.apply({"params": base, **variables}, *inputs, train=False, **keywords)


def kept_float32(path: str, leaf: Any) -> bool:
    """Whether a base parameter stays float32 under ``train.base_dtype`` with ``base_vectors=float32``:
    a norm's scale or a bias (named ``scale`` or ``bias``), or any parameter of fewer than 2 dimensions."""
    return path.rpartition("/")[2] in ("scale", "bias") or len(getattr(leaf, "shape", ())) < 2


def cast_base(base: Any, settings: Settings) -> Any:
    """The base parameters in ``settings.base_dtype``: every floating one, or (``base_vectors``
    ``float32``, the default) all but the norms' scales and the biases (:func:`kept_float32`), which
    are a vanishing part of the memory and the part whose rounding the model feels most::

        base = cast_base(base, Settings(rank=16, base_dtype="bfloat16"))
    """
    dtype = jnp.dtype(settings.base_dtype)
    flat, tree = jax.tree_util.tree_flatten_with_path(base)
    every = settings.base_vectors != "float32"

    def cast(path: Any, x: Any) -> Any:
        if not jnp.issubdtype(x.dtype, jnp.floating):
            return x
        if not every and kept_float32(joined(path), x):
            return x.astype(jnp.promote_types(x.dtype, jnp.float32))
        return x.astype(dtype)

    return jax.tree_util.tree_unflatten(tree, [cast(p, x) for p, x in flat])


def without_base(state: Any) -> Any:
    """A train state without its :data:`BASE` collection (what a LoRA checkpoint holds); other states as they are::

    checkpoints.save(step, without_base(state))
    """
    model_state = getattr(state, "model_state", None)
    if not isinstance(model_state, dict) or BASE not in model_state:
        return state
    return state.replace(model_state={k: v for k, v in model_state.items() if k != BASE})


__all__ = [
    "ALL",
    "ATTENTION",
    "BASE",
    "LARGE",
    "Lora",
    "Settings",
    "adapter_paths",
    "cast_base",
    "kept_float32",
    "merge",
    "targets",
    "without_base",
]

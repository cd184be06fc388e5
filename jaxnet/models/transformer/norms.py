"""The Transformer's normalisations: LayerNorm or RMSNorm of a spec's epsilon, wherever one is used
(before and after each branch, before the unembedding, on each head's queries and keys)."""

from __future__ import annotations

import flax.linen as nn

from jaxnet.models.common import OffsetRMSNorm
from jaxnet.models.transformer.spec import TransformerSpec


def norm(spec: TransformerSpec, name: str, axis: str = "embed", kind: str = "") -> nn.Module:
    """A normalisation of epsilon ``spec.norm_eps`` over the last axis, its parameters named along
    ``axis``: LayerNorm (``kind`` or ``spec.norm`` ``"layer"``: scale and bias) or RMSNorm
    (``"rms"``: x / sqrt(mean(x^2) + eps) * scale, in float32, as Llama's; with ``spec.norm_offset``,
    times ``offset + scale`` as Gemma's ``1 + w``: :class:`~jaxnet.models.common.OffsetRMSNorm`)::

        h = norm(spec, "norm_1")(x)                      # before attention
        q = norm(spec, "query_norm", "kv", "rms")(q)     # each head's queries (spec.qk_norm)
    """
    scale = nn.with_logical_partitioning(nn.initializers.ones, (axis,))
    common = dict(epsilon=spec.norm_eps, dtype=spec.dtype, param_dtype=spec.param_dtype, name=name, scale_init=scale)
    if (kind or spec.norm) == "rms" and spec.norm_offset:
        return OffsetRMSNorm(spec.norm_offset, spec.norm_eps, spec.dtype, spec.param_dtype, (axis,), name=name)
    if (kind or spec.norm) == "rms":
        return nn.RMSNorm(**common)
    return nn.LayerNorm(**common, bias_init=nn.with_logical_partitioning(nn.initializers.zeros, (axis,)))

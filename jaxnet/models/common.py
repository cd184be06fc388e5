"""Pieces the model families share."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax.numpy as jnp

# A config's dtype names; float64 needs JAX's 64-bit mode (JAX_ENABLE_X64=1), for numerical checks.
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16, "float64": jnp.float64}


def lookup(embed: nn.Embed, tokens: jnp.ndarray, dtype: Any) -> jnp.ndarray:
    """Embedding rows of ``tokens`` (batch, time) -> (batch, time, width), split like the batch.

    The rows come from the whole table (gathered like any FSDP weight): gathering from a table
    split along its width leaves a layout the SPMD partitioner can only convert by replicating it.
    Without axis rules in scope this is ``embed(tokens)``.
    """
    table = nn.with_logical_constraint(embed.embedding, (None, None))
    return nn.with_logical_constraint(jnp.take(table, tokens, axis=0).astype(dtype), ("batch", None, None))

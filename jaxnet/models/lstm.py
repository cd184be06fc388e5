"""A multi-layer LSTM language model in Flax Linen (Zaremba, Sutskever and Vinyals 2014).

embedding -> dropout -> [LSTM layer -> dropout] x layers -> output projection. Dropout touches
only the non-recurrent connections (between layers and before the output), as in the paper.
Each layer runs its time loop with ``lax.scan``; the input half of the gate pre-activations is
computed for all time steps in one matrix product before the scan.

The LSTM equations, with ``z = x W_x + h W_h + b`` split into four gates ``i, f, g, o``::

    c' = sigmoid(f) * c + sigmoid(i) * tanh(g)
    h' = sigmoid(o) * tanh(c')

**Carried state.** Each layer's final ``(h, c)`` is stored in the ``carry`` variable collection
when that collection is mutable and read back as the initial state of the next call, so hidden
state flows across consecutive truncated-BPTT batches. The training step zeroes it at epoch
boundaries; without a ``carry`` collection every call starts from zeros.

Parameters carry logical axis names (``vocab``, ``embed``, ``mlp`` for the hidden units of the
gates) for the parallelism rules; the gate pre-activations and logits are marked
``(batch, ..., mlp)`` and ``(batch, ..., vocab)`` for the compiler (no effect without axis rules).
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxnet.models.common import lookup

Dtype = Any


def symmetric_uniform(scale: float) -> nn.initializers.Initializer:
    """Uniform in ``[-scale, scale]``, the initialisation of Zaremba et al."""

    def init(key: jax.Array, shape: tuple, dtype: Dtype = jnp.float32) -> jnp.ndarray:
        return jax.random.uniform(key, shape, dtype, -scale, scale)

    return init


def lstm_scan(
    x_proj: jnp.ndarray, w_h: jnp.ndarray, h0: jnp.ndarray, c0: jnp.ndarray, dtype: Dtype = jnp.float32
) -> tuple[jnp.ndarray, tuple[jnp.ndarray, jnp.ndarray]]:
    """Run the LSTM recurrence over time.

    ``x_proj``: (batch, time, 4, hidden) input contributions ``x W_x + b`` (float32); ``w_h``: (hidden, 4,
    hidden); ``h0``, ``c0``: (batch, hidden). Returns the outputs (batch, time, hidden) and the
    final ``(h, c)``. The state and the sums are kept in float32 (float64 if ``dtype`` is) whatever
    ``dtype`` the products use.
    """
    acc = jnp.promote_types(dtype, jnp.float32)

    def cell(carry: tuple, z_x: jnp.ndarray) -> tuple:
        h, c = carry
        z = z_x + jnp.einsum("bh,hgk->bgk", h.astype(dtype), w_h.astype(dtype), preferred_element_type=acc)
        i, f, g, o = z[:, 0], z[:, 1], z[:, 2], z[:, 3]
        c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
        h = jax.nn.sigmoid(o) * jnp.tanh(c)
        return (h, c), h

    (h, c), outputs = jax.lax.scan(cell, (h0.astype(acc), c0.astype(acc)), x_proj.swapaxes(0, 1))
    return outputs.swapaxes(0, 1), (h, c)


class LSTMLayer(nn.Module):
    """One LSTM layer over a whole sequence; its state lives in the ``carry`` collection."""

    hidden: int
    init_scale: float = 0.0
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32

    @nn.compact
    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        batch, _, features = x.shape
        if self.init_scale:
            kernel_init = recurrent_init = symmetric_uniform(self.init_scale)
            bias_init = symmetric_uniform(self.init_scale)
        else:
            kernel_init = nn.initializers.lecun_normal(in_axis=0, out_axis=(1, 2))
            recurrent_init = nn.initializers.orthogonal(column_axis=-1)
            bias_init = nn.initializers.zeros
        w_x = self.param(
            "w_x",
            nn.with_logical_partitioning(kernel_init, ("embed", None, "mlp")),
            (features, 4, self.hidden),
            self.param_dtype,
        )
        w_h = self.param(
            "w_h",
            nn.with_logical_partitioning(recurrent_init, ("embed", None, "mlp")),
            (self.hidden, 4, self.hidden),
            self.param_dtype,
        )
        b = self.param("b", nn.with_logical_partitioning(bias_init, (None, "mlp")), (4, self.hidden), self.param_dtype)
        acc = jnp.promote_types(self.dtype, jnp.float32)  # float32 sums under bf16 compute
        zeros = lambda: jnp.zeros((batch, self.hidden), acc)
        if self.is_mutable_collection("carry") or self.has_variable("carry", "h"):
            h, c = self.variable("carry", "h", zeros), self.variable("carry", "c", zeros)
            h0, c0 = h.value, c.value
        else:
            h = c = None
            h0, c0 = zeros(), zeros()
        x_proj = jnp.einsum(
            "btf,fgk->btgk", x.astype(self.dtype), w_x.astype(self.dtype), preferred_element_type=acc
        ) + b.astype(acc)  # gate pre-activations summed in float32 whatever the compute dtype
        x_proj = nn.with_logical_constraint(x_proj, ("batch", None, None, "mlp"))
        outputs, (h_last, c_last) = lstm_scan(x_proj, w_h, h0, c0, self.dtype)
        if h is not None and self.is_mutable_collection("carry") and not self.is_initializing():
            h.value, c.value = h_last, c_last
        return outputs.astype(self.dtype)


class LSTMLanguageModel(nn.Module):
    """Token ids (batch, time) -> next-token logits (batch, time, vocab), float32."""

    vocab_size: int
    layers: int = 2
    hidden: int = 200
    dropout: float = 0.0
    init_scale: float = 0.0
    tie_embeddings: bool = False
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32

    @nn.compact
    def __call__(self, tokens: jnp.ndarray, train: bool = False, decode: bool = False) -> jnp.ndarray:
        """Logits for every position. ``decode`` changes nothing: the ``carry`` collection already
        makes one-token-at-a-time calls continue each other (the interface matches the Transformer's)."""
        del decode
        embed_init = symmetric_uniform(self.init_scale) if self.init_scale else nn.initializers.normal(1.0)
        embed = nn.Embed(
            self.vocab_size,
            self.hidden,
            embedding_init=nn.with_logical_partitioning(embed_init, ("vocab", "embed")),
            dtype=self.dtype,
            param_dtype=self.param_dtype,
            name="embed",
        )
        x = lookup(embed, tokens, self.dtype)
        x = nn.Dropout(self.dropout, deterministic=not train)(x)
        for i in range(self.layers):
            x = LSTMLayer(self.hidden, self.init_scale, self.dtype, self.param_dtype, name=f"lstm_{i}")(x)
            x = nn.Dropout(self.dropout, deterministic=not train)(x)
        if self.tie_embeddings:
            logits = embed.attend(x)
        else:
            out_init = symmetric_uniform(self.init_scale) if self.init_scale else nn.initializers.lecun_normal()
            logits = nn.Dense(
                self.vocab_size,
                dtype=self.dtype,
                param_dtype=self.param_dtype,
                kernel_init=nn.with_logical_partitioning(out_init, ("embed", "vocab")),
                bias_init=nn.with_logical_partitioning(
                    symmetric_uniform(self.init_scale) if self.init_scale else nn.initializers.zeros, ("vocab",)
                ),
                name="output",
            )(x)
        logits = nn.with_logical_constraint(logits, ("batch", None, "vocab"))
        return logits.astype(jnp.promote_types(self.dtype, jnp.float32))

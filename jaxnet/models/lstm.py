"""A multi-layer LSTM language model in Flax Linen (Zaremba, Sutskever and Vinyals 2014).

embedding -> dropout -> [LSTM layer -> dropout] x layers -> output projection. Dropout touches
only the non-recurrent connections (between layers and before the output), as in the paper.

**Two implementations** of a layer's recurrence, chosen by ``impl`` (same parameters, same
results up to rounding, interchangeable checkpoints):

- ``"scan"`` (default, runs everywhere): the input half of the gate pre-activations is computed for
  all time steps in one matrix product, then the time loop runs with ``lax.scan``
  (:func:`lstm_scan`). Products use the compute ``dtype``; state and sums stay float32. This is
  the reference the other path is tested against.
- ``"cudnn"``: cuDNN's fused LSTM through ``jax.experimental.rnn.lstm`` (:func:`lstm_cudnn`), with
  the parameters repacked into cuDNN's flat weight vector (:func:`pack_cudnn_weights`) on every
  call. Only available on NVIDIA GPUs (the kernel has no CPU or TPU lowering, and ROCm's MIOpen
  orders the gates differently), and computed in float32 whatever the compute ``dtype``. Tests run
  this path on a CPU by pointing the module hook ``_RNN_FN`` at :func:`cudnn_lstm_reference`.

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

:class:`LSTMConfig` holds the ``model.*`` config keys and makes the model (``build``); the last
line registers it as ``lstm``.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.experimental import rnn

from jaxnet.errors import UserError
from jaxnet.models.base import ModelConfig, field, has_cudnn, register
from jaxnet.models.common import DTYPES, lookup

Dtype = Any


@dataclass
class LSTMConfig(ModelConfig):
    """``model.*`` keys of :class:`LSTMLanguageModel`."""

    carries_state: ClassVar[bool] = True  # the hidden state, from one batch to the next

    layers: int = field(2, "number of LSTM layers", low=1)
    width: int = field(200, "hidden units (= embedding size)", low=1)
    dropout: float = field(0.0, "dropout rate between layers", low=0.0, high=0.95)
    tie_embeddings: bool = field(False, "output layer shares the embedding matrix")
    init_scale: float = field(
        0.0, "initialise every weight uniformly in [-init_scale, init_scale] (0 = Flax defaults)", low=0.0
    )
    lstm_impl: str = field(
        "auto",
        "recurrence; auto = cuDNN's fused LSTM on an NVIDIA GPU, a lax.scan loop otherwise",
        choices=("auto", "scan", "cudnn"),
    )

    def for_backend(self, backend: str) -> LSTMConfig:
        """Also ``lstm_impl=auto``: cuDNN's fused LSTM on an NVIDIA GPU, the ``lax.scan`` loop elsewhere;
        an explicit ``cudnn`` elsewhere is a :class:`UserError`."""
        cfg = super().for_backend(backend)
        gpu = has_cudnn(backend)
        impl = cfg.lstm_impl if cfg.lstm_impl != "auto" else ("cudnn" if gpu else "scan")
        if impl == "cudnn" and not gpu:
            raise UserError(
                f"model.lstm_impl=cudnn needs an NVIDIA GPU (the backend here is {backend}); use model.lstm_impl=auto"
            )
        return dataclasses.replace(cfg, lstm_impl=impl)

    def forward_flops(self, *, batch: int, input_shape: tuple, outputs: int, causal: bool = True) -> float:
        """The input and recurrent products of the 4 gates per layer, then the output projection."""
        tokens = batch * input_shape[0]
        per_layer = 2 * tokens * (self.width * 4 * self.width + self.width * 4 * self.width)
        return self.layers * per_layer + 2 * tokens * self.width * outputs

    def build(self, *, outputs: int, seq_len: int = 0, batch_axis: Any = None) -> LSTMLanguageModel:
        """The :class:`LSTMLanguageModel` this config describes over a vocabulary of ``outputs`` tokens
        (``auto`` settings resolved, see :func:`jaxnet.models.resolve`)."""
        return LSTMLanguageModel(
            outputs,
            self.layers,
            self.width,
            self.dropout,
            self.init_scale,
            self.tie_embeddings,
            DTYPES[self.dtype],
            DTYPES[self.param_dtype],
            impl=self.lstm_impl,
        )


#: The fused LSTM the ``"cudnn"`` implementation calls, with ``jax.experimental.rnn.lstm``'s signature;
#: ``None`` means ``jax.experimental.rnn.lstm`` itself (NVIDIA GPUs only). Tests set it to
#: :func:`cudnn_lstm_reference` to run that path on a CPU. It is read when a model is traced, so a
#: function already compiled keeps the implementation it was traced with.
_RNN_FN: Callable[..., tuple[jnp.ndarray, jnp.ndarray, jnp.ndarray]] | None = None


def symmetric_uniform(scale: float) -> nn.initializers.Initializer:
    """Uniform in ``[-scale, scale]``, the initialisation of Zaremba et al."""

    def init(key: jax.Array, shape: tuple, dtype: Dtype = jnp.float32) -> jnp.ndarray:
        return jax.random.uniform(key, shape, dtype, -scale, scale)

    return init


@jax.custom_vjp
def output_product(x: jnp.ndarray, kernel: jnp.ndarray) -> jnp.ndarray:
    """``x @ kernel`` for the output layer: (..., hidden) by (hidden, vocab) gives (..., vocab). Its
    backward pass takes the kernel's gradient as ``x^T g`` over the leading axes, in the kernel's
    own (hidden, vocab) order.

    JAX's derivative of the same product takes it as ``(g^T x)^T``. On a CPU, XLA then copies the
    logits' gradient into vocabulary-major order for that product, and leaves the kernel's gradient
    transposed in memory, where the gradient norm's sum of its squares becomes XLA's windowed tree
    reduction (the 7 x 313 reduce-window of the ``lstm`` benchmark case). What that cost, and what
    this saves, is in docs/performance.md (On a CPU). The values are the same products, equal to
    float rounding (``tests/test_lm.py``). Being a custom VJP, it has no forward-mode derivative
    (``jax.jvp``); nothing in jaxnet takes one. Used through ``nn.Dense(dot_general=...)``
    (:func:`_output_dot_general`)::

        logits = output_product(features, kernel)      # (b, t, hidden) @ (hidden, vocab)
    """
    return _last_by_first(x, kernel)


def _last_by_first(x: jnp.ndarray, kernel: jnp.ndarray) -> jnp.ndarray:
    """The plain product of ``x``'s last axis with ``kernel``'s first."""
    return jax.lax.dot_general(x, kernel, (((x.ndim - 1,), (0,)), ((), ())))


def _output_product_forward(x: jnp.ndarray, kernel: jnp.ndarray) -> tuple[jnp.ndarray, tuple]:
    return _last_by_first(x, kernel), (x, kernel)


def _output_product_backward(saved: tuple, grad: jnp.ndarray) -> tuple[jnp.ndarray, jnp.ndarray]:
    x, kernel = saved
    lead = tuple(range(x.ndim - 1))
    dx = jax.lax.dot_general(grad, kernel, (((grad.ndim - 1,), (1,)), ((), ())))
    dk = jax.lax.dot_general(x, grad, ((lead, lead), ((), ())))
    return dx.astype(x.dtype), dk.astype(kernel.dtype)


output_product.defvjp(_output_product_forward, _output_product_backward)


def _output_dot_general(
    lhs: jnp.ndarray,
    rhs: jnp.ndarray,
    dimension_numbers: Any,
    precision: Any = None,
    preferred_element_type: Any = None,
) -> jnp.ndarray:
    """``jax.lax.dot_general`` as ``nn.Dense`` calls it, through :func:`output_product` for the
    plain product of the output layer (the last axis of ``lhs`` with the first of a 2-D ``rhs``)."""
    plain = (((lhs.ndim - 1,), (0,)), ((), ()))
    if rhs.ndim == 2 and dimension_numbers == plain and precision is None and preferred_element_type is None:
        return output_product(lhs, rhs)
    return jax.lax.dot_general(
        lhs, rhs, dimension_numbers, precision=precision, preferred_element_type=preferred_element_type
    )


def lstm_scan(
    x_proj: jnp.ndarray, w_h: jnp.ndarray, h0: jnp.ndarray, c0: jnp.ndarray, dtype: Dtype = jnp.float32
) -> tuple[jnp.ndarray, tuple[jnp.ndarray, jnp.ndarray]]:
    """Run the LSTM recurrence over time.

    ``x_proj``: (batch, time, 4, hidden) input contributions ``x W_x + b`` (float32); ``w_h``: (hidden, 4,
    hidden); ``h0``, ``c0``: (batch, hidden). Returns the outputs (batch, time, hidden) and the
    final ``(h, c)``. The state and the sums are kept in float32 (float64 if ``dtype`` is) whatever
    ``dtype`` the products use.

    The backward pass is written out (:func:`_recurrence_backward`) rather than left to JAX's
    differentiation of the loop: compiled for a CPU, that one transposed the recurrent weight and
    added each step's share of its gradient, in another layout, inside the loop at every step.
    Here the weight is transposed once, the loop carries only the state's gradients, and the
    weight's gradient is one product after it. The value and gradient of the ``lstm`` benchmark
    case's two layers took 18.7 against 20.6 ms on a 2-core CPU (medians of 5 alternating rounds,
    ``python scripts/profile_lstm.py``, benchmarks/results/lstm-backward-cpu-*.json); the whole
    step's difference was within that machine's noise. The gradients equal JAX's to rounding
    (tests/test_lm.py).
    """
    return _recurrence(jnp.dtype(dtype).name, x_proj, w_h, h0, c0)


def _recurrence_forward(dtype: str, x_proj, w_h, h0, c0) -> tuple:  # noqa: ANN001
    """The outputs, the final ``(h, c)`` and what the backward pass needs of each step: the state
    before it, the four gates and tanh of the new cell state, stacked over time."""
    dtype = jnp.dtype(dtype)
    acc = jnp.promote_types(dtype, jnp.float32)
    w = w_h.reshape(w_h.shape[0], -1).astype(dtype)  # (hidden, 4 hidden)

    def cell(carry: tuple, z_x: jnp.ndarray) -> tuple:
        h, c = carry
        z = z_x + jnp.dot(h.astype(dtype), w, preferred_element_type=acc).reshape(z_x.shape)
        i, f, g, o = jax.nn.sigmoid(z[:, 0]), jax.nn.sigmoid(z[:, 1]), jnp.tanh(z[:, 2]), jax.nn.sigmoid(z[:, 3])
        c_new = f * c + i * g
        tanh_c = jnp.tanh(c_new)
        h_new = o * tanh_c
        return (h_new, c_new), (h_new, (h, c, i, f, g, o, tanh_c))

    final, (outputs, steps) = jax.lax.scan(cell, (h0.astype(acc), c0.astype(acc)), x_proj.swapaxes(0, 1))
    return outputs.swapaxes(0, 1), final, steps


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _recurrence(dtype: str, x_proj, w_h, h0, c0) -> tuple:  # noqa: ANN001
    outputs, final, _ = _recurrence_forward(dtype, x_proj, w_h, h0, c0)
    return outputs, final


def _recurrence_save(dtype: str, x_proj, w_h, h0, c0) -> tuple:  # noqa: ANN001
    outputs, final, steps = _recurrence_forward(dtype, x_proj, w_h, h0, c0)
    kinds = tuple(jnp.zeros((0,), a.dtype) for a in (x_proj, h0, c0))  # the inputs' dtypes, for their gradients
    return (outputs, final), (steps, w_h, kinds)


def _recurrence_backward(dtype: str, saved: tuple, grads: tuple) -> tuple:
    """The gradients of :func:`lstm_scan`'s inputs, from those of its outputs: a loop backwards
    over time that carries the gradients of ``h`` and ``c``, then the recurrent weight's gradient
    as one product over all the steps."""
    steps, w_h, kinds = saved
    d_outputs, (dh, dc) = grads
    dtype = jnp.dtype(dtype)
    acc = jnp.promote_types(dtype, jnp.float32)
    hidden = w_h.shape[0]
    w_t = w_h.reshape(hidden, -1).T.astype(dtype)  # (4 hidden, hidden), once, outside the loop

    def back(carry: tuple, step: tuple) -> tuple:
        dh, dc = carry
        d_out, h, c, i, f, g, o, tanh_c = step
        dh = dh + d_out
        dc = dc + dh * o * (1 - tanh_c * tanh_c)
        dz = jnp.concatenate(
            [dc * g * i * (1 - i), dc * c * f * (1 - f), dc * i * (1 - g * g), dh * tanh_c * o * (1 - o)], axis=-1
        )  # the gates' pre-activations i, f, g, o side by side: (batch, 4 hidden)
        return (jnp.dot(dz.astype(dtype), w_t, preferred_element_type=acc), dc * f), dz

    inputs = (d_outputs.swapaxes(0, 1).astype(acc), *steps)
    (dh0, dc0), dz = jax.lax.scan(back, (dh.astype(acc), dc.astype(acc)), inputs, reverse=True)
    time, batch = dz.shape[:2]
    h_before = steps[0].reshape(time * batch, hidden)
    dw = jnp.dot(h_before.T.astype(dtype), dz.reshape(time * batch, -1).astype(dtype), preferred_element_type=acc)
    d_x = dz.reshape(time, batch, 4, hidden).swapaxes(0, 1)
    x_kind, h_kind, c_kind = kinds
    return (
        d_x.astype(x_kind.dtype),
        dw.reshape(w_h.shape).astype(w_h.dtype),
        dh0.astype(h_kind.dtype),
        dc0.astype(c_kind.dtype),
    )


_recurrence.defvjp(_recurrence_save, _recurrence_backward)


def pack_cudnn_weights(w_x: jnp.ndarray, w_h: jnp.ndarray, b: jnp.ndarray) -> jnp.ndarray:
    """One layer's parameters as cuDNN's flat weight vector (one layer, one direction, double bias).

    ``jax.experimental.rnn`` lays the vector out as ``W_ih`` (4 hidden, in), ``W_hh`` (4 hidden,
    hidden), ``b_ih`` (4 hidden,), ``b_hh`` (4 hidden,), each flattened row-major, with the rows of
    each block grouped by gate in the order i, f, g, o, the same order as ours, and each gate's
    block multiplying as ``x @ W.T``. So ``W_ih[g * hidden + k, f] = w_x[f, g, k]``,
    ``W_hh[g * hidden + k, j] = w_h[j, g, k]``, ``b_ih = b`` flattened, and ``b_hh = 0``. The
    length is ``rnn.get_num_params_in_lstm(in, hidden, 1, False)``; the dtype is the parameters'.
    """
    features, _, hidden = w_x.shape
    w_ih = w_x.reshape(features, 4 * hidden).T
    w_hh = w_h.reshape(hidden, 4 * hidden).T
    b_ih = b.reshape(4 * hidden)
    b_hh = jnp.zeros_like(b_ih)  # our single bias goes entirely to b_ih
    return jnp.concatenate([w_ih.ravel(), w_hh.ravel(), b_ih, b_hh])


def cudnn_lstm_reference(
    x: jnp.ndarray,
    h_0: jnp.ndarray,
    c_0: jnp.ndarray,
    weights: jnp.ndarray,
    seq_lengths: jnp.ndarray,
    input_size: int,
    hidden_size: int,
    num_layers: int,
    dropout: float,
    bidirectional: bool,
    precision: Any = None,
) -> tuple[jnp.ndarray, jnp.ndarray, jnp.ndarray]:
    """``jax.experimental.rnn.lstm`` computed by its pure-JAX reference ``rnn.lstm_ref`` (any backend).

    Same signature and flat weight layout as ``rnn.lstm`` (``rnn.lstm_ref`` itself takes the
    unpacked weight dictionaries instead), so it can stand in for it as ``_RNN_FN``. ``precision``
    is ignored: the reference uses JAX's default matmul precision.
    """
    del precision
    w_ih, w_hh, b_ih, b_hh = rnn.unpack_lstm_weights(weights, input_size, hidden_size, num_layers, bidirectional)
    return rnn.lstm_ref(
        x, h_0, c_0, w_ih, w_hh, b_ih, b_hh, seq_lengths, input_size, hidden_size, num_layers, dropout, bidirectional
    )


def lstm_cudnn(
    x: jnp.ndarray,
    w_x: jnp.ndarray,
    w_h: jnp.ndarray,
    b: jnp.ndarray,
    h0: jnp.ndarray,
    c0: jnp.ndarray,
    dtype: Dtype = jnp.float32,
    rnn_fn: Callable[..., tuple[jnp.ndarray, jnp.ndarray, jnp.ndarray]] | None = None,
) -> tuple[jnp.ndarray, tuple[jnp.ndarray, jnp.ndarray]]:
    """One LSTM layer over a whole sequence through cuDNN's fused kernel (``rnn_fn``, by default
    ``jax.experimental.rnn.lstm``, which runs only on NVIDIA GPUs).

    ``x``: (batch, time, in); ``w_x``, ``w_h``, ``b``: the layer's parameters; ``h0``, ``c0``:
    (batch, hidden). Returns the outputs (batch, time, hidden) and the final ``(h, c)``, float32,
    like :func:`lstm_scan` after the input projection. Differentiable (``rnn.lstm`` has a custom
    VJP running cuDNN's backward pass).

    **Dtypes.** jaxlib's cuDNN RNN kernel takes float32 only (its lowering rejects bfloat16 and
    ``rnn.lstm`` raises for bfloat16 matmul precision), so inputs, weights and state are cast to
    float32 and the whole layer runs in float32 whatever ``dtype`` is. ``dtype`` only picks the
    matmul precision: float32 passes ``precision=None``, which follows
    ``jax_default_matmul_precision`` (unset: cuDNN may use TF32 tensor cores; ``"highest"``: full
    float32), and a 16-bit ``dtype`` (bfloat16 compute) explicitly allows TF32. A ``dtype`` wider
    than float32 is an error, since the kernel cannot honour it.
    """
    f32 = jnp.float32
    if jnp.promote_types(dtype, f32) != f32:
        raise ValueError(f"the cuDNN LSTM computes in float32 and cannot run in {jnp.dtype(dtype).name}")
    if rnn_fn is None:
        if jax.default_backend() != "gpu":
            raise RuntimeError(
                f"the cuDNN LSTM needs an NVIDIA GPU (JAX's backend is {jax.default_backend()}); use impl='scan', "
                "or pass cudnn_lstm_reference as rnn_fn (or set jaxnet.models.lstm._RNN_FN to it) to emulate it"
            )
        rnn_fn = rnn.lstm
    batch, time, features = x.shape
    hidden = w_h.shape[0]
    precision = None if jnp.dtype(dtype) == f32 else jax.lax.Precision.HIGH  # HIGH = TF32 allowed
    weights = pack_cudnn_weights(w_x.astype(f32), w_h.astype(f32), b.astype(f32))
    outputs, h_n, c_n = rnn_fn(
        x.astype(f32),
        h0.astype(f32)[None],  # (layers * directions, batch, hidden)
        c0.astype(f32)[None],
        weights,
        jnp.full((batch,), time, jnp.int32),  # every sequence runs the full length
        input_size=features,
        hidden_size=hidden,
        num_layers=1,
        dropout=0.0,
        bidirectional=False,
        precision=precision,
    )
    return outputs.astype(f32), (h_n[0].astype(f32), c_n[0].astype(f32))


class LSTMLayer(nn.Module):
    """One LSTM layer over a whole sequence; its state lives in the ``carry`` collection.

    ``impl``: ``"scan"`` (:func:`lstm_scan`, anywhere) or ``"cudnn"`` (:func:`lstm_cudnn`, NVIDIA
    GPUs, float32 inside; see the module docstring)."""

    hidden: int
    init_scale: float = 0.0
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32
    impl: str = "scan"

    @nn.compact
    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        if self.impl not in ("scan", "cudnn"):
            raise ValueError(f"LSTMLayer.impl must be 'scan' or 'cudnn', not {self.impl!r}")
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
        if self.impl == "cudnn":
            outputs, (h_last, c_last) = lstm_cudnn(x, w_x, w_h, b, h0, c0, self.dtype, _RNN_FN)  # float32 = acc
        else:
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
    impl: str = "scan"  # each layer's recurrence: "scan" or "cudnn" (see LSTMLayer)

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
            layer = LSTMLayer(self.hidden, self.init_scale, self.dtype, self.param_dtype, self.impl, name=f"lstm_{i}")
            x = layer(x)
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
                dot_general=_output_dot_general,
                name="output",
            )(x)
        logits = nn.with_logical_constraint(logits, ("batch", None, "vocab"))
        return logits.astype(jnp.promote_types(self.dtype, jnp.float32))


register("lstm", LSTMConfig, inputs="tokens")

"""Pieces the model families share."""

from __future__ import annotations

import contextlib
import contextvars
import functools
from collections.abc import Callable, Iterator
from typing import Any

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
from jax import custom_batching, lax

from jaxnet.errors import UserError

# A config's dtype names; float64 needs JAX's 64-bit mode (JAX_ENABLE_X64=1), for numerical checks.
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16, "float64": jnp.float64}


def step_platform() -> str:
    """The platform the program being traced is built for: that of the mesh in scope (a plan's
    GPUs, compiled on a CPU), else JAX's default backend."""
    mesh = jax.sharding.get_abstract_mesh()
    device = None if mesh.empty else getattr(mesh, "abstract_device", None)
    return getattr(device, "platform", None) or jax.default_backend()


def lookup(embed: nn.Embed, tokens: jnp.ndarray, dtype: Any, axes: tuple = ("batch", None, None)) -> jnp.ndarray:
    """Embedding rows of ``tokens`` (batch, time) -> (batch, time, width), split like the batch
    (the logical ``axes`` of the result: ``("batch", "length", None)`` splits the time axis too).

    The rows come from the whole table (gathered like any FSDP weight): gathering from a table
    split along its width leaves a layout the SPMD partitioner can only convert by replicating it.
    Without axis rules in scope this is ``embed(tokens)``.
    """
    table = nn.with_logical_constraint(embed.embedding, (None, None))
    return nn.with_logical_constraint(jnp.take(table, tokens, axis=0).astype(dtype), axes)


# ---------------------------------------------------------------------------------------------
# Rematerialisation: what a recomputed layer keeps for the backward pass

#: The recomputation policies by name, each saying what a rematerialised layer keeps for the
#: backward pass (the rest is recomputed there): ``none`` keeps everything (no recomputation);
#: ``full`` only the layer's inputs; ``dots`` every matrix product's output; ``dots_no_batch`` the
#: outputs of products without batch dimensions (the projections; attention's products, batched
#: over heads, are recomputed); ``minimal`` only the values named :data:`SAVED_NAMES` (the
#: attention's output); ``offload`` what ``dots_no_batch`` keeps, moved to the host's memory and
#: back (JAX's offload policy).
REMAT = ("none", "full", "dots", "dots_no_batch", "minimal", "offload")
#: Older spellings of the policies (``model.remat`` was true or false).
REMAT_ALIASES = {True: "full", False: "none", "true": "full", "false": "none"}
#: The name of the attention's output (``jax.ad_checkpoint.checkpoint_name``), what ``minimal`` keeps.
ATTENTION_OUTPUT = "context"
SAVED_NAMES = (ATTENTION_OUTPUT,)


def remat_policy(name: str) -> Callable | None:
    """JAX's ``jax.checkpoint`` policy of recomputation policy ``name`` (:data:`REMAT`; None for
    ``full``, which keeps nothing but the inputs). The one place the policies are looked up, so a
    JAX that lacks one says so in a line rather than deep in a trace::

        block = nn.remat(Block, policy=remat_policy("dots_no_batch"))
    """
    policies = jax.checkpoint_policies
    wanted = {
        "full": None,
        "dots": "dots_saveable",
        "dots_no_batch": "dots_with_no_batch_dims_saveable",
        "minimal": "save_only_these_names",
        "offload": "offload_dot_with_no_batch_dims",
    }
    if name not in wanted:
        raise ValueError(f"remat policy {name!r} is not one of {', '.join(REMAT[1:])}")
    attribute = wanted[name]
    if attribute is None:
        return None
    if not hasattr(policies, attribute):
        raise UserError(
            f"model.remat={name} needs jax.checkpoint_policies.{attribute}, which this JAX ({jax.__version__}) "
            "lacks; choose another policy"
        )
    if name == "minimal":
        return policies.save_only_these_names(*SAVED_NAMES)
    if name == "offload":
        return policies.offload_dot_with_no_batch_dims("device", "pinned_host")
    return getattr(policies, attribute)


# ---------------------------------------------------------------------------------------------
# Convolutions of a sweep's members

_MEMBERS = contextvars.ContextVar("jaxnet_sweep_members", default=False)


@contextlib.contextmanager
def members() -> Iterator[None]:
    """Models built inside train the members of a sweep (``jax.vmap`` over their weights): their
    convolutions are :func:`member_conv`. Read when a model's layers are built (in its trace)."""
    token = _MEMBERS.set(True)
    try:
        yield
    finally:
        _MEMBERS.reset(token)


def conv_for_members() -> Callable | None:
    """The ``conv_general_dilated`` of ``flax.linen.Conv`` for the layers being built: None (JAX's)
    outside :func:`members`."""
    return member_conv if _MEMBERS.get() else None


def _each(fn: Callable, axis_size: int, in_batched: Any, *args: Any) -> tuple[Any, Any]:
    """``fn`` member by member (static slices, stacked results): plain operations, unrolled."""
    args = [a if b else jnp.broadcast_to(a, (axis_size, *a.shape)) for a, b in zip(args, in_batched, strict=True)]
    outs = [fn(*(a[i] for a in args)) for i in range(axis_size)]
    stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *outs)
    return stacked, jax.tree.map(lambda _: True, stacked)


def member_conv(lhs: jnp.ndarray, rhs: jnp.ndarray, *args: Any, **kwargs: Any) -> jnp.ndarray:
    """``lax.conv_general_dilated`` whose ``vmap`` over the kernel computes one plain convolution
    per member (forward and backward) instead of JAX's rule, one grouped convolution over all of
    them: XLA's CPU backend runs grouped convolutions about 3x slower than the same work as plain
    ones (a 3x3, 32 -> 64 channel layer of 4 members, forward and backward: 0.76 s against 0.25 s).
    Unbatched kernels (shared weights) keep JAX's rule. Same values as the plain convolution."""
    conv = lambda x, w: lax.conv_general_dilated(x, w, *args, **kwargs)  # noqa: E731

    @custom_batching.custom_vmap
    def forward(x: jnp.ndarray, w: jnp.ndarray) -> jnp.ndarray:
        return conv(x, w)

    @forward.def_vmap
    def _forward_members(axis_size: int, in_batched: Any, x: jnp.ndarray, w: jnp.ndarray) -> Any:
        if not in_batched[1]:
            return jax.vmap(conv, in_axes=(0 if in_batched[0] else None, None))(x, w), in_batched[0]
        return _each(conv, axis_size, in_batched, x, w)

    def grads(x: jnp.ndarray, w: jnp.ndarray, g: jnp.ndarray) -> Any:
        return jax.vjp(conv, x, w)[1](g)

    @custom_batching.custom_vmap
    def backward(x: jnp.ndarray, w: jnp.ndarray, g: jnp.ndarray) -> Any:
        return grads(x, w, g)

    @backward.def_vmap
    def _backward_members(axis_size: int, in_batched: Any, x: jnp.ndarray, w: jnp.ndarray, g: jnp.ndarray) -> Any:
        if not in_batched[1]:
            axes = tuple(0 if b else None for b in in_batched)
            out = jax.vmap(grads, in_axes=axes)(x, w, g)
            return out, (True, True)
        return _each(grads, axis_size, in_batched, x, w, g)

    @jax.custom_vjp
    def f(x: jnp.ndarray, w: jnp.ndarray) -> jnp.ndarray:
        return forward(x, w)

    f.defvjp(lambda x, w: (forward(x, w), (x, w)), lambda res, g: backward(*res, g))
    return f(lhs, rhs)


# ---------------------------------------------------------------------------------------------
# The linear layer


def normal(std: float, names: tuple) -> nn.initializers.Initializer:
    """N(0, ``std``) initialisation of a parameter whose axes have the logical ``names``."""
    return nn.with_logical_partitioning(nn.initializers.normal(std), names)


#: How a projection multiplies: ``default`` in the compute dtype (``model.dtype``); ``fp8`` through
#: float8 (:func:`fp8_matmul`).
MATMULS = ("default", "fp8")


def project(
    x: jnp.ndarray, kernel: jnp.ndarray, bias: jnp.ndarray | None, contract: int, dtype: Any, matmul: str = "default"
) -> jnp.ndarray:
    """``x @ kernel + bias`` in ``dtype``, contracting the last ``contract`` axes of ``x`` with the
    first ``contract`` of ``kernel``; with ``matmul="fp8"`` the product goes through float8
    (:func:`fp8_matmul`), the bias is added in ``dtype``."""
    x, kernel = x.astype(dtype), kernel.astype(dtype)
    if matmul == "fp8":
        y = fp8_matmul(x, kernel, contract)
    else:
        inputs = tuple(range(x.ndim - contract, x.ndim))
        y = jax.lax.dot_general(x, kernel, ((inputs, tuple(range(contract))), ((), ())))
    return y if bias is None else y + bias.astype(dtype)


# ---------------------------------------------------------------------------------------------
# Float8 products: e4m3 forward, e5m2 gradients, each tensor scaled by its own current maximum

E4M3, E5M2 = jnp.float8_e4m3fn, jnp.float8_e5m2


def fp8_quantize(x: jnp.ndarray, dtype: Any) -> tuple[jnp.ndarray, jnp.ndarray]:
    """``x`` in float8 ``dtype`` and its scale (float32), by *current* scaling: the tensor divided
    by ``max|x| / largest float8``, so its largest magnitude lands on the format's largest number
    (448 for e4m3, 57344 for e5m2); ``x ~ q * scale``. A tensor of zeros has scale 1::

        q, scale = fp8_quantize(x, jnp.float8_e4m3fn)
    """
    top = float(jnp.finfo(dtype).max)
    amax = jnp.max(jnp.abs(x)).astype(jnp.float32)
    scale = jax.lax.stop_gradient(jnp.where(amax > 0, amax / top, 1.0))
    return jnp.clip(x.astype(jnp.float32) / scale, -top, top).astype(dtype), scale


def _scaled_dot(a: jnp.ndarray, b: jnp.ndarray, dims: Any, scale: jnp.ndarray, dtype: Any) -> jnp.ndarray:
    """``dot_general(a, b) * scale`` of float8 operands, accumulated in float32 and returned in
    ``dtype``: the form XLA's GPU compiler runs as one float8 GEMM (a Triton or cuBLASLt kernel,
    the scale applied to its float32 result)."""
    return (jax.lax.dot_general(a, b, dims, preferred_element_type=jnp.float32) * scale).astype(dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def fp8_matmul(x: jnp.ndarray, kernel: jnp.ndarray, contract: int = 1) -> jnp.ndarray:
    """``x @ kernel`` contracting the last ``contract`` axes of ``x`` with the first ``contract`` of
    ``kernel``, through float8 as Hopper's tensor cores run it: both operands quantized to e4m3
    (:func:`fp8_quantize`: current scaling, each tensor by its own maximum in this step, no
    history kept), products accumulated in float32; in the backward pass the incoming gradient is
    quantized to e5m2 (more range, less precision) and multiplied with the saved e4m3 operands
    (kept in float8: half the bytes of bfloat16). Results and gradients are in the operands'
    dtype. On a GPU with float8 matrix units (compute capability 8.9 and up) each of the three
    products is a float8 GEMM; on a CPU XLA computes the same products of float8 values in wider
    arithmetic, a simulation with the same rounding of the operands::

        y = fp8_matmul(x, kernel)                 # (b, t, w) @ (w, f) -> (b, t, f)
    """
    return _fp8_forward(x, kernel, contract)[0]


def _fp8_forward(x: jnp.ndarray, kernel: jnp.ndarray, contract: int) -> tuple[jnp.ndarray, tuple]:
    (xq, x_scale), (kq, k_scale) = fp8_quantize(x, E4M3), fp8_quantize(kernel, E4M3)
    dims = ((tuple(range(x.ndim - contract, x.ndim)), tuple(range(contract))), ((), ()))
    return _scaled_dot(xq, kq, dims, x_scale * k_scale, x.dtype), (xq, x_scale, kq, k_scale)


def _fp8_backward(contract: int, saved: tuple, grad: jnp.ndarray) -> tuple[jnp.ndarray, jnp.ndarray]:
    xq, x_scale, kq, k_scale = saved
    gq, g_scale = fp8_quantize(grad, E5M2)
    lead = xq.ndim - contract
    # d x[..., K] = sum over F of g[..., F] k[K, F];  d k[K, F] = sum over ... of x[..., K] g[..., F]
    to_x = ((tuple(range(lead, grad.ndim)), tuple(range(contract, kq.ndim))), ((), ()))
    to_kernel = ((tuple(range(lead)), tuple(range(lead))), ((), ()))
    dx = _scaled_dot(gq, kq, to_x, g_scale * k_scale, grad.dtype)
    dk = _scaled_dot(xq, gq, to_kernel, x_scale * g_scale, grad.dtype)
    return dx, dk


fp8_matmul.defvjp(_fp8_forward, _fp8_backward)


LORA = "lora"
"""The collection a LoRA-adapted :class:`Projection` finds its adapters in (see :mod:`jaxnet.models.adapters.lora`)."""

_ADAPTING = contextvars.ContextVar("jaxnet_lora", default=(1.0, 0.0))


@contextlib.contextmanager
def adapting(scale: float, dropout: float) -> Iterator[None]:
    """Inside, a :class:`Projection` with adapters in the :data:`LORA` collection adds ``scale`` times
    their product, with ``dropout`` on their inputs (0 in evaluation). Read when the layers are traced."""
    token = _ADAPTING.set((float(scale), float(dropout)))
    try:
        yield
    finally:
        _ADAPTING.reset(token)


def adapter_dropout() -> float:
    """The dropout on the LoRA adapters' inputs in force (:func:`adapting`; 0 outside it)."""
    return _ADAPTING.get()[1]


class Projection(nn.Module):
    """``x @ kernel + bias`` contracting the last ``contract`` axes of ``x`` into ``features``: every
    linear layer of the Transformer (queries, keys, values, the attention's output, the MLP, an
    untied output head), so that what changes a linear layer changes it here: :meth:`weights`, which
    every product with the layer goes through, and :meth:`adapter`, the low-rank term a LoRA
    adapter adds to it.

    ``names`` are the logical names of the kernel's axes (inputs, then outputs). The kernel is
    created at its full shape (Flax's ``DenseGeneral`` creates it flat and reshapes, which its own
    logical-axis constraints reject), so its axes can be named and split. It starts from
    N(0, ``std``) unless ``kernel_init`` says otherwise; the bias (``use_bias``) from zeros.
    ``matmul`` is how the product is taken (:data:`MATMULS`: ``fp8`` through float8, the
    parameters staying in ``param_dtype``)::

        q = Projection((heads, head_dim), ("embed", "heads", "kv"), name="query")(x)  # (b, t, heads, head_dim)
    """

    features: tuple[int, ...]
    names: tuple[str | None, ...]
    contract: int = 1
    std: float = 0.02
    use_bias: bool = True
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32
    kernel_init: Callable | None = None
    matmul: str = "default"

    @nn.compact
    def weights(self, inputs: tuple[int, ...]) -> tuple[jnp.ndarray, jnp.ndarray | None]:
        """The kernel, of shape ``inputs + features``, and the bias (None without one), created on
        first use: what the layer multiplies by (a caller may multiply by several layers' at once)."""
        init = nn.with_logical_partitioning(self.kernel_init, self.names) if self.kernel_init else None
        kernel = self.param("kernel", init or normal(self.std, self.names), (*inputs, *self.features), self.param_dtype)
        if not self.use_bias:
            return kernel, None
        bias_init = nn.with_logical_partitioning(nn.initializers.zeros, self.names[self.contract :])
        return kernel, self.param("bias", bias_init, self.features, self.param_dtype)

    def adapter(self, x: jnp.ndarray) -> jnp.ndarray | None:
        """``scale * dropout(x) @ A @ B`` of the LoRA adapter ``{"a": A, "b": B}`` this layer finds
        in the :data:`LORA` collection under ``kernel`` (A: inputs + (rank,), B: (rank,) + features;
        ``scale`` and ``dropout`` from :func:`adapting`), or None without one. Computed through the
        rank, never as a merged kernel, so the base kernel's product is unchanged (B = 0 adds
        exact zeros) and its gradient is never formed."""
        if not self.has_variable(LORA, "kernel"):
            return None
        adapter = self.get_variable(LORA, "kernel")
        scale, rate = _ADAPTING.get()
        if rate > 0:
            keep = jax.random.bernoulli(self.make_rng("dropout"), 1.0 - rate, x.shape)
            x = jnp.where(keep, x / (1.0 - rate), 0).astype(x.dtype)
        low = project(x, adapter["a"], None, self.contract, self.dtype)
        return project(low * jnp.asarray(scale, low.dtype), adapter["b"], None, 1, self.dtype)

    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        kernel, bias = self.weights(tuple(x.shape[x.ndim - self.contract :]))
        y = project(x, kernel, bias, self.contract, self.dtype, self.matmul)
        delta = self.adapter(x)
        return y if delta is None else y + delta


# ---------------------------------------------------------------------------------------------
# Normalisation


class OffsetRMSNorm(nn.Module):
    """RMSNorm whose scale is kept as ``w`` and multiplies by ``offset + w``: Gemma's ``1 + w``
    (``offset=1``, its scales starting at 0, so that a checkpoint's ``w`` is held as the file holds
    it, in bfloat16 too). Computed in float32 and returned in ``dtype``, as Gemma's::

        y = OffsetRMSNorm(offset=1.0, epsilon=1e-6, names=("embed",), name="norm_1")(x)

    ``names`` are the logical names of the scale's one axis."""

    offset: float = 1.0
    epsilon: float = 1e-6
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32
    names: tuple[str | None, ...] = (None,)

    @nn.compact
    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        init = nn.with_logical_partitioning(nn.initializers.constant(1.0 - self.offset), self.names)
        scale = self.param("scale", init, (x.shape[-1],), self.param_dtype)
        x = x.astype(jnp.float32)
        y = x * jax.lax.rsqrt(jnp.mean(jnp.square(x), axis=-1, keepdims=True) + self.epsilon)
        return (y * (self.offset + scale.astype(jnp.float32))).astype(self.dtype)


# ---------------------------------------------------------------------------------------------
# The output layer over a vocabulary


def mask_unused_vocab(logits: jnp.ndarray, used: int) -> jnp.ndarray:
    """``logits`` (..., vocab) with the ids at or above ``used`` (the padding of a vocabulary padded
    to a round size) at the dtype's lowest number, so they are never predicted and their rows get
    no gradient; ``logits`` itself when ``used`` is 0 or the whole vocabulary."""
    vocab = logits.shape[-1]
    if not 0 < used < vocab:
        return logits
    return jnp.where(jnp.arange(vocab) < used, logits, jnp.finfo(logits.dtype).min)


@flax.struct.dataclass
class Head:
    """A model's output layer over a vocabulary, as arrays: ``logits = features @ kernel + bias`` in
    float32, the ids at or above ``used`` masked (:func:`mask_unused_vocab`). What a model with
    ``features`` and ``head`` methods hands a loss that computes the logits in pieces and never
    whole (:func:`jaxnet.blockwise.cross_entropy`); its ``unembed`` is :meth:`logits`.

    ``kernel`` is (width, vocab), or (vocab, width) with ``transposed`` (an output tied to the
    token embedding); ``bias`` (vocab,) or None; ``dtype`` the compute dtype of the products;
    ``softcap`` (0: none) caps the logits as ``softcap * tanh(logits / softcap)`` (Gemma 2's final
    logits), before the unused ids are masked::

        head = Head(embedding, transposed=True, used=50257)   # GPT-2's tied output, padded vocabulary
        logits = head.logits(features)                        # (..., vocab), float32
    """

    kernel: jax.Array
    bias: jax.Array | None = None
    transposed: bool = flax.struct.field(pytree_node=False, default=False)
    used: int = flax.struct.field(pytree_node=False, default=0)
    dtype: Any = flax.struct.field(pytree_node=False, default=jnp.float32)
    softcap: float = flax.struct.field(pytree_node=False, default=0.0)

    @property
    def vocab(self) -> int:
        """The number of ids (columns of the logits), the padding included."""
        return self.kernel.shape[0 if self.transposed else 1]

    def logits(self, features: jnp.ndarray) -> jnp.ndarray:
        """Logits (..., vocab) of ``features`` (..., width): the product in ``dtype``, then float32
        (or ``dtype`` if wider), the unused ids masked."""
        contract = 1 if self.transposed else 0
        x, kernel = features.astype(self.dtype), self.kernel.astype(self.dtype)
        logits = jax.lax.dot_general(x, kernel, (((x.ndim - 1,), (contract,)), ((), ())))
        if self.bias is not None:
            logits = logits + self.bias.astype(self.dtype)
        logits = logits.astype(jnp.promote_types(self.dtype, jnp.float32))
        if self.softcap:
            logits = soft_cap(logits, self.softcap)
        return mask_unused_vocab(logits, self.used)


def soft_cap(logits: jnp.ndarray, cap: float) -> jnp.ndarray:
    """``cap * tanh(logits / cap)``: logits squeezed smoothly into (-cap, cap), nearly unchanged
    well inside it (Gemma 2's soft-capping of attention and output logits)::

        soft_cap(jnp.array([1.0, 100.0]), 30.0)   # [0.9996, 29.92]
    """
    return jnp.asarray(cap, logits.dtype) * jnp.tanh(logits / jnp.asarray(cap, logits.dtype))


# ---------------------------------------------------------------------------------------------
# Losses a model adds to its task's (a router's load-balancing loss)

#: The collection a model sows the losses it adds into (:func:`add_loss`).
LOSSES = "losses"


def add_loss(module: nn.Module, name: str, value: jnp.ndarray) -> None:
    """Add ``value`` (a scalar, its coefficient applied) to the objective the train step minimises,
    logged as ``name``: every module's losses of one name are summed (:func:`added_losses`). The
    train step collects them; evaluation and prediction do not, so their ``loss`` is the task's
    alone. Call it from a Linen module's ``__call__``::

        add_loss(self, "router_z", 1e-3 * jnp.mean(jax.nn.logsumexp(router_logits, -1) ** 2))
    """
    if module.is_initializing():  # a model's variables never hold them
        return
    module.sow(LOSSES, name, jnp.asarray(value, jnp.float32), reduce_fn=lambda a, b: a + b, init_fn=lambda: 0.0)


#: The collection a model sows figures it reports into (:func:`add_stat`).
STATS = "stats"


def add_stat(module: nn.Module, name: str, value: jnp.ndarray) -> None:
    """Report ``value`` (a scalar) as the train metric ``name`` (a mixture's expert load): logged
    with the train step's metrics, never added to the objective; the same name from several calls
    is summed. Training collects them; evaluation and prediction do not::

        add_stat(self, f"moe/{self.name}/load_max", counts.max() / counts.mean())
    """
    if module.is_initializing():
        return
    module.sow(STATS, name, jnp.asarray(value, jnp.float32), reduce_fn=lambda a, b: a + b, init_fn=lambda: 0.0)


def added_losses(collection: Any) -> dict[str, jnp.ndarray]:
    """The losses a model added (its :data:`LOSSES` collection after ``apply``; or the figures of
    its :data:`STATS`), summed by name over the modules that added them, in the order first met."""
    totals: dict[str, jnp.ndarray] = {}
    for path, value in jax.tree_util.tree_flatten_with_path(collection)[0]:
        name = str(getattr(path[-1], "key", path[-1]))
        totals[name] = totals[name] + value if name in totals else value
    return totals

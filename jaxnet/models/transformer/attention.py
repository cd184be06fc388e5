"""Self-attention: rotary positions, the one attention function (:func:`attend`) and the module
with its key/value cache.

:func:`attend` is softmax(Q K^T / sqrt(d)) V for training, evaluation and decoding alike, on
every kernel: XLA's (``jax.nn.dot_product_attention``), cuDNN's fused flash attention (the same
call) and the head-major form XLA runs fastest on a CPU (:func:`head_major_attention`). Keys and
values may have fewer heads than queries (grouped-query attention: each key/value head serves
``heads // kv_heads`` query heads), and an optional boolean ``mask`` says which keys each query
sees (the decoding cache's filled positions; examples packed into one row).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import math
from collections.abc import Iterator
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from jaxnet import _startup
from jaxnet.models.common import ATTENTION_OUTPUT, Projection, project, soft_cap, step_platform
from jaxnet.models.transformer import context
from jaxnet.models.transformer.norms import norm
from jaxnet.models.transformer.spec import TransformerSpec

#: The kernel a decoding step attends with: JAX's choice for a few queries over the masked cache.
DECODE_KERNEL = None


def rotary(
    x: jnp.ndarray,
    positions: jnp.ndarray,
    base: float = 10000.0,
    llama3: tuple[float, float, float, int] | None = None,
    linear: float = 1.0,
) -> jnp.ndarray:
    """Rotary position embedding of ``x`` (batch, time, heads, head_dim) at ``positions`` (time,),
    or (batch, time) when each row has its own.

    The two halves of the head dimension are rotated as pairs by angles ``position * base**(-2i/d)``,
    so the product of a rotated query and key depends only on their distance (the half-split
    convention of transformers' Llama, so its q/k weights need no permutation). ``llama3``
    (factor, low and high frequency factors, original context) rescales the frequencies as Llama
    3.1 does (:func:`llama3_frequencies`); ``linear`` divides every frequency by it (linear rope
    scaling, Gemma 3's global layers)::

        q = rotary(q, jnp.arange(q.shape[1]), base=500000.0, llama3=(8.0, 1.0, 4.0, 8192))
    """
    half = x.shape[-1] // 2
    freqs = base ** (-jnp.arange(half, dtype=jnp.float32) / half)
    if llama3 is not None:
        freqs = llama3_frequencies(freqs, *llama3)
    if linear != 1.0:
        freqs = freqs / linear
    angles = positions.astype(jnp.float32)[..., None] * freqs
    cos, sin = jnp.cos(angles)[..., None, :], jnp.sin(angles)[..., None, :]  # (..., time, 1, half)
    x1, x2 = x[..., :half].astype(jnp.float32), x[..., half:].astype(jnp.float32)
    return jnp.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1).astype(x.dtype)


def llama3_frequencies(
    freqs: jnp.ndarray, factor: float, low_freq_factor: float, high_freq_factor: float, original_context: int
) -> jnp.ndarray:
    """Rotary frequencies rescaled as Llama 3.1 rescales them (Meta's ``apply_scaling``, transformers'
    ``rope_type: llama3``): wavelengths shorter than ``original_context / high_freq_factor`` are
    kept, those longer than ``original_context / low_freq_factor`` divided by ``factor``, and those
    between interpolated smoothly between the two::

        llama3_frequencies(500000.0 ** (-jnp.arange(64) / 64), 8.0, 1.0, 4.0, 8192)
    """
    wavelength = 2 * math.pi / freqs
    low, high = original_context / low_freq_factor, original_context / high_freq_factor
    scaled = jnp.where(wavelength > low, freqs / factor, freqs)
    smooth = (original_context / wavelength - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelength >= high) & (wavelength <= low)
    return jnp.where(medium, smoothed, scaled)


def head_major_attention(
    q: jnp.ndarray,
    k: jnp.ndarray,
    v: jnp.ndarray,
    is_causal: bool = True,
    mask: jnp.ndarray | None = None,
    local_window_size: tuple[int, int] | None = None,
    scale: float | None = None,
    softcap: float = 0.0,
) -> jnp.ndarray:
    """``jax.nn.dot_product_attention``'s XLA softmax(QK^T / sqrt(d))V on (batch, time, heads,
    head_dim) queries and (batch, time, kv_heads, head_dim) keys and values, with the heads moved
    ahead of time first, equal to it up to float rounding. ``mask`` (broadcastable to (batch,
    heads, time, time)) is True where a query may see a key; ``local_window_size`` ``(left,
    right)`` limits query ``i`` to keys ``i - left`` .. ``i + right``, as JAX's does; ``scale``
    multiplies the logits in place of 1 / sqrt(d); ``softcap`` (0: none) caps the scaled logits
    as ``softcap * tanh(logits / softcap)`` before the mask, which JAX's function cannot.

    On a CPU, XLA runs this form's products and softmax (forward and backward) in about half the
    time of ``jax.nn.dot_product_attention``'s (scripts/profile_cpu.py).
    """
    logits_dtype = jnp.promote_types(q.dtype, jnp.float32)
    batch, length, heads, head_dim = q.shape
    kv_heads = k.shape[2]
    k, v = jnp.swapaxes(k, 1, 2), jnp.swapaxes(v, 1, 2)  # (batch, kv_heads, time, head_dim)
    if kv_heads == heads:
        q = jnp.swapaxes(q, 1, 2)
        logits = jnp.einsum("bnth,bnsh->bnts", q, k, preferred_element_type=logits_dtype)
    else:  # each key/value head serves a group of query heads
        q = q.reshape(batch, length, kv_heads, heads // kv_heads, head_dim).transpose(0, 2, 3, 1, 4)
        logits = jnp.einsum("bkgth,bksh->bkgts", q, k, preferred_element_type=logits_dtype)
        logits = logits.reshape(batch, heads, length, -1)
    logits *= jnp.array(1.0 / math.sqrt(head_dim) if scale is None else scale, logits.dtype)
    if softcap:
        logits = soft_cap(logits, softcap)
    visible = jnp.tril(jnp.ones(logits.shape[-2:], bool)) if is_causal else None
    if local_window_size is not None:
        band = window_mask(logits.shape[-2], logits.shape[-1], *local_window_size)
        visible = band if visible is None else visible & band
    if mask is not None:
        visible = mask if visible is None else visible & mask
    if visible is not None:
        logits = jnp.where(visible, logits, jnp.asarray(0.7 * jnp.finfo(logits.dtype).min, logits.dtype))
    probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1).astype(k.dtype)
    if kv_heads == heads:
        return jnp.swapaxes(jnp.einsum("bnts,bnsh->bnth", probs, v), 1, 2)
    probs = probs.reshape(batch, kv_heads, heads // kv_heads, length, -1)
    out = jnp.einsum("bkgts,bksh->btkgh", probs, v)
    return out.reshape(batch, length, heads, head_dim)


_IN_A_PIECE = contextvars.ContextVar("jaxnet_in_a_piece", default=False)


@contextlib.contextmanager
def in_a_piece() -> Iterator[None]:
    """Inside, the code traced computes one piece of a batch its caller has already cut
    (:meth:`~jaxnet.models.transformer.model.TransformerLanguageModel.features`): :func:`cpu_pieces`
    answers 1, so the attention is not cut again."""
    token = _IN_A_PIECE.set(True)
    try:
        yield
    finally:
        _IN_A_PIECE.reset(token)


def cpu_pieces(batch: int, most: int | None = None) -> int:
    """How many independent pieces of the batch :func:`attend` computes a CPU's head-major attention
    in: the largest divisor of ``batch`` up to the threads of XLA's CPU client (the cores this
    process may use, unless ``$PJRT_NPROC`` or ``$NPROC`` says otherwise) and up to ``most``
    (None: no other bound), or 1 off a CPU,
    under a mesh of more than one device (each device's work is its own there), for a symbolic
    batch size (``jax.export``'s) and :func:`in_a_piece` (a piece already).

    XLA's CPU runtime computes each batched product of attention (Q K^T, P V and their gradients)
    on one thread, whatever the cores: the attention of the ``transformer`` benchmark case gained
    only 1.1-1.4x from a second core. It runs independent operations side by side, one a
    thread, so ``n`` pieces of the batch, each attention whole for its rows, keep ``n`` cores busy
    (``python scripts/profile_attention.py``; benchmarks/results/attention-pieces-cpu-*.json).
    """
    mesh = jax.sharding.get_abstract_mesh()
    if _IN_A_PIECE.get() or not isinstance(batch, int):
        return 1
    if step_platform() != "cpu" or (not mesh.empty and mesh.size > 1):
        return 1
    bound = min(_startup.xla_cpu_threads(), batch, most or batch)
    return max(d for d in range(1, bound + 1) if batch % d == 0)


def per_piece(a: jnp.ndarray | None, pieces: int, batch: int, rank: int) -> list:
    """``a`` for each of ``pieces`` equal parts of a batch of ``batch`` rows: cut along axis 0 where
    it has a row per example (``rank`` axes, the first ``batch`` long), else the same ``a`` (None,
    or one shared by every example, such as positions (time,) or a mask (1, 1, time, time'))."""
    if a is not None and a.ndim == rank and a.shape[0] == batch:
        return jnp.split(a, pieces)
    return [a] * pieces


def in_pieces(
    fn: Any, pieces: int, q: jnp.ndarray, k: jnp.ndarray, v: jnp.ndarray, mask: Any, **kw: Any
) -> jnp.ndarray:
    """``fn(q, k, v, mask=mask, **kw)`` computed on ``pieces`` equal parts of the batch (axis 0) and
    joined again: the same numbers, as independent operations (:func:`cpu_pieces`). A ``mask``
    (broadcastable to (batch, heads, time, time')) is cut with the batch where it has a row per
    example, and serves every piece whole where it has none."""
    if pieces == 1:
        return fn(q, k, v, mask=mask, **kw)
    rows = [jnp.split(a, pieces) for a in (q, k, v)]
    masks = per_piece(mask, pieces, q.shape[0], rank=4)
    return jnp.concatenate([fn(a, b, c, mask=m, **kw) for a, b, c, m in zip(*rows, masks, strict=True)])


def window_mask(queries: int, keys: int, left: int, right: int = 0) -> jnp.ndarray:
    """(queries, keys), True where key ``j`` lies within ``left`` positions before query ``i`` and
    ``right`` after it (``i - left <= j <= i + right``)::

        window_mask(4, 4, 1).astype(int)   # [[1,0,0,0],[1,1,0,0],[0,1,1,0],[0,0,1,1]]
    """
    i, j = jnp.arange(queries)[:, None], jnp.arange(keys)[None, :]
    return (j >= i - left) & (j <= i + right)


def attention_fn(kernel: str | None) -> Any:
    """The attention function of ``kernel`` (``model.attention`` resolved for the backend the model
    is built for): :func:`head_major_attention` for ``"xla_head_major"``, else
    ``jax.nn.dot_product_attention`` with ``kernel`` as its ``implementation`` (None: JAX's choice)."""
    if kernel == "xla_head_major":
        return head_major_attention
    return functools.partial(jax.nn.dot_product_attention, implementation=kernel)


def attend(
    q: jnp.ndarray,
    k: jnp.ndarray,
    v: jnp.ndarray,
    *,
    causal: bool,
    kernel: str | None,
    mask: jnp.ndarray | None = None,
    window: int = 0,
    scale: float | None = None,
    softcap: float = 0.0,
    segments: jnp.ndarray | None = None,
    context_attention: str = "auto",
) -> jnp.ndarray:
    """softmax(Q K^T / sqrt(head_dim)) V: queries (batch, time, heads, head_dim), keys and values
    (batch, time', kv_heads, head_dim) with ``kv_heads`` dividing ``heads`` -> (batch, time,
    heads, head_dim). ``causal`` hides later keys; ``window`` (a local layer's) hides keys more
    than ``window - 1`` positions before the query; ``mask`` (True where a query sees a key,
    broadcastable to (batch, heads, time, time')) hides others, as do ``segments`` (batch, time),
    the examples packed in each row (:func:`segment_mask`); ``scale`` multiplies Q K^T in place of
    1 / sqrt(head_dim); ``softcap`` (0: none) caps the scaled logits as ``softcap * tanh(logits /
    softcap)`` (Gemma 2). ``kernel`` picks the computation (:func:`attention_fn`), but soft-capped
    logits are always :func:`head_major_attention`'s (no fused kernel caps them: ``model.attention=auto``
    then resolves to XLA's); :func:`head_major_attention` runs in :func:`cpu_pieces` pieces of the
    batch; every caller (training, evaluation, decoding) comes through here::

        out = attend(q, k, v, causal=True, kernel="xla", window=4096)

    Under sharding rules that split the sequence (``mesh.context`` > 1) the tokens are in the order
    :func:`~jaxnet.models.transformer.context.balanced_order` gives and attention works across the
    devices (:func:`jaxnet.models.transformer.context.attention`, ``context_attention``: ``ring``,
    ``gather`` or ``auto``), the examples of packed rows kept apart by ``segments`` (a ``mask``
    there is an error: it would be as long as the sequence squared).
    """
    if context.split()[1] > 1:
        if mask is not None:
            raise ValueError("attention over a sequence split by mesh.context takes segments, not a mask")
        if softcap:
            raise ValueError("soft-capped attention logits over a sequence split by mesh.context are not computed")
        return context.attention(
            q, k, v, causal=causal, window=window, segments=segments, how=context_attention, scale=scale
        )
    if segments is not None:
        mask = segment_mask(segments) if mask is None else mask & segment_mask(segments)
    local = {"local_window_size": (window - 1, 0)} if window else {}
    if softcap or kernel == "xla_head_major":
        kw = {"is_causal": causal, "scale": scale, "softcap": softcap, **local}
        return in_pieces(head_major_attention, cpu_pieces(q.shape[0]), q, k, v, mask, **kw)
    return attention_fn(kernel)(q, k, v, is_causal=causal, mask=mask, scale=scale, **local)


def segment_mask(segments: jnp.ndarray) -> jnp.ndarray:
    """Which keys each query may see in rows of packed examples: ``segments`` (batch, time) numbers
    the examples of a row (0 for padding) -> (batch, 1, time, time), True where query and key belong
    to the same example (padding sees padding only, so no row of the softmax is empty); with the
    causal rule, attention stays inside each example::

        segment_mask(jnp.array([[1, 1, 2, 0]]))[0, 0].astype(int)   # [[1,1,0,0],[1,1,0,0],[0,0,1,0],[0,0,0,1]]
    """
    return segments[:, None, :, None] == segments[:, None, None, :]


def _packed_draw(key: jax.Array, spec: TransformerSpec, index: int, std: float = 0.02) -> Any:
    """Kernel initialiser of part ``index`` (0 queries, 1 keys, 2 values) of one N(0, std) draw of
    shape (width, 3, heads, head_dim) from ``key``: the weights a run started from when the three
    were one packed kernel, so a fresh run starts where it always did."""

    def init(_: jax.Array, shape: tuple, dtype: Any) -> jnp.ndarray:
        packed = jax.random.normal(key, (spec.width, 3, spec.heads, spec.head_dim), dtype) * jnp.array(std, dtype)
        return packed[:, index].reshape(shape)

    return init


class _PackedKey(nn.Module):
    """The random key the packed ``qkv`` kernel was drawn from (its scope's first ``params`` key)."""

    @nn.compact
    def __call__(self) -> jax.Array:
        return self.make_rng("params")


class SelfAttention(nn.Module):
    """Self-attention of a :class:`TransformerSpec`: queries, keys and values (each a
    :class:`~jaxnet.models.common.Projection`: ``query``, ``key``, ``value``; keys and values of
    ``spec.kv_heads`` heads), rotary positions if the spec says so, :func:`attend`, and the output
    projection ``out``. With ``decode=True`` (a causal model) the keys and values of each call are
    appended to a cache of ``spec.context`` positions of ``kv_heads`` heads (the ``cache``
    collection) and the queries attend to every position filled so far; a local layer's cache
    keeps only its window's last positions (:meth:`window_cache`).

    ``positions`` are the positions of ``x``'s tokens: (time,), or (batch, time) for rows that
    restart them. ``mask`` (True where a query may see a key, broadcastable to (batch, heads,
    time, time)) is added to the causal rule: examples packed into one row that must not see
    each other; on a sequence split over ``mesh.context``, ``segments`` (batch, time) say the same
    (:func:`attend`). ``index`` is the block's number: its :class:`~jaxnet.models.transformer.spec.Layer`
    says whether it attends to every earlier position or to a window, and its rotary base.
    """

    spec: TransformerSpec
    index: int = 0

    def window_cache(
        self, q: jnp.ndarray, k: jnp.ndarray, v: jnp.ndarray, positions: jnp.ndarray, window: int, scaling: dict
    ) -> jnp.ndarray:
        """Decoding attention of a local layer over a cache of ``window`` positions, not the
        context's: position ``p`` is kept in slot ``p % window`` (a ring), so the cache holds the
        last ``window`` keys and values, all a local layer's queries ever see. A call's queries
        attend to the cache as it was (each slot's position known from the first new position)
        and to the call's own keys, then its last ``window`` keys are written into their slots; a
        call may bring more positions than the window (a prompt decoded at once)."""
        s = self.spec
        batch, length = k.shape[:2]
        shape = (batch, window, s.kv_heads, s.head_dim)
        cached_k = self.variable("cache", "cached_key", jnp.zeros, shape, k.dtype)
        cached_v = self.variable("cache", "cached_value", jnp.zeros, shape, v.dtype)
        start = positions[0]
        slots = jnp.arange(window)
        held = start - 1 - jnp.mod(start - 1 - slots, window)  # each slot's latest position before start (< 0: none)
        seen = jnp.concatenate([held, positions])  # the positions of the keys attended to
        visible = (seen[None, :] >= 0) & (seen[None, :] <= positions[:, None])
        visible &= seen[None, :] > positions[:, None] - window
        keys = jnp.concatenate([cached_k.value, k], axis=1)
        values = jnp.concatenate([cached_v.value, v], axis=1)
        out = attend(q, keys, values, causal=False, kernel=DECODE_KERNEL, mask=visible[None, None], **scaling)
        kept = min(length, window)
        write = jnp.mod(positions[length - kept :], window)
        cached_k.value = cached_k.value.at[:, write].set(k[:, length - kept :])
        cached_v.value = cached_v.value.at[:, write].set(v[:, length - kept :])
        return out

    @nn.compact
    def __call__(
        self,
        x: jnp.ndarray,
        positions: jnp.ndarray,
        decode: bool = False,
        mask: jnp.ndarray | None = None,
        segments: jnp.ndarray | None = None,
    ) -> jnp.ndarray:
        s = self.spec
        layer = s.layer(self.index)
        batch = x.shape[0]
        packed = None
        if s.kv_heads == s.heads and self.is_initializing():
            packed = _PackedKey(name="qkv")()

        def projection(name: str, heads: int, axis: str, index: int) -> Projection:
            init = None if packed is None else _packed_draw(packed, s, index)
            return Projection(
                (heads, s.head_dim),
                ("embed", axis, "kv"),
                dtype=s.dtype,
                param_dtype=s.param_dtype,
                use_bias=s.biased("qkv"),
                kernel_init=init,
                matmul=s.matmul,
                name=name,
            )

        projections = [
            projection("query", s.heads, "heads", 0),
            projection("key", s.kv_heads, "kv_heads", 1),
            projection("value", s.kv_heads, "kv_heads", 2),
        ]
        if s.kv_heads == s.heads:
            # One product over the three kernels stacked (width, 3, heads, head_dim), split by head
            # like each: the numbers of the packed kernel of before, and a third of the products.
            weights = [p.weights((s.width,)) for p in projections]
            kernel = jnp.stack([k for k, _ in weights], axis=1)
            bias = jnp.stack([b for _, b in weights]) if s.biased("qkv") else None
            qkv = project(x, kernel, bias, 1, s.dtype, s.matmul)
            qkv = nn.with_logical_constraint(qkv, ("batch", context.LENGTH, None, "heads", None))
            q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
            deltas = [p.adapter(x) for p in projections]  # LoRA adapters' terms, each through its rank
            q, k, v = (a if d is None else a + d for a, d in zip((q, k, v), deltas, strict=True))
        else:
            q, k, v = (p(x) for p in projections)
            q = nn.with_logical_constraint(q, ("batch", context.LENGTH, "heads", None))
            k, v = (nn.with_logical_constraint(a, ("batch", context.LENGTH, "kv_heads", None)) for a in (k, v))
        if s.qk_norm:  # each head's queries and keys, over its head_dim, before the positions
            q, k = (norm(s, name, "kv", "rms")(a) for a, name in ((q, "query_norm"), (k, "key_norm")))
        if s.position == "rotary":
            q, k = (rotary(a, positions, layer.rope_theta, layer.rope_llama3, layer.rope_linear) for a in (q, k))
        scaling = {
            "scale": s.attention_scale_dim**-0.5 if s.attention_scale_dim else None,
            "softcap": s.attention_softcap,
        }
        if decode and 0 < layer.window < s.context:
            out = self.window_cache(q, k, v, positions, layer.window, scaling)
        elif decode:
            if not s.causal:
                raise ValueError("decoding with a key/value cache needs a causal model (causal=True)")
            shape = (batch, s.context, s.kv_heads, s.head_dim)
            cached_k = self.variable("cache", "cached_key", jnp.zeros, shape, k.dtype)
            cached_v = self.variable("cache", "cached_value", jnp.zeros, shape, v.dtype)
            start = positions[0]
            cached_k.value = jax.lax.dynamic_update_slice(cached_k.value, k, (0, start, 0, 0))
            cached_v.value = jax.lax.dynamic_update_slice(cached_v.value, v, (0, start, 0, 0))
            filled = jnp.arange(s.context)[None, :] <= positions[:, None]  # (query, key)
            if layer.window:
                filled &= jnp.arange(s.context)[None, :] > positions[:, None] - layer.window
            visible = filled[None, None] if mask is None else filled[None, None] & mask
            out = attend(q, cached_k.value, cached_v.value, causal=False, kernel=DECODE_KERNEL, mask=visible, **scaling)
        else:
            out = attend(
                q,
                k,
                v,
                causal=s.causal,
                kernel=s.attention,
                mask=mask,
                window=layer.window,
                segments=segments,
                context_attention=s.context_attention,
                **scaling,
            )
        out = checkpoint_name(out, ATTENTION_OUTPUT)  # what model.remat=minimal keeps
        return Projection(
            (s.width,),
            ("heads", "kv", "embed"),
            contract=2,
            std=s.out_std,
            use_bias=s.biased("out"),
            dtype=s.dtype,
            param_dtype=s.param_dtype,
            matmul=s.matmul,
            name="out",
        )(out)

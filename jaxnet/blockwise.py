"""The cross-entropy of a language model's output layer, computed in blocks: the logits never exist whole.

A language model's last layer scores every id of the vocabulary at every position: for a batch of
64 x 1,024 tokens and GPT-2's 50,304 ids that is 3.3 G numbers (13 GB in float32), written once,
read back for the softmax and written again for its gradient. :func:`cross_entropy` takes the final
hidden states and the output layer (:class:`~jaxnet.models.common.Head`) instead of the logits and
walks the positions in blocks (a ``lax.scan``): each block's logits over the whole vocabulary are
made, reduced to the loss and turned into their gradient at once (the gradients with respect to the
hidden states, the output kernel and its bias, Liger's "fused linear cross-entropy"), and are gone
before the next block. The backward pass only scales what the forward pass kept, so a training step
multiplies by the output layer three times, as with the whole logits, not four.

Exact: the same values as the whole logits through :func:`jaxnet.tasks.cross_entropy`, and the
same gradients, to float32 rounding (the sums run in another order). It covers label smoothing
(spread over the used ids only), PaLM's z-loss (``z * logsumexp(logits)**2``), a per-token weight
(the batch's ``mask``), the padding ids of a padded vocabulary (never predicted, never counted), an
output tied to the embedding or not, with or without a bias, and logits soft-capped by the output
layer (``Head.softcap``, Gemma 2's ``c * tanh(logits / c)``: its gradient through the cap too).

Placement on a mesh. Under the run's sharding rules (:func:`jaxnet.parallel.under_rules`) every
block keeps the batch split as the features are (``batch``), the positions of each row split as
they are (``length``, over ``context``: each device walks its own piece of the sequence) and the
vocabulary split as the output layer is (``vocab``, over ``tensor``): the log-sum-exp and the
gradient of the hidden states are reduced across the tensor devices inside each block, and each
device adds its own tokens' gradient of the output layer into a partial sum of its own, reduced
across the batch and context devices once, after the last block. Outside such rules it is plain
single-device code.

Block size: ``block`` tokens of one device per block (whole positions of every row the device
holds); 0 picks as many as keep a block's float32 logits on one device near :data:`BLOCK_BYTES`.

>>> loss_sum, hit_sum = cross_entropy(features, head, labels, weights)  # doctest: +SKIP
>>> loss = loss_sum / jnp.maximum(weights.sum(), 1.0)                     # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxnet import optim
from jaxnet.models.common import Head, mask_unused_vocab, step_platform
from jaxnet.models.transformer.context import LENGTH

#: The float32 logits of one block on one device that ``block=0`` aims at, by platform (bytes):
#: see :func:`block_bytes`.
BLOCK_BYTES = {"cpu": 64 << 20, "gpu": 1 << 30}


def cross_entropy(
    features: jax.Array,
    head: Head,
    labels: jax.Array,
    weights: jax.Array | None = None,
    *,
    label_smoothing: Any = 0.0,
    z_loss: Any = 0.0,
    block: int = 0,
) -> tuple[jax.Array, jax.Array]:
    """``(loss_sum, hit_sum)``: the weighted sums over the positions of the softmax cross-entropy of
    ``head.logits(features)`` against ``labels`` (plus ``z_loss * logsumexp**2`` per position) and of
    the hits (1 where the label's logit is the largest, :func:`jaxnet.tasks.hits`), without ever
    holding the whole logits.

    ``features`` (rows, ..., width), ``labels`` (rows, ...) integer ids, ``weights`` like
    ``labels`` (None: all 1). ``loss_sum`` is differentiable with respect to ``features``, the head's
    kernel and bias and ``weights``; ``hit_sum`` is a metric (no gradient); ``label_smoothing`` and
    ``z_loss`` may be traced (a sweep's members) but get no gradient. ``block``: tokens of one
    device per block (0 = automatic, see the module docstring). For example, a masked mean::

        loss_sum, hits = cross_entropy(h, model_head, batch["targets"], mask)
        loss = loss_sum / jnp.maximum(mask.sum(), 1.0)
    """
    rows = labels.shape[0]
    length = math.prod(labels.shape[1:])
    width = features.shape[-1]
    if features.shape[:-1] != labels.shape:
        raise ValueError(f"features {features.shape} do not match labels {labels.shape} (plus a width axis)")
    h = features.reshape(rows, length, width)
    y = labels.reshape(rows, length).astype(jnp.int32)
    acc = jnp.promote_types(head.dtype, jnp.float32)  # what the logits and the sums are computed in
    w = jnp.ones((rows, length), acc) if weights is None else weights.reshape(rows, length).astype(acc)
    plan = _plan(rows, length, head, block, not optim.off(label_smoothing), not optim.off(z_loss))
    eps = jax.lax.stop_gradient(jnp.asarray(label_smoothing, acc))
    z = jax.lax.stop_gradient(jnp.asarray(z_loss, acc))
    # The output layer whole along the width on every device, once, before the blocks (an FSDP
    # split would otherwise be gathered again in every block).
    kernel = nn.with_logical_constraint(head.kernel, ("vocab", None) if head.transposed else (None, "vocab"))
    loss_sum, hit_sum = _fused(plan, h, kernel, head.bias, y, w, eps, z)
    return loss_sum, jax.lax.stop_gradient(hit_sum)


@dataclasses.dataclass(frozen=True)
class _Plan:
    """What the blocks are: ``shards`` groups of rows (one per batch device), ``pieces`` pieces of
    each row (one per context device), ``blocks`` blocks of ``per_block`` positions of each piece,
    the last ``pad`` positions of a piece padding (weight 0); the head's static settings; whether
    label smoothing and the z-loss are on."""

    shards: int
    pieces: int
    blocks: int
    per_block: int
    pad: int
    transposed: bool
    vocab: int
    used: int
    dtype: Any
    softcap: float
    smoothing: bool
    z_loss: bool
    gather_label: bool
    reuse_exp: bool


def _mesh_sizes(name: str) -> int:
    """How many devices the run's sharding rules split logical axis ``name`` over (1 outside them)."""
    rules = nn.get_logical_axis_rules()
    mesh = jax.sharding.get_abstract_mesh()
    if not rules or mesh.empty:
        return 1
    spec = nn.logical_to_mesh_axes((name,), rules)
    axes = spec[0] if spec is not None and len(spec) else None
    if axes is None:
        return 1
    axes = (axes,) if isinstance(axes, str) else tuple(axes)
    return math.prod(mesh.shape.get(a, 1) for a in axes)


def block_bytes(platform: str) -> int:
    """The float32 logits of one block on one device that ``block=0`` aims at on ``platform``: a
    CPU's share of its last-level cache, so that the passes over a block's logits stay in it; a
    GPU's enough for every block's product to make up for adding into the output layer's gradient
    (which is read and written once per block)."""
    return BLOCK_BYTES.get(platform, BLOCK_BYTES["gpu"])


def _positions_per_block(length: int, target: int) -> int:
    """Positions per block near ``target`` (at least 1): the largest divisor of ``length`` up to it
    when that is at least half of it (no padding), else ``target`` itself."""
    target = max(1, min(length, target))
    divisor = max(d for d in range(1, target + 1) if length % d == 0)
    return divisor if 2 * divisor >= target else target


def _plan(rows: int, length: int, head: Head, block: int, smoothing: bool, z_loss: bool) -> _Plan:
    platform = step_platform()
    shards = _mesh_sizes("batch")
    if rows % shards:
        shards = 1
    pieces = _mesh_sizes(LENGTH)
    if length % pieces:
        pieces = 1
    local_rows, local_length = rows // shards, length // pieces
    if block <= 0:
        local_vocab = -(-head.vocab // _mesh_sizes("vocab"))
        block = max(1, block_bytes(platform) // (4 * local_vocab))
    per_block = _positions_per_block(local_length, block // local_rows)
    blocks = -(-local_length // per_block)
    per_block = -(-local_length // blocks)  # the same number of blocks, evened out: the least padding
    used = head.used if 0 < head.used < head.vocab else head.vocab
    return _Plan(
        shards=shards,
        pieces=pieces,
        blocks=blocks,
        per_block=per_block,
        pad=blocks * per_block - local_length,
        transposed=head.transposed,
        vocab=head.vocab,
        used=used,
        dtype=head.dtype,
        softcap=head.softcap,
        smoothing=smoothing,
        z_loss=z_loss,
        # The label's logit by a gather on a CPU (a second reduction costs it 5 % more time there)
        gather_label=platform == "cpu",
        # The softmax's exponentials kept for its gradient on a CPU, where computing them twice over
        # the block cost its step 13 % (gpt2_shakespeare, scripts/compare_commits.py); a GPU makes
        # them again for free inside the gradient's fusion rather than write and read them
        reuse_exp=platform == "cpu",
    )


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _fused(plan: _Plan, h: jax.Array, kernel: jax.Array, bias: Any, y: jax.Array, w: jax.Array, eps: Any, z: Any):
    return _blocks(plan, h, kernel, bias, y, w, eps, z, grads=False)[0]


def _forward(plan: _Plan, h: jax.Array, kernel: jax.Array, bias: Any, y: jax.Array, w: jax.Array, eps: Any, z: Any):
    sums, grads = _blocks(plan, h, kernel, bias, y, w, eps, z, grads=True)
    return sums, (grads, (h, kernel, bias, w))


def _backward(plan: _Plan, saved: tuple, cotangents: tuple) -> tuple:
    grads, primals = saved
    g = cotangents[0]  # the hit sum is a metric: its cotangent is dropped (stop_gradient outside)
    scale = lambda x, primal: None if x is None else _like_primal((g * x).astype(x.dtype), primal)  # noqa: E731
    dh, dkernel, dbias, dw = (scale(x, primal) for x, primal in zip(grads, primals, strict=True))
    # No gradient for the labels, nor for label smoothing and the z-loss (stop_gradient outside).
    return dh, dkernel, dbias, None, dw, None, None


_fused.defvjp(_forward, _backward)


def _blocks(
    plan: _Plan,
    h: jax.Array,
    kernel: jax.Array,
    bias: jax.Array | None,
    y: jax.Array,
    w: jax.Array,
    eps: jax.Array,
    z: jax.Array,
    *,
    grads: bool,
) -> tuple[tuple[jax.Array, jax.Array], tuple | None]:
    """The blocks: the sums, and with ``grads`` the gradients of the loss sum (its cotangent 1)."""
    rows, length, width = h.shape
    s, c, n, p = plan.shards, plan.pieces, plan.blocks, plan.per_block
    used, dtype = plan.used, plan.dtype
    acc = jnp.promote_types(dtype, jnp.float32)

    def blocked(x: jax.Array) -> jax.Array:
        """(rows, length, ...) -> (blocks, shards, rows / shards, pieces, per_block, ...), each piece
        padded with zeros."""
        x = x.reshape(rows, c, length // c, *x.shape[2:])
        x = jnp.pad(x, [(0, 0), (0, 0), (0, plan.pad)] + [(0, 0)] * (x.ndim - 3))
        x = x.reshape(s, rows // s, c, n, p, *x.shape[3:])
        x = jnp.moveaxis(x, 3, 0)
        return nn.with_logical_constraint(x, (None, "batch", None, LENGTH) + (None,) * (x.ndim - 4))

    xs = (blocked(h), blocked(y), blocked(w))
    k = kernel.astype(dtype)
    # Einsum letters: s shards, r rows, c pieces, p positions, d width, v vocabulary.
    kernel_axes = "vd" if plan.transposed else "dv"
    ids = jnp.arange(plan.vocab)

    def block(carry: tuple, x: tuple) -> tuple:
        h_b, y_b, w_b = x
        # As the whole logits are made (Head.logits): the product in the compute dtype, then wider.
        logits = jnp.einsum(f"srcpd,{kernel_axes}->srcpv", h_b.astype(dtype), k)
        if bias is not None:
            logits = logits + bias.astype(dtype)
        logits = logits.astype(acc)
        logits = nn.with_logical_constraint(logits, ("batch", None, LENGTH, None, "vocab"))
        if plan.softcap:  # as Head.logits: capped, then the unused ids masked
            capped = jnp.tanh(logits / plan.softcap)
            logits = plan.softcap * capped
        logits = mask_unused_vocab(logits, used)
        top = jnp.max(logits, axis=-1)
        shifted = jnp.exp(logits - top[..., None])
        total = jnp.sum(shifted, axis=-1)
        lse = top + jnp.log(total)
        is_label = ids == y_b[..., None]
        if plan.gather_label:
            label_logit = jnp.take_along_axis(logits, y_b[..., None], axis=-1)[..., 0]
        else:  # a reduction beside the maximum's: one pass over the logits on a GPU (6 % less traffic)
            label_logit = jnp.sum(jnp.where(is_label, logits, 0.0), axis=-1)
        if plan.smoothing:  # the targets: 1 - eps on the label, eps spread over the used ids
            used_mean = jnp.sum(jnp.where(ids < used, logits, 0.0), axis=-1) / used
            loss = lse - (1.0 - eps) * label_logit - eps * used_mean
        else:
            loss = lse - label_logit
        if plan.z_loss:
            loss = loss + z * lse**2
        hit = (label_logit >= top).astype(acc)
        sums = (carry[0] + jnp.sum(w_b * loss), carry[1] + jnp.sum(w_b * hit))
        if not grads:
            return sums, None
        dkernel, dbias = carry[2:]
        if plan.reuse_exp:  # the exponentials the log-sum-exp made, scaled: no second exp over the block
            probs = shifted * (1.0 / total)[..., None]
        else:  # made again inside the gradient's fusion: no block-sized buffer of them between the two
            probs = jnp.exp(logits - lse[..., None])
        if plan.z_loss:
            probs = probs * (1.0 + 2.0 * z * lse)[..., None]
        if plan.smoothing:
            target = jnp.where(is_label, 1.0 - eps, 0.0) + jnp.where(ids < used, eps / used, 0.0)
        else:
            target = is_label.astype(acc)
        dlogits = w_b[..., None] * (probs - target)
        if plan.softcap:  # through the cap: d(c tanh(x / c)) / dx = 1 - tanh(x / c)**2
            dlogits = dlogits * (1.0 - capped * capped)
        dlogits = dlogits.astype(dtype)
        dlogits = nn.with_logical_constraint(dlogits, ("batch", None, LENGTH, None, "vocab"))
        # Made once: XLA on a CPU would otherwise make it again inside each of the two products.
        dlogits = jax.lax.optimization_barrier(dlogits)
        dh = jnp.einsum(f"srcpv,{kernel_axes}->srcpd", dlogits, k, preferred_element_type=acc)
        # Each batch and context device adds into a partial sum of its own (the leading shard and
        # piece axes), reduced across those devices once, after the last block; (width, vocab)
        # whether tied or not, so that the product reads the block's gradient as it lies
        # (transposed once, at the end).
        dk = jnp.einsum("srcpd,srcpv->scdv", h_b.astype(dtype), dlogits, preferred_element_type=acc)
        dkernel = nn.with_logical_constraint(dkernel + dk, ("batch", LENGTH, None, "vocab"))
        if dbias is not None:
            dbias = dbias + jnp.sum(dlogits.astype(acc), axis=(1, 3))
        return (*sums, dkernel, dbias), (dh.astype(h.dtype), loss)

    inputs = (h, kernel, bias, y, w)
    zero = _varying_like(jnp.zeros((), acc), inputs)
    if not grads:
        sums, _ = jax.lax.scan(block, (zero, zero), xs)
        return sums, None
    dkernel0 = _varying_like(jnp.zeros((s, c, width, plan.vocab), acc), inputs)
    dbias0 = None if bias is None else _varying_like(jnp.zeros((s, c, plan.vocab), acc), inputs)
    (loss_sum, hit_sum, dkernel, dbias), (dh, per_token) = jax.lax.scan(block, (zero, zero, dkernel0, dbias0), xs)

    def unblocked(x: jax.Array) -> jax.Array:
        """The inverse of ``blocked``, the padding dropped."""
        x = jnp.moveaxis(x, 0, 3).reshape(rows, c, n * p, *x.shape[5:])
        return x[:, :, : length // c].reshape(rows, length, *x.shape[3:])

    gradients = (
        unblocked(dh),
        (dkernel.sum((0, 1)).T if plan.transposed else dkernel.sum((0, 1))).astype(kernel.dtype),
        None if bias is None else dbias.sum((0, 1)).astype(bias.dtype),
        unblocked(per_token),
    )
    return (loss_sum, hit_sum), gradients


def _varying(x: Any) -> set[str]:
    """The manual mesh axes (inside ``shard_map``: ``parallel.mode=replicas``) over which ``x``'s
    value differs from device to device."""
    aval = jax.typeof(x)
    manual = getattr(aval, "manual_axis_type", None)  # jax 0.10; other versions say aval.vma
    return set(getattr(aval, "vma", None) or getattr(manual, "varying", None) or ())


def _varying_like(x: jax.Array, inputs: Any) -> jax.Array:
    """``x`` varying over every manual mesh axis any of ``inputs`` vary over, as a loop's carry
    must be to take their values."""
    axes = set().union(*(_varying(leaf) for leaf in jax.tree.leaves(inputs)))
    return jax.lax.pcast(x, tuple(sorted(axes)), to="varying") if axes else x


def _like_primal(cotangent: jax.Array | None, primal: Any) -> jax.Array | None:
    """``cotangent`` summed over the manual mesh axes it varies over and its primal does not: the
    gradient of a value every device shares is the sum of every device's part."""
    if cotangent is None:
        return None
    axes = _varying(cotangent) - _varying(primal)
    return jax.lax.psum(cotangent, tuple(sorted(axes))) if axes else cotangent


__all__ = ["BLOCK_BYTES", "block_bytes", "cross_entropy"]

"""Context parallelism: each row's sequence split over a mesh axis (``mesh.context``), and the
attention across the pieces.

Under a mesh whose sharding rules map the logical axis ``length`` (the sequence axis of the
activations) onto an axis of ``C`` > 1 devices, the Transformer splits every row into ``2C``
chunks of equal length and gives device ``d`` chunks ``d`` and ``2C - 1 - d``, one from the
start and one from the end (:func:`balanced_order`): under the causal rule a query at position
``i`` looks at ``i + 1`` keys, so this pairing gives every device the same amount of attention
work. The model puts the tokens (and their positions and segment ids) in that order once, on the
way in, and puts the final hidden states back in order once, on the way out (:func:`restore`,
two ``ppermute`` s of the hidden states); between the two, embeddings, norms and MLPs work on the
tokens each device holds, and only attention (:func:`attention`) looks across devices.

Attention is exact: the same softmax(QK^T / sqrt(d))V as on one device (the causal rule by each
token's index in its row, packed examples kept apart by their segment ids, a local layer's
window, grouped-query attention), computed blockwise with an online softmax, its backward pass
recomputing the probabilities from the saved log-sum-exp (a ``custom_vjp``). Two ways to bring
the keys and values to the queries, the same numbers either way (``model.context_attention``):

* ``ring``: each device passes its keys and values to the next one (``ppermute``), ``C - 1``
  times, and attends to each piece as it arrives; the backward pass sends the keys and values
  round again with their gradients. Each device holds two pieces at a time, and each transfer
  can hide under the attention of the piece before.
* ``gather``: every device gathers all the keys and values (``all_gather``) and the gradients
  are summed back to their owners (``psum_scatter``): two collectives a layer instead of ``C``,
  at the memory of the whole row's keys and values on every device.

``auto`` takes ``gather`` for chunks of at most :data:`GATHER_TOKENS` tokens a device (there the
attention of one ring step is too short to hide a transfer behind it, and the whole row's keys
and values are small) and ``ring`` above. Both move the same bytes: the keys and values of the
row, ``(C - 1) / C`` of them into every device, twice that in the backward pass.

On each device the work is done in blocks of at most ``block`` queries by ``block`` keys (a
``lax.scan``; blocks no query of which can see any key are skipped), so the memory of the scores
is that of one block, whatever the sequence. XLA computes each block; cuDNN's fused kernel does
not return the log-sum-exp that joining blocks needs, so it is not used here.

>>> balanced_order(8, 2).tolist()   # device 0: chunks 0 and 3; device 1: chunks 1 and 2
[0, 1, 6, 7, 2, 3, 4, 5]
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from jaxnet.errors import UserError

#: The logical name of the sequence axis of the activations (``("batch", LENGTH, ...)``); the
#: sharding rules map it onto ``mesh.context``.
LENGTH = "length"

#: ``auto`` gathers the keys and values when each device holds at most this many tokens of a row,
#: and passes them round a ring above (a rule of thumb, see the module docstring).
GATHER_TOKENS = 2048

#: The queries and keys of one block of the blockwise attention on a device (at most).
BLOCK = 1024

STRATEGIES = ("auto", "ring", "gather")


def split() -> tuple[str | None, int]:
    """``(mesh axis, devices)`` the sequence of the activations is split over in the sharding rules
    and mesh in scope (:func:`jaxnet.parallel.under_rules`); ``(None, 1)`` when it is not split."""
    rules = nn.get_logical_axis_rules()
    mesh = jax.sharding.get_abstract_mesh()
    if not rules or mesh.empty:
        return None, 1
    spec = nn.logical_to_mesh_axes((LENGTH,), rules)
    axis = spec[0] if spec is not None and len(spec) else None
    if axis is None:
        return None, 1
    if not isinstance(axis, str):
        raise ValueError(f"the sequence can be split over one mesh axis, not {axis}")
    ways = mesh.shape.get(axis, 1)
    return (axis, ways) if ways > 1 else (None, 1)


def check_length(length: int, ways: int, key: str | None = None) -> None:
    """A one-line :class:`~jaxnet.errors.UserError` unless ``length`` splits into ``2 * ways`` equal
    chunks (a chunk from the start and one from the end for each of ``ways`` devices); ``key`` names
    the setting that gave the length (``data.seq_len``)::

        check_length(4096, 4, "data.seq_len")    # fine: 8 chunks of 512
    """
    if ways <= 1 or length % (2 * ways) == 0:
        return
    unit = 2 * ways
    below, above = length // unit * unit, (length // unit + 1) * unit
    near = f"{below} or {above}" if below else str(above)
    what = f"{key}={length}" if key else f"a sequence of {length} tokens"
    fix = f"use {key}={near}" if key else f"use a length of {near}"
    raise UserError(
        f"{what} cannot be split over mesh.context={ways}: each device holds a chunk from the start of a row and "
        f"one from its end, so the length must be a multiple of 2 x {ways} = {unit}; {fix}, or another mesh.context"
    )


def balanced_order(length: int, ways: int) -> np.ndarray:
    """The positions of a row of ``length`` tokens in the order the devices hold them: the row cut
    into ``2 * ways`` chunks, device ``d`` holding chunk ``d`` then chunk ``2 * ways - 1 - d``::

        balanced_order(12, 3).tolist()   # [0, 1, 10, 11, 2, 3, 8, 9, 4, 5, 6, 7]
    """
    check_length(length, ways)
    chunks = np.arange(length).reshape(2 * ways, length // (2 * ways))
    return np.concatenate([np.concatenate([chunks[d], chunks[2 * ways - 1 - d]]) for d in range(ways)])


def _specs(*logical: tuple) -> list[jax.sharding.PartitionSpec]:
    rules = nn.get_logical_axis_rules()
    return [nn.logical_to_mesh_axes(names, rules) for names in logical]


def restore(x: jnp.ndarray) -> jnp.ndarray:
    """Activations ``x`` (batch, length, ...) in :func:`balanced_order` back in the row's order,
    each device then holding one contiguous piece: each device sends its chunk of even number and
    its chunk of odd number to the device that holds them in order (two ``ppermute`` s). Outside a
    context mesh, ``x`` itself::

        features = restore(x)   # (batch, length, width), the tokens in order
    """
    axis, ways = split()
    if ways == 1:
        return x
    check_length(x.shape[1], ways)
    (spec,) = _specs(("batch", LENGTH) + (None,) * (x.ndim - 2))

    def local(piece: jnp.ndarray) -> jnp.ndarray:
        d = jax.lax.axis_index(axis)
        c = piece.shape[1] // 2
        first, last = piece[:, :c], piece[:, c:]
        even = jnp.where(d % 2 == 0, first, last)  # of chunks d and 2C-1-d, exactly one is even
        odd = jnp.where(d % 2 == 0, last, first)
        pairs = zip((even, odd), _homes(ways), strict=True)
        return jnp.concatenate([x if _still(perm) else jax.lax.ppermute(x, axis, perm) for x, perm in pairs], axis=1)

    return jax.shard_map(local, in_specs=spec, out_specs=spec, check_vma=False)(x)


def _homes(ways: int) -> tuple[list[tuple[int, int]], ...]:
    """Where each device sends its chunk of even number and its chunk of odd number so that device
    ``j`` holds chunks ``2j`` and ``2j + 1``: two ``ppermute`` pairs lists."""
    chunk_of = lambda dev, parity: dev if dev % 2 == parity else 2 * ways - 1 - dev  # noqa: E731
    return tuple([(dev, chunk_of(dev, parity) // 2) for dev in range(ways)] for parity in (0, 1))


def _still(perm: list[tuple[int, int]]) -> bool:
    return all(a == b for a, b in perm)


def restore_moves(ways: int) -> int:
    """How many of :func:`restore`'s two ``ppermute`` s move anything over ``ways`` devices (with 2
    devices the even chunks are already where they belong)::

        restore_moves(2), restore_moves(8)   # (1, 2)
    """
    return sum(not _still(perm) for perm in _homes(ways))


def strategy(choice: str, length: int, ways: int) -> str:
    """``ring`` or ``gather`` for ``choice`` (``auto``: :data:`GATHER_TOKENS`) when each of ``ways``
    devices holds ``length / ways`` tokens of a row::

        strategy("auto", 131072, 8)   # 'ring'
    """
    if choice not in STRATEGIES:
        raise ValueError(f"model.context_attention={choice!r}: choose one of {', '.join(STRATEGIES)}")
    if choice != "auto":
        return choice
    return "gather" if length // ways <= GATHER_TOKENS else "ring"


def attention(
    q: jnp.ndarray,
    k: jnp.ndarray,
    v: jnp.ndarray,
    *,
    causal: bool,
    window: int = 0,
    segments: jnp.ndarray | None = None,
    how: str = "auto",
    block: int = BLOCK,
    scale: float | None = None,
) -> jnp.ndarray:
    """softmax(Q K^T / sqrt(head_dim)) V over a sequence split over the context axis: queries
    (batch, length, heads, head_dim), keys and values (batch, length, kv_heads, head_dim), their
    tokens in :func:`balanced_order`, as are ``segments`` (batch, length; tokens of different
    segments never see each other; None: one sequence per row). ``causal`` and ``window`` act on
    each token's index in its row, as :func:`~jaxnet.models.transformer.attention.attend`'s do on
    one device. ``how``: ``ring``, ``gather`` or ``auto`` (:func:`strategy`); ``block``: queries
    and keys of one block on a device; ``scale`` multiplies Q K^T in place of 1 / sqrt(head_dim).
    Called inside the sharding rules of a mesh with a context
    axis (:func:`split`)::

        out = attention(q, k, v, causal=True, segments=segments_in_balanced_order)
    """
    axis, ways = split()
    if ways == 1:
        raise ValueError("context.attention needs a mesh whose rules split the sequence (mesh.context > 1)")
    batch, length, heads, head_dim = q.shape
    kv_heads = k.shape[2]
    check_length(length, ways)
    q_spec, kv_spec, row_spec = _specs(
        ("batch", LENGTH, "heads", None), ("batch", LENGTH, "kv_heads", None), ("batch", LENGTH)
    )
    if kv_heads != heads and tuple(kv_spec)[2:3] != tuple(q_spec)[2:3]:
        # Key/value heads placed otherwise than the query heads (fewer than the tensor devices):
        # each query head's own key/value head, so that a device holds the pairs it needs.
        k, v = (jnp.repeat(a, heads // kv_heads, axis=2) for a in (k, v))
        kv_spec = q_spec
    chunk = length // (2 * ways)
    setup = _Setup(
        axis=axis,
        ways=ways,
        causal=causal,
        window=window,
        block=max(d for d in range(1, min(block, chunk) + 1) if chunk % d == 0),
        gather=strategy(how, length, ways) == "gather",
        scale=1.0 / math.sqrt(head_dim) if scale is None else scale,
    )
    if segments is None:
        run = lambda q, k, v: _attention(setup, q, k, v, None)  # noqa: E731
        specs = (q_spec, kv_spec, kv_spec)
        args = (q, k, v)
    else:
        run = lambda q, k, v, s: _attention(setup, q, k, v, s)  # noqa: E731
        specs = (q_spec, kv_spec, kv_spec, row_spec)
        args = (q, k, v, segments.astype(jnp.int32))
    return jax.shard_map(run, in_specs=specs, out_specs=q_spec, check_vma=False)(*args)


@dataclasses.dataclass(frozen=True)
class _Setup:
    """What the attention on one device is: the context ``axis`` of ``ways`` devices, the masks,
    the block size, ring or gather, the scale of the scores."""

    axis: str
    ways: int
    causal: bool
    window: int
    block: int
    gather: bool
    scale: float


# ---------------------------------------------------------------------------------------------
# On one device. The local queries, keys and values are two chunks each ("halves": chunk d and
# chunk 2C-1-d), kept on a leading axis of 2; queries are grouped by key/value head:
# (2, batch, chunk, kv_heads, groups, head_dim). Scores are (batch, kv_heads, groups, q, k).

_HIDDEN = -1e30  # the score of a key a query cannot see (finite: no inf - inf in the online softmax)


def _halves(x: jnp.ndarray) -> jnp.ndarray:
    """(batch, 2c, ...) -> (2, batch, c, ...)."""
    return jnp.moveaxis(x.reshape(x.shape[0], 2, x.shape[1] // 2, *x.shape[2:]), 1, 0)


def _whole(x: jnp.ndarray) -> jnp.ndarray:
    """The inverse of :func:`_halves`."""
    x = jnp.moveaxis(x, 0, 1)
    return x.reshape(x.shape[0], 2 * x.shape[2], *x.shape[3:])


def _indices(setup: _Setup, device: Any, c: int) -> jnp.ndarray:
    """(2, c): the index in the row of each token ``device`` holds, by half (chunks of ``c``)."""
    steps = jnp.arange(c, dtype=jnp.int32)
    return jnp.stack([device * c + steps, (2 * setup.ways - 1 - device) * c + steps])


def _acc(x: jnp.ndarray) -> Any:
    """The dtype scores and sums are kept in: float32, or the inputs' if wider."""
    return jnp.promote_types(x.dtype, jnp.float32)


def _visible(setup: _Setup, iq: jnp.ndarray, ik: jnp.ndarray, sq: Any, sk: Any) -> Any:
    """Which keys each query sees, broadcastable to the scores (batch, kv_heads, groups, q, k)."""
    seen = None
    if setup.causal:
        seen = ik[None, :] <= iq[:, None]
    if setup.window:
        near = ik[None, :] > iq[:, None] - setup.window
        seen = near if seen is None else seen & near
    if seen is not None:
        seen = seen[None, None, None]
    if sq is not None:
        same = (sq[:, :, None] == sk[:, None, :])[:, None, None]
        seen = same if seen is None else seen & same
    return True if seen is None else seen


def _may_see(setup: _Setup, iq: jnp.ndarray, ik: jnp.ndarray) -> Any:
    """Whether any query of a block (indices ``iq``, increasing) may see a key of a block (``ik``):
    None when every block may (no causal rule, no window)."""
    if not setup.causal and not setup.window:
        return None
    ok = jnp.array(True)
    if setup.causal:
        ok &= ik[0] <= iq[-1]
    if setup.window:
        ok &= ik[-1] > iq[0] - setup.window
    return ok


def _scores(setup: _Setup, q: jnp.ndarray, k: jnp.ndarray) -> jnp.ndarray:
    s = jnp.einsum("bqkgd,bskd->bkgqs", q, k, preferred_element_type=_acc(q))
    return s * jnp.array(setup.scale, s.dtype)


def _split_blocks(x: Any, size: int, axis: int) -> Any:
    """``axis`` of ``x`` cut into blocks of ``size``, the block number first (None stays None)."""
    if x is None:
        return None
    x = x.reshape(*x.shape[:axis], x.shape[axis] // size, size, *x.shape[axis + 1 :])
    return jnp.moveaxis(x, axis, 0)


def _join_blocks(x: jnp.ndarray, axis: int) -> jnp.ndarray:
    """The inverse of :func:`_split_blocks`."""
    x = jnp.moveaxis(x, 0, axis)
    return x.reshape(*x.shape[:axis], x.shape[axis] * x.shape[axis + 1], *x.shape[axis + 2 :])


def _skip_unless(ok: Any, compute: Any, skipped: Any, *args: Any) -> Any:
    return compute(*args) if ok is None else jax.lax.cond(ok, compute, skipped, *args)


def _block_forward(setup: _Setup, acc: tuple, q: tuple, kv: tuple) -> tuple:
    """One block of the online softmax: ``acc`` = (out sum (b, kv_heads, g, q, d), running max,
    running sum (b, kv_heads, g, q)) of queries ``q`` = (q, indices, segments) with the keys and
    values ``kv`` = (k, v, indices, segments) added."""
    qb, iqb, sqb = q
    kb, vb, ikb, skb = kv
    o, m, total = acc
    seen = _visible(setup, iqb, ikb, sqb, skb)
    s = jnp.where(seen, _scores(setup, qb, kb), _HIDDEN)
    m_new = jnp.maximum(m, s.max(-1))
    p = jnp.where(seen, jnp.exp(s - m_new[..., None]), 0.0)
    fade = jnp.exp(m - m_new)
    pv = jnp.einsum("bkgqs,bskd->bkgqd", p.astype(vb.dtype), vb, preferred_element_type=o.dtype)
    return o * fade[..., None] + pv, m_new, total * fade + p.sum(-1)


def _block_backward(setup: _Setup, dkv: tuple, q: tuple, kv: tuple) -> tuple:
    """One block of the backward pass: ``(dk, dv)`` of the block's keys and values with this
    block's part added, and the block's part of the queries' gradient, from queries ``q`` = (q,
    d_out, log-sum-exp, delta, indices, segments) and keys ``kv`` = (k, v, indices, segments)."""
    qb, dob, lseb, deltab, iqb, sqb = q
    kb, vb, ikb, skb = kv
    dkb, dvb = dkv
    seen = _visible(setup, iqb, ikb, sqb, skb)
    p = jnp.where(seen, jnp.exp(_scores(setup, qb, kb) - lseb[..., None]), 0.0)
    dvb = dvb + jnp.einsum("bkgqs,bqkgd->bskd", p.astype(dob.dtype), dob, preferred_element_type=dvb.dtype)
    dp = jnp.einsum("bqkgd,bskd->bkgqs", dob, vb, preferred_element_type=dvb.dtype)
    ds = (p * (dp - deltab[..., None]) * setup.scale).astype(qb.dtype)
    dkb = dkb + jnp.einsum("bkgqs,bqkgd->bskd", ds, qb, preferred_element_type=dkb.dtype)
    dqb = jnp.einsum("bkgqs,bskd->bqkgd", ds, kb, preferred_element_type=dkb.dtype)
    return (dkb, dvb), dqb


def _pair_forward(setup: _Setup, acc: tuple, q: tuple, kv: tuple) -> tuple:
    """:func:`_block_forward` over a chunk of queries and a chunk of keys, in blocks of at most
    ``setup.block`` by ``setup.block`` (queries one block after another, each walking the keys'
    blocks; blocks in which no query can see a key skipped)."""
    n = setup.block
    if q[0].shape[1] == n:  # one block
        return _block_forward(setup, acc, q, kv)
    q_blocks = tuple(_split_blocks(x, n, axis) for x, axis in zip(q, (1, 0, 1), strict=True))
    acc_blocks = tuple(_split_blocks(x, n, 3) for x in acc)
    kv_blocks = tuple(_split_blocks(x, n, axis) for x, axis in zip(kv, (1, 1, 0, 1), strict=True))

    def per_query(args: tuple) -> tuple:
        qb, a = args

        def step(a: tuple, kvb: tuple) -> tuple:
            ok = _may_see(setup, qb[1], kvb[2])
            return _skip_unless(ok, lambda a: _block_forward(setup, a, qb, kvb), lambda a: a, a), None

        return jax.lax.scan(step, a, kv_blocks)[0]

    out = jax.lax.map(per_query, (q_blocks, acc_blocks))
    return tuple(_join_blocks(x, 3) for x in out)


def _pair_backward(setup: _Setup, grads: tuple, q: tuple, kv: tuple) -> tuple:
    """``grads`` = (dq (b, c, kv_heads, g, d), dk (b, c, kv_heads, d), dv) plus the gradients of
    queries ``q`` = (q, d_out, log-sum-exp, delta, indices, segments) against keys and values
    ``kv`` = (k, v, indices, segments): :func:`_block_backward` block by block (keys one block
    after another, each walking the queries' blocks)."""
    n = setup.block
    dq, dk, dv = grads
    if q[0].shape[1] == n:  # one block
        (dk, dv), dq_part = _block_backward(setup, (dk, dv), q, kv)
        return dq + dq_part, dk, dv
    # the positions' axis: lse and delta are (b, kv_heads, g, c), the indices (c,)
    q_blocks = tuple(_split_blocks(x, n, axis) for x, axis in zip(q, (1, 1, 3, 3, 0, 1), strict=True))
    kv_blocks = tuple(_split_blocks(x, n, axis) for x, axis in zip((*kv, dk, dv), (1, 1, 0, 1, 1, 1), strict=True))

    def per_key(dq_sum: jnp.ndarray, kvb: tuple) -> tuple:
        keys, dkv = kvb[:4], kvb[4:]

        def per_query(carry: tuple, qb: tuple) -> tuple:
            def skipped(carry: tuple) -> tuple:
                return carry, jnp.zeros(qb[0].shape, carry[0].dtype)

            compute = lambda carry: _block_backward(setup, carry, qb, keys)  # noqa: E731
            return _skip_unless(_may_see(setup, qb[4], keys[2]), compute, skipped, carry)

        dkv, dq_blocks = jax.lax.scan(per_query, dkv, q_blocks)
        return dq_sum + _join_blocks(dq_blocks, 1), dkv

    dq, (dk_blocks, dv_blocks) = jax.lax.scan(per_key, dq, kv_blocks)
    return dq, _join_blocks(dk_blocks, 1), _join_blocks(dv_blocks, 1)


def _schedule(setup: _Setup, own: bool, source: Any, device: Any) -> list[tuple[Any, Any]]:
    """The (query half, key half) pairs a device computes with the keys of device ``source`` (its
    ``own``, or another's): under the causal rule only those in which some query sees some key,
    the same amount of work on every device; every pair otherwise."""
    if not setup.causal:
        return [(0, 0), (0, 1), (1, 0), (1, 1)]
    if own:  # chunk d sees itself (diagonal); chunk 2C-1-d sees chunk d and itself (diagonal)
        return [(0, 0), (1, 0), (1, 1)]
    # An earlier device's chunks: both of mine see its first; its last comes after both of mine.
    # A later device's: my last sees both of its chunks; my first sees neither.
    # So (1, 0) always, and (0, 0) or (1, 1).
    other = jnp.where(source < device, 0, 1)
    return [(1, 0), (other, other)]


def _take(tree: Any, index: Any) -> Any:
    """Entry ``index`` (a number, or traced) of the leading axis of every array of ``tree``."""
    return jax.tree.map(lambda x: jax.lax.dynamic_index_in_dim(x, index, 0, keepdims=False), tree)


def _put(tree: Any, index: Any, value: Any) -> Any:
    """``tree`` with entry ``index`` of the leading axis of every array replaced by ``value``'s."""
    return jax.tree.map(lambda x, y: jax.lax.dynamic_update_index_in_dim(x, y, index, 0), tree, value)


def _ring_shift(setup: _Setup, tree: Any) -> Any:
    """Every device's ``tree`` to the next device of the ring."""
    perm = [(d, (d + 1) % setup.ways) for d in range(setup.ways)]
    return jax.tree.map(lambda x: jax.lax.ppermute(x, setup.axis, perm), tree)


def _other_devices(setup: _Setup, device: Any, own: Any, start: Any, step: Any, last: Any) -> Any:
    """Ring steps 1 .. C-1: ``step(carry, held, source) -> carry`` with the keys and values ``held``
    of device ``source`` = device - s at step s, starting from ``start`` (the carry after the
    device's own). The ring passes them on before each step's work, so a transfer can run under
    it; the last step passes nothing on (``last`` is ``step`` there). Gathered: read from ``own``
    of every device."""
    ways = setup.ways
    source_of = lambda s: (device - s) % ways  # noqa: E731
    if setup.gather:
        everyone = jax.lax.all_gather(own, setup.axis)
        body = lambda carry, s: (step(carry, _take(everyone, source_of(s)), source_of(s)), None)  # noqa: E731
        return jax.lax.scan(body, start, jnp.arange(1, ways))[0]

    def body(carry: tuple, s: Any) -> tuple:
        inner, held = carry
        ahead = _ring_shift(setup, held)  # for the next step, independent of this step's work
        return (step(inner, held, source_of(s)), ahead), None

    carry, held = jax.lax.scan(body, (start, _ring_shift(setup, own)), jnp.arange(1, ways - 1))[0]
    return last(carry, held, source_of(ways - 1))


def _forward(setup: _Setup, q: jnp.ndarray, k: jnp.ndarray, v: jnp.ndarray, seg: Any) -> tuple:
    batch, length, heads, head_dim = q.shape
    kv_heads, c = k.shape[2], length // 2
    device = jax.lax.axis_index(setup.axis)
    segs = None if seg is None else _halves(seg)
    mine = (_halves(q.reshape(batch, length, kv_heads, heads // kv_heads, head_dim)), _indices(setup, device, c), segs)
    wide = _acc(q)
    acc = (
        jnp.zeros((2, batch, kv_heads, heads // kv_heads, c, head_dim), wide),
        jnp.full((2, batch, kv_heads, heads // kv_heads, c), _HIDDEN, wide),
        jnp.zeros((2, batch, kv_heads, heads // kv_heads, c), wide),
    )

    def attend_to(acc: tuple, held: tuple, source: Any, own: bool = False) -> tuple:
        theirs = (held[0], held[1], _indices(setup, source, c), held[2])
        for qh, kh in _schedule(setup, own, source, device):
            acc = _put(acc, qh, _pair_forward(setup, _take(acc, qh), _take(mine, qh), _take(theirs, kh)))
        return acc

    own = (_halves(k), _halves(v), segs)
    acc = attend_to(acc, own, device, own=True)
    acc = _other_devices(setup, device, own, acc, attend_to, attend_to)
    o, m, total = acc
    lse = m + jnp.log(total)  # (2, b, kv_heads, g, c); every query sees at least itself
    out = o / total[..., None]  # (2, b, kv_heads, g, c, d)
    out = _whole(jnp.moveaxis(out, 4, 2)).reshape(batch, length, heads, head_dim)
    return out.astype(q.dtype), lse


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _attention(setup: _Setup, q: jnp.ndarray, k: jnp.ndarray, v: jnp.ndarray, seg: Any) -> jnp.ndarray:
    return _forward(setup, q, k, v, seg)[0]


def _attention_fwd(setup: _Setup, q: jnp.ndarray, k: jnp.ndarray, v: jnp.ndarray, seg: Any) -> tuple:
    out, lse = _forward(setup, q, k, v, seg)
    return out, (q, k, v, seg, out, lse)


def _attention_bwd(setup: _Setup, saved: tuple, d_out: jnp.ndarray) -> tuple:
    q, k, v, seg, out, lse = saved
    batch, length, heads, head_dim = q.shape
    kv_heads, c = k.shape[2], length // 2
    groups = heads // kv_heads
    device = jax.lax.axis_index(setup.axis)
    grouped = lambda x: _halves(x.reshape(batch, length, kv_heads, groups, head_dim))  # noqa: E731
    qg, dog = grouped(q), grouped(d_out)
    wide = _acc(q)
    # delta_i = sum_d dO_i O_i (the softmax's backward): (2, b, kv_heads, g, c), like the lse
    delta = jnp.moveaxis(jnp.sum(dog.astype(wide) * grouped(out).astype(wide), axis=-1), 2, 4)
    segs = None if seg is None else _halves(seg)
    mine = (qg, dog, lse, delta, _indices(setup, device, c), segs)
    own = (_halves(k), _halves(v), segs)
    no_grads = (jnp.zeros(own[0].shape, wide), jnp.zeros(own[1].shape, wide))

    def grads_from(dq: jnp.ndarray, held: tuple, source: Any, own: bool = False) -> tuple:
        """dq with the part of the keys ``held`` added, and their gradients from this device's queries."""
        theirs = (held[0], held[1], _indices(setup, source, c), held[2])
        dk, dv = no_grads
        for qh, kh in _schedule(setup, own, source, device):
            (dk_h, dv_h), (dq_h,) = _take((dk, dv), kh), _take((dq,), qh)
            dq_h, dk_h, dv_h = _pair_backward(setup, (dq_h, dk_h, dv_h), _take(mine, qh), _take(theirs, kh))
            (dk, dv), (dq,) = _put((dk, dv), kh, (dk_h, dv_h)), _put((dq,), qh, (dq_h,))
        return dq, (dk, dv)

    dq, d_own = grads_from(jnp.zeros(qg.shape, wide), own, device, own=True)
    if setup.gather:  # every device's key gradients, summed over the devices into their owners'

        def gathered(carry: tuple, held: tuple, source: Any) -> tuple:
            dq, d_all = carry
            dq, part = grads_from(dq, held, source)
            return dq, _put(d_all, source, jax.tree.map(jnp.add, _take(d_all, source), part))

        d_all = jax.tree.map(lambda x: jnp.zeros((setup.ways, *x.shape), wide), d_own)
        d_all = _put(d_all, device, d_own)
        dq, d_all = _other_devices(setup, device, own, (dq, d_all), gathered, gathered)
        dk, dv = (jax.lax.psum_scatter(x, setup.axis, scatter_dimension=0) for x in d_all)
    else:  # the key gradients travel with the keys, each device adding its part, and come home

        def passed(carry: tuple, held: tuple, source: Any, home: bool = False) -> tuple:
            dq, travelling = carry  # the gradients of ``held``, arriving while this device works
            dq, part = grads_from(dq, held, source)
            total = jax.tree.map(jnp.add, travelling, part)
            if home:  # complete: sent home in the keys' dtype (half the bytes of float32 in bfloat16)
                total = (total[0].astype(k.dtype), total[1].astype(v.dtype))
            return dq, _ring_shift(setup, total)

        last = functools.partial(passed, home=True)
        dq, (dk, dv) = _other_devices(setup, device, own, (dq, _ring_shift(setup, d_own)), passed, last)
    dq = _whole(dq).reshape(batch, length, heads, head_dim)
    return dq.astype(q.dtype), _whole(dk).astype(k.dtype), _whole(dv).astype(v.dtype), None


_attention.defvjp(_attention_fwd, _attention_bwd)


__all__ = [
    "BLOCK",
    "GATHER_TOKENS",
    "LENGTH",
    "STRATEGIES",
    "attention",
    "balanced_order",
    "check_length",
    "restore",
    "restore_moves",
    "split",
    "strategy",
]

"""A mixture of experts: the MLP of a layer whose ``mlp_pattern`` entry is ``moe``.

A router (a ``width x experts`` matrix, in float32) scores every expert for each token; the
token goes to the ``experts_per_token`` (k) likeliest of the softmax, weighted by their
probabilities (rescaled to sum to 1 with ``router_renorm``, which is Mixtral's top-k-then-softmax).
Each expert is a SwiGLU MLP, ``down(silu(gate(x)) * up(x))``, the experts' kernels held as stacked
arrays (``gate``, ``up``: ``(experts, width, expert_hidden)``; ``down``: ``(experts,
expert_hidden, width)``, their first axis named ``expert``); ``shared_experts`` adds one SwiGLU MLP
every token goes through. Parameters, under the block::

    block_N/moe/router                 (width, experts)
    block_N/moe/{gate,up}              (experts, width, expert_hidden)
    block_N/moe/down                   (experts, expert_hidden, width)
    block_N/moe/shared_{gate,up,down}  (width, S), (width, S), (S, width)    S = shared_experts x expert_hidden

**Dropless.** The (token, expert) assignments are sorted by expert and multiplied in one grouped
matmul (:func:`grouped_matmul`: ``jax.lax.ragged_dot``, or rows padded to blocks of one expert
each), so every token reaches its experts whatever the batch or the mesh, and a token's output
does not depend on which others share its batch. ``capacity_factor`` > 0 gives each expert a
buffer of fixed size instead, ``capacity_factor`` times its even share of a device's assignments,
multiplied in one batched product (:func:`experts_batched`: no sort, fixed shapes, what a GPU runs
fastest); assignments past it are dropped (counted as ``moe/block_N/dropped``), a result that then
depends on the batch and the mesh.

**Expert parallelism.** On a mesh with an ``expert`` axis the experts are split over it and the
batch too; each device routes its own tokens, and the rows for experts on other devices travel
there and back by ``all_to_all`` inside ``jax.shard_map`` (buffers of every device's worst case
when dropless, so the result equals one device's to rounding). The router's load-balancing loss
(Mixtral's form of Switch's: ``experts * sum_e f_e * P_e``, ``f_e`` the share of tokens that
chose expert ``e`` among their k and ``P_e`` its mean probability, both over the whole batch: k
when the load is even; ``router_aux_loss`` times it, averaged over the mixture layers) and the
z-loss go through the auxiliary-loss channel (:func:`~jaxnet.models.common.add_loss`); the load
of the experts (``moe/block_N/load_max``: the busiest expert's tokens over the mean) is reported
per layer (:func:`~jaxnet.models.common.add_stat`).
"""

from __future__ import annotations

import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from jaxnet.models.common import add_loss, add_stat, normal
from jaxnet.models.transformer.spec import TransformerSpec

#: The mesh axes the tokens of a mixture layer are split over; ``expert`` also splits the experts.
TOKEN_AXES = ("data", "fsdp", "expert")
#: Experts' per-expert figures are reported one by one for mixtures of at most this many experts.
EACH_EXPERT = 16


def grouped_matmul(x: jnp.ndarray, w: jnp.ndarray, sizes: jnp.ndarray, impl: str) -> jnp.ndarray:
    """``x`` (rows, in), its rows sorted by group, times each group's matrix of ``w`` (groups, in,
    out): the first ``sizes[0]`` rows by ``w[0]``, the next ``sizes[1]`` by ``w[1]``, ...; rows past
    ``sum(sizes)`` give zeros. ``impl`` ``ragged`` is ``jax.lax.ragged_dot``; ``blocks`` pads each
    group to whole blocks of rows and multiplies each block by its group's matrix (about 3x faster
    than ``ragged_dot`` on a CPU, where XLA computes that as a dense product per group)::

        y = grouped_matmul(x, w, jnp.array([3, 0, 5]), "blocks")   # rows 0-2 by w[0], 3-7 by w[2]
    """
    if impl == "ragged":
        return jax.lax.ragged_dot(x, w, sizes.astype(jnp.int32))
    rows, groups = x.shape[0], w.shape[0]
    block = max(8, min(64, 1 << max(0, math.ceil(math.log2(max(1, rows // (2 * groups)))))))
    blocks = -(-rows // block) + groups  # every group padded to whole blocks fits
    padded = (sizes + block - 1) // block * block
    padded_start, start = jnp.cumsum(padded) - padded, jnp.cumsum(sizes) - sizes
    group = jnp.searchsorted(jnp.cumsum(sizes), jnp.arange(rows), side="right")  # == groups: past them all
    inside = group < groups
    g = jnp.minimum(group, groups - 1)
    slot = jnp.where(inside, padded_start[g] + jnp.arange(rows) - start[g], blocks * block)  # past the end: dropped
    xp = jnp.zeros((blocks * block, x.shape[1]), x.dtype).at[slot].set(x, mode="drop")
    block_group = jnp.minimum(
        jnp.searchsorted(jnp.cumsum(padded), jnp.arange(blocks) * block, side="right"), groups - 1
    )
    y = jnp.einsum("kbi,kio->kbo", xp.reshape(blocks, block, -1), w[block_group]).reshape(blocks * block, -1)
    return jnp.where(inside[:, None], y[jnp.minimum(slot, blocks * block - 1)], 0).astype(y.dtype)


def swiglu(x: jnp.ndarray, gate: jnp.ndarray, up: jnp.ndarray, down: jnp.ndarray) -> jnp.ndarray:
    """``down(silu(x @ gate) * (x @ up))`` of one MLP (the shared experts)."""
    return (nn.silu(x @ gate) * (x @ up)) @ down


def experts_of(x: jnp.ndarray, sizes: jnp.ndarray, weights: tuple, impl: str) -> jnp.ndarray:
    """Rows ``x`` sorted by expert (``sizes`` rows each; later rows zeros) through their experts' SwiGLU."""
    gate, up, down = weights
    h = nn.silu(grouped_matmul(x, gate, sizes, impl)) * grouped_matmul(x, up, sizes, impl)
    return grouped_matmul(h, down, sizes, impl)


def route(logits: jnp.ndarray, k: int, renorm: bool) -> tuple[jnp.ndarray, jnp.ndarray, jnp.ndarray]:
    """The router's softmax probabilities (tokens, experts), each token's ``k`` experts (tokens, k)
    and their weights (tokens, k), float32: the top-k probabilities, rescaled to sum to 1 with
    ``renorm`` (the same experts and weights as Mixtral's softmax over the top-k logits)."""
    probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
    top, chosen = jax.lax.top_k(probs, k)
    if renorm:
        top = top / jnp.sum(top, axis=-1, keepdims=True)
    return probs, chosen, top


def _buffered(
    x: jnp.ndarray, chosen: jnp.ndarray, rank: jnp.ndarray, weights: tuple, experts: int, capacity: int, axis: Any
) -> jnp.ndarray:
    """Each assignment's expert output (tokens * k, width), with a ``capacity``: every expert's
    first ``capacity`` assignments of this device (``rank`` below it) go into a buffer of fixed shape
    (experts, capacity, width) and the experts multiply theirs in one batched product (no sorting,
    no grouped matmul: what a GPU runs fastest); later assignments are dropped (zeros). With an
    expert ``axis`` the buffer's rows for experts held elsewhere travel there and back by ``all_to_all``."""
    n, k = chosen.shape
    gate, up, down = weights
    flat, slot = chosen.reshape(-1), rank.reshape(-1)
    rows = x[jnp.arange(n * k) // k]
    if axis is None:
        buffer = jnp.zeros((experts, capacity, x.shape[1]), x.dtype).at[flat, slot].set(rows, mode="drop")
        out = experts_batched(buffer, gate, up, down)
        return jnp.where((slot < capacity)[:, None], out[flat, jnp.minimum(slot, capacity - 1)], 0)
    devices = jax.lax.axis_size(axis)
    local = experts // devices
    where = (flat // local, flat % local, slot)
    send = jnp.zeros((devices, local, capacity, x.shape[1]), x.dtype).at[where].set(rows, mode="drop")
    got = jax.lax.all_to_all(send, axis, 0, 0, tiled=True)  # (sources, local experts, capacity, width)
    mine = jnp.swapaxes(got, 0, 1).reshape(local, devices * capacity, -1)
    out = experts_batched(mine, gate, up, down).reshape(local, devices, capacity, -1)
    back = jax.lax.all_to_all(jnp.swapaxes(out, 0, 1), axis, 0, 0, tiled=True)
    clipped = (where[0], where[1], jnp.minimum(slot, capacity - 1))
    return jnp.where((slot < capacity)[:, None], back[clipped], 0)


def experts_batched(buffer: jnp.ndarray, gate: jnp.ndarray, up: jnp.ndarray, down: jnp.ndarray) -> jnp.ndarray:
    """Each expert's SwiGLU on its rows of ``buffer`` (experts, rows, width), one batched product a kernel."""
    h = nn.silu(jnp.einsum("erw,ewh->erh", buffer, gate)) * jnp.einsum("erw,ewh->erh", buffer, up)
    return jnp.einsum("erh,ehw->erw", h, down)


def _local(
    x: jnp.ndarray, chosen: jnp.ndarray, kept: jnp.ndarray, weights: tuple, experts: int, impl: str, axis: str | None
) -> jnp.ndarray:
    """Each assignment's expert output (tokens * k, width) for this device's ``x`` (tokens, width)
    and ``chosen`` experts (tokens, k): sorted by expert, sent to the device holding it (``axis``,
    ``all_to_all``) and back; ``kept`` False: a dropped assignment (zeros)."""
    n, k = chosen.shape
    flat = jnp.where(kept.reshape(-1), chosen.reshape(-1), experts)  # dropped assignments sort last
    order = jnp.argsort(flat, stable=True)
    rows = x[order // k]
    if axis is None:
        sizes = jnp.bincount(flat, length=experts + 1)[:experts]
        out = experts_of(rows, sizes, weights, impl)
        return jnp.zeros_like(out).at[order].set(out)
    devices = jax.lax.axis_size(axis)
    local = experts // devices
    cap = n * k  # dropless: one device may receive every assignment of another
    sorted_e = flat[order]
    dest = jnp.minimum(sorted_e // local, devices - 1)
    first = jnp.searchsorted(dest, jnp.arange(devices))  # each destination's first sorted assignment
    slot = jnp.where(sorted_e < experts, jnp.arange(n * k) - first[dest], cap)  # dropped: past the buffer
    send = jnp.zeros((devices, cap, x.shape[1]), x.dtype).at[dest, slot].set(rows, mode="drop")
    ids = jnp.full((devices, cap), local, jnp.int32).at[dest, slot].set(sorted_e % local, mode="drop")
    got = jax.lax.all_to_all(send, axis, 0, 0, tiled=True).reshape(devices * cap, -1)
    got_ids = jax.lax.all_to_all(ids, axis, 0, 0, tiled=True).reshape(-1)
    here = jnp.argsort(got_ids, stable=True)  # by local expert; empty slots (id = local) last
    sizes = jnp.bincount(got_ids, length=local + 1)[:local]
    out = experts_of(got[here], sizes, weights, impl)
    out = jnp.zeros_like(out).at[here].set(out).reshape(devices, cap, -1)
    back = jax.lax.all_to_all(out, axis, 0, 0, tiled=True)
    mine = jnp.where((slot < cap)[:, None], back[dest, jnp.minimum(slot, cap - 1)], 0)
    return jnp.zeros_like(mine).at[order].set(mine)


class MoE(nn.Module):
    """The mixture-of-experts MLP of block ``index`` of ``spec`` (see the module's docstring):
    hidden states (batch, time, width) -> (batch, time, width)."""

    spec: TransformerSpec
    index: int = 0

    @nn.compact
    def __call__(self, h: jnp.ndarray) -> jnp.ndarray:
        s = self.spec
        E, H, W = s.experts, s.expert_hidden, s.width
        router = self.param("router", normal(0.02, ("embed", None)), (W, E), s.param_dtype)
        gate = self.param("gate", normal(0.02, ("expert", "embed", "mlp")), (E, W, H), s.param_dtype)
        up = self.param("up", normal(0.02, ("expert", "embed", "mlp")), (E, W, H), s.param_dtype)
        down = self.param("down", normal(s.out_std, ("expert", "mlp", "embed")), (E, H, W), s.param_dtype)
        weights = tuple(w.astype(s.dtype) for w in (gate, up, down))
        impl = (
            s.expert_matmul if s.expert_matmul != "auto" else ("blocks" if jax.default_backend() == "cpu" else "ragged")
        )
        x = h.astype(s.dtype)

        def mix(x: jnp.ndarray, router: jnp.ndarray, gate: Any, up: Any, down: Any, axes: tuple) -> tuple:
            n = x.shape[0] * x.shape[1]
            tokens = x.reshape(n, W)
            logits = tokens.astype(jnp.float32) @ router.astype(jnp.float32)
            probs, chosen, top = route(logits, s.experts_per_token, s.router_renorm)
            counts = jnp.zeros((E,), jnp.float32).at[chosen.reshape(-1)].add(1.0)
            kept = jnp.ones(chosen.shape, bool)
            ep = "expert" if "expert" in axes else None
            if s.capacity_factor:  # each expert's first `capacity` assignments on this device, in token order
                capacity = max(1, math.ceil(s.capacity_factor * n * s.experts_per_token / E))
                flat = chosen.reshape(-1)
                rank = jnp.cumsum(jax.nn.one_hot(flat, E, dtype=jnp.int32), axis=0)[jnp.arange(flat.size), flat] - 1
                kept = (rank < capacity).reshape(chosen.shape)
                out = _buffered(tokens, chosen, rank.reshape(chosen.shape), (gate, up, down), E, capacity, ep)
            else:
                out = _local(tokens, chosen, kept, (gate, up, down), E, impl, ep)
            y = jnp.sum(out.reshape(n, -1, W) * (top * kept)[..., None].astype(out.dtype), axis=1)
            mean = lambda v: jax.lax.pmean(v, axes) if axes else v  # noqa: E731
            routed = mean(counts / n)  # f_e: the tokens that chose expert e, over the whole batch
            share = routed / s.experts_per_token  # the experts' shares of the assignments (sum to 1)
            figures = {
                "balance": E * jnp.sum(routed * mean(jnp.mean(probs, axis=0))),
                "z": mean(jnp.mean(jax.nn.logsumexp(logits, axis=-1) ** 2)),
                "share": share,
                "dropped": mean(1.0 - jnp.mean(kept.astype(jnp.float32))),
            }
            return y.reshape(x.shape).astype(s.dtype), figures

        axes = _manual_axes()
        if axes:  # each device its own tokens (and with an expert axis, its own experts)
            tokens_spec = P(axes)
            expert_spec = P("expert") if "expert" in axes else P()
            per_device = jax.shard_map(
                lambda *a: mix(*a, axes),
                in_specs=(tokens_spec, P(), expert_spec, expert_spec, expert_spec),
                out_specs=(tokens_spec, P()),
                axis_names=set(axes),
                check_vma=False,
            )
            y, figures = per_device(x, router, *weights)
        else:
            y, figures = mix(x, router, *weights, ())
        layers = sum(1 for i in range(s.layers) if s.layer(i).mlp == "moe")
        if s.router_aux_loss:
            add_loss(self, "router_balance", s.router_aux_loss * figures["balance"] / layers)
        if s.router_z_loss:
            add_loss(self, "router_z", s.router_z_loss * figures["z"] / layers)
        block = f"moe/block_{self.index}"
        add_stat(self, f"{block}/load_max", jnp.max(figures["share"]) * E)
        if E <= EACH_EXPERT:
            for e in range(E):
                add_stat(self, f"{block}/expert_{e}", figures["share"][e])
        if s.capacity_factor:
            add_stat(self, f"{block}/dropped", figures["dropped"])
        if s.shared_experts:
            S = s.shared_experts * H
            shared = [
                self.param(name, normal(std, names), shape, s.param_dtype).astype(s.dtype)
                for name, std, names, shape in (
                    ("shared_gate", 0.02, ("embed", "mlp"), (W, S)),
                    ("shared_up", 0.02, ("embed", "mlp"), (W, S)),
                    ("shared_down", s.out_std, ("mlp", "embed"), (S, W)),
                )
            ]
            y = y + swiglu(x, *shared)
        return y


def _manual_axes() -> tuple[str, ...]:
    """The mesh axes in scope (under the run's rules) that split a mixture layer's tokens: those of
    :data:`TOKEN_AXES` the mesh has with more than one device, unless already manual (a model run
    per device)."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return ()
    manual = set(getattr(mesh, "manual_axes", ()) or ())
    return tuple(a for a in TOKEN_AXES if a in mesh.axis_names and mesh.shape[a] > 1 and a not in manual)

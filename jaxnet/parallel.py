"""The device mesh, and where parameters, optimizer state and batches live on it.

The mesh has three axes: ``data`` (the batch is split, parameters replicated), ``fsdp`` (the
batch is split and so are parameters and optimizer state, gathered layer by layer by the
compiler) and ``tensor`` (the hidden dimensions of a layer are split: attention heads, MLP
hidden units, LSTM gates). Models name the axes of their parameters logically (``embed``,
``heads``, ``mlp``, ``vocab``, ...); :data:`RULES` is the one table that maps those names onto
mesh axes, so no model knows about devices. Every placement decision goes through this module.
"""

from __future__ import annotations

import math
from typing import Any

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxnet.config import MeshConfig
from jaxnet.errors import UserError

AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")

# Logical parameter axis -> mesh axis (None: not split). The first matching rule wins.
RULES: tuple[tuple[str, str | tuple[str, ...] | None], ...] = (
    ("batch", BATCH_AXES),
    ("embed", "fsdp"),  # model width: split for FSDP, gathered before use
    ("heads", "tensor"),  # attention heads (Megatron: q/k/v column-split, output row-split)
    ("mlp", "tensor"),  # MLP hidden units, LSTM gate units, conv output channels
    ("vocab", "tensor"),
    ("kv", None),
)


def mesh_shape(cfg: MeshConfig, device_count: int) -> dict[str, int]:
    """Sizes of the mesh axes, with at most one -1 ("the rest of the devices") resolved."""
    sizes = {axis: getattr(cfg, axis) for axis in AXES}
    free = [a for a, n in sizes.items() if n == -1]
    if len(free) > 1:
        raise UserError(f"only one mesh axis can be -1, got {', '.join(f'mesh.{a}=-1' for a in free)}")
    for axis, n in sizes.items():
        if n == 0 or n < -1:
            raise UserError(f"mesh.{axis}={n}: use a positive device count (or -1 for the rest of the devices)")
    fixed = math.prod(n for n in sizes.values() if n != -1)
    if free:
        if device_count % fixed:
            raise UserError(
                f"the mesh axes set to {fixed} devices do not divide the {device_count} device(s) present; "
                f"use sizes whose product divides {device_count}"
            )
        sizes[free[0]] = device_count // fixed
    total = math.prod(sizes.values())
    if total > device_count or device_count % total:
        shape = " x ".join(f"{a}={n}" for a, n in sizes.items())
        raise UserError(
            f"mesh {shape} needs {total} devices but {device_count} device(s) are present; "
            f"use sizes whose product divides {device_count} (or -1 for one axis)"
        )
    return sizes


def make_mesh(cfg: MeshConfig, devices: list | None = None) -> Mesh:
    """A ``(data, fsdp, tensor)`` mesh over the first ``data * fsdp * tensor`` devices."""
    devices = devices if devices is not None else jax.devices()
    sizes = mesh_shape(cfg, len(devices))
    count = math.prod(sizes.values())
    return Mesh(np.asarray(devices[:count]).reshape(tuple(sizes.values())), AXES)


def replicated(mesh: Mesh) -> NamedSharding:
    """Every device holds the whole array."""
    return NamedSharding(mesh, PartitionSpec())


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """The leading (batch) dimension is split along ``data`` and ``fsdp``."""
    return NamedSharding(mesh, PartitionSpec(BATCH_AXES))


def batch_devices(mesh: Mesh) -> int:
    """Number of ways a batch is split (``data * fsdp``)."""
    return mesh.shape["data"] * mesh.shape["fsdp"]


def check_batch(batch_size: int, mesh: Mesh, what: str = "train.batch_size") -> None:
    """A batch must split evenly across the data-parallel devices."""
    devices = batch_devices(mesh)
    if batch_size % devices:
        raise UserError(
            f"{what}={batch_size} is not divisible by the {devices} devices it is split over "
            f"(mesh.data={mesh.shape['data']} x mesh.fsdp={mesh.shape['fsdp']}); use a multiple of {devices}"
        )


def put_batch(batch: Any, mesh: Mesh) -> Any:
    """Copy a host batch (a pytree of numpy arrays) onto the mesh, split along the batch axis.

    Scalars (e.g. a batch's ``reset`` flag) are copied to every device.
    """
    split, whole = batch_sharding(mesh), replicated(mesh)
    return jax.device_put(batch, jax.tree.map(lambda x: split if np.ndim(x) else whole, batch))


def state_shardings(boxed_state: Any, mesh: Mesh) -> Any:
    """Shardings for every leaf of a state whose parameters carry logical axis names.

    ``boxed_state`` is the (abstract) state with Flax's ``LogicallyPartitioned`` boxes still on,
    optimizer moments included (optax keeps the boxes of the parameters it mirrors). Unnamed
    leaves (step, counters, RNG, BatchNorm statistics, carried state) are replicated. A dimension
    that its mesh axes do not divide is a one-line error naming the array.
    """
    shardings = nn.logical_to_mesh_sharding(nn.get_partition_spec(boxed_state), mesh, RULES)
    check_divisible(nn.unbox(boxed_state), shardings, mesh)
    return shardings


def check_divisible(state: Any, shardings: Any, mesh: Any) -> None:
    """A one-line error for the first array with a dimension its mesh axes do not divide."""
    leaves = jax.tree_util.tree_leaves_with_path(state)
    flat = jax.tree.leaves(shardings, is_leaf=lambda x: hasattr(x, "spec"))
    for (path, leaf), sharding in zip(leaves, flat, strict=True):
        for dim, axes in zip(leaf.shape, sharding.spec, strict=False):
            names = (axes,) if isinstance(axes, str) else tuple(axes or ())
            ways = math.prod(mesh.shape[a] for a in names)
            if ways > 1 and dim % ways:
                where = jax.tree_util.keystr(path)
                raise UserError(
                    f"{where} has a dimension of {dim}, which the mesh cannot split {ways} ways "
                    f"({' x '.join(f'mesh.{a}={mesh.shape[a]}' for a in names)}); choose sizes it divides"
                )


def describe(mesh: Mesh, state: Any) -> str:
    """One line: the mesh and the bytes of parameters and optimizer state each device holds."""
    shape = ", ".join(f"{a}={n}" for a, n in mesh.shape.items())
    params, opt = bytes_per_device(state.params), bytes_per_device(state.opt_state)
    whole = sum(
        math.prod(x.shape) * np.dtype(x.dtype).itemsize for x in jax.tree.leaves((state.params, state.opt_state))
    )
    return (
        f"mesh {shape}: per device {params / 2**20:.1f} MiB of parameters and {opt / 2**20:.1f} MiB of "
        f"optimizer state (of {whole / 2**20:.1f} MiB in all)"
    )


def bytes_per_device(tree: Any) -> int:
    """Bytes one device holds of a tree of sharded (concrete or abstract) arrays: the largest shard each."""
    total = 0
    for leaf in jax.tree.leaves(tree):
        shape = leaf.sharding.shard_shape(leaf.shape) if getattr(leaf, "sharding", None) is not None else leaf.shape
        total += math.prod(shape) * np.dtype(leaf.dtype).itemsize
    return total

"""The device mesh, and where parameters, optimizer state and batches live on it.

The mesh has five axes: ``data`` (the batch is split, parameters replicated), ``fsdp`` (the
batch is split and so are parameters and optimizer state, gathered layer by layer by the
compiler), ``expert`` (a mixture's experts are split, and the batch), ``context`` (each row's
sequence is split: the activations' ``length`` axis, attention working across the pieces,
:mod:`jaxnet.models.transformer.context`) and ``tensor`` (the hidden dimensions of a layer are
split: attention heads, MLP hidden units, LSTM gates). Models name the
axes of their parameters logically (``embed``, ``heads``, ``mlp``, ``vocab``, ...) and of a few
activations (``batch``, ``length``); :data:`RULES` is the one table that maps those names onto
mesh axes, so no model knows about devices. Every placement decision goes through this module.

With several processes the mesh spans every process's devices, each process reads only the rows
of each batch that its devices hold (:func:`process_rows`) and :func:`put_batch` assembles the
global batch from those pieces.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxnet.config import MeshConfig
from jaxnet.errors import UserError
from jaxnet.models.adapters.lora import BASE as LORA_BASE
from jaxnet.models.adapters.reference import REFERENCE
from jaxnet.models.transformer import context

AXES = ("data", "fsdp", "expert", "context", "tensor")
BATCH_AXES = ("data", "fsdp", "expert")
REPLICA_AXIS = "data"  # parallel.mode=replicas: one whole model per device along this axis

# Logical parameter axis -> mesh axis (None: not split). The first matching rule wins.
RULES: tuple[tuple[str, str | tuple[str, ...] | None], ...] = (
    ("batch", BATCH_AXES),
    # model width: split for FSDP, gathered before use; the context devices hold other tokens of the
    # same rows, so the parameters are split over them too (otherwise each would hold them whole)
    ("embed", ("fsdp", "context")),
    ("heads", "tensor"),  # attention heads (Megatron: q/k/v column-split, output row-split)
    ("mlp", "tensor"),  # MLP hidden units, LSTM gate units, conv output channels
    ("vocab", "tensor"),
    ("kv", None),
    ("expert", "expert"),  # a mixture's experts (the batch is split along it too: tokens travel to them)
    ("length", "context"),  # the sequence of the activations (context parallelism)
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
    """A ``(data, fsdp, expert, context, tensor)`` mesh over the first (product of their sizes) devices."""
    devices = devices if devices is not None else jax.devices()
    sizes = mesh_shape(cfg, len(devices))
    count = math.prod(sizes.values())
    if jax.process_count() > 1 and count != len(devices):
        raise UserError(
            f"a multi-process run's mesh must use all {len(devices)} devices of its {jax.process_count()} "
            f"processes, not {count}; set one mesh axis to -1"
        )
    return Mesh(np.asarray(devices[:count]).reshape(tuple(sizes.values())), AXES)


def replicated(mesh: Mesh) -> NamedSharding:
    """Every device holds the whole array."""
    return NamedSharding(mesh, PartitionSpec())


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """The leading (batch) dimension is split along ``data``, ``fsdp`` and ``expert``."""
    return NamedSharding(mesh, PartitionSpec(BATCH_AXES))


def batch_devices(mesh: Mesh) -> int:
    """Number of ways a batch is split (``data * fsdp * expert``)."""
    return math.prod(mesh.shape[a] for a in BATCH_AXES)


def check_batch(batch_size: int, mesh: Mesh, what: str = "train.batch_size") -> None:
    """A batch must split evenly across the data-parallel devices."""
    devices = batch_devices(mesh)
    if batch_size % devices:
        split = " x ".join(f"mesh.{a}={mesh.shape[a]}" for a in BATCH_AXES if a != "expert" or mesh.shape[a] > 1)
        raise UserError(
            f"{what}={batch_size} is not divisible by the {devices} devices it is split over "
            f"({split}); use a multiple of {devices}"
        )


def check_sequence(length: int, mesh: Mesh, key: str = "data.seq_len") -> None:
    """A sequence must split into two chunks per ``context`` device (one from the start of a row,
    one from its end: :func:`jaxnet.models.transformer.context.balanced_order`); a one-line
    :class:`UserError` naming ``key`` otherwise::

        check_sequence(cfg.data.seq_len, mesh)   # UserError for 100 tokens on mesh.context=8
    """
    context.check_length(length, mesh.shape.get("context", 1), key)


def put_batch(batch: Any, mesh: Mesh, lead: int = 0) -> Any:
    """Copy a host batch (a pytree of numpy arrays) onto the mesh, split along the batch axis.

    Scalars (e.g. a batch's ``reset`` flag) are copied to every device. With several processes,
    ``batch`` holds this process's rows (:func:`process_rows`) and the result is the global batch.
    ``lead`` leading axes come before the batch axis, kept whole (a sweep's members).
    """
    split, whole = NamedSharding(mesh, PartitionSpec(*[None] * lead, BATCH_AXES)), replicated(mesh)
    shardings = jax.tree.map(lambda x: split if np.ndim(x) > lead else whole, batch)
    if jax.process_count() == 1:
        return jax.device_put(batch, shardings)
    return jax.tree.map(jax.make_array_from_process_local_data, shardings, batch)


def process_rows(mesh: Mesh, batch_size: int) -> slice:
    """The rows of a ``batch_size`` batch that this process's devices hold (all of them with one
    process): the only rows it needs to read."""
    if jax.process_count() == 1:
        return slice(0, batch_size)
    index = batch_sharding(mesh).addressable_devices_indices_map((batch_size,))
    spans = sorted({(s[0].start or 0, batch_size if s[0].stop is None else s[0].stop) for s in index.values()})
    if any(a[1] != b[0] for a, b in zip(spans, spans[1:], strict=False)):
        raise UserError(f"this process's devices hold rows {spans} of the batch, not one block; use mesh.tensor=1")
    return slice(spans[0][0], spans[-1][1])


def state_shardings(boxed_state: Any, mesh: Mesh, split_carry: bool = False, rules: tuple = RULES) -> Any:
    """Shardings for every leaf of a state whose parameters carry logical axis names.

    ``boxed_state`` is the (abstract) state with Flax's ``LogicallyPartitioned`` boxes still on,
    optimizer moments included (optax keeps the boxes of the parameters it mirrors). Unnamed leaves
    (step, counters, RNG, BatchNorm statistics, a model's carried state) are replicated, except
    parameters without names and their optimizer moments, which a mesh with ``fsdp`` > 1 splits
    along their largest dimension it divides (as the ``embed`` rule splits named ones); with
    ``split_carry`` the carried state (the ``carry`` collection, one row per batch row) is split
    like the batch instead, as per-device replicas need it. (Under ``jit``, a batch-split carry
    made jax 0.10.2's partitioner compute wrong LSTM gradients on a data x fsdp x tensor mesh, so
    the sharded mode keeps it whole: it is one small array per layer.) A vocabulary
    the ``tensor`` axis does not divide stays whole (the vocabulary is the data's, not a choice);
    any other dimension that its mesh axes do not divide is a one-line error naming the array.
    ``rules`` is :data:`RULES` with the model family's own in front (``ModelConfig.axis_rules``).
    """
    shapes = nn.unbox(boxed_state)
    tensor = mesh.shape["tensor"]

    def keep_whole_vocab(spec: Any, leaf: Any) -> Any:
        names = [None if n == "vocab" and dim % tensor else n for n, dim in zip(spec, leaf.shape, strict=False)]
        return PartitionSpec(*names)

    logical = jax.tree.map(
        keep_whole_vocab,
        nn.get_partition_spec(boxed_state),
        shapes,
        is_leaf=lambda x: isinstance(x, PartitionSpec),
    )
    shardings = nn.logical_to_mesh_sharding(logical, mesh, rules)
    rows = batch_sharding(mesh)
    shardings = jax.tree_util.tree_map_with_path(
        lambda path, sh: rows if split_carry and any(getattr(k, "key", None) == "carry" for k in path) else sh,
        shardings,
        is_leaf=lambda x: isinstance(x, NamedSharding),
    )
    if mesh.shape["fsdp"] > 1 and not split_carry and hasattr(shardings, "params"):
        shardings = _unnamed_by_size(nn.get_partition_spec(boxed_state), shapes, shardings, mesh)
    check_divisible(shapes, shardings, mesh)
    return shardings


def _unnamed_by_size(names: Any, shapes: Any, shardings: Any, mesh: Mesh) -> Any:
    """Parameters without axis names (an Equinox model, ``jaxnet.Model``, an unannotated module)
    and their optimizer moments split over ``fsdp`` along their largest dimension it divides, so
    such a model's memory still falls with the fsdp size; a leaf no dimension of which ``fsdp``
    divides stays whole. Named leaves keep their rules, and the rest of the state stays as it is."""
    fsdp = mesh.shape["fsdp"]

    def by_size(spec: PartitionSpec, leaf: Any, sharding: Any) -> Any:
        if any(spec) or not getattr(leaf, "shape", ()):
            return sharding
        dims = [i for i, size in enumerate(leaf.shape) if size % fsdp == 0]
        if not dims:
            return sharding
        dim = max(dims, key=lambda i: leaf.shape[i])  # the first of the largest
        return NamedSharding(mesh, PartitionSpec(*("fsdp" if i == dim else None for i in range(len(leaf.shape)))))

    def place(field: str) -> Any:
        return jax.tree.map(
            by_size,
            getattr(names, field),
            getattr(shapes, field),
            getattr(shardings, field),
            is_leaf=lambda x: isinstance(x, PartitionSpec),
        )

    return shardings.replace(params=place("params"), opt_state=place("opt_state"))


def under_rules(fn: Callable, mesh: Mesh, rules: tuple = RULES) -> Callable:
    """``fn`` traced with ``rules`` (:data:`RULES` and the model family's own) and ``mesh`` in scope,
    so the activation marks in the models (``nn.with_logical_constraint``) become sharding
    constraints for the compiler."""

    @functools.wraps(fn)
    def traced(*args: Any) -> Any:
        with jax.sharding.use_abstract_mesh(mesh.abstract_mesh), nn.logical_axis_rules(rules):
            return fn(*args)

    return traced


def replicas(step: Callable, mesh: Mesh, shardings: Any) -> Callable:
    """``step(state, batch)``, written for one device (its rows of the batch, a whole model), run on
    every device of ``mesh`` with ``jax.shard_map``: the ``pmap`` model of data parallelism.

    ``shardings`` (the state's) says which state leaves are per-device rows (the carried state)
    and which are one value on every device; the step must make the latter agree (``lax.pmean``).
    Metrics come back as one value.
    """

    def used_axes(spec: PartitionSpec) -> PartitionSpec:  # mesh axes of size 1 split nothing
        keep = lambda names: tuple(
            a for a in ((names,) if isinstance(names, str) else names or ()) if mesh.shape[a] > 1
        )
        return PartitionSpec(*(keep(n) or None for n in spec))

    specs = jax.tree.map(lambda sh: used_axes(sh.spec), shardings, is_leaf=lambda x: isinstance(x, NamedSharding))
    rows = PartitionSpec(REPLICA_AXIS)

    @functools.wraps(step)
    def on_mesh(state: Any, batch: Any) -> Any:
        batch_specs = jax.tree.map(lambda x: rows if x.ndim else PartitionSpec(), batch)
        mapped = jax.shard_map(step, mesh=mesh, in_specs=(specs, batch_specs), out_specs=(specs, PartitionSpec()))
        return mapped(state, batch)

    return on_mesh


def check_divisible(state: Any, shardings: Any, mesh: Any) -> None:
    """A one-line error for the first array with a dimension its mesh axes do not divide."""
    leaves = jax.tree_util.tree_leaves_with_path(state)
    flat = jax.tree.leaves(shardings, is_leaf=lambda x: hasattr(x, "spec"))
    for (path, leaf), sharding in zip(leaves, flat, strict=True):
        for dim, axes in zip(leaf.shape, sharding.spec, strict=False):
            names = (axes,) if isinstance(axes, str) else tuple(axes or ())
            ways = math.prod(mesh.shape.get(a, 1) for a in names)
            if ways > 1 and dim % ways:
                where = jax.tree_util.keystr(path)
                raise UserError(
                    f"{where} has a dimension of {dim}, which the mesh cannot split {ways} ways "
                    f"({' x '.join(f'mesh.{a}={mesh.shape[a]}' for a in names)}); choose sizes it divides"
                )


def memory(state: Any, compiled: Any = None) -> dict[str, int]:
    """Bytes per device: ``params`` and ``opt_state`` as placed, their unsharded ``total``, and
    ``activations``, the scratch memory XLA planned for the compiled step (activations kept for the
    backward pass, gradients, temporaries; -1 if the backend does not say)."""
    whole = sum(
        math.prod(x.shape) * np.dtype(x.dtype).itemsize for x in jax.tree.leaves((state.params, state.opt_state))
    )
    stats = compiled.memory_analysis() if compiled is not None else None
    return {
        "params": bytes_per_device(state.params),
        "opt_state": bytes_per_device(state.opt_state),
        "total": whole,
        "activations": int(stats.temp_size_in_bytes) if stats is not None else -1,
    }


def describe(mesh: Mesh, state: Any, compiled: Any = None) -> str:
    """One line: the mesh and, per device, the bytes of parameters, optimizer state and (given the
    compiled train step) activations."""
    shape = " x ".join(f"{a}={n}" for a, n in mesh.shape.items())
    sizes = memory(state, compiled)
    acts = f", {size(sizes['activations'])} of activations and temporaries" if sizes["activations"] >= 0 else ""
    model_state = getattr(state, "model_state", None)
    base = model_state.get(LORA_BASE) if isinstance(model_state, dict) else None  # a LoRA run's frozen base
    frozen = f", {size(bytes_per_device(base))} of frozen base" if base else ""
    copy = model_state.get(REFERENCE) if isinstance(model_state, dict) else None  # a full DPO run's reference
    frozen += f", {size(bytes_per_device(copy))} of frozen reference" if copy else ""
    return (
        f"mesh {shape} ({mesh.size} {mesh.devices.flat[0].platform} device(s)): per device "
        f"{size(sizes['params'])} of parameters{frozen}, {size(sizes['opt_state'])} of optimizer state{acts} "
        f"(parameters and optimizer state unsharded: {size(sizes['total'])})"
    )


def size(n: float) -> str:
    """Bytes in the largest binary unit that keeps the number at or above 1, e.g. ``'3.2 MiB'``."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError


def bytes_per_device(tree: Any) -> int:
    """Bytes one device holds of a tree of sharded (concrete or abstract) arrays: the largest shard each."""
    total = 0
    for leaf in jax.tree.leaves(tree):
        shape = leaf.sharding.shard_shape(leaf.shape) if getattr(leaf, "sharding", None) is not None else leaf.shape
        total += math.prod(shape) * np.dtype(leaf.dtype).itemsize
    return total

"""The device mesh, and where parameters and batches live on it.

Today the mesh has one axis, ``data``: the batch is split across devices and the parameters
are replicated (data parallelism). Every placement decision goes through this module so that
other layouts change nothing elsewhere.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxnet.config import MeshConfig
from jaxnet.errors import UserError


def make_mesh(cfg: MeshConfig, devices: list | None = None) -> Mesh:
    """A mesh with a ``data`` axis over ``cfg.data`` devices (-1 = all of them)."""
    devices = devices if devices is not None else jax.devices()
    count = len(devices) if cfg.data == -1 else cfg.data
    if count > len(devices):
        raise UserError(f"mesh.data={cfg.data} but only {len(devices)} device(s) are present; use mesh.data=-1")
    return Mesh(np.asarray(devices[:count]), ("data",))


def replicated(mesh: Mesh) -> NamedSharding:
    """Every device holds the whole array (parameters, optimizer state)."""
    return NamedSharding(mesh, PartitionSpec())


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """The leading (batch) dimension is split along ``data``."""
    return NamedSharding(mesh, PartitionSpec("data"))


def check_batch(batch_size: int, mesh: Mesh, what: str = "train.batch_size") -> None:
    """A batch must split evenly across the data-parallel devices."""
    devices = mesh.shape["data"]
    if batch_size % devices:
        raise UserError(
            f"{what}={batch_size} is not divisible by the {devices} data-parallel devices; use a multiple of {devices}"
        )


def put_batch(batch: Any, mesh: Mesh) -> Any:
    """Copy a host batch (a pytree of numpy arrays) onto the mesh, split along the batch axis.

    Scalars (e.g. a batch's ``reset`` flag) are copied to every device.
    """
    split, whole = batch_sharding(mesh), replicated(mesh)
    return jax.device_put(batch, jax.tree.map(lambda x: split if np.ndim(x) else whole, batch))

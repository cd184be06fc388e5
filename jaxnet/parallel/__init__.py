"""The device mesh, where parameters, optimizer state and batches live on it, and the processes
of a multi-process run.

- :mod:`jaxnet.parallel.mesh`: the ``(data, fsdp, expert, context, tensor)`` mesh, the logical-axis rules, the
  shardings of the state and the batch, replicas (``shard_map``) and the memory report.
- :mod:`jaxnet.parallel.launchers`: who started this process (the command line's flags, a Slurm
  job step, Open MPI's ``mpirun``) and the coordinator's port.
- :mod:`jaxnet.parallel.processes`: joining a run (``jax.distributed``), leaving it with one line,
  and which process writes.
- :mod:`jaxnet.parallel.watch`: the connection from process 0 to every other process that tells
  them all within seconds when one stops.

Every name is importable from ``jaxnet.parallel`` itself, e.g.
``from jaxnet.parallel import make_mesh, init_processes``; each submodule is imported when one
of its names is first used, so that ``launchers`` and ``watch`` (which need no JAX) can be read
before JAX starts.
"""

from __future__ import annotations

import importlib
from typing import Any

_HOMES = {
    "jaxnet._startup": ("make_room_for_simulated_devices", "simulated_cpu_devices"),
    "jaxnet.parallel.mesh": (
        "AXES",
        "BATCH_AXES",
        "REPLICA_AXIS",
        "RULES",
        "batch_devices",
        "batch_sharding",
        "bytes_per_device",
        "check_batch",
        "check_divisible",
        "check_sequence",
        "describe",
        "make_mesh",
        "memory",
        "mesh_shape",
        "process_rows",
        "put_batch",
        "replicas",
        "replicated",
        "size",
        "state_shardings",
        "under_rules",
    ),
    "jaxnet.parallel.processes": (
        "HEARTBEAT_SECONDS",
        "heartbeat_seconds",
        "init_processes",
        "is_primary",
        "leave",
        "peer_stopped",
        "quiet_output",
        "sync",
    ),
    "jaxnet.parallel.watch": ("watch_port",),
}
_HOME = {name: module for module, names in _HOMES.items() for name in names}
__all__ = sorted(_HOME)


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module 'jaxnet.parallel' has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOME[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})

"""Who started this process, and how the processes of a multi-process run find each other.

Three launchers are read: the command line's ``--coordinator``, ``--num-processes`` and
``--process-id``; a Slurm job step (the tasks ``srun`` starts); Open MPI 4's ``mpirun``. Each
gives what ``jax.distributed.initialize`` needs: the coordinator's ``HOST:PORT`` (a port on
process 0's host), the number of processes, this process's number, and which of its host's
devices this process uses (:class:`Launch`). A launcher that starts several processes but says
nothing jaxnet can read (Open MPI 5, MPICH's or Intel MPI's ``mpiexec``) is one line saying what
to give; ``$JAX_COORDINATOR_ADDRESS`` alone leaves everything to JAX's own detection.

The coordinator's port under Slurm is derived per job step (:func:`slurm_port`), so two steps of
one job running at once never share it; under Open MPI per ``mpirun`` (as JAX derives it);
``$JAX_COORDINATOR_PORT`` overrides both. Process 0 checks that the port is free before it
starts the coordinator (:func:`check_port`): JAX's coordinator (gRPC) would share a port with
another run's coordinator without a word, and the processes of two runs could then meet.
"""

from __future__ import annotations

import errno
import os
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass

from jaxnet.errors import UserError

PORT_BASE, PORT_RANGE = 61440, 4096  # JAX's range for a derived coordinator port: 61440 to 65535
# Slurm: port = PORT_BASE + (job + STEP_STRIDE * step) % PORT_RANGE. The stride is odd, so the
# steps of one job never share a port; and 2531/4096 is near the golden ratio, so the ports of
# steps a few apart are hundreds apart and two jobs on one node with nearby ids do not meet.
STEP_STRIDE = 2531
# Launchers that start several processes but give no coordinator: the variable holding the count,
# the one holding this process's number, and the launcher.
_UNREADABLE = (
    ("OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "Open MPI 5 (its mpirun sets no OMPI_MCA_orte_hnp_uri)"),
    ("PMI_SIZE", "PMI_RANK", "an MPI launcher (MPICH, Intel MPI)"),
    ("MV2_COMM_WORLD_SIZE", "MV2_COMM_WORLD_RANK", "MVAPICH"),
)


@dataclass(frozen=True)
class Launch:
    """How this process joins its run: ``jax.distributed.initialize(coordinator, num_processes,
    process_id, local_device_ids=...)``. ``local_device_ids`` empty: every device the process
    sees; None: JAX's own choice. ``launcher`` says where the values came from (for messages);
    ``port_hint`` what to do when the coordinator's port is taken."""

    coordinator: str | None
    num_processes: int | None
    process_id: int | None
    local_device_ids: tuple[int, ...] | None
    launcher: str
    port_hint: str = "set JAX_COORDINATOR_PORT to a free port"


def find(
    coordinator: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    env: Mapping[str, str] | None = None,
) -> Launch | None:
    """How this process joins a multi-process run, or None for a single-process run.

    The flags win; then Open MPI 4 (as in JAX, it wins over a Slurm allocation it runs in), then a
    Slurm job step of several tasks, then ``$JAX_COORDINATOR_ADDRESS`` (JAX detects the rest). A
    :class:`~jaxnet.errors.UserError` for incomplete or bad flags and for a launcher that started
    several processes but cannot be read.

    >>> find(env={"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "1", "SLURM_STEP_NUM_TASKS": "2",
    ...           "SLURM_STEP_NODELIST": "node[03-04]", "SLURM_PROCID": "1", "SLURM_LOCALID": "0",
    ...           "SLURM_STEP_TASKS_PER_NODE": "1(x2)", "SLURM_NODEID": "1"}).coordinator
    'node03:63978'
    """
    env = os.environ if env is None else env
    given = {"--coordinator": coordinator, "--num-processes": num_processes, "--process-id": process_id}
    if any(v is not None for v in given.values()):
        return _from_flags(coordinator, num_processes, process_id, env)
    if "OMPI_MCA_orte_hnp_uri" in env and _number(env, "OMPI_COMM_WORLD_SIZE", 1) > 1:
        return _open_mpi(env)
    if _number(env, "SLURM_STEP_NUM_TASKS", 1) > 1:
        return _slurm(env)
    if env.get("JAX_COORDINATOR_ADDRESS"):
        return Launch(env["JAX_COORDINATOR_ADDRESS"], None, None, None, "JAX_COORDINATOR_ADDRESS")
    for size, rank, name in _UNREADABLE:
        if _number(env, size, 1) > 1:
            count = env[size]
            raise UserError(
                f"this process was started by {name} as one of {count} ({size}={count}), which jaxnet cannot "
                "join by itself: give every process --coordinator HOST:PORT (a free port on the host of process "
                f"0), --num-processes {count} and --process-id, e.g. mpiexec -n {count} sh -c 'exec jaxnet "
                f"train ... --coordinator HOST:PORT --num-processes {count} --process-id ${rank}'"
            )
    return None


def batch_shell_tasks(env: Mapping[str, str] | None = None) -> int:
    """The tasks of the Slurm job this process runs in when it is the batch script's own shell (not
    a task ``srun`` started): more than 1 means it trains alone where the job meant several; else 0.

    >>> batch_shell_tasks({"SLURM_JOB_ID": "7", "SLURM_NTASKS": "2"})
    2
    """
    env = os.environ if env is None else env
    if "SLURM_JOB_ID" not in env or "SLURM_STEP_ID" in env or "OMPI_MCA_orte_hnp_uri" in env:
        return 0
    tasks = _number(env, "SLURM_NTASKS", 1)
    return tasks if tasks > 1 else 0


def _number(env: Mapping[str, str], name: str, default: int) -> int:
    value = env.get(name, "").strip()
    return int(value) if value.isdigit() else default


def _from_flags(coordinator: str | None, num_processes: int | None, process_id: int | None, env: Mapping) -> Launch:
    given = {"--coordinator": coordinator, "--num-processes": num_processes, "--process-id": process_id}
    missing = [k for k, v in given.items() if v is None]
    if missing:
        raise UserError(
            f"a multi-process run needs --coordinator, --num-processes and --process-id; {', '.join(missing)} missing"
        )
    if not re.fullmatch(r"[\w.\-\[\]:]+:\d+", str(coordinator)):
        raise UserError(f"--coordinator {coordinator}: expected HOST:PORT of process 0, e.g. localhost:12355")
    if num_processes < 1 or not 0 <= process_id < num_processes:
        raise UserError(
            f"--process-id {process_id} with --num-processes {num_processes}: "
            f"ids run from 0 to {max(num_processes, 1) - 1}"
        )
    # Under a launcher too, the flags say it all; the devices follow the launcher's layout if any.
    local = _local_layout(env)
    devices = local_devices(*local, env) if local else ()
    return Launch(coordinator, num_processes, process_id, devices, "--coordinator", "give --coordinator a free port")


def _open_mpi(env: Mapping[str, str]) -> Launch:
    uri = env["OMPI_MCA_orte_hnp_uri"]  # e.g. 1531576320.0;tcp://10.96.0.1,10.148.0.1:34911
    host = re.search(r"tcp://(.+?)[,:]|tcp6://\[(.+?)[,\]]", uri)
    job = uri.split(".", 1)[0]
    if host is None or not job.isdigit():
        raise UserError(
            f"OMPI_MCA_orte_hnp_uri={uri}: not the address Open MPI 4's mpirun gives; "
            "give every process --coordinator HOST:PORT, --num-processes N and --process-id I"
        )
    address = env.get("JAX_COORDINATOR_ADDRESS") or _address(
        next(h for h in host.groups() if h is not None), env.get("JAX_COORDINATOR_PORT") or _mpi_port(int(job))
    )
    local = (_number(env, "OMPI_COMM_WORLD_LOCAL_RANK", 0), _number(env, "OMPI_COMM_WORLD_LOCAL_SIZE", 1))
    return Launch(
        address,
        _number(env, "OMPI_COMM_WORLD_SIZE", 1),
        _number(env, "OMPI_COMM_WORLD_RANK", 0),
        local_devices(*local, env),
        "Open MPI's mpirun",
    )


def _mpi_port(job: int) -> int:
    # Open MPI's job ids are multiples of 4096: the same port as JAX's own detection derives
    return PORT_BASE + (job // PORT_RANGE) % PORT_RANGE


def _slurm(env: Mapping[str, str]) -> Launch:
    needed = ("SLURM_JOB_ID", "SLURM_STEP_ID", "SLURM_STEP_NODELIST", "SLURM_PROCID", "SLURM_LOCALID")
    missing = [name for name in needed if not env.get(name)]
    if missing:
        raise UserError(
            f"this process runs in a Slurm job step of {env['SLURM_STEP_NUM_TASKS']} tasks without "
            f"{', '.join(missing)}; start it with srun, or give every process --coordinator HOST:PORT, "
            "--num-processes N and --process-id I"
        )
    job, step = _number(env, "SLURM_JOB_ID", 0), _number(env, "SLURM_STEP_ID", 0)
    port = env.get("JAX_COORDINATOR_PORT") or slurm_port(job, step)
    address = env.get("JAX_COORDINATOR_ADDRESS") or _address(first_host(env["SLURM_STEP_NODELIST"]), port)
    return Launch(
        address,
        _number(env, "SLURM_STEP_NUM_TASKS", 1),
        _number(env, "SLURM_PROCID", 0),
        local_devices(*_local_layout(env), env),
        f"Slurm job {job} step {step}",
    )


def _address(host: str, port: int | str) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def slurm_port(job: int, step: int) -> int:
    """The coordinator's port of Slurm job step ``job.step``: JAX's own for step 0, another for
    each other step, so that two steps of one job running at once never meet.

    >>> slurm_port(7, 0), slurm_port(7, 1)
    (61447, 63978)
    """
    return PORT_BASE + (job + STEP_STRIDE * step) % PORT_RANGE


def first_host(nodelist: str) -> str:
    """The first host of a Slurm host list (``SLURM_STEP_NODELIST``), where process 0 runs.

    >>> first_host("gpu[007-009,012]-ib,cpu1"), first_host("rack[1-2]-n[01-04]")
    ('gpu007-ib', 'rack1-n01')
    """
    out, i = [], 0
    while i < len(nodelist) and nodelist[i] != ",":
        if nodelist[i] == "[":
            end = nodelist.find("]", i)
            if end < 0:
                break
            out.append(re.split(r"[,-]", nodelist[i + 1 : end])[0])
            i = end + 1
        else:
            out.append(nodelist[i])
            i += 1
    return "".join(out)


def _local_layout(env: Mapping[str, str]) -> tuple[int, int] | None:
    """(this process's number on its host, the processes on its host) under Open MPI or Slurm."""
    if "OMPI_COMM_WORLD_LOCAL_SIZE" in env:
        return _number(env, "OMPI_COMM_WORLD_LOCAL_RANK", 0), _number(env, "OMPI_COMM_WORLD_LOCAL_SIZE", 1)
    if "SLURM_STEP_TASKS_PER_NODE" in env:
        per_node = tasks_per_node(env["SLURM_STEP_TASKS_PER_NODE"])
        node = _number(env, "SLURM_NODEID", 0)
        return _number(env, "SLURM_LOCALID", 0), per_node[node] if node < len(per_node) else 1
    return None


def tasks_per_node(text: str) -> list[int]:
    """Slurm's compressed tasks-per-node list, one number per node.

    >>> tasks_per_node("2(x3),1")
    [2, 2, 2, 1]
    """
    counts: list[int] = []
    for part in text.split(","):
        match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if match is None:
            return []
        counts += [int(match[1])] * int(match[2] or 1)
    return counts


def local_devices(local_id: int, local_count: int, env: Mapping[str, str]) -> tuple[int, ...]:
    """Which of its host's devices a process uses: all it sees (``()``) when it is its host's only
    process, or when the launcher gave it devices of its own (``srun --gpus-per-task``, or a single
    device in ``CUDA_VISIBLE_DEVICES``); otherwise device ``local_id`` (one device per process, JAX's
    rule). Without this, JAX's detection makes the only process of a host use its first GPU alone.

    >>> local_devices(0, 1, {}), local_devices(3, 8, {}), local_devices(3, 8, {"CUDA_VISIBLE_DEVICES": "3"})
    ((), (3,), ())
    """
    if local_count <= 1 or env.get("SLURM_GPUS_PER_TASK"):
        return ()
    for name in ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES"):
        if name in env and len([d for d in env[name].split(",") if d.strip()]) == 1:
            return ()
    return (local_id,)


def check_port(port: int, what: str, hint: str) -> None:
    """A one-line :class:`~jaxnet.errors.UserError` if ``port`` is in use on this host: ``what`` names
    the port (``"the coordinator's port"``), ``hint`` what to do.

    >>> check_port(0, "a port", "choose another")  # port 0: any free port, never in use
    """
    try:
        _probe(port)
    except OSError as e:
        if e.errno != errno.EADDRINUSE:
            return  # not ours to judge (no IPv6, a privileged port): the one who binds it says
        raise UserError(
            f"{what} {port} is in use on this host (by another run, perhaps); {hint}, the same for every process"
        ) from None


def _probe(port: int) -> None:
    """Bind ``port`` on every address as JAX's coordinator does, without SO_REUSEPORT (a listener
    that set it, as gRPC's does, then still makes the bind fail), and let it go."""
    try:
        server = socket.create_server(("::", port), family=socket.AF_INET6, dualstack_ipv6=True)
    except OSError as e:
        if e.errno == errno.EADDRINUSE:
            raise
        server = socket.create_server(("0.0.0.0", port))
    server.close()

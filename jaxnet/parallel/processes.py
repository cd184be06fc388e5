"""Joining a multi-process run, and leaving it: every process runs the same program on its own
host's devices, process 0 writes the logs, and when one process stops the others stop too.

:func:`init_processes` reads the launcher (:mod:`jaxnet.parallel.launchers`), checks the ports,
joins the run through ``jax.distributed`` and starts the watch (:mod:`jaxnet.parallel.watch`);
:func:`leave` and :func:`peer_stopped` end a process with one line that says which process it
is, and which one stopped.
"""

from __future__ import annotations

import io
import os
import sys
import time

import jax

from jaxnet.errors import UserError
from jaxnet.parallel import launchers, watch
from jaxnet.parallel.watch import watch_port

# How long a process that fails before it has joined the watch waits to join, so that the others
# hear why it stopped (at most this much later than it would have stopped).
_JOIN_WAIT_SECONDS = 10.0

HEARTBEAT_SECONDS = 40


def init_processes(
    coordinator: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    *,
    quiet: bool = False,
) -> None:
    """Join a multi-process run before JAX touches a device.

    With ``coordinator`` (``HOST:PORT`` of process 0), ``num_processes`` and ``process_id`` given,
    those are used. With none given, a Slurm job step (``srun``) or Open MPI 4's ``mpirun`` is
    read, or with ``$JAX_COORDINATOR_ADDRESS`` set JAX detects the rest; otherwise this is a
    single-process run and nothing happens. With ``quiet``, what the libraries print straight to
    the process's standard output (gloo's connection lines) is dropped (:func:`quiet_output`).

    >>> init_processes()  # a single-process run: nothing to join
    """
    launch = launchers.find(coordinator, num_processes, process_id)
    if launch is None:
        tasks = launchers.batch_shell_tasks()
        if tasks:
            watch._warn(
                f"jaxnet: warning: this Slurm job has {tasks} tasks but this process is the batch script's "
                "own, so it trains alone; start it with srun (see scripts/slurm/train.sbatch)"
            )
        return
    if launch.process_id is not None:
        watch.identify(launch.process_id, launch.num_processes)
    port = watch_port()  # a bad value stops every process before any joins
    if launch.process_id == 0:
        launchers.check_port(int(launch.coordinator.rsplit(":", 1)[1]), "the coordinator's port", launch.port_hint)
        launchers.check_port(port, f"JAXNET_WATCH_PORT={port}: port", "set it to a free port (or 0 for any)")
    _initialize(launch)
    watch.identify(jax.process_index(), jax.process_count())
    if quiet:
        quiet_output()
    watch.start(heartbeat_seconds())


def _initialize(launch: launchers.Launch) -> None:
    kwargs = {"heartbeat_timeout_seconds": 2 * heartbeat_seconds() + 20}
    args: tuple = ()
    if launch.num_processes is not None:  # else JAX detects them (JAX_COORDINATOR_ADDRESS alone)
        args = (launch.coordinator, launch.num_processes, launch.process_id)
        if not os.environ.get("JAX_LOCAL_DEVICE_IDS"):  # the user's choice wins
            kwargs["local_device_ids"] = list(launch.local_device_ids)
    try:
        jax.distributed.initialize(*args, **kwargs)
    except (ValueError, RuntimeError) as e:
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UserError(
            f"could not join the multi-process run at {launch.coordinator} (from {launch.launcher}): {reason}; "
            "check that every process can reach that address, or pass --coordinator, --num-processes and "
            "--process-id"
        ) from None


def heartbeat_seconds() -> int:
    """How long a process of a multi-process run may go unheard before the others take it to have
    hung and stop: ``$JAXNET_HEARTBEAT_SECONDS``, by default :data:`HEARTBEAT_SECONDS`.

    A process that dies is noticed at once (its connection closes); this bounds the wait for one
    that hangs (a frozen host, a network cut). JAX's own heartbeat check, which ends the processes
    with a long runtime message or an abort, is set to twice that plus 20 s (100 s, JAX's default,
    with the default), as a backstop.

    >>> heartbeat_seconds()  # without $JAXNET_HEARTBEAT_SECONDS
    40
    """
    value = os.environ.get("JAXNET_HEARTBEAT_SECONDS", "").strip()
    if not value:
        return HEARTBEAT_SECONDS
    if not value.isdigit() or int(value) < 1:
        raise UserError(f"JAXNET_HEARTBEAT_SECONDS={value}: expected a whole number of seconds, at least 1")
    return int(value)


def quiet_output() -> None:
    """Keep what the libraries print straight to file descriptor 1 out of the terminal: gloo's
    "Rank 0 is connected to 1 peer ranks" line each time it connects the processes. Python's
    ``print`` goes on to the same terminal or file as before, through a copy of the descriptor;
    descriptor 1 itself then points to ``/dev/null``. Nothing changes where standard output has no
    descriptor (a test capturing it) or is already ``/dev/null``. (The libraries' log lines on
    standard error are kept out by their log levels: see ``jaxnet train --verbose``.)

    >>> quiet_output()  # doctest: +SKIP
    """
    try:
        sys.stdout.flush()
        if sys.stdout.fileno() != 1:
            return
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        return
    stream = sys.stdout
    sys.stdout = open(  # noqa: SIM115 - the process's standard output from now on
        os.dup(1),
        "w",
        buffering=1 if stream.line_buffering else -1,
        encoding=stream.encoding,
        errors=stream.errors,
    )
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    os.close(null)


def leave(code: int, message: str | None = None) -> None:
    """End this process of a multi-process run with exit code ``code``, after printing ``message``
    (if any, naming this process) on stderr and telling the other processes, which then stop too:
    at once, or, if this process has not yet joined the watch that tells them, once it has (at
    most ``_JOIN_WAIT_SECONDS`` later; the message is printed before that wait).

    A normal exit would wait at JAX's shutdown barrier for the others, which wait in a collective
    for this one. If another process is already reporting its failure, this one stays quiet.

    >>> leave(2, "jaxnet: error: data.path=x: no such directory")  # doctest: +SKIP
    """
    current = watch.current()
    if current is not None and not current.reporting.acquire(blocking=False):
        while True:  # the watch is printing its error and ending the process
            time.sleep(1)
    if current is not None:
        watch.write_now(message)  # first: whatever ends this process meanwhile, it has said why
        current.joined.wait(_JOIN_WAIT_SECONDS)  # a process failing early: still joining the watch
        current.say(f"failed {code}" if current.index else f"failed 0 {code}")
        message = None
    watch._exit(code, message)


def peer_stopped(error: BaseException) -> str | None:
    """If ``error`` looks like the failure of another process of a multi-process run (a collective
    whose connection was cut, a coordination service that lost a process), a one-line error
    saying so; otherwise None. Waits a few seconds first: if a process did stop, the watch
    (which knows which one) prints the error and ends this process meanwhile.

    >>> peer_stopped(ValueError("bad shape")) is None
    True
    """
    texts, seen = [], error
    while seen is not None and len(texts) < 5:
        texts.append(str(seen))
        seen = seen.__cause__ or seen.__context__
    text = " ".join(texts)
    markers = ("Connection reset by peer", "Connection closed by peer", "Broken pipe", "heartbeat", "Gloo")
    if not any(m.lower() in text.lower() for m in markers):
        return None
    if watch.current() is not None:
        time.sleep(watch._GRACE_SECONDS + 3)
    first = next((line.strip() for line in str(error).splitlines() if line.strip()), type(error).__name__)
    reason = first if len(first) <= 200 else first[:197] + "..."
    return f"jaxnet: error: another process of the run stopped ({reason}); this process stops too: {watch._RESUME}"


def is_primary() -> bool:
    """Whether this process writes logs, summaries and plots (process 0; every single-process run).

    >>> is_primary()
    True
    """
    return jax.process_index() == 0


def sync(name: str) -> None:
    """Wait until every process gets here (nothing to wait for in a single-process run).

    >>> sync("jaxnet: workdir checked")
    """
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)

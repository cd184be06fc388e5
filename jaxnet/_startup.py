"""Process settings that must be in place before the C libraries start: the ``jaxnet`` command
re-executes itself once with them, before JAX is imported.

glibc's malloc hands the large buffers XLA allocates and frees on every step back to the kernel
and takes them again, each 4 KiB page a fault to zero: about 15,000 minor page faults per step
of the default ConvNet on a CPU and 87,000 for the Transformer, a quarter of the process's CPU
time spent in the kernel. ``glibc.malloc.hugetlb=1`` makes malloc ask for transparent huge
pages (2 MiB), which cuts the faults about 40-fold (benchmarks/results/cpu-profile-*.json). The
tunable is read once, when a process starts, so only a fresh process can take it: the command
sets it and re-executes itself; a program that imports jaxnet can start Python with it set::

    GLIBC_TUNABLES=glibc.malloc.hugetlb=1 python my_training.py

A ``GLIBC_TUNABLES`` that already names ``glibc.malloc.hugetlb`` is left as it is (set
``glibc.malloc.hugetlb=0`` to opt out), and nothing changes outside Linux.

Huge pages still leave the Transformer's step with a fault per 2 MiB of the ~300 MiB buffer XLA
allocates and frees on every step: glibc maps any allocation over 32 MiB afresh and unmaps it
when freed, and the kernel zeroes each page again, 40-50 ms of kernel time a step on a 2-core CPU.
``JAXNET_MALLOC=mimalloc`` makes the command preload mimalloc instead (the ``cmeel-mimalloc`` wheel:
``pip install 'jaxnet[mimalloc]'``) with 2 MiB pages and freed memory kept for reuse
(``MIMALLOC_ALLOW_LARGE_OS_PAGES=1``, ``MIMALLOC_PURGE_DELAY=-1``): the faults go. On a 2-core
CPU the ConvNet's step took 17 % less time, the Transformer's 9 %, the LSTM's 1 %, and the process
held 150-360 MiB more memory (benchmarks/results/cpu-threads-2026-11-28-malloc.json). It is not
the default: the gain depends on the model and the machine, the memory is never given back, and
PyTorch gains as much from it (4-22 % there).
``JAXNET_MALLOC=glibc`` is the default; an ``LD_PRELOAD`` that already names an allocator is left
as it is. A program that imports jaxnet can start the same way::

    LD_PRELOAD=$(python -c "from jaxnet import _startup; print(_startup.mimalloc_library())") \\
        MIMALLOC_ALLOW_LARGE_OS_PAGES=1 MIMALLOC_PURGE_DELAY=-1 python my_training.py

Here too, needing no JAX: the libraries' log levels (:func:`quiet_libraries`), set before
JAX's library loads; the size of XLA's CPU thread pool for simulated devices
(:func:`make_room_for_simulated_devices`), which ``import jaxnet`` sets before JAX starts, and
where the wheels ``jaxnet plan`` compiles with live (:func:`plan_dir`, :func:`bind_cuda_plugin`).
"""

from __future__ import annotations

import os
import re
import sys

TUNABLE = "glibc.malloc.hugetlb"
SETTING = f"{TUNABLE}=1"


MIMALLOC_SETTINGS = {"MIMALLOC_ALLOW_LARGE_OS_PAGES": "1", "MIMALLOC_PURGE_DELAY": "-1"}
ALLOCATORS = ("mimalloc", "jemalloc", "tcmalloc")  # an LD_PRELOAD naming one of these is the user's choice
MALLOCS = ("glibc", "mimalloc")  # the values of $JAXNET_MALLOC, the default first


def mimalloc_library() -> str | None:
    """The path of the shared mimalloc library the ``cmeel-mimalloc`` wheel installed, or None."""
    from importlib import metadata

    try:
        files = metadata.distribution("cmeel-mimalloc").files or []
    except metadata.PackageNotFoundError:
        return None
    found = sorted((f for f in files if re.fullmatch(r"libmimalloc\.so\.\d+", f.name)), key=str)
    path = found and str(found[0].locate())
    return path if path and os.path.isfile(path) else None


def environment(env: dict[str, str], library: str | None = None) -> dict[str, str] | None:
    """``env`` with the malloc settings added, or None if it needs no change: glibc's huge pages,
    and with ``JAXNET_MALLOC=mimalloc`` mimalloc preloaded (``library``, default
    :func:`mimalloc_library`) unless an allocator is preloaded already. A ``JAXNET_MALLOC`` that
    is neither ``glibc`` (the default) nor ``mimalloc``, or mimalloc missing on Linux, raises a
    ValueError saying what to do."""
    new = dict(env)
    tunables = env.get("GLIBC_TUNABLES", "")
    if TUNABLE not in tunables:
        new["GLIBC_TUNABLES"] = f"{tunables}:{SETTING}" if tunables else SETTING
    given = env.get("JAXNET_MALLOC", MALLOCS[0])
    choice = given.strip().lower() or MALLOCS[0]
    if choice not in MALLOCS:
        raise ValueError(f"JAXNET_MALLOC={given!r} is not an allocator jaxnet knows: use glibc or mimalloc")
    preload = env.get("LD_PRELOAD", "")
    if choice == "mimalloc" and not any(name in preload for name in ALLOCATORS):
        library = library or mimalloc_library()
        if library is None and sys.platform.startswith("linux"):
            raise ValueError("JAXNET_MALLOC=mimalloc needs the cmeel-mimalloc wheel: pip install 'jaxnet[mimalloc]'")
        if library:  # off Linux the wheel is not there, and nothing changes
            new["LD_PRELOAD"] = f"{library}:{preload}" if preload else library
            for key, value in MIMALLOC_SETTINGS.items():
                new.setdefault(key, value)
    return None if new == env else new


def _is_jaxnet_command(argv: list[str]) -> bool:
    """Whether this process was started as ``jaxnet ...`` or ``python [options] -m jaxnet ...``."""
    if len(argv) > 1 and os.path.basename(argv[1]) == "jaxnet" and not argv[1].endswith(".py"):
        return True  # the console script: python /path/to/bin/jaxnet ...
    return any(a == "-m" and b == "jaxnet" for a, b in zip(argv, argv[1:], strict=False))


def reexec_command() -> None:
    """Re-execute the ``jaxnet`` command with the malloc setting, if it lacks it (else return)."""
    if not sys.platform.startswith("linux") or "jax" in sys.modules:
        return
    argv = list(getattr(sys, "orig_argv", []))
    if not _is_jaxnet_command(argv):
        return
    try:
        env = environment(dict(os.environ))
    except ValueError as e:  # a bad $JAXNET_MALLOC: one line, exit status 2
        sys.stderr.write(f"jaxnet: error: {e}\n")
        raise SystemExit(2) from None
    if env is None:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *argv[1:]], env)


def simulated_cpu_devices() -> int:
    """How many CPU devices this process simulates: ``jax_num_cpu_devices`` (``$JAX_NUM_CPU_DEVICES``)
    if set, else ``--xla_force_host_platform_device_count`` in ``$XLA_FLAGS``, else 1. Read from
    the environment while JAX is not imported (``import jaxnet`` does not import it)."""
    if "jax" in sys.modules:
        configured = sys.modules["jax"].config.jax_num_cpu_devices
    else:
        text = os.environ.get("JAX_NUM_CPU_DEVICES", "").strip()
        configured = int(text) if text.isdigit() else 0
    if configured > 0:
        return configured
    found = re.findall(r"--xla_force_host_platform_device_count=(\d+)", os.environ.get("XLA_FLAGS", ""))
    return int(found[-1]) if found else 1


def make_room_for_simulated_devices() -> None:
    """Give XLA's CPU client at least twice as many threads as the devices it simulates, before
    JAX starts it: ``$PJRT_NPROC``, the client's thread count, is set or raised to that.

    The client runs each device's part of a multi-device program on a thread of one pool, sized
    to the device count when the machine has fewer cores, and every part must be running at once
    for the program's collectives to meet. Each call of a jitted function dispatches its parts
    from that same pool, and a dispatch waits there while its device has 32 computations queued
    (XLA's ``max_inflight_computations_per_device``). When the host runs that far ahead of the
    devices (a busy machine, evaluation's many small programs), a waiting dispatch holds a thread
    a part needs, the parts already running wait in their collectives for it, and XLA aborts the
    process after 40 s ("Termination timeout for `all gather RendezvousKey{...}`"). With twice
    the threads, one call's dispatches and one program's parts always fit. A larger value (more
    cores, or the user's) is kept; nothing changes without simulated devices, nor once JAX has
    started its backends (too late to size the pool). Needs no JAX: ``import jaxnet`` calls it.
    """
    devices = simulated_cpu_devices()
    if devices < 2:
        return
    if "jax" in sys.modules:  # without JAX imported, no backend can have started
        from jax._src import xla_bridge  # whether the CPU client exists already: no public API says

        if xla_bridge.backends_are_initialized():
            return
    # An inherited value counts too: a parent process may have simulated fewer devices.
    os.environ["PJRT_NPROC"] = str(max(xla_cpu_threads(), 2 * devices))


def xla_cpu_threads() -> int:
    """The threads XLA's CPU client runs with: ``$PJRT_NPROC``, else ``$NPROC`` (a CPU reservation),
    else the cores this process may use."""
    given = next((v for v in (os.environ.get(k, "").strip() for k in ("PJRT_NPROC", "NPROC")) if v.isdigit()), "")
    if given:
        return int(given)
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def quiet_libraries() -> None:
    """Keep the libraries' informational log lines out of the terminal, errors still shown: the C++
    log of XLA and JAX's runtime below ERROR (``$TF_CPP_MIN_LOG_LEVEL`` raised to 2, a higher value
    kept: the preemption notifier's "SIGTERM caught at ..."; importing JAX sets 1, which a process
    started by one that imported JAX inherits) and Python's ``absl`` logger below ERROR (orbax's
    "Reached preemption sync point"). The C++ level is read once, when JAX's library loads, so
    this must come first. ``jaxnet train`` calls it unless ``--verbose``.

    >>> quiet_libraries(); import logging; logging.getLogger("absl").level == logging.ERROR
    True
    """
    level = os.environ.get("TF_CPP_MIN_LOG_LEVEL", "").strip()
    if not (level.isdigit() and int(level) >= 2):
        os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
    from absl import logging as absl_logging  # its verbosity, which jaxnet.checkpoint saves and restores

    absl_logging.set_verbosity(absl_logging.ERROR)


def plan_dir() -> str:
    """Where the plan's wheels live apart from every other JAX process: ``$JAXNET_PLAN_DIR``, else
    ``jaxnet-plan`` in this Python's environment (``.venv/jaxnet-plan``). On a machine without a GPU,
    the CUDA plugin on the path makes each JAX process log to stderr, so it is not installed beside
    jaxnet (see :mod:`jaxnet.planner`)."""
    return os.environ.get("JAXNET_PLAN_DIR") or os.path.join(sys.prefix, "jaxnet-plan")


def bind_cuda_plugin() -> None:
    """Import JAX and register the CUDA plugin found on ``sys.path`` (the plan's wheels put there
    first), with the plugin's "no CUDA driver" log lines kept off stderr: no GPU is expected."""
    saved, null = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 2)
    try:
        import jax._src.xla_bridge

        jax._src.xla_bridge._discover_and_register_pjrt_plugins()
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)


reexec_command()

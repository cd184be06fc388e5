"""Process settings that must be in place before the C libraries start: the ``jaxnet`` command
re-executes itself once with them, before JAX is imported.

glibc's malloc hands the large buffers XLA allocates and frees on every step back to the kernel
and takes them again, each 4 KiB page a fault to zero: about 15,000 minor page faults per step
of the default ConvNet on a CPU and 83,000 for the Transformer, a quarter of the process's CPU
time spent in the kernel. ``glibc.malloc.hugetlb=1`` makes malloc ask for transparent huge
pages (2 MiB), which cuts the faults about 40-fold (benchmarks/results/cpu-profile-*.json). The
tunable is read once, when a process starts, so only a fresh process can take it: the command
sets it and re-executes itself; a program that imports jaxnet can start Python with it set::

    GLIBC_TUNABLES=glibc.malloc.hugetlb=1 python my_training.py

A ``GLIBC_TUNABLES`` that already names ``glibc.malloc.hugetlb`` is left as it is (set
``glibc.malloc.hugetlb=0`` to opt out), and nothing changes outside Linux.
"""

from __future__ import annotations

import os
import sys

TUNABLE = "glibc.malloc.hugetlb"
SETTING = f"{TUNABLE}=1"


def environment(env: dict[str, str]) -> dict[str, str] | None:
    """``env`` with the malloc setting added, or None if it needs no change."""
    tunables = env.get("GLIBC_TUNABLES", "")
    if TUNABLE in tunables:
        return None
    return {**env, "GLIBC_TUNABLES": f"{tunables}:{SETTING}" if tunables else SETTING}


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
    env = environment(dict(os.environ))
    if env is None:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *argv[1:]], env)


reexec_command()

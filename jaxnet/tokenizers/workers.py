"""The worker processes of ``jaxnet prepare``: started by spawning (never forked from a process that
may hold JAX), each one a fresh Python that imports this module, the tokenizer and numpy, and
nothing of an accelerator.

:func:`worker_pool` starts them; :func:`start` is what each one runs first. The tokenizer reaches
a worker through a file (see :func:`worker_pool`); a worker's environment keeps each library to one
thread, since the processes are the parallelism.
"""

from __future__ import annotations

import contextlib
import math
import multiprocessing
import os
import pickle
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor

# Set in a worker before anything imports numpy or a tokenizer library. OpenBLAS starts a thread
# a core when numpy is imported: 0.05-0.08 s of CPU a worker start on this project's 2-core
# machines, for BLAS a tokenizer never calls.
WORKER_ENVIRONMENT = {
    "TOKENIZERS_PARALLELISM": "false",
    "RAYON_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "OMP_NUM_THREADS": "1",
}


class Probe:
    """What the machine's cores do from now on: made when a prepare starts, read (:meth:`others`)
    when it chooses its worker count, so that the time between (reading the source) is the window.

    >>> probe = Probe(); busy, how = probe.others(2)  # cores the other work kept busy, and how that was known
    """

    WINDOW = 0.1  # seconds at least: Linux counts CPU time in ticks of 10 ms

    def __init__(self) -> None:
        self.wall, self.mine, self.ticks = time.monotonic(), time.process_time(), _cpu_ticks()

    def others(self, cores: int) -> tuple[float, str]:
        """How many of the ``cores`` other processes kept busy since the probe was made (Linux's
        ``/proc/stat``: the machine's busy time less this process's own), and how it was known;
        where there is no ``/proc/stat``, the 1-minute load average (which counts recent work, this
        process's included); 0 where neither is known."""
        if self.ticks is not None:
            time.sleep(max(0.0, self.WINDOW - (time.monotonic() - self.wall)))
            ticks = _cpu_ticks()
            if ticks is not None and ticks[0] > self.ticks[0]:
                wall = time.monotonic() - self.wall
                total, idle = ticks[0] - self.ticks[0], ticks[1] - self.ticks[1]
                busy = cores * (1 - idle / total) - (time.process_time() - self.mine) / wall
                return max(0.0, busy), f"over the last {wall:.1f} s"
        try:
            return os.getloadavg()[0], "by the load average"
        except (AttributeError, OSError):  # no load average (Windows): the cores alone
            return 0.0, "unknown"


def _cpu_ticks() -> tuple[int, int] | None:
    """The machine's CPU time so far, all of it and the idle part, in Linux's ticks (None elsewhere)."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:9]]  # user nice system idle iowait irq softirq steal
    except (OSError, ValueError):
        return None
    return (sum(fields), fields[3] + fields[4]) if len(fields) == 8 else None


def default_workers(most: int, probe: Probe | None = None, cores: int | None = None) -> tuple[int, str]:
    """The number of processes a prepare uses when ``--workers`` is not given: ``most`` (one per core,
    bounded by the work), but no more than the cores other work leaves idle (:meth:`Probe.others`
    since ``probe``, else over the next 0.1 s), rounded up, and at least one. ``cores`` defaults to
    this machine's. Returns the count and, when the other work lowered it, the line that says so
    (else "").

    On busy cores a second worker only shares them with the work already there, and its start
    costs a core about 0.15 s (the Data page has the measurements).
    """
    cores = cores or os.cpu_count() or 1
    if most <= 1:
        return 1, ""
    busy, how = (probe or Probe()).others(cores)
    idle = max(1, math.ceil(cores - busy))
    if most <= idle:
        return most, ""
    return idle, (
        f"{idle} worker{'s' if idle != 1 else ''}, not {most}: other work kept {busy:.1f} of the {cores} cores busy "
        f"({how}), and on busy cores more workers only share them (--workers {most} starts them anyway)"
    )


@contextlib.contextmanager
def worker_pool(
    processes: int, initializer: Callable[..., None], initargs: tuple
) -> Iterator[ProcessPoolExecutor | None]:
    """``processes`` spawned worker processes, each started by ``initializer(*initargs)`` (None for
    none); shut down, waiting for them, when the block ends.

    The arguments reach the workers through a file, not the pipe a spawned process is started
    through: that pipe holds 64 KiB, and this process would wait, writing the rest (a GPT-2
    encoding is 0.6 MB, a ``tokenizer.json`` several), until the child had started Python and
    imported the tokenizer, about 0.1 s in which it encodes nothing. Through the file the start
    costs this process a few milliseconds, and the child reads the arguments on its own time.
    """
    if processes < 1:
        yield None
        return
    with tempfile.TemporaryDirectory(prefix="jaxnet-workers-") as tmp:
        path = os.path.join(tmp, "initargs.pickle")
        with open(path, "wb") as f:
            pickle.dump((initializer, initargs), f, protocol=pickle.HIGHEST_PROTOCOL)
        ctx = multiprocessing.get_context("spawn")
        pool = ProcessPoolExecutor(processes, mp_context=ctx, initializer=start, initargs=(path,))
        try:
            yield pool
        finally:
            pool.shutdown(wait=True, cancel_futures=True)


def start(path: str) -> None:
    """A worker process's initializer: its environment (:data:`WORKER_ENVIRONMENT`, and never an
    accelerator), then ``initializer(*initargs)`` as pickled in the file ``path``."""
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    os.environ.update(WORKER_ENVIRONMENT)
    with open(path, "rb") as f:
        initializer, initargs = pickle.load(f)
    initializer(*initargs)

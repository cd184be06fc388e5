"""The worker processes of ``jaxnet prepare``: started by spawning (never forked from a process that
may hold JAX), each one a fresh Python that imports this module, the tokenizer and numpy, and
nothing of an accelerator.

:func:`worker_pool` starts them; :func:`start` is what each one runs first. The tokenizer reaches
a worker through a file (see :func:`worker_pool`); a worker's environment keeps each library to one
thread, since the processes are the parallelism.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import pickle
import tempfile
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

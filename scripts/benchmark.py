"""The full benchmark matrix, then the README's performance tables.

    python scripts/benchmark.py [--rounds R] [--seconds S]

Every family (``jaxnet bench --full``: the CNN, the LSTM, the Transformer, a CIFAR-shaped
ResNet-20 and, on a GPU, the GPT-2-small shape), each against the hand-written jit loop,
PyTorch (when installed) and resident batches; on a GPU also the CPU-versus-GPU table
(``--compare-devices``). Writes ``benchmarks/results/<device>-<date>.json`` and regenerates the
README from the results files (``scripts/update_docs.py``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str]) -> int:
    """Run the matrix with ``argv`` passed on to ``jaxnet bench``; returns the exit code."""
    sys.path.insert(0, str(ROOT))
    from jaxnet import _startup

    try:
        env = _startup.environment(dict(os.environ))
    except ValueError as e:  # a bad $JAXNET_MALLOC
        print(f"benchmark.py: error: {e}", file=sys.stderr)
        return 2
    if env is not None:  # the allocator setting the jaxnet command runs with, read at process start
        os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)
    import jax

    from jaxnet.cli import main as jaxnet

    extra = ["--compare-devices"] if jax.default_backend() == "gpu" else []
    code = jaxnet(["bench", "--full", "--out", str(ROOT / "benchmarks" / "results"), *extra, *argv])
    if code == 0:
        import update_docs

        update_docs.main([])
    return code


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

"""jaxnet runs in subprocesses for the multi-process tests: 1 process with K simulated CPU devices,
or N processes started by ``scripts/launch_local.sh`` (K devices each), with a ``sitecustomize``
on their path that records what each process reads.

The ``sitecustomize`` (:func:`write_spy`) runs an ``_install(module)`` of the test's own when the
module it watches is first imported in a process; ``_install`` wraps what it wants to watch and
writes records with ``_log(record)``, one JSON line per record in
``$JAXNET_TEST_SPY/process-ID.jsonl`` (``_LOCAL`` is a thread-local it may use)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAUNCH = str(ROOT / "scripts" / "launch_local.sh")

_HEAD = r"""
import importlib.abc, importlib.util, json, os, sys, threading

_DIR = os.environ["JAXNET_TEST_SPY"]
_ID = sys.argv[sys.argv.index("--process-id") + 1] if "--process-id" in sys.argv else "0"
_LOCK, _LOCAL = threading.Lock(), threading.local()


def _log(record):
    with _LOCK, open(os.path.join(_DIR, f"process-{_ID}.jsonl"), "a") as f:
        f.write(json.dumps(record) + "\n")
"""

_TAIL = r"""

class _After(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != _WATCHED:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            _install(module)

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _After())
"""


def write_spy(site: Path, module: str, install: str) -> None:
    """Write ``site/sitecustomize.py``: ``install`` (Python source defining ``_install(module)``) run
    on ``module`` (e.g. ``"jaxnet.data.tokens"``) when a process first imports it."""
    site.mkdir(parents=True, exist_ok=True)
    (site / "sitecustomize.py").write_text(f"{_HEAD}\n_WATCHED = {module!r}\n{install}\n{_TAIL}")


def env(devices: int, spy: Path) -> dict[str, str]:
    """The environment of a run on ``devices`` CPU devices per process recording into ``spy`` (made
    here), with the ``sitecustomize`` of ``spy.parent / "site"`` and this checkout on the path."""
    from conftest import cpu_env

    out = cpu_env(devices)
    spy.mkdir(parents=True)
    out["JAXNET_TEST_SPY"] = str(spy)
    out["PYTHONPATH"] = os.pathsep.join([str(spy.parent / "site"), str(ROOT)])
    out["PYTHON"] = sys.executable
    return out


def run(command: list[str], devices: int, spy: Path) -> subprocess.CompletedProcess:
    """Run ``command`` (in the checkout) with ``devices`` CPU devices per process, recording into
    ``spy``; it must succeed."""
    from conftest import run_patiently

    result = run_patiently(command, capture_output=True, text=True, env=env(devices, spy), timeout=600, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def records(spy: Path) -> dict[int, list[dict]]:
    """Each process's records (by process id)."""
    return {
        int(f.stem.split("-")[1]): [json.loads(line) for line in f.read_text().splitlines()]
        for f in sorted(spy.glob("process-*.jsonl"))
    }


def metrics(workdir: Path) -> dict[tuple[int, str], dict]:
    """The run's ``metrics.jsonl`` records by ``(step, split)``."""
    lines = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    return {(r["step"], r["split"]): r for r in lines}

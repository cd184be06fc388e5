"""Shared test fixtures: small datasets built in memory, and tiny configs that train in seconds."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("JAX_PLATFORMS", "cpu")

# The tests check what programs compute, not how fast they run, and each runs a program for a few
# steps: LLVM's optimisation passes are then most of the time (XLA's CPU compilation of a tiny
# ResNet's initialisers: 8 s at the default level, 1.4 s at level 0). XLA's older (non-MLIR)
# fusion emitters compile the same programs in about half the time again (the ConvNet smoke
# step: 1.3 -> 0.5 s; a tiny Transformer's 2.4 -> 1.5 s). Subprocesses get them too.
TEST_XLA_FLAGS = (
    "--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false"
    if os.environ["JAX_PLATFORMS"] == "cpu"
    else ""
)
if TEST_XLA_FLAGS and TEST_XLA_FLAGS not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {TEST_XLA_FLAGS}".strip()


def fails(argv: list[str], capsys) -> str:
    """Run ``jaxnet ARGV``; it must exit 2 with one ``jaxnet: error:`` line on stderr, which is returned."""
    from jaxnet import cli

    capsys.readouterr()
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("jaxnet: error: ") and "\n" not in err, err
    return err


def said(argv: list[str], capsys) -> str:
    """Run ``jaxnet ARGV``; it must exit 0, and what it printed on stdout is returned."""
    from jaxnet import cli

    capsys.readouterr()
    assert cli.main(argv) == 0
    return capsys.readouterr().out


def busy() -> float:
    """How many times slower than on a quiet machine work may run now: the load average of the
    last minute per core, at least 1 (a machine with every core busy twice over: 2)."""
    return max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1))


def patient(seconds: float) -> float:
    """A time limit of ``seconds`` (what the work needs on a quiet machine, with room) stretched by
    how busy the machine is now (:func:`busy`): a test must not fail because others use the cores."""
    return seconds * busy()


def run_patiently(command: list[str], *, timeout: float, **kw) -> subprocess.CompletedProcess:
    """``subprocess.run(command, capture_output=True, text=True, **kw)`` under a time limit that
    follows the load: ``timeout`` seconds on a quiet machine, stretched by the busiest load average
    seen while the command runs (:func:`busy`, sampled every few seconds at most). A command past it is
    killed and :class:`subprocess.TimeoutExpired` raised, as ``subprocess.run`` does."""
    kw.pop("capture_output", None)
    kw.setdefault("text", True)
    deadline = LoadDeadline(timeout)
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw) as process:
        while True:
            try:
                out, err = process.communicate(timeout=min(5.0, timeout / 4))
                break
            except subprocess.TimeoutExpired:
                if deadline.passed():
                    process.kill()
                    out, err = process.communicate()
                    raise subprocess.TimeoutExpired(command, deadline.limit(), out, err) from None
    return subprocess.CompletedProcess(command, process.returncode, out, err)


class LoadDeadline:
    """A time limit from now of ``timeout`` seconds on a quiet machine, stretched by the busiest
    load average seen at its checks (:func:`busy`): poll :meth:`passed` every few seconds."""

    def __init__(self, timeout: float):
        self.timeout, self.factor, self.started = timeout, busy(), time.monotonic()

    def limit(self) -> float:
        """The limit in seconds as stretched so far."""
        return self.timeout * self.factor

    def passed(self) -> bool:
        """Whether the limit, stretched by the load now if that is the busiest yet, has passed."""
        self.factor = max(self.factor, busy())
        return time.monotonic() - self.started > self.limit()


def cpu_env(devices: int = 1) -> dict[str, str]:
    """The environment of a subprocess on ``devices`` simulated CPU devices (with the tests' XLA flags)."""
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
    flags = [TEST_XLA_FLAGS] + ([f"--xla_force_host_platform_device_count={devices}"] if devices > 1 else [])
    env["XLA_FLAGS"] = " ".join(f for f in flags if f)
    env["JAX_PLATFORMS"] = "cpu"
    return env


def _share_compilations() -> None:
    """One XLA compilation cache for the whole test session, its subprocesses and its parallel
    workers (pytest-xdist): many tests compile the same tiny step (a run and its resume, the CLI
    and the library on one config), and a cached executable is the same program, so results do
    not change. A directory of this session alone: nothing outlives or leaks into other runs."""
    if "JAX_COMPILATION_CACHE_DIR" in os.environ:
        return
    import atexit
    import shutil
    import tempfile
    import time

    root = Path(tempfile.gettempdir())
    for old in root.glob("jaxnet-tests-xla-cache-*"):  # left by parallel runs (their workers share one)
        if time.time() - old.stat().st_mtime > 6 * 3600:
            shutil.rmtree(old, ignore_errors=True)
    session = os.environ.get("PYTEST_XDIST_TESTRUNUID")  # the same in every worker of one run
    if session:
        path = root / f"jaxnet-tests-xla-cache-{session}"
        path.mkdir(exist_ok=True)
    else:
        path = Path(tempfile.mkdtemp(prefix="jaxnet-tests-xla-cache-"))
        atexit.register(shutil.rmtree, path, ignore_errors=True)
    os.environ["JAX_COMPILATION_CACHE_DIR"] = str(path)
    os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"


_share_compilations()


def _with_plan_wheels() -> None:
    """The wheels `jaxnet plan` compiles with live apart (jaxnet._startup.plan_dir): put on this
    process's path before JAX is imported, which is when JAX binds the CUDA plugin, so
    tests/test_plan.py plans in-process. Subprocesses do not inherit the path."""
    from jaxnet._startup import bind_cuda_plugin, plan_dir  # imports no JAX

    directory = plan_dir()
    if not os.path.isdir(os.path.join(directory, "jax_cuda12_plugin")) or directory in sys.path:
        return
    sys.path.insert(0, directory)
    bind_cuda_plugin()


_with_plan_wheels()

import flax.linen as nn  # noqa: E402

from jaxnet import Config, Dataset, config  # noqa: E402  (after the environment above: jax reads it)


def _installed_fashion_mnist() -> Path | None:
    """Where jaxnet finds Fashion-MNIST (system-wide or per user), if it is installed."""
    from jaxnet.data.images import find_fashion_mnist
    from jaxnet.errors import UserError

    try:
        return find_fashion_mnist()
    except UserError:
        return None


FASHION_MNIST = _installed_fashion_mnist()
needs_fashion_mnist = pytest.mark.skipif(
    FASHION_MNIST is None, reason="Fashion-MNIST not installed (scripts/test installs it)"
)


def bright_quadrant_data(n: int, seed: int, size: int = 8) -> tuple[np.ndarray, np.ndarray]:
    """Noise images with one brighter quadrant; the label is which quadrant (4 classes)."""
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 100, size=(n, size, size, 1)).astype(np.uint8)
    y = rng.integers(0, 4, size=n).astype(np.int32)
    half = size // 2
    for i, label in enumerate(y):
        r, c = divmod(int(label), 2)
        x[i, r * half : (r + 1) * half, c * half : (c + 1) * half] += 120
    return x, y


@pytest.fixture(scope="session")
def quadrants() -> Dataset:
    """A learnable 4-class dataset of 8x8 images: 512 train, 128 val, 128 test."""
    return Dataset(
        train=bright_quadrant_data(512, 0),
        val=bright_quadrant_data(128, 1),
        test=bright_quadrant_data(128, 2),
        num_classes=4,
        name="quadrants",
    )


def tiny_config(**sections: dict) -> Config:
    """A config for a tiny ConvNet on :func:`quadrants`: 12 steps, logs every 2, no progress bar."""
    cfg = Config(experiment="tiny")
    cfg.model.features = (4,)
    cfg.model.hidden = 16
    cfg.optim.lr = 1e-2
    cfg.train.steps = 12
    cfg.train.batch_size = 32
    cfg.train.eval_batch_size = 64
    cfg.train.log_every = 2
    cfg.train.eval_every = 4
    cfg.train.checkpoint_every = 4
    cfg.train.progress = False
    cfg.data.prefetch = 2
    name = sections.get("model", {}).get("name", cfg.model.name)
    if name != cfg.model.name:  # another family: its config class, with its defaults
        cfg.model = config.model_config(name)
    for section, values in sections.items():
        for key, value in values.items():
            setattr(getattr(cfg, section), key, value)
    return cfg


# The files whose tests take longest, run first: with parallel workers (scripts/test runs
# pytest-xdist, one file per worker at a time) a long file started last would leave the other
# workers idle at the end.
LONGEST_FIRST = ("test_parallel.py", "test_multiprocess.py", "test_lm_cli.py", "test_bench.py", "test_train.py")


def pytest_collection_modifyitems(items: list) -> None:
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(Path(str(item.fspath)).name, len(rank)))  # stable: order within a file kept


#: What every test of a user's own arrays sets: the data comes from Python, and no progress bar.
OWN_ARRAYS = ("data.name=arrays", "train.progress=false")


def arrays_config(experiment: str, settings: list[str] | tuple[str, ...], *overrides: str) -> Config:
    """``Config(experiment=experiment)`` for a user's own arrays (:data:`OWN_ARRAYS`), with a test
    file's ``settings`` and then a test's ``overrides`` (``key=value`` each)::

        cfg = arrays_config("library", ["optim.lr=1e-2", "train.steps=40"], "train.batch_size=8")
    """
    return config.apply_overrides(Config(experiment=experiment), [*OWN_ARRAYS, *settings, *overrides])


# A user's own model and arrays, for the tests of the library path: y is a noisy linear function of x.
WEIGHTS = np.array([1.0, -2.0, 0.5], np.float32)


def linear_data(n: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 3)).astype(np.float32)
    return {"x": x, "y": (x @ WEIGHTS + 0.1 * rng.normal(size=n)).astype(np.float32)}


class MLP(nn.Module):
    @nn.compact
    def __call__(self, x, train=False):
        return nn.Dense(1)(nn.relu(nn.Dense(16)(x)))[..., 0]

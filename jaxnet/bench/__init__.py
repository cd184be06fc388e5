"""``jaxnet bench``: training speed of the standard experiments, side by side with yardsticks.

For each family (the CNN, the LSTM and the Transformer at their standard experiment shapes;
``--full`` adds a CIFAR-shaped ResNet-20 and, on a GPU, a GPT-2-small-shaped Transformer) it
measures, in alternation (A B C ... A B C ...) after a warm-up, with the same shapes, dtypes,
optimizer and batches:

- ``runner``: :func:`jaxnet.train` itself on the real data, its throughput read from its own
  metrics log (compile time, checkpoints and plots excluded; the first interval skipped);
- ``handwritten``: the shortest ``jax.jit`` loop on the same model and data
  (:mod:`jaxnet.bench.handwritten`), the yardstick for the runner's overhead;
- ``pipeline`` and ``resident``: the runner's compiled step fed by the real input pipeline
  (host batches made on a background thread and placed on the device ahead of the step) and by
  batches already on the device, the yardstick for the input pipeline;
- ``torch``: the same model in PyTorch (:mod:`jaxnet.bench.torch_peers`, when torch is
  installed) fed batches already in host memory; it never waits for a loader.

Each measurement times ``3 L`` steps after ``L`` untimed ones, and reads the loss every ``L``
steps (``L`` is the log interval). Step time, examples/s, tokens/s, compile time of the first
step, XLA's memory plan per device, FLOPs per step and achieved FLOP/s (and MFU where the
device's peak is known, :mod:`jaxnet.flops`) are reported with the medians over the rounds and
the ratios the project targets. The table is printed and every figure goes to
``benchmarks/results/<device>-<date>.json``.

Every run also places each family's compiled step on the device's roofline
(:mod:`jaxnet.bench.roofline`: FLOPs and bytes per step from XLA's cost analysis, arithmetic
intensity, compute- or memory-bound, fraction of the roofline reached) and draws
``roofline-<device>-<date>.png``; ``--roofline`` measures only that (the compiled step on
resident batches) and writes ``roofline-<device>-<date>.json``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import io
import itertools
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import numpy as np

from jaxnet import config as config_lib
from jaxnet import data as data_lib
from jaxnet import flops, models, observe, parallel
from jaxnet.bench import roofline
from jaxnet.data import pipeline
from jaxnet.data import text as text_lib
from jaxnet.errors import UserError


@dataclasses.dataclass(frozen=True)
class Case:
    """One benchmarked configuration: an experiment, overrides, and where its data comes from."""

    name: str
    experiment: str
    overrides: tuple[str, ...] = ()
    synthetic: str = ""  # "cifar10" or "tokens:VOCAB": random data of the real shape
    gpu_only: bool = False
    doc: str = ""


CASES = {
    "cnn": Case("cnn", "cnn_fashion_mnist", doc="ConvNet on Fashion-MNIST, batch 128"),
    "lstm": Case("lstm", "lstm_ptb_small", doc="2 x 200 LSTM on Penn Treebank words, batch 20 x 20 steps"),
    "transformer": Case(
        "transformer", "transformer_shakespeare", doc="4 x 128 Transformer on Shakespeare characters, 32 x 128"
    ),
    "resnet": Case(
        "resnet",
        "resnet_cifar10",
        synthetic="cifar10",
        doc="ResNet-20 on CIFAR-10-shaped images (32 x 32 x 3, random pixels), batch 128",
    ),
    "gpt2_shakespeare": Case(
        "gpt2_shakespeare",
        "gpt2_shakespeare",
        doc="4 x 128 GPT on Shakespeare in GPT-2's tokens, 16 x 128, vocabulary 50,304: the output layer is most "
        "of the work",
    ),
    "gpt2": Case(
        "gpt2",
        "transformer_shakespeare",
        (
            "model.layers=12",
            "model.width=768",
            "model.heads=12",
            "data.seq_len=1024",
            "train.batch_size=16",
            "optim.warmup_steps=10",
        ),
        synthetic="tokens:50304",
        gpu_only=True,
        doc="GPT-2-small shape: 12 x 768, 12 heads, context 1024, vocabulary 50,304, batch 16 (random tokens)",
    ),
}
STANDARD = ("cnn", "lstm", "transformer")
METHODS = ("runner", "handwritten", "pipeline", "resident", "torch")

# The project's targets: (ratio or figure, threshold, what it compares).
TARGETS = {
    "runner/handwritten": (0.97, "runner throughput over the hand-written jit loop's"),
    "pipeline/resident": (0.95, "real input pipeline over batches already on the device"),
    "jaxnet/torch": (1.0, "runner throughput over PyTorch's on the same model and batches"),
}
COMPILE_TARGET_S = {"cpu": 30.0}
MFU_TARGET = 0.45  # GPT-2-small shape, bf16, one H100/H200


@dataclasses.dataclass
class Options:
    """What to run and for how long."""

    families: tuple[str, ...] = STANDARD
    rounds: int = 3
    seconds: float = 3.0  # target length of one timed measurement
    methods: tuple[str, ...] = METHODS
    smoke: bool = False  # the experiments' smoke variants, a few steps each: checks that it all works
    roofline: bool = False  # only the roofline: the compiled step on resident batches, cost analysed
    out: str = "benchmarks/results"
    say: Callable[[str], None] = print


# ---------------------------------------------------------------------------------------------
# Setting a case up


def case_config(case: Case, smoke: bool) -> config_lib.Config:
    """The experiment's config with the case's overrides, no evaluation, checkpoints or progress bar."""
    overrides = [*case.overrides, "train.eval_every=0", "train.checkpoint_every=0", "train.progress=false"]
    if smoke and case.gpu_only:  # a GPT-2 shape on a CPU: shrink it to a smoke size
        overrides += ["model.layers=2", "model.width=64", "model.heads=2", "data.seq_len=64", "train.batch_size=4"]
    return config_lib.load_experiment(case.experiment + (":smoke" if smoke else ""), overrides)


def case_dataset(case: Case, cfg: config_lib.Config) -> Any:
    """The real data, or random data of its shape for cases whose data cannot be installed here."""
    rng = np.random.default_rng(0)
    if case.synthetic == "cifar10":
        n = max(4 * cfg.train.batch_size, 512)
        empty = (np.zeros((0, 32, 32, 3), np.uint8), np.zeros((0,), np.int32))
        images = rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8)
        return data_lib.Dataset(train=(images, rng.integers(0, 10, n)), val=empty, test=empty, num_classes=10)
    if case.synthetic.startswith("tokens:"):
        vocab = int(case.synthetic.split(":")[1])
        tokens = rng.integers(0, vocab, 1 << 20)
        return text_lib.TextDataset(
            train=tokens, val=tokens[:0], test=tokens[:0], vocab=[f"<{i}>" for i in range(vocab)], name="random"
        )
    from jaxnet.train.loop import experiment_hooks

    hooks = experiment_hooks(cfg)  # an experiment's own data (gpt2_shakespeare's corpus, prepared on first use)
    return hooks["data"](cfg) if "data" in hooks else data_lib.load(cfg.data)


def _set_timing(cfg: config_lib.Config, interval: int) -> config_lib.Config:
    """``cfg`` logging every ``interval`` steps and stopping after ``4 * interval``."""
    steps = max(cfg.train.steps, 4 * interval)
    return config_lib.apply_overrides(
        cfg,
        [f"train.log_every={interval}", f"train.steps={steps}", f"train.stop_after={4 * interval}"],
    )


# ---------------------------------------------------------------------------------------------
# The measurements: each returns steps per second over 3 * interval steps after interval untimed ones


def _timed_loop(step: Callable[[int], Any], interval: int) -> float:
    """Steps/s of ``step(i)`` (which returns something to wait on) over 3 intervals after one untimed."""
    out = None
    for i in range(interval):
        out = step(i)
    jax.block_until_ready(out)
    start = time.perf_counter()
    for i in range(interval, 4 * interval):
        out = step(i)
        if (i + 1) % interval == 0:
            jax.block_until_ready(out)
    return 3 * interval / (time.perf_counter() - start)


def measure_runner(cfg: config_lib.Config, dataset: Any, interval: int) -> tuple[float, float]:
    """The runner's steps/s (from its own metrics log, first interval skipped) and its compile time."""
    from jaxnet.train import train

    with tempfile.TemporaryDirectory(prefix="jaxnet-bench-") as workdir:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            summary = train(_set_timing(cfg, interval), Path(workdir) / "run", dataset=dataset)
        # the runner stops cleanly at a signal (a time limit's SIGTERM): so does the bench, with the
        # shell's code for that signal (130 for SIGINT, 143 for SIGTERM)
        if summary.get("interrupted_by"):
            name = summary["interrupted_by"]
            print(
                f"jaxnet bench: stopped by {name} during the runner's measurement "
                f"(step {summary['step']} of {4 * interval}); nothing measured for {cfg.experiment}",
                file=sys.stderr,
            )
            raise SystemExit(128 + getattr(signal, name, signal.SIGTERM))
        rows = [r for r in observe.read_metrics(Path(workdir) / "run" / "metrics.jsonl") if r["split"] == "train"]
    rates = [r["steps_per_s"] for r in rows][1:]
    if len(rates) != 3:
        raise RuntimeError(f"expected 4 logged intervals from the runner, got {len(rows)}")
    seconds = sum(interval / rate for rate in rates)
    return 3 * interval / seconds, summary["compile_time_s"]


class Fixture:
    """Everything built once per case and shared by the measurements: the runner's ``Run``, its
    compiled step, host and device batches, the hand-written loop and the PyTorch peer."""

    def __init__(self, case: Case, cfg: config_lib.Config, dataset: Any, methods: tuple[str, ...]):
        from jaxnet.train.loop import Run

        self.case, self.cfg, self.dataset = case, cfg, dataset
        self.run = Run(cfg, dataset=dataset)
        self.state = self.run.init_state()
        self.host = list(itertools.islice(self.run.train_batches(0), 8))
        self.placed = [parallel.put_batch(b, self.run.mesh) for b in self.host]
        self.compiled = self.run.train_step.lower(self.state, self.placed[0]).compile()
        self.model_cfg = models.resolve(cfg.model)
        self.hand = None
        if "handwritten" in methods:
            from jaxnet.bench.handwritten import Loop

            self.hand = Loop(cfg, dataset, config_lib.batching(cfg) if self.run.text else "examples")
        self.torch = None
        if "torch" in methods and torch_version() and jax.process_count() == 1:
            from jaxnet.bench import torch_peers

            device = "cuda" if jax.default_backend() == "gpu" else "cpu"
            torch = __import__("torch")
            torch.set_num_threads(os.cpu_count() or 1)
            self.torch = torch_peers.Trainer(
                self.model_cfg,
                cfg.optim,
                cfg.train.steps,
                dataset.num_classes,
                cfg.data.seq_len,
                device=device,
                bf16=self.model_cfg.dtype == "bfloat16",
                label_smoothing=cfg.train.label_smoothing,
                seed=cfg.seed,
                **({} if self.run.text else {"image_shape": tuple(dataset.train[0].shape[1:])}),
            )
            self.torch_batches = [self.torch.put(b) for b in self.host]

    def step_time(self) -> float:
        """Seconds per step of the compiled step on resident batches (a quick first estimate)."""
        self._step_resident(0)
        jax.block_until_ready(self.state)
        start = time.perf_counter()
        for i in range(3):
            self._step_resident(i)
        jax.block_until_ready(self.state)
        return (time.perf_counter() - start) / 3

    def _step_resident(self, i: int) -> Any:
        self.state, metrics = self.compiled(self.state, self.placed[i % len(self.placed)])
        return metrics

    def resident(self, interval: int) -> float:
        """Steps/s of the runner's compiled step on batches already on the device."""
        return _timed_loop(self._step_resident, interval)

    def pipeline(self, interval: int) -> float:
        """Steps/s of the runner's compiled step fed by the runner's own input pipeline."""
        place = lambda b: parallel.put_batch(b, self.run.mesh)  # noqa: E731
        batches = pipeline.prefetch(self.run.train_batches(0), self.cfg.data.prefetch, place)
        try:

            def step(i: int) -> Any:
                self.state, metrics = self.compiled(self.state, next(batches))
                return metrics

            return _timed_loop(step, interval)
        finally:
            batches.close()

    def handwritten(self, interval: int) -> float:
        """Steps/s of the hand-written loop."""
        self.hand.run(interval, interval)
        return 3 * interval / self.hand.run(3 * interval, interval)

    def torch_peer(self, interval: int) -> float:
        """Steps/s of the PyTorch peer on batches already in (host or GPU) memory."""
        trainer, batches = self.torch, self.torch_batches

        def step(i: int) -> None:
            trainer.step(batches[i % len(batches)])
            if (i + 1) % interval == 0:
                trainer.loss()

        for i in range(interval):
            step(i)
        start = time.perf_counter()
        for i in range(interval, 4 * interval):
            step(i)
        trainer.loss()
        return 3 * interval / (time.perf_counter() - start)


def torch_version() -> str | None:
    """The installed torch's version, or None (torch is an optional benchmark peer)."""
    from jaxnet.bench import torch_peers

    return torch_peers.available()


# ---------------------------------------------------------------------------------------------
# One case, all methods, in alternation


def measure_case(case: Case, opts: Options) -> dict[str, Any]:
    """Every measurement of ``case`` (see the module docstring), as a results record."""
    cfg = case_config(case, opts.smoke)
    dataset = case_dataset(case, cfg)
    fixture = Fixture(case, cfg, dataset, opts.methods)
    methods = [m for m in opts.methods if m != "torch" or fixture.torch is not None]
    if opts.smoke:
        interval = 2
    else:
        interval = max(5, min(500, round(opts.seconds / 3 / fixture.step_time())))
    per_call = config_lib.steps_per_call(cfg)  # the experiment's, auto (0) resolved on its intervals
    cfg = config_lib.apply_overrides(cfg, [f"train.steps_per_call={per_call}"])
    interval = -(-interval // per_call) * per_call  # the runner logs at the end of a call
    measure = {
        "runner": lambda: measure_runner(cfg, dataset, interval),
        "handwritten": lambda: fixture.handwritten(interval),
        "pipeline": lambda: fixture.pipeline(interval),
        "resident": lambda: fixture.resident(interval),
        "torch": lambda: fixture.torch_peer(interval),
    }
    rates: dict[str, list[float]] = {m: [] for m in methods}
    compile_times: list[float] = []
    for r in range(opts.rounds):
        order = methods[r % len(methods) :] + methods[: r % len(methods)]  # a different one leads each round
        for method in order:
            result = measure[method]()
            if method == "runner":
                result, compile_s = result
                compile_times.append(compile_s)
            rates[method].append(result)
    return _record(case, cfg, dataset, fixture, interval, rates, compile_times)


def _record(
    case: Case,
    cfg: config_lib.Config,
    dataset: Any,
    fixture: Fixture,
    interval: int,
    rates: dict[str, list[float]],
    compile_times: list[float],
) -> dict[str, Any]:
    text = fixture.run.text
    batch = cfg.train.batch_size
    median = {m: statistics.median(v) for m, v in rates.items() if v}
    shape = (cfg.data.seq_len,) if text else tuple(dataset.train[0].shape[1:])
    step_flops = flops.train_step_flops(cfg.model, batch=batch, input_shape=shape, vocab=dataset.num_classes)
    kind = jax.devices()[0].device_kind
    jaxnet_rate = median.get("runner", median.get("pipeline"))
    record: dict[str, Any] = {
        "family": case.name,
        "experiment": case.experiment,
        "what": case.doc,
        "data": "random, real shape" if case.synthetic else cfg.data.name,
        "batch_size": batch,
        "seq_len": cfg.data.seq_len if text else None,
        "dtype": fixture.model_cfg.dtype,
        "param_dtype": cfg.model.param_dtype,
        "attention": getattr(fixture.model_cfg, "attention", None),
        "lstm_impl": getattr(fixture.model_cfg, "lstm_impl", None),
        "optimizer": cfg.optim.name,
        "param_count": int(sum(x.size for x in jax.tree.leaves(fixture.state.params))),
        "steps_per_measurement": 3 * interval,
        "log_interval": interval,
        "steps_per_s": {m: [round(x, 3) for x in v] for m, v in rates.items()},
        "median_steps_per_s": {m: round(x, 3) for m, x in median.items()},
        "compile_time_s": compile_times[0] if compile_times else None,
        "memory_bytes": parallel.memory(fixture.state, fixture.compiled),
        "flops_per_step": step_flops,
    }
    if jaxnet_rate:
        record["step_time_ms"] = round(1000 / jaxnet_rate, 3)
        record["examples_per_s"] = round(jaxnet_rate * batch, 1)
        if text:
            record["tokens_per_s"] = round(jaxnet_rate * batch * cfg.data.seq_len, 1)
        record["tflops"] = round(step_flops * jaxnet_rate / 1e12, 4)
        peak = flops.peak_flops(kind)
        record["peak_flops"] = peak
        record["mfu"] = None if peak is None else round(flops.mfu(step_flops, jaxnet_rate, kind, 1), 4)
    ratios = {}
    if "runner" in median and "handwritten" in median:
        ratios["runner/handwritten"] = round(median["runner"] / median["handwritten"], 3)
    if "pipeline" in median and "resident" in median:
        ratios["pipeline/resident"] = round(median["pipeline"] / median["resident"], 3)
    if jaxnet_rate and "torch" in median:
        ratios["jaxnet/torch"] = round(jaxnet_rate / median["torch"], 3)
    record["ratios"] = ratios
    rate = median.get("resident") or jaxnet_rate  # the compiled step XLA analysed, on resident batches
    peaks = roofline.device_peaks((fixture.model_cfg.dtype,))
    record["roofline"] = roofline.case_roofline(fixture.compiled, step_flops, rate, fixture.model_cfg.dtype, peaks)
    return record


def measure_roofline(case: Case, opts: Options) -> dict[str, Any]:
    """The roofline record of ``case`` alone: its compiled step timed on resident batches (median
    of ``opts.rounds`` measurements) and cost-analysed."""
    cfg = case_config(case, opts.smoke)
    dataset = case_dataset(case, cfg)
    fixture = Fixture(case, cfg, dataset, methods=())
    interval = 2 if opts.smoke else max(5, min(500, round(opts.seconds / 3 / fixture.step_time())))
    rates = [fixture.resident(interval) for _ in range(opts.rounds)]
    rate = statistics.median(rates)
    text = fixture.run.text
    batch = cfg.train.batch_size
    shape = (cfg.data.seq_len,) if text else tuple(dataset.train[0].shape[1:])
    step_flops = flops.train_step_flops(cfg.model, batch=batch, input_shape=shape, vocab=dataset.num_classes)
    dtype = fixture.model_cfg.dtype
    return {
        "family": case.name,
        "experiment": case.experiment,
        "what": case.doc,
        "data": "random, real shape" if case.synthetic else cfg.data.name,
        "batch_size": batch,
        "seq_len": cfg.data.seq_len if text else None,
        "dtype": dtype,
        "attention": getattr(fixture.model_cfg, "attention", None),
        "lstm_impl": getattr(fixture.model_cfg, "lstm_impl", None),
        "param_count": int(sum(x.size for x in jax.tree.leaves(fixture.state.params))),
        "steps_per_measurement": 3 * interval,
        "steps_per_s": {"resident": [round(x, 3) for x in rates]},
        "median_steps_per_s": {"resident": round(rate, 3)},
        "step_time_ms": round(1000 / rate, 3),
        "roofline": roofline.case_roofline(fixture.compiled, step_flops, rate, dtype, roofline.device_peaks((dtype,))),
    }


# ---------------------------------------------------------------------------------------------
# The whole run: cases, table, results file


def device_slug() -> str:
    """``cpu``, or the accelerator's kind in lower case with dashes (``nvidia-h100-80gb-hbm3``)."""
    device = jax.devices()[0]
    if device.platform == "cpu":
        return "cpu"
    return re.sub(r"[^a-z0-9]+", "-", device.device_kind.lower()).strip("-")


@contextlib.contextmanager
def _compile_once_per_program():
    """JAX's persistent compilation cache in a temporary folder while the bench runs, so that each
    round's runner (a fresh ``train`` that compiles its step again) loads the program the first
    round compiled. The figure reported is the first round's compile, cold; on a GPU, where the
    GPT-2-small shape's step compiles for tens of seconds, the rounds after it cost only their
    steps. A cache the user configured (``JAX_COMPILATION_CACHE_DIR``) is left as it is. JAX
    settles whether it caches at a process's first compile, so the cache is reset on the way in and
    out (``reset_cache``): after the bench, the process compiles as it did before it."""
    if jax.config.jax_compilation_cache_dir:
        yield
        return
    from jax.experimental.compilation_cache import compilation_cache

    keys = ("jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs")
    before = {k: getattr(jax.config, k) for k in keys}
    with tempfile.TemporaryDirectory(prefix="jaxnet-bench-cache-") as folder:
        compilation_cache.reset_cache()
        jax.config.update("jax_compilation_cache_dir", folder)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
        try:
            yield
        finally:
            for k, v in before.items():
                jax.config.update(k, v)
            compilation_cache.reset_cache()


def run(opts: Options) -> dict[str, Any]:
    """Measure ``opts.families``; returns the results record (see :func:`write`)."""
    with _compile_once_per_program():
        return _run(opts)


def _run(opts: Options) -> dict[str, Any]:
    gpu = jax.default_backend() == "gpu"
    unknown = [f for f in opts.families if f not in CASES]
    if unknown:
        raise UserError(f"unknown family {unknown[0]!r}; choose from {', '.join(CASES)}")
    unknown = [m for m in opts.methods if m not in METHODS]
    if unknown:
        raise UserError(f"unknown measurement {unknown[0]!r}; choose from {', '.join(METHODS)}")
    if opts.rounds < 1 or opts.seconds <= 0:
        raise UserError("--rounds must be at least 1 and --seconds positive")
    env = observe.environment()
    env["versions"]["torch"] = torch_version()
    env["cpu"] = observe.cpu_model()
    record: dict[str, Any] = {
        "kind": "roofline" if opts.roofline else "benchmark",
        "command": " ".join(["jaxnet", *sys.argv[1:]]) if sys.argv and "jaxnet" in sys.argv[0] else None,
        "smoke": opts.smoke,
        "rounds": opts.rounds,
        "environment": env,
        "targets": {k: v[0] for k, v in TARGETS.items()} | {"compile_time_s_cpu": 30.0, "mfu_gpt2_gpu": MFU_TARGET},
        "cases": {},
    }
    if record["command"] is None and sys.argv:  # a script, e.g. scripts/benchmark.py
        record["command"] = " ".join(["python", os.path.relpath(sys.argv[0]), *sys.argv[1:]])
    roofline.device_peaks(("float32",))  # on a CPU, measured now, before the families load it
    record["load_average"] = {"start": [round(x, 2) for x in os.getloadavg()]}  # others' work on a shared machine
    for name in opts.families:
        case = CASES[name]
        if case.gpu_only and not gpu and not opts.smoke:
            opts.say(f"{name}: skipped (GPU only: {case.doc})")
            continue
        opts.say(f"{name}: {case.doc} ...")
        started = time.perf_counter()
        record["cases"][name] = (measure_roofline if opts.roofline else measure_case)(case, opts)
        if not opts.smoke:  # a CPU's peaks between families too (a smoke run checks only that it all works)
            roofline.remeasure((record["cases"][name]["dtype"],))
        opts.say(f"{name}: done in {time.perf_counter() - started:.0f} s")
    dtypes = tuple(dict.fromkeys(c["dtype"] for c in record["cases"].values())) or ("float32",)
    record["load_average"]["end"] = [round(x, 2) for x in os.getloadavg()]
    record["device_peaks"] = peaks = roofline.device_peaks(dtypes)
    for case in record["cases"].values():
        case["roofline"] = roofline.replace_peaks(case, peaks)
    return record


def write(record: dict[str, Any], out: str | os.PathLike) -> Path:
    """Write ``record`` to ``OUT/<device>-<date>.json`` (``roofline-`` before it for ``--roofline``
    runs, ``-smoke`` after it for smoke runs) and its roofline plot to ``OUT/roofline-<device>-<date>.png``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    date = datetime.date.today().isoformat()
    stem = f"{device_slug()}-{date}{'-smoke' if record.get('smoke') else ''}"
    path = out / f"{'roofline-' if record.get('kind') == 'roofline' else ''}{stem}.json"
    observe.write_json(path, record)
    plot_roofline(record, out / f"roofline-{stem}.png")
    return path


def plot_roofline(record: dict[str, Any], path: str | os.PathLike) -> None:
    """Draw the roofline of every case of ``record`` that has one into ``path``."""
    cases = {name: c for name, c in record["cases"].items() if c.get("roofline")}
    if cases and record.get("device_peaks"):
        env = record["environment"]
        device = (
            f"{env['device']}" if env["platform"] != "cpu" else f"{env.get('cpu') or 'CPU'}, {env['cpu_count']} cores"
        )
        roofline.plot(cases, record["device_peaks"], path, f"roofline: {device} ({env['date'][:10]})")


def _num(x: float | None, digits: int = 1) -> str:
    if x is None:
        return "-"
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    return f"{x:.{digits}f}"


def _ratio(value: float | None, target: float) -> str:
    if value is None:
        return "-"
    return f"{value:.3f} {'ok' if value >= target else 'BELOW'}"


def table(record: dict[str, Any]) -> str:
    """The results as a plain-text table (medians over the rounds; ratios beside their targets)."""
    head = (
        "family",
        "dtype",
        "step ms",
        "examples/s",
        "tokens/s",
        "compile s",
        "TFLOP/s",
        "MFU",
        "runner/hand (>=0.97)",
        "pipe/resident (>=0.95)",
        "jaxnet/torch (>=1.0)",
    )
    rows = [head]
    for name, c in record["cases"].items():
        ratios = c["ratios"]
        rows.append(
            (
                name,
                c["dtype"],
                _num(c.get("step_time_ms"), 2),
                _num(c.get("examples_per_s")),
                _num(c.get("tokens_per_s")),
                _num(c.get("compile_time_s"), 2),
                _num(c.get("tflops"), 3),
                "-" if c.get("mfu") is None else f"{100 * c['mfu']:.1f}%",
                *(_ratio(ratios.get(k), TARGETS[k][0]) for k in TARGETS),
            )
        )
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(head))]
    lines = ["  ".join(str(v).ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    env = record["environment"]
    lines.append(
        f"device: {env['device']} x {env['device_count']} ({env['cpu']}, {env['cpu_count']} cores); "
        f"jax {env['versions']['jax']}, flax {env['versions']['flax']}, torch {env['versions'].get('torch') or '-'}; "
        f"medians of {record['rounds']} rounds"
    )
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# CPU against GPU


def compare_devices(opts: Options) -> dict[str, Any]:
    """Every measurement on the GPU (here), the runner's throughput per family on the CPU (a child
    process with ``JAX_PLATFORMS=cpu``), and the GPU's speed-up."""
    if jax.default_backend() != "gpu":
        raise UserError(
            f"--compare-devices needs a GPU, and JAX sees only {jax.default_backend()} devices here "
            "(on a machine with an NVIDIA GPU install jaxnet with its cuda extra: pip install 'jaxnet[cuda]')"
        )
    gpu = run(opts)
    families = [f for f in opts.families if not CASES[f].gpu_only]
    if not families:  # GPU-only families: nothing to compare with
        return {"cpu": None, "gpu": gpu, "speedup": {}}
    with tempfile.TemporaryDirectory(prefix="jaxnet-bench-cpu-") as out:
        command = [sys.executable, "-m", "jaxnet", "bench", *families, "--only", "runner", "--out", out]
        command += ["--rounds", str(opts.rounds), "--seconds", str(opts.seconds)] + (["--smoke"] if opts.smoke else [])
        opts.say("the same on the CPU, in a child process ...")
        subprocess.run(command, check=True, env={**os.environ, "JAX_PLATFORMS": "cpu"}, stdout=subprocess.DEVNULL)
        cpu = json.loads(next(Path(out).glob("cpu-*.json")).read_text())
    rows = {}
    for f in families:
        c, g = cpu["cases"][f], gpu["cases"][f]
        rows[f] = {
            "cpu_examples_per_s": c["examples_per_s"],
            "gpu_examples_per_s": g["examples_per_s"],
            "cpu_dtype": c["dtype"],
            "gpu_dtype": g["dtype"],
            "speedup": round(g["examples_per_s"] / c["examples_per_s"], 2),
        }
    return {"cpu": cpu, "gpu": gpu, "speedup": rows}


def compare_table(result: dict[str, Any]) -> str:
    """The CPU-versus-GPU table as plain text."""
    env_c, env_g = result["cpu"]["environment"], result["gpu"]["environment"]
    lines = [f"{'family':<12} {'CPU examples/s':>16} {'GPU examples/s':>16} {'GPU / CPU':>10}"]
    for f, r in result["speedup"].items():
        lines.append(
            f"{f:<12} {r['cpu_examples_per_s']:>16,.1f} {r['gpu_examples_per_s']:>16,.1f} {r['speedup']:>9.1f}x"
        )
    lines.append(f"CPU: {env_c['cpu']} ({env_c['cpu_count']} cores); GPU: {env_g['device']}")
    return "\n".join(lines)


def main(opts: Options, compare: bool = False) -> Path:
    """Run, print the table, write the results file; returns its path."""
    if compare and opts.roofline:
        raise UserError("--roofline measures one device; leave out --compare-devices (a full run has both)")
    if compare:
        result = compare_devices(opts)
        record = {**result["gpu"], "compare_devices": result["speedup"], "cpu_record": result["cpu"]}
        opts.say(table(result["gpu"]))
        if result["cpu"] is not None:
            opts.say(compare_table(result))
    else:
        record = run(opts)
        if not opts.roofline:
            opts.say(table(record))
    if record["cases"]:
        opts.say(roofline.table(record["cases"], record["device_peaks"]))
    path = write(record, opts.out)
    opts.say(f"results written to {path}")
    return path

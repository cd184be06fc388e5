"""Compile a run's train step for GPUs that are not here, and say whether it fits and how fast it
could go.

XLA compiles for an NVIDIA GPU without one ("deviceless" ahead-of-time compilation) from a
description of the device: :func:`plan` builds the real :class:`~jaxnet.train.loop.Run` of a
config for the GPUs of such a topology (the model's ``auto`` settings resolved for CUDA:
bfloat16, cuDNN's fused attention), lowers and compiles its train and eval steps, and reads the
compiled program: memory per device, FLOPs and bytes (XLA's cost analysis of the optimized HLO),
the kernels it runs and its collectives. The step time is a **prediction** (a roofline bound
from the target's peaks), never a measurement.

    >>> cfg = jaxnet.load_experiment("gpt2_small", ["mesh.fsdp=8"])       # doctest: +SKIP
    >>> report = jaxnet.plan(cfg, target="h100", gpus=8)                   # doctest: +SKIP
    >>> report["fits"], report["memory"]["total"]                           # doctest: +SKIP
    (True, 5960557472)

Targets are the files ``jaxnet/targets/<name>.txt`` (one per GPU kind, from the vendors' data
sheets); adding a GPU kind is adding a file. Needs the CUDA plugin wheels, best in a directory of their own
(:func:`plan_dir`, see docs/plan.md) so that no other JAX process loads them: the ``jaxnet plan`` command
puts that directory on the path itself; from Python, start with ``PYTHONPATH=<plan_dir> JAX_PLATFORMS=cpu``
(JAX binds the plugin when it is imported). There is no ``plan`` extra: installed beside jaxnet the plugin
makes every JAX process on a machine without a GPU log a CUDA error.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.machinery
import importlib.metadata
import importlib.resources
import json
import math
import re
import shlex
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import flax.linen as nn
import jax
import numpy as np

from jaxnet import _startup, models, parallel, tasks
from jaxnet import flops as flops_lib
from jaxnet.bench import roofline
from jaxnet.config import Config
from jaxnet.errors import UserError
from jaxnet.train.loop import Run


def plan_dir() -> Path:
    """Where the plan's wheels live (:func:`jaxnet._startup.plan_dir`, the rule tests/conftest.py
    uses before JAX is imported too)."""
    return Path(_startup.plan_dir())


INSTALL = f"pip install --no-deps --target {shlex.quote(str(plan_dir()))} -c constraints.txt -r requirements-plan.txt"
HEADROOM = 0.10  # a plan fits when it leaves this fraction of the device's memory free
JAX_DEFAULT_POOL = 0.75  # JAX preallocates this fraction of a GPU's memory unless told otherwise

CAVEATS = [
    "compiled without a GPU: gemm tiles are XLA's defaults, not autotuned on the device",
    "cuDNN workspaces are not sized without a GPU: memory for cuDNN calls is a lower bound",
    "predicted_step_s is the largest of three bounds (FLOPs / peak, bytes / bandwidth, kernels x the "
    "target's launch_overhead_s), not a measurement: communication and its overlap with compute are not "
    "modelled, and a step is slower than each bound when they do not overlap",
    "flops_per_step and bytes_per_step are per device; loops are counted as often as they run",
]


# ---------------------------------------------------------------------------------------------
# Targets


@dataclasses.dataclass(frozen=True)
class Target:
    """One GPU kind, read from ``jaxnet/targets/<name>.txt``."""

    name: str
    fields: dict[str, str]
    source: str

    def number(self, key: str) -> float:
        return float(self.fields[key])

    @property
    def device_kind(self) -> str:
        return self.fields["device_kind"]

    @property
    def memory_bytes(self) -> int:
        return int(self.number("memory_bytes"))

    @property
    def bandwidth(self) -> float:
        return self.number("memory_bandwidth")

    @property
    def launch_overhead(self) -> float | None:
        """Seconds one kernel launch costs at the least (``launch_overhead_s``; None if the file has none)."""
        own = self.fields.get("launch_overhead_s")
        return float(own) if own else None

    def peak_flops(self, dtype: str) -> float | None:
        """Dense peak FLOP/s for matrix products in ``dtype`` (float32 ones run on TF32 tensor cores)."""
        if dtype in ("bfloat16", "float16"):
            own = self.fields.get("peak_bf16_flops")
            return float(own) if own else flops_lib.peak_flops(self.device_kind)
        own = self.fields.get("peak_f32_flops")
        return float(own) if own else roofline._lookup(roofline.PEAK_F32_FLOPS, self.device_kind)

    def config_text(self) -> str:
        """XLA's ``GpuTargetConfigProto`` in text form: what the compiler knows of the device."""
        major, minor = self.fields["compute_capability"].split(".")
        f = self.fields
        return f"""gpu_device_info {{
  cuda_compute_capability {{ major: {major} minor: {minor} }}
  threads_per_block_limit: 1024
  threads_per_warp: 32
  shared_memory_per_block: {f["shared_memory_per_block"]}
  shared_memory_per_block_optin: {f["shared_memory_per_block_optin"]}
  shared_memory_per_core: {f["shared_memory_per_sm"]}
  threads_per_core_limit: {f["threads_per_sm"]}
  core_count: {f["sms"]}
  fpus_per_core: {f["fpus_per_sm"]}
  block_dim_limit_x: 2147483647
  block_dim_limit_y: 65535
  block_dim_limit_z: 65535
  memory_bandwidth: {int(self.bandwidth)}
  l2_cache_size: {f["l2_cache_bytes"]}
  clock_rate_ghz: {f["clock_ghz"]}
  device_memory_size: {self.memory_bytes}
  registers_per_core_limit: {f["registers_per_sm"]}
  registers_per_block_limit: {f["registers_per_block"]}
}}
platform_name: "CUDA"
dnn_version_info {{ major: {_cudnn_version()[0]} minor: {_cudnn_version()[1]} patch: 0 }}
device_description_str: "{self.device_kind}"
"""


def targets() -> list[str]:
    """The GPU kinds :func:`plan` knows (the files under ``jaxnet/targets``)."""
    folder = importlib.resources.files("jaxnet") / "targets"
    return sorted(p.name[: -len(".txt")] for p in folder.iterdir() if p.name.endswith(".txt"))


REQUIRED = (
    "device_kind",
    "compute_capability",
    "sms",
    "memory_bytes",
    "memory_bandwidth",
    "l2_cache_bytes",
    "clock_ghz",
    "shared_memory_per_block",
    "shared_memory_per_block_optin",
    "shared_memory_per_sm",
    "registers_per_sm",
    "registers_per_block",
    "threads_per_sm",
    "fpus_per_sm",
)


@functools.cache
def load_target(name: str) -> Target:
    """The target ``name`` (e.g. ``h100``, or the path of a target file of one's own); an unknown
    name is a :class:`UserError` listing the known ones."""
    if name.endswith(".txt") and Path(name).is_file():
        text = Path(name).read_text()
    else:
        known = targets()
        if name not in known:
            raise UserError(
                f"unknown --target {name!r}; known GPU kinds: {', '.join(known)} (files in jaxnet/targets/, or "
                "the path of a .txt file written like them)"
            )
        text = (importlib.resources.files("jaxnet") / "targets" / f"{name}.txt").read_text()
    fields, comments = {}, []
    for line in text.splitlines():
        if line.startswith("#"):
            comments.append(line[1:].strip())
        elif line.strip():
            key, _, value = line.partition(":")
            fields[key.strip()] = value.strip()
    missing = [k for k in REQUIRED if k not in fields]
    if missing:
        raise UserError(f"target {name} lacks {', '.join(missing)}; see jaxnet/targets/h100.txt")
    return Target(name, fields, " ".join(comments))


# ---------------------------------------------------------------------------------------------
# The GPU topology


def plugin_missing() -> str | None:
    """What of the plan's CUDA wheels is neither on the path nor in :func:`plan_dir` (None when all are)."""
    search = [*sys.path, str(plan_dir())]
    for package, wheel in (("jax_cuda12_plugin", "jax-cuda12-plugin"), ("nvidia", "nvidia-cudnn-cu12")):
        spec = importlib.machinery.PathFinder.find_spec(package, search)
        if spec is None or (
            package == "nvidia" and not any((Path(d) / "cudnn").is_dir() for d in spec.submodule_search_locations or ())
        ):
            return wheel
    return None


def jax_has_plugin() -> bool:
    """Whether JAX found the CUDA plugin when it was imported (it binds the plugin's modules then,
    cuDNN's version among them: a plugin put on the path later compiles no cuDNN attention)."""
    from jax._src import lib

    return lib.cuda_versions is not None


@functools.cache
def _cudnn_version() -> tuple[int, int]:
    try:
        major, minor = importlib.metadata.version("nvidia-cudnn-cu12").split(".")[:2]
        return int(major), int(minor)
    except importlib.metadata.PackageNotFoundError:
        return 9, 8


def _use_cpu_for_jax() -> None:
    """Keep JAX itself on the CPU: with the CUDA plugin installed and no GPU, starting the CUDA
    backend fails and takes the plugin's deviceless compiler with it."""
    from jax._src import xla_bridge

    if not xla_bridge.backends_are_initialized():
        jax.config.update("jax_platforms", "cpu")


@functools.cache
def topology(target: str, gpus: int) -> Any:
    """``gpus`` GPUs of kind ``target`` (8 to a host), as a JAX topology description."""
    missing = plugin_missing()
    if missing:
        raise UserError(f"jaxnet plan needs the CUDA plugin wheels ({missing} is missing); install them: {INSTALL}")
    if not jax_has_plugin():
        where = plan_dir()
        raise UserError(
            f"JAX was imported without the CUDA plugin wheels on its path; start Python with "
            f"PYTHONPATH={shlex.quote(str(where))} JAX_PLATFORMS=cpu (or use the jaxnet plan command)"
        )
    _use_cpu_for_jax()
    from jax.experimental import topologies

    per_host = min(gpus, 8)
    if gpus % per_host:
        raise UserError(f"--gpus {gpus}: more than 8 GPUs must be a multiple of 8 (8 GPUs to a host)")
    try:
        return topologies.get_topology_desc(
            platform="cuda",
            topology=f"1x{gpus // per_host}x{per_host}",
            target_config=load_target(target).config_text(),
        )
    except NotImplementedError:
        raise UserError(
            "JAX started on another backend before the plan; set JAX_PLATFORMS=cpu before JAX starts "
            "(JAX_PLATFORMS=cpu python ...)"
        ) from None


# ---------------------------------------------------------------------------------------------
# Reading the compiled program

_ARRAY = re.compile(r"\b(pred|[subf]\d+|bf16|f8e\w+|c64|c128)\[([\d,]*)\]")
_WIDTH = {"pred": 1, "bf16": 2, "c64": 8, "c128": 16}
COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")


def _array_bytes(dtype: str, dims: str) -> int:
    width = _WIDTH.get(dtype) or (1 if dtype.startswith("f8") else max(int(re.sub(r"\D", "", dtype)) // 8, 1))
    return width * math.prod(int(d) for d in dims.split(",") if d)


def _instructions(text: str) -> list[tuple[str, str, str, str]]:
    """``(name, result type, opcode, rest of line)`` of every instruction of an HLO module's text."""
    out = []
    for line in text.splitlines():
        m = re.match(r"\s*(?:ROOT )?(%\S+) = (.+?) ([a-z][a-z0-9\-]*)\((.*)$", line)
        if m:
            out.append(m.groups())
    return out


def _arguments(rest: str) -> str:
    """The operand list at the start of ``rest`` (up to its closing parenthesis)."""
    depth = 0
    for i, ch in enumerate(rest):
        depth += ch in "({["
        depth -= ch in ")}]"
        if depth < 0:
            return rest[:i]
    return rest


def _operand_types(rest: str, types: dict[str, str]) -> list[tuple[str, str]]:
    """Dtype and dimensions of each operand, looked up by name (the compiled text omits them)."""
    out = []
    for name in re.findall(r"%[\w.\-]+", _arguments(rest)):
        found = _ARRAY.findall(types.get(name, ""))
        if len(found) == 1:
            out.append(found[0])
    return out


def attention_flops(text: str) -> tuple[float, dict[str, int]]:
    """FLOPs of cuDNN's fused attention calls (XLA's cost analysis counts none), from the shapes of
    their operands: forward ``4 B H Tq Tk D`` (the score and value products; a causal mask halves
    the pairs to ``Tq (Tq + 1) / 2``) and backward twice that, as :mod:`jaxnet.flops` counts it."""
    total, calls = 0.0, Counter()
    for _, _, op, rest in _instructions(text):
        if op != "custom-call" or "__cudnn$fmha" not in rest:
            continue
        backward = "Backward" in rest
        calls["backward" if backward else "forward"] += 1
        layouts = re.search(r"operand_layout_constraints=\{(.*?)\}, api_version", rest)
        found = _ARRAY.findall(layouts.group(1) if layouts else "")
        shapes = [[int(x) for x in dims.split(",") if x] for _, dims in found]
        if len(shapes) < 2 or len(shapes[0]) != 4:
            continue
        batch, tq, heads, dim = shapes[0]  # cuDNN's layout: batch, sequence, heads, head size
        tk = shapes[1][1]
        pairs = tq * (tq + 1) / 2 if re.search(r'"mask_type": ?"CAUSAL', rest) and tq == tk else tq * tk
        forward = 4 * batch * heads * pairs * dim
        total += 2 * forward if backward else forward
    return total, dict(calls)


def kernels(text: str) -> dict[str, Any]:
    """What a compiled GPU program runs: cuDNN attention calls, gemm fusions by emitter, the dtypes
    of the matrix products and the collectives with their bytes."""
    insts = _instructions(text)
    types = {name: result for name, result, _, _ in insts}
    fmha, gemms, dtypes, calls = Counter(), Counter(), Counter(), Counter()
    collectives: dict[str, dict[str, int]] = {}
    for _, result, op, rest in insts:
        if op == "custom-call":
            target = re.search(r'custom_call_target="([^"]+)"', rest)
            name = target.group(1) if target else ""
            calls[name] += 1
            if name.startswith("__cudnn$fmha"):
                fmha["backward" if "Backward" in name else "forward"] += 1
            elif name.startswith("__cudnn$conv"):
                dtypes.update(f"{d} (cuDNN convolution)" for d, _ in _operand_types(rest, types)[:1])
            elif name.startswith("__cublas"):
                gemms["cublas"] += 1
                dtypes.update(d for d, _ in _operand_types(rest, types)[:1])
        elif op == "fusion":
            kind = re.search(r'"kind":"([^"]+)"', rest)
            if kind and "gemm" in kind.group(1):
                gemms["triton" if "triton" in kind.group(1) else kind.group(1)] += 1
            elif kind and "cudnn" in kind.group(1):
                gemms["cudnn"] += 1
        elif op in ("dot", "convolution"):
            dtypes.update(f"{d} ({op})" if op == "convolution" else d for d, _ in _operand_types(rest, types)[:1])
        base = op.removesuffix("-start")
        if base in COLLECTIVES and not op.endswith("-done"):
            sizes = [_array_bytes(d, s) for d, s in _ARRAY.findall(result)]
            operand = sum(_array_bytes(d, s) for d, s in _operand_types(rest, types))
            entry = collectives.setdefault(base, {"count": 0, "bytes": 0})
            entry["count"] += 1
            entry["bytes"] += max([operand, *sizes])
    return {
        "cudnn_attention": {"forward": fmha["forward"], "backward": fmha["backward"]},
        "gemm_fusions": dict(gemms),
        "matmul_dtypes": dict(sorted(dtypes.items())),
        "custom_calls": dict(sorted(calls.items())),
        "collectives": collectives,
        "collective_bytes_note": "per device and step: the larger of each collective's input and output "
        "(the whole tensor it gathers, reduces or scatters)",
        "while_loops": sum(1 for _, _, op, _ in insts if op == "while"),
    }


# ---------------------------------------------------------------------------------------------
# Kernel launches per step

# Instructions that launch nothing on the GPU: values, views and tuples, and the second half of an
# asynchronous pair (``*-done`` waits for the work its ``*-start`` launched).
NO_LAUNCH = frozenset(
    {"parameter", "constant", "get-tuple-element", "tuple", "bitcast", "after-all", "add-dependency", "opt-barrier",
     "domain"}
)
_CALLED = re.compile(r"\b(?:calls|to_apply)=(%[\w.\-]+)")
_BRANCHES = re.compile(
    r"(?:branch_computations=\{([^}]*)\}|true_computation=(%[\w.\-]+), false_computation=(%[\w.\-]+))"
)
_LOOP = re.compile(r"condition=(%[\w.\-]+), body=(%[\w.\-]+)")


def _launch_kind(op: str, rest: str) -> str | None:
    """What one instruction of a compiled GPU program launches per execution (None: nothing)."""
    if op in NO_LAUNCH or op.endswith("-done"):
        return None
    if op == "fusion":
        kind = re.search(r'"kind":"([^"]+)"', rest)
        kind = kind.group(1) if kind else ""
        return "gemm fusions" if "gemm" in kind else "cuDNN fusions" if "cudnn" in kind else "fusions"
    if op == "custom-call":
        target = re.search(r'custom_call_target="([^"]+)"', rest)
        name = target.group(1) if target else ""
        if name.startswith("__cudnn$fmha"):
            return "cuDNN attention"
        if name.startswith("__cudnn$conv"):
            return "cuDNN convolutions"
        if name.startswith("__cublas"):
            return "cuBLAS"
        return "other custom calls"
    if op.removesuffix("-start") in COLLECTIVES:
        return "collectives"
    if op in ("copy", "copy-start"):
        return "copies"
    return "other"


def launches(text: str) -> dict[str, Any]:
    """The kernels a compiled GPU program launches per step, read from its optimized HLO text.

    Every fusion is one kernel, every custom call (cuBLAS, cuDNN attention and convolution) one,
    every collective one (its ``-start``; ``-done`` only waits), every copy one; values, views and
    tuples none. A ``while`` loop with a known trip count ``n`` runs its body ``n`` times and never
    its condition (XLA's GPU runtime skips it); one with an unknown trip count is counted as one
    pass of its condition and body, so the count is then a lower bound (``unknown_trip_loops``).
    A ``conditional`` counts its cheapest branch, a ``call`` (an async wrapper, a command buffer)
    what it calls. Fusions that XLA's runtime splits into more than one kernel count once: the
    total is a floor.

    >>> launches(compiled.as_text())["total"]  # doctest: +SKIP
    109
    """
    comps, entry = roofline._computations(text)
    unknown: list[str] = []

    @functools.cache
    def count(name: str) -> tuple[tuple[str, int], ...]:
        total: Counter = Counter()
        for line_name, _, op, rest in _instructions("\n".join(comps.get(name, ()))):
            if op == "while":
                loop = _LOOP.search(rest)
                trip = roofline._TRIP.search(rest)
                if loop is None:
                    continue
                condition, body = loop.groups()
                if trip:
                    total.update({k: int(trip.group(1)) * n for k, n in count(body)})
                else:
                    unknown.append(line_name)
                    total.update(dict(count(body)))
                    total.update(dict(count(condition)))
                continue
            if op == "conditional":
                found = _BRANCHES.search(rest)
                if found:
                    names = re.findall(r"%[\w.\-]+", found.group(1)) if found.group(1) else list(found.groups()[1:])
                    cheapest = min((dict(count(b)) for b in names), key=lambda c: sum(c.values()), default={})
                    total.update(cheapest)
                total["other"] += 1  # the predicate's copy to the host
                continue
            if op in ("call", "async-start"):
                called = _CALLED.search(rest)
                if called:
                    total.update(dict(count(called.group(1))))
                continue
            kind = _launch_kind(op, rest)
            if kind:
                total[kind] += 1
        return tuple(sorted(total.items()))

    by_kind = dict(count(entry))
    return {
        "total": sum(by_kind.values()),
        "by_kind": by_kind,
        "unknown_trip_loops": len(set(unknown)),
        "note": "kernels launched per train step by the compiled program: each fusion, custom call, collective "
        "and copy once, loop bodies times their known trip count"
        + (
            "; loops of unknown trip count counted once (a lower bound)"
            if unknown
            else ""
        ),
    }


def hlo_cost(text: str) -> dict[str, float]:
    """XLA's cost analysis (FLOPs, bytes accessed) of a compiled module's text, every loop counted
    as often as it runs; JAX's ``cost_analysis()`` has none for a deviceless compile."""
    client = jax.devices("cpu")[0].client  # the analysis reads the HLO; any client parses it
    _, entry = roofline._computations(text)
    cost = roofline._module_cost(text, entry, client)
    if " while(" in text and roofline.xla_counts_loop_bodies_once():
        extra, _ = roofline.loop_extra(text, client)
        cost = {k: cost[k] + extra[k] for k in cost}
    return cost


# ---------------------------------------------------------------------------------------------
# The input rate, the goal and calibration


def step_bound(compute_s: float | None, memory_s: float, launch_s: float | None) -> tuple[str, float]:
    """The predicted step: the largest of the compute, memory and launch bounds (a bound that is
    None, no peak or no launch cost known, counts as 0), and which one it is.

    >>> step_bound(6.6e-3, 10.3e-3, 4.4e-3)
    ('memory', 0.0103)
    """
    bounds = {"compute": compute_s or 0.0, "memory": memory_s, "launch": launch_s or 0.0}
    bound = max(bounds, key=bounds.get)
    return bound, bounds[bound]


def hosts_for(gpus: int) -> int:
    """Hosts of a planned run: 8 GPUs to a host (one JAX process each), as :func:`topology` lays them."""
    return max(gpus // 8, 1)


def input_rate(run: Run, batch: dict[str, np.ndarray], rows: int, gpus: int, step_s: float) -> dict[str, Any]:
    """What each host's input pipeline must deliver for the step to take ``step_s``: examples,
    tokens and bytes per second per host (one process per host of 8 GPUs). Tokens come from the
    batch's shape: a text run's ``rows x seq_len``, else the model input's length when it is a
    2-D array of integer ids (a data source given from Python), else none (images are not tokens).
    Bytes are those of the batch's arrays as the loader hands them over (their own dtypes)."""
    hosts = hosts_for(gpus)
    if run.text:
        per_example = run.cfg.data.seq_len
    else:
        try:
            inputs = np.asarray(run.task.model_inputs(batch)[0])
        except (KeyError, IndexError, TypeError, AttributeError, ValueError):
            inputs = None
        integer = inputs is not None and np.issubdtype(inputs.dtype, np.integer)
        per_example = int(inputs.shape[1]) if integer and inputs.ndim == 2 else None
    sample_rows = max(len(next(iter(v for v in batch.values() if np.ndim(v)), [0])), 1)
    batch_bytes = sum(np.asarray(v).nbytes for v in batch.values() if np.ndim(v)) * rows / sample_rows
    per_s = 1 / step_s if step_s else None
    return {
        "hosts": hosts,
        "tokens_per_example": per_example,
        "tokens_per_step": rows * per_example if per_example else None,
        "examples_per_s_per_host": rows / hosts * per_s if per_s else None,
        "tokens_per_s_per_host": rows * per_example / hosts * per_s if per_s and per_example else None,
        "bytes_per_s_per_host": batch_bytes / hosts * per_s if per_s else None,
        "note": "what each host's loader must deliver to keep up with the predicted step (8 GPUs and one "
        "process to a host; the global batch split evenly); tokens from the batch's shape",
    }


def _number(value: Any, flag: str, *, zero: bool) -> float:
    """``value`` as a finite float, positive (or at least 0 with ``zero``), else a :class:`UserError`."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = math.nan
    if not math.isfinite(number) or number < 0 or (number == 0 and not zero):
        need = "a number of at least 0" if zero else "a number above 0"
        raise UserError(f"{flag} {value}: give {need} (e.g. {flag} {'3' if zero else '10e9'})")
    return number


def check_goal(tokens: float | None, epochs: float | None, price: float | None) -> None:
    """Refuse a goal that cannot be planned: ``tokens`` and ``epochs`` together, either not above
    0, a negative ``price`` (dollars per GPU-hour); each a one-line :class:`UserError`."""
    if tokens is not None and epochs is not None:
        raise UserError("give --tokens or --epochs, not both: the goal is one of them (or train.steps)")
    if tokens is not None:
        _number(tokens, "--tokens", zero=False)
    if epochs is not None:
        _number(epochs, "--epochs", zero=False)
    if price is not None:
        _number(price, "--price", zero=True)


def _train_size(run: Run) -> int | None:
    """The training split's size: tokens for a text dataset, else examples (None if unknown)."""
    size = getattr(run.dataset, "size", None)
    try:
        return int(size("train")) if size else None
    except (TypeError, ValueError, AttributeError, KeyError):
        return None


def goal(
    report: dict[str, Any],
    *,
    tokens: float | None = None,
    epochs: float | None = None,
    price: float | None = None,
) -> dict[str, Any]:
    """The predicted wall time, GPU-hours and (with ``price``, US dollars per GPU-hour) cost of
    ``tokens`` tokens, ``epochs`` passes over the training split (``report["train_data"]``), or
    else the config's ``train.steps`` steps, at the report's step (the calibrated one when there is
    one). Training steps only: evaluation, checkpoints and start-up are not counted.

    >>> goal(report, tokens=10e9, price=3)["cost_usd"]  # doctest: +SKIP
    """
    check_goal(tokens, epochs, price)
    rows = report["batch_size"]
    per_step = report["input_rate"]["tokens_per_step"]
    data = report["train_data"]
    size, text = data["size"], data["unit"] == "tokens"
    if tokens is not None:
        if not per_step:
            raise UserError("--tokens needs a model that reads token sequences; give --epochs or train.steps=N")
        steps, what = math.ceil(float(tokens) / per_step), f"{float(tokens):,.0f} tokens"
    elif epochs is not None:
        if not size:
            raise UserError("--epochs needs a dataset whose training split has a known size; give train.steps=N")
        per_epoch = size / per_step if text and per_step else size / rows
        steps, what = math.ceil(float(epochs) * per_epoch), f"{float(epochs):g} epochs of {size:,} {data['unit']}"
    else:
        steps, what = data["steps"], f"train.steps={data['steps']}"
    calibrated = report.get("calibration")
    step_s = calibrated["calibrated_step_s"] if calibrated else report["prediction"]["predicted_step_s"]
    seconds = steps * step_s
    gpu_hours = seconds / 3600 * report["gpus"]
    return {
        "goal": what,
        "steps": steps,
        "tokens": steps * per_step if per_step else None,
        "examples": steps * rows,
        "epochs": steps * (per_step if text else rows) / size if size and (per_step or not text) else None,
        "step_s": step_s,
        "wall_s": seconds,
        "wall_days": seconds / 86400,
        "gpu_hours": gpu_hours,
        "price_usd_per_gpu_hour": float(price) if price is not None else None,
        "cost_usd": gpu_hours * float(price) if price is not None else None,
        "label": ("CALIBRATED prediction" if calibrated else "PREDICTED (a lower bound on time and cost)")
        + ", not measured: training steps only (no evaluation, checkpoints or start-up)",
    }


CALIBRATION_KIND = "plan-vs-measured"


def load_calibration(path: str | Path, tgt: Target) -> dict[str, Any]:
    """A measured-efficiency file: ``plan-vs-measured-<device>-<date>.json`` as ``scripts/gpu_check.sh
    --only plan`` writes it on a GPU (each config's measured step over the plan's predicted one).
    Refused with a one-line :class:`UserError`: a file that is missing, not such a record, a dry run
    (measured on a CPU), measured on another GPU kind than ``tgt``, or without a measured ratio."""
    path = Path(path)
    try:
        record = json.loads(path.read_text())
    except OSError as e:
        raise UserError(f"--calibrate {path}: cannot read it ({e.strerror})") from None
    except ValueError:
        raise UserError(f"--calibrate {path}: not JSON; give a plan-vs-measured file from gpu_check.sh") from None
    if not isinstance(record, dict) or record.get("kind") != CALIBRATION_KIND:
        raise UserError(
            f"--calibrate {path}: not a {CALIBRATION_KIND} file; bash scripts/gpu_check.sh --only plan writes "
            "one on a GPU"
        )
    if record.get("mode") != "gpu":
        raise UserError(
            f"--calibrate {path}: a dry run's file (measured on a CPU); calibrate with one measured on a GPU"
        )
    if record.get("device_kind") != tgt.device_kind:
        raise UserError(
            f"--calibrate {path}: measured on {record.get('device_kind')}, not on the target's {tgt.device_kind}; "
            f"give a file measured on a {tgt.name} (or --target for that GPU)"
        )
    ratios = {
        name: entry
        for name, entry in (record.get("configs") or {}).items()
        if isinstance(entry, dict) and (entry.get("ratio_measured_to_predicted") or {}).get("median_step_s")
    }
    if not ratios:
        raise UserError(f"--calibrate {path}: no config in it has a measured/predicted step ratio")
    return {"file": str(path), "date": record.get("date"), "device_kind": record["device_kind"], "configs": ratios}


def apply_calibration(calibration: dict[str, Any], report: dict[str, Any]) -> dict[str, Any]:
    """The report's step scaled by a measured ratio of ``calibration`` (:func:`load_calibration`):
    the same experiment at the same batch size gives its measured step itself; else the ratio of
    a config whose prediction had the same bound; else the median of the file's ratios."""
    prediction = report["prediction"]
    configs = calibration["configs"]
    name = report.get("experiment") or ""
    same = next(
        (
            (n, e)
            for n, e in configs.items()
            if n in (name, name.split(":")[0]) and (e.get("measured") or {}).get("batch_size") == report["batch_size"]
        ),
        None,
    )
    if same and same[1]["measured"].get("median_step_s"):
        used, basis = [same], f"{same[0]} measured at this batch size: its measured step"
        ratio = same[1]["measured"]["median_step_s"] / prediction["predicted_step_s"]
    else:
        used = [(n, e) for n, e in configs.items() if (e.get("predicted") or {}).get("bound") == prediction["bound"]]
        basis = f"configs whose prediction was {prediction['bound']}-bound too"
        if not used:
            used, basis = list(configs.items()), "every config in the file (none had this plan's bound)"
        ratio = float(np.median([e["ratio_measured_to_predicted"]["median_step_s"] for _, e in used]))
        basis = f"measured/predicted step of {', '.join(n for n, _ in used)} ({basis})"
    step = prediction["predicted_step_s"] * ratio
    return {
        "file": calibration["file"],
        "measured_on": calibration["device_kind"],
        "date": calibration["date"],
        "ratio": ratio,
        "efficiency": 1 / ratio if ratio else None,
        "basis": basis,
        "calibrated_step_s": step,
        "examples_per_s": report["batch_size"] / step if step else None,
        "tokens_per_s": prediction["tokens_per_s"] / ratio if prediction["tokens_per_s"] and ratio else None,
        "label": "CALIBRATED: the predicted step times a measured/predicted ratio from one GPU run",
    }


# ---------------------------------------------------------------------------------------------
# The plan


def gpus_for(cfg: Config, gpus: int | None) -> int:
    """The number of GPUs: ``gpus`` if given (checked against the mesh), else the mesh's fixed size."""
    sizes = {a: getattr(cfg.mesh, a) for a in parallel.AXES}
    fixed = math.prod(n for n in sizes.values() if n > 0)
    if gpus is None:
        return fixed
    if not isinstance(gpus, int) or isinstance(gpus, bool) or gpus < 1:
        raise UserError(f"--gpus {gpus}: give a number of GPUs of at least 1")
    shape = parallel.mesh_shape(cfg.mesh, gpus)
    if math.prod(shape.values()) != gpus:
        laid = " x ".join(f"{a}={n}" for a, n in shape.items())
        raise UserError(
            f"the mesh {laid} uses {math.prod(shape.values())} GPUs but --gpus is {gpus}; make the mesh axes "
            f"multiply to {gpus} (or set one to -1)"
        )
    return gpus


def _for_gpu(cfg: Config, own_model: bool) -> tuple[Config, list[str]]:
    """``cfg`` with the settings a GPU would use that cannot be compiled without one replaced, and why."""
    notes = []
    if own_model or not hasattr(cfg.model, "lstm_impl"):
        return cfg, notes
    if models.resolve(cfg.model, "cuda").lstm_impl == "cudnn":
        notes.append(
            "the LSTM would run cuDNN's fused LSTM on the GPU (model.lstm_impl=auto), which cannot be traced "
            "without a GPU (cuDNN is not initialised); this plan compiles its lax.scan path instead "
            "(model.lstm_impl=scan), so its memory and time are the scan's"
        )
        cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, lstm_impl="scan"))
    return cfg, notes


def _abstract_batch(batch: dict[str, np.ndarray], rows: int, mesh: Any) -> dict[str, jax.ShapeDtypeStruct]:
    split, whole = parallel.batch_sharding(mesh), parallel.replicated(mesh)
    return {
        k: jax.ShapeDtypeStruct((rows, *v.shape[1:]), v.dtype, sharding=split)
        if np.ndim(v)
        else jax.ShapeDtypeStruct((), np.asarray(v).dtype, sharding=whole)
        for k, v in batch.items()
    }


def _compile_train(run: Run, batch: dict, rows: int) -> tuple[Any, Any, dict, float]:
    state = run.abstract_state()
    abstract = _abstract_batch(batch, rows, run.mesh)
    start = time.perf_counter()
    compiled = run.train_step.lower(state, abstract).compile()
    return compiled, state, abstract, time.perf_counter() - start


def _memory(compiled: Any, state: Any, batch: dict, device: int) -> dict[str, Any]:
    stats = compiled.memory_analysis()
    total = (
        stats.argument_size_in_bytes + stats.output_size_in_bytes - stats.alias_size_in_bytes + stats.temp_size_in_bytes
    )
    return {
        "arguments": int(stats.argument_size_in_bytes),
        "params": parallel.bytes_per_device(state.params),
        "opt_state": parallel.bytes_per_device(state.opt_state),
        "batch": parallel.bytes_per_device(batch),
        "outputs": int(stats.output_size_in_bytes),
        "aliased": int(stats.alias_size_in_bytes),
        "temp": int(stats.temp_size_in_bytes),
        "total": int(total),
        "device": device,
        "headroom": int(device - total),
        "headroom_fraction": round((device - total) / device, 4),
        "usable": int(device * (1 - HEADROOM)),
        "jax_default_pool": int(device * JAX_DEFAULT_POOL),
        "note": "bytes per device from XLA's buffer assignment (total = arguments + outputs - aliased (donated) + "
        "temp); cuDNN workspaces are not counted (a lower bound). JAX preallocates 75 % of a GPU by default: "
        "a plan above jax_default_pool needs XLA_PYTHON_CLIENT_MEM_FRACTION raised (e.g. 0.95)",
    }


def _fits(memory: dict[str, Any]) -> bool:
    return memory["total"] <= memory["usable"]


def _model_flops(run: Run, rows: int) -> float | None:
    """jaxnet's own analytic count of the step (built-in families only)."""
    cfg = run.cfg
    try:
        shape = tuple(run.task.model_inputs(run.sample)[0].shape[1:])
        if run.text:
            shape = (cfg.data.seq_len,)
        vocab = run.dataset.num_classes + run.task.extra_inputs
        return flops_lib.train_step_flops(cfg.model, batch=rows, input_shape=shape, vocab=vocab)
    except (ValueError, AttributeError, TypeError, IndexError):
        return None


def _versions() -> dict[str, str]:
    out = {}
    for name in ("jax", "jaxlib", "flax", "optax", "jax-cuda12-plugin", "jax-cuda12-pjrt", "nvidia-cudnn-cu12"):
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def plan(
    cfg: Config,
    target: str = "h100",
    gpus: int | None = None,
    *,
    model: nn.Module | None = None,
    dataset: Any = None,
    task: tasks.Task | None = None,
    max_batch: bool = False,
    tokens: float | None = None,
    epochs: float | None = None,
    price: float | None = None,
    calibrate: str | Path | None = None,
    say: Any = None,
) -> dict[str, Any]:
    """Compile ``cfg``'s train and eval steps for ``gpus`` GPUs of kind ``target`` on this machine
    (no GPU needed) and report memory, FLOPs, kernels and a predicted step time: the largest of a
    compute, a memory and a kernel-launch bound. ``model``, ``dataset`` and ``task`` are those
    :func:`jaxnet.train` takes. With ``max_batch``, also the largest ``train.batch_size`` that fits
    with 10 % headroom.

    The goal (``report["goal"]``) is ``tokens`` tokens or ``epochs`` passes over the training data,
    else the config's ``train.steps``: its predicted wall time and GPU-hours, and with ``price``
    (US dollars per GPU-hour) its cost. ``calibrate`` is a plan-vs-measured file written by
    ``scripts/gpu_check.sh --only plan`` on a GPU of this kind: its measured/predicted ratio
    scales the step (``report["calibration"]``), and the goal uses the calibrated step.

    >>> plan(load_experiment("gpt2_small"), target="h100")["fits"]  # doctest: +SKIP
    True
    >>> eight = plan(load_experiment("gpt2_small", ["mesh.fsdp=8"]), "h100", 8, tokens=10e9, price=3)  # doctest: +SKIP
    >>> eight["goal"]["wall_days"], eight["goal"]["cost_usd"]  # doctest: +SKIP
    """
    say = say or (lambda line: None)
    tgt = load_target(target)
    check_goal(tokens, epochs, price)
    calibration = load_calibration(calibrate, tgt) if calibrate is not None else None
    gpus = gpus_for(cfg, gpus)
    topo = topology(target, gpus)
    planned, notes = _for_gpu(cfg, model is not None)
    run = Run(planned, model=model, dataset=dataset, task=task, devices=list(topo.devices), backend="cuda")
    first = next(iter(run.train_batches(0)))
    rows = cfg.train.batch_size
    say(f"compiling the train step for {gpus} x {tgt.device_kind} (batch {rows}) ...")
    compiled, state, batch, compile_s = _compile_train(run, first, rows)
    text = compiled.as_text()
    memory = _memory(compiled, state, batch, tgt.memory_bytes)

    start = time.perf_counter()
    carry = {"carry": state.model_state["carry"]} if "carry" in state.model_state else {}
    eval_compiled = run.eval_step.lower(state, batch, carry).compile()
    eval_s = time.perf_counter() - start
    eval_memory = _memory(eval_compiled, state, batch, tgt.memory_bytes)

    cost = hlo_cost(text)
    attention, _ = attention_flops(text)
    flops_device = cost["flops"] + attention
    analytic = _model_flops(run, rows)
    # XLA counts nothing inside cuDNN's convolution calls either: where jaxnet's own count of the
    # matrix products and convolutions is larger, it is the better figure (as jaxnet bench does).
    source = "xla + cuDNN attention by formula"
    if analytic and analytic / gpus > flops_device:
        flops_device, source = analytic / gpus, "jaxnet.flops / gpus (above XLA's count: work inside cuDNN calls)"
    # A Linen module's own compute dtype (run.model is the model seam's adapter around it).
    dtype = getattr(getattr(run.model, "module", None), "dtype", None) or getattr(planned.model, "dtype", "float32")
    dtype = np.dtype(dtype).name if not isinstance(dtype, str) else dtype
    dtype = models.resolve(planned.model, "cuda").dtype if dtype == "auto" else dtype
    peak = tgt.peak_flops(dtype)
    compute_s = flops_device / peak if peak else None
    memory_s = cost["bytes"] / tgt.bandwidth
    launched = launches(text)
    launch_s = launched["total"] * tgt.launch_overhead if tgt.launch_overhead else None
    bound, step_s = step_bound(compute_s, memory_s, launch_s)
    rate = input_rate(run, first, rows, gpus, step_s)
    per_step_tokens = rate["tokens_per_step"]
    report: dict[str, Any] = {
        "experiment": cfg.experiment,
        "target": target,
        "device_kind": tgt.device_kind,
        "gpus": gpus,
        "mesh": dict(run.mesh.shape),
        "batch_size": rows,
        "seq_len": planned.data.seq_len if run.text else None,
        "model": run.model.name,
        "compute_dtype": dtype,
        "fits": _fits(memory),
        "memory": memory,
        "eval_memory": {k: eval_memory[k] for k in ("arguments", "outputs", "temp", "total")},
        "flops_per_step": {
            "per_device": flops_device,
            "all_devices": flops_device * gpus,
            "xla_cost_analysis": cost["flops"],
            "cudnn_attention_by_formula": attention,
            "jaxnet_flops_py": analytic,
            "source": source,
            "ratio_xla_to_flops_py": round((cost["flops"] + attention) * gpus / analytic, 4) if analytic else None,
            "note": "XLA's HLO cost analysis of the compiled per-device program, plus cuDNN's fused attention "
            "counted from its operand shapes (XLA counts none inside it); jaxnet_flops_py counts matrix "
            "products only, for all devices",
        },
        "bytes_per_step": {"per_device": cost["bytes"], "note": "XLA's bytes accessed by every fused kernel"},
        "prediction": {
            "predicted_step_s": step_s,
            "bound": bound,
            "compute_s": compute_s,
            "memory_s": memory_s,
            "launch_s": launch_s,
            "kernels_per_step": launched["total"],
            "launch_overhead_s": tgt.launch_overhead,
            "peak_flops": peak,
            "peak_dtype": dtype,
            "memory_bandwidth": tgt.bandwidth,
            "examples_per_s": rows / step_s if step_s else None,
            "tokens_per_s": per_step_tokens / step_s if per_step_tokens and step_s else None,
            "mfu_bound": analytic / step_s / (peak * gpus) if analytic and peak and step_s else None,
            "label": "PREDICTED (the largest of the compute, memory and launch bounds from the target's data "
            "sheet and launch cost), not measured",
        },
        "input_rate": rate,
        "train_data": {
            "size": _train_size(run),
            "unit": "tokens" if run.text else "examples",
            "steps": cfg.train.steps,
            "note": "the training split's size (for --epochs) and the config's train.steps (the default goal)",
        },
        "kernels": {**kernels(text), "launches": launched},
        "compile_s": round(compile_s, 2),
        "eval_compile_s": round(eval_s, 2),
        "versions": _versions(),
        "target_source": tgt.source,
        "caveats": notes + CAVEATS,
    }
    report["processes"] = process_layout(gpus, report["mesh"])
    if calibration is not None:
        report["calibration"] = apply_calibration(calibration, report)
        again = input_rate(run, first, rows, gpus, report["calibration"]["calibrated_step_s"])
        rate["calibrated"] = {k: v for k, v in again.items() if k.endswith("_per_s_per_host")}
    report["goal"] = goal(report, tokens=tokens, epochs=epochs, price=price)
    if max_batch:
        report["max_batch_size"] = search_batch(run, first, tgt, say)
    return report


def search_batch(run: Run, first: dict, tgt: Target, say: Any) -> dict[str, Any]:
    """The largest ``train.batch_size`` (a multiple of the data-parallel size) whose train step fits
    ``tgt`` with 10 % headroom, by doubling then bisection over compiles."""
    unit = parallel.batch_devices(run.mesh) * run.cfg.optim.grad_accum
    tried: dict[int, dict[str, Any]] = {}

    def memory_at(multiple: int) -> dict[str, Any]:
        rows = multiple * unit
        if rows not in tried:
            cfg = dataclasses.replace(run.cfg, train=dataclasses.replace(run.cfg.train, batch_size=rows))
            sized = Run(
                cfg,
                model=run.model,
                dataset=run.dataset,
                task=run.task,
                devices=list(run.mesh.devices.flat),
                backend="cuda",
            )
            compiled, state, batch, seconds = _compile_train(sized, first, rows)
            tried[rows] = _memory(compiled, state, batch, tgt.memory_bytes)
            say(f"  batch {rows}: {tried[rows]['total'] / 2**30:.2f} GiB per device ({seconds:.1f} s to compile)")
        return tried[rows]

    # Start from the configured batch: doubling up while it fits, then bisection between the
    # largest multiple that fits (low) and the smallest that does not (high).
    start = max(run.cfg.train.batch_size // unit, 1)
    if _fits(memory_at(start)):
        low, high = start, start * 2
        while _fits(memory_at(high)):
            low, high = high, high * 2
            if high * unit > 1 << 24:
                raise UserError("--max-batch: more than 16 M rows still fit; the step's memory does not grow with them")
    else:
        low, high = 0, start
    while high - low > 1:
        middle = (low + high) // 2
        if _fits(memory_at(middle)):
            low = middle
        else:
            high = middle
    return {
        "batch_size": low * unit,
        "multiple_of": unit,
        "memory_at": tried.get(low * unit, {}).get("total"),
        "next_size": high * unit,
        "memory_at_next": tried[high * unit]["total"],
        "usable": int(tgt.memory_bytes * (1 - HEADROOM)),
        "compiles": len(tried),
        "note": "fits = total per device within 90 % of the device's memory",
    }


def _gib(n: float | None) -> str:
    return "-" if n is None else parallel.size(n)


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{1e3 * seconds:.3g} ms"


def _us(seconds: float | None) -> str:
    return "-" if seconds is None else f"{1e6 * seconds:.3g} us"


def _per_s(value: float | None, unit: str) -> str | None:
    return None if value is None else f"{value:,.0f} {unit}/s"


def _input_line(report: dict[str, Any]) -> str:
    r = report["input_rate"]
    rates = [
        _per_s(r["examples_per_s_per_host"], "examples"),
        _per_s(r["tokens_per_s_per_host"], "tokens"),
        None if r["bytes_per_s_per_host"] is None else f"{r['bytes_per_s_per_host'] / 1e6:,.1f} MB/s",
    ]
    line = f"  input per host ({r['hosts']} host{'s' if r['hosts'] > 1 else ''}, 8 GPUs each at most): PREDICTED "
    line += ", ".join(x for x in rates if x)
    if "calibrated" in r:
        c = r["calibrated"]
        line += "; CALIBRATED " + ", ".join(
            x
            for x in (_per_s(c["examples_per_s_per_host"], "examples"), _per_s(c["tokens_per_s_per_host"], "tokens"))
            if x
        )
    return line


def _calibration_lines(report: dict[str, Any]) -> list[str]:
    c = report.get("calibration")
    if not c:
        return []
    return [
        f"  CALIBRATED step {_ms(c['calibrated_step_s'])} = predicted x {c['ratio']:.3g} (measured efficiency "
        f"{100 * c['efficiency']:.0f} % of the bound) from {c['file']} ({c['measured_on']}, {c['date']}): {c['basis']}"
    ]


def _goal_line(report: dict[str, Any]) -> str:
    g = report["goal"]
    seconds = g["wall_s"]
    plain = f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds / 60:.1f} min" if seconds >= 60 else (
        f"{seconds:.3g} s"
    )
    when = f"{g['wall_days']:.3g} days ({plain})"
    cost = ""
    if g["cost_usd"] is not None:
        dollars = f"{g['cost_usd']:,.0f}" if g["cost_usd"] >= 100 else f"{g['cost_usd']:.2f}"
        cost = f", ${dollars} at ${g['price_usd_per_gpu_hour']:g} per GPU-hour"
    word = "CALIBRATED" if report.get("calibration") else "PREDICTED"
    return (
        f"  {word} to reach {g['goal']}: {g['steps']:,} steps in {when}, {g['gpu_hours']:,.3g} GPU-hours{cost} "
        "(training steps only)"
    )


def describe(report: dict[str, Any]) -> str:
    """The plan as a few lines of text for the terminal."""
    m, f, p, k = report["memory"], report["flops_per_step"], report["prediction"], report["kernels"]
    mesh = " x ".join(f"{a}={n}" for a, n in report["mesh"].items())
    verdict = "fits" if report["fits"] else "DOES NOT FIT"
    lines = [
        f"{report['experiment'] or 'run'} on {report['gpus']} x {report['device_kind']} (mesh {mesh}), batch "
        f"{report['batch_size']}, {report['compute_dtype']}: {verdict} "
        f"({_gib(m['total'])} of {_gib(m['device'])} per device; usable with 10 % headroom {_gib(m['usable'])})",
        f"  memory per device: arguments {_gib(m['arguments'])} (parameters {_gib(m['params'])}, optimizer state "
        f"{_gib(m['opt_state'])}, batch {_gib(m['batch'])}), outputs {_gib(m['outputs'])} "
        f"({_gib(m['aliased'])} donated), temp {_gib(m['temp'])}; cuDNN workspaces not counted",
        f"  FLOPs per step per device {f['per_device'] / 1e9:.3f} G from {f['source']} (XLA "
        f"{f['xla_cost_analysis'] / 1e9:.3f} G, cuDNN attention {f['cudnn_attention_by_formula'] / 1e9:.3f} G); "
        "jaxnet.flops "
        + (f"{f['jaxnet_flops_py'] / 1e9:.3f} G for all devices" if f["jaxnet_flops_py"] else "n/a")
        + f"; bytes per device {report['bytes_per_step']['per_device'] / 1e9:.3f} GB",
        f"  PREDICTED step {1e3 * p['predicted_step_s']:.3g} ms, {p['bound']}-bound (compute "
        f"{_ms(p['compute_s'])} at {(p['peak_flops'] or 0) / 1e12:.0f} TFLOP/s {p['peak_dtype']}, memory "
        f"{_ms(p['memory_s'])} at {p['memory_bandwidth'] / 1e12:.2f} TB/s, launch {_ms(p['launch_s'])} = "
        f"{p['kernels_per_step']:,} kernels x {_us(p['launch_overhead_s'])})"
        + (f", {p['tokens_per_s']:,.0f} tokens/s" if p["tokens_per_s"] else f", {p['examples_per_s']:,.0f} examples/s")
        + (f", MFU at most {100 * p['mfu_bound']:.1f} %" if p["mfu_bound"] else ""),
        *_calibration_lines(report),
        _input_line(report),
        *_processes_line(report),
        _goal_line(report),
        f"  kernels per step {report['kernels']['launches']['total']:,} ("
        + ", ".join(f"{n} {c:,}" for n, c in report["kernels"]["launches"]["by_kind"].items())
        + (
            f"; {report['kernels']['launches']['unknown_trip_loops']} loops of unknown trip count counted once"
            if report["kernels"]["launches"]["unknown_trip_loops"]
            else ""
        )
        + f"): cuDNN attention {k['cudnn_attention']['forward']} forward + {k['cudnn_attention']['backward']} "
        f"backward, gemm fusions {k['gemm_fusions'] or '-'}, matmul dtypes {k['matmul_dtypes'] or '-'}"
        + (
            ", collectives " + ", ".join(f"{n} {c['count']} ({_gib(c['bytes'])})" for n, c in k["collectives"].items())
            if k["collectives"]
            else ""
        ),
        f"  compiled in {report['compile_s']:.1f} s (eval step {report['eval_compile_s']:.1f} s)",
    ]
    if "max_batch_size" in report:
        b = report["max_batch_size"]
        lines.append(
            f"  largest train.batch_size that fits with 10 % headroom: {b['batch_size']} ({_gib(b['memory_at'])}); "
            f"{b['next_size']} does not ({_gib(b['memory_at_next'])}); {b['compiles']} compiles"
        )
    lines += [f"  note: {c}" for c in report["caveats"][: len(report["caveats"]) - len(CAVEATS)]]
    lines.append("  not known without a GPU: autotuned gemm tiles, cuDNN workspaces, measured time and overlap")
    return "\n".join(lines)


# The process layout (for the cluster page's two ways of starting a run on GPUs).


def process_layout(gpus: int, mesh: dict[str, int]) -> dict[str, Any]:
    """How a planned run's processes can sit on its hosts (:func:`hosts_for` of them): one per host
    using all its GPUs, or one per GPU. The mesh is the same either way (its devices in process
    order, Slurm placing consecutive tasks on one node); its ``tensor`` groups stay inside a host,
    on its fast links, when ``mesh.tensor`` divides the GPUs of a host.

    >>> process_layout(16, {"data": 8, "fsdp": 1, "tensor": 2})["per_gpu"]["srun"]
    '--nodes=2 --ntasks-per-node=8 --gpus-per-task=1'
    """
    hosts = hosts_for(gpus)
    per_host = max(gpus // hosts, 1)
    return {
        "hosts": hosts,
        "gpus_per_host": per_host,
        "per_host": {"processes": hosts, "srun": f"--nodes={hosts} --ntasks-per-node=1 --gpus-per-node={per_host}"},
        "per_gpu": {
            "processes": hosts * per_host,
            "srun": f"--nodes={hosts} --ntasks-per-node={per_host} --gpus-per-task=1",
        },
        "tensor_within_host": per_host % mesh.get("tensor", 1) == 0,
    }


def _processes_line(report: dict[str, Any]) -> list[str]:
    layout = report.get("processes")
    if layout is None:  # a report written before the layout was planned
        return []
    tensor = report["mesh"].get("tensor", 1)
    where = "inside a host" if layout["tensor_within_host"] else "ACROSS hosts (slow links): use a smaller mesh.tensor"
    return [
        f"  processes: either {layout['per_host']['processes']} (one per host: srun {layout['per_host']['srun']}) "
        f"or {layout['per_gpu']['processes']} (one per GPU: srun {layout['per_gpu']['srun']}); "
        f"mesh.tensor={tensor} groups {where} (see docs/cluster.md)"
    ]

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
(:func:`plan_dir`, see README) so that no other JAX process loads them: the ``jaxnet plan`` command puts
that directory on the path itself; from Python, start with ``PYTHONPATH=<plan_dir> JAX_PLATFORMS=cpu``
(JAX binds the plugin when it is imported). Installed beside jaxnet (``pip install '.[plan]'``) they work
too.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.machinery
import importlib.metadata
import importlib.resources
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
    "predicted_step_s is a roofline bound (FLOPs / peak, bytes / bandwidth), not a measurement: "
    "kernel launch gaps, communication and its overlap with compute are not modelled",
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
    say: Any = None,
) -> dict[str, Any]:
    """Compile ``cfg``'s train and eval steps for ``gpus`` GPUs of kind ``target`` on this machine
    (no GPU needed) and report memory, FLOPs, kernels and a predicted step time (a roofline
    bound). ``model``, ``dataset`` and ``task`` are those :func:`jaxnet.train` takes. With
    ``max_batch``, also the largest ``train.batch_size`` that fits with 10 % headroom.

    >>> plan(load_experiment("gpt2_small"), target="h100")["fits"]  # doctest: +SKIP
    True
    """
    say = say or (lambda line: None)
    tgt = load_target(target)
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
    step_s = max(compute_s or 0.0, memory_s)
    tokens = rows * planned.data.seq_len if run.text else None
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
            "bound": "compute" if (compute_s or 0.0) >= memory_s else "memory",
            "compute_s": compute_s,
            "memory_s": memory_s,
            "peak_flops": peak,
            "peak_dtype": dtype,
            "memory_bandwidth": tgt.bandwidth,
            "examples_per_s": rows / step_s if step_s else None,
            "tokens_per_s": tokens / step_s if tokens and step_s else None,
            "mfu_bound": analytic / step_s / (peak * gpus) if analytic and peak and step_s else None,
            "label": "PREDICTED (roofline bound from the target's data-sheet peaks), not measured",
        },
        "kernels": kernels(text),
        "compile_s": round(compile_s, 2),
        "eval_compile_s": round(eval_s, 2),
        "versions": _versions(),
        "target_source": tgt.source,
        "caveats": notes + CAVEATS,
    }
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
        f"  PREDICTED step {1e3 * p['predicted_step_s']:.3g} ms ({p['bound']}-bound roofline, peak "
        f"{(p['peak_flops'] or 0) / 1e12:.0f} TFLOP/s {p['peak_dtype']}, {p['memory_bandwidth'] / 1e12:.2f} TB/s)"
        + (f", {p['tokens_per_s']:,.0f} tokens/s" if p["tokens_per_s"] else f", {p['examples_per_s']:,.0f} examples/s")
        + (f", MFU at most {100 * p['mfu_bound']:.1f} %" if p["mfu_bound"] else ""),
        f"  kernels: cuDNN attention {k['cudnn_attention']['forward']} forward + {k['cudnn_attention']['backward']} "
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

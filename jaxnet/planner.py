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
from jaxnet.models.adapters import lora
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
    "predicted_step_s is the largest of four bounds (FLOPs / peak, bytes / bandwidth, kernels x the "
    "target's launch_overhead_s, collectives over the target's links), not a measurement: a step is slower "
    "than each bound when they do not overlap",
    "expected_step_s is the bound of compute, memory and launches divided by one efficiency fitted on published "
    "measured runs (jaxnet/targets/expected.json), plus the communication XLA did not schedule to overlap: "
    "an estimate for a well-tuned run, not a measurement",
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
    "nvlink_bandwidth",
    "network_bandwidth",
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


def gpus_per_node(tgt: Target, gpus: int, nodes: int | None) -> int:
    """GPUs on each node of a planned run: ``gpus / nodes`` with ``nodes`` given, else as many as the
    target's ``gpus_per_node`` (8 when the file has none) up to ``gpus``; a one-line
    :class:`UserError` when they do not divide.

    >>> gpus_per_node(load_target("h100"), 16, None), gpus_per_node(load_target("h100"), 16, 4)
    (8, 4)
    """
    if nodes is not None:
        if not isinstance(nodes, int) or isinstance(nodes, bool) or nodes < 1:
            raise UserError(f"--nodes {nodes}: give a number of nodes of at least 1")
        if gpus % nodes:
            raise UserError(f"--nodes {nodes} does not divide --gpus {gpus}; give a number of GPUs that is a multiple")
        return gpus // nodes
    per_node = int(tgt.number("gpus_per_node")) if "gpus_per_node" in tgt.fields else 8
    if gpus > per_node and gpus % per_node:
        raise UserError(
            f"--gpus {gpus}: more than {per_node} GPUs must be a multiple of {per_node} ({per_node} GPUs to a node "
            f"in {tgt.name}); or give --nodes"
        )
    return min(gpus, per_node)


@functools.cache
def topology(target: str, gpus: int, nodes: int | None = None) -> Any:
    """``gpus`` GPUs of kind ``target`` on ``nodes`` hosts (default: as many as the target's
    ``gpus_per_node`` needs, 8 GPUs to a host), as a JAX topology description."""
    missing = plugin_missing()
    if missing:
        raise UserError(f"jaxnet plan needs the CUDA plugin wheels ({missing} is missing); install them: {INSTALL}")
    if not jax_has_plugin():
        where = plan_dir()
        raise UserError(
            f"JAX was imported without the CUDA plugin wheels on its path; start Python with "
            f"PYTHONPATH={shlex.quote(str(where))} JAX_PLATFORMS=cpu (or use the jaxnet plan command)"
        )
    per_host = gpus_per_node(load_target(target), gpus, nodes)
    _use_cpu_for_jax()
    from jax.experimental import topologies

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


def attention_kernel(text: str, asked: str | None, packed: bool) -> dict[str, Any] | None:
    """Which attention kernel a compiled GPU step runs: cuDNN's fused attention (its custom calls,
    their mask type, and whether an additive bias goes in: how a mask such as packed rows' segments
    reaches it) or XLA's own softmax(QK^T)V. ``asked`` is ``model.attention`` as resolved for the
    GPU (None: a model without that key, whose attention is not reported); ``packed``: the batch
    carries ``segments``."""
    if asked is None:
        return None
    targets = sorted(set(re.findall(r'custom_call_target="(__cudnn\$fmha[A-Za-z]*)"', text)))
    masks = sorted(set(re.findall(r"mask_type\W+([A-Z_]{4,})", text)))
    bias = any("Bias" in t for t in targets)
    if targets:
        calls = ", ".join(t.removeprefix("__cudnn$") for t in targets)
        how = f"cuDNN's fused attention ({calls}; mask type {'/'.join(masks) or '?'}"
        if bias:
            how += "; the attention mask goes in as an additive bias, whose gradient the backward call also computes"
        how += ")"
    else:
        how = "XLA's softmax(QK^T)V (no cuDNN attention call)"
    return {
        "model_attention": asked,
        "kernel": "cudnn" if targets else "xla",
        "cudnn_calls": targets,
        "mask_type": masks,
        "bias": bias,
        "packed": packed,
        "description": how + (" on packed rows" if packed else ""),
    }


def kernels(text: str) -> dict[str, Any]:
    """What a compiled GPU program runs: cuDNN attention calls, gemm fusions by emitter and the dtypes
    of the matrix products (its collectives: :func:`communication`)."""
    insts = _instructions(text)
    types = {name: result for name, result, _, _ in insts}
    fmha, gemms, dtypes, calls = Counter(), Counter(), Counter(), Counter()
    for _, _, op, rest in insts:
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
    return {
        "cudnn_attention": {"forward": fmha["forward"], "backward": fmha["backward"]},
        "gemm_fusions": dict(gemms),
        "matmul_dtypes": dict(sorted(dtypes.items())),
        "custom_calls": dict(sorted(calls.items())),
        "while_loops": sum(1 for _, _, op, _ in insts if op == "while"),
    }


# ---------------------------------------------------------------------------------------------
# Communication: the collectives of the compiled program over the links they cross

# Bytes each GPU sends (and receives) for one collective over a group of n GPUs, as a fraction of
# the full buffer S (the gathered output, the reduced or scattered input), with the ring algorithms
# NCCL uses for large buffers: a ring all-reduce is a reduce-scatter then an all-gather.
RING = {
    "all-reduce": lambda n: 2 * (n - 1) / n,
    "all-gather": lambda n: (n - 1) / n,
    "reduce-scatter": lambda n: (n - 1) / n,
    "all-to-all": lambda n: (n - 1) / n,
    "collective-permute": lambda n: 1.0,
}


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def _mesh_groups(axes: list[tuple[str, int]], grouped: list[str], devices: np.ndarray) -> list[list[int]] | None:
    """Groups of a ``mesh[...] {axes}`` replica-group list, as XLA expands one: ``devices`` (the
    mesh's device ids in order) reshaped to the mesh's axes, a sub-axis ``'a':(pre)size`` splitting
    ``a`` into ``pre x size x rest`` and taking the middle, the grouped axes moved last in the order
    they are named, one group per row."""
    sizes = dict(axes)
    refs = {}
    for position, ref in enumerate(grouped):
        m = re.fullmatch(r"'([^']+)'(?::\((\d+)\)(\d+))?", ref.strip())
        if m is None or m.group(1) not in sizes or m.group(1) in refs:
            return None
        refs[m.group(1)] = (position, (int(m.group(2)), int(m.group(3))) if m.group(2) else None)
    dims: list[int] = []
    chosen: list[tuple[int, int]] = []  # (position in the group list, reshaped dimension)
    for name, size in axes:
        if name not in refs:
            dims.append(size)
            continue
        position, sub = refs[name]
        if sub is None:
            chosen.append((position, len(dims)))
            dims.append(size)
        elif size % (sub[0] * sub[1]) == 0:
            chosen.append((position, len(dims) + 1))
            dims += [sub[0], sub[1], size // (sub[0] * sub[1])]
        else:
            return None
    aggregate = [d for _, d in sorted(chosen)]
    rest = [d for d in range(len(dims)) if d not in aggregate]
    group = math.prod(dims[d] for d in aggregate)
    return devices.reshape(dims).transpose(rest + aggregate).reshape(-1, group).tolist()


def replica_groups(rest: str, devices: int) -> list[list[int]] | None:
    """The groups of logical device ids one collective runs over, read from its HLO attributes:
    ``replica_groups={{0,1},{2,3}}`` (``{}``: every device), the iota form ``[2,4]<=[4,2]T(1,0)``,
    the mesh form ``mesh['x'=2,'y'=4] {'y'}``, or a collective permute's ``source_target_pairs``
    (each pair a group). None when the attribute is in none of these forms.

    >>> replica_groups("replica_groups=[2,4]<=[4,2]T(1,0), dimensions={0}", 8)
    [[0, 2, 4, 6], [1, 3, 5, 7]]
    """
    found = re.search(r"replica_groups=", rest)
    if found is None:
        pairs = re.search(r"source_target_pairs=\{((?:\{\d+,\d+\},?)*)\}", rest)
        return [_ints(p) for p in re.findall(r"\{([\d,]+)\}", pairs.group(1))] if pairs else None
    text = rest[found.end() :]
    if text.startswith("{}"):
        return [list(range(devices))]
    if text.startswith("{{"):
        return [_ints(g) for g in re.findall(r"\{([\d,]*)\}", text[1 : text.index("}}") + 1])]
    iota = re.match(r"\[([\d,]+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?", text)
    if iota:
        shape, dims = _ints(iota.group(1)), _ints(iota.group(2))
        perm = _ints(iota.group(3)) if iota.group(3) else list(range(len(dims)))
        return np.arange(math.prod(dims)).reshape(dims).transpose(perm).reshape(shape).tolist()
    mesh = re.match(r"mesh\[([^\]]*)\]", text)
    if mesh:
        axes = [(name, int(size)) for name, size in re.findall(r"'([^']+)'=(\d+)", mesh.group(1))]
        count = math.prod(s for _, s in axes)
        rest_of = text[mesh.end() :]
        order = np.arange(count)
        listed = re.match(r",\s*device_ids=\(", rest_of)
        if listed:
            inner = _arguments(rest_of[listed.end() :])
            rest_of = rest_of[listed.end() + len(inner) + 1 :]
            iota = re.fullmatch(r"\[([\d,]+)\](?:T\(([\d,]+)\))?", inner.strip())
            if iota:
                dims = _ints(iota.group(1))
                perm = _ints(iota.group(2)) if iota.group(2) else list(range(len(dims)))
                order = np.arange(math.prod(dims)).reshape(dims).transpose(perm).reshape(-1)
            else:
                order = np.asarray(_ints(inner))
        grouped = re.match(r"\s*\{([^}]*)\}", rest_of)
        if grouped is None or order.size != count:
            return None
        return _mesh_groups(axes, re.findall(r"'[^']+'(?::\(\d+\)\d+)?", grouped.group(1)), order)
    return None


def link_seconds(kind: str, size: float, groups: list[list[int]], node_of: list[int], tgt: Target) -> dict[str, Any]:
    """Seconds one collective of ``size`` bytes (its full buffer) takes over ``groups`` (logical
    device ids; ``node_of[i]`` is the node of id ``i``), the slowest group setting the time: within
    a node each GPU's share crosses NVLink (``nvlink_bandwidth`` each way); a group that spans ``k``
    nodes with ``g`` GPUs on each runs hierarchically, the ring factor of ``g`` over NVLink and that
    of ``k`` over each GPU's own network link (``network_bandwidth``) on 1/g of the buffer.

    >>> round(link_seconds("all-reduce", 1e9, [list(range(8))], [0] * 8, load_target("h100"))["seconds"], 6)
    0.003889
    """
    nvlink, network = tgt.number("nvlink_bandwidth"), tgt.number("network_bandwidth")
    ring, worst, crosses = RING[kind], 0.0, False
    for group in groups:
        n = len(group)
        if n < 2:
            continue
        nodes = Counter(node_of[d] for d in group)
        k, g = len(nodes), max(nodes.values())
        crosses |= k > 1
        if kind == "collective-permute":
            seconds = size / (network if k > 1 else nvlink)
        elif kind == "all-to-all":
            seconds = size * (g - 1) / n / nvlink + (size * (n - g) / n / network if k > 1 else 0.0)
        else:
            seconds = (ring(g) * size / nvlink if g > 1 else 0.0) + (ring(k) * size / (g * network) if k > 1 else 0.0)
        worst = max(worst, seconds)
    return {"seconds": worst, "crosses_nodes": crosses, "group_size": max((len(g) for g in groups), default=0)}


def _array_sum(types: str) -> int:
    return sum(_array_bytes(d, s) for d, s in _ARRAY.findall(types))


def _multiplicities(text: str) -> tuple[dict[str, int], dict[str, list[str]]]:
    """How often each computation that can hold collectives runs per execution of the entry: loop
    bodies their known trip count (once when unknown), called computations as often as their caller;
    fused computations (no collectives in them) are left out."""
    comps, entry = roofline._computations(text)
    runs: Counter = Counter()

    def visit(name: str, times: int) -> None:
        runs[name] += times
        for _, _, op, rest in _instructions("\n".join(comps.get(name, ()))):
            if op == "while":
                loop, trip = _LOOP.search(rest), roofline._TRIP.search(rest)
                if loop:
                    visit(loop.group(2), times * (int(trip.group(1)) if trip else 1))
            elif op == "call":  # an async-start's computation is read with it (communication)
                called = _CALLED.search(rest)
                if called:
                    visit(called.group(1), times)
            elif op == "conditional":
                found = _BRANCHES.search(rest)
                if found:
                    names = re.findall(r"%[\w.\-]+", found.group(1)) if found.group(1) else list(found.groups()[1:])
                    for branch in names[:1]:  # the collectives of one branch (the first)
                        visit(branch, times)

    visit(entry, 1)
    return dict(runs), comps


def communication(text: str, node_of: list[int], tgt: Target) -> dict[str, Any]:
    """The communication of a compiled GPU program: every collective (kind, bytes of its full
    buffer, its groups of devices, whether they cross nodes) timed over the links it crosses
    (:func:`link_seconds`), and whether XLA scheduled it to overlap with compute: an asynchronous
    collective (``*-start`` ... ``*-done``) with kernels scheduled between its start and its done can
    run under them; a synchronous one, or a start followed by its done with no kernel between, cannot.

    ``seconds`` is the communication time of a step if nothing overlapped (the communication bound:
    a step is never shorter); ``exposed_s`` the time of the collectives that cannot overlap."""
    runs, comps = _multiplicities(text)
    devices = len(node_of)
    by_kind: dict[str, dict[str, Any]] = {}
    total = exposed = overlappable = 0.0
    unparsed = 0
    for name, times in runs.items():
        insts = _instructions("\n".join(comps.get(name, ())))
        types = {n: result for n, result, _, _ in insts}
        done_of = {}
        for position, (_, result, op, rest) in enumerate(insts):
            if op.endswith("-done"):
                started = re.findall(r"%[\w.\-]+", _arguments(rest))
                if started:
                    done_of[started[0]] = (position, result)
        for position, (inst, result, op, rest) in enumerate(insts):
            if op == "async-start":  # a collective wrapped in an async computation: read the one inside
                called = _CALLED.search(rest)
                inner = _instructions("\n".join(comps.get(called.group(1), ()))) if called else []
                wrapped = [(r, o, a) for _, r, o, a in inner if o in COLLECTIVES]
                if not wrapped:
                    continue
                result, op, rest = wrapped[0][0], wrapped[0][1] + "-start", wrapped[0][2]
                types.update({n: t for n, t, _, _ in inner})
            kind = op.removesuffix("-start")
            if kind not in COLLECTIVES or op.endswith("-done"):
                continue
            operand = sum(_array_bytes(d, s) for d, s in _operand_types(rest, types))
            end, output = done_of.get(inst, (position, result))
            size = max(operand, _array_sum(output if op.endswith("-start") else result))
            groups = replica_groups(rest, devices)
            if groups is None:
                unparsed += 1
                groups = [list(range(devices))]
            link = link_seconds(kind, size, groups, node_of, tgt)
            between = sum(
                1 for _, _, o, r in insts[position + 1 : end] if _launch_kind(o, r) not in (None, "collectives")
            )
            sync = not op.endswith("-start") or '"is_sync":true' in rest or between == 0
            entry = by_kind.setdefault(
                kind,
                {"count": 0, "bytes": 0, "seconds": 0.0, "crossing_nodes": 0, "overlappable": 0, "group_sizes": []},
            )
            entry["count"] += times
            entry["bytes"] += times * size
            entry["seconds"] += times * link["seconds"]
            entry["crossing_nodes"] += times * link["crosses_nodes"]
            entry["overlappable"] += 0 if sync else times
            if link["group_size"] not in entry["group_sizes"]:
                entry["group_sizes"].append(link["group_size"])
            total += times * link["seconds"]
            if sync:
                exposed += times * link["seconds"]
            else:
                overlappable += times * link["seconds"]
    count = sum(e["count"] for e in by_kind.values())
    hidden = sum(e["overlappable"] for e in by_kind.values())
    return {
        "seconds": total,
        "exposed_s": exposed,
        "overlappable_s": overlappable,
        "by_kind": by_kind,
        "collectives": count,
        "overlappable_collectives": hidden,
        "groups_unparsed": unparsed,
        "nvlink_bandwidth": tgt.number("nvlink_bandwidth"),
        "network_bandwidth": tgt.number("network_bandwidth"),
        "overlap": f"XLA scheduled {'all ' if hidden == count else ''}{hidden} of {count} collectives "
        "asynchronously with kernels between their start and done (they can run under compute)"
        + ("" if hidden == count else "; the others hold up the next kernel until they finish"),
        "model": "ring algorithms over the full buffer S: all-reduce 2(n-1)/n S, all-gather, reduce-scatter and "
        "all-to-all (n-1)/n S per GPU; within a node over NVLink (nvlink_bandwidth, each way), across nodes "
        "hierarchically over each GPU's network link (network_bandwidth); latency per collective, NVLink SHARP "
        "and in-network reduction are not modelled",
    }


# ---------------------------------------------------------------------------------------------
# Kernel launches per step

# Instructions that launch nothing on the GPU: values, views and tuples, and the second half of an
# asynchronous pair (``*-done`` waits for the work its ``*-start`` launched).
NO_LAUNCH = frozenset(
    {
        "parameter",
        "constant",
        "get-tuple-element",
        "tuple",
        "bitcast",
        "after-all",
        "add-dependency",
        "opt-barrier",
        "domain",
    }
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
        + ("; loops of unknown trip count counted once (a lower bound)" if unknown else ""),
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


def step_bound(
    compute_s: float | None, memory_s: float, launch_s: float | None, communication_s: float | None = None
) -> tuple[str, float]:
    """The predicted step: the largest of the compute, memory, launch and communication bounds (a
    bound that is None, no peak, launch cost or link bandwidth known, counts as 0), and which one it is.

    >>> step_bound(6.6e-3, 10.3e-3, 4.4e-3)
    ('memory', 0.0103)
    >>> step_bound(6.6e-3, 10.3e-3, 4.4e-3, 12e-3)
    ('communication', 0.012)
    """
    bounds = {"compute": compute_s or 0.0, "memory": memory_s, "launch": launch_s or 0.0}
    bounds["communication"] = communication_s or 0.0
    bound = max(bounds, key=bounds.get)
    return bound, bounds[bound]


def hosts_for(gpus: int, per_node: int = 8) -> int:
    """Hosts of a planned run: ``per_node`` GPUs to a host (one JAX process each), as :func:`topology` lays them."""
    return max(gpus // per_node, 1)


def input_rate(
    run: Run, batch: dict[str, np.ndarray], rows: int, gpus: int, step_s: float, hosts: int | None = None
) -> dict[str, Any]:
    """What each host's input pipeline must deliver for the step to take ``step_s``: examples,
    tokens and bytes per second per host (one process per host of 8 GPUs). Tokens come from the
    batch's shape: a text run's ``rows x seq_len``, else the model input's length when it is a
    2-D array of integer ids (a data source given from Python), else none (images are not tokens).
    Bytes are those of the batch's arrays as the loader hands them over (their own dtypes)."""
    hosts = hosts or hosts_for(gpus)
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
        "gpus_per_host": -(-gpus // hosts),
        "tokens_per_example": per_example,
        "tokens_per_step": rows * per_example if per_example else None,
        "examples_per_s_per_host": rows / hosts * per_s if per_s else None,
        "tokens_per_s_per_host": rows * per_example / hosts * per_s if per_s and per_example else None,
        "bytes_per_s_per_host": batch_bytes / hosts * per_s if per_s else None,
        "note": "what each host's loader must deliver to keep up with the predicted step (the bound: the most "
        "a loader can be asked for; one process to a host, the global batch split evenly); tokens from the "
        "batch's shape",
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
    prediction = report["prediction"]
    if calibrated:
        step_s, basis = calibrated["calibrated_step_s"], "calibrated"
    elif prediction.get("expected_step_s"):
        step_s, basis = prediction["expected_step_s"], "expected"
    else:
        step_s, basis = prediction["predicted_step_s"], "bound"

    def cost(step: float) -> dict[str, Any]:
        seconds = steps * step
        gpu_hours = seconds / 3600 * report["gpus"]
        return {
            "step_s": step,
            "wall_s": seconds,
            "wall_days": seconds / 86400,
            "gpu_hours": gpu_hours,
            "cost_usd": gpu_hours * float(price) if price is not None else None,
        }

    labels = {
        "calibrated": "CALIBRATED (the bound times a measured/predicted ratio of one GPU run)",
        "expected": "EXPECTED (the bound divided by an efficiency fitted on published measured runs)",
        "bound": "PREDICTED (a lower bound on time and cost; no fitted efficiency is shipped)",
    }
    return {
        "goal": what,
        "steps": steps,
        "tokens": steps * per_step if per_step else None,
        "examples": steps * rows,
        "epochs": steps * (per_step if text else rows) / size if size and (per_step or not text) else None,
        "epochs_of": f"{size:,} {data['unit']}" if size else None,
        **cost(step_s),
        "basis": basis,
        "price_usd_per_gpu_hour": float(price) if price is not None else None,
        "bound": cost(prediction["predicted_step_s"]),
        "label": labels[basis] + ", not measured: training steps only (no evaluation, checkpoints or start-up); "
        "bound: the same goal at the predicted bound, the least it can take",
    }


# ---------------------------------------------------------------------------------------------
# The expected step: the bounds and an efficiency fitted on published measured runs

FIT_FILE = "expected.json"


@functools.cache
def load_fit() -> dict[str, Any] | None:
    """The efficiency fitted on published runs (``jaxnet/targets/expected.json``, written by
    ``scripts/record_plans.py published``), or None when none is shipped."""
    path = importlib.resources.files("jaxnet") / "targets" / FIT_FILE
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None


def expected_step(prediction: dict[str, Any], communication: dict[str, Any] | None, efficiency: float) -> dict:
    """The step a well-tuned run reaches: the largest of the compute, memory and launch bounds
    divided by ``efficiency`` (the fraction of that bound published runs achieve), plus the
    communication that cannot hide under it: the collectives XLA left no kernel to overlap with
    (``exposed_s``) and what of the overlappable ones outlasts the compute; never shorter than the
    communication bound itself.

    >>> expected_step({"compute_s": 0.168, "memory_s": 0.155, "launch_s": 0.005}, None, 0.56)["expected_step_s"]
    0.3
    """
    roof = max(prediction.get("compute_s") or 0.0, prediction["memory_s"], prediction.get("launch_s") or 0.0)
    work = roof / efficiency
    comm = communication or {}
    exposed = comm.get("exposed_s", 0.0) + max(0.0, comm.get("overlappable_s", 0.0) - work)
    step = max(work + exposed, comm.get("seconds", 0.0))
    return {"expected_step_s": round(step, 12), "work_s": work, "exposed_communication_s": exposed}


def solve_efficiency(prediction: dict[str, Any], communication: dict[str, Any] | None, measured_s: float) -> float:
    """The efficiency at which :func:`expected_step` gives ``measured_s`` for this plan (bisection;
    NaN when no efficiency in (0, 1.5] does: a run faster than its bound, or slower than its work
    could explain).

    >>> solve_efficiency({"compute_s": 0.168, "memory_s": 0.155, "launch_s": 0.005}, None, 0.3)
    0.56
    """
    low, high = 1e-4, 1.5
    if not expected_step(prediction, communication, high)["expected_step_s"] <= measured_s:
        return math.nan
    if expected_step(prediction, communication, low)["expected_step_s"] < measured_s:
        return math.nan
    for _ in range(200):
        middle = (low + high) / 2
        if expected_step(prediction, communication, middle)["expected_step_s"] > measured_s:
            low = middle
        else:
            high = middle
    return round((low + high) / 2, 6)


def fit_efficiency(runs: list[tuple[str, dict[str, Any], float]]) -> dict[str, Any]:
    """One efficiency for every plan: the median over ``runs`` (``(name, report, measured step)``)
    of the efficiency each needs (:func:`solve_efficiency`); no constant of any one run survives.

    >>> fit_efficiency([("a", report_a, 0.30), ("b", report_b, 0.82)])["efficiency"]  # doctest: +SKIP
    """
    each = {
        name: solve_efficiency(report["prediction"], report.get("communication"), measured)
        for name, report, measured in runs
    }
    usable = [e for e in each.values() if math.isfinite(e)]
    if not usable:
        raise UserError("no published run could be fitted: each was faster than its bound or had no bound")
    return {
        "efficiency": float(np.median(usable)),
        "per_run": {n: e if math.isfinite(e) else None for n, e in each.items()},
        "fitted_on": sorted(n for n, e in each.items() if math.isfinite(e)),
    }


def expectation(report: dict[str, Any], fit: dict[str, Any] | None) -> dict[str, Any]:
    """The report's expected figures with ``fit`` (:func:`load_fit`'s dict; None: no expected figure):
    step, tokens and examples per second and MFU at that step."""
    if not fit:
        return {
            "expected_step_s": None,
            "efficiency": None,
            "label": "no fitted efficiency is shipped (jaxnet/targets/expected.json): only the bound",
        }
    p = report["prediction"]
    out = expected_step(p, report.get("communication"), fit["efficiency"])
    step = out["expected_step_s"]
    per_step = report["input_rate"]["tokens_per_step"]
    analytic = report["flops_per_step"]["jaxnet_flops_py"]
    return {
        **out,
        "efficiency": fit["efficiency"],
        "fitted_on": fit.get("fitted_on"),
        "fit_date": fit.get("date"),
        "expected_tokens_per_s": per_step / step if per_step else None,
        "expected_examples_per_s": report["batch_size"] / step,
        "expected_mfu": analytic / step / (p["peak_flops"] * report["gpus"]) if analytic and p["peak_flops"] else None,
        "label": "EXPECTED (the largest of the compute, memory and launch bounds / an efficiency fitted on published "
        "measured runs, plus communication XLA cannot overlap), not measured",
    }


# ---------------------------------------------------------------------------------------------
# Warnings a practitioner would give

# Tokens per step of GPT-3's models by size (Brown et al. 2020, "Language Models are Few-Shot Learners",
# Table 2.1): the batch the paper trained each size with.
USUAL_BATCH_TOKENS = (
    (125e6, 0.5e6),
    (350e6, 0.5e6),
    (760e6, 0.5e6),
    (1.3e9, 1e6),
    (2.7e9, 1e6),
    (6.7e9, 2e6),
    (13e9, 2e6),
    (175e9, 3.2e6),
)
SMALL_BATCH_FACTOR = 4  # "far below": under a quarter of the usual batch
MAX_EPOCHS = 4  # Muennighoff et al. 2023: up to about 4 epochs of repeated tokens are worth nearly as much as new ones


def usual_batch(params: float) -> tuple[float, float] | None:
    """The tokens per step GPT-3 trained its model of the nearest size with (``(its size, tokens)``),
    or None for a model more than twice as small as GPT-3's smallest (125 M parameters) or more than
    twice as large as its largest: the table says nothing there.

    >>> usual_batch(124e6), usual_batch(8e9), usual_batch(10e6)
    ((125000000.0, 500000.0), (6700000000.0, 2000000.0), None)
    """
    size, tokens = min(USUAL_BATCH_TOKENS, key=lambda row: abs(math.log(params / row[0])))
    return (size, tokens) if 0.5 <= params / size <= 2 else None


def plan_warnings(report: dict[str, Any], requested_batch: int | None = None) -> list[dict[str, str]]:
    """What a practitioner would say of this plan: a batch far below what a language model of this
    size is trained with, a goal of many epochs over a text corpus, a batch that does not divide the
    devices (``requested_batch``: the size asked for, planned at the next multiple), a step bound by
    kernel launches. Each ``{"kind", "message"}``."""
    out = []
    rows, per_step = report["batch_size"], report["input_rate"]["tokens_per_step"]
    if requested_batch is not None and requested_batch != rows:
        below = rows - report["batch_devices"] * report["grad_accum"]
        out.append(
            {
                "kind": "batch_not_divisible",
                "message": f"train.batch_size={requested_batch} does not split evenly over the "
                f"{report['batch_devices']} data-parallel devices (mesh.data x mesh.fsdp"
                + (f", per micro-batch of optim.grad_accum={report['grad_accum']}" if report["grad_accum"] > 1 else "")
                + f"): training would stop with an error; planned at {rows}, the next size that does"
                + (f" (or {below}, the one below)" if below else ""),
            }
        )
    params = report.get("parameters")
    usual = usual_batch(params) if params and per_step and report["train_data"]["unit"] == "tokens" else None
    if usual and per_step * SMALL_BATCH_FACTOR < usual[1]:
        out.append(
            {
                "kind": "small_batch",
                "message": f"{per_step:,} tokens a step is 1/{usual[1] / per_step:.0f} of the {usual[1] / 1e6:g} M "
                f"tokens GPT-3 trained its {usual[0] / 1e6:,.0f} M-parameter model with (Brown et al. 2020, Table "
                f"2.1; this model has {params / 1e6:,.0f} M): raise train.batch_size, or optim.grad_accum to keep "
                "the per-GPU batch",
            }
        )
    epochs = (report.get("goal") or {}).get("epochs")
    if epochs and epochs > MAX_EPOCHS and report["train_data"]["unit"] == "tokens":
        out.append(
            {
                "kind": "many_epochs",
                "message": f"the goal is {epochs:,.3g} epochs of a {report['train_data']['size']:,}-token corpus: "
                f"past about {MAX_EPOCHS} epochs repeated tokens are worth much less than new ones (Muennighoff et "
                "al. 2023, Scaling Data-Constrained Language Models); plan on a larger corpus (data.path)",
            }
        )
    p = report["prediction"]
    if p["bound"] == "launch":
        busy = max(p.get("compute_s") or 0.0, p["memory_s"])
        out.append(
            {
                "kind": "launch_bound",
                "message": f"the step is bound by kernel launches ({p['kernels_per_step']:,} kernels x "
                f"{1e6 * p['launch_overhead_s']:.3g} us): the GPU waits on the host "
                + (
                    f"and its work would fill only {100 * busy / p['launch_s']:.0f} % of the step; a batch about "
                    f"{p['launch_s'] / busy:.0f}x larger costs about the same time per step"
                    if busy
                    else "between kernels"
                ),
            }
        )
    return out


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
        # a LoRA run: its frozen base, held beside the adapters (state.params) and never differentiated
        "frozen_base": parallel.bytes_per_device(state.model_state.get(lora.BASE, {})),
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
    nodes: int | None = None,
    say: Any = None,
) -> dict[str, Any]:
    """Compile ``cfg``'s train and eval steps for ``gpus`` GPUs of kind ``target`` (on ``nodes``
    hosts; default 8 GPUs to a host) on this machine (no GPU needed) and report memory, FLOPs,
    kernels, the collectives and a predicted step time: the largest of a compute, a memory, a
    kernel-launch and a communication bound; beside it the **expected** step, the bound divided by
    an efficiency fitted on published measured runs (``report["prediction"]["expected_step_s"]``).
    ``model``, ``dataset`` and ``task`` are those :func:`jaxnet.train` takes. With ``max_batch``,
    also the largest ``train.batch_size`` that fits with 10 % headroom.

    The goal (``report["goal"]``) is ``tokens`` tokens or ``epochs`` passes over the training data,
    else the config's ``train.steps``: its wall time and GPU-hours at the expected step (and at the
    bound), and with ``price`` (US dollars per GPU-hour) its cost. ``calibrate`` is a
    plan-vs-measured file written by ``scripts/gpu_check.sh --only plan`` on a GPU of this kind: its
    measured/predicted ratio scales the step (``report["calibration"]``), and the goal uses the
    calibrated step instead. ``report["warnings"]`` holds what a practitioner would warn of.

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
    per_node = gpus_per_node(tgt, gpus, nodes)
    topo = topology(target, gpus, nodes)
    planned, notes = _for_gpu(cfg, model is not None)
    requested = planned.train.batch_size
    planned = _dividing_batch(planned, list(topo.devices))
    run = Run(planned, model=model, dataset=dataset, task=task, devices=list(topo.devices), backend="cuda")
    first = next(iter(run.train_batches(0)))
    rows = planned.train.batch_size
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
    comm = communication(text, [d.process_index for d in run.mesh.devices.flat], tgt)
    comm.update(nodes=gpus // per_node, gpus_per_node=per_node)
    bound, step_s = step_bound(compute_s, memory_s, launch_s, comm["seconds"])
    rate = input_rate(run, first, rows, gpus, step_s, hosts=gpus // per_node)
    per_step_tokens = rate["tokens_per_step"]
    report: dict[str, Any] = {
        "experiment": cfg.experiment,
        "target": target,
        "device_kind": tgt.device_kind,
        "gpus": gpus,
        "mesh": dict(run.mesh.shape),
        "batch_size": rows,
        "batch_devices": parallel.batch_devices(run.mesh),
        "grad_accum": planned.optim.grad_accum,
        "seq_len": planned.data.seq_len if run.text else None,
        "model": run.model.name,
        "parameters": _count(state.params),
        **(
            {"lora": dataclasses.asdict(run.lora), "frozen_parameters": _count(state.model_state[lora.BASE])}
            if run.lora is not None
            else {}
        ),
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
            "communication_s": comm["seconds"],
            "label": "PREDICTED (the largest of the compute, memory, launch and communication bounds from the "
            "target's data sheet, launch cost and links), not measured",
        },
        "communication": comm,
        "input_rate": rate,
        "train_data": {
            "size": _train_size(run),
            "unit": "tokens" if run.text else "examples",
            "steps": cfg.train.steps,
            "note": "the training split's size (for --epochs) and the config's train.steps (the default goal)",
        },
        "kernels": {
            **kernels(text),
            "collectives": {k: {"count": c["count"], "bytes": c["bytes"]} for k, c in comm["by_kind"].items()},
            "collective_bytes_note": "per device and step, loops counted as often as they run: each collective's "
            "full buffer (the whole tensor it gathers, reduces or scatters); see communication",
            "launches": launched,
        },
        "attention": attention_kernel(
            text, getattr(models.resolve(run.cfg.model, "cuda"), "attention", None), "segments" in first
        ),
        "compile_s": round(compile_s, 2),
        "eval_compile_s": round(eval_s, 2),
        "versions": _versions(),
        "target_source": tgt.source,
        "caveats": notes + CAVEATS,
    }
    report["prediction"].update(expectation(report, load_fit()))
    report["processes"] = process_layout(gpus, report["mesh"], per_node)
    if calibration is not None:
        report["calibration"] = apply_calibration(calibration, report)
        again = input_rate(run, first, rows, gpus, report["calibration"]["calibrated_step_s"], hosts=gpus // per_node)
        rate["calibrated"] = {k: v for k, v in again.items() if k.endswith("_per_s_per_host")}
    report["goal"] = goal(report, tokens=tokens, epochs=epochs, price=price)
    report["warnings"] = plan_warnings(report, requested)
    if max_batch:
        report["max_batch_size"] = search_batch(run, first, tgt, say)
    return report


def _count(params: Any) -> int:
    """Parameters of a (possibly abstract) parameter tree."""
    return int(sum(math.prod(np.shape(x)) for x in jax.tree.leaves(params)))


def _dividing_batch(cfg: Config, devices: list) -> Config:
    """``cfg`` with ``train.batch_size`` raised to the next size whose micro-batches split evenly
    over the data-parallel devices (unchanged when it already does): training refuses such a batch,
    the plan says so (:func:`plan_warnings`) and plans the size that would run."""
    unit = parallel.batch_devices(parallel.make_mesh(cfg.mesh, devices)) * cfg.optim.grad_accum
    rows = cfg.train.batch_size
    if rows % unit == 0:
        return cfg
    return dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, batch_size=-(-rows // unit) * unit))


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
    each = r.get("gpus_per_host")  # absent from plans recorded before it was
    gpus = "8 GPUs each at most" if each is None else f"{each} GPU{'s' if each > 1 else ''} each"
    line = f"  input per host ({r['hosts']} host{'s' if r['hosts'] > 1 else ''}, {gpus}): PREDICTED "
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


def _duration(seconds: float) -> str:
    plain = (
        f"{seconds / 3600:.1f} h"
        if seconds >= 3600
        else f"{seconds / 60:.1f} min"
        if seconds >= 60
        else f"{seconds:.3g} s"
    )
    return f"{seconds / 86400:.3g} days ({plain})"


def _dollars(usd: float | None) -> str:
    return "" if usd is None else f"${usd:,.0f}" if usd >= 100 else f"${usd:.2f}"


def _goal_line(report: dict[str, Any]) -> str:
    g = report["goal"]
    cost = f", {_dollars(g['cost_usd'])} at ${g['price_usd_per_gpu_hour']:g} per GPU-hour" if g["cost_usd"] else ""
    word = {"calibrated": "CALIBRATED", "expected": "EXPECTED", "bound": "PREDICTED"}[g["basis"]]
    epochs = (
        f" = {g['epochs']:,.3g} epochs of {g['epochs_of']}" if g.get("epochs") and "epochs of" not in g["goal"] else ""
    )
    line = (
        f"  {word} to reach {g['goal']}{epochs}: {g['steps']:,} steps in {_duration(g['wall_s'])}, "
        f"{g['gpu_hours']:,.3g} GPU-hours{cost} (training steps only)"
    )
    if g["basis"] != "bound":
        b = g["bound"]
        line += f"; at the bound {_duration(b['wall_s'])}" + (f", {_dollars(b['cost_usd'])}" if b["cost_usd"] else "")
    return line


def _expected_line(report: dict[str, Any]) -> list[str]:
    p = report["prediction"]
    if not p.get("expected_step_s"):
        return []
    rate = (
        f"{p['expected_tokens_per_s']:,.0f} tokens/s"
        if p["expected_tokens_per_s"]
        else f"{p['expected_examples_per_s']:,.0f} examples/s"
    )
    mfu = f", MFU {100 * p['expected_mfu']:.0f} %" if p.get("expected_mfu") else ""
    return [
        f"  EXPECTED step {_ms(p['expected_step_s'])} = the bound's work / {p['efficiency']:.3g} (the efficiency "
        f"fitted on {', '.join(p['fitted_on'] or [])}) + {_ms(p['exposed_communication_s'])} of communication not "
        "overlapped: "
        f"{rate}{mfu}; the PREDICTED bound below is the least a step can take"
    ]


def _communication_line(report: dict[str, Any]) -> str:
    c = report["communication"]
    if not c["collectives"]:
        return "  communication: none (no collectives in the compiled step)"
    kinds = ", ".join(
        f"{n} {e['count']} ({_gib(e['bytes'])}, groups of {'/'.join(map(str, e['group_sizes']))}"
        + (", across nodes" if e["crossing_nodes"] else "")
        + ")"
        for n, e in c["by_kind"].items()
    )
    return (
        f"  communication per step {_ms(c['seconds'])} ({c['nodes']} node{'s' if c['nodes'] > 1 else ''} x "
        f"{c['gpus_per_node']} GPUs; NVLink {c['nvlink_bandwidth'] / 1e9:.0f} GB/s, network "
        f"{c['network_bandwidth'] * 8 / 1e9:.0f} Gb/s per GPU): {kinds}; {c['overlap']}; "
        f"{_ms(c['exposed_s'])} cannot overlap"
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
        f"  memory per device: arguments {_gib(m['arguments'])} (parameters {_gib(m['params'])}"
        + (f", frozen base {_gib(m['frozen_base'])}" if m.get("frozen_base") else "")
        + f", optimizer state "
        f"{_gib(m['opt_state'])}, batch {_gib(m['batch'])}), outputs {_gib(m['outputs'])} "
        f"({_gib(m['aliased'])} donated), temp {_gib(m['temp'])}; cuDNN workspaces not counted",
        f"  FLOPs per step per device {f['per_device'] / 1e9:.3f} G from {f['source']} (XLA "
        f"{f['xla_cost_analysis'] / 1e9:.3f} G, cuDNN attention {f['cudnn_attention_by_formula'] / 1e9:.3f} G); "
        "jaxnet.flops "
        + (f"{f['jaxnet_flops_py'] / 1e9:.3f} G for all devices" if f["jaxnet_flops_py"] else "n/a")
        + f"; bytes per device {report['bytes_per_step']['per_device'] / 1e9:.3f} GB",
        *_expected_line(report),
        f"  PREDICTED step {1e3 * p['predicted_step_s']:.3g} ms, {p['bound']}-bound (compute "
        f"{_ms(p['compute_s'])} at {(p['peak_flops'] or 0) / 1e12:.0f} TFLOP/s {p['peak_dtype']}, memory "
        f"{_ms(p['memory_s'])} at {p['memory_bandwidth'] / 1e12:.2f} TB/s, launch {_ms(p['launch_s'])} = "
        f"{p['kernels_per_step']:,} kernels x {_us(p['launch_overhead_s'])}, communication "
        f"{_ms(p['communication_s'])})"
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
        f"backward, gemm fusions {k['gemm_fusions'] or '-'}, matmul dtypes {k['matmul_dtypes'] or '-'}",
        *([f"  attention: {report['attention']['description']}"] if report.get("attention") else []),
        _communication_line(report),
        f"  compiled in {report['compile_s']:.1f} s (eval step {report['eval_compile_s']:.1f} s)",
    ]
    if "max_batch_size" in report:
        b = report["max_batch_size"]
        lines.append(
            f"  largest train.batch_size that fits with 10 % headroom: {b['batch_size']} ({_gib(b['memory_at'])}); "
            f"{b['next_size']} does not ({_gib(b['memory_at_next'])}); {b['compiles']} compiles"
        )
    lines += [f"  WARNING: {w['message']}" for w in report.get("warnings", ())]
    lines += [f"  note: {c}" for c in report["caveats"][: len(report["caveats"]) - len(CAVEATS)]]
    lines.append("  not known without a GPU: autotuned gemm tiles, cuDNN workspaces, measured time and overlap")
    return "\n".join(lines)


# The process layout (for the cluster page's two ways of starting a run on GPUs).


def process_layout(gpus: int, mesh: dict[str, int], per_node: int = 8) -> dict[str, Any]:
    """How a planned run's processes can sit on its hosts (:func:`hosts_for` of them): one per host
    using all its GPUs, or one per GPU. The mesh is the same either way (its devices in process
    order, Slurm placing consecutive tasks on one node); its ``tensor`` groups stay inside a host,
    on its fast links, when ``mesh.tensor`` divides the GPUs of a host.

    >>> process_layout(16, {"data": 8, "fsdp": 1, "tensor": 2})["per_gpu"]["srun"]
    '--nodes=2 --ntasks-per-node=8 --gpus-per-task=1'
    """
    hosts = hosts_for(gpus, per_node)
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

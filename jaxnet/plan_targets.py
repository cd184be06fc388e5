"""The GPUs a plan compiles for: the target files (each GPU kind's data-sheet figures, with their
sources) and JAX's deviceless topology of N of them, with the CUDA plugin wheels it needs.

    >>> load_target("h100").memory_bytes                                  # doctest: +SKIP
    85520809984
    >>> topology("h100", 8).devices                                       # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.machinery
import importlib.metadata
import importlib.resources
import shlex
import sys
from pathlib import Path
from typing import Any

import jax

from jaxnet import _startup
from jaxnet import flops as flops_lib
from jaxnet.bench import roofline
from jaxnet.errors import UserError


def plan_dir() -> Path:
    """Where the plan's wheels live (:func:`jaxnet._startup.plan_dir`, the rule tests/conftest.py
    uses before JAX is imported too)."""
    return Path(_startup.plan_dir())


INSTALL = f"pip install --no-deps --target {shlex.quote(str(plan_dir()))} -c constraints.txt -r requirements-plan.txt"

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
        """Dense peak FLOP/s for matrix products in ``dtype`` (float32 ones run on TF32 tensor cores;
        ``float8`` where the GPU has float8 matrix units, else None)."""
        if dtype == "float8":
            own = self.fields.get("peak_fp8_flops")
            return float(own) if own else flops_lib.peak_flops(self.device_kind, "float8")
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

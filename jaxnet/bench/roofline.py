"""The roofline of a training step: is it limited by arithmetic or by memory traffic?

A step that performs ``F`` floating-point operations and moves ``B`` bytes between memory and the
processor has an arithmetic intensity ``I = F / B`` (FLOPs per byte). On a device with peak
arithmetic ``P`` (FLOP/s) and memory bandwidth ``W`` (bytes/s) it cannot run faster than
``min(P, I * W)`` FLOP/s: below the ridge point ``I = P / W`` the step is **memory-bound** (more
bandwidth would speed it up, more arithmetic units would not), above it **compute-bound**. The
fraction of the roofline reached is the achieved FLOP/s over that bound.

Where the figures come from:

- **FLOPs and bytes per step**: XLA's cost analysis of the compiled step (``bytes accessed`` is
  the operand and result bytes of every operation after fusion: the traffic if nothing stays in a
  cache between operations, an upper bound of DRAM traffic on a CPU with large caches). XLA counts
  a ``while`` loop's body once whatever its trip count, so the body of every loop with a known trip
  count (a ``lax.scan``: the LSTM's recurrence) is analysed on its own and counted as many times as
  the loop runs. XLA cannot count inside fused kernels it calls (cuDNN's attention and LSTM); the
  analytic count of :mod:`jaxnet.flops` covers only matrix products, so it is a lower bound of the
  work too, and the larger of the two is used (``flops_source`` says which).
- **Peaks**: for a GPU or TPU, a table by device kind (data sheets: dense bf16 and TF32 FLOP/s,
  memory bandwidth); for a CPU, measured here by a short matrix-product and copy microbenchmark
  (half a second each, the best pass kept: a ceiling, not an average).
"""

from __future__ import annotations

import functools
import re
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxnet import flops as flops_lib

# Memory bandwidth of one device, bytes/s (data sheets), matched against ``device_kind`` by
# substring, first match wins.
MEMORY_BANDWIDTH: tuple[tuple[str, float], ...] = (
    ("H200", 4.8e12),
    ("H100 PCIe", 2.0e12),
    ("H100", 3.35e12),  # SXM, HBM3
    ("A100-SXM4-80GB", 2.039e12),
    ("A100 80GB PCIe", 1.935e12),
    ("A100", 1.555e12),  # 40 GB
    ("L4", 300e9),
    ("A10G", 600e9),
    ("V100", 900e9),
    ("TPU v5p", 2.765e12),
    ("TPU v5 lite", 819e9),
    ("TPU v4", 1.2e12),
)

# Dense float32 matrix-product peak, FLOP/s: TF32 tensor cores on the GPUs that have them (XLA's
# default precision lets float32 products use them), plain float32 on a V100.
PEAK_F32_FLOPS: tuple[tuple[str, float], ...] = (
    ("H200", 494.7e12),
    ("H100 PCIe", 378e12),
    ("H100", 494.7e12),
    ("A100", 156e12),
    ("L4", 60e12),
    ("A10G", 62.5e12),
    ("V100", 15.7e12),
)


def _lookup(table: tuple[tuple[str, float], ...], kind: str) -> float | None:
    for name, value in table:
        if name.lower() in kind.lower():
            return value
    return None


# ---------------------------------------------------------------------------------------------
# The device's peaks


def measure_matmul_flops(dtype: str = "float32", n: int = 1024, seconds: float = 0.5) -> float:
    """The best FLOP/s of an ``n`` x ``n`` by ``n`` x ``n`` product on JAX's default device."""
    key_a, key_b = jax.random.split(jax.random.PRNGKey(0))
    a = jax.random.normal(key_a, (n, n), dtype)
    b = jax.random.normal(key_b, (n, n), dtype)
    product = jax.jit(lambda x, y: x @ y)
    return 2.0 * n**3 / _best_time(lambda: product(a, b), seconds)


def measure_copy_bandwidth(megabytes: int = 512, seconds: float = 0.5) -> float:
    """The best bytes/s of reading and writing back a ``megabytes`` MiB float32 array in place
    (the input buffer is donated, so each pass reads and writes every byte once)."""
    x = jnp.ones((megabytes << 18,), jnp.float32)
    scale = jax.jit(lambda v: v * 1.0000001, donate_argnums=0)
    state = {"x": x}

    def once() -> Any:
        state["x"] = scale(state["x"])
        return state["x"]

    return 2.0 * x.nbytes / _best_time(once, seconds)


def _best_time(fn: Callable[[], Any], seconds: float) -> float:
    """The shortest of repeated timings of ``fn`` (blocked on), after a warm-up, for about ``seconds``."""
    jax.block_until_ready(fn())
    best, deadline = float("inf"), time.perf_counter() + seconds
    while True:
        start = time.perf_counter()
        jax.block_until_ready(fn())
        best = min(best, time.perf_counter() - start)
        if time.perf_counter() > deadline:
            return best


_MEASURED: dict[str, float] = {}  # a CPU's best measurements in this process: FLOP/s per dtype, "bandwidth"


def _measured(key: str) -> float:
    if key not in _MEASURED:
        _MEASURED[key] = round(measure_copy_bandwidth() if key == "bandwidth" else measure_matmul_flops(key))
    return _MEASURED[key]


def remeasure(dtypes: tuple[str, ...]) -> None:
    """Measure a CPU's peaks again, keeping the best of all measurements (another process's load
    lowers a measurement; it never raises one)."""
    if jax.devices()[0].platform != "cpu":
        return
    for dtype in dtypes:
        _MEASURED[dtype] = max(_MEASURED.get(dtype, 0.0), round(measure_matmul_flops(dtype)))
    _MEASURED["bandwidth"] = max(_MEASURED.get("bandwidth", 0.0), round(measure_copy_bandwidth()))


def device_peaks(dtypes: tuple[str, ...] = ("float32",)) -> dict[str, Any]:
    """Peak FLOP/s per compute dtype and memory bandwidth of JAX's first device, and where they
    come from (measured once per process on a CPU)."""
    device = jax.devices()[0]
    kind = device.device_kind
    if device.platform == "cpu":
        peaks = {d: _measured(d) for d in dtypes}
        bandwidth = _measured("bandwidth")
        source = (
            "measured before and after each family, the best kept: repeated 1024 x 1024 matrix products (per "
            "dtype) and in-place passes over a 512 MiB float32 array (bytes read + written), all cores"
        )
    else:
        tables = {"bfloat16": flops_lib.PEAK_BF16_FLOPS, "float16": flops_lib.PEAK_BF16_FLOPS}
        peaks = {d: _lookup(tables.get(d, PEAK_F32_FLOPS), kind) for d in dtypes}
        bandwidth = _lookup(MEMORY_BANDWIDTH, kind)
        source = "data sheets (jaxnet/bench/roofline.py, jaxnet/flops.py): dense, no sparsity"
    return {
        "device": kind,
        "platform": device.platform,
        "peak_flops": peaks,
        "memory_bandwidth": bandwidth,
        "source": source,
    }


# ---------------------------------------------------------------------------------------------
# FLOPs and bytes of a compiled program


def _cost_dict(cost: Any) -> dict[str, float]:
    """``cost_analysis()`` as one dict (some JAX versions return a list with one dict per program)."""
    if isinstance(cost, list | tuple):
        cost = cost[0] if cost else {}
    return dict(cost or {})


def xla_cost(compiled: Any) -> dict[str, float]:
    """XLA's own ``flops`` and ``bytes accessed`` of a compiled program (loop bodies counted once)."""
    cost = _cost_dict(compiled.cost_analysis())
    return {"flops": float(cost.get("flops", 0.0)), "bytes": float(cost.get("bytes accessed", 0.0))}


_HEADER = re.compile(r"^(ENTRY )?(%[^\s(]+) \(.*\{\s*$")
_WHILE = re.compile(r"\bwhile\(.*?body=(%[^\s,]+)")
_TRIP = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')
_CALLS = re.compile(r"\b(?:calls|to_apply)=(%[^\s,]+)")


def _computations(text: str) -> tuple[dict[str, list[str]], str]:
    """The HLO module's computations (name -> instruction lines) and the entry's name."""
    comps: dict[str, list[str]] = {}
    entry, current = "", None
    for line in text.splitlines():
        header = _HEADER.match(line)
        if header:
            current = header.group(2)
            comps[current] = []
            entry = current if header.group(1) else entry
        elif line.startswith("}"):
            current = None
        elif current is not None:
            comps[current].append(line)
    return comps, entry


_NAME = re.compile(r"%[^\s,(){}]+")


def _pruned(text: str, entry: str) -> str:
    """The module ``text`` cut down to ``entry`` and the computations it reaches: what analysing one
    loop body needs. Parsing the whole module for every loop made a program of hundreds of loops
    (a 131,072-token ring, blockwise attention in every layer) take hours; this takes the body's size."""
    blocks: dict[str, list[str]] = {}
    head, current = [], None
    for line in text.splitlines():
        header = _HEADER.match(line)
        if header:
            current = header.group(2)
            blocks[current] = [line]
        elif current is not None:
            blocks[current].append(line)
            if line.startswith("}"):
                current = None
        elif not blocks:
            head.append(line)
    keep, todo = set(), [entry]
    while todo:
        name = todo.pop()
        if name in keep or name not in blocks:
            continue
        keep.add(name)
        todo.extend(n for line in blocks[name][1:] for n in _NAME.findall(line) if n in blocks)
    return "\n".join(head + [line for name, lines in blocks.items() if name in keep for line in lines]) + "\n"


def _module_cost(text: str, entry: str, client: Any) -> dict[str, float]:
    """XLA's cost analysis of the module ``text`` with computation ``entry`` made its entry (the
    module cut down to what ``entry`` reaches, :func:`_pruned`)."""
    from jax._src.lib import xla_client as xc  # no public API analyses one computation of a module

    text = _pruned(text, entry)
    text = re.sub(r"^HloModule ([^,\s]+).*$", r"HloModule \1", text, count=1, flags=re.M)
    text = re.sub(r"^ENTRY ", "", text, flags=re.M)
    text = re.sub(rf"^{re.escape(entry)} \(", f"ENTRY {entry} (", text, count=1, flags=re.M)
    parse = getattr(xc._xla, "hlo_module_from_text", None) or xc.hlo.hlo_module_from_text
    cost = _cost_dict(xc._xla.hlo_module_cost_analysis(client, parse(text)))
    return {"flops": float(cost.get("flops", 0.0)), "bytes": float(cost.get("bytes accessed", 0.0))}


def loop_extra(text: str, client: Any) -> tuple[dict[str, float], list[int]]:
    """FLOPs and bytes XLA's cost analysis leaves out of the module ``text`` by counting each loop
    body once: ``(n - 1)`` more passes over the body of every ``while`` with known trip count ``n``
    (nested loops included). Returns the missing amounts and the trip counts found."""
    comps, entry = _computations(text)
    trips: list[int] = []

    @functools.cache
    def extra(name: str) -> tuple[float, float]:
        flops = bytes_ = 0.0
        for line in comps.get(name, ()):
            loop = _WHILE.search(line)
            if loop:
                trip = _TRIP.search(line)
                if trip:
                    n, body = int(trip.group(1)), loop.group(1)
                    trips.append(n)
                    once = _module_cost(text, body, client)
                    inner = extra(body)
                    flops += (n - 1) * once["flops"] + n * inner[0]
                    bytes_ += (n - 1) * once["bytes"] + n * inner[1]
                continue
            for called in _CALLS.findall(line):
                inner = extra(called)
                flops, bytes_ = flops + inner[0], bytes_ + inner[1]
        return flops, bytes_

    flops, bytes_ = extra(entry)
    return {"flops": flops, "bytes": bytes_}, trips


@functools.cache
def xla_counts_loop_bodies_once() -> bool:
    """Whether this XLA's cost analysis counts a loop body once (checked on a 10-step scan)."""

    def ten_products(h: jax.Array, w: jax.Array) -> jax.Array:
        return jax.lax.scan(lambda c, _: (c @ w, None), h, None, length=10)[0]

    compiled = jax.jit(ten_products).lower(jnp.ones((8, 64)), jnp.ones((64, 64))).compile()
    return xla_cost(compiled)["flops"] < 0.5 * 10 * 2 * 8 * 64 * 64


def step_cost(compiled: Any) -> dict[str, Any]:
    """FLOPs and bytes of one run of a compiled program, every loop counted as often as it runs."""
    cost = xla_cost(compiled)
    out: dict[str, Any] = {"flops": cost["flops"], "bytes": cost["bytes"], "loop_trip_counts": []}
    if " while(" not in compiled.as_text():
        out["loops"] = "none"
        return out
    if not xla_counts_loop_bodies_once():
        out["loops"] = "counted by XLA"
        return out
    try:
        missing, trips = loop_extra(compiled.as_text(), jax.devices()[0].client)
    except Exception as e:  # an XLA without the (internal) per-computation analysis: say so, keep XLA's figures
        out["loops"] = f"each loop body counted once: no per-computation cost analysis here ({type(e).__name__})"
        return out
    out.update(flops=cost["flops"] + missing["flops"], bytes=cost["bytes"] + missing["bytes"], loop_trip_counts=trips)
    out["loops"] = "bodies counted once per iteration" if trips else "no known trip counts"
    return out


# ---------------------------------------------------------------------------------------------
# The roofline of one step


def point(flops: float, bytes_: float, steps_per_s: float | None, peak_flops: float | None, bandwidth: float | None):
    """Intensity, ridge point, verdict and fraction of the roofline of a step of ``flops`` and
    ``bytes_`` run ``steps_per_s`` times a second on a device of the given peaks."""
    intensity = flops / bytes_ if bytes_ else None
    out: dict[str, Any] = {"intensity": _round(intensity)}
    if peak_flops and bandwidth and intensity is not None:
        ridge = peak_flops / bandwidth
        attainable = min(peak_flops, intensity * bandwidth)
        out.update(
            ridge=_round(ridge),
            bound="memory-bound" if intensity < ridge else "compute-bound",
            attainable_flops=_round(attainable),
        )
        if steps_per_s:
            achieved = flops * steps_per_s
            out.update(achieved_flops=_round(achieved), fraction=_round(achieved / attainable))
    return out


def _round(x: float | None, digits: int = 4) -> float | None:
    """``x`` to ``digits`` significant digits."""
    if x is None or x == 0 or not np.isfinite(x):
        return x
    return float(f"{x:.{digits}g}")


def replace_peaks(case: dict[str, Any], peaks: dict[str, Any]) -> dict[str, Any]:
    """``case``'s roofline record placed against ``peaks`` (records measured in several processes,
    each with its own CPU measurement, merged under one)."""
    r = case["roofline"]
    peak = peaks["peak_flops"].get(case["dtype"])
    moved = point(r["flops_per_step"], r["bytes_per_step"], r.get("steps_per_s"), peak, peaks["memory_bandwidth"])
    return {**r, "peak_flops": peak, "memory_bandwidth": peaks["memory_bandwidth"], **moved}


def case_roofline(
    compiled: Any, model_flops: float, steps_per_s: float | None, dtype: str, peaks: dict[str, Any]
) -> dict[str, Any]:
    """The roofline record of one family's compiled step (see the module docstring)."""
    cost = step_cost(compiled)
    use_model = model_flops > cost["flops"]
    used = model_flops if use_model else cost["flops"]
    peak = peaks["peak_flops"].get(dtype)
    return {
        "flops_per_step": _round(used, 6),
        "flops_source": "analytic (above XLA's count: work inside kernels XLA cannot count)" if use_model else "xla",
        "flops_xla": _round(cost["flops"], 6),
        "flops_model": _round(model_flops, 6),
        "bytes_per_step": _round(cost["bytes"], 6),
        "loops": cost["loops"],
        "loop_trip_counts": cost["loop_trip_counts"],
        "steps_per_s": _round(steps_per_s),
        "peak_flops": peak,
        "memory_bandwidth": peaks["memory_bandwidth"],
        **point(used, cost["bytes"], steps_per_s, peak, peaks["memory_bandwidth"]),
    }


# ---------------------------------------------------------------------------------------------
# Table and plot


def table(cases: dict[str, dict[str, Any]], peaks: dict[str, Any]) -> str:
    """The roofline per family as plain text."""
    head = ("family", "dtype", "GFLOP/step", "MB/step", "FLOP/byte", "ridge", "verdict", "TFLOP/s", "of roofline")
    rows = [head]
    for name, c in cases.items():
        r = c["roofline"]
        rows.append(
            (
                name,
                c["dtype"],
                f"{r['flops_per_step'] / 1e9:.3f}",
                f"{r['bytes_per_step'] / 1e6:.1f}",
                f"{r['intensity']:.2f}" if r.get("intensity") else "-",
                f"{r['ridge']:.2f}" if r.get("ridge") else "-",
                r.get("bound", "-"),
                f"{r['achieved_flops'] / 1e12:.4f}" if r.get("achieved_flops") else "-",
                f"{100 * r['fraction']:.1f}%" if r.get("fraction") is not None else "-",
            )
        )
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(head))]
    lines = ["  ".join(str(v).ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    flops_txt = ", ".join(f"{d} {p / 1e12:.3g} TFLOP/s" for d, p in peaks["peak_flops"].items() if p)
    bandwidth = peaks["memory_bandwidth"]
    lines.append(
        f"peaks of {peaks['device']}: {flops_txt or 'unknown'}, memory "
        f"{f'{bandwidth / 1e9:.3g} GB/s' if bandwidth else 'unknown'} ({peaks['source']})"
    )
    return "\n".join(lines)


def plot(cases: dict[str, dict[str, Any]], peaks: dict[str, Any], path: Any, title: str = "") -> None:
    """A log-log roofline: the roof of each compute dtype and one point per family (achieved FLOP/s
    against arithmetic intensity), labelled with the fraction of the roofline reached."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bandwidth = peaks["memory_bandwidth"]
    points = {n: c for n, c in cases.items() if c["roofline"].get("intensity")}
    xs = [c["roofline"]["intensity"] for c in points.values()]
    known = [p for p in peaks["peak_flops"].values() if p]
    lo = min([*xs, *(p / bandwidth for p in known if bandwidth)] or [1.0]) / 10
    hi = max([*xs, *(p / bandwidth for p in known if bandwidth)] or [10.0]) * 10
    grid = np.geomspace(lo, hi, 200)
    fig, ax = plt.subplots(figsize=(7, 5))
    if bandwidth:
        for i, (dtype, peak) in enumerate(p for p in peaks["peak_flops"].items() if p[1]):
            ax.plot(grid, np.minimum(peak, grid * bandwidth), color=f"C{i}", lw=2, label=f"roof, {dtype}")
            ax.axvline(peak / bandwidth, color=f"C{i}", ls=":", lw=1)
    ax.plot([], [], "o", color="k", label="a family's step: achieved, % of its roof")
    for i, (name, c) in enumerate(points.items()):
        r = c["roofline"]
        if r.get("achieved_flops"):
            ax.plot(r["intensity"], r["achieved_flops"], "o", color="k")
            label = f"{name} {100 * r['fraction']:.0f}%" if r.get("fraction") is not None else name
            offset = (6, 4) if i % 2 == 0 else (6, -12)  # alternate sides: neighbouring points stay readable
            ax.annotate(
                label, (r["intensity"], r["achieved_flops"]), textcoords="offset points", xytext=offset, fontsize=9
            )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP per byte accessed)")
    ax.set_ylabel("FLOP/s")
    ax.grid(alpha=0.3, which="both")
    ax.legend(loc="lower right")
    ax.set_title(title or f"roofline: {peaks['device']}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)

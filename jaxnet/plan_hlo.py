"""Reading a compiled GPU program's text: the kernels it runs (cuDNN attention, gemm fusions, the
dtypes of its matrix products), the collectives and the links they cross, the kernel launches per
step and XLA's cost analysis (FLOPs, bytes) with every loop counted as often as it runs.

    >>> kernels(compiled.as_text())["cudnn_attention"]                    # doctest: +SKIP
    {'forward': 12, 'backward': 12}
"""

from __future__ import annotations

import functools
import math
import re
from collections import Counter
from typing import Any

import jax
import numpy as np

from jaxnet.bench import roofline
from jaxnet.plan_targets import Target, load_target  # noqa: F401  (load_target: link_seconds' example)

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


def attention_kernel(text: str, asked: str | None, packed: bool, why: str = "") -> dict[str, Any] | None:
    """Which attention kernel a compiled GPU step runs: cuDNN's fused attention (its custom calls,
    their mask type, and whether an additive bias goes in: how a mask such as packed rows' segments
    reaches it) or XLA's own softmax(QK^T)V. ``asked`` is ``model.attention`` as resolved for the
    GPU (None: a model without that key, whose attention is not reported); ``packed``: the batch
    carries ``segments``; ``why``: the model's reason for running no fused kernel, if it has one
    (soft-capped logits, a head size cuDNN is not given: ``TransformerConfig.unfused_because``), said with XLA's::

        attention_kernel(hlo_text, "xla", False, "model.attention_softcap=50 soft-caps the attention logits")
    """
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
        how = "XLA's softmax(QK^T)V (no cuDNN attention call" + (f": {why})" if why else ")")
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


def _dims(attribute: str, rest: str) -> list[int]:
    found = re.search(attribute + r"=\{([\d,]*)\}", rest)
    return _ints(found.group(1)) if found else []


def matmul_flops(text: str) -> dict[str, float]:
    """FLOPs of the matrix products of a compiled GPU program per execution, by the dtype of their
    first operand (``f8e4m3fn``, ``f8e5m2``, ``bf16``, ...): each ``dot`` (inside a gemm fusion or
    not) ``2 x`` its result's elements ``x`` its contracted size, and each cuBLAS call likewise from
    its ``dot_dimension_numbers``, every fusion counted as often as the computation that runs it,
    loop bodies their known trip count (once when unknown). What a float8 plan's compute bound
    takes at the float8 peak (XLA's cost analysis gives one total, not the dtypes).

    >>> matmul_flops(compiled.as_text())  # doctest: +SKIP
    {'bf16': 4.1e9, 'f8e4m3fn': 2.2e10, 'f8e5m2': 2.2e10}
    """
    comps, entry = roofline._computations(text)
    flops: Counter = Counter()

    def visit(name: str, times: int) -> None:
        insts = _instructions("\n".join(comps.get(name, ())))
        types = {n: result for n, result, _, _ in insts}
        for _, result, op, rest in insts:
            if op == "while":
                loop, trip = _LOOP.search(rest), roofline._TRIP.search(rest)
                if loop:
                    visit(loop.group(2), times * (int(trip.group(1)) if trip else 1))
            elif op in ("fusion", "call", "async-start"):
                called = _CALLED.search(rest)
                if called:
                    visit(called.group(1), times)
            elif op == "conditional":
                found = _BRANCHES.search(rest)
                if found:
                    names = re.findall(r"%[\w.\-]+", found.group(1)) if found.group(1) else list(found.groups()[1:])
                    for branch in names[:1]:
                        visit(branch, times)
            elif op == "dot" or (op == "custom-call" and '"__cublas' in rest):
                operands = _operand_types(rest, types)
                out = _ARRAY.findall(result)
                if not operands or not out:
                    continue
                lhs = [int(d) for d in operands[0][1].split(",") if d]
                if op == "dot":
                    contracted = _dims("lhs_contracting_dims", rest)
                else:
                    found = re.search(r'"lhs_contracting_dimensions":\[([^\]]*)\]', rest)
                    contracted = [int(d) for d in re.findall(r"\d+", found.group(1))] if found else []
                size = math.prod(lhs[d] for d in contracted if d < len(lhs))
                elements = math.prod(int(d) for d in out[0][1].split(",") if d)
                flops[operands[0][0]] += 2.0 * elements * size * times

    visit(entry, 1)
    return dict(sorted(flops.items()))


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

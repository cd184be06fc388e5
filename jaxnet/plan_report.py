"""The plan as text for the terminal: one paragraph of lines, each a part of the report
(memory, FLOPs, the expected and predicted steps, input, processes, the goal, kernels, attention,
communication, compile time, the largest batch, warnings).

    >>> print(describe(jaxnet.plan(cfg, "h100")))                          # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any

from jaxnet import parallel
from jaxnet.plan_estimate import CAVEATS


def _gib(n: float | None) -> str:
    return "-" if n is None else parallel.size(n)


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{1e3 * seconds:.3g} ms"


def _us(seconds: float | None) -> str:
    return "-" if seconds is None else f"{1e6 * seconds:.3g} us"


def _flop(n: float) -> str:
    """A count of floating-point operations in units a reader takes in at once: ``427.6 TFLOP``.

    >>> _flop(427638.468e9), _flop(2.5e6), _flop(0)
    ('427.6 TFLOP', '2.5 MFLOP', '0 FLOP')
    """
    for power, prefix in ((18, "E"), (15, "P"), (12, "T"), (9, "G"), (6, "M"), (3, "k")):
        if abs(n) >= 10**power:
            return f"{n / 10**power:.4g} {prefix}FLOP"
    return f"{n:.4g} FLOP"


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
    spread = p.get("expected_spread")  # absent from plans recorded before it was
    within = ""
    if spread:
        low, high = 100 * spread["low"], 100 * spread["high"]
        within = f" (against {spread['runs']} published runs: {low:+.0f} % .. {high:+.0f} % of their measured step)"
    return [
        f"  EXPECTED step {_ms(p['expected_step_s'])}{within} = the bound's work / {p['efficiency']:.3g} "
        "(the efficiency "
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


def _context_line(report: dict[str, Any]) -> list[str]:
    c = report.get("context")
    if not c:
        return []
    compiled = ", ".join(
        f"{kind} {_gib(found['bytes'])} ({_ms(found['seconds'])})" for kind, found in c["compiled"].items() if found
    )
    return [
        f"  context parallelism: mesh.context={c['ways']}, {c['attention']} attention, {c['tokens_per_device']:,} "
        f"tokens of a micro-batch on a device; predicted {_gib(c['predicted_bytes'])} a step (attention forward "
        f"{_gib(c['per_layer_forward_bytes'])} x {c['attention_forwards']} and backward "
        f"{_gib(c['per_layer_backward_bytes'])} a layer, reordering {_gib(c['restore_bytes'])}); compiled: "
        f"{compiled or 'none'}"
    ]


def _parameters(report: dict[str, Any]) -> str:
    """``N parameters`` (billions or millions), with how many each token computes with where fewer (experts)."""
    total, active = report.get("parameters") or 0, report.get("active_parameters")
    size = lambda n: f"{n / 1e9:.2f} B" if n >= 1e9 else f"{n / 1e6:.1f} M"  # noqa: E731
    return f"{size(total)} parameters" + (f" ({size(active)} active a token)" if active and active < total else "")


def _loss(report: dict[str, Any]) -> str:
    """Where the plan's training loss comes from (plans recorded before it was said: nothing)."""
    loss = report.get("loss")
    if loss is None:
        return ""
    return "; the loss blockwise, the whole logits never held" if loss == "blockwise" else "; the loss from the logits"


def describe(report: dict[str, Any]) -> str:
    """The plan as a few lines of text for the terminal."""
    m, f, p, k = report["memory"], report["flops_per_step"], report["prediction"], report["kernels"]
    mesh = " x ".join(f"{a}={n}" for a, n in report["mesh"].items())
    verdict = "fits" if report["fits"] else "DOES NOT FIT"
    lines = [
        f"{report['experiment'] or 'run'} on {report['gpus']} x {report['device_kind']} (mesh {mesh}), batch "
        f"{report['batch_size']}, {report['compute_dtype']}, {_parameters(report)}: {verdict} "
        f"({_gib(m['total'])} of {_gib(m['device'])} per device; usable with 10 % headroom {_gib(m['usable'])})"
        + _loss(report),
        f"  memory per device: arguments {_gib(m['arguments'])} (parameters {_gib(m['params'])}"
        + (f", frozen base {_gib(m['frozen_base'])}" if m.get("frozen_base") else "")
        + f", optimizer state "
        f"{_gib(m['opt_state'])}, batch {_gib(m['batch'])}), outputs {_gib(m['outputs'])} "
        f"({_gib(m['aliased'])} donated), temp {_gib(m['temp'])}; cuDNN workspaces not counted",
        f"  FLOPs per step per device {_flop(f['per_device'])} from {f['source']} (XLA "
        f"{_flop(f['xla_cost_analysis'])}, cuDNN attention {_flop(f['cudnn_attention_by_formula'])}); "
        "jaxnet.flops "
        + (f"{_flop(f['jaxnet_flops_py'])} for all devices" if f["jaxnet_flops_py"] else "n/a")
        + (
            f"; float8 products {_flop(f['fp8'])} (at the float8 peak, "
            f"{(p.get('peak_fp8_flops') or 0) / 1e12:.0f} TFLOP/s)"
            if f.get("fp8")
            else ""
        )
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
        *_context_line(report),
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


def _processes_line(report: dict[str, Any]) -> list[str]:
    layout = report.get("processes")
    if layout is None:  # a report written before the layout was planned
        return []
    tensor = report["mesh"].get("tensor", 1)
    where = "inside a host" if layout["tensor_within_host"] else "ACROSS hosts (slow links): use a smaller mesh.tensor"
    ways = report["mesh"].get("context", 1)
    ring = ""
    if ways > 1 and "context_within_host" in layout:
        ring = f"; mesh.context={ways} groups " + (
            "inside a host"
            if layout["context_within_host"]
            else "ACROSS hosts (slow links): use a smaller mesh.context"
        )
    return [
        f"  processes: either {layout['per_host']['processes']} (one per host: srun {layout['per_host']['srun']}) "
        f"or {layout['per_gpu']['processes']} (one per GPU: srun {layout['per_gpu']['srun']}); "
        f"mesh.tensor={tensor} groups {where}{ring} (see docs/cluster.md)"
    ]

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

This module builds and compiles the run; the plan's other jobs are modules of their own, whose
public names are importable from here too: :mod:`jaxnet.plan_targets` (the GPU kinds and their
topology), :mod:`jaxnet.plan_hlo` (reading the compiled program), :mod:`jaxnet.plan_estimate`
(bounds, the expected step, the goal, calibration, warnings) and :mod:`jaxnet.plan_report` (the
text the command prints).
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import math
import time
from pathlib import Path
from typing import Any

import flax.linen as nn
import jax
import numpy as np

from jaxnet import flops as flops_lib
from jaxnet import models, parallel, tasks
from jaxnet.config import Config
from jaxnet.errors import UserError
from jaxnet.models.adapters import lora

# The plan's parts, importable from here as before they were split out.
from jaxnet.plan_estimate import (  # noqa: F401
    CALIBRATION_KIND,
    CAVEATS,
    FIT_FILE,
    MAX_EPOCHS,
    SMALL_BATCH_FACTOR,
    USUAL_BATCH_TOKENS,
    _train_size,
    apply_calibration,
    check_goal,
    expectation,
    expected_step,
    fit_efficiency,
    goal,
    hosts_for,
    input_rate,
    load_calibration,
    load_fit,
    plan_warnings,
    process_layout,
    solve_efficiency,
    step_bound,
    usual_batch,
)
from jaxnet.plan_hlo import (  # noqa: F401
    COLLECTIVES,
    NO_LAUNCH,
    RING,
    attention_flops,
    attention_kernel,
    communication,
    hlo_cost,
    kernels,
    launches,
    link_seconds,
    matmul_flops,
    replica_groups,
)
from jaxnet.plan_report import _input_line, _processes_line, describe  # noqa: F401
from jaxnet.plan_targets import (  # noqa: F401
    INSTALL,
    REQUIRED,
    Target,
    gpus_per_node,
    jax_has_plugin,
    load_target,
    plan_dir,
    plugin_missing,
    targets,
    topology,
)
from jaxnet.train.loop import Run

HEADROOM = 0.10  # a plan fits when it leaves this fraction of the device's memory free
JAX_DEFAULT_POOL = 0.75  # JAX preallocates this fraction of a GPU's memory unless told otherwise


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


def mfu_peak(peak: float | None, fp8_peak: float | None, fp8_share: float) -> float | None:
    """The peak MFU is taken against: ``peak`` (the compute dtype's), or where a share ``fp8_share``
    of the FLOPs are float8 products, the rate at which each precision's share runs at its own peak.

    >>> mfu_peak(989e12, 1979e12, 0.0), round(mfu_peak(989e12, 1979e12, 1.0) / 1e12)
    (989000000000000.0, 1979)
    """
    if not peak or not fp8_peak or not fp8_share:
        return peak
    return 1.0 / ((1.0 - fp8_share) / peak + fp8_share / fp8_peak)


def step_figures(run: Run, text: str, rows: int, tgt: Target, gpus: int, per_node: int) -> dict[str, Any]:
    """What the compiled train step ``text`` of ``run`` (at ``rows`` rows, on ``gpus`` GPUs of ``tgt``,
    ``per_node`` to a node) costs: FLOPs per device (XLA's, cuDNN attention's by formula, or
    jaxnet.flops' where larger), the float8 products' share, the compute, memory, launch and
    communication bounds and which one the predicted step is."""
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
    dtype = getattr(getattr(run.model, "module", None), "dtype", None) or getattr(run.cfg.model, "dtype", "float32")
    dtype = np.dtype(dtype).name if not isinstance(dtype, str) else dtype
    dtype = models.resolve(run.cfg.model, "cuda").dtype if dtype == "auto" else dtype
    peak = tgt.peak_flops(dtype)
    by_dtype = matmul_flops(text)
    fp8 = sum(f for d, f in by_dtype.items() if d.startswith("f8"))
    fp8_peak = tgt.peak_flops("float8") if fp8 else None
    # float8 products at the float8 peak, the rest at the compute dtype's
    compute_s = (flops_device - fp8) / peak + (fp8 / fp8_peak if fp8_peak else fp8 / peak) if peak else None
    memory_s = cost["bytes"] / tgt.bandwidth
    launched = launches(text)
    launch_s = launched["total"] * tgt.launch_overhead if tgt.launch_overhead else None
    comm = communication(text, [d.process_index for d in run.mesh.devices.flat], tgt)
    comm.update(nodes=gpus // per_node, gpus_per_node=per_node)
    bound, step_s = step_bound(compute_s, memory_s, launch_s, comm["seconds"])
    return {
        "cost": cost,
        "attention": attention,
        "flops": flops_device,
        "analytic": analytic,
        "source": source,
        "dtype": dtype,
        "peak": peak,
        "by_dtype": by_dtype,
        "fp8": fp8,
        "fp8_peak": fp8_peak,
        "compute_s": compute_s,
        "memory_s": memory_s,
        "launched": launched,
        "launch_s": launch_s,
        "comm": comm,
        "bound": bound,
        "step_s": step_s,
    }


def context_traffic(run: Run, rows: int, packed: bool, comm: dict[str, Any]) -> dict[str, Any] | None:
    """What splitting each row's sequence over ``mesh.context`` sends from one device in a train step
    of ``rows`` rows (``packed``: with segment ids), predicted from the Transformer's shapes
    (:mod:`jaxnet.models.transformer.context`), beside what the compiled program's collectives of
    that kind carry (``comm``, :func:`communication`, whose seconds are in the communication bound).
    Bytes are each collective's full buffer, as :func:`communication` counts them. None without a
    context axis or a Transformer.

    A ring sends a device's keys and values (and segment ids) on ``C - 1`` times in each forward
    pass of an attention layer, and in its backward pass the keys and values again ``C - 2`` times
    (XLA reuses the first transfer of the forward pass that runs before it) and their gradients
    ``C`` times (float32, the last in the compute dtype); gathered, the keys and
    values are all-gathered in each pass and their gradients reduce-scattered. Putting the hidden
    states back in order sends them once in the forward pass and once in the backward pass
    (``collective-permute`` either way). With ``model.remat`` other than ``none`` and ``minimal`` the
    forward pass of attention runs twice.

    >>> cfg = load_experiment("llama3_8b", ["mesh.context=8", "data.seq_len=131072"])  # doctest: +SKIP
    >>> plan(cfg, "h100", 8)["context"]["predicted_bytes"]  # doctest: +SKIP
    """
    from jaxnet.models.transformer import context

    ways = run.mesh.shape.get("context", 1)
    spec = getattr(getattr(run.model, "module", None), "spec", None)
    if ways == 1 or spec is None:
        return None
    length, accum = run.cfg.data.seq_len, run.cfg.optim.grad_accum
    how = context.strategy(spec.context_attention, length, ways)
    tensor = run.mesh.shape.get("tensor", 1)
    kv_heads = (spec.kv_heads if spec.kv_heads % tensor == 0 else spec.heads) // tensor
    tokens = rows // accum // parallel.batch_devices(run.mesh) * (length // ways)  # one micro-batch's
    item = np.dtype(spec.dtype).itemsize
    wide = np.dtype(np.promote_types(spec.dtype, np.float32)).itemsize
    values = 2 * tokens * kv_heads * spec.head_dim
    held = values * item + (4 * tokens if packed else 0)
    forwards = 1 if spec.remat in ("none", "minimal") else 2
    if how == "ring":
        forward, backward = (ways - 1) * held, (ways - 2) * held + (ways - 1) * values * wide + values * item
        kinds = {"collective-permute": None}
    else:
        forward, backward = ways * held, ways * held + ways * values * wide
        kinds = {"all-gather": None, "reduce-scatter": None, "collective-permute": None}
    restore = 2 * context.restore_moves(ways) * tokens // 2 * spec.width * item  # forward and backward
    per_step = accum * (spec.layers * (forwards * forward + backward) + restore)
    for kind in kinds:
        found = comm["by_kind"].get(kind)
        kinds[kind] = {"bytes": found["bytes"], "seconds": found["seconds"]} if found else None
    return {
        "ways": ways,
        "attention": how,
        "tokens_per_device": tokens,
        "attention_forwards": forwards,
        "per_layer_forward_bytes": forward,
        "per_layer_backward_bytes": backward,
        "restore_bytes": restore,
        "predicted_bytes": per_step,
        "compiled": kinds,
        "note": "predicted_bytes: context parallelism's collectives of one step by the model's shapes (per device, "
        "each collective's full buffer); compiled: all the collectives of those kinds in the compiled step "
        + (
            "(the ring and the reordering are its only collective-permutes)"
            if how == "ring"
            else "(the gathers "
            "of FSDP are all-gathers and reduce-scatters too; the reordering is its only collective-permutes)"
        ),
    }


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

    An experiment's default corpus that is not prepared yet is prepared for the plan in a
    temporary directory (:func:`jaxnet.data.tokens.prepared_in`), never where training would put it.
    """
    import tempfile

    from jaxnet.data import tokens as tokens_lib

    goal_of = dict(tokens=tokens, epochs=epochs, price=price, calibrate=calibrate, nodes=nodes, say=say)
    with tempfile.TemporaryDirectory(prefix="jaxnet-plan-") as scratch, tokens_lib.prepared_in(scratch):
        return _plan(cfg, target, gpus, model=model, dataset=dataset, task=task, max_batch=max_batch, **goal_of)


def _plan(
    cfg: Config,
    target: str,
    gpus: int | None,
    *,
    model: nn.Module | None,
    dataset: Any,
    task: tasks.Task | None,
    max_batch: bool,
    tokens: float | None,
    epochs: float | None,
    price: float | None,
    calibrate: str | Path | None,
    nodes: int | None,
    say: Any,
) -> dict[str, Any]:
    """:func:`plan`, its corpus (if it prepares one) in a temporary directory."""
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

    f = step_figures(run, text, rows, tgt, gpus, per_node)
    cost, attention, flops_device, analytic, source = f["cost"], f["attention"], f["flops"], f["analytic"], f["source"]
    dtype, peak, by_dtype, fp8, fp8_peak = f["dtype"], f["peak"], f["by_dtype"], f["fp8"], f["fp8_peak"]
    compute_s, memory_s, launch_s, comm = f["compute_s"], f["memory_s"], f["launch_s"], f["comm"]
    launched, bound, step_s = f["launched"], f["bound"], f["step_s"]
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
        "active_parameters": planned.model.active_parameters(state.params) if run.lora is None else None,
        **(
            {"lora": dataclasses.asdict(run.lora), "frozen_parameters": _count(state.model_state[lora.BASE])}
            if run.lora is not None
            else {}
        ),
        "compute_dtype": dtype,
        "loss": "blockwise" if run.blockwise_loss else "logits",
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
            "matmuls_by_dtype": by_dtype,
            "fp8": fp8,
            "note": "XLA's HLO cost analysis of the compiled per-device program, plus cuDNN's fused attention "
            "counted from its operand shapes (XLA counts none inside it); jaxnet_flops_py counts matrix "
            "products only, for all devices; matmuls_by_dtype: the matrix products' FLOPs by the dtype of their "
            "first operand, fp8: those of float8 operands (at the float8 peak in the compute bound)",
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
            "peak_fp8_flops": fp8_peak,
            # MFU's peak: the compute dtype's, or with float8 products the peak of each precision in
            # the proportion of the FLOPs it runs (a float8 plan at its bound is 100 %, not 200 %)
            "mfu_peak_flops": mfu_peak(peak, fp8_peak, fp8 / flops_device if flops_device else 0.0),
            "memory_bandwidth": tgt.bandwidth,
            "examples_per_s": rows / step_s if step_s else None,
            "tokens_per_s": per_step_tokens / step_s if per_step_tokens and step_s else None,
            "mfu_bound": analytic / step_s / (mfu_peak(peak, fp8_peak, fp8 / flops_device) * gpus)
            if analytic and peak and step_s
            else None,
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
            text,
            getattr(models.resolve(run.cfg.model, "cuda"), "attention", None),
            "segments" in first,
            getattr(run.cfg.model, "unfused_because", lambda: "")(),  # capped logits or a wide head: why not cuDNN
        ),
        "compile_s": round(compile_s, 2),
        "eval_compile_s": round(eval_s, 2),
        "versions": _versions(),
        "target_source": tgt.source,
        "caveats": notes + CAVEATS,
    }
    report["prediction"].update(expectation(report, load_fit()))
    traffic = context_traffic(run, rows, "segments" in first, comm)
    if traffic is not None:
        report["context"] = traffic
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

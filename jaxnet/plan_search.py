"""Searching plans: for a target and a GPU count, the largest batch and the recomputation policy
(and the mesh split, among those allowed) with the best expected tokens per second that fits.

For each allowed mesh and each policy (``model.remat``) the train step is compiled for the target
(deviceless, as :func:`jaxnet.planner.plan` does) at two batch sizes; memory grows with the batch
by a near constant amount per row, so the line through the two gives the largest batch that should
fit with 10 % headroom, which is compiled to confirm (stepping down, or up, a multiple of the
data-parallel size at a time until it fits and the next does not). Each candidate's expected step
(:func:`jaxnet.plan_estimate.expected_step`) at every size compiled that fits gives its tokens per
second, and the fastest is the candidate's (often the largest, not always: a program squeezed into
memory may recompute);
the best is the answer and the others are its runner-up rows, each with its memory, FLOPs per
token and what recomputation adds to them (against ``none`` on the same mesh), and the compile
time spent::

    >>> found = search(load_experiment("llama3_8b", ["mesh.fsdp=8"]), "h100", 8)   # doctest: +SKIP
    >>> found["best"]["remat"], found["best"]["batch_size"]                          # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from typing import Any

import flax.linen as nn

from jaxnet import parallel, tasks
from jaxnet.config import Config, apply_overrides
from jaxnet.errors import UserError
from jaxnet.models.common import REMAT
from jaxnet.plan_estimate import expected_step, load_fit
from jaxnet.plan_targets import gpus_per_node, load_target, topology
from jaxnet.planner import HEADROOM, _compile_train, _dividing_batch, _for_gpu, _memory, gpus_for, step_figures
from jaxnet.train.loop import Run

MAX_COMPILES = 8  # per candidate (mesh and policy): two to draw the line, the rest to find and confirm


def parse_mesh(text: str) -> dict[str, int]:
    """``data=2,fsdp=4`` -> ``{"data": 2, "fsdp": 4}``; a one-line :class:`UserError` when it is not such a list.

    >>> parse_mesh("data=2,fsdp=4")
    {'data': 2, 'fsdp': 4}
    """
    out = {}
    for item in filter(None, (s.strip() for s in text.split(","))):
        axis, sep, size = item.partition("=")
        if not sep or axis not in parallel.AXES or not size.lstrip("-").isdigit():
            raise UserError(
                f"--mesh {text}: give axis=size pairs of the mesh axes {', '.join(parallel.AXES)}, e.g. --mesh fsdp=8"
            )
        out[axis] = int(size)
    if not out:
        raise UserError("--mesh: give axis=size pairs, e.g. --mesh data=2,fsdp=4")
    return out


def largest_multiple(
    memory_at: Callable[[int], float], start: int, usable: float, most: int = MAX_COMPILES
) -> tuple[int | None, int | None]:
    """The largest multiple ``k`` of the data-parallel size whose memory (``memory_at(k)``, one
    compile each, asked at most ``most`` times) is within ``usable``, and the smallest known not to
    be (None when not reached). From ``start`` (halved until it fits), then ``2 x`` it: the line
    through the two guesses the answer; once a size is known not to fit, the next sizes alternate
    between the secant of the two sizes around the limit and the middle between them, until one
    fits and the next does not. ``(None, k)`` when not even one fits.

    >>> largest_multiple(lambda k: 100 + 10 * k, 2, 175)   # fits up to k = 7
    (7, 8)
    """
    seen: dict[int, float] = {}

    def fits(k: int) -> bool:
        if k not in seen:
            seen[k] = memory_at(k)
        return seen[k] <= usable

    low = max(start, 1)
    while not fits(low):
        if low == 1 or len(seen) >= most:
            return None, low
        low //= 2
    first, high = low, None
    if fits(2 * first):
        low = 2 * first
    else:
        high = 2 * first
    per_multiple = (seen[2 * first] - seen[first]) / first
    guess = low + 1 if per_multiple <= 0 else int(first + (usable - seen[first]) // per_multiple)
    probes = 0
    while len(seen) < most and (high is None or high - low > 1):
        if high is None:
            step = max(guess, low + 1)
        elif probes % 2:  # every other probe halves the interval: memory need not be a line (XLA
            step = (low + high) // 2  # rematerialises, reschedules), so the secant alone can crawl
        else:  # the secant between the largest size that fits and the smallest that does not
            slope = (seen[high] - seen[low]) / (high - low)
            step = int(low + (usable - seen[low]) // slope) if slope > 0 else (low + high) // 2
            step = min(max(step, low + 1), high - 1)
        probes += 1
        if fits(step):
            low = step
            guess = step + 1 if per_multiple <= 0 else int(step + (usable - seen[step]) // per_multiple) + 0
            guess = max(guess, step + 1)
        else:
            high = step
    return low, high


def _with(cfg: Config, mesh: dict[str, int] | None, remat: str, rows: int | None = None) -> Config:
    """``cfg`` with ``mesh`` (the axes it does not name at 1), ``model.remat=remat`` where the model
    has the key, and ``rows`` as its batch."""
    keys = [f"model.remat={remat}"] if hasattr(cfg.model, "remat") else []
    keys += [f"mesh.{a}={n}" for a, n in (mesh or {}).items()]
    if mesh:  # the axes not named are 1 (the mesh is the one given, not merged with the config's)
        keys += [f"mesh.{a}=1" for a in parallel.AXES if a not in mesh]
    if rows is not None:
        keys.append(f"train.batch_size={rows}")
    return apply_overrides(cfg, keys)


def _candidate(
    cfg: Config,
    tgt: Any,
    gpus: int,
    per_node: int,
    devices: list,
    build: dict[str, Any],
    efficiency: float | None,
    say: Any,
) -> dict[str, Any]:
    """The largest batch of ``cfg`` (its mesh and policy) that fits ``tgt``, and its expected speed."""
    cfg = _dividing_batch(cfg, devices)
    usable = tgt.memory_bytes * (1 - HEADROOM)
    unit = parallel.batch_devices(parallel.make_mesh(cfg.mesh, devices)) * cfg.optim.grad_accum
    tried: dict[int, dict[str, Any]] = {}
    seconds = 0.0

    def compile_at(rows: int) -> dict[str, Any]:
        nonlocal seconds
        if rows not in tried:
            sized = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, batch_size=rows))
            run = Run(sized, devices=devices, backend="cuda", **build)
            first = next(iter(run.train_batches(0)))
            compiled, state, batch, spent = _compile_train(run, first, rows)
            seconds += spent
            memory = _memory(compiled, state, batch, tgt.memory_bytes)
            text = compiled.as_text() if memory["total"] <= usable else None
            tried[rows] = {"memory": memory, "run": run, "text": text}
            policy = getattr(cfg.model, "remat", "-")
            say(f"  remat={policy} batch {rows}: {memory['total'] / 2**30:.2f} GiB ({spent:.0f} s)")
        return tried[rows]

    found, high = largest_multiple(
        lambda multiple: compile_at(multiple * unit)["memory"]["total"], max(cfg.train.batch_size // unit, 1), usable
    )
    if found is None:
        return {"fits": False, "tried": {r: t["memory"]["total"] for r, t in tried.items()}, "compile_s": seconds}

    def rate(rows: int) -> tuple[float, dict, float | None]:
        """Examples a second expected at ``rows`` (a compiled size), its step figures and expected step."""
        f = step_figures(tried[rows]["run"], tried[rows]["text"], rows, tgt, gpus, per_node)
        prediction = {"compute_s": f["compute_s"], "memory_s": f["memory_s"], "launch_s": f["launch_s"]}
        expected = expected_step(prediction, f["comm"], efficiency)["expected_step_s"] if efficiency else None
        return rows / (expected or f["step_s"]), f, expected

    # Every size compiled that fits is a candidate: the largest is not always the fastest (XLA may
    # recompute inside a program it must squeeze, at a cost per token the smaller size does not pay)
    fitting = {r: rate(r) for r, t in tried.items() if t["memory"]["total"] <= usable}
    rows = max(fitting, key=lambda r: fitting[r][0])
    _, f, expected = fitting[rows]
    run = tried[rows]["run"]
    step_s = expected or f["step_s"]
    tokens = rows * cfg.data.seq_len if run.text else None
    return {
        "fits": True,
        "largest_batch_size": found * unit,
        "sizes_fitting": {r: round(fitting[r][0] * (cfg.data.seq_len if run.text else 1), 1) for r in sorted(fitting)},
        "batch_size": rows,
        "multiple_of": unit,
        "next_size": high * unit if high is not None else None,
        "memory": tried[rows]["memory"]["total"],
        "memory_at_next": tried[high * unit]["memory"]["total"] if high is not None and high * unit in tried else None,
        "flops_per_device": f["flops"],
        "flops_per_token": f["flops"] * gpus / tokens if tokens else None,
        "fp8_flops": f["fp8"],
        "bound": f["bound"],
        "predicted_step_s": f["step_s"],
        "expected_step_s": expected,
        "tokens_per_s": tokens / step_s if tokens else None,
        "examples_per_s": rows / step_s,
        "compiles": len(tried),
        "compile_s": round(seconds, 1),
        "tried": {r: t["memory"]["total"] for r, t in sorted(tried.items())},
    }


def search(
    cfg: Config,
    target: str = "h100",
    gpus: int | None = None,
    *,
    policies: tuple[str, ...] | None = None,
    meshes: list[dict[str, int]] | None = None,
    model: nn.Module | None = None,
    dataset: Any = None,
    task: tasks.Task | None = None,
    nodes: int | None = None,
    say: Any = None,
) -> dict[str, Any]:
    """The largest ``train.batch_size``, recomputation policy (``policies``: names of
    :data:`jaxnet.models.common.REMAT`; default all of them) and mesh (``meshes``, each a dict of
    axis sizes; default the config's) whose train step fits ``gpus`` GPUs of ``target`` with the
    best expected tokens per second. Returns ``{"best", "runners_up", "candidates", "compile_s",
    "compiles"}``; each candidate says its mesh, policy, batch, memory, FLOPs per token and
    ``recompute_flops_per_token`` (what its policy adds to ``none``'s on the same mesh, when
    ``none`` was searched), the expected (and predicted) step and tokens per second.

    >>> search(load_experiment("gpt2_small"), "h100", 1, policies=("none", "full"))["best"]  # doctest: +SKIP

    As :func:`jaxnet.plan`, a default corpus not prepared yet is prepared in a temporary directory.
    """
    import tempfile

    from jaxnet.data import tokens as tokens_lib

    given = dict(policies=policies, meshes=meshes, model=model, dataset=dataset, task=task, nodes=nodes, say=say)
    with tempfile.TemporaryDirectory(prefix="jaxnet-plan-") as scratch, tokens_lib.prepared_in(scratch):
        return _search(cfg, target, gpus, **given)


def _search(
    cfg: Config,
    target: str,
    gpus: int | None,
    *,
    policies: tuple[str, ...] | None,
    meshes: list[dict[str, int]] | None,
    model: nn.Module | None,
    dataset: Any,
    task: tasks.Task | None,
    nodes: int | None,
    say: Any,
) -> dict[str, Any]:
    """:func:`search`, its corpus (if it prepares one) in a temporary directory."""
    say = say or (lambda line: None)
    tgt = load_target(target)
    if not hasattr(cfg.model, "remat"):  # a family without recomputation policies: batch and mesh only
        if policies and tuple(policies) != ("none",):
            raise UserError(f"--policies: model {cfg.model.name} has no model.remat to choose; leave --policies out")
        policies = ("none",)
    policies = tuple(policies or REMAT)
    unknown = [p for p in policies if p not in REMAT]
    if unknown:
        raise UserError(f"--policies {','.join(policies)}: {unknown[0]!r} is not one of {', '.join(REMAT)}")
    fit = load_fit()
    efficiency = fit["efficiency"] if fit else None
    build = {"model": model, "dataset": dataset, "task": task}
    started = time.perf_counter()
    candidates = []
    for mesh in meshes or [None]:
        base = _with(cfg, mesh, policies[0]) if mesh else cfg
        count = gpus_for(base, gpus)
        per_node = gpus_per_node(tgt, count, nodes)
        devices = list(topology(target, count, nodes).devices)
        laid = dict(parallel.mesh_shape(base.mesh, count))
        for policy in policies:
            say(f"searching mesh {' x '.join(f'{a}={n}' for a, n in laid.items())}, model.remat={policy} ...")
            planned, _ = _for_gpu(_with(cfg, mesh, policy), model is not None)
            found = _candidate(planned, tgt, count, per_node, devices, build, efficiency, say)
            candidates.append({"mesh": laid, "remat": policy, **found})
    for c in candidates:
        none = next((o for o in candidates if o["mesh"] == c["mesh"] and o["remat"] == "none" and o["fits"]), None)
        if c["fits"] and none and c.get("flops_per_token") and none.get("flops_per_token"):
            c["recompute_flops_per_token"] = c["flops_per_token"] - none["flops_per_token"]
            c["recompute_fraction"] = c["recompute_flops_per_token"] / none["flops_per_token"]
    ranked = sorted(
        (c for c in candidates if c["fits"]),
        key=lambda c: -(c["tokens_per_s"] or c["examples_per_s"]),
    )
    if not ranked:
        raise UserError(
            f"no searched configuration fits {gpus_for(cfg, gpus)} x {tgt.device_kind}, not even one row a device; "
            "allow more GPUs, another mesh (--mesh) or another policy (--policies)"
        )
    return {
        "target": target,
        "device_kind": tgt.device_kind,
        "experiment": cfg.experiment,
        "best": ranked[0],
        "runners_up": ranked[1:],
        "candidates": candidates,
        "policies": list(policies),
        "efficiency": efficiency,
        "compiles": sum(c.get("compiles", len(c.get("tried", {}))) for c in candidates),
        "compile_s": round(sum(c["compile_s"] for c in candidates), 1),
        "wall_s": round(time.perf_counter() - started, 1),
        "label": "the tokens/s are EXPECTED (jaxnet plan's bound over the efficiency fitted on published runs) at "
        "each candidate's largest batch that fits with 10 % headroom, not measured",
    }


def describe(found: dict[str, Any]) -> str:
    """The search as lines for the terminal: the best configuration first, then the runners-up."""

    def row(c: dict[str, Any]) -> str:
        mesh = " x ".join(f"{a}={n}" for a, n in c["mesh"].items() if n > 1) or "one device"
        if not c["fits"]:
            return f"  {mesh}, model.remat={c['remat']}: does not fit at any batch"
        rate = f"{c['tokens_per_s']:,.0f} tokens/s" if c["tokens_per_s"] else f"{c['examples_per_s']:,.0f} examples/s"
        step = c["expected_step_s"] or c["predicted_step_s"]
        extra = (
            f", recompute +{100 * c['recompute_fraction']:.0f} % FLOPs"
            if c.get("recompute_fraction") is not None
            else ""
        )
        nxt = f"; {c['next_size']} does not fit" if c.get("next_size") else ""
        return (
            f"  {mesh}, model.remat={c['remat']}: batch {c['batch_size']} ({c['memory'] / 2**30:.1f} GiB{nxt}), "
            f"EXPECTED step {1e3 * step:,.0f} ms, {rate} ({c['bound']}-bound){extra}; {c['compiles']} compiles, "
            f"{c['compile_s']:.0f} s"
        )

    b = found["best"]
    lines = [
        f"{found['experiment'] or 'run'} on {b['mesh'] and math.prod(b['mesh'].values())} x {found['device_kind']}: "
        f"best expected speed with model.remat={b['remat']}, train.batch_size={b['batch_size']}",
        row(b),
        *(["  runners-up:"] + [row(c) for c in found["runners_up"]] if found["runners_up"] else []),
        *[row(c) for c in found["candidates"] if not c["fits"]],
        f"  searched {len(found['candidates'])} configurations in {found['compiles']} compiles "
        f"({found['compile_s']:.0f} s compiling, {found['wall_s']:.0f} s in all); {found['label']}",
    ]
    return "\n".join(lines)


__all__ = ["describe", "parse_mesh", "search"]

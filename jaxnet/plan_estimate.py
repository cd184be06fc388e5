"""From what a compiled step costs to how long it takes: the four bounds, the expected step (an
efficiency fitted on published measured runs), the input rate each host must feed, a goal's time
and cost, calibration by a run measured on a GPU, the warnings a practitioner would give, and how
the processes sit on the hosts.

    >>> step_bound(6.6e-3, 10.3e-3, 4.4e-3)
    ('memory', 0.0103)
"""

from __future__ import annotations

import functools
import importlib.resources
import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from jaxnet.errors import UserError
from jaxnet.plan_targets import Target
from jaxnet.train.loop import Run

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


def published_spread(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """How far the expected step has fallen from measured ones: the least and the greatest of
    ``expected / published - 1`` over the published runs jaxnet planned (``rows`` of the table
    ``scripts/record_plans.py published`` writes, each with ``ratio_expected_to_published``), or
    None without any.

    >>> rows = [{"ratio_expected_to_published": 0.66}, {"ratio_expected_to_published": 1.18}]
    >>> published_spread(rows)["low"], published_spread(rows)["high"]
    (-0.34, 0.18)
    """
    ratios = [r["ratio_expected_to_published"] for r in rows if r.get("ratio_expected_to_published")]
    if not ratios:
        return None
    return {
        "low": round(min(ratios) - 1, 4),
        "high": round(max(ratios) - 1, 4),
        "runs": len(ratios),
        "note": "expected step / published step - 1 over the published runs jaxnet plans "
        "(jaxnet/targets/published_runs.json): how far an expected step has been from a measured one",
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
    peak = p.get("mfu_peak_flops") or p["peak_flops"]  # plans recorded before float8 have no mfu_peak_flops
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
        "expected_mfu": analytic / step / (peak * report["gpus"]) if analytic and peak else None,
        "expected_spread": fit.get("spread"),
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


# The process layout (for the cluster page's two ways of starting a run on GPUs).


def process_layout(gpus: int, mesh: dict[str, int], per_node: int = 8) -> dict[str, Any]:
    """How a planned run's processes can sit on its hosts (:func:`hosts_for` of them): one per host
    using all its GPUs, or one per GPU. The mesh is the same either way (its devices in process
    order, Slurm placing consecutive tasks on one node); its ``tensor`` groups stay inside a host,
    on its fast links, when ``mesh.tensor`` divides the GPUs of a host, and its ``context`` groups
    (the axis next to ``tensor``) when ``mesh.context x mesh.tensor`` does.

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
        "context_within_host": per_host % (mesh.get("context", 1) * mesh.get("tensor", 1)) == 0,
    }

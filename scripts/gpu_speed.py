"""The GPU check's ``speed`` part: jaxnet's train step against PyTorch's on one GPU, same shapes.

Rows (in the order they run; a row that the time left cannot hold is recorded as "not measured:
budget" rather than started):

====  ================================================  =======  ======
 #    model (shape)                                     matmuls  remat
====  ================================================  =======  ======
 1    gpt2_small: 12 x 768, context 1,024, batch 32     bf16     none
 2    llama_1b: Llama 3.2 1B's shape, 2 x 2,048         bf16     none
 3    gpt2_small                                        fp8      none
 4    llama_1b                                          fp8      none
 5    gpt2_small                                        bf16     full
 6    llama_1b                                          bf16     full
====  ================================================  =======  ======

``llama_1b`` is 16 blocks 2,048 wide, 32 query heads sharing 8 key/value heads, a SwiGLU MLP of
8,192, RMSNorm, rotary positions of base 500,000, tied embeddings, a vocabulary of 128,256:
1.24 B parameters. Both models train with AdamW (0.9, 0.95), weight decay 0.1 and clipping at 1.0,
float32 parameters and optimizer state, bf16 compute, on one device-resident batch of random ids.

Each row compiles jaxnet's train step (the runner's own, :class:`jaxnet.train.loop.Run`) and the
PyTorch twin (:mod:`jaxnet.bench.torch_peers`: ``torch.compile``, ``scaled_dot_product_attention``
with its flash kernel, bf16 autocast, fused AdamW; remat ``full`` is ``torch.utils.checkpoint``
around each block; ``fp8`` is torchao's float8 training with tensorwise (current) scaling where
torchao imports, else "not installable" with the reason), warms both up, then alternates: ``steps``
jaxnet steps, ``steps`` PyTorch steps, for ``rounds`` rounds; a step's time is its round's time over
``steps`` (one wait for the device at the end of each round), and the figure is the median over the
rounds. MFU is jaxnet.flops' count of the step (the same for both) over the step time and the
device's dense bf16 peak from jaxnet/flops.py (FP8 rows too, as float8 training results are
usually quoted). Beside each row: ``jaxnet plan``'s expected and predicted step for the same config
on the same GPU kind, from the committed record ``benchmarks/results/planned-speed-rows-*.json``
(``python scripts/gpu_speed.py plan``, deviceless on a CPU).

The results file (``speed-<device>-<date>.json`` in the output folder) is rewritten after every row,
so a run killed at its limit still leaves every row measured so far.

    python scripts/gpu_speed.py run --out FILE --deadline EPOCH_SECONDS [--rows A,B] [--dry-run]   (the child)
    python scripts/gpu_speed.py plan [--targets h100,h200] [--dry-run]                (the plan records)
"""

from __future__ import annotations

import datetime
import functools
import json
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

ROWS = (
    ("gpt2_small", "default", "none"),
    ("llama_1b", "default", "none"),
    ("gpt2_small", "fp8", "none"),
    ("llama_1b", "fp8", "none"),
    ("gpt2_small", "default", "full"),
    ("llama_1b", "default", "full"),
)
# (batch, sequence) on the GPU (both frameworks' state and activations in one 80 GB H100 at once)
# and in a dry run on a CPU
SHAPES = {"gpt2_small": (32, 1024), "llama_1b": (2, 2048)}
DRY_SHAPES = {"gpt2_small": (2, 64), "llama_1b": (2, 64)}
STEPS, ROUNDS, WARMUP = 5, 4, 2
DRY_STEPS, DRY_ROUNDS, DRY_WARMUP = 2, 2, 1
# seconds a row is expected to need before its first measurement, until one of the model is seen
FIRST_GUESS = {"gpt2_small": 90.0, "llama_1b": 120.0}
DRY_GUESS = {"gpt2_small": 30.0, "llama_1b": 30.0}
SPEED_BUDGET, DRY_SPEED_BUDGET = 420, 400  # the whole part, every compile included
PLAN_GLOB = "planned-speed-rows-*.json"


def row_id(model: str, matmul: str, remat: str) -> str:
    """The row's name in results and plan records: ``gpt2_small-bf16-none``."""
    return f"{model}-{'bf16' if matmul == 'default' else matmul}-{remat}"


def speed_config(model: str, matmul: str, remat: str, dry: bool = False) -> Any:
    """The jaxnet config of one row (its data comes from :func:`random_dataset`)."""
    from jaxnet.config import load_experiment

    batch, seq = (DRY_SHAPES if dry else SHAPES)[model]
    keys = [f"train.batch_size={batch}", f"data.seq_len={seq}", f"model.matmul={matmul}", f"model.remat={remat}"]
    keys += ["train.progress=false", "optim.warmup_steps=0"] + (["data.vocab_size=512"] if dry else [])
    if model == "gpt2_small":
        return load_experiment("gpt2_small:smoke" if dry else "gpt2_small", keys)
    shape = [] if dry else ["model.layers=16", "model.width=2048", "model.heads=32", "model.kv_heads=8"]
    shape += [] if dry else ["model.mlp_hidden=8192"]
    return load_experiment("llama3_8b:smoke" if dry else "llama3_8b", [*shape, "model.tie_embeddings=true", *keys])


def vocabulary(cfg: Any) -> int:
    """The ids of the row's model: the experiment's vocabulary (GPT-2's padded, Llama 3's)."""
    return cfg.data.vocab_size or 257


def random_dataset(cfg: Any) -> Any:
    """Random token ids of the row's vocabulary, enough for a few batches (in memory: nothing to prepare)."""
    import numpy as np

    from jaxnet.data.text import TextDataset

    vocab = vocabulary(cfg)
    ids = np.random.default_rng(0).integers(0, vocab, 4 * cfg.train.batch_size * (cfg.data.seq_len + 1))
    return TextDataset(
        ids,
        ids[: 2 * (cfg.data.seq_len + 1)],
        ids[: 2 * (cfg.data.seq_len + 1)],
        [str(i) for i in range(vocab)],
        "word",
        "random ids",
    )


def _cfg_for_data(cfg: Any) -> Any:
    """``cfg`` reading an in-memory dataset: no corpus path, the vocabulary the ids span."""
    import dataclasses

    data = dataclasses.replace(cfg.data, name="text", path="", vocab_size=0, tokenizer="")
    return dataclasses.replace(cfg, data=data)


# ---------------------------------------------------------------------------------------------
# The child: every row in one process


class Results:
    """The results file, rewritten whole (atomically) after each row."""

    def __init__(self, path: Path, dry: bool, deadline: float):
        import jax

        self.path = path
        self.record: dict[str, Any] = {
            "kind": "gpu-speed",
            "mode": "dry-run (CPU)" if dry else "gpu",
            "date": datetime.date.today().isoformat(),
            "started": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "device_kind": jax.devices()[0].device_kind,
            "versions": versions(),
            "budget_deadline_s": round(deadline - time.time(), 1),
            "timing": f"median over rounds of alternating blocks: jaxnet steps then PyTorch steps, each block's "
            f"time over its steps (one wait at the end of each block), after {DRY_WARMUP if dry else WARMUP} "
            "warm-up steps each; compile times are the first call's",
            "peak_bytes": "jaxnet: the device's peak bytes in use since the process started (JAX keeps no peak per "
            "row); torch: the most allocated in the row",
            "rows": {},
        }
        self.write()

    def row(self, name: str, entry: dict[str, Any]) -> None:
        self.record["rows"][name] = entry
        self.write()

    def write(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.record, indent=2) + "\n")
        tmp.replace(self.path)


def versions() -> dict[str, str | None]:
    import importlib.metadata as md

    out = {}
    for name in ("jax", "jaxlib", "jax-cuda13-plugin", "jax-cuda12-plugin", "flax", "optax", "torch", "torchao"):
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            out[name] = None
    return out


def _median_block(run_block: Any, rounds: int) -> list[float]:
    return [run_block() for _ in range(rounds)]


def jaxnet_side(cfg: Any, steps: int, warmup: int) -> dict[str, Any]:
    """Compile the runner's train step for ``cfg`` on this device; return its timer and figures."""
    import jax

    from jaxnet.train.loop import Run

    run = Run(_cfg_for_data(cfg), dataset=random_dataset(cfg))
    batch = run.put_batch(next(iter(run.train_batches(0))))
    state = run.init_state()
    begin = time.perf_counter()
    compiled = run.train_step.lower(state, batch).compile()
    compile_s = time.perf_counter() - begin
    holder = {"state": state}
    for _ in range(warmup):
        holder["state"], metrics = compiled(holder["state"], batch)
    jax.block_until_ready(holder["state"])
    loss = float(metrics["loss"]) if "loss" in metrics else None

    def block() -> float:
        start = time.perf_counter()
        for _ in range(steps):
            holder["state"], _ = compiled(holder["state"], batch)
        jax.block_until_ready(holder["state"])
        return (time.perf_counter() - start) / steps

    stats = jax.devices()[0].memory_stats() or {}
    return {
        "block": block,
        "compile_s": round(compile_s, 1),
        "first_loss": loss,
        "peak_bytes_in_use": stats.get("peak_bytes_in_use"),
        "release": lambda: holder.clear(),
    }


def torch_side(cfg: Any, matmul: str, remat: str, steps: int, warmup: int, device: str, dry: bool) -> dict[str, Any]:
    """The PyTorch twin of ``cfg``: compiled (not in a dry run), bf16 autocast, flash SDPA, fused
    AdamW; ``remat=full`` checkpoints each block; ``fp8`` converts its linear layers with torchao.
    Returns its timer, or ``{"status": ...}`` when it cannot run (torchao not importable)."""
    import numpy as np
    import torch
    import torch.utils.checkpoint

    from jaxnet import models
    from jaxnet.bench import torch_peers

    if matmul == "fp8":
        try:
            from torchao.float8 import convert_to_float8_training
        except Exception as e:  # noqa: BLE001 - any import failure means "not installable here"
            return {"status": f"not installable: torchao's float8 training ({type(e).__name__}: {str(e)[:200]})"}
    resolved = models.resolve(cfg.model, "cuda" if device == "cuda" else "cpu")
    vocab, seq = vocabulary(cfg), cfg.data.seq_len
    # bf16 autocast as jaxnet's bf16 on a GPU; a dry run on a CPU computes in float32 on both sides
    trainer = torch_peers.Trainer(resolved, cfg.optim, 1000, vocab, seq, device=device, bf16=not dry)
    model = trainer.model
    if matmul == "fp8":
        # every projection of the blocks, not the output layer (as jaxnet's fp8 leaves it in bf16)
        convert_to_float8_training(model, module_filter_fn=lambda module, name: name.startswith("blocks."))
    if remat == "full":
        for block in model.blocks:
            block.forward = functools.partial(torch.utils.checkpoint.checkpoint, block.forward, use_reentrant=False)
    trainer.model = model if dry else torch.compile(model)
    ids = np.random.default_rng(0).integers(0, vocab, (cfg.train.batch_size, seq + 1))
    batch = trainer.put({"tokens": ids[:, :-1].astype(np.int32), "targets": ids[:, 1:].astype(np.int32)})
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    begin = time.perf_counter()
    trainer.step(batch)
    sync()
    compile_s = time.perf_counter() - begin
    for _ in range(max(warmup - 1, 0)):
        trainer.step(batch)
    sync()

    def block() -> float:
        start = time.perf_counter()
        for _ in range(steps):
            trainer.step(batch)
        sync()
        return (time.perf_counter() - start) / steps

    def release() -> None:
        trainer.model = trainer.optimizer = None
        if device == "cuda":
            torch.cuda.empty_cache()

    peak = torch.cuda.max_memory_allocated() if device == "cuda" else None
    return {
        "block": block,
        "compile_s": round(compile_s, 1),
        "first_loss": trainer.loss(),
        "peak_bytes": peak,
        "release": release,
    }


def free(device: str) -> None:
    """Let go of the last row's models before the next: PyTorch's compiled graphs hold their models."""
    import gc

    import torch

    torch._dynamo.reset()
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def failed(error: Exception) -> dict[str, str]:
    """A side that could not run: the error in a line and the end of its trace."""
    return {"status": f"failed: {type(error).__name__}: {str(error)[:300]}", "trace": traceback.format_exc()[-800:]}


def plan_rows(target: str | None) -> dict[str, Any]:
    """The committed plan of each row for ``target`` (newest ``planned-speed-rows-*.json``), or {}."""
    found = sorted((ROOT / "benchmarks" / "results").glob(PLAN_GLOB))
    if not found or target is None:
        return {}
    record = json.loads(found[-1].read_text())
    return {
        name: {**plans[target], "file": found[-1].relative_to(ROOT).as_posix()}
        for name, plans in record["rows"].items()
        if target in plans
    }


def plan_target(device_kind: str) -> str | None:
    for name in ("h200", "h100", "a100"):
        if name in device_kind.lower():
            return name
    return None


def run_rows(out: Path, deadline: float, dry: bool, only: tuple[str, ...] = ()) -> int:
    """(child) Every row (or those named in ``only``) that the time before ``deadline`` holds, the
    results file after each."""
    import jax

    from jaxnet import flops, models

    results = Results(out, dry, deadline)
    device_kind = results.record["device_kind"]
    target = plan_target(device_kind)
    planned = plan_rows(target)
    peak = flops.peak_flops(device_kind)
    results.record.update(
        peak_flops=peak,
        peak_source="jaxnet/flops.py PEAK_BF16_FLOPS: the data sheet's dense bf16 peak for this device kind"
        if peak
        else "no peak known for this device (a CPU): no MFU",
        plan_target=target,
    )
    steps, rounds, warmup = (DRY_STEPS, DRY_ROUNDS, DRY_WARMUP) if dry else (STEPS, ROUNDS, WARMUP)
    seen: dict[str, float] = {}  # seconds a row of each model took, to decide whether the next fits
    device = "cpu" if dry or jax.default_backend() == "cpu" else "cuda"
    for model, matmul, remat in ROWS:
        name = row_id(model, matmul, remat)
        if only and name not in only:
            continue
        left = deadline - time.time()
        need = seen.get(model, (DRY_GUESS if dry else FIRST_GUESS)[model])
        if left < need:
            results.row(
                name, {"status": "not measured: budget", "seconds_left": round(left, 1), "seconds_needed": need}
            )
            continue
        started = time.time()
        cfg = speed_config(model, matmul, remat, dry)
        resolved = models.resolve(cfg.model, jax.default_backend())
        batch, seq = cfg.train.batch_size, cfg.data.seq_len
        step_flops = flops.train_step_flops(resolved, batch=batch, input_shape=(seq,), vocab=vocabulary(cfg))
        entry: dict[str, Any] = {
            "model": model,
            "matmul": matmul,
            "remat": remat,
            "batch": batch,
            "seq_len": seq,
            "tokens_per_step": batch * seq,
            "flops_per_step": step_flops,
            "dtype": resolved.dtype,
            "attention": resolved.attention,
            "plan": planned.get(name),
        }
        sides: dict[str, dict[str, Any]] = {}
        try:
            sides["jaxnet"] = jaxnet_side(cfg, steps, warmup)
        except Exception as e:  # noqa: BLE001 - a row that fails is recorded, the next one runs
            entry["jaxnet"] = {
                "status": f"failed: {type(e).__name__}: {str(e)[:300]}",
                "trace": traceback.format_exc()[-800:],
            }
        try:
            sides["torch"] = torch_side(cfg, matmul, remat, steps, warmup, device, dry)
        except Exception as e:  # noqa: BLE001
            entry["torch"] = {
                "status": f"failed: {type(e).__name__}: {str(e)[:300]}",
                "trace": traceback.format_exc()[-800:],
            }
        timers = {k: v for k, v in sides.items() if "block" in v}
        times: dict[str, list[float]] = {k: [] for k in timers}
        for _ in range(rounds):  # alternating: jaxnet's block, then PyTorch's
            for side, timer in timers.items():
                times[side].append(timer["block"]())
        for side, info in sides.items():
            if side not in timers:
                entry[side] = {"status": info["status"]}
                continue
            step = statistics.median(times[side])
            entry[side] = {
                "status": "measured",
                "median_step_s": step,
                "step_s_each_round": [round(t, 6) for t in times[side]],
                "tokens_per_s": batch * seq / step,
                "mfu": step_flops / step / peak if peak else None,
                "compile_s": info["compile_s"],
                "first_loss": info["first_loss"],
                "peak_bytes": info.get("peak_bytes_in_use") or info.get("peak_bytes"),
            }
            info["release"]()
        if "median_step_s" in entry.get("jaxnet", {}) and "median_step_s" in entry.get("torch", {}):
            entry["jaxnet_over_torch_tokens_per_s"] = entry["torch"]["median_step_s"] / entry["jaxnet"]["median_step_s"]
        plan = entry["plan"] or {}
        if plan.get("expected_step_s") and "median_step_s" in entry.get("jaxnet", {}):
            entry["jaxnet_measured_over_expected"] = entry["jaxnet"]["median_step_s"] / plan["expected_step_s"]
        entry["seconds"] = round(time.time() - started, 1)
        seen[model] = max(entry["seconds"], 1.0)
        sides.clear()
        free(device)
        results.row(name, entry)
        print(
            f"SPEED {name}: " + json.dumps({k: v for k, v in entry.items() if k in ("jaxnet", "torch")})[:600],
            flush=True,
        )
    return 0


# ---------------------------------------------------------------------------------------------
# The plan records: each row compiled for an H100 and an H200 here (deviceless)


def record_plans(targets: list[str], dry: bool) -> int:
    """``jaxnet plan`` of every row's config for each target, written to
    ``benchmarks/results/planned-speed-rows-<date>.json`` (a dry run: printed only)."""
    from jaxnet import planner

    date = datetime.date.today().isoformat()
    rows: dict[str, dict[str, Any]] = {}
    for model, matmul, remat in ROWS:
        name = row_id(model, matmul, remat)
        cfg = speed_config(model, matmul, remat, dry)
        for target in targets:
            begin = time.perf_counter()
            report = planner.plan(_cfg_for_data(cfg), target, 1, dataset=random_dataset(cfg))
            p = report["prediction"]
            rows.setdefault(name, {})[target] = {
                "expected_step_s": p.get("expected_step_s"),
                "predicted_step_s": p["predicted_step_s"],
                "bound": p["bound"],
                "compute_s": p["compute_s"],
                "memory_s": p["memory_s"],
                "launch_s": p["launch_s"],
                "expected_mfu": p.get("expected_mfu"),
                "memory_total": report["memory"]["total"],
                "fits": report["fits"],
                "matmul_dtypes": report["kernels"]["matmul_dtypes"],
                "fp8_flops": report["flops_per_step"].get("fp8"),
                "compile_s": report["compile_s"],
            }
            print(
                f"{name} on {target}: {json.dumps(rows[name][target])} ({time.perf_counter() - begin:.0f} s)",
                flush=True,
            )
    record = {
        "kind": "plan-speed-rows",
        "date": date,
        "command": f"python scripts/gpu_speed.py plan --targets {','.join(targets)}",
        "versions": planner._versions(),
        "label": "PREDICTED and EXPECTED steps of jaxnet plan (deviceless compile on a CPU), not measurements",
        "rows": rows,
    }
    if dry:
        print(json.dumps(record, indent=2))
        return 0
    path = ROOT / "benchmarks" / "results" / f"planned-speed-rows-{date}.json"
    for old in path.parent.glob(PLAN_GLOB):
        if old != path:
            old.unlink()
    path.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {path.relative_to(ROOT)}")
    return 0


def main(argv: list[str]) -> int:
    dry = "--dry-run" in argv
    if argv[:1] == ["run"]:
        out = Path(argv[argv.index("--out") + 1])
        deadline = float(argv[argv.index("--deadline") + 1])
        only = tuple(argv[argv.index("--rows") + 1].split(",")) if "--rows" in argv else ()
        return run_rows(out, deadline, dry, only)
    if argv[:1] == ["plan"]:
        targets = argv[argv.index("--targets") + 1].split(",") if "--targets" in argv else ["h100", "h200"]
        return record_plans(targets, dry)
    print(__doc__.strip().splitlines()[-2:], file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

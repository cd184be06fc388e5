"""nanoGPT and jaxnet side by side on the CPU: the same GPT, the same train.bin / val.bin, the same steps.

    git clone https://github.com/karpathy/nanoGPT /tmp/nanoGPT          # the peer's source, not ours
    python scripts/compare_nanogpt.py --nanogpt /tmp/nanoGPT             # 600 steps, 3 rounds (~1 h on 2 cores)
    python scripts/compare_nanogpt.py --nanogpt /tmp/nanoGPT --steps 20 --rounds 1 --out /tmp/check   # a quick look

The shape is nanoGPT's CPU recipe (its README: ``--device=cpu --compile=False``, 4 layers, 4 heads,
128 wide, dropout 0) on GPT-2 tokens, as jaxnet's ``gpt2_shakespeare`` trains it: context 128,
batch 16, GPT-2's vocabulary padded to 50,304, tied embeddings, biases, AdamW (0.9, 0.95), weight
decay 0.1, peak learning rate 1e-3 after 50 warm-up steps, cosine decay to 1e-4, clipping at 1.0,
float32. nanoGPT's ``train.py`` runs unchanged from the given checkout, its settings passed on the
command line as its own configurator takes them; jaxnet runs ``jaxnet train gpt2_shakespeare``.

The data: ``train.bin`` and ``val.bin`` as nanoGPT's ``data/shakespeare/prepare.py`` writes them
(the text's first 90 % of characters for training, the rest for validation, GPT-2 ids by tiktoken's
``encode_ordinary``, uint16), made from the Shakespeare text jaxnet ships (its 42 works, joined), or
``--data DIR`` holding a pair of your own (e.g. what that prepare.py wrote). jaxnet reads the same
files (``data.format=nanogpt``).

Each round runs nanoGPT, then jaxnet (the order alternates between rounds), each in a fresh process
with the machine's cores. What is recorded per run: the process's wall time, the training steps'
own time (nanoGPT: the sum of its per-iteration times, less its two evaluations; jaxnet: its wall
time less compilation and evaluation, from summary.json), and the final validation loss, both
computed the same way here: the mean next-token cross-entropy over every prediction of val.bin in
non-overlapping windows of 128 (jaxnet's own evaluation with ``train.eval_tokens=0``; nanoGPT's
checkpoint at its last step, evaluated by this script with nanoGPT's own model code). nanoGPT's own
estimate (20 random batches) is kept beside it. The training curves and the medians go to
``benchmarks/results/nanogpt-cpu-<date>.json`` and ``.png``. Nothing of nanoGPT is copied into
this repository: the script runs the checkout it is given, in a temporary directory.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SEQ, BATCH, LAYERS, HEADS, WIDTH, VOCAB = 128, 16, 4, 4, 128, 50304
LR, MIN_LR, WARMUP, B2, DECAY, CLIP = 1e-3, 1e-4, 50, 0.95, 0.1, 1.0


def write_bins(out: Path) -> dict:
    """train.bin and val.bin of jaxnet's shipped Shakespeare, as nanoGPT's shakespeare prepare.py
    cuts and encodes its text."""
    sys.path.insert(0, str(ROOT))
    from jaxnet.data.text import shakespeare_works
    from jaxnet.tokenizers import gpt2

    text = "\n".join(body for _, body in shakespeare_works())
    n = len(text)
    ids = {"train": gpt2.encode(text[: int(n * 0.9)]), "val": gpt2.encode(text[int(n * 0.9) :])}
    out.mkdir(parents=True, exist_ok=True)
    for split, values in ids.items():
        np.array(values, dtype=np.uint16).tofile(out / f"{split}.bin")
    return {"source": "jaxnet's shipped Shakespeare (42 works, joined), cut 90/10 by characters, GPT-2 ids"} | {
        f"{split}_tokens": len(values) for split, values in ids.items()
    }


def nanogpt_command(steps: int, dataset: str) -> list[str]:
    """nanoGPT's train.py with the shape and the optimizer above (its configurator's --key=value)."""
    settings = {
        "dataset": dataset,
        "device": "cpu",
        "compile": False,
        "dtype": "float32",
        "n_layer": LAYERS,
        "n_head": HEADS,
        "n_embd": WIDTH,
        "block_size": SEQ,
        "batch_size": BATCH,
        "gradient_accumulation_steps": 1,
        "bias": True,
        "dropout": 0.0,
        "learning_rate": LR,
        "min_lr": MIN_LR,
        "warmup_iters": WARMUP,
        "max_iters": steps,
        "lr_decay_iters": steps,
        "beta2": B2,
        "weight_decay": DECAY,
        "grad_clip": CLIP,
        "eval_interval": steps,  # at 0 and after the last step, which saves the checkpoint evaluated here
        "eval_iters": 20,
        "log_interval": 1,
        "always_save_checkpoint": True,
        "out_dir": "out",
    }
    return [sys.executable, "train.py", *(f"--{k}={v}" for k, v in settings.items())]


def run_nanogpt(checkout: Path, data: Path, steps: int, work: Path) -> dict:
    """nanoGPT's train.py in a temporary directory holding links to its files and to the data."""
    for name in ("train.py", "model.py", "configurator.py"):
        (work / name).symlink_to(checkout / name)
    (work / "data").mkdir()
    (work / "data" / "side_by_side").symlink_to(data.resolve())
    start = time.perf_counter()
    out = subprocess.run(nanogpt_command(steps, "side_by_side"), cwd=work, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if out.returncode:
        raise RuntimeError(f"nanoGPT failed:\n{out.stderr[-3000:]}")
    logged = re.findall(r"iter (\d+): loss ([\d.]+), time ([\d.]+)ms", out.stdout)
    iters = [(int(i), float(loss), float(ms)) for i, loss, ms in logged]
    evals = [float(v) for v in re.findall(r"val loss ([\d.]+)", out.stdout)]
    # An iteration's time holds its step and the evaluation before it, if any: steps 0 and max_iters
    # (one past the last step counted) hold one. Steps 1 .. steps-1 are steps alone; step 0 counts
    # as their median.
    step_ms = [ms for i, _, ms in iters if 0 < i < steps]
    median = statistics.median(step_ms)
    return {
        "wall_s": round(wall, 1),
        "train_s": round((sum(step_ms) + median) / 1000, 1),
        "median_step_ms": round(median, 1),
        "train_losses": [[i, loss] for i, loss, _ in iters if i < steps],
        "own_val_estimate": evals[-1] if evals else None,
        "val_loss": evaluate_nanogpt(checkout, work / "out" / "ckpt.pt", data / "val.bin"),
    }


def evaluate_nanogpt(checkout: Path, checkpoint: Path, val: Path) -> float:
    """The mean cross-entropy of nanoGPT's checkpoint over every prediction of ``val`` in
    non-overlapping windows of SEQ (the last one partial), as jaxnet evaluates a split."""
    import torch

    sys.path.insert(0, str(checkout))
    from model import GPT, GPTConfig  # nanoGPT's own model code

    state = torch.load(checkpoint, map_location="cpu", weights_only=False)
    model = GPT(GPTConfig(**state["model_args"]))
    model.load_state_dict({k.removeprefix("_orig_mod."): v for k, v in state["model"].items()})
    model.eval()
    ids = np.fromfile(val, dtype=np.uint16).astype(np.int64)
    predictions = len(ids) - 1
    total = 0.0
    with torch.no_grad():
        for first in range(0, predictions, SEQ * BATCH):
            starts = range(first, min(first + SEQ * BATCH, predictions), SEQ)
            x = np.zeros((len(starts), SEQ), np.int64)
            y = np.full((len(starts), SEQ), -1, np.int64)
            for row, s in enumerate(starts):
                n = min(SEQ, predictions - s)
                x[row, :n], y[row, :n] = ids[s : s + n], ids[s + 1 : s + 1 + n]
            logits, _ = model(torch.from_numpy(x), torch.from_numpy(y))
            loss = torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.shape[-1]), torch.from_numpy(y).reshape(-1), ignore_index=-1, reduction="sum"
            )
            total += float(loss)
    return total / predictions


def run_jaxnet(data: Path, steps: int, work: Path) -> dict:
    """``jaxnet train gpt2_shakespeare`` on the same files: the shape and the optimizer are the
    experiment's own; the steps, the schedule's length and the evaluation are set here."""
    overrides = [
        f"data.path={data.resolve()}",
        "data.format=nanogpt",
        f"train.steps={steps}",
        "train.eval_every=0",  # once, after the last step
        "train.eval_tokens=0",  # every prediction of val.bin
        f"train.checkpoint_every={steps}",
        "train.log_every=10",
        "train.progress=false",
    ]
    command = [sys.executable, "-m", "jaxnet", "train", "gpt2_shakespeare", *overrides, "--workdir", str(work / "run")]
    start = time.perf_counter()
    out = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if out.returncode:
        raise RuntimeError(f"jaxnet failed:\n{out.stderr[-3000:]}")
    summary = json.loads((work / "run" / "summary.json").read_text())
    rows = [json.loads(line) for line in (work / "run" / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if r["split"] == "train"]
    val = [r for r in rows if r["split"] == "val"]
    rates = [r["steps_per_s"] for r in train[1:] if r.get("steps_per_s")]  # the first interval holds warm-up
    return {
        "wall_s": round(wall, 1),
        "train_s": round(steps / summary["steps_per_s"], 1),  # the loop's steps: compilation and evaluation not in it
        "median_step_ms": round(1000 / statistics.median(rates), 1) if rates else None,
        "train_losses": [[r["step"], r["loss"]] for r in train],
        "val_loss": val[-1]["loss"],
        "summary": {k: v for k, v in summary.items() if isinstance(v, (int, float, str))},
    }


def plot(record: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (curves, bars) = plt.subplots(1, 2, figsize=(11, 4), gridspec_kw={"width_ratios": [3, 2]})
    colours = {"nanogpt": "tab:orange", "jaxnet": "tab:blue"}
    for name in ("nanogpt", "jaxnet"):
        for i, run in enumerate(record["runs"][name]):
            steps, losses = np.array(run["train_losses"]).T
            if name == "nanogpt":  # per step: the mean of each 10, as jaxnet logs them
                k = 10
                n = len(losses) // k * k
                steps, losses = steps[k - 1 : n : k], losses[:n].reshape(-1, k).mean(1)
            curves.plot(steps, losses, color=colours[name], alpha=0.8, label=name if i == 0 else None)
        vals = [r["val_loss"] for r in record["runs"][name]]
        curves.scatter([record["steps"]] * len(vals), vals, color=colours[name], marker="x", zorder=3)
    curves.set_xlabel("step")
    curves.set_ylabel("training loss (nats per token); x: final validation loss")
    curves.set_ylim(top=8)
    curves.legend()
    names = ["nanogpt", "jaxnet"]
    medians = record["medians"]
    bars.bar(names, [medians[n]["train_s"] for n in names], color=[colours[n] for n in names])
    for i, n in enumerate(names):
        bars.text(i, medians[n]["train_s"], f"{medians[n]['train_s']:.0f} s\nval {medians[n]['val_loss']:.3f}",
                  ha="center", va="bottom")  # fmt: skip
    bars.set_ylabel(f"training time of {record['steps']} steps (s), median")
    fig.suptitle(f"nanoGPT and jaxnet on the CPU ({record['cpu']}), {record['date']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nanogpt", required=True, help="a checkout of github.com/karpathy/nanoGPT")
    parser.add_argument("--data", help="a directory with train.bin and val.bin (default: made from the shipped text)")
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    args = parser.parse_args()
    checkout = Path(args.nanogpt).resolve()
    if not (checkout / "train.py").is_file() or not (checkout / "model.py").is_file():
        sys.exit(f"{checkout} is not a nanoGPT checkout (no train.py and model.py); git clone it first")
    sys.path.insert(0, str(ROOT))
    import torch

    import jaxnet
    from jaxnet import observe

    with tempfile.TemporaryDirectory(prefix="nanogpt-side-by-side-") as tmp:
        tmp = Path(tmp)
        data = Path(args.data) if args.data else tmp / "data"
        data_note = {"source": f"given: {data}"} if args.data else write_bins(data)
        runs: dict[str, list[dict]] = {"nanogpt": [], "jaxnet": []}
        loads = []
        for r in range(args.rounds):
            order = ["nanogpt", "jaxnet"] if r % 2 == 0 else ["jaxnet", "nanogpt"]
            for name in order:
                work = tmp / f"{name}-{r}"
                work.mkdir()
                result = (run_nanogpt(checkout, data, args.steps, work) if name == "nanogpt"
                          else run_jaxnet(data, args.steps, work))  # fmt: skip
                result["load_average"] = round(os.getloadavg()[0], 2)
                loads.append(result["load_average"])
                runs[name].append(result)
                print(
                    f"round {r + 1} {name:8s}: wall {result['wall_s']} s, training {result['train_s']} s, "
                    f"step {result['median_step_ms']} ms, val loss {result['val_loss']:.4f}, "
                    f"load {result['load_average']}",
                    flush=True,
                )
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=checkout, capture_output=True, text=True).stdout.strip()
    medians = {
        name: {
            key: round(statistics.median(r[key] for r in results), 4)
            for key in ("wall_s", "train_s", "median_step_ms", "val_loss")
        }
        for name, results in runs.items()
    }
    import jax

    record = {
        "kind": "nanogpt-side-by-side",
        "command": "python " + " ".join(sys.argv),
        "date": datetime.date.today().isoformat(),
        "device": f"cpu ({os.cpu_count()} cores)",
        "cpu": observe.cpu_model(),
        "versions": {
            "jax": jax.__version__,
            "jaxnet": jaxnet.__version__,
            "torch": torch.__version__,
            "nanogpt_commit": commit or "not a git checkout",
        },  # fmt: skip
        "machine_shared": "yes: other jobs ran on the same cores; the runs alternate, medians are compared",
        "load_average": {"min": min(loads), "median": statistics.median(loads), "max": max(loads)},
        "shape": {"layers": LAYERS, "heads": HEADS, "width": WIDTH, "context": SEQ, "batch": BATCH, "vocab": VOCAB},
        "optimizer": {
            "adamw_b2": B2,
            "weight_decay": DECAY,
            "lr": LR,
            "min_lr": MIN_LR,
            "warmup": WARMUP,
            "clip": CLIP,
        },
        "nanogpt_command": " ".join(nanogpt_command(args.steps, "DATASET")[1:]),
        "data": data_note,
        "steps": args.steps,
        "val_loss_how": "mean cross-entropy over every prediction of val.bin, non-overlapping windows of 128",
        "differences": "nanoGPT draws its own initial weights (seed 1337) and batches (torch.randint), jaxnet its "
        "own (seed 0); nanoGPT's random windows of train.bin and jaxnet's are both uniform; both decay the weights "
        "of 2 or more dimensions (embeddings included), not biases and norms; nanoGPT trains max_iters + 1 "
        "steps and saves its checkpoint after max_iters, which is what is evaluated",
        "medians": medians,
        "runs": runs,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"nanogpt-cpu-{record['date']}.json"
    path.write_text(json.dumps(record, indent=1) + "\n")
    plot(record, path.with_suffix(".png"))
    print(json.dumps(medians, indent=1))
    print(f"wrote {path} and {path.with_suffix('.png')}")


if __name__ == "__main__":
    main()

"""Token corpora on disk, measured: memory, loader speed, prepare speed, and the same losses as in memory.

    python scripts/measure_corpus.py                      # 1 GB and 8 GB corpora; about 15 minutes here
    python scripts/measure_corpus.py --sizes-gb 1 --skip-prepare

Writes benchmarks/results/corpus-cpu-DATE.json (device, library versions, date, command, load
average at start and end, every figure). What it measures:

memory
    Synthetic corpora of random GPT-2 token ids (uint16, llm.c's shard layout, 100 M tokens a
    shard, with a ``corpus.json`` as ``jaxnet prepare`` writes it) of each size in ``--sizes-gb``,
    written into a temporary directory and deleted afterwards (free disk is checked first). On
    each, ``jaxnet train gpt2_shakespeare:smoke data.path=DIR`` for ``--steps`` steps in a fresh
    process whose resident memory (RSS, the process and its children) is sampled every 50 ms:
    the peak and the last sample. The figure is the difference between the largest and the
    smallest corpus; the corpus is memory-mapped, so it should be near zero (< 100 MB required).
loader
    Training batches of gpt2_small's shape (64 x 1024 tokens, window batching) read from the
    largest corpus by one process, in tokens/s, beside the tokens/s one host of ``jaxnet plan
    gpt2_small --target h100 --gpus 8 mesh.fsdp=8`` consumes (from the committed plan results:
    its input-rate field where it has one, else batch tokens / predicted step time).
prepare
    ``jaxnet prepare shakespeare|ptb --tokenizer gpt2`` with 1 and 2 workers, tokens/s (the
    command's own figure and tokens / wall time of the whole command).
same_losses
    A small gpt2_shakespeare-style model trained twice: from ``jaxnet prepare shakespeare
    --tokenizer byte``'s shards (``data.name=tokens``) and from a :class:`jaxnet.TextDataset` in
    memory built here from the shipped text, as prepare defines the corpus: each work's UTF-8
    bytes after an end-of-text id (256), the works held out by prepare's documented rule
    (:func:`jaxnet.data.prepare.assign_splits`). The losses at every step must be equal.
    (``data.name=shakespeare data.tokenizer=byte`` is another corpus: each work cut 90/5/5 by
    position, no end-of-text token, 256 ids, so its losses differ by design.)
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
SHARD_TOKENS = 100_000_000
VAL_TOKENS = 1_000_000
BATCH, SEQ = 64, 1024  # gpt2_small's batch shape


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env["JAX_PLATFORMS"] = "cpu"
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def write_synthetic_corpus(path: Path, train_tokens: int, seed: int = 0) -> dict:
    """Random GPT-2 ids as ``jaxnet prepare`` lays them out: train/val/test shards and corpus.json."""
    from jaxnet.data import prepare, shards

    path.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    splits = {}
    for split, count in (("train", train_tokens), ("val", VAL_TOKENS), ("test", VAL_TOKENS)):
        entries, left, index = [], count, 0
        while left:
            n = min(left, SHARD_TOKENS)
            name = f"{split}_{index:06d}.bin"
            sha = shards.write_shard(path / name, rng.integers(0, 50257, n, dtype=np.uint16))
            entries.append({"file": name, "tokens": n, "sha256": sha})
            left, index = left - n, index + 1
        splits[split] = {"tokens": count, "documents": 1, "max_id": 50256, "shards": entries}
    tok = {"name": "gpt2", "vocab_size": 50257, "eot_id": 50256}
    manifest = {
        "format": prepare.FORMAT,
        "settings": {"source": "synthetic random ids (scripts/measure_corpus.py)", "tokenizer": "gpt2"},
        "tokenizer": tok,
        "vocab_size": 50257,
        "eot_id": 50256,
        "dtype": "uint16",
        "splits": splits,
    }
    shards.write_json(path / "corpus.json", manifest)
    return manifest


def peak_rss(command: list[str], interval: float = 0.05) -> dict:
    """Run ``command``; sample the resident memory of it and its children until it exits."""
    import psutil

    start = time.perf_counter()
    process = subprocess.Popen(
        command, cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    samples: list[int] = []

    def sample() -> None:
        try:
            root = psutil.Process(process.pid)
            while process.poll() is None:
                total = 0
                for p in [root, *root.children(recursive=True)]:
                    try:
                        total += p.memory_info().rss
                    except psutil.Error:
                        pass
                samples.append(total)
                time.sleep(interval)
        except psutil.Error:
            pass

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    output, _ = process.communicate()
    thread.join()
    if process.returncode:
        raise SystemExit(f"{' '.join(command)} failed:\n{output[-3000:]}")
    samples = [s for s in samples if s]  # 0: sampled as the process exited
    return {
        "peak_rss_mb": round(max(samples) / 2**20, 1),
        "final_rss_mb": round(samples[-1] / 2**20, 1),
        "median_rss_last_half_mb": round(float(np.median(samples[len(samples) // 2 :])) / 2**20, 1),
        "samples": len(samples),
        "wall_s": round(time.perf_counter() - start, 1),
        "last_line": output.strip().splitlines()[-1],
    }


def loader_rate(path: Path, batches: int) -> dict:
    """Tokens/s of training batches of gpt2_small's shape read by one process from ``path``."""
    from jaxnet.config import Config, DataConfig
    from jaxnet.data import tokens

    cfg = Config()
    cfg.data = DataConfig(name="tokens", path=str(path), seq_len=SEQ, vocab_size=50304)
    cfg.train.batch_size = BATCH
    ds = tokens.load(cfg.data)
    stream = ds.train_batches(cfg, start_step=0)
    next(stream)  # the first maps the shards
    times = []
    for _ in range(batches):
        t = time.perf_counter()
        batch = next(stream)
        times.append(time.perf_counter() - t)
    assert batch["tokens"].shape == (BATCH, SEQ)
    per_batch = float(np.median(times))
    fifth = max(1, batches // 5)
    return {
        "batch_shape": [BATCH, SEQ],
        "batches": batches,
        "median_batch_s": per_batch,
        "tokens_per_s": BATCH * SEQ / per_batch,
        "tokens_per_s_mean": BATCH * SEQ * batches / float(np.sum(times)),
        # The first batches after the corpus is written (and a training run) read slower than later ones.
        "tokens_per_s_mean_first_fifth": BATCH * SEQ * fifth / float(np.sum(times[:fifth])),
        "tokens_per_s_mean_last_fifth": BATCH * SEQ * fifth / float(np.sum(times[-fifth:])),
        "corpus_tokens": len(ds.train),
        "corpus_shards": len(ds.train.shards),
    }


def plan_rate() -> dict:
    """The tokens/s one host of the committed gpt2_small 8 x H100 plan consumes."""
    files = sorted((ROOT / "benchmarks" / "results").glob("plan-gpt2_small-h100x8-*.json"))
    if not files:
        return {"error": "no benchmarks/results/plan-gpt2_small-h100x8-*.json; run scripts/record_plans.py"}
    plan = json.loads(files[-1].read_text())
    out = {"file": files[-1].name, "gpus": plan.get("gpus"), "mesh": plan.get("mesh")}
    for key in ("input_tokens_per_s_per_host", "input_rate_per_host", "tokens_per_s_per_host"):
        for where in (plan, plan.get("prediction", {})):
            if key in where:
                out.update(tokens_per_s_per_host=float(where[key]), source=f"the plan's {key} field")
                return out
    step = plan["prediction"]["predicted_step_s"]
    tokens = plan["batch_size"] * plan["seq_len"]
    out.update(
        tokens_per_s_per_host=tokens / step,
        source=(
            f"computed: batch {plan['batch_size']} x {plan['seq_len']} tokens / predicted step "
            f"{step * 1e3:.2f} ms (the plan has no input-rate field); its {plan['gpus']} GPUs are one host"
        ),
    )
    return out


def prepare_rates(tmp: Path, sources: list[str], workers: list[int]) -> list[dict]:
    out = []
    for source in sources:
        for w in workers:
            target = tmp / f"prepare-{source}-{w}"
            command = [sys.executable, "-m", "jaxnet", "prepare", source, "--tokenizer", "gpt2"]
            command += ["--out", str(target), "--workers", str(w), "--quiet"]
            start = time.perf_counter()
            result = subprocess.run(command, cwd=ROOT, env=_env(), capture_output=True, text=True)
            wall = time.perf_counter() - start
            if result.returncode:
                raise SystemExit(f"{' '.join(command)} failed:\n{result.stderr[-3000:]}")
            manifest = json.loads((target / "corpus.json").read_text())
            total = sum(s["tokens"] for s in manifest["splits"].values())
            said = re.search(r"\(([\d,]+) tokens/s", result.stdout + result.stderr)
            out.append(
                {
                    "source": source,
                    "workers": w,
                    "tokens": total,
                    "documents": sum(s["documents"] for s in manifest["splits"].values()),
                    "tokens_per_s_reported": int(said.group(1).replace(",", "")) if said else None,
                    "wall_s": round(wall, 2),
                    "tokens_per_s_wall": total / wall,
                    "load_average": _load(),
                }
            )
            print(f"prepare {source} workers={w}: {out[-1]['tokens_per_s_reported']} tokens/s ({wall:.1f} s)")
            shutil.rmtree(target)
    return out


def same_losses(tmp: Path, steps: int) -> dict:
    """Shards of ``jaxnet prepare shakespeare --tokenizer byte`` and the same ids in memory: the losses."""
    import jaxnet
    from jaxnet.data import prepare, text
    from jaxnet.data.text import TextDataset

    corpus = tmp / "shakespeare-byte"
    command = [sys.executable, "-m", "jaxnet", "prepare", "shakespeare", "--tokenizer", "byte", "--out", str(corpus)]
    subprocess.run([*command, "--workers", "1", "--quiet"], cwd=ROOT, env=_env(), check=True, capture_output=True)
    works = text.shakespeare_works()
    manifest = json.loads((corpus / "corpus.json").read_text())
    settings = manifest["settings"]
    split_of = prepare.assign_splits(len(works), settings["val_fraction"], settings["test_fraction"], settings["seed"])
    ids = {s: [] for s in ("train", "val", "test")}
    for (_, work), split in zip(works, split_of, strict=True):
        ids[split] += [256, *work.encode("utf-8")]
    vocab = [chr(b) for b in range(256)] + ["<|endoftext|>"]
    arrays = (np.asarray(ids[s], np.int32) for s in ("train", "val", "test"))
    memory = TextDataset(*arrays, vocab=vocab, tokenizer="byte", name="shakespeare-in-memory")

    def config(**data) -> jaxnet.Config:
        sys.path.insert(0, str(ROOT / "experiments"))
        import gpt2_shakespeare

        cfg = gpt2_shakespeare.get_config("smoke")
        cfg.data.vocab_size = 0  # the byte vocabulary, 257 ids
        cfg.data.seq_len = 64
        cfg.model.layers, cfg.model.width, cfg.model.heads = 2, 64, 2
        cfg.train.batch_size, cfg.train.steps = 8, steps
        cfg.train.eval_every, cfg.train.log_every, cfg.train.checkpoint_every = steps // 2, 10, 0
        # Whole validation and test splits: an in-memory TextDataset evaluates every prediction.
        cfg.train.eval_tokens, cfg.train.eval_batch_size, cfg.train.progress = 0, 256, False
        for k, v in data.items():
            setattr(cfg.data, k, v)
        return cfg

    jaxnet.train(config(name="tokens", path=str(corpus)), tmp / "run-shards")
    # The config names the built-in in-memory corpus; the dataset given replaces it.
    jaxnet.train(config(name="shakespeare", path="", tokenizer="byte"), tmp / "run-memory", dataset=memory)
    losses = {}
    for name in ("shards", "memory"):
        lines = (tmp / f"run-{name}" / "metrics.jsonl").read_text().splitlines()
        losses[name] = {f"{r['split']}@{r['step']}": r["loss"] for r in map(json.loads, lines)}
    same = losses["shards"] == losses["memory"]
    differences = [abs(losses["shards"][k] - losses["memory"].get(k, np.nan)) for k in losses["shards"]]
    return {
        "command": "jaxnet prepare shakespeare --tokenizer byte; train from its shards and from the same ids in memory",
        "model": "gpt2_shakespeare:smoke with 2 layers x 64 wide, 2 heads, context 64, batch 8, vocabulary 257; "
        "evaluation over the whole validation and test splits (train.eval_tokens=0)",
        "steps": steps,
        "train_tokens": {"shards": manifest["splits"]["train"]["tokens"], "memory": len(memory.train)},
        "losses_shards": losses["shards"],
        "losses_memory": losses["memory"],
        "identical": same,
        "max_abs_difference": float(np.nanmax(differences)) if differences else None,
        "in_memory_corpus": (
            "a jaxnet.TextDataset built from the shipped works: per work, id 256 then its UTF-8 bytes, works held "
            "out by prepare.assign_splits (what prepare writes); data.name=shakespeare data.tokenizer=byte is "
            "another corpus (90/5/5 by position inside each work, no end-of-text id, 256 ids)"
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes-gb", type=float, nargs="+", default=[1.0, 8.0], help="synthetic corpus sizes")
    parser.add_argument("--steps", type=int, default=40, help="training steps of each memory run")
    parser.add_argument("--loader-batches", type=int, default=1000)
    parser.add_argument("--loss-steps", type=int, default=40)
    parser.add_argument("--skip-prepare", action="store_true")
    parser.add_argument("--skip-losses", action="store_true")
    parser.add_argument("--tmp", default=None, help="directory for the temporary corpora (default: the system's)")
    parser.add_argument("--out", default=None, help="results file (default benchmarks/results/corpus-cpu-DATE.json)")
    args = parser.parse_args()

    from jaxnet import observe

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stopped: the temporary corpora are still deleted
    tmp_root = Path(args.tmp or tempfile.gettempdir())
    need = int(sum(args.sizes_gb) * 1e9 * 1.05) + 4 * VAL_TOKENS + (1 << 30)
    free = shutil.disk_usage(tmp_root).free
    if free < need:
        raise SystemExit(
            f"{tmp_root} has {free / 1e9:.1f} GB free; the corpora of --sizes-gb {args.sizes_gb} need about "
            f"{need / 1e9:.1f} GB. Give smaller --sizes-gb or --tmp DIR on a larger disk."
        )
    date = datetime.date.today().isoformat()
    out = Path(args.out or ROOT / "benchmarks" / "results" / f"corpus-cpu-{date}.json")
    record: dict = {
        "environment": observe.environment(),
        "cpu": observe.cpu_model(),
        "command": "python " + " ".join([os.path.relpath(__file__, ROOT), *sys.argv[1:]]),
        "load_average": {"start": _load()},
        "disk_free_gb": round(free / 1e9, 1),
    }
    with tempfile.TemporaryDirectory(prefix="jaxnet-corpus-", dir=tmp_root) as tmpdir:
        tmp = Path(tmpdir)
        memory = []
        largest = None
        for size in sorted(args.sizes_gb):
            tokens = int(size * 1e9) // 2
            path = tmp / f"synthetic-{size:g}gb"
            t = time.perf_counter()
            write_synthetic_corpus(path, tokens)
            written = time.perf_counter() - t
            command = [sys.executable, "-m", "jaxnet", "train", "gpt2_shakespeare:smoke", f"data.path={path}"]
            command += [f"train.steps={args.steps}", "train.eval_every=0", "train.checkpoint_every=0"]
            command += ["train.progress=false", "--workdir", str(tmp / f"run-{size:g}gb")]
            result = peak_rss(command)
            result.update(corpus_gb=size, train_tokens=tokens, write_s=round(written, 1), load_average=_load())
            memory.append(result)
            print(f"{size:g} GB corpus: peak RSS {result['peak_rss_mb']} MB, final {result['final_rss_mb']} MB")
            if largest is not None:
                shutil.rmtree(largest)
            largest = path
        record["memory"] = {
            "command": " ".join(command[1:-2]).replace(str(largest), "DIR"),
            "runs": memory,
            "peak_rss_difference_mb": round(memory[-1]["peak_rss_mb"] - memory[0]["peak_rss_mb"], 1),
            "final_rss_difference_mb": round(memory[-1]["final_rss_mb"] - memory[0]["final_rss_mb"], 1),
            "median_rss_last_half_difference_mb": round(
                memory[-1]["median_rss_last_half_mb"] - memory[0]["median_rss_last_half_mb"], 1
            ),
            "required_under_mb": 100,
        }
        record["memory"]["passes"] = abs(record["memory"]["peak_rss_difference_mb"]) < 100

        loader = loader_rate(largest, args.loader_batches)
        plan = plan_rate()
        loader["plan"] = plan
        if "tokens_per_s_per_host" in plan:
            loader["ratio_to_plan"] = loader["tokens_per_s"] / plan["tokens_per_s_per_host"]
            loader["ratio_to_plan_mean"] = loader["tokens_per_s_mean"] / plan["tokens_per_s_per_host"]
            loader["passes"] = loader["ratio_to_plan"] >= 10  # by the median batch
            loader["passes_by_mean"] = loader["ratio_to_plan_mean"] >= 10  # slow batches (a loaded machine) in
        loader["load_average"] = _load()
        record["loader"] = loader
        print(f"loader: {loader['tokens_per_s']:,.0f} tokens/s; plan needs {plan.get('tokens_per_s_per_host', 0):,.0f}")
        shutil.rmtree(largest)

        if not args.skip_prepare:
            record["prepare"] = prepare_rates(tmp, ["shakespeare", "ptb"], [1, 2])
        if not args.skip_losses:
            record["same_losses"] = same_losses(tmp, args.loss_steps)
            print(f"same losses: {record['same_losses']['identical']}")
    record["load_average"]["end"] = _load()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=2, default=float) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()

"""Measure the image-file loader on this machine -> benchmarks/results/images-cpu-<date>.json:

    python scripts/measure_images.py [--images 400] [--batches 6] [--train]

- decoded images/s at 224x224 (random resized crop + flip, as training) from a synthetic JPEG
  folder (written to a temporary directory by this script, not committed) with 0, 1 and 2 grain
  worker processes, and the same from ArrayRecord shards packed from it (jaxnet prepare images);
- resident memory (this process and its workers) after reading batches from that folder and from
  one 10 times larger: the loader holds file names, not images;
- with --train: steps/s of cnn_fashion_mnist:smoke on the in-memory Fashion-MNIST and on the same
  images as a PNG folder (scripts/write_image_folder.py), from the runs' metrics;
- the images/s per host the committed plan of resnet_cifar10 on H100s says a loader must deliver.

The machine is shared: the load average before and after is recorded beside every figure.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("JAX_PLATFORMS", "cpu")


def synthetic_folder(root: Path, n: int, seed: int = 0) -> Path:
    """``n`` random-ish RGB JPEGs of 250-400 px a side in 4 class folders (smooth noise, so JPEG
    sizes are realistic: about 20-40 KB)."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    for i in range(n):
        h, w = rng.integers(250, 401, 2)
        small = rng.integers(0, 256, (h // 8 + 1, w // 8 + 1, 3), dtype=np.uint8)
        image = Image.fromarray(small).resize((int(w), int(h)), Image.BILINEAR)
        d = root / f"class{i % 4}"
        d.mkdir(parents=True, exist_ok=True)
        image.save(d / f"{i:06d}.jpg", quality=90)
    return root


def rss_mb() -> float:
    import psutil

    me = psutil.Process()
    return (me.memory_info().rss + sum(c.memory_info().rss for c in me.children(recursive=True))) / 2**20


def images_per_s(name: str, path: Path, workers: int, batches: int, batch: int = 32) -> dict:
    from jaxnet.config import Config, DataConfig
    from jaxnet.data import load

    cfg = Config(experiment="measure")
    cfg.data = DataConfig(name=name, path=str(path), val_size=batch, workers=workers, image_size=224, augment=True)
    cfg.train.batch_size = batch
    ds = load(cfg.data)
    start = time.perf_counter()
    it = ds.train_batches(cfg, 0)
    next(it)  # workers started, first batch made
    first = time.perf_counter() - start
    start = time.perf_counter()
    for _ in range(batches):
        next(it)
    seconds = time.perf_counter() - start
    rss = rss_mb()
    it.close()
    return {
        "source": name,
        "workers": workers,
        "images_per_s": batches * batch / seconds,
        "first_batch_s": first,
        "batch": batch,
        "batches_timed": batches,
        "rss_mb_while_reading": rss,
        "load_avg": os.getloadavg(),
    }


def train_steps_per_s(overrides: list[str], workdir: Path) -> dict:
    command = [
        sys.executable,
        "-m",
        "jaxnet",
        "train",
        "cnn_fashion_mnist:smoke",
        *overrides,
        "--workdir",
        str(workdir),
        "train.progress=false",
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    start = time.perf_counter()
    subprocess.run(command, check=True, env=env, capture_output=True)
    rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    rates = [r["steps_per_s"] for r in rows if "steps_per_s" in r]
    return {
        "overrides": overrides,
        "steps_per_s_logged": rates,
        "wall_s": time.perf_counter() - start,
        "load_avg": os.getloadavg(),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--images", type=int, default=400)
    parser.add_argument("--batches", type=int, default=6)
    parser.add_argument("--train", action="store_true")
    parser.add_argument("--png-folder", default="data/fashion-mnist-png")
    args = parser.parse_args()
    import grain
    import PIL

    from jaxnet.data import prepare_images

    result: dict = {
        "date": datetime.date.today().isoformat(),
        "command": "python " + shlex.join(["scripts/measure_images.py", *sys.argv[1:]]),
        "device": f"cpu: {platform.processor() or platform.machine()}, {len(os.sched_getaffinity(0))} cores (shared)",
        "versions": {"python": platform.python_version(), "grain": grain.__version__, "pillow": PIL.__version__},
        "load_avg_start": os.getloadavg(),
    }
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        folder = synthetic_folder(tmp / "jpegs", args.images)
        packed = tmp / "packed"
        start = time.perf_counter()
        prepare_images.prepare_images(folder, packed, workers=2, shard_images=100, progress=False, say=lambda *_: None)
        result["prepare_images"] = {"images": args.images, "seconds": time.perf_counter() - start, "workers": 2}
        rows = []
        for workers in (0, 1, 2):
            rows.append(images_per_s("folder", folder, workers, args.batches))
            print(rows[-1], flush=True)
        for workers in (0, 2):
            rows.append(images_per_s("arrayrecord", packed, workers, args.batches))
            print(rows[-1], flush=True)
        result["decode_224"] = rows
        base = rss_mb()
        small = images_per_s("folder", folder, 0, 2)
        big = synthetic_folder(tmp / "big", args.images * 10, seed=1)
        large = images_per_s("folder", big, 0, 2)
        result["memory"] = {
            "rss_mb_before": base,
            "folder_images": [args.images, args.images * 10],
            "rss_mb_reading": [small["rss_mb_while_reading"], large["rss_mb_while_reading"]],
            "note": "in-process loader (workers=0), this process's RSS after 3 batches of 32",
        }
        print(result["memory"], flush=True)
    if args.train and Path(args.png_folder).is_dir():
        with tempfile.TemporaryDirectory() as tmp:
            result["train_cnn_fashion_mnist_smoke"] = [
                train_steps_per_s([], Path(tmp) / "memory"),
                train_steps_per_s(["data.name=folder", f"data.path={args.png_folder}"], Path(tmp) / "folder"),
            ]
            print(result["train_cnn_fashion_mnist_smoke"], flush=True)
    plan = sorted((ROOT / "benchmarks" / "results").glob("plan-resnet_cifar10-h100-*.json"))
    if plan:
        record = json.loads(plan[-1].read_text())
        result["plan_input_rate"] = {
            "file": plan[-1].name,
            "examples_per_s_per_host": record["input_rate"]["examples_per_s_per_host"],
            "note": "resnet_cifar10 (32x32 inputs) on H100s, the committed plan; no resnet50-shaped (224x224) "
            "experiment ships, so no such plan was made",
        }
    result["load_avg_end"] = os.getloadavg()
    out = ROOT / "benchmarks" / "results" / f"images-cpu-{result['date']}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()

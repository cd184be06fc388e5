"""Fine-tuning: convolutions learnt on five Fashion-MNIST classes, frozen, reused on a few labels of the other five.

Command:  python examples/finetune_fashion_mnist.py [--workdir runs/finetune] [--labels 10,50,100]
          [--seeds 0,1,2] [--results benchmarks/results/finetune-fashion_mnist-cpu-DATE.json]
Data:     Fashion-MNIST. The source run trains the built-in ConvNet on all 30,000 training images
          of classes 0-4 (T-shirt, trouser, pullover, dress, coat). The target task is classes 5-9
          (sandal, shirt, sneaker, bag, ankle boot) from only 10, 50 or 100 labelled training images
          (an equal number per class, a fixed draw), tested on all 5,000 test images of those classes.
Compared: the same model and the same 150 steps (batches of up to 50) on the same few images, trained
          * from scratch;
          * from the source run (train.init_from), its classifier fresh (train.init_skip=Dense_1)
            and its two convolutions frozen (optim.freeze=Conv): no update, no optimizer state;
          * from the source run, fresh classifier, nothing frozen.
Result:   see the README's fine-tuning paragraph and the results file it quotes (test accuracy of
          each, per seed, and their means)
Time:     about 2 minutes on a 2-core CPU (30 runs of a few seconds each)

Each run is an ordinary run directory under --workdir (rerun the command to reuse them).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

import jaxnet
from jaxnet import observe
from jaxnet.data import images

SOURCE_CLASSES, TARGET_CLASSES = (0, 1, 2, 3, 4), (5, 6, 7, 8, 9)
COMMON = [
    "data.name=arrays",
    "model.name=convnet",
    "train.eval_batch_size=1000",
    "train.progress=false",
    "train.log_every=50",
]
SOURCE = ["train.steps=300", "train.batch_size=64", "train.checkpoint_every=300"]
FEW = ["train.steps=150", "train.checkpoint_every=150", "train.log_every=50"]
VARIANTS = {
    "scratch": [],
    "init_from, convolutions frozen": ["train.init_skip=Dense_1", "optim.freeze=Conv"],
    "init_from, all trained": ["train.init_skip=Dense_1"],
}


def split(x: np.ndarray, y: np.ndarray, classes: tuple[int, ...], pixels: np.ndarray) -> dict[str, np.ndarray]:
    """The images of ``classes``, standardised by the statistics of ``pixels`` (the training images, as the
    built-in loader does), labelled 0..4."""
    keep = np.isin(y, classes)
    mean, std = float(pixels.mean(dtype=np.float64)), float(pixels.std(dtype=np.float64))
    return {
        "x": (x[keep].astype(np.float32) - mean) / std,
        "y": np.searchsorted(np.asarray(classes), y[keep]).astype(np.int32),
    }


def few(data: dict[str, np.ndarray], labels: int) -> dict[str, np.ndarray]:
    """``labels`` images, an equal number per class, drawn once with a fixed seed."""
    rng = np.random.default_rng(0)
    per_class = labels // len(TARGET_CLASSES)
    picked = np.concatenate([rng.choice(np.flatnonzero(data["y"] == c), per_class, replace=False) for c in range(5)])
    return {k: v[np.sort(picked)] for k, v in data.items()}


def main(argv: list[str]) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", default="runs/finetune")
    parser.add_argument(
        "--labels", default="10,50,100", help="labelled training images of the target classes (one run each)"
    )
    parser.add_argument("--seeds", default="0,1,2", help="seeds of the few-label runs (initialisation and order)")
    parser.add_argument("--results", default="", help="also write the figures to this JSON file")
    args = parser.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    sizes = [int(n) for n in args.labels.split(",")]
    root = Path(args.workdir)
    raw = images.load_idx_dataset(images.find_fashion_mnist())
    task = jaxnet.tasks.classification(inputs="x", target="y")

    pixels = raw["train"][0]
    source_data = jaxnet.data.arrays(
        train=split(*raw["train"], SOURCE_CLASSES, pixels),
        test=split(*raw["test"], SOURCE_CLASSES, pixels),
        num_classes=5,
    )
    cfg = jaxnet.apply_overrides(jaxnet.Config(experiment="finetune_source"), COMMON + SOURCE)
    source = jaxnet.train(cfg, root / "source", dataset=source_data, task=task)

    target_test = split(*raw["test"], TARGET_CLASSES, pixels)
    target_pool = split(*raw["train"], TARGET_CLASSES, pixels)
    accuracy: dict[str, dict[str, dict[str, float]]] = {}
    for labels in sizes:
        target = jaxnet.data.arrays(train=few(target_pool, labels), test=target_test, num_classes=5)
        for name, extra in VARIANTS.items():
            start = [f"train.init_from={root / 'source'}"] if extra else []
            for seed in seeds:
                overrides = COMMON + FEW + [f"train.batch_size={min(50, labels)}", *start, *extra, f"seed={seed}"]
                cfg = jaxnet.apply_overrides(jaxnet.Config(experiment="finetune_target"), overrides)
                workdir = root / f"{name.replace(', ', '-').replace(' ', '_')}-{labels}-seed{seed}"
                summary = jaxnet.train(cfg, workdir, dataset=target, task=task)
                accuracy.setdefault(str(labels), {}).setdefault(name, {})[str(seed)] = round(
                    summary["test"]["accuracy"], 4
                )
    means = {
        labels: {name: round(float(np.mean(list(a.values()))), 4) for name, a in by_name.items()}
        for labels, by_name in accuracy.items()
    }
    result = {
        "source": {"classes": list(SOURCE_CLASSES), "test_accuracy": round(source["test"]["accuracy"], 4)},
        "target": {"classes": list(TARGET_CLASSES), "labelled_images": sizes, "test_images": len(target_test["y"])},
        "settings": {"common": COMMON, "source": SOURCE, "few_labels": FEW, "variants": VARIANTS, "seeds": seeds},
        "test_accuracy": accuracy,
        "mean_test_accuracy": means,
    }
    for labels, by_name in means.items():
        for name, mean in by_name.items():
            print(f"{labels:>4s} labels  {name:32s} test accuracy {mean:.4f}  (seeds: {accuracy[labels][name]})")
    if args.results:
        observe.write_json(Path(args.results), {**result, "environment": observe.environment()})
    return result


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except jaxnet.UserError as e:  # bad input: one line and exit code 2, as the jaxnet command does
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)

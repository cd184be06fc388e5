"""Write Fashion-MNIST as PNG files in class folders, the layout data.name=folder reads (not committed):

    python scripts/write_image_folder.py [OUT]        # default OUT: data/fashion-mnist-png

OUT/train/<class>/<index>.png (60,000) and OUT/test/<class>/<index>.png (10,000), 28x28 greyscale,
the class names those of the dataset's documentation, the pixels exactly the installed IDX files'
(/usr/share/datasets/fashion-mnist, see DATASETS.md). Then:

    jaxnet train cnn_fashion_mnist:folder            # data.name=folder data.path=data/fashion-mnist-png
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CLASSES = ("0-tshirt", "1-trouser", "2-pullover", "3-dress", "4-coat", "5-sandal", "6-shirt", "7-sneaker", "8-bag",
           "9-boot")  # fmt: skip
"""Prefixed with the label so that sorted names give the dataset's own label ids."""


def main(out: str = "data/fashion-mnist-png") -> None:
    from PIL import Image

    from jaxnet.data import images

    splits = images.load_idx_dataset(images.find_fashion_mnist())
    root = Path(out)
    for split, (x, y) in splits.items():
        for c in CLASSES:
            (root / split / c).mkdir(parents=True, exist_ok=True)
        for i, (image, label) in enumerate(zip(x, y, strict=True)):
            path = root / split / CLASSES[label] / f"{i:05d}.png"
            if not path.exists():
                tmp = path.with_suffix(".partial.png")
                Image.fromarray(image[..., 0], "L").save(tmp)
                tmp.replace(path)
        print(f"{root / split}: {len(x):,} images")


if __name__ == "__main__":
    main(*sys.argv[1:2])

"""``jaxnet prepare images DIR --out OUT``: pack an image folder into ArrayRecord shards for
``data.name=arrayrecord``.

``OUT`` gets, per split of the folder (``train/``, ``val/``, ``test/`` if it has them, else all of
it as ``train``): shards ``{split}-{i:05d}-of-{n:05d}.arrayrecord`` of up to ``shard_images``
records each (one record per image, :func:`jaxnet.data.imagefiles.pack_record`: the label, the
image's path and the file's bytes unchanged), ``{split}-labels.npy`` (int32, one per record, in
record order) and, last, ``images.json``: the format, the class names, each split's shards with
their record counts and sha256.

Every image is opened with Pillow while packing, so an unreadable file stops the prepare with its
name (``skip_corrupt``: left out and counted). Shards are written by worker processes, each
whole or not at all (a ``.partial`` file renamed); a killed prepare continues from the shards
``prepare-images-progress.json`` lists when run again.

>>> prepare_images("pets", "pets-packed")    # doctest: +SKIP
"""

from __future__ import annotations

import hashlib
import io
import json
import multiprocessing
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from jaxnet.data import imagefiles
from jaxnet.data import shards as shards_lib
from jaxnet.errors import UserError

PROGRESS = "prepare-images-progress.json"
SHARD_IMAGES = 5000


def _write_shard(job: tuple[str, str, list[tuple[int, str, str]], bool]) -> dict[str, Any]:
    """Write one shard (atomically): ``(out path, source root, [(label, relative name, path)],
    skip_corrupt)`` -> its record, with the labels written and the files left out."""
    from array_record.python.array_record_module import ArrayRecordWriter
    from PIL import Image

    path, root, items, skip = job
    tmp = path + ".partial"
    labels, skipped = [], []
    writer = ArrayRecordWriter(tmp, "group_size:1")
    try:
        for label, name, file in items:
            try:
                data = Path(file).read_bytes()
                with Image.open(io.BytesIO(data)) as image:
                    image.load()
            except Exception as e:
                if skip:
                    skipped.append(file)
                    continue
                raise UserError(
                    f"{file} is not a readable image ({type(e).__name__}); replace or remove it, or pass "
                    "--skip-corrupt to leave unreadable images out"
                ) from None
            writer.write(imagefiles.pack_record(label, name, data))
            labels.append(label)
    finally:
        writer.close()
    digest = hashlib.sha256()
    with open(tmp, "rb") as f:
        while chunk := f.read(1 << 22):
            digest.update(chunk)
    os.replace(tmp, path)
    return {"file": os.path.basename(path), "records": len(labels), "labels": labels, "sha256": digest.hexdigest(),
            "skipped": skipped}  # fmt: skip


def prepare_images(
    source: str | os.PathLike,
    out: str | os.PathLike,
    *,
    workers: int = 0,
    shard_images: int = SHARD_IMAGES,
    skip_corrupt: bool = False,
    progress: bool = True,
    say: Any = print,
) -> dict[str, Any]:
    """Pack the image folder ``source`` into ``out`` (see the module's docstring); returns the manifest.
    ``workers`` processes write shards (0 = one per core)."""
    source, out = Path(source).expanduser(), Path(out).expanduser()
    if shard_images < 1:
        raise UserError(f"--shard-images {shard_images}: give at least 1")
    splits, classes = imagefiles.folder_splits(source)
    manifest_path = out / imagefiles.MANIFEST
    if manifest_path.is_file():
        say(f"already prepared: {manifest_path}")
        return imagefiles.read_manifest(manifest_path)
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} is a file; give a directory")
    out.mkdir(parents=True, exist_ok=True)
    progress_path = out / PROGRESS
    plan = {"source": str(source.resolve()), "classes": classes, "shard_images": shard_images}
    done: dict[str, dict[str, Any]] = {}
    if progress_path.is_file():
        saved = json.loads(progress_path.read_text())
        if saved.get("plan") != plan:
            raise UserError(
                f"{out} holds an unfinished prepare of another folder or shard size ({saved.get('plan')}); "
                "give a new --out or the same arguments"
            )
        done = {d["file"]: d for d in saved["done"] if (out / d["file"]).is_file()}
        say(f"continuing the prepare in {out}: {len(done)} shard(s) done")
    jobs, layout = [], {}
    for split, src in splits.items():
        if src is None:
            continue
        n = -(-len(src) // shard_images)
        layout[split] = []
        for i in range(n):
            name = f"{split}-{i:05d}-of-{n:05d}.arrayrecord"
            layout[split].append(name)
            part = range(i * shard_images, min((i + 1) * shard_images, len(src)))
            items = [(int(src.labels[k]), f"{split}/{src.names[k]}", src.name(k)) for k in part]
            if name not in done:
                jobs.append((str(out / name), str(source), items, skip_corrupt))
    workers = workers or len(os.sched_getaffinity(0))
    workers = max(1, min(workers, len(jobs)))
    from tqdm import tqdm

    total = sum(len(j[2]) for j in jobs)
    bar = tqdm(total=total, unit="img", desc="images", disable=not progress, mininterval=1.0)
    start = time.perf_counter()

    def record(result: dict[str, Any]) -> None:
        done[result["file"]] = result
        shards_lib.write_json(progress_path, {"plan": plan, "done": list(done.values())})
        bar.update(result["records"] + len(result["skipped"]))

    try:
        if workers == 1:
            for job in jobs:
                record(_write_shard(job))
        else:
            ctx = multiprocessing.get_context("spawn")  # children import no accelerator state of ours
            with ctx.Pool(workers) as pool:
                for result in pool.imap_unordered(_write_shard, jobs):
                    record(result)
    finally:
        bar.close()
    manifest: dict[str, Any] = {"format": imagefiles.FORMAT, "source": str(source), "classes": classes, "splits": {}}
    skipped = []
    for split, names in layout.items():
        labels = np.asarray([y for n in names for y in done[n]["labels"]], np.int32)
        labels_file = f"{split}-labels.npy"
        shards_lib.atomic_write(out / labels_file, lambda f, labels=labels: np.save(f, labels))
        manifest["splits"][split] = {
            "records": int(len(labels)),
            "labels": labels_file,
            "shards": [{k: done[n][k] for k in ("file", "records", "sha256")} for n in names],
        }
        skipped += [s for n in names for s in done[n]["skipped"]]
    manifest["skipped"] = len(skipped)
    shards_lib.write_json(manifest_path, manifest)
    progress_path.unlink(missing_ok=True)
    seconds = time.perf_counter() - start
    counts = ", ".join(f"{s} {v['records']:,}" for s, v in manifest["splits"].items())
    note = f"; left out {len(skipped)} unreadable image(s), e.g. {skipped[0]}" if skipped else ""
    rate = total / max(seconds, 1e-9)
    say(f"wrote {manifest_path}: {counts} images ({rate:,.0f} images/s, {workers} worker(s)){note}")
    return manifest

"""Images read from files (data.name=folder, data.name=arrayrecord): the transforms against Pillow's
own operations, batches that are a pure function of (seed, step) row by row (resume, 1 vs 2
processes, workers vs in-process, folder vs ArrayRecord), and one-line errors for bad folders."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from conftest import run_patiently
from PIL import Image

from jaxnet import cli
from jaxnet.config import Config, DataConfig
from jaxnet.data import imagefiles, load, prepare_images
from jaxnet.errors import UserError


def write_folder(root: Path, per_class: int = 8, size: tuple[int, int] = (12, 12), mode: str = "L", fmt: str = "png"):
    """Three classes of random images, written as files; returns the root."""
    rng = np.random.default_rng(0)
    shape = (size[1], size[0]) + (() if mode == "L" else (3,))
    for c in ("cat", "ant", "bee"):  # not in sorted order on purpose
        (root / c).mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8), mode).save(root / c / f"{i}.{fmt}")
    return root


SPLIT_SIZES = {"train": 12, "val": 3, "test": 5}  # images per class: 60 in all


def write_splits(root: Path, size: int = 12, sizes: dict[str, int] = SPLIT_SIZES) -> Path:
    """``train/``, ``val/`` and ``test/`` folders of three learnable classes of greyscale PNGs (a
    bright left half, right half or bottom half over noise); returns the root."""
    rng = np.random.default_rng(5)
    bright = {"left": np.s_[:, : size // 2], "right": np.s_[:, size // 2 :], "bottom": np.s_[size // 2 :, :]}
    for split, per_class in sizes.items():
        for c, where in bright.items():
            (root / split / c).mkdir(parents=True, exist_ok=True)
            for i in range(per_class):
                image = rng.integers(0, 120, (size, size))
                image[where] += 100
                Image.fromarray(image.astype(np.uint8), "L").save(root / split / c / f"{i}.png")
    return root


def cfg_for(path: Path, name: str = "folder", **kw) -> Config:
    cfg = Config(experiment="tiny")
    cfg.data = DataConfig(name=name, path=str(path), val_size=4, workers=0, **kw)
    cfg.train.batch_size = 8
    cfg.seed = 3
    return cfg


def take(ds, cfg: Config, start: int, n: int, rows: slice = slice(None)) -> list[dict[str, np.ndarray]]:
    it = ds.train_batches(cfg, start, rows)
    out = [next(it) for _ in range(n)]
    it.close()
    return out


def test_center_matches_pillow_resize_then_crop():
    image = np.random.default_rng(1).integers(0, 256, (30, 40, 3), dtype=np.uint8)
    ref = Image.fromarray(image).resize((32, 24), Image.BILINEAR).crop((4, 0, 28, 24))  # short side 30 -> 24
    np.testing.assert_array_equal(imagefiles.center(image, 24), np.asarray(ref))
    assert imagefiles.center(image[:24, :24], 24) is not None
    np.testing.assert_array_equal(imagefiles.center(image[:24, :24], 24), image[:24, :24])  # already that size


def test_random_crop_box_stays_in_the_image_with_the_allowed_area_and_ratio():
    rng = np.random.default_rng(0)
    for _ in range(300):
        left, top, right, bottom = imagefiles.random_crop_box(50, 80, rng)
        assert 0 <= left < right <= 80 and 0 <= top < bottom <= 50
        w, h = right - left, bottom - top
        assert 0.08 * 4000 * 0.9 <= w * h <= 4000
        assert 3 / 4 * 0.85 <= w / h <= 4 / 3 * 1.15 or (w, h) == (80, 50) or w == 80 or h == 50


def test_random_resized_crop_is_pillow_crop_resize_and_a_flip_from_the_same_draws():
    yy, xx = np.mgrid[0:20, 0:30]
    image = np.stack([yy * 6, xx * 4, yy * 3 + xx * 2], -1).astype(np.uint8)  # smooth: the filters agree inside
    out = imagefiles.random_resized_crop(image, 16, np.random.default_rng(7))
    rng = np.random.default_rng(7)
    box = imagefiles.random_crop_box(20, 30, rng)
    ref = np.asarray(Image.fromarray(image).crop(box).resize((16, 16), Image.BILINEAR))
    ref = ref[:, ::-1] if rng.random() < 0.5 else ref
    # resize(box=) also reads the pixels just outside the box at the edges; inside the two agree
    assert np.abs(out.astype(int) - ref.astype(int))[2:-2, 2:-2].max() <= 2


def test_folder_classes_sorted_labels_and_statistics(tmp_path):
    root = write_folder(tmp_path / "f")
    ds = load(cfg_for(root).data)
    assert ds.classes == ["ant", "bee", "cat"] and ds.num_classes == 3
    assert (ds.image_size, ds.channels) == (12, 1)
    assert len(ds.train) == 20 and len(ds.val) == 4 and len(ds.test) == 0
    names = sorted(ds.train.names + ds.val.names)
    assert names[0] == os.path.join("ant", "0.png") and len(names) == 24
    label_of = dict(zip(ds.train.names, ds.train.labels, strict=True))
    assert label_of[os.path.join("cat", "1.png")] == 2
    pixels = np.stack([np.asarray(Image.open(root / n)) for n in ds.train.names]) / 255.0  # all 20 < the sample
    np.testing.assert_allclose(ds.mean, [pixels.mean()], rtol=1e-5)
    np.testing.assert_allclose(ds.std, [pixels.std()], rtol=1e-5)


def test_train_val_test_subfolders_are_the_splits(tmp_path):
    write_folder(tmp_path / "f" / "train")
    write_folder(tmp_path / "f" / "test", per_class=2)
    write_folder(tmp_path / "f" / "val", per_class=1)
    ds = load(cfg_for(tmp_path / "f").data)
    assert (len(ds.train), len(ds.val), len(ds.test)) == (24, 3, 6)
    batch = next(ds.eval_batches(cfg_for(tmp_path / "f"), "test", 4))
    assert batch["image"].shape == (4, 12, 12, 1) and batch["label"].tolist() == [0, 0, 1, 1]
    last = list(ds.eval_batches(cfg_for(tmp_path / "f"), "test", 4))[-1]
    assert last["mask"].tolist() == [1, 1, 0, 0]


def test_batches_are_the_same_on_resume_and_row_by_row_on_two_processes(tmp_path):
    cfg = cfg_for(write_folder(tmp_path / "f", size=(20, 16), mode="RGB", fmt="jpg"), image_size=12, augment=True)
    ds = load(cfg.data)
    whole = take(ds, cfg, 0, 5)
    assert whole[0]["image"].shape == (8, 12, 12, 3) and whole[0]["image"].dtype == np.float32
    resumed = take(ds, cfg, 3, 2)
    for a, b in zip(whole[3:], resumed, strict=True):
        np.testing.assert_array_equal(a["image"], b["image"])
        np.testing.assert_array_equal(a["label"], b["label"])
    halves = [take(ds, cfg, 0, 5, slice(0, 4)), take(ds, cfg, 0, 5, slice(4, 8))]  # process 0 and 1
    for step in range(5):
        joined = np.concatenate([halves[0][step]["image"], halves[1][step]["image"]])
        np.testing.assert_array_equal(joined, whole[step]["image"])
    assert not np.array_equal(whole[0]["image"], whole[1]["image"])  # augmentation and order differ by step
    # the order is the in-memory datasets' index rule
    from jaxnet.data import pipeline

    idx = pipeline.batch_indices(len(ds.train), 8, cfg.seed, 4)
    np.testing.assert_array_equal(whole[4]["label"], ds.train.labels[idx])


def test_evaluation_rows_decoded_apart_make_the_whole_batches(tmp_path, monkeypatch):
    """What each of 2 or 4 processes decodes of an evaluation batch, put together, is the batch one
    process makes (padding included), and each reads only the files of its rows."""
    root = write_splits(tmp_path / "f", sizes={"train": 4, "test": 5})  # 15 test images: 4 batches of 4
    cfg = cfg_for(root)
    ds = load(cfg.data)
    whole = list(ds.eval_batches(cfg, "test", 4))
    assert len(whole) == 4 and whole[-1]["mask"].tolist() == [1, 1, 1, 0]
    reads = []
    real = imagefiles.FileSource.read
    monkeypatch.setattr(imagefiles.FileSource, "read", lambda self, i: reads.append(self.names[i]) or real(self, i))
    names = ds.test.names
    for parts in (2, 4):
        pieces = []
        for p in range(parts):
            rows = slice(p * 4 // parts, (p + 1) * 4 // parts)
            reads.clear()
            pieces.append(list(ds.eval_batches(cfg, "test", 4, rows=rows)))
            assert reads == [names[k * 4 + r] for k in range(4) for r in range(rows.start, rows.stop) if k * 4 + r < 15]
        for k, batch in enumerate(whole):
            for key in ("image", "label", "mask"):
                np.testing.assert_array_equal(np.concatenate([p[k][key] for p in pieces]), batch[key], err_msg=key)


def test_worker_processes_give_the_same_batches_and_stay_off_accelerators(tmp_path):
    cfg = cfg_for(write_folder(tmp_path / "f"), augment=True)
    ds = load(cfg.data)
    here = take(ds, cfg, 2, 3)
    ds.workers = 2
    there = take(ds, cfg, 2, 3)
    for a, b in zip(here, there, strict=True):
        np.testing.assert_array_equal(a["image"], b["image"])
    seen = list(imagefiles.run_batches(_backend_report, 2, workers=1))
    assert all(r["platforms"] == "cpu" and not r["initialized"] for r in seen)


def _backend_report(k: int) -> dict:
    import jax
    from jax._src import xla_bridge

    return {"platforms": jax.config.jax_platforms, "initialized": xla_bridge.backends_are_initialized()}


class _KillingSource(imagefiles.FileSource):
    def read(self, i: int) -> bytes:
        if self.names[i].endswith("5.png"):
            os.kill(os.getpid(), 9)
        return super().read(i)


def test_a_killed_worker_is_an_error_naming_the_file_it_read(tmp_path):
    root = write_folder(tmp_path / "f")
    names = [os.path.join("ant", f"{i}.png") for i in range(8)]
    source = _KillingSource(str(root), names, np.zeros(8, np.int32))
    work = imagefiles.BatchWork(source, size=12, channels=1, batch_size=8, rows=slice(None), train=False)
    with pytest.raises(UserError, match=r"worker process died \(exit code -9\) while reading .*ant/5\.png"):
        list(imagefiles.run_batches(work, 3, workers=1))


def test_arrayrecord_packed_by_prepare_gives_the_folder_batches(tmp_path):
    root = write_folder(tmp_path / "f", fmt="jpg")
    out = tmp_path / "packed"
    prepare_images.prepare_images(root, out, workers=1, shard_images=10, progress=False, say=lambda *_: None)
    shards = sorted(p.name for p in out.glob("*.arrayrecord"))
    assert shards == [f"train-0000{i}-of-00003.arrayrecord" for i in range(3)]
    rec = imagefiles.RecordSource([str(out / shards[0])], np.zeros(10, np.int32))
    label, name, data = imagefiles.unpack_record(rec._open()[0])
    assert (label, name, data) == (0, "train/ant/0.jpg", (root / "ant" / "0.jpg").read_bytes())
    folder, packed = cfg_for(root, augment=True), cfg_for(out, "arrayrecord", augment=True)
    a, b = load(folder.data), load(packed.data)
    assert b.classes == a.classes
    for x, y in zip(take(a, folder, 0, 3), take(b, packed, 0, 3), strict=True):
        np.testing.assert_array_equal(x["image"], y["image"])
        np.testing.assert_array_equal(x["label"], y["label"])
    glob = load(cfg_for(out / "train-*.arrayrecord", "arrayrecord").data)
    assert glob.train.labels.tolist() == a.train.labels.tolist()


def test_prepare_images_resumes_from_finished_shards(tmp_path):
    root = write_folder(tmp_path / "f")
    out = tmp_path / "packed"
    prepare_images.prepare_images(root, out, workers=1, shard_images=10, progress=False, say=lambda *_: None)
    first = (out / "train-00001-of-00003.arrayrecord").stat().st_mtime_ns
    # as if killed after the first two shards: the manifest and the last shard missing, the progress file there
    (out / imagefiles.MANIFEST).unlink()
    (out / "train-00002-of-00003.arrayrecord").unlink()
    import json

    plan = {"source": str(root.resolve()), "classes": ["ant", "bee", "cat"], "shard_images": 10}
    done = [{"file": f"train-0000{i}-of-00003.arrayrecord", "records": 10, "labels": [i] * 10, "sha256": "x",
             "skipped": []} for i in range(2)]  # fmt: skip
    (out / prepare_images.PROGRESS).write_text(json.dumps({"plan": plan, "done": done}))
    said = []
    prepare_images.prepare_images(root, out, workers=1, shard_images=10, progress=False, say=said.append)
    assert "2 shard(s) done" in said[0]
    assert (out / "train-00001-of-00003.arrayrecord").stat().st_mtime_ns == first  # not rewritten
    assert np.load(out / "train-labels.npy")[:20].tolist() == [0] * 10 + [1] * 10  # the progress file's labels


def _error(tmp_path, capsys, *overrides: str) -> str:
    code = cli.main(["train", "cnn_fashion_mnist", *overrides, "--workdir", str(tmp_path / "run")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    return err


def test_bad_folders_are_one_line_errors_with_exit_2(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    empty = f"data.path={tmp_path / 'empty'}"
    assert "is empty: no class subdirectories" in _error(tmp_path, capsys, "data.name=folder", empty)
    loose = tmp_path / "loose"
    loose.mkdir()
    Image.fromarray(np.zeros((4, 4), np.uint8)).save(loose / "a.png")
    assert "but no class subdirectories" in _error(tmp_path, capsys, "data.name=folder", f"data.path={loose}")
    mixed = write_folder(tmp_path / "mixed")
    Image.fromarray(np.zeros((12, 12, 3), np.uint8)).save(mixed / "bee" / "zz.png")
    mixed_error = _error(tmp_path, capsys, "data.name=folder", f"data.path={mixed}", "data.val_size=1")
    assert "mixed channel counts" in mixed_error
    sizes = write_folder(tmp_path / "sizes")
    Image.fromarray(np.zeros((10, 14), np.uint8)).save(sizes / "bee" / "zz.png")
    sizes_error = _error(tmp_path, capsys, "data.name=folder", f"data.path={sizes}", "data.val_size=1")
    assert "differ in size; set data.image_size" in sizes_error


def test_corrupt_image_small_image_and_skip_corrupt(tmp_path):
    root = write_folder(tmp_path / "f", fmt="jpg")
    cfg = cfg_for(root, image_size=12)
    cfg.data.val_size = 1
    ds = load(cfg.data)
    good = (root / "bee" / "3.jpg").read_bytes()
    (root / "bee" / "3.jpg").write_bytes(good[: len(good) // 3])  # a truncated JPEG
    with pytest.raises(UserError, match=r"bee/3\.jpg is not a readable image"):
        load(cfg.data)  # found by the look at the images' headers
    with pytest.raises(UserError, match=r"bee/3\.jpg is not a readable image .*data\.skip_corrupt=true"):
        list(ds.eval_batches(cfg, "train", 8))  # every training image once
    cfg.data.skip_corrupt = True
    ds = load(cfg.data)
    masks = [b["mask"] for b in ds.eval_batches(cfg, "train", 8)]
    assert sum(m.sum() for m in masks) == len(ds.train) - 1 and ds.skipped == 1
    assert ds.skipped_files == {str(root / "bee" / "3.jpg")}
    assert len(take(ds, cfg, 0, 6)) == 6  # training: the next image stands in for it
    cfg = cfg_for(root, image_size=16)  # larger than the 12x12 images
    cfg.data.skip_corrupt = True
    with pytest.raises(UserError, match=r"is 12x12, smaller than data.image_size=16.*data\.upscale=true"):
        load(cfg.data)
    cfg.data.upscale = True
    assert load(cfg.data).image_size == 16


FOLDER_RUN = [
    "cnn_fashion_mnist:smoke",
    "data.name=folder",
    "data.workers=0",
    "train.batch_size=8",
    "train.steps=10",
    "train.eval_every=5",
    "train.eval_batch_size=8",
    "train.progress=false",
]


@pytest.fixture(scope="module")
def folder_run(tmp_path_factory):
    """The Fashion-MNIST ConvNet (smoke) trained 10 steps from a folder of 12x12 PNGs with
    train/val/test subfolders: ``(run directory, folder)``."""
    tmp = tmp_path_factory.mktemp("folder-run")
    root = write_splits(tmp / "images")
    assert cli.main(["train", *FOLDER_RUN, f"data.path={root}", "--workdir", str(tmp / "run")]) == 0
    return tmp / "run", root


def test_predict_on_image_files_is_load_predict_and_reproduces_the_test_accuracy(folder_run, tmp_path):
    """``jaxnet predict --input DIR`` of raw PNG files gives what ``jaxnet.load(RUN).predict`` gives
    for the same images read with Pillow, and its argmax is right on exactly the test images the
    run's own evaluation of the test folder got right: the accuracy metrics.jsonl records."""
    import json

    import jaxnet

    run, root = folder_run
    files = sorted((root / "test").rglob("*.png"))
    classes = ["bottom", "left", "right"]
    labels = np.asarray([classes.index(f.parent.name) for f in files])
    assert len(files) == 15
    logits_file, argmax_file = tmp_path / "logits.npy", tmp_path / "argmax.npy"
    assert cli.main(["predict", "--workdir", str(run), "--input", str(root / "test"), "--out", str(logits_file)]) == 0
    assert cli.main(["predict", "--workdir", str(run), "--input", str(root / "test"), "--out", str(argmax_file),
                     "--argmax"]) == 0  # fmt: skip
    logits, argmax = np.load(logits_file), np.load(argmax_file)

    # the reference: the files decoded by Pillow (12x12 already: evaluation's resize and crop keep them)
    x = np.stack([np.asarray(Image.open(f).convert("L")) for f in files])[..., None]
    trained = jaxnet.load(run)
    expected = trained.predict(x)
    assert logits.shape == (15, 3) and logits.dtype == np.float32
    np.testing.assert_allclose(logits, expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(argmax, expected.argmax(-1))

    # the run's evaluation of the test folder, example by example: its batches through the model
    ds = load(trained.config.data)
    right = []
    for batch in ds.eval_batches(trained.config, "test", 8):
        out = np.asarray(trained.forward(trained.params, trained.model_state, batch["image"]))
        right += (out.argmax(-1) == batch["label"])[batch["mask"] > 0].tolist()
    np.testing.assert_array_equal(argmax == labels, right)
    test = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    test = [r for r in test if r["split"] == "test"]
    assert len(test) == 1 and test[0]["step"] == 10
    assert test[0]["accuracy"] == pytest.approx(np.mean(argmax == labels), abs=1e-6)
    assert test[0]["accuracy"] > 0.5  # it learnt something: the check is not one of chance guesses (1/3)


def test_a_skipped_image_is_named_once_however_often_it_comes_up(tmp_path, capsys):
    root = write_splits(tmp_path / "images", sizes={"train": 4, "val": 2, "test": 2})
    bad = root / "train" / "left" / "1.png"
    bad.write_bytes(bad.read_bytes()[:60])  # its header reads, its pixels do not
    run = ["train", *FOLDER_RUN, f"data.path={root}", "data.skip_corrupt=true", "train.batch_size=4",
           "train.steps=6", "train.eval_every=3", "train.eval_batch_size=4", "optim.warmup_steps=1"]  # fmt: skip
    assert cli.main([*run, "--workdir", str(tmp_path / "run")]) == 0  # met in the statistics and in training
    out, err = capsys.readouterr()
    lines = [line for line in (out + err).splitlines() if "1.png" in line]
    assert lines == [f"jaxnet: warning: skipping {bad}: not a readable image (data.skip_corrupt=true); 1 file so far"]
    assert "UserWarning" not in err


def test_workers_stopped_by_an_error_leave_no_shared_memory_behind(tmp_path):
    """A loader of 2 grain workers stopped by an error in one: the process ends with the error
    alone, no "leaked shared_memory objects" from Python's resource tracker (which grain's
    in-flight batches used to leave it to clean up and report)."""
    import sys

    script = tmp_path / "stops.py"
    script.write_text(f"""
import sys
sys.path.insert(0, {str(Path(__file__).resolve().parents[1])!r})
import numpy as np
from jaxnet.data import image_workers
from jaxnet.errors import UserError

class Work:
    def __call__(self, k):
        if k == 5:
            raise UserError("an unreadable image in batch 5")
        return {{"image": np.full((64, 32, 32, 3), k, np.uint8), "label": np.arange(64, dtype=np.int32)}}

if __name__ == "__main__":
    try:
        for batch in image_workers.run_batches(Work(), 40, workers=2):
            pass
    except UserError as e:
        print("stopped:", e)
""")
    result = run_patiently([sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert result.returncode == 0 and result.stdout == "stopped: an unreadable image in batch 5\n", result.stderr
    assert "leaked" not in result.stderr and "resource_tracker" not in result.stderr, result.stderr


def test_predict_on_an_unreadable_image_gives_advice_predict_can_take(folder_run, tmp_path, capsys):
    run, root = folder_run
    photos = tmp_path / "photos"
    photos.mkdir()
    for name in ("a.png", "b.png"):
        (photos / name).write_bytes((root / "test" / "left" / "0.png").read_bytes())
    (photos / "b.png").write_bytes((photos / "b.png").read_bytes()[:60])
    assert cli.main(["predict", "--workdir", str(run), "--input", str(photos), "--out", str(tmp_path / "o.npy")]) == 2
    err = capsys.readouterr().err
    assert f"{photos / 'b.png'} is not a readable image" in err and err.count("\n") == 1, err
    assert "skip_corrupt" not in err and "remove it from --input" in err and not (tmp_path / "o.npy").exists()


def test_skip_corrupt_skips_an_unreadable_record_of_arrayrecord_shards(tmp_path):
    from array_record.python.array_record_module import ArrayRecordWriter

    root = write_folder(tmp_path / "f", per_class=2)
    files = sorted(root.rglob("*.png"))
    shard = tmp_path / "train-00000-of-00001.arrayrecord"
    writer = ArrayRecordWriter(str(shard), "group_size:1")
    for k, f in enumerate(files):
        data = f.read_bytes()
        writer.write(imagefiles.pack_record(k % 3, f"{f.parent.name}/{f.name}", data[:60] if k == 2 else data))
    writer.close()
    source = imagefiles.RecordSource([str(shard)], np.arange(len(files)) % 3)
    work = imagefiles.BatchWork(source, size=12, channels=1, batch_size=8, rows=slice(None), train=False,
                                skip_corrupt=True)  # fmt: skip
    batch = work(0)
    assert batch["mask"].tolist() == [1, 1, 0, 1, 1, 1, 0, 0]  # six records, the third unreadable, two of padding
    (name,) = batch["skipped"].tolist()
    assert name.startswith(f"{files[2].parent.name}/{files[2].name} (record 2 of")


def test_a_folder_smaller_than_val_size_says_what_val_size_would_fit(tmp_path, capsys):
    root = write_folder(tmp_path / "small", per_class=8)  # 24 images, no val/: the default holds out 5,000
    err = _error(tmp_path, capsys, "data.name=folder", f"data.path={root}")
    assert err == (
        "jaxnet: error: data.val_size=5000 leaves no training images (the folder has 24 and no val/ directory); "
        "hold out fewer, e.g. data.val_size=2 (a tenth), or give a val/ directory"
    )

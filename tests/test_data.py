"""Dataset readers (IDX, CIFAR-10 pickles) and the host batching pipeline."""

from __future__ import annotations

import collections
import gzip
import itertools
import pickle
import struct
import threading
from pathlib import Path

import numpy as np
import pytest
from conftest import FASHION_MNIST

import jaxnet.data
from jaxnet.config import DataConfig
from jaxnet.data import pipeline
from jaxnet.data.images import load_cifar10, load_idx_dataset, read_idx
from jaxnet.errors import UserError

FASHION_MNIST_DIR = FASHION_MNIST
HAS_FASHION_MNIST = FASHION_MNIST is not None


# ---------------------------------------------------------------------------------------------
# IDX files, written byte by byte


def idx_bytes(array: np.ndarray, type_code: int = 0x08) -> bytes:
    """An IDX file: two zero bytes, type code, ndim, big-endian uint32 dims, big-endian data."""
    header = struct.pack(">BBBB", 0, 0, type_code, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    big_endian = array.astype(array.dtype.newbyteorder(">"))
    return header + big_endian.tobytes()


def write_idx(path: Path, array: np.ndarray, type_code: int = 0x08) -> Path:
    data = idx_bytes(array, type_code)
    path.write_bytes(gzip.compress(data) if path.suffix == ".gz" else data)
    return path


@pytest.mark.parametrize("name", ["images-idx3-ubyte", "images-idx3-ubyte.gz"])
def test_read_idx_round_trips_uint8_values_plain_and_gzipped(tmp_path, name):
    values = np.random.default_rng(0).integers(0, 256, size=(3, 5, 4), dtype=np.uint8)
    path = write_idx(tmp_path / name, values)
    # the header is exactly what the IDX format specifies
    assert idx_bytes(values)[:16] == b"\x00\x00\x08\x03" + b"\x00\x00\x00\x03\x00\x00\x00\x05\x00\x00\x00\x04"
    out = read_idx(path)
    assert out.shape == (3, 5, 4)
    assert out.dtype == np.uint8
    np.testing.assert_array_equal(out, values)


def test_read_idx_converts_big_endian_int16_and_float32_to_native_values(tmp_path):
    ints = np.array([[1, -2, 300], [-32768, 32767, 258]], np.int16)
    floats = np.array([1.5, -0.25, 3.0e7], np.float32)
    out_ints = read_idx(write_idx(tmp_path / "ints-idx2", ints, type_code=0x0B))
    out_floats = read_idx(write_idx(tmp_path / "floats-idx1.gz", floats, type_code=0x0D))
    assert out_ints.dtype == np.int16 and out_ints.dtype.isnative
    assert out_floats.dtype == np.float32 and out_floats.dtype.isnative
    np.testing.assert_array_equal(out_ints, ints)
    np.testing.assert_array_equal(out_floats, floats)


def test_read_idx_rejects_wrong_magic_number_naming_the_file(tmp_path):
    path = tmp_path / "labels-idx1-ubyte"
    path.write_bytes(b"\x1f\x8b\x08\x01" + struct.pack(">I", 3) + bytes(3))
    with pytest.raises(UserError) as err:
        read_idx(path)
    assert str(path) in str(err.value)
    assert "not an IDX file" in str(err.value)
    assert "1f8b0801" in str(err.value)


def test_read_idx_rejects_unknown_type_code_and_empty_file(tmp_path):
    bad_type = tmp_path / "bad-type"
    bad_type.write_bytes(b"\x00\x00\x07\x01" + struct.pack(">I", 2) + bytes(2))
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    for path in (bad_type, empty):
        with pytest.raises(UserError, match="not an IDX file") as err:
            read_idx(path)
        assert str(path) in str(err.value)


@pytest.mark.parametrize("name", ["images-idx3-ubyte", "images-idx3-ubyte.gz"])
def test_read_idx_rejects_data_shorter_than_header_says(tmp_path, name):
    full = idx_bytes(np.zeros((4, 3, 3), np.uint8))
    path = tmp_path / name
    short = full[:-5]  # 5 bytes of pixel data missing
    path.write_bytes(gzip.compress(short) if name.endswith(".gz") else short)
    with pytest.raises(UserError) as err:
        read_idx(path)
    message = str(err.value)
    assert str(path) in message
    assert "truncated" in message
    assert f"has {len(short)} bytes" in message and f"needs {len(full)}" in message


def test_read_idx_rejects_trailing_bytes_beyond_what_the_header_says(tmp_path):
    full = idx_bytes(np.zeros((2, 3), np.uint8))
    path = tmp_path / "labels-idx2-ubyte"
    path.write_bytes(full + b"\x00\x01")
    with pytest.raises(UserError) as err:
        read_idx(path)
    assert str(path) in str(err.value)
    assert f"has {len(full) + 2} bytes but its header (2, 3) needs {len(full)}" in str(err.value)


def test_read_idx_rejects_file_cut_inside_its_header(tmp_path):
    path = tmp_path / "cut-header"
    path.write_bytes(b"\x00\x00\x08\x03" + struct.pack(">I", 10))  # 3 dims announced, 1 given
    with pytest.raises(UserError) as err:
        read_idx(path)
    assert str(path) in str(err.value)
    assert "truncated" in str(err.value)
    assert "needs 16 bytes" in str(err.value)


def test_read_idx_rejects_truncated_gzip_stream(tmp_path):
    data = idx_bytes((np.arange(2 * 28 * 28) % 7).astype(np.uint8).reshape(2, 28, 28))
    compressed = gzip.compress(data)
    path = tmp_path / "train-images-idx3-ubyte.gz"
    path.write_bytes(compressed[: len(compressed) // 2])
    with pytest.raises(UserError) as err:
        read_idx(path)
    message = str(err.value)
    assert str(path) in message
    assert "ended before the end-of-stream marker" in message  # i.e. the stream is truncated
    assert "damaged" in message


def test_read_idx_rejects_corrupted_gzip_stream(tmp_path):
    data = idx_bytes((np.arange(2 * 28 * 28) % 7).astype(np.uint8).reshape(2, 28, 28))
    compressed = bytearray(gzip.compress(data, mtime=0))
    compressed[10] ^= 0xFF  # first byte of the deflate stream: the block header becomes invalid
    path = tmp_path / "train-images-idx3-ubyte.gz"
    path.write_bytes(bytes(compressed))
    with pytest.raises(UserError) as err:
        read_idx(path)
    assert str(path) in str(err.value)
    assert "damaged" in str(err.value)


def write_idx_dataset(directory: Path, n_train: int, n_test: int, gz: bool = True) -> dict:
    rng = np.random.default_rng(1)
    arrays = {
        "train-images-idx3-ubyte": rng.integers(0, 256, size=(n_train, 28, 28), dtype=np.uint8),
        "train-labels-idx1-ubyte": rng.integers(0, 10, size=n_train, dtype=np.uint8),
        "t10k-images-idx3-ubyte": rng.integers(0, 256, size=(n_test, 28, 28), dtype=np.uint8),
        "t10k-labels-idx1-ubyte": rng.integers(0, 10, size=n_test, dtype=np.uint8),
    }
    for stem, array in arrays.items():
        write_idx(directory / (stem + (".gz" if gz else "")), array)
    return arrays


@pytest.mark.parametrize("gz", [True, False])
def test_load_idx_dataset_gives_nhwc_uint8_images_and_int32_labels(tmp_path, gz):
    arrays = write_idx_dataset(tmp_path, n_train=5, n_test=3, gz=gz)
    splits = load_idx_dataset(tmp_path)
    assert set(splits) == {"train", "test"}
    (x, y), (xt, yt) = splits["train"], splits["test"]
    assert x.shape == (5, 28, 28, 1) and x.dtype == np.uint8
    assert xt.shape == (3, 28, 28, 1) and xt.dtype == np.uint8
    assert y.shape == (5,) and y.dtype == np.int32
    assert yt.shape == (3,) and yt.dtype == np.int32
    np.testing.assert_array_equal(x[..., 0], arrays["train-images-idx3-ubyte"])
    np.testing.assert_array_equal(y, arrays["train-labels-idx1-ubyte"])
    np.testing.assert_array_equal(xt[..., 0], arrays["t10k-images-idx3-ubyte"])
    np.testing.assert_array_equal(yt, arrays["t10k-labels-idx1-ubyte"])


def test_load_idx_dataset_names_the_missing_file(tmp_path):
    write_idx_dataset(tmp_path, n_train=2, n_test=2)
    (tmp_path / "t10k-labels-idx1-ubyte.gz").unlink()
    with pytest.raises(UserError) as err:
        load_idx_dataset(tmp_path)
    assert "t10k-labels-idx1-ubyte" in str(err.value)
    assert str(tmp_path) in str(err.value)


def test_load_idx_dataset_rejects_missing_directory_and_mismatched_counts(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        load_idx_dataset(tmp_path / "nowhere")
    write_idx_dataset(tmp_path, n_train=4, n_test=2)
    write_idx(tmp_path / "train-labels-idx1-ubyte.gz", np.zeros(3, np.uint8))  # 4 images, 3 labels
    with pytest.raises(UserError, match=r"train images \(4, 28, 28\) and labels \(3,\) do not match"):
        load_idx_dataset(tmp_path)


# ---------------------------------------------------------------------------------------------
# CIFAR-10 python-pickle batches


def write_cifar_batch(path: Path, data: np.ndarray, labels: list[int]) -> None:
    batch = {
        b"batch_label": path.name.encode(),
        b"labels": labels,
        b"data": data,
        b"filenames": [f"img_{i}.png".encode() for i in range(len(labels))],
    }
    with open(path, "wb") as f:
        pickle.dump(batch, f, protocol=2)


def write_cifar(directory: Path, per_batch: int = 2) -> dict[str, tuple[np.ndarray, list[int]]]:
    rng = np.random.default_rng(2)
    batches = {}
    for name in [f"data_batch_{b}" for b in range(1, 6)] + ["test_batch"]:
        data = rng.integers(0, 256, size=(per_batch, 3072), dtype=np.uint8)
        labels = [int(v) for v in rng.integers(0, 10, size=per_batch)]
        batches[name] = (data, labels)
        write_cifar_batch(directory / name, data, labels)
    return batches


def test_load_cifar10_reads_all_batches_in_order_with_int32_labels(tmp_path):
    batches = write_cifar(tmp_path, per_batch=3)
    splits = load_cifar10(tmp_path)
    x, y = splits["train"]
    xt, yt = splits["test"]
    assert x.shape == (15, 32, 32, 3) and x.dtype == np.uint8
    assert xt.shape == (3, 32, 32, 3) and xt.dtype == np.uint8
    assert y.dtype == np.int32 and yt.dtype == np.int32
    expected_labels = sum((batches[f"data_batch_{b}"][1] for b in range(1, 6)), [])
    np.testing.assert_array_equal(y, expected_labels)
    np.testing.assert_array_equal(yt, batches["test_batch"][1])
    # batch 3's second row is train image 3 * 2 + 1
    np.testing.assert_array_equal(x[7, 0, 0], batches["data_batch_3"][0][1, [0, 1024, 2048]])


def test_load_cifar10_maps_channel_major_rows_to_nhwc_pixels(tmp_path):
    batches = write_cifar(tmp_path, per_batch=2)
    marked = np.zeros((2, 3072), np.uint8)
    r, c = 3, 17  # not on the diagonal, so a swapped H/W would show
    marked[0, 0 * 1024 + r * 32 + c] = 201  # red plane
    marked[0, 1 * 1024 + c * 32 + r] = 102  # green plane at the transposed position
    marked[1, 2 * 1024 + 31 * 32 + 0] = 53  # blue plane, last row, first column
    write_cifar_batch(tmp_path / "test_batch", marked, [4, 5])
    xt, _ = load_cifar10(tmp_path)["test"]
    assert xt[0, r, c, 0] == 201
    assert xt[0, c, r, 1] == 102
    assert xt[1, 31, 0, 2] == 53
    assert np.count_nonzero(xt) == 3
    # every pixel of a random batch, by the format's definition, with explicit loops
    data = batches["data_batch_1"][0]
    x, _ = load_cifar10(tmp_path)["train"]
    expected = np.empty((2, 32, 32, 3), np.uint8)
    for n in range(2):
        for ch in range(3):
            for row in range(32):
                for col in range(32):
                    expected[n, row, col, ch] = data[n, ch * 1024 + row * 32 + col]
    np.testing.assert_array_equal(x[:2], expected)


def test_load_cifar10_rejects_rows_that_are_not_3072_values(tmp_path):
    write_cifar(tmp_path)
    write_cifar_batch(tmp_path / "data_batch_2", np.zeros((2, 3000), np.uint8), [0, 1])
    with pytest.raises(UserError) as err:
        load_cifar10(tmp_path)
    assert "3072" in str(err.value)
    assert "data_batch_2" in str(err.value)
    assert "(2, 3000)" in str(err.value)


def test_load_cifar10_names_a_missing_batch_and_a_damaged_pickle(tmp_path):
    write_cifar(tmp_path)
    (tmp_path / "test_batch").unlink()
    with pytest.raises(UserError, match="has no test_batch"):
        load_cifar10(tmp_path)
    (tmp_path / "test_batch").write_bytes(b"\x80\x02}q\x00(")  # a pickle cut short
    with pytest.raises(UserError, match="cannot read CIFAR batch .*test_batch"):
        load_cifar10(tmp_path)


# ---------------------------------------------------------------------------------------------
# The real Fashion-MNIST, when installed


@pytest.fixture(scope="module")
def fashion_mnist():
    return load_idx_dataset(FASHION_MNIST_DIR)


@pytest.mark.skipif(not HAS_FASHION_MNIST, reason=f"Fashion-MNIST not installed in {FASHION_MNIST_DIR}")
def test_fashion_mnist_matches_its_published_sizes_labels_and_pixel_statistics(fashion_mnist):
    x, y = fashion_mnist["train"]
    xt, yt = fashion_mnist["test"]
    assert x.shape == (60000, 28, 28, 1) and xt.shape == (10000, 28, 28, 1)
    assert y.shape == (60000,) and yt.shape == (10000,)
    assert y[:10].tolist() == [9, 0, 0, 3, 0, 2, 7, 2, 5, 5]
    assert np.bincount(y).tolist() == [6000] * 10
    assert np.bincount(yt).tolist() == [1000] * 10
    pixels = x.astype(np.float64) / 255.0
    assert round(pixels.mean(), 3) == pytest.approx(0.286, abs=1e-9)
    assert round(pixels.std(), 3) == pytest.approx(0.353, abs=1e-9)


@pytest.mark.skipif(not HAS_FASHION_MNIST, reason=f"Fashion-MNIST not installed in {FASHION_MNIST_DIR}")
def test_load_fashion_mnist_holds_out_a_disjoint_validation_split(fashion_mnist):
    ds = jaxnet.data.load(DataConfig(val_size=5000))
    assert ds.num_classes == 10
    assert len(ds.train[0]) == 55000 and len(ds.train[1]) == 55000
    assert len(ds.val[0]) == 5000 and len(ds.val[1]) == 5000
    assert len(ds.test[0]) == 10000
    # train + val is exactly the original training set, each example used once: compare the
    # multisets of (image, label) rows, which also holds if the dataset has duplicate images
    x, y = fashion_mnist["train"]

    def rows(images: np.ndarray, labels: np.ndarray) -> collections.Counter:
        flat = images.reshape(len(images), -1)
        return collections.Counter(flat[i].tobytes() + bytes([labels[i]]) for i in range(len(flat)))

    full, train, val = rows(x, y), rows(*ds.train), rows(*ds.val)
    assert train + val == full
    assert sum(val.values()) == 5000
    # the training statistics used for normalisation come from the 55000 training images only
    expected_mean = ds.train[0].astype(np.float64).mean() / 255.0
    assert ds.mean.shape == (1,)
    assert ds.mean[0] == pytest.approx(expected_mean, rel=1e-6)


# ---------------------------------------------------------------------------------------------
# Pipeline


def test_split_validation_is_deterministic_disjoint_and_depends_only_on_val_size():
    n = 50
    x = np.arange(n) * 10
    y = np.arange(n)
    (xtr, ytr), (xv, yv) = pipeline.split_validation(x, y, 8)
    assert len(xv) == 8 and len(xtr) == 42
    np.testing.assert_array_equal(xtr, ytr * 10)  # images and labels stay paired
    np.testing.assert_array_equal(xv, yv * 10)
    assert set(ytr.tolist()).isdisjoint(yv.tolist())
    assert sorted(ytr.tolist() + yv.tolist()) == list(range(n))
    # the same val_size gives the same split, whatever the global numpy random state
    np.random.seed(123)
    (_, ytr2), (_, yv2) = pipeline.split_validation(x, y, 8)
    np.testing.assert_array_equal(yv2, yv)
    np.testing.assert_array_equal(ytr2, ytr)
    # the held-out examples depend on the data only through its length, not on the values
    (_, _), (xv3, _) = pipeline.split_validation(x[::-1].copy(), y, 8)
    np.testing.assert_array_equal(xv3, x[::-1][yv])
    # a larger val_size picks different examples (not just the first ones), in sorted order
    (_, _), (_, yv_big) = pipeline.split_validation(x, y, 20)
    assert len(yv_big) == 20 and np.all(np.diff(yv_big) > 0)
    assert yv.tolist() != list(range(8))


def test_batch_indices_cover_every_example_once_per_epoch():
    n, batch = 12, 3
    per_epoch = pipeline.steps_per_epoch(n, batch)
    assert per_epoch == 4
    for epoch in range(2):
        steps = range(epoch * per_epoch, (epoch + 1) * per_epoch)
        seen = np.concatenate([pipeline.batch_indices(n, batch, seed=7, step=s) for s in steps])
        assert sorted(seen.tolist()) == list(range(n))
    first = np.concatenate([pipeline.batch_indices(n, batch, 7, s) for s in range(4)])
    second = np.concatenate([pipeline.batch_indices(n, batch, 7, s) for s in range(4, 8)])
    assert first.tolist() != second.tolist()  # each epoch is a fresh shuffle
    # with a partial last batch: 10 examples, 3 per batch -> 3 steps, 9 distinct examples
    seen = np.concatenate([pipeline.batch_indices(10, 3, seed=7, step=s) for s in range(3)])
    assert len(seen) == 9 and len(set(seen.tolist())) == 9


def test_batch_indices_are_a_function_of_seed_and_step():
    a = pipeline.batch_indices(100, 10, seed=1, step=13)
    b = pipeline.batch_indices(100, 10, seed=1, step=13)
    c = pipeline.batch_indices(100, 10, seed=2, step=13)
    d = pipeline.batch_indices(100, 10, seed=1, step=14)
    assert a.shape == (10,)
    np.testing.assert_array_equal(a, b)
    assert a.tolist() != c.tolist()
    assert a.tolist() != d.tolist()


@pytest.mark.parametrize("do_augment", [False, True])
def test_train_batches_resumed_at_step_k_continue_the_uninterrupted_stream(do_augment):
    rng = np.random.default_rng(3)
    x = rng.integers(0, 256, size=(20, 6, 6, 1), dtype=np.uint8)
    y = np.arange(20, dtype=np.int32)
    mean, std = np.array([0.5], np.float32), np.array([0.25], np.float32)
    kw = dict(batch_size=4, seed=5, mean=mean, std=std, do_augment=do_augment)
    k = 7  # past the first epoch of 5 steps
    full = list(itertools.islice(pipeline.train_batches(x, y, start_step=0, **kw), k + 4))
    resumed = list(itertools.islice(pipeline.train_batches(x, y, start_step=k, **kw), 4))
    for a, b in zip(full[k:], resumed, strict=True):
        assert a["image"].shape == (4, 6, 6, 1) and a["image"].dtype == np.float32
        np.testing.assert_array_equal(a["image"], b["image"])
        np.testing.assert_array_equal(a["label"], b["label"])
    # the labels are the examples batch_indices picks, and the images are those examples
    for step, batch in enumerate(full):
        idx = pipeline.batch_indices(20, 4, 5, step)
        np.testing.assert_array_equal(batch["label"], idx)
        if not do_augment:
            np.testing.assert_allclose(batch["image"], (x[idx] / 255.0 - 0.5) / 0.25, rtol=1e-6, atol=1e-6)
    assert full[0]["label"].tolist() != full[5]["label"].tolist()
    if do_augment:
        # steps 0-4 and 5-9 are two epochs, each showing every example once: an example's crop
        # and flip are drawn afresh at each step, so the two epochs show it differently
        def by_example(batches):
            return {int(label): image for b in batches for label, image in zip(b["label"], b["image"], strict=True)}

        first, second = by_example(full[0:5]), by_example(full[5:10])
        assert sorted(first) == sorted(second) == list(range(20))
        assert sum(not np.array_equal(first[i], second[i]) for i in range(20)) >= 10


def test_train_batches_draw_fresh_augmentation_at_every_step():
    # every example is the same image, so batches can only differ through the augmentation
    image = np.random.default_rng(6).integers(1, 256, size=(6, 6, 1), dtype=np.uint8)
    x = np.repeat(image[None], 8, axis=0)
    y = np.zeros(8, np.int32)
    kw = dict(batch_size=4, seed=5, mean=np.zeros(1, np.float32), std=np.ones(1, np.float32))
    augmented = list(itertools.islice(pipeline.train_batches(x, y, start_step=0, do_augment=True, **kw), 6))
    plain = list(itertools.islice(pipeline.train_batches(x, y, start_step=0, do_augment=False, **kw), 6))
    assert all(np.array_equal(b["image"], plain[0]["image"]) for b in plain)
    distinct = {b["image"].tobytes() for b in augmented}
    assert len(distinct) == 6


def test_eval_batches_cover_every_example_once_with_a_mask_and_fixed_shape():
    x = np.arange(10, dtype=np.uint8).reshape(10, 1, 1, 1) * 20 + 5
    y = np.arange(10, dtype=np.int32) + 100
    mean, std = np.zeros(1, np.float32), np.ones(1, np.float32)
    batches = list(pipeline.eval_batches(x, y, batch_size=4, mean=mean, std=std))
    assert len(batches) == 3
    for b in batches:
        assert b["image"].shape == (4, 1, 1, 1) and b["image"].dtype == np.float32
        assert b["label"].shape == (4,) and b["mask"].shape == (4,)
    assert [b["mask"].tolist() for b in batches] == [[1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 0, 0]]
    real = np.concatenate([b["mask"] for b in batches]) == 1
    labels = np.concatenate([b["label"] for b in batches])[real]
    images = np.concatenate([b["image"] for b in batches])[real]
    np.testing.assert_array_equal(labels, y)
    np.testing.assert_allclose(images, x / 255.0, rtol=1e-6)
    # an exact multiple needs no padding
    exact = list(pipeline.eval_batches(x[:8], y[:8], batch_size=4, mean=mean, std=std))
    assert len(exact) == 2 and all(b["mask"].tolist() == [1, 1, 1, 1] for b in exact)


def brute_force_augment_candidates(image: np.ndarray, padding: int) -> list[tuple[int, int, bool, np.ndarray]]:
    """Every crop of the zero-padded image, flipped or not, built with plain loops."""
    h, w, ch = image.shape
    padded = np.zeros((h + 2 * padding, w + 2 * padding, ch), image.dtype)
    for i in range(h):
        for j in range(w):
            padded[i + padding, j + padding] = image[i, j]
    candidates = []
    for dy in range(2 * padding + 1):
        for dx in range(2 * padding + 1):
            crop = np.empty_like(image)
            for i in range(h):
                for j in range(w):
                    crop[i, j] = padded[dy + i, dx + j]
            mirrored = np.empty_like(crop)
            for j in range(w):
                mirrored[:, j] = crop[:, w - 1 - j]
            candidates.append((dy, dx, False, crop))
            candidates.append((dy, dx, True, mirrored))
    return candidates


def test_augment_output_is_a_padded_crop_or_its_mirror_of_each_input():
    images = np.random.default_rng(4).integers(1, 256, size=(24, 6, 5, 2), dtype=np.uint8)  # no zeros
    out = pipeline.augment(images, np.random.default_rng(9), padding=4)
    assert out.shape == images.shape and out.dtype == np.uint8
    np.testing.assert_array_equal(out, pipeline.augment(images, np.random.default_rng(9), padding=4))
    chosen = []
    for image, result in zip(images, out, strict=True):
        candidates = brute_force_augment_candidates(image, padding=4)
        assert len(candidates) == 81 * 2
        matches = [(dy, dx, flip) for dy, dx, flip, cand in candidates if np.array_equal(cand, result)]
        assert len(matches) == 1, matches  # exactly one of the 162 crops (the image has no zeros)
        chosen.append(matches[0])
    # the crops are really random: several offsets, both flipped and not
    assert len({(dy, dx) for dy, dx, _ in chosen}) >= 10
    assert {flip for _, _, flip in chosen} == {False, True}
    # the input is left alone
    assert np.count_nonzero(images == 0) == 0


def test_augment_without_padding_only_flips():
    images = np.random.default_rng(5).integers(0, 256, size=(16, 4, 4, 3), dtype=np.uint8)
    out = pipeline.augment(images, np.random.default_rng(0), padding=0)
    flipped = [bool(np.array_equal(o, i[:, ::-1])) for o, i in zip(out, images, strict=True)]
    same = [bool(np.array_equal(o, i)) for o, i in zip(out, images, strict=True)]
    assert all(f != s for f, s in zip(flipped, same, strict=True))  # exactly one of the two each time
    assert any(flipped) and any(same)


@pytest.mark.parametrize("size", [0, 1, 3])
def test_prefetch_yields_the_same_items_in_order(size):
    items = [{"i": i, "x": np.full(3, i)} for i in range(25)]
    placed = list(pipeline.prefetch(iter(items), size, place=lambda b: {**b, "placed": True}))
    assert [b["i"] for b in placed] == list(range(25))
    assert all(b["placed"] for b in placed)
    assert [b["x"].tolist() for b in placed] == [[i] * 3 for i in range(25)]


@pytest.mark.parametrize("size", [0, 2])
def test_prefetch_reraises_a_producer_error_in_the_consumer(size):
    def batches():
        yield 1
        yield 2
        raise ValueError("producer broke at item 3")

    consumer = pipeline.prefetch(batches(), size)
    assert next(consumer) == 1
    assert next(consumer) == 2
    with pytest.raises(ValueError, match="producer broke at item 3"):
        next(consumer)


def test_prefetch_reraises_an_error_from_place_and_runs_place_off_the_consumer_thread():
    threads = []

    def place(b):
        threads.append(threading.current_thread())
        if b == 2:
            raise RuntimeError("cannot place batch 2")
        return b * 10

    consumer = pipeline.prefetch(iter(range(5)), 2, place=place)
    assert next(consumer) == 0
    assert next(consumer) == 10
    with pytest.raises(RuntimeError, match="cannot place batch 2"):
        next(consumer)
    assert threading.current_thread() not in threads


def test_prefetch_closed_early_stops_and_joins_an_endless_producer():
    pulled = []

    def endless():
        for i in itertools.count():
            pulled.append(i)
            yield i

    before = set(threading.enumerate())
    consumer = pipeline.prefetch(endless(), 2)
    assert [next(consumer) for _ in range(3)] == [0, 1, 2]
    consumer.close()
    started = [t for t in threading.enumerate() if t not in before and t.name == "jaxnet-prefetch"]
    assert started == []  # the producer thread has finished, not been abandoned
    assert len(pulled) <= 3 + 2 + 2  # consumed + buffered + one in hand + the one that saw the stop

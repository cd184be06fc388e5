"""An image folder read by several processes: a 2-process run (``scripts/launch_local.sh``) trains
from a folder of PNG files like 1 process with as many devices, each process decoding only its
rows of every training and evaluation batch.

What each process decodes is recorded by a ``sitecustomize`` put on the processes' path (it wraps
:class:`jaxnet.data.imagefiles.BatchWork` and the file reads when that module is imported; see
tests/multiprocess_runs.py), and checked against the files that numpy's permutations of the
documented index rule put in each batch."""

from __future__ import annotations

import sys

import multiprocess_runs
import numpy as np
import pytest
from test_imagefiles import SPLIT_SIZES, write_splits

SEED, BATCH, STEPS, EVAL_BATCH = 0, 8, 10, 8
CLASSES = ["bottom", "left", "right"]  # write_splits' classes, sorted: the label ids
RUN = [
    "cnn_fashion_mnist:smoke",
    "data.name=folder",
    "data.workers=0",
    "train.progress=false",
    f"train.batch_size={BATCH}",
    f"train.steps={STEPS}",
    "train.eval_every=5",
    f"train.eval_batch_size={EVAL_BATCH}",
    f"seed={SEED}",
    "mesh.data=-1",
]

# Recorded per process in $JAXNET_TEST_SPY/process-ID.jsonl: every batch it decodes (training:
# step; evaluation: split and index), the rows of it, the files read to make them, labels, mask.
SPY = r"""
def _install(imagefiles):
    files, work = imagefiles.FileSource, imagefiles.BatchWork
    read, call = files.read, work.__call__

    def spy_read(self, i):
        if getattr(_LOCAL, "reads", None) is not None:
            _LOCAL.reads.append(self.names[i])
        return read(self, i)

    def spy_call(self, k):
        _LOCAL.reads = []
        try:
            batch = call(self, k)
        finally:
            reads, _LOCAL.reads = _LOCAL.reads, None
        rows = [self.rows.start or 0, self.batch_size if self.rows.stop is None else self.rows.stop]
        record = {"kind": "train" if self.train else "eval", "split": os.path.basename(self.source.root),
                  "rows": rows, "read": reads, "labels": batch["label"].tolist(), "mask": batch["mask"].tolist()}
        if self.train:
            record["step"] = self.start + int(k)
        else:
            record["index"] = int(k)
        _log(record)
        return batch

    files.read, work.__call__ = spy_read, spy_call
"""


def _names(split: str) -> list[str]:
    """The files of ``split`` in the dataset's order: classes sorted, then file names sorted."""
    return [f"{c}/{i}.png" for c in CLASSES for i in sorted(range(SPLIT_SIZES[split]), key=str)]


def _batch(step: int) -> list[str]:
    """The files of training batch ``step`` by the index rule (jaxnet.data.pipeline.batch_indices):
    a permutation of the training images drawn from (seed, epoch), cut into whole batches."""
    names = _names("train")
    epoch, index = divmod(step, len(names) // BATCH)
    order = np.random.default_rng([SEED, epoch]).permutation(len(names))
    return [names[i] for i in order[index * BATCH : (index + 1) * BATCH]]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("images-multiprocess")
    multiprocess_runs.write_spy(tmp / "site", "jaxnet.data.imagefiles", SPY)
    args = [*RUN, f"data.path={write_splits(tmp / 'images')}"]
    one = [sys.executable, "-m", "jaxnet", "train", *args, "--workdir", str(tmp / "one")]
    two = [multiprocess_runs.LAUNCH, "2", *args, "--workdir", str(tmp / "two")]
    return {
        "tmp": tmp,
        "one": multiprocess_runs.run(one, 2, tmp / "spy-one"),
        "two": multiprocess_runs.run(two, 1, tmp / "spy-two"),
    }


@pytest.mark.slow  # two training runs in subprocesses, one of 2 processes: 22 s alone on the shared 2-core machine
def test_two_processes_train_from_a_folder_like_one_and_each_decodes_only_its_rows(runs):
    tmp = runs["tmp"]
    assert "on 2 cpu device(s)" in runs["two"].stdout and "data=2" in runs["two"].stdout
    expected, got = multiprocess_runs.metrics(tmp / "one"), multiprocess_runs.metrics(tmp / "two")
    assert got.keys() == expected.keys()
    assert {(5, "val"), (STEPS, "val"), (STEPS, "test")} <= got.keys()
    assert "accuracy" in got[(STEPS, "test")]
    for key, record in expected.items():  # float32 reduction order: gloo's all-reduce against one process's
        for metric in ("loss", "accuracy"):
            if metric in record:
                assert got[key][metric] == pytest.approx(record[metric], rel=1e-5, abs=1e-6), (key, metric)

    one, two = multiprocess_runs.records(tmp / "spy-one"), multiprocess_runs.records(tmp / "spy-two")
    assert sorted(one) == [0] and sorted(two) == [0, 1]
    halves = {0: [0, BATCH // 2], 1: [BATCH // 2, BATCH]}

    # Training: every step's files by the index rule; each process read only those of its rows
    # (each once), the one process all of them.
    for step in range(STEPS):
        wanted = _batch(step)
        whole = [r for r in one[0] if r["kind"] == "train" and r["step"] == step]
        assert len(whole) == 1 and whole[0]["rows"] == [0, BATCH] and whole[0]["read"] == wanted, step
        assert whole[0]["labels"] == [CLASSES.index(n.split("/")[0]) for n in wanted]
        for process, (start, stop) in halves.items():
            mine = [r for r in two[process] if r["kind"] == "train" and r["step"] == step]
            assert len(mine) == 1 and mine[0]["rows"] == [start, stop], (process, step)
            assert mine[0]["read"] == wanted[start:stop], (process, step)
    for process, rows in halves.items():
        assert all(r["rows"] == rows for r in two[process] if r["kind"] == "train")

    # Evaluation: batch k of a split holds its examples k*8 .. k*8+7; each process read the files
    # of its rows of it (padding past the end masked), together every file once per evaluation.
    for split, evaluations in (("val", 2), ("test", 1)):
        names = _names(split)
        covered: list[str] = []
        for process, (start, stop) in halves.items():
            batches = [r for r in two[process] if r["kind"] == "eval" and r["split"] == split]
            assert sum(r["index"] == 0 for r in batches) == evaluations, (process, split)
            for r in batches:
                first = r["index"] * EVAL_BATCH
                assert r["rows"] == [start, stop]
                assert r["read"] == names[first + start : first + stop], (process, split, r["index"])
                assert sum(r["mask"]) == len(r["read"]) and len(r["mask"]) == stop - start
                covered += r["read"]
        assert sorted(covered) == sorted(names * evaluations), split
        whole = [r for r in one[0] if r["kind"] == "eval" and r["split"] == split]
        assert whole and all(r["rows"] == [0, EVAL_BATCH] for r in whole)
        assert sorted(n for r in whole for n in r["read"]) == sorted(names * evaluations)

"""jaxnet as a library: a user's own Flax model, arrays, task and periodic action get a full run
directory, exact evaluation and one-line errors."""

from __future__ import annotations

import json

import flax.linen as nn
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from conftest import MLP, arrays_config, linear_data

import jaxnet
from jaxnet import observe


class Rows:
    """An indexable dataset (len and [i] -> dict), as grain's MapDataset or a PyTorch Dataset is."""

    def __init__(self, columns: dict[str, np.ndarray]):
        self.columns = columns

    def __len__(self) -> int:
        return len(self.columns["x"])

    def __getitem__(self, i: int) -> dict[str, np.ndarray]:
        return {k: v[i] for k, v in self.columns.items()}


DATA = {"train": linear_data(256, 0), "val": linear_data(40, 1), "test": linear_data(50, 2)}
SETTINGS = [
    "optim.lr=1e-2",
    "train.steps=40",
    "train.batch_size=16",
    "train.eval_batch_size=32",  # 50 test rows: a full batch and a padded one
    "train.log_every=10",
    "train.eval_every=20",
    "train.checkpoint_every=20",
]


def config(*extra: str) -> jaxnet.Config:
    return arrays_config("library", SETTINGS, *extra)


def test_own_model_data_task_and_action_get_everything_a_built_in_run_gets(tmp_path):
    seen = []

    def weight_norm(loop):
        seen.append(loop.step)
        loop.log({"weight_norm": optax.global_norm(loop.state.params)})

    task = jaxnet.tasks.regression(inputs="x", target="y")
    summary = jaxnet.train(
        config(),
        tmp_path / "run",
        model=MLP(),
        dataset=jaxnet.data.arrays(**DATA),
        task=task,
        actions=[jaxnet.every(10, weight_norm)],
    )
    assert seen == [10, 20, 30, 40]
    test = summary["test"]
    assert set(test) == {"loss", "mse", "mae", "r2"} and test["r2"] > 0.5  # an untrained model is near 0 or below
    y = DATA["test"]["y"].astype(np.float64)
    np.testing.assert_allclose(test["r2"], 1 - test["mse"] / y.var(), rtol=1e-5)  # R^2 over the whole split
    assert summary["model"] == "MLP"
    records = observe.read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in records if "weight_norm" in r] == [10, 20, 30, 40]
    assert [r["step"] for r in records if r["split"] == "val"] == [20, 40]
    assert sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir() if p.name.isdigit()) == ["20", "40"]
    assert (tmp_path / "run" / "curves.png").read_bytes()[:4] == b"\x89PNG"
    assert json.loads((tmp_path / "run" / "config.json").read_text())["data"]["name"] == "arrays"
    # the saved run evaluates to the same numbers when handed the same model, data and task
    again = jaxnet.evaluate(tmp_path / "run", "test", model=MLP(), dataset=jaxnet.data.arrays(**DATA), task=task)
    assert {k: again[k] for k in summary["test"]} == summary["test"]


def test_an_indexable_dataset_trains_exactly_like_the_same_arrays(tmp_path):
    runs = {}
    for name, wrap in (("arrays", dict), ("rows", Rows)):
        data = jaxnet.data.arrays(**{split: wrap(columns) for split, columns in DATA.items()})
        runs[name] = jaxnet.train(
            config("train.steps=10"), tmp_path / name, model=MLP(), dataset=data, task=jaxnet.tasks.regression()
        )
    assert runs["rows"]["test"] == runs["arrays"]["test"]


class Ragged(Rows):
    """Rows whose item ``odd`` has one feature too few."""

    def __init__(self, columns: dict[str, np.ndarray], odd: int):
        super().__init__(columns)
        self.odd = odd

    def __getitem__(self, i: int) -> dict[str, np.ndarray]:
        item = super().__getitem__(i)
        return {**item, "x": item["x"][:2]} if i == self.odd else item


def test_items_of_different_shapes_name_the_split_item_key_and_shapes(tmp_path):
    data = jaxnet.data.arrays(train=Rows(DATA["train"]), val=Ragged(DATA["val"], odd=13))
    with pytest.raises(jaxnet.UserError) as info:
        task = jaxnet.tasks.regression()
        jaxnet.train(config("train.steps=4"), tmp_path / "run", model=MLP(), dataset=data, task=task)
    assert str(info.value) == (
        "val split: item 13's 'x' has shape (2,) but item 0's has (3,); "
        "give every item the same shape (pad or crop them)"
    )


def test_a_ragged_item_from_an_experiment_file_is_exit_2_and_one_line(tmp_path, capsys):
    from jaxnet import cli

    path = tmp_path / "ragged.py"
    path.write_text(
        "import flax.linen as nn\nimport numpy as np\nimport jaxnet\n\n"
        "class Linear(nn.Module):\n"
        "    @nn.compact\n"
        "    def __call__(self, x, train=False):\n        return nn.Dense(1)(x)[:, 0]\n\n"
        "def model(cfg):\n    return Linear()\n\n"
        "class Items:\n"
        "    def __len__(self):\n        return 8\n"
        "    def __getitem__(self, i):\n"
        "        return {'x': np.ones(3 if i != 5 else 4, np.float32), 'y': np.float32(i)}\n\n"
        "def data(cfg):\n    return jaxnet.data.arrays(train=Items())\n\n"
        "def task(cfg):\n    return jaxnet.tasks.regression()\n\n"
        "def get_config(variant):\n"
        "    return jaxnet.apply_overrides(jaxnet.Config(), ['data.name=arrays', "
        "'train.batch_size=8', 'train.steps=1', 'train.progress=false'])\n"
    )
    assert cli.main(["train", str(path), "--workdir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.splitlines() == [
        "jaxnet: error: train split: item 5's 'x' has shape (4,) but item 0's has (3,); "
        "give every item the same shape (pad or crop them)"
    ]


def vector_loss(out, batch):
    return (out - batch["y"]) ** 2


class Broken(nn.Module):
    @nn.compact
    def __call__(self, x, train=False):
        return nn.Dense(1)(x.reshape(5, -1))  # 3 features do not fill 5 rows


BAD_LIBRARY_INPUT = [
    (lambda: dict(task=jaxnet.Task(inputs="x", loss=vector_loss)), "the loss returns shape (1,), not a scalar"),
    (
        lambda: dict(
            task=jaxnet.Task(inputs="x", loss=lambda out, b: jnp.mean(out), metrics={"raw": lambda out, b: out})
        ),
        "metric 'raw' returns shape (1,)",
    ),
    (lambda: dict(task=jaxnet.tasks.regression(inputs="z")), "feeds batch key 'z' to the model, but the data has"),
    (
        lambda: dict(task=jaxnet.tasks.regression(), model=Broken()),
        "model Broken failed on a batch of (x float32[1, 3]",
    ),
    (lambda: dict(task=None), "your data has no default task"),
    (lambda: dict(task=jaxnet.tasks.regression(), actions=[print]), "has no 'every'"),
    (lambda: dict(task=jaxnet.tasks.regression(), model=lambda x: x), "pass a Flax Linen module"),
]


@pytest.mark.parametrize("make, words", BAD_LIBRARY_INPUT, ids=[w for _, w in BAD_LIBRARY_INPUT])
def test_bad_library_input_is_one_line_before_anything_is_written(tmp_path, make, words):
    kwargs = {"model": MLP(), "dataset": jaxnet.data.arrays(**DATA), **make()}
    with pytest.raises(jaxnet.UserError) as info:
        jaxnet.train(config(), tmp_path / "run", **kwargs)
    assert words in str(info.value) and "\n" not in str(info.value)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "splits, words",
    [
        ({"train": {"x": np.zeros((10, 3)), "y": np.zeros(9)}}, "arrays of different lengths (x has 10, y has 9)"),
        ({"train": {"x": np.zeros((10, 3))}, "val": {"x": np.zeros((4, 2))}}, "'x' examples have shape (2,)"),
        ({"train": {"x": np.zeros((10, 3))}, "test": {"z": np.zeros((4, 3))}}, "test split has keys z but train"),
        ({"train": [1, 2, 3]}, "list[0] is a int; items must be dicts of arrays"),
        ({"train": 5}, "train split is a int; expected a dict of arrays"),
        ({"train": {"x": np.zeros((0, 3))}}, "the train split is empty"),
    ],
)
def test_malformed_arrays_are_one_line_errors(splits, words):
    with pytest.raises(jaxnet.UserError) as info:
        jaxnet.data.arrays(**splits)
    assert words in str(info.value)

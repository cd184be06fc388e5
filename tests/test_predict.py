"""jaxnet.load and predict: a run directory becomes a model that predicts as the run evaluated,
with the training preprocessing saved in the run, in evaluation mode, for built-in and own models."""

from __future__ import annotations

import json

import flax.linen as nn
import jax
import numpy as np
import pytest
from conftest import MLP, arrays_config, linear_data, run_patiently, tiny_config

import jaxnet
from jaxnet import cli

DATA = {"train": linear_data(256, 0), "val": linear_data(40, 1), "test": linear_data(50, 2)}
SETTINGS = [
    "optim.lr=1e-2",
    "train.steps=20",
    "train.batch_size=16",
    "train.eval_batch_size=32",
    "train.checkpoint_every=10",
]


def train_own(workdir, model, *extra: str) -> dict:
    cfg = arrays_config("own", SETTINGS, *extra)
    task = jaxnet.tasks.regression(inputs="x", target="y")
    return jaxnet.train(cfg, workdir, model=model, dataset=jaxnet.data.arrays(**DATA), task=task)


@pytest.fixture(scope="module")
def mlp_run(tmp_path_factory):
    """A user's own Linen MLP trained from Python on arrays (regression), 20 steps."""
    workdir = tmp_path_factory.mktemp("predict") / "mlp"
    return workdir, train_own(workdir, MLP())


@pytest.fixture(scope="module")
def image_run(tmp_path_factory, quadrants):
    """The built-in ConvNet trained on the user's own uint8 images (normalised by jaxnet), 12 steps."""
    workdir = tmp_path_factory.mktemp("predict") / "images"
    return workdir, jaxnet.train(tiny_config(), workdir, dataset=quadrants)


def test_an_own_linen_model_predicts_what_its_parameters_compute(mlp_run):
    workdir, summary = mlp_run
    trained = jaxnet.load(workdir, model=MLP())
    x = DATA["test"]["x"]
    predicted = trained.predict(x)
    by_hand = MLP().apply({"params": jaxnet.load_params(workdir)}, x)  # the checkpoint's newest weights
    np.testing.assert_allclose(predicted, by_hand, rtol=1e-6, atol=1e-6)
    assert trained.step == 20 and predicted.shape == (50,)
    # the run's own test mse, from the predictions
    mse = np.mean((predicted.astype(np.float64) - DATA["test"]["y"]) ** 2)
    np.testing.assert_allclose(mse, summary["test"]["mse"], rtol=1e-5)
    # a dict by batch key, and a last batch padded (50 = 3 x 16 + 2), give the same outputs
    np.testing.assert_allclose(trained.predict({"x": x, "y": x[:, 0]}, batch_size=16), predicted, rtol=1e-6)


def test_a_python_trained_run_records_what_it_trained_and_eval_names_jaxnet_evaluate(mlp_run, capsys):
    workdir, _ = mlp_run
    trained = json.loads((workdir / "config.json").read_text())["_run"]["trained"]
    assert trained == {
        "model": {"class": "MLP", "module": "conftest", "from": "python"},
        "data": {"kind": "arrays", "name": "arrays", "from": "python"},
        "task": {"name": "regression", "from": "python"},
    }
    assert cli.main(["eval", "--workdir", str(workdir)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert "trained from Python with your own model MLP (module conftest) and data (arrays), which" in err
    assert "jaxnet.evaluate(workdir, model=..., dataset=..., task=...)" in err
    with pytest.raises(jaxnet.UserError, match=r"your own model MLP .*jaxnet.load\(workdir, model=\.\.\.\)"):
        jaxnet.load(workdir)


class Noisy(nn.Module):
    """Dropout and BatchNorm: in training two calls differ and statistics move; in evaluation neither."""

    @nn.compact
    def __call__(self, x, train=False):
        h = nn.BatchNorm(use_running_average=not train)(nn.Dense(32)(x))
        return nn.Dense(1)(nn.Dropout(0.5, deterministic=not train)(nn.relu(h)))[..., 0]


def test_predict_is_in_evaluation_mode(tmp_path):
    workdir = tmp_path / "noisy"
    train_own(workdir, Noisy())
    trained = jaxnet.load(workdir, model=Noisy())
    x = DATA["test"]["x"]
    first, second = trained.predict(x), trained.predict(x)
    np.testing.assert_array_equal(first, second)  # no dropout
    saved = jaxnet.checkpoint.load_state(workdir)
    stats = saved["model_state"]["batch_stats"]
    assert not np.allclose(stats["BatchNorm_0"]["mean"], 0)  # training moved the running mean
    variables = {"params": saved["params"], "batch_stats": stats}
    np.testing.assert_allclose(first, Noisy().apply(variables, x, train=False), rtol=1e-5, atol=1e-6)


def test_images_are_normalised_with_the_training_statistics_numpy_computes(image_run, quadrants):
    workdir, summary = image_run
    record = json.loads((workdir / "inputs.json").read_text())
    train_images = quadrants.train[0].astype(np.float64) / 255  # the training split only
    mean, std = train_images.mean(axis=(0, 1, 2)), train_images.std(axis=(0, 1, 2))
    np.testing.assert_allclose(record["normalize"]["mean"], mean, rtol=1e-6)
    np.testing.assert_allclose(record["normalize"]["std"], std, rtol=1e-6)
    assert record["inputs"] == [{"key": "image", "shape": [8, 8, 1], "dtype": "uint8"}] and record["outputs"] == 4
    trained = jaxnet.load(workdir)  # the built-in model, rebuilt from config.json
    x, y = quadrants.test
    (prepared,) = trained.preprocess(x)
    np.testing.assert_allclose(prepared, (x / 255 - mean) / std, rtol=1e-5, atol=1e-6)
    # predictions from raw images reproduce the run's own test accuracy, example for example
    correct = int((trained.predict(x).argmax(-1) == y).sum())
    assert correct == round(summary["test"]["accuracy"] * len(y))


# The README's lines that run an exported model, in a Python that never imports jaxnet.
RUN_EXPORTED = """
import sys
import numpy as np
from jax import export
with open("model.jax", "rb") as f:
    exported = export.deserialize(bytearray(f.read()))
np.save("outputs.npy", np.asarray(exported.call(np.load("images.npy"))))
assert not any(name.startswith("jaxnet") for name in sys.modules)
"""


def test_an_exported_model_runs_with_jax_alone(image_run, quadrants, tmp_path):
    import sys

    from conftest import cpu_env

    workdir, _ = image_run
    trained = jaxnet.load(workdir)
    trained.export(tmp_path / "model.jax")
    x = quadrants.test[0][:37]  # any batch size, raw uint8 images: the normalisation is inside
    np.save(tmp_path / "images.npy", x)
    result = run_patiently(
        [sys.executable, "-c", RUN_EXPORTED], cwd=tmp_path, env=cpu_env(), capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    np.testing.assert_allclose(np.load(tmp_path / "outputs.npy"), trained.predict(x), rtol=1e-5, atol=1e-5)


def test_step_best_reads_the_best_checkpoint_the_run_names(mlp_run, tmp_path):
    import shutil

    workdir = shutil.copytree(mlp_run[0], tmp_path / "run")
    with pytest.raises(jaxnet.UserError, match="no best checkpoint: train with train.keep_best=METRIC"):
        jaxnet.load(workdir, "best", model=MLP())
    record = {"format": "jaxnet-best-checkpoint/1", "step": 10, "metric": "val/loss", "mode": "min", "value": 0.5}
    (workdir / "checkpoints" / "best.json").write_text(json.dumps(record))
    best = jaxnet.load(workdir, "best", model=MLP())
    assert best.step == 10
    expected = jaxnet.load_params(workdir, step=10)
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(best.params), expected)


@pytest.mark.parametrize(
    "inputs, message",
    [
        (np.zeros((4, 8, 8), np.uint8), "input 'image' has shape (4, 8, 8); the run was trained on uint8 (N, 8, 8, 1)"),
        (
            np.zeros((4, 8, 8, 1), np.float32),
            "input 'image' is float32 (floating-point) but the run was trained on uint8 (N, 8, 8, 1); "
            "convert it (x.astype('uint8')) or pass cast=True (jaxnet predict: --cast)",
        ),
        (np.full((4, 8, 8, 1), 300), "holds values 300..300, outside uint8's 0..255"),
        ({"x": np.zeros((4, 8, 8, 1), np.uint8)}, "the inputs have no 'image'; the model takes image"),
    ],
)
def test_bad_inputs_to_predict_are_one_line_errors(image_run, inputs, message):
    trained = jaxnet.load(image_run[0])
    with pytest.raises(jaxnet.UserError) as e:
        trained.predict(inputs)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_another_dtype_kind_than_training_is_an_error_unless_cast(mlp_run):
    # The run trained on float32 x; integers were silently converted before.
    trained = jaxnet.load(mlp_run[0], model=MLP())
    x = np.array([[1, -2, 3], [0, 4, -1], [2, 2, 2]], np.int64)
    with pytest.raises(jaxnet.UserError) as e:
        trained.predict(x)
    assert str(e.value) == (
        "input 'x' is int64 (integer) but the run was trained on float32 (N, 3); convert it (x.astype('float32')) "
        "or pass cast=True (jaxnet predict: --cast) to convert it here"
    )
    want = trained.predict(x.astype(np.float32))
    np.testing.assert_array_equal(trained.predict(x, cast=True), want)
    np.testing.assert_array_equal(trained.predict(x.astype(np.float64)), want)  # another width of floats: converted


def test_built_in_image_runs_take_their_raw_integers_and_cast_floats_only_when_asked(image_run, quadrants, tmp_path):
    trained = jaxnet.load(image_run[0])
    images = quadrants.test[0][:5]
    want = trained.predict(images)
    np.testing.assert_array_equal(trained.predict(images.astype(np.int64)), want)  # integers of another width
    np.save(tmp_path / "floats.npy", images.astype(np.float32))
    argv = ["predict", "--workdir", str(image_run[0]), "--input", str(tmp_path / "floats.npy")]
    assert cli.main([*argv, "--out", str(tmp_path / "refused.npy")]) == 2
    assert not (tmp_path / "refused.npy").exists()
    assert cli.main([*argv, "--out", str(tmp_path / "cast.npy"), "--cast"]) == 0
    np.testing.assert_allclose(np.load(tmp_path / "cast.npy"), want, rtol=1e-6)
    with pytest.raises(jaxnet.UserError, match=r"holds non-integer values \(e.g. 0.5\) that cannot become the uint8"):
        trained.predict(np.full(images.shape, 0.5), cast=True)  # a cast never truncates silently


def test_a_run_from_before_the_record_still_fails_in_one_line_without_its_data(mlp_run, tmp_path):
    import shutil

    workdir = shutil.copytree(mlp_run[0], tmp_path / "old")
    saved = json.loads((workdir / "config.json").read_text())
    del saved["_run"]["trained"]
    (workdir / "config.json").write_text(json.dumps(saved))
    with pytest.raises(jaxnet.UserError, match=r"data.name=arrays is data given from Python .* dataset=jaxnet.data"):
        jaxnet.evaluate(workdir, model=MLP(), task=jaxnet.tasks.regression())

"""Config: experiment loading, key=value overrides with type conversion, and the errors."""

from __future__ import annotations

import json

import pytest

from jaxnet import config
from jaxnet.config import Config, apply_overrides, load_experiment
from jaxnet.errors import UserError


def test_overrides_convert_each_type():
    cfg = apply_overrides(
        Config(),
        ["optim.lr=0.05", "train.steps=3e3", "data.augment=yes", "model.features=16,32,64", "model.name=resnet"],
    )
    assert cfg.optim.lr == 0.05
    assert cfg.train.steps == 3000 and isinstance(cfg.train.steps, int)
    assert cfg.data.augment is True
    assert cfg.model.features == (16, 32, 64)
    assert cfg.model.name == "resnet"


def test_overrides_do_not_change_the_original():
    original = Config()
    apply_overrides(original, ["optim.lr=0.5"])
    assert original.optim.lr == Config().optim.lr


@pytest.mark.parametrize(
    "override, message",
    [
        ("optim.learning_rate=0.1", "did you mean optim.lr"),
        ("train.lr=0.1", "did you mean optim.lr"),
        ("train.step=10", "did you mean train.steps"),
        ("train.steps=ten", "train.steps='ten': expected an integer"),
        ("train.steps=2.5", "expected an integer"),
        ("train.steps=0", "train.steps=0 must be >= 1"),
        ("train.batch_size=-8", "must be >= 1"),
        ("optim.lr=nan", "expected a finite number"),
        ("optim.lr=inf", "expected a finite number"),
        ("optim.lr=-1", "must be >= 0.0"),
        ("data.augment=maybe", "expected true or false"),
        ("model.name=vgg", "is not one of: convnet, resnet"),
        ("model.features=", "non-empty"),
        ("model.features=16,0", "must be >= 1"),
        ("optim.grad_accum=3", "not divisible by optim.grad_accum=3"),
        ("mesh.data=0", "mesh.data=0"),
        ("steps", "not of the form key=value"),
    ],
)
def test_bad_overrides_name_the_problem(override, message):
    with pytest.raises(UserError, match=None) as excinfo:
        apply_overrides(Config(), [override])
    assert message in str(excinfo.value)
    assert "\n" not in str(excinfo.value)


def test_every_experiment_loads_with_default_and_smoke_variants():
    names = config.list_experiments()
    assert {"cnn_fashion_mnist", "resnet_cifar10"} <= set(names)
    for name in names:
        for variant in ("default", "smoke"):
            cfg = load_experiment(f"{name}:{variant}")
            assert cfg.experiment == (name if variant == "default" else f"{name}:{variant}")


def test_smoke_variant_is_smaller_than_default():
    assert load_experiment("cnn_fashion_mnist:smoke").train.steps < load_experiment("cnn_fashion_mnist").train.steps


def test_unknown_experiment_and_variant_are_rejected_with_suggestions():
    with pytest.raises(UserError, match="did you mean cnn_fashion_mnist"):
        load_experiment("cnn_fashion_mnst")
    with pytest.raises(UserError, match="variants: default, smoke"):
        load_experiment("cnn_fashion_mnist:huge")


def test_experiment_from_a_file_path(tmp_path):
    path = tmp_path / "mine.py"
    path.write_text(
        "from jaxnet.config import Config\n"
        "def get_config(variant='default'):\n"
        "    cfg = Config()\n"
        "    cfg.train.steps = 7\n"
        "    return cfg\n"
    )
    cfg = load_experiment(str(path), ["optim.lr=0.2"])
    assert (cfg.train.steps, cfg.optim.lr, cfg.experiment) == (7, 0.2, "mine")


def test_config_round_trips_through_json(tmp_path):
    cfg = load_experiment("resnet_cifar10:smoke", ["optim.lr=0.3"])
    config.save(cfg, tmp_path / "config.json")
    assert json.loads((tmp_path / "config.json").read_text())["model"]["features"] == [8, 16]
    assert config.load(tmp_path / "config.json") == cfg


def test_saved_config_with_unknown_key_is_rejected(tmp_path):
    tree = Config().to_dict()
    tree["optim"]["learningrate"] = 1.0
    (tmp_path / "config.json").write_text(json.dumps(tree))
    with pytest.raises(UserError, match="unknown config key 'optim.learningrate'"):
        config.load(tmp_path / "config.json")


def test_describe_lists_every_key_once():
    lines = config.describe().splitlines()
    assert len(lines) == len(config.KEYS)
    assert any(line.startswith("optim.lr ") and "peak learning rate" in line for line in lines)

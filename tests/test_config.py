"""Config: experiment loading, key=value overrides with type conversion, and the errors."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest

from jaxnet import config, models
from jaxnet.cli import main
from jaxnet.config import Config, ModelConfig, apply_overrides, load_experiment
from jaxnet.errors import UserError
from jaxnet.models import LSTMConfig, TransformerConfig


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
    assert len(lines) == len(config.keys())
    assert any(line.startswith("optim.lr ") and "peak learning rate" in line for line in lines)


# ---------------------------------------------------------------------------------------------
# Model families: each owns its model.* keys


def model_keys(cfg: Config) -> list[str]:
    return [k for k in config.keys(cfg) if k.startswith("model.")]


def test_show_config_of_a_cnn_lists_only_the_convnet_model_keys(capsys):
    assert main(["train", "cnn_fashion_mnist:smoke", "--show-config"]) == 0
    out = capsys.readouterr().out
    shown, _, keys = out.partition("\nkeys:\n")
    assert json.loads(shown)["model"] == {
        "name": "convnet",
        "features": [32, 64],
        "hidden": 256,
        "dropout": 0.25,
        "dtype": "auto",
        "param_dtype": "float32",
    }
    listed = [line.split()[0] for line in keys.splitlines() if line.startswith("model.")]
    assert listed == [f"model.{k}" for k in ("name", "features", "hidden", "dropout", "dtype", "param_dtype")]


def test_switching_family_keeps_the_fields_both_families_have():
    lstm = load_experiment("lstm_shakespeare:smoke", ["model.dtype=float32", "model.dropout=0.2"])
    # model.name is applied first wherever it stands, so model.heads is a key by then
    cfg = apply_overrides(lstm, ["model.heads=8", "model.name=transformer"])
    assert isinstance(cfg.model, TransformerConfig)
    assert (cfg.model.layers, cfg.model.width, cfg.model.dropout, cfg.model.dtype) == (2, 32, 0.2, "float32")
    assert (cfg.model.heads, cfg.model.causal) == (8, True)  # set, and the transformer's default
    assert model_keys(cfg) == [f"model.{k}" for k in cfg.to_dict()["model"]]
    assert "model.init_scale" not in model_keys(cfg) and "model.lstm_impl" not in model_keys(cfg)


def test_a_key_of_another_family_says_whose_it_is():
    with pytest.raises(UserError) as excinfo:
        apply_overrides(Config(), ["model.heads=4"])
    assert str(excinfo.value) == (
        "model.heads is not a key of model convnet (it belongs to transformer); "
        "the convnet keys are features, hidden, dropout, dtype, param_dtype"
    )


def test_renaming_the_model_in_place_names_the_config_class_to_use():
    cfg = Config()
    cfg.model.name = "resnet"  # the way to switch before each family had its own config
    with pytest.raises(UserError, match=re.escape("set cfg.model = ResNetConfig(...) rather than cfg.model.name")):
        config.validate(cfg)


def test_an_unknown_model_name_gets_the_nearest_registered_names():
    with pytest.raises(UserError, match="model.name='resnt' is not one of: .*; did you mean resnet"):
        apply_overrides(Config(), ["model.name=resnt"])


def test_an_old_config_json_with_every_familys_model_keys_still_loads(tmp_path):
    flat_model = {
        "name": "lstm", "features": [32, 64], "blocks": [2, 2, 2], "hidden": 256, "dropout": 0.0, "layers": 2,
        "width": 24, "heads": 4, "mlp_ratio": 4, "position": "learned", "tie_embeddings": False,
        "init_scale": 0.1, "dtype": "auto", "param_dtype": "float32", "attention": "auto", "lstm_impl": "auto",
        "remat": False,
    }  # fmt: skip
    tree = load_experiment("lstm_shakespeare:smoke").to_dict()
    del tree["task"], tree["data"]["mask_rate"]  # written before these keys existed
    (tmp_path / "config.json").write_text(json.dumps({**tree, "model": flat_model}))
    cfg = config.load(tmp_path / "config.json")
    assert cfg.model == LSTMConfig(layers=2, width=24, init_scale=0.1)
    with pytest.raises(UserError, match="model.heads is not a key of model lstm"):  # but not from the command line
        apply_overrides(cfg, ["model.heads=4"])


USER_MODEL = """
from dataclasses import dataclass

import flax.linen as nn

import jaxnet
from jaxnet.config import Config, field


@dataclass
class MLPConfig(jaxnet.ModelConfig):
    hidden: int = field(64, "hidden units", low=1)
    activation: str = field("relu", "nonlinearity", choices=("relu", "gelu"))

    def build(self, *, outputs, seq_len, batch_axis):
        return MLP(self.hidden, outputs)


class MLP(nn.Module):
    hidden: int
    classes: int

    @nn.compact
    def __call__(self, x, train=False):
        return nn.Dense(self.classes)(nn.relu(nn.Dense(self.hidden)(x.reshape(x.shape[0], -1))))


jaxnet.models.register("mlp", MLPConfig, inputs="images")


def get_config(variant="default"):
    cfg = Config()
    cfg.model = MLPConfig(hidden=32)
    return cfg
"""


@pytest.fixture
def registry():
    """The model registry, restored after the test."""
    saved = dict(models.REGISTRY)
    yield models.REGISTRY
    models.REGISTRY.clear()
    models.REGISTRY.update(saved)


def test_a_model_registered_by_an_experiment_file_has_checked_keys(tmp_path, registry):
    path = tmp_path / "mine.py"
    path.write_text(USER_MODEL)
    cfg = load_experiment(str(path), ["model.hidden=128", "model.dtype=float32"])
    assert (cfg.model.name, cfg.model.hidden, cfg.model.activation, cfg.model.dtype) == ("mlp", 128, "relu", "float32")
    assert config.experiment_module("mine").MLPConfig is type(cfg.model)
    assert model_keys(cfg) == ["model.name", "model.hidden", "model.activation", "model.dtype", "model.param_dtype"]
    for override, message in [
        ("model.hidden=many", "model.hidden='many': expected an integer"),
        ("model.hidden=0", "model.hidden=0 must be >= 1"),
        ("model.activation=tanh", "model.activation='tanh' is not one of: relu, gelu"),
        ("model.hiden=8", "unknown config key 'model.hiden'; did you mean model.hidden?"),
    ]:
        with pytest.raises(UserError, match=re.escape(message)):
            load_experiment(str(path), [override])
    module = models.build(cfg.model, 10)
    assert (module.hidden, module.classes) == (128, 10)
    tree = cfg.to_dict()
    assert config.from_dict(tree) == apply_overrides(cfg, [])
    convnet = apply_overrides(cfg, ["model.name=convnet"])
    assert (convnet.model.hidden, convnet.model.dtype) == (128, "float32")  # carried over by name and type


def test_register_refuses_a_config_field_overrides_cannot_set(registry):
    @dataclasses.dataclass
    class Listed(ModelConfig):
        sizes: list = dataclasses.field(default_factory=list)

    with pytest.raises(TypeError, match="Listed.sizes"):
        models.register("listed", Listed, lambda *args: None)
    with pytest.raises(ValueError, match="built-in"):
        models.register("convnet", models.ConvNetConfig, lambda *args: None)
    assert "listed" not in registry


def test_register_refuses_a_config_class_that_cannot_build_its_module(registry):
    @dataclasses.dataclass
    class Unbuildable(ModelConfig):
        hidden: int = config.field(8, "hidden units")

    with pytest.raises(TypeError, match=re.escape("Unbuildable for model unbuildable needs a build(self, *, outputs")):
        models.register("unbuildable", Unbuildable)
    assert "unbuildable" not in registry


def test_the_older_register_form_with_a_build_function_still_builds(registry):
    @dataclasses.dataclass
    class Older(ModelConfig):
        hidden: int = config.field(8, "hidden units")

    calls = []

    def build(cfg, n, seq_len, batch_axis):
        calls.append((cfg.dtype, n, seq_len))
        return "module"

    models.register("older", Older, build)
    cfg = apply_overrides(Config(), ["model.name=older", "model.hidden=16"])
    assert models.build(cfg.model, 10, 7, backend="cpu") == "module"
    assert calls == [("float32", 10, 7)]  # the function got the config resolved for the backend


def test_experiment_module_is_none_for_an_experiment_never_loaded():
    assert config.experiment_module("never_loaded_here") is None


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["data.mask_rate=0.9"], "data.mask_rate=0.9 must be <= 0.5"),
        (["model.name=transformer"], "language models (lstm, transformer) need text data"),
        (["model.name=resnet", "model.blocks=1"], "must have one entry per ResNet stage"),
    ],
)
def test_new_fields_and_family_checks(overrides, message):
    with pytest.raises(UserError, match=re.escape(message)):
        apply_overrides(Config(), overrides)


def test_arrays_data_and_a_task_are_accepted_with_any_model():
    cfg = apply_overrides(Config(), ["data.name=arrays", "model.name=transformer", "task=regression"])
    assert (cfg.data.name, cfg.model.name, cfg.task) == ("arrays", "transformer", "regression")
    assert cfg.data.mask_rate == 0.15


@pytest.mark.parametrize(
    "section, name, value, message",
    [
        ("optim", "learning_rate", 0.5, "unknown config key 'optim.learning_rate'; did you mean optim.lr?"),
        ("train", "step", 5, "unknown config key 'train.step'; did you mean train.steps?"),
        ("train", "lr", 0.1, "unknown config key 'train.lr'; did you mean optim.lr?"),
        ("model", "hiden", 8, "unknown config key 'model.hiden'; did you mean model.hidden?"),
        ("model", "heads", 2, "model.heads is not a key of model convnet (it belongs to transformer)"),
        ("mesh", "pipeline", 2, "unknown mesh axis 'pipeline' in mesh.pipeline; the mesh axes are mesh.data"),
        ("", "sed", 1, "unknown config key 'sed'; did you mean seed?"),
        ("train", "steps", "20", "train.steps='20': expected an integer (got str)"),
        ("train", "steps", 2.5, "train.steps=2.5: expected an integer (got float)"),
        ("optim", "lr", "fast", "optim.lr='fast': expected a number (got str)"),
        ("train", "progress", 0, "train.progress=0: expected true or false (got int)"),
        ("train", "trackers", "mlflow", "train.trackers='mlflow': expected a tuple of strings, e.g. ('mlflow',)"),
        ("model", "features", (8, "wide"), "model.features='wide': expected an integer (got str)"),
        ("", "optim", {"lr": 0.1}, "optim must be an OptimConfig; got a dict"),
    ],
)
def test_setting_a_config_attribute_from_python_is_checked_like_the_command_line(section, name, value, message):
    """A misspelt attribute raises the command line's "did you mean", and a wrong type names the
    field and the type, at the assignment: nothing is silently ignored or trained on."""
    cfg = Config()
    before = cfg.to_dict()
    with pytest.raises(UserError, match=re.escape(message)):
        setattr(getattr(cfg, section) if section else cfg, name, value)
    assert cfg.to_dict() == before


def test_values_set_from_python_are_stored_as_their_fields_type():
    cfg = Config()
    cfg.train.steps = 1e4  # an integral float, as 1e4 is written
    cfg.optim.lr = 1
    cfg.model.features = [8, 16]
    cfg.model = config.model_config("transformer")
    cfg.model.heads = 2
    assert (cfg.train.steps, cfg.optim.lr, type(cfg.optim.lr)) == (10000, 1.0, float)
    assert (cfg.model.heads, Config().model.features) == (2, (32, 64))
    convnet = Config().model
    convnet.features = [8, 16]
    assert convnet.features == (8, 16)
    # dataclasses.replace builds through the same checks, and still copies
    assert dataclasses.replace(cfg.optim, lr=0.5).lr == 0.5 and cfg.optim.lr == 1.0
    with pytest.raises(UserError, match=re.escape("optim.b1='x': expected a number")):
        dataclasses.replace(cfg.optim, b1="x")
    with pytest.raises(UserError, match=re.escape("unknown config key 'optim.learning_rate'; did you mean optim.lr?")):
        config.OptimConfig(learning_rate=0.1)


def test_a_users_model_config_gets_the_same_checks(registry):
    @dataclasses.dataclass
    class Wide(ModelConfig):
        width: int = config.field(8, "hidden units", low=1)

        def build(self, *, outputs, seq_len, batch_axis):
            return None

    models.register("wide", Wide)
    cfg = Config(model=Wide())
    with pytest.raises(UserError, match=re.escape("unknown config key 'model.widht'; did you mean model.width?")):
        cfg.model.widht = 16
    with pytest.raises(UserError, match=re.escape("model.width='16': expected an integer (got str)")):
        cfg.model.width = "16"
    cfg.model.width = 16
    assert apply_overrides(cfg, []).model.width == 16


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_a_non_finite_number_set_from_python_is_refused_as_the_command_line_refuses_it(value):
    cfg = Config()
    cfg.optim.lr = value
    with pytest.raises(UserError, match=re.escape(f"optim.lr={value}")):
        config.validate(cfg)
    with pytest.raises(UserError, match="a finite number"):
        config.apply_overrides(Config(), [f"optim.lr={value}"])

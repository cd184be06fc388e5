"""Any JAX model trains like a Linen module: a Flax NNX module, an Equinox module and two pure
functions (jaxnet.Model), given the same initial weights as a Linen MLP, train to the same losses,
resume exactly after a stop, evaluate, and fail in one line on bad input."""

from __future__ import annotations

import json

import equinox as eqx
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import arrays_config, run_patiently
from flax import nnx

import jaxnet

HIDDEN = 8


def classes(n: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 4)).astype(np.float32)
    return {"x": x, "y": (x[:, 0] + x[:, 1] > 0).astype(np.int32) + (x[:, 2] > 1).astype(np.int32)}


DATA = jaxnet.data.arrays(train=classes(64, 0), val=classes(16, 1), test=classes(24, 2))
TASK = jaxnet.tasks.classification(inputs="x", target="y")
SETTINGS = [
    "optim.lr=3e-2",
    "train.steps=6",
    "train.batch_size=8",
    "train.eval_batch_size=8",
    "train.log_every=1",
    "train.eval_every=3",
    "train.checkpoint_every=3",
]


def config(*extra: str) -> jaxnet.Config:
    return arrays_config("adapters", SETTINGS, *extra)


class LinenMLP(nn.Module):
    @nn.compact
    def __call__(self, x, train=False):
        return nn.Dense(3, name="out")(nn.relu(nn.Dense(HIDDEN, name="hidden")(x)))


def linen_params() -> dict:
    """The Linen MLP's initial parameters for the run's seed (as the trainer makes them)."""
    init_rng, _ = jax.random.split(jax.random.PRNGKey(0))
    return LinenMLP().init({"params": init_rng, "dropout": init_rng}, jnp.zeros((1, 4)))["params"]


class NNXMLP(nnx.Module):
    def __init__(self, params: dict):
        rngs = nnx.Rngs(0)
        self.hidden = nnx.Linear(4, HIDDEN, rngs=rngs)
        self.out = nnx.Linear(HIDDEN, 3, rngs=rngs)
        for name in ("hidden", "out"):
            getattr(self, name).kernel.value = params[name]["kernel"]
            getattr(self, name).bias.value = params[name]["bias"]

    def __call__(self, x):
        return self.out(nnx.relu(self.hidden(x)))


class EqxMLP(eqx.Module):
    hidden: eqx.nn.Linear
    out: eqx.nn.Linear

    def __init__(self, params: dict):
        keys = jax.random.split(jax.random.PRNGKey(0))
        hidden, out = eqx.nn.Linear(4, HIDDEN, key=keys[0]), eqx.nn.Linear(HIDDEN, 3, key=keys[1])
        # Equinox's Linear holds the weight as (out, in), Linen's Dense kernel as (in, out).
        put = lambda layer, p: eqx.tree_at(lambda m: (m.weight, m.bias), layer, (p["kernel"].T, p["bias"]))
        self.hidden, self.out = put(hidden, params["hidden"]), put(out, params["out"])

    def __call__(self, x, key=None):
        assert x.shape == (4,), "called on one example"
        return self.out(jax.nn.relu(self.hidden(x)))


def functions_mlp(params: dict) -> jaxnet.Model:
    def init(rng, x):
        return jax.tree.map(jnp.asarray, params)

    def apply(p, x, train, rng):
        h = jax.nn.relu(x @ p["hidden"]["kernel"] + p["hidden"]["bias"])
        return h @ p["out"]["kernel"] + p["out"]["bias"]

    return jaxnet.Model(init=init, apply=apply)


KINDS = {
    "nnx": NNXMLP,
    "equinox": EqxMLP,
    "functions": functions_mlp,
}


def train_losses(workdir) -> list[float]:
    rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in rows if r["split"] == "train"]


@pytest.fixture(scope="module")
def linen_run(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("linen") / "run"
    summary = jaxnet.train(config(), workdir, model=LinenMLP(), dataset=DATA, task=TASK)
    return workdir, summary


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_same_weights_train_to_the_same_losses_as_linen_and_resume_exactly(kind, linen_run, tmp_path):
    linen_dir, linen_summary = linen_run
    model = KINDS[kind](linen_params())
    summary = jaxnet.train(config(), tmp_path / "whole", model=model, dataset=DATA, task=TASK)
    expected = train_losses(linen_dir)
    assert len(expected) == 6
    np.testing.assert_allclose(train_losses(tmp_path / "whole"), expected, rtol=2e-6, atol=1e-7)
    np.testing.assert_allclose(summary["test"]["loss"], linen_summary["test"]["loss"], rtol=2e-6)
    assert summary["model"] == {"nnx": "NNXMLP", "equinox": "EqxMLP", "functions": "Model"}[kind]

    # Stopped after 3 steps, then resumed from the checkpoint: the same losses, bit for bit.
    jaxnet.train(config("train.stop_after=3"), tmp_path / "resumed", model=model, dataset=DATA, task=TASK)
    jaxnet.train(config(), tmp_path / "resumed", model=model, dataset=DATA, task=TASK)
    assert train_losses(tmp_path / "resumed") == train_losses(tmp_path / "whole")

    params = jaxnet.load_params(tmp_path / "whole")
    final = jaxnet.load_params(tmp_path / "resumed")
    assert jax.tree.map(np.shape, params) == jax.tree.map(np.shape, final)
    assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(final), strict=True))
    evaluated = jaxnet.evaluate(tmp_path / "whole", "test", model=model, dataset=DATA, task=TASK)
    assert evaluated["loss"] == pytest.approx(summary["test"]["loss"], rel=1e-6)

    # jaxnet.load rebuilds the model's variables from the checkpoint: it predicts what the Linen run does.
    x = DATA.splits["test"].columns["x"]
    logits = jaxnet.load(tmp_path / "whole", model=KINDS[kind](linen_params())).predict(x, batch_size=16)
    linen_logits = jaxnet.load(linen_dir, model=LinenMLP()).predict(x)
    np.testing.assert_allclose(logits, linen_logits, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_vmapped_two_member_sweep_trains_each_member_as_its_own_linen_run(kind, linen_run, tmp_path):
    linen_dir, _ = linen_run
    record = jaxnet.sweep(
        config(),
        {"optim.lr": [1e-2, 3e-2]},
        tmp_path / "sweep",
        model=KINDS[kind](linen_params()),
        dataset=DATA,
        task=TASK,
        members_at_once=2,
        say=lambda *_: None,
    )
    assert [m["complete"] for m in record["members"]] == [True, True]
    same_lr = tmp_path / "sweep" / "optim.lr=0.03"  # the Linen run's learning rate
    np.testing.assert_allclose(train_losses(same_lr), train_losses(linen_dir), rtol=1e-5)
    assert train_losses(tmp_path / "sweep" / "optim.lr=0.01") != train_losses(same_lr)
    if kind == "functions":  # a member's run directory loads like any run's (inputs.json is written there too)
        x = DATA.splits["test"].columns["x"]
        member = jaxnet.load(same_lr, model=KINDS[kind](linen_params())).predict(x)
        np.testing.assert_allclose(member, jaxnet.load(linen_dir, model=LinenMLP()).predict(x), rtol=1e-5, atol=1e-6)


class NNXNormed(nnx.Module):
    """BatchNorm statistics (model state the trainer carries) and dropout (from the module's Rngs)."""

    def __init__(self, rate: float):
        rngs = nnx.Rngs(params=1, dropout=2)
        self.hidden = nnx.Linear(4, HIDDEN, rngs=rngs)
        self.norm = nnx.BatchNorm(HIDDEN, rngs=rngs)
        self.drop = nnx.Dropout(rate, rngs=rngs)
        self.out = nnx.Linear(HIDDEN, 3, rngs=rngs)

    def __call__(self, x):
        return self.out(self.drop(nnx.relu(self.norm(self.hidden(x)))))


class EqxDropout(eqx.Module):
    hidden: eqx.nn.Linear
    drop: eqx.nn.Dropout
    out: eqx.nn.Linear

    def __init__(self):
        keys = jax.random.split(jax.random.PRNGKey(3))
        self.hidden, self.drop = eqx.nn.Linear(4, HIDDEN, key=keys[0]), eqx.nn.Dropout(0.5)
        self.out = eqx.nn.Linear(HIDDEN, 3, key=keys[1])

    def __call__(self, x, key=None):
        return self.out(self.drop(jax.nn.relu(self.hidden(x)), key=key))


def stopped_and_resumed(model, workdir) -> list[float]:
    jaxnet.train(config("train.stop_after=3"), workdir, model=model, dataset=DATA, task=TASK)
    jaxnet.train(config(), workdir, model=model, dataset=DATA, task=TASK)
    return train_losses(workdir)


def test_nnx_batch_statistics_are_carried_and_dropout_draws_from_the_step_key(tmp_path):
    summary = jaxnet.train(config(), tmp_path / "whole", model=NNXNormed(0.5), dataset=DATA, task=TASK)
    losses = train_losses(tmp_path / "whole")
    assert stopped_and_resumed(NNXNormed(0.5), tmp_path / "resumed") == losses
    jaxnet.train(config(), tmp_path / "no_dropout", model=NNXNormed(0.0), dataset=DATA, task=TASK)
    assert train_losses(tmp_path / "no_dropout")[0] != losses[0]  # the masks are drawn in training...
    again = jaxnet.evaluate(tmp_path / "whole", "test", model=NNXNormed(0.5), dataset=DATA, task=TASK)
    assert again["loss"] == pytest.approx(summary["test"]["loss"], rel=1e-6)  # ...and not in evaluation

    # The running statistics moved away from their initial 0 and 1 (momentum 0.99, 6 steps).
    from jaxnet.checkpoint import Checkpoints

    ckpts = Checkpoints(tmp_path / "whole" / "checkpoints", read_only=True)
    saved = ckpts._manager.item_metadata(6)["state"]
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    target = jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=device), saved)
    stats = ckpts.restore(target)["model_state"]["batch_stats"]["norm"]
    ckpts.close()
    assert set(stats) == {"mean", "var"}
    assert 0 < np.abs(np.asarray(stats["mean"])).max() < 1 and not np.allclose(stats["var"], 1)


def test_equinox_dropout_gets_a_key_per_example_in_training_and_none_in_evaluation(tmp_path):
    summary = jaxnet.train(config(), tmp_path / "whole", model=EqxDropout(), dataset=DATA, task=TASK)
    losses = train_losses(tmp_path / "whole")
    assert stopped_and_resumed(EqxDropout(), tmp_path / "resumed") == losses
    eval_model = eqx.nn.inference_mode(EqxDropout())
    params = jaxnet.load_params(tmp_path / "whole")
    trained = eqx.tree_at(
        lambda m: (m.hidden.weight, m.hidden.bias, m.out.weight, m.out.bias),
        eval_model,
        (params["hidden"]["weight"], params["hidden"]["bias"], params["out"]["weight"], params["out"]["bias"]),
    )
    test = classes(24, 2)
    logits = jax.vmap(trained)(jnp.asarray(test["x"]))
    expected = -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), test["y"][:, None], axis=1))
    assert summary["test"]["loss"] == pytest.approx(float(expected), rel=1e-5)
    earlier = jaxnet.load_params(tmp_path / "whole", step=3)
    assert not np.array_equal(earlier["out"]["weight"], params["out"]["weight"])
    with pytest.raises(jaxnet.UserError, match=r"has no checkpoint step 99 \(steps there: 3, 6\)$"):
        jaxnet.load_params(tmp_path / "whole", step=99)


class BatchFirst(eqx.Module):
    """Written for a batch, not for one example."""

    linear: eqx.nn.Linear

    def __init__(self):
        self.linear = eqx.nn.Linear(4, 3, key=jax.random.PRNGKey(0))

    def __call__(self, x, key=None):
        return jax.vmap(self.linear)(x)


def without_batch_axis(rng, x):
    return {"w": jnp.zeros((4, 3))}


BAD_MODELS = {
    "not a model": (lambda: (lambda x: x), "model is a function; pass a Flax Linen module, a Flax NNX module, an "
                    "Equinox module or jaxnet.Model(init=..., apply=...)"),
    "equinox on a batch": (BatchFirst, "Equinox model BatchFirst failed on one example (float32[4]): "),
    "wrong output shape": (
        lambda: jaxnet.Model(without_batch_axis, lambda p, x, train, rng: (x @ p["w"])[0]),
        "jaxnet.Model: apply returned outputs of shape [3] for a batch of 1; return one row per example",
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(BAD_MODELS))
def test_a_bad_model_is_one_line_before_anything_is_written(case, tmp_path):
    make, message = BAD_MODELS[case]
    with pytest.raises(jaxnet.UserError) as error:
        jaxnet.train(config(), tmp_path / "run", model=make(), dataset=DATA, task=TASK)
    assert str(error.value).startswith(message) and "\n" not in str(error.value)
    assert not (tmp_path / "run").exists()


EXPERIMENT = """
import equinox as eqx
import jax
import numpy as np
import jaxnet


class Linear(eqx.Module):
    layer: eqx.nn.Linear

    def __init__(self, outputs):
        self.layer = eqx.nn.Linear(4, outputs, key=jax.random.PRNGKey(0))

    def __call__(self, x, key=None):
        return self.layer(x)


def data(cfg):
    x = np.random.default_rng(0).normal(size=(32, 4)).astype(np.float32)
    split = {"x": x, "y": (x[:, 0] > 0).astype(np.int32)}
    return jaxnet.data.arrays(train=split, test=split)


def model(cfg):
    return Linear(2)


def task(cfg):
    return jaxnet.tasks.classification(inputs="x", target="y")


def get_config(variant):
    return jaxnet.apply_overrides(
        jaxnet.Config(), ["data.name=arrays", "train.batch_size=8", "train.steps=4", "train.progress=false"]
    )
"""


def test_an_experiment_file_model_may_be_an_equinox_module_and_evaluates_from_its_run(tmp_path):
    path = tmp_path / "mine.py"
    path.write_text(EXPERIMENT)
    summary = jaxnet.train(jaxnet.load_experiment(str(path)), tmp_path / "run")
    assert summary["model"] == "Linear" and summary["param_count"] == 10
    evaluated = jaxnet.evaluate(tmp_path / "run", "test")
    assert evaluated["step"] == 4 and evaluated["loss"] == pytest.approx(summary["test"]["loss"], rel=1e-6)


def test_nnx_partitioning_metadata_places_parameters_on_the_mesh_axes_and_on_one_device_unnamed_ones_stay_whole():
    from jaxnet.train.loop import Run

    class Sharded(nnx.Module):
        def __init__(self):
            init = nnx.initializers.lecun_normal()
            with nnx.use_eager_sharding(False):  # the names only; jaxnet places the arrays
                self.hidden = nnx.Linear(4, HIDDEN, kernel_init=nnx.with_partitioning(init, ("embed", "mlp")),
                                         rngs=nnx.Rngs(0))  # fmt: skip
            self.out = nnx.Linear(HIDDEN, 3, rngs=nnx.Rngs(1))

        def __call__(self, x):
            return self.out(nnx.relu(self.hidden(x)))

    run = Run(config(), model=Sharded(), dataset=DATA, task=TASK)
    specs = jax.tree.map(lambda s: tuple(s.spec), run.state_shardings.params)
    # embed over fsdp x context (the context devices hold other tokens of the same rows), mlp over tensor
    want = {"hidden": {"kernel": (("fsdp", "context"), "tensor"), "bias": ()}, "out": {"kernel": (), "bias": ()}}
    assert specs == want


def test_jaxnet_eval_on_the_command_line_prints_the_summary_metrics_of_an_experiment_file_model(tmp_path, capsys):
    from jaxnet import cli

    path = tmp_path / "mine.py"
    path.write_text(EXPERIMENT)
    summary = jaxnet.train(jaxnet.load_experiment(str(path)), tmp_path / "run")
    capsys.readouterr()
    assert cli.main(["eval", "--workdir", str(tmp_path / "run")]) == 0
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert printed["step"] == 4
    assert printed["loss"] == pytest.approx(summary["test"]["loss"], rel=1e-6)
    assert printed["accuracy"] == summary["test"]["accuracy"]


# A small ConvNet (3x3 conv to 4 channels, 2x2 mean pooling, dense to 10 classes) on 8x8x1 images.
CONV_CHANNELS = 4


def images(n: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 8, 8, 1)).astype(np.float32)
    return {"x": x, "y": (np.abs(x[:, :4, :4, 0].sum((1, 2))) * 2).astype(np.int32) % 10}


IMAGES = jaxnet.data.arrays(train=images(32, 0), val=images(8, 1), test=images(16, 2))


def pool(h):
    """2x2 mean pooling of channel-last maps, with or without a batch axis."""
    *batch, height, width, channels = h.shape
    return h.reshape(*batch, height // 2, 2, width // 2, 2, channels).mean((-4, -2))


class LinenConv(nn.Module):
    @nn.compact
    def __call__(self, x, train=False):
        h = pool(nn.relu(nn.Conv(CONV_CHANNELS, (3, 3), padding="SAME", name="conv")(x)))
        return nn.Dense(10, name="out")(h.reshape(h.shape[0], -1))


def linen_conv_params() -> dict:
    init_rng, _ = jax.random.split(jax.random.PRNGKey(0))
    return LinenConv().init({"params": init_rng, "dropout": init_rng}, jnp.zeros((1, 8, 8, 1)))["params"]


class NNXConv(nnx.Module):
    def __init__(self, params: dict):
        rngs = nnx.Rngs(0)
        self.conv = nnx.Conv(1, CONV_CHANNELS, kernel_size=(3, 3), padding="SAME", rngs=rngs)
        self.out = nnx.Linear(16 * CONV_CHANNELS, 10, rngs=rngs)
        for name in ("conv", "out"):
            getattr(self, name).kernel.value = params[name]["kernel"]
            getattr(self, name).bias.value = params[name]["bias"]

    def __call__(self, x):
        h = pool(nnx.relu(self.conv(x)))
        return self.out(h.reshape(h.shape[0], -1))


class EqxConv(eqx.Module):
    conv: eqx.nn.Conv2d
    out: eqx.nn.Linear

    def __init__(self, params: dict):
        keys = jax.random.split(jax.random.PRNGKey(0))
        conv = eqx.nn.Conv2d(1, CONV_CHANNELS, 3, padding=1, key=keys[0])
        out = eqx.nn.Linear(16 * CONV_CHANNELS, 10, key=keys[1])
        # Equinox is channel-first: its kernel is (out, in, h, w), Linen's (h, w, in, out).
        kernel, bias = params["conv"]["kernel"].transpose(3, 2, 0, 1), params["conv"]["bias"][:, None, None]
        self.conv = eqx.tree_at(lambda m: (m.weight, m.bias), conv, (kernel, bias))
        self.out = eqx.tree_at(lambda m: (m.weight, m.bias), out, (params["out"]["kernel"].T, params["out"]["bias"]))

    def __call__(self, x, key=None):
        assert x.shape == (8, 8, 1), "called on one example"
        h = jax.nn.relu(self.conv(x.transpose(2, 0, 1))).transpose(1, 2, 0)  # HWC -> CHW -> HWC
        return self.out(pool(h).reshape(-1))  # flattened in Linen's (h, w, c) order


def functions_conv(params: dict) -> jaxnet.Model:
    def init(rng, x):
        return jax.tree.map(jnp.asarray, params)

    def apply(p, x, train, rng):
        h = jax.lax.conv_general_dilated(
            x, p["conv"]["kernel"], (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")
        )
        h = pool(jax.nn.relu(h + p["conv"]["bias"]))
        return h.reshape(h.shape[0], -1) @ p["out"]["kernel"] + p["out"]["bias"]

    return jaxnet.Model(init=init, apply=apply)


CONV_KINDS = {"nnx": NNXConv, "equinox": EqxConv, "functions": functions_conv}


@pytest.fixture(scope="module")
def linen_conv_run(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("linen_conv") / "run"
    summary = jaxnet.train(config(), workdir, model=LinenConv(), dataset=IMAGES, task=TASK)
    return workdir, summary


@pytest.mark.parametrize("kind", sorted(CONV_KINDS))
def test_a_convnet_with_linen_weights_trains_to_the_same_losses_resumes_exactly_and_evaluates(
    kind, linen_conv_run, tmp_path
):
    linen_dir, linen_summary = linen_conv_run
    model = CONV_KINDS[kind](linen_conv_params())
    summary = jaxnet.train(config(), tmp_path / "whole", model=model, dataset=IMAGES, task=TASK)
    expected = train_losses(linen_dir)
    assert len(expected) == 6 and expected[-1] < expected[0]
    np.testing.assert_allclose(train_losses(tmp_path / "whole"), expected, rtol=1e-5)
    np.testing.assert_allclose(summary["test"]["loss"], linen_summary["test"]["loss"], rtol=1e-5)
    assert summary["test"]["accuracy"] == linen_summary["test"]["accuracy"]

    jaxnet.train(config("train.stop_after=3"), tmp_path / "resumed", model=model, dataset=IMAGES, task=TASK)
    jaxnet.train(config(), tmp_path / "resumed", model=model, dataset=IMAGES, task=TASK)
    assert train_losses(tmp_path / "resumed") == train_losses(tmp_path / "whole")
    evaluated = jaxnet.evaluate(tmp_path / "resumed", "test", model=model, dataset=IMAGES, task=TASK)
    assert evaluated["loss"] == pytest.approx(summary["test"]["loss"], rel=1e-6)
    assert evaluated["accuracy"] == summary["test"]["accuracy"]


UNNAMED_ON_FSDP = """
import json, pathlib, sys
sys.path.insert(0, "tests")
import jax, jaxnet
import test_adapters as t
from jaxnet.train.loop import Run

losses = {}
for fsdp in (1, 4):
    cfg, workdir = t.config("mesh.data=1", f"mesh.fsdp={fsdp}"), pathlib.Path(sys.argv[1]) / f"fsdp{fsdp}"
    model = t.EqxMLP(t.linen_params())
    shardings = Run(cfg, model=model, dataset=t.DATA, task=t.TASK).state_shardings
    specs = jax.tree.map(lambda s: tuple(s.spec), shardings.params)
    jaxnet.train(cfg, workdir, model=model, dataset=t.DATA, task=t.TASK)
    losses[fsdp] = t.train_losses(workdir)
print(json.dumps({"specs": specs, "losses": losses}))
"""


def test_unnamed_parameters_split_over_fsdp_along_their_largest_divisible_dimension(tmp_path):
    import sys
    from pathlib import Path

    from conftest import cpu_env

    done = run_patiently(
        [sys.executable, "-c", UNNAMED_ON_FSDP, str(tmp_path)],
        env=cpu_env(4), cwd=Path(__file__).parent.parent, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    # Equinox weights are (out, in): hidden (8, 4) splits its 8 rows, out (3, 8) its 8 columns; the
    # biases of 8 split, the bias of 3 (which 4 does not divide) stays whole.
    assert result["specs"] == {
        "hidden": {"weight": ["fsdp", None], "bias": ["fsdp"]},
        "out": {"weight": [None, "fsdp"], "bias": []},
    }
    np.testing.assert_allclose(result["losses"]["4"], result["losses"]["1"], rtol=1e-6)

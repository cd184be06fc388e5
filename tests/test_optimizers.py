"""Optimizers: the built-in choices against optax itself, the schedules against their formulas,
AdamW's weight decay mask against one step worked by hand, and an optax optimizer of the user's
(from Python and from an experiment file) training, resuming bitwise, and in a sweep."""

from __future__ import annotations

import json
import math
import textwrap

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from conftest import MLP, arrays_config, linear_data

import jaxnet
from jaxnet import optim
from jaxnet.config import OptimConfig

DATA = {"train": linear_data(128, 0), "val": linear_data(32, 1), "test": linear_data(32, 2)}
SETTINGS = [
    "optim.lr=1e-2",
    "train.steps=20",
    "train.batch_size=16",
    "train.log_every=5",
    "train.eval_every=10",
    "train.checkpoint_every=10",
]
TASK = jaxnet.tasks.regression(inputs="x", target="y")


def config(*extra: str) -> jaxnet.Config:
    return arrays_config("optimizers", SETTINGS, *extra)


def params_tree(seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {
        "Dense_0": {"kernel": rng.normal(size=(3, 4)), "bias": rng.normal(size=4)},
        "LayerNorm_0": {"scale": 1 + rng.normal(size=4)},
        "Attention_0": {"kernel": rng.normal(size=(4, 2, 2)), "bias": rng.normal(size=(2, 2))},
    }


def apply_steps(tx: optax.GradientTransformation, params: dict, grads: list[dict]) -> dict:
    params = jax.tree.map(jnp.float32, params)
    state = tx.init(params)
    for g in grads:
        updates, state = tx.update(jax.tree.map(jnp.float32, g), state, params)
        params = optax.apply_updates(params, updates)
    return params


MATRICES = {
    "Dense_0": {"kernel": True, "bias": False},
    "LayerNorm_0": {"scale": False},
    "Attention_0": {"kernel": True, "bias": False},
}


@pytest.mark.parametrize(
    "name, reference",
    [
        ("lion", lambda: optax.lion(3e-3, b1=0.8, b2=0.95, weight_decay=0.1, mask=MATRICES)),
        ("adafactor", lambda: optax.adafactor(3e-3, weight_decay_rate=0.1, weight_decay_mask=MATRICES)),
        ("adamw", lambda: optax.adamw(3e-3, b1=0.8, b2=0.95, weight_decay=0.1, mask=MATRICES)),
    ],
)
def test_built_in_optimizers_are_optax_own_with_decay_on_the_matrices(name, reference):
    cfg = OptimConfig(name=name, lr=3e-3, b1=0.8, b2=0.95, weight_decay=0.1, schedule="constant")
    grads = [params_tree(s) for s in (1, 2, 3)]
    ours = apply_steps(optim.build(cfg, 10)[0], params_tree(), grads)
    theirs = apply_steps(reference(), params_tree(), grads)
    for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(theirs), strict=True):
        np.testing.assert_array_equal(a, b)


def test_without_decay_adamw_is_bitwise_the_unmasked_optax_adamw():
    """Runs without weight decay (most of them) train exactly as before the mask existed."""
    cfg = OptimConfig(lr=3e-3, schedule="constant")
    grads = [params_tree(s) for s in (1, 2)]
    ours = apply_steps(optim.build(cfg, 10)[0], params_tree(), grads)
    theirs = apply_steps(optax.adamw(3e-3, weight_decay=0.0), params_tree(), grads)
    for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(theirs), strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("mask", ["auto", "matrices", "all"])
def test_adamw_decay_alone_shrinks_the_matrices_and_leaves_biases_and_scales(mask):
    """One AdamW step from zero gradients moves a parameter only by its decay, -lr * wd * p:
    worked by hand here. ``all`` decays every parameter, as jaxnet did before the mask."""
    lr, wd = 0.1, 0.5
    cfg = OptimConfig(lr=lr, weight_decay=wd, schedule="constant", decay_mask=mask)
    zero = jax.tree.map(np.zeros_like, params_tree())
    after = apply_steps(optim.build(cfg, 10)[0], params_tree(), [zero])
    before = jax.tree.map(np.float32, params_tree())
    decayed = MATRICES if mask != "all" else jax.tree.map(lambda _: True, MATRICES)
    for (path, p), d, a in zip(
        jax.tree_util.tree_flatten_with_path(before)[0], jax.tree.leaves(decayed), jax.tree.leaves(after), strict=True
    ):
        expected = p * (1 - lr * wd) if d else p
        np.testing.assert_allclose(a, expected, rtol=1e-6, err_msg=jax.tree_util.keystr(path))
        if not d:
            np.testing.assert_array_equal(a, p)  # bitwise untouched


def test_sgd_decays_everything_unless_asked_for_matrices():
    """SGD's L2 term keeps its old reach (the ResNet recipes); decay_mask=matrices narrows it."""
    zero = jax.tree.map(np.zeros_like, params_tree())
    for mask, bias_moves in (("auto", True), ("matrices", False)):
        cfg = OptimConfig(name="sgd", lr=0.1, momentum=0.0, weight_decay=0.5, schedule="constant", decay_mask=mask)
        after = apply_steps(optim.build(cfg, 10)[0], params_tree(), [zero])
        bias = np.float32(params_tree()["Dense_0"]["bias"])
        np.testing.assert_allclose(after["Dense_0"]["bias"], bias * (1 - 0.05) if bias_moves else bias, rtol=1e-6)


def test_decay_mask_names_flax_biases_and_norm_scales_through_their_axis_boxes():
    class Block(nn.Module):
        @nn.compact
        def __call__(self, x, train=False):
            boxed = nn.with_logical_partitioning
            x = nn.Embed(10, 4)(x)
            x = nn.Dense(
                3,
                kernel_init=boxed(nn.initializers.lecun_normal(), ("embed", "mlp")),
                bias_init=boxed(nn.initializers.zeros, ("mlp",)),
            )(x)
            return nn.LayerNorm()(x)

    params = Block().init(jax.random.PRNGKey(0), jnp.zeros((2, 5), jnp.int32))["params"]
    mask = optim.decay_mask(OptimConfig(weight_decay=0.1))(params)
    assert mask == {
        "Embed_0": {"embedding": True},  # decayed, as nanoGPT decays its embeddings
        "Dense_0": {"kernel": True, "bias": False},
        "LayerNorm_0": {"scale": False, "bias": False},
    }


def schedule_values(cfg: OptimConfig, total: int) -> np.ndarray:
    return np.asarray(jax.vmap(optim.schedule(cfg, total))(jnp.arange(total + 1)))


def test_linear_schedule_warms_up_then_falls_in_a_straight_line_to_the_end_factor():
    lr, warmup, total, end = 0.2, 4, 24, 0.1
    values = schedule_values(OptimConfig(lr=lr, warmup_steps=warmup, schedule="linear", end_lr_factor=end), total)
    t = np.arange(total + 1)
    expected = np.where(
        t < warmup, lr * (t + 1) / warmup, lr + (lr * end - lr) * np.minimum(t - warmup, 20) / (total - warmup)
    )
    np.testing.assert_allclose(values, expected, rtol=1e-6)


def test_warmup_cosine_is_optax_warmup_cosine_decay_schedule():
    lr, warmup, total, end = 0.2, 5, 30, 0.05
    cfg = OptimConfig(lr=lr, warmup_steps=warmup, schedule="warmup_cosine", end_lr_factor=end)
    reference = optax.warmup_cosine_decay_schedule(0.0, lr, warmup, total, lr * end)
    np.testing.assert_allclose(schedule_values(cfg, total), [float(reference(t)) for t in range(total + 1)], rtol=1e-6)
    t = np.arange(warmup, total + 1)  # and the formula: from 0 up to lr at step `warmup`, then a cosine to lr * end
    cosine = lr * end + (lr - lr * end) * 0.5 * (1 + np.cos(math.pi * (t - warmup) / (total - warmup)))
    np.testing.assert_allclose(schedule_values(cfg, total)[warmup:], cosine, rtol=1e-5)
    assert schedule_values(cfg, total)[0] == 0.0


def train_losses(workdir) -> list[float]:
    rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in rows if r["split"] == "train"]


def same_params(a, b) -> bool:
    return all(np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True))


def test_own_optax_optimizer_from_python_trains_and_resumes_bitwise(tmp_path):
    """A function of the schedule gets the config's schedule: ``lambda lr: optax.lion(lr)`` trains
    bitwise as ``optim.name=lion`` does. Stopped halfway and resumed, the run is bitwise the
    uninterrupted one (the optimizer's state is in the checkpoints), and config.json names it."""
    mine = lambda lr: optax.lion(lr, b2=0.99, weight_decay=0.0)  # noqa: E731
    common = dict(model=MLP(), dataset=jaxnet.data.arrays(**DATA), task=TASK)
    jaxnet.train(config(), tmp_path / "whole", optimizer=mine, **common)
    jaxnet.train(config("train.stop_after=10"), tmp_path / "resumed", optimizer=mine, **common)
    jaxnet.train(config(), tmp_path / "resumed", optimizer=mine, **common)
    jaxnet.train(config("optim.name=lion", "optim.b2=0.99"), tmp_path / "built_in", **common)
    assert train_losses(tmp_path / "resumed") == train_losses(tmp_path / "whole")
    whole = jaxnet.load_params(tmp_path / "whole")
    assert same_params(jaxnet.load_params(tmp_path / "resumed"), whole)
    assert same_params(jaxnet.load_params(tmp_path / "built_in"), whole)
    saved = json.loads((tmp_path / "whole" / "config.json").read_text())["_run"]["optimizer"]
    assert saved == {
        "given": "jaxnet.train(optimizer=...)",
        "optimizer": "lambda lr: optax.lion(lr, b2=0.99, weight_decay=0.0)",
    }
    rows = [json.loads(line) for line in (tmp_path / "whole" / "metrics.jsonl").read_text().splitlines()]
    assert [r["lr"] for r in rows if r["split"] == "train"][0] == pytest.approx(
        1e-2 * 0.5 * (1 + math.cos(math.pi * 4 / 20))
    )


def test_a_fixed_transformation_logs_no_schedule_and_evaluate_asks_for_it_again(tmp_path, capsys):
    common = dict(model=MLP(), dataset=jaxnet.data.arrays(**DATA), task=TASK)
    summary = jaxnet.train(config("optim.b1=0.5"), tmp_path / "run", optimizer=optax.sgd(0.05), **common)
    assert "not used: optim.b1=0.5, optim.lr=0.01" in capsys.readouterr().out
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert not any("lr" in r for r in rows)  # the transformation's own rate, which jaxnet cannot read
    with pytest.raises(jaxnet.UserError, match=r"trained with an optimizer of its own \(chain\); pass the same one"):
        jaxnet.evaluate(tmp_path / "run", **common)
    again = jaxnet.evaluate(tmp_path / "run", optimizer=optax.sgd(0.05), **common)
    assert again["mse"] == summary["test"]["mse"]


EXPERIMENT = """
import numpy as np
import optax

import jaxnet
from conftest import MLP, arrays_config, linear_data


def get_config(variant):
    return arrays_config("", {settings!r})


def data(cfg):
    return jaxnet.data.arrays(train=linear_data(128, 0), val=linear_data(32, 1), test=linear_data(32, 2))


def model(cfg):
    return MLP()


def task(cfg):
    return jaxnet.tasks.regression(inputs="x", target="y")


def optimizer(cfg):
    return lambda lr: optax.chain(optax.clip(1.0), optax.lion(lr, b1=cfg.optim.b1, weight_decay=0.0))
"""


def test_an_experiment_files_optimizer_trains_resumes_bitwise_and_is_recorded(tmp_path):
    path = tmp_path / "lion_exp.py"
    path.write_text(textwrap.dedent(EXPERIMENT.format(settings=SETTINGS)))
    jaxnet.train(jaxnet.load_experiment(str(path)), tmp_path / "whole")
    jaxnet.train(jaxnet.load_experiment(str(path), ["train.stop_after=10"]), tmp_path / "resumed")
    jaxnet.train(jaxnet.load_experiment(str(path)), tmp_path / "resumed")
    whole = jaxnet.load_params(tmp_path / "whole")
    assert same_params(jaxnet.load_params(tmp_path / "resumed"), whole)
    # the file's optimizer, not the built-in adamw: the same transformation given from Python trains alike
    same = lambda lr: optax.chain(optax.clip(1.0), optax.lion(lr, b1=0.9, weight_decay=0.0))  # noqa: E731
    jaxnet.train(
        config(), tmp_path / "python", optimizer=same, model=MLP(), dataset=jaxnet.data.arrays(**DATA), task=TASK
    )
    assert same_params(jaxnet.load_params(tmp_path / "python"), whole)
    saved = json.loads((tmp_path / "whole" / "config.json").read_text())["_run"]["optimizer"]
    assert saved == {
        "given": f"optimizer(cfg) in {path}",
        "optimizer": "lambda lr: optax.chain(optax.clip(1.0), optax.lion(lr, b1=cfg.optim.b1, weight_decay=0.0))",
    }


def test_a_sweep_over_the_rate_gives_each_member_its_schedule_and_refuses_keys_the_optimizer_ignores(tmp_path):
    common = dict(model=MLP(), dataset=jaxnet.data.arrays(**DATA), task=TASK)
    mine = lambda lr: optax.adam(lr)  # noqa: E731  (smooth: lion's sign would magnify rounding)
    jaxnet.sweep(config(), {"optim.lr": [1e-2, 3e-3]}, tmp_path / "sweep", optimizer=mine, say=lambda _: None, **common)
    jaxnet.train(config("optim.lr=3e-3"), tmp_path / "alone", optimizer=mine, **common)
    member = jaxnet.load_params(tmp_path / "sweep" / "optim.lr=0.003")
    for a, b in zip(jax.tree.leaves(member), jax.tree.leaves(jaxnet.load_params(tmp_path / "alone")), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    with pytest.raises(jaxnet.UserError, match=r"sweep over optim.lr: optimizer=chain\(scale_by_adam\) .*lambda lr"):
        jaxnet.sweep(config(), {"optim.lr": [1e-2, 3e-3]}, tmp_path / "s2", optimizer=optax.adam(1e-3), **common)
    with pytest.raises(jaxnet.UserError, match=r"sweep over optim.b1: .* build it in the experiment file's optimizer"):
        jaxnet.sweep(config(), {"optim.b1": [0.8, 0.9]}, tmp_path / "s3", optimizer=mine, **common)
    assert not (tmp_path / "s2").exists() and not (tmp_path / "s3").exists()


@pytest.mark.parametrize(
    "optimizer, words",
    [
        ("lion", "optimizer is a str; pass an optax.GradientTransformation"),
        (lambda lr: "lion", "returned a str, not an optax.GradientTransformation"),
    ],
)
def test_an_optimizer_that_is_not_one_is_a_one_line_error_before_anything_is_written(tmp_path, optimizer, words):
    with pytest.raises(jaxnet.UserError, match=words):
        jaxnet.train(
            config(), tmp_path / "run", optimizer=optimizer, model=MLP(), dataset=jaxnet.data.arrays(**DATA), task=TASK
        )
    assert not (tmp_path / "run").exists()

"""The PyTorch peers of the benchmark compute what jaxnet's Flax models and training step compute.

The model tests fill a Flax model's variables with random values (so that zero-initialised
scales and biases take part), copy them into the torch twin and compare logits, parameter counts
and the carried LSTM state. The trainer tests start jaxnet's jitted training step and the torch
Trainer from the same variables and compare the losses of three optimizer steps, with settings
chosen so that each optimizer feature (weight decay, momentum, clipping, warmup, carried state)
moves those losses by far more than the tolerance.
"""

from __future__ import annotations

import dataclasses
import functools

import pytest

torch = pytest.importorskip("torch")

import flax.linen as nn  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from jaxnet import models, tasks  # noqa: E402
from jaxnet.bench import torch_peers  # noqa: E402
from jaxnet.config import ModelConfig, OptimConfig  # noqa: E402
from jaxnet.optim import build as build_optimizer  # noqa: E402
from jaxnet.optim import schedule  # noqa: E402
from jaxnet.train.state import create, param_count  # noqa: E402
from jaxnet.train.step import make_train_step  # noqa: E402

RTOL, ATOL = 1e-4, 1e-5

CONVNET = models.ConvNetConfig(features=(32, 64), hidden=256, dtype="float32")
RESNET = models.ResNetConfig(features=(8, 16), blocks=(1, 1), dtype="float32")
LSTM = models.LSTMConfig(layers=2, width=32, dtype="float32", lstm_impl="scan")
TRANSFORMER = models.TransformerConfig(layers=2, width=32, heads=4, dtype="float32", attention="xla")


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


def _random_variables(module: nn.Module, sample: np.ndarray, seed: int) -> dict:
    """Variables of ``module`` (the structure of ``module.init``, found without compiling it) filled with
    random values: weights of variance 1 / fan-in, scales near 1, other vectors near 0, positive
    variances, a zero LSTM carry. Random rather than initial values, so that every parameter counts."""
    shapes = jax.eval_shape(functools.partial(module.init, train=False), jax.random.PRNGKey(0), sample)
    rng = np.random.default_rng(seed)

    def fill(path: tuple, leaf: jax.ShapeDtypeStruct) -> np.ndarray:
        names = [getattr(k, "key", "") for k in path]
        shape = leaf.shape
        if names[0] == "carry":
            return np.zeros(shape, np.float32)
        if names[-1] == "var":
            return rng.uniform(0.5, 1.5, shape).astype(np.float32)
        if len(shape) >= 2:
            fan_in = int(np.prod(shape[:-1])) if names[-1] != "embedding" else 1
            return (rng.standard_normal(shape) / np.sqrt(fan_in)).astype(np.float32)
        return ((names[-1] == "scale") + 0.2 * rng.standard_normal(shape)).astype(np.float32)

    return jax.tree_util.tree_map_with_path(fill, dict(nn.unbox(shapes)))


def _flax(cfg: ModelConfig, num_classes: int, sample: np.ndarray, seq_len: int = 0) -> tuple[nn.Module, dict]:
    module = models.build(cfg, num_classes, seq_len)
    return module, _random_variables(module, sample, seed=1)


def _apply(module: nn.Module, variables: dict, inputs: np.ndarray, **kw) -> object:
    """``module.apply`` jitted: one compilation instead of one per operation."""
    return jax.jit(functools.partial(module.apply, **kw))(variables, inputs)


def _torch_twin(cfg: ModelConfig, num_classes: int, variables: dict, seq_len: int = 0) -> torch.nn.Module:
    model = torch_peers.build_model(cfg, num_classes, seq_len)
    torch_peers.load_flax_params(model, variables, cfg)
    return model


def _trainable(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def _close(actual: torch.Tensor, expected: jnp.ndarray) -> None:
    np.testing.assert_allclose(actual.detach().numpy(), np.asarray(expected), rtol=RTOL, atol=ATOL)


def test_available() -> None:
    assert torch_peers.available() == torch.__version__


def test_convnet_logits() -> None:
    images = np.random.default_rng(0).standard_normal((4, 28, 28, 1)).astype(np.float32)
    module, variables = _flax(CONVNET, 10, images[:1])
    model = _torch_twin(CONVNET, 10, variables).eval()
    assert _trainable(model) == param_count(variables["params"])
    _close(model(torch.from_numpy(images)), _apply(module, variables, images, train=False))


def test_resnet_logits_train_and_eval() -> None:
    images = np.random.default_rng(0).standard_normal((4, 32, 32, 3)).astype(np.float32)
    module, variables = _flax(RESNET, 10, images[:1])
    model = _torch_twin(RESNET, 10, variables)
    assert _trainable(model) == param_count(variables["params"])
    x = torch.from_numpy(images)
    # Evaluation: the (random) running averages.
    _close(model.eval()(x), _apply(module, variables, images, train=False))
    # Training: batch statistics, and the running means updated alike (torch's running variance
    # uses the unbiased batch variance, Flax's the biased one: a few parts in 10^4 here).
    logits, updated = _apply(module, variables, images, train=True, mutable=["batch_stats"])
    _close(model.train()(x), logits)
    stats = updated["batch_stats"]
    np.testing.assert_allclose(model.stem_norm.running_mean.numpy(), stats["BatchNorm_0"]["mean"], rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(model.stem_norm.running_var.numpy(), stats["BatchNorm_0"]["var"], rtol=2e-3)
    block = model.blocks[1]
    assert block.project  # the stride-2 block with its projection and asymmetric SAME padding
    np.testing.assert_allclose(
        block.norm3.running_mean.numpy(), stats["ResidualBlock_1"]["BatchNorm_2"]["mean"], rtol=RTOL, atol=ATOL
    )


@pytest.mark.parametrize("tie", [False, True])
def test_lstm_logits_and_carried_state(tie: bool) -> None:
    cfg = dataclasses.replace(LSTM, tie_embeddings=tie)
    tokens = np.random.default_rng(0).integers(0, 50, (2, 3, 7)).astype(np.int32)
    module, variables = _flax(cfg, 50, tokens[0])
    model = _torch_twin(cfg, 50, variables).eval()
    assert _trainable(model) == param_count(variables["params"])
    apply = jax.jit(functools.partial(module.apply, train=False, mutable=["carry"]))
    state = None
    for t in tokens:  # two consecutive calls: the second starts from the first's final state
        expected, updated = apply(variables, t)
        variables = {**variables, "carry": updated["carry"]}
        logits, state = model(torch.from_numpy(t).long(), state)
        _close(logits, expected)
    for i in range(cfg.layers):
        _close(state[0][i], variables["carry"][f"lstm_{i}"]["h"])
        _close(state[1][i], variables["carry"][f"lstm_{i}"]["c"])


@pytest.mark.parametrize("position, tie", [("learned", True), ("learned", False), ("rotary", False)])
def test_transformer_logits(position: str, tie: bool) -> None:
    cfg = dataclasses.replace(TRANSFORMER, position=position, tie_embeddings=tie)
    tokens = np.random.default_rng(0).integers(0, 50, (3, 16)).astype(np.int32)
    module, variables = _flax(cfg, 50, tokens[:1], seq_len=16)
    model = _torch_twin(cfg, 50, variables, seq_len=16).eval()
    assert _trainable(model) == param_count(variables["params"])
    expected = _apply(module, variables, tokens, train=False)
    _close(model(torch.from_numpy(tokens).long()), expected)
    # A shorter sequence takes the first positions: causal, so its logits are the full sequence's first ones.
    _close(model(torch.from_numpy(tokens[:, :9]).long()), expected[:, :9])


@pytest.mark.parametrize("tie", [True, False])
def test_llama_shaped_transformer_logits(tie: bool) -> None:
    """The Llama-shaped twin (the GPU speed check's peer): grouped-query attention (4 query heads
    sharing 2 key/value heads), rotary positions of base 500,000, RMSNorm, SwiGLU, no biases."""
    cfg = models.TransformerConfig.preset(
        "llama", layers=2, width=32, heads=4, kv_heads=2, mlp_hidden=48, rope_theta=500000.0, norm_eps=1e-5,
        tie_embeddings=tie, dtype="float32", attention="xla",
    )  # fmt: skip
    tokens = np.random.default_rng(0).integers(0, 50, (3, 16)).astype(np.int32)
    module, variables = _flax(cfg, 50, tokens[:1], seq_len=16)
    model = _torch_twin(cfg, 50, variables, seq_len=16).eval()
    assert isinstance(model, torch_peers.LlamaLanguageModel)
    assert _trainable(model) == param_count(variables["params"])
    _close(model(torch.from_numpy(tokens).long()), _apply(module, variables, tokens, train=False))


def _train_both(
    model_cfg: ModelConfig, optim_cfg: OptimConfig, batches: list[dict], num_classes: int, seq_len: int = 0
) -> tuple[list[float], list[float]]:
    """Per-step losses of jaxnet's jitted step and of the torch Trainer from the same variables."""
    steps, smoothing = 5, 0.1
    model = models.build(model_cfg, num_classes, seq_len)
    tx, _ = build_optimizer(optim_cfg, steps)
    first = batches[0]
    sample = first["tokens"] if "tokens" in first else first["image"][:1]
    state = jax.jit(create, static_argnums=(0, 1, 3))(model, tx, jnp.asarray(sample), 0)
    task = tasks.lm(smoothing) if "tokens" in first else tasks.classification(label_smoothing=smoothing)
    train_step = jax.jit(make_train_step(model, tx, task=task))
    trainer = torch_peers.Trainer(model_cfg, optim_cfg, steps, num_classes, seq_len, label_smoothing=smoothing)
    torch_peers.load_flax_params(trainer.model, {"params": state.params, **state.model_state}, model_cfg)
    jax_losses, torch_losses = [], []
    for batch in batches:
        state, metrics = train_step(state, {k: jnp.asarray(v) for k, v in batch.items()})
        jax_losses.append(float(metrics["loss"]))
        trainer.step(trainer.put(batch))
        torch_losses.append(trainer.loss())
    return jax_losses, torch_losses


def test_adamw_trainer_matches_jaxnet() -> None:
    """AdamW with weight decay, warmup, cosine decay and clipping on a small Transformer."""
    rng = np.random.default_rng(0)
    cfg = dataclasses.replace(TRANSFORMER, layers=1)
    optim = OptimConfig(name="adamw", lr=3e-2, weight_decay=0.5, warmup_steps=2, clip_norm=0.5, b2=0.99)
    tokens = rng.integers(0, 50, (4, 9)).astype(np.int32)
    batches = 3 * [{"tokens": tokens[:, :-1], "targets": tokens[:, 1:], "reset": np.asarray(1, np.int32)}]
    jax_losses, torch_losses = _train_both(cfg, optim, batches, 50, seq_len=8)
    assert jax_losses[2] < jax_losses[0] - 0.01  # the updates do change the loss
    np.testing.assert_allclose(torch_losses, jax_losses, rtol=1e-4)


@pytest.mark.parametrize("name", ["lstm", "convnet"])
def test_sgd_trainer_matches_jaxnet(name: str) -> None:
    """SGD with momentum, weight decay and clipping: the LSTM carrying its state from batch to batch
    (zeroed on the batches marked ``reset``), and a small ConvNet with Nesterov momentum."""
    rng = np.random.default_rng(0)
    optim = OptimConfig(name="sgd", lr=0.5, momentum=0.9, weight_decay=5e-2, clip_norm=1.0)
    if name == "lstm":
        tokens = rng.integers(0, 50, (3, 4, 8)).astype(np.int32)
        batches = [
            {"tokens": t[:, :-1], "targets": t[:, 1:], "reset": np.asarray(r, np.int32)}
            for t, r in zip(tokens, (1, 0, 1), strict=True)
        ]
        # Weights in [-0.5, 0.5]: large enough that the carried state moves the loss by about 1 %.
        jax_losses, torch_losses = _train_both(dataclasses.replace(LSTM, init_scale=0.5), optim, batches, 50)
    else:
        cfg = dataclasses.replace(CONVNET, features=(8, 16), hidden=32)
        image, label = rng.standard_normal((4, 28, 28, 1)).astype(np.float32), rng.integers(0, 10, 4).astype(np.int32)
        batches = 3 * [{"image": image, "label": label}]
        jax_losses, torch_losses = _train_both(cfg, dataclasses.replace(optim, lr=0.1, nesterov=True), batches, 10)
        assert jax_losses[2] < jax_losses[0] - 0.01
    np.testing.assert_allclose(torch_losses, jax_losses, rtol=1e-4)


def test_schedule_values_match_optax() -> None:
    cfg = OptimConfig(lr=0.1, warmup_steps=3, end_lr_factor=0.1)
    values = torch_peers.schedule_values(cfg, 10)
    np.testing.assert_allclose(values, [float(schedule(cfg, 10)(t)) for t in range(10)], rtol=1e-6)


@pytest.mark.parametrize("name", ["transformer", "lstm", "resnet"])
def test_bf16_trainer_runs(name: str) -> None:
    """bf16 autocast (on the CPU here) trains with float32 parameters; the LSTM keeps a float32 state."""
    cfg = {"transformer": dataclasses.replace(TRANSFORMER, layers=1), "lstm": LSTM, "resnet": RESNET}[name]
    trainer = torch_peers.Trainer(cfg, OptimConfig(), 3, 10 if name == "resnet" else 50, seq_len=8, bf16=True)
    rng = np.random.default_rng(0)
    if name == "resnet":
        batch = {"image": rng.standard_normal((2, 32, 32, 3)).astype(np.float32), "label": np.array([1, 2])}
    else:
        tokens = rng.integers(0, 50, (2, 9)).astype(np.int32)
        batch = {"tokens": tokens[:, :-1], "targets": tokens[:, 1:], "reset": np.asarray(0, np.int32)}
    for _ in range(2):
        trainer.step(trainer.put(batch))
    assert np.isfinite(trainer.loss())
    assert all(p.dtype == torch.float32 for p in trainer.model.parameters())
    if name == "lstm":
        assert all(s.dtype == torch.float32 and s.shape == (2, 2, 32) for s in trainer.state)

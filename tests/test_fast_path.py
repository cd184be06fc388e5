"""The GPU fast path's choices (bf16, cuDNN attention and LSTM) and activation rematerialisation."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxnet import models
from jaxnet.cli import main
from jaxnet.errors import UserError
from jaxnet.models import LSTMConfig, TransformerConfig

TRANSFORMER = TransformerConfig(layers=2, width=64, heads=4)  # head size 16
LSTM = LSTMConfig(layers=1, width=16)


def test_auto_is_float32_xla_and_scan_on_a_cpu():
    transformer, lstm = models.resolve(TRANSFORMER, "cpu"), models.resolve(LSTM, "cpu")
    assert (transformer.dtype, transformer.attention) == ("float32", "xla_head_major")  # XLA's, heads first
    assert (lstm.dtype, lstm.lstm_impl) == ("float32", "scan")


def test_resolve_changes_only_the_fields_a_family_has():
    assert not hasattr(models.resolve(TRANSFORMER, "gpu"), "lstm_impl")
    assert not hasattr(models.resolve(LSTM, "gpu"), "attention")
    convnet = models.resolve(models.ConvNetConfig(), "gpu")
    assert type(convnet) is models.ConvNetConfig and convnet.dtype == "bfloat16"


def test_auto_is_bf16_with_cudnn_kernels_on_a_gpu():
    got = models.resolve(TRANSFORMER, "gpu")
    assert (got.dtype, got.param_dtype, got.attention) == ("bfloat16", "float32", "cudnn")
    assert models.resolve(LSTM, "gpu").lstm_impl == "cudnn"
    assert models.resolve(TRANSFORMER, "tpu").dtype == "bfloat16"
    assert models.resolve(TRANSFORMER, "tpu").attention == "xla"


def test_auto_attention_falls_back_to_xla_where_the_fused_kernel_does_not_fit():
    odd_heads = dataclasses.replace(TRANSFORMER, width=60, heads=5)  # head size 12
    assert models.resolve(odd_heads, "gpu").attention == "xla"
    assert models.resolve(dataclasses.replace(TRANSFORMER, dtype="float32"), "gpu").attention == "xla"
    explicit = dataclasses.replace(TRANSFORMER, dtype="float32", attention="xla")
    got = models.resolve(explicit, "gpu")
    assert (got.dtype, got.attention) == ("float32", "xla")  # what was set stays


@pytest.mark.parametrize(
    "cfg, match",
    [
        (dataclasses.replace(TRANSFORMER, attention="cudnn"), "model.attention=cudnn needs an NVIDIA GPU"),
        (dataclasses.replace(LSTM, lstm_impl="cudnn"), "model.lstm_impl=cudnn needs an NVIDIA GPU"),
    ],
)
def test_cudnn_where_it_cannot_run_is_a_clear_error(cfg, match):
    with pytest.raises(UserError, match=match):
        models.resolve(cfg, "cpu")


def test_cli_refuses_cudnn_attention_on_a_cpu_without_writing(tmp_path, capsys):
    workdir = tmp_path / "run"
    code = main(["train", "transformer_shakespeare:smoke", "model.attention=cudnn", "--workdir", str(workdir)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "model.attention=cudnn" in err
    assert not workdir.exists()


_TRAINED: dict[str, tuple] = {}


def trained(policy: str) -> tuple[list[float], object, str]:
    """Three SGD steps of a one-block Transformer (dropout on, float32) under ``model.remat=policy``,
    from the same initial weights: the steps' losses, the first step's gradients and the jaxpr of
    the gradient (computed once per policy)."""
    if policy not in _TRAINED:
        cfg = dataclasses.replace(TRANSFORMER, layers=1, width=32, heads=2, dtype="float32", dropout=0.1)
        model = models.build(dataclasses.replace(cfg, attention="xla", remat=policy), 50, 16)
        tokens = jax.random.randint(jax.random.PRNGKey(0), (4, 16), 0, 50)
        if "params" not in _TRAINED:  # the parameters do not depend on the policy
            _TRAINED["params"] = jax.jit(model.init)(jax.random.PRNGKey(1), tokens)["params"]
        params = _TRAINED["params"]

        def loss(p, step):
            rngs = {"dropout": jax.random.fold_in(jax.random.PRNGKey(2), step)}
            logits = model.apply({"params": p}, tokens, train=True, rngs=rngs)
            return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits[:, :-1]), tokens[:, 1:, None], -1))

        @jax.jit
        def step(p, i):
            value, grads = jax.value_and_grad(loss)(p, i)
            return jax.tree.map(lambda w, g: w - 0.5 * g, p, grads), value, grads

        losses, first = [], None
        for i in range(3):
            params, value, grads = step(params, i)
            losses.append(float(value))
            first = grads if first is None else first
        _TRAINED[policy] = (losses, first, str(jax.make_jaxpr(jax.grad(loss))(params, 0)))
    return _TRAINED[policy]


@pytest.mark.parametrize("policy", ["full", "dots", "dots_no_batch", "minimal", "offload"])
def test_every_remat_policy_trains_to_the_losses_of_none(policy):
    """Recomputation changes what is kept, not what is computed: three training steps under each
    policy give the losses of model.remat=none (the same order of operations: equal to float
    rounding) and the first step's gradients, and the backward pass holds a remat call."""
    losses, grads, jaxpr = trained(policy)
    plain_losses, plain_grads, plain_jaxpr = trained("none")
    np.testing.assert_allclose(losses, plain_losses, rtol=1e-6)
    assert losses[-1] < losses[0]
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7), grads, plain_grads)
    assert "remat" in jaxpr or "checkpoint" in jaxpr
    assert "remat" not in plain_jaxpr and "checkpoint" not in plain_jaxpr


def test_remat_true_and_false_are_read_as_full_and_none(tmp_path):
    """model.remat was true or false before it named a policy: both spellings still read, from the
    command line, from Python and from a saved config.json (older runs' directories)."""
    from jaxnet import config

    cfg = config.load_experiment("transformer_shakespeare:smoke")
    assert [config.apply_overrides(cfg, [f"model.remat={v}"]).model.remat for v in ("true", "false", "dots")] == [
        "full",
        "none",
        "dots",
    ]
    assert dataclasses.replace(TRANSFORMER, remat=True).remat == "full"
    tree = cfg.to_dict()
    tree["model"]["remat"] = False
    (tmp_path / "config.json").write_text(__import__("json").dumps(tree))
    assert config.load(tmp_path / "config.json").model.remat == "none"
    with pytest.raises(UserError, match="model.remat='some' is not one of: none, full, dots"):
        config.apply_overrides(cfg, ["model.remat=some"])

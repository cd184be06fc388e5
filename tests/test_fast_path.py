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


def test_remat_changes_memory_not_results():
    """Rematerialised blocks give the same loss and gradients (they recompute, in the same order)."""
    cfg = dataclasses.replace(TRANSFORMER, dtype="float32", dropout=0.1)
    plain, remat = models.build(cfg, 50, 32), models.build(dataclasses.replace(cfg, remat=True), 50, 32)
    tokens = jax.random.randint(jax.random.PRNGKey(0), (4, 32), 0, 50)
    params = plain.init(jax.random.PRNGKey(1), tokens)["params"]
    assert jax.tree.structure(params) == jax.tree.structure(remat.init(jax.random.PRNGKey(1), tokens)["params"])

    def loss(model, p):
        logits = model.apply({"params": p}, tokens, train=True, rngs={"dropout": jax.random.PRNGKey(2)})
        return -jnp.mean(jax.nn.log_softmax(logits)[..., 0])

    (l1, g1), (l2, g2) = (jax.value_and_grad(lambda p, m=m: loss(m, p))(params) for m in (plain, remat))
    np.testing.assert_allclose(l1, l2, rtol=1e-6)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7), g1, g2)
    # the rematerialised backward pass recomputes: its jaxpr holds a remat (checkpoint) call
    jaxpr = str(jax.make_jaxpr(jax.grad(lambda p: loss(remat, p)))(params))
    assert "remat" in jaxpr or "checkpoint" in jaxpr

"""Every family's train step lowers for CUDA on a machine without a GPU (``jax.export``).

What this checks without a GPU: each experiment's compiled-step program (its smoke shape, bf16
compute as on a GPU, XLA's attention and the ``lax.scan`` LSTM) lowers for ``platforms=['cuda']``:
no CPU-only operation, host callback or custom call in it, bf16 products, buffer donation kept,
for one family, the program lowered for both the CPU and
CUDA runs on the CPU and takes the same step as the runner's own.

What it cannot check: the cuDNN paths (``model.attention=cudnn``, ``model.lstm_impl=cudnn``) need
cuDNN already when they are traced (JAX asks the CUDA plugin for cuDNN's version and workspace
sizes), so without the plugin they do not lower and those tests are skipped, saying why; nor can
it check what happens only on the GPU: XLA's GPU compilation, the kernels and their numerics
(``scripts/gpu_check.sh`` runs those on a lent GPU).
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import export

from jaxnet import Dataset, parallel
from jaxnet.config import load_experiment
from jaxnet.data import text as text_lib
from jaxnet.train.loop import Run


def images(shape: tuple[int, ...], classes: int, n: int = 256) -> Dataset:
    rng = np.random.default_rng(0)
    split = lambda m: (rng.integers(0, 256, (m, *shape), dtype=np.uint8), rng.integers(0, classes, m).astype(np.int32))  # noqa: E731
    return Dataset(train=split(n), val=split(8), test=split(8), num_classes=classes, name="random")


def tokens(vocab: int, n: int = 1 << 14) -> text_lib.TextDataset:
    ids = np.random.default_rng(0).integers(0, vocab, n).astype(np.int32)
    return text_lib.TextDataset(train=ids, val=ids[:512], test=ids[:512], vocab=[f"<{i}>" for i in range(vocab)])


# family: (experiment, the XLA path chosen explicitly, random data of the experiment's shape)
FAMILIES = {
    "cnn": ("cnn_fashion_mnist", [], lambda: images((28, 28, 1), 10)),
    "resnet": ("resnet_cifar10", [], lambda: images((32, 32, 3), 10)),
    "lstm": ("lstm_ptb_small", ["model.lstm_impl=scan"], lambda: tokens(10_000)),
    "transformer": ("transformer_shakespeare", ["model.attention=xla"], lambda: tokens(84)),
}


def build(family: str, extra: tuple[str, ...] = (), abstract: bool = True) -> tuple[Run, object, dict]:
    """The smoke variant's runner, initial state (its shapes only, unless ``abstract`` is false)
    and first batch, computing in bf16 as on a GPU."""
    experiment, path, data = FAMILIES[family]
    cfg = load_experiment(f"{experiment}:smoke", ["model.dtype=bfloat16", *path, *extra])
    run = Run(cfg, dataset=data())
    state = jax.eval_shape(run.init_state) if abstract else run.init_state()
    batch = parallel.put_batch(next(run.train_batches(0)), run.mesh)
    return run, state, batch


@pytest.mark.parametrize("family", list(FAMILIES))
def test_train_step_lowers_for_cuda(family):
    run, state, batch = build(family)
    exported = export.export(run.train_step, platforms=["cuda"])(state, batch)
    assert exported.platforms == ("cuda",)
    assert len(exported.in_avals) == len(jax.tree.leaves((state, batch)))
    module = exported.mlir_module()
    assert "custom_call" not in module  # no host callback, no CPU-only kernel
    products = re.findall(r"stablehlo\.(?:dot_general|convolution).*", module)
    assert products and any("bf16" in p for p in products), "no bf16 matrix product or convolution"
    assert "jax.buffer_donor" in module or "tf.aliasing_output" in module  # the state's buffers stay donated


@pytest.mark.slow  # two compilations of a train step: about 15 s on a 2-core CPU
def test_program_lowered_for_cpu_and_cuda_takes_the_runners_step_on_the_cpu():
    shrink = ("model.dtype=float32", "model.features=(4, 8)", "model.hidden=16", "train.batch_size=16")
    run, state, batch = build("cnn", shrink, abstract=False)
    exported = export.export(run.train_step, platforms=["cpu", "cuda"])(state, batch)
    assert exported.platforms == ("cpu", "cuda")
    copy = jax.tree.map(jnp.copy, state)  # the step donates its input state
    new_state, metrics = exported.call(copy, batch)
    want_state, want_metrics = run.train_step(state, batch)
    # two compilations: on a GPU each may pick its own (TF32) convolution algorithm
    rtol = 2e-3 if jax.default_backend() == "gpu" else 1e-5
    np.testing.assert_allclose(metrics["loss"], want_metrics["loss"], rtol=rtol)
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=rtol, atol=1e-6), new_state.params, want_state.params
    )
    assert int(new_state.step) == int(want_state.step) == 1


CUDNN = {
    "attention": lambda: jax.jit(
        lambda q: jax.nn.dot_product_attention(q, q, q, is_causal=True, implementation="cudnn")
    ),
    "lstm": lambda: jax.jit(_cudnn_lstm),
}


def _cudnn_lstm(x):
    from jax.experimental import rnn

    h = jnp.zeros((1, x.shape[0], 16), jnp.float32)
    weights = jnp.zeros((rnn.get_num_params_in_lstm(x.shape[-1], 16, 1, False),), jnp.float32)
    lengths = jnp.full((x.shape[0],), x.shape[1], jnp.int32)
    return rnn.lstm(
        x,
        h,
        h,
        weights,
        lengths,
        input_size=x.shape[-1],
        hidden_size=16,
        num_layers=1,
        dropout=0.0,
        bidirectional=False,
    )[0]


@pytest.mark.parametrize(
    "kernel, shape, dtype", [("attention", (2, 64, 4, 32), jnp.bfloat16), ("lstm", (2, 5, 8), jnp.float32)]
)
def test_cudnn_kernels_lower_for_cuda_where_cudnn_is_present(kernel, shape, dtype):
    """Without JAX's CUDA plugin these fail at trace time, with the errors named here; with it
    they lower to cuDNN custom calls: attention on any machine (the plan wheels), the LSTM only on a
    GPU machine (cuDNN must create a handle to trace it: CUDNN_STATUS_NOT_INITIALIZED without one)."""
    try:  # jax.export refuses cuDNN's custom calls (no compatibility guarantee): lower for CUDA directly
        lowered = CUDNN[kernel]().trace(jax.ShapeDtypeStruct(shape, dtype)).lower(lowering_platforms=("cuda",))
    except (RuntimeError, AttributeError, NotImplementedError) as e:
        if re.search(r"cuDNN is not detected|gpu_rnn|cuda|CUDNN_STATUS_NOT_INITIALIZED", str(e), re.IGNORECASE):
            pytest.skip(f"cuDNN {kernel} cannot be lowered on this machine ({type(e).__name__}: {e})")
        raise
    assert re.search(r"custom_call.*(cudnn|fmha)", lowered.as_text(), re.IGNORECASE)

"""The blockwise cross-entropy (jaxnet.blockwise) against the whole logits: the same loss, the same
gradients (hidden states, output kernel, bias, weights) and the same hits, for every option the
built-in tasks pass (label smoothing, z-loss, a per-position or per-example mask, a padded
vocabulary, tied and untied outputs, with and without a bias, blocks that do or do not divide the
positions), in the train step of a real Transformer, and across 2 simulated CPU devices that split
the vocabulary (mesh.tensor=2) or the batch (mesh.data=2).

The values are checked against plain numpy in float64; the gradients against JAX's own
differentiation of the whole logits through optax's cross-entropy (nothing of jaxnet.blockwise).
"""

from __future__ import annotations

import json
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from conftest import run_patiently

from jaxnet import blockwise, config, tasks
from jaxnet.data import packing
from jaxnet.data.text import from_text
from jaxnet.errors import UserError
from jaxnet.models.adapters import features_apply
from jaxnet.models.common import Head
from jaxnet.models.transformer import PRESETS, TransformerLanguageModel, TransformerSpec
from jaxnet.train.loop import Run
from jaxnet.train.step import make_grad_fn
from tests.conftest import cpu_env

ROWS, LENGTH, WIDTH, VOCAB, USED = 3, 7, 8, 40, 33


def draw(tied: bool, bias: bool, seed: int = 0) -> tuple:
    rng = np.random.default_rng(seed)
    h = rng.normal(size=(ROWS, LENGTH, WIDTH)).astype(np.float32)
    kernel = rng.normal(size=(VOCAB, WIDTH) if tied else (WIDTH, VOCAB)).astype(np.float32)
    b = rng.normal(size=VOCAB).astype(np.float32) if bias else None
    labels = rng.integers(0, USED, (ROWS, LENGTH)).astype(np.int32)
    return h, kernel, b, labels


def numpy_loss(h, kernel, bias, labels, weights, tied, used, smoothing, z_loss, softcap=0.0) -> tuple[float, float]:
    """The weighted sums of the loss and the hits, in float64, from the whole logits."""
    logits = np.einsum("rtd,vd->rtv" if tied else "rtd,dv->rtv", h.astype(np.float64), kernel.astype(np.float64))
    if bias is not None:
        logits = logits + bias
    if softcap:
        logits = softcap * np.tanh(logits / softcap)
    logits = logits[..., :used]  # the padding ids: never predicted, never counted
    top = logits.max(-1)
    lse = top + np.log(np.exp(logits - top[..., None]).sum(-1))
    label = np.take_along_axis(logits, labels[..., None], -1)[..., 0]
    loss = lse - (1 - smoothing) * label - smoothing * logits.mean(-1) + z_loss * lse**2
    return float((weights * loss).sum()), float((weights * (label >= top)).sum())


def whole_logits(h, kernel, bias, labels, weights, tied, used, smoothing, z_loss, softcap=0.0):
    """The loss sum from the whole logits through optax: the reference for the gradients."""
    logits = Head(kernel, bias, transposed=tied, used=used).logits(h)
    if softcap:  # written out here: JAX differentiates the cap itself
        logits = jnp.where(jnp.arange(VOCAB) < used, softcap * jnp.tanh(logits / softcap), logits)
    valid = jnp.arange(VOCAB) < used
    targets = jax.nn.one_hot(labels, VOCAB) * (1 - smoothing) + valid * smoothing / used
    loss = optax.softmax_cross_entropy(jnp.where(valid, logits, -1e30), targets)
    return jnp.sum(weights * (loss + z_loss * jax.nn.logsumexp(logits, axis=-1) ** 2))


def blockwise_loss(h, kernel, bias, labels, weights, tied, used, smoothing, z_loss, block, softcap=0.0):
    head = Head(kernel, bias, transposed=tied, used=used, softcap=softcap)
    return blockwise.cross_entropy(h, head, labels, weights, label_smoothing=smoothing, z_loss=z_loss, block=block)


CASES = {  # tied, bias, used, smoothing, z_loss, mask, block (tokens; ROWS x LENGTH = 21)
    "untied": (False, False, VOCAB, 0.0, 0.0, None, 6),
    "tied padded": (True, False, USED, 0.0, 0.0, None, 6),
    "bias padded masked": (False, True, USED, 0.0, 0.0, "position", 9),
    "smoothing": (False, False, USED, 0.1, 0.0, None, 6),
    "z-loss per-example mask": (True, False, USED, 0.0, 1e-2, "example", 3),
    "everything one block": (True, True, USED, 0.2, 1e-3, "position", 0),
}


@pytest.mark.parametrize("platform", ["cpu", "gpu"])
@pytest.mark.parametrize("case", CASES)
def test_loss_gradients_and_hits_equal_the_whole_logits(case, platform, monkeypatch):
    """Both ways a block is built: a CPU's (the label's logit gathered, the softmax's exponentials
    kept for the gradient) and a GPU's (a second reduction, the exponentials made again)."""
    monkeypatch.setattr(blockwise, "step_platform", lambda: platform)
    tied, bias, used, smoothing, z_loss, mask, block = CASES[case]
    h, kernel, b, labels = draw(tied, bias)
    rng = np.random.default_rng(1)
    if mask is None:
        weights = np.ones((ROWS, LENGTH), np.float32)
    elif mask == "position":
        weights = rng.integers(0, 2, (ROWS, LENGTH)).astype(np.float32)
    else:
        weights = np.asarray(tasks.expand_mask(np.array([1.0, 0.0, 1.0], np.float32), (ROWS, LENGTH)))
    settings = (tied, used, smoothing, z_loss)
    loss_sum, hit_sum = jax.jit(lambda *a: blockwise_loss(*a, *settings, block))(h, kernel, b, labels, weights)
    want_loss, want_hits = numpy_loss(h, kernel, b, labels, weights, *settings)
    assert float(loss_sum) == pytest.approx(want_loss, rel=1e-5)
    assert float(hit_sum) == want_hits

    args = (0, 1, 2, 4) if bias else (0, 1, 4)
    grad = lambda f: jax.jit(jax.grad(f, argnums=args))(h, kernel, b, labels, weights)  # noqa: E731
    got = grad(lambda *a: blockwise_loss(*a, *settings, block)[0])
    want = grad(lambda *a: whole_logits(*a, *settings))
    for g, w, name in zip(got, want, ("features", "kernel", "bias", "weights")[: len(args)], strict=False):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("platform", ["cpu", "gpu"])
def test_a_soft_capped_output_layer_gives_the_loss_and_gradients_of_its_capped_whole_logits(platform, monkeypatch):
    """Gemma 2's final soft-capping (cap * tanh(logits / cap)), owned by the output layer: the blocks
    cap as the whole logits do, and the gradients go through the cap. A cap of 2 on logits of
    about +-8 changes them a lot, so a loss that ignored it would be far off."""
    monkeypatch.setattr(blockwise, "step_platform", lambda: platform)
    h, kernel, b, labels = draw(tied=False, bias=True, seed=3)
    weights = np.random.default_rng(4).integers(0, 2, (ROWS, LENGTH)).astype(np.float32)
    settings = (False, USED, 0.1, 1e-2)
    capped = jax.jit(lambda *a: blockwise_loss(*a, *settings, 6, softcap=2.0))
    loss_sum, hit_sum = capped(h, kernel, b, labels, weights)
    want_loss, want_hits = numpy_loss(h, kernel, b, labels, weights, *settings, softcap=2.0)
    assert float(loss_sum) == pytest.approx(want_loss, rel=1e-5)
    assert float(hit_sum) == want_hits
    assert abs(want_loss - numpy_loss(h, kernel, b, labels, weights, *settings)[0]) > 0.1 * abs(want_loss)
    grad = lambda f: jax.jit(jax.grad(f, argnums=(0, 1, 2, 4)))(h, kernel, b, labels, weights)  # noqa: E731
    got = grad(lambda *a: blockwise_loss(*a, *settings, 6, softcap=2.0)[0])
    want = grad(lambda *a: whole_logits(*a, *settings, softcap=2.0))
    for g, w, name in zip(got, want, ("features", "kernel", "bias", "weights"), strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5, atol=1e-6, err_msg=name)


def test_the_hits_are_a_metric_and_get_no_gradient():
    h, kernel, _, labels = draw(tied=False, bias=False)
    grads = jax.grad(lambda h: blockwise.cross_entropy(h, Head(kernel), labels)[1])(h)
    assert not np.any(np.asarray(grads))


def test_blocks_are_automatic_whole_positions_and_overridable():
    head = Head(jnp.zeros((128, 50304)))  # GPT-2's padded vocabulary
    # gpt2_shakespeare's batch on a CPU: 64 MiB of float32 logits is 333 tokens, 20 positions of 16
    # rows; 16 divides the 128 positions: 8 blocks, no padding.
    auto = blockwise._plan(16, 128, head, 0, False, False)
    assert (auto.blocks, auto.per_block, auto.pad) == (8, 16, 0)
    given = blockwise._plan(16, 128, head, 512, False, False)
    assert (given.blocks, given.per_block, given.pad) == (4, 32, 0)
    prime = blockwise._plan(2, 127, head, 60, False, False)  # no divisor near 30: padded
    assert (prime.blocks, prime.per_block, prime.pad) == (5, 26, 3)
    assert blockwise._plan(2, 127, head, 10**9, False, False).blocks == 1


def test_label_smoothing_of_a_padded_vocabulary_spreads_over_the_used_ids_only():
    h, kernel, _, labels = draw(tied=False, bias=False)
    logits = Head(kernel, used=USED).logits(h)
    got = np.asarray(tasks.cross_entropy(logits, labels, label_smoothing=0.1, z_loss=1e-2))
    weights = np.zeros((ROWS, LENGTH))
    for r in range(ROWS):
        for t in range(LENGTH):
            weights[r, t] = 1.0
            want, _ = numpy_loss(h, kernel, None, labels, weights, False, USED, 0.1, 1e-2)
            weights[r, t] = 0.0
            assert got[r, t] == pytest.approx(want, rel=1e-5)


# ---------------------------------------------------------------------------------------------
# The train step of a real Transformer


def transformer(tied: bool, used: int = 0, **keys) -> TransformerLanguageModel:
    sizes = dict(vocab=29, context=8, layers=1, width=16, heads=2, tie_embeddings=tied, vocab_used=used)
    spec = TransformerSpec(**{**sizes, **keys})
    return TransformerLanguageModel(spec)


@pytest.mark.parametrize(
    "tied,used,mask,keys",
    [
        (True, 25, "position", {}),
        (False, 0, "example", {}),
        (True, 25, "position", {**PRESETS["gemma2"], "logit_softcap": 0.5, "layers": 2, "window": 3}),  # capped
    ],
)
def test_the_train_step_from_features_equals_the_step_from_logits(tied, used, mask, keys):
    model = transformer(tied, used, **keys)
    rng = np.random.default_rng(2)
    tokens = rng.integers(0, 25, (4, 8)).astype(np.int32)
    batch = {"tokens": tokens, "targets": np.roll(tokens, -1, axis=1)}
    batch["mask"] = (rng.random((4, 8)) < 0.7 if mask == "position" else np.array([1, 0, 1, 1])).astype(np.float32)
    params = model.init(jax.random.PRNGKey(0), tokens)["params"]
    assert features_apply(model) is not None
    values = {}
    for source in ("features", "logits"):
        task = tasks.lm(loss_from=source, z_loss=1e-3, label_smoothing=0.05, loss_block=8)
        (loss, (_, metrics)), grads = jax.jit(make_grad_fn(model, task))(params, {}, batch, jax.random.PRNGKey(1))
        values[source] = (loss, metrics["accuracy"], grads)
    (loss, accuracy, grads), (want_loss, want_accuracy, want_grads) = values["features"], values["logits"]
    assert float(loss) == pytest.approx(float(want_loss), rel=1e-6)
    assert float(accuracy) == float(want_accuracy)
    for path, g in jax.tree_util.tree_leaves_with_path(grads):
        w = dict(jax.tree_util.tree_leaves_with_path(want_grads))[path]
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5, atol=1e-7, err_msg=str(path))


def test_under_lora_the_step_from_features_equals_the_step_from_logits_and_the_merged_model():
    """LoRA on every projection and the (untied) output layer, whose adapter is merged into the
    head: auto takes the features, and the adapters' loss and gradients equal the whole logits';
    the logits equal the plain model's with each kernel replaced by W + s A B."""
    from jaxnet.models.adapters import adapt, lora

    spec = TransformerSpec(vocab=29, context=8, layers=1, width=16, heads=2, **PRESETS["llama"])
    targets = r"(attention/(query|key|value|out)|mlp_(in|gate|out)|output)/kernel$"
    model = lora.Lora(adapt(TransformerLanguageModel(spec)), lora.Settings(rank=4, alpha=8, targets=targets))
    rng = np.random.default_rng(5)
    tokens = rng.integers(0, 29, (4, 8)).astype(np.int32)
    batch = {"tokens": tokens, "targets": np.roll(tokens, -1, axis=1), "mask": (rng.random((4, 8)) < 0.8) * 1.0}
    variables = model.init({"params": jax.random.PRNGKey(0), "dropout": jax.random.PRNGKey(1)}, tokens)
    # B drawn too (it starts at zero): the adapters then change what the model computes
    adapters = jax.tree.map(
        lambda x: jnp.asarray(rng.normal(0, 0.3, x.shape), jnp.float32), nn.unbox(variables["params"])
    )
    base = nn.unbox(variables[lora.BASE])
    assert lora.adapter_paths(adapters)[-1] == "output/kernel" and features_apply(model) is not None
    merged = TransformerLanguageModel(spec).apply({"params": lora.merge(base, adapters, 2.0)}, tokens)
    adapted = model.apply({"params": adapters, lora.BASE: base}, tokens, train=False)
    np.testing.assert_allclose(np.asarray(adapted), np.asarray(merged), rtol=1e-5, atol=1e-5)
    values = {}
    for source in ("features", "logits"):
        task = tasks.lm(loss_from=source, z_loss=1e-3, loss_block=8)
        grad_fn = jax.jit(make_grad_fn(model, task))
        (loss, _), grads = grad_fn(adapters, {lora.BASE: base}, batch, jax.random.PRNGKey(2))
        values[source] = (float(loss), grads)
    (loss, grads), (want, want_grads) = values["features"], values["logits"]
    assert loss == pytest.approx(want, rel=1e-6)
    flat, flat_want = (np.concatenate([np.ravel(x) for x in jax.tree.leaves(g)]) for g in (grads, want_grads))
    assert np.abs(flat_want).max() > 1e-3 and flat.size == sum(x.size for x in jax.tree.leaves(adapters))
    np.testing.assert_allclose(flat, flat_want, rtol=1e-5, atol=1e-6 * np.abs(flat_want).max())


def test_packed_chat_rows_of_a_llama_shape_train_as_each_example_alone():
    """Packed rows (segments, positions) with a chat corpus's loss mask, on the Llama shape (RMSNorm,
    SwiGLU, grouped-query rotary attention, an untied output without bias, a padded vocabulary):
    the step from features (the default) equals each example in a row of its own from position 0,
    its logits through optax, the padding ids cut off: the model gets the rows' keywords, the
    blocks count the masked positions only."""
    spec = TransformerSpec(
        vocab=40, context=16, layers=1, width=16, heads=4, kv_heads=2, vocab_used=33, **PRESETS["llama"]
    )
    model = TransformerLanguageModel(spec)
    assert not spec.tie_embeddings and spec.bias == "none"
    r = np.random.default_rng(3)
    lengths = [6, 5, 3]  # 5 + 4 + 2 = 11 positions of 16: 5 of padding
    examples = [r.integers(0, 33, n) for n in lengths]
    trained = [r.integers(0, 2, n).astype(np.float32) for n in lengths]  # the assistant's tokens
    p = packing.pack(np.array(lengths), seq_len=16)
    assert p.rows == 1
    batch = packing.assemble(p, np.array([0]), lambda e, n: (examples[e][:n], trained[e][:n]))
    batch["tokens"][0, 11:] = 7  # what padding holds must not matter
    params = model.init(jax.random.PRNGKey(1), jnp.zeros((1, 16), jnp.int32))["params"]
    task = tasks.lm(loss_block=4)  # 4 blocks of the 16 positions
    assert task.from_features is not None and set(task.model_keywords(batch)) == {"segments", "positions"}
    (loss, _), grads = jax.jit(make_grad_fn(model, task))(params, {}, batch, jax.random.PRNGKey(0))

    alone = {k: np.zeros((len(examples), max(lengths) - 1), t) for k, t in
             (("tokens", np.int32), ("targets", np.int32), ("mask", np.float32))}  # fmt: skip
    for i, (ids, mask) in enumerate(zip(examples, trained, strict=True)):
        alone["tokens"][i, : len(ids) - 1], alone["targets"][i, : len(ids) - 1] = ids[:-1], ids[1:]
        alone["mask"][i, : len(ids) - 1] = mask[1:]

    def reference(params):
        logits = model.apply({"params": params}, alone["tokens"])[..., :33]
        per_token = optax.softmax_cross_entropy_with_integer_labels(logits, alone["targets"])
        return jnp.sum(per_token * alone["mask"]) / np.sum(alone["mask"])

    want, want_grads = jax.jit(jax.value_and_grad(reference))(params)
    assert np.sum(alone["mask"]) == np.sum(batch["mask"]) > 0
    np.testing.assert_allclose(float(loss), float(want), rtol=1e-6)
    flat, flat_want = (np.concatenate([np.ravel(x) for x in jax.tree.leaves(g)]) for g in (grads, want_grads))
    assert np.abs(flat_want).max() > 0.01
    np.testing.assert_allclose(flat, flat_want, rtol=2e-5, atol=1e-6 * np.abs(flat_want).max())


class OwnLanguageModel(nn.Module):
    """A user's model without the features seam: only logits."""

    @nn.compact
    def __call__(self, tokens, train=False):
        return nn.Dense(29)(nn.Embed(29, 8)(tokens))


def test_a_model_without_the_seam_trains_from_its_logits():
    model = OwnLanguageModel()
    assert features_apply(model) is None
    tokens = np.arange(16, dtype=np.int32).reshape(2, 8)
    batch = {"tokens": tokens, "targets": np.roll(tokens, -1, axis=1)}
    params = model.init(jax.random.PRNGKey(0), tokens)["params"]
    (loss, _), _ = make_grad_fn(model, tasks.lm())(params, {}, batch, jax.random.PRNGKey(1))
    logits = model.apply({"params": params}, tokens)
    want = optax.softmax_cross_entropy_with_integer_labels(logits, batch["targets"]).mean()
    assert float(loss) == pytest.approx(float(want), rel=1e-6)


def text_config(*overrides: str) -> config.Config:
    base = ["model.layers=1", "model.width=16", "model.heads=2", "data.seq_len=8", "train.batch_size=4"]
    return config.load_experiment("transformer_shakespeare:smoke", [*base, *overrides])


def test_loss_from_features_refuses_a_model_or_task_that_cannot():
    text = from_text("to be or not to be, that is the question. " * 20, "char")
    with pytest.raises(UserError, match=r"train.loss_from=features: model LSTMLanguageModel does not offer"):
        Run(config.load_experiment("lstm_shakespeare:smoke", ["train.loss_from=features"]), dataset=text)
    own = tasks.Task(inputs="tokens", loss=lambda out, b: jnp.mean(out), name="mine")
    with pytest.raises(UserError, match=r"task 'mine' computes its loss from the model's outputs only"):
        Run(text_config("train.loss_from=features"), dataset=text, task=own)
    # auto: blockwise for the Transformer, with LoRA adapters too (what jaxnet plan reports as its loss)
    assert Run(text_config(), dataset=text).blockwise_loss
    assert Run(text_config("train.lora_rank=2", "train.init_from=elsewhere"), dataset=text).blockwise_loss
    assert not Run(text_config("train.loss_from=logits"), dataset=text).blockwise_loss


# ---------------------------------------------------------------------------------------------
# Two devices

TWO_DEVICES = """
import json, sys
import jax, numpy as np
from jaxnet import blockwise, config, parallel
from jaxnet.data.text import TextDataset
from jaxnet.train.loop import Run

assert jax.device_count() == 2
# 29 ids, 3 of them padding no token uses: a padded vocabulary
tokens = np.random.default_rng(0).integers(0, 26, 2000)
text = TextDataset(train=tokens, val=tokens[:200], test=tokens[:200], vocab=[str(i) for i in range(29)], name="ids")
base = ["model.layers=1", "model.width=16", "model.heads=2", "data.seq_len=8", "train.batch_size=4",
        "optim.name=sgd", "optim.lr=1.0", "optim.momentum=0", "optim.weight_decay=0", "optim.clip_norm=0",
        "optim.warmup_steps=0", "optim.schedule=constant", "model.tie_embeddings=false", "train.z_loss=1e-3",
        "train.loss_block=8", "model.vocab_used=26"]
out = {}
for mesh in ("data=1 tensor=1", "data=1 tensor=2", "data=2 tensor=1", "data=1 fsdp=2"):
    for source in ("features", "logits"):
        overrides = base + [f"mesh.{kv}" for kv in mesh.split()] + [f"train.loss_from={source}"]
        cfg = config.load_experiment("transformer_shakespeare:smoke", overrides)
        devices = jax.devices()[:1] if mesh == "data=1 tensor=1" else None
        run = Run(cfg, dataset=text, devices=devices)
        state = run.init_state()
        before = jax.device_get(state.params)
        state, metrics = run.train_step(state, parallel.put_batch(next(iter(run.train_batches(0))), run.mesh))
        grads = jax.tree.map(lambda a, b: (a - b).ravel().tolist(), before, jax.device_get(state.params))
        assert int(metrics["nonfinite"]) == 0
        out[f"{mesh} {source}"] = {"loss": float(metrics["loss"]), "grads": grads}
    sizes = {}
    def probe():
        sizes.update(batch=blockwise._mesh_sizes("batch"), vocab=blockwise._mesh_sizes("vocab"))
    parallel.under_rules(probe, run.mesh, run.rules)()
    out[mesh + " sizes"] = sizes
print("RESULTS" + json.dumps(out))
"""


@pytest.fixture(scope="module")
def two_device_runs():
    result = run_patiently(
        [sys.executable, "-c", TWO_DEVICES], capture_output=True, text=True, env=cpu_env(2), timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.split("RESULTS", 1)[1])


@pytest.mark.parametrize("mesh", ["data=1 tensor=2", "data=2 tensor=1", "data=1 fsdp=2"])
def test_across_two_devices_the_loss_and_gradients_equal_one_device_from_logits(two_device_runs, mesh):
    """The vocabulary split over tensor devices (the log-sum-exp and the hidden states' gradient
    reduced across them in every block) or the batch over data or FSDP devices (each device's
    partial gradient of the output layer, reduced once; with FSDP the output layer gathered whole
    first): the same step as the whole logits on one device."""
    runs = two_device_runs
    assert runs[f"{mesh} sizes"] == ({"batch": 1, "vocab": 2} if "tensor=2" in mesh else {"batch": 2, "vocab": 1})
    want = runs["data=1 tensor=1 logits"]
    assert want["loss"] > 1.0  # a real step: neither zeroed as non-finite nor trivial
    for source in ("features", "logits"):
        got = runs[f"{mesh} {source}"]
        assert got["loss"] == pytest.approx(want["loss"], rel=1e-6)
        for (path, g), w in zip(leaves(got["grads"]), jax.tree.leaves(want["grads"], is_leaf=is_list), strict=True):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-7, err_msg=f"{source} {path}")


def is_list(x) -> bool:
    return isinstance(x, list)


def leaves(tree) -> list:
    return jax.tree_util.tree_leaves_with_path(tree, is_leaf=is_list)

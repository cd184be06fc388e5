"""Packing examples into rows (jaxnet.data.packing) and a Transformer on packed rows.

The packing against a plain-Python best-fit-decreasing; the rows of a batch against the examples
placed by hand; a packed row through the Transformer against each example run alone (the loss and
its gradients sum to the same numbers in float32, for learned and rotary positions, both XLA
kernels, grouped-query attention), and one example changed leaves the others' logits as they were."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxnet.data import packing
from jaxnet.errors import UserError
from jaxnet.models.transformer import TransformerLanguageModel, TransformerSpec, segment_mask


def reference_bfd(sizes: list[int], capacity: int) -> list[int]:
    """Best fit decreasing the plain way: each size, longest first, into the fullest row it fits;
    the rows' fills, sorted (which of two equally full rows takes a size changes no fill)."""
    rows: list[list[int]] = []
    for size in sorted(sizes, reverse=True):
        fits = [r for r in rows if capacity - sum(r) >= size]
        if fits:
            min(fits, key=lambda r: capacity - sum(r)).append(size)
        else:
            rows.append([size])
    return sorted(sum(r) for r in rows)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_best_fit_decreasing_equals_the_plain_python_one(seed):
    r = np.random.default_rng(seed)
    lengths = r.integers(2, 60, size=300)
    p = packing.pack(lengths, seq_len=64)
    fills = sorted(int(sum(lengths[p.items(i)] - 1)) for i in range(p.rows))
    assert fills == reference_bfd((lengths - 1).tolist(), 64)
    assert sorted(p.example.tolist()) == list(range(300))  # every example once
    assert all(sum(lengths[p.items(i)] - 1) <= 64 for i in range(p.rows))
    assert p.padding == pytest.approx(1 - (lengths - 1).sum() / (64 * p.rows))
    first = [p.items(i).min() for i in range(p.rows)]
    assert first == sorted(first)  # rows numbered by the first example they hold
    again = packing.pack(lengths, seq_len=64)
    assert np.array_equal(again.example, p.example) and np.array_equal(again.starts, p.starts)


def test_overlong_examples_are_dropped_or_truncated_and_counted():
    lengths = np.array([10, 30, 1, 8, 17])  # 30 and 17 fill more than 15 positions; 1 predicts nothing
    dropped = packing.pack(lengths, seq_len=15, overlong="drop")
    assert (dropped.dropped, dropped.truncated, dropped.too_short, dropped.lost_tokens) == (2, 0, 1, 47)
    assert sorted(dropped.example.tolist()) == [0, 3]
    cut = packing.pack(lengths, seq_len=15, overlong="truncate")
    assert (cut.dropped, cut.truncated, cut.lost_tokens) == (0, 2, (30 - 16) + (17 - 16))
    assert dict(zip(cut.example.tolist(), cut.length.tolist(), strict=True)) == {0: 10, 1: 16, 3: 8, 4: 16}
    assert "2 longer than a row truncated" in cut.describe()
    with pytest.raises(UserError, match="data.overlong=split"):
        packing.pack(lengths, 15, "split")


def test_epochs_visit_every_row_once_in_an_order_drawn_from_the_seed():
    rows, batch = 10, 4
    seen = np.concatenate([packing.epoch_rows(rows, 7, step, batch) for step in range(5)])  # two epochs
    assert sorted(seen[:10]) == list(range(10)) and sorted(seen[10:20]) == list(range(10))
    assert not np.array_equal(seen[:10], seen[10:20])
    assert np.array_equal(packing.epoch_rows(rows, 7, 3, batch), seen[12:16])  # a pure function of the step
    assert not np.array_equal(packing.epoch_rows(rows, 8, 0, batch), seen[:4])


def test_a_batch_holds_each_example_at_its_own_positions():
    examples = {0: np.array([5, 6, 7, 8]), 1: np.array([20, 21, 22]), 2: np.array([30, 31])}
    trained = {0: np.array([0, 0, 1, 1]), 1: np.array([0, 1, 1]), 2: np.array([1, 1])}
    p = packing.pack(np.array([4, 3, 2]), seq_len=8)
    assert p.rows == 1 and p.items(0).tolist() == [0, 1, 2]
    b = packing.assemble(p, np.array([0, -1]), lambda e, n: (examples[e][:n], trained[e][:n]))
    assert b["tokens"].tolist() == [[5, 6, 7, 20, 21, 30, 0, 0], [0] * 8]
    assert b["targets"].tolist() == [[6, 7, 8, 21, 22, 31, 0, 0], [0] * 8]
    assert b["mask"].tolist() == [[0, 1, 1, 1, 1, 1, 0, 0], [0] * 8]
    assert b["segments"].tolist() == [[1, 1, 1, 2, 2, 3, 0, 0], [0] * 8]
    assert b["positions"].tolist() == [[0, 1, 2, 0, 1, 0, 0, 0], [0] * 8]


def test_segment_mask_keeps_examples_and_padding_apart():
    m = np.asarray(segment_mask(jnp.array([[1, 1, 2, 0, 0]])))[0, 0]
    assert m.astype(int).tolist() == [
        [1, 1, 0, 0, 0], [1, 1, 0, 0, 0], [0, 0, 1, 0, 0], [0, 0, 0, 1, 1], [0, 0, 0, 1, 1]
    ]  # fmt: skip


# ---------------------------------------------------------------------------------------------
# The Transformer on packed rows


def summed_loss(logits, targets, mask):
    return jnp.sum(optax.softmax_cross_entropy_with_integer_labels(logits, targets) * mask)


VARIANTS = [  # learned and rotary positions, both XLA kernels, multi-head and grouped-query attention
    dict(position="learned", attention="xla"),
    dict(position="rotary", attention="xla_head_major", kv_heads=2),
]


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: "-".join(str(x) for x in v.values()))
def test_a_packed_rows_loss_and_gradients_are_the_sum_of_each_example_alone(variant):
    spec = TransformerSpec(vocab=50, context=24, layers=2, width=32, heads=4, **variant)
    model = TransformerLanguageModel(spec)
    r = np.random.default_rng(0)
    lengths = [8, 6, 5, 3]  # 7 + 5 + 4 + 2 = 18 positions of 24: 6 of padding
    examples = [r.integers(0, 50, n) for n in lengths]
    trained = [r.integers(0, 2, n).astype(np.float32) for n in lengths]  # e.g. the assistant's tokens
    p = packing.pack(np.array(lengths), seq_len=24)
    assert p.rows == 1
    batch = packing.assemble(p, np.array([0]), lambda e, n: (examples[e][:n], trained[e][:n]))
    batch["tokens"][0, 18:] = 7  # what padding holds must not matter
    params = model.init(jax.random.PRNGKey(1), jnp.zeros((1, 24), jnp.int32))["params"]

    def packed(params):
        rows = {"segments": batch["segments"], "positions": batch["positions"]}
        logits = model.apply({"params": params}, batch["tokens"], **rows)
        return summed_loss(logits, batch["targets"], batch["mask"])

    # each example alone: a row of its own from position 0, what follows it (causal) not counted
    alone_rows = {k: np.zeros((len(examples), max(lengths) - 1), dtype) for k, dtype in
                  (("tokens", np.int32), ("targets", np.int32), ("mask", np.float32))}  # fmt: skip
    for i, (ids, mask) in enumerate(zip(examples, trained, strict=True)):
        alone_rows["tokens"][i, : len(ids) - 1], alone_rows["targets"][i, : len(ids) - 1] = ids[:-1], ids[1:]
        alone_rows["mask"][i, : len(ids) - 1] = mask[1:]

    def alone(params):
        logits = model.apply({"params": params}, alone_rows["tokens"])
        return summed_loss(logits, alone_rows["targets"], alone_rows["mask"])

    loss_p, grads_p = jax.jit(jax.value_and_grad(packed))(params)
    loss_a, grads_a = jax.jit(jax.value_and_grad(alone))(params)
    np.testing.assert_allclose(loss_p, loss_a, rtol=1e-6)
    flat_p, flat_a = (np.concatenate([np.ravel(g) for g in jax.tree.leaves(g)]) for g in (grads_p, grads_a))
    assert np.abs(flat_a).max() > 0.1
    np.testing.assert_allclose(flat_p, flat_a, rtol=2e-5, atol=1e-6 * np.abs(flat_a).max())  # float32 rounding


def test_changing_one_example_leaves_the_others_logits_unchanged():
    spec = TransformerSpec(vocab=50, context=16, layers=2, width=32, heads=4, position="rotary", attention="xla")
    model = TransformerLanguageModel(spec)
    tokens = np.random.default_rng(0).integers(0, 50, (1, 16))
    segments = np.array([[1] * 5 + [2] * 6 + [3] * 3 + [0] * 2])
    positions = np.array([list(range(5)) + list(range(6)) + list(range(3)) + [0, 0]])
    params = model.init(jax.random.PRNGKey(2), tokens)
    run = jax.jit(lambda t: model.apply(params, t, segments=segments, positions=positions))
    before = np.asarray(run(tokens))
    changed = tokens.copy()
    changed[0, 5:11] = (changed[0, 5:11] + 13) % 50  # the second example
    after = np.asarray(run(changed))
    others = segments[0] != 2
    np.testing.assert_array_equal(after[0, others], before[0, others])
    assert not np.allclose(after[0, ~others], before[0, ~others])
    # without segments the later examples see the changed one
    plain = jax.jit(lambda t: model.apply(params, t))
    assert not np.allclose(np.asarray(plain(changed))[0, 11:14], np.asarray(plain(tokens))[0, 11:14])


def test_the_lm_task_gives_a_packed_rows_segments_and_positions_to_the_model_by_name():
    from jaxnet import tasks

    class Echo(nn.Module):
        @nn.compact
        def __call__(self, tokens, train=False, segments=None, positions=None):
            assert segments is not None and positions is not None
            return jax.nn.one_hot(positions, 8) + 0 * self.param("w", nn.initializers.zeros, ())

    batch = {
        "tokens": np.zeros((1, 4), np.int32),
        "segments": np.ones((1, 4), np.int32),
        "positions": np.array([[0, 1, 0, 1]]),
        "targets": np.array([[0, 1, 0, 1]]),
        "mask": np.ones((1, 4)),
    }
    task = tasks.lm()
    assert task.model_keywords(batch).keys() == {"segments", "positions"}
    variables = Echo().init(jax.random.PRNGKey(0), *task.model_inputs(batch), **task.model_keywords(batch))
    out = Echo().apply(variables, *task.model_inputs(batch), **task.model_keywords(batch))
    assert float(task.train_values(out, batch)[1]["accuracy"]) == 1.0

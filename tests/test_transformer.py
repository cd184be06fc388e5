"""The Transformer against independent references: attention (multi-head and grouped-query, every
kernel, with the decoding cache and with a mask) against naive numpy softmax attention, rotary
positions against a numpy rotation, causality, decoding with the cache against full forward
passes, greedy and top-k sampling, the features/unembedding seam and the spec's presets.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_lm import greedy_reference, jitted, np_softmax, np_tree, param_shapes, random_params, random_tokens, scaled

from jaxnet.errors import UserError
from jaxnet.models import TransformerConfig
from jaxnet.models.transformer import (
    PRESETS,
    SelfAttention,
    TransformerLanguageModel,
    TransformerSpec,
    attend,
    mask_unused_vocab,
    preset,
    rotary,
)
from jaxnet.sample import decode_state, generate

# ---------------------------------------------------------------------------------------------
# Plain numpy references (float64)


def np_rotary(x: np.ndarray, positions: np.ndarray, base: float = 10000.0) -> np.ndarray:
    """Pairs (x[j], x[j + d/2]) rotated by the angle position * base**(-2j/d)."""
    d = x.shape[-1]
    half = d // 2
    out = np.empty_like(x, dtype=np.float64)
    for t, pos in enumerate(positions):
        for j in range(half):
            angle = pos * base ** (-2.0 * j / d)
            a, b = x[:, t, :, j], x[:, t, :, j + half]
            out[:, t, :, j] = a * np.cos(angle) - b * np.sin(angle)
            out[:, t, :, j + half] = a * np.sin(angle) + b * np.cos(angle)
    return out


def np_causal_attention(params, x, heads: int, use_rotary: bool, kv_heads: int | None = None) -> np.ndarray:
    """Naive causal softmax attention with input and output projections, query head ``h`` reading
    key/value head ``h // (heads // kv_heads)`` (grouped-query attention; multi-head when equal)."""
    p = np_tree(params)
    x = np.asarray(x, np.float64)
    batch, length, width = x.shape
    head_dim = width // heads
    group = heads // (kv_heads or heads)
    q, k, v = (np.einsum("btw,whd->bthd", x, p[n]["kernel"]) + p[n]["bias"] for n in ("query", "key", "value"))
    if use_rotary:
        q, k = np_rotary(q, np.arange(length)), np_rotary(k, np.arange(length))
    out = np.zeros((batch, length, heads, head_dim))
    for bi in range(batch):
        for h in range(heads):
            scores = q[bi, :, h] @ k[bi, :, h // group].T / np.sqrt(head_dim)  # (query, key)
            scores = np.where(np.tril(np.ones((length, length), bool)), scores, -np.inf)
            out[bi, :, h] = np_softmax(scores) @ v[bi, :, h // group]
    return np.einsum("bthd,hdw->btw", out, p["out"]["kernel"]) + p["out"]["bias"]


# ---------------------------------------------------------------------------------------------
# Attention and rotary positions

T_VOCAB, CONTEXT = 31, 8


def transformer(position: str = "learned", **fields) -> TransformerLanguageModel:
    fields = {"layers": 2, "width": 16, "heads": 2, **fields}
    spec = TransformerSpec(vocab=T_VOCAB, context=CONTEXT, position=position, **fields)
    return TransformerLanguageModel(spec)


@pytest.fixture(scope="module")
def transformer_params():
    return {
        position: random_params(transformer(position), jnp.zeros((1, CONTEXT), jnp.int32), seed=3)
        for position in ("learned", "rotary")
    }


@pytest.mark.parametrize("position", ["learned", "rotary"])
def test_transformer_logits_at_a_position_never_depend_on_later_tokens(transformer_params, position):
    model = transformer(position)
    params = scaled(transformer_params[position], 5.0)  # larger weights: changes propagate visibly
    apply = functools.partial(jitted(model), {"params": params})
    tokens = random_tokens((2, CONTEXT), seed=6, vocab=T_VOCAB)
    base = np.asarray(apply(tokens))
    for t in (0, 3, CONTEXT - 1):
        changed = tokens.copy()
        changed[:, t] = (changed[:, t] + 1) % T_VOCAB
        logits = np.asarray(apply(changed))
        np.testing.assert_array_equal(logits[:, :t], base[:, :t])
        assert (np.abs(logits[:, t:] - base[:, t:]).max(axis=-1) > 1e-4).all()  # every later position sees it


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
def test_a_later_token_changes_earlier_positions_only_without_the_causal_mask(transformer_params, causal):
    model = transformer(causal=causal)
    apply = functools.partial(jitted(model), {"params": scaled(transformer_params["learned"], 5.0)})
    tokens = random_tokens((2, CONTEXT), seed=8, vocab=T_VOCAB)
    changed = tokens.copy()
    changed[:, -1] = (changed[:, -1] + 1) % T_VOCAB
    earlier = np.abs(np.asarray(apply(changed))[:, :-1] - np.asarray(apply(tokens))[:, :-1]).max(axis=-1)
    if causal:
        assert (earlier == 0).all()
    else:
        assert (earlier > 1e-4).all()  # every earlier position attends to the last token


def attention_params(shapes, seed: int):
    """Random weights and biases of order one, so that the softmax is far from uniform."""
    rng = np.random.default_rng(seed)
    return jax.tree.map(
        lambda s: (0.5 * rng.normal(size=s)).astype(np.float32), shapes, is_leaf=lambda s: isinstance(s, tuple)
    )


@pytest.mark.parametrize("use_rotary", [False, True], ids=["plain", "rotary"])
def test_causal_self_attention_matches_naive_numpy_softmax_attention(use_rotary):
    heads, length, width = 2, 7, 8
    spec = TransformerSpec(
        vocab=1, context=CONTEXT, width=width, heads=heads, position="rotary" if use_rotary else "learned"
    )
    module = SelfAttention(spec)
    rng = np.random.default_rng(7)
    x = rng.normal(size=(2, length, width)).astype(np.float32)
    shapes = param_shapes(module, x, positions=jnp.arange(length))
    head = {"kernel": (width, heads, width // heads), "bias": (heads, width // heads)}
    assert shapes == {
        "query": head,
        "key": head,
        "value": head,
        "out": {"kernel": (heads, width // heads, width), "bias": (width,)},
    }
    params = attention_params(shapes, seed=7)
    got = jitted(module)({"params": params}, x, positions=jnp.arange(length))
    want = np_causal_attention(params, x, heads, use_rotary)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    if use_rotary:  # positions matter: the same module without rotation gives something else
        plain = np_causal_attention(params, x, heads, False)
        assert np.abs(plain - want).max() > 1e-2


@pytest.mark.parametrize("kernel", ["xla", "xla_head_major"])
@pytest.mark.parametrize("kv_heads", [2, 1])
def test_grouped_query_attention_matches_numpy_each_key_value_head_serving_its_group(kernel, kv_heads):
    heads, length, width = 4, 7, 16
    spec = TransformerSpec(vocab=1, context=CONTEXT, width=width, heads=heads, kv_heads=kv_heads, attention=kernel)
    module = SelfAttention(spec)
    x = np.random.default_rng(11).normal(size=(2, length, width)).astype(np.float32)
    shapes = param_shapes(module, x, positions=jnp.arange(length))
    assert shapes["query"]["kernel"] == (width, heads, 4) and shapes["out"]["kernel"] == (heads, 4, width)
    assert shapes["key"]["kernel"] == shapes["value"]["kernel"] == (width, kv_heads, 4)  # fewer heads: a shape
    params = attention_params(shapes, seed=12)
    got = jitted(module)({"params": params}, x, positions=jnp.arange(length))
    want = np_causal_attention(params, x, heads, False, kv_heads=kv_heads)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    # and every query head of a group reads its one key/value head: multi-head attention with the
    # key/value weights repeated per group computes the same
    repeat = lambda a: np.repeat(a, heads // kv_heads, axis=-2)  # noqa: E731
    full = {**params, **{n: {k: repeat(v) for k, v in params[n].items()} for n in ("key", "value")}}
    mha = SelfAttention(dataclasses.replace(spec, kv_heads=heads))
    np.testing.assert_allclose(jitted(mha)({"params": full}, x, positions=jnp.arange(length)), got, atol=1e-5)


def test_a_mask_keeps_examples_packed_in_one_row_from_seeing_each_other():
    """The seam packing uses: causal attention over two segments of one row, with a mask that hides
    each from the other, equals each segment attended alone (every kernel, grouped heads)."""
    rng = np.random.default_rng(13)
    q = jnp.asarray(rng.normal(size=(1, 7, 4, 8)).astype(np.float32))
    k, v = (jnp.asarray(rng.normal(size=(1, 7, 2, 8)).astype(np.float32)) for _ in range(2))
    segments = np.array([0, 0, 0, 1, 1, 1, 1])
    mask = jnp.asarray(segments[:, None] == segments[None, :])[None, None]
    attend_jit = jax.jit(attend, static_argnames=("causal", "kernel"))
    for kernel in ("xla", "xla_head_major"):
        packed = attend_jit(q, k, v, causal=True, kernel=kernel, mask=mask)
        first = attend_jit(q[:, :3], k[:, :3], v[:, :3], causal=True, kernel=kernel)
        second = attend_jit(q[:, 3:], k[:, 3:], v[:, 3:], causal=True, kernel=kernel)
        np.testing.assert_allclose(packed, jnp.concatenate([first, second], axis=1), rtol=1e-6, atol=1e-6)


def test_rotary_matches_numpy_half_split_rotation():
    rng = np.random.default_rng(8)
    x = rng.normal(size=(2, 5, 3, 8)).astype(np.float32)
    positions = np.array([0, 1, 4, 9, 30])
    got = rotary(jnp.asarray(x), jnp.asarray(positions))
    np.testing.assert_allclose(got, np_rotary(x.astype(np.float64), positions), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got[:, 0], x[:, 0], rtol=0, atol=0)  # position 0 is the identity
    np.testing.assert_allclose(np.linalg.norm(got, axis=-1), np.linalg.norm(x, axis=-1), rtol=1e-5)
    # positions per row (examples packed in a row restart theirs): each row as rotated alone
    rows = np.array([[0, 1, 2, 0, 1], [5, 6, 7, 8, 9]])
    per_row = rotary(jnp.asarray(x), jnp.asarray(rows))
    for r in range(2):
        np.testing.assert_allclose(per_row[r : r + 1], np_rotary(x[r : r + 1].astype(np.float64), rows[r]), atol=1e-5)


def test_rotary_query_key_products_depend_only_on_the_distance():
    rng = np.random.default_rng(9)
    q, k = rng.normal(size=(2, 1, 1, 1, 16)).astype(np.float32)
    dots = {}
    for p_q, p_k in [(5, 2), (3, 3), (0, 7)]:
        for shift in (0, 1, 13, 50):
            rq = np.asarray(rotary(jnp.asarray(q), jnp.asarray([p_q + shift])), np.float64)
            rk = np.asarray(rotary(jnp.asarray(k), jnp.asarray([p_k + shift])), np.float64)
            dots.setdefault((p_q, p_k), []).append(float((rq * rk).sum()))
    for pair, values in dots.items():
        np.testing.assert_allclose(values, values[0], rtol=1e-4, atol=1e-4, err_msg=str(pair))
    # but the product does depend on the distance
    assert abs(dots[(5, 2)][0] - dots[(3, 3)][0]) > 1e-2 and abs(dots[(0, 7)][0] - dots[(3, 3)][0]) > 1e-2


def decode_in_chunks(model, params, tokens, sizes):
    """Logits of ``tokens`` (1, T) decoded with the cache in chunks of ``sizes``, and the last cache."""
    cache = decode_state(model)["cache"]  # an empty cache for one sequence
    pieces, start = [], 0
    decode = jitted(model, decode=True, mutable=("cache",))
    for size in sizes:
        logits, variables = decode({"params": params, "cache": cache}, tokens[:, start : start + size])
        cache, start = variables["cache"], start + size
        pieces.append(logits)
    assert start == tokens.shape[1]
    return np.concatenate(pieces, axis=1), cache


@pytest.mark.parametrize("position", ["learned", "rotary"])
def test_transformer_decoding_with_the_cache_matches_the_full_forward_pass(transformer_params, position):
    model = transformer(position)
    params = scaled(transformer_params[position], 5.0)
    tokens = random_tokens((1, CONTEXT), seed=10, vocab=T_VOCAB)
    full = jitted(model)({"params": params}, tokens)
    decoded, _ = decode_in_chunks(model, params, tokens, (3, 1, 1, 1, 1, 1))  # a chunk, then single tokens
    np.testing.assert_allclose(decoded, full, rtol=1e-5, atol=1e-5)


def test_grouped_query_decoding_keeps_a_cache_of_the_key_value_heads_and_matches_the_full_pass():
    model = transformer("rotary", heads=4, kv_heads=2)
    params = scaled(random_params(model, jnp.zeros((1, CONTEXT), jnp.int32), seed=14), 5.0)
    tokens = random_tokens((1, CONTEXT), seed=15, vocab=T_VOCAB)
    decoded, cache = decode_in_chunks(model, params, tokens, (2, 1, 4, 1))
    np.testing.assert_allclose(decoded, jitted(model)({"params": params}, tokens), rtol=1e-5, atol=1e-5)
    assert cache["block_0"]["attention"]["cached_key"].shape == (1, CONTEXT, 2, 4)  # kv_heads, not heads


# ---------------------------------------------------------------------------------------------
# Local layers (a window), scaled and soft-capped attention


def np_attention(q, k, v, window: int = 0, scale: float | None = None, softcap: float = 0.0) -> np.ndarray:
    """Causal softmax attention in float64, query head ``h`` reading key/value head ``h // group``; a
    query at ``i`` sees keys ``j`` with ``i - window < j <= i`` (every earlier one when 0), the logits
    scaled by ``scale`` (1 / sqrt(head_dim) when None) and capped as ``softcap * tanh(x / softcap)``."""
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    batch, length, heads, head_dim = q.shape
    group = heads // k.shape[2]
    i, j = np.arange(length)[:, None], np.arange(length)[None, :]
    visible = (j <= i) & ((j > i - window) if window else True)
    out = np.zeros(q.shape)
    for b in range(batch):
        for h in range(heads):
            scores = q[b, :, h] @ k[b, :, h // group].T * (head_dim**-0.5 if scale is None else scale)
            if softcap:
                scores = softcap * np.tanh(scores / softcap)
            out[b, :, h] = np_softmax(np.where(visible, scores, -np.inf)) @ v[b, :, h // group]
    return out


@pytest.mark.parametrize("kernel", ["xla", "xla_head_major"])
@pytest.mark.parametrize("scaling", [{}, {"scale": 0.4, "softcap": 1.5}], ids=["plain", "scaled-capped"])
def test_attention_in_a_window_scaled_and_soft_capped_matches_numpy(kernel, scaling):
    """A local layer's window (each query sees itself and the 2 positions before it), Gemma's
    query_pre_attn_scalar (a scale of its own) and soft-capped logits, against numpy; grouped heads."""
    rng = np.random.default_rng(21)
    q = rng.normal(size=(2, 9, 4, 8)).astype(np.float32) * 2
    k, v = (rng.normal(size=(2, 9, 2, 8)).astype(np.float32) * 2 for _ in range(2))
    run = jax.jit(functools.partial(attend, causal=True, kernel=kernel, **scaling), static_argnames="window")
    windowed = np.asarray(run(q, k, v, window=3))
    np.testing.assert_allclose(windowed, np_attention(q, k, v, 3, **scaling), rtol=1e-5, atol=1e-5)
    whole = np.asarray(run(q, k, v, window=0))
    np.testing.assert_allclose(whole, np_attention(q, k, v, 0, **scaling), rtol=1e-5, atol=1e-5)
    assert np.abs(whole[:, 3:] - windowed[:, 3:]).max() > 1e-2  # past the window the two differ
    np.testing.assert_allclose(whole[:, :3], windowed[:, :3], rtol=1e-6, atol=1e-7)  # within it, the same


def test_a_local_layer_decodes_from_a_cache_of_its_window_and_matches_the_full_pass():
    """Local layers keep only their window's positions (a ring of 3 slots here, for a context of 8),
    global ones the context; decoding in chunks longer than the window and one token at a time gives
    the full pass's logits (Gemma 2's shape: local and global layers, soft-capped, scaled)."""
    keys = {**PRESETS["gemma2"], "window": 3, "attention_scale_dim": 6, "attention_softcap": 2.0}
    model = transformer(**{**keys, "layers": 4, "heads": 4, "kv_heads": 2, "logit_softcap": 3.0})
    params = scaled(random_params(model, jnp.zeros((1, CONTEXT), jnp.int32), seed=22), 5.0)
    tokens = random_tokens((1, CONTEXT), seed=23, vocab=T_VOCAB)
    full = jitted(model)({"params": params}, tokens)
    for sizes in ((5, 1, 2), (1,) * CONTEXT, (2, 4, 2)):
        decoded, cache = decode_in_chunks(model, params, tokens, sizes)
        np.testing.assert_allclose(decoded, full, rtol=1e-5, atol=1e-5, err_msg=str(sizes))
    assert cache["block_0"]["attention"]["cached_key"].shape == (1, 3, 2, 4)  # local: the window
    assert cache["block_1"]["attention"]["cached_key"].shape == (1, CONTEXT, 2, 4)  # global: the context
    # the window matters here: the same weights attending globally give other logits
    wide = transformer(**{**keys, "attention_pattern": ("global",), "layers": 4, "heads": 4, "kv_heads": 2})
    assert np.abs(np.asarray(jitted(wide)({"params": params}, tokens)) - full).max() > 1e-2


def test_soft_capped_attention_never_runs_a_fused_kernel_and_says_why():
    capped = TransformerConfig.preset("gemma2", dtype="bfloat16", width=64, heads=4)
    assert capped.for_backend("cuda").attention == "xla"  # not cuDNN's, which cannot cap
    assert "soft-caps the attention logits" in capped.unfused_because()
    assert (
        TransformerConfig.preset("gemma3", dtype="bfloat16", width=64, heads=4).for_backend("cuda").attention == "cudnn"
    )
    with pytest.raises(UserError, match="model.attention=cudnn: model.attention_softcap=50 soft-caps"):
        dataclasses.replace(capped, attention="cudnn").for_backend("cuda")
    # and jaxnet plan's line on the attention kernel gives the reason beside XLA's
    from jaxnet.plan_hlo import attention_kernel

    said = attention_kernel("", "xla", False, capped.unfused_because())["description"]
    assert said == f"XLA's softmax(QK^T)V (no cuDNN attention call: {capped.unfused_because()})"
    # a head size past cuDNN's (Gemma 3 12B's 256) is XLA's too, and said so
    wide = TransformerConfig.preset("gemma3", dtype="bfloat16", width=1024, heads=4)
    assert wide.for_backend("cuda").attention == "xla"
    assert wide.unfused_because().startswith("a head size of 256")


def test_local_layers_count_the_flops_of_their_window():
    from jaxnet.models.transformer import transformer_flops

    sizes = dict(layers=2, width=16, heads=2, mlp_hidden=32)
    whole = TransformerConfig.preset("gemma", **sizes).spec(50, 16)
    local = TransformerConfig.preset("gemma2", **sizes, window=4).spec(50, 16)  # layer 0 local, layer 1 global
    pairs_whole, pairs_local = 16 * 17 / 2, 4 * 5 / 2 + 12 * 4  # each query sees at most 4 positions
    scores = lambda pairs: 2 * 2 * 3 * pairs * 2 * 8  # noqa: E731  (batch 3, 2 heads of 8)
    assert transformer_flops(whole, batch=3) - transformer_flops(local, batch=3) == scores(pairs_whole) - scores(
        pairs_local
    )


# ---------------------------------------------------------------------------------------------
# The features and the unembedding apart


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_the_logits_are_the_unembedded_features_and_any_slice_unembeds_alone(tied):
    model = transformer(tie_embeddings=tied, vocab_used=29)
    params = random_params(model, jnp.zeros((1, CONTEXT), jnp.int32), seed=16)
    tokens = random_tokens((2, CONTEXT), seed=17, vocab=T_VOCAB)
    logits = np.asarray(jitted(model)({"params": params}, tokens))
    features = jitted(model, method="features")({"params": params}, tokens)
    assert features.shape == (2, CONTEXT, 16)
    np.testing.assert_array_equal(jitted(model, method="unembed")({"params": params}, features), logits)
    piece = jitted(model, method="unembed")({"params": params}, features[:, 2:5])
    np.testing.assert_allclose(piece, logits[:, 2:5], rtol=1e-6, atol=1e-6)
    # the unembedding by hand: the embedding's transpose or the output kernel, then the mask
    p = np_tree(params)
    head = p["embed"]["embedding"].T if tied else p["output"]["kernel"]
    want = np.asarray(features, np.float64) @ head
    np.testing.assert_allclose(logits[..., :29], want[..., :29], rtol=1e-5, atol=1e-5)
    assert (logits[..., 29:] == np.finfo(np.float32).min).all() and logits.dtype == np.float32


def test_the_unused_vocabulary_mask_hides_only_the_padding_ids():
    logits = jnp.arange(12, dtype=jnp.float32).reshape(2, 6)
    masked = np.asarray(mask_unused_vocab(logits, 4))
    np.testing.assert_array_equal(masked[:, :4], np.asarray(logits)[:, :4])
    assert (masked[:, 4:] == np.finfo(np.float32).min).all()
    for used in (0, 6, 9):  # nothing to mask
        assert mask_unused_vocab(logits, used) is logits


# ---------------------------------------------------------------------------------------------
# The spec, its presets and the config that becomes it


def test_the_config_becomes_one_spec_and_presets_are_its_variants():
    cfg = TransformerConfig(layers=3, width=24, heads=6, mlp_ratio=2, norm_eps=1e-5, context=40, dtype="float32")
    spec = cfg.spec(vocab=70, context=40)
    assert (spec.layers, spec.width, spec.heads, spec.kv_heads, spec.head_dim) == (3, 24, 6, 6, 4)
    assert (spec.mlp_hidden, spec.norm_eps, spec.vocab, spec.context, spec.groups) == (48, 1e-5, 70, 40, 1)
    assert cfg.build(outputs=70, seq_len=16).spec == spec  # the module takes the spec whole
    assert TransformerConfig.preset("gpt2", layers=2).norm_eps == 1e-5
    assert preset("bert_encoder", vocab=5, context=8).causal is False
    assert set(PRESETS) == {"char_gpt", "gpt2", "bert_encoder", "llama", "qwen2", "mistral", "qwen3", "phi3", "gemma",
                            "gemma2", "gemma3"}  # fmt: skip
    # the keys are declared once: the spec has every config key but the config's own four, and
    # its vocabulary, positions and dtypes; every preset field is both
    spec_fields = {f.name for f in dataclasses.fields(TransformerSpec)}
    config_fields = {f.name for f in dataclasses.fields(TransformerConfig)}
    assert spec_fields - {"vocab"} == config_fields - {"name"}
    assert all(set(p) <= spec_fields & config_fields for p in PRESETS.values())
    # one check for both: a ValueError in Python, a one-line error (exit 2) on the command line
    with pytest.raises(ValueError, match="model.kv_heads=3 does not divide model.heads=4"):
        TransformerSpec(vocab=5, context=8, width=16, heads=4, kv_heads=3)
    with pytest.raises(UserError, match="model.kv_heads=3 does not divide model.heads=4"):
        TransformerConfig(width=16, heads=4, kv_heads=3).validate()


def test_the_family_splits_key_value_heads_over_tensor_devices_only_where_they_divide():
    cfg = TransformerConfig(heads=4)
    assert cfg.axis_rules({"data": 1, "fsdp": 1, "tensor": 2}) == (("kv_heads", "tensor"),)
    assert cfg.axis_rules({"data": 1, "fsdp": 1, "tensor": 8}) == (("kv_heads", None),)


# ---------------------------------------------------------------------------------------------
# Sampling


@pytest.fixture(scope="module")
def sharp_transformer(transformer_params):
    """A Transformer whose greedy continuations are not all one token."""
    return transformer("learned"), scaled(transformer_params["learned"], 20.0)


def test_greedy_generation_with_the_kv_cache_equals_full_forward_greedy_within_the_context(sharp_transformer):
    model, params = sharp_transformer
    prompt = np.array([3, 17, 5], np.int32)
    n = CONTEXT - len(prompt) + 1  # the last one is predicted from a full context
    want = greedy_reference(model, params, prompt, n, CONTEXT)
    assert len(set(want)) > 1
    got = generate(model, params, prompt, n, temperature=0.0)
    assert got.dtype == np.int32 and got.tolist() == want


def test_generation_past_the_context_slides_the_window(sharp_transformer):
    model, params = sharp_transformer
    prompt = np.array([9, 2], np.int32)
    n = 3 * CONTEXT + 1
    got = generate(model, params, prompt, n, temperature=0.0)
    assert got.shape == (n,) and ((0 <= got) & (got < T_VOCAB)).all()
    want = greedy_reference(model, params, prompt, n, CONTEXT)
    assert len(set(want)) > 1
    assert got.tolist() == want
    sampled = generate(model, params, prompt, n, temperature=1.0, seed=3)
    assert sampled.shape == (n,) and ((0 <= sampled) & (sampled < T_VOCAB)).all()


def test_a_prompt_as_long_as_the_context_is_a_user_error(sharp_transformer):
    model, params = sharp_transformer
    with pytest.raises(UserError, match="context"):
        generate(model, params, np.arange(CONTEXT) % T_VOCAB, 2)
    with pytest.raises(UserError, match="empty"):
        generate(model, params, np.zeros(0, np.int32), 2)
    assert len(generate(model, params, np.arange(CONTEXT - 1), 2, temperature=0.0)) == 2


def test_a_prompt_shaped_as_the_model_takes_it_a_batch_of_one_generates_as_its_row(sharp_transformer):
    model, params = sharp_transformer
    prompt = np.array([3, 17, 5], np.int32)
    row = generate(model, params, prompt, 4, temperature=0.0)
    assert generate(model, params, prompt[None], 4, temperature=0.0).tolist() == row.tolist()
    assert generate(model, params, prompt[None].astype(np.int64), 4, temperature=0.0).tolist() == row.tolist()
    with pytest.raises(
        UserError, match=r"shape \(2, 3\); give the token ids of one sequence, shaped \(T,\) or \(1, T\)"
    ):
        generate(model, params, np.stack([prompt, prompt]), 4)
    with pytest.raises(UserError, match="float32"):
        generate(model, params, prompt.astype(np.float32), 4)
    with pytest.raises(UserError, match="empty"):
        generate(model, params, np.zeros((1, 0), np.int32), 4)


def test_top_k_1_is_greedy_and_seeds_make_samples_reproducible(sharp_transformer, transformer_params):
    model, sharp = sharp_transformer
    flat = transformer_params["learned"]  # small weights: nearly uniform next-token distributions
    prompt = np.array([4, 1], np.int32)
    for params in (sharp, flat):
        greedy = generate(model, params, prompt, 10, temperature=0.0).tolist()
        for seed in (0, 1):
            assert generate(model, params, prompt, 10, temperature=1.0, top_k=1, seed=seed).tolist() == greedy
    # draws depend on the seed, and only on it
    first = generate(model, flat, prompt, 16, temperature=1.0, seed=5)
    assert generate(model, flat, prompt, 16, temperature=1.0, seed=5).tolist() == first.tolist()
    assert generate(model, flat, prompt, 16, temperature=1.0, seed=6).tolist() != first.tolist()
    assert len(set(first.tolist())) > 3


def test_top_k_draws_only_among_the_k_likeliest_tokens(transformer_params):
    model, params = transformer("learned"), transformer_params["learned"]
    prompt = np.array([7, 3, 11], np.int32)
    logits = np.asarray(jitted(model)({"params": params}, prompt[None]))[0, -1]
    top3 = set(np.argsort(logits)[-3:].tolist())
    drawn = {int(generate(model, params, prompt, 1, temperature=1.0, top_k=3, seed=seed)[0]) for seed in range(24)}
    assert drawn <= top3 and len(drawn) > 1

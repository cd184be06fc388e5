"""The Transformer language model: blocks of attention and MLP on a :class:`TransformerSpec`.

token embedding (+ learned position embedding, or rotary positions inside attention) ->
dropout -> ``layers`` pre-norm blocks -> norm = the *features*; the *unembedding*
turns features into float32 logits (the transposed token embedding, or an ``output`` projection),
the padding ids past ``vocab_used`` masked. A block is::

    x = x + dropout(attention(norm(x)))      # self-attention (causal by default), global or in a window
    x = x + dropout(mlp(norm(x)))            # width -> mlp_hidden -> width, GELU or SwiGLU

(each branch's output normalised too with ``spec.post_norms``; what differs from layer to layer is
the spec's pattern, :meth:`~jaxnet.models.transformer.spec.TransformerSpec.layer`).

The norm is LayerNorm or RMSNorm (``spec.norm``), the MLP GELU or SwiGLU (``spec.mlp``), and
which projections have a bias is ``spec.bias``: GPT-2 is LayerNorm, GELU, biases everywhere;
Llama is RMSNorm, SwiGLU, no biases (:data:`~jaxnet.models.transformer.spec.PRESETS`).

Every linear layer is a :class:`~jaxnet.models.common.Projection`. Parameters, by path (the
names the checkpoints, ``train.init_from``, ``optim.freeze`` and the Hugging Face tables use)::

    embed/embedding                 (vocab, width)
    position                        (context, width)              learned positions only
    block_N/norm_1/{scale,bias}     (width,)                      norm_2 likewise, before the MLP; RMSNorm: scale only
    block_N/norm_1_post/...         (width,)                      norm_2_post likewise; post_norms only
    block_N/attention/query/kernel  (width, heads, head_dim)      bias (heads, head_dim)
    block_N/attention/query_norm/scale  (head_dim,)               key_norm likewise; qk_norm only
    block_N/attention/key/kernel    (width, kv_heads, head_dim)   value likewise
    block_N/attention/out/kernel    (heads, head_dim, width)      bias (width,)
    block_N/mlp_in/kernel           (width, mlp_hidden)           bias (mlp_hidden,)
    block_N/mlp_gate/kernel         (width, mlp_hidden)           SwiGLU only; bias (mlp_hidden,)
    block_N/mlp_out/kernel          (mlp_hidden, width)           bias (width,)
    norm_out/{scale,bias}           (width,)
    output/kernel                   (width, vocab)                untied embeddings only

Weights start from N(0, 0.02), the output projections of each residual branch from
N(0, 0.02 / sqrt(2 * layers)) (GPT-2). Every parameter carries logical axis names (``vocab``,
``embed``, ``heads``, ``kv_heads``, ``kv``, ``mlp``) for the parallelism rules, and activations
are marked where tensor parallelism splits them (Megatron: queries, keys and values by head, the
MLP's hidden units, the logits by vocabulary; the residual stream whole on every tensor device).
Without axis rules the marks do nothing.
"""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp

from jaxnet.models.common import Head, Projection, adapter_dropout, lookup, normal, remat_policy
from jaxnet.models.transformer import context
from jaxnet.models.transformer.attention import SelfAttention, cpu_pieces, in_a_piece, per_piece, segment_mask
from jaxnet.models.transformer.context import LENGTH
from jaxnet.models.transformer.moe import MoE
from jaxnet.models.transformer.norms import norm
from jaxnet.models.transformer.spec import TransformerSpec


def dense_mlp(spec: TransformerSpec, h: jnp.ndarray) -> jnp.ndarray:
    """The dense MLP (a block's ``mlp_pattern`` entry ``dense``), its projections made in the calling
    block's scope (``mlp_in``, ``mlp_gate``, ``mlp_out``): ``mlp_out(gelu(mlp_in(h)))`` or, with
    ``spec.mlp="swiglu"``, ``mlp_out(silu(mlp_gate(h)) * mlp_in(h))`` (Llama's gate, up and down),
    or with ``"geglu"`` the same with ``spec.gelu``'s GELU for the SiLU (Gemma's)."""
    s = spec
    kw = dict(dtype=s.dtype, param_dtype=s.param_dtype, use_bias=s.biased("mlp"), matmul=s.matmul)
    y = Projection((s.mlp_hidden,), ("embed", "mlp"), name="mlp_in", **kw)(h)
    y = nn.with_logical_constraint(y, ("batch", LENGTH, "mlp"))
    if s.mlp in ("swiglu", "geglu"):
        gate = Projection((s.mlp_hidden,), ("embed", "mlp"), name="mlp_gate", **kw)(h)
        gate = nn.with_logical_constraint(gate, ("batch", LENGTH, "mlp"))
        y = (nn.silu(gate) if s.mlp == "swiglu" else nn.gelu(gate, approximate=s.gelu == "tanh")) * y
    else:
        y = nn.gelu(y, approximate=s.gelu == "tanh")
    return Projection((s.width,), ("mlp", "embed"), std=s.out_std, name="mlp_out", **kw)(y)


def moe_mlp(spec: TransformerSpec, index: int, h: jnp.ndarray) -> jnp.ndarray:
    """The mixture of experts of block ``index`` (``mlp_pattern`` entry ``moe``), its parameters
    under ``moe`` (:class:`~jaxnet.models.transformer.moe.MoE`)."""
    return MoE(spec, index, name="moe")(h)


#: The MLP of each kind a layer's ``mlp_pattern`` entry names: ``mlp(spec, index, h) -> y``, called
#: inside block ``index`` (its parameters under the block's name). A new kind is one entry here.
MLPS = {"dense": lambda spec, index, h: dense_mlp(spec, h), "moe": moe_mlp}


#: The most pieces of the batch :meth:`TransformerLanguageModel.features` runs the blocks on (one a
#: core, up to this): each piece is its own copy of the blocks in the compiled program, so the
#: compile grows with them, and the gain was measured on 2 cores only.
MOST_BLOCK_PIECES = 4


class Block(nn.Module):
    """Transformer block ``index``: attention and MLP, each a residual branch with dropout, each
    normalised before (``norm_1``, ``norm_2``) and with ``spec.post_norms`` after too
    (``norm_1_post``, ``norm_2_post``); the attention and MLP kinds are the layer's
    (:meth:`~jaxnet.models.transformer.spec.TransformerSpec.layer`)::

        x = x + dropout(post(attention(norm_1(x))))
        x = x + dropout(post(mlp(norm_2(x))))
    """

    spec: TransformerSpec
    index: int = 0

    @nn.compact
    def __call__(
        self,
        x: jnp.ndarray,
        positions: jnp.ndarray,
        train: bool,
        decode: bool,
        mask: jnp.ndarray | None = None,
        segments: jnp.ndarray | None = None,
    ) -> jnp.ndarray:
        s = self.spec
        drop = nn.Dropout(s.dropout, deterministic=not train)
        y = SelfAttention(s, self.index, name="attention")(norm(s, "norm_1")(x), positions, decode, mask, segments)
        if s.post_norms:
            y = norm(s, "norm_1_post")(y)
        x = x + drop(y)
        y = MLPS[s.layer(self.index).mlp](s, self.index, norm(s, "norm_2")(x))
        if s.post_norms:
            y = norm(s, "norm_2_post")(y)
        return nn.with_logical_constraint(x + drop(y), ("batch", LENGTH, None))


class _DecodePositions(nn.Module):
    """The positions of a decoding call's tokens: the count of tokens decoded so far (in the
    ``cache`` collection), then that many more."""

    @nn.compact
    def __call__(self, length: int) -> jnp.ndarray:
        index = self.variable("cache", "index", lambda: jnp.zeros((), jnp.int32))
        positions = index.value + jnp.arange(length)
        if not self.is_initializing():
            index.value = index.value + length
        return positions


class TransformerLanguageModel(nn.Module):
    """Token ids (batch, time) -> logits (batch, time, ``spec.vocab``), float32: next-token logits
    when ``spec.causal``, per-position logits of a bidirectional encoder otherwise.

    The logits are ``unembed(features(tokens))``: :meth:`features` are the final hidden states
    (batch, time, width), in the compute dtype, and :meth:`unembed` maps any of them to logits, so
    a loss can take the features and unembed them in pieces::

        h = model.apply(variables, tokens, method="features")          # (batch, time, width)
        logits = model.apply(variables, h[:, :16], method="unembed")   # (batch, 16, vocab)

    **Decoding.** ``decode=True`` keeps a key/value cache of ``spec.context`` positions in the
    ``cache`` collection: each call appends its tokens' keys and values and attends to everything
    cached so far, so generating token ``t`` costs one position, not ``t``. Positions past the
    context do not exist; :mod:`jaxnet.sample` slides the window. Only a causal model decodes.
    ``spec.remat`` names what each block keeps for the backward pass (``none``: everything);
    the rest is recomputed there (:func:`~jaxnet.models.common.remat_policy`): less memory for long
    contexts, up to a third more compute (``full``, which keeps only each block's input).

    **Packed rows** (:mod:`jaxnet.data.packing`): ``segments`` (batch, time) numbers the examples
    of each row (0 for padding) and ``positions`` (batch, time) restarts at each: a token attends
    only to its own example's tokens and sits at its position in it (rotary or learned), so each
    example computes what it computes alone.

    **Context parallelism.** Under sharding rules that split the sequence (``mesh.context`` > 1,
    :mod:`~jaxnet.models.transformer.context`), :meth:`features` puts the tokens, their positions
    and segments in :func:`~jaxnet.models.transformer.context.balanced_order` (two chunks per
    device, one from the start of the row and one from its end), runs the blocks on the tokens
    each device holds, attention working across the devices, and returns the hidden states in
    the row's order again, split along it: the same numbers as on one device. Decoding is not
    split (sample with ``mesh.context=1``).
    """

    spec: TransformerSpec

    @property
    def context(self) -> int:
        """The positions the model has (the longest sequence, the decoding cache's size)."""
        return self.spec.context

    def setup(self) -> None:
        s = self.spec
        self.embed = nn.Embed(
            s.vocab, s.width, dtype=s.dtype, param_dtype=s.param_dtype, embedding_init=normal(0.02, ("vocab", "embed"))
        )
        if s.position == "learned":
            self.position = self.param("position", normal(0.02, (None, "embed")), (s.context, s.width), s.param_dtype)
        self.drop = nn.Dropout(s.dropout, name="Dropout_0")
        # train and decode pick the code path: static arguments of the rematerialised call
        policy = remat_policy(s.remat) if s.remat != "none" else None
        block = nn.remat(Block, static_argnums=(3, 4), policy=policy) if s.remat != "none" else Block
        self.blocks = [block(s, i, name=f"block_{i}") for i in range(s.layers)]
        self.norm_out = norm(s, "norm_out")
        if not s.tie_embeddings:
            self.output = Projection(
                (s.vocab,), ("embed", "vocab"), use_bias=False, dtype=s.dtype, param_dtype=s.param_dtype
            )
        self.decode_positions = _DecodePositions()

    def features(
        self,
        tokens: jnp.ndarray,
        train: bool = False,
        decode: bool = False,
        segments: jnp.ndarray | None = None,
        positions: jnp.ndarray | None = None,
    ) -> jnp.ndarray:
        """The final hidden states (batch, time, width) of token ids (batch, time), after the last
        normalisation, in the compute dtype; ``segments`` and ``positions`` of packed rows keep
        their examples apart."""
        s = self.spec
        ways = context.split()[1]
        if ways > 1 and decode:
            raise ValueError("decoding does not split the sequence over mesh.context; decode with mesh.context=1")
        if positions is None:
            positions = self.decode_positions(tokens.shape[1]) if decode else jnp.arange(tokens.shape[1])
        if ways > 1:  # each device's two chunks of every row (context.balanced_order), segments given as they are
            order = context.balanced_order(tokens.shape[1], ways)
            tokens, positions = tokens[:, order], jnp.take(positions, order, axis=-1)
            segments = None if segments is None else segments[:, order]
            mask = None
        else:
            mask, segments = (None if segments is None else segment_mask(segments)), None
        x = lookup(self.embed, tokens, s.dtype, ("batch", LENGTH, None))
        if s.embed_scale:  # Gemma's sqrt(width), rounded to the compute dtype as its own is to its weights'
            x = x * jnp.asarray(s.width**0.5, s.dtype)
        if s.position == "learned":
            table = jnp.take(self.position, positions, axis=0).astype(s.dtype)
            x = x + (table if table.ndim == 3 else table[None])
        x = self.drop(x, deterministic=not train)
        pieces = self._batch_pieces(x.shape[0], train, decode)
        if pieces == 1:
            return context.restore(self.norm_out(self._stack(x, positions, train, decode, mask, segments)))
        batch = x.shape[0]
        cut = zip(
            jnp.split(x, pieces),
            per_piece(positions, pieces, batch, rank=2),
            per_piece(mask, pieces, batch, rank=4),
            strict=True,
        )
        with in_a_piece():  # segments is None here: only a sequence split over devices keeps them
            parts = [self.norm_out(self._stack(part, where, train, decode, seen, None)) for part, where, seen in cut]
        return context.restore(jnp.concatenate(parts))

    def _stack(self, x, positions, train, decode, mask, segments) -> jnp.ndarray:  # noqa: ANN001
        """The blocks, one after the other, on hidden states ``x`` (batch, time, width)."""
        for block in self.blocks:
            x = block(x, positions, train, decode, mask, segments)
        return x

    def _batch_pieces(self, batch: int, train: bool, decode: bool) -> int:
        """How many pieces of the batch :meth:`features` runs the blocks on, each piece all the way
        through, independently: :func:`~jaxnet.models.transformer.attention.cpu_pieces` on a CPU
        under a mesh of one device, where XLA runs independent operations side by side, one a
        thread, and the pieces keep the cores busy where a block's own operations leave them idle
        (``python scripts/profile_attention.py``); else 1. Each row's numbers are the same (a row never
        meets another in a dense block); the parameters' gradients are sums over the pieces, equal
        up to rounding. 1 where rows would not be independent or a piece would draw other random
        numbers than the whole batch: a mixture of experts (its routing and router losses are the
        batch's), dropout in training (``model.dropout`` or a LoRA adapter's), decoding (the cache).
        At most :data:`MOST_BLOCK_PIECES`: each piece is a copy of the blocks in the compiled program."""
        s = self.spec
        if decode or any(s.layer(i).mlp != "dense" for i in range(s.layers)):
            return 1
        if train and (s.dropout > 0 or adapter_dropout() > 0):
            return 1
        return cpu_pieces(batch, most=MOST_BLOCK_PIECES)

    def head(self) -> Head:
        """The output layer as arrays (:class:`~jaxnet.models.common.Head`): the token embedding,
        transposed, or the ``output`` projection's kernel, with the unused ids past ``vocab_used``;
        what a loss that computes the logits in pieces multiplies by."""
        s = self.spec
        if s.tie_embeddings:
            return Head(
                self.embed.embedding, transposed=True, used=s.vocab_used, dtype=s.dtype, softcap=s.logit_softcap
            )
        kernel, bias = self.output.weights((s.width,))
        return Head(kernel, bias, used=s.vocab_used, dtype=s.dtype, softcap=s.logit_softcap)

    def unembed(self, features: jnp.ndarray) -> jnp.ndarray:
        """Logits (..., vocab), float32 (or the compute dtype if wider), of final hidden states
        (..., width): :meth:`head`'s logits (soft-capped with ``spec.logit_softcap``), the unused ids
        masked (:func:`mask_unused_vocab`)."""
        return nn.with_logical_constraint(self.head().logits(features), ("batch", LENGTH, "vocab"))

    def __call__(
        self,
        tokens: jnp.ndarray,
        train: bool = False,
        decode: bool = False,
        segments: jnp.ndarray | None = None,
        positions: jnp.ndarray | None = None,
    ) -> jnp.ndarray:
        return self.unembed(self.features(tokens, train, decode, segments, positions))

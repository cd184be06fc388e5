"""What a Transformer is: its ``model.*`` keys, declared once (:class:`TransformerKeys`), the frozen
:class:`TransformerSpec` every module of the model takes whole, the layer pattern
(:meth:`TransformerSpec.layer`), and the variants as presets (:data:`PRESETS`).

A setting of the model is one field of :class:`TransformerKeys` (its default, its description and
the values it takes, checked in one place: :func:`check`) and one use where it acts. The spec is
made from the same fields, with the vocabulary, the context and the dtypes resolved, so the config
(:class:`~jaxnet.models.transformer.TransformerConfig`, the keys plus what the family owns beside
its module) and a Hugging Face ``config.json`` (:mod:`jaxnet.models.hf`) become a spec the same
way::

    spec = TransformerSpec(vocab=84, context=128, layers=4, width=128, heads=4, **PRESETS["char_gpt"])
    model = TransformerLanguageModel(spec)

**Layers.** Every block is pre-norm attention then an MLP, each a residual branch; what may differ
from layer to layer is one pattern (:meth:`TransformerSpec.layer`): attention over every earlier
position (``global``) or over the last ``window`` (``local``, with its own rotary base), norms
after each branch too (``post_norms``), the queries and keys normalised (``qk_norm``), and the
MLP's kind (``dense``, or ``moe``: a mixture of ``experts``, :mod:`~jaxnet.models.transformer.moe`).
``attention_pattern`` and ``mlp_pattern`` repeat over the layers (a pattern as long as ``layers``
names each one): ``("local", "global")`` alternates.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import jax.numpy as jnp

from jaxnet.errors import UserError
from jaxnet.models.base import ModelConfig, field
from jaxnet.models.common import MATMULS, REMAT, REMAT_ALIASES

_LLAMA: dict[str, Any] = {
    "position": "rotary",
    "tie_embeddings": False,
    "causal": True,
    "norm": "rms",
    "mlp": "swiglu",
    "bias": "none",
    "norm_eps": 1e-5,
    "rope_theta": 10000.0,
}

# Gemma's decoder: Llama's with a GeGLU MLP (tanh GELU), RMSNorm scales of 1 + w, the embeddings
# scaled by sqrt(width) and tied to the output.
_GEMMA: dict[str, Any] = {
    **_LLAMA,
    "mlp": "geglu",
    "gelu": "tanh",
    "norm_offset": 1.0,
    "embed_scale": True,
    "tie_embeddings": True,
    "norm_eps": 1e-6,
}

#: Variants of the Transformer: the keys that make each what it is, sizes left to the caller.
#: ``char_gpt`` is jaxnet's own GPT (learned positions, tied embeddings, tanh GELU, LayerNorm
#: epsilon 1e-6); ``gpt2`` is OpenAI's (epsilon 1e-5), as its Hugging Face checkpoints hold it;
#: ``bert_encoder`` attends both ways, with rotary positions. ``llama`` is the decoder of Llama,
#: Mistral, SmolLM and TinyLlama: rotary positions, RMSNorm, a SwiGLU MLP, no biases, untied
#: output; ``qwen2`` is the same with biases on the queries, keys and values; ``mistral`` is
#: ``llama`` (a checkpoint's sliding window is its own ``window``); ``qwen3`` is ``llama`` with
#: RMSNorm on each head's queries and keys; ``phi3`` is ``llama`` (its files fuse the queries, keys
#: and values, and the MLP's gate and up projections). ``gemma`` is Gemma's: a GeGLU MLP, RMSNorm
#: scales of ``1 + w``, embeddings scaled by sqrt(width) and tied; ``gemma2`` adds norms after each
#: branch, soft-capped attention and output logits, and local layers (a window of 4,096)
#: alternating with global ones; ``gemma3`` has norms after each branch and on the queries and
#: keys, five local layers to one global, each kind with its own rotary base, and no soft-capping.
#: The sizes (``kv_heads``, ``mlp_hidden``, ``rope_theta``, rope scaling, ``window``) are each
#: checkpoint's own.
PRESETS: dict[str, dict[str, Any]] = {
    "char_gpt": {"position": "learned", "tie_embeddings": True, "causal": True, "gelu": "tanh", "norm_eps": 1e-6},
    "gpt2": {"position": "learned", "tie_embeddings": True, "causal": True, "gelu": "tanh", "norm_eps": 1e-5},
    "bert_encoder": {"position": "rotary", "causal": False},
    "llama": _LLAMA,
    "qwen2": {**_LLAMA, "bias": "qkv", "norm_eps": 1e-6},
    "mistral": _LLAMA,
    "qwen3": {**_LLAMA, "qk_norm": True, "norm_eps": 1e-6, "rope_theta": 1000000.0},
    "phi3": _LLAMA,
    "gemma": _GEMMA,
    "gemma2": {
        **_GEMMA,
        "post_norms": True,
        "attention_softcap": 50.0,
        "logit_softcap": 30.0,
        "attention_pattern": ("local", "global"),
        "window": 4096,
    },
    "gemma3": {
        **_GEMMA,
        "post_norms": True,
        "qk_norm": True,
        "attention_pattern": ("local",) * 5 + ("global",),
        "window": 1024,
        "rope_theta": 1000000.0,
        "rope_local_theta": 10000.0,
    },
}

#: What ``bias`` puts a bias on: every projection, or only the queries, keys and values (Qwen2), or none (Llama).
BIAS_GROUPS = {"all": ("qkv", "out", "mlp"), "qkv": ("qkv",), "none": ()}

#: The kinds of attention a layer may have, and the kinds of MLP (``attention_pattern``, ``mlp_pattern``).
ATTENTION_KINDS = ("global", "local")
MLP_KINDS = ("dense", "moe")


@dataclass
class TransformerKeys(ModelConfig):
    """The ``model.*`` keys of the Transformer, each declared here and nowhere else: the config
    (:class:`~jaxnet.models.transformer.TransformerConfig`) is these keys, the spec
    (:class:`TransformerSpec`) is made of the same fields."""

    layers: int = field(2, "number of Transformer blocks", low=1)
    width: int = field(200, "model width (embedding size)", low=1)
    heads: int = field(4, "attention heads (must divide model.width unless model.head_dim is set)", low=1)
    kv_heads: int = field(
        0,
        "key/value heads (0 = model.heads); fewer is grouped-query attention, each serving model.heads / "
        "model.kv_heads query heads (must divide model.heads)",
        low=0,
    )
    head_dim: int = field(0, "size of each attention head (0 = model.width / model.heads)", low=0)
    mlp_ratio: int = field(4, "MLP hidden size as a multiple of model.width (unless model.mlp_hidden is set)", low=1)
    mlp_hidden: int = field(0, "MLP hidden units (0 = model.mlp_ratio x model.width; Llama 3 8B: 14336)", low=0)
    mlp: str = field(
        "gelu",
        "the MLP: gelu = out(gelu(in(x))); swiglu = out(silu(gate(x)) * in(x)), Llama's; geglu = "
        "out(gelu(gate(x)) * in(x)), Gemma's (model.gelu says which GELU)",
        choices=("gelu", "swiglu", "geglu"),
    )
    norm: str = field(
        "layer",
        "the normalisation: layer = LayerNorm (scale and bias); rms = RMSNorm (scale only)",
        choices=("layer", "rms"),
    )
    bias: str = field(
        "all",
        "which projections have a bias: all (GPT-2), qkv = only queries, keys and values (Qwen2), none (Llama)",
        choices=tuple(BIAS_GROUPS),
    )
    dropout: float = field(0.0, "dropout rate (embeddings, attention and MLP outputs)", low=0.0, high=0.95)
    position: str = field("learned", "position encoding", choices=("learned", "rotary"))
    tie_embeddings: bool = field(False, "output layer shares the embedding matrix")
    causal: bool = field(True, "False = bidirectional encoder (BERT-style), every position attends to every other")
    attention: str = field(
        "auto",
        "attention kernel; auto = cuDNN's fused kernel on an NVIDIA GPU in bfloat16, XLA's with the heads "
        "moved first (xla_head_major) on a CPU, XLA's (jax.nn.dot_product_attention) otherwise",
        choices=("auto", "xla", "xla_head_major", "cudnn"),
    )
    remat: str = field(
        "none",
        "what each block keeps for the backward pass, the rest recomputed there (less memory, more compute): "
        "none = everything; full = its input only; dots = every matrix product's output; dots_no_batch = the "
        "projections' outputs (attention's products recomputed); minimal = the attention's output; offload = what "
        "dots_no_batch keeps, in host memory",
        choices=REMAT,
        aliases=REMAT_ALIASES,
    )
    matmul: str = field(
        "default",
        "how the projections of attention and the MLP multiply: default = in model.dtype; fp8 = float8 (e4m3 "
        "forward, e5m2 gradients, current scaling; an H100/H200 runs float8 GEMMs, a CPU simulates them), the "
        "parameters, optimizer, output layer and attention's own products unchanged",
        choices=MATMULS,
    )
    context_attention: str = field(
        "auto",
        "with mesh.context > 1, how attention reaches the keys and values of the other devices: ring = passed "
        "device to device (ppermute), a piece at a time; gather = all of them gathered on every device "
        "(all_gather); auto = gather when a device holds at most 2048 tokens of a row, ring above",
        choices=("auto", "ring", "gather"),
    )
    gelu: str = field(
        "tanh",
        "the MLP's GELU: tanh = the tanh approximation (GPT-2's gelu_new), exact = x * Phi(x) with erf",
        choices=("tanh", "exact"),
    )
    norm_eps: float = field(1e-6, "LayerNorm or RMSNorm epsilon (GPT-2's and Llama 3's are 1e-5)", low=0.0)
    post_norms: bool = field(
        False, "also normalise each branch's output before it is added back (norms before and after: Gemma 2 and 3)"
    )
    qk_norm: bool = field(False, "RMSNorm on each head's queries and keys before the rotary positions (Qwen3, Gemma 3)")
    norm_offset: float = field(
        0.0,
        "RMSNorm scales are kept as w and multiply by model.norm_offset + w, starting at 1 (Gemma's 1 + w: 1.0)",
    )
    embed_scale: bool = field(False, "the token embeddings are multiplied by sqrt(model.width) (Gemma)")
    attention_scale_dim: int = field(
        0,
        "the attention logits are Q K^T / sqrt(model.attention_scale_dim) (0 = the head size; Gemma 2 and 3's "
        "query_pre_attn_scalar)",
        low=0,
    )
    attention_softcap: float = field(
        0.0,
        "the attention logits capped as c * tanh(logits / c), c = model.attention_softcap (0 = none; Gemma 2: 50)",
        low=0.0,
    )
    logit_softcap: float = field(
        0.0,
        "the output logits capped as c * tanh(logits / c), c = model.logit_softcap (0 = none; Gemma 2: 30)",
        low=0.0,
    )
    rope_theta: float = field(10000.0, "rotary positions: the base of their frequencies (Llama 3: 500000)", low=1.0)
    rope_scaling: str = field(
        "none",
        "rotary positions: llama3 = rescale the frequencies as Llama 3.1 does (model.rope_factor, "
        "model.rope_low_freq_factor, model.rope_high_freq_factor, model.rope_original_context); linear = every "
        "frequency divided by model.rope_factor (Gemma 3)",
        choices=("none", "llama3", "linear"),
    )
    rope_factor: float = field(
        8.0, "model.rope_scaling=llama3: the low frequencies are divided by it; linear: every frequency", low=1.0
    )
    rope_low_freq_factor: float = field(1.0, "model.rope_scaling=llama3: low-frequency factor", low=0.0)
    rope_high_freq_factor: float = field(4.0, "model.rope_scaling=llama3: high-frequency factor", low=0.0)
    rope_original_context: int = field(
        8192, "model.rope_scaling=llama3: the context the model was first trained at", low=1
    )
    attention_pattern: tuple[str, ...] = field(
        ("global",),
        "each layer's attention, the pattern repeated over the layers: global = every earlier position, local = "
        "the last model.window (e.g. local,global alternates; as many entries as model.layers name each layer)",
        choices=ATTENTION_KINDS,
    )
    window: int = field(0, "positions a local layer attends to, itself included (model.attention_pattern)", low=0)
    rope_local_theta: float = field(
        0.0, "the rotary base of local layers, without rope scaling (0 = model.rope_theta, scaled as the rest)", low=0.0
    )
    mlp_pattern: tuple[str, ...] = field(
        ("dense",),
        "each layer's MLP, the pattern repeated over the layers (as model.attention_pattern)",
        choices=MLP_KINDS,
    )
    experts: int = field(0, "experts of a mixture-of-experts layer (model.mlp_pattern entry moe)", low=0)
    experts_per_token: int = field(2, "experts each token is routed to (top-k of the router's probabilities)", low=1)
    expert_hidden: int = field(0, "hidden units of each expert's SwiGLU MLP (0 = model.mlp_hidden)", low=0)
    shared_experts: int = field(
        0,
        "experts every token goes through beside its routed ones, as one SwiGLU MLP of that many experts' units",
        low=0,
    )
    router_renorm: bool = field(
        True, "the top-k experts' probabilities rescaled to sum to 1 (Mixtral; Qwen3-MoE's norm_topk_prob)"
    )
    router_aux_loss: float = field(
        0.01,
        "coefficient of the load-balancing loss (Switch/Mixtral form, the mean over the mixture layers) added to "
        "the objective (a checkpoint's router_aux_loss_coef; train.router_aux_loss overrides it)",
        low=0.0,
    )
    router_z_loss: float = field(0.0, "coefficient of the router's z-loss, mean(logsumexp(logits)^2)", low=0.0)
    capacity_factor: float = field(
        0.0,
        "0 = dropless (every token reaches its experts); else each expert takes at most capacity_factor x its "
        "even share of a device's tokens and the rest are dropped (counted as moe/dropped)",
        low=0.0,
    )
    expert_matmul: str = field(
        "auto",
        "the experts' grouped matmul: ragged = jax.lax.ragged_dot, blocks = rows padded to blocks of one expert "
        "each (faster on a CPU); auto = blocks on a CPU, ragged elsewhere",
        choices=("auto", "ragged", "blocks"),
    )
    context: int = field(
        0, "rows of the learned position table and positions a decoding cache holds (0 = data.seq_len)", low=0
    )
    vocab_used: int = field(
        0,
        "ids the model predicts: logits of ids at or above it (a vocabulary padded to a round size) are masked "
        "and never predicted (0 = every id)",
        low=0,
    )

    def validate(self) -> None:
        check(self)


class SpecError(UserError, ValueError):
    """A Transformer spec whose keys contradict each other (a :class:`UserError` on the command
    line, a ``ValueError`` for a spec made in Python)."""


def check(keys: Any) -> None:
    """The checks across keys of a Transformer (its config or its spec): a :class:`SpecError`
    naming the first problem and what to do."""
    head_size = keys.head_dim or (keys.width // keys.heads if keys.width % keys.heads == 0 else 0)
    if not head_size:
        raise SpecError(
            f"model.width={keys.width} is not divisible by model.heads={keys.heads}; change one, or set model.head_dim"
        )
    if keys.kv_heads and (keys.kv_heads > keys.heads or keys.heads % keys.kv_heads):
        raise SpecError(
            f"model.kv_heads={keys.kv_heads} does not divide model.heads={keys.heads}; give a divisor of it "
            "(0 = model.heads)"
        )
    if keys.position == "rotary" and head_size % 2:
        raise SpecError(f"rotary positions need an even head size; the head size is {head_size}")
    if keys.rope_scaling == "llama3" and keys.rope_high_freq_factor <= keys.rope_low_freq_factor:
        raise SpecError(
            f"model.rope_high_freq_factor={keys.rope_high_freq_factor} must be above "
            f"model.rope_low_freq_factor={keys.rope_low_freq_factor}"
        )
    for name, kinds in (("attention_pattern", ATTENTION_KINDS), ("mlp_pattern", MLP_KINDS)):
        pattern = getattr(keys, name)
        if not pattern or any(k not in kinds for k in pattern):
            raise SpecError(f"model.{name}={','.join(pattern) or '(empty)'}: each entry is one of {', '.join(kinds)}")
        if len(pattern) > keys.layers:
            raise SpecError(f"model.{name} names {len(pattern)} layers, more than model.layers={keys.layers}")
    if "moe" in keys.mlp_pattern:
        if keys.experts < 2:
            raise SpecError(
                f"model.mlp_pattern has moe layers but model.experts={keys.experts}; give 2 or more experts"
            )
        if keys.experts_per_token > keys.experts:
            raise SpecError(
                f"model.experts_per_token={keys.experts_per_token} is more than model.experts={keys.experts}; route "
                "each token to at most every expert"
            )
    if "local" in keys.attention_pattern and not keys.causal:
        raise SpecError(
            "model.attention_pattern has local layers, which attend to earlier positions; set model.causal=true"
        )
    if keys.norm_offset and keys.norm != "rms":
        raise SpecError(f"model.norm_offset={keys.norm_offset} is an offset of RMSNorm scales; set model.norm=rms")
    if "local" in keys.attention_pattern and not keys.window:
        raise SpecError("model.attention_pattern has local layers but model.window=0; set the window they attend over")


@dataclass(frozen=True)
class Layer:
    """What one block of a :class:`TransformerSpec` is (:meth:`TransformerSpec.layer`): its
    attention's kind and ``window`` (0: every earlier position), the rotary base and Llama 3
    scaling of its positions, its MLP's kind, and the linear rope scaling of its positions (the
    frequencies divided by ``rope_linear``; 1: none)."""

    attention: str
    window: int
    rope_theta: float
    rope_llama3: tuple[float, float, float, int] | None
    mlp: str
    rope_linear: float = 1.0


class _Spec:
    """The methods of :class:`TransformerSpec` (its fields are :class:`TransformerKeys`')."""

    def __post_init__(self) -> None:
        check(self)
        resolved = {
            "kv_heads": self.kv_heads or self.heads,
            "mlp_hidden": self.mlp_hidden or self.mlp_ratio * self.width,
            "expert_hidden": self.expert_hidden or self.mlp_hidden or self.mlp_ratio * self.width,
            "head_dim": self.head_dim or self.width // self.heads,
            "attention": "xla" if self.attention == "auto" else self.attention,
            "attention_pattern": tuple(self.attention_pattern),
            "mlp_pattern": tuple(self.mlp_pattern),
        }
        for name, value in resolved.items():
            object.__setattr__(self, name, value)

    def biased(self, group: str) -> bool:
        """Whether the projections of ``group`` (``qkv``, ``out``, ``mlp``) have a bias (:data:`BIAS_GROUPS`)."""
        return group in BIAS_GROUPS[self.bias]

    @property
    def rope_llama3(self) -> tuple[float, float, float, int] | None:
        """Llama 3.1's rescaling of the rotary frequencies (factor, low and high frequency factors,
        original context), or None."""
        if self.rope_scaling != "llama3":
            return None
        return (self.rope_factor, self.rope_low_freq_factor, self.rope_high_freq_factor, self.rope_original_context)

    def layer(self, index: int) -> Layer:
        """What block ``index`` is: each pattern repeated over the layers (:class:`Layer`).

        >>> spec = TransformerSpec(vocab=8, context=16, layers=4, attention_pattern=("local", "global"), window=4)
        >>> [spec.layer(i).attention for i in range(4)]
        ['local', 'global', 'local', 'global']
        """
        attention = self.attention_pattern[index % len(self.attention_pattern)]
        local = attention == "local"
        theta, llama3 = self.rope_theta, self.rope_llama3
        linear = self.rope_factor if self.rope_scaling == "linear" else 1.0
        if local and self.rope_local_theta:
            theta, llama3, linear = self.rope_local_theta, None, 1.0
        return Layer(
            attention=attention,
            window=self.window if local else 0,
            rope_theta=theta,
            rope_llama3=llama3,
            mlp=self.mlp_pattern[index % len(self.mlp_pattern)],
            rope_linear=linear,
        )

    @property
    def groups(self) -> int:
        """Query heads per key/value head (1: multi-head attention)."""
        return self.heads // self.kv_heads

    @property
    def out_std(self) -> float:
        """Initial scale of each residual branch's output projection (GPT-2: 0.02 / sqrt(2 layers))."""
        return 0.02 / math.sqrt(2 * self.layers)


#: The keys that are the config's alone: the spec has its own ``context`` (positions, resolved),
#: and the dtypes as JAX dtypes.
_CONFIG_ONLY = ("name", "context", "dtype", "param_dtype")


def _spec_fields() -> list[tuple[str, Any, Any]]:
    out = []
    for f in dataclasses.fields(TransformerKeys):
        if f.name in _CONFIG_ONLY:
            continue
        default = f.default if f.default_factory is dataclasses.MISSING else f.default_factory()
        out.append((f.name, f.type, dataclasses.field(default=default, metadata=f.metadata)))
    return out


TransformerSpec = dataclasses.make_dataclass(
    "TransformerSpec",
    [
        ("vocab", "int"),
        ("context", "int"),
        *_spec_fields(),
        ("dtype", "Any", dataclasses.field(default=jnp.float32)),
        ("param_dtype", "Any", dataclasses.field(default=jnp.float32)),
    ],
    bases=(_Spec,),
    frozen=True,
    namespace={"__module__": __name__},
)
TransformerSpec.__doc__ = """The whole of a Transformer language model (a causal decoder, or a bidirectional encoder):
``vocab`` rows of the token embedding (the data's vocabulary, maybe padded to a round size), of
which the first ``vocab_used`` are ever predicted (0 = all); ``context`` positions (the learned
position table and the decoding cache); then every key of :class:`TransformerKeys` (their
meanings are the ``model.*`` keys'), ``kv_heads``, ``mlp_hidden`` and ``head_dim`` resolved from
their zeros, ``attention`` a kernel (``auto``: XLA's); ``dtype`` the compute dtype and
``param_dtype`` the parameters', as JAX dtypes. Frozen and hashable (a static argument of ``jit``)::

    TransformerSpec(vocab=50257, context=1024, layers=12, width=768, heads=12, **PRESETS["gpt2"])
"""


def shortest_pattern(kinds: Any) -> tuple[str, ...]:
    """The shortest pattern that, repeated, gives each layer's kind in ``kinds`` (a pattern as
    :meth:`TransformerSpec.layer` repeats it)::

        shortest_pattern(["local", "global", "local", "global", "local"])   # ('local', 'global')
    """
    kinds = tuple(kinds)
    for size in range(1, len(kinds)):
        if all(kinds[i] == kinds[i % size] for i in range(len(kinds))):
            return kinds[:size]
    return kinds


def spec_keys() -> tuple[str, ...]:
    """The names of the keys a :class:`TransformerSpec` has beside ``vocab``, ``context`` and the dtypes."""
    return tuple(name for name, _, _ in _spec_fields())


def preset(name: str, **fields: Any) -> TransformerSpec:
    """The spec of variant ``name`` of :data:`PRESETS` with ``fields`` (sizes, vocabulary, context)::

    preset("gpt2", vocab=50257, context=1024, layers=12, width=768, heads=12)
    """
    return TransformerSpec(**{**PRESETS[name], **fields})

"""Llama 3 8B's shape (Meta 2024), for planning: does it train on 8 H100s with FSDP, at what batch, how fast.

Command:  jaxnet plan llama3_8b mesh.fsdp=8 --target h100 --gpus 8 --max-batch      (compiled here, on a CPU)
          jaxnet plan llama3_8b mesh.fsdp=8 model.remat=true --target h100 --gpus 8 --max-batch
          jaxnet train llama3_8b mesh.fsdp=-1 train.init_from=hf:DIR data.path=CORPUS  (on 8 GPUs)
          jaxnet train llama3_8b:smoke                                                   (a tiny relative, on a CPU)
Result:   not trained here (no GPU); the plans of 8 H100s with fsdp=8, with and without model.remat, are
          benchmarks/results/plan-llama3_8b-h100x8*-*.json and the table of docs/plan.md
Time:     smoke: under a minute on a 2-core CPU; each plan of 8 H100s compiles in minutes on 2 cores

32 blocks 4,096 wide, 32 query heads sharing 8 key/value heads (grouped-query attention), head size
128, a SwiGLU MLP of 14,336 units, RMSNorm (epsilon 1e-5), rotary positions of base 500,000, an
untied output head, a vocabulary of 128,256 and a context of 8,192: 8.03 B parameters
(``TransformerConfig.preset("llama")``). Llama 3.1 8B is the same with ``model.rope_scaling=llama3``
(factor 8, low/high frequency factors 1 and 4, original context 8,192) and a context of 131,072;
started from a checkpoint (``train.init_from=hf:DIR``) every ``model.*`` value comes from its
config.json. bfloat16 compute on a GPU (``model.dtype=auto``; float32 parameters and AdamW state),
cuDNN's fused attention; AdamW (0.9, 0.95) at 3e-4 after 2,000 warmup steps, cosine decay to 3e-5,
weight decay 0.1, clipping at 1.0; a global batch of 8 sequences of 8,192 tokens (65,536 tokens a
step; one per GPU on 8).

The default data is only a placeholder of the right shapes for planning: the shipped Shakespeare as
bytes (``corpora/shakespeare-byte``, prepared on first use; its 257 ids fit every vocabulary). A real
run names a corpus prepared with the checkpoint's own tokenizer (``jaxnet prepare FILES --tokenizer
hf:DIR --out CORPUS``, then ``data.path=CORPUS``).

Variants: ``smoke`` trains a 2 x 64 model of the same shape (grouped-query, SwiGLU, RMSNorm, rotary)
with context 64 on the bytes for 10 steps.
"""

import dataclasses
from pathlib import Path

from jaxnet.config import Config
from jaxnet.data import TokenDataset
from jaxnet.data.tokens import load as load_corpus
from jaxnet.data.tokens import load_or_prepare
from jaxnet.models import TransformerConfig

VARIANTS = ("default", "smoke")
VOCAB = 128256
CORPUS = "corpora/shakespeare-byte"
PAIRS = "corpora/shakespeare-pairs-byte"


def get_config(variant: str = "default") -> Config:
    """The config of ``variant`` (one of VARIANTS)."""
    cfg = Config()
    cfg.data.name = "tokens"
    cfg.data.path = CORPUS
    cfg.data.vocab_size = VOCAB
    cfg.data.seq_len = 8192
    cfg.model = TransformerConfig.preset(
        "llama",
        layers=32,
        width=4096,
        heads=32,
        kv_heads=8,
        mlp_hidden=14336,
        rope_theta=500000.0,
        norm_eps=1e-5,
        tie_embeddings=False,
        dropout=0.0,
    )
    cfg.optim.name = "adamw"
    cfg.optim.lr = 3e-4
    cfg.optim.b2 = 0.95
    cfg.optim.weight_decay = 0.1
    cfg.optim.warmup_steps = 2000
    cfg.optim.end_lr_factor = 0.1
    cfg.optim.clip_norm = 1.0
    cfg.train.batch_size = 8
    cfg.train.eval_batch_size = 8
    cfg.train.steps = 20000
    cfg.train.log_every = 50
    cfg.train.eval_every = 1000
    cfg.train.checkpoint_every = 1000
    if variant == "smoke":
        cfg.data.vocab_size = 0  # the bytes' 257 ids
        cfg.data.seq_len = 64
        cfg.model.layers, cfg.model.width, cfg.model.heads, cfg.model.kv_heads = 2, 64, 4, 2
        cfg.model.mlp_hidden = 176
        cfg.optim.lr = 1e-3
        cfg.optim.warmup_steps = 2
        cfg.train.batch_size = 8
        cfg.train.eval_batch_size = 8
        cfg.train.eval_tokens = 2048
        cfg.train.steps = 10
        cfg.train.log_every = 5
        cfg.train.eval_every = 10
        cfg.train.checkpoint_every = 10
    return cfg


def data(cfg: Config) -> TokenDataset:
    """The corpus at data.path; the default one (the shipped Shakespeare as bytes, a placeholder of
    the right shapes) is prepared on first use; with ``train.objective`` (DPO, SimPO) the default is
    a placeholder of preference pairs (:func:`placeholder_pairs`)."""
    if cfg.train.objective and cfg.data.path == CORPUS:
        return load_corpus(dataclasses.replace(cfg.data, path=placeholder_pairs()))
    return load_or_prepare(cfg.data, "shakespeare", "byte", default=CORPUS)


def placeholder_pairs(out: str = PAIRS, count: int = 2000) -> str:
    """``out``, a preference corpus of the shipped Shakespeare in bytes (prepared on first use):
    ``count`` plain-text pairs of consecutive paragraphs, one the prompt, the next the chosen reply
    and the one after it the rejected. Only its shapes matter: it is the placeholder a plan of DPO
    or SimPO reads (every pair is padded to data.seq_len)."""
    import json

    from jaxnet.data import text
    from jaxnet.data.preference import prepare_preference

    if not (Path(out) / "corpus.json").is_file():
        paragraphs = [p.strip() for p in text.shakespeare_works()[0][1].split("\n\n") if p.strip()]
        rows = [
            {"prompt": paragraphs[k] + "\n", "chosen": paragraphs[k + 1], "rejected": paragraphs[k + 2]}
            for k in range(0, min(3 * count, len(paragraphs) - 2), 3)
            if paragraphs[k + 1] != paragraphs[k + 2]
        ]
        rows_file = Path(out + "-rows.jsonl")
        rows_file.parent.mkdir(parents=True, exist_ok=True)
        rows_file.write_text("".join(json.dumps(r) + "\n" for r in rows))
        prepare_preference([str(rows_file)], "byte", out, progress=False)
    return out

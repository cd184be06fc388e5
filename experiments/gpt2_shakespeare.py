"""A small GPT on Shakespeare in GPT-2's tokens: prepare, train, sample, on a CPU.

Command:  jaxnet prepare shakespeare --tokenizer gpt2 --out corpora/shakespeare-gpt2
          jaxnet train gpt2_shakespeare data.path=corpora/shakespeare-gpt2
          jaxnet sample --workdir runs/gpt2_shakespeare --prompt "ROMEO:" --tokens 100
Result:   val 5.397 nats per GPT-2 token (perplexity 221), test 5.151 (perplexity 173)
Time:     15 min on a shared 2-core CPU (878 s, load 1-7; python scripts/record_result.py gpt2_shakespeare)

Four pre-LayerNorm blocks, 128 wide, 4 heads, context 128, tied embeddings, GPT-2's vocabulary
padded to 50,304 (6.6 M parameters, 6.4 M of them the embedding): the road from text to GPT-2
tokens to samples, sized for a CPU. The corpus is the 42 works of the shipped Shakespeare, one
document each, tokenized by ``jaxnet prepare`` (1.48 M training tokens; one work each held out
for validation and test by a fixed seed), read through memory maps (``data.name=tokens``).
AdamW at 1e-3, 50 warmup steps, cosine decay; batch 16 windows of 128 tokens, 600 steps. Loss
in nats per GPT-2 token, with perplexity beside it. Without ``data.path`` the corpus is prepared
into corpora/shakespeare-gpt2 on first use.

Variants: ``smoke`` trains a 1 x 32 model for 10 steps, for tests.
"""

from jaxnet.config import Config
from jaxnet.data import TokenDataset
from jaxnet.data.tokens import load_or_prepare
from jaxnet.models import TransformerConfig

VARIANTS = ("default", "smoke")


def get_config(variant: str = "default") -> Config:
    """The config of ``variant`` (one of VARIANTS)."""
    cfg = Config()
    cfg.data.name = "tokens"
    cfg.data.path = "corpora/shakespeare-gpt2"
    cfg.data.vocab_size = 50304
    cfg.data.seq_len = 128
    cfg.model = TransformerConfig(layers=4, width=128, heads=4, mlp_ratio=4, dropout=0.0, tie_embeddings=True)
    cfg.optim.name = "adamw"
    cfg.optim.lr = 1e-3
    cfg.optim.b2 = 0.95
    cfg.optim.weight_decay = 0.1
    cfg.optim.warmup_steps = 50
    cfg.optim.end_lr_factor = 0.1
    cfg.optim.clip_norm = 1.0
    cfg.train.batch_size = 16
    cfg.train.eval_batch_size = 64
    cfg.train.eval_tokens = 1 << 20
    cfg.train.steps = 600
    cfg.train.log_every = 50
    cfg.train.eval_every = 200
    cfg.train.checkpoint_every = 200
    if variant == "smoke":
        cfg.data.seq_len = 32
        cfg.model.layers, cfg.model.width, cfg.model.heads = 1, 32, 2
        cfg.train.batch_size = 4
        cfg.train.eval_batch_size = 4
        cfg.train.eval_tokens = 512
        cfg.optim.warmup_steps = 2
        cfg.train.steps = 10
        cfg.train.log_every = 5
        cfg.train.eval_every = 5
        cfg.train.checkpoint_every = 5
    return cfg


def data(cfg: Config) -> TokenDataset:
    """The corpus at data.path; the default one (the shipped Shakespeare in GPT-2 tokens) is prepared on first use."""
    return load_or_prepare(cfg.data, "shakespeare", "gpt2")

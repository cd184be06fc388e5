"""GPT-2 small's shape (Radford et al. 2019): the multi-GPU config, planned for H100s on a CPU.

Command:  jaxnet plan gpt2_small --target h100 --gpus 8 mesh.fsdp=8      (compile for 8 H100s here)
          jaxnet train gpt2_small mesh.fsdp=-1                            (on a machine with GPUs)
          jaxnet train gpt2_small:smoke                                   (a tiny relative, on a CPU)
Result:   not trained here (no GPU); the plan of 8 H100s with fsdp=8 fits, see
          benchmarks/results/plan-gpt2_small-h100x8-*.json and the README's plan table
Time:     smoke: under a minute on a 2-core CPU; the plan of 8 H100s compiles in about a minute

12 pre-LayerNorm blocks 768 wide, 12 heads, context 1,024, learned positions, tied embeddings, a
vocabulary of 50,304 (GPT-2's 50,257 rounded up to a multiple of 64, as nanoGPT does): 124 M
parameters. bfloat16 compute on a GPU (``model.dtype=auto``; float32 parameters and optimizer
state) with cuDNN's fused attention. AdamW (0.9, 0.95), peak learning rate 6e-4 after 200 warmup
steps, cosine decay to 6e-5, weight decay 0.1, clipping at 1.0; a global batch of 64 sequences
(8 per GPU on 8 GPUs, 65,536 tokens a step).

The data is a corpus of GPT-2 tokens prepared by ``jaxnet prepare`` (``data.name=tokens``,
``data.path=DIR``), GPT-2's 50,257 tokens padded with unused ids to 50,304 (``data.vocab_size``).
By default it is the shipped Shakespeare, prepared into ``corpora/shakespeare-gpt2`` on first use
(1.5 M training tokens: enough to plan and to smoke-test, far too little to train GPT-2 small);
point ``data.path`` at a real corpus (``jaxnet prepare FILES --out DIR``, nanoGPT's ``train.bin``
with ``data.format=nanogpt``, or llm.c's FineWeb shards) to train it for real.

Variants: ``smoke`` trains a 2 x 64 model with context 64 (GPT-2's padded vocabulary) for 30 steps.
"""

from jaxnet.config import Config
from jaxnet.data import TokenDataset
from jaxnet.data.tokens import load_or_prepare
from jaxnet.models import TransformerConfig

VARIANTS = ("default", "smoke")
VOCAB = 50304
CORPUS = "corpora/shakespeare-gpt2"


def get_config(variant: str = "default") -> Config:
    """The config of ``variant`` (one of VARIANTS)."""
    cfg = Config()
    cfg.data.name = "tokens"
    cfg.data.path = CORPUS
    cfg.data.vocab_size = VOCAB
    cfg.data.seq_len = 1024
    cfg.model = TransformerConfig(layers=12, width=768, heads=12, mlp_ratio=4, dropout=0.0, tie_embeddings=True)
    cfg.optim.name = "adamw"
    cfg.optim.lr = 6e-4
    cfg.optim.b2 = 0.95
    cfg.optim.weight_decay = 0.1
    cfg.optim.warmup_steps = 200
    cfg.optim.end_lr_factor = 0.1
    cfg.optim.clip_norm = 1.0
    cfg.train.batch_size = 64
    cfg.train.eval_batch_size = 64
    cfg.train.steps = 5000
    cfg.train.log_every = 50
    cfg.train.eval_every = 500
    cfg.train.checkpoint_every = 500
    if variant == "smoke":
        cfg.data.seq_len = 64
        cfg.model.layers = 2
        cfg.model.width = 64
        cfg.model.heads = 4
        cfg.optim.lr = 1e-3
        cfg.optim.warmup_steps = 5
        cfg.train.batch_size = 8
        cfg.train.eval_batch_size = 8
        cfg.train.steps = 30
        cfg.train.log_every = 10
        cfg.train.eval_every = 15
        cfg.train.checkpoint_every = 15
    return cfg


def data(cfg: Config) -> TokenDataset:
    """The corpus at data.path; the default one (the shipped Shakespeare in GPT-2 tokens) is prepared on first use."""
    return load_or_prepare(cfg.data, "shakespeare", "gpt2")

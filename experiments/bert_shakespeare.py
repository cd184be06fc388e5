"""A BERT-style bidirectional Transformer encoder, trained by masked language modelling on
Shakespeare's complete works (characters).

Command:  jaxnet train bert_shakespeare
Result:   see benchmarks/results/train-bert_shakespeare-cpu-2026-11-22.json (masked-character
          accuracy and loss on validation and test)
Time:     about 12 minutes on a 2-core CPU, start to finish

The same blocks as transformer_shakespeare with ``model.causal=false``: every position attends to
every other. ``task=masked_lm`` (BERT, Devlin et al. 2019): 15 % of the characters of each
128-character window are chosen; 80 % of those become a mask token, 10 % a random character and
10 % stay, and the model predicts the original characters at the chosen positions only. The
corruption is drawn from the run's seed and the step, so a resumed run sees the same batches;
validation and test use one fixed corruption. Loss is in nats per masked character.

Variants: ``smoke`` trains a tiny encoder for 30 steps, for tests.
"""

from jaxnet.config import Config
from jaxnet.models import TransformerConfig

VARIANTS = ("default", "smoke")


def get_config(variant: str = "default") -> Config:
    """The config of ``variant`` (one of VARIANTS)."""
    cfg = Config()
    cfg.task = "masked_lm"
    cfg.data.name = "shakespeare"
    cfg.data.seq_len = 128
    cfg.data.mask_rate = 0.15
    cfg.model = TransformerConfig(
        layers=4, width=128, heads=4, mlp_ratio=4, dropout=0.0, tie_embeddings=True, causal=False
    )
    cfg.optim.name = "adamw"
    cfg.optim.lr = 1e-3
    cfg.optim.b2 = 0.99
    cfg.optim.weight_decay = 0.1
    cfg.optim.warmup_steps = 100
    cfg.optim.end_lr_factor = 0.1
    cfg.optim.clip_norm = 1.0
    cfg.train.batch_size = 32
    cfg.train.eval_batch_size = 64
    cfg.train.steps = 2000
    cfg.train.log_every = 50
    cfg.train.eval_every = 500
    cfg.train.checkpoint_every = 500
    if variant == "smoke":
        cfg.data.seq_len = 32
        cfg.model.layers = 2
        cfg.model.width = 32
        cfg.optim.warmup_steps = 5
        cfg.train.batch_size = 8
        cfg.train.steps = 30
        cfg.train.log_every = 10
        cfg.train.eval_every = 15
        cfg.train.checkpoint_every = 15
    return cfg

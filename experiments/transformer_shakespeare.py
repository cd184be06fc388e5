"""A character-level GPT-style Transformer on Shakespeare's complete works.

Command:  jaxnet train transformer_shakespeare
          jaxnet sample --workdir runs/transformer_shakespeare --prompt "ROMEO:" --tokens 500
Result:   validation loss 1.628 nats/char (2.349 bits/char), test 1.615 (2.330) after 2,000 steps
Time:     5.4 minutes on a 2-core CPU, start to finish, with the head-major attention jaxnet
          uses on a CPU (benchmarks/results/train-transformer_shakespeare-cpu-2026-11-24.json: the
          same losses to 4 digits); 11 minutes before it (...-cpu-2026-11-21.json)

Four pre-LayerNorm blocks, 128 wide, 4 heads, context 128, learned positions, tied embeddings
(0.82 M parameters): a CPU-sized relative of the well-known "shakespeare_char" recipe (6 x 384,
context 256). AdamW at 1e-3 with 100 warmup steps and cosine decay, batch 32 random windows,
2,000 steps (8.2 M characters, 1.8 passes over the 4.55 M training characters). The text is
split per work 90/5/5 by position (see jaxnet.data.text); loss is in nats per character, with
bits per character beside it.

Variants: ``smoke`` trains a tiny model for 30 steps, for tests.
"""

from jaxnet.config import Config
from jaxnet.models import TransformerConfig

VARIANTS = ("default", "smoke")


def get_config(variant: str = "default") -> Config:
    """The config of ``variant`` (one of VARIANTS)."""
    cfg = Config()
    cfg.data.name = "shakespeare"
    cfg.data.seq_len = 128
    cfg.model = TransformerConfig(layers=4, width=128, heads=4, mlp_ratio=4, dropout=0.0, tie_embeddings=True)
    cfg.optim.name = "adamw"
    cfg.optim.lr = 1e-3
    cfg.optim.b2 = 0.99
    cfg.optim.weight_decay = 0.1
    # The result above was measured with decay on every parameter; optim.decay_mask=auto (biases and
    # LayerNorm scales undecayed, the default since) gives a slightly different run, not yet measured.
    cfg.optim.decay_mask = "all"
    cfg.optim.warmup_steps = 100
    cfg.optim.end_lr_factor = 0.1
    cfg.optim.clip_norm = 1.0
    cfg.train.batch_size = 32
    cfg.train.eval_batch_size = 64
    cfg.train.steps = 2000
    cfg.train.log_every = 50
    cfg.train.eval_every = 500
    cfg.train.checkpoint_every = 500
    cfg.train.steps_per_call = 0  # auto: 5 steps per compiled call here (faster on a CPU); 1 in a sweep
    if variant == "smoke":
        cfg.train.steps_per_call = 1  # the many tests' runs compile fastest so (several a call: tested apart)
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

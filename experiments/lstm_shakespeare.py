"""A character-level LSTM on Shakespeare's complete works: the Transformer's task, a recurrent model.

Command:  jaxnet train lstm_shakespeare
Result:   validation loss 1.633 nats/char (2.356 bits/char), test 1.623 (2.342) after 2,000 steps;
          transformer_shakespeare reaches 1.628 / 1.615 with the same characters (the README plots both)
Time:     7 minutes on a 2-core CPU, start to finish
          (benchmarks/results/train-lstm_shakespeare-cpu-2026-11-21.json)

Two LSTM layers of 224 units (0.84 M parameters, like transformer_shakespeare's 0.82 M),
trained on the same characters with the same tokens per step (batch 32, sequences of 128,
2,000 steps) and the same optimizer family (AdamW, warmup and cosine decay; the LSTM takes a
learning rate of 2e-3 and no weight decay). The LSTM reads the text as 32 contiguous streams and carries its
hidden state from batch to batch (truncated backpropagation through time), which gives it
context beyond 128 characters.

Variants: ``smoke`` trains a tiny model for 30 steps, for tests.
"""

from jaxnet.config import Config
from jaxnet.models import LSTMConfig

VARIANTS = ("default", "smoke")


def get_config(variant: str = "default") -> Config:
    """The config of ``variant`` (one of VARIANTS)."""
    cfg = Config()
    cfg.data.name = "shakespeare"
    cfg.data.seq_len = 128
    cfg.model = LSTMConfig(layers=2, width=224, dropout=0.0, init_scale=0.08)
    cfg.optim.name = "adamw"
    cfg.optim.lr = 2e-3
    cfg.optim.b2 = 0.99
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
        cfg.model.width = 32
        cfg.optim.warmup_steps = 5
        cfg.train.batch_size = 8
        cfg.train.steps = 30
        cfg.train.log_every = 10
        cfg.train.eval_every = 15
        cfg.train.checkpoint_every = 15
    return cfg

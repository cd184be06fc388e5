"""The medium LSTM of Zaremba, Sutskever and Vinyals (2014) on word-level Penn Treebank.

Command:  jaxnet train lstm_ptb_medium
Result:   not run to the end here; the paper reports test perplexity 82.7
Time:     39 epochs of 1,327 steps = 51,753 steps; 2.44 steps/s on a 2-core CPU, so about 5.9 hours
          of training (benchmarks/results/cost-lstm_ptb_medium-cpu-2026-11-21.json, from
          scripts/measure_cost.py); a GPU is the place for it

Two LSTM layers of 650 units, dropout 0.5 on the non-recurrent connections, weights uniform in
[-0.05, 0.05]; plain SGD, the learning rate held for 6 epochs then divided by 1.2 every epoch
(the paper's schedule; TensorFlow's well-known port multiplies by 0.8 instead); gradients
clipped by global norm; batch 20, truncated backpropagation over 35 steps with the hidden state
carried across batches; 39 epochs.

As in lstm_ptb_small, the paper's loss sums over the 35 time steps, so its learning rate 1 and
clipping norm 5 are learning rate 35 and clipping norm 5/35 here.

Variants: ``smoke`` trains a tiny model for 30 steps, for tests.
"""

from jaxnet.config import Config
from jaxnet.models import LSTMConfig

VARIANTS = ("default", "smoke")

STEPS_PER_EPOCH = 1327  # (929,589 - 1) // 20 streams // 35 steps


def get_config(variant: str = "default") -> Config:
    """The config of ``variant`` (one of VARIANTS)."""
    cfg = Config()
    cfg.data.name = "ptb"
    cfg.data.seq_len = 35
    cfg.model = LSTMConfig(layers=2, width=650, dropout=0.5, init_scale=0.05)
    cfg.optim.name = "sgd"
    cfg.optim.momentum = 0.0
    cfg.optim.lr = 35.0  # the paper's 1, for a loss summed over seq_len=35 steps
    cfg.optim.clip_norm = 5.0 / 35  # the paper's 5, likewise divided by 35
    cfg.optim.schedule = "step"
    cfg.optim.decay_start = 6 * STEPS_PER_EPOCH
    cfg.optim.decay_every = STEPS_PER_EPOCH
    cfg.optim.decay_factor = 1 / 1.2
    cfg.train.batch_size = 20
    cfg.train.eval_batch_size = 20
    cfg.train.steps = 39 * STEPS_PER_EPOCH
    cfg.train.log_every = 200
    cfg.train.eval_every = STEPS_PER_EPOCH
    cfg.train.checkpoint_every = STEPS_PER_EPOCH
    cfg.train.steps_per_call = 0  # auto: 8 steps per compiled call, single ones up to an epoch's end (faster)
    if variant == "smoke":
        cfg.train.steps_per_call = 1  # the many tests' runs compile fastest so (several a call: tested apart)
        cfg.model.width = 32
        cfg.train.eval_batch_size = 200  # fewer, longer passes over the 74k validation words
        cfg.optim.decay_start = 15
        cfg.optim.decay_every = 5
        cfg.train.steps = 30
        cfg.train.log_every = 10
        cfg.train.eval_every = 15
        cfg.train.checkpoint_every = 15
    return cfg

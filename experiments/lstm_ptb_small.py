"""The small LSTM of Zaremba, Sutskever and Vinyals (2014) on word-level Penn Treebank.

Command:  jaxnet train lstm_ptb_small
Result:   test perplexity 114.4, validation 118.6 (the paper: 114.5 test)
Time:     46 minutes on a 2-core CPU, start to finish, partly sharing the cores with other jobs
          (about 14 steps/s alone: 36 minutes for the 30,199 steps)
          (benchmarks/results/train-lstm_ptb_small-cpu-2026-11-21.json)

Two LSTM layers of 200 units, no dropout, weights uniform in [-0.1, 0.1]; plain SGD, the
learning rate halved at the start of every epoch after the fourth; gradients clipped by global
norm; batch 20, truncated backpropagation over 20 steps with the hidden state carried across
batches (reset each epoch); 13 epochs of 2,323 steps. The paper reports test perplexity 114.5.

The paper's loss is summed over the 20 time steps (and averaged over the batch); jaxnet's is the
mean over all tokens, 20 times smaller. Its learning rate 1 and clipping norm 5 are therefore
learning rate 20 and clipping norm 0.25 here: the same updates. Validation and test perplexity
are measured over every word of the split read as 20 streams, each starting from a zero state
(the TensorFlow reference reads the test split as one stream; the difference is 19 cold starts
in 82,430 words).

Variants: ``smoke`` trains a tiny model for 40 steps, for tests.
"""

from jaxnet.config import Config
from jaxnet.models import LSTMConfig

VARIANTS = ("default", "smoke")

STEPS_PER_EPOCH = 2323  # (929,589 - 1) // 20 streams // 20 steps


def get_config(variant: str = "default") -> Config:
    """The config of ``variant`` (one of VARIANTS)."""
    cfg = Config()
    cfg.data.name = "ptb"
    cfg.data.seq_len = 20
    cfg.model = LSTMConfig(layers=2, width=200, dropout=0.0, init_scale=0.1)
    cfg.optim.name = "sgd"
    cfg.optim.momentum = 0.0
    cfg.optim.lr = 20.0  # the paper's 1, for a loss summed over seq_len=20 steps
    cfg.optim.clip_norm = 0.25  # the paper's 5, likewise divided by 20
    cfg.optim.schedule = "step"
    cfg.optim.decay_start = 4 * STEPS_PER_EPOCH
    cfg.optim.decay_every = STEPS_PER_EPOCH
    cfg.optim.decay_factor = 0.5
    cfg.train.batch_size = 20
    cfg.train.eval_batch_size = 20
    cfg.train.steps = 13 * STEPS_PER_EPOCH
    cfg.train.log_every = 200
    cfg.train.eval_every = STEPS_PER_EPOCH
    cfg.train.checkpoint_every = STEPS_PER_EPOCH
    cfg.train.steps_per_call = 0  # auto: 8 steps per compiled call, single ones up to an epoch's end (faster)
    if variant == "smoke":
        cfg.train.steps_per_call = 1  # the many tests' runs compile fastest so (several a call: tested apart)
        cfg.model.width = 32
        cfg.train.eval_batch_size = 200  # fewer, longer passes over the 74k validation words
        cfg.optim.decay_start = 20
        cfg.optim.decay_every = 10
        cfg.train.steps = 40
        cfg.train.log_every = 10
        cfg.train.eval_every = 0  # at the end only: a pass over the validation words is ~5 s of a ~20 s run
        cfg.train.checkpoint_every = 20
    return cfg

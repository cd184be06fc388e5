"""A BERT-style Transformer encoder trained by masked language modelling on Shakespeare (characters).

Command:  jaxnet train bert_shakespeare
Result:   64.1 % of the masked characters right on test (loss 1.197 nats per masked character),
          63.7 % on validation (1.215), after 2,000 steps
Time:     30 minutes on a 2-core CPU that other jobs were loading (load average 3-4); the same
          model trained causally (transformer_shakespeare) takes 11 minutes on a quiet one
          (benchmarks/results/train-bert_shakespeare-cpu-2026-11-22.json)

transformer_shakespeare's model and recipe (4 blocks of 128, 4 heads, tied embeddings, AdamW,
2,000 steps of 32 windows of 128 characters) with ``model.causal=false`` (every position attends
to every other) and rotary positions. ``task=masked_lm`` (BERT, Devlin et al. 2019): 15 % of the characters of each
128-character window are chosen; 80 % of those become a mask token, 10 % a random character and
10 % stay, and the model predicts the original characters at the chosen positions only. The
corruption is drawn from the run's seed and the step, so a resumed run sees the same batches;
validation and test use one fixed corruption. Loss is in nats per masked character.

Variants: ``smoke`` trains a tiny encoder for 30 steps, for tests.
"""

from jaxnet.config import Config, load_experiment

VARIANTS = ("default", "smoke")


def get_config(variant: str = "default") -> Config:
    """transformer_shakespeare's recipe of the same ``variant`` (model, optimizer, steps, data),
    made bidirectional, with rotary positions, and trained by masked LM."""
    cfg = load_experiment("transformer_shakespeare" + (":smoke" if variant == "smoke" else ""))
    cfg.model.causal = False
    # Rotary positions: a masked character is predicted from its neighbours, and attention by
    # relative position finds them at once; learned absolute positions sat at the unigram plateau
    # (loss 3.04) for the first 900 steps.
    cfg.model.position = "rotary"
    cfg.task = "masked_lm"
    cfg.data.mask_rate = 0.15
    return cfg

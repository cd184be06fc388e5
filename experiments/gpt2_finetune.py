"""Fine-tune GPT-2 from a Hugging Face checkpoint (train.init_from=hf:PATH) on the shipped text.

Command:  jaxnet train gpt2_finetune train.init_from=hf:checkpoints/gpt2     (a directory save_pretrained wrote)
          jaxnet export --workdir runs/gpt2_finetune --format hf --out gpt2-shakespeare
          jaxnet train gpt2_finetune:smoke train.init_from=hf:DIR            (a small GPT-2, on a CPU)
Result:   not trained here: no published weights can be downloaded on this machine; the smoke variant
          is trained in tests/test_hf_gpt2.py from a GPT-2 that transformers saves with random weights
Time:     smoke: under a minute on a 2-core CPU

The model's shape (layers, width, heads, context, vocabulary, GELU, LayerNorm epsilon) comes from
the checkpoint's config.json: this file sets none of it, and a ``model.*`` override that
contradicts the checkpoint is refused. The vocabulary is padded from GPT-2's 50,257 to 50,304 (a
multiple of 64), the padding ids masked (``model.vocab_used``) so they are never predicted.
AdamW (0.9, 0.95) at 3e-5 after 50 warmup steps, cosine decay, weight decay 0.1, clipping at
1.0; 8 sequences of 1,024 tokens a step.

The text is a corpus of GPT-2 tokens prepared by ``jaxnet prepare`` (``data.name=tokens``,
``data.path``; GPT-2's weights only make sense on GPT-2's token ids); the default,
corpora/shakespeare-gpt2, is prepared from the shipped Shakespeare on first use.

jaxnet never downloads weights. On a machine with internet access, ``transformers`` writes the
published GPT-2 as such a directory::

    from transformers import GPT2LMHeadModel
    GPT2LMHeadModel.from_pretrained("gpt2").save_pretrained("checkpoints/gpt2")

Variants: ``smoke`` fine-tunes whatever small GPT-2 ``train.init_from`` names on the text as
bytes (its vocabulary must be at most 256; ``train.check_tokenizer=false``: not GPT-2's tokens, on
purpose), context 32, for 10 steps.
"""

from jaxnet.config import Config
from jaxnet.data import TextDataset
from jaxnet.data import load as load_data
from jaxnet.data.tokens import load_or_prepare
from jaxnet.models import TransformerConfig

VARIANTS = ("default", "smoke")
VOCAB = 50304  # GPT-2's 50,257 padded to a multiple of 64


def get_config(variant: str = "default") -> Config:
    """The config of ``variant`` (one of VARIANTS); ``train.init_from=hf:PATH`` names the checkpoint."""
    cfg = Config()
    cfg.data.name = "tokens"
    cfg.data.path = "corpora/shakespeare-gpt2"
    cfg.data.vocab_size = VOCAB
    cfg.data.seq_len = 1024
    cfg.model = TransformerConfig(dropout=0.0)  # the shape: the checkpoint's
    cfg.train.init_from = "hf:checkpoints/gpt2"
    cfg.optim.name = "adamw"
    cfg.optim.lr = 3e-5
    cfg.optim.b2 = 0.95
    cfg.optim.weight_decay = 0.1
    cfg.optim.warmup_steps = 50
    cfg.optim.end_lr_factor = 0.1
    cfg.optim.clip_norm = 1.0
    cfg.train.batch_size = 8
    cfg.train.eval_batch_size = 8
    cfg.train.steps = 1000
    cfg.train.log_every = 50
    cfg.train.eval_every = 250
    cfg.train.checkpoint_every = 250
    if variant == "smoke":
        cfg.data.name, cfg.data.path, cfg.data.vocab_size = "shakespeare", "", 0
        cfg.data.tokenizer = "byte"
        cfg.train.check_tokenizer = False  # bytes on a small GPT-2 of random weights, on purpose
        cfg.data.seq_len = 32
        cfg.optim.lr = 1e-3
        cfg.optim.warmup_steps = 2
        cfg.train.batch_size = 4
        cfg.train.eval_batch_size = 4
        cfg.train.steps = 10
        cfg.train.log_every = 5
        cfg.train.eval_every = 10
        cfg.train.checkpoint_every = 10
    return cfg


def data(cfg: Config) -> TextDataset:
    """The corpus at data.path (the default one prepared on first use), or the smoke variant's shipped text."""
    if cfg.data.name == "tokens":
        return load_or_prepare(cfg.data, "shakespeare", "gpt2")
    return load_data(cfg.data)

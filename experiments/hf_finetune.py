"""Fine-tune a Hugging Face checkpoint (Llama, Qwen2, Mistral or GPT-2) on text tokenized with its own tokenizer.

Command:  jaxnet train hf_finetune train.init_from=hf:checkpoints/SmolLM-135M      (any supported checkpoint)
          jaxnet sample --workdir runs/hf_finetune --prompt "ROMEO:" --tokens 100
          jaxnet export --workdir runs/hf_finetune --format hf --out smollm-shakespeare
          jaxnet train hf_finetune:smoke train.init_from=hf:DIR                     (a small checkpoint, on a CPU)
Result:   not trained here: no published weights can be downloaded on this machine; the smoke variant is
          trained in tests/test_hf_llama.py from Llama, Qwen2 and Mistral checkpoints transformers saves with
          random weights, exported, and read back by transformers to the same logits
Time:     smoke: under a minute on a 2-core CPU

The model's whole shape (layers, width, heads, key/value heads, MLP, norm, rotary base and scaling,
tied or untied head, vocabulary) comes from the checkpoint's config.json: this file sets none of it,
and a ``model.*`` override that contradicts the checkpoint is refused. The text is the shipped
Shakespeare, prepared with the checkpoint's own tokenizer (its ``tokenizer.json``) into
``corpora/shakespeare-<checkpoint directory's name>`` on first use; ``data.path=CORPUS`` names another
corpus, which must have been prepared with the same tokenizer (``jaxnet prepare FILES --tokenizer
hf:DIR --out CORPUS``: a corpus of another tokenizer is refused before anything runs). AdamW (0.9,
0.95) at 2e-5 after 20 warmup steps, cosine decay to 2e-6, weight decay 0.1, clipping at 1.0; 8
sequences of 1,024 tokens a step, 500 steps; bfloat16 compute on a GPU.

jaxnet never downloads weights. On a machine with internet access, ``transformers`` writes a
checkpoint with its tokenizer as such a directory::

    from transformers import AutoModelForCausalLM, AutoTokenizer
    AutoModelForCausalLM.from_pretrained("HuggingFaceTB/SmolLM-135M").save_pretrained("checkpoints/SmolLM-135M")
    AutoTokenizer.from_pretrained("HuggingFaceTB/SmolLM-135M").save_pretrained("checkpoints/SmolLM-135M")

Variants: ``smoke`` fine-tunes on the shipped Shakespeare in memory (``data.name=shakespeare``, the
checkpoint's tokenizer), context 32, batch 4, for 10 steps.
"""

import dataclasses

from jaxnet.config import Config
from jaxnet.data import TextDataset
from jaxnet.data import load as load_data
from jaxnet.data.tokens import load_or_prepare
from jaxnet.errors import UserError
from jaxnet.models import TransformerConfig, hf

VARIANTS = ("default", "smoke")


def get_config(variant: str = "default") -> Config:
    """The config of ``variant`` (one of VARIANTS); ``train.init_from=hf:PATH`` names the checkpoint."""
    cfg = Config()
    cfg.data.name = "tokens"
    cfg.data.path = ""  # corpora/shakespeare-<checkpoint>, prepared with its tokenizer on first use
    cfg.data.seq_len = 1024
    cfg.model = TransformerConfig(dropout=0.0)  # the shape: the checkpoint's
    cfg.optim.name = "adamw"
    cfg.optim.lr = 2e-5
    cfg.optim.b2 = 0.95
    cfg.optim.weight_decay = 0.1
    cfg.optim.warmup_steps = 20
    cfg.optim.end_lr_factor = 0.1
    cfg.optim.clip_norm = 1.0
    cfg.train.batch_size = 8
    cfg.train.eval_batch_size = 8
    cfg.train.eval_tokens = 1 << 18
    cfg.train.steps = 500
    cfg.train.log_every = 25
    cfg.train.eval_every = 250
    cfg.train.checkpoint_every = 250
    if variant == "smoke":
        cfg.data.name = "shakespeare"
        cfg.data.seq_len = 32
        cfg.optim.lr = 1e-3
        cfg.optim.warmup_steps = 2
        cfg.train.batch_size = 4
        cfg.train.eval_batch_size = 4
        cfg.train.eval_tokens = 512
        cfg.train.steps = 10
        cfg.train.log_every = 5
        cfg.train.eval_every = 10
        cfg.train.checkpoint_every = 10
    return cfg


def data(cfg: Config) -> TextDataset:
    """The text in the checkpoint's own tokens: the corpus at data.path, or the shipped Shakespeare
    prepared with its tokenizer (the smoke variant: tokenized in memory)."""
    if not hf.is_hf(cfg.train.init_from):
        raise UserError("hf_finetune fine-tunes a Hugging Face checkpoint: give train.init_from=hf:DIR")
    directory = hf.hf_dir(cfg.train.init_from)
    tokenizer = cfg.data.tokenizer or f"hf:{directory}"
    if cfg.data.name != "tokens":
        return load_data(dataclasses.replace(cfg.data, tokenizer=tokenizer))
    if cfg.data.path:
        return load_or_prepare(cfg.data, "shakespeare", tokenizer)
    corpus = f"corpora/shakespeare-{directory.resolve().name}"
    return load_or_prepare(dataclasses.replace(cfg.data, path=corpus), "shakespeare", tokenizer, default=corpus)

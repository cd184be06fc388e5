"""Qwen3 8B's shape (Alibaba 2025), for planning: does it train on 8 H100s with FSDP, at what batch, how fast.

Command:  jaxnet plan qwen3_8b mesh.fsdp=8 --target h100 --gpus 8 --max-batch      (compiled here, on a CPU)
          jaxnet train qwen3_8b mesh.fsdp=-1 train.init_from=hf:DIR data.path=CORPUS   (on 8 GPUs)
          jaxnet train qwen3_8b:smoke                                                    (a tiny relative, on a CPU)
Result:   not trained here (no GPU); the plan of 8 H100s with fsdp=8 is
          benchmarks/results/plan-qwen3_8b-h100x8-*.json and the table of docs/open-models.md
Time:     smoke: under a minute on a 2-core CPU; the plan of 8 H100s took 45 min on a shared 2-core CPU
          (two compiles of 15 min)

36 blocks 4,096 wide, 32 query heads of 128 sharing 8 key/value heads, RMSNorm on each head's queries
and keys before the rotary positions (base 1,000,000), a SwiGLU MLP of 12,288 units, RMSNorm (epsilon
1e-6), an untied output head, a vocabulary of 151,936: 8.19 B parameters (``TransformerConfig.preset(
"qwen3")``; Qwen3-8B's config.json). Started from a checkpoint (``train.init_from=hf:DIR``) every
``model.*`` value comes from its config.json. The rest is llama3_8b's recipe: bfloat16 compute on a
GPU (float32 parameters and AdamW state), cuDNN's fused attention, AdamW (0.9, 0.95) at 3e-4 after
2,000 warmup steps, cosine decay to 3e-5, weight decay 0.1, clipping at 1.0, a global batch of 8
sequences of 8,192 tokens (one per GPU on 8), so the two plans compare.

The default data is only a placeholder of the right shapes for planning: the shipped Shakespeare as
bytes (``corpora/shakespeare-byte``, prepared on first use). A real run names a corpus prepared with
the checkpoint's own tokenizer (``jaxnet prepare FILES --tokenizer hf:DIR --out CORPUS``).

Variants: ``smoke`` trains a 2 x 64 model of the same shape with context 64 on the bytes for 10 steps.
"""

from jaxnet.config import Config, load_experiment
from jaxnet.data import TokenDataset
from jaxnet.data.tokens import load_or_prepare
from jaxnet.models import TransformerConfig

VARIANTS = ("default", "smoke")
VOCAB = 151936
CORPUS = "corpora/shakespeare-byte"


def get_config(variant: str = "default") -> Config:
    """llama3_8b's recipe of ``variant`` (one of VARIANTS) with Qwen3 8B's model and vocabulary."""
    cfg = load_experiment("llama3_8b" + (":smoke" if variant == "smoke" else ""))
    cfg.model = TransformerConfig.preset(
        "qwen3", layers=36, width=4096, heads=32, kv_heads=8, head_dim=128, mlp_hidden=12288, dropout=0.0
    )
    if variant == "smoke":
        cfg.model.layers, cfg.model.width, cfg.model.heads, cfg.model.kv_heads = 2, 64, 4, 2
        cfg.model.head_dim, cfg.model.mlp_hidden = 32, 176
    else:
        cfg.data.vocab_size = VOCAB
    return cfg


def data(cfg: Config) -> TokenDataset:
    """The corpus at data.path; the default one (the shipped Shakespeare as bytes, a placeholder of
    the right shapes) is prepared on first use."""
    return load_or_prepare(cfg.data, "shakespeare", "byte", default=CORPUS)

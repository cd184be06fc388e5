"""Gemma 3 12B's text decoder (Google 2025), for planning: does it train on 8 H100s with FSDP, at what batch, how fast.

Command:  jaxnet plan gemma3_12b mesh.fsdp=8 --target h100 --gpus 8                  (compiled here, on a CPU)
          jaxnet plan gemma3_12b mesh.fsdp=8 model.remat=true --target h100 --gpus 8 --max-batch
          jaxnet train gemma3_12b mesh.fsdp=-1 train.init_from=hf:DIR data.path=CORPUS   (on 8 GPUs)
          jaxnet train gemma3_12b:smoke                                                    (a tiny relative, on a CPU)
Result:   not trained here (no GPU). Planned on 8 H100s with fsdp=8 at one sequence a GPU, it does NOT
          fit: 195.2 GiB per device of 79.6, 178.7 GiB of it temporaries, its attention XLA's (a head
          of 256) (benchmarks/results/plan-gemma3_12b-h100x8-*.json, the table of docs/open-models.md);
          the plan with model.remat (record_plans.py dense:gemma3_12b-remat) is not recorded yet
Time:     smoke: under a minute on a 2-core CPU; each compile of a plan of 8 H100s takes 10 to 20 min on a
          shared 2-core CPU

48 blocks 3,840 wide, 16 query heads of 256 sharing 8 key/value heads, a GeGLU MLP of 15,360 units,
RMSNorm (1 + w, epsilon 1e-6) before and after each branch and on each head's queries and keys, the
embeddings scaled by sqrt(width) and tied to the output, five local layers (the last 1,024 positions,
rotary base 10,000) to one global (rotary base 1,000,000, linearly scaled by 8), a vocabulary of
262,208: 11.77 B parameters (``TransformerConfig.preset("gemma3")``; the text_config of
Gemma-3-12B's config.json). The rest is llama3_8b's recipe: bfloat16 compute on a GPU (float32
parameters and AdamW state), AdamW (0.9, 0.95) at 3e-4 after 2,000 warmup steps, cosine decay to
3e-5, weight decay 0.1, clipping at 1.0, a global batch of 8 sequences of 8,192 tokens. A head of
256 is more than cuDNN's fused attention takes here (``model.attention=auto`` resolves to XLA's, and
``jaxnet plan`` says which kernel it compiled).

The default data is only a placeholder of the right shapes for planning: the shipped Shakespeare as
bytes (``corpora/shakespeare-byte``, prepared on first use). A real run names a corpus prepared with
the checkpoint's own tokenizer, and starts from Gemma 3's text decoder saved as ``Gemma3ForCausalLM``.

Variants: ``smoke`` trains a 3 x 64 model of the same shape (two local blocks of 16 positions, one
global) with context 64 on the bytes for 10 steps.
"""

from jaxnet.config import Config, load_experiment
from jaxnet.data import TokenDataset
from jaxnet.data.tokens import load_or_prepare
from jaxnet.models import TransformerConfig

VARIANTS = ("default", "smoke")
VOCAB = 262208
CORPUS = "corpora/shakespeare-byte"


def get_config(variant: str = "default") -> Config:
    """llama3_8b's recipe of ``variant`` (one of VARIANTS) with Gemma 3 12B's text decoder and vocabulary."""
    cfg = load_experiment("llama3_8b" + (":smoke" if variant == "smoke" else ""))
    cfg.model = TransformerConfig.preset(
        "gemma3",
        layers=48,
        width=3840,
        heads=16,
        kv_heads=8,
        head_dim=256,
        mlp_hidden=15360,
        window=1024,
        rope_scaling="linear",
        rope_factor=8.0,
        dropout=0.0,
    )
    if variant == "smoke":
        cfg.model.layers, cfg.model.width, cfg.model.heads, cfg.model.kv_heads = 3, 64, 4, 2
        cfg.model.head_dim, cfg.model.mlp_hidden, cfg.model.window = 32, 176, 16
        cfg.model.attention_pattern = ("local", "local", "global")
    else:
        cfg.data.vocab_size = VOCAB
    return cfg


def data(cfg: Config) -> TokenDataset:
    """The corpus at data.path; the default one (the shipped Shakespeare as bytes, a placeholder of
    the right shapes) is prepared on first use."""
    return load_or_prepare(cfg.data, "shakespeare", "byte", default=CORPUS)

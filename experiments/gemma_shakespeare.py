"""A small Gemma-2-style decoder on Shakespeare in GPT-2's tokens, beside llama_shakespeare: same data, size and steps.

Command:  jaxnet prepare shakespeare --tokenizer gpt2 --out corpora/shakespeare-gpt2
          jaxnet train gemma_shakespeare data.path=corpora/shakespeare-gpt2
          jaxnet sample --workdir runs/gemma_shakespeare --prompt "ROMEO:" --tokens 100
Result:   see docs/open-models.md (python scripts/record_result.py gemma_shakespeare)
Time:     55 min on a 2-core CPU shared with other jobs (load average 6 to 9; llama_shakespeare: 16 min)

llama_shakespeare's model in Gemma 2's shape (``TransformerConfig.preset("gemma2")``): a GeGLU MLP
(the tanh GELU gating the up projection) instead of SwiGLU, RMSNorm scales of 1 + w, the embeddings
scaled by sqrt(width), norms after each branch as well as before, local layers (each position
attends to the last 64, half the context) alternating with global ones, and Gemma 2's soft-capping
of the attention logits (at 50) and of the output logits (at 30, in the blockwise loss too). The
sizes are llama_shakespeare's: four blocks 128 wide, 4 query heads sharing 2 key/value heads, an MLP
of 400 units, context 128, tied embeddings, GPT-2's vocabulary padded to 50,304: 7,252,096
parameters (llama_shakespeare's 7,251,072 and the 1,024 scales of the norms after each branch).
Everything else is gpt2_shakespeare's: the same prepared corpus (the 42 works in GPT-2 tokens, one
work each held out for validation and test), AdamW at 1e-3 with 50 warmup steps and cosine decay,
batch 16 windows of 128 tokens, 600 steps, loss in nats per GPT-2 token.

Variants: ``smoke`` trains a 2 x 32 model (one local block, one global) for 10 steps, for tests.
"""

from jaxnet.config import Config, load_experiment
from jaxnet.data import TokenDataset
from jaxnet.data.tokens import load_or_prepare
from jaxnet.models import TransformerConfig

VARIANTS = ("default", "smoke")


def get_config(variant: str = "default") -> Config:
    """gpt2_shakespeare's recipe of the same ``variant`` (data, optimizer, steps), its model in Gemma 2's shape."""
    cfg = load_experiment("gpt2_shakespeare" + (":smoke" if variant == "smoke" else ""))
    cfg.model = TransformerConfig.preset(
        "gemma2", layers=4, width=128, heads=4, kv_heads=2, mlp_hidden=400, window=64, dropout=0.0
    )
    if variant == "smoke":
        cfg.model.layers, cfg.model.width, cfg.model.heads, cfg.model.kv_heads = 2, 32, 2, 1
        cfg.model.mlp_hidden, cfg.model.window = 96, 8
    return cfg


def data(cfg: Config) -> TokenDataset:
    """The corpus at data.path; the default one (the shipped Shakespeare in GPT-2 tokens) is prepared on first use."""
    return load_or_prepare(cfg.data, "shakespeare", "gpt2")

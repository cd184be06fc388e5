"""A small Llama-style decoder on Shakespeare in GPT-2's tokens, beside gpt2_shakespeare: same data, size and steps.

Command:  jaxnet prepare shakespeare --tokenizer gpt2 --out corpora/shakespeare-gpt2
          jaxnet train llama_shakespeare data.path=corpora/shakespeare-gpt2
          jaxnet sample --workdir runs/llama_shakespeare --prompt "ROMEO:" --tokens 100
Result:   see docs/open-models.md (python scripts/record_result.py llama_shakespeare)
Time:     about 15 min on a shared 2-core CPU

gpt2_shakespeare's model in Llama's shape (``TransformerConfig.preset("llama")``): rotary positions
instead of a learned table, RMSNorm instead of LayerNorm, a SwiGLU MLP, grouped-query attention (4
query heads sharing 2 key/value heads), no biases. Four blocks 128 wide, context 128, tied
embeddings, GPT-2's vocabulary padded to 50,304, and an MLP of 400 units chosen so the parameter
count matches gpt2_shakespeare's (7,251,072 against 7,248,640). Everything else is gpt2_shakespeare's:
the same prepared corpus (the 42 works in GPT-2 tokens, one work each held out for validation and
test), AdamW at 1e-3 with 50 warmup steps and cosine decay, batch 16 windows of 128 tokens, 600
steps, loss in nats per GPT-2 token. What the difference in loss says is what the modern block buys
at this size, on this CPU-sized budget.

Variants: ``smoke`` trains a 1 x 32 model for 10 steps, for tests.
"""

from jaxnet.config import Config, load_experiment
from jaxnet.data import TokenDataset
from jaxnet.data.tokens import load_or_prepare
from jaxnet.models import TransformerConfig

VARIANTS = ("default", "smoke")


def get_config(variant: str = "default") -> Config:
    """gpt2_shakespeare's recipe of the same ``variant`` (data, optimizer, steps), its model in Llama's shape."""
    cfg = load_experiment("gpt2_shakespeare" + (":smoke" if variant == "smoke" else ""))
    cfg.model = TransformerConfig.preset(
        "llama", layers=4, width=128, heads=4, kv_heads=2, mlp_hidden=400, tie_embeddings=True, dropout=0.0
    )
    if variant == "smoke":
        cfg.model.layers, cfg.model.width, cfg.model.heads, cfg.model.kv_heads = 1, 32, 2, 1
        cfg.model.mlp_hidden = 96
    return cfg


def data(cfg: Config) -> TokenDataset:
    """The corpus at data.path; the default one (the shipped Shakespeare in GPT-2 tokens) is prepared on first use."""
    return load_or_prepare(cfg.data, "shakespeare", "gpt2")

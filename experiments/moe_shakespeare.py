"""A small mixture of experts on Shakespeare in GPT-2's tokens, beside llama_shakespeare: same data,
active parameters and steps.

Command:  jaxnet prepare shakespeare --tokenizer gpt2 --out corpora/shakespeare-gpt2
          jaxnet train moe_shakespeare data.path=corpora/shakespeare-gpt2
          python scripts/measure_moe.py          (its step beside llama_shakespeare's, the routing's cost)
Result:   test loss 4.804 nats (perplexity 122.0) against llama_shakespeare's 4.841 (126.6), one run
          each (python scripts/record_result.py moe_shakespeare; docs/mixture-of-experts.md)
Time:     40 min on a shared 2-core CPU at load 1.8-4.1 (its step 1.09x llama_shakespeare's)

llama_shakespeare's model (four Llama blocks 128 wide, 4 query heads sharing 2 key/value heads,
rotary positions, RMSNorm, tied embeddings, context 128) with each MLP a mixture of 8 SwiGLU experts
of 200 units, each token routed to 2 (``model.mlp_pattern=moe``): a token computes with 2 x 200 = 400
MLP units, llama_shakespeare's MLP, plus the router's 128 x 8, so the active parameters are
llama_shakespeare's (7,255,168 against 7,251,072; 9,098,368 in all). Dropless, the top-2
weights renormalised (Mixtral's routing), the load-balancing loss at 0.01 (logged as
``router_balance``, the experts' load as ``moe/block_N/...``). Everything else is llama_shakespeare's,
so the difference in loss is what 8 experts buy over one MLP of the same cost a token.

Variants: ``smoke`` trains a 1 x 32 model of 4 experts for 10 steps, for tests.
"""

from jaxnet.config import Config, load_experiment
from jaxnet.data import TokenDataset
from jaxnet.data.tokens import load_or_prepare

VARIANTS = ("default", "smoke")


def get_config(variant: str = "default") -> Config:
    """llama_shakespeare's ``variant`` with mixture layers of the same cost a token."""
    cfg = load_experiment("llama_shakespeare" + (":smoke" if variant == "smoke" else ""))
    cfg.model.mlp_pattern = ("moe",)
    cfg.model.experts, cfg.model.experts_per_token = (4, 2) if variant == "smoke" else (8, 2)
    cfg.model.expert_hidden = cfg.model.mlp_hidden // 2  # two experts a token: the dense MLP's units
    return cfg


def data(cfg: Config) -> TokenDataset:
    """The corpus at data.path; the default one (the shipped Shakespeare in GPT-2 tokens) is prepared on first use."""
    return load_or_prepare(cfg.data, "shakespeare", "gpt2")

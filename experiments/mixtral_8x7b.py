"""Mixtral 8x7B's shape (Mistral AI 2024), for planning: which expert x FSDP split of 8 H100s holds it, at what batch.

Command:  jaxnet plan mixtral_8x7b mesh.fsdp=8 --target h100 --gpus 8 --max-batch        (compiled here, on a CPU)
          jaxnet plan mixtral_8x7b mesh.fsdp=4 mesh.expert=2 --target h100 --gpus 8 --max-batch
          jaxnet train mixtral_8x7b mesh.fsdp=-1 train.init_from=hf:DIR data.path=CORPUS  (on GPUs)
          jaxnet train mixtral_8x7b:smoke                                                   (a tiny relative, on a CPU)
Result:   not trained here (no GPU); the plans are benchmarks/results/plan-mixtral_8x7b-*.json and the
          mixture-of-experts section of docs/plan.md (python scripts/record_plans.py mixtral_8x7b)
Time:     smoke: under a minute on a 2-core CPU; each plan of 8 H100s compiles in minutes on 2 cores

32 blocks 4,096 wide, 32 query heads sharing 8 key/value heads, head size 128, RMSNorm (epsilon
1e-5), rotary positions of base 1,000,000, an untied output head, a vocabulary of 32,000, every
MLP a mixture of 8 SwiGLU experts of 14,336 units with each token routed to 2 (top-2, the weights
renormalised), the load-balancing loss at Mixtral's 0.02: 46.7 B parameters, 12.9 B active a token.
bfloat16 compute on a GPU, float32 parameters and AdamW state (the plan says what that costs: 46.7 B
parameters and two moments in float32 are 560 GB before any activation, more than 8 x 80 GB hold),
sequences of 4,096 tokens. The default data is a placeholder of the right shapes for planning
(the shipped Shakespeare as bytes).

Variants: ``smoke`` trains a 2 x 64 model of 4 experts (top-2) with context 64 on the bytes for 10 steps.
"""

from jaxnet.config import Config, load_experiment
from jaxnet.data import TokenDataset
from jaxnet.data.tokens import load_or_prepare

VARIANTS = ("default", "smoke")
CORPUS = "corpora/shakespeare-byte"


def get_config(variant: str = "default") -> Config:
    """Llama 3 8B's recipe (llama3_8b) with Mixtral's shape; the smoke variant its tiny relative."""
    cfg = load_experiment("llama3_8b" + (":smoke" if variant == "smoke" else ""))
    m = cfg.model
    m.mlp_pattern, m.experts, m.experts_per_token, m.router_aux_loss = ("moe",), 8, 2, 0.02
    if variant == "smoke":
        m.experts, m.expert_hidden = 4, 88
        return cfg
    m.rope_theta, m.expert_hidden = 1e6, 14336
    cfg.data.vocab_size, cfg.data.seq_len, cfg.train.batch_size = 32000, 4096, 8
    return cfg


def data(cfg: Config) -> TokenDataset:
    """The corpus at data.path; the default one (the shipped Shakespeare as bytes) is prepared on first use."""
    return load_or_prepare(cfg.data, "shakespeare", "byte", default=CORPUS)

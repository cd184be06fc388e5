"""Qwen3-30B-A3B's shape (Qwen 2025), for planning: 128 fine-grained experts, 8 a token, on 8 H100s.

Command:  jaxnet plan qwen3_30b_a3b mesh.fsdp=8 --target h100 --gpus 8 --max-batch         (compiled here, on a CPU)
          jaxnet plan qwen3_30b_a3b mesh.fsdp=2 mesh.expert=4 --target h100 --gpus 8 --max-batch
          jaxnet train qwen3_30b_a3b mesh.fsdp=-1 train.init_from=hf:DIR data.path=CORPUS  (on GPUs)
          jaxnet train qwen3_30b_a3b:smoke                                                   (a tiny relative, on a CPU)
Result:   not trained here (no GPU); the plans are benchmarks/results/plan-qwen3_30b_a3b-*.json and the
          mixture-of-experts section of docs/plan.md (python scripts/record_plans.py qwen3_30b_a3b)
Time:     smoke: under a minute on a 2-core CPU; each plan of 8 H100s compiles in minutes on 2 cores

48 blocks 2,048 wide, 32 query heads of 128 sharing 4 key/value heads (head size apart from the
width: 32 x 128 = 4,096), RMSNorm (epsilon 1e-6) on the queries and keys too, rotary positions of
base 1,000,000, an untied output head, a vocabulary of 151,936, every MLP a mixture of 128 SwiGLU
experts of 768 units with each token routed to 8 (``norm_topk_prob``: the top-8 weights
renormalised), the load-balancing loss at 0.001: 30.5 B parameters, 3.3 B active a token. bfloat16
compute on a GPU, float32 parameters and AdamW state, sequences of 4,096 tokens; the default data is
a placeholder of the right shapes (the shipped Shakespeare as bytes).

Variants: ``smoke`` trains a 2 x 64 model of 8 experts (top-2, query/key norms) with context 64 on the
bytes for 10 steps.
"""

from jaxnet.config import Config, load_experiment
from jaxnet.data import TokenDataset
from jaxnet.data.tokens import load_or_prepare

VARIANTS = ("default", "smoke")
CORPUS = "corpora/shakespeare-byte"


def get_config(variant: str = "default") -> Config:
    """Llama 3 8B's recipe (llama3_8b) with Qwen3-30B-A3B's shape; the smoke variant its tiny relative."""
    cfg = load_experiment("llama3_8b" + (":smoke" if variant == "smoke" else ""))
    m = cfg.model
    m.qk_norm, m.mlp_pattern, m.router_renorm, m.router_aux_loss = True, ("moe",), True, 0.001
    if variant == "smoke":
        m.experts, m.experts_per_token, m.expert_hidden = 8, 2, 32
        return cfg
    m.layers, m.width, m.heads, m.kv_heads, m.head_dim = 48, 2048, 32, 4, 128
    m.experts, m.experts_per_token, m.expert_hidden = 128, 8, 768
    m.rope_theta, m.norm_eps = 1e6, 1e-6
    cfg.data.vocab_size, cfg.data.seq_len, cfg.train.batch_size = 151936, 4096, 8
    return cfg


def data(cfg: Config) -> TokenDataset:
    """The corpus at data.path; the default one (the shipped Shakespeare as bytes) is prepared on first use."""
    return load_or_prepare(cfg.data, "shakespeare", "byte", default=CORPUS)

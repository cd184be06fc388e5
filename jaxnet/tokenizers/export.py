"""The tokenizer files a Hugging Face checkpoint directory holds beside its weights, for
``jaxnet export --format hf``: what transformers' ``AutoTokenizer``, ``apply_chat_template`` and
``generate`` read, so the exported model chats in transformers' text-generation pipeline.

- A run whose tokenizer is a checkpoint's (``hf:DIR``: it started from one, or its corpus was
  prepared with one) carries that directory's files over (``tokenizer.json``,
  ``tokenizer_config.json``, ``special_tokens_map.json``, ``generation_config.json``, the chat
  template, and a slow tokenizer's files where there are some).
- A run in GPT-2's tokens (``gpt2``) gets GPT-2's tokenizer written here: a ``tokenizer.json``
  built with the ``tokenizers`` library from the same two files jaxnet's GPT-2 tokenizer reads
  (``encoder.json``, ``vocab.bpe``), as transformers' own GPT-2 converter builds it (byte-level
  BPE, no prefix space, ``<|endoftext|>`` the special token, BOS and EOS).
- Characters, bytes and words have no Hugging Face tokenizer: the weights go alone.

A chat template (the one a run was fine-tuned with, or one given with ``--chat-template FILE``)
is written as ``chat_template.jinja`` (what transformers 5 reads) and as ``tokenizer_config.json``'s
``chat_template`` (what transformers 4 reads). ``generation_config.json`` is written where the
directory has none: the tokenizer's end ids (:attr:`~jaxnet.tokenizers.hf.HF.end_ids`), so
``generate`` stops where ``jaxnet sample`` stops. ``special_tokens_map.json`` likewise.

>>> files, ids = export_files("gpt2", context=1024)
>>> sorted(files), ids
(['generation_config.json', 'special_tokens_map.json', 'tokenizer.json', 'tokenizer_config.json'], \
{'bos_token_id': 50256, 'eos_token_id': 50256})
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from jaxnet.errors import UserError
from jaxnet.tokenizers.base import EOT

#: The files of a checkpoint's tokenizer that an export carries over from ``hf:DIR``.
CARRIED = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "generation_config.json",
    "chat_template.jinja",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
)
NAMED = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


def _dumps(value: Any) -> bytes:
    return (json.dumps(value, indent=2, ensure_ascii=False) + "\n").encode("utf-8")


def gpt2_tokenizer_json() -> bytes:
    """GPT-2's ``tokenizer.json`` built from jaxnet's GPT-2 files (see the module docstring).

    >>> json.loads(gpt2_tokenizer_json())["model"]["type"]
    'BPE'
    """
    try:
        from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors
    except ImportError:
        raise UserError("writing a tokenizer.json needs the tokenizers package; `pip install tokenizers`") from None
    from jaxnet.tokenizers import gpt2

    files = gpt2.gpt2_files()
    gpt2.file_hashes()  # the files are GPT-2's
    tok = Tokenizer(models.BPE.from_file(str(files["encoder.json"]), str(files["vocab.bpe"])))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.add_special_tokens([AddedToken(EOT, special=True)])
    if tok.token_to_id(EOT) != gpt2.EOT_ID or tok.get_vocab_size(with_added_tokens=True) != gpt2.VOCAB_SIZE:
        raise UserError(f"{files['encoder.json']} is not GPT-2's encoder.json; {gpt2.INSTALL}")
    return tok.to_str(pretty=True).encode("utf-8")


def _gpt2(context: int | None) -> tuple[dict[str, bytes], dict[str, Any]]:
    from jaxnet.tokenizers import gpt2

    named = {"bos_token": EOT, "eos_token": EOT, "unk_token": EOT}
    config = {"tokenizer_class": "GPT2Tokenizer", "add_prefix_space": False, **named}
    if context:
        config["model_max_length"] = context
    ids = {"bos_token_id": gpt2.EOT_ID, "eos_token_id": gpt2.EOT_ID}
    files = {
        "tokenizer.json": gpt2_tokenizer_json(),
        "tokenizer_config.json": _dumps(config),
        "special_tokens_map.json": _dumps(named),
        "generation_config.json": _dumps(ids),
    }
    return files, ids


def _hf(directory: Path) -> tuple[dict[str, bytes], dict[str, Any]]:
    from jaxnet.tokenizers import hf

    tok = hf.HF(directory)
    files = {name: (directory / name).read_bytes() for name in CARRIED if (directory / name).is_file()}
    ids: dict[str, Any] = {}
    if tok.bos_id is not None:
        ids["bos_token_id"] = tok.bos_id
    if tok.end_ids:
        ids["eos_token_id"] = tok.end_ids[0] if len(tok.end_ids) == 1 else list(tok.end_ids)
    if "generation_config.json" not in files:
        files["generation_config.json"] = _dumps(ids)
    if "special_tokens_map.json" not in files:
        try:
            config = json.loads(files.get("tokenizer_config.json", b"{}"))
        except ValueError:
            config = {}
        named = {k: config[k] for k in NAMED if isinstance(config, dict) and config.get(k) is not None}
        if named:
            files["special_tokens_map.json"] = _dumps(named)
    return files, ids


def export_files(
    tokenizer: str, *, chat_template: str | None = None, context: int | None = None
) -> tuple[dict[str, bytes], dict[str, Any]]:
    """The tokenizer files (file name -> bytes) an exported checkpoint of a run in ``tokenizer``'s
    ids holds, with ``chat_template`` (Jinja text) as its template when given, and the special ids
    its ``config.json`` gets (``bos_token_id``, ``eos_token_id``); a tokenizer with no Hugging Face
    form gives none (and a ``chat_template`` for it is a one-line error). ``context`` is the
    model's positions (GPT-2's ``model_max_length``).

    >>> files, ids = export_files("hf:checkpoints/my-llama", chat_template=open("chat.jinja").read())  # doctest: +SKIP
    """
    kind = tokenizer.partition(":")[0]
    if kind == "gpt2":
        files, ids = _gpt2(context)
    elif kind == "hf":
        files, ids = _hf(Path(tokenizer.partition(":")[2]))
    else:
        if chat_template is not None:
            raise UserError(
                f"a chat template goes with a tokenizer.json, and the run's tokenizer is {tokenizer}, which has none; "
                "chat templates go with gpt2 or hf:DIR tokenizers"
            )
        return {}, {}
    if chat_template is not None:
        config = json.loads(files.get("tokenizer_config.json", b"{}"))
        config["chat_template"] = chat_template
        files["tokenizer_config.json"] = _dumps(config)
        files["chat_template.jinja"] = chat_template.encode("utf-8")
    _stop_at_end_of_turn(files, ids)
    return files, ids


def _stop_at_end_of_turn(files: dict[str, bytes], ids: dict[str, Any]) -> None:
    """Add the template's end-of-turn id to ``generation_config.json``'s ``eos_token_id`` (and
    ``ids``) where it is one token and not there yet, so ``generate`` ends a reply where the
    template ends it, as ``jaxnet sample --chat`` does."""
    from jaxnet.tokenizers import chat as chat_lib

    config = json.loads(files.get("tokenizer_config.json", b"{}"))
    source = files["chat_template.jinja"].decode("utf-8") if "chat_template.jinja" in files else None
    source = source or (config.get("chat_template") if isinstance(config.get("chat_template"), str) else None)
    if source is None or "tokenizer.json" not in files:
        return
    from tokenizers import Tokenizer

    tok = Tokenizer.from_str(files["tokenizer.json"].decode("utf-8"))
    named = {k: v if isinstance(v, str) else v.get("content") for k, v in config.items() if k in NAMED and v}
    named = {k: v for k, v in named.items() if isinstance(v, str)}  # a string, or an AddedToken's content
    encode = lambda text: tok.encode(text, add_special_tokens=False).ids
    turn = chat_lib.ChatTemplate(source, named, "the chat template").end_of_turn(encode)
    settings = json.loads(files["generation_config.json"])
    eos = settings.get("eos_token_id")
    eos = [] if eos is None else eos if isinstance(eos, list) else [eos]
    if len(turn) != 1 or turn[0] in eos:
        return
    settings["eos_token_id"] = ids["eos_token_id"] = [*eos, turn[0]]
    files["generation_config.json"] = _dumps(settings)


__all__ = ["CARRIED", "export_files", "gpt2_tokenizer_json"]

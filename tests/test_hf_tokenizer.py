"""--tokenizer hf:DIR and data.tokenizer=hf:DIR: a checkpoint directory's tokenizer.json read with
the tokenizers library, checked against transformers' own tokenizer of the same directory (ids on
fixed strings, the special tokens around a text, decoding), prepared into a corpus and trained on.

The directories are written here, offline: a byte-level BPE trained on local text with the
tokenizers library and saved as tokenizer.json + tokenizer_config.json by hand, a Llama 3-style
one saved by transformers' PreTrainedTokenizerFast (BOS added by its post-processor, several end
ids in generation_config.json) beside a random LlamaConfig, and a Llama 2-style one by
transformers' LlamaTokenizer (SentencePiece-style BPE with byte fallback)."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest

from jaxnet import cli, tokenizers
from jaxnet.data import prepare as prep
from jaxnet.data import text, tokens
from jaxnet.errors import UserError

transformers = pytest.importorskip("transformers", reason="the reference extra (transformers) is not installed")
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers  # noqa: E402

STRINGS = [
    "Hello world",
    "  leading spaces and\ttabs\n\nparagraphs\n",
    "Ünïcödé café — naïve résumé",
    "東京 and 北京, Москва, Αθήνα 🙂👍🏽",
    "numbers 1234567 and it's 3.14",
    "<|endoftext|> written as text",
    "",
]


def local_text() -> str:
    """About 300 KB of the shipped Shakespeare: the text the test tokenizers learn from."""
    return "".join(t for _, t in text.shakespeare_works()[:2])[:300_000]


def byte_level_bpe(special: list[str], size: int = 600) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=size, special_tokens=special, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator([local_text()], trainer)
    return tok


@pytest.fixture(scope="module")
def bpe_dir(tmp_path_factory):
    """A GPT-2-style tokenizer trained here and saved as a checkpoint's files, by hand."""
    d = tmp_path_factory.mktemp("bpe")
    byte_level_bpe(["<|endoftext|>"]).save(str(d / "tokenizer.json"))
    (d / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|endoftext|>", "bos_token": "<|endoftext|>"}))
    return d


@pytest.fixture(scope="module")
def llama3_dir(tmp_path_factory):
    """A Llama 3-style tokenizer saved by transformers beside a random LlamaConfig: BOS added by the
    post-processor, the base end-of-text in tokenizer_config.json and two more end ids in
    generation_config.json."""
    d = tmp_path_factory.mktemp("llama3")
    tok = byte_level_bpe(["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>", "<|eom_id|>"])
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A <|begin_of_text|> $B", special_tokens=[
            ("<|begin_of_text|>", bos)]
    )  # fmt: skip
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<|begin_of_text|>", eos_token="<|end_of_text|>"
    )
    fast.save_pretrained(d)
    ends = [tok.token_to_id(t) for t in ("<|end_of_text|>", "<|eom_id|>", "<|eot_id|>")]
    config = transformers.LlamaConfig(
        vocab_size=fast.vocab_size, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, bos_token_id=bos, eos_token_id=ends[0],
    )  # fmt: skip
    config.save_pretrained(d)
    transformers.GenerationConfig(bos_token_id=bos, eos_token_id=ends).save_pretrained(d)
    return d


@pytest.fixture(scope="module")
def llama2_dir(tmp_path_factory):
    """transformers' own LlamaTokenizer (Metaspace BPE with byte fallback, BOS added) over a
    vocabulary learned here."""
    d = tmp_path_factory.mktemp("llama2")
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=True)  # fast to learn
    trainer = trainers.BpeTrainer(vocab_size=500, special_tokens=["<unk>", "<s>", "</s>"])
    bpe.train_from_iterator([local_text()], trainer)
    learned = json.loads(bpe.to_str())["model"]
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2} | {f"<0x{b:02X}>": 3 + b for b in range(256)}
    for t, _ in sorted(learned["vocab"].items(), key=lambda kv: kv[1]):
        vocab.setdefault(t, len(vocab))
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in learned["merges"]]
    transformers.LlamaTokenizer(vocab=vocab, merges=merges, add_bos_token=True).save_pretrained(d)
    return d


@pytest.mark.parametrize("which", ["bpe_dir", "llama3_dir", "llama2_dir"])
def test_ids_equal_transformers_tokenizer_of_the_same_directory_and_decode_back(request, which):
    d = request.getfixturevalue(which)
    theirs = transformers.AutoTokenizer.from_pretrained(str(d))
    ours = tokenizers.get(f"hf:{d}")
    assert ours.name == f"hf:{d.resolve()}" and ours.vocab_size == len(theirs)
    ids = ours.encode_batch(STRINGS)
    for s, got in zip(STRINGS, ids, strict=True):
        plain = theirs(s, add_special_tokens=False)["input_ids"]
        assert got.tolist() == plain, s
        assert list(ours.added[0]) + plain + list(ours.added[1]) == theirs(s)["input_ids"], s
        assert ours.decode(got) == theirs.decode(plain), s
        if not (which == "llama2_dir" and s.startswith(" ")):  # SentencePiece-style decoding drops a leading space
            assert ours.decode(got) == s, s
    pieces = ours.pieces(STRINGS[3])
    assert pieces == theirs.convert_ids_to_tokens(theirs(STRINGS[3], add_special_tokens=False)["input_ids"])


def test_special_ids_come_from_the_directorys_files(bpe_dir, llama3_dir, llama2_dir):
    bpe = tokenizers.get(f"hf:{bpe_dir}")
    eot = bpe._tok.token_to_id("<|endoftext|>")
    assert (bpe.end_ids, bpe.eot_id, bpe.bos_id, bpe.before, bpe.after) == ((eot,), eot, eot, (), (eot,))
    assert not bpe.bos_prepended
    llama3 = tokenizers.get(f"hf:{llama3_dir}")
    gen = json.loads((llama3_dir / "generation_config.json").read_text())
    assert list(llama3.end_ids) == gen["eos_token_id"] and len(llama3.end_ids) == 3  # every end id, once
    bos = json.loads((llama3_dir / "config.json").read_text())["bos_token_id"]
    assert llama3.bos_id == bos and llama3.before == (bos,) and llama3.after == (llama3.end_ids[0],)
    assert llama3.bos_prepended and llama3.start_id({}) == bos
    llama2 = tokenizers.get(f"hf:{llama2_dir}")
    assert (llama2.bos_id, llama2.end_ids, llama2.before, llama2.after) == (1, (2,), (1,), (2,))


def test_a_corpus_prepared_with_it_holds_each_document_as_transformers_encodes_it(tmp_path, llama3_dir):
    src = tmp_path / "src"
    src.mkdir()
    docs = [s * 3 for s in STRINGS[:6]] + ["one more document, ending the set."]
    for i, d in enumerate(docs):
        (src / f"{i}.txt").write_text(d, encoding="utf-8")
    out = tmp_path / "corpus"
    kw = {"val_fraction": 0.15, "test_fraction": 0.15, "progress": False, "say": print}
    m = prep.prepare(str(src), f"hf:{llama3_dir}", out, **kw)
    tok = m["tokenizer"]
    assert tok["name"] == f"hf:{llama3_dir.resolve()}" and tok["bos_prepended"] is True
    sha = hashlib.sha256((llama3_dir / "tokenizer.json").read_bytes()).hexdigest()
    assert tok["files"] == {"tokenizer.json": sha}
    theirs = transformers.AutoTokenizer.from_pretrained(str(llama3_dir))
    split_of = prep.assign_splits(len(docs), 0.15, 0.15)
    for split in ("train", "val", "test"):
        want = []
        for s, d in zip(split_of, docs, strict=True):
            if s == split:  # transformers' ids with its BOS, then the end-of-text id
                want += theirs(d)["input_ids"] + [tok["eot_id"]]
        got = tokens.load(tokens_cfg(out).data)
        np.testing.assert_array_equal(getattr(got, split)[0 : len(getattr(got, split))], want)
    ds = tokens.load(tokens_cfg(out).data)
    assert ds.tokenizer == tok["name"] and ds.vocab == tokenizers.get(f"hf:{llama3_dir}").corpus_vocab()
    (llama3_dir / "tokenizer.json").write_text((llama3_dir / "tokenizer.json").read_text() + " ")
    try:
        with pytest.raises(UserError, match="has changed since the corpus was prepared"):
            tokens.load(tokens_cfg(out).data)
    finally:
        (llama3_dir / "tokenizer.json").write_text((llama3_dir / "tokenizer.json").read_text()[:-1])


def tokens_cfg(path):
    from jaxnet.config import Config, DataConfig

    cfg = Config()
    cfg.data = DataConfig(name="tokens", path=str(path), seq_len=8)
    return cfg


def test_a_text_file_with_data_tokenizer_hf_is_split_after_encoding_as_transformers_encodes_it(tmp_path, llama2_dir):
    body = "".join(STRINGS) * 20
    (tmp_path / "t.txt").write_text(body, encoding="utf-8")
    ds = text.load_file(str(tmp_path / "t.txt"), f"hf:{llama2_dir}")
    theirs = transformers.AutoTokenizer.from_pretrained(str(llama2_dir))
    whole = np.concatenate([ds.train, ds.val, ds.test])
    np.testing.assert_array_equal(whole, theirs(body, add_special_tokens=False)["input_ids"])
    assert ds.num_classes == len(theirs) and ds.decode(ds.val) == theirs.decode(ds.val.tolist())
    assert "perplexity" in ds.extra_metrics(1.0)


def test_prepared_and_trained_a_few_steps_then_sampled_with_the_same_tokenizer(tmp_path, bpe_dir, capsys):
    src = tmp_path / "src.jsonl"
    works = text.shakespeare_works()[:1][0][1][:60_000]
    src.write_text("".join(json.dumps({"text": works[i : i + 2000]}) + "\n" for i in range(0, len(works), 2000)))
    out = tmp_path / "corpus"
    assert cli.main(["prepare", str(src), "--tokenizer", f"hf:{bpe_dir}", "--out", str(out), "--quiet"]) == 0
    work = tmp_path / "run"
    args = ["train", "transformer_shakespeare:smoke", "data.name=tokens", f"data.path={out}", "train.steps=4",
            "optim.warmup_steps=1", "train.log_every=2", "train.eval_every=0", "train.checkpoint_every=4",
            "train.eval_tokens=256", "train.progress=false", "--workdir", str(work)]  # fmt: skip
    assert cli.main(args) == 0
    summary = json.loads((work / "summary.json").read_text())
    assert np.isfinite(summary["test"]["loss"]) and "perplexity" in summary["test"]
    saved = json.loads((work / "vocab.json").read_text())
    assert saved["tokenizer"] == f"hf:{bpe_dir.resolve()}" and len(saved["vocab"]) == 600
    capsys.readouterr()
    assert cli.main(["sample", "--workdir", str(work), "--prompt", "ROMEO:", "--tokens", "6", "--seed", "1"]) == 0
    sampled = capsys.readouterr().out
    assert sampled.startswith("ROMEO:") and len(sampled) > len("ROMEO:")


def test_a_checkpoint_whose_vocabulary_the_corpus_does_not_fit_is_refused(bpe_dir, llama3_dir):
    bpe = tokenizers.get(f"hf:{bpe_dir}").record()
    tokenizers.check_fits(bpe, 600, bpe_dir)  # the same file
    tokenizers.check_fits(bpe, 640)  # padded: fits
    with pytest.raises(UserError, match="has 600 ids, more than the model's 500"):
        tokenizers.check_fits(bpe, 500)
    with pytest.raises(UserError, match=r"prepared with another tokenizer than .*: its id \d+ is "):
        tokenizers.check_fits(bpe, 700, llama3_dir)
    with pytest.raises(UserError, match="its id 0 is"):
        tokenizers.check_fits(tokenizers.get("byte").record(), 700, llama3_dir)


def test_bad_tokenizer_directories_are_one_line_and_exit_2(tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    bare = tmp_path / "bare"  # no end-of-text token, nothing added before a text
    bare.mkdir()
    byte_level_bpe([], size=300).save(str(bare / "tokenizer.json"))
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "tokenizer.json").write_text("{not json")
    (tmp_path / "a.txt").write_text("some text\n" * 50)
    cases = {
        f"hf:{tmp_path / 'missing'}": "is not a directory",
        f"hf:{empty}": "has no tokenizer.json",
        f"hf:{broken}": "cannot be read by the tokenizers library",
        f"hf:{bare}": "documents would run together",
    }
    for i, (name, message) in enumerate(cases.items()):
        out = tmp_path / f"out{i}"
        assert cli.main(["prepare", str(tmp_path / "a.txt"), "--tokenizer", name, "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert message in err and err.startswith("jaxnet: error:") and err.count("\n") == 1, err
        assert not out.exists()


def test_two_worker_processes_write_the_shards_one_writes(tmp_path, monkeypatch, llama3_dir):
    src = tmp_path / "src.jsonl"
    src.write_text("".join(json.dumps({"text": f"document {i}: " + STRINGS[i % 6] * 3}) + "\n" for i in range(40)))
    monkeypatch.setattr(prep, "TASK_DOCS", 4)  # ten batches, over two processes
    kw = {"val_fraction": 0.1, "test_fraction": 0.1, "progress": False, "say": lambda _: None}
    prep.prepare(str(src), f"hf:{llama3_dir}", tmp_path / "one", workers=1, **kw)
    prep.prepare(str(src), f"hf:{llama3_dir}", tmp_path / "two", workers=2, **kw)
    names = sorted(p.name for p in (tmp_path / "one").iterdir())
    assert names == sorted(p.name for p in (tmp_path / "two").iterdir())
    for name in names:
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "two" / name).read_bytes(), name

"""GPT-2's tokenizer (jaxnet.tokenizers.gpt2) against a plain-Python byte-level BPE over the same
vocab.bpe / encoder.json, and against token ids known from GPT-2's own release; the one tokenizer
interface and its registry (jaxnet.tokenizers) against plain Python and tiktoken."""

import json

import numpy as np
import pytest
import regex

from jaxnet.data import text
from jaxnet.errors import UserError
from jaxnet.tokenizers import gpt2 as tokenizers

# GPT-2's pre-tokenization pattern as its release (encoder.py) writes it.
PATTERN = regex.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""")


def _bytes_to_unicode() -> dict[int, str]:
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    printable += list(range(ord("®"), ord("ÿ") + 1))
    out, extra = {}, 0
    for b in range(256):
        if b in printable:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return out


class ReferenceBPE:
    """The merge loop of byte-level BPE, written out: repeatedly merge the adjacent pair of lowest rank."""

    def __init__(self) -> None:
        files = tokenizers.gpt2_files()
        self.encoder = json.loads(files["encoder.json"].read_text(encoding="utf-8"))
        lines = files["vocab.bpe"].read_text(encoding="utf-8").split("\n")[1:]
        merges = [tuple(line.split()) for line in lines if line.strip()]
        self.ranks = {pair: i for i, pair in enumerate(merges)}
        self.byte_char = _bytes_to_unicode()

    def bpe(self, word: str) -> list[str]:
        parts = list(word)
        while len(parts) > 1:
            inf = float("inf")
            pairs = [(self.ranks.get((parts[i], parts[i + 1]), inf), i) for i in range(len(parts) - 1)]
            rank, i = min(pairs)
            if rank == float("inf"):
                break
            first, second = parts[i], parts[i + 1]
            merged, j = [], 0
            while j < len(parts):  # merge every occurrence of the pair, left to right
                if j < len(parts) - 1 and parts[j] == first and parts[j + 1] == second:
                    merged.append(first + second)
                    j += 2
                else:
                    merged.append(parts[j])
                    j += 1
            parts = merged
        return parts

    def encode(self, s: str) -> list[int]:
        ids = []
        for piece in PATTERN.findall(s):
            word = "".join(self.byte_char[b] for b in piece.encode("utf-8"))
            ids += [self.encoder[t] for t in self.bpe(word)]
        return ids


STRINGS = [
    "Hello world",
    "To be, or not to be: that is the question.\n\nWhether 'tis nobler in the mind",
    "naïve café — Ærøskøbing, 東京タワー, Привет мир! 🙂🙂 ½ + ¾ = 1¼",
    "   leading spaces and trailing   \n\t tabs\r\n",
    "numbers 1234567890 3.14159 and it's they're we've I'm you'll he'd",
    "code: def f(x):\n    return x**2  # square\n",
    "<|endoftext|> is plain text here",
]


@pytest.fixture(scope="module")
def reference() -> ReferenceBPE:
    return ReferenceBPE()


@pytest.mark.parametrize("s", STRINGS)
def test_gpt2_ids_equal_a_plain_python_bpe_over_the_same_files(reference, s):
    ids = tokenizers.encode(s)
    assert ids == reference.encode(s)
    assert tokenizers.decode(ids) == s


def test_gpt2_known_ids_vocabulary_and_end_of_text():
    assert tokenizers.encode("Hello world") == [15496, 995]
    assert tokenizers.encode(" the") == [262]
    assert tokenizers.encode("<|endoftext|>", allow_eot=True) == [tokenizers.EOT_ID] == [50256]
    assert 50256 not in tokenizers.encode("<|endoftext|>")  # ordinary text unless allowed
    vocab = tokenizers.gpt2_vocab()
    assert len(vocab) == 50257 and vocab[50256] == "<|endoftext|>" and vocab[262] == "Ġthe"
    assert tokenizers.file_hashes() == tokenizers.FILE_SHA256
    assert tokenizers.decode([15496, 995, 50300]) == "Hello world"  # padding ids beyond GPT-2's are skipped


def test_data_tokenizer_gpt2_splits_a_text_file_and_decodes_it(tmp_path):
    body = "The quick brown fox jumps over the lazy dog. Ünïcödé ✓\n" * 40
    (tmp_path / "t.txt").write_text(body, encoding="utf-8")
    ds = text.load_file(str(tmp_path / "t.txt"), "gpt2")
    assert ds.num_classes == 50257 and ds.tokenizer == "gpt2"
    whole = np.concatenate([ds.train, ds.val, ds.test])
    np.testing.assert_array_equal(whole, tokenizers.encode(body))
    assert ds.decode(ds.train[:9]) == "The quick brown fox jumps over the lazy dog"
    np.testing.assert_array_equal(ds.encode("Hello world"), [15496, 995])
    assert "perplexity" in ds.extra_metrics(1.0)


# ---------------------------------------------------------------------------------------------
# The one interface


def test_gpt2s_ranks_from_encoder_json_equal_tiktokens_from_both_files():
    from tiktoken.load import data_gym_to_mergeable_bpe_ranks

    from jaxnet.tokenizers import gpt2

    files = {name: str(path) for name, path in gpt2.gpt2_files().items()}
    theirs = data_gym_to_mergeable_bpe_ranks(files["vocab.bpe"], files["encoder.json"])
    ours = gpt2.mergeable_ranks()
    assert ours == theirs and len(ours) == gpt2.VOCAB_SIZE - 1 and ours[b" the"] == 262


def test_each_tokenizer_encodes_documents_as_plain_python_and_tiktoken_do():
    import tiktoken  # noqa: F401 - the reference below is tiktoken's own batch encoder

    from jaxnet import tokenizers as registry

    docs = ["Hello world", "Ünïcödé café — 東京 🙂\n\nnext", "<|endoftext|> is text here", "", "a\ud800b"]
    enc = tokenizers.gpt2_encoding()
    ours = registry.get("gpt2").encode_batch(docs, np.uint16)
    assert [a.tolist() for a in ours] == enc.encode_ordinary_batch(docs) and ours[0].dtype == np.uint16
    char = registry.get("char").fit(docs[:3])
    chars = sorted(set("".join(docs[:3])))
    assert char.corpus_vocab() == [*chars, "<|endoftext|>"] and char.before == (len(chars),)
    assert [a.tolist() for a in char.encode_batch(docs[:3])] == [[chars.index(c) for c in d] for d in docs[:3]]
    byte = registry.get("byte")
    assert [a.tolist() for a in byte.encode_batch(docs[:2])] == [list(d.encode()) for d in docs[:2]]
    with pytest.raises(UserError, match="not in this"):
        char.encode_batch(["z"])


def test_the_choices_are_written_once_and_the_schema_and_the_command_line_read_them(capsys):
    import dataclasses

    from jaxnet import cli, config
    from jaxnet import tokenizers as registry

    assert registry.CHOICES == ("char", "word", "byte", "gpt2", "hf:DIR")
    assert registry.PREPARE_CHOICES == ("char", "byte", "gpt2", "hf:DIR")  # words are learned in memory only
    field = {f.name: f for f in dataclasses.fields(config.DataConfig)}["tokenizer"]
    assert field.metadata["choices"] == ("", *registry.CHOICES)
    for good in ("gpt2", "hf:checkpoints/llama", ""):
        config.apply_overrides(config.load_experiment("transformer_shakespeare:smoke"), [f"data.tokenizer={good}"])
    for bad in ("hf:", "hf", "sentencepiece", "gpt2:x"):
        with pytest.raises(UserError, match="is not one of: , char, word, byte, gpt2, hf:DIR"):
            smoke = config.load_experiment("transformer_shakespeare:smoke")
            config.validate(config.apply_overrides(smoke, [f"data.tokenizer={bad}"]))
    assert cli.main(["prepare", "shakespeare", "--tokenizer", "word", "--out", "/nonexistent/x"]) == 2
    err = capsys.readouterr().err
    assert "--tokenizer='word' is not one of: char, byte, gpt2, hf:DIR" in err and err.count("\n") == 1
    with pytest.raises(SystemExit):
        cli.main(["prepare", "--help"])
    assert "char, byte, gpt2, hf:DIR" in capsys.readouterr().out.replace("\n", " ").replace("  ", " ")


def test_no_module_outside_the_tokenizers_tests_a_tokenizer_by_name():
    """Tokenizer-specific behaviour lives in jaxnet/tokenizers: nowhere else is a tokenizer's name
    compared (``x == "gpt2"``, ``x in ("word", ...)``) or used as a key of behaviour."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "jaxnet"
    names = {"char", "word", "byte", "gpt2"}
    found = []
    for path in sorted(root.rglob("*.py")):
        if "tokenizers" in path.relative_to(root).parts[:1]:
            continue
        source = path.read_text()
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Compare):
                operands = [node.left, *node.comparators]
                groups = [c for c in node.comparators if isinstance(c, ast.Tuple | ast.Set | ast.List)]
                operands += [e for c in groups for e in c.elts]
                named = any(isinstance(c, ast.Constant) and c.value in names for c in operands)
                if named and "tokenizer" in (ast.get_source_segment(source, node) or ""):
                    found.append(f"{path.relative_to(root)}:{node.lineno}")
            keys = [k for k in getattr(node, "keys", ()) if isinstance(k, ast.Constant) and k.value in names]
            if isinstance(node, ast.Dict) and len(keys) > 1:
                found.append(f"{path.relative_to(root)}:{node.lineno}")
    assert found == []

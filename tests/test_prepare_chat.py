"""``jaxnet prepare chat``: conversations into a chat corpus (token, mask and length shards beside
corpus.json), read back by data.name=tokens as packed rows, trained on and resumed exactly; bad
input as one line, exit 2, nothing written.

The checkpoint directories and conversations are made here (tests/chat_corpora.py); the stored
ids and assistant masks are checked against transformers' apply_chat_template where it is
installed."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from chat_corpora import CHATML, CHATML_PLAIN, checkpoint, conversations, write_jsonl
from conftest import said

from jaxnet import cli, config, tokenizers
from jaxnet.data import chat, shards, tokens
from jaxnet.errors import UserError
from jaxnet.tokenizers import chat as chat_template


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> dict[str, Path]:
    """Checkpoints (a marked and a plain ChatML template), conversation files and a corpus."""
    root = tmp_path_factory.mktemp("chat")
    paths = {
        "marked": checkpoint(root / "marked", CHATML),
        "plain": checkpoint(root / "plain", CHATML_PLAIN),
        "train": write_jsonl(root / "train.jsonl", conversations(120, seed=0)),
        "val": write_jsonl(root / "val.jsonl", conversations(12, seed=1)),
        "test": write_jsonl(root / "test.jsonl", conversations(8, seed=2)),
    }
    paths["corpus"] = root / "corpus"
    args = ["prepare", "chat", str(paths["train"]), "--tokenizer", f"hf:{paths['plain']}", "--out",
            str(paths["corpus"]), "--val", str(paths["val"]), "--test", str(paths["test"]), "--quiet",
            "--seq-lens", "64,128"]  # fmt: skip
    assert cli.main(args) == 0
    return paths


def stored(corpus: Path, split: str) -> list[tuple[list[int], list[int]]]:
    """Each conversation of a split as the corpus holds it: its ids and its assistant mask."""
    manifest = json.loads((corpus / "corpus.json").read_text())
    out = []
    for x in manifest["splits"][split]["shards"]:
        ids = shards.ShardedTokens([shards.open_shard(corpus / x["file"])])[:]
        mask = np.fromfile(corpus / x["mask"]["file"], np.uint8)
        ends = np.cumsum(np.fromfile(corpus / x["lengths"]["file"], "<u4"))
        pairs = zip(np.split(ids, ends[:-1]), np.split(mask, ends[:-1]), strict=True)
        out += [(a.tolist(), m.tolist()) for a, m in pairs]
    return out


def test_a_chat_corpus_holds_the_ids_and_assistant_masks_of_apply_chat_template(made):
    transformers = pytest.importorskip("transformers", reason="the reference extra (transformers) is not installed")
    marked = transformers.AutoTokenizer.from_pretrained(str(made["marked"]))  # the same tokenizer, marked template
    for split, seed, count in (("train", 0, 120), ("val", 1, 12)):
        held = stored(made["corpus"], split)
        assert len(held) == count
        for (ids, mask), messages in zip(held, conversations(count, seed=seed), strict=True):
            want = marked.apply_chat_template(messages, return_dict=True, return_assistant_tokens_mask=True)
            assert ids == want["input_ids"] and mask == want["assistant_masks"]


def test_corpus_json_says_it_is_a_chat_corpus_with_its_template_and_counts(made):
    m = json.loads((made["corpus"] / "corpus.json").read_text())
    assert m["kind"] == "chat" and m["format"] == "jaxnet-corpus/1"
    assert m["chat"]["template"] == CHATML_PLAIN and m["chat"]["assistant_tokens"] == "prefixes"
    assert m["chat"]["template_sha256"] == chat_template.load(made["plain"]).sha256
    held = stored(made["corpus"], "train")
    assert m["splits"]["train"]["tokens"] == sum(len(i) for i, _ in held)
    assert m["splits"]["train"]["trained_tokens"] == sum(sum(k) for _, k in held)
    assert m["splits"]["train"]["documents"] == 120 and m["splits"]["train"]["untrained_conversations"] == 0
    assert [r["seq_len"] for r in m["chat"]["packing"]] == [64, 128]
    assert m["tokenizer"]["files"]["tokenizer.json"] == tokenizers.get(f"hf:{made['plain']}").sha256


def cfg_for(corpus: Path, **data) -> config.Config:
    cfg = config.Config()
    cfg.data.name, cfg.data.path, cfg.data.seq_len = "tokens", str(corpus), 64
    for k, v in data.items():
        setattr(cfg.data, k, v)
    cfg.train.batch_size, cfg.train.eval_batch_size = 4, 3
    return cfg


def test_packed_batches_are_a_pure_function_of_the_step_and_each_process_reads_its_rows(made):
    cfg = cfg_for(made["corpus"])
    ds = tokens.load(cfg.data)
    ds.check(cfg)
    assert "packed into" in ds.describe() and "padding" in ds.describe()
    run = ds.train_batches(cfg, 0)
    batches = [next(run) for _ in range(6)]
    again = next(ds.train_batches(cfg, 4))
    for k in ("tokens", "targets", "mask", "segments", "positions"):
        np.testing.assert_array_equal(again[k], batches[4][k])
        np.testing.assert_array_equal(next(ds.train_batches(cfg, 4, slice(1, 3)))[k], batches[4][k][1:3])
    b = batches[0]
    assert b["tokens"].shape == b["segments"].shape == (4, 64)
    assert set(np.unique(b["mask"])) <= {0.0, 1.0} and np.all(b["mask"][b["segments"] == 0] == 0)
    # positions restart at each example: 0 wherever the segment changes to a new example
    starts = (b["segments"] > 0) & (np.diff(b["segments"], prepend=0) != 0)
    assert np.all(b["positions"][starts] == 0)


def test_evaluation_counts_exactly_the_assistants_tokens(made):
    cfg = cfg_for(made["corpus"])
    ds = tokens.load(cfg.data)
    cfg.data.seq_len = int(ds.example_lengths("val").max())  # every conversation fits a row
    assert ds.packing(cfg, "val").dropped == 0
    rows = ds.eval_rows(cfg, "val")
    batches = list(ds.eval_batches(cfg, "val", rows))
    m = json.loads((made["corpus"] / "corpus.json").read_text())
    # every conversation starts with <|im_start|>, never the assistant's: each trained token is a target once
    assert sum(float(b["mask"].sum()) for b in batches) == m["splits"]["val"]["trained_tokens"]
    assert sum(len(np.unique(b["segments"][b["segments"] > 0])) for b in [{"segments": s} for s in
               (row for b in batches for row in b["segments"])]) == 12  # fmt: skip


def test_a_chat_corpus_is_never_cut_into_windows(made):
    cfg = cfg_for(made["corpus"], batching="windows")
    with pytest.raises(UserError, match="is a chat corpus, trained on whole conversations"):
        tokens.load(cfg.data).check(cfg)


def test_prompt_completion_rows_and_parquet_files(tmp_path, made):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    rows = [{"prompt": "hello how are you", "completion": "fine thank you"}] * 3
    rows.append({"prompt": [{"role": "user", "content": "weather today"}],
                 "completion": [{"role": "assistant", "content": "sunny"}]})  # fmt: skip
    rows.append({"messages": [{"role": "user", "content": "a question nobody answers"}]})  # context only
    assert chat.messages_of(rows[0], "x") == [
        {"role": "user", "content": "hello how are you"}, {"role": "assistant", "content": "fine thank you"}
    ]  # fmt: skip
    table = pa.table({"messages": [m for m in conversations(6, seed=3)]})
    pq.write_table(table, tmp_path / "chats.parquet", row_group_size=4)
    write_jsonl(tmp_path / "pc.jsonl", rows)
    out = tmp_path / "out"
    files = [str(tmp_path / "chats.parquet"), str(tmp_path / "pc.jsonl")]
    quiet = dict(progress=False, say=lambda *_: None)
    m = chat.prepare_chat(files, f"hf:{made['plain']}", out, val=str(made["val"]), test=str(made["test"]), **quiet)
    assert m["splits"]["train"]["documents"] == 11 and m["splits"]["train"]["untrained_conversations"] == 1
    tmpl, tok = chat_template.load(made["plain"]), tokenizers.get(f"hf:{made['plain']}")
    expected = [tmpl.encode(c, tok) for c in [*conversations(6, seed=3), *(chat.messages_of(r, "") for r in rows)]]
    held = stored(out, "train")
    assert [h[0] for h in held] == [e[0].tolist() for e in expected]
    assert [h[1] for h in held] == [e[1].tolist() for e in expected]


def test_two_workers_write_the_same_corpus_as_one(tmp_path, made):
    for workers in (1, 2):
        chat.prepare_chat([str(made["train"])], f"hf:{made['plain']}", tmp_path / str(workers), workers=workers,
                          shard_tokens=2000, progress=False, say=lambda *_: None)  # fmt: skip
    files = sorted(p.name for p in (tmp_path / "1").iterdir())
    assert len(files) > 10 and files == sorted(p.name for p in (tmp_path / "2").iterdir())
    for name in files:
        if name != "corpus.json":
            assert (tmp_path / "1" / name).read_bytes() == (tmp_path / "2" / name).read_bytes(), name


def test_a_chat_worker_imports_nothing_of_jax_and_renders_as_this_process(made):
    """A prepare chat worker starts from jaxnet.tokenizers alone (under jaxnet.data it imported JAX:
    0.6 s of every worker start) and renders and tokenizes as this process does."""
    from test_prepare import WORKER_STATE

    from jaxnet.tokenizers import workers

    tok = tokenizers.get(f"hf:{made['plain']}", "--tokenizer")
    template = chat_template.load(tok.directory)
    rows = [(f"train.jsonl:{i + 1}", m) for i, m in enumerate(conversations(3, seed=5))]
    initargs = (tok, template.source, template.variables, template.origin)
    with workers.worker_pool(1, chat_template.worker_init, initargs) as pool:
        assert pool.submit(eval, WORKER_STATE).result(timeout=60) == ([], "1")
        there = pool.submit(chat_template.worker_encode, rows, np.dtype(np.uint32)).result(timeout=60)
    here = chat_template.encode_conversations(tok, template, rows, np.uint32)
    assert [a.tolist() for a in there] == [a.tolist() for a in here] and there[1].sum() > 0


def test_bad_input_is_one_line_exit_2_and_nothing_written(tmp_path, made, capsys):
    bare = checkpoint(tmp_path / "bare", template=None)
    empty_marks = checkpoint(tmp_path / "empty_marks", CHATML.replace("message['content'] + '<|im_end|>'", "''"))
    good = str(made["train"])
    files = {
        "no_assistant.jsonl": [[{"role": "user", "content": "hi"}]] * 3,
        "unknown_role.jsonl": [[{"role": "user", "content": "hi"}, {"role": "bot", "content": "yo"}]],
        "wrong_type.jsonl": [{"messages": "hello"}],
        "no_messages.jsonl": [{"text": "hello"}],
        "content.jsonl": [[{"role": "user", "content": ["hi"]}, {"role": "assistant", "content": "yo"}]],
    }
    for name, rows in files.items():
        write_jsonl(tmp_path / name, rows)
    (tmp_path / "malformed.jsonl").write_text(
        json.dumps({"messages": conversations(1)[0]}) + "\n\n" + '{"messages": [\n', encoding="utf-8"
    )
    (tmp_path / "pretty.jsonl").write_text(json.dumps({"messages": conversations(1)[0]}, indent=2), encoding="utf-8")
    plain = f"hf:{made['plain']}"
    cases = {
        "has no chat template": [good, "--tokenizer", f"hf:{bare}"],
        "has no assistant turn in any of its 3": [str(tmp_path / "no_assistant.jsonl"), "--tokenizer", plain],
        "unknown_role.jsonl:1: message 2 has role 'bot'": [str(tmp_path / "unknown_role.jsonl"), "--tokenizer", plain],
        "wrong_type.jsonl:1: messages must be a list": [str(tmp_path / "wrong_type.jsonl"), "--tokenizer", plain],
        "has neither messages nor prompt and completion": [str(tmp_path / "no_messages.jsonl"), "--tokenizer", plain],
        "message 1's content is a list": [str(tmp_path / "content.jsonl"), "--tokenizer", plain],
        "malformed.jsonl:3 is not a line of JSON: Expecting value at column 15; fix that line, or leave such lines "
        "out with --skip-corrupt": [str(tmp_path / "malformed.jsonl"), "--tokenizer", plain],
        "pretty.jsonl:1 is not a line of JSON: Expecting property name enclosed in double quotes at column 2; the file "
        "looks like one JSON value written over several lines": [str(tmp_path / "pretty.jsonl"), "--tokenizer", plain],
        "needs --tokenizer hf:DIR": [good, "--tokenizer", "gpt2"],
        "names no conversations": [str(tmp_path / "missing*.jsonl"), "--tokenizer", plain],
        "marks no token of the training conversations": [good, "--tokenizer", f"hf:{empty_marks}"],
        "no assistant turn": [good, "--tokenizer", plain, "--val", str(tmp_path / "no_assistant.jsonl")],
    }
    for i, (message, args) in enumerate(cases.items()):
        out = tmp_path / f"out{i}"
        assert cli.main(["prepare", "chat", *args, "--out", str(out), "--quiet"]) == 2, message
        err = capsys.readouterr().err.strip()
        assert message in err and err.startswith("jaxnet: error:") and "\n" not in err, err
        assert not out.exists(), message
    assert cli.main(["prepare", good, "--val", good, "--out", str(tmp_path / "plain")]) == 2
    assert "are for jaxnet prepare chat" in capsys.readouterr().err


def test_skip_corrupt_leaves_malformed_lines_out_counts_them_and_writes_the_clean_files_corpus(tmp_path, made, capsys):
    good = conversations(30, seed=4)
    lines = [json.dumps({"messages": c}) for c in good]
    lines[3:3] = ['{"messages": [', '{"messages": "hello"}']  # not JSON; a messages that is no list
    lines.append('{"prompt": "hi"}')  # neither messages nor prompt and completion
    (tmp_path / "dirty.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    clean = write_jsonl(tmp_path / "clean.jsonl", good)
    held = ["--val", str(made["val"]), "--test", str(made["test"]), "--tokenizer", f"hf:{made['plain']}"]
    common = [*held, "--workers", "1", "--quiet"]
    dirty = ["prepare", "chat", str(tmp_path / "dirty.jsonl"), *common, "--skip-corrupt"]
    out = said([*dirty, "--out", str(tmp_path / "a")], capsys)
    assert out.startswith(
        f"skipped 3 malformed conversations ({tmp_path / 'dirty.jsonl'}:4: not JSON (Expecting value at column 15); "
    ), out
    assert cli.main(["prepare", "chat", str(clean), *common, "--out", str(tmp_path / "b")]) == 0
    for name in sorted(p.name for p in (tmp_path / "b").iterdir() if p.name != "corpus.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    manifest = json.loads((tmp_path / "a" / "corpus.json").read_text())
    assert manifest["settings"]["skipped"] == 3 and manifest["settings"]["conversations"] == 30


def test_a_chat_corpus_trains_from_the_command_line_and_resumes_exactly(tmp_path, made, capsys):
    base = ["train", "gpt2_shakespeare:smoke", f"data.path={made['corpus']}", "data.vocab_size=0", "data.seq_len=128",
            "train.steps=6", "train.eval_every=3", "train.checkpoint_every=3", "train.log_every=1"]  # fmt: skip
    assert cli.main([*base, "--workdir", str(tmp_path / "whole")]) == 0
    first_line = capsys.readouterr().out.splitlines()[0]
    assert "chat" in first_line and "packed into" in first_line and "padding" in first_line
    assert cli.main([*base, "train.stop_after=4", "--workdir", str(tmp_path / "resumed")]) == 0
    assert cli.main([*base, "--workdir", str(tmp_path / "resumed")]) == 0
    logs = {}
    for name in ("whole", "resumed"):
        records = [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
        logs[name] = {(r["step"], r["split"]): r["loss"] for r in records if "loss" in r}
    assert logs["whole"] == logs["resumed"]
    assert logs["whole"][(6, "train")] < logs["whole"][(1, "train")]


def test_plain_corpora_pack_their_documents_on_request(tmp_path):
    docs = ["first little document. " * 3, "a second one", "and the third document is the longest of them all. " * 4]
    source = tmp_path / "docs.jsonl"
    source.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs * 10))
    out = tmp_path / "corpus"
    from jaxnet.data import prepare

    prepare.prepare(str(source), "byte", out, workers=1, progress=False, say=lambda *_: None)
    cfg = cfg_for(out, batching="packed", seq_len=256, overlong="truncate")
    ds = tokens.load(cfg.data)
    lengths = ds.example_lengths("train")
    assert sorted(set(lengths.tolist())) <= sorted({len(d.encode()) + 1 for d in docs})  # the end-of-text id first
    assert lengths.sum() == len(ds.train)
    ds.check(cfg)
    b = next(ds.train_batches(cfg, 0))
    for row in range(4):
        for seg in np.unique(b["segments"][row][b["segments"][row] > 0]):
            where = b["segments"][row] == seg
            assert b["tokens"][row][where][0] == 256  # each example is one document from its start
            assert b["positions"][row][where].tolist() == list(range(where.sum()))
    assert np.array_equal(b["mask"] > 0, b["segments"] > 0)
    overrides = ["data.name=shakespeare", "data.batching=packed", "model.name=transformer", "data.seq_len=8"]
    with pytest.raises(UserError, match="data.batching=packed packs a prepared corpus"):
        config.validate(config.apply_overrides(config.Config(), overrides))


def test_the_plan_says_which_attention_kernel_packed_rows_compile_to(made):
    """cuDNN's fused attention, the segment mask going in as a bias (unpacked rows: tests/test_plan.py)."""
    from jaxnet import planner

    if planner.plugin_missing() is not None:
        pytest.skip(f"the CUDA plugin wheels are not installed: {planner.INSTALL}")
    base = ["data.vocab_size=0", "data.seq_len=64", "train.batch_size=4"]
    packed = planner.plan(config.load_experiment("gpt2_shakespeare:smoke", [f"data.path={made['corpus']}", *base]))
    a = packed["attention"]
    assert (a["kernel"], a["bias"], a["packed"], a["mask_type"]) == ("cudnn", True, True, ["CAUSAL"])
    assert a["cudnn_calls"] == ["__cudnn$fmhaScaleBiasSoftmax", "__cudnn$fmhaScaleBiasSoftmaxBackward"]
    assert "  attention: cuDNN's fused attention (fmhaScaleBiasSoftmax" in planner.describe(packed)


def test_a_gpt2_checkpoint_evaluated_on_a_chat_corpus_gives_transformers_loss_over_the_assistants_tokens(
    tmp_path, capsys
):
    """A random GPT-2 saved by transformers with this tokenizer and a ChatML template beside it: one
    step at learning rate 0 leaves it as it was, and the run's validation loss is transformers' mean
    cross-entropy over the assistant's tokens of the validation conversations, each run alone; so
    is `jaxnet eval --workdir hf:PATH` of the checkpoint before any training."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from test_hf_gpt2 import save_gpt2

    source = save_gpt2(tmp_path / "gpt2", n_layer=2, n_embd=32, n_head=4, n_positions=256, vocab_size=400)
    checkpoint(source, CHATML)  # the tokenizer's files and the template, beside the weights
    files = {s: write_jsonl(tmp_path / f"{s}.jsonl", conversations(n, seed=i)) for i, (s, n) in
             enumerate((("train", 40), ("val", 6), ("test", 4)))}  # fmt: skip
    corpus = tmp_path / "corpus"
    quiet = dict(progress=False, say=lambda *_: None)
    chat.prepare_chat([str(files["train"])], f"hf:{source}", corpus, val=str(files["val"]), test=str(files["test"]),
                      **quiet)  # fmt: skip
    run = tmp_path / "run"
    argv = ["train", "gpt2_finetune:smoke", f"train.init_from=hf:{source}", "data.name=tokens", f"data.path={corpus}",
            "data.tokenizer=", "data.seq_len=256", "optim.lr=0", "optim.warmup_steps=0", "train.steps=1",
            "train.eval_every=1", "--workdir", str(run)]  # fmt: skip
    assert cli.main(argv) == 0
    val_loss = json.loads((run / "summary.json").read_text())["val"]["loss"]
    model = transformers.GPT2LMHeadModel.from_pretrained(source).eval()
    total, count = 0.0, 0
    for ids, mask in stored(corpus, "val"):
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0, :-1].double()
        losses = torch.nn.functional.cross_entropy(logits, torch.tensor(ids[1:]), reduction="none").numpy()
        total += float((losses * np.asarray(mask[1:])).sum())
        count += int(np.sum(mask[1:]))
    assert count > 100
    assert val_loss == pytest.approx(total / count, rel=1e-5)
    # the checkpoint before any training, evaluated from the command line: the same number
    capsys.readouterr()
    evaluated = ["eval", "--workdir", f"hf:{source}", "--split", "val", f"data.path={corpus}", "data.seq_len=256"]
    assert cli.main(evaluated) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (result["step"], result["split"]) == (0, "val")
    assert result["loss"] == pytest.approx(total / count, rel=1e-5)
    assert cli.main(["eval", "--workdir", f"hf:{source}"]) == 2
    assert "needs data.path=DIR" in capsys.readouterr().err


def test_a_killed_prepare_continues_where_it_stopped(tmp_path, made, monkeypatch):
    quiet = dict(progress=False, say=lambda *_: None, shard_tokens=1500)
    chat.prepare_chat([str(made["train"])], f"hf:{made['plain']}", tmp_path / "whole", **quiet)
    monkeypatch.setattr(chat, "TASK_CONVERSATIONS", 10)
    real, calls = chat.chat_lib.encode_conversations, []

    def dies(*args, **kw):
        calls.append(1)
        if len(calls) == 7:
            raise KeyboardInterrupt
        return real(*args, **kw)

    monkeypatch.setattr(chat.chat_lib, "encode_conversations", dies)
    with pytest.raises(KeyboardInterrupt):
        chat.prepare_chat([str(made["train"])], f"hf:{made['plain']}", tmp_path / "killed", **quiet)
    progress = json.loads((tmp_path / "killed" / chat.PROGRESS).read_text())
    done = sum(progress["splits"][s]["done"] for s in ("train", "val", "test"))
    assert 0 < done < 60 and not (tmp_path / "killed" / "corpus.json").exists()
    monkeypatch.setattr(chat.chat_lib, "encode_conversations", real)
    chat.prepare_chat([str(made["train"])], f"hf:{made['plain']}", tmp_path / "killed", **quiet)
    whole = sorted(p.name for p in (tmp_path / "whole").iterdir())
    assert whole == sorted(p.name for p in (tmp_path / "killed").iterdir())
    for name in whole:
        if name != "corpus.json":
            assert (tmp_path / "whole" / name).read_bytes() == (tmp_path / "killed" / name).read_bytes(), name
    a, b = (json.loads((tmp_path / d / "corpus.json").read_text()) for d in ("whole", "killed"))
    assert a["splits"] == b["splits"]

"""Preference tuning: ``jaxnet prepare preference`` and ``train.objective=dpo|simpo``, against TRL's
``DPOTrainer`` and plain transformers (test-time only).

The checkpoint is test_chat_finetune's random ``LlamaForCausalLM`` (a byte-level BPE with BOS before a
text, a Llama-3-style template without generation blocks). Pairs are drawn from a fixed seed, the
chosen reply always opening with "the", so a model can learn to prefer it in a few steps; every pair
fits a row of 128 tokens. The policy of the parity tests is the checkpoint with its weights moved a
little (saved beside it), the reference the checkpoint itself.
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
from pathlib import Path

import numpy as np
import pytest
from chat_corpora import WORDS
from conftest import fails, said
from test_chat_finetune import transformers_parts, write_chat_llama
from test_prepare_chat import stored

from jaxnet import preference

LN2 = math.log(2.0)
REWARDS = ("rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies")


def pairs(count: int, seed: int, conversational: bool) -> list[dict]:
    """``count`` pairs in TRL's conversational or plain-text shape; the chosen reply opens with "the"."""
    r = random.Random(seed)
    words = lambda n: " ".join(r.choice(WORDS) for _ in range(n))  # noqa: E731
    out = []
    for _ in range(count):
        prompt, chosen, rejected = words(r.randint(2, 6)), "the " + words(r.randint(1, 4)), words(r.randint(1, 5))
        if conversational:
            reply = lambda text: [{"role": "assistant", "content": text}]  # noqa: E731
            out.append({"prompt": [{"role": "user", "content": prompt}], "chosen": reply(chosen),
                        "rejected": reply(rejected)})  # fmt: skip
        else:
            out.append({"prompt": prompt, "chosen": " " + chosen, "rejected": " " + rejected})
    return out


def write(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def chat_llama(tmp_path_factory) -> Path:
    return write_chat_llama(tmp_path_factory.mktemp("chat-llama") / "llama")


@pytest.fixture(scope="module")
def policy(chat_llama, tmp_path_factory) -> Path:
    """The checkpoint with every weight moved by N(0, 0.05): a model that differs from the reference."""
    torch, _, model = transformers_parts(chat_llama)
    directory = tmp_path_factory.mktemp("policy") / "llama"
    shutil.copytree(chat_llama, directory)
    torch.manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    model.save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def corpora(chat_llama, tmp_path_factory) -> dict[str, Path]:
    """A corpus of each shape (48 training pairs, 16 validation, 8 test) and its files."""
    from jaxnet.data.preference import prepare_preference

    root = tmp_path_factory.mktemp("pairs")
    out = {}
    for shape, conversational in (("conversational", True), ("text", False)):
        files = {s: write(root / f"{shape}-{s}.jsonl", pairs(n, i, conversational))
                 for i, (s, n) in enumerate((("train", 48), ("val", 16), ("test", 8)))}  # fmt: skip
        out[shape] = root / shape
        prepare_preference([str(files["train"])], f"hf:{chat_llama}", out[shape], val=str(files["val"]),
                           test=str(files["test"]), progress=False, say=lambda *_: None)  # fmt: skip
        out[f"{shape}-val"] = files["val"]
    return out


def evaluated(corpus: Path, reference: Path, policy: Path) -> tuple[dict[str, float], dict[str, float]]:
    """jaxnet's DPO metrics of the validation pairs for a run from ``reference`` (its frozen copy the
    reference model): at the start, and with the parameters of ``policy``."""
    import dataclasses

    from jaxnet import config as config_lib
    from jaxnet.config import Config
    from jaxnet.models import TransformerConfig
    from jaxnet.train import init_from
    from jaxnet.train.loop import Run

    cfg = Config()
    cfg.model = TransformerConfig()
    cfg.data.name = "tokens"
    overrides = [
        f"data.path={corpus}",
        "data.seq_len=128",
        f"train.init_from=hf:{reference}",
        "train.eval_batch_size=16",
    ]
    cfg = init_from.with_hf_shape(config_lib.apply_overrides(cfg, overrides))
    run = Run(cfg)
    state = run.init_state(init_from.load(cfg, run, Path(os.devnull)))
    start = run.evaluate(state, "val")
    moved = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, init_from=f"hf:{policy}"))
    state = state.replace(params=run.init_state(init_from.load(moved, run, Path(os.devnull))).params)
    return start, run.evaluate(state, "val")


@pytest.mark.parametrize("shape", ["conversational", "text"])
def test_dpo_loss_and_rewards_equal_trls_dpo_trainer_on_a_batch(chat_llama, policy, corpora, shape):
    """TRL 1.16's DPOTrainer (sigmoid loss, beta 0.1, float32) on the validation pairs as one batch:
    the same sequences and reply masks as the corpus holds, and the same loss, rewards and log-probabilities."""
    pytest.importorskip("trl", reason="the reference extra (trl) is not installed")
    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer

    torch, tok, model = transformers_parts(policy)
    _, _, reference = transformers_parts(chat_llama)
    tok.pad_token = tok.eos_token
    rows = [json.loads(line) for line in corpora[f"{shape}-val"].read_text().splitlines()]
    args = DPOConfig(output_dir=str(corpora[shape] / "trl"), beta=0.1, bf16=False, use_cpu=True, report_to=[])
    trainer = DPOTrainer(model=model, ref_model=reference, args=args, train_dataset=Dataset.from_list(rows),
                         processing_class=tok)  # fmt: skip
    examples = [trainer.train_dataset[i] for i in range(len(rows))]
    held = stored(corpora[shape], "val")
    for k, example in enumerate(examples):  # pair k: sequences 2k (chosen) and 2k + 1 (rejected)
        for j, reply in ((0, "chosen_ids"), (1, "rejected_ids")):
            ids, mask = held[2 * k + j]
            assert ids == example["prompt_ids"] + example[reply]
            assert mask == [0] * len(example["prompt_ids"]) + [1] * len(example[reply])
    with torch.no_grad():
        loss = float(trainer.compute_loss(model, trainer.data_collator(examples)))
    theirs = {k: v[-1] for k, v in trainer._metrics["eval" if not model.training else "train"].items()}
    start, ours = evaluated(corpora[shape], chat_llama, policy)
    assert start["loss"] == pytest.approx(LN2, abs=1e-6) and all(start[k] == 0 for k in REWARDS)  # step 0
    assert abs(theirs["rewards/margins"]) > 1e-3 and 0 < theirs["rewards/accuracies"] < 1  # a batch that tells
    assert ours["loss"] == pytest.approx(loss, abs=2e-6)
    for name in (*REWARDS, "logps/chosen", "logps/rejected"):
        assert ours[name] == pytest.approx(theirs[name], rel=1e-5, abs=2e-6), name


def test_a_lora_dpo_run_learns_the_preference_and_its_export_scored_by_transformers_gives_its_loss(
    chat_llama,
    corpora,
    tmp_path,
    capsys,
):
    """From the command line: a LoRA DPO run (whose step 0 is ln 2 with no reward, as the parity
    tests find) lowers the validation loss and raises the reward accuracy, logs TRL's metric names
    to metrics.jsonl, TensorBoard and summary.json, and its merged export, scored by transformers
    against the checkpoint as the reference, gives the DPO loss it reported."""
    corpus, run, out = corpora["conversational"], tmp_path / "run", tmp_path / "merged"
    data = ["data.name=tokens", f"data.path={corpus}", "data.seq_len=128", "train.eval_tokens=0"]  # every pair
    said(["train", "hf_finetune:smoke", f"train.init_from=hf:{chat_llama}", *data, "train.steps=8",
          "train.batch_size=8", "train.eval_every=8", "train.checkpoint_every=8", "train.log_every=4",
          "train.progress=false", "train.lora_rank=4", "train.lora_alpha=8", "train.lora_targets=all",
          "optim.lr=1e-2", "--workdir", str(run)], capsys)  # fmt: skip
    summary = json.loads((run / "summary.json").read_text())
    val = summary["val"]
    assert val["loss"] < LN2 - 0.1 and val["rewards/accuracies"] > 0.75, val
    assert summary["task"] == "dpo"
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    names = {"loss", *REWARDS, "logps/chosen", "logps/rejected"}
    assert names <= set(records[0]) and names <= set(val)
    events = b"".join(p.read_bytes() for p in (run / "tb").glob("events.out.tfevents.*"))
    assert all(f"val/{name}".encode() in events for name in names)

    said(["export", "--workdir", str(run), "--format", "hf", "--out", str(out)], capsys)
    torch, _, merged = transformers_parts(out)
    _, _, reference = transformers_parts(chat_llama)

    def logps(model, ids: list[int], mask: list[int]) -> float:
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0, :-1].double()
        picked = torch.log_softmax(logits, -1)[torch.arange(len(ids) - 1), torch.tensor(ids[1:])]
        return float((picked * torch.tensor(mask[1:], dtype=torch.float64)).sum())

    held = stored(corpus, "val")
    losses = []
    for k in range(0, len(held), 2):
        ratio = [logps(merged, *held[k + j]) - logps(reference, *held[k + j]) for j in (0, 1)]
        losses.append(-math.log(1 / (1 + math.exp(-0.1 * (ratio[0] - ratio[1])))))
    assert val["loss"] == pytest.approx(float(np.mean(losses)), rel=1e-5)


def test_a_full_dpo_run_trains_against_a_frozen_copy_and_loads_as_a_plain_model(chat_llama, corpora, tmp_path, capsys):
    """Without LoRA the reference is a frozen copy of the starting weights in the train state: the
    run learns, jaxnet eval of its checkpoint gives its validation numbers, and jaxnet.load gives
    the trained model alone (the copy is no parameter of it)."""
    import jaxnet
    from jaxnet import config as config_lib

    cfg = config_lib.load_experiment("hf_finetune:smoke", [
        f"train.init_from=hf:{chat_llama}", "data.name=tokens", f"data.path={corpora['text']}", "data.seq_len=128",
        "train.steps=4", "train.batch_size=8", "train.eval_every=4", "train.checkpoint_every=4", "train.progress=false",
        "optim.lr=3e-3", "train.objective=dpo", "train.base_dtype=bfloat16"])  # fmt: skip
    summary = jaxnet.train(cfg, tmp_path / "run")
    assert summary["val"]["loss"] < LN2 - 0.01 and summary["val"]["rewards/margins"] > 0
    again = json.loads(said(["eval", "--workdir", str(tmp_path / "run"), "--split", "val"], capsys).splitlines()[-1])
    assert again["loss"] == pytest.approx(summary["val"]["loss"], rel=1e-6)
    assert "reference" not in jaxnet.load(tmp_path / "run").model_state


def test_simpo_and_smoothed_dpo_equal_their_published_formulas_on_a_batch():
    """SimPO (Meng et al. 2024, eq. 6): -log sigmoid(beta/|c| log p(c) - beta/|r| log p(r) - gamma);
    conservative DPO (Mitchell 2023): -(1-e) log sigmoid(m) - e log sigmoid(-m); computed here in
    float64 from the softmax of random logits."""
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(3, 2, 6, 11)).astype(np.float32)
    targets = rng.integers(0, 11, size=(3, 2, 6))
    mask = (rng.random((3, 2, 6)) < 0.7).astype(np.float32)
    mask[:, :, 0] = 1
    batch = {"targets": targets, "mask": mask}
    z = logits.astype(np.float64)
    token = np.take_along_axis(z, targets[..., None], -1)[..., 0] - np.log(np.exp(z).sum(-1))
    logps, counts = (token * mask).sum(-1), mask.sum(-1)
    log_sigmoid = lambda x: -np.log1p(np.exp(-x))  # noqa: E731

    beta, gamma = 2.0, 1.0
    loss, metrics = preference.simpo(beta, gamma).train_values(logits.reshape(6, 6, 11), batch)
    avg = logps / counts
    want = -log_sigmoid(beta * avg[:, 0] - beta * avg[:, 1] - gamma)
    assert float(loss) == pytest.approx(want.mean(), rel=1e-5)
    assert float(metrics["rewards/chosen"]) == pytest.approx((beta * avg[:, 0]).mean(), rel=1e-5)
    assert float(metrics["logps/rejected"]) == pytest.approx(avg[:, 1].mean(), rel=1e-5)

    reference = logps + rng.normal(size=(3, 2))
    eps, beta = 0.2, 0.5
    loss, metrics = preference.dpo(beta, eps).train_values(
        logits.reshape(6, 6, 11), {**batch, "reference_logps": reference}
    )
    m = beta * (logps - reference)
    margin = m[:, 0] - m[:, 1]
    want = -(1 - eps) * log_sigmoid(margin) - eps * log_sigmoid(-margin)
    assert float(loss) == pytest.approx(want.mean(), rel=1e-5)
    assert float(metrics["rewards/accuracies"]) == pytest.approx(np.mean(margin > 0))
    assert float(metrics["rewards/margins"]) == pytest.approx(margin.mean(), rel=1e-5)


def test_a_byte_corpus_of_plain_pairs_gives_batches_of_pairs_under_data_overlong(tmp_path, capsys):
    """Plain-text pairs need no template: prepared in bytes, a pair's rows hold the prompt and a reply
    and the end-of-text id, the mask on the reply's; a pair longer than a row is dropped or cut."""
    from jaxnet import config as config_lib
    from jaxnet.data import tokens

    rows = [{"prompt": "ab", "chosen": "c", "rejected": "de"}, {"prompt": "x" * 7, "chosen": "yy", "rejected": "z"}]
    write(tmp_path / "train.jsonl", rows)
    write(tmp_path / "val.jsonl", rows[:1])
    out = said(["prepare", "preference", str(tmp_path / "train.jsonl"), "--val", str(tmp_path / "val.jsonl"),
                "--test", str(tmp_path / "val.jsonl"), "--tokenizer", "byte", "--out", str(tmp_path / "c"),
                "--quiet"], capsys)  # fmt: skip
    assert "train: 2 pairs" in out
    cfg = config_lib.Config()
    cfg.data.name, cfg.data.path, cfg.data.seq_len = "tokens", str(tmp_path / "c"), 8
    cfg.train.batch_size = 2
    ds = tokens.load(cfg.data)
    ds.check(cfg)
    assert "1 pairs in rows of 8, 1 longer dropped" in ds.describe()
    batch = next(ds.eval_batches(cfg, "val", 2))
    eot = 256  # the byte tokenizer's end of text
    assert batch["tokens"][0, 0, :3].tolist() == [97, 98, 99] and batch["targets"][0, 0, :3].tolist() == [98, 99, eot]
    assert batch["mask"][0].tolist() == [[0, 1, 1, 0, 0, 0, 0, 0], [0, 1, 1, 1, 0, 0, 0, 0]]
    assert batch["mask"][1].sum() == 0  # a pair of padding
    cfg.data.overlong = "truncate"  # the longer pair's chosen sequence cut to 9 tokens: 7 of prompt, 2 of reply
    ds.check(cfg)
    assert "2 pairs in rows of 8, 1 longer truncated" in ds.describe()
    assert next(ds.train_batches(cfg, 0))["tokens"].shape == (2, 2, 8)


def test_bad_preference_input_is_one_line_exit_2_and_nothing_written(chat_llama, corpora, tmp_path, capsys):
    ok = {"prompt": "Hi", "chosen": " the sun", "rejected": " rain"}
    bad = [
        {"prompt": "Hi", "chosen": " a"},
        {"prompt": "Hi", "chosen": "", "rejected": " b"},
        {**ok, "rejected": ok["chosen"]},
    ]
    mixed = write(tmp_path / "mixed.jsonl", [ok, ok, ok, *bad])
    out = said(["prepare", "preference", str(mixed), "--val", str(mixed), "--test", str(mixed), "--tokenizer", "byte",
                "--out", str(tmp_path / "ok"), "--quiet"], capsys)  # fmt: skip
    assert "left out: 3 with a field missing, 3 with an empty reply, 3 with chosen equal to rejected" in out
    corpus = json.loads((tmp_path / "ok" / "corpus.json").read_text())
    assert corpus["kind"] == "preference" and corpus["preference"]["skipped"] == {"missing": 3, "empty": 3, "same": 3}
    target = tmp_path / "never"
    cases = {
        "has no usable pair (1 with a field missing": [bad[0]],
        "is not a line of JSON": "{not json",
        "must be three strings or three lists of messages": [{"prompt": "Hi", "chosen": ["x"], "rejected": "y"}],
        "the chosen messages must be the assistant's": [{"prompt": [{"role": "user", "content": "Hi"}],
            "chosen": [{"role": "user", "content": "a"}], "rejected": [{"role": "assistant", "content": "b"}]}],
    }  # fmt: skip
    for k, (message, rows) in enumerate(cases.items()):
        path = tmp_path / f"bad{k}.jsonl"
        path.write_text(rows + "\n") if isinstance(rows, str) else write(path, rows)
        err = fails(["prepare", "preference", str(path), "--tokenizer", "byte", "--out", str(target)], capsys)
        assert message in err, err
    conversation = write(
        tmp_path / "conv.jsonl", [json.loads(corpora["conversational-val"].read_text().splitlines()[0])]
    )
    err = fails(["prepare", "preference", str(conversation), "--tokenizer", "gpt2", "--out", str(target)], capsys)
    assert "need a chat template" in err
    assert "needs a tokenizer of a fixed vocabulary" in fails(
        ["prepare", "preference", str(mixed), "--tokenizer", "char", "--out", str(target)], capsys
    )
    assert not target.exists()
    run = tmp_path / "run"
    (tmp_path / "plain.txt").write_text("To be, or not to be, that is the question.\n\n" * 40)
    said(["prepare", str(tmp_path / "plain.txt"), "--tokenizer", "byte", "--out", str(tmp_path / "text"),
          "--cut-bytes", "300", "--quiet"], capsys)  # fmt: skip
    err = fails(["train", "llama3_8b:smoke", f"data.path={tmp_path / 'text'}", "data.seq_len=16",
                 "train.objective=dpo", "--workdir", str(run)], capsys)  # fmt: skip
    assert "train.objective=dpo trains on pairs of a chosen and a rejected reply" in err
    err = fails(["train", "hf_finetune:smoke", f"train.init_from=hf:{chat_llama}", "data.name=tokens",
                 f"data.path={corpora['text']}", "train.objective=dpo", "train.label_smoothing=0.5",
                 "--workdir", str(run)], capsys)  # fmt: skip
    assert "give a value below 0.5" in err
    assert not run.exists()


def test_dpo_shakespeares_pairs_are_the_chat_conversations_with_a_reply_from_elsewhere():
    import importlib.util

    root = Path(__file__).resolve().parents[1] / "experiments"
    spec = importlib.util.spec_from_file_location("dpo_shakespeare", root / "dpo_shakespeare.py")
    experiment = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(experiment)
    made = experiment.pairs()
    conversations = experiment._chat_shakespeare().conversations()
    assert len(made["val"]) > 500 and len(made["test"]) > 500 and len(made["train"]) > 10_000
    first = made["val"][0]
    assert [first["prompt"][0], first["chosen"][0]] == conversations["val"][0]["messages"]
    assert all(p["chosen"] != p["rejected"] for p in made["val"])
    replies = {c["messages"][1]["content"] for c in conversations["val"]}
    assert all(p["rejected"][0]["content"] in replies for p in made["val"])  # from the same held-out play

"""Benchmark tasks (jaxnet eval --task, train.eval_tasks): scores equal to a plain transformers
computation on the same rows, and task files checked line by line.

The reference is transformers (the ``reference`` extra): a random Llama checkpoint with a byte-level
BPE whose post-processor puts BOS before a text (tests/test_hf_llama.py makes both); each
continuation's log-likelihood is computed with torch from the checkpoint's own tokenizer, the
context's trailing whitespace moved to the continuation as lm-evaluation-harness does, and acc /
acc_norm taken from those numbers here.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np
import pytest
from conftest import fails, said

from jaxnet import tokenizers
from jaxnet.data import text
from jaxnet.errors import UserError
from jaxnet.train import eval_tasks

torch = pytest.importorskip("torch", reason="the reference extra (torch, transformers) is not installed")
transformers = pytest.importorskip("transformers", reason="the reference extra (torch, transformers) is not installed")


def speaker_rows(n: int, seed: int = 0) -> list[dict]:
    """Multiple-choice rows from the shipped Shakespeare: a line, then which of four words follows."""
    works = text.shakespeare_works()
    rng = np.random.default_rng(seed)
    lines = [ln.strip() for ln in works[3][1].splitlines() if 30 < len(ln.strip()) < 60]
    rows = []
    for i in rng.choice(len(lines), n, replace=False):
        words = lines[i].split()
        cut = int(rng.integers(2, len(words)))
        others = rng.choice([w for ln in lines[:400] for w in ln.split()], 3).tolist()
        choices = [" " + w for w in [words[cut], *others]]
        order = rng.permutation(4)
        rows.append(
            {
                "context": " ".join(words[:cut]),
                "choices": [choices[k] for k in order],
                "gold": int(np.flatnonzero(order == 0)[0]),
            }
        )
    return rows


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    from test_hf_llama import learned_tokenizer, save

    return save(tmp_path_factory.mktemp("eval-tasks") / "llama-tied", "llama-tied", learned_tokenizer())


@pytest.fixture(scope="module")
def task_files(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("task-files")
    continuation = [
        {"context": "ROMEO: ", "continuation": "But soft, what light"},
        {"context": "", "continuation": "To be, or not to be"},
        {"context": "Good night, good night! Parting is", "continuation": " such sweet sorrow"},
    ]
    return {
        "choices": write_jsonl(root / "choices.jsonl", speaker_rows(16)),
        "continuations": write_jsonl(root / "continuations.jsonl", continuation),
    }


def reference(directory: Path, pairs: list[tuple[str, str]]) -> list[float]:
    """Each continuation's summed log-probability under transformers, tokenized as lm-eval's HF model does."""
    tok = transformers.AutoTokenizer.from_pretrained(directory)
    model = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    out = []
    for context, continuation in pairs:
        if context:
            spaces = len(context) - len(context.rstrip())
            if spaces:
                context, continuation = context[:-spaces], context[-spaces:] + continuation
            head, whole = tok.encode(context), tok.encode(context + continuation)
            ctx, cont = head, whole[len(head) :]
        else:
            ctx, cont = [tok.bos_token_id], tok.encode(continuation, add_special_tokens=False)
        ids = torch.tensor([ctx + cont])
        with torch.no_grad():
            logp = torch.log_softmax(model(ids[:, :-1]).logits.float(), -1)[0]
        positions = range(len(ctx) - 1, len(ctx) + len(cont) - 1)
        out.append(float(sum(logp[p, t] for p, t in zip(positions, cont, strict=True))))
    return out


def test_jaxnet_eval_task_gives_acc_and_acc_norm_of_a_transformers_computation(checkpoint, task_files, capsys):
    rows = [json.loads(line) for line in task_files["choices"].read_text().splitlines()]
    pairs = [(r["context"], c) for r in rows for c in r["choices"]]
    lls = np.array(reference(checkpoint, pairs))
    acc, norm, at = [], [], 0
    for r in rows:
        ll = lls[at : at + 4]
        at += 4
        acc.append(np.argmax(ll) == r["gold"])
        norm.append(np.argmax(ll / np.array([len(c) for c in r["choices"]])) == r["gold"])

    files = [str(task_files["choices"]), str(task_files["continuations"])]
    out = said(["eval", "--workdir", f"hf:{checkpoint}", "--task", *files, "--json", "--batch-size", "8"], capsys)
    result = json.loads(out)
    got = result["tasks"]["choices"]
    assert got["rows"] == 16
    assert got["acc"] == pytest.approx(np.mean(acc), abs=1e-12)
    assert got["acc_norm"] == pytest.approx(np.mean(norm), abs=1e-12)
    assert 0 < np.mean(acc) < 1 or 0 < np.mean(norm) < 1  # not a degenerate task: choices were told apart

    cont = [json.loads(line) for line in task_files["continuations"].read_text().splitlines()]
    expected = reference(checkpoint, [(r["context"], r["continuation"]) for r in cont])
    ll = result["tasks"]["continuations"]
    assert ll["loglikelihood"] == pytest.approx(np.mean(expected), rel=1e-5)
    assert ll["perplexity"] == pytest.approx(math.exp(-np.mean(expected)), rel=1e-4)
    assert result["average"]["acc_norm"] == got["acc_norm"]

    text_out = said(["eval", "--workdir", f"hf:{checkpoint}", "--task", files[0]], capsys)
    assert "choices" in text_out and f"{got['acc']:.4f}" in text_out and "average" in text_out


def test_each_log_likelihood_equals_transformers(checkpoint, task_files):
    from jaxnet import benchmarks

    scoring = benchmarks.open_model(f"hf:{checkpoint}", batch_size=3)  # batches of 3: padding rows too
    rows = [json.loads(line) for line in task_files["choices"].read_text().splitlines()][:3]
    pairs = [(r["context"], c) for r in rows for c in r["choices"]]
    lls, greedy = scoring.loglikelihoods([scoring.codec.pair(c, x) for c, x in pairs])
    np.testing.assert_allclose(lls, reference(checkpoint, pairs), rtol=1e-5, atol=1e-5)
    assert greedy.dtype == bool and len(greedy) == len(pairs)


@pytest.mark.parametrize(
    "lines, message",
    [
        (['{"context": "a", "choices": ["x", "y"], "gold": 2}'], "line 1: 'gold' must be the index (0..1)"),
        (['{"context": "a", "choices": ["x"], "gold": 0}'], "at least two non-empty texts"),
        (['{"choices": ["x", "y"], "gold": 0}'], "line 1 has no text 'context'"),
        (['{"context": "a", "continuation": "b"}', "not json"], "line 2 is not JSON"),
        (
            ['{"context": "a", "continuation": "b"}', '{"context": "a", "choices": ["x", "y"], "gold": 0}'],
            "rows of one kind",
        ),
        (["", "  "], "has no rows"),
        (['{"context": "a"}'], "neither 'choices'"),
    ],
)
def test_bad_task_files_are_one_line_naming_the_line(tmp_path, lines, message):
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(UserError, match=message.replace("(", r"\(").replace(")", r"\)")):
        eval_tasks.read_task(path)


def test_a_missing_task_file_is_exit_2_before_the_model_loads(tmp_path, capsys):
    err = fails(["eval", "--workdir", str(tmp_path / "no-run"), "--task", str(tmp_path / "none.jsonl")], capsys)
    assert "none.jsonl does not exist" in err


def test_codec_encodes_pairs_as_the_harness_does():
    codec = eval_tasks.Codec("gpt2", tokenizers.get("gpt2").corpus_vocab())
    context, continuation = codec.pair("The capital of France is ", "Paris")
    assert codec.decode(context) == "The capital of France is" and codec.decode(continuation) == " Paris"
    assert codec.pair("", "Hello") == ([50256], codec.encode("Hello"))  # no context: the end-of-text id


# --- lm-evaluation-harness as a client ------------------------------------------------------------

TASK_YAML = """task: {name}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: {kind}
{body}
"""
CHOICE_BODY = """doc_to_text: context
doc_to_choice: choices
doc_to_target: gold
target_delimiter: ""
metric_list:
  - metric: acc
  - metric: acc_norm"""
ROLLING_BODY = """doc_to_text: ""
doc_to_target: text
metric_list:
  - metric: word_perplexity
  - metric: bits_per_byte"""


@pytest.fixture(scope="module")
def lm_eval_tasks(task_files, tmp_path_factory):
    """Two local YAML tasks (the multiple-choice rows above; whole texts longer than the model's 64
    positions, scored in rolling windows), and the datasets library kept offline in a directory of
    its own. lm-eval's 14,000 built-in task files are left out of its task index (indexing them
    costs 10-45 s a command here, and these tests use none of them)."""
    pytest.importorskip("lm_eval", reason="the lm-eval extra is not installed")
    import functools

    from lm_eval.tasks import TaskManager

    patch = pytest.MonkeyPatch()
    patch.setattr(TaskManager, "__init__", functools.partialmethod(TaskManager.__init__, include_defaults=False))
    root = tmp_path_factory.mktemp("lm-eval-tasks")
    saved = {k: os.environ.get(k) for k in ("HF_DATASETS_CACHE", "HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE")}
    os.environ.update(HF_DATASETS_CACHE=str(root / "cache"), HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1")
    works = text.shakespeare_works()
    texts = write_jsonl(root / "texts.jsonl", [{"text": works[5][1][i * 900 : i * 900 + 700]} for i in range(3)])
    for name, kind, data, body in (
        ("jaxnet_choices", "multiple_choice", task_files["choices"], CHOICE_BODY),
        ("jaxnet_rolling", "loglikelihood_rolling", texts, ROLLING_BODY),
    ):
        (root / f"{name}.yaml").write_text(TASK_YAML.format(name=name, data=data, kind=kind, body=body))
    yield root
    patch.undo()
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def lm_eval_results(out: Path) -> dict:
    (path,) = out.rglob("results_*.json")
    return json.loads(path.read_text())["results"]


def test_lm_eval_with_jaxnet_agrees_with_jaxnet_eval_and_with_its_own_hf_model(
    checkpoint, task_files, lm_eval_tasks, tmp_path, capsys
):
    from jaxnet import benchmarks, cli

    common = ["--tasks", "jaxnet_choices,jaxnet_rolling", "--include_path", str(lm_eval_tasks), "--batch_size", "4"]
    ours = ["lm-eval", "--model", "jaxnet", "--model_args", f"workdir=hf:{checkpoint}", *common]
    assert cli.main([*ours, "--output_path", str(tmp_path / "jaxnet")]) == 0
    theirs = ["lm-eval", "--model", "hf", "--model_args", f"pretrained={checkpoint},dtype=float32", "--device", "cpu"]
    assert cli.main([*theirs, *common, "--output_path", str(tmp_path / "hf")]) == 0  # lm-eval's own model beside ours
    capsys.readouterr()
    jaxnet_results, hf_results = lm_eval_results(tmp_path / "jaxnet"), lm_eval_results(tmp_path / "hf")

    direct = benchmarks.evaluate(f"hf:{checkpoint}", [str(task_files["choices"])])["tasks"]["choices"]
    for metric in ("acc", "acc_norm"):
        assert jaxnet_results["jaxnet_choices"][f"{metric},none"] == pytest.approx(direct[metric], abs=1e-12)
        assert hf_results["jaxnet_choices"][f"{metric},none"] == pytest.approx(direct[metric], abs=1e-12)
    for metric in ("word_perplexity,none", "bits_per_byte,none"):  # several windows a text
        assert jaxnet_results["jaxnet_rolling"][metric] == pytest.approx(hf_results["jaxnet_rolling"][metric], rel=1e-5)


def test_simple_evaluate_from_python_with_the_model_registered(checkpoint, task_files, lm_eval_tasks):
    import lm_eval
    from lm_eval.tasks import TaskManager

    from jaxnet import benchmarks, harness

    harness.register()
    out = lm_eval.simple_evaluate(
        model="jaxnet",
        model_args=f"workdir=hf:{checkpoint}",
        tasks=["jaxnet_choices"],
        task_manager=TaskManager(include_path=str(lm_eval_tasks)),
    )
    direct = benchmarks.evaluate(f"hf:{checkpoint}", [str(task_files["choices"])])["tasks"]["choices"]
    assert out["results"]["jaxnet_choices"]["acc_norm,none"] == pytest.approx(direct["acc_norm"], abs=1e-12)


def test_generate_until_stops_at_its_text_and_equals_jaxnets_greedy_sampler(checkpoint):
    from jaxnet import harness
    from jaxnet.sample import generate

    lm = harness.JaxnetLM(workdir=f"hf:{checkpoint}")
    request = type("Instance", (), {"args": ("ROMEO: But soft", {"until": ["\n\n"], "max_gen_toks": 12})})()
    (got,) = lm.generate_until([request])
    ids = lm.codec.encode("ROMEO: But soft")
    params = lm.scoring.trained.params
    expected = lm.codec.decode(generate(lm.scoring.trained.model.module, params, np.asarray(ids), 12, temperature=0))
    assert isinstance(got, str) and expected.startswith(got) and (got == expected or "\n\n" in expected)

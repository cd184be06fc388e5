"""``jaxnet eval --task``: benchmark tasks (:mod:`jaxnet.train.eval_tasks`) scored by a trained
run's checkpoint or by a Hugging Face checkpoint, and the model lm-evaluation-harness calls
(:mod:`jaxnet.harness`) stands on the same pieces.

The model comes from :func:`jaxnet.load` (a run directory, or ``hf:DIR``); its tokenizer is the
run's (its ``vocab.json``) or the checkpoint's ``tokenizer.json``; requests are scored in batches
split over every local device::

    result = evaluate("runs/mixture_shakespeare", ["tasks/speakers.jsonl"])
    result["tasks"]["speakers"]["acc_norm"]

On the command line: ``jaxnet eval --workdir RUN|hf:DIR --task FILE... [--json]``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax

from jaxnet import parallel, tokenizers
from jaxnet.config import MeshConfig
from jaxnet.data import text as text_lib
from jaxnet.errors import UserError
from jaxnet.models import hf
from jaxnet.predict import Trained, load
from jaxnet.train import eval_tasks


@dataclass
class Scoring:
    """A loaded model ready to score text: the :class:`~jaxnet.predict.Trained` model, its
    :class:`~jaxnet.train.eval_tasks.Codec`, a :class:`~jaxnet.train.eval_tasks.Scorer` and its
    variables on the devices, and the most positions it reads (``max_len``)."""

    trained: Trained
    codec: eval_tasks.Codec
    scorer: eval_tasks.Scorer
    variables: Any
    max_len: int

    def loglikelihoods(self, requests: list[eval_tasks.Request]) -> tuple[Any, Any]:
        """Each request's summed log-probability and greedy match (see :class:`~jaxnet.train.eval_tasks.Scorer`)."""
        return self.scorer(self.variables, requests)


def tokenizer_of(trained: Trained, spec: str) -> tuple[str, list[str]]:
    """The tokenizer name and vocabulary a loaded model's ids are in."""
    if hf.is_hf(spec):
        tok = tokenizers.get(str(spec))
        return tok.name, tok.corpus_vocab()
    path = Path(spec) / "vocab.json"
    if not path.is_file():
        raise UserError(f"{spec} has no vocab.json: it did not train a language model on text, which tasks score")
    vocab, name = text_lib.read_vocab(path)
    return name, vocab


def open_model(spec: str | os.PathLike, step: int | str | None = None, batch_size: int = 0) -> Scoring:
    """A run directory (its newest checkpoint, or ``step``) or ``hf:DIR`` ready to score text,
    ``batch_size`` requests a batch (0 = as many as keep a batch's logits near 256 MiB)."""
    spec = str(spec)
    trained = load(spec, step)
    if getattr(trained.config.model, "carries_state", False):
        raise UserError(f"{spec} is a model that carries state between batches (an LSTM); tasks need a Transformer")
    name, vocab = tokenizer_of(trained, spec)
    mesh = parallel.make_mesh(MeshConfig())  # every local device along the data axis
    variables = jax.device_put({"params": trained.params, **trained.model_state}, parallel.replicated(mesh))
    max_len = int(trained.config.data.seq_len)
    scorer = eval_tasks.Scorer(
        trained.model, mesh, max_len=max_len, vocab=int(trained.inputs["outputs"]), rows=batch_size
    )
    return Scoring(trained, eval_tasks.Codec(name, vocab), scorer, variables, max_len)


def evaluate(
    spec: str | os.PathLike, paths: list[str], *, step: int | str | None = None, batch_size: int = 0
) -> dict[str, Any]:
    """Score the task files ``paths`` with the model of ``spec`` (a run directory or ``hf:DIR``):
    ``{"checkpoint", "step", "tasks": {name: metrics}, "average": {...}}``. The task files are read
    and checked before the model is loaded."""
    for path in paths:
        eval_tasks.read_task(path)
    scoring = open_model(spec, step, batch_size)
    prepared = eval_tasks.Prepared.of(paths, scoring.codec)
    results = prepared.score(scoring.scorer, scoring.variables)
    return {
        "checkpoint": str(spec),
        "step": scoring.trained.step,
        "tasks": results,
        "average": eval_tasks.average(results),
    }


def table(result: dict[str, Any]) -> str:
    """The text form of :func:`evaluate`'s result: one line per task and the average.

    >>> print(table({"checkpoint": "runs/a", "step": 3, "average": {"acc": 0.5},
    ...              "tasks": {"t": {"acc": 0.5, "acc_stderr": 0.1, "rows": 4}}}))
    runs/a at step 3
    task        rows  acc              acc_norm         acc_bytes
    t              4  0.5000 ± 0.1000
    average           0.5000
    """
    lines = [f"{result['checkpoint']} at step {result['step']}"]
    width = max(10, *(len(n) for n in result["tasks"]))
    lines.append(f"{'task':<{width}}  {'rows':>4}  {'acc':<15}  {'acc_norm':<15}  acc_bytes")

    def cell(r: dict[str, Any], key: str) -> str:
        if key not in r:
            return ""
        spread = r.get(f"{key}_stderr")
        return f"{r[key]:.4f}" + (f" ± {spread:.4f}" if spread is not None and spread == spread else "")

    for name, r in result["tasks"].items():
        row = (
            f"{name:<{width}}  {r['rows']:>4}  {cell(r, 'acc'):<15}  {cell(r, 'acc_norm'):<15}  {cell(r, 'acc_bytes')}"
        )
        lines.append(row.rstrip())
    avg = result["average"]
    lines.append(f"{'average':<{width}}  {'':>4}  {cell(avg, 'acc'):<15}  {cell(avg, 'acc_norm')}".rstrip())
    return "\n".join(lines)


__all__ = ["Scoring", "evaluate", "open_model", "table", "tokenizer_of"]

"""Benchmark tasks scored by log-likelihood: multiple choice and continuations, as lm-evaluation-harness scores them.

A task is a JSONL file, one row a line, all rows of one kind:

- **multiple choice**: ``{"context": "...", "choices": ["...", ...], "gold": 1}``: each choice is
  scored by the sum of the log-probabilities of its tokens after the context; ``acc`` is the
  fraction of rows whose gold choice scores highest, ``acc_norm`` the same with each score divided
  by its choice's length in characters (lm-evaluation-harness's ``acc_norm``, which divides by
  ``len(choice)``), ``acc_bytes`` by its length in UTF-8 bytes (its ``acc_bytes``);
- **log-likelihood**: ``{"context": "...", "continuation": "..."}``: ``loglikelihood`` is the mean
  of the continuations' summed log-probabilities, ``perplexity`` ``exp(-loglikelihood)`` and
  ``acc`` the fraction of continuations that greedy decoding would produce token for token.

Text becomes tokens as lm-evaluation-harness's Hugging Face model makes them: the context's
trailing whitespace moves to the start of the continuation, ``context + continuation`` is encoded
whole and the continuation's tokens are those after the context's (a tokenizer that puts ids
around a text, e.g. a BOS, puts them here too); an empty context is the tokenizer's BOS (else its
end-of-text id). The scored choice is the text given, with no separator added: a task whose
choices follow a space says so in its context or its choices. Rows longer than the model's context
lose their first tokens.

Requests are scored in fixed-shape batches on the run's mesh (the batch split over its data
devices, each process giving its rows), one compiled program per task.

>>> task = read_task("tasks/speakers.jsonl")                      # doctest: +SKIP
>>> task.kind, len(task.rows)                                      # doctest: +SKIP
('multiple_choice', 200)
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxnet import parallel, tasks, tokenizers
from jaxnet.errors import UserError

MULTIPLE_CHOICE, LOGLIKELIHOOD = "multiple_choice", "loglikelihood"
LOGITS_BUDGET = 1 << 28  # bytes of float32 logits one batch may hold (256 MiB)
LENGTH_STEP = 16  # a task's rows are padded to a multiple of this many tokens
ROW_KINDS = "{context, choices, gold} or {context, continuation}"

Request = tuple[list[int], list[int]]  # (context ids, continuation ids)


@dataclass
class Task:
    """The rows of a task file: ``kind`` is ``multiple_choice`` or ``loglikelihood``."""

    name: str
    path: str
    kind: str
    rows: list[dict[str, Any]]

    def pairs(self) -> list[tuple[str, str]]:
        """The (context, continuation) texts to score: every choice of every row, in order."""
        if self.kind == MULTIPLE_CHOICE:
            return [(row["context"], choice) for row in self.rows for choice in row["choices"]]
        return [(row["context"], row["continuation"]) for row in self.rows]


def read_task(path: str | Path) -> Task:
    """A task file (see the module docstring), every row checked: a one-line error names the file,
    the line and what is wrong."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise UserError(
            f"task file {path} does not exist; give a JSONL file of rows (context, choices, gold)"
        ) from None
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"cannot read task file {path}: {e}") from None
    rows, kinds = [], set()
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path} line {number}"
        try:
            row = json.loads(line)
        except ValueError as e:
            raise UserError(f"{where} is not JSON ({e.msg}); a task file has one JSON object per line") from None
        kind = _check_row(row, where)
        kinds.add(kind)
        if len(kinds) > 1:
            raise UserError(f"{where} is a {kind} row, the lines before it are not: a task file holds rows of one kind")
        rows.append(row)
    if not rows:
        raise UserError(f"task file {path} has no rows; give one JSON object per line")
    return Task(path.stem, str(path), kinds.pop(), rows)


def _check_row(row: Any, where: str) -> str:
    """The kind of a row, or a one-line error saying what it lacks."""
    if not isinstance(row, dict):
        raise UserError(f"{where} is not a JSON object")
    if not isinstance(row.get("context"), str):
        raise UserError(
            f"{where} has no text 'context'; a row is {{context, choices, gold}} or {{context, continuation}}"
        )
    if "choices" in row:
        choices, gold = row["choices"], row.get("gold")
        if not isinstance(choices, list) or len(choices) < 2 or not all(isinstance(c, str) and c for c in choices):
            raise UserError(f"{where}: 'choices' must be a list of at least two non-empty texts")
        if isinstance(gold, bool) or not isinstance(gold, int) or not 0 <= gold < len(choices):
            raise UserError(f"{where}: 'gold' must be the index (0..{len(choices) - 1}) of the right choice")
        return MULTIPLE_CHOICE
    if isinstance(row.get("continuation"), str) and row["continuation"]:
        return LOGLIKELIHOOD
    raise UserError(f"{where} has neither 'choices' (with 'gold') nor a non-empty 'continuation'")


class Codec:
    """Text to ids with a run's tokenizer (by name) and vocabulary, as lm-evaluation-harness's
    Hugging Face model encodes text (see the module docstring).

    >>> codec = Codec("byte", [chr(i) for i in range(256)])
    >>> codec.pair("Answer: ", "yes")
    ([65, 110, 115, 119, 101, 114, 58], [32, 121, 101, 115])
    """

    def __init__(self, tokenizer: str, vocab: Sequence[str]):
        self.tok = tokenizers.get(tokenizer)
        self.vocab = list(vocab)
        self.index = {t: i for i, t in enumerate(self.vocab)}
        self.around: tuple[tuple[int, ...], tuple[int, ...]] = getattr(self.tok, "added", ((), ()))
        usable = lambda i: i is not None and 0 <= i < len(self.vocab)  # noqa: E731
        bos, eot = self.tok.bos_id, self.tok.eot_id
        if self.tok.kind == "char" and tokenizers.EOT in self.index:  # a prepared character corpus
            eot = self.index[tokenizers.EOT]
        self.prefix_id = bos if usable(bos) else eot if usable(eot) else self.tok.start_id(self.index)

    def encode(self, text: str) -> list[int]:
        """The ids of ``text``, with the ids the tokenizer puts around a text (an ``hf:DIR`` one's BOS)."""
        if self.tok.kind in ("char", "word"):  # ids of a learned vocabulary
            ids = self.tok.encode_prompt(text, self.index).tolist()
        else:
            ids = self.tok.encode_batch([text])[0].tolist()
        return [*self.around[0], *ids, *self.around[1]]

    def pair(self, context: str, continuation: str) -> Request:
        """The ids of a context and of the continuation after it."""
        if not context:
            ids = self.encode(continuation)[len(self.around[0]) :]
            if ids and ids[0] == self.prefix_id:
                return ids[:1], ids[1:]
            return [self.prefix_id], ids
        spaces = len(context) - len(context.rstrip())
        if spaces:
            context, continuation = context[:-spaces], context[-spaces:] + continuation
        whole, head = self.encode(context + continuation), self.encode(context)
        return head, whole[len(head) :]

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ids."""
        return self.tok.decode(list(ids), self.vocab)


class Scorer:
    """Log-likelihoods of token requests under a model, in fixed-shape batches on ``mesh``.

    ``model.apply(variables, tokens, train=False)`` gives logits ``(rows, length, vocab)``; each
    request ``(context ids, continuation ids)`` is one row, ``max_len`` positions at most (a longer
    one loses its first tokens)::

        scorer = Scorer(trained.model, mesh, max_len=128, vocab=50304)
        lls, greedy = scorer(variables, [([15496], [995])])
    """

    def __init__(
        self, model: Any, mesh: Any, *, max_len: int, vocab: int, rules: tuple = parallel.RULES, rows: int = 0
    ):
        self.mesh, self.max_len, self.vocab, self.rows_wanted = mesh, max_len, vocab, rows

        def score(variables: Any, batch: dict[str, Any]) -> tuple[Any, Any]:
            logits = model.apply(variables, batch["tokens"], train=False).astype(jnp.float32)
            logp = -tasks.cross_entropy(logits, batch["targets"])
            hit = tasks.hits(logits, batch["targets"])
            counted = batch["mask"] > 0
            return jnp.where(counted, logp, 0.0).sum(-1), jnp.all(jnp.where(counted, hit > 0, True), -1)

        replicated = parallel.replicated(mesh)
        self._score = jax.jit(parallel.under_rules(score, mesh, rules), out_shardings=(replicated, replicated))

    def shape(self, requests: Sequence[Request]) -> tuple[int, int]:
        """Rows and length of the batches for ``requests``: the longest request rounded up to a
        multiple of 16 (at most ``max_len``); as many rows as keep a batch's logits near 256 MiB,
        a multiple of the mesh's data devices."""
        longest = max(len(c) + len(x) - 1 for c, x in requests)
        length = min(self.max_len, -(-max(longest, 1) // LENGTH_STEP) * LENGTH_STEP)
        devices = parallel.batch_devices(self.mesh)
        rows = self.rows_wanted or max(1, min(64, LOGITS_BUDGET // (4 * length * self.vocab)))
        return -(-rows // devices) * devices, length

    def __call__(self, variables: Any, requests: Sequence[Request]) -> tuple[np.ndarray, np.ndarray]:
        """Each request's summed log-probability of its continuation (float64) and whether greedy
        decoding gives the continuation (bool)."""
        if not requests:
            return np.zeros(0), np.zeros(0, bool)
        rows, length = self.shape(requests)
        mine = parallel.process_rows(self.mesh, rows)
        lls, greedy = [], []
        for first in range(0, len(requests), rows):
            batch = self._batch(requests[first : first + rows], rows, length)
            batch = {k: v[mine] for k, v in batch.items()}
            ll, ok = self._score(variables, parallel.put_batch(batch, self.mesh))
            lls.append(ll)
            greedy.append(ok)
        n = len(requests)
        return np.concatenate(jax.device_get(lls)).astype(np.float64)[:n], np.concatenate(jax.device_get(greedy))[:n]

    def _batch(self, requests: Sequence[Request], rows: int, length: int) -> dict[str, np.ndarray]:
        tokens = np.zeros((rows, length), np.int32)
        targets = np.zeros((rows, length), np.int32)
        mask = np.zeros((rows, length), np.float32)
        for r, (context, continuation) in enumerate(requests):
            if len(continuation) > length:
                raise UserError(
                    f"a continuation of {len(continuation)} tokens is longer than the {length} positions the model "
                    "reads; shorten it"
                )
            whole = (list(context) + list(continuation))[-(length + 1) :]
            n = len(whole) - 1
            tokens[r, :n], targets[r, :n] = whole[:-1], whole[1:]
            mask[r, n - len(continuation) : n] = 1
        return {"tokens": tokens, "targets": targets, "mask": mask}


def stderr(values: np.ndarray) -> float:
    """The standard error of a mean, as lm-evaluation-harness reports it (sample deviation / sqrt(n))."""
    n = len(values)
    return float(np.std(values, ddof=1) / math.sqrt(n)) if n > 1 else float("nan")


def metrics(task: Task, lls: np.ndarray, greedy: np.ndarray) -> dict[str, float]:
    """A task's metrics from the log-likelihoods (and greedy matches) of its :meth:`Task.pairs`."""
    if task.kind == LOGLIKELIHOOD:
        mean = float(np.mean(lls))
        hits = greedy.astype(np.float64)
        return {
            "acc": float(hits.mean()),
            "acc_stderr": stderr(hits),
            "loglikelihood": mean,
            "perplexity": math.exp(min(-mean, 700.0)),
            "rows": len(task.rows),
        }
    acc, norm, by_bytes, at = [], [], [], 0
    for row in task.rows:
        k = len(row["choices"])
        ll = lls[at : at + k]
        at += k
        chars = np.array([len(c) for c in row["choices"]], np.float64)
        nbytes = np.array([len(c.encode("utf-8")) for c in row["choices"]], np.float64)
        acc.append(float(np.argmax(ll) == row["gold"]))
        norm.append(float(np.argmax(ll / chars) == row["gold"]))
        by_bytes.append(float(np.argmax(ll / nbytes) == row["gold"]))
    acc_, norm_ = np.array(acc), np.array(norm)
    return {
        "acc": float(acc_.mean()),
        "acc_stderr": stderr(acc_),
        "acc_norm": float(norm_.mean()),
        "acc_norm_stderr": stderr(norm_),
        "acc_bytes": float(np.mean(by_bytes)),
        "rows": len(task.rows),
    }


def average(results: dict[str, dict[str, float]]) -> dict[str, float]:
    """The unweighted mean over tasks of ``acc`` (every task) and ``acc_norm`` (multiple-choice tasks)."""
    out = {"acc": float(np.mean([r["acc"] for r in results.values()]))}
    norms = [r["acc_norm"] for r in results.values() if "acc_norm" in r]
    if norms:
        out["acc_norm"] = float(np.mean(norms))
    return out


@dataclass
class Prepared:
    """Task files read and their requests encoded once, for scoring again and again."""

    tasks: list[Task]
    requests: list[list[Request]]

    @classmethod
    def of(cls, paths: Sequence[str], codec: Codec) -> Prepared:
        """``paths`` read and encoded with ``codec`` (two tasks of one name are refused)."""
        read = [read_task(p) for p in paths]
        names = [t.name for t in read]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise UserError(f"two task files are named {twice[0]}; results are keyed by the file's name, rename one")
        requests = []
        for task in read:
            try:
                requests.append([codec.pair(c, x) for c, x in task.pairs()])
            except UserError as e:
                raise UserError(f"task {task.path}: {e}") from None
        return cls(read, requests)

    def score(self, scorer: Scorer, variables: Any) -> dict[str, dict[str, float]]:
        """Each task's :func:`metrics`."""
        out = {}
        for task, requests in zip(self.tasks, self.requests, strict=True):
            lls, greedy = scorer(variables, requests)
            out[task.name] = metrics(task, lls, greedy)
        return out


def check(run: Any) -> None:
    """Read and encode ``train.eval_tasks`` when a run is built, so a bad task file is one line
    before any step (kept on the run for :func:`in_loop`)."""
    if not hasattr(run.dataset, "vocab"):
        raise UserError("train.eval_tasks scores text under a language model; this run's data is not text")
    if getattr(run.cfg.model, "carries_state", False):
        raise UserError("train.eval_tasks: a model that carries state between batches (an LSTM) is not supported")
    codec = Codec(run.dataset.tokenizer, run.dataset.vocab)
    run.eval_tasks = Prepared.of(run.cfg.train.eval_tasks, codec)


def in_loop(run: Any, state: Any) -> dict[str, float]:
    """The scores of ``train.eval_tasks`` for a run's state, flat for the validation record:
    ``NAME/acc``, ``NAME/acc_norm``, ... per task and ``tasks/acc`` (``tasks/acc_norm``) averaged."""
    prepared = getattr(run, "eval_tasks", None)
    if prepared is None:
        check(run)
        prepared = run.eval_tasks
    scorer = getattr(run, "eval_scorer", None)
    if scorer is None:
        scorer = run.eval_scorer = Scorer(
            run.model, run.mesh, max_len=run.cfg.data.seq_len, vocab=run.dataset.num_classes, rules=run.rules
        )
    results = prepared.score(scorer, {"params": state.params, **state.model_state})
    out = {
        f"{name}/{k}": v
        for name, r in results.items()
        for k, v in r.items()
        if k != "rows" and not k.endswith("stderr")
    }
    out.update({f"tasks/{k}": v for k, v in average(results).items()})
    return out


__all__ = ["Codec", "Prepared", "Scorer", "Task", "average", "in_loop", "metrics", "read_task"]

"""lm-evaluation-harness with jaxnet's models: ``jaxnet lm-eval --model jaxnet --model_args workdir=RUN|hf:DIR``.

:class:`JaxnetLM` is a model of lm-evaluation-harness (``lm_eval.api.model.LM``):
``loglikelihood`` and ``loglikelihood_rolling`` score token requests with the batched scorer of
``jaxnet eval --task`` (:mod:`jaxnet.benchmarks`, the same numbers on the same rows), and
``generate_until`` decodes greedily (or at the request's temperature) with jaxnet's sampler
(:func:`jaxnet.sample.generate`), one request at a time. The model comes from :func:`jaxnet.load`: a
run directory (``workdir=runs/x``, ``step=N``) or a Hugging Face checkpoint (``workdir=hf:DIR``).

``jaxnet lm-eval ARGS...`` is lm-evaluation-harness's own command line (``lm-eval run ARGS...``)
with this model registered as ``jaxnet``, beside lm-eval's own (``--model hf`` still works): lm-eval
0.4.13 finds no model plugins by itself, and registers its built-in models only while its registry
is empty, so they are registered first here. From Python, :func:`register` then
``lm_eval.simple_evaluate``::

    from jaxnet import harness
    import lm_eval

    harness.register()
    results = lm_eval.simple_evaluate(model="jaxnet", model_args="workdir=runs/mixture_shakespeare",
                                      tasks=["my_task"], task_manager=lm_eval.tasks.TaskManager(include_path="tasks/"))

Any lm-eval task on disk runs offline: a YAML task with ``dataset_path: json`` and local
``data_files``. Needs the ``lm-eval`` extra: ``pip install 'jaxnet[lm-eval]'``.
"""

from __future__ import annotations

import sys
from typing import Any

from jaxnet.errors import UserError

INSTALL = "pip install 'jaxnet[lm-eval]' (lm-eval==0.4.13)"

try:
    from lm_eval.api.model import LM
except ImportError:  # the command says how to install it; importing this module alone stays harmless
    LM = object  # type: ignore[misc,assignment]


def rolling_windows(tokens: list[int], prefix: int, max_len: int) -> list[tuple[list[int], list[int]]]:
    """A whole text's tokens as (context, continuation) requests of at most ``max_len`` positions
    that predict every token once, each with as much context before it as fits (the first
    predicted after ``prefix``): how lm-evaluation-harness scores ``loglikelihood_rolling``.

    >>> rolling_windows([1, 2, 3, 4, 5], prefix=0, max_len=2)
    [([0], [1, 2]), ([2], [3, 4]), ([3, 4], [5])]
    """
    if not tokens:
        return []
    first = min(max_len, len(tokens))
    out = [([prefix], tokens[:first])]
    done = first
    while done < len(tokens):
        n = min(len(tokens) - done, max_len)
        end = done + n
        seen = tokens[end - max_len - 1 : end - 1]
        out.append((seen[: len(seen) - (n - 1)], tokens[end - n : end]))
        done = end
    return out


class JaxnetLM(LM):
    """A jaxnet run's checkpoint or a Hugging Face checkpoint as an lm-evaluation-harness model.

    ``workdir``: ``RUN_DIR`` or ``hf:DIR``; ``step``: a run's checkpoint (default the newest);
    ``batch_size``: requests a batch (0 or ``auto``: as many as keep a batch's logits near 256 MiB).
    lm-eval's other model arguments (``device``, ``max_batch_size``) are accepted and not used: the
    batches go over every local device.

    >>> lm = JaxnetLM(workdir="hf:checkpoints/gpt2")                       # doctest: +SKIP
    """

    def __init__(self, workdir: str = "", step: Any = None, batch_size: Any = 0, **_: Any):
        if LM is object:
            raise UserError(f"lm-evaluation-harness is not installed: {INSTALL}")
        super().__init__()
        if not workdir:
            raise UserError("--model jaxnet needs --model_args workdir=RUN_DIR (or workdir=hf:DIR)")
        from jaxnet import benchmarks

        size = 0 if batch_size in (None, "", "auto") or str(batch_size).startswith("auto") else int(batch_size)
        self.scoring = benchmarks.open_model(workdir, None if step in (None, "") else step, size)
        self.codec = self.scoring.codec

    def loglikelihood(self, requests: list[Any], disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        """Each ``(context, continuation)`` request's log-probability and whether greedy decoding gives it."""
        lls, greedy = self.scoring.loglikelihoods([self.codec.pair(*req.args) for req in requests])
        return [(float(ll), bool(g)) for ll, g in zip(lls, greedy, strict=True)]

    def loglikelihood_rolling(self, requests: list[Any], disable_tqdm: bool = False) -> list[float]:
        """Each text's whole log-probability, scored in windows of the model's context."""
        pieces, owner = [], []
        for i, req in enumerate(requests):
            windows = rolling_windows(self.codec.encode(req.args[0]), self.codec.prefix_id, self.scoring.max_len)
            pieces += windows
            owner += [i] * len(windows)
        lls, _ = self.scoring.loglikelihoods(pieces)
        totals = [0.0] * len(requests)
        for i, ll in zip(owner, lls, strict=True):
            totals[i] += float(ll)
        return totals

    def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[str]:
        """Each request's continuation of its context, cut before the first of its ``until`` texts."""
        import numpy as np

        from jaxnet.sample import generate

        module = getattr(self.scoring.trained.model, "module", None)
        if module is None:
            raise UserError("generate_until needs a Flax Linen language model (jaxnet's Transformer)")
        out = []
        for req in requests:
            context, kwargs = req.args
            kwargs = dict(kwargs or {})
            until = kwargs.get("until") or []
            until = [until] if isinstance(until, str) else list(until)
            budget = int(kwargs.get("max_gen_toks", 256))
            temperature = float(kwargs.get("temperature", 0.0)) if kwargs.get("do_sample", False) else 0.0
            ids = self.codec.encode(context)[-max(1, self.scoring.max_len - 1) :]
            budget = max(1, min(budget, self.scoring.max_len - len(ids)))
            stops = tuple(self.codec.tok.end_ids) if self.codec.tok.kind == "hf" else ()
            new = generate(module, self.scoring.trained.params, np.asarray(ids, np.int32), budget,
                           temperature=temperature, stop_ids=stops)  # fmt: skip
            new = [int(t) for t in new if int(t) not in stops]
            text = self.codec.decode(new)
            cut = min((text.find(u) for u in until if u and u in text), default=len(text))
            out.append(text[:cut])
        return out


def register() -> None:
    """Register :class:`JaxnetLM` as lm-eval's model ``jaxnet``, after lm-eval's own models (so
    ``--model hf`` and the rest still resolve)."""
    try:
        import lm_eval.models  # noqa: F401 - lm-eval's models: registered only while its registry is empty
        from lm_eval.api.registry import model_registry
    except ImportError:
        raise UserError(f"jaxnet lm-eval needs lm-evaluation-harness: {INSTALL}") from None
    if "jaxnet" not in model_registry:
        model_registry.register("jaxnet", target=JaxnetLM)


def main(argv: list[str]) -> int:
    """``jaxnet lm-eval ARGS...``: lm-eval's command line (``lm-eval run ARGS...`` unless ARGS
    starts with one of its commands: ``run``, ``ls``, ``validate``) with ``--model jaxnet``."""
    register()
    from lm_eval._cli import HarnessCLI

    if not argv or argv[0] in ("-h", "--help"):
        argv = ["run", "--help"]
    saved = sys.argv
    sys.argv = ["jaxnet lm-eval", *argv]
    try:
        cli = HarnessCLI()
        cli.execute(cli.parse_args())
    except SystemExit as e:  # argparse's own exits (--help, a bad option)
        return int(e.code or 0) if isinstance(e.code, int) else 2
    finally:
        sys.argv = saved
    return 0


__all__ = ["JaxnetLM", "main", "register", "rolling_windows"]

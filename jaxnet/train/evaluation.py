"""Evaluating a run after training: a run directory's checkpoint on a split (``jaxnet eval``,
:func:`jaxnet.evaluate`), or a Hugging Face checkpoint before any training (the baseline a
fine-tune is compared with). Training's own evaluations are :meth:`jaxnet.train.loop.Run.evaluate`.

>>> evaluate("runs/smoke", "test")["accuracy"]  # doctest: +SKIP
0.83
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from jaxnet import config as config_lib
from jaxnet import optim, tasks
from jaxnet.checkpoint import Checkpoints, resolve_step
from jaxnet.config import Config
from jaxnet.errors import UserError
from jaxnet.observe import write_json
from jaxnet.train import init_from, record
from jaxnet.train.loop import Run, check_vocab, load_experiment_file

#: Evaluation runs on every local device, whatever mesh the run trained on: all along ``data``.
ONE_AXIS = ("mesh.data=-1", "mesh.fsdp=1", "mesh.expert=1", "mesh.tensor=1")


def evaluate(
    workdir: str | os.PathLike,
    split: str = "test",
    overrides: list[str] | None = None,
    *,
    model: Any = None,
    dataset: Any = None,
    task: tasks.Task | None = None,
    step: int | str | None = None,
    optimizer: optim.UserOptimizer | None = None,
) -> dict[str, Any]:
    """Evaluate the newest checkpoint of a run directory (or checkpoint ``step``, or ``"best"``, the
    one ``train.keep_best`` kept) on ``split`` (val or test).

    The config is read from the run's ``config.json``, with ``overrides`` applied (e.g. a new
    ``data.dir``); it runs on all local devices whatever mesh the run trained on. A run of your
    own ``model``, ``dataset``, ``task`` and ``optimizer`` (given to :func:`train` from Python)
    needs them again here. The result is also written to ``eval.json`` in the run directory.
    """
    workdir = Path(workdir)
    if not (workdir / "config.json").is_file():
        raise UserError(f"{workdir} is not a run directory (no config.json); pass the --workdir of a training run")
    if not (workdir / "checkpoints").exists():  # a file there is named by Checkpoints below
        raise UserError(f"{workdir} has no checkpoints yet; train first with `jaxnet train`")
    check_rebuildable(workdir, model=model, dataset=dataset, task=task)
    load_experiment_file(workdir / "config.json")
    cfg = config_lib.apply_overrides(config_lib.load(workdir / "config.json"), [*ONE_AXIS, *(overrides or [])])
    _check_optimizer_given(workdir, optimizer)
    run = Run(cfg, model=model, dataset=dataset, task=task, optimizer=optimizer)
    check_vocab(workdir, run.dataset)
    step = resolve_step(workdir, step)
    ckpts = Checkpoints(workdir / "checkpoints", read_only=True)
    try:
        # stdout is the result's: a note on the checkpoint (an older layout read) goes to stderr
        init = None
        if run.lora is not None:  # the base of LoRA adapters, checked against the hash the run recorded
            init_from.check_base(cfg, workdir)
            init = init_from.load(cfg, run, workdir)
        state = run.restore(ckpts, step, say=lambda line: print(line, file=sys.stderr), init=init)
    finally:
        ckpts.close()
    result = {"step": int(state.step), "split": split, **run.evaluate(state, split)}
    write_json(workdir / "eval.json", result)
    return result


def evaluate_pretrained(spec: str, split: str = "test", overrides: list[str] | None = None) -> dict[str, Any]:
    """A Hugging Face checkpoint (``hf:PATH``) evaluated before any training on ``split`` of the
    corpus ``data.path=DIR`` names (prepared with the checkpoint's tokenizer; a chat corpus gives
    the mean loss over the assistant's tokens): the baseline a fine-tune is compared with. The
    model's shape is the checkpoint's, ``data.seq_len`` its context unless given, evaluation
    batches of ``train.eval_batch_size`` rows (default 8)::

        evaluate_pretrained("hf:checkpoints/gpt2", "val", ["data.path=corpora/chats", "data.seq_len=1024"])
    """
    from jaxnet.models import hf, model_config

    if not any(o.startswith("data.path=") and o != "data.path=" for o in overrides or ()):
        raise UserError(
            f"jaxnet eval --workdir {spec} needs data.path=DIR, a corpus prepared with its tokenizer "
            f"(jaxnet prepare SOURCE --tokenizer {spec}, or jaxnet prepare chat FILE... --tokenizer {spec})"
        )
    checkpoint = hf.read(spec)
    cfg = Config()
    cfg.model = model_config(checkpoint.table.family)
    cfg.data.name, cfg.data.seq_len, cfg.train.eval_batch_size = "tokens", checkpoint.context, 8
    cfg.train.init_from = str(spec)
    cfg = config_lib.apply_overrides(cfg, [*ONE_AXIS, *(overrides or [])])
    start = init_from.Start(init_from.with_hf_shape(cfg, checkpoint), checkpoint)
    config_lib.validate(start.cfg)
    run = Run(start.cfg)
    state = run.init_state(start.load(run, Path(os.devnull)))
    return {"step": 0, "checkpoint": str(spec), "split": split, **run.evaluate(state, split)}


def check_rebuildable(workdir: Path, *, model: Any = None, dataset: Any = None, task: Any = None) -> None:
    """Refuse in one line a run trained from Python with a model, data or task that is not given
    again: jaxnet cannot rebuild them from the run directory. Says what to call instead."""
    missing = record.from_python(workdir / "config.json", model=model, dataset=dataset, task=task)
    if missing:
        raise UserError(
            f"{workdir} was trained from Python with your own {' and '.join(missing)}, which jaxnet cannot rebuild "
            "from the run directory; evaluate it from Python with jaxnet.evaluate(workdir, model=..., dataset=..., "
            "task=...) (predict with jaxnet.load(workdir, model=...))"
        )


def _check_optimizer_given(workdir: Path, optimizer: Any) -> None:
    """A run trained with an optimizer given from Python keeps its state in the checkpoints, whose
    layout only that optimizer rebuilds: say so rather than that the checkpoint does not fit."""
    try:
        used = json.loads((workdir / "config.json").read_text()).get(config_lib.RUN_KEY, {}).get("optimizer")
    except (OSError, ValueError, AttributeError):
        return
    if optimizer is None and isinstance(used, dict) and used.get("given", "").startswith("jaxnet.train"):
        raise UserError(
            f"{workdir} trained with an optimizer of its own ({used.get('optimizer')}); pass the same one: "
            "jaxnet.evaluate(workdir, optimizer=..., model=..., ...)"
        )

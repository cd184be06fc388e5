"""The runner: init or restore, then steps, evaluations, checkpoints and logs, then a summary.

>>> summary = train(load_experiment("cnn_fashion_mnist:smoke"), "runs/smoke")  # doctest: +SKIP
>>> summary["test"]["accuracy"]                                                  # doctest: +SKIP
0.83
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from jaxnet import config as config_lib
from jaxnet import data as data_lib
from jaxnet import models, observe, optim, parallel, tasks, xla_options
from jaxnet.checkpoint import Checkpoints
from jaxnet.config import Config
from jaxnet.data import mixture, pipeline
from jaxnet.data import text as text_lib
from jaxnet.errors import UserError
from jaxnet.models import adapters
from jaxnet.models.adapters import lora as lora_lib
from jaxnet.models.adapters import reference as reference_lib
from jaxnet.observe import headline
from jaxnet.train import actions as actions_lib
from jaxnet.train import best as best_lib
from jaxnet.train import init_from, record
from jaxnet.train import state as state_lib
from jaxnet.train import trackers as trackers_lib
from jaxnet.train.step import (
    accumulate,
    make_async_train_step,
    make_eval_step,
    make_local_train_step,
    make_multi_step,
    make_summed_step,
    make_train_step,
    metric_zeros,
)

TRANSFORM_STREAM = 3  # a task's host transform of training batch s draws from default_rng([seed, this, s])


class Interrupts:
    """SIGTERM and SIGINT while training: the runner finishes the call of the step it is in (one
    step, or up to ``train.steps_per_call``), checkpoints and stops.

    A second SIGINT (Ctrl-C twice) raises ``KeyboardInterrupt`` at once. Handlers can only be
    installed from the main thread; elsewhere signals keep their usual effect. In a
    multi-process run SIGTERM goes through JAX's preemption sync point, so that every process
    stops after the same call, and SIGINT ends the process at once.
    """

    def __init__(self) -> None:
        self.received: int | None = None
        self.multi_process = jax.process_count() > 1
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> Interrupts:
        if threading.current_thread() is threading.main_thread() and not self.multi_process:
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: Any) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _handle(self, signum: int, frame: Any) -> None:
        if self.received == signal.SIGINT and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.received = signum

    def stop_after(self, done: int) -> bool:
        """Whether to stop after call ``done`` of the loop (call it after every call, counting from
        1; every process of a multi-process run counts the same calls)."""
        if self.received is not None:
            return True
        if self.multi_process:
            from jax.experimental import multihost_utils

            if multihost_utils.reached_preemption_sync_point(done):
                self.received = signal.SIGTERM
                return True
        return False

    @property
    def name(self) -> str | None:
        """``SIGTERM`` or ``SIGINT`` once one has been received, else None."""
        return signal.Signals(self.received).name if self.received is not None else None


def default_workdir(cfg: Config) -> Path:
    """``runs/<experiment>`` (``:variant`` becomes ``-variant``), so rerunning a command resumes it."""
    return Path("runs") / (cfg.experiment.replace(":", "-") or "run")


def workers_of(cfg: Config) -> dict[str, Any]:
    """The :func:`jaxnet.train.state.create` arguments for ``cfg.parallel``'s simulated workers."""
    p = cfg.parallel
    return {"sgd": p.sgd, "workers": p.workers, "staleness": p.staleness}


class Run:
    """Everything built from a config before the first step: data, task, mesh, model, optimizer,
    steps.

    ``model``, ``dataset``, ``task`` and ``optimizer`` replace what the config (or the experiment
    file's ``model(cfg)``, ``data(cfg)``, ``task(cfg)`` and ``optimizer(cfg)``) would give. Building a ``Run`` reads and
    checks all user input, tracing the model and the task once on abstract values, but writes
    nothing, so bad input fails before any file in the workdir is touched.

    ``devices`` (default: ``jax.devices()``) are the devices the mesh is laid out on and
    ``backend`` (default: JAX's) the one ``auto`` model settings resolve for: ``jaxnet plan``
    builds the run for the GPUs of a topology that is not attached (:mod:`jaxnet.plan`).
    """

    def __init__(
        self,
        cfg: Config,
        *,
        model: Any = None,
        dataset: Any = None,
        task: tasks.Task | None = None,
        optimizer: optim.UserOptimizer | None = None,
        devices: list | None = None,
        backend: str | None = None,
    ):
        self.cfg = cfg
        self.hooks = experiment_hooks(cfg)
        self.optimizer_given = optimizer
        if dataset is None and "data" in self.hooks:
            dataset = self.hooks["data"](cfg)
        self.dataset = dataset if dataset is not None else data_lib.load(cfg.data)
        if not hasattr(self.dataset, "train_batches"):
            raise UserError(
                f"dataset is a {type(self.dataset).__name__}; pass jaxnet.data.arrays(train=..., val=..., test=...) "
                "or a jaxnet Dataset / TextDataset"
            )
        self.text = isinstance(self.dataset, text_lib.TextDataset)
        if model is None and "model" not in self.hooks:  # the family's own checks of the mesh's sizes first
            cfg.model.axis_rules({axis: getattr(cfg.mesh, axis) for axis in parallel.AXES})
        self.mesh: Mesh = parallel.make_mesh(cfg.mesh, devices)
        if self.mesh.shape["context"] > 1:  # mesh.context=-1 is known only now
            parallel.check_sequence(cfg.data.seq_len, self.mesh)
        accum = cfg.optim.grad_accum
        parallel.check_batch(
            cfg.train.batch_size // accum,
            self.mesh,
            "train.batch_size" if accum == 1 else "the micro-batch size train.batch_size / optim.grad_accum",
        )
        self.dataset.check(cfg)
        if task is None and "task" in self.hooks:
            task = self.hooks["task"](cfg)
        self.task = task if task is not None else self.dataset.default_task(cfg)
        if not isinstance(self.task, tasks.Task):
            raise UserError(f"task is a {type(self.task).__name__}; pass a jaxnet.Task (or jaxnet.tasks.NAME(...))")
        self.replicas = cfg.parallel.mode == "replicas"
        self.rules = parallel.RULES  # the logical axes of a model of yours
        if model is None and "model" in self.hooks:
            model = self.hooks["model"](cfg)
        if model is None:
            if getattr(self.dataset, "num_classes", 0) < 1:
                raise UserError(
                    "your data does not say how many classes or tokens a built-in model should output; pass your own "
                    "model= (any Flax module), or num_classes= to jaxnet.data.arrays"
                )
            # Per-device replicas see only their rows: BatchNorm averages its statistics across them.
            batch_axis = parallel.REPLICA_AXIS if self.replicas else None
            outputs = self.dataset.num_classes + self.task.extra_inputs
            built = cfg.model
            if cfg.train.router_aux_loss >= 0 and hasattr(built, "router_aux_loss"):  # this run's coefficient
                built = dataclasses.replace(built, router_aux_loss=cfg.train.router_aux_loss)
            model = models.build(built, outputs, cfg.data.seq_len, batch_axis=batch_axis, backend=backend)
            # The family's own logical axes (a built model's; yours are placed by the shared rules).
            self.rules = tuple(cfg.model.axis_rules(dict(self.mesh.shape))) + parallel.RULES
        self.model = adapters.adapt(model)
        self.lora = lora_lib.Settings.of(cfg.train)
        if self.lora is not None:  # adapters trained on a frozen base (jaxnet.models.adapters.lora)
            inner = self.model.inner if isinstance(self.model, lora_lib.Lora) else self.model  # a run's, rebuilt
            self.model = lora_lib.Lora(inner, self.lora)
            self.rules = lora_lib.RULES + tuple(self.rules)
        elif self.task.reference is not None and adapters.reference_apply(self.model) is None:
            # a DPO run's reference model: a frozen copy of the starting weights (under LoRA: the base)
            self.model = reference_lib.Reference(self.model, cfg.train.base_dtype)
        self._check_loss_from(cfg.train.loss_from)
        self.sample = self.dataset.sample(cfg)
        sgd = cfg.parallel
        updates_per_step = sgd.workers if sgd.sgd == "async" else 1
        self.optimizer_made = optimizer = self.optimizer(cfg)  # None: the built-in optim.name
        self.tx, self.lr_schedule = optim.build(cfg.optim, cfg.train.steps, updates_per_step, optimizer)
        if not optim.reads_schedule(optimizer):
            self.lr_schedule = None  # a transformation of your own carries its own learning rate
        boxed = self._check_model_and_task()
        optim.check_freeze(cfg.optim.freeze, boxed.params)
        # Where every leaf of the train state lives, from the parameters' logical axis names.
        self.state_shardings = parallel.state_shardings(boxed, self.mesh, split_carry=self.replicas, rules=self.rules)
        step = self._make_step()
        if self.replicas:
            step = parallel.replicas(step, self.mesh, self.state_shardings)
        else:
            step = parallel.under_rules(step, self.mesh, self.rules)
        options = xla_options.compiler_options(self.mesh)  # on a CPU: convolutions on every core
        self.train_step = jax.jit(
            step,
            donate_argnums=0,
            compiler_options=options,
            # Outputs placed like the inputs (the carried state included), so the next call hits the
            # same compiled step instead of compiling again for a new layout.
            out_shardings=(self.state_shardings, parallel.replicated(self.mesh)),
        )
        # One step and its metrics added to the interval's totals, in one program: what the loop
        # calls when it runs one step per call (make_summed_step says why).
        self.train_step_summed = jax.jit(
            make_summed_step(step),
            donate_argnums=0,
            compiler_options=options,
            out_shardings=(self.state_shardings, parallel.replicated(self.mesh)),
        )
        # train.steps_per_call > 1: that many steps in one compiled call, on stacked batches; the
        # intervals whose multiples end a call (train() adds its actions'), and single steps that do
        # too: a profiled window's trace starts after update A - 1 and stops after update B.
        self.steps_per_call = config_lib.steps_per_call(cfg)
        self.call_everies = (cfg.train.log_every, cfg.train.eval_every, cfg.train.checkpoint_every)
        profiled = config_lib.profile_steps(cfg)
        self.call_stops = (profiled[0] - 1, profiled[1]) if profiled else ()
        self.train_calls = jax.jit(
            make_multi_step(step),
            donate_argnums=0,
            compiler_options=options,
            out_shardings=(self.state_shardings, parallel.replicated(self.mesh)),
        )
        self.eval_step = jax.jit(
            parallel.under_rules(make_eval_step(self.model, self.task), self.mesh, self.rules),
            compiler_options=options,
            out_shardings=(parallel.replicated(self.mesh), parallel.replicated(self.mesh)),
        )
        if cfg.train.eval_tasks:  # read and encoded now: a bad task file is one line before any step
            from jaxnet.train import eval_tasks

            eval_tasks.check(self)

    def optimizer(self, cfg: Config) -> optim.UserOptimizer | None:
        """Your optimizer for ``cfg`` (a sweep member's, its numbers traced): the one given to the
        run, else the experiment file's ``optimizer(cfg)``, else None (the built-in ``optim.name``)."""
        if self.optimizer_given is not None:
            return self.optimizer_given
        return self.hooks["optimizer"](cfg) if "optimizer" in self.hooks else None

    def optimizer_record(self) -> dict[str, str] | None:
        """What config.json says of your optimizer: where it came from and what it is."""
        if self.optimizer_given is not None:
            return {"given": "jaxnet.train(optimizer=...)", "optimizer": optim.describe(self.optimizer_given)}
        if "optimizer" in self.hooks:
            path = config_lib.experiment_module(self.cfg.experiment).__file__
            return {"given": f"optimizer(cfg) in {path}", "optimizer": optim.describe(self.optimizer_made)}
        return None

    def _check_model_and_task(self) -> Any:
        """The model initialises on the data's shapes and the task's loss and metrics are scalars:
        found by tracing (nothing is computed), so a mistake is one line before any step. Returns
        the abstract train state with the parameters' logical-axis boxes on."""
        tasks.check_inputs(self.task, self.sample)
        inputs = self.task.model_inputs(self.sample)
        keywords = self.task.model_keywords(self.sample)
        name = self.model.name

        def apply(state: state_lib.TrainState) -> Any:
            variables = {"params": state.params, **state.model_state}
            # A per-device replica's training mode averages over devices (BatchNorm), which needs
            # shard_map around it; its outputs have the same shapes in evaluation mode.
            train = not self.replicas
            rngs = {"dropout": jax.random.PRNGKey(0)}
            return self.model.apply(variables, *inputs, **keywords, train=train, rngs=rngs, mutable=True)[0]

        try:
            boxed = jax.eval_shape(lambda: self._create_state(unbox=False))
            outputs = jax.eval_shape(apply, nn.unbox(boxed))
        except UserError:
            raise
        except Exception as e:
            shapes = ", ".join(f"{k} {np.asarray(v).dtype}{list(np.shape(v))}" for k, v in self.sample.items())
            message = (str(e).strip().splitlines() or [""])[0]
            named = "".join(f", {k}=" for k in keywords)
            packed = " (rows of packed examples: the model is given their segments and positions)" if keywords else ""
            raise UserError(
                f"model {name} failed on a batch of ({shapes}) fed as {', '.join(self.task.inputs)}{named}: "
                f"{type(e).__name__}: {message}; check the model's __call__(inputs{named}, train=...) and the task's "
                f"inputs{packed}"
            ) from None
        tasks.check(self.task, name, outputs, self.sample)
        tasks.check_labels(self.task, name, outputs, self.sample, self.dataset)
        return boxed

    @property
    def blockwise_loss(self) -> bool:
        """Whether the train step computes the task's loss from the model's final hidden states and
        output layer in blocks (:mod:`jaxnet.blockwise`), never holding the whole logits: a
        cross-entropy task and a model that offers them (the Transformer, with LoRA or without)."""
        return self.task.from_features is not None and adapters.features_apply(self.model) is not None

    def _check_loss_from(self, loss_from: str) -> None:
        """``train.loss_from=features`` needs a task that computes its loss from features and a model
        that offers them."""
        if loss_from != "features":
            return
        if self.task.from_features is None:
            raise UserError(
                f"train.loss_from=features: task {self.task.name!r} computes its loss from the model's outputs only; "
                "use train.loss_from=auto (or a built-in cross-entropy task)"
            )
        if adapters.features_apply(self.model) is None:
            methods = ", ".join(m + "()" for m in adapters.FEATURES_SEAM)
            raise UserError(
                f"train.loss_from=features: model {self.model.name} does not offer its final hidden states and output "
                f"layer apart (a Flax Linen module with {methods} methods); use train.loss_from=auto or logits"
            )

    def _make_step(self) -> Any:
        """The train step of ``parallel.sgd``: synchronous, asynchronous or local SGD."""
        cfg, p = self.cfg, self.cfg.parallel
        common = dict(task=self.task, skip_nonfinite=cfg.train.on_nonfinite == "skip")
        if p.sgd == "async":
            return make_async_train_step(
                self.model,
                self.tx,
                workers=p.workers,
                staleness=p.staleness,
                randomised=p.delay == "random",
                **common,
            )
        if p.sgd == "local":
            return make_local_train_step(self.model, self.tx, workers=p.workers, local_steps=p.local_steps, **common)
        return make_train_step(
            self.model,
            self.tx,
            grad_accum=cfg.optim.grad_accum,
            accum_parallel=cfg.optim.grad_accum_mode == "parallel",
            axis_name=parallel.REPLICA_AXIS if self.replicas else None,
            **common,
        )

    def _create_state(self, unbox: bool = True, seed: Any = None, init: dict | None = None) -> state_lib.TrainState:
        inputs = tuple(jnp.asarray(x) for x in self.task.model_inputs(self.sample))
        keywords = {k: jnp.asarray(v) for k, v in self.task.model_keywords(self.sample).items()}
        seed = self.cfg.seed if seed is None else seed
        return state_lib.create(
            self.model, self.tx, inputs, seed, unbox=unbox, init=init, keywords=keywords, **workers_of(self.cfg)
        )

    def init_state(self, init: dict | None = None) -> state_lib.TrainState:
        """A fresh train state, created directly in place on the mesh; ``init`` (from
        :func:`jaxnet.train.init_from.load`) replaces the variables it names."""
        # The output shardings place every leaf; the models' activation marks are not needed here.
        if init:  # an argument, not a constant folded into the program; donated: the state takes its buffers
            create = lambda values: self._create_state(init=values)  # noqa: E731
            return jax.jit(create, out_shardings=self.state_shardings, donate_argnums=0)(init)
        return jax.jit(self._create_state, out_shardings=self.state_shardings)()

    def restore(
        self,
        ckpts: Checkpoints,
        step: int | None = None,
        *,
        say: Any = print,
        init: dict | None = None,
        base: Any = None,
    ) -> state_lib.TrainState:
        """The train state of checkpoint ``step`` (default the newest intact one). A LoRA run's
        checkpoints hold no base: it is ``base`` (a live state's), else made again from ``init``
        (:func:`jaxnet.train.init_from.load`)."""
        target = self.abstract_state()
        if self.lora is None:
            return ckpts.restore(target, step=step, say=say)
        restored = ckpts.restore(lora_lib.without_base(target), step=step, say=say)
        if base is None:
            base = self.init_state(init).model_state[lora_lib.BASE]
        return restored.replace(model_state={**restored.model_state, lora_lib.BASE: base})

    def abstract_state(self) -> Any:
        """Shapes, dtypes and placement of the train state, without computing it (a restore target)."""
        return abstract_state(self._create_state, self.mesh, self.state_shardings)

    def train_batches(self, start_step: int, cfg: Config | None = None) -> Any:
        """Host batches from ``start_step`` on (a pure function of the seed and the step): the rows
        this process's devices hold, which with one process is all of them. ``cfg`` (default: the
        run's) gives the seed and batch size: a sweep reads each member's own batches."""
        cfg = cfg or self.cfg
        rows = parallel.process_rows(self.mesh, cfg.train.batch_size)
        batches = self.dataset.train_batches(cfg, start_step, rows)
        transform = self.task.transform
        if transform is None:
            return batches
        return (
            transform(b, np.random.default_rng([cfg.seed, TRANSFORM_STREAM, s]))
            for s, b in enumerate(batches, start_step)
        )

    def put_batch(self, batch: Any) -> Any:
        """A host batch onto the mesh, split along the batch axis."""
        return parallel.put_batch(batch, self.mesh)

    def call_batches(self, start: int, end: int) -> Any:
        """``(n, batch)`` for each call of the steps from ``start`` to ``end`` (see
        :func:`call_sizes`, with the intervals in :attr:`call_everies`): a host batch (``n`` = 1)
        or ``n`` of them stacked along a new leading axis, the same batches in the same order as
        :meth:`train_batches`."""
        batches = self.train_batches(start)
        for n in call_sizes(start, end, self.steps_per_call, self.call_everies, self.call_stops):
            group = [next(batches) for _ in range(n)]
            yield n, group[0] if n == 1 else jax.tree.map(lambda *rows: np.stack(rows), *group)

    def put_call(self, item: tuple[int, Any]) -> tuple[int, Any]:
        """An item of :meth:`call_batches` onto the mesh (stacked batches split along axis 1)."""
        n, batch = item
        return n, parallel.put_batch(batch, self.mesh, lead=int(n > 1))

    def _eval_batches(self, split: str, dataset: Any = None) -> tuple[Any, int]:
        """Evaluation batches of ``split`` (this process's rows of them) and their number of rows
        (0 if the split is empty); of ``dataset`` (a corpus of a mixture) instead of the run's."""
        dataset = self.dataset if dataset is None else dataset
        devices = parallel.batch_devices(self.mesh)
        wanted = dataset.eval_rows(self.cfg, split) if dataset.size(split) else 0
        if not wanted:
            return iter(()), 0
        rows = -(-wanted // devices) * devices
        mine = parallel.process_rows(self.mesh, rows) if jax.process_count() > 1 else None
        # A dataset whose eval_batches takes ``rows`` reads only this process's rows (a corpus on
        # disk); the others make whole batches, sliced below. A transform draws for whole batches.
        reads_rows = mine is not None and self.task.transform is None and _takes_rows(dataset.eval_batches)
        if reads_rows:
            batches = dataset.eval_batches(self.cfg, split, rows, rows=mine)
            return batches, rows
        batches = dataset.eval_batches(self.cfg, split, rows)
        if self.task.transform is not None:  # the same corruption on every evaluation of the split
            salt = ("train", "val", "test").index(split)
            transform = self.task.transform
            batches = (
                transform(b, np.random.default_rng([pipeline.VALIDATION_SEED, salt, i])) for i, b in enumerate(batches)
            )
        if mine is not None:
            batches = ({k: v[mine] if v.ndim else v for k, v in b.items()} for b in batches)
        return batches, rows

    def evaluate(self, state: state_lib.TrainState, split: str) -> dict[str, float]:
        """The task's loss and metrics over every example (or token) of ``split`` (val or test),
        plus what the task derives from them (perplexity, bits per character, R^2); ``{}`` if the
        split is empty.

        A stateful model walking streams carries its state from batch to batch, starting from
        zeros; with window batching every batch starts from zeros.

        A mixture of corpora (``data.mixture``) reports the metrics over all its corpora's tokens of
        ``split`` together, and each corpus's as ``NAME/loss``, ``NAME/perplexity``, ...; the
        validation pass of a run with ``train.eval_tasks`` adds their scores
        (:mod:`jaxnet.train.eval_tasks`).
        """
        parts = getattr(self.dataset, "parts", None)
        if parts is None:
            out = self._summarize(self._eval_totals(state, split))
        else:
            each = {name: self._eval_totals(state, split, part) for name, part in parts}
            found = [t for t in each.values() if t]
            out = self._summarize({k: sum(t[k] for t in found) for k in found[0]}) if found else {}
            for name, totals in each.items():
                out.update({f"{name}/{k}": v for k, v in self._summarize(totals).items()})
        if split == "val" and self.cfg.train.eval_tasks:
            from jaxnet.train import eval_tasks

            out.update(eval_tasks.in_loop(self, state))
        return out

    def _summarize(self, totals: dict[str, float]) -> dict[str, float]:
        """The task's metrics from an evaluation's summed totals (``{}`` for none)."""
        if not totals:
            return {}
        totals = dict(totals)
        count = float(totals.pop("count"))
        return self.task.summarize({k: float(v) / count for k, v in totals.items()})

    def _eval_totals(self, state: state_lib.TrainState, split: str, dataset: Any = None) -> dict[str, float]:
        """The summed loss, metrics and ``count`` of ``split`` (of ``dataset``, default the run's), on the host."""
        batches, rows = self._eval_batches(split, dataset)
        if not rows:
            return {}
        zeros: dict = {}
        if "carry" in state.model_state:
            zeros = {
                "carry": jax.tree.map(lambda c: jnp.zeros((rows, *c.shape[1:]), c.dtype), state.model_state["carry"])
            }
        stream = self.text and config_lib.batching(self.cfg) == "stream"
        carry, totals = zeros, None
        for batch in pipeline.prefetch(batches, self.cfg.data.prefetch, self.put_batch):
            sums, carry = self.eval_step(state, batch, carry if stream else zeros)
            totals = sums if totals is None else accumulate(totals, sums)
        if totals is None:
            return {}
        return {k: float(v) for k, v in jax.device_get(totals).items()}


def _takes_rows(method: Callable) -> bool:
    """Whether a dataset's ``eval_batches`` reads only some rows of each batch (a ``rows`` argument)."""
    try:
        return "rows" in inspect.signature(method).parameters
    except (TypeError, ValueError):
        return False


def experiment_hooks(cfg: Config) -> dict[str, Callable]:
    """The ``model``, ``data``, ``task``, ``actions`` and ``optimizer`` functions of the experiment
    file ``cfg`` came from, those it defines, each turning its errors into one line naming the file."""
    module = config_lib.experiment_module(cfg.experiment) if cfg.experiment else None
    if module is None:
        return {}
    path = Path(module.__file__)
    hooks = {}
    for name in ("model", "data", "task", "actions", "optimizer"):
        fn = getattr(module, name, None)
        if callable(fn):
            hooks[name] = lambda c, fn=fn: config_lib._run_experiment_code(path, lambda: fn(c))
    return hooks


def abstract_state(create: Any, mesh: Mesh, shardings: Any = None) -> Any:
    """Shapes, dtypes and placement of the state ``create()`` would build, without building it.

    ``shardings`` (a tree like the state's) places each leaf; by default everything is replicated.
    """
    shapes = jax.eval_shape(create)
    if shardings is None:
        shardings = jax.tree.map(lambda _: parallel.replicated(mesh), shapes)
    return jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), shapes, shardings)


# What a run directory may contain; a directory holding anything else is not ours to write into.
RUN_FILES = {
    "config.json",
    record.INPUTS,
    "vocab.json",
    "metrics.jsonl",
    "summary.json",
    "eval.json",
    "curves.png",
    "checkpoints",
    "tb",
    "profile",
    trackers_lib.MLFLOW_DIR,
}


def _open_workdir(workdir: Path, cfg: Config, adopt: bool = False) -> Config | None:
    """Check that ``workdir`` can hold this run; create it. Returns the config saved there, if any.

    A workdir holding a run of another experiment is refused unless ``adopt``.
    """
    if str(workdir) in ("", "."):
        raise UserError("--workdir must name a run directory, e.g. runs/mine")
    if workdir.exists() and not workdir.is_dir():
        raise UserError(f"workdir {workdir} is a file; pass a directory with --workdir")
    previous = None
    if workdir.is_dir():
        if (workdir / "config.json").exists():
            previous = config_lib.load(workdir / "config.json")
            if previous.experiment != cfg.experiment and not adopt:
                raise UserError(
                    f"workdir {workdir} holds a run of {previous.experiment or 'another experiment'!r}, "
                    f"not {cfg.experiment!r}; pass a fresh --workdir, or --adopt to continue its checkpoints"
                )
        else:
            foreign = sorted(p.name for p in workdir.iterdir() if p.name not in RUN_FILES)
            if foreign:
                raise UserError(
                    f"workdir {workdir} is not empty and is not a jaxnet run directory (it has {foreign[0]}); "
                    "pass a new or empty --workdir"
                )
    try:
        workdir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"cannot create workdir {workdir}: {e.strerror}; pass another --workdir") from None
    if not os.access(workdir, os.W_OK | os.X_OK):
        raise UserError(f"workdir {workdir} is not writable; pass another --workdir")
    return previous


def schedule_extension(cfg: Config, workdir: Path, say: Callable[[str], Any]) -> Config:
    """``cfg`` with ``optim.extended_at`` set where it resumes a completed run with a larger
    ``train.steps`` and a schedule that depends on it (so it would jump, cosine from its end back
    up): the old schedule then ends there and ``optim.extend`` says what follows, which is said in
    one line. An extension recorded earlier carries over; otherwise ``cfg`` is returned as it is."""
    try:
        previous = config_lib.load(workdir / "config.json")
        old_steps = previous.train.steps
    except (UserError, OSError):  # no run there, or one _open_workdir will refuse
        return cfg
    at = cfg.optim.extended_at or previous.optim.extended_at
    summary = _completed_summary(workdir, old_steps, old_steps)
    if summary is not None and summary.get("step") == old_steps < cfg.train.steps and old_steps > at:
        so_far = dataclasses.replace(cfg.optim, extended_at=at)  # the schedule the run completed
        before = optim.extended_schedule(so_far, old_steps)
        stretched = optim.extended_schedule(so_far, cfg.train.steps)
        if float(before(old_steps - 1)) != float(stretched(old_steps - 1)):
            at = old_steps
            added = cfg.train.steps - old_steps
            if cfg.optim.extend == "restart":
                what = f"begins again over the {added} new steps (optim.extend=continue holds its final value)"
            else:
                what = f"holds its final value {float(before(old_steps)):.3g} (optim.extend=restart begins it again)"
            say(
                f"warning: train.steps {old_steps} -> {cfg.train.steps} extends a completed run whose "
                f"{cfg.optim.schedule} schedule ended at step {old_steps}; its learning rate {what}"
            )
    if at == cfg.optim.extended_at or at >= cfg.train.steps:
        return cfg
    return config_lib.apply_overrides(cfg, [f"optim.extended_at={at}"])


def _changes(previous: Config | None, cfg: Config) -> str:
    if previous is None:
        return ""
    old, new = config_lib.flatten(previous.to_dict()), config_lib.flatten(cfg.to_dict())
    changed = [f"{k} {old.get(k)} -> {v}" for k, v in new.items() if old.get(k) != v]
    return f" (changed: {'; '.join(changed)})" if changed else ""


def _completed_summary(workdir: Path, start: int, steps: int) -> dict[str, Any] | None:
    """The summary of a run that completed at ``start``: its last step, or where it stopped early."""
    try:
        summary = json.loads((workdir / "summary.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(summary, dict) or not summary.get("complete"):
        return None
    stopped = summary.get("stopped_early")
    return summary if start == (stopped["step"] if isinstance(stopped, dict) else steps) else None


def _result_line(summary: dict[str, Any]) -> str:
    test = summary.get("test") or summary.get("val") or {}
    split = "test" if "test" in summary else "val"
    if not test:
        return f"finished; run directory {summary['workdir']}"
    return f"{headline(test, split)}  wall time {summary['wall_time_s']:.0f} s  run directory {summary['workdir']}"


def check_vocab(workdir: Path, dataset: Any) -> None:
    """A run's token ids mean what its ``vocab.json`` says: refuse data whose vocabulary differs."""
    path = workdir / "vocab.json"
    if not isinstance(dataset, text_lib.TextDataset) or not path.exists():
        return
    saved, _ = text_lib.read_vocab(path)
    if saved != dataset.vocab:
        extra = [t for t in dataset.vocab if t not in set(saved)]
        what = f"tokens outside it ({', '.join(repr(t) for t in extra[:5])})" if extra else "a different token order"
        raise UserError(
            f"the data's vocabulary does not match the run in {workdir}: the data has {what}; "
            "train on the same text or use a fresh --workdir"
        )


def train(
    cfg: Config,
    workdir: str | os.PathLike | None = None,
    *,
    model: Any = None,
    dataset: Any = None,
    task: tasks.Task | None = None,
    actions: list[Any] | None = None,
    optimizer: optim.UserOptimizer | None = None,
    adopt: bool = False,
    stop_when: Callable[[int, dict[str, float]], bool] | None = None,
) -> dict[str, Any]:
    """Train as ``cfg`` says, in ``workdir``; resume from its newest checkpoint if it has one.

    Your own work replaces what the config names: ``model`` a Flax Linen module called as
    ``model.apply(variables, *inputs, train=..., rngs=...)``, a Flax NNX module, an Equinox
    module (called on one example) or :class:`jaxnet.Model` (two pure functions), see
    :mod:`jaxnet.models.adapters`; ``dataset`` your data
    (:func:`jaxnet.data.arrays`, or a built-in ``Dataset`` / ``TextDataset``); ``task`` what
    to minimise and report (:class:`jaxnet.Task`, or one of :mod:`jaxnet.tasks`); ``actions``
    periodic actions (:func:`jaxnet.every`) run after the built-in ones; :func:`jaxnet.early_stop`
    among them ends the run complete, evaluated on its best checkpoint (``train.keep_best`` keeps
    that checkpoint without stopping; :mod:`jaxnet.train.best`). ``optimizer`` any
    ``optax.GradientTransformation``, or a function of the learning-rate schedule returning one
    (``lambda lr: optax.lion(lr)``), in place of ``optim.name`` (see :func:`jaxnet.optim.build`
    for what jaxnet still wraps around it: clipping if configured, ``optim.freeze``). ``adopt`` resumes a
    workdir that holds a run of another experiment (its checkpoints must fit this model).
    ``stop_when(step, val_metrics)``, called after each validation pass of the loop, ends the
    run there when it returns True, with a checkpoint, as ``train.stop_after`` does
    (``jaxnet study`` stops at a target with it). Returns the run summary (also written to
    ``summary.json``)::

        summary = jaxnet.train(jaxnet.load_experiment("cnn_fashion_mnist"), "runs/a")
        print(summary["test"]["accuracy"])
    """
    started = time.time()
    environment = observe.environment()  # at the start: the commit, versions and command the run was launched with
    workdir = Path(workdir) if workdir is not None else default_workdir(cfg)
    # train.init_from, read once: a checkpoint's shape, the config checked, a LoRA base pinned and hashed
    start = init_from.prepare(cfg, workdir)
    cfg = start.cfg
    trackers_lib.check(cfg)
    cfg = schedule_extension(cfg, workdir, print if parallel.is_primary() else lambda *_: None)
    cfg = mixture.end_of_data(cfg, data_lib.load, print if parallel.is_primary() else lambda *_: None)
    run = Run(cfg, model=model, dataset=dataset, task=task, optimizer=optimizer)
    extra = [*(run.hooks["actions"](cfg) if "actions" in run.hooks else []), *(actions or [])]
    extra = [actions_lib.as_action(a) for a in extra]
    # auto (0) also fits the actions' intervals; a call ends on every step where one of them falls
    everies = tuple(a.every for a in extra if a.every)
    run.steps_per_call = config_lib.steps_per_call(cfg, everies)
    run.call_everies += everies
    environment["trained"] = record.trained(run, model=model, dataset=dataset, task=task)
    keep = best_lib.plan(cfg, run, extra)
    if run.hooks:  # `jaxnet eval` loads the file again for its model, data and task
        environment["experiment_file"] = str(Path(config_lib.experiment_module(cfg.experiment).__file__).resolve())
    custom = run.optimizer_record()
    if custom is not None:
        environment["optimizer"] = custom
        if optimizer is not None and parallel.is_primary():
            ignored = optim.unused(cfg.optim, optimizer)
            if ignored:
                shown = ", ".join(f"{k}={getattr(cfg.optim, k.partition('.')[2])}" for k in ignored)
                print(f"note: optimizer={custom['optimizer']} replaces the built-in optimizer; not used: {shown}")
    if start.base is not None:  # what the adapters adapt, with its hash: checked on resume
        environment[init_from.BASE_RECORD] = start.base
    start_from = start.load(run, workdir)  # before the workdir is touched: a bad source writes nothing
    previous = _open_workdir(workdir, cfg, adopt)
    if start.base is not None and parallel.is_primary():  # a LoRA base that moved: the run names its new place
        moved = init_from.record_moved_base(workdir, start.base)
        if moved is not None:
            print(f"the LoRA base moved: {moved} -> {start.base['init_from']} (the same weights, by sha256)")
            previous = config_lib.load(workdir / "config.json")
    check_vocab(workdir, run.dataset)
    parallel.sync("jaxnet: workdir checked")  # by every process, before process 0 writes to it
    ckpts = Checkpoints(workdir / "checkpoints", keep=cfg.train.keep_checkpoints)
    try:
        with Interrupts() as interrupts:
            return _train(
                run, workdir, ckpts, previous, started, environment, interrupts, stop_when, extra, start_from, keep
            )
    finally:
        ckpts.close()


def _train(
    run: Run,
    workdir: Path,
    ckpts: Checkpoints,
    previous: Config | None,
    started: float,
    environment: dict[str, Any],
    interrupts: Interrupts,
    stop_when: Callable[[int, dict[str, float]], bool] | None,
    extra: list[actions_lib.Action],
    start_from: dict | None = None,
    keep: best_lib.Plan | None = None,
) -> dict[str, Any]:
    cfg, train_cfg = run.cfg, run.cfg.train
    primary = parallel.is_primary()  # with several processes, only process 0 writes and prints
    say = print if primary else lambda *_: None
    if ckpts.latest_step() is None:
        state, start = run.init_state(start_from), 0
    else:
        state = run.restore(ckpts, say=say, init=start_from)
        start = int(state.step)
        if start > train_cfg.steps:
            raise UserError(
                f"the checkpoint in {workdir} is at step {start}, past train.steps={train_cfg.steps}; "
                "raise train.steps or use a fresh --workdir"
            )
        say(f"resuming {workdir} from step {start}{_changes(previous, cfg)}")
        done_before = _completed_summary(workdir, start, train_cfg.steps)
        if done_before is not None:
            if done_before.get("stopped_early"):
                say(best_lib.describe(done_before))
            say(f"already complete: {_result_line(done_before)}")
            return done_before
    trackers = trackers_lib.build(cfg, workdir, start) if primary else []
    if primary:
        log = observe.MetricsLog(workdir, resume_step=start, final=start == train_cfg.steps, trackers=trackers)
        config_lib.save(cfg, workdir / "config.json", run=environment)
        observe.write_json(workdir / record.INPUTS, record.inputs(run))
        if run.text:
            observe.write_json(workdir / record.VOCAB, record.vocab(run.dataset))
    else:
        log = observe.Quiet()

    end = train_cfg.steps if not train_cfg.stop_after else min(train_cfg.steps, start + train_cfg.stop_after)
    num_params = state_lib.param_count(state.params)
    progress = observe.Progress(train_cfg.steps, start, enabled=train_cfg.progress) if primary else observe.Quiet()
    described = f"{num_params:,} parameters"
    if run.lora is not None:
        frozen = state_lib.param_count(state.model_state[lora_lib.BASE])
        described = f"LoRA adapters of {num_params:,} parameters on a frozen base of {frozen:,}"
    if reference_lib.REFERENCE in state.model_state:
        described += " and a frozen copy of them (the reference)"
    if start == 0:
        progress.note(
            f"{cfg.experiment or 'run'}: {run.model.name} with {described}, "
            f"{run.dataset.describe()}, {train_cfg.steps} steps of "
            f"{train_cfg.batch_size} on {run.mesh.size} {jax.devices()[0].platform} device(s)"
        )
        notice = empty_val_notice(run.dataset)
        if notice:
            progress.note(notice)
        notice = short_interval_notice(run.steps_per_call, run.call_everies)
        if notice:
            progress.note(notice)
        if hasattr(run.dataset, "first_pass"):  # a mixture: how far the run reads each corpus
            progress.note(run.dataset.first_pass(cfg))
    loop = actions_lib.Loop(run, workdir, state, start, end, log, progress, skip=train_cfg.on_nonfinite == "skip")
    profile = config_lib.profile_steps(cfg)
    builtin = [
        actions_lib.StopOnSignal(interrupts),
        *([actions_lib.Profile(*profile)] if profile and primary else []),
        actions_lib.LogTrain(
            train_cfg.log_every, run.lr_schedule, train_cfg.batch_size, tokens_per_example(run) if run.text else 0
        ),
        validate := actions_lib.Validate(train_cfg.eval_every, train_cfg.steps, stop_when),
        checkpoint := actions_lib.Checkpoint(train_cfg.checkpoint_every, ckpts),
    ]
    best = best_lib.Best(keep, ckpts, start) if keep is not None else None
    if best is not None:
        builtin.insert(-1, best_lib.KeepBest(best, validate, checkpoint))  # before the checkpoint of its step
    try:
        compile_seconds = run_loop(run, loop, [*builtin, *extra])
        summary = _summary(run, loop, workdir, num_params, compile_seconds, interrupts, log, best)
    except BaseException:
        trackers_lib.finish(trackers, workdir, None, "FAILED")
        raise
    finally:
        progress.close()
        log.close()
    summary["wall_time_s"] = round(time.time() - started, 2)
    summary["environment"] = environment
    if primary:
        observe.plot_curves(workdir / "metrics.jsonl", workdir / "curves.png", cfg.experiment)
        summary.update(trackers_lib.summary_fields(trackers))
        observe.write_json(workdir / "summary.json", summary)
        trackers_lib.finish(trackers, workdir, summary, "KILLED" if interrupts.name else "FINISHED")
    end = loop.end
    if interrupts.name:
        say(
            f"{interrupts.name} received: stopped at step {end} of {train_cfg.steps} with a checkpoint; "
            f"run the same command again to resume ({workdir})"
        )
    elif end < train_cfg.steps and not summary.get("stopped_early"):
        say(f"stopped at step {end} of {train_cfg.steps}; run the same command again to continue ({workdir})")
    else:
        kept = best_lib.describe(summary)
        if kept:
            say(kept)
        say(_result_line(summary))
    return summary


def tokens_per_example(run: Run) -> int:
    """The token positions of one example of a text run's batch: ``data.seq_len``, times the sequences
    an example holds (a preference pair: two)."""
    return run.cfg.data.seq_len * int(getattr(run.dataset, "sequences_per_example", 1))


def short_interval_notice(steps_per_call: int, everies: Any) -> str | None:
    """A note when an interval is shorter than ``train.steps_per_call``: the steps up to each of its
    multiples then run one a call (:func:`call_sizes`), which a user who asked for K may not expect."""
    short = sorted({e for e in everies or () if 0 < e < steps_per_call})
    if steps_per_call < 2 or not short:
        return None
    return (
        f"note: something is due every {short[0]} steps, fewer than train.steps_per_call={steps_per_call}: "
        "the steps run one a call; set train.steps_per_call to a divisor of every interval, or 0 (auto)"
    )


def empty_val_notice(dataset: Any) -> str | None:
    """One line saying that ``dataset`` has no validation examples (so no validation pass, and
    nothing for ``stop_when`` to judge), with where they come from; None if it has some."""
    if dataset.size("val"):
        return None
    if isinstance(dataset, data_lib.Dataset):
        where = "set data.val_size=N to hold out N training examples"
    elif isinstance(dataset, data_lib.ArrayDataset):
        where = "give jaxnet.data.arrays(...) a val= split"
    else:
        where = "give the data a val split"
    return f"note: the validation split is empty, so this run has no validation pass; {where}"


def call_sizes(start: int, end: int, steps_per_call: int, everies: Any, stops: Any = ()) -> Any:
    """How many steps each call takes from ``start`` to ``end``: ``steps_per_call`` at a time
    wherever no multiple of one of ``everies`` (the steps at which logs, evaluations, checkpoints
    and actions fall) and none of ``stops`` (single steps, such as the ends of a profiled
    window) lies inside the call, single steps where one would, and single steps for what is left
    at ``end``. Every such step thus ends a call, also after resuming from any step. For example,
    8 steps per call and a log every 200 steps with an evaluation every 2323: calls of 8 up to step
    2320, 3 single steps to 2323, then calls of 8 again up to 2395 and 5 single steps to 2400."""
    everies = [e for e in everies if e > 0]
    step = start
    while step < end:
        after = step + steps_per_call
        fits = after <= end and all((step // e + 1) * e >= after for e in everies)
        n = steps_per_call if fits and not any(step < s < after for s in stops) else 1
        yield n
        step += n


def run_loop(run: Run, loop: actions_lib.Loop, actions: list[actions_lib.Action]) -> float:
    """The loop core: step from ``loop.step`` to ``loop.end``, one step or ``train.steps_per_call``
    steps per call, calling each action that is due after every call. Returns the seconds spent
    compiling."""
    steps_per_call = run.steps_per_call
    if steps_per_call > 1:
        source = pipeline.prefetch(run.call_batches(loop.start, loop.end), run.cfg.data.prefetch, run.put_call)
        batches = source
    else:
        source = pipeline.prefetch(run.train_batches(loop.start), run.cfg.data.prefetch, run.put_batch)
        batches = ((1, b) for b in source)
    loop_start = time.perf_counter()
    programs: dict[int, Any] = {}
    zeros: list[Any] = []  # metric totals of no steps, on the mesh: where a call's totals start
    compile_seconds = 0.0

    def program(n: int, batch: Any) -> Any:
        """The compiled step (``n`` = 1) or ``n``-step call, compiled ahead of time for the placed
        state and batch when first needed: the same program every call, and XLA's memory plan."""
        nonlocal compile_seconds
        if n not in programs:
            started = time.perf_counter()
            if not zeros:
                one = batch if n == 1 else jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape[1:], x.dtype), batch)
                shapes = jax.eval_shape(run.train_step, loop.state, one)[1]
                zeros.append(jax.device_put(metric_zeros(shapes), parallel.replicated(run.mesh)))
            calls = run.train_step_summed if n == 1 else run.train_calls
            programs[n] = calls.lower(loop.state, batch, zeros[0]).compile()
            if len(programs) > 1:  # compiled mid-run: left out of the steps' time
                spent = time.perf_counter() - started
                compile_seconds += spent
                loop.paused += spent
                loop.interval_start += spent
        return programs[n]

    try:
        n, batch = next(batches) if loop.end > loop.start else (1, None)
        first = program(n, batch) if batch is not None else None
        compile_seconds = time.perf_counter() - loop_start
        loop.progress.note(parallel.describe(run.mesh, loop.state, first))
        loop.paused += compile_seconds
        loop.interval_start = time.perf_counter()
        for action in actions:
            action.begin(loop)
        while loop.step < loop.end:
            if loop.step > loop.start:
                n, batch = next(batches)
            call = program(n, batch)  # the step and its metrics' totals in one program, n steps a call
            loop.state, loop.sums = call(loop.state, batch, zeros[0] if loop.sums is None else loop.sums)
            loop.interval_steps += n
            loop.step += n
            for action in actions:
                if action.due(loop):
                    action(loop)
        for action in actions:
            action.finish(loop)
    finally:
        for action in actions:
            action.close(loop)
        source.close()
    loop.seconds = time.perf_counter() - loop_start
    return compile_seconds


def summary_head(
    run: Any, cfg: Config, workdir: Path, end: int, num_params: int, compile_seconds: float
) -> dict[str, Any]:
    """The first fields of a run's summary.json: what ran, where, and how far it got."""
    return {
        "experiment": cfg.experiment,
        "workdir": str(workdir),
        "step": end,
        "steps_total": cfg.train.steps,
        "complete": end == cfg.train.steps,
        "model": run.model.name,
        "task": run.task.name,
        "param_count": num_params,
        "compile_time_s": round(compile_seconds, 2),
    }


def _summary(
    run: Run,
    loop: actions_lib.Loop,
    workdir: Path,
    num_params: int,
    compile_seconds: float,
    interrupts: Interrupts,
    log: Any,
    best: best_lib.Best | None = None,
) -> dict[str, Any]:
    """summary.json: where the run ended, its speed, and at the last step (or an early stop) the val
    and test metrics."""
    cfg, train_cfg, start, end = run.cfg, run.cfg.train, loop.start, loop.end
    summary = summary_head(run, cfg, workdir, end, num_params, compile_seconds)
    if interrupts.name:
        summary["interrupted_by"] = interrupts.name
    if loop.skip and parallel.is_primary():  # from the log, which a resume keeps consistent with the checkpoints
        summary["skipped_updates"] = sum(
            int(r.get("skipped") or 0) for r in observe.read_metrics(log.path) if r["split"] == "train"
        )
    if end > start:
        step_seconds = (loop.seconds - loop.paused) / (end - start)
        summary["steps_per_s"] = round(1 / step_seconds, 2)
        summary["examples_per_s"] = round(train_cfg.batch_size / step_seconds, 1)
        if run.text:
            summary["tokens_per_s"] = round(train_cfg.batch_size * tokens_per_example(run) / step_seconds, 1)
    if hasattr(run.dataset, "summary"):  # a mixture: each corpus's weights and the tokens read from it
        summary["mixture"] = run.dataset.summary(cfg, end)
    if best is not None and (end == train_cfg.steps or best.stopped_early):
        summary.update(best_lib.final_metrics(best, run, loop, log))
    elif end == train_cfg.steps:
        for split in ("val", "test"):
            metrics = run.evaluate(loop.state, split)
            if metrics:
                log.write(end, split, metrics)
                summary[split] = metrics
    return summary


def load_experiment_file(config_path: Path) -> None:
    """Load the experiment file a run's config came from, if it has one of its own (its models
    register, and its model, data and task functions become the run's again)."""
    try:
        saved = json.loads(config_path.read_text())
        path = Path(saved[config_lib.RUN_KEY]["experiment_file"])
        experiment = saved["experiment"]
    except (OSError, ValueError, KeyError, TypeError):
        return
    if not path.is_file():
        raise UserError(f"{config_path.parent} was trained from {path}, which no longer exists; restore that file")
    variant = experiment.partition(":")[2]
    config_lib.load_experiment(f"{path}:{variant}" if variant else str(path))

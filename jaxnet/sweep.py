"""``jaxnet sweep``: a grid of configurations trained side by side in one compiled program.

    jaxnet sweep cnn_fashion_mnist optim.lr=1e-3,3e-3,1e-2 seed=0,1,2 [key=value ...] [--workdir DIR]

trains the 9 members of the grid. Members that differ only in numbers the step reads
(:data:`BATCHED`: the seed and the optimizer's and loss's scalars) share one program, compiled
once: the train step of one member ``jax.vmap``-ed over all of them, each member with its own
parameters, optimizer state, dropout stream and data order (its seed's). Any other key
(a width, the batch size, the schedule, warmup, dropout) changes the program, so its values
split the grid into groups trained one after another; so does a batched key that is 0 for some
members and not for others (0 switches a part off: no clipping, no momentum, no smoothing).
``--members-per-program N`` caps a program's members (memory); the mesh applies as in a run:
each member's arrays are laid out as in ``jaxnet train``, with the members along a leading axis.
``--members-at-once K`` sets how many members one vmapped step takes: the program runs its
members K at a time in a loop (``jax.lax.map``), still compiled once. The default is all of them
on an accelerator; on a CPU it is all of them for models with convolutions and 1 otherwise (see
:func:`members_at_once`).

The sweep directory holds one run directory per member (``config.json``, ``metrics.jsonl``,
``summary.json``, ``curves.png``, ``checkpoints/``: as if trained alone, so ``jaxnet eval``
works on it), and ``sweep.json``, ``sweep.md`` (mean and standard deviation over seeds of each
configuration, best first) and ``sweep.png``. Stopped, the same command resumes every member
exactly; rerun when finished, it prints the table.

A member trained in a sweep ends with the parameters it would have trained to alone, to
float32 rounding (the batched program computes the same values in another order).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec

from jaxnet import config as config_lib
from jaxnet import observe, optim, parallel, tasks, xla_options
from jaxnet.checkpoint import Checkpoints
from jaxnet.config import Config
from jaxnet.errors import UserError
from jaxnet.models import common as model_common
from jaxnet.study import common
from jaxnet.train import actions as actions_lib
from jaxnet.train import record as run_record
from jaxnet.train import state as state_lib
from jaxnet.train import trackers as trackers_lib
from jaxnet.train.loop import Interrupts, Run, default_workdir, run_loop, summary_head
from jaxnet.train.step import make_summed_step, make_train_step

BATCHED = (
    "seed",  # initialisation, data order and dropout
    "optim.lr",
    "optim.weight_decay",
    "optim.momentum",
    "optim.b1",
    "optim.b2",
    "optim.end_lr_factor",
    "optim.clip_norm",
    "train.label_smoothing",
)
"""Keys whose values share one compiled program (everything else splits the grid into groups)."""

ON_OFF = ("optim.weight_decay", "optim.momentum", "optim.clip_norm", "train.label_smoothing")
"""Batched keys for which 0 means "no such part": members with 0 and members without are two programs."""

MAX_MEMBERS = 256


# ---------------------------------------------------------------------------------------------
# The grid


@dataclasses.dataclass
class Member:
    """One configuration of the grid: its name (its directory), swept values and whole config."""

    name: str
    values: dict[str, Any]
    cfg: Config


def parse(tokens: Sequence[str]) -> tuple[dict[str, list[str]], list[str]]:
    """``key=v1,v2`` tokens as ``({key: [v1, v2]}, fixed overrides)``. A key whose values are
    tuples (``model.features=8,16``) is one override unless ``;`` separates alternatives
    (``model.features=8,16;16,32``)."""
    grid: dict[str, list[str]] = {}
    fixed: list[str] = []
    seen: set[str] = set()
    for token in tokens:
        key, sep, text = token.partition("=")
        key = key.strip()
        if not sep or not key:
            raise UserError(f"{token!r} is not of the form key=value or key=v1,v2,... (e.g. optim.lr=1e-3,3e-3)")
        if key in seen:
            raise UserError(f"{key} is given twice; give it once, with every value: {key}=V1,V2,...")
        seen.add(key)
        separator = ";" if _is_tuple(key) else ","
        if separator not in text:
            if not text.strip():
                raise UserError(f"{key}= has no values; give one or more, e.g. {key}=V1,V2")
            fixed.append(f"{key}={text}")
            continue
        values = [v.strip() for v in text.split(separator)]
        if any(not v for v in values):
            raise UserError(
                f"{key}={text!r} has an empty value; separate the values with '{separator}', e.g. {key}=V1{separator}V2"
            )
        grid[key] = values
    return grid, fixed


def _is_tuple(key: str) -> bool:
    known = config_lib.keys()
    return key in known and "tuple" in str(known[key].type)


def expand(base: Config, grid: dict[str, list[str]], max_members: int = MAX_MEMBERS) -> list[Member]:
    """Every combination of the grid's values applied to ``base`` (each value parsed and checked
    like an override), in the order the keys and values were given."""
    if not grid:
        raise UserError("nothing to sweep: give at least one key with several values, e.g. optim.lr=1e-3,3e-3")
    parsed: dict[str, list[Any]] = {}
    for key, texts in grid.items():
        values = []
        for text in texts:
            cfg = config_lib.apply_overrides(base, [f"{key}={text}"])  # unknown key, bad value: one line
            values.append(_get(cfg, key))
        repeated = [t for t, v in zip(texts, values, strict=True) if values.count(v) > 1]
        if repeated:
            raise UserError(f"{key} lists the value {repeated[0]} twice; give each value once")
        parsed[key] = list(zip(texts, values, strict=True))
    size = math.prod(len(v) for v in parsed.values())
    if size > max_members:
        raise UserError(
            f"the grid has {size} members, more than --max-members={max_members}; sweep fewer values "
            "or raise --max-members"
        )
    members = []
    for combination in itertools.product(*parsed.values()):
        overrides = [f"{key}={text}" for key, (text, _) in zip(parsed, combination, strict=True)]
        cfg = config_lib.apply_overrides(base, overrides)
        values = {key: value for key, (_, value) in zip(parsed, combination, strict=True)}
        name = "-".join(f"{key}={_name_part(text)}" for key, (text, _) in zip(parsed, combination, strict=True))
        members.append(Member(name, values, cfg))
    return members


def _name_part(text: str) -> str:
    return "".join(c if c.isalnum() or c in "._+-" else "x" for c in text.strip())


def _get(cfg: Config, key: str) -> Any:
    node: Any = cfg
    for part in key.split("."):
        node = getattr(node, part)
    return node


def with_values(cfg: Config, values: dict[str, Any]) -> Config:
    """``cfg`` with ``values`` (dotted keys, possibly traced arrays) set, unchecked: what a member's
    step is built from inside the vmapped program."""
    sections: dict[str, dict[str, Any]] = {}
    top: dict[str, Any] = {}
    for key, value in values.items():
        section, _, name = key.rpartition(".")
        if section:
            sections.setdefault(section, {})[name] = value
        else:
            top[name] = value
    changed = {s: dataclasses.replace(getattr(cfg, s), **fields) for s, fields in sections.items()}
    return dataclasses.replace(cfg, **changed, **top)


def program_key(cfg: Config) -> str:
    """What must be equal for two members to share a program: the config without the batched
    keys, plus which of the on/off keys are on."""
    flat = config_lib.flatten(cfg.to_dict())
    shared = {k: v for k, v in flat.items() if k not in BATCHED}
    shared["_on"] = [not optim.off(flat[k]) for k in ON_OFF]
    return json.dumps(shared, sort_keys=True, default=str)


def programs(members: list[Member], per_program: int = 0) -> list[list[Member]]:
    """The members grouped by :func:`program_key`, in grid order, each group cut into programs of
    at most ``per_program`` members (0 = no cap)."""
    groups: dict[str, list[Member]] = {}
    for m in members:
        groups.setdefault(program_key(m.cfg), []).append(m)
    out = []
    for group in groups.values():
        size = per_program or len(group)
        out.extend(group[i : i + size] for i in range(0, len(group), size))
    return out


def check_supported(cfg: Config) -> None:
    """The sweep trains synchronous SGD on a sharded mesh (the step it vmaps)."""
    if cfg.parallel.sgd != "sync":
        raise UserError(
            f"jaxnet sweep trains synchronous SGD; parallel.sgd={cfg.parallel.sgd} runs one at a time with "
            "jaxnet train (or jaxnet study async)"
        )
    if cfg.parallel.mode != "sharded":
        raise UserError("jaxnet sweep runs parallel.mode=sharded (members vmapped on one mesh); drop parallel.mode")
    if cfg.train.steps_per_call not in (0, 1):  # 0 (auto) is one step per call here
        raise UserError(
            f"jaxnet sweep runs one step per call; drop train.steps_per_call={cfg.train.steps_per_call} "
            "(it is for jaxnet train)"
        )
    if cfg.train.init_from or cfg.train.lora_rank:
        what = "train.init_from" if cfg.train.init_from else "train.lora_rank (adapters on a train.init_from base)"
        raise UserError(f"jaxnet sweep starts every member fresh; {what} is for jaxnet train")
    if cfg.train.objective:
        raise UserError(f"train.objective={cfg.train.objective} tunes a trained model on pairs: jaxnet train")
    if cfg.train.keep_best:
        raise UserError("jaxnet sweep keeps each member's newest checkpoints; train.keep_best is for jaxnet train")


# ---------------------------------------------------------------------------------------------
# A population: the members of one program


class Population:
    """The members of one program, trained as one: a :class:`~jaxnet.train.loop.Run` of the first
    member gives the data, model, task and mesh; the state holds every member along a leading
    axis; the step is the member step vmapped over it, ``at_once`` members at a time (None: as
    :func:`members_at_once` chooses). Provides what :func:`~jaxnet.train.loop.run_loop` uses of a run."""

    def __init__(
        self,
        members: list[Member],
        *,
        model: Any = None,
        dataset: Any = None,
        task: Any = None,
        optimizer: Any = None,
        at_once: int | None = None,
    ):
        self.members = members
        self.cfgs = [m.cfg for m in members]
        self.run = run = Run(self.cfgs[0], model=model, dataset=dataset, task=task, optimizer=optimizer)
        self.cfg, self.mesh, self.model, self.task, self.text = run.cfg, run.mesh, run.model, run.task, run.text
        self.dataset = run.dataset
        self.size = len(members)
        self.steps_per_call = 1  # the loop's calls: one vmapped step each (sweeps refuse more)
        self._task_given = task
        varying = [k for k in BATCHED if k != "seed" and len({_get(c, k) for c in self.cfgs}) > 1]
        _check_optimizer_reads(varying, optimizer)
        # The members' own numbers, fed to the vmapped step as its third argument.
        self.hyper = {k: jnp.asarray([_get(c, k) for c in self.cfgs], jnp.float32) for k in varying}
        stacked = lambda s: NamedSharding(self.mesh, PartitionSpec(None, *s.spec))
        self.state_shardings = jax.tree.map(stacked, run.state_shardings)
        whole = parallel.replicated(self.mesh)
        self.at_once = members_at_once(self, at_once)
        all_steps = parallel.under_rules(self._all_steps, self.mesh, run.rules)
        self.train_step = jax.jit(
            all_steps,
            donate_argnums=0,
            compiler_options=xla_options.compiler_options(self.mesh),
            out_shardings=(self.state_shardings, whole),
        )
        self.train_step_summed = jax.jit(  # the step with its metrics' totals, as the runner's (Run)
            make_summed_step(all_steps),
            donate_argnums=0,
            compiler_options=xla_options.compiler_options(self.mesh),
            out_shardings=(self.state_shardings, whole),
        )
        self._take = jax.jit(lambda state, i: jax.tree.map(lambda x: x[i], state), out_shardings=run.state_shardings)

    # The member's step, built inside the trace from its (traced) numbers.

    def _member_task(self, cfg: Config) -> tasks.Task:
        if "train.label_smoothing" not in self.hyper or self._task_given is not None:
            return self.task
        return self.run.hooks["task"](cfg) if "task" in self.run.hooks else self.dataset.default_task(cfg)

    def _member_step(self, state: Any, batch: Any, hyper: dict[str, Any]) -> Any:
        cfg = with_values(self.cfg, hyper)
        tx, _ = optim.build(cfg.optim, cfg.train.steps, optimizer=self.run.optimizer(cfg))
        step = make_train_step(
            self.model,
            tx,
            grad_accum=cfg.optim.grad_accum,
            accum_parallel=cfg.optim.grad_accum_mode == "parallel",
            task=self._member_task(cfg),
            skip_nonfinite=cfg.train.on_nonfinite == "skip",
        )
        with model_common.members():  # the layers built in this trace: convolutions per member
            return step(state, batch)

    def _all_steps(self, state: Any, batch: Any) -> Any:
        """Every member's step: vmapped over all members, or over ``at_once`` of them at a time in
        a loop (one at a time: a plain loop over members)."""
        if self.at_once >= self.size:
            return jax.vmap(self._member_step)(state, batch, self.hyper)
        chunk = self.at_once if self.at_once > 1 else None
        return lax.map(lambda args: self._member_step(*args), (state, batch, self.hyper), batch_size=chunk)

    # What run_loop and the actions use.

    def init_state(self) -> Any:
        """Every member's fresh state (its own seed), stacked, created in place on the mesh."""
        seeds = jnp.asarray([c.seed for c in self.cfgs], jnp.int32)
        create = jax.vmap(lambda seed: self.run._create_state(seed=seed))
        return jax.jit(create, out_shardings=self.state_shardings)(seeds)

    def stack(self, states: list[Any]) -> Any:
        """Member states (as restored) as one population state."""
        return jax.jit(
            lambda *xs: jax.tree.map(lambda *leaves: jnp.stack(leaves), *xs), out_shardings=self.state_shardings
        )(*states)

    def member(self, state: Any, i: int) -> Any:
        """Member ``i``'s state, laid out as its own run's."""
        return self._take(state, jnp.int32(i))

    def train_batches(self, start_step: int) -> Iterator[dict[str, np.ndarray]]:
        """Each member's own batches (its seed's order), stacked along a leading axis."""
        streams = [self.run.train_batches(start_step, cfg=c) for c in self.cfgs]
        for batches in zip(*streams, strict=False):  # endless streams
            yield {k: np.stack([b[k] for b in batches]) for k in batches[0]}

    def put_batch(self, batch: Any) -> Any:
        """A stacked host batch onto the mesh: members whole, each member's rows split as in a run."""
        return parallel.put_batch(batch, self.mesh, lead=1)

    def evaluate(self, state: Any, split: str) -> list[dict[str, float]]:
        """Each member's metrics on ``split``, computed as its own run computes them: member after
        member with the run's evaluation step (one compilation). Evaluation reads no batched number
        (label smoothing changes only the training loss), and a vmapped evaluation, whose members
        share the batch, ran 2x slower on a CPU than this."""
        return [self.run.evaluate(self.member(state, i), split) for i in range(self.size)]


def _check_optimizer_reads(varying: list[str], optimizer: Any) -> None:
    """A swept ``optim.*`` key that your optimizer does not read is refused: every member would
    train alike. (An experiment file's ``optimizer(cfg)`` may read any key: it gets each member's.)"""
    if optimizer is None:
        return
    names = optim.BUILT_IN_KEYS + (() if optim.reads_schedule(optimizer) else optim.SCHEDULE_KEYS)
    unread = [k for k in varying if k.startswith("optim.") and k.partition(".")[2] in names]
    if unread:
        fix = (
            "pass a function of the schedule (optimizer=lambda lr: optax.lion(lr)) to sweep optim.lr"
            if unread[0] == "optim.lr"
            else "build it in the experiment file's optimizer(cfg) from cfg.optim, or sweep with optim.name instead"
        )
        raise UserError(
            f"jaxnet sweep over {unread[0]}: optimizer={optim.describe(optimizer)} does not read it, so every member "
            f"would train alike; {fix}"
        )


def members_at_once(pop: Population, requested: int | None = None) -> int:
    """How many members one vmapped step of ``pop`` takes: ``requested`` (0 = all), or by default
    all of them on an accelerator, where one small model leaves the device mostly idle. On a CPU
    one member already keeps the cores busy, and a vmapped step's arrays are K times larger: XLA
    gives every call fresh memory for them, and first touching it costs page faults. Measured on a
    2-core CPU (``scripts/bench_sweep.py --per-step``), 8 Transformer members vmapped touched
    3.7 GB of fresh pages per step and took 720 ms per member-step, against 412 MB and 359 ms with
    the members one after another in a loop inside the program, and 335 MB and 478 ms for a run's
    own step (the loop pays a call's fresh memory once for all its members). Convolutions are the
    exception: XLA's CPU backend runs them ~20x slower inside a loop, and vmapped (one plain
    convolution per member, see :func:`jaxnet.models.common.member_conv`) a ConvNet member-step
    took 96 ms against 98 ms alone. So on a CPU the default is all members for models with
    convolutions and 1 otherwise."""
    if requested is not None:
        return min(requested, pop.size) if requested else pop.size
    if jax.default_backend() != "cpu":
        return pop.size
    return pop.size if _convolves(pop.run) else 1


def _convolves(run: Run) -> bool:
    """Whether the model computes a convolution (found in the trace of its initialisation)."""
    return "conv_general_dilated" in str(jax.make_jaxpr(lambda: run._create_state())())


# ---------------------------------------------------------------------------------------------
# The loop's actions, for every member


class _Loop(actions_lib.Loop):
    """A population's loop view: a member's NaN does not stop the others (it is reported)."""

    def totals(self) -> dict[str, Any]:
        if self._totals is None or self._totals[0] != self.step:
            self._totals = (self.step, jax.device_get(self.sums))
        return self._totals[1]


class _LogMembers(actions_lib.Action):
    """Every ``train.log_every`` steps and at the end: each member's train line, as a run writes it."""

    at_end = True

    def __init__(self, pop: Population, logs: list[Any], diverged: dict[int, int]):
        self.every, self.pop, self.logs, self.diverged = pop.cfg.train.log_every, pop, logs, diverged
        reads = pop.run.lr_schedule is not None  # else the members' optimizer carries its own rate
        self.schedules = [optim.schedule(c.optim, c.train.steps) if reads else None for c in pop.cfgs]

    def __call__(self, loop: actions_lib.Loop) -> None:
        totals = loop.totals()
        now = time.perf_counter()
        rate = loop.interval_steps / (now - loop.interval_start)
        cfg = self.pop.cfg
        losses = []
        for i, log in enumerate(self.logs):
            mine = {k: v[i] for k, v in totals.items()}
            values = actions_lib.interval_values(mine, loop.interval_steps, loop.skip, self.pop.task)
            if int(mine["nonfinite"]) and not loop.skip:
                self.diverged.setdefault(i, int(mine["first_nonfinite"]))
            if self.schedules[i] is not None:
                values["lr"] = float(self.schedules[i](loop.step - 1))
            values.update(steps_per_s=rate, examples_per_s=rate * cfg.train.batch_size)
            if self.pop.text:
                values["tokens_per_s"] = values["examples_per_s"] * cfg.data.seq_len
            log.write(loop.step, "train", values)
            losses.append(values["loss"])
        finite = [x for x in losses if math.isfinite(x)]
        shown = {"best loss": min(finite)} if finite else {}
        loop.progress.update(loop.step, {**shown, "diverged": len(self.diverged), "steps/s": rate})
        loop.sums, loop.interval_steps = None, 0
        loop.interval_start = now


class _ValidateMembers(actions_lib.Action):
    """Every ``train.eval_every`` steps (not at the last step): each member's validation metrics."""

    def __init__(self, pop: Population, logs: list[Any]):
        self.every, self.pop, self.logs = pop.cfg.train.eval_every, pop, logs

    def due(self, loop: actions_lib.Loop) -> bool:
        return super().due(loop) and loop.step != self.pop.cfg.train.steps

    def __call__(self, loop: actions_lib.Loop) -> None:
        results = loop.timed(lambda: self.pop.evaluate(loop.state, "val"))
        for log, val in zip(self.logs, results, strict=True):
            if val:
                log.write(loop.step, "val", val)


class _CheckpointMembers(actions_lib.Action):
    """Every ``train.checkpoint_every`` steps and after the last: one checkpoint per member, in its
    own run directory, as its run would save it."""

    def __init__(self, pop: Population, ckpts: list[Checkpoints]):
        self.every, self.pop, self.ckpts = pop.cfg.train.checkpoint_every, pop, ckpts

    def due(self, loop: actions_lib.Loop) -> bool:
        return super().due(loop) and loop.step != loop.end

    def __call__(self, loop: actions_lib.Loop) -> None:
        self._save(loop)

    def finish(self, loop: actions_lib.Loop) -> None:
        if loop.end > loop.saved_step:
            self._save(loop)
        for c in self.ckpts:
            c.wait()

    def _save(self, loop: actions_lib.Loop) -> None:
        for i, c in enumerate(self.ckpts):
            c.save(loop.step, self.pop.member(loop.state, i))
        loop.saved_step = loop.step


# ---------------------------------------------------------------------------------------------
# Training a population


def _restore(pop: Population, ckpts: list[Checkpoints], say: Callable) -> tuple[Any, int]:
    """The newest step every member has a checkpoint of, restored and stacked; or a fresh state."""
    common_steps = set.intersection(*(set(c.all_steps()) for c in ckpts))
    if not common_steps:
        return pop.init_state(), 0
    step = max(common_steps)
    target = pop.run.abstract_state()
    states = [c.restore(target, step, say=lambda _: None) for c in ckpts]
    if any(int(s.step) != step for s in states):  # a damaged newest checkpoint fell back to an older one
        step = min(int(s.step) for s in states)
        states = [c.restore(target, step, say=lambda _: None) for c in ckpts]
    say(f"resuming {len(ckpts)} members from step {step}")
    return pop.stack(states), step


def _at_once_text(pop: Population) -> str:
    if pop.at_once >= pop.size:
        return "vmapped all at once"
    if pop.at_once == 1:
        return "one after another in a loop"
    return f"vmapped {pop.at_once} at a time in a loop"


def train_population(
    pop: Population,
    dirs: list[Path],
    environment: dict[str, Any],
    interrupts: Interrupts,
    say: Callable,
    parent: str | None = None,
) -> dict[str, Any]:
    """Train (or resume) one program's members, each in its run directory; returns the program's
    timing record. ``parent`` is the sweep's MLflow run, which the members' runs go under."""
    cfg, train_cfg = pop.cfg, pop.cfg.train
    started = time.time()
    ckpts = [Checkpoints(d / "checkpoints", keep=train_cfg.keep_checkpoints) for d in dirs]
    logs: list[Any] = []
    trackers: list[list[Any]] = []
    progress: Any = observe.Quiet()
    try:
        state, start = _restore(pop, ckpts, say)
        custom = pop.run.optimizer_record()
        for d, c in zip(dirs, pop.cfgs, strict=True):
            config_lib.save(c, d / "config.json", run={**environment, **({"optimizer": custom} if custom else {})})
            observe.write_json(d / run_record.INPUTS, run_record.inputs(pop.run))  # what jaxnet.load needs to predict
            if pop.text:
                observe.write_json(d / run_record.VOCAB, run_record.vocab(pop.dataset))  # a chat corpus's template too
        for d, c in zip(dirs, pop.cfgs, strict=True):
            trackers.append(trackers_lib.build(c, d, start, store=d.parent, parent=parent))
            logs.append(observe.MetricsLog(d, resume_step=start, final=start == train_cfg.steps, trackers=trackers[-1]))
        end = train_cfg.steps if not train_cfg.stop_after else min(train_cfg.steps, start + train_cfg.stop_after)
        progress = observe.Progress(train_cfg.steps, start, enabled=train_cfg.progress)
        num_params = state_lib.param_count(pop.member(state, 0).params)
        if start == 0:
            progress.note(
                f"{pop.size} members of {cfg.experiment or 'a run'} in one program ({_at_once_text(pop)}): "
                f"{pop.model.name} "
                f"with {num_params:,} parameters each, {pop.dataset.describe()}, {train_cfg.steps} steps of "
                f"{train_cfg.batch_size} on {pop.mesh.size} {jax.devices()[0].platform} device(s)"
            )
        loop = _Loop(
            pop, dirs[0].parent, state, start, end, observe.Quiet(), progress, skip=train_cfg.on_nonfinite == "skip"
        )
        diverged: dict[int, int] = {}
        actions = [
            actions_lib.StopOnSignal(interrupts),
            _LogMembers(pop, logs, diverged),
            _ValidateMembers(pop, logs),
            _CheckpointMembers(pop, ckpts),
        ]
        compile_seconds = run_loop(pop, loop, actions)
        end = loop.end
        finals: dict[str, list[dict[str, float]]] = {}
        if end == train_cfg.steps:
            for split in ("val", "test"):
                finals[split] = pop.evaluate(loop.state, split)
        steps_per_s = (end - start) / max(loop.seconds - loop.paused, 1e-9) if end > start else None
        for i, (d, log) in enumerate(zip(dirs, logs, strict=True)):
            summary = summary_head(pop, pop.cfgs[i], d, end, num_params, compile_seconds)
            summary["sweep"] = {
                "members_in_program": pop.size,
                "members_at_once": pop.at_once,
                "member": pop.members[i].name,
            }
            if steps_per_s:
                summary["steps_per_s"] = round(steps_per_s, 2)
                summary["examples_per_s"] = round(steps_per_s * train_cfg.batch_size, 1)
            if i in diverged:
                summary["diverged_at_step"] = diverged[i]
            for split, results in finals.items():
                if results[i]:
                    log.write(end, split, results[i])
                    summary[split] = results[i]
            summary["wall_time_s"] = round(time.time() - started, 2)
            summary["environment"] = environment
            log.close()
            observe.plot_curves(d / "metrics.jsonl", d / "curves.png", f"{cfg.experiment}: {pop.members[i].name}")
            summary.update(trackers_lib.summary_fields(trackers[i]))
            common.write_json(d / "summary.json", summary)
            trackers_lib.finish(trackers[i], d, summary, "KILLED" if interrupts.name else "FINISHED")
        logs = []
        return {
            "members": [m.name for m in pop.members],
            "start_step": start,
            "end_step": end,
            "members_at_once": pop.at_once,
            "compile_time_s": round(compile_seconds, 2),
            "steps_per_s": round(steps_per_s, 3) if steps_per_s else None,
            "wall_time_s": round(time.time() - started, 2),
        }
    except BaseException:
        for member in trackers:
            trackers_lib.finish(member, dirs[0], None, "FAILED")
        raise
    finally:
        progress.close()
        for log in logs:
            log.close()
        for c in ckpts:
            c.close()


# ---------------------------------------------------------------------------------------------
# The sweep


def sweep(
    experiment: str | Config,
    grid: dict[str, Sequence[Any]] | Sequence[str],
    workdir: str | Path | None = None,
    *,
    overrides: Sequence[str] = (),
    model: Any = None,
    dataset: Any = None,
    task: tasks.Task | None = None,
    optimizer: optim.UserOptimizer | None = None,
    members_per_program: int = 0,
    members_at_once: int | None = None,
    max_members: int = MAX_MEMBERS,
    add: bool = False,
    say: Callable[[str], Any] = print,
) -> dict[str, Any]:
    """Train every configuration of ``grid`` over ``experiment`` (a name, a path, or a Config),
    vmapping those that can share a program; returns the sweep record (also ``sweep.json``).

    ``grid`` is ``{"optim.lr": [1e-3, 3e-3], "seed": [0, 1, 2]}`` or CLI tokens
    (``["optim.lr=1e-3,3e-3", "seed=0,1,2"]``); ``model``, ``dataset``, ``task`` and ``optimizer``
    are your own work as in :func:`jaxnet.train` (a function of the schedule,
    ``lambda lr: optax.lion(lr)``, gets each member's learning rate; a swept key your optimizer
    does not read is refused). ``members_per_program`` caps a program's members (0: no
    cap); ``members_at_once`` is how many members one vmapped step takes (0: all; None: chosen by
    :func:`members_at_once`). A ``workdir`` holding a sweep of another grid is refused unless
    ``add``: then this grid's members train beside the old ones, which stay in the table, and a
    member whose configuration the old sweep trained (under another name) is not trained again::

        record = jaxnet.sweep("cnn_fashion_mnist:smoke", {"optim.lr": [1e-3, 3e-3], "seed": [0, 1]}, "runs/s")
        print(record["configs"][0])  # the best configuration, its mean and std over seeds
    """
    if isinstance(grid, dict):
        tokens = [f"{k}={(';' if _is_tuple(k) else ',').join(_text(v) for v in vs)}" for k, vs in grid.items()]
        empty = [k for k, vs in grid.items() if not len(vs)]
        if empty:
            raise UserError(f"{empty[0]} has no values; give one or more")
    else:
        tokens = list(grid)
    if members_per_program < 0 or (members_at_once or 0) < 0 or max_members < 1:
        raise UserError(
            f"--members-per-program={members_per_program} --members-at-once={members_at_once} "
            f"--max-members={max_members}: give numbers >= 1 (0 = all members for the first two)"
        )
    swept, fixed = parse(tokens)
    if isinstance(experiment, Config):
        base = config_lib.apply_overrides(experiment, [*fixed, *overrides])
    else:
        base = config_lib.load_experiment(experiment, [*fixed, *overrides])
    members = expand(base, swept, max_members)
    for m in members:
        check_supported(m.cfg)
    trackers_lib.check(base)
    root = Path(workdir) if workdir is not None else Path("runs") / f"sweep-{default_workdir(base).name}"
    everyone, swept_keys = members, swept
    if (root / "sweep.json").is_file():
        members, everyone, swept_keys = _beside_previous(root, members, swept, add)
    dirs = {m.name: root / m.name for m in everyone}
    for m in members:
        common.check_reusable(dirs[m.name], m.cfg)
    groups = programs(members, members_per_program)
    # Every program's data, model and task read and checked before anything is written.
    pops: dict[int, Population] = {}
    datasets: dict[str, Any] = {}
    for number, group in enumerate(groups, 1):
        if not all(_complete(dirs[m.name]) for m in group):
            data_key = json.dumps(group[0].cfg.to_dict()["data"], sort_keys=True)
            given = dataset if dataset is not None else datasets.get(data_key)
            pops[number] = Population(
                group, model=model, dataset=given, task=task, optimizer=optimizer, at_once=members_at_once
            )
            datasets[data_key] = pops[number].dataset
    metric = common.headline_metric(base)
    environment = observe.environment()
    root.mkdir(parents=True, exist_ok=True)
    parent = trackers_lib.sweep_parent(base, root)
    say(
        f"sweep of {len(members)} members over {', '.join(swept)}: {len(groups)} program(s) "
        f"({', '.join(str(len(g)) for g in groups)} members), in {root}"
    )
    timings = []
    with Interrupts() as interrupts:
        for number, group in enumerate(groups, 1):
            if number not in pops:
                continue
            if interrupts.name:
                break
            say(f"program {number} of {len(groups)}: {', '.join(m.name for m in group)}")
            pop = pops.pop(number)
            for m in group:
                dirs[m.name].mkdir(parents=True, exist_ok=True)
            timings.append(
                {
                    "program": number,
                    **train_population(
                        pop, [dirs[m.name] for m in group], environment, interrupts, say, parent and parent.run_id
                    ),
                }
            )
    record = _record(base, swept_keys, everyone, dirs, groups, metric, timings, environment, root)
    if interrupts.name:
        record["interrupted_by"] = interrupts.name
    common.write_json(root / "sweep.json", record)
    (root / "sweep.md").write_text(report(record) + "\n")
    plot(record, root / "sweep.png")
    if parent is not None:
        parent.finish(root, record, "KILLED" if interrupts.name else "FINISHED")
    incomplete = [m for m in record["members"] if not m["complete"]]
    if interrupts.name or incomplete:
        why = f"{interrupts.name} received" if interrupts.name else f"{len(incomplete)} members not finished"
        say(f"{why}: run the same command again to resume ({root})")
    else:
        say(report(record))
    say(f"wrote {common.relpath(root / 'sweep.json')}, sweep.md and sweep.png")
    return record


def _beside_previous(
    root: Path, members: list[Member], swept: dict[str, list[str]], add: bool
) -> tuple[list[Member], list[Member], dict[str, list[str]]]:
    """For a ``root`` that holds a sweep already: the members to train, every member of the
    table, and the swept keys of both. The same grid resumes as it is; another grid is refused
    unless ``add``. A member whose configuration an old member trained is that old member (its
    name and run directory) and is not trained again; an unfinished one resumes with its own grid."""
    try:
        previous = json.loads((root / "sweep.json").read_text())
        old_names = [m["name"] for m in previous["members"]]
        old_keys = dict(previous["keys"])
    except (OSError, ValueError, KeyError, TypeError):
        raise UserError(f"{root}/sweep.json is not a sweep record; pass a fresh --workdir") from None
    if old_names == [m.name for m in members]:
        return members, members, swept
    if not add:
        shown = " ".join(f"{k}={','.join(map(str, v))}" for k, v in old_keys.items())
        raise UserError(
            f"{root} holds a sweep of another grid ({shown}); pass --add to train this grid's new members beside "
            "it (the table keeps both), or a fresh --workdir"
        )
    old = {}
    for name in old_names:
        path = root / name / "config.json"
        if path.is_file():  # a member never started has nothing to keep
            old[name] = config_lib.load(path)
    by_run = {common.run_key(cfg): name for name, cfg in old.items()}
    table = [dataclasses.replace(m, name=by_run.get(common.run_key(m.cfg), m.name)) for m in members]
    mine = {m.name for m in table}
    table += [Member(name, {}, cfg) for name, cfg in old.items() if name not in mine]
    keys = [*old_keys, *(k for k in swept if k not in old_keys)]
    for m in table:
        m.values = {k: _get(m.cfg, k) for k in keys}
    texts = {k: list(dict.fromkeys(_text(m.values[k]) for m in table)) for k in keys}
    return [m for m in table if m.name not in old], table, texts


def _text(value: Any) -> str:
    if isinstance(value, tuple | list):
        return ",".join(str(v) for v in value)
    return str(value)


def _complete(workdir: Path) -> bool:
    try:
        return bool(json.loads((workdir / "summary.json").read_text()).get("complete"))
    except (OSError, ValueError):
        return False


def _record(
    base: Config,
    swept: dict[str, list[str]],
    members: list[Member],
    dirs: dict[str, Path],
    groups: list[list[Member]],
    metric: str,
    timings: list[dict[str, Any]],
    environment: dict[str, Any],
    root: Path,
) -> dict[str, Any]:
    rows = []
    for m in members:
        summary: dict[str, Any] = {}
        try:
            summary = json.loads((dirs[m.name] / "summary.json").read_text())
        except (OSError, ValueError):
            pass
        rows.append(
            {
                "name": m.name,
                "values": m.values,
                "workdir": str(dirs[m.name]),
                "complete": bool(summary.get("complete")),
                "step": summary.get("step", 0),
                "val": summary.get("val", {}),
                "test": summary.get("test", {}),
                "diverged_at_step": summary.get("diverged_at_step"),
                "curve": common.val_curve(dirs[m.name], metric),
            }
        )
    if not any(metric in r["val"] for r in rows):  # a task of its own (regression, ...): judged by its loss
        metric = "loss" if any("loss" in r["val"] for r in rows) else metric
        for row in rows:
            row["curve"] = common.val_curve(Path(row["workdir"]), metric)
    keys = [k for k in swept if k != "seed"]
    configs: dict[str, dict[str, Any]] = {}
    for row in rows:
        values = {k: row["values"][k] for k in keys}
        entry = configs.setdefault(json.dumps(values, default=str), {"values": values, "members": []})
        entry["members"].append(row["name"])
    by_name = {r["name"]: r for r in rows}
    for entry in configs.values():
        for split in ("val", "test"):
            # a diverged member's metrics (NaN loss, an accuracy of NaN logits) are not a result
            xs = [by_name[n][split].get(metric) for n in entry["members"] if by_name[n]["diverged_at_step"] is None]
            xs = [x for x in xs if isinstance(x, int | float) and math.isfinite(x)]
            entry[f"{split}_mean"] = statistics.fmean(xs) if xs else None
            entry[f"{split}_std"] = statistics.stdev(xs) if len(xs) > 1 else (0.0 if xs else None)
            entry[f"{split}_n"] = len(xs)
        entry["diverged"] = sum(by_name[n]["diverged_at_step"] is not None for n in entry["members"])
    sign = -1 if common.higher_is_better(metric) else 1
    ordered = sorted(configs.values(), key=lambda e: (e["val_mean"] is None, sign * (e["val_mean"] or 0)))
    return {
        "kind": "sweep",
        "experiment": base.experiment,
        "workdir": str(root),
        "metric": metric,
        "higher_is_better": common.higher_is_better(metric),
        "keys": swept,
        "batched": [k for k in swept if k in BATCHED],
        "programs": [[m.name for m in g] for g in groups],
        "timings": timings,
        "members": rows,
        "configs": ordered,
        "environment": environment,
    }


def report(record: dict[str, Any]) -> str:
    """The sweep's table (markdown): each configuration's mean and standard deviation over its
    seeds of the validation and test metric, best validation first."""
    metric = record["metric"]
    keys = [k for k in record["keys"] if k != "seed"]
    lines = [
        f"Sweep of {record['experiment'] or 'a run'}: {len(record['members'])} members, "
        f"{len(record['programs'])} program(s); {metric} ({'higher' if record['higher_is_better'] else 'lower'} is "
        "better), mean ± standard deviation over seeds.",
        "",
        "| " + " | ".join([*keys, "seeds", f"val {metric}", f"test {metric}"]) + " |",
        "|" + "---|" * (len(keys) + 3),
    ]
    for e in record["configs"]:
        cells = [str(e["values"][k]) for k in keys]
        cells.append(str(len(e["members"])))
        for split in ("val", "test"):
            mean, std = e[f"{split}_mean"], e[f"{split}_std"]
            if mean is None:
                cells.append("diverged" if e["diverged"] else "-")
            else:
                cells.append(
                    f"{common.fmt(mean)} ± {common.fmt(std, 2)}"
                    + (f" ({e['diverged']} diverged)" if e["diverged"] else "")
                )
        lines.append("| " + " | ".join(cells) + " |")
    diverged = [m["name"] for m in record["members"] if m.get("diverged_at_step")]
    if diverged:
        lines += ["", f"Diverged (NaN or Inf loss): {', '.join(diverged)}."]
    return "\n".join(lines)


def plot(record: dict[str, Any], path: Path) -> None:
    """sweep.png: the validation metric against each swept key (mean over seeds, error bars one
    standard deviation), and every member's validation curve."""
    plt = common.pyplot()
    metric = record["metric"]
    keys = [k for k in record["keys"] if k != "seed"] or ["seed"]
    fig, axes = plt.subplots(1, len(keys) + 1, figsize=(4.5 * (len(keys) + 1), 3.8), squeeze=False)
    for ax, key in zip(axes[0], keys, strict=False):
        others = [k for k in keys if k != key]
        lines: dict[str, list[tuple[Any, Any, Any]]] = {}
        source = (
            record["configs"]
            if key != "seed"
            else [
                {"values": {"seed": m["values"]["seed"]}, "val_mean": m["val"].get(metric), "val_std": 0.0}
                for m in record["members"]
            ]
        )
        for e in source:
            label = ", ".join(f"{k}={e['values'][k]}" for k in others)
            lines.setdefault(label, []).append((e["values"][key], e["val_mean"], e["val_std"]))
        texts = record["keys"][key]
        numeric = all(_number(v) is not None for v in texts)
        order = {str(v): i for i, v in enumerate(texts)}  # a key of tuples: its values in the order given
        for label, points in lines.items():
            points = [p for p in points if p[1] is not None]
            if not numeric:
                points = [(order.get(_text(p[0]), 0), p[1], p[2]) for p in points]
            points = sorted(points, key=lambda p: p[0])
            if points:
                xs, ys, es = zip(*points, strict=True)
                ax.errorbar(xs, ys, yerr=es, marker="o", capsize=3, label=label or None)
        values = [_number(v) for v in texts]
        if not numeric:
            ax.set_xticks(range(len(texts)), texts)
        elif min(values) > 0 and max(values) / min(values) >= 10:
            ax.set_xscale("log")
            ax.set_xticks(values, texts)  # the swept values, as given, instead of crowded minor ticks
            ax.minorticks_off()
        ax.set_xlabel(key)
        ax.set_ylabel(f"val {metric}")
        if any(lines):
            ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    ax = axes[0][-1]
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    config_of = {name: i for i, e in enumerate(record["configs"]) for name in e["members"]}
    labelled: set[int] = set()
    for m in record["members"]:
        if m["curve"]:
            steps, ys = zip(*m["curve"], strict=True)
            i = config_of[m["name"]]
            label = None
            if i not in labelled and len(record["configs"]) <= 10:
                label = ", ".join(f"{k}={v}" for k, v in record["configs"][i]["values"].items()) or None
                labelled.add(i)
            ax.plot(steps, ys, alpha=0.7, linewidth=1, color=colours[i % len(colours)], label=label)
    if labelled:
        ax.legend(fontsize=7)
    ax.set_xlabel("step")
    ax.set_ylabel(f"val {metric}")
    ax.set_title("every member", fontsize=9)
    ax.grid(alpha=0.3)
    fig.suptitle(f"jaxnet sweep: {record['experiment']}", fontsize=10)
    common.save_figure(fig, path)


def _number(text: Any) -> float | None:
    try:
        return float(text)
    except (TypeError, ValueError):
        return None


__all__ = ["BATCHED", "MAX_MEMBERS", "Population", "report", "sweep"]

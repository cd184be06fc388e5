"""train.steps_per_call=K: K steps in one compiled call give the same run as one step per call
(the same batches, updates, logs and checkpoints), resume exactly, and bad settings are one line."""

from __future__ import annotations

import itertools
import json

import pytest
from conftest import MLP, arrays_config, linear_data

import jaxnet
from jaxnet import config as config_lib
from jaxnet import observe
from jaxnet.train.loop import call_sizes

DATA = {"train": linear_data(96, 0), "val": linear_data(16, 1), "test": linear_data(16, 2)}
SETTINGS = ["optim.lr=1e-2", "train.steps=10", "train.batch_size=8", "train.eval_batch_size=16"]
SETTINGS += ["train.log_every=4", "train.eval_every=8", "train.checkpoint_every=4"]


def train(workdir, *extra: str, actions=None) -> dict:
    cfg = arrays_config("k", SETTINGS, *extra)
    return jaxnet.train(
        cfg, workdir, model=MLP(), dataset=jaxnet.data.arrays(**DATA), task=jaxnet.tasks.regression(), actions=actions
    )


def logged(workdir) -> list[tuple]:
    """Every logged value but the speeds, in order."""
    rows = observe.read_metrics(workdir / "metrics.jsonl")
    speed = ("steps_per_s", "examples_per_s")
    return [(r["step"], r["split"], sorted((k, v) for k, v in r.items() if k not in speed)) for r in rows]


def test_calls_end_on_multiples_of_k_with_single_steps_around_them():
    # something due every K steps (a log every 4 with 4 steps a call)
    assert list(call_sizes(0, 10, 4, (4,))) == [4, 4, 1, 1]
    assert list(call_sizes(3, 20, 4, (4,))) == [1, 4, 4, 4, 4]  # resumed from step 3
    assert list(call_sizes(5, 7, 4, (4,))) == [1, 1]
    assert list(call_sizes(0, 6, 1, (1,))) == [1] * 6


def test_k_steps_per_call_log_the_same_values_and_reach_the_same_parameters(tmp_path):
    one = train(tmp_path / "one")
    four = train(tmp_path / "four", "train.steps_per_call=4")  # calls of 4, 4, then 1 and 1
    assert logged(tmp_path / "four") == logged(tmp_path / "one")
    assert four["test"] == one["test"]  # bitwise: the loss of every test example summed the same way
    assert sorted(p.name for p in (tmp_path / "four" / "checkpoints").iterdir()) == sorted(
        p.name for p in (tmp_path / "one" / "checkpoints").iterdir()
    )


def test_a_run_of_k_steps_per_call_resumes_exactly_from_a_step_between_calls(tmp_path):
    whole = train(tmp_path / "whole", "train.steps_per_call=2")
    # Stopped after 3 steps (a call of 2, then 1), resumed: 1 step to reach a multiple of 2, then calls of 2.
    train(tmp_path / "resumed", "train.steps_per_call=2", "train.stop_after=3")
    assert json.loads((tmp_path / "resumed" / "summary.json").read_text())["step"] == 3
    resumed = train(tmp_path / "resumed", "train.steps_per_call=2")
    assert resumed["test"] == whole["test"]
    val = lambda workdir: [row for row in logged(workdir) if row[1] != "train"]  # noqa: E731
    assert val(tmp_path / "resumed") == val(tmp_path / "whole")  # step 8's validation, the end's val and test


def test_an_action_sees_the_run_after_each_call_at_its_multiples(tmp_path):
    seen = []
    train(tmp_path / "run", "train.steps_per_call=2", actions=[jaxnet.every(4, lambda loop: seen.append(loop.step))])
    assert seen == [4, 8]


@pytest.mark.parametrize(
    "extra",
    [
        ["train.steps_per_call=3"],  # logs every 4: calls of 3, then 1 to reach step 4, ...
        ["train.steps_per_call=4", "train.eval_every=6"],
        ["train.steps_per_call=4", "train.checkpoint_every=3"],
    ],
)
def test_intervals_that_k_does_not_divide_still_fall_on_their_steps(tmp_path, extra):
    """Single steps lead up to a log, evaluation or checkpoint that a call of K would pass over."""
    k = train(tmp_path / "k", *extra)
    one = train(tmp_path / "one", *[e for e in extra if "steps_per_call" not in e])
    assert logged(tmp_path / "k") == logged(tmp_path / "one")
    assert k["test"] == one["test"]
    assert sorted(p.name for p in (tmp_path / "k" / "checkpoints").iterdir()) == sorted(
        p.name for p in (tmp_path / "one" / "checkpoints").iterdir()
    )


def test_a_negative_steps_per_call_is_a_one_line_error_before_anything_is_written(tmp_path):
    with pytest.raises(jaxnet.UserError, match="train.steps_per_call") as caught:
        train(tmp_path / "run", "train.steps_per_call=-1")
    assert "\n" not in str(caught.value)
    assert not (tmp_path / "run").exists()


def test_an_interval_shorter_than_k_is_noted_in_one_line():
    from jaxnet.train.loop import short_interval_notice

    note = short_interval_notice(4, (2, 8, 0))
    assert "every 2 steps, fewer than train.steps_per_call=4" in note and "\n" not in note
    assert short_interval_notice(4, (4, 6, 0)) is None  # 6 costs single steps before its multiples only
    assert short_interval_notice(1, (1,)) is None


def test_an_action_whose_interval_k_does_not_divide_sees_the_run_at_its_multiples(tmp_path):
    seen = []
    train(tmp_path / "run", "train.steps_per_call=2", actions=[jaxnet.every(3, lambda loop: seen.append(loop.step))])
    assert seen == [3, 6, 9]


def test_calls_split_at_every_interval_k_does_not_divide():
    """The LSTM experiment's shape: 8 steps a call, logs every 200 steps, an epoch of 2,323."""
    sizes = list(call_sizes(0, 2410, 8, (200, 2323, 2323, 0)))
    assert sizes == [8] * 290 + [1] * 3 + [8] * 9 + [1] * 5 + [8] + [1] * 2
    ends = set(itertools.accumulate(sizes))
    assert {*range(200, 2401, 200), 2323} <= ends
    assert list(call_sizes(2321, 2335, 8, (200, 2323))) == [1, 1, 8, 1, 1, 1, 1]  # resumed mid-way
    assert list(call_sizes(0, 10, 4, ())) == [4, 4, 1, 1]  # nothing due: calls of K up to the end
    assert list(call_sizes(0, 12, 4, (4,), stops=(5, 7))) == [4, 1, 1, 1, 1, 4]  # a window traced from 6 to 7


def test_the_processes_agree_where_to_stop_on_a_signal_by_counting_calls(monkeypatch):
    """JAX's preemption sync point is one number every process must pass exactly: the steps of
    calls of 8 jump over it, the calls do not."""
    from types import SimpleNamespace

    from jax.experimental import multihost_utils

    from jaxnet.train.actions import StopOnSignal
    from jaxnet.train.loop import Interrupts

    sync_point = 3  # the highest count any process reported when the notice came, plus one
    monkeypatch.setattr(multihost_utils, "reached_preemption_sync_point", lambda n: n == sync_point)
    interrupts = Interrupts()
    interrupts.multi_process = True
    action = StopOnSignal(interrupts)
    loop = SimpleNamespace(step=0, end=80, stop=lambda: setattr(loop, "end", loop.step))
    while loop.step < loop.end:
        loop.step += 8
        action(loop)
    assert loop.end == 24  # after the third call


@pytest.mark.parametrize(
    "intervals, everies, k",
    [
        ((50, 500, 500), (), 5),  # the default ConvNet's
        ((40, 400, 0), (), 8),  # at most 8; 0 (only at the end) divides anything
        ((4, 8, 4), (), 4),
        ((4, 8, 4), (6,), 2),  # an action every 6 steps
        ((7, 0, 0), (), 7),
        ((50, 500, 500), (3,), 1),
        ((200, 2323, 2323), (), 8),  # intervals of 100 steps or more need not be multiples
        ((10, 150, 150), (), 5),
    ],
)
def test_auto_steps_per_call_is_the_largest_up_to_8_dividing_every_short_interval(intervals, everies, k):
    log, val, ckpt = intervals
    cfg = jaxnet.apply_overrides(
        jaxnet.Config(), ["train.steps_per_call=0", f"train.log_every={log}", f"train.eval_every={val}",
                          f"train.checkpoint_every={ckpt}"]
    )  # fmt: skip
    assert config_lib.steps_per_call(cfg, everies) == k
    cfg.train.steps_per_call = 3
    assert config_lib.steps_per_call(cfg, everies) == 3  # a number given is kept (and checked elsewhere)


def test_auto_steps_per_call_fits_an_action_and_logs_like_one_step_per_call(tmp_path):
    seen = []
    action = jaxnet.every(2, lambda loop: seen.append(loop.step))
    auto = train(tmp_path / "auto", "train.steps_per_call=0", actions=[action])  # intervals 4, 8, 4 and 2: K = 2
    one = train(tmp_path / "one")
    assert seen == [2, 4, 6, 8, 10]
    assert logged(tmp_path / "auto") == logged(tmp_path / "one")
    assert auto["test"] == one["test"]


def test_the_one_step_call_equals_the_step_then_its_metrics_added_apart():
    """What the runner calls for one step (the step and its metrics' totals in one program) reaches
    the same state and the same totals, bitwise, as the step followed by a separate ``accumulate``."""
    import jax
    import numpy as np

    from jaxnet.train.loop import Run
    from jaxnet.train.step import NO_STEP, accumulate, metric_zeros

    cfg = arrays_config("k", SETTINGS)
    run = Run(cfg, model=MLP(), dataset=jaxnet.data.arrays(**DATA), task=jaxnet.tasks.regression())
    batches = [run.put_batch(b) for b, _ in zip(run.train_batches(0), range(3), strict=False)]
    apart, summed = run.init_state(), run.init_state()
    totals_apart = totals_summed = None
    losses = []
    for batch in batches:
        apart, metrics = run.train_step(apart, batch)
        losses.append(float(metrics["loss"]))
        totals_apart = metrics if totals_apart is None else accumulate(totals_apart, metrics)
        if totals_summed is None:
            totals_summed = metric_zeros(metrics)
        summed, totals_summed = run.train_step_summed(summed, batch, totals_summed)

    def same(a, b):
        return all(np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True))

    assert not same(summed.params, run.init_state().params)  # three steps moved the parameters
    assert same(summed.params, apart.params) and same(summed.opt_state, apart.opt_state)
    assert same(totals_summed, totals_apart)
    assert float(totals_summed["loss"]) == pytest.approx(sum(losses), rel=1e-6)
    assert int(totals_summed["first_nonfinite"]) == NO_STEP and int(totals_summed["nonfinite"]) == 0


def test_a_k_step_call_is_unrolled_only_where_the_step_convolves():
    """XLA on a CPU runs convolutions inside a loop many times slower; any other step stays in one."""
    import jax
    import jax.numpy as jnp

    from jaxnet.train.step import convolves

    image, kernel = jnp.zeros((1, 1, 4, 4)), jnp.zeros((1, 1, 3, 3))
    conv = jax.jit(lambda x, w: jax.lax.conv(x, w, (1, 1), "SAME"))
    assert convolves(jax.grad(lambda w, x: jnp.sum(conv(x, w))), kernel, image)  # nested in jit and grad
    assert not convolves(jax.grad(lambda w, x: jnp.sum(jnp.tanh(x @ w))), jnp.zeros((4, 3)), jnp.zeros((2, 4)))


def test_an_evaluation_leaves_out_its_own_time_and_not_the_steps_still_running():
    """Steps run asynchronously: the time ``Loop.timed`` leaves out of the steps' time starts once
    the steps already dispatched are done."""
    import time
    from types import SimpleNamespace

    import jax
    import jax.numpy as jnp

    from jaxnet.train.actions import Loop

    slow = jax.jit(lambda x: jax.lax.fori_loop(0, 60, lambda i, y: jnp.tanh(y @ y), x))
    x = jnp.full((400, 400), 0.01)
    jax.block_until_ready(slow(x))
    started = time.perf_counter()
    jax.block_until_ready(slow(x))
    step = time.perf_counter() - started
    loop = Loop(SimpleNamespace(cfg=None), None, slow(x), 0, 1, None, None, False)  # dispatched, running
    loop.timed(lambda: jax.block_until_ready(loop.state))  # an evaluation reads the state
    assert loop.paused < step / 2

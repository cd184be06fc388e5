"""Where the default ConvNet's CPU train step spends its time, and what each change buys, side by side.

    python scripts/profile_conv.py                       # every variant and PyTorch, 7 rounds
    python scripts/profile_conv.py --rounds 3 --steps 20 --no-torch
    python scripts/profile_conv.py --variant before --variant after --breakdown

One process builds the runner's step of ``cnn_fashion_mnist`` (batch 128) in several variants,
each the same model and data with one thing changed, and the PyTorch peer of
:mod:`jaxnet.bench.torch_peers`, then times them in alternation (A B C ... A B C ...) on batches
already in memory, after a warm-up: wall and process CPU milliseconds per step and the CPU used
(200 % = both cores of a 2-core machine). On a machine that other jobs share, the ratios between
variants of one round mean more than any one time, and the load average is kept with each round.

Variants (``--variant``, default all):

- ``before``: the step as it was: 2x2 max pooling as a reshape and a max over two axes, and XLA's
  default CPU libraries (YNNPACK for dots, convolutions and reductions).
- ``pool``: max pooling as the maximum of four strided views, with an elementwise gradient
  (:func:`jaxnet.models.cnn.max_pool_2x2`).
- ``after``: ``pool`` compiled with :func:`jaxnet.xla_options.compiler_options` (convolutions
  on XLA's own multi-threaded kernels): what jaxnet runs.
- ``im2col1``: ``after`` with the first convolution (1 input channel) as nine shifted views
  concatenated and one matmul, a candidate that is not the default.
- ``after_k5``: ``after`` with ``train.steps_per_call=5`` (five steps per compiled call).

``--pieces`` also times each piece of the step (convolutions, relu + pooling in both forms,
dense) jitted on its own at the step's shapes, under XLA's defaults and under jaxnet's options,
and the same pieces in PyTorch (unless ``--no-torch``).
``--numerics`` also records how far jaxnet's options move one step's gradients and the smoke
runs' losses from XLA's defaults.
``--breakdown`` also records, for each variant, XLA's own trace of its steps (``jax.profiler``):
the milliseconds per step of each operation of the compiled program, grouped by the layer and
the pass (forward / backward) its metadata names. These are the durations of the operations'
events: XLA's own (Eigen) convolutions hand their work to the thread pool and their events come
out far shorter than the work (use ``--pieces`` for them), and a busy machine stretches them all.
The results go to ``benchmarks/results/conv-cpu-<date>[-<tag>].json``.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import glob
import json
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = ("before", "pool", "after", "im2col1", "after_k5")
K = 5  # steps per call of the after_k5 variant
# XLA's default YNNPACK list, named so that a variant compiles with the defaults whatever jaxnet sets.
XLA_DEFAULT = {
    "xla_cpu_experimental_ynn_fusion_type": "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT,"
    "LIBRARY_FUSION_TYPE_INDIVIDUAL_CONVOLUTION,LIBRARY_FUSION_TYPE_REDUCE"
}


def reshape_max_pool(x: Any) -> Any:
    """The ConvNet's max pooling before: a reshape and a max over the two window axes."""
    n, h, w, c = x.shape
    x = x[:, : h - h % 2, : w - w % 2]
    return x.reshape(n, h // 2, 2, w // 2, 2, c).max(axis=(2, 4))


def shifted_views_conv(lhs: Any, rhs: Any, window_strides: Any, padding: Any, **kwargs: Any) -> Any:
    """A stride-1 NHWC x HWIO convolution as nine shifted views concatenated and one matmul."""
    import jax.numpy as jnp
    from jax import lax

    kh, kw, cin, cout = rhs.shape
    n, h, w, _ = lhs.shape
    if isinstance(padding, str):
        padding = lax.padtype_to_pads((h, w), (kh, kw), window_strides, padding)
    (top, bottom), (left, right) = padding
    padded = jnp.pad(lhs, ((0, 0), (top, bottom), (left, right), (0, 0)))
    ho, wo = h + top + bottom - kh + 1, w + left + right - kw + 1
    views = [padded[:, i : i + ho, j : j + wo, :] for i in range(kh) for j in range(kw)]
    return jnp.concatenate(views, axis=-1) @ rhs.reshape(kh * kw * cin, cout)


def build_variant(name: str, cfg: Any, dataset: Any) -> tuple[Any, Any]:
    """The runner's ``Run`` and (compiled step, initial state) for variant ``name`` (the model
    patched while it is traced). ``after_k5``'s step takes five batches stacked and does five steps."""
    import jax
    import jax.numpy as jnp

    import jaxnet.models.cnn as cnn
    from jaxnet import config as config_lib
    from jaxnet.train.loop import Run
    from jaxnet.train.step import metric_zeros

    saved = cnn.max_pool_2x2, cnn.conv_for_members, cnn._conv
    if name == "before":
        cnn.max_pool_2x2 = reshape_max_pool
    if name == "im2col1":
        plain = cnn._conv

        def conv(features: int, kernel: int, strides: int = 1, *, first: bool = False, **kw: Any) -> Any:
            if first:
                cnn.conv_for_members = lambda: shifted_views_conv
            try:
                return plain(features, kernel, strides, first=first, **kw)
            finally:
                cnn.conv_for_members = saved[1]

        cnn._conv = conv
    if name == "after_k5":
        cfg = config_lib.apply_overrides(cfg, [f"train.steps_per_call={K}", f"train.log_every={10 * K}"])
    run = Run(cfg, dataset=dataset)
    state = run.init_state()
    batch = run.put_batch(next(run.train_batches(0)))
    options = XLA_DEFAULT if name in ("before", "pool") else None
    compiled = run.train_step.lower(state, batch).compile(compiler_options=options)
    if name == "after_k5":
        batch = jax.tree.map(lambda x: jnp.stack([x] * K), batch)
        zeros = metric_zeros(jax.eval_shape(run.train_step, state, jax.tree.map(lambda x: x[0], batch))[1])
        program = run.train_calls.lower(state, batch, zeros).compile()
        compiled = lambda state, batches: program(state, batches, zeros)  # noqa: E731
    cnn.max_pool_2x2, cnn.conv_for_members, cnn._conv = saved
    jax.block_until_ready(compiled(state, batch))  # compile-time work out of the way; state donated
    return run, (compiled, run.init_state())


def breakdown(compiled: Any, state: Any, batches: list, steps: int) -> tuple[dict, Any]:
    """Milliseconds per step of each group of the compiled program's operations (XLA's trace)."""
    import jax
    from jax.profiler import ProfileData

    names = {}
    entry = compiled.as_text().split("\nENTRY", 1)[1]
    for line in entry.splitlines():
        m = re.match(r"\s*(?:ROOT )?%([\w.\-]+) = ", line)
        if m:
            op = re.search(r'op_name="([^"]*)"', line)
            names[m.group(1)] = group(op.group(1) if op else "")
    with tempfile.TemporaryDirectory() as trace_dir:
        jax.profiler.start_trace(trace_dir)
        for i in range(steps):
            state, metrics = compiled(state, batches[i % len(batches)])
        jax.block_until_ready(metrics)
        jax.profiler.stop_trace()
        profile = ProfileData.from_file(sorted(glob.glob(f"{trace_dir}/**/*.xplane.pb", recursive=True))[-1])
        total = collections.Counter()
        for plane in profile.planes:
            for line in plane.lines:
                for event in line.events:
                    if event.name in names:
                        total[names[event.name]] += event.duration_ns
    ms = {k: round(v / 1e6 / steps, 3) for k, v in total.most_common()}
    return {"total": round(sum(ms.values()), 2), **ms}, state


def group(op_name: str) -> str:
    """A readable group for an HLO op's ``op_name`` metadata: layer and pass."""
    if not op_name:
        return "layout copies (no source op)"
    backward = "transpose(jvp" in op_name
    layer = re.search(r"(Conv_\d|Dense_\d|Dropout_\d)", op_name)
    if layer:
        what = layer.group(1)
        if what.startswith("Conv") and "conv_general_dilated" not in op_name:
            what += " bias"
    elif "ConvNet" in op_name:
        what = "relu + max pool"
    else:
        return "loss, optimizer, metrics"
    return f"{what} {'backward' if backward else 'forward'}"


def pieces(rounds: int, repeats: int = 10, with_torch: bool = False) -> dict:
    """Milliseconds (wall and CPU) of each piece of the ConvNet's step at its shapes (batch 128),
    each jitted on its own, under XLA's default CPU libraries and under jaxnet's options, timed in
    alternation: the convolutions forward and backward, each relu + max pool layer forward and
    backward in both formulations, and the dense layers. ``with_torch``: the same pieces in
    PyTorch too (setting ``pytorch``), the inputs in the channels-last memory the PyTorch peer's
    ConvNet uses (:mod:`jaxnet.bench.torch_peers`), each gradient by ``torch.autograd.grad`` after
    its forward pass, as ``jax.grad`` includes it."""
    import jax
    from jax import lax

    from jaxnet import xla_options
    from jaxnet.models.cnn import max_pool_2x2

    keys = iter(jax.random.split(jax.random.PRNGKey(0), 16))
    normal = lambda *shape: jax.random.normal(next(keys), shape)  # noqa: E731
    x0, x1, h = normal(128, 28, 28, 1), normal(128, 14, 14, 32), normal(128, 3136)
    w0, w1, w2 = normal(3, 3, 1, 32), normal(3, 3, 32, 64), normal(3136, 256)
    z0, z1 = normal(128, 28, 28, 32), normal(128, 14, 14, 64)

    def conv(x: Any, w: Any) -> Any:
        return lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))

    def layer_grad(pool: Any) -> Any:  # relu + pool, forward and backward (the gradient of a sum of squares)
        return jax.grad(lambda z: (pool(jax.nn.relu(z)) ** 2).sum())

    work = {
        "conv 1 forward": (conv, (x0, w0)),
        "conv 1 kernel gradient": (jax.grad(lambda w, x: (conv(x, w) ** 2).sum()), (w0, x0)),
        "conv 2 forward": (conv, (x1, w1)),
        "conv 2 input + kernel gradients": (jax.grad(lambda x, w: (conv(x, w) ** 2).sum(), (0, 1)), (x1, w1)),
        "relu + pool 1 fwd+bwd, reshape + max": (layer_grad(reshape_max_pool), (z0,)),
        "relu + pool 1 fwd+bwd, strided views": (layer_grad(max_pool_2x2), (z0,)),
        "relu + pool 2 fwd+bwd, reshape + max": (layer_grad(reshape_max_pool), (z1,)),
        "relu + pool 2 fwd+bwd, strided views": (layer_grad(max_pool_2x2), (z1,)),
        "dense 3136x256 fwd+bwd": (jax.grad(lambda h, w: ((h @ w) ** 2).sum(), (0, 1)), (h, w2)),
    }
    settings = {"xla default": XLA_DEFAULT, "jaxnet options": xla_options.compiler_options()}
    compiled = {}  # (piece, setting) -> a call that runs the piece once, to completion
    for name, (fn, args) in work.items():
        for setting, options in settings.items():
            program = jax.jit(fn).lower(*args).compile(compiler_options=options)
            jax.block_until_ready(program(*args))
            compiled[name, setting] = lambda program=program, args=args: jax.block_until_ready(program(*args))
    if with_torch:
        for name, call in torch_pieces().items():
            call()  # a first call out of the way, as the compiled pieces had theirs
            compiled[name, "pytorch"] = call
    times = {key: [] for key in compiled}
    for _ in range(rounds):
        for key, call in compiled.items():
            cpu, start = time.process_time(), time.perf_counter()
            for _ in range(repeats):
                call()
            times[key].append((time.perf_counter() - start, time.process_time() - cpu))
    result = {}
    for (name, setting), rows in times.items():
        wall = statistics.median(w for w, _ in rows) / repeats
        cpu = statistics.median(c for _, c in rows) / repeats
        result.setdefault(name, {})[setting] = {
            "ms": round(1000 * wall, 3), "cpu_ms": round(1000 * cpu, 3), "cpu_percent": round(100 * cpu / wall, 1)
        }  # fmt: skip
        print(f"{name:40s} {setting:15s} {1000 * wall:7.2f} ms {1000 * cpu:7.2f} CPU ms", flush=True)
    return result


def torch_pieces() -> dict:
    """The PyTorch calls of :func:`pieces` (the same names; its own max pooling under its own), in
    channels-last memory, on all cores."""
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(os.cpu_count() or 1)  # as jaxnet bench sets it for its PyTorch peer
    last = lambda *shape: torch.randn(*shape).to(memory_format=torch.channels_last)  # noqa: E731
    x0, x1, z0, z1 = last(128, 1, 28, 28), last(128, 32, 14, 14), last(128, 32, 28, 28), last(128, 64, 14, 14)
    w0, w1, h, w2 = torch.randn(32, 1, 3, 3), torch.randn(64, 32, 3, 3), torch.randn(128, 3136), torch.randn(3136, 256)

    def forward(x: Any, w: Any) -> Any:
        with torch.no_grad():
            return F.conv2d(x, w, padding=1)

    def grads(loss: Any, *leaves: Any) -> Any:
        leaves = [t.detach().requires_grad_(True) for t in leaves]
        return lambda: torch.autograd.grad(loss(*leaves), leaves)

    square_conv = lambda x, w: (F.conv2d(x, w, padding=1) ** 2).sum()  # noqa: E731
    square_pool = lambda z: (F.max_pool2d(F.relu(z), 2) ** 2).sum()  # noqa: E731
    return {
        "conv 1 forward": lambda: forward(x0, w0),
        "conv 1 kernel gradient": grads(lambda w: square_conv(x0, w), w0),
        "conv 2 forward": lambda: forward(x1, w1),
        "conv 2 input + kernel gradients": grads(square_conv, x1, w1),
        "relu + pool 1 fwd+bwd, F.max_pool2d": grads(square_pool, z0),
        "relu + pool 2 fwd+bwd, F.max_pool2d": grads(square_pool, z1),
        "dense 3136x256 fwd+bwd": grads(lambda h, w: ((h @ w) ** 2).sum(), h, w2),
    }


def numerics(families: tuple[str, ...] = ("cnn_fashion_mnist", "lstm_shakespeare", "transformer_shakespeare")) -> dict:
    """How far jaxnet's CPU options move the numbers from XLA's defaults: one ConvNet step's loss
    and gradients (max abs difference per parameter), and each experiment's smoke run trained
    twice (``XLA_FLAGS`` naming XLA's default libraries, which jaxnet then leaves alone, against
    jaxnet's options): the largest difference of any logged loss."""
    import subprocess

    import jax

    from jaxnet import xla_options
    from jaxnet.bench import CASES, case_config, case_dataset
    from jaxnet.train.loop import Run
    from jaxnet.train.step import make_grad_fn

    case = CASES["cnn"]
    cfg = case_config(case, smoke=False)
    run = Run(cfg, dataset=case_dataset(case, cfg))
    state = run.init_state()
    args = (state.params, state.model_state, run.put_batch(next(run.train_batches(0))), jax.random.PRNGKey(0))
    program = jax.jit(make_grad_fn(run.model, run.task)).lower(*args)
    (loss_a, _), grads_a = program.compile(compiler_options=XLA_DEFAULT)(*args)
    (loss_b, _), grads_b = program.compile(compiler_options=xla_options.compiler_options())(*args)
    diff = jax.tree.map(lambda a, b: float(abs(a - b).max()), grads_a, grads_b)
    result = {
        "one_step": {
            "loss_abs_diff": abs(float(loss_a) - float(loss_b)),
            "grad_max_abs_diff": {jax.tree_util.keystr(k): v for k, v in jax.tree_util.tree_leaves_with_path(diff)},
        },
        "smoke_runs": {},
    }
    flag = "--xla_cpu_experimental_ynn_fusion_type=" + XLA_DEFAULT["xla_cpu_experimental_ynn_fusion_type"]
    with tempfile.TemporaryDirectory() as tmp:
        logged = {}
        for name in families:
            for setting, flags in (("xla default", flag), ("jaxnet options", "")):
                workdir = Path(tmp) / f"{name}-{len(flags)}"
                env = {**os.environ, "XLA_FLAGS": flags}
                command = [sys.executable, "-m", "jaxnet", "train", f"{name}:smoke", "--workdir", str(workdir)]
                subprocess.run([*command, "train.progress=false"], env=env, check=True, capture_output=True)
                rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
                logged[setting] = [(r["step"], r["split"], k, v) for r in rows for k, v in r.items() if "loss" in k]
            pairs = list(zip(logged["xla default"], logged["jaxnet options"], strict=True))
            result["smoke_runs"][name] = {
                "losses_compared": len(pairs),
                "identical": all(a == b for a, b in pairs),
                "max_abs_diff": max(abs(a[3] - b[3]) for a, b in pairs),
            }
            print(name, result["smoke_runs"][name], flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variant", action="append", choices=VARIANTS, help="default: all")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=30, help="steps per timed measurement (a multiple of 5)")
    parser.add_argument("--no-torch", action="store_true")
    parser.add_argument("--breakdown", action="store_true", help="also XLA's per-operation trace of each variant")
    parser.add_argument("--pieces", action="store_true", help="also each piece of the step jitted on its own")
    parser.add_argument("--numerics", action="store_true", help="also the loss and gradient differences it makes")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    parser.add_argument("--tag", default="", help="added to the file name: conv-cpu-DATE-TAG.json")
    args = parser.parse_args()
    variants = args.variant or list(VARIANTS)

    import jax
    import jax.numpy as jnp
    import jaxlib

    from jaxnet import observe
    from jaxnet.bench import CASES, case_config, case_dataset, torch_version

    case = CASES["cnn"]
    cfg = case_config(case, smoke=False)
    dataset = case_dataset(case, cfg)
    built = {name: build_variant(name, cfg, dataset) for name in variants}
    run = next(iter(built.values()))[0]
    batches = [run.put_batch(b) for b, _ in zip(run.train_batches(0), range(8), strict=False)]
    states = {name: state for name, (_, (_, state)) in built.items()}

    stacks = [jax.tree.map(lambda *x: jnp.stack(x), *batches[i : i + K]) for i in (0, len(batches) - K)]

    def jax_steps(name: str, n: int) -> None:
        compiled = built[name][1][0]
        if name == "after_k5":
            for i in range(n // K):
                states[name], metrics = compiled(states[name], stacks[i % 2])
        else:
            for i in range(n):
                states[name], metrics = compiled(states[name], batches[i % len(batches)])
        jax.block_until_ready(metrics)

    timed = {name: (lambda n, name=name: jax_steps(name, n)) for name in variants}
    torch = None if args.no_torch else torch_version()
    if torch:
        import torch as torch_module

        from jaxnet import models
        from jaxnet.bench import torch_peers

        torch_module.set_num_threads(os.cpu_count() or 1)
        trainer = torch_peers.Trainer(
            models.resolve(cfg.model), cfg.optim, cfg.train.steps, dataset.num_classes, cfg.data.seq_len,
            device="cpu", seed=cfg.seed, image_shape=tuple(dataset.train[0].shape[1:]),
        )  # fmt: skip
        host = [b for b, _ in zip(run.train_batches(0), range(8), strict=False)]
        placed = [trainer.put(b) for b in host]

        def torch_steps(n: int) -> None:
            for i in range(n):
                trainer.step(placed[i % len(placed)])
            trainer.loss()

        timed["torch"] = torch_steps
    for fn in timed.values():
        fn(5)
    rounds = {name: [] for name in timed}
    for r in range(args.rounds):
        for name, fn in timed.items():
            cpu, start = time.process_time(), time.perf_counter()
            fn(args.steps)
            wall, cpu = time.perf_counter() - start, time.process_time() - cpu
            rounds[name].append(
                {
                    "ms_per_step": round(1000 * wall / args.steps, 2),
                    "cpu_ms_per_step": round(1000 * cpu / args.steps, 2),
                    "cpu_percent": round(100 * cpu / wall, 1),
                    "load_average": round(os.getloadavg()[0], 2),
                }
            )
        print(f"round {r + 1}: " + "  ".join(f"{k} {v[-1]['ms_per_step']} ms" for k, v in rounds.items()), flush=True)
    results = {}
    for name, rows in rounds.items():
        results[name] = {
            "median": {k: statistics.median(row[k] for row in rows) for k in rows[0]},
            "rounds": rows,
        }
    ratios = {}
    for name in timed:
        for other in timed:
            if name != other and (other == "torch" or other == "before"):
                pairs = zip(rounds[name], rounds[other], strict=True)
                per_round = [o["ms_per_step"] / s["ms_per_step"] for s, o in pairs]
                ratios[f"{other} ms / {name} ms"] = round(statistics.median(per_round), 3)
    record = {
        "kind": "conv-profile",
        "what": "the runner's ConvNet train step (cnn_fashion_mnist, batch 128) on batches in memory, variants "
        "and the PyTorch peer timed in alternation in one process",
        "command": "python " + " ".join(sys.argv),
        "date": datetime.date.today().isoformat(),
        "device": f"cpu ({os.cpu_count()} cores)",
        "cpu_model": observe.cpu_model(),
        "versions": {
            "jax": jax.__version__,
            "jaxlib": jaxlib.__version__,
            "torch": torch,
            "python": sys.version.split()[0],
        },  # fmt: skip
        "environment": {k: os.environ.get(k, "") for k in ("GLIBC_TUNABLES", "XLA_FLAGS")},
        "machine_shared": "yes: other jobs ran on the same cores (load average per round); ratios between "
        "variants of one round mean more than any one time",
        "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
        "variants": {k: v for k, v in variant_notes().items() if k in timed},
        "steps_per_measurement": args.steps,
        "results": results,
        "median_ratio_per_round": ratios,
    }
    if args.pieces:
        record["pieces"] = pieces(args.rounds, with_torch=torch is not None)
    if args.numerics:
        record["numerics"] = numerics()
    if args.breakdown:
        record["breakdown_ms_per_step"] = {}
        for name in [v for v in variants if v != "after_k5"]:
            compiled = built[name][1][0]
            record["breakdown_ms_per_step"][name], states[name] = breakdown(compiled, states[name], batches, 20)
    for name, row in results.items():
        m = row["median"]
        ms, cpu_ms, percent = m["ms_per_step"], m["cpu_ms_per_step"], m["cpu_percent"]
        print(f"{name:8s} {ms:7.2f} ms/step  {cpu_ms:7.2f} CPU ms/step  {percent:5.1f} %")
    for k, v in ratios.items():
        print(f"{k}: {v}")
    out = Path(args.out) / f"conv-cpu-{record['date']}{'-' + args.tag if args.tag else ''}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {out}")


def variant_notes() -> dict[str, str]:
    """One line per variant for the results file (the module docstring says more)."""
    return {
        "before": "max pool as reshape + max over axes; XLA's default CPU libraries (YNNPACK convolutions)",
        "pool": "max pool as the max of four strided views, elementwise gradient; XLA's defaults",
        "after": "pool + jaxnet.xla_options (convolutions on XLA's multi-threaded kernels): jaxnet's default",
        "im2col1": "after + first convolution as nine shifted views and one matmul (candidate)",
        "after_k5": "after with train.steps_per_call=5: five steps per compiled call",
        "torch": "the PyTorch peer (jaxnet.bench.torch_peers), same model, optimizer and batches",
    }


if __name__ == "__main__":
    main()

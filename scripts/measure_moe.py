"""Measure the mixture of experts on this CPU: moe_shakespeare's train step beside llama_shakespeare's
(the same active parameters), the grouped-matmul mixture layer beside a plain loop over its experts
(the cost of routing), and, from a recorded run's metrics.jsonl, the experts' load over training.

    python scripts/measure_moe.py [--rounds 7] [--run runs/moe_shakespeare]

Steps are timed in one process, alternating (moe, dense, moe, dense, ...: a block of steps each after a
warm-up that excludes compilation), and the median of each kind's blocks reported, as
/work/shared/BENCHMARKING.md asks. The layer comparison runs the forward and backward pass of one
mixture layer of moe_shakespeare's shape on a batch of 16 x 128 tokens three ways, alternating:
``blocks`` and ``ragged`` (jaxnet's grouped matmuls) and ``loop`` (every expert on every token,
weighted by its routing weight, zero for tokens not routed to it: the arithmetic of a naive mixture,
8/2 = 4x the routed work). Writes benchmarks/results/moe-cpu-<date>.json and, with --run,
moe-load-<date>.png.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from jaxnet import config, observe, parallel  # noqa: E402
from jaxnet.models.transformer.moe import experts_of, route  # noqa: E402
from jaxnet.train.loop import Run  # noqa: E402


def time_blocks(fns: dict, rounds: int, steps: int) -> dict[str, list[float]]:
    """Seconds a call of each function of ``fns``, one block of ``steps`` calls each per round, alternating."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            start = time.perf_counter()
            for _ in range(steps):
                out = fn()
            jax.block_until_ready(out)
            times[name].append((time.perf_counter() - start) / steps)
    return times


def train_steps(experiment: str):
    """A closure making one train step of ``experiment`` (its state advancing), compiled and warmed up."""
    cfg = config.load_experiment(experiment, ["train.progress=false"])
    run = Run(cfg)
    state = [run.init_state()]
    batch = parallel.put_batch(next(run.train_batches(0)), run.mesh)

    def step():
        state[0], metrics = run.train_step(state[0], batch)
        return metrics["loss"]

    start = time.perf_counter()
    jax.block_until_ready(step())
    compile_s = time.perf_counter() - start
    for _ in range(2):
        jax.block_until_ready(step())
    tokens = cfg.train.batch_size * cfg.data.seq_len
    return step, compile_s, tokens


def layer_functions(width: int = 128, experts: int = 8, k: int = 2, hidden: int = 200, tokens: int = 2048):
    """Forward and backward of one mixture layer, as jaxnet computes it (blocks, ragged) and as a loop over experts."""
    r = jax.random.split(jax.random.key(0), 5)
    x = jax.random.normal(r[0], (tokens, width))
    router = jax.random.normal(r[1], (width, experts)) * 0.1
    shapes = ((experts, width, hidden), (experts, width, hidden), (experts, hidden, width))
    w = tuple(jax.random.normal(r[i], shape) * 0.05 for i, shape in zip((2, 3, 4), shapes, strict=True))

    def routed(impl):
        def f(x, router, *w):
            _, chosen, top = route(x @ router, k, True)
            flat = chosen.reshape(-1)
            order = jnp.argsort(flat, stable=True)
            sizes = jnp.bincount(flat, length=experts)
            out = experts_of(x[order // k], sizes, w, impl)
            out = jnp.zeros_like(out).at[order].set(out)
            return jnp.sum(out.reshape(tokens, k, width) * top[..., None], axis=1)

        return f

    def loop(x, router, gate, up, down):
        _, chosen, top = route(x @ router, k, True)
        y = jnp.zeros_like(x)
        for e in range(experts):
            weight = jnp.sum(jnp.where(chosen == e, top, 0.0), axis=-1)  # 0 for tokens not routed to e
            y = y + weight[:, None] * ((jax.nn.silu(x @ gate[e]) * (x @ up[e])) @ down[e])
        return y

    fns = {"blocks": routed("blocks"), "ragged": routed("ragged"), "loop": loop}
    reference = fns["loop"](x, router, *w)
    made = {}
    for name, f in fns.items():
        np.testing.assert_allclose(f(x, router, *w), reference, rtol=2e-4, atol=2e-4)  # the same layer, three ways
        grad = jax.jit(jax.grad(lambda *a, f=f: jnp.sum(f(*a) ** 2), argnums=(0, 2, 3, 4)))
        jax.block_until_ready(grad(x, router, *w))
        made[name] = lambda grad=grad: grad(x, router, *w)
    return made


def load_plot(run: Path, out: Path) -> dict:
    """The experts' shares of the tokens over training, per layer, from ``run``'s metrics.jsonl, as a plot."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = [r for r in observe.read_metrics(run / "metrics.jsonl") if r["split"] == "train"]
    layers = sorted({k.split("/")[1] for r in records for k in r if k.startswith("moe/") and k.endswith("/load_max")})
    fig, axes = plt.subplots(1, len(layers), figsize=(4 * len(layers), 3.2), sharey=True, squeeze=False)
    summary = {}
    for ax, layer in zip(axes[0], layers, strict=True):
        names = sorted(k for k in records[0] if k.startswith(f"moe/{layer}/expert_"))
        steps = [r["step"] for r in records]
        for name in names:
            ax.plot(steps, [r[name] for r in records], lw=1, label=name.rsplit("_", 1)[-1])
        ax.axhline(1 / len(names), color="k", ls=":", lw=0.8)
        ax.set_title(f"{layer}: busiest / mean {records[-1][f'moe/{layer}/load_max']:.2f} at the end")
        ax.set_xlabel("step")
        summary[layer] = {
            "load_max_first": records[0][f"moe/{layer}/load_max"],
            "load_max_last": records[-1][f"moe/{layer}/load_max"],
        }
    axes[0][0].set_ylabel("share of the tokens' assignments")
    axes[0][-1].legend(title="expert", fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    return summary


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=3, help="steps (or layer calls) a timed block")
    parser.add_argument("--run", type=Path, help="a recorded moe_shakespeare run directory, for the load plot")
    args = parser.parse_args(argv)
    date = datetime.date.today().isoformat()
    results = ROOT / "benchmarks" / "results"
    load = {"start": __import__("os").getloadavg()[0]}
    moe, moe_compile, tokens = train_steps("moe_shakespeare")
    dense, dense_compile, _ = train_steps("llama_shakespeare")
    steps = time_blocks({"moe_shakespeare": moe, "llama_shakespeare": dense}, args.rounds, args.steps)
    layer = time_blocks(layer_functions(), args.rounds, args.steps)
    load["end"] = __import__("os").getloadavg()[0]
    median = {k: statistics.median(v) for k, v in {**steps, **layer}.items()}
    env = observe.environment()
    record = {
        "kind": "moe-cpu",
        "date": date,
        "command": "python scripts/measure_moe.py " + " ".join(argv),
        "device": f"{env['cpu_count']}-core CPU ({observe.cpu_model()})",
        "versions": {k: env.get(k) for k in ("jax", "jaxlib", "flax", "optax", "numpy")},
        "load_average": load,
        "train_step": {
            name: {"median_s": median[name], "tokens_per_s": tokens / median[name], "each_round_s": steps[name]}
            for name in steps
        },
        "train_step_compile_s": {"moe_shakespeare": moe_compile, "llama_shakespeare": dense_compile},
        "moe_over_dense_step": median["moe_shakespeare"] / median["llama_shakespeare"],
        "layer_forward_backward": {name: {"median_s": median[name], "each_round_s": layer[name]} for name in layer},
        "loop_over_blocks": median["loop"] / median["blocks"],
        "loop_over_ragged": median["loop"] / median["ragged"],
        "layer_shape": "16 x 128 tokens of width 128, 8 experts of 200 units, top-2 (moe_shakespeare's)",
    }
    if args.run is not None:
        record["load"] = load_plot(args.run, results / f"moe-load-{date}.png")
        record["load_plot"] = f"moe-load-{date}.png"
    (results / f"moe-cpu-{date}.json").write_text(json.dumps(record, indent=2) + "\n")
    print(
        json.dumps(
            {k: v for k, v in record.items() if k in ("moe_over_dense_step", "loop_over_blocks", "loop_over_ragged")}
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

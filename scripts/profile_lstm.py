"""What writing out the LSTM recurrence's backward pass buys (jaxnet.models.lstm.lstm_scan).

    python scripts/profile_lstm.py                   # 3 alternating rounds
    python scripts/profile_lstm.py --rounds 5 --steps 40

Compiled for a CPU, JAX's differentiation of the recurrence's loop transposed the recurrent weight
and added each step's share of its gradient, in another layout, inside the loop at every step.
``lstm_scan``'s own backward pass transposes the weight once and takes its gradient as one product
after the loop. This script measures, each in a fresh process and in alternation over the rounds:

1. **the recurrence alone**: value and gradient of the ``lstm`` benchmark case's two layers
   (batch 20, 20 steps, 200 units) with the written-out backward pass (``written``) and with JAX
   differentiating the same forward loop (``jax``);
2. **the train step**: the runner's compiled step of the ``lstm`` case both ways, and PyTorch's step
   of the same model (``jaxnet/bench/torch_peers.py``).

Writes ``benchmarks/results/lstm-backward-cpu-<date>.json`` with the device, versions, load and date.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BATCH, TIME, HIDDEN, LAYERS = 20, 20, 200, 2  # the lstm case


def _differentiated_by_jax() -> None:
    """Make ``lstm_scan`` JAX's differentiation of its own forward loop (this process)."""
    from jaxnet.models import lstm

    lstm._recurrence = lambda dtype, *args: lstm._recurrence_forward(dtype, *args)[:2]


def recurrence_ms(how: str, steps: int) -> float:
    """Milliseconds of one value-and-gradient of the case's two LSTM layers (this process); ``how``:
    ``written`` (lstm_scan's backward pass) or ``jax``."""
    import jax
    import jax.numpy as jnp

    from jaxnet import xla_options
    from jaxnet.models import lstm

    if how == "jax":
        _differentiated_by_jax()
    keys = jax.random.split(jax.random.key(0), 2 * LAYERS + 2)
    weight = lambda key: 0.05 * jax.random.normal(key, (HIDDEN, 4, HIDDEN))  # noqa: E731
    layers = [(weight(keys[2 * i]), weight(keys[2 * i + 1])) for i in range(LAYERS)]
    x = jax.random.normal(keys[-1], (BATCH, TIME, HIDDEN))
    zeros = jnp.zeros((BATCH, HIDDEN))

    def loss(layers, x):
        for w_x, w_h in layers:
            x, _ = lstm.lstm_scan(jnp.einsum("btf,fgk->btgk", x, w_x), w_h, zeros, zeros)
        return jnp.sum(x * x)

    grad = jax.jit(jax.value_and_grad(loss), compiler_options=xla_options.compiler_options())
    out = grad(layers, x)
    jax.block_until_ready(out)
    start = time.perf_counter()
    for _ in range(steps):
        out = grad(layers, x)
    jax.block_until_ready(out)
    return (time.perf_counter() - start) / steps * 1e3


def step_ms(how: str, steps: int) -> float:
    """Milliseconds of the ``lstm`` case's train step (this process): ``written``, ``jax`` or ``torch``."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import profile_ops

    if how == "jax":
        _differentiated_by_jax()
    return profile_ops.timed("lstm", "torch" if how == "torch" else "jaxnet", steps)


def child(what: str, how: str, steps: int) -> float:
    """``what`` (recurrence, step) of ``how`` in a fresh process on every core."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import profile_ops

    code = (
        f"import sys, json; sys.path.insert(0, {str(ROOT / 'scripts')!r}); import profile_lstm as p; "
        f"print('RESULT', json.dumps(p.{what}_ms({how!r}, {steps})))"
    )
    return round(profile_ops.fresh_process(code, os.cpu_count() or 1, f"{what} ({how})"), 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20, help="timed steps per measurement")
    parser.add_argument("--rounds", type=int, default=3, help="alternations of the measurements")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT / "scripts"))
    import profile_ops

    record = profile_ops.record_head(
        "lstm-backward",
        f"value and gradient of the lstm case's {LAYERS} LSTM layers (batch {BATCH}, {TIME} steps, {HIDDEN} units) "
        "with lstm_scan's written-out backward pass and with JAX differentiating its forward loop; the case's train "
        "step both ways and PyTorch's (ms, medians of alternating rounds, each a fresh process)",
    )
    cases = [("recurrence", "written"), ("recurrence", "jax"), ("step", "written"), ("step", "jax")]
    if record["versions"]["torch"]:
        cases.append(("step", "torch"))
    times = {case: [] for case in cases}
    for r in range(args.rounds):
        for case in cases:
            times[case].append(child(*case, args.steps))
            print(f"round {r + 1}: {case[0]:10s} {case[1]:7s}: {times[case][-1]} ms", flush=True)
    name = lambda case: f"{case[0]} {case[1]}"  # noqa: E731
    median = {name(c): statistics.median(v) for c, v in times.items()}
    record.update({"ms": median, "rounds": {name(c): v for c, v in times.items()}})
    record["recurrence_jax_over_written"] = round(median["recurrence jax"] / median["recurrence written"], 3)
    record["step_jax_over_written"] = round(median["step jax"] / median["step written"], 3)
    if record["versions"]["torch"]:
        record["step_jaxnet_over_torch"] = {
            h: round(median["step torch"] / median[f"step {h}"], 3) for h in ("written", "jax")
        }
    out = profile_ops.write_record(record, args.out, f"lstm-backward-cpu-{record['date']}.json")
    print(json.dumps({k: v for k, v in record.items() if k.startswith(("ms", "recurrence_", "step_"))}, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()

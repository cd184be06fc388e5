"""What cutting a CPU's attention into pieces of the batch buys (jaxnet.models.transformer.attention.cpu_pieces).

    python scripts/profile_attention.py                   # 3 alternating rounds
    python scripts/profile_attention.py --rounds 5 --steps 20

XLA's CPU runtime computes each batched product of attention on one thread. This script measures,
each in a fresh process and in alternation over the rounds:

1. **attention alone**: value and gradient of the ``transformer`` benchmark case's attention
   (batch 32, 128 positions, 4 heads of 32, causal), whole and in :func:`cpu_pieces` pieces, on
   every core and on one (``taskset``), with PyTorch's ``scaled_dot_product_attention`` (its
   fused CPU kernel) beside it when PyTorch is installed;
2. **the train step**: the runner's compiled step of the ``transformer`` case with nothing in
   pieces, the attention alone in pieces, the blocks in pieces of the batch (the default,
   ``TransformerLanguageModel._batch_pieces``), and that with the batch in as many micro-batches
   as cores run side by side (``optim.grad_accum=<cores> optim.grad_accum_mode=parallel``: the
   same update), and PyTorch's step of the same model (``jaxnet/bench/torch_peers.py``).

Attention that takes the same time on one core as on every core runs on one thread. Writes
``benchmarks/results/attention-pieces-cpu-<date>.json`` with the device, versions, load and date.
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
SHAPE = (32, 128, 4, 32)  # the transformer case: batch, positions, heads, head size


def attention_ms(how: str, steps: int) -> float:
    """Milliseconds of one value-and-gradient of the case's causal attention (this process);
    ``how``: ``whole``, ``pieces`` (as the Transformer computes it here) or ``torch``."""
    import numpy as np

    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(SHAPE).astype(np.float32) for _ in range(4)]
    if how == "torch":
        import torch

        torch.set_num_threads(len(os.sched_getaffinity(0)))
        q, k, v, w = (torch.tensor(a).transpose(1, 2).contiguous().requires_grad_(True) for a in arrays)

        def step() -> None:
            out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            (out * w).sum().backward()

        wait = lambda: None  # noqa: E731
    else:
        import jax
        import jax.numpy as jnp

        from jaxnet import xla_options
        from jaxnet.models.transformer import attention

        pieces = attention.cpu_pieces(SHAPE[0]) if how == "pieces" else 1

        def loss(q, k, v, w):
            return jnp.sum(attention.in_pieces(attention.head_major_attention, pieces, q, k, v, None) * w)

        grad = jax.jit(jax.grad(loss, argnums=(0, 1, 2)), compiler_options=xla_options.compiler_options())
        q, k, v, w = (jnp.asarray(a) for a in arrays)
        holder = {}

        def step() -> None:
            holder["out"] = grad(q, k, v, w)

        wait = lambda: jax.block_until_ready(holder["out"])  # noqa: E731
    for _ in range(3):
        step()
    wait()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    wait()
    return (time.perf_counter() - start) / steps * 1e3


def step_ms(how: str, steps: int) -> float:
    """Milliseconds of the ``transformer`` case's train step (this process): ``whole`` (nothing in
    pieces), ``attention`` (the attention alone in pieces of the batch), ``pieces`` (the blocks in
    pieces of the batch, the default: ``TransformerLanguageModel._batch_pieces``), ``micro`` (the
    pieces and the batch in as many micro-batches as cores, side by side:
    ``optim.grad_accum=<cores> optim.grad_accum_mode=parallel``) or ``torch``."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import profile_ops

    from jaxnet.models.transformer import attention, model

    if how in ("whole", "attention"):  # the blocks on the whole batch
        model.TransformerLanguageModel._batch_pieces = lambda self, batch, train, decode: 1
    if how == "whole":  # and the attention too
        attention.cpu_pieces = lambda batch, most=None: 1
    overrides = ()
    if how == "micro":
        overrides = (f"optim.grad_accum={len(os.sched_getaffinity(0))}", "optim.grad_accum_mode=parallel")
    return profile_ops.timed("transformer", "torch" if how == "torch" else "jaxnet", steps, overrides)


def child(what: str, how: str, steps: int, cores: int) -> float:
    """``what`` (attention, step) of ``how`` in a fresh process on ``cores`` cores."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import profile_ops

    code = (
        f"import sys, json; sys.path.insert(0, {str(ROOT / 'scripts')!r}); import profile_attention as p; "
        f"print('RESULT', json.dumps(p.{what}_ms({how!r}, {steps})))"
    )
    return round(profile_ops.fresh_process(code, cores, f"{what} ({how})"), 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=10, help="timed steps per measurement")
    parser.add_argument("--rounds", type=int, default=3, help="alternations of the measurements")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    parser.add_argument("--tag", default="", help="added to the file's name: attention-pieces-cpu-<date>-<tag>.json")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT / "scripts"))
    import profile_ops

    from jaxnet.models.transformer import attention

    cores = os.cpu_count() or 1
    record = profile_ops.record_head(
        "attention-pieces",
        "value and gradient of the transformer case's causal attention (batch, positions, heads, head size "
        f"{SHAPE}) whole, in pieces of the batch and PyTorch's, on every core and one; the case's train step with "
        "nothing in pieces, the attention in pieces, the blocks in pieces (the default), that with micro-batches "
        "side by side, and PyTorch's "
        "(ms, medians of alternating rounds, each a fresh process)",
    )
    torch_version = record["versions"]["torch"]
    hows = ["whole", "pieces"] + (["torch"] if torch_version else [])
    step_hows = ["whole", "attention", "pieces", "micro"] + (["torch"] if torch_version else [])
    cases = [("attention", h, c) for c in (cores, 1) for h in hows] + [("step", h, cores) for h in step_hows]
    times = {case: [] for case in cases}
    for r in range(args.rounds):
        for case in cases:
            times[case].append(child(case[0], case[1], args.steps, case[2]))
            print(f"round {r + 1}: {case[0]:9s} {case[1]:6s} on {case[2]} core(s): {times[case][-1]} ms", flush=True)
    name = lambda case: f"{case[0]} {case[1]} on {case[2]} core(s)"  # noqa: E731
    median = {name(c): statistics.median(v) for c, v in times.items()}
    record.update(
        {
            "pieces": attention.cpu_pieces(SHAPE[0]),
            "ms": median,
            "rounds": {name(c): v for c, v in times.items()},
            "attention_pieces_over_whole": round(
                median[name(("attention", "whole", cores))] / median[name(("attention", "pieces", cores))], 3
            ),
            "step_pieces_over_whole": round(
                median[name(("step", "whole", cores))] / median[name(("step", "pieces", cores))], 3
            ),
            "step_attention_over_whole": round(
                median[name(("step", "whole", cores))] / median[name(("step", "attention", cores))], 3
            ),
            "step_micro_over_whole": round(
                median[name(("step", "whole", cores))] / median[name(("step", "micro", cores))], 3
            ),
        }
    )
    if torch_version:
        record["step_jaxnet_over_torch"] = {
            h: round(median[name(("step", "torch", cores))] / median[name(("step", h, cores))], 3)
            for h in ("whole", "attention", "pieces", "micro")
        }
    out = profile_ops.write_record(
        record, args.out, f"attention-pieces-cpu-{record['date']}{'-' + args.tag if args.tag else ''}.json"
    )
    print(
        json.dumps(
            {
                k: record[k]
                for k in (
                    "ms",
                    "attention_pieces_over_whole",
                    "step_attention_over_whole",
                    "step_pieces_over_whole",
                    "step_micro_over_whole",
                )
            },
            indent=1,
        )
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()

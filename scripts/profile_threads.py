"""How jaxnet's compiled step and the PyTorch peer keep a CPU's cores busy.

    python scripts/profile_threads.py                   # lstm transformer
    python scripts/profile_threads.py cnn lstm transformer --steps 20 --rounds 3

PyTorch runs its operations on OpenMP threads. GNU OpenMP's threads, by default, wait for the
next parallel region spinning on a core for a while before they sleep, so an operation that
follows another finds them awake. XLA's CPU threads sleep when their queue is empty and are
woken by the kernel. A step of many small operations (the LSTM's loop over time) pays for the
wake-ups and the cores' idle time between them.

For each family, in fresh processes, alternating: the runner's compiled step as the ``jaxnet``
command runs it (glibc's malloc with huge pages) and with ``JAXNET_MALLOC=mimalloc``
(``jaxnet/_startup.py``), the PyTorch peer as it runs by default, the peer with
``OMP_WAIT_POLICY=PASSIVE`` (its threads sleep at once, as XLA's do), and the peer with the same
mimalloc settings. Each measurement gives the step's milliseconds, its user and kernel CPU
milliseconds, the voluntary context switches per step (a thread that went to sleep to wait) and
the CPU used (200 % = two cores busy all along): ``profile_ops.timed(..., usage=True)``.

Writes ``benchmarks/results/cpu-threads-<date>.json`` with the device, versions, load and date.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import profile_ops  # noqa: E402

# peer -> (what profile_ops.timed measures, the environment its process starts with, on top of
# the allocator settings the jaxnet command adds to it: jaxnet._startup.environment)
GLIBC, MIMALLOC = {"JAXNET_MALLOC": "glibc"}, {"JAXNET_MALLOC": "mimalloc"}
PEERS = {
    "jaxnet": ("jaxnet", GLIBC),
    "jaxnet, mimalloc": ("jaxnet", MIMALLOC),
    "torch": ("torch", GLIBC),
    "torch, OMP_WAIT_POLICY=PASSIVE": ("torch", {**GLIBC, "OMP_WAIT_POLICY": "PASSIVE"}),
    "torch, mimalloc": ("torch", MIMALLOC),
}


def child(family: str, peer: str, steps: int, warmup: int = 3) -> dict:
    """``peer``'s step of ``family`` with its CPU use, in a fresh process on every core."""
    what, env = PEERS[peer]
    code = (
        f"import sys, json; sys.path.insert(0, {str(ROOT / 'scripts')!r}); import profile_ops as p; "
        f"print('RESULT', json.dumps(p.timed({family!r}, {what!r}, {steps}, usage=True, warmup={warmup})))"
    )
    if "OMP_WAIT_POLICY" in os.environ and "OMP_WAIT_POLICY" not in env:
        raise SystemExit("unset OMP_WAIT_POLICY first: the 'torch' peer measures PyTorch's default")
    if os.environ.get("LD_PRELOAD"):
        raise SystemExit("unset LD_PRELOAD first: each peer's allocator is chosen here (JAXNET_MALLOC)")
    return profile_ops.fresh_process(code, os.cpu_count() or 1, f"{peer} on {family}", env)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("families", nargs="*", default=["lstm", "transformer"])
    parser.add_argument("--steps", type=int, default=20, help="timed steps per measurement")
    parser.add_argument("--rounds", type=int, default=3, help="alternations of the measurements")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps before the timed ones")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    parser.add_argument("--tag", help="added to the results file's name: cpu-threads-<date>-<tag>.json")
    args = parser.parse_args()
    record = profile_ops.record_head(
        "cpu-threads",
        "each family's train step for jaxnet's compiled step (as the jaxnet command runs it, and with "
        "JAXNET_MALLOC=mimalloc), the PyTorch peer as it runs by default, with OMP_WAIT_POLICY=PASSIVE and with "
        "mimalloc: milliseconds, user and kernel CPU milliseconds, voluntary context switches per step "
        "and CPU used (medians of alternating rounds, each a fresh process on every core); ratios are each "
        "peer's milliseconds over jaxnet's",
    )
    record["warmup_steps"], record["timed_steps"] = args.warmup, args.steps
    record["peers"] = {peer: env for peer, (_, env) in PEERS.items()}  # on top of jaxnet._startup.environment
    if not record["versions"]["torch"]:
        raise SystemExit("PyTorch is not installed: pip install torch")
    record["families"] = {}
    for family in args.families:
        rounds = {peer: [] for peer in PEERS}
        for r in range(args.rounds):
            for peer in PEERS:
                rounds[peer].append(child(family, peer, args.steps, args.warmup))
                print(f"{family} round {r + 1}: {peer:32s} {rounds[peer][-1]}", flush=True)
        median = {
            peer: {key: statistics.median(m[key] for m in runs) for key in runs[0]} for peer, runs in rounds.items()
        }
        ms = {peer: m["ms_per_step"] for peer, m in median.items()}
        record["families"][family] = {
            "median": median,
            "rounds": rounds,
            "jaxnet_over_torch": {peer: round(ms[peer] / ms["jaxnet"], 3) for peer in PEERS if peer != "jaxnet"},
        }
        print(json.dumps({family: record["families"][family]["jaxnet_over_torch"]}), flush=True)
    name = f"cpu-threads-{record['date']}{'-' + args.tag if args.tag else ''}.json"
    out = profile_ops.write_record(record, args.out, name)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()

"""Per-device memory of an experiment under each mesh layout, on 8 simulated CPU devices.

    python scripts/memory_table.py                                  # transformer_shakespeare
    python scripts/memory_table.py transformer_shakespeare model.layers=12 model.width=768 \\
        model.heads=12 data.seq_len=1024 train.batch_size=8 --name gpt2-small-shape

For every layout it builds the run (nothing is trained), compiles the train step for the placed
state and a real first batch, and records what one device holds: parameters and optimizer state
(from their shardings) and the activations and temporaries XLA planned for the step (from the
compiled step's memory analysis). The results file, benchmarks/results/memory-NAME-DATE.json,
names the devices, library versions and date; scripts/update_docs.py turns it into the
README's table.
"""

from __future__ import annotations

import argparse
import datetime
import os
from pathlib import Path

os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
os.environ.setdefault("JAX_PLATFORMS", "cpu")

ROOT = Path(__file__).resolve().parents[1]
LAYOUTS = [
    ("1 device", {"data": 1, "fsdp": 1, "tensor": 1}, "sharded"),
    ("data=8", {"data": 8, "fsdp": 1, "tensor": 1}, "sharded"),
    ("replicas (shard_map), data=8", {"data": 8, "fsdp": 1, "tensor": 1}, "replicas"),
    ("fsdp=8", {"data": 1, "fsdp": 8, "tensor": 1}, "sharded"),
    ("data=4, tensor=2", {"data": 4, "fsdp": 1, "tensor": 2}, "sharded"),
    ("fsdp=4, tensor=2", {"data": 1, "fsdp": 4, "tensor": 2}, "sharded"),
    ("data=2, fsdp=2, tensor=2", {"data": 2, "fsdp": 2, "tensor": 2}, "sharded"),
]


def measure(experiment: str, overrides: list[str]) -> tuple[list[dict], dict, dict, int]:
    """One row per layout: bytes per device of parameters, optimizer state and activations."""
    import jax

    from jaxnet import config, parallel
    from jaxnet.train.loop import Run

    rows = []
    dataset = None
    for label, sizes, mode in LAYOUTS:
        cfg = config.load_experiment(
            experiment, [*overrides, *(f"mesh.{k}={v}" for k, v in sizes.items()), f"parallel.mode={mode}"]
        )
        run = Run(cfg, dataset=dataset)
        dataset = run.dataset  # load once
        state = run.abstract_state()
        batch = parallel.put_batch(next(run.train_batches(0)), run.mesh)
        compiled = run.train_step.lower(state, batch).compile()
        sizes_bytes = parallel.memory(state, compiled)
        rows.append({"layout": label, "mesh": sizes, "mode": mode, **sizes_bytes})
        print(f"{label:32s} {parallel.describe(run.mesh, state, compiled)}", flush=True)
        del compiled
    cfg = config.load_experiment(experiment, overrides)
    model = {k: v for k, v in cfg.to_dict()["model"].items() if k in ("name", "layers", "width", "heads", "mlp_ratio")}
    return rows, model, {"batch_size": cfg.train.batch_size, "seq_len": cfg.data.seq_len}, jax.device_count()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("experiment", nargs="?", default="transformer_shakespeare")
    parser.add_argument("overrides", nargs="*", help="config overrides, e.g. model.layers=12")
    parser.add_argument("--name", help="name in the results file (default: the experiment)")
    args = parser.parse_args()
    from record_result import write_result

    from jaxnet import observe

    rows, model, shape, devices = measure(args.experiment, args.overrides)
    env = observe.environment()
    name = args.name or args.experiment.replace(":", "-")
    record = {
        "kind": "memory",
        "name": name,
        "command": " ".join(["python scripts/memory_table.py", args.experiment, *args.overrides])
        + (f" --name {args.name}" if args.name else ""),
        "model": model,
        "shape": shape,
        "devices": f"{devices} simulated CPU devices",
        "rows": rows,
        "versions": env["versions"],
        "date": datetime.date.today().isoformat(),
        "git_commit": env["git_commit"],
    }
    out = write_result(f"memory-{name}-{record['date']}.json", record)
    print(f"wrote {out.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

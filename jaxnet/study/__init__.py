"""``jaxnet study``: parallel-SGD studies that train an experiment several times, or read benchmark
results, and write a JSON record and a plot (docs/studies.md describes each).

- :mod:`jaxnet.study.batch_scaling`: steps to a target against batch size; the critical batch size;
- :mod:`jaxnet.study.devices`: GPU against CPU throughput per family, from ``jaxnet bench`` results;
- :mod:`jaxnet.study.async_sgd`: SGD with stale gradients against synchronous SGD, in updates and
  in modelled wall-clock time;
- :mod:`jaxnet.study.common`: what they share.

Each is a function of an ``Options`` object, so a study can be run from Python too::

    from jaxnet.study import batch_scaling
    batch_scaling.main(batch_scaling.Options("cnn_fashion_mnist", [64, 128, 256], target=0.9))
"""

from __future__ import annotations

import argparse

from jaxnet.errors import UserError


def main(args: argparse.Namespace, command: str | None = None) -> int:
    """Run the study ``args.study`` parsed by :mod:`jaxnet.cli`; returns the exit code."""
    from jaxnet.study import common

    if args.study == "batch-scaling":
        from jaxnet.study import batch_scaling

        own, overrides = common.split_arguments(args.overrides, ("batch",))
        if "batch" not in own:
            raise UserError("batch-scaling needs the batch sizes, e.g. batch=64,128,256,512")
        for name, value in (("--max-examples", args.max_examples), ("--eval-examples", args.eval_examples)):
            if value is not None and value < 1:
                raise UserError(f"{name} {value}: must be a positive number of examples")
        batch_scaling.main(
            batch_scaling.Options(
                experiment=args.experiment,
                batches=common.parse_int_list("batch", own["batch"]),
                target=args.target,
                lr_rule=args.lr_rule,
                max_examples=args.max_examples,
                eval_examples=args.eval_examples,
                tolerance=args.tolerance,
                smoke=args.smoke,
                workdir=args.workdir,
                overrides=overrides,
                command=command,
            )
        )
        return 0
    if args.study == "devices":
        from jaxnet.study import devices

        devices.main(devices.Options(results=args.results, workdir=args.workdir, command=command))
        return 0
    if args.study == "async":
        from jaxnet.study import async_sgd

        own, overrides = common.split_arguments(args.overrides, ("staleness", "workers"))
        if "staleness" not in own:
            raise UserError("async needs the staleness values to compare, e.g. staleness=0,1,2,4,8")
        if args.comm_ms is not None and args.comm_ms < 0:
            raise UserError(f"--comm-ms {args.comm_ms}: must be >= 0")
        if args.jitter < 0:
            raise UserError(f"--jitter {args.jitter}: must be >= 0")
        async_sgd.main(
            async_sgd.Options(
                experiment=args.experiment,
                staleness=common.parse_int_list("staleness", own["staleness"], low=0),
                workers=common.parse_int("workers", own["workers"]) if "workers" in own else None,
                comm_ms=args.comm_ms,
                jitter=args.jitter,
                smoke=args.smoke,
                workdir=args.workdir,
                overrides=overrides,
                command=command,
            )
        )
        return 0
    raise AssertionError(args.study)

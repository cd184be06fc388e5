"""The ``jaxnet`` command: argument parsing only; the work happens in :mod:`jaxnet.train`.

    jaxnet train EXPERIMENT[:VARIANT] [key=value ...] [--workdir DIR] [--show-config]
    jaxnet eval --workdir DIR [--split test|val] [key=value ...]
    jaxnet list

Bad input ends with one line ``jaxnet: error: ...`` on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import json
import sys

from jaxnet.errors import UserError


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, not usage + message
        raise UserError(f"{message} (see `{self.prog} --help`)")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="jaxnet", description="Train and evaluate JAX models from experiment files.")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    train = commands.add_parser("train", help="train an experiment (resumes if the workdir has checkpoints)")
    train.add_argument("experiment", help="name under experiments/ or path to a .py file, optionally :VARIANT")
    train.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides, e.g. optim.lr=0.05")
    train.add_argument("--workdir", help="run directory (default: runs/EXPERIMENT[-VARIANT])")
    train.add_argument("--show-config", action="store_true", help="print the resolved config and every key, then exit")

    evaluate = commands.add_parser("eval", help="evaluate the newest checkpoint of a run")
    evaluate.add_argument("--workdir", required=True, help="run directory of a training run")
    evaluate.add_argument("--split", default="test", choices=("test", "val"))
    evaluate.add_argument(
        "overrides", nargs="*", metavar="key=value", help="change the saved config, e.g. data.dir=DIR"
    )

    commands.add_parser("list", help="list the experiments that can be trained")
    return parser


def _run(args: argparse.Namespace) -> int:
    from jaxnet import config

    if args.command == "list":
        for name in config.list_experiments():
            print(name)
        return 0
    if args.command == "train":
        cfg = config.load_experiment(args.experiment, args.overrides)
        if args.show_config:
            print(json.dumps(cfg.to_dict(), indent=2))
            print("\nkeys:\n" + config.describe())
            return 0
        from jaxnet.train import train

        train(cfg, args.workdir)
        return 0
    if args.command == "eval":
        from jaxnet.train import evaluate

        result = evaluate(args.workdir, args.split, args.overrides)
        print(json.dumps(result))
        return 0
    raise AssertionError(args.command)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``jaxnet`` command; returns the exit code."""
    try:
        parser = _parser()
        args, extra = parser.parse_known_args(argv)
        # argparse stops collecting positionals at the first option, so gather the key=value
        # pairs that come after --workdir here.
        unknown = [e for e in extra if not hasattr(args, "overrides") or "=" not in e or e.startswith("-")]
        if unknown:
            parser.error(f"unrecognized arguments: {' '.join(unknown)}")
        if extra:
            args.overrides = [*args.overrides, *extra]
        return _run(args)
    except UserError as e:
        print(f"jaxnet: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("jaxnet: interrupted; run the same command again to resume from the last checkpoint", file=sys.stderr)
        return 130

"""The ``jaxnet`` command: argument parsing only; the work happens in :mod:`jaxnet.train`.

    jaxnet train EXPERIMENT[:VARIANT] [key=value ...] [--workdir DIR] [--show-config] [--adopt] [--verbose]
                 [--coordinator HOST:PORT --num-processes N --process-id I]
    jaxnet sweep EXPERIMENT[:VARIANT] key=v1,v2,... [key=value ...] [--workdir DIR] [--members-per-program N]
                 [--members-at-once K] [--max-members N] [--add]
    jaxnet eval --workdir DIR [--split test|val] [--step N|best] [key=value ...]
    jaxnet eval --workdir hf:PATH data.path=CORPUS [--split test|val] [key=value ...]
    jaxnet eval --workdir DIR|hf:PATH --task FILE... [--step N|best] [--json] [--batch-size N]
    jaxnet predict --workdir DIR --input FILE.npy --out FILE.npy [--step N|best] [--batch-size B] [--probs|--argmax]
                   [--cast]
    jaxnet sample --workdir DIR|hf:PATH [--prompt TEXT | --ids I,J,... | --chat MESSAGE [--system TEXT]] [--tokens N]
                  [--temperature T] [--top-k K] [--repetition-penalty P] [--seed S]
    jaxnet export --workdir DIR --format hf|jax|peft --out PATH [--step N|best] [--chat-template FILE]
    jaxnet bench [FAMILY ...] [--full] [--smoke] [--rounds R] [--seconds S] [--only M,...] [--out DIR]
                 [--compare-devices] [--roofline]
    jaxnet study batch-scaling EXPERIMENT batch=B1,B2,... [--target V] [--lr-rule linear|sqrt|none]
                 [--max-examples N] [--eval-examples N] [--tolerance X] [--smoke] [--workdir DIR] [key=value ...]
    jaxnet study devices [--results DIR] [--workdir DIR]
    jaxnet study async EXPERIMENT staleness=K1,K2,... [workers=W] [--comm-ms MS] [--jitter S] [--smoke]
                 [--workdir DIR] [key=value ...]
    jaxnet plan EXPERIMENT[:VARIANT] [key=value ...] --target h100|h200|a100 [--gpus N] [--nodes N] [--max-batch]
                [--out FILE] [--tokens N | --epochs E] [--price USD_PER_GPU_HOUR] [--calibrate FILE]
    jaxnet prepare SOURCE --tokenizer gpt2|byte|char|hf:DIR --out DIR [--workers N] [--shard I/N] [--shard-tokens N]
                   [--val-fraction F] [--test-fraction F] [--text-field NAME] [--cut-bytes N]
    jaxnet prepare --merge --out DIR
    jaxnet prepare chat FILE... --tokenizer hf:DIR --out DIR [--val FILE] [--test FILE] [--chat-template FILE]
                   [--workers N] [--seq-lens N,...] [--skip-corrupt]
    jaxnet prepare preference FILE... --tokenizer hf:DIR|gpt2|byte --out DIR [--val FILE] [--test FILE]
                   [--chat-template FILE] [--seq-lens N,...]
    jaxnet prepare images DIR --out DIR [--workers N] [--shard-images N] [--skip-corrupt]
    jaxnet lm-eval --model jaxnet --model_args workdir=DIR|hf:PATH --tasks TASK... [any lm-eval option]
    jaxnet list

Bad input ends with one line ``jaxnet: error: ...`` on stderr and exit code 2. ``jaxnet train``
stopped by SIGTERM or SIGINT finishes its step (its call of steps), saves a checkpoint and exits with 0 or 130.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import traceback
from typing import Any

from jaxnet import tokenizers
from jaxnet.errors import UserError

METHODS = ("runner", "handwritten", "pipeline", "resident", "torch")  # jaxnet.bench.METHODS, without importing JAX


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
    train.add_argument(
        "--show-config",
        action="store_true",
        help="print the config, then every key with its value and what auto settings become here; then exit",
    )
    train.add_argument("--adopt", action="store_true", help="resume a workdir that holds a run of another experiment")
    train.add_argument(
        "--verbose",
        action="store_true",
        help="also show the libraries' own log lines (XLA, gloo, orbax), which are kept out of the terminal otherwise",
    )
    hosts = train.add_argument_group(
        "multi-process runs", "one process per host (Slurm and Open MPI are detected without these)"
    )
    hosts.add_argument("--coordinator", metavar="HOST:PORT", help="address of process 0, the same for every process")
    hosts.add_argument("--num-processes", type=int, metavar="N", help="number of processes in the run")
    hosts.add_argument("--process-id", type=int, metavar="I", help="this process's number, 0 to N-1")

    sweep = commands.add_parser(
        "sweep",
        help="train a grid of configurations, batched into one vmapped program where they can be",
        description="Train every combination of the values given as key=v1,v2,... (a tuple key separates its "
        "values with ';'); key=value without a comma is a plain override. Members differing only in the seed and "
        "optimizer or loss scalars share one compiled program. Writes a run directory per member and "
        "sweep.json, sweep.md and sweep.png; rerun the command to resume.",
    )
    sweep.add_argument("experiment", help="name under experiments/ or path to a .py file, optionally :VARIANT")
    sweep.add_argument("overrides", nargs="*", metavar="key=v1,v2,...|key=value", help="the grid, then overrides")
    sweep.add_argument("--workdir", help="sweep directory (default: runs/sweep-EXPERIMENT[-VARIANT])")
    sweep.add_argument(
        "--members-per-program", type=int, default=0, metavar="N", help="at most N members in one program (0 = all)"
    )
    sweep.add_argument(
        "--members-at-once",
        type=int,
        default=None,
        metavar="K",
        help="members one vmapped step takes; the program loops over them K at a time (0 = all; default: all on "
        "an accelerator, on a CPU all for models with convolutions and 1 otherwise)",
    )
    sweep.add_argument("--max-members", type=int, default=256, metavar="N", help="refuse a grid of more members")
    sweep.add_argument(
        "--add",
        action="store_true",
        help="the workdir holds a sweep of another grid: train this grid's new members beside it (one table)",
    )

    evaluate = commands.add_parser(
        "eval", help="evaluate the newest checkpoint of a run, or a Hugging Face checkpoint (hf:PATH) on a corpus"
    )
    evaluate.add_argument(
        "--workdir",
        required=True,
        help="run directory of a training run, or hf:PATH (a checkpoint before any training: give data.path=DIR)",
    )
    evaluate.add_argument("--split", default="test", choices=("test", "val"))
    evaluate.add_argument(
        "--step", type=_checkpoint_step, default=None, help="checkpoint step N, or best (train.keep_best's)"
    )
    evaluate.add_argument(
        "overrides", nargs="*", metavar="key=value", help="change the saved config, e.g. data.dir=DIR"
    )
    evaluate.add_argument(
        "--task",
        nargs="+",
        action="extend",
        metavar="FILE",
        help="score benchmark tasks instead: JSONL files of multiple-choice rows (context, choices, gold) or "
        "log-likelihood rows (context, continuation); prints acc and acc_norm per task and averaged",
    )
    evaluate.add_argument("--json", action="store_true", help="with --task: print the result as JSON")
    evaluate.add_argument(
        "--batch-size", type=int, default=0, metavar="N", help="with --task: requests per batch (0 = automatic)"
    )

    commands.add_parser(
        "lm-eval",
        add_help=False,
        help="lm-evaluation-harness's own command line with jaxnet's model registered: jaxnet lm-eval --model jaxnet "
        "--model_args workdir=RUN|hf:DIR --tasks ... [any lm-eval option] (pip install 'jaxnet[lm-eval]')",
    )

    predict = commands.add_parser(
        "predict",
        help="run a trained model on the inputs in a .npy file; write its outputs (logits) to a .npy file",
        description="Loads the newest checkpoint of a run (or --step), preprocesses the inputs as training did "
        "(images: uint8 (N, H, W, C) as the dataset holds them, normalised with the statistics saved in the run) "
        "and writes the model's outputs in evaluation mode: logits by default, softmax probabilities with "
        "--probs, class indices with --argmax. A run of your own model from Python: use jaxnet.load(RUN, model=...).",
    )
    predict.add_argument("--workdir", required=True, help="run directory of a training run")
    predict.add_argument(
        "--input",
        required=True,
        metavar="FILE.npy",
        help="inputs, one row per example (numpy.save); or, for a run on images, an image file or a directory of them "
        "(sorted by path)",
    )
    predict.add_argument("--out", required=True, metavar="FILE.npy", help="where the outputs go (logits by default)")
    predict.add_argument("--step", default=None, metavar="N|best", help="checkpoint step, or best (default: newest)")
    predict.add_argument(
        "--batch-size", type=int, default=None, metavar="B", help="examples per batch (default: train.eval_batch_size)"
    )
    which = predict.add_mutually_exclusive_group()
    which.add_argument(
        "--probs", action="store_const", const="probs", dest="output", help="write softmax probabilities"
    )
    which.add_argument("--argmax", action="store_const", const="argmax", dest="output", help="write class indices")
    predict.set_defaults(output="logits")
    predict.add_argument(
        "--cast", action="store_true", help="convert inputs of another dtype kind than training's (ints to float32)"
    )

    sample = commands.add_parser("sample", help="print text generated by the newest checkpoint of a language model")
    sample.add_argument("--workdir", required=True, help="run directory of a language-model training run")
    sample.add_argument("--prompt", default=None, help="text to continue (default: the start of a line)")
    sample.add_argument("--tokens", type=int, default=500, help="tokens to generate (characters or words)")
    sample.add_argument("--temperature", type=float, default=0.8, help="0 = always the likeliest token")
    sample.add_argument("--top-k", type=int, default=0, help="draw from the k likeliest tokens only (0 = all)")
    sample.add_argument(
        "--repetition-penalty",
        type=float,
        default=1.0,
        metavar="P",
        help="make tokens already in the text less likely (logits / P where positive, x P where negative, as "
        "transformers' repetition_penalty); 1 = off, 1.2-1.5 keeps greedy replies from looping",
    )
    sample.add_argument("--seed", type=int, default=0, help="random seed of the draws")
    sample.add_argument(
        "--ids", default=None, metavar="I,J,...", help="the prompt as token ids; prints token ids (hf: checkpoints)"
    )
    sample.add_argument(
        "--chat",
        default=None,
        metavar="MESSAGE",
        help="a user's message: rendered with the chat template and its generation prompt; prints the reply",
    )
    sample.add_argument("--system", default=None, metavar="TEXT", help="with --chat: a system turn before the message")

    export = commands.add_parser(
        "export",
        help="write a trained run out: a Hugging Face checkpoint (hf), jax.export's StableHLO (jax) or LoRA "
        "adapters as PEFT writes them (peft)",
        description="--format hf writes a Transformer run as config.json + model.safetensors into the new or empty "
        "directory --out, which transformers' from_pretrained loads (the vocabulary's padding rows dropped; a LoRA "
        "run's adapters merged into its base); --format peft writes a LoRA run's adapters alone (adapter_config.json "
        "+ adapter_model.safetensors, which peft loads onto the base); --format jax writes the inference function "
        "with its weights to the file --out (Trained.export). Nothing is written unless the whole export is.",
    )
    export.add_argument("--workdir", required=True, help="run directory of a training run")
    export.add_argument(
        "--format",
        required=True,
        choices=("hf", "jax", "peft"),
        help="hf (a Hugging Face checkpoint and tokenizer, LoRA adapters merged), jax, or peft (a LoRA run's adapters "
        "alone)",
    )
    export.add_argument("--out", required=True, metavar="PATH", help="hf: a new or empty directory; jax: a new file")
    export.add_argument("--step", type=_checkpoint_step, default=None, help="checkpoint step N, or best")
    export.add_argument(
        "--chat-template",
        default=None,
        metavar="FILE",
        help="hf: the chat template (a Jinja file) written with the tokenizer files (default: the chat corpus's the "
        "run was fine-tuned on, or the checkpoint's)",
    )

    bench = commands.add_parser(
        "bench",
        help="measure training speed against a hand-written jit loop, PyTorch and resident batches",
        description="Training speed of the standard experiments, each measured in alternation with its "
        "yardsticks; prints a table and writes benchmarks/results/<device>-<date>.json.",
    )
    bench.add_argument(
        "families", nargs="*", metavar="FAMILY", help="cnn, lstm, transformer (default), resnet, gpt2_shakespeare, gpt2"
    )
    bench.add_argument("--full", action="store_true", help="every family: adds resnet, gpt2_shakespeare and gpt2 (GPU)")
    bench.add_argument("--smoke", action="store_true", help="the smoke variants, a few steps: checks it all works")
    bench.add_argument("--rounds", type=int, default=3, help="alternations of all measurements (median reported)")
    bench.add_argument("--seconds", type=float, default=3.0, help="length of one timed measurement")
    bench.add_argument(
        "--only", default=",".join(METHODS), help=f"measurements to make, comma-separated ({','.join(METHODS)})"
    )
    bench.add_argument("--out", default="benchmarks/results", help="directory for the results file")
    bench.add_argument("--compare-devices", action="store_true", help="the CPU-versus-GPU table (needs a GPU)")
    bench.add_argument("--roofline", action="store_true", help="only the roofline: FLOPs, bytes, intensity per family")

    plan = commands.add_parser(
        "plan",
        help="compile the train step for GPUs here (no GPU needed): memory, kernels, expected speed and cost",
        description="Compiles the experiment's train and eval steps for N GPUs of the target kind without a GPU "
        "(XLA deviceless compilation) and reports memory per device, whether it fits, FLOPs, the kernels and "
        "collectives of the compiled program, a PREDICTED step time (the largest of four bounds, not a measurement) "
        "and the EXPECTED step (the bound over an efficiency fitted on published runs), with the time and cost of "
        "--tokens or --epochs. "
        "Needs the CUDA plugin wheels, in a directory of their own (.venv/jaxnet-plan or $JAXNET_PLAN_DIR): "
        "pip install --no-deps --target .venv/jaxnet-plan -c constraints.txt -r requirements-plan.txt.",
    )
    plan.add_argument("experiment", help="name under experiments/ or path to a .py file, optionally :VARIANT")
    plan.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides, e.g. mesh.fsdp=8")
    plan.add_argument("--target", required=True, help="GPU kind: a file under jaxnet/targets (h100, h200, a100)")
    plan.add_argument("--gpus", type=int, help="number of GPUs (default: the mesh's size, or 1)")
    plan.add_argument(
        "--nodes", type=int, help="hosts the GPUs are spread over (default: the target's gpus_per_node, 8, to a node)"
    )
    plan.add_argument("--max-batch", action="store_true", help="also find the largest train.batch_size that fits")
    plan.add_argument(
        "--search",
        action="store_true",
        help="find the largest batch and the model.remat policy (and --mesh, among those given) with the best "
        "expected tokens/s that fits; runner-up rows beside it",
    )
    plan.add_argument(
        "--policies", help="with --search: the model.remat policies to try, comma-separated (default: all)"
    )
    plan.add_argument(
        "--mesh",
        action="append",
        metavar="AXIS=N,...",
        help="with --search: a mesh to try (e.g. --mesh fsdp=8 --mesh data=2,fsdp=4); default: the config's",
    )
    plan.add_argument("--out", help="write the plan as JSON to this file")
    goal = plan.add_mutually_exclusive_group()
    goal.add_argument("--tokens", type=float, help="goal: train on N tokens (e.g. 10e9); default: train.steps")
    goal.add_argument("--epochs", type=float, help="goal: E passes over the training data; default: train.steps")
    plan.add_argument("--price", type=float, metavar="USD", help="US dollars per GPU-hour: the goal's predicted cost")
    plan.add_argument(
        "--calibrate",
        metavar="FILE",
        help="a plan-vs-measured file from scripts/gpu_check.sh --only plan on this GPU kind: scale the step by "
        "its measured/predicted ratio",
    )

    _study_parser(commands)
    prep = commands.add_parser(
        "prepare",
        help="tokenize text once into token shards (llm.c's layout) plus corpus.json, for data.name=tokens; "
        "conversations through a checkpoint's chat template (jaxnet prepare chat FILE...); pairs of a chosen and "
        "a rejected reply for preference tuning (jaxnet prepare preference FILE...); "
        "or pack an image folder into ArrayRecord shards (jaxnet prepare images DIR), for data.name=arrayrecord",
        description="SOURCE: shakespeare, ptb, a text file (cut into documents at paragraph ends when it is the "
        "only one), a .jsonl/.jsonl.gz file (one document per line), a .parquet file (one document per row), a glob "
        'pattern or a directory of them; or `chat FILE...`, conversations ({"messages": [...]} or {"prompt", '
        '"completion"} rows of .jsonl, .jsonl.gz or .parquet files) rendered with --tokenizer hf:DIR\'s chat '
        'template; or `preference FILE...`, pairs ({"prompt", "chosen", "rejected"} rows: strings, or lists of '
        "messages rendered with the chat template); or `images DIR`, an image folder with a subdirectory per class. "
        "Killed, it continues when run again.",
    )
    prep.add_argument(
        "source",
        nargs="?",
        help="shakespeare, ptb, a file, a glob pattern or a directory; or chat, preference or images",
    )
    prep.add_argument(
        "folder",
        nargs="*",
        help="with chat: the conversation files; with preference: the files of pairs; with images: the image folder",
    )
    prep.add_argument(
        "--tokenizer",
        default="gpt2",
        help=f"{', '.join(tokenizers.PREPARE_CHOICES)} (hf:DIR: a Hugging Face checkpoint's tokenizer.json); "
        "default: gpt2",
    )
    prep.add_argument("--out", required=True, metavar="DIR", help="directory for the shards and corpus.json")
    prep.add_argument("--workers", type=int, default=0, help="tokenizing processes (default: one per core)")
    prep.add_argument("--shard", default=None, metavar="I/N", help="prepare only the I-th of N slices of the files")
    prep.add_argument("--merge", action="store_true", help="join the corpus-IofN.json of all N slices in --out")
    prep.add_argument("--shard-tokens", type=int, default=100_000_000, metavar="N", help="tokens per shard file")
    prep.add_argument("--val-fraction", type=float, default=0.01, help="documents held out for validation")
    prep.add_argument("--test-fraction", type=float, default=0.01, help="documents held out for test")
    prep.add_argument(
        "--text-field", default="text", help="the field of a JSONL line, the column of a Parquet file: the text"
    )
    prep.add_argument(
        "--cut-bytes",
        type=int,
        default=1 << 16,
        metavar="N",
        help="a source of too few documents (one text file) is cut into documents of about N bytes at paragraph ends",
    )
    prep.add_argument("--val", metavar="FILE", help="chat, preference: conversations (pairs) held out for validation")
    prep.add_argument("--test", metavar="FILE", help="chat, preference: conversations (pairs) held out for test")
    prep.add_argument(
        "--chat-template",
        metavar="FILE",
        help="chat, preference: a Jinja chat template to use instead of the checkpoint's own",
    )
    prep.add_argument(
        "--seq-lens",
        default="512,1024,2048,4096",
        metavar="N,...",
        help="chat: the row lengths (data.seq_len) whose packing padding is reported; preference: whose overlong "
        "pairs are counted",
    )
    prep.add_argument("--shard-images", type=int, default=5000, metavar="N", help="images: records per shard file")
    prep.add_argument(
        "--skip-corrupt",
        action="store_true",
        help="images: leave unreadable images out; chat: malformed lines and conversations (counted, said)",
    )
    prep.add_argument("--quiet", action="store_true", help="no progress bar")

    commands.add_parser("list", help="list the experiments that can be trained, with their results and times")
    return parser


def _checkpoint_step(text: str) -> int | str:
    if text == "best" or (text.isdigit() and text.isascii()):
        return text if text == "best" else int(text)
    raise argparse.ArgumentTypeError(f"{text!r} is not a checkpoint step: give a step number or best")


def _seq_lens(text: str) -> tuple[int, ...]:
    """``--seq-lens 1024,2048`` as row lengths."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts or not all(p.isdigit() and p.isascii() and int(p) > 0 for p in parts):
        raise UserError(f"--seq-lens {text!r}: give positive row lengths separated by commas, e.g. 1024,2048")
    return tuple(int(p) for p in parts)


def _ids(text: str | None) -> list[int] | None:
    """``--ids 464,3290`` as token ids."""
    if text is None:
        return None
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts or not all(p.isdigit() and p.isascii() for p in parts):
        raise UserError(f"--ids {text!r}: give token ids as numbers separated by commas, e.g. --ids 464,3290")
    return [int(p) for p in parts]


def _study_parser(commands: argparse._SubParsersAction) -> None:
    study = commands.add_parser(
        "study",
        help="parallel-SGD studies: batch-size scaling, GPU against CPU, asynchronous SGD (docs/studies.md)",
        description="Studies that train an experiment several times (or read benchmark results) and write "
        "a JSON record and a plot; see docs/studies.md.",
    )
    kinds = study.add_subparsers(dest="study", required=True, parser_class=_Parser, metavar="KIND")

    scaling = kinds.add_parser(
        "batch-scaling",
        help="steps and examples to a target validation metric against batch size; the critical batch size",
    )
    scaling.add_argument("experiment", help="name under experiments/ or path to a .py file, optionally :VARIANT")
    scaling.add_argument(
        "overrides", nargs="*", metavar="batch=B1,B2,...|key=value", help="the batch sizes, then config overrides"
    )
    scaling.add_argument("--target", type=float, help="validation metric to reach (accuracy >=, perplexity/bpc <=)")
    scaling.add_argument("--lr-rule", default="linear", help="learning rate from the base batch: linear, sqrt, none")
    scaling.add_argument("--max-examples", type=int, help="training budget per batch size, in examples")
    scaling.add_argument("--eval-examples", type=int, help="examples between validation passes (every batch size)")
    scaling.add_argument("--tolerance", type=float, default=2.0, help="critical batch: slowdown allowed over perfect")
    scaling.add_argument("--smoke", action="store_true", help="the experiment's smoke variant and a tiny budget")
    scaling.add_argument("--workdir", help="study directory (default: runs/study-batch-scaling-EXPERIMENT)")

    devices = kinds.add_parser("devices", help="GPU against CPU throughput per family from jaxnet bench results")
    devices.add_argument("--results", default="benchmarks/results", help="directory of jaxnet bench results files")
    devices.add_argument("--workdir", help="where the table's JSON and PNG go (default: runs/study-devices)")

    asynchronous = kinds.add_parser(
        "async", help="asynchronous SGD with stale gradients: validation metric against updates and modelled time"
    )
    asynchronous.add_argument("experiment", help="name under experiments/ or path to a .py file, optionally :VARIANT")
    asynchronous.add_argument(
        "overrides",
        nargs="*",
        metavar="staleness=K1,...|workers=W|key=value",
        help="staleness list, workers, overrides",
    )
    asynchronous.add_argument("--comm-ms", type=float, help="communication time per exchange (default: modelled)")
    asynchronous.add_argument("--jitter", type=float, default=0.2, help="workers' compute-time spread (exponential)")
    asynchronous.add_argument("--smoke", action="store_true", help="the experiment's smoke variant and a tiny budget")
    asynchronous.add_argument("--workdir", help="study directory (default: runs/study-async-EXPERIMENT)")


def _run(args: argparse.Namespace, argv: list[str] | None = None) -> int:
    if args.command == "lm-eval":
        from jaxnet import harness

        return harness.main(args.arguments)
    if args.command == "plan":
        return _plan(args, argv)
    if args.command == "prepare":
        from jaxnet.data import prepare

        if args.merge:
            prepare.merge(args.out)
            return 0
        if not args.source:
            raise UserError("jaxnet prepare needs a SOURCE (shakespeare, ptb, a file, a pattern or a directory)")
        if args.source in ("chat", "preference"):
            common = dict(
                val=args.val,
                test=args.test,
                chat_template=args.chat_template,
                val_fraction=args.val_fraction,
                test_fraction=args.test_fraction,
                shard_tokens=args.shard_tokens,
                seq_lens=_seq_lens(args.seq_lens),
                progress=not args.quiet,
            )
            if args.source == "chat":
                from jaxnet.data import chat

                common.update(workers=args.workers, skip_corrupt=args.skip_corrupt)
                chat.prepare_chat(args.folder, args.tokenizer, args.out, **common)
                return 0
            if args.skip_corrupt:
                raise UserError("--skip-corrupt is for jaxnet prepare chat|images; a preference file is read whole")
            from jaxnet.data import preference

            preference.prepare_preference(args.folder, args.tokenizer, args.out, **common)
            return 0
        if args.val or args.test or args.chat_template:
            raise UserError("--val, --test and --chat-template are for jaxnet prepare chat|preference FILE...")
        if args.source == "images":
            if len(args.folder) != 1:
                raise UserError("jaxnet prepare images needs the image folder: jaxnet prepare images DIR --out DIR")
            from jaxnet.data import prepare_images

            prepare_images.prepare_images(
                args.folder[0],
                args.out,
                workers=args.workers,
                shard_images=args.shard_images,
                skip_corrupt=args.skip_corrupt,
                progress=not args.quiet,
            )
            return 0
        if args.folder:
            raise UserError(
                f"jaxnet prepare {args.source} {' '.join(args.folder)}: text takes one SOURCE (a glob pattern or "
                "directory for many files); `jaxnet prepare chat FILE...` renders conversations, "
                "`jaxnet prepare images DIR` packs an image folder"
            )
        prepare.prepare(
            args.source,
            args.tokenizer,
            args.out,
            workers=args.workers,
            shard_tokens=args.shard_tokens,
            val_fraction=args.val_fraction,
            test_fraction=args.test_fraction,
            text_field=args.text_field,
            cut_bytes=args.cut_bytes,
            shard=prepare.parse_shard(args.shard) if args.shard else None,
            progress=not args.quiet,
        )
        return 0
    if args.command == "list":
        from jaxnet import catalog  # reads the files' docstrings: no JAX

        print(catalog.listing())
        return 0
    if args.command == "train":
        from jaxnet.parallel import launchers, watch  # no JAX yet

        if not args.verbose:
            from jaxnet._startup import quiet_libraries

            quiet_libraries()  # before JAX's library loads: it reads its log level once
        launch = launchers.find(args.coordinator, args.num_processes, args.process_id)
        if launch is not None and launch.process_id is not None:  # its errors name it from here on
            watch.identify(launch.process_id, launch.num_processes)
    from jaxnet import config

    if args.command == "train":
        cfg = config.load_experiment(args.experiment, args.overrides)
        if args.show_config:
            shaped, taken = _checkpoint_shape(cfg)
            print(json.dumps(shaped.to_dict(), indent=2))
            print("\nkeys:\n" + config.describe(cfg, {**_in_effect(shaped), **taken}))
            return 0
        from jaxnet import parallel
        from jaxnet.train import train

        parallel.init_processes(args.coordinator, args.num_processes, args.process_id, quiet=not args.verbose)
        summary = train(cfg, args.workdir, adopt=args.adopt)
        # Stopped by a signal after saving a checkpoint: SIGTERM (preemption) is a clean exit
        return 130 if summary.get("interrupted_by") == "SIGINT" else 0
    if args.command == "sweep":
        from jaxnet.sweep import sweep

        record = sweep(
            args.experiment,
            args.overrides,
            args.workdir,
            members_per_program=args.members_per_program,
            members_at_once=args.members_at_once,
            max_members=args.max_members,
            add=args.add,
        )
        return 130 if record.get("interrupted_by") == "SIGINT" else 0
    if args.command == "eval" and args.task:
        if args.overrides:
            raise UserError(f"--task scores the checkpoint as it is; {args.overrides[0]} has nothing to change")
        if args.batch_size < 0:
            raise UserError(f"--batch-size {args.batch_size}: give a number of requests of at least 1 (0 = automatic)")
        from jaxnet import benchmarks

        result = benchmarks.evaluate(args.workdir, args.task, step=args.step, batch_size=args.batch_size)
        print(json.dumps(result) if args.json else benchmarks.table(result))
        return 0
    if args.command == "eval":
        from jaxnet.train import evaluate

        if args.workdir.startswith("hf:"):  # a published checkpoint before any training
            from jaxnet.train.evaluation import evaluate_pretrained

            if args.step is not None:
                raise UserError(f"--step is for a run's checkpoints; {args.workdir} is one checkpoint")
            print(json.dumps(evaluate_pretrained(args.workdir, args.split, args.overrides)))
            return 0
        result = evaluate(args.workdir, args.split, args.overrides, step=args.step)
        print(json.dumps(result))
        return 0
    if args.command == "predict":
        from jaxnet.predict import predict_file

        print(
            predict_file(
                args.workdir,
                args.input,
                args.out,
                step=args.step,
                batch_size=args.batch_size,
                output=args.output,
                cast=args.cast,
            )
        )
        return 0
    if args.command == "bench":
        from jaxnet import bench

        families = tuple(args.families) or (tuple(bench.CASES) if args.full else bench.STANDARD)
        opts = bench.Options(
            families=families,
            rounds=args.rounds,
            seconds=args.seconds,
            methods=tuple(m for m in args.only.split(",") if m),
            smoke=args.smoke,
            roofline=args.roofline,
            out=args.out,
        )
        bench.main(opts, compare=args.compare_devices)
        return 0
    if args.command == "study":
        from jaxnet import study

        return study.main(args, command=shlex.join(["jaxnet", *(sys.argv[1:] if argv is None else argv)]))
    if args.command == "sample":
        from jaxnet.sample import sample

        prompts = (("--prompt", args.prompt), ("--ids", args.ids), ("--chat", args.chat))
        given = [flag for flag, value in prompts if value is not None]
        if len(given) > 1:
            raise UserError(
                f"give the prompt as one of --prompt TEXT, --ids I,J,... or --chat MESSAGE, not {' and '.join(given)}"
            )
        if args.system is not None and args.chat is None:
            raise UserError("--system adds a system turn to a conversation: give the user's message with --chat")
        text = sample(
            args.workdir,
            args.prompt,
            args.tokens,
            temperature=args.temperature,
            top_k=args.top_k,
            seed=args.seed,
            ids=_ids(args.ids),
            chat=args.chat,
            system=args.system,
            repetition_penalty=args.repetition_penalty,
        )
        print(text)
        if args.chat is not None and not text.strip():
            print(
                "(the reply is empty: the model ended its turn at once; a model trained longer, or sampling with "
                "--temperature 0.8 --seed N, may answer)",
                file=sys.stderr,
            )
        return 0
    if args.command == "export":
        from jaxnet.predict import export_run

        print(export_run(args.workdir, args.out, args.format, step=args.step, chat_template=args.chat_template))
        return 0
    raise AssertionError(args.command)


def _checkpoint_shape(cfg: Any) -> tuple[Any, dict[str, str]]:
    """``cfg`` with the shape of the Hugging Face checkpoint ``train.init_from=hf:DIR`` names (what
    the run takes from it), and each key it changes as ``--show-config`` shows it; ``cfg`` and
    nothing for any other start."""
    from jaxnet.models import hf

    if not hf.is_hf(cfg.train.init_from):
        return cfg, {}
    from jaxnet.config import model_keys
    from jaxnet.train import init_from

    shaped = init_from.with_hf_shape(cfg)
    taken = {}
    for key in [*model_keys(type(cfg.model)), "data.seq_len", "data.vocab_size"]:
        section, _, name = key.partition(".")
        theirs = getattr(getattr(shaped, section), name)
        if theirs != getattr(getattr(cfg, section), name):
            shown = json.dumps(theirs) if isinstance(theirs, bool) else theirs  # as the values above show it
            taken[key] = f"{shown} (from {cfg.train.init_from})"
    return shaped, taken


def _in_effect(cfg: Any) -> dict[str, str]:
    """What ``--show-config`` adds to the values: what the settings left to jaxnet become on this
    machine's devices, and which keys the experiment file's own functions replace."""
    import jax

    from jaxnet import config as config_lib
    from jaxnet import parallel
    from jaxnet.train.loop import experiment_hooks

    try:
        sizes = parallel.mesh_shape(cfg.mesh, jax.device_count())
    except UserError:  # the run would say so; the config is still worth showing
        sizes = None
    return config_lib.settings_in_effect(cfg, jax.default_backend(), sizes, experiment_hooks(cfg))


# The command again, in a Python whose path starts with the plan's wheels: JAX binds the CUDA plugin
# when it is imported, which this process has done without it.
_WITH_PLUGIN = """import sys
from jaxnet._startup import bind_cuda_plugin
bind_cuda_plugin()
from jaxnet.cli import main
sys.exit(main())
"""


def _replan_with_plugin(plan_dir: str) -> None:
    path = os.pathsep.join(p for p in (plan_dir, os.environ.get("PYTHONPATH")) if p)
    env = dict(os.environ, PYTHONPATH=path, JAX_PLATFORMS="cpu")
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, "-P", "-c", _WITH_PLUGIN, *sys.argv[1:]], env)


def _plan(args: argparse.Namespace, argv: list[str] | None) -> int:
    # JAX itself stays on the CPU: the CUDA plugin compiles for the target without starting a GPU.
    os.environ["JAX_PLATFORMS"] = "cpu"
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    from jaxnet import config, planner

    if args.gpus is not None and args.gpus < 1:
        raise UserError(f"--gpus {args.gpus}: give a number of GPUs of at least 1")
    if not args.search and (args.policies or args.mesh):
        raise UserError(
            "--policies and --mesh choose what --search tries; add --search (or set model.remat and mesh.*)"
        )
    if args.search and (args.max_batch or args.calibrate or args.tokens or args.epochs or args.price is not None):
        raise UserError(
            "--search finds the batch and policy; plan its answer again for --max-batch, a goal or --calibrate"
        )
    if args.mesh:
        from jaxnet import plan_search

        for mesh in args.mesh:
            plan_search.parse_mesh(mesh)
    target = planner.load_target(args.target)
    planner.check_goal(args.tokens, args.epochs, args.price)
    if args.calibrate is not None:
        planner.load_calibration(args.calibrate, target)
    cfg = config.load_experiment(args.experiment, args.overrides)
    planner.gpus_per_node(target, planner.gpus_for(cfg, args.gpus), args.nodes)
    missing = planner.plugin_missing()
    if missing:
        raise UserError(f"jaxnet plan needs the CUDA plugin wheels ({missing} is missing): {planner.INSTALL}")
    if argv is None and not planner.jax_has_plugin() and str(planner.plan_dir()) not in sys.path:
        _replan_with_plugin(str(planner.plan_dir()))
    # An executable compiled without a GPU goes into JAX's persistent cache (JAX_COMPILATION_CACHE_DIR)
    # but cannot be read back without one: the next plan would warn and compile again anyway.
    import jax

    jax.config.update("jax_enable_compilation_cache", False)
    if args.search:
        return _plan_search(args, argv, cfg)
    report = planner.plan(
        cfg,
        args.target,
        args.gpus,
        max_batch=args.max_batch,
        tokens=args.tokens,
        epochs=args.epochs,
        price=args.price,
        calibrate=args.calibrate,
        nodes=args.nodes,
        say=print,
    )
    report["command"] = shlex.join(["jaxnet", *(sys.argv[1:] if argv is None else argv)])
    print(planner.describe(report))
    if args.out:
        try:
            with open(args.out, "w") as f:
                json.dump(report, f, indent=2)
                f.write("\n")
        except OSError as e:
            raise UserError(f"cannot write --out {args.out}: {e.strerror}") from None
        print(f"wrote {args.out}")
    return 0


def _plan_search(args: argparse.Namespace, argv: list[str] | None, cfg: object) -> int:
    from jaxnet import plan_search

    found = plan_search.search(
        cfg,
        args.target,
        args.gpus,
        policies=tuple(p for p in args.policies.split(",") if p) if args.policies else None,
        meshes=[plan_search.parse_mesh(m) for m in args.mesh] if args.mesh else None,
        nodes=args.nodes,
        say=print,
    )
    found["command"] = shlex.join(["jaxnet", *(sys.argv[1:] if argv is None else argv)])
    print(plan_search.describe(found))
    if args.out:
        _write_json(args.out, found)
    return 0


def _write_json(path: str, record: dict) -> None:
    try:
        with open(path, "w") as f:
            json.dump(record, f, indent=2)
            f.write("\n")
    except OSError as e:
        raise UserError(f"cannot write --out {path}: {e.strerror}") from None
    print(f"wrote {path}")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line as the ``jaxnet`` command reads it; a :class:`UserError` if it cannot."""
    parser = _parser()
    words = sys.argv[1:] if argv is None else argv
    if words[:1] == ["lm-eval"]:  # lm-eval's own options, which it parses (jaxnet.harness)
        return argparse.Namespace(command="lm-eval", arguments=list(words[1:]))
    args, extra = parser.parse_known_args(argv)
    # argparse stops collecting positionals at the first option, so gather the key=value
    # pairs that come after --workdir here.
    unknown = [e for e in extra if not hasattr(args, "overrides") or "=" not in e or e.startswith("-")]
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    if extra:
        args.overrides = [*args.overrides, *extra]
    return args


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``jaxnet`` command; returns the exit code."""
    try:
        return _run(parse_args(argv), argv)
    except UserError as e:
        return _leave_processes(2, f"jaxnet: error: {e}")
    except KeyboardInterrupt:
        return _leave_processes(
            130, "jaxnet: interrupted; run the same command again to resume from the last checkpoint"
        )
    except BrokenPipeError:  # `jaxnet list | head`: the reader has gone, which is not an error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so the exit's flush does not fail again
        return 0
    except BaseException as e:
        if _multi_process():
            from jaxnet import parallel

            message = parallel.peer_stopped(e)  # another process died: one line, not this traceback
            if message is None:
                from jaxnet.parallel import watch

                print(watch.tagged("jaxnet: error: stopped by an unexpected error:"), file=sys.stderr)
                traceback.print_exc()
            _leave_processes(1, message)
        raise


def _multi_process() -> bool:
    if "jax" not in sys.modules:  # failed before JAX was needed
        return False
    import jax

    return jax.distributed.is_initialized()


def _leave_processes(code: int, message: str | None) -> int:
    """Print ``message`` on stderr and return ``code``; in a multi-process run, exit at once
    instead and tell the other processes, which stop too (a normal exit would wait at JAX's
    shutdown barrier for them while they wait in a collective for this one)."""
    if _multi_process():
        from jaxnet import parallel

        parallel.leave(code, message)
    if message and "jaxnet.parallel.watch" in sys.modules:  # a process of a run that has not joined: say which
        message = sys.modules["jaxnet.parallel.watch"].tagged(message)
    if message:
        print(message, file=sys.stderr)
    return code

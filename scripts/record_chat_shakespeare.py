"""Record chat_shakespeare end to end on this machine, offline, and save the results file.

    python scripts/record_chat_shakespeare.py [--pretrain-steps 600] [--steps 100] [--lora-rank 8]
        [--repetition-penalty 1.3] [--keep DIR [--reuse]]

Runs, each as the ``jaxnet`` command a user types, in a scratch directory (or ``--keep DIR``):

1. ``jaxnet train llama_shakespeare train.steps=P`` (its corpus prepared on first use): the
   pretraining of the Llama-style model in GPT-2's tokens (P = 600, the experiment's own steps);
2. ``jaxnet export --format hf --chat-template experiments/chat_shakespeare.jinja``: the checkpoint
   with GPT-2's tokenizer files and the template;
3. ``python experiments/chat_shakespeare.py convs`` and ``jaxnet prepare chat``: the conversations
   of the plays, into the experiment's default corpus;
4. ``jaxnet eval --workdir hf:CKPT`` on the validation and test conversations: the loss over the
   assistant's tokens before fine-tuning;
5. ``jaxnet train chat_shakespeare train.init_from=hf:CKPT``: the fine-tune of every weight, and
   the same with ``train.lora_rank=R`` (adapters alone, at ``--lora-lr``; ``--lora-rank 0`` skips it);
6. ``jaxnet sample --chat`` (greedy, and greedy with ``--repetition-penalty``) of the checkpoint
   and of the fine-tunes, on the first user turns of the test play.

``--keep DIR --reuse`` works in a DIR an earlier ``--keep DIR`` left: step 1's run is resumed
where it stopped (a finished one at once), so a stopped recording goes on.

Writes ``docs/results/chat_shakespeare-<platform>-<date>.json``: every command, its wall time,
the losses, the replies, the device, the library versions and the date.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from jaxnet import observe

ROOT = Path(__file__).resolve().parents[1]
MESSAGES = 4  # test-play user turns sampled before and after


def main(argv: list[str]) -> int:
    """Run the steps and write the results file; returns the exit code."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pretrain-steps", type=int, default=600, help="llama_shakespeare's train.steps")
    parser.add_argument("--steps", type=int, default=100, help="chat_shakespeare's train.steps")
    parser.add_argument("--lora-rank", type=int, default=8, help="the LoRA fine-tune's train.lora_rank (0: none)")
    parser.add_argument("--lora-lr", type=float, default=3e-3, help="the LoRA fine-tune's optim.lr")
    parser.add_argument("--repetition-penalty", type=float, default=1.3, help="the guarded greedy replies' P")
    parser.add_argument("--keep", type=Path, default=None, help="work in DIR (new) and leave everything there")
    parser.add_argument("--reuse", action="store_true", help="with --keep: DIR may hold an earlier recording's work")
    args = parser.parse_args(argv)
    if args.reuse and args.keep is None:
        print("--reuse goes with --keep DIR: the directory whose work to reuse", file=sys.stderr)
        return 2
    if args.keep is not None and args.keep.exists() and not args.reuse:
        print(f"--keep {args.keep}: already exists; give a new directory (or --reuse to go on in it)", file=sys.stderr)
        return 2
    work = args.keep.absolute() if args.keep else Path(tempfile.mkdtemp(prefix="jaxnet-chat-"))
    work.mkdir(parents=True, exist_ok=True)
    template = ROOT / "experiments" / "chat_shakespeare.jinja"
    steps: list[dict] = []
    load_start = os.getloadavg()[0]

    def run(*command: str) -> str:
        started = time.perf_counter()
        python = [sys.executable] if command[0] == "python" else [sys.executable, "-m", "jaxnet"]
        result = subprocess.run([*python, *command[1:]], cwd=work, capture_output=True, text=True)
        wall = time.perf_counter() - started
        shown = " ".join(command).replace(str(ROOT) + "/", "")
        print(f"{wall:7.1f} s  {shown}", flush=True)
        if result.returncode != 0:
            sys.stderr.write(result.stdout[-3000:] + result.stderr[-3000:])
            raise SystemExit(result.returncode)
        steps.append({"command": shown, "wall_time_s": round(wall, 1)})
        return result.stdout

    try:
        p = args.pretrain_steps
        run("jaxnet", "train", "llama_shakespeare", f"train.steps={p}", f"train.eval_every={p}",
            f"train.checkpoint_every={p}", "train.progress=false", "--workdir", "runs/llama_shakespeare")  # fmt: skip
        pretrain = json.loads((work / "runs/llama_shakespeare/summary.json").read_text())
        (work / "checkpoints").mkdir(exist_ok=True)
        run("jaxnet", "export", "--workdir", "runs/llama_shakespeare", "--format", "hf", "--out",
            "checkpoints/llama-shakespeare", "--chat-template", str(template))  # fmt: skip
        run("python", str(ROOT / "experiments" / "chat_shakespeare.py"), "corpora/chat-shakespeare-conversations")
        conv = "corpora/chat-shakespeare-conversations"
        prepared = run("jaxnet", "prepare", "chat", f"{conv}/train.jsonl", "--val", f"{conv}/val.jsonl", "--test",
                       f"{conv}/test.jsonl", "--tokenizer", "hf:checkpoints/llama-shakespeare", "--out",
                       "corpora/chat-shakespeare-llama-shakespeare", "--seq-lens", "128", "--quiet")  # fmt: skip
        corpus = "data.path=corpora/chat-shakespeare-llama-shakespeare"
        before = {}
        for split in ("val", "test"):
            out = run("jaxnet", "eval", "--workdir", "hf:checkpoints/llama-shakespeare", "--split", split, corpus,
                      "data.seq_len=128", "train.eval_tokens=1000000")  # fmt: skip
            before[split] = json.loads(out.strip().splitlines()[-1])
        tests = [json.loads(line) for line in (work / conv / "test.jsonl").read_text().splitlines()[:MESSAGES]]
        greedy = ["--temperature", "0", "--tokens", "60"]
        guarded = [*greedy, "--repetition-penalty", str(args.repetition_penalty)]

        def answer(entry: dict, workdir: str, label: str) -> None:
            for name, how in ((label, greedy), (f"{label}, guarded", guarded)):
                entry[name] = run("jaxnet", "sample", "--workdir", workdir, "--chat", entry["user"], *how).rstrip("\n")

        replies: list[dict] = []
        for row in tests:
            user, reply = (m["content"] for m in row["messages"])
            replies.append({"user": user, "play's reply": reply})
            answer(replies[-1], "hf:checkpoints/llama-shakespeare", "before fine-tuning")
        run("jaxnet", "train", "chat_shakespeare", "train.init_from=hf:checkpoints/llama-shakespeare",
            f"train.steps={args.steps}", "train.eval_tokens=1000000", "train.progress=false", "--workdir",
            "runs/chat_shakespeare")  # fmt: skip
        chat = json.loads((work / "runs/chat_shakespeare/summary.json").read_text())
        for entry in replies:
            answer(entry, "runs/chat_shakespeare", "after fine-tuning")
        lora = None
        if args.lora_rank:
            run("jaxnet", "train", "chat_shakespeare", "train.init_from=hf:checkpoints/llama-shakespeare",
                f"train.lora_rank={args.lora_rank}", f"train.lora_alpha={2 * args.lora_rank}",
                f"optim.lr={args.lora_lr}", f"train.steps={args.steps}", "train.eval_tokens=1000000",
                "train.progress=false", "--workdir", "runs/chat_shakespeare_lora")  # fmt: skip
            lora = json.loads((work / "runs/chat_shakespeare_lora/summary.json").read_text())
            for entry in replies:
                answer(entry, "runs/chat_shakespeare_lora", "after LoRA fine-tuning")
        manifest = json.loads((work / "corpora/chat-shakespeare-llama-shakespeare/corpus.json").read_text())
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    env = chat["environment"]
    date = datetime.date.today().isoformat()
    device = env["device"] if env["platform"] != "cpu" else f"{env['cpu_count']}-core CPU ({observe.cpu_model()})"
    record = {
        "kind": "chat fine-tuning, end to end",
        "date": date,
        "device": device,
        "platform": env["platform"],
        "versions": env["versions"],
        "python": env["python"],
        "git_commit": env["git_commit"],
        "load_average": [round(load_start, 2), round(os.getloadavg()[0], 2)],
        "steps": steps,
        "pretraining": {
            "experiment": "llama_shakespeare",
            "steps": pretrain["step"],
            "wall_time_s": pretrain.get("wall_time_s"),  # the run's own, also when --reuse resumed it finished
            "reused": args.reuse,
            "val_loss": pretrain["val"]["loss"],
            "test_loss": pretrain["test"]["loss"],
            "param_count": pretrain["param_count"],
        },
        "conversations": {
            s: {k: manifest["splits"][s][k] for k in ("documents", "tokens", "trained_tokens")}
            for s in ("train", "val", "test")
        },
        "packing": manifest["chat"]["packing"],
        "prepare_output": prepared.strip().splitlines(),
        "before_fine_tuning": {s: {"loss": before[s]["loss"]} for s in before},
        "fine_tuning": {
            "experiment": "chat_shakespeare",
            "steps": chat["step"],
            "val_loss": chat["val"]["loss"],
            "test_loss": chat["test"]["loss"],
            "compile_time_s": chat["compile_time_s"],
            "tokens_per_s": chat.get("tokens_per_s"),
        },
        "lora_fine_tuning": None
        if lora is None
        else {
            "experiment": "chat_shakespeare",
            "overrides": [
                f"train.lora_rank={args.lora_rank}",
                f"train.lora_alpha={2 * args.lora_rank}",
                f"optim.lr={args.lora_lr}",
            ],  # fmt: skip
            "trained_parameters": lora["param_count"],
            "steps": lora["step"],
            "val_loss": lora["val"]["loss"],
            "test_loss": lora["test"]["loss"],
            "compile_time_s": lora["compile_time_s"],
            "tokens_per_s": lora.get("tokens_per_s"),
        },
        "sampling": {
            "greedy": "--temperature 0 --tokens 60",
            "guarded": f"the same, --repetition-penalty {args.repetition_penalty}",
        },  # fmt: skip
        "replies": replies,
    }
    out = ROOT / "docs" / "results" / f"chat_shakespeare-{env['platform']}-{date}.json"
    out.write_text(json.dumps(record, indent=2, ensure_ascii=False) + "\n")
    print(
        f"wrote {out.relative_to(ROOT)}: assistant-token loss on the test play {before['test']['loss']:.3f} before, "
        f"{chat['test']['loss']:.3f} after {chat['step']} steps"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

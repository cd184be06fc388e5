"""Record dpo_shakespeare end to end on this machine, offline, and save the results file.

    python scripts/record_dpo_shakespeare.py [--pretrain-steps 120] [--chat-steps 100] [--steps 100]
                                             [--lora-rank 0] [--lora-lr 1e-3] [--work DIR]

Runs, each as the ``jaxnet`` command a user types, in a scratch directory (or ``--work DIR``, kept;
a run already complete there is not trained again: its command returns at once and its summary is
what is recorded; an export is written again from its run):

1. chat_shakespeare's road: ``jaxnet train llama_shakespeare train.steps=P``, ``jaxnet export
   --chat-template experiments/chat_shakespeare.jinja``, ``jaxnet train chat_shakespeare
   train.steps=C``, then ``jaxnet export`` of that fine-tune: the checkpoint DPO starts from;
2. ``python experiments/dpo_shakespeare.py`` and ``jaxnet prepare preference``: the pairs of the plays;
3. ``jaxnet eval --workdir hf:CKPT train.objective=simpo`` on the first 256 test pairs: how often the
   checkpoint's mean log-probability per token already prefers the true reply (DPO against itself is
   ln 2 with no reward, by construction);
4. ``jaxnet train dpo_shakespeare``: every weight against a frozen copy, and with ``--lora-rank R``
   also the adapters alone against the base;
5. each DPO run exported and evaluated as in 3 with ``train.objective=simpo``: the same preference
   measured on the tuned model.

Writes ``docs/results/dpo_shakespeare-<platform>-<date>.json``: every command, its wall time, the
runs' summaries, the device, the library versions and the date.
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
EVAL_TOKENS = 256 * 2 * 128  # the first 256 pairs of the test play, as dpo_shakespeare evaluates
METRICS = ("loss", "rewards/accuracies", "rewards/margins", "rewards/chosen", "rewards/rejected",
           "logps/chosen", "logps/rejected")  # fmt: skip


def main(argv: list[str]) -> int:
    """Run the steps and write the results file; returns the exit code."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pretrain-steps", type=int, default=120, help="llama_shakespeare's train.steps (600)")
    parser.add_argument("--chat-steps", type=int, default=100, help="chat_shakespeare's train.steps")
    parser.add_argument("--steps", type=int, default=100, help="dpo_shakespeare's train.steps")
    parser.add_argument("--lora-rank", type=int, default=0, help="also a LoRA run of this train.lora_rank (0: none)")
    parser.add_argument("--lora-lr", type=float, default=1e-3, help="the LoRA run's optim.lr")
    parser.add_argument("--work", type=Path, default=None, help="work in DIR and leave everything there")
    args = parser.parse_args(argv)
    work = args.work.absolute() if args.work else Path(tempfile.mkdtemp(prefix="jaxnet-dpo-"))
    work.mkdir(parents=True, exist_ok=True)
    steps: list[dict] = []
    load_start = os.getloadavg()[0]

    def run(*command: str) -> str:
        if command[:2] == ("jaxnet", "export"):  # made again from its run (a --work DIR used before)
            shutil.rmtree(work / command[command.index("--out") + 1], ignore_errors=True)
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

    def summary(run_dir: str) -> dict:
        s = json.loads((work / run_dir / "summary.json").read_text())
        keep = ("step", "param_count", "wall_time_s", "compile_time_s", "tokens_per_s")
        return {**{k: s.get(k) for k in keep}, **{split: _metrics(s[split]) for split in ("val", "test") if split in s}}

    def evaluate(workdir: str, *extra: str) -> dict:
        settings = [f"data.path={corpus}", "data.seq_len=128", f"train.eval_tokens={EVAL_TOKENS}"]
        said = run("jaxnet", "eval", "--workdir", workdir, "--split", "test", *settings, "train.eval_batch_size=32",
                   *extra)  # fmt: skip
        return {"test": _metrics(json.loads(said.strip().splitlines()[-1]))}

    try:
        p, c = args.pretrain_steps, args.chat_steps
        run("jaxnet", "train", "llama_shakespeare", f"train.steps={p}", f"train.eval_every={p}",
            f"train.checkpoint_every={p}", "train.progress=false", "--workdir", "runs/llama_shakespeare")  # fmt: skip
        template = str(ROOT / "experiments" / "chat_shakespeare.jinja")
        (work / "checkpoints").mkdir(exist_ok=True)
        run("jaxnet", "export", "--workdir", "runs/llama_shakespeare", "--format", "hf", "--out",
            "checkpoints/llama-shakespeare", "--chat-template", template)  # fmt: skip
        run("jaxnet", "train", "chat_shakespeare", "train.init_from=hf:checkpoints/llama-shakespeare",
            f"train.steps={c}", "train.eval_tokens=1000000", "train.progress=false", "--workdir",
            "runs/chat_shakespeare")  # fmt: skip
        run("jaxnet", "export", "--workdir", "runs/chat_shakespeare", "--format", "hf", "--out",
            "checkpoints/chat-shakespeare")  # fmt: skip
        pairs = "corpora/dpo-shakespeare-pairs"
        run("python", str(ROOT / "experiments" / "dpo_shakespeare.py"), pairs)
        corpus = "corpora/dpo-shakespeare-chat-shakespeare"
        prepared = run("jaxnet", "prepare", "preference", f"{pairs}/train.jsonl", "--val", f"{pairs}/val.jsonl",
                       "--test", f"{pairs}/test.jsonl", "--tokenizer", "hf:checkpoints/chat-shakespeare", "--out",
                       corpus, "--seq-lens", "128", "--quiet")  # fmt: skip
        start = "hf:checkpoints/chat-shakespeare"
        before = {"simpo": evaluate(start, "train.objective=simpo")}  # DPO against itself is ln 2 by construction
        tuned = {}
        runs = {"full": ("runs/dpo_shakespeare", [])}
        if args.lora_rank:
            lora = [f"train.lora_rank={args.lora_rank}", f"train.lora_alpha={2 * args.lora_rank}",
                    f"optim.lr={args.lora_lr}"]  # fmt: skip
            runs["lora"] = ("runs/dpo_shakespeare_lora", lora)
        for name, (workdir, extra) in runs.items():
            run("jaxnet", "train", "dpo_shakespeare", f"train.init_from={start}", f"data.path={corpus}",
                f"train.steps={args.steps}", *extra, "train.progress=false", "--workdir", workdir)  # fmt: skip
            exported = f"checkpoints/{Path(workdir).name}"
            run("jaxnet", "export", "--workdir", workdir, "--format", "hf", "--out", exported)
            tuned[name] = {
                "overrides": extra,
                "summary": summary(workdir),
                "simpo_eval": evaluate(f"hf:{exported}", "train.objective=simpo"),
            }
        manifest = json.loads((work / corpus / "corpus.json").read_text())
        chat = summary("runs/chat_shakespeare")
        environment = json.loads((work / "runs/dpo_shakespeare/summary.json").read_text())["environment"]
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    date = datetime.date.today().isoformat()
    env = environment
    device = env["device"] if env["platform"] != "cpu" else f"{env['cpu_count']}-core CPU ({observe.cpu_model()})"
    record = {
        "kind": "preference tuning (DPO), end to end",
        "date": date,
        "device": device,
        "platform": env["platform"],
        "versions": env["versions"],
        "python": env["python"],
        "git_commit": env["git_commit"],
        "load_average": [round(load_start, 2), round(os.getloadavg()[0], 2)],
        "steps": steps,
        "chat_fine_tuning": chat,
        "pairs": {
            s: {k: manifest["splits"][s][k] for k in ("pairs", "tokens", "trained_tokens")}
            for s in ("train", "val", "test")
        },  # fmt: skip
        "prepare_output": prepared.strip().splitlines(),
        "before": before,
        "dpo": tuned,
    }
    out = ROOT / "docs" / "results" / f"dpo_shakespeare-{env['platform']}-{date}.json"
    out.write_text(json.dumps(record, indent=2, ensure_ascii=False) + "\n")
    full = tuned["full"]["summary"]["test"]
    print(
        f"wrote {out.relative_to(ROOT)}: test reward accuracy {full['rewards/accuracies']:.3f} after {args.steps} steps"
    )
    return 0


def _metrics(values: dict) -> dict:
    return {k: values[k] for k in METRICS if k in values}


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

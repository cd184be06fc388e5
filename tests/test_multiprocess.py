"""Multi-process runs: 2 processes x 4 CPU devices, started by ``scripts/launch_local.sh`` and
talking over localhost (gloo), train exactly like 1 process with 8 devices, write one set of
logs, and leave checkpoints that a single process resumes."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from conftest import patient, run_patiently

ROOT = Path(__file__).resolve().parents[1]
RUN = [
    "transformer_shakespeare:smoke",
    "data.name=text",
    "train.progress=false",
    "train.checkpoint_every=10",
    "mesh.data=-1",
    "mesh.fsdp=2",
]


def _env(devices: int) -> dict[str, str]:
    from conftest import cpu_env

    env = cpu_env(devices)
    env["PYTHON"] = sys.executable
    return env


def _losses_of(text: str) -> dict[tuple[int, str], float]:
    """(step, split) -> loss of the lines of a metrics.jsonl."""
    return {(r["step"], r["split"]): r["loss"] for r in map(json.loads, text.splitlines())}


def _losses(workdir: Path) -> dict[tuple[int, str], float]:
    return _losses_of((workdir / "metrics.jsonl").read_text())


def _run(command: list[str], devices: int, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run ``command`` with ``devices`` simulated CPU devices per process; it must succeed."""
    env = {**_env(devices), **(env or {})}
    result = run_patiently(command, capture_output=True, text=True, env=env, timeout=300, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def _stranger(address: tuple[str, int], payload: bytes, wait: float = 5.0) -> bool:
    """Connect to a watch, send ``payload`` and say whether the watch closed the connection
    within ``wait`` seconds (after sending its challenge first)."""
    import socket
    import time

    with socket.create_connection(address, timeout=wait) as connection:
        assert connection.recv(4096).startswith(b"challenge ")
        with contextlib.suppress(OSError):  # the watch may close before it has read it all
            connection.sendall(payload)
        until = time.monotonic() + wait
        while time.monotonic() < until:
            try:
                if not connection.recv(4096):
                    return True
            except TimeoutError:
                pass
            except OSError:  # reset: closed with data unread
                return True
        return False


def _disturb(address: tuple[str, int], wait: float = 5.0) -> dict[str, bool]:
    """What a stranger who can reach process 0's watch might send, each on a connection of its
    own: for each, whether the watch closed that connection within ``wait`` seconds. Then 100
    connections opened and closed at once."""
    import random
    import socket

    rng = random.Random(0)
    attempts = {
        "hello 1": b"hello 1\n",
        "failed 1 9": b"failed 1 9\n",
        "random bytes": rng.randbytes(4096),
        "1 MB line without a newline": b"x" * 1_000_000,
        # a handshake seen on another connection: its proof is for another challenge
        "replayed handshake": f"hello 1 {rng.randbytes(16).hex()} {rng.randbytes(32).hex()}\n".encode(),
    }
    closed = {name: _stranger(address, payload, wait) for name, payload in attempts.items()}
    for _ in range(100):
        socket.create_connection(address, timeout=5).close()
    return closed


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Three runs of the same 30 steps: one process with 8 devices; two processes with 4 each,
    disturbed by a stranger at process 0's watch and stopped after 20 steps (what they wrote is
    kept as it was then); and one process with 8 devices finishing the two processes' run from
    their checkpoint."""
    tmp = tmp_path_factory.mktemp("multiprocess")
    text = tmp / "fox.txt"
    text.write_text("the quick brown fox jumps over the lazy dog.\n" * 400)
    args = [*RUN, f"data.path={text}"]
    one_process = [sys.executable, "-m", "jaxnet", "train", *args]
    two_processes = [str(ROOT / "scripts" / "launch_local.sh"), "2", *args]
    one = _run([*one_process, "--workdir", str(tmp / "one")], 8)
    port, disturbed = _free_port(), {}
    stranger = threading.Thread(target=_disturb_when_listening, args=(("localhost", port), disturbed), daemon=True)
    stranger.start()
    two = _run(
        [*two_processes, "train.stop_after=20", "--workdir", str(tmp / "two")], 4, env={"JAXNET_WATCH_PORT": str(port)}
    )
    stranger.join(timeout=patient(60))
    written = (tmp / "two" / "metrics.jsonl").read_text()  # by the two processes, before the resume adds to it
    summary = json.loads((tmp / "two" / "summary.json").read_text())
    rest = _run([*one_process, "--workdir", str(tmp / "two")], 8)
    return {
        "one": (tmp / "one", one),
        "two": (tmp / "two", two),
        "two_wrote": (written, summary),
        "rest": rest,
        "disturbed": disturbed,
    }


def _disturb_when_listening(address: tuple[str, int], report: dict) -> None:
    """:func:`_disturb` as soon as the watch at ``address`` listens, into ``report`` (with
    ``during``: whether the run was still going afterwards, the watch still answering)."""
    import socket
    import time

    deadline = time.monotonic() + patient(240)
    while time.monotonic() < deadline:
        try:
            socket.create_connection(address, timeout=5).close()
            break
        except OSError:
            time.sleep(0.05)
    report["closed"] = _disturb(address)
    try:
        with socket.create_connection(address, timeout=5) as connection:
            report["during"] = connection.recv(4096).startswith(b"challenge ")
    except OSError:
        report["during"] = False


def test_two_processes_train_like_one_process_with_as_many_devices(runs):
    one_dir, _ = runs["one"]
    _, two = runs["two"]
    written, summary = runs["two_wrote"]
    assert "on 8 cpu device(s)" in two.stdout and "data=4 x fsdp=2" in two.stdout
    expected, got = _losses(one_dir), _losses_of(written)
    assert got.keys() == {k for k in expected if k[0] <= 20} and (20, "train") in got and (15, "val") in got
    for key, loss in got.items():
        assert loss == pytest.approx(expected[key], rel=1e-5), key
    assert summary["environment"]["process_count"] == 2 and not summary["complete"]


def test_only_process_zero_prints_and_writes_logs(runs):
    _, two = runs["two"]
    # One process's output: each line once, not once per process.
    assert two.stdout.count("step 15: val loss") == 1
    assert two.stdout.count("stopped at step 20") == 1
    lines = runs["two_wrote"][0].splitlines()
    of_one = [
        r for r in map(json.loads, (runs["one"][0] / "metrics.jsonl").read_text().splitlines()) if r["step"] <= 20
    ]
    assert len(lines) == len(set(lines)) == len(of_one)


def test_the_libraries_own_lines_stay_out_of_the_terminal(runs):
    """(``--verbose`` lets them through: the slow two-process fault test checks it.)"""
    _, two = runs["two"]
    assert "[Gloo] Rank" not in two.stdout + two.stderr  # printed by gloo to file descriptor 1
    assert "step 15: val loss" in two.stdout and "stopped at step 20" in two.stdout  # jaxnet's own lines


def test_checkpoints_written_by_two_processes_resume_in_one(runs):
    two_dir, _ = runs["two"]
    assert "resuming" in runs["rest"].stdout and "test loss" in runs["rest"].stdout
    expected, got = _losses(runs["one"][0]), _losses(two_dir)
    assert got.keys() == expected.keys()
    for key, loss in expected.items():
        assert got[key] == pytest.approx(loss, rel=1e-5), key
    assert json.loads((two_dir / "summary.json").read_text())["complete"]


def test_a_stranger_at_the_watch_neither_stops_nor_changes_a_two_process_run(runs):
    """While two processes train, a stranger connects to process 0's watch and sends what stopped
    a run before the watch checked who it talks to: each such connection is closed, the run goes
    on to its stop at step 20 with the losses of one process with as many devices, as an
    undisturbed run."""
    disturbed = runs["disturbed"]
    names = ["hello 1", "failed 1 9", "random bytes", "1 MB line without a newline", "replayed handshake"]
    assert disturbed["closed"] == dict.fromkeys(names, True)
    assert disturbed["during"]  # the watch still answered after the stranger was done
    expected, got = _losses(runs["one"][0]), _losses_of(runs["two_wrote"][0])
    assert got[(20, "train")] == pytest.approx(expected[(20, "train")], rel=1e-5)
    assert "stopped at step 20" in runs["two"][1].stdout


@pytest.fixture
def watch(monkeypatch):
    """Process 0's watch of a 3-process run, in a thread on localhost, with the secret ``b"s" *
    32`` and 3 s to prove it; what would stop the process is recorded in ``watch.stops`` instead."""
    import socket

    from jaxnet.parallel import watch as watch_lib

    stops = []
    monkeypatch.setattr(watch_lib, "_exit", lambda code, message=None: stops.append(message))
    monkeypatch.setattr(watch_lib, "_HELLO_SECONDS", 3.0)
    monkeypatch.setattr(watch_lib, "_GRACE_SECONDS", 0.0)
    monkeypatch.setattr(watch_lib, "_BEAT_SECONDS", 0.2)
    watch = watch_lib._Watch(0, 3, silence=60, secret=b"s" * 32)
    watch.stops = stops
    server = socket.create_server(("127.0.0.1", 0))
    thread = threading.Thread(target=watch.serve, args=([server],), daemon=True)
    thread.start()
    watch.address = server.getsockname()
    yield watch
    watch.serving = False
    thread.join(timeout=10)
    server.close()


def _hello(secret: bytes, index: int, challenge: str, nonce: str) -> bytes:
    """A joining process's answer to ``challenge``, computed here from the protocol's description."""
    import hashlib
    import hmac

    proof = hmac.new(secret, f"hello {index} {challenge} {nonce}".encode(), hashlib.sha256).hexdigest()
    return f"hello {index} {nonce} {proof}\n".encode()


def _wait_for(condition, seconds: float = 5.0) -> bool:
    import time

    until = time.monotonic() + seconds
    while not condition() and time.monotonic() < until:
        time.sleep(0.02)
    return condition()


def test_the_watch_closes_every_connection_that_does_not_prove_it_belongs_to_the_run(watch):
    import socket

    closed = _disturb(watch.address, wait=1.0)  # closed at once, not when its 3 s to prove itself are up
    assert closed == dict.fromkeys(closed, True) and len(closed) == 5
    secret, nonce = b"s" * 32, "ab" * 16
    assert _stranger(watch.address, b"hello 1 " + nonce.encode() + b" " + b"0" * 64 + b"\n")  # a guessed proof
    with socket.create_connection(watch.address, timeout=5) as connection:  # an id outside the run
        challenge = connection.recv(4096).split()[1].decode()
        connection.sendall(_hello(secret, 3, challenge, nonce))
        assert connection.recv(4096) == b""
    silent = socket.create_connection(watch.address, timeout=5)  # proves nothing within 3 s
    assert silent.recv(4096).startswith(b"challenge ") and silent.recv(4096) == b""
    assert watch.peers == {} and watch.stops == []


def test_only_a_proven_process_can_stop_the_run_and_a_recorded_handshake_proves_nothing(watch):
    import hashlib
    import hmac
    import socket

    from jaxnet.parallel import watch as watch_lib

    secret, nonce = b"s" * 32, "cd" * 16
    one = socket.create_connection(watch.address, timeout=5)
    challenge = one.recv(4096).split()[1].decode()
    hello = _hello(secret, 1, challenge, nonce)
    one.sendall(hello)
    welcome = one.recv(4096).split()
    assert welcome[0] == b"welcome"  # and process 0 proves it holds the secret too
    expected = hmac.new(secret, f"welcome 1 {challenge} {nonce}".encode(), hashlib.sha256).hexdigest()
    assert welcome[1].decode() == expected
    assert _stranger(watch.address, hello)  # the same handshake again: the challenge is another
    with socket.create_connection(watch.address, timeout=5) as again:  # a second, valid hello for 1
        again.sendall(_hello(secret, 1, again.recv(4096).split()[1].decode(), nonce))
        assert again.recv(4096) == b""
    assert list(watch.peers) == [1] and watch.stops == []

    joined = watch_lib._handshake(watch.address, 2, secret)  # the real joining side
    assert joined is not None and sorted(watch.peers) == [1, 2]
    joined[0].sendall(b"failed 9\n")
    assert _wait_for(lambda: len(watch.stops) == 1)
    assert "process 2 of 3 stopped with exit code 9" in watch.stops[0]
    assert b"failed 2 9" in one.recv(4096)  # told to the others
    one.close()
    assert _wait_for(lambda: len(watch.stops) == 2)
    assert "process 1 of 3 stopped unexpectedly" in watch.stops[1]
    joined[0].close()


def test_a_process_that_fails_while_still_joining_the_watch_is_heard_failing(watch, monkeypatch):
    """Under load a process can fail before its watch has joined process 0's: it waits to join, so
    process 0 hears its exit code instead of only its connection closing."""
    import time

    from jaxnet.parallel import processes
    from jaxnet.parallel import watch as watch_lib

    class SlowClient:  # the coordination service, answering late
        def blocking_key_value_get(self, key, timeout_ms):
            time.sleep(0.5)
            return (b"s" * 32).hex() if key.endswith("secret") else str(watch.address[1])

        def key_value_set(self, key, value):
            pass

    one = watch_lib._Watch(1, 3, silence=60)
    monkeypatch.setattr(watch_lib, "_watch", one)
    threading.Thread(target=one.join, args=(SlowClient(), "127.0.0.1"), daemon=True).start()
    processes.leave(2, None)  # at once, while the join is under way
    assert _wait_for(lambda: any(s and "process 1 of 3 stopped with exit code 2" in s for s in watch.stops))
    assert not any(s and "stopped unexpectedly" in s for s in watch.stops)


def test_a_joining_process_does_not_trust_a_watch_without_the_run_s_secret():
    import socket

    from jaxnet.parallel import watch

    with socket.create_server(("127.0.0.1", 0)) as server:

        def impostor():
            connection, _ = server.accept()
            with connection:
                connection.sendall(b"challenge " + b"ef" * 16 + b"\n")
                connection.recv(4096)
                connection.sendall(b"welcome " + b"0" * 64 + b"\n")
                connection.recv(4096)

        thread = threading.Thread(target=impostor, daemon=True)
        thread.start()
        assert watch._handshake(server.getsockname(), 1, b"s" * 32) is None
        thread.join(timeout=10)


def test_a_line_without_its_end_costs_bounded_memory_and_is_dropped():
    from jaxnet.parallel import watch

    lines = watch._Lines()
    assert lines.feed(b"be") == [] and lines.feed(b"at\nbye\nfai") == [["beat"], ["bye"]]
    assert lines.feed(b"led 9\n") == [["failed", "9"]] and not lines.too_long
    for _ in range(256):  # 1 MiB, no newline
        assert lines.feed(b"x" * 4096) == []
        assert len(lines.buffer) <= watch._LINE_BYTES
    assert lines.too_long
    assert lines.feed(b"xx\nbeat\n") == [["beat"]]  # the long line's end is dropped too


@pytest.mark.parametrize("value", ["abc", "70000", "-1"])
def test_a_bad_watch_port_is_a_one_line_error(monkeypatch, value):
    from jaxnet import parallel
    from jaxnet.errors import UserError

    monkeypatch.setenv("JAXNET_WATCH_PORT", value)
    with pytest.raises(UserError, match=f"JAXNET_WATCH_PORT={value}: expected a port number"):
        parallel.watch_port()
    monkeypatch.setenv("JAXNET_WATCH_PORT", "12355")
    assert parallel.watch_port() == 12355


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--coordinator", "localhost:1"], "--num-processes, --process-id missing"),
        (["--coordinator", "nohostport", "--num-processes", "2", "--process-id", "0"], "expected HOST:PORT"),
        (["--coordinator", "localhost:1", "--num-processes", "2", "--process-id", "2"], "ids run from 0 to 1"),
    ],
)
def test_bad_multi_process_flags_are_one_line_errors(tmp_path, flags, message):
    result = run_patiently(
        [sys.executable, "-m", "jaxnet", "train", "transformer_shakespeare:smoke", *flags, "--workdir", str(tmp_path)],
        capture_output=True,
        text=True,
        env=_env(1),
        timeout=120,
    )
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and message in result.stderr


def test_a_mesh_that_leaves_out_a_process_stops_every_process_at_once(tmp_path):
    text = tmp_path / "fox.txt"
    text.write_text("the quick brown fox jumps over the lazy dog.\n" * 50)
    result = run_patiently(
        [str(ROOT / "scripts" / "launch_local.sh"), "2", *RUN, f"data.path={text}", "mesh.data=2", "mesh.fsdp=1"]
        + ["--workdir", str(tmp_path / "run")],
        capture_output=True,
        text=True,
        env=_env(2),
        timeout=120,
        cwd=ROOT,
    )
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if line.startswith("jaxnet: error:")]
    mesh = "must use all 4 devices of its 2 processes"
    assert any(mesh in e for e in errors)
    # A process slower to reach the check (a loaded machine) may first hear that the other stopped
    # and say so instead: it stops all the same, with one line.
    assert all(mesh in e or "this process stops too" in e for e in errors), errors
    assert "Traceback" not in result.stderr and not (tmp_path / "run").exists()


@pytest.mark.parametrize("parts", [2, 4])
def test_each_process_reads_exactly_its_rows_of_every_batch(parts):
    """Rows read piece by piece (one piece per process) put together are the whole batch, with
    augmentation drawn as for the whole batch."""
    import numpy as np

    from jaxnet.data import pipeline, text

    rng = np.random.default_rng(0)
    images, labels = rng.integers(0, 256, (100, 8, 8, 3), dtype=np.uint8), rng.integers(0, 10, 100)
    tokens = rng.integers(0, 50, 5000).astype(np.int32)
    size = 16
    pieces = [slice(i * size // parts, (i + 1) * size // parts) for i in range(parts)]
    stats = {"mean": np.zeros(3, np.float32), "std": np.ones(3, np.float32)}

    def image_batch(rows):
        batches = pipeline.train_batches(
            images, labels, batch_size=size, seed=3, start_step=5, do_augment=True, rows=rows, **stats
        )
        return next(batches)

    def text_batch(mode, rows):
        batches = text.train_batches(tokens, batch_size=size, seq_len=8, mode=mode, seed=3, start_step=7, rows=rows)
        return next(batches)

    for whole, part in [
        (image_batch(slice(None)), image_batch),
        (text_batch("stream", slice(None)), lambda rows: text_batch("stream", rows)),
        (text_batch("windows", slice(None)), lambda rows: text_batch("windows", rows)),
    ]:
        got = [part(rows) for rows in pieces]
        for key, value in whole.items():
            if np.ndim(value):
                np.testing.assert_array_equal(np.concatenate([g[key] for g in got]), value, err_msg=key)
            else:
                assert all(g[key] == value for g in got)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _start_processes(commands: list[list[str]], logs: Path, tag: str) -> list[subprocess.Popen]:
    """Start one process per command, output to ``logs/TAG-I.out`` and ``.err`` (files, not pipes:
    a process that is not read must not block on a full pipe)."""
    env = {**_env(1), "JAXNET_HEARTBEAT_SECONDS": "10"}
    processes = []
    for i, command in enumerate(commands):
        with open(logs / f"{tag}-{i}.out", "w") as out, open(logs / f"{tag}-{i}.err", "w") as err:
            processes.append(subprocess.Popen(command, stdout=out, stderr=err, env=env, cwd=ROOT))
    return processes


def _stop_all(processes: list[subprocess.Popen]) -> None:
    for p in processes:
        if p.poll() is None:
            p.kill()  # SIGKILL: SIGCONT is not needed for a stopped process
    for p in processes:
        p.wait(timeout=patient(60))


@pytest.mark.slow
@pytest.mark.parametrize(
    "how, victim",
    [("killed", 1), ("killed", 0), ("hung", 0)],
    ids=["process-1-killed", "process-0-killed", "process-0-hung"],
)
def test_when_a_process_dies_the_other_stops_with_one_line_and_the_run_resumes(tmp_path, how, victim):
    """SIGKILL (or SIGSTOP: a hung host) one of two processes while they train: the other ends
    within seconds with a one-line error naming it, and the same two commands run again resume
    from the newest checkpoint and finish the run."""
    import re
    import signal
    import time

    text = tmp_path / "fox.txt"
    text.write_text("the quick brown fox jumps over the lazy dog.\n" * 400)
    workdir = tmp_path / "run"
    args = [*RUN[:3], f"data.path={text}", "train.checkpoint_every=5", "train.steps=400", "train.eval_every=0"]
    args += ["mesh.data=-1", "--workdir", str(workdir), "--coordinator", f"localhost:{_free_port()}"]
    commands = [
        [sys.executable, "-m", "jaxnet", "train", *args, "--num-processes", "2", "--process-id", str(i)] for i in (0, 1)
    ]
    survivor = 1 - victim
    processes = _start_processes(commands, tmp_path, "first")
    try:
        deadline = time.monotonic() + patient(240)
        while not any(p.name.isdigit() for p in workdir.glob("checkpoints/*")):  # a finished checkpoint
            assert time.monotonic() < deadline and all(p.poll() is None for p in processes), "no checkpoint"
            time.sleep(0.05)
        processes[victim].send_signal(signal.SIGKILL if how == "killed" else signal.SIGSTOP)
        stopped = time.monotonic()
        code = processes[survivor].wait(timeout=patient(120))
        seconds = time.monotonic() - stopped
        print(f"process {victim} {how}: process {survivor} exited {seconds:.1f} s later")  # the README's figure
        assert processes[victim].poll() is None or how == "killed"
    finally:
        _stop_all(processes)
    stderr = (tmp_path / f"first-{survivor}.err").read_text()
    what = "stopped unexpectedly" if how == "killed" else "stopped responding"
    expected = f"process {victim} of 2{' (the coordinator)' if victim == 0 else ''} {what}"
    assert code == 1 and f"jaxnet: error: [process {survivor} of 2] {expected}" in stderr, stderr[-3000:]
    assert "run the same command on every process again to resume" in stderr
    assert seconds < (5 if how == "killed" else 30), seconds  # killed: at once; hung: after 10 s unheard
    if victim == 1:  # when process 0 dies, JAX's runtime ends the others too, with lines of its own
        assert "Traceback" not in stderr and stderr.count("\n") == 1, stderr[-3000:]
    assert "test loss" not in (tmp_path / "first-0.out").read_text()  # stopped while training

    # run again with --verbose: the libraries' own lines (gloo's) reach the terminal then
    again = _start_processes([[*c, "--verbose"] for c in commands], tmp_path, "again")
    try:
        codes = [p.wait(timeout=patient(300)) for p in again]
    finally:
        _stop_all(again)
    stdout = (tmp_path / "again-0.out").read_text()
    assert codes == [0, 0], (tmp_path / "again-0.err").read_text()[-3000:]
    resumed = re.search(r"resuming .* from step (\d+)", stdout)
    assert resumed and 5 <= int(resumed.group(1)) < 400, stdout
    assert "test loss" in stdout and json.loads((workdir / "summary.json").read_text())["complete"]
    assert "[Gloo] Rank" in stdout  # printed by gloo to file descriptor 1, let through by --verbose
    assert "[Gloo] Rank" not in (tmp_path / "first-0.out").read_text()

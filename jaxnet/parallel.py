"""The device mesh, and where parameters, optimizer state and batches live on it.

The mesh has three axes: ``data`` (the batch is split, parameters replicated), ``fsdp`` (the
batch is split and so are parameters and optimizer state, gathered layer by layer by the
compiler) and ``tensor`` (the hidden dimensions of a layer are split: attention heads, MLP
hidden units, LSTM gates). Models name the axes of their parameters logically (``embed``,
``heads``, ``mlp``, ``vocab``, ...); :data:`RULES` is the one table that maps those names onto
mesh axes, so no model knows about devices. Every placement decision goes through this module.

**Several processes** (hosts) run the same program: :func:`init_processes` joins them, the mesh
spans every process's devices, each process reads only the rows of each batch that its devices
hold (:func:`process_rows`) and :func:`put_batch` assembles the global batch from those pieces.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import hashlib
import hmac
import math
import os
import re
import secrets
import selectors
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxnet._startup import make_room_for_simulated_devices, simulated_cpu_devices  # noqa: F401  (part of this API)
from jaxnet.config import MeshConfig
from jaxnet.errors import UserError

AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")
REPLICA_AXIS = "data"  # parallel.mode=replicas: one whole model per device along this axis

# Logical parameter axis -> mesh axis (None: not split). The first matching rule wins.
RULES: tuple[tuple[str, str | tuple[str, ...] | None], ...] = (
    ("batch", BATCH_AXES),
    ("embed", "fsdp"),  # model width: split for FSDP, gathered before use
    ("heads", "tensor"),  # attention heads (Megatron: q/k/v column-split, output row-split)
    ("mlp", "tensor"),  # MLP hidden units, LSTM gate units, conv output channels
    ("vocab", "tensor"),
    ("kv", None),
)


def mesh_shape(cfg: MeshConfig, device_count: int) -> dict[str, int]:
    """Sizes of the mesh axes, with at most one -1 ("the rest of the devices") resolved."""
    sizes = {axis: getattr(cfg, axis) for axis in AXES}
    free = [a for a, n in sizes.items() if n == -1]
    if len(free) > 1:
        raise UserError(f"only one mesh axis can be -1, got {', '.join(f'mesh.{a}=-1' for a in free)}")
    for axis, n in sizes.items():
        if n == 0 or n < -1:
            raise UserError(f"mesh.{axis}={n}: use a positive device count (or -1 for the rest of the devices)")
    fixed = math.prod(n for n in sizes.values() if n != -1)
    if free:
        if device_count % fixed:
            raise UserError(
                f"the mesh axes set to {fixed} devices do not divide the {device_count} device(s) present; "
                f"use sizes whose product divides {device_count}"
            )
        sizes[free[0]] = device_count // fixed
    total = math.prod(sizes.values())
    if total > device_count or device_count % total:
        shape = " x ".join(f"{a}={n}" for a, n in sizes.items())
        raise UserError(
            f"mesh {shape} needs {total} devices but {device_count} device(s) are present; "
            f"use sizes whose product divides {device_count} (or -1 for one axis)"
        )
    return sizes


def make_mesh(cfg: MeshConfig, devices: list | None = None) -> Mesh:
    """A ``(data, fsdp, tensor)`` mesh over the first ``data * fsdp * tensor`` devices."""
    devices = devices if devices is not None else jax.devices()
    sizes = mesh_shape(cfg, len(devices))
    count = math.prod(sizes.values())
    if jax.process_count() > 1 and count != len(devices):
        raise UserError(
            f"a multi-process run's mesh must use all {len(devices)} devices of its {jax.process_count()} "
            f"processes, not {count}; set one mesh axis to -1"
        )
    return Mesh(np.asarray(devices[:count]).reshape(tuple(sizes.values())), AXES)


def replicated(mesh: Mesh) -> NamedSharding:
    """Every device holds the whole array."""
    return NamedSharding(mesh, PartitionSpec())


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """The leading (batch) dimension is split along ``data`` and ``fsdp``."""
    return NamedSharding(mesh, PartitionSpec(BATCH_AXES))


def batch_devices(mesh: Mesh) -> int:
    """Number of ways a batch is split (``data * fsdp``)."""
    return mesh.shape["data"] * mesh.shape["fsdp"]


def check_batch(batch_size: int, mesh: Mesh, what: str = "train.batch_size") -> None:
    """A batch must split evenly across the data-parallel devices."""
    devices = batch_devices(mesh)
    if batch_size % devices:
        raise UserError(
            f"{what}={batch_size} is not divisible by the {devices} devices it is split over "
            f"(mesh.data={mesh.shape['data']} x mesh.fsdp={mesh.shape['fsdp']}); use a multiple of {devices}"
        )


def put_batch(batch: Any, mesh: Mesh, lead: int = 0) -> Any:
    """Copy a host batch (a pytree of numpy arrays) onto the mesh, split along the batch axis.

    Scalars (e.g. a batch's ``reset`` flag) are copied to every device. With several processes,
    ``batch`` holds this process's rows (:func:`process_rows`) and the result is the global batch.
    ``lead`` leading axes come before the batch axis, kept whole (a sweep's members).
    """
    split, whole = NamedSharding(mesh, PartitionSpec(*[None] * lead, BATCH_AXES)), replicated(mesh)
    shardings = jax.tree.map(lambda x: split if np.ndim(x) > lead else whole, batch)
    if jax.process_count() == 1:
        return jax.device_put(batch, shardings)
    return jax.tree.map(jax.make_array_from_process_local_data, shardings, batch)


def process_rows(mesh: Mesh, batch_size: int) -> slice:
    """The rows of a ``batch_size`` batch that this process's devices hold (all of them with one
    process): the only rows it needs to read."""
    if jax.process_count() == 1:
        return slice(0, batch_size)
    index = batch_sharding(mesh).addressable_devices_indices_map((batch_size,))
    spans = sorted({(s[0].start or 0, batch_size if s[0].stop is None else s[0].stop) for s in index.values()})
    if any(a[1] != b[0] for a, b in zip(spans, spans[1:], strict=False)):
        raise UserError(f"this process's devices hold rows {spans} of the batch, not one block; use mesh.tensor=1")
    return slice(spans[0][0], spans[-1][1])


def init_processes(
    coordinator: str | None = None, num_processes: int | None = None, process_id: int | None = None
) -> None:
    """Join a multi-process run before JAX touches a device.

    With ``coordinator`` (``HOST:PORT`` of process 0), ``num_processes`` and ``process_id`` given,
    those are used. With none given, a cluster scheduler's environment (Slurm, Open MPI, or
    ``JAX_COORDINATOR_ADDRESS``) is detected by ``jax.distributed.initialize``; otherwise this
    is a single-process run and nothing happens.
    """
    given = {"--coordinator": coordinator, "--num-processes": num_processes, "--process-id": process_id}
    if any(v is not None for v in given.values()):
        missing = [k for k, v in given.items() if v is None]
        if missing:
            raise UserError(
                "a multi-process run needs --coordinator, --num-processes and --process-id; "
                f"{', '.join(missing)} missing"
            )
        if not re.fullmatch(r"[\w.\-\[\]:]+:\d+", str(coordinator)):
            raise UserError(f"--coordinator {coordinator}: expected HOST:PORT of process 0, e.g. localhost:12355")
        if num_processes < 1 or not 0 <= process_id < num_processes:
            raise UserError(
                f"--process-id {process_id} with --num-processes {num_processes}: "
                f"ids run from 0 to {max(num_processes, 1) - 1}"
            )
        _initialize(coordinator, num_processes, process_id)
    elif _scheduled():
        _initialize()
    else:
        return
    _start_watch()


def _initialize(*args: Any) -> None:
    watch_port()  # a bad value stops every process before any joins
    try:
        jax.distributed.initialize(*args, heartbeat_timeout_seconds=2 * heartbeat_seconds() + 20)
    except (ValueError, RuntimeError) as e:
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UserError(
            f"could not join the multi-process run ({reason}); pass --coordinator, --num-processes and --process-id"
        ) from None


HEARTBEAT_SECONDS = 40


def heartbeat_seconds() -> int:
    """How long a process of a multi-process run may go unheard before the others take it to have
    hung and stop: ``$JAXNET_HEARTBEAT_SECONDS``, by default :data:`HEARTBEAT_SECONDS`.

    A process that dies is noticed at once (its connection closes); this bounds the wait for one
    that hangs (a frozen host, a network cut). JAX's own heartbeat check, which ends the processes
    with a long runtime message or an abort, is set to twice that plus 20 s (100 s, JAX's default,
    with the default), as a backstop.
    """
    value = os.environ.get("JAXNET_HEARTBEAT_SECONDS", "").strip()
    if not value:
        return HEARTBEAT_SECONDS
    if not value.isdigit() or int(value) < 1:
        raise UserError(f"JAXNET_HEARTBEAT_SECONDS={value}: expected a whole number of seconds, at least 1")
    return int(value)


def _scheduled() -> bool:
    """Whether a cluster scheduler started several processes of this run."""
    env = os.environ
    if env.get("JAX_COORDINATOR_ADDRESS"):
        return True
    # srun sets SLURM_STEP_NUM_TASKS for the tasks it starts; a batch script itself is one task
    return int(env.get("SLURM_STEP_NUM_TASKS") or 1) > 1 or int(env.get("OMPI_COMM_WORLD_SIZE") or 1) > 1


# The watch. JAX notices a dead process only when its heartbeats time out; the processes left
# then end with a long runtime message or an abort, or meanwhile fail in a collective (gloo: a
# "Connection reset by peer" traceback) or wait in one (NCCL). So process 0 also holds a TCP
# connection to every other process, watched by a thread in each: when a process ends, the kernel
# closes its connection at once, and the processes left say which one stopped, in one line, and
# exit; one that hangs is noticed when its beats stop. Lines sent: "beat" (every few seconds),
# "bye" (ends normally), "failed CODE" (leaves with an error), and from process 0 to the others
# "lost I" / "hung I" / "failed I CODE" (process I stopped).
#
# Only the run's own processes are heard. Process 0 puts a random secret in the coordination
# service's key-value store; it sends each connection a fresh challenge ("challenge C"), which a
# joining process I answers with "hello I N PROOF" (N its own fresh nonce, PROOF an HMAC of the
# line under the secret), and process 0 answers "welcome PROOF" with an HMAC of its own: each
# side then knows the other holds the run's secret, and a handshake recorded on one connection
# proves nothing on another. A connection that does not prove itself within _HELLO_SECONDS, sends
# anything else first, names a process outside the run or one already connected, or sends a line
# longer than _LINE_BYTES is closed and changes nothing. Process 0 listens only on the address the
# others reach it at (each says which address it resolves the coordinator's host to).

_WATCH_KEY = "jaxnet/watch"
_BEAT_SECONDS = 5.0
_GRACE_SECONDS = 2.0  # a process that announced its error: give this one time to fail on its own
_HELLO_SECONDS = 10.0  # a connection must prove it belongs to the run within this
_JOIN_SECONDS = 120.0  # how long a process keeps trying to join the watch
_LINE_BYTES = 256  # no line of the watch is longer: a longer one is dropped, a stranger's connection closed
_MAX_STRANGERS = 64  # connections not proven yet; more are closed at once
_RESUME = "run the same command on every process again to resume from the newest checkpoint"


class _Lines:
    """The whole lines that arrive on one connection, split into words. A line longer than
    :data:`_LINE_BYTES` is dropped and noted in ``too_long``, so a sender that never ends its line
    costs at most that much memory."""

    def __init__(self) -> None:
        self.buffer = b""
        self.skipping = False  # the start of the current line was too long and is gone
        self.too_long = False

    def feed(self, data: bytes) -> list[list[str]]:
        *lines, rest = (self.buffer + data).split(b"\n")
        words = []
        for line in lines:
            if self.skipping:
                self.skipping = False
            elif len(line) > _LINE_BYTES:
                self.too_long = True
            else:
                words.append(line.decode(errors="replace").split())
        if len(rest) > _LINE_BYTES:
            self.too_long = self.skipping = True
            rest = b""
        self.buffer = rest
        return words


def _read_lines(connection: socket.socket, lines: _Lines) -> list[list[str]] | None:
    """The whole lines that arrived on ``connection`` (none if nothing came in time); None once it
    closed."""
    try:
        data = connection.recv(4096)
    except TimeoutError:
        return []
    except OSError:
        data = b""
    if not data:
        return None
    return lines.feed(data)


def _proof(secret: bytes, *words: str) -> str:
    """HMAC-SHA256 of ``words`` (joined by spaces) under the run's secret, in hex."""
    return hmac.new(secret, " ".join(words).encode(), hashlib.sha256).hexdigest()


def _proves(secret: bytes, proof: str, *words: str) -> bool:
    return hmac.compare_digest(proof.encode(), _proof(secret, *words).encode())


class _Watch:
    def __init__(self, index: int, count: int, silence: float, secret: bytes = b"") -> None:
        self.index, self.count, self.silence = index, count, silence
        self.secret = secret  # the run's, shared through the coordination service
        self.reporting = threading.Lock()  # held by whoever prints the error; never released
        self.sending = threading.Lock()
        self.peers: dict[int, socket.socket] = {}  # process 0: every other process; the others: {0: ...}
        self.heard: dict[int, float] = {}  # when each peer was last heard from
        self.ended: set[int] = set()  # processes that said bye or failed: their connection may close
        self.beat = time.monotonic()
        self.serving = True  # process 0's loop goes on while this holds (a test ends it)

    def listen(self, client: Any, port: int) -> None:
        """Process 0: listen where each other process will connect, tell it the port, and serve."""
        servers: dict[str, socket.socket | None] = {}
        for index in range(1, self.count):
            try:
                address = client.blocking_key_value_get(f"{_WATCH_KEY}/{index}/address", 300_000)
            except Exception:  # noqa: BLE001 - that process never came: JAX's heartbeats end the run
                continue
            if address not in servers:
                servers[address] = _listen(address, port)
            server = servers[address]
            with contextlib.suppress(Exception):
                client.key_value_set(f"{_WATCH_KEY}/{index}/port", str(server.getsockname()[1] if server else 0))
        self.serve([server for server in servers.values() if server is not None])

    def serve(self, servers: list[socket.socket]) -> None:
        """Process 0: accept the others' connections, keep those that prove they are processes of
        this run, and read them until one of them stops."""
        selector = selectors.DefaultSelector()
        for server in servers:
            selector.register(server, selectors.EVENT_READ, None)
        strangers: dict[socket.socket, float] = {}  # connection -> when it must have proven itself
        while self.serving:
            wait = min([_BEAT_SECONDS, *(until - time.monotonic() for until in strangers.values())])
            for key, _ in selector.select(timeout=max(wait, 0.0)):
                if key.data is None:
                    self._accept(key.fileobj, selector, strangers)
                    continue
                connection, peer = key.fileobj, key.data
                lines = _read_lines(connection, peer["lines"])
                if peer["id"] is None:
                    if lines is None or peer["lines"].too_long or (lines and not self._admit(connection, peer, lines)):
                        _drop(connection, selector, strangers)
                        continue
                    if peer["id"] is None:  # no whole line yet
                        continue
                    del strangers[connection]
                    lines = lines[1:]
                self.heard[peer["id"]] = time.monotonic()
                for words in lines or []:
                    if words[:1] == ["bye"]:
                        self.ended.add(peer["id"])
                    elif words[:1] == ["failed"]:
                        self.ended.add(peer["id"])
                        code = words[1] if len(words) > 1 else "?"
                        self._tell_others(f"failed {peer['id']} {code}", peer["id"])
                        self._stop(self._failed(peer["id"], code), wait=_GRACE_SECONDS)
                if lines is None:  # closed
                    selector.unregister(connection)
                    connection.close()
                    if peer["id"] not in self.ended:
                        self._tell_others(f"lost {peer['id']}", peer["id"])
                        self._stop(self._lost(peer["id"]))
            for connection in [c for c, until in strangers.items() if until <= time.monotonic()]:
                _drop(connection, selector, strangers)
            for index in self._silent():
                self._tell_others(f"hung {index}", index)
                self._stop(self._hung(index))
            self._keep_beating()

    def _accept(self, server: socket.socket, selector: Any, strangers: dict[socket.socket, float]) -> None:
        try:
            connection, _ = server.accept()
        except OSError:  # e.g. out of file descriptors: the connection waits in the backlog
            time.sleep(0.1)
            return
        challenge = secrets.token_hex(16)
        try:
            if len(strangers) >= _MAX_STRANGERS:
                raise OSError("too many connections not proven yet")
            connection.settimeout(_BEAT_SECONDS)
            connection.sendall(f"challenge {challenge}\n".encode())
        except OSError:
            connection.close()
            return
        selector.register(connection, selectors.EVENT_READ, {"id": None, "lines": _Lines(), "challenge": challenge})
        strangers[connection] = time.monotonic() + _HELLO_SECONDS

    def _admit(self, connection: socket.socket, peer: dict[str, Any], lines: list[list[str]]) -> bool:
        """Whether the first of a new connection's ``lines`` proves that it comes from a process of
        this run not connected yet; if so, the connection becomes that process's and is told so."""
        words = lines[0]
        if len(words) != 4 or words[0] != "hello" or not re.fullmatch(r"[1-9][0-9]{0,8}", words[1]):
            return False
        index, nonce, proof = int(words[1]), words[2], words[3]
        if index >= self.count or index in self.peers or not re.fullmatch(r"[0-9a-f]{32}", nonce):
            return False
        if not _proves(self.secret, proof, "hello", words[1], peer["challenge"], nonce):
            return False
        welcome = _proof(self.secret, "welcome", words[1], peer["challenge"], nonce)
        # Registered and welcomed under one lock: no other message reaches it before the welcome,
        # and once welcomed it is a peer (what it says next counts).
        with self.sending:
            self.peers[index] = connection
            try:
                connection.sendall(f"welcome {welcome}\n".encode())
            except OSError:
                del self.peers[index]
                return False
        peer["id"] = index
        return True

    def join(self, client: Any, host: str) -> None:
        """Any other process: prove to process 0 that this process belongs to the run, then read
        until process 0 stops or says one stopped."""
        try:
            self.secret = bytes.fromhex(client.blocking_key_value_get(f"{_WATCH_KEY}/secret", 300_000))
            address = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)[0][4][0]
            client.key_value_set(f"{_WATCH_KEY}/{self.index}/address", address)
            port = int(client.blocking_key_value_get(f"{_WATCH_KEY}/{self.index}/port", 300_000))
        except Exception:  # noqa: BLE001 - no watch then; JAX's heartbeats still end the run
            return
        deadline = time.monotonic() + _JOIN_SECONDS
        while (joined := _handshake((address, port), self.index, self.secret) if port else None) is None:
            if not port or time.monotonic() > deadline:
                return
            time.sleep(1)
        connection, buffer, lines = joined
        with self.sending:
            self.peers[0] = connection
        self.heard[0] = time.monotonic()
        while lines is not None:
            if lines:
                self.heard[0] = time.monotonic()
            for words in lines:
                if words[:1] == ["bye"]:
                    self.ended.add(0)
                elif words[:1] in (["lost"], ["hung"]) and len(words) == 2 and words[1].isdigit():
                    index = int(words[1])
                    self._stop(self._lost(index) if words[0] == "lost" else self._hung(index))
                elif words[:1] == ["failed"] and len(words) == 3 and words[1].isdigit():
                    self.ended.add(0)
                    self._stop(self._failed(int(words[1]), words[2]), wait=_GRACE_SECONDS)
            if self._silent():
                self._stop(self._hung(0))
            self._keep_beating()
            lines = _read_lines(connection, buffer)
        if 0 not in self.ended:
            self._stop(self._lost(0))

    def _silent(self) -> list[int]:
        now = time.monotonic()
        return [i for i, heard in self.heard.items() if i not in self.ended and now - heard > self.silence]

    def _keep_beating(self) -> None:
        if time.monotonic() - self.beat >= _BEAT_SECONDS:
            self.beat = time.monotonic()
            self.say("beat")

    def _lost(self, index: int) -> str:
        return f"{self._name(index)} stopped unexpectedly (killed or crashed: its connection closed)"

    def _hung(self, index: int) -> str:
        return f"{self._name(index)} stopped responding (not heard from for {self.silence:.0f} s)"

    def _failed(self, index: int, code: str) -> str:
        return f"{self._name(index)} stopped with exit code {code} (its output says why)"

    def _name(self, index: int) -> str:
        return f"process {index} of {self.count}{' (the coordinator)' if index == 0 else ''}"

    def _tell_others(self, line: str, about: int) -> None:
        with self.sending:
            for index, connection in self.peers.items():
                if index != about:
                    with contextlib.suppress(OSError):
                        connection.sendall(f"{line}\n".encode())

    def _stop(self, what: str, wait: float = 0.0) -> None:
        time.sleep(wait)
        with self.reporting:
            _exit(1, f"jaxnet: error: {what}; this process stops too: {_RESUME}")

    def say(self, line: str) -> None:
        """Send ``line`` to process 0 (from process 0: to every other process)."""
        self._tell_others(line, about=-1)


def _drop(connection: socket.socket, selector: Any, strangers: dict[socket.socket, float]) -> None:
    """Close a connection that has not proven it belongs to the run."""
    selector.unregister(connection)
    strangers.pop(connection, None)
    connection.close()


def _handshake(
    address: tuple[str, int], index: int, secret: bytes
) -> tuple[socket.socket, _Lines, list[list[str]]] | None:
    """Connect to process 0's watch at ``address`` as process ``index`` and prove, each to the
    other, that both hold the run's ``secret``: the connection, its line reader and any lines that
    came after the welcome; None if either side failed."""
    buffer, queue = _Lines(), []

    def next_line(until: float) -> list[str]:
        while not queue:
            if buffer.too_long or time.monotonic() > until:
                raise TimeoutError("no line from the watch")
            got = _read_lines(connection, buffer)
            if got is None:
                raise ConnectionError("the watch closed the connection")
            queue.extend(got)
        return queue.pop(0)

    try:
        connection = socket.create_connection(address, timeout=_HELLO_SECONDS)
    except OSError:
        return None
    try:
        challenge = next_line(time.monotonic() + _HELLO_SECONDS)
        if len(challenge) != 2 or challenge[0] != "challenge":
            raise ConnectionError("not a watch")
        nonce = secrets.token_hex(16)
        hello = _proof(secret, "hello", str(index), challenge[1], nonce)
        connection.sendall(f"hello {index} {nonce} {hello}\n".encode())
        welcome = next_line(time.monotonic() + 60)
        if len(welcome) != 2 or welcome[0] != "welcome":
            raise ConnectionError("not welcomed")
        if not _proves(secret, welcome[1], "welcome", str(index), challenge[1], nonce):
            raise ConnectionError("the watch does not hold the run's secret")
    except OSError:
        connection.close()
        return None
    connection.settimeout(_BEAT_SECONDS)
    return connection, buffer, queue


def _listen(address: str, port: int) -> socket.socket | None:
    """A server socket on ``address``, or on every address of its family if that is not one of
    this host's (the others reach it through a NAT, say); None, with a warning, if neither works."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    error: OSError | None = None
    for host in (address, "::" if family == socket.AF_INET6 else "0.0.0.0"):
        try:
            return socket.create_server((host, port), family=family)
        except OSError as e:
            error = error or e
    _warn(
        f"jaxnet: warning: the watch of the other processes cannot listen on {address} port {port} ({error}); "
        "a process that dies is noticed only by JAX's heartbeats"
    )
    return None


def _warn(message: str) -> None:
    """Print ``message`` on stderr straight away (from the watch's thread, beside the run's output)."""
    with contextlib.suppress(OSError):
        os.write(sys.__stderr__.fileno() if sys.__stderr__ else 2, (message + "\n").encode())


def watch_port() -> int:
    """The port process 0 listens on for the others' watch connections: ``$JAXNET_WATCH_PORT``
    (to open it in a firewall, say), by default any free port (0)."""
    value = os.environ.get("JAXNET_WATCH_PORT", "").strip()
    if not value:
        return 0
    if not value.isdigit() or not 0 <= int(value) < 65536:
        raise UserError(f"JAXNET_WATCH_PORT={value}: expected a port number from 1 to 65535 (or 0 for any free port)")
    return int(value)


_watch: _Watch | None = None


def _start_watch() -> None:
    """Start watching the other processes of the run just joined (nothing if that cannot be set up)."""
    global _watch
    from jax._src import distributed  # the run's coordination client, as orbax and multihost_utils use it

    state = distributed.global_state
    client, address = getattr(state, "client", None), getattr(state, "coordinator_address", None)
    if client is None or not address or state.num_processes < 2:
        return
    watch = _Watch(state.process_id, state.num_processes, heartbeat_seconds())
    if watch.index == 0:
        watch.secret = secrets.token_bytes(32)
        try:
            client.key_value_set(f"{_WATCH_KEY}/secret", watch.secret.hex())
        except Exception:  # noqa: BLE001 - no watch then; JAX's heartbeats still end the run
            return
        target, args = watch.listen, (client, watch_port())
    else:
        target, args = watch.join, (client, address.rsplit(":", 1)[0].strip("[]"))
    threading.Thread(target=target, args=args, name="jaxnet-watch", daemon=True).start()
    atexit.register(watch.say, "bye")  # runs before JAX's own exit handler, which waits for the others
    _watch = watch


def leave(code: int, message: str | None = None) -> None:
    """End this process of a multi-process run at once with exit code ``code``, after printing
    ``message`` (if any) on stderr and telling the other processes, which then stop too.

    A normal exit would wait at JAX's shutdown barrier for the others, which wait in a collective
    for this one. If another process is already reporting its failure, this one stays quiet.
    """
    if _watch is not None and not _watch.reporting.acquire(blocking=False):
        while True:  # the watch is printing its error and ending the process
            time.sleep(1)
    if _watch is not None:
        _watch.say(f"failed {code}" if _watch.index else f"failed 0 {code}")
    _exit(code, message)


def peer_stopped(error: BaseException) -> str | None:
    """If ``error`` looks like the failure of another process of a multi-process run (a collective
    whose connection was cut, a coordination service that lost a process), a one-line error
    saying so; otherwise None. Waits a few seconds first: if a process did stop, the watch
    (which knows which one) prints the error and ends this process meanwhile."""
    texts, seen = [], error
    while seen is not None and len(texts) < 5:
        texts.append(str(seen))
        seen = seen.__cause__ or seen.__context__
    text = " ".join(texts)
    markers = ("Connection reset by peer", "Connection closed by peer", "Broken pipe", "heartbeat", "Gloo")
    if not any(m.lower() in text.lower() for m in markers):
        return None
    if _watch is not None:
        time.sleep(_GRACE_SECONDS + 3)
    first = next((line.strip() for line in str(error).splitlines() if line.strip()), type(error).__name__)
    reason = first if len(first) <= 200 else first[:197] + "..."
    return f"jaxnet: error: another process of the run stopped ({reason}); this process stops too: {_RESUME}"


def _exit(code: int, message: str | None = None) -> None:
    """Print ``message`` and end the process now, without waiting for the other processes. The
    message goes first, straight to the file: when process 0 dies, JAX's runtime ends the
    others too, a moment later, with a long message of its own."""
    with contextlib.suppress(Exception):
        sys.stderr.flush()
    if message:
        with contextlib.suppress(OSError):
            os.write(sys.__stderr__.fileno() if sys.__stderr__ else 2, (message + "\n").encode())
    with contextlib.suppress(Exception):
        sys.stdout.flush()
    os._exit(code)


def is_primary() -> bool:
    """Whether this process writes logs, summaries and plots (process 0; every single-process run)."""
    return jax.process_index() == 0


def sync(name: str) -> None:
    """Wait until every process gets here (nothing to wait for in a single-process run)."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)


def state_shardings(boxed_state: Any, mesh: Mesh, split_carry: bool = False, rules: tuple = RULES) -> Any:
    """Shardings for every leaf of a state whose parameters carry logical axis names.

    ``boxed_state`` is the (abstract) state with Flax's ``LogicallyPartitioned`` boxes still on,
    optimizer moments included (optax keeps the boxes of the parameters it mirrors). Unnamed leaves
    (step, counters, RNG, BatchNorm statistics, a model's carried state) are replicated, except
    parameters without names and their optimizer moments, which a mesh with ``fsdp`` > 1 splits
    along their largest dimension it divides (as the ``embed`` rule splits named ones); with
    ``split_carry`` the carried state (the ``carry`` collection, one row per batch row) is split
    like the batch instead, as per-device replicas need it. (Under ``jit``, a batch-split carry
    made jax 0.10.2's partitioner compute wrong LSTM gradients on a data x fsdp x tensor mesh, so
    the sharded mode keeps it whole: it is one small array per layer.) A vocabulary
    the ``tensor`` axis does not divide stays whole (the vocabulary is the data's, not a choice);
    any other dimension that its mesh axes do not divide is a one-line error naming the array.
    ``rules`` is :data:`RULES` with the model family's own in front (``ModelConfig.axis_rules``).
    """
    shapes = nn.unbox(boxed_state)
    tensor = mesh.shape["tensor"]

    def keep_whole_vocab(spec: Any, leaf: Any) -> Any:
        names = [None if n == "vocab" and dim % tensor else n for n, dim in zip(spec, leaf.shape, strict=False)]
        return PartitionSpec(*names)

    logical = jax.tree.map(
        keep_whole_vocab,
        nn.get_partition_spec(boxed_state),
        shapes,
        is_leaf=lambda x: isinstance(x, PartitionSpec),
    )
    shardings = nn.logical_to_mesh_sharding(logical, mesh, rules)
    rows = batch_sharding(mesh)
    shardings = jax.tree_util.tree_map_with_path(
        lambda path, sh: rows if split_carry and any(getattr(k, "key", None) == "carry" for k in path) else sh,
        shardings,
        is_leaf=lambda x: isinstance(x, NamedSharding),
    )
    if mesh.shape["fsdp"] > 1 and not split_carry and hasattr(shardings, "params"):
        shardings = _unnamed_by_size(nn.get_partition_spec(boxed_state), shapes, shardings, mesh)
    check_divisible(shapes, shardings, mesh)
    return shardings


def _unnamed_by_size(names: Any, shapes: Any, shardings: Any, mesh: Mesh) -> Any:
    """Parameters without axis names (an Equinox model, ``jaxnet.Model``, an unannotated module)
    and their optimizer moments split over ``fsdp`` along their largest dimension it divides, so
    such a model's memory still falls with the fsdp size; a leaf no dimension of which ``fsdp``
    divides stays whole. Named leaves keep their rules, and the rest of the state stays as it is."""
    fsdp = mesh.shape["fsdp"]

    def by_size(spec: PartitionSpec, leaf: Any, sharding: Any) -> Any:
        if any(spec) or not getattr(leaf, "shape", ()):
            return sharding
        dims = [i for i, size in enumerate(leaf.shape) if size % fsdp == 0]
        if not dims:
            return sharding
        dim = max(dims, key=lambda i: leaf.shape[i])  # the first of the largest
        return NamedSharding(mesh, PartitionSpec(*("fsdp" if i == dim else None for i in range(len(leaf.shape)))))

    def place(field: str) -> Any:
        return jax.tree.map(
            by_size,
            getattr(names, field),
            getattr(shapes, field),
            getattr(shardings, field),
            is_leaf=lambda x: isinstance(x, PartitionSpec),
        )

    return shardings.replace(params=place("params"), opt_state=place("opt_state"))


def under_rules(fn: Callable, mesh: Mesh, rules: tuple = RULES) -> Callable:
    """``fn`` traced with ``rules`` (:data:`RULES` and the model family's own) and ``mesh`` in scope,
    so the activation marks in the models (``nn.with_logical_constraint``) become sharding
    constraints for the compiler."""

    @functools.wraps(fn)
    def traced(*args: Any) -> Any:
        with jax.sharding.use_abstract_mesh(mesh.abstract_mesh), nn.logical_axis_rules(rules):
            return fn(*args)

    return traced


def replicas(step: Callable, mesh: Mesh, shardings: Any) -> Callable:
    """``step(state, batch)``, written for one device (its rows of the batch, a whole model), run on
    every device of ``mesh`` with ``jax.shard_map``: the ``pmap`` model of data parallelism.

    ``shardings`` (the state's) says which state leaves are per-device rows (the carried state)
    and which are one value on every device; the step must make the latter agree (``lax.pmean``).
    Metrics come back as one value.
    """

    def used_axes(spec: PartitionSpec) -> PartitionSpec:  # mesh axes of size 1 split nothing
        keep = lambda names: tuple(
            a for a in ((names,) if isinstance(names, str) else names or ()) if mesh.shape[a] > 1
        )
        return PartitionSpec(*(keep(n) or None for n in spec))

    specs = jax.tree.map(lambda sh: used_axes(sh.spec), shardings, is_leaf=lambda x: isinstance(x, NamedSharding))
    rows = PartitionSpec(REPLICA_AXIS)

    @functools.wraps(step)
    def on_mesh(state: Any, batch: Any) -> Any:
        batch_specs = jax.tree.map(lambda x: rows if x.ndim else PartitionSpec(), batch)
        mapped = jax.shard_map(step, mesh=mesh, in_specs=(specs, batch_specs), out_specs=(specs, PartitionSpec()))
        return mapped(state, batch)

    return on_mesh


def check_divisible(state: Any, shardings: Any, mesh: Any) -> None:
    """A one-line error for the first array with a dimension its mesh axes do not divide."""
    leaves = jax.tree_util.tree_leaves_with_path(state)
    flat = jax.tree.leaves(shardings, is_leaf=lambda x: hasattr(x, "spec"))
    for (path, leaf), sharding in zip(leaves, flat, strict=True):
        for dim, axes in zip(leaf.shape, sharding.spec, strict=False):
            names = (axes,) if isinstance(axes, str) else tuple(axes or ())
            ways = math.prod(mesh.shape[a] for a in names)
            if ways > 1 and dim % ways:
                where = jax.tree_util.keystr(path)
                raise UserError(
                    f"{where} has a dimension of {dim}, which the mesh cannot split {ways} ways "
                    f"({' x '.join(f'mesh.{a}={mesh.shape[a]}' for a in names)}); choose sizes it divides"
                )


def memory(state: Any, compiled: Any = None) -> dict[str, int]:
    """Bytes per device: ``params`` and ``opt_state`` as placed, their unsharded ``total``, and
    ``activations``, the scratch memory XLA planned for the compiled step (activations kept for the
    backward pass, gradients, temporaries; -1 if the backend does not say)."""
    whole = sum(
        math.prod(x.shape) * np.dtype(x.dtype).itemsize for x in jax.tree.leaves((state.params, state.opt_state))
    )
    stats = compiled.memory_analysis() if compiled is not None else None
    return {
        "params": bytes_per_device(state.params),
        "opt_state": bytes_per_device(state.opt_state),
        "total": whole,
        "activations": int(stats.temp_size_in_bytes) if stats is not None else -1,
    }


def describe(mesh: Mesh, state: Any, compiled: Any = None) -> str:
    """One line: the mesh and, per device, the bytes of parameters, optimizer state and (given the
    compiled train step) activations."""
    shape = " x ".join(f"{a}={n}" for a, n in mesh.shape.items())
    sizes = memory(state, compiled)
    acts = f", {size(sizes['activations'])} of activations and temporaries" if sizes["activations"] >= 0 else ""
    return (
        f"mesh {shape} ({mesh.size} {mesh.devices.flat[0].platform} device(s)): per device "
        f"{size(sizes['params'])} of parameters, {size(sizes['opt_state'])} of optimizer state{acts} "
        f"(parameters and optimizer state unsharded: {size(sizes['total'])})"
    )


def size(n: float) -> str:
    """Bytes in the largest binary unit that keeps the number at or above 1, e.g. ``'3.2 MiB'``."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError


def bytes_per_device(tree: Any) -> int:
    """Bytes one device holds of a tree of sharded (concrete or abstract) arrays: the largest shard each."""
    total = 0
    for leaf in jax.tree.leaves(tree):
        shape = leaf.sharding.shard_shape(leaf.shape) if getattr(leaf, "sharding", None) is not None else leaf.shape
        total += math.prod(shape) * np.dtype(leaf.dtype).itemsize
    return total

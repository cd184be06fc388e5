"""The watch: every process of a multi-process run learns within seconds that another one stopped.

JAX notices a dead process only when its heartbeats time out; the processes left
then end with a long runtime message or an abort, or meanwhile fail in a collective (gloo: a
"Connection reset by peer" traceback) or wait in one (NCCL). So process 0 also holds a TCP
connection to every other process, watched by a thread in each: when a process ends, the kernel
closes its connection at once, and the processes left say which one stopped, in one line, and
exit; one that hangs is noticed when its beats stop. Lines sent: "beat" (every few seconds),
"bye" (ends normally), "failed CODE" (leaves with an error), and from process 0 to the others
"lost I" / "hung I" / "failed I CODE" (process I stopped).

Only the run's own processes are heard. Process 0 puts a random secret in the coordination
service's key-value store; it sends each connection a fresh challenge ("challenge C"), which a
joining process I answers with "hello I N PROOF" (N its own fresh nonce, PROOF an HMAC of the
line under the secret), and process 0 answers "welcome PROOF" with an HMAC of its own: each
side then knows the other holds the run's secret, and a handshake recorded on one connection
proves nothing on another. A connection that does not prove itself within _HELLO_SECONDS, sends
anything else first, names a process outside the run or one already connected, or sends a line
longer than _LINE_BYTES is closed and changes nothing. Process 0 listens only on the address the
others reach it at (each says which address it resolves the coordinator's host to).
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import hmac
import os
import re
import secrets
import selectors
import socket
import sys
import threading
import time
from typing import Any

from jaxnet.errors import UserError

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
        # Set once this process can tell process 0 anything (connected, or gave up joining; process 0:
        # at once): a process that fails early waits for it, or its "failed" line would go nowhere and
        # process 0 would only see its connection close.
        self.joined = threading.Event()
        if index == 0:
            self.joined.set()

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
            self._join(client, host)
        finally:
            self.joined.set()

    def _join(self, client: Any, host: str) -> None:
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
        self.joined.set()
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
        os.write(sys.__stderr__.fileno() if sys.__stderr__ else 2, (tagged(message) + "\n").encode())


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


def start(silence: float) -> None:
    """Start watching the other processes of the run just joined (nothing if that cannot be set up);
    one not heard from for ``silence`` seconds counts as hung."""
    global _watch
    from jax._src import distributed  # the run's coordination client, as orbax and multihost_utils use it

    state = distributed.global_state
    client, address = getattr(state, "client", None), getattr(state, "coordinator_address", None)
    if client is None or not address or state.num_processes < 2:
        return
    watch = _Watch(state.process_id, state.num_processes, silence)
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


def _exit(code: int, message: str | None = None) -> None:
    """Print ``message`` (naming this process, see :func:`tagged`) and end the process now, without
    waiting for the other processes. The message goes first, straight to the file: when process 0
    dies, JAX's runtime ends the others too, a moment later, with a long message of its own."""
    write_now(message)
    with contextlib.suppress(Exception):
        sys.stdout.flush()
    os._exit(code)


def write_now(message: str | None) -> None:
    """``message`` (naming this process, see :func:`tagged`) on stderr at once, straight to the file."""
    with contextlib.suppress(Exception):
        sys.stderr.flush()
    if message:
        with contextlib.suppress(OSError):
            os.write(sys.__stderr__.fileno() if sys.__stderr__ else 2, (tagged(message) + "\n").encode())


_who: tuple[int, int] | None = None  # (this process, the run's processes), once a multi-process run knows


def identify(index: int, count: int) -> None:
    """Name this process as process ``index`` of ``count`` in the lines it prints (:func:`tagged`)."""
    global _who
    _who = (index, count) if count > 1 else None


def tagged(message: str) -> str:
    """``message`` with this process of a multi-process run named after its ``jaxnet: error:`` (or
    ``warning:``) prefix, so that each line in a job's shared output says which process wrote it;
    unchanged in a single-process run.

    >>> identify(1, 2); tagged("jaxnet: error: no such file")
    'jaxnet: error: [process 1 of 2] no such file'
    """
    if _who is None or not message:
        return message
    tag = f"[process {_who[0]} of {_who[1]}] "
    prefix = next((p for p in ("jaxnet: error: ", "jaxnet: warning: ", "jaxnet: ") if message.startswith(p)), "")
    return prefix + tag + message[len(prefix) :]


def current() -> _Watch | None:
    """The watch of this process's run, once started (None in a single-process run)."""
    return _watch

"""A link to the real broker that a test can cut: the broker "dies" for one child process only.

The child runs in a network namespace of its own (``unshare -n``), where 127.0.0.1 is private: there,
the broker's advertised address is a forwarder into a Unix socket (Unix sockets are files: they cross
network namespaces), and the test process forwards that socket to the real broker. Every byte the
child exchanges with Kafka is real. ``cut()`` closes every connection and refuses new ones: to the
child, the broker is gone; the shared broker and everyone else see nothing. ``hold(client_id)``
stalls only the requests of the child's Kafka client of that ``client.id`` (read from the first
request header of each connection) until ``release()``: to that one client, the broker is very slow.
``hold_requests(api_keys)`` stalls, on any connection, the requests of those Kafka API keys (and
what follows them on that connection) until ``release_requests()``: with the group's keys, the
coordinator no longer hears the child while its fetches and writes go on; with ``open_only``, only
on the connections open at that moment (as after a cut that healed while the TCP connections it
caught are still backing off, when a new connection goes through at once). ``requests`` counts the
requests of each API key that went through.

Needs ``unshare -n`` (root) or ``unshare -rn`` (unprivileged user namespaces); ``available()`` says.

The child side is this module's ``__main__``: ``python -m tests.faults.broker_link --unix PATH --port
PORT -- COMMAND...`` brings the namespace's loopback up, forwards 127.0.0.1:PORT to PATH and runs
COMMAND (stdio inherited, the same process group), exiting with its status.
"""

from __future__ import annotations

import argparse
import fcntl
import os
import socket
import struct
import subprocess
import sys
import threading
from collections.abc import Callable


def client_id(first: bytes) -> str | None:
    """The client.id in a Kafka request header (size, api key, api version, correlation id, id)."""
    if len(first) < 14:
        return None
    (n,) = struct.unpack(">h", first[12:14])
    return first[14 : 14 + n].decode(errors="replace") if n >= 0 and len(first) >= 14 + n else None


class Frames:
    """The Kafka requests one connection carries, whatever the reads cut them into: ``feed`` says the
    API key of each request that starts in ``data`` (a request is a 4-byte size, then its header,
    whose first field is the API key)."""

    def __init__(self) -> None:
        self._head = b""  # the start of a request whose size and API key are not complete yet
        self._left = 0  # bytes of the current request still to come

    def feed(self, data: bytes) -> list[int]:
        keys = []
        i = 0
        while i < len(data):
            if self._left:
                step = min(self._left, len(data) - i)
                self._left -= step
                i += step
                continue
            need = 6 - len(self._head)
            self._head += data[i : i + need]
            i += min(need, len(data) - i)
            if len(self._head) == 6:
                size, key = struct.unpack(">ih", self._head)
                keys.append(key)
                self._left = max(0, size - 2)  # the API key is the size's first 2 bytes
                self._head = b""
        return keys


def _pump(src: socket.socket, dst: socket.socket, gate: Callable[[bytes], None] | None = None) -> None:
    try:
        while data := src.recv(65536):
            if gate is not None:
                gate(data)  # may block: a stalled link
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


class Forwarder:
    """Accepts on ``listener``; each connection is piped to a fresh ``connect()``. With
    ``stall_after``: once that many bytes came back from the other side, the link stops relaying
    (connections stay open, nothing moves: ``stalled`` is set) until ``cut()``."""

    def __init__(
        self, listener: socket.socket, connect: Callable[[], socket.socket], stall_after: int | None = None
    ) -> None:
        self._listener = listener
        self._connect = connect
        self._lock = threading.Lock()
        self._open: list[socket.socket] = []
        self._cut = False
        self._stall_after = stall_after
        self.received = 0
        self.stalled = threading.Event()
        self._released = threading.Event()
        self._held: str | None = None  # the client.id whose requests wait (``hold``)
        self._unheld = threading.Event()
        self._unheld.set()
        self.holding = threading.Event()  # set once a held client's request is waiting
        self._held_keys: frozenset[int] = frozenset()  # API keys whose requests wait (``hold_requests``)
        self._accepted = 0  # connections accepted so far: each one's number
        self._held_below = 0  # only connections numbered below this hold their requests by API key
        self.holding_requests = threading.Event()  # set once a request of a held API key is waiting
        self._keys_released = threading.Event()
        self.requests: dict[int, int] = {}  # API key -> requests that went through
        threading.Thread(target=self._accept, daemon=True).start()

    def _gate(self, data: bytes) -> None:
        with self._lock:
            self.received += len(data)
            stall = self._stall_after is not None and self.received >= self._stall_after
        if stall:
            self.stalled.set()
            self._released.wait()

    def _requests_gate(self, number: int) -> Callable[[bytes], None]:
        """The gate of connection ``number``'s requests: it learns the client from the first one."""
        ident: list[str | None] = []
        frames = Frames()

        def gate(data: bytes) -> None:
            if not ident:
                ident.append(client_id(data))
            while ident[0] is not None and ident[0] == self._held and not self._unheld.is_set():
                self.holding.set()
                self._unheld.wait(0.1)
            keys = frames.feed(data)
            while self._held_keys.intersection(keys) and number < self._held_below:
                self.holding_requests.set()
                self._keys_released.wait(0.1)
            with self._lock:
                for key in keys:
                    self.requests[key] = self.requests.get(key, 0) + 1

        return gate

    def hold(self, client: str) -> None:
        """From now on, requests of the Kafka client ``client`` (its client.id) wait, on their
        open connections and on new ones, until ``release()``; nobody else's do."""
        self.holding.clear()
        self._held = client
        self._unheld.clear()

    def release(self) -> None:
        """Let the held requests through, in the order they came."""
        self._unheld.set()

    def hold_requests(self, api_keys: frozenset[int], open_only: bool = False) -> None:
        """From now on, a request of one of ``api_keys`` waits, with whatever follows it on its
        connection, until ``release_requests()``; other requests go through, and with
        ``open_only`` every request of a connection opened after this call too."""
        self.holding_requests.clear()
        self._keys_released.clear()
        with self._lock:
            self._held_below = self._accepted if open_only else sys.maxsize
        self._held_keys = api_keys

    def release_requests(self) -> None:
        """Let the requests held by API key through, in the order they came."""
        self._held_keys = frozenset()
        self._keys_released.set()

    def count(self, api_key: int) -> int:
        """Requests of ``api_key`` that went through so far."""
        with self._lock:
            return self.requests.get(api_key, 0)

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # cut
            try:
                upstream = self._connect()
            except OSError:
                client.close()  # the other side is gone: a refused connection, as from a dead broker
                continue
            with self._lock:
                if self._cut:
                    client.close()
                    upstream.close()
                    return
                self._open += [client, upstream]
                number = self._accepted
                self._accepted += 1
            gate = self._requests_gate(number)
            threading.Thread(target=_pump, args=(client, upstream, gate), daemon=True).start()
            threading.Thread(target=_pump, args=(upstream, client, self._gate), daemon=True).start()

    def cut(self) -> None:
        self._released.set()
        self._unheld.set()
        self._held_keys = frozenset()
        self._keys_released.set()
        with self._lock:
            self._cut = True
            self._listener.close()
            for s in self._open:
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()


def unshare_command() -> list[str]:
    return ["unshare", "-n"] if os.geteuid() == 0 else ["unshare", "-rn"]


def available() -> bool:
    try:
        return subprocess.run([*unshare_command(), "true"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def link_to(broker: tuple[str, int], unix_path: str, stall_after: int | None = None) -> Forwarder:
    """The test's side: ``unix_path`` -> the real broker (``stall_after``: see ``Forwarder``)."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(unix_path)
    listener.listen(64)

    def connect() -> socket.socket:
        s = socket.create_connection(broker, timeout=10)
        s.settimeout(None)  # a connect timeout only: a held or quiet link must not time out reading
        return s

    return Forwarder(listener, connect, stall_after)


def _loopback_up() -> None:
    """``ip link set lo up``, without needing iproute2: a new network namespace starts with it down."""
    siocgifflags, siocsifflags, iff_up = 0x8913, 0x8914, 0x1
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        got = fcntl.ioctl(s, siocgifflags, struct.pack("16sH14x", b"lo", 0))
        flags = struct.unpack("16sH", got[:18])[1]
        fcntl.ioctl(s, siocsifflags, struct.pack("16sH14x", b"lo", flags | iff_up))


def main() -> int:
    """The child's side, inside its own network namespace."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--unix", required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("command", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    command = a.command[1:] if a.command[:1] == ["--"] else a.command
    _loopback_up()
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", a.port))
    listener.listen(64)

    def connect() -> socket.socket:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect(a.unix)
        except OSError:
            s.close()
            raise
        return s

    Forwarder(listener, connect)
    return subprocess.run(command).returncode


if __name__ == "__main__":
    sys.exit(main())

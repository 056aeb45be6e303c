"""Small real HTTP servers on loopback for the fault suite: each answers every request with a
function of the request and records what it saw (path as sent on the wire, headers), so a test can
assert what reached it. They stand in for destinations and for things that are not the processor."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Seen:
    path: str  # the request target as it came on the wire (no decoding, no normalisation)
    headers: dict[str, str]


@dataclass
class Reply:
    status: int
    body: bytes | Iterator[bytes] = b""  # an iterator is streamed (no Content-Length) until it ends
    headers: dict[str, str] = field(default_factory=dict)


class _Handler(BaseHTTPRequestHandler):
    server: LoopbackServer

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        srv = self.server
        with srv.lock:
            srv.seen.append(Seen(self.path, {k.lower(): v for k, v in self.headers.items()}))
        reply = srv.answer(self.path)
        self.send_response(reply.status)
        for k, v in reply.headers.items():
            self.send_header(k, v)
        if isinstance(reply.body, bytes):
            if "Content-Length" not in reply.headers:
                self.send_header("Content-Length", str(len(reply.body)))
            self.end_headers()
            self.wfile.write(reply.body)
            return
        # Streamed: HTTP/1.0 style, the body ends when the connection closes.
        self.send_header("Connection", "close")
        self.end_headers()
        try:
            for chunk in reply.body:
                self.wfile.write(chunk)
                with srv.lock:
                    srv.streamed += len(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the reader hung up: what it did not read was never sent
        finally:
            with srv.lock:
                srv.streams_done += 1


class LoopbackServer(ThreadingHTTPServer):
    """``with LoopbackServer(answer) as srv: srv.url``; ``answer(path) -> Reply``."""

    daemon_threads = True

    def __init__(self, answer: Callable[[str], Reply], host: str = "127.0.0.1") -> None:
        super().__init__((host, 0), _Handler)
        self.answer = answer
        self.lock = threading.Lock()
        self.seen: list[Seen] = []
        self.streamed = 0  # bytes of streamed bodies written to the socket
        self.streams_done = 0  # streamed bodies that ended (completely or because the reader left)
        self._thread = threading.Thread(target=self.serve_forever, name="loopback-server", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def __enter__(self) -> LoopbackServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
        self.server_close()

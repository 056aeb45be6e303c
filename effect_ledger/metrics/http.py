"""The ``/metrics`` endpoint: Prometheus's text format over HTTP, from a daemon thread.

Not prometheus-client's own ``start_http_server``, which listens wherever it is told without a
credential and gives every connection a thread of its own for as long as the client keeps it
open (a client that sends nothing holds its thread for ever). Here:

* beyond loopback only with a bearer token (``Authorization: Bearer TOKEN``, as Prometheus's
  ``authorization`` scrape setting sends it); ``ConfigError`` otherwise, before anything listens;
* at most ``MAX_CONNECTIONS`` connections at once (more are closed at once), each given
  ``IO_TIMEOUT_S`` in all to send its request and take the answer (a client that sends a header
  line now and then is closed all the same), and a request per connection;
* ``GET /metrics`` (and ``/``) only; http.server's own bounds hold for the request: a line of at
  most 64 KiB, at most 100 headers.
"""

from __future__ import annotations

import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from effect_ledger.errors import ConfigError
from effect_ledger.streams.config import is_loopback, same_secret

MAX_CONNECTIONS = 32
IO_TIMEOUT_S = 10.0


def check_exposure(host: str, token: str | None) -> None:
    """``ConfigError`` for an address beyond loopback without a token (before anything listens)."""
    if not is_loopback(host) and not token:
        raise ConfigError(
            f"/metrics would listen on {host or 'every address'}, beyond loopback, without a credential: "
            "set --metrics-token (EFFECTS_METRICS_TOKEN), which scrapers send as 'Authorization: Bearer TOKEN'"
        )


class MetricsServer(ThreadingHTTPServer):
    """Serves one registry's samples; ``.server_port`` is the bound port, ``.shutdown()`` stops it."""

    daemon_threads = True

    def __init__(self, host: str, port: int, registry: Any, token: str | None) -> None:
        check_exposure(host, token)
        self.registry = registry
        self.expected = f"Bearer {token}" if token else None
        self.slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.address_family = family
        super().__init__((host, port), _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.slots.acquire(blocking=False):  # full: this one is closed, the others go on
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()


class _Handler(BaseHTTPRequestHandler):
    server: MetricsServer
    timeout = IO_TIMEOUT_S  # StreamRequestHandler sets it on the socket: a silent client is let go

    def setup(self) -> None:
        super().setup()
        self.close_connection = True  # one request per connection: the deadline below is its whole life
        # A read timeout alone restarts with every byte: the connection's whole life is bounded too.
        # Shutting the socket down wakes the read it is blocked in; the handler then ends.
        self._deadline = threading.Timer(self.timeout, self._cut)
        self._deadline.daemon = True
        self._deadline.start()

    def _cut(self) -> None:
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # already closed

    def finish(self) -> None:
        self._deadline.cancel()
        try:
            super().finish()
        except OSError:
            pass  # the connection was cut (its deadline) or dropped: nothing left to flush to it

    def log_message(self, format: str, *args: Any) -> None:
        pass  # a scrape every few seconds is not news

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        if self.path.split("?", 1)[0] not in ("/metrics", "/"):
            self._text(404, b"not found: /metrics\n")
            return
        expected = self.server.expected
        if expected is not None:
            if not same_secret(self.headers.get("Authorization", ""), expected):
                self._text(401, b"unauthorized: send Authorization: Bearer TOKEN\n", {"WWW-Authenticate": "Bearer"})
                return
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        self._text(200, generate_latest(self.server.registry), {"Content-Type": CONTENT_TYPE_LATEST})

    def _text(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        headers = {"Content-Type": "text/plain; charset=utf-8", **(headers or {})}
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def serve_metrics(registry: Any, port: int, host: str = "127.0.0.1", token: str | None = None) -> MetricsServer:
    """Start serving ``registry`` on ``host:port`` from a daemon thread (see the module docstring)."""
    try:
        server = MetricsServer(host, port, registry, token)
    except OSError as e:
        raise ConfigError(f"cannot serve metrics on {host}:{port}: {e.strerror or e}") from None
    threading.Thread(target=server.serve_forever, name="effect-ledger-metrics", daemon=True).start()
    return server

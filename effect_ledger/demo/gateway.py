"""A payment gateway on loopback that behaves like a real one, for the demo and the crash tests.

It comes in the four kinds of destination that matter to effect-ledger:

| kind          | deduplicates by ``Idempotency-Key`` | answers "refund by key?" |
|---------------|-------------------------------------|--------------------------|
| ``key+lookup``| yes                                 | yes                      |
| ``lookup``    | no                                  | yes (the key is stored as metadata) |
| ``key``       | yes                                 | no (501)                 |
| ``none``      | no                                  | no (501)                 |

API: ``POST /refunds`` (JSON ``order``, ``amount``, ``currency``; header ``Idempotency-Key``) ->
200 with the refund; ``GET /refunds/by-key/{key}`` -> 200 refund / 404 / 501;
``GET /_admin/refunds`` -> every refund made; ``POST /_admin/fail`` (JSON ``count``, ``mode``:
``reject`` (400), ``error`` (503 before committing), ``lost`` (commit, then 503: the reply is lost),
``slow`` (commit, then reply after ``delay`` seconds), ``late`` (wait ``delay`` seconds, then commit
and reply: the refund takes effect after a caller that timed out gave up)) -> failures on demand;
``POST /_admin/reset``.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from dataclasses import asdict, dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote

KINDS = ("key+lookup", "lookup", "key", "none")


@dataclass
class Refund:
    id: str
    order: str
    amount: int
    currency: str
    idempotency_key: str | None
    created_ms: int
    status: str = "succeeded"


class GatewayState:
    """The gateway's books, guarded by one lock (requests are served on several threads)."""

    def __init__(self, kind: str) -> None:
        if kind not in KINDS:
            raise ValueError(f"unknown gateway kind {kind!r}; one of {', '.join(KINDS)}")
        self.kind = kind
        self.honours_keys = kind in ("key+lookup", "key")
        self.lookup = kind in ("key+lookup", "lookup")
        self.lock = threading.Lock()
        self.refunds: list[Refund] = []
        self.by_key: dict[str, Refund] = {}
        self.failures: list[tuple[str, float]] = []
        self._ids = itertools.count(1)

    def reset(self) -> None:
        with self.lock:
            self.refunds.clear()
            self.by_key.clear()
            self.failures.clear()
            self._ids = itertools.count(1)

    def create(self, body: dict[str, Any], key: str | None) -> tuple[int, dict[str, Any], float]:
        """(status, reply, delay before replying)."""
        with self.lock:
            mode, delay = self.failures.pop(0) if self.failures else ("", 0.0)
        if mode == "late":
            # Held in a queue (or by a busy server) before it takes effect: a caller that gave up
            # in the meantime has not stopped it.
            time.sleep(delay)
            mode, delay = "", 0.0
        with self.lock:
            if mode == "reject":
                return 400, {"error": "card_declined", "message": "refund rejected by the issuer"}, 0.0
            if mode == "error":
                return 503, {"error": "unavailable"}, 0.0
            if not isinstance(body.get("amount"), int) or body["amount"] <= 0 or not body.get("order"):
                return 400, {"error": "invalid_request", "message": "order and a positive integer amount"}, 0.0
            if self.honours_keys and key and key in self.by_key:
                return 200, asdict(self.by_key[key]), 0.0  # the original, not a second refund
            refund = Refund(
                f"re_{next(self._ids):04d}",
                str(body["order"]),
                body["amount"],
                str(body.get("currency", "CNY")),
                key,
                int(time.time() * 1000),
            )
            self.refunds.append(refund)
            if key and (self.honours_keys or self.lookup):
                self.by_key.setdefault(key, refund)
            if mode == "lost":
                return 503, {"error": "connection reset"}, 0.0
            return 200, asdict(refund), delay

    def find(self, key: str) -> tuple[int, dict[str, Any]]:
        with self.lock:
            if not self.lookup:
                return 501, {"error": "lookup by idempotency key is not supported"}
            r = self.by_key.get(key)
            return (200, asdict(r)) if r else (404, {"error": "no refund with that key"})


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # keep the demo's output clean
        pass

    def _reply(self, status: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        try:
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the caller gave up waiting (a timeout): what was done is done, as at a real gateway

    def _body(self) -> dict[str, Any]:
        n = int(self.headers.get("Content-Length") or 0)
        try:
            body = json.loads(self.rfile.read(n) or b"{}")
        except json.JSONDecodeError:
            return {}
        return body if isinstance(body, dict) else {}

    def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
        state = self.server.state
        if self.path == "/refunds":
            status, body, delay = state.create(self._body(), self.headers.get("Idempotency-Key"))
            if delay:
                time.sleep(delay)
            self._reply(status, body)
        elif self.path == "/_admin/fail":
            b = self._body()
            with state.lock:
                state.failures.extend(
                    [(str(b.get("mode", "error")), float(b.get("delay", 0)))] * int(b.get("count", 1))
                )
            self._reply(200, {"queued": len(state.failures)})
        elif self.path == "/_admin/reset":
            state.reset()
            self._reply(200, {"reset": True})
        else:
            self._reply(404, {"error": "not found"})

    def do_GET(self) -> None:  # noqa: N802
        state = self.server.state
        if self.path.startswith("/refunds/by-key/"):
            status, body = state.find(unquote(self.path[len("/refunds/by-key/") :]))
            self._reply(status, body)
        elif self.path == "/_admin/refunds":
            with state.lock:
                self._reply(200, {"kind": state.kind, "refunds": [asdict(r) for r in state.refunds]})
        else:
            self._reply(404, {"error": "not found"})


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    state: GatewayState


class Gateway:
    """A running gateway: ``with Gateway("key+lookup") as gw: gw.url``."""

    def __init__(
        self, kind: str = "key+lookup", port: int = 0, state: GatewayState | None = None, host: str = "127.0.0.1"
    ) -> None:
        self.state = state or GatewayState(kind)  # ``state``: books that fail on their own terms (the soak)
        # ``host``: loopback unless a test's network says otherwise (the chaos run's bridge address).
        self._host = host
        self._server = _Server((host, port), _Handler)
        self._server.state = self.state
        self._thread = threading.Thread(target=self._server.serve_forever, name=f"gateway-{kind}", daemon=True)

    @property
    def url(self) -> str:
        port = self._server.server_address[1]
        return f"http://{self._host}:{port}"

    def start(self) -> Gateway:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> Gateway:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def refunds(self) -> list[Refund]:
        with self.state.lock:
            return list(self.state.refunds)

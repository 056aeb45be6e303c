"""What the loopback fakes of search-based destinations share (``payment_api``: Stripe-shaped,
``ticket_api``: Jira-shaped): a threaded HTTP server, a clock that tests can move (index lag, key
expiry), and search answers that go wrong on demand the way real ones do.

Admin API of every fake: ``POST /_admin/advance`` (JSON ``seconds``: move the fake's clock),
``POST /_admin/fail`` (JSON ``on`` = ``"search"`` or ``"create"``, ``mode``, ``count``, ``delay``,
``to``), ``POST /_admin/lag`` (JSON ``seconds``: the search index's lag).

Search failures: ``error`` (HTTP 500), ``redirect`` (302 to ``to``, by default the same search on
this server: even a same-origin redirect is not the answer asked for), ``slow`` (answer after
``delay`` s), ``huge`` (a valid answer padded to ``delay`` MiB), ``shape`` (a 200 in another
shape), ``wrong-page`` (a 200 in the right shape for another page or search, empty), ``html``
(a 200 text/html login page). Create failures: ``error`` (503 before committing), ``lost`` (commit,
then 503: the reply is lost), ``slow`` (commit, then reply after ``delay`` s).
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

SEARCH_FAULTS = ("error", "redirect", "slow", "huge", "shape", "wrong-page", "html")
CREATE_FAULTS = ("error", "lost", "slow")


@dataclass
class Fault:
    mode: str
    delay: float = 0.0
    to: str = ""


@dataclass
class Answer:
    status: int
    body: Any
    headers: dict[str, str]
    delay: float = 0.0
    raw: bytes | None = None  # sent as is (text/html) instead of ``body`` as JSON


class FakeState:
    """Books, clock and queued faults of one fake, guarded by one lock."""

    def __init__(self, lag_s: float = 0.0) -> None:
        self.lock = threading.Lock()
        self.lag_s = lag_s
        self.offset_s = 0.0
        self.faults: dict[str, list[Fault]] = {"search": [], "create": []}
        self.searches = 0  # search requests served (every page)

    def now(self) -> float:
        """The fake's clock (wall clock plus what ``advance`` added), in seconds."""
        return time.time() + self.offset_s

    def fault(self, on: str) -> Fault | None:
        with self.lock:
            queue = self.faults[on]
            return queue.pop(0) if queue else None

    def admin(self, path: str, body: dict[str, Any]) -> tuple[int, Any] | None:
        """An admin request's answer, or None when ``path`` is not one."""
        with self.lock:
            if path == "/_admin/advance":
                self.offset_s += float(body.get("seconds", 0))
                return 200, {"now": self.offset_s}
            if path == "/_admin/lag":
                self.lag_s = float(body.get("seconds", 0))
                return 200, {"lag": self.lag_s}
            if path == "/_admin/fail":
                on, mode = str(body.get("on", "search")), str(body.get("mode", "error"))
                allowed = SEARCH_FAULTS if on == "search" else CREATE_FAULTS if on == "create" else ()
                if mode not in allowed:
                    return 400, {"error": f"unknown fault {on}/{mode}"}
                fault = Fault(mode, float(body.get("delay", 0)), str(body.get("to", "")))
                self.faults[on].extend([fault] * int(body.get("count", 1)))
                return 200, {"queued": len(self.faults[on])}
        return None


def faulty_search(fault: Fault | None, own_url: str, good: Answer, other_page: Any) -> Answer:
    """The answer a search gives under ``fault`` (``good`` without one)."""
    if fault is None:
        return good
    if fault.mode == "error":
        return Answer(500, {"error": {"type": "api_error", "message": "search unavailable"}}, {})
    if fault.mode == "redirect":
        return Answer(302, {}, {"Location": fault.to or own_url})
    if fault.mode == "slow":
        return Answer(good.status, good.body, good.headers, fault.delay)
    if fault.mode == "huge":
        padded = dict(good.body) if isinstance(good.body, dict) else {"body": good.body}
        padded["padding"] = "x" * int(max(fault.delay, 1.0) * (1 << 20))
        return Answer(good.status, padded, good.headers)
    if fault.mode == "shape":
        return Answer(200, {"results": [], "count": 0}, {})
    if fault.mode == "html":
        return Answer(200, None, {"Content-Type": "text/html"}, raw=b"<html><body>Sign in</body></html>")
    return Answer(200, other_page, {})  # wrong-page


class Handler(BaseHTTPRequestHandler):
    """Dispatches to the server's ``app`` (``get(path)``, ``post(path, headers, body)``)."""

    server: FakeServer

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _send(self, a: Answer) -> None:
        if a.delay:
            time.sleep(a.delay)
        data = a.raw if a.raw is not None else json.dumps(a.body).encode()
        self.send_response(a.status)
        headers = {"Content-Type": "application/json", **a.headers}
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        try:
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the caller gave up waiting: what was done is done, as at a real server

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        self._send(self.server.app.get(self.path))

    def do_POST(self) -> None:  # noqa: N802
        n = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(n) if n else b""
        app = self.server.app
        if self.path.startswith("/_admin/"):
            try:
                body = json.loads(raw or b"{}")
            except json.JSONDecodeError:
                body = {}
            got = app.state.admin(self.path, body if isinstance(body, dict) else {})
            self._send(Answer(got[0], got[1], {}) if got else Answer(404, {"error": "not found"}, {}))
            return
        self._send(app.post(self.path, {k.lower(): v for k, v in self.headers.items()}, raw))


class FakeServer(ThreadingHTTPServer):
    daemon_threads = True
    app: Any


class Running:
    """A fake on loopback: ``with Running(app) as srv: srv.url``."""

    def __init__(self, app: Any, port: int = 0, host: str = "127.0.0.1") -> None:
        self._host = host
        self.app = app
        self._server = FakeServer((host, port), Handler)
        self._server.app = app
        app.url = self.url
        # A short poll: stopping a fake (once per test) should not cost half a second.
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, name="fake-api", daemon=True
        )

    @property
    def url(self) -> str:
        return f"http://{self._host}:{self._server.server_address[1]}"

    def start(self) -> Running:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> Running:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

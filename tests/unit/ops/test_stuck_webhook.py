"""``effects stuck --webhook``: the finding posted to a real loopback HTTP server that records what
it receives, in the three formats; slow, failing and redirecting answers; a redirect to another
origin is not followed. The body is bounded whatever the number of stuck effects."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from effect_ledger.ops import page
from effect_ledger.ops.views import Row
from tests.incident import incident
from tests.ops_expected import now_ms, write_ledger

ROOT = Path(__file__).resolve().parents[3]
EXIT_FOUND, EXIT_PAGE_FAILED = 3, 4


@dataclass
class Received:
    path: str
    content_type: str
    body: Any


@dataclass
class Hook:
    """A loopback HTTP server; what it does depends on the path it is posted to."""

    server: ThreadingHTTPServer
    received: list[Received] = field(default_factory=list)
    release: threading.Event = field(default_factory=threading.Event)  # lets /slow answer
    elsewhere: str = ""  # another origin, for /away

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"


def serve(hook_of: dict[str, Hook]) -> Hook:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *_: Any) -> None:
            pass

        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            hook = hook_of["me"]
            n = int(self.headers.get("Content-Length", "0"))
            path = self.path.split("?")[0]
            hook.received.append(Received(path, self.headers.get("Content-Type", ""), json.loads(self.rfile.read(n))))
            if path == "/slow":
                hook.release.wait(60)
            if path == "/hop":
                return self._answer(307, {"Location": "/ok"})
            if path == "/loop":
                return self._answer(307, {"Location": "/loop"})
            if path == "/away":
                return self._answer(302, {"Location": f"{hook.elsewhere}/ok"})
            self._answer(500 if path == "/fail" else 200, {})

        def _answer(self, status: int, headers: dict[str, str]) -> None:
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, v)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    hook = Hook(server)
    hook_of["me"] = hook
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return hook


@pytest.fixture
def hooks() -> Iterator[tuple[Hook, Hook]]:
    main, other = serve({}), serve({})
    main.elsewhere = other.base
    yield main, other
    for h in (main, other):
        h.release.set()
        h.server.shutdown()
        h.server.server_close()


@pytest.fixture(scope="module")
def ledger(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    inc = incident(now_ms())
    return write_ledger(tmp_path_factory.mktemp("stuck") / "incident.db", inc.events), inc.stuck


def stuck(ledger: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run(
        [sys.executable, "-m", "effect_ledger", "stuck", "--db", str(ledger), "--json", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def one_line(r: subprocess.CompletedProcess[str]) -> str:
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("effects: ") and "Traceback" not in r.stderr, r.stderr
    return lines[0]


@pytest.mark.parametrize("fmt", ["json", "slack", "pagerduty"])
def test_posts_the_finding_in_each_format(ledger: tuple[Path, list[str]], hooks: tuple[Hook, Hook], fmt: str) -> None:
    db, stuck_keys = ledger
    main, _ = hooks
    r = stuck(db, "--webhook", f"{main.base}/ok", "--webhook-format", fmt, "--routing-key", "R0UTING")
    assert r.returncode == EXIT_FOUND, r.stderr
    assert len(main.received) == 1 and main.received[0].content_type == "application/json"
    body = main.received[0].body
    if fmt == "json":
        assert body["stuck"] == 5 and sorted(e["effect_id"] for e in body["effects"]) == sorted(stuck_keys)
    elif fmt == "slack":
        assert body["text"].startswith("effect-ledger: 5 effects stuck for longer than 10m")
        assert all(k in body["text"] for k in stuck_keys)
    else:
        assert body["routing_key"] == "R0UTING" and body["event_action"] == "trigger"
        assert body["payload"]["severity"] == "critical" and body["payload"]["custom_details"]["stuck"] == 5


def test_nothing_stuck_posts_nothing(ledger: tuple[Path, list[str]], hooks: tuple[Hook, Hook]) -> None:
    main, _ = hooks
    r = stuck(ledger[0], "--older-than", "2h", "--webhook", f"{main.base}/ok")
    assert r.returncode == 0, r.stderr
    assert main.received == []


def test_same_origin_redirect_is_followed(ledger: tuple[Path, list[str]], hooks: tuple[Hook, Hook]) -> None:
    main, _ = hooks
    r = stuck(ledger[0], "--webhook", f"{main.base}/hop")
    assert r.returncode == EXIT_FOUND, r.stderr
    assert [x.path for x in main.received] == ["/hop", "/ok"]
    assert main.received[0].body == main.received[1].body


@pytest.mark.parametrize(
    ("path", "said"),
    [
        ("/fail", "answered HTTP 500"),
        ("/slow", "did not answer within 1 s"),
        ("/away", "not followed (another origin)"),
        ("/loop", "redirected more than 3 times"),
    ],
)
def test_a_failed_post_is_one_line_and_exit_4(
    ledger: tuple[Path, list[str]], hooks: tuple[Hook, Hook], path: str, said: str
) -> None:
    main, other = hooks
    r = stuck(ledger[0], "--webhook", f"{main.base}{path}?token=s3cret", "--webhook-timeout", "1")
    assert r.returncode == EXIT_PAGE_FAILED, r.stderr
    line = one_line(r)
    assert line.startswith("effects: webhook not delivered: ") and said in line, line
    assert "s3cret" not in line  # the URL's secret part is never printed
    assert len(r.stdout.splitlines()) == 5  # the finding is still printed
    assert main.received and other.received == []  # never handed to another origin


def test_nobody_listening_is_exit_4(ledger: tuple[Path, list[str]], hooks: tuple[Hook, Hook]) -> None:
    main, _ = hooks
    port = main.server.server_address[1]
    main.server.shutdown()
    main.server.server_close()
    r = stuck(ledger[0], "--webhook", f"http://127.0.0.1:{port}/ok")
    assert r.returncode == EXIT_PAGE_FAILED
    assert "webhook not delivered" in one_line(r)


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--webhook", "ftp://example.invalid/x"], "give an http:// or https:// URL"),
        (["--webhook", "http://127.0.0.1:1/x", "--webhook-format", "pagerduty"], "needs --routing-key"),
    ],
)
def test_bad_webhook_settings_are_one_line_exit_1(ledger: tuple[Path, list[str]], args: list[str], said: str) -> None:
    r = stuck(ledger[0], *args)
    assert r.returncode == 1 and said in one_line(r)
    assert r.stdout == ""  # refused before scanning


def test_the_body_is_bounded() -> None:
    rows = [Row(f"payments:{i:064x}", "PENDING", "payments", "refund", 1, 0, 0, "x" * 100_000) for i in range(5000)]
    for fmt in page.FORMATS:
        body = page.payload(rows, fmt, "10m", routing_key="k")
        data = page.encode(body)
        assert len(data) <= page.MAX_BODY, (fmt, len(data))
        text = data.decode()
        assert "4980 more" in text or '"more": 4980' in text, fmt

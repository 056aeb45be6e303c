"""``effects mcp-proxy --upstream``: who may use the proxy, and whose recorded result a caller gets.

Found by a hostile probe:

* ``--host 0.0.0.0`` started with no credential at all;
* a caller with no (or a wrong) ``Authorization`` who sent the same arguments as another caller got
  that caller's recorded result: the upstream was never asked;
* an upstream answering 401 with a JSON body made the call's outcome unknown: the key was then
  UNCERTAIN, and the rightful caller's call with the same identity was refused for good.

The proxy runs as the real command; the MCP server is a small real HTTP server on loopback that,
like a real one behind OAuth, answers 401 to a request without a known bearer token.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.packaging import ROOT

USERS = {"Bearer alice-token": "alice", "Bearer alice-refreshed": "alice", "Bearer bob-token": "bob"}
TARGETS = '[targets.payments]\nlookup = "none"\n\n[mcp.writes.refund]\ntarget = "payments"\n'
REFUND = {"order": "A-1", "amount": 4800}
WAIT_S = 60


@dataclass
class Upstream:
    """A streamable-HTTP MCP server (JSON answers) that knows two bearer tokens."""

    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)  # (user, params) of tools/call
    seen_headers: list[dict[str, str]] = field(default_factory=list)


def _handler(up: Upstream) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _send(self, status: int, body: Any) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
            msg = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
            up.seen_headers.append({k.lower(): v for k, v in self.headers.items()})
            user = USERS.get(self.headers.get("Authorization", ""))
            if user is None:
                self._send(401, {"error": "unauthorized", "error_description": "a bearer token is required"})
                return
            if msg.get("method") == "tools/call":
                up.calls.append((user, msg["params"]))
                text = f"refund re_{len(up.calls):04d} made for {user}"
                result = {"content": [{"type": "text", "text": text}]}
                self._send(200, {"jsonrpc": "2.0", "id": msg["id"], "result": result})
                return
            self._send(200, {"jsonrpc": "2.0", "id": msg.get("id"), "result": {}})

    return Handler


@pytest.fixture
def upstream() -> Iterator[tuple[Upstream, str]]:
    up = Upstream()
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _handler(up))
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield up, f"http://127.0.0.1:{srv.server_address[1]}/mcp"
    srv.shutdown()
    srv.server_close()


def proxy_cmd(tmp: Path, url: str, *flags: str) -> list[str]:
    (tmp / "targets.toml").write_text(TARGETS)
    return [
        sys.executable, "-m", "effect_ledger.cli.main", "mcp-proxy", "--db", str(tmp / "effects.db"),
        "--targets", str(tmp / "targets.toml"), "--upstream", url, "--port", "0", *flags,
    ]  # fmt: skip


@pytest.fixture
def proxy(tmp_path: Path, upstream: tuple[Upstream, str], request: pytest.FixtureRequest) -> Iterator[str]:
    flags = getattr(request, "param", ())
    p = subprocess.Popen(proxy_cmd(tmp_path, upstream[1], *flags), stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert p.stderr is not None
        # The proxy first says which policy each write tool runs under, then where it listens.
        for _ in range(100):
            banner = p.stderr.readline()
            if not banner or "listening on" in banner:
                break
        found = re.search(r"listening on (http://127\.0\.0\.1:\d+/mcp)", banner)
        assert found, banner
        yield found.group(1)
    finally:
        p.terminate()
        p.wait(timeout=WAIT_S)


def post(url: str, body: dict[str, Any], headers: dict[str, str]) -> tuple[int, dict[str, Any]]:
    import urllib.error
    import urllib.request

    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), method="POST",
        headers={"Content-Type": "application/json", "Accept": "application/json, text/event-stream", **headers},
    )  # fmt: skip
    try:
        with urllib.request.urlopen(req, timeout=WAIT_S) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def refund(url: str, headers: dict[str, str], meta: dict[str, Any] | None = None) -> dict[str, Any]:
    params: dict[str, Any] = {"name": "refund", "arguments": REFUND}
    if meta is not None:
        params["_meta"] = meta
    status, answer = post(url, {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params}, headers)
    assert status == 200, answer
    return answer


def text_of(answer: dict[str, Any]) -> str:
    return " ".join(c.get("text", "") for c in answer["result"]["content"])


def states(tmp: Path) -> list[str]:
    with sqlite3.connect(tmp / "effects.db") as db:
        return [s for (s,) in db.execute("SELECT state FROM effects ORDER BY created_ms")]


def test_a_recorded_result_is_not_given_to_a_caller_the_server_refuses(
    upstream: tuple[Upstream, str], proxy: str
) -> None:
    up, _ = upstream
    alice = refund(proxy, {"Authorization": "Bearer alice-token"})
    assert "made for alice" in text_of(alice)
    # The same arguments, no session id: a caller the server does not accept gets a refusal.
    for who in ({}, {"Authorization": "Bearer stolen"}):
        answer = refund(proxy, who)
        assert "alice" not in json.dumps(answer) and "refused this caller (HTTP 401)" in json.dumps(answer), answer
    # alice retrying, with the same token or a refreshed one, gets her recorded result: the key does
    # not depend on the credential, so a refreshed token never makes a retry a second refund.
    for token in ("Bearer alice-token", "Bearer alice-refreshed"):
        again = refund(proxy, {"Authorization": token})
        assert text_of(again) == text_of(alice)
        assert again["result"]["_meta"]["effect-ledger/effect"]["called"] is False
    assert [u for u, _ in up.calls] == ["alice"]


def test_a_call_refused_by_the_servers_transport_does_not_poison_the_key(
    tmp_path: Path, upstream: tuple[Upstream, str], proxy: str
) -> None:
    up, _ = upstream
    meta = {"effect-ledger/runId": "run-7", "effect-ledger/stepId": "refund-A-1"}  # one identity for both
    refused = refund(proxy, {"Authorization": "Bearer wrong"}, meta)
    assert "error" in refused or refused["result"]["isError"] is True, refused
    assert "401" in json.dumps(refused)
    assert states(tmp_path) == ["FAILED"]  # the server said no before the tool: nothing happened
    ok = refund(proxy, {"Authorization": "Bearer alice-token"}, meta)
    assert "made for alice" in text_of(ok), ok
    assert [u for u, _ in up.calls] == ["alice"] and states(tmp_path) == ["CONFIRMED"]


@pytest.mark.parametrize("proxy", [("--token", "proxy-s3cret")], indirect=True)
def test_with_a_token_every_request_must_carry_it(upstream: tuple[Upstream, str], proxy: str) -> None:
    up, _ = upstream
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    for headers in ({}, {"Effect-Ledger-Token": "guess"}, {"Authorization": "Bearer alice-token"}):
        status, answer = post(proxy, body, headers)
        assert status == 401 and "Effect-Ledger-Token" in json.dumps(answer), (headers, answer)
    assert up.seen_headers == []  # nothing reached the server
    status, _ = post(proxy, body, {"Effect-Ledger-Token": "proxy-s3cret", "Authorization": "Bearer alice-token"})
    assert status == 200
    # The proxy's own credential stays with the proxy; the server's goes through.
    assert [h.get("authorization") for h in up.seen_headers] == ["Bearer alice-token"]
    assert all("effect-ledger-token" not in h for h in up.seen_headers)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", ""])
def test_beyond_loopback_it_refuses_to_start_without_a_token(
    tmp_path: Path, upstream: tuple[Upstream, str], host: str
) -> None:
    r = subprocess.run(
        [*proxy_cmd(tmp_path, upstream[1]), "--host", host], capture_output=True, text=True, timeout=WAIT_S, cwd=ROOT,
        env={k: v for k, v in os.environ.items() if k != "EFFECTS_MCP_TOKEN"},
    )  # fmt: skip
    assert r.returncode == 1, r.stderr
    (line,) = r.stderr.splitlines()
    assert line.startswith("effects: ") and "beyond loopback" in line and "--token" in line
    assert not (tmp_path / "effects.db").exists()

"""The ``/metrics`` endpoint (``--metrics-port``, ``LedgerMetrics.serve``), found by a hostile probe:

* ``--metrics-host 0.0.0.0`` (or ``""``) served every interface with no credential, and there was
  no way to ask for one;
* every connection got a thread for as long as the client kept it open: 888 connections that sent
  nothing were all still held after the probe ended.

Now: beyond loopback only with a bearer token; at most ``MAX_CONNECTIONS`` connections at once, each
given ``IO_TIMEOUT_S``. Real sockets, the real command and the real endpoint.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from effect_ledger.errors import ConfigError
from effect_ledger.metrics import http as metrics_http
from effect_ledger.metrics.names import LedgerMetrics
from tests.incident import incident
from tests.ops_expected import now_ms, write_ledger
from tests.packaging import ROOT
from tests.services import free_port

WAIT_S = 60.0


def get(port: int, headers: dict[str, str] | None = None, host: str = "127.0.0.1") -> tuple[int, str]:
    req = urllib.request.Request(f"http://{host}:{port}/metrics", headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


@pytest.mark.parametrize("host", ["0.0.0.0", "::", ""])
def test_beyond_loopback_without_a_token_is_refused_before_listening(tmp_path: Path, host: str) -> None:
    db = write_ledger(tmp_path / "l.db", incident(now_ms()).events[:3])
    targets = tmp_path / "targets.toml"
    targets.write_text('[targets.payments]\nlookup = "none"\n[targets.tickets]\nlookup = "none"\n')
    port = free_port()
    cmd = [sys.executable, "-m", "effect_ledger", "run", "--db", str(db), "--targets", str(targets),
           "--metrics-port", str(port), "--metrics-host", host]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "EFFECTS_METRICS_TOKEN"}
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=WAIT_S, cwd=ROOT, env=env)
    assert r.returncode == 1, (r.stdout, r.stderr)
    (line,) = r.stderr.splitlines()
    assert line.startswith("effects: ") and "beyond loopback" in line and "--metrics-token" in line
    with pytest.raises(ConfigError, match="beyond loopback"):
        LedgerMetrics().serve(0, host)


@pytest.fixture
def guarded() -> Iterator[int]:
    server = LedgerMetrics().serve(0, "0.0.0.0", token="scrape-s3cret")
    yield server.server_port
    server.shutdown()
    server.server_close()


def test_with_a_token_a_scrape_must_carry_it(guarded: int) -> None:
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic c2NyYXBlLXMzY3JldA=="}):
        status, body = get(guarded, headers)
        assert status == 401 and "effect_ledger_" not in body, (headers, status)
    status, body = get(guarded, {"Authorization": "Bearer scrape-s3cret"})
    assert status == 200 and "effect_ledger_" in body


def test_silent_connections_are_bounded_and_let_go(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(metrics_http, "IO_TIMEOUT_S", 1.0)
    monkeypatch.setattr(metrics_http._Handler, "timeout", 1.0)
    server = LedgerMetrics().serve(0)
    port = server.server_port
    idle = []
    try:
        for _ in range(metrics_http.MAX_CONNECTIONS * 4):  # clients that connect and send nothing
            idle.append(socket.create_connection(("127.0.0.1", port), timeout=5))
        # The endpoint holds at most MAX_CONNECTIONS of them; once the silent ones are let go, a
        # scrape is answered again (waiting on that condition, with a deadline).
        end = time.monotonic() + WAIT_S
        while True:
            try:
                status, body = get(port)
                if status == 200:
                    break
            except OSError:
                pass
            assert time.monotonic() < end, "a scrape was never answered while idle connections were open"
            time.sleep(0.1)
        assert "effect_ledger_" in body
        # Every silent connection was closed by the endpoint (by the bound or by the timeout).
        closed = 0
        for s in idle:
            s.settimeout(WAIT_S)
            try:
                closed += s.recv(1) == b""
            except ConnectionResetError:
                closed += 1
        assert closed == len(idle)
        assert threading_count_of(server) == 0
    finally:
        for s in idle:
            s.close()
        server.shutdown()
        server.server_close()


def threading_count_of(server: metrics_http.MetricsServer) -> int:
    """Connections the endpoint still holds (its slots taken)."""
    end = time.monotonic() + WAIT_S
    while True:
        free = 0
        while server.slots.acquire(blocking=False):
            free += 1
        for _ in range(free):
            server.slots.release()
        held = metrics_http.MAX_CONNECTIONS - free
        if held == 0 or time.monotonic() > end:
            return held
        time.sleep(0.05)


def test_a_client_that_trickles_its_headers_is_let_go_all_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    """A read timeout alone restarts with every byte: a header line every 0.7 s kept a connection
    (and with 32 of them, every scrape) for ever. The whole connection has a deadline."""
    monkeypatch.setattr(metrics_http._Handler, "timeout", 1.5)
    server = LedgerMetrics().serve(0)
    try:
        s = socket.create_connection(("127.0.0.1", server.server_port), timeout=5)
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
        start = time.monotonic()
        cut = False
        while time.monotonic() - start < 10:
            try:
                s.sendall(b"X-Slow: 1\r\n")
            except OSError:
                cut = True
                break
            s.settimeout(0.5)
            try:
                if s.recv(1024) == b"":
                    cut = True
                    break
            except TimeoutError:
                pass
            except OSError:
                cut = True
                break
        assert cut, "the trickling client was still connected after 10 s"
        assert time.monotonic() - start < 5
        s.close()
    finally:
        server.shutdown()
        server.server_close()

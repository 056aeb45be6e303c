"""``effects mcp-proxy`` between the ``mcp`` package's real client and a real MCP server
(``tests/integrations/mcp_server.py``), over stdio and streamable HTTP.

The crash tests SIGKILL the proxy at a named crash point (``EFFECT_LEDGER_CRASH``), start a new
proxy on the same ledger file, retry the same call and count executions at the server.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mcp")

from mcp import Client, StdioServerParameters  # noqa: E402

from effect_ledger.sdk import crashpoints  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SERVER = [sys.executable, "-m", "tests.integrations.mcp_server"]
RUN = {"effect-ledger/runId": "run-42"}
REFUND = {"order": "A-1", "amount": 4800}
CALL_DEADLINE_S = 60

LOOKUP = """
[targets.payments]
lookup = "none"

[mcp.writes.refund]
target = "payments"
lookup_tool = "find_refund"
"""
HONOURS = """
[targets.payments]
lookup = "none"
honours_keys = true

[mcp.writes.refund]
target = "payments"
"""
NEITHER = """
[targets.payments]
lookup = "none"
"""


class Setup:
    def __init__(self, tmp: Path, targets: str, honours_keys: bool) -> None:
        self.tmp = tmp
        self.state = tmp / "server-state.json"
        self.db = tmp / "effects.db"
        self.targets = tmp / "targets.toml"
        self.targets.write_text(targets)
        self.env = {
            "MCP_TEST_STATE": str(self.state),
            "MCP_TEST_HONOURS_KEYS": "1" if honours_keys else "0",
            "PYTHONPATH": str(ROOT),
        }

    def proxy(self, *flags: str, crash: str | None = None) -> StdioServerParameters:
        env = dict(self.env)
        if crash:
            env[crashpoints.ENV] = crash
        args = ["-m", "effect_ledger.cli.main", "mcp-proxy", "--db", str(self.db), "--targets", str(self.targets)]
        return StdioServerParameters(command=sys.executable, args=[*args, *flags, "--", *SERVER], env=env, cwd=ROOT)

    def server_state(self) -> dict[str, Any]:
        return json.loads(self.state.read_text()) if self.state.exists() else {"executions": 0, "calls": 0}

    def effects(self) -> list[tuple[str, str]]:
        with sqlite3.connect(self.db) as db:
            return db.execute("SELECT operation, state FROM effects ORDER BY created_ms").fetchall()


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, CALL_DEADLINE_S))


async def call_refund(params: StdioServerParameters, meta: dict[str, Any] = RUN) -> Any:
    async with Client(params) as client:
        return await client.call_tool("refund", REFUND, meta=meta)


async def call_through_crash(params: StdioServerParameters) -> BaseException | None:
    """The agent's call while the proxy kills itself: the client sees the connection end."""
    try:
        await call_refund(params)
    except BaseException as e:  # the client reports the lost connection in its own way
        return e
    return None


def effect_meta(result: Any) -> dict[str, Any]:
    return dict((result.meta or {})["effect-ledger/effect"])


@pytest.mark.parametrize(
    ("targets", "honours", "asked"),
    [(LOOKUP, False, {"calls": 1, "lookups": 1}), (HONOURS, True, {"calls": 2, "lookups": 0})],
    ids=["lookup-tool", "server-honours-key"],
)
def test_proxy_killed_after_the_server_executed_then_retry_executes_once(
    tmp_path: Path, targets: str, honours: bool, asked: dict[str, int]
) -> None:
    s = Setup(tmp_path, targets, honours_keys=honours)
    err = run(call_through_crash(s.proxy(crash=crashpoints.AFTER_CALL)))
    assert err is not None, "the proxy should have died before answering"
    assert s.server_state()["executions"] == 1
    assert s.effects() == [("refund", "PENDING")]  # the intent, and nothing after it

    result = run(call_refund(s.proxy()))  # a new proxy, the same call

    assert not result.is_error, result.content
    assert result.structured_content["refund_id"] == "rf_1"
    meta = effect_meta(result)
    assert meta["called"] is False and meta["source"] == "RECONCILER"
    state = s.server_state()
    assert state["executions"] == 1
    # asked through the lookup tool, or by replaying the key to a server that deduplicates it
    assert {k: state[k] for k in asked} == asked
    assert s.effects() == [("refund", "CONFIRMED")]


def test_retry_after_the_result_was_recorded_does_not_call_the_server(tmp_path: Path) -> None:
    s = Setup(tmp_path, NEITHER, honours_keys=False)
    assert run(call_through_crash(s.proxy("--writes", "refund", crash=crashpoints.AFTER_EXECUTED))) is not None

    result = run(call_refund(s.proxy("--writes", "refund")))

    assert result.structured_content["refund_id"] == "rf_1"
    assert effect_meta(result)["called"] is False
    assert s.server_state()["calls"] == 1  # the retry never reached the server
    assert s.effects() == [("refund", "CONFIRMED")]


def test_uncertain_call_is_a_tool_error_that_says_so(tmp_path: Path) -> None:
    s = Setup(tmp_path, NEITHER, honours_keys=False)  # no lookup tool, and the server ignores keys
    assert run(call_through_crash(s.proxy("--writes", "refund", crash=crashpoints.AFTER_CALL))) is not None

    result = run(call_refund(s.proxy("--writes", "refund")))

    assert result.is_error
    text = result.content[0].text
    meta = effect_meta(result)
    assert meta["state"] == "ESCALATED" and meta["id"].startswith("payments:")
    assert meta["id"] in text and "effects resolve" in text and "not called again" in text
    assert s.server_state() == {**s.server_state(), "executions": 1, "calls": 1}


def test_new_step_is_a_new_call_and_reads_pass_through_unrecorded(tmp_path: Path) -> None:
    s = Setup(tmp_path, LOOKUP, honours_keys=False)

    async def agent() -> dict[str, Any]:
        async with Client(s.proxy()) as client:
            tools = await client.list_tools()
            resource = await client.read_resource("test://policy")
            prompt = await client.get_prompt("apologise")
            balance = await client.call_tool("balance", {"order": "A-1"})
            first = await client.call_tool("refund", REFUND, meta=RUN)
            again = await client.call_tool("refund", REFUND, meta=RUN)
            other = await client.call_tool("refund", REFUND, meta={**RUN, "effect-ledger/stepId": "second"})
            refused = await client.call_tool("refund", {"order": "A-2", "amount": 0}, meta=RUN)
            return locals()

    r = run(agent())
    assert [t.name for t in r["tools"].tools] == ["refund", "find_refund", "balance"]
    assert r["resource"].contents[0].text == "refunds within 30 days"
    assert r["prompt"].messages[0].content.text == "Say sorry for the delay."
    assert json.loads(r["balance"].content[0].text) == {"order": "A-1", "balance": 4800}
    assert r["balance"].meta is None or "effect-ledger/effect" not in r["balance"].meta  # not recorded
    assert r["again"].structured_content == r["first"].structured_content  # same args, same run: one call
    assert effect_meta(r["again"])["called"] is False
    assert r["other"].structured_content["refund_id"] == "rf_2"  # its own step: a new call
    assert r["refused"].is_error and "amount must be positive" in r["refused"].content[0].text
    assert s.server_state()["executions"] == 2
    assert sorted(s.effects()) == [("refund", "CONFIRMED"), ("refund", "CONFIRMED"), ("refund", "FAILED")]


def test_bad_declaration_is_one_line_and_exit_1(tmp_path: Path) -> None:
    s = Setup(tmp_path, NEITHER, honours_keys=False)
    cmd = [sys.executable, "-m", "effect_ledger.cli.main", "mcp-proxy", "--db", str(s.db)]
    out = subprocess.run(
        [*cmd, "--targets", str(s.targets), "--writes", "refund", "--target", "nope", "--", *SERVER],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=CALL_DEADLINE_S,
    )
    assert out.returncode == 1
    assert out.stderr.strip().splitlines() == ["effects: --target 'nope' is not declared in the targets file"]
    assert not s.db.exists()


# -- streamable HTTP -----------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_listening(port: int, deadline: float) -> None:
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)  # polling a port with a deadline, not waiting for time to pass


@pytest.fixture
def http_proxy(tmp_path: Path) -> Iterator[tuple[Setup, str]]:
    s = Setup(tmp_path, LOOKUP, honours_keys=True)
    port = _free_port()
    server = subprocess.Popen(SERVER, env={**os.environ, **s.env, "MCP_TEST_HTTP_PORT": str(port)}, cwd=ROOT)
    cmd = [sys.executable, "-m", "effect_ledger.cli.main", "mcp-proxy", "--db", str(s.db)]
    proxy = subprocess.Popen(
        [*cmd, "--targets", str(s.targets), "--upstream", f"http://127.0.0.1:{port}/mcp", "--port", "0"],
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    try:
        assert proxy.stderr is not None
        # The proxy first says which policy each write tool runs under, then where it listens.
        for _ in range(100):
            banner = proxy.stderr.readline()
            if not banner or "listening on" in banner:
                break
        found = re.search(r"listening on (http://127\.0\.0\.1:\d+/mcp)", banner)
        assert found, banner
        _wait_listening(port, time.monotonic() + 30)
        yield s, found.group(1)
    finally:
        for p in (proxy, server):
            p.terminate()
            p.wait(timeout=30)


@pytest.mark.parametrize("mode", ["auto", "legacy"])
def test_http_passes_through_and_records_writes(http_proxy: tuple[Setup, str], mode: str) -> None:
    s, url = http_proxy

    async def agent() -> dict[str, Any]:
        async with Client(url, mode=mode) as client:
            tools = await client.list_tools()
            balance = await client.call_tool("balance", {"order": "A-1"})
            first = await client.call_tool("refund", REFUND, meta=RUN)
            again = await client.call_tool("refund", REFUND, meta=RUN)
            return locals()

    r = run(agent())
    assert "refund" in [t.name for t in r["tools"].tools]
    assert json.loads(r["balance"].content[0].text)["balance"] == 4800
    assert effect_meta(r["first"])["called"] is True
    assert effect_meta(r["again"])["called"] is False
    assert r["again"].structured_content == r["first"].structured_content
    assert s.server_state()["executions"] == 1
    assert s.effects() == [("refund", "CONFIRMED")]

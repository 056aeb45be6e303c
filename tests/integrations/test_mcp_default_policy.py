"""The MCP proxy's safe default, with the ``mcp`` package's real client and a real MCP server
(``tests/integrations/mcp_server.py``): the proxy is SIGKILLed after the server paid, a new proxy is
started without any run id (neither ``--run-id`` nor ``_meta``), the agent repeats the same call, and
the server has paid once. Before issue 34 the new proxy's new MCP session minted a new key and paid
again; a tool declared ``repeats = "per-session"`` still does, which the last test shows, so that this
test could see a second payment."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mcp")

from effect_ledger.sdk import crashpoints  # noqa: E402
from tests.integrations.test_mcp_proxy import (  # noqa: E402
    CALL_DEADLINE_S,
    HONOURS,
    LOOKUP,
    ROOT,
    SERVER,
    Setup,
    call_refund,
    effect_meta,
    run,
)

NO_RUN: dict[str, str] = {}  # the agent sends no run id, step or key: only the arguments say which call


async def _through_crash(s: Setup) -> BaseException | None:
    try:
        await call_refund(s.proxy(crash=crashpoints.AFTER_CALL), meta=NO_RUN)
    except BaseException as e:  # the client reports the lost connection in its own way
        return e
    return None


@pytest.mark.parametrize(
    ("targets", "honours"), [(LOOKUP, False), (HONOURS, True)], ids=["lookup-tool", "server-honours-key"]
)
def test_restarted_proxy_without_a_run_id_pays_once(tmp_path: Path, targets: str, honours: bool) -> None:
    s = Setup(tmp_path, targets, honours_keys=honours)
    assert run(_through_crash(s)) is not None, "the proxy should have died before answering"
    assert s.server_state()["executions"] == 1  # the server paid; nothing about it was recorded

    result = run(call_refund(s.proxy(), meta=NO_RUN))  # a new proxy, a new session, the same call

    assert not result.is_error, result.content
    assert result.structured_content["refund_id"] == "rf_1"  # the first payment's own id
    meta = effect_meta(result)
    assert (meta["called"], meta["keyFrom"]) == (False, "arguments-window")
    assert s.server_state()["executions"] == 1
    assert s.effects() == [("refund", "CONFIRMED")]


def test_the_proxy_says_which_policy_each_write_tool_runs_under(tmp_path: Path) -> None:
    s = Setup(tmp_path, LOOKUP, honours_keys=False)
    cmd = [sys.executable, "-m", "effect_ledger.cli.main", "mcp-proxy", "--db", str(s.db), "--targets", str(s.targets)]
    out = subprocess.run(
        [*cmd, "--", *SERVER], input="", capture_output=True, text=True, cwd=ROOT, env={**os.environ, **s.env},
        timeout=CALL_DEADLINE_S,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr  # no agent: stdin ends, the proxy stops
    said = [line for line in out.stderr.splitlines() if line.startswith("effects mcp-proxy: write tool")]
    assert said == [
        "effects mcp-proxy: write tool 'refund' -> target 'payments' (operation 'refund'): a call repeating the "
        "same arguments within 24h is the same effect, across proxy restarts, unless the agent sends its own "
        "runId, stepId or idempotencyKey"
    ]


def test_per_session_opt_out_pays_again_and_says_so(tmp_path: Path) -> None:
    s = Setup(tmp_path, LOOKUP.replace('lookup_tool = "find_refund"', 'repeats = "per-session"'), honours_keys=False)
    assert run(_through_crash(s)) is not None

    result = run(call_refund(s.proxy(), meta=NO_RUN))

    assert not result.is_error and result.structured_content["refund_id"] == "rf_2"
    assert s.server_state()["executions"] == 2  # what the default prevents
    assert sorted(s.effects()) == [("refund", "CONFIRMED"), ("refund", "PENDING")]

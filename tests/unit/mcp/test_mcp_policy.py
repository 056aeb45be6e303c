"""The MCP proxy's declarations, key rule (pinned: never change it silently), lookup mapping and
bounded line reader. No MCP SDK needed."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from effect_ledger.core.keys import effect_key
from effect_ledger.core.reconcile import Absent, Found, Unknown
from effect_ledger.errors import InvalidEffect, TargetsError
from effect_ledger.mcp.calls import lookup_answer
from effect_ledger.mcp.policy import WriteTool, call_identity, load_policy
from effect_ledger.mcp.wire import read_lines
from effect_ledger.targets.load import parse_targets

REFUND = WriteTool("refund", "payments", "refund", lookup_tool="find_refund")
ARGS = {"order": "A-1", "amount": 4800}


def key_of(meta: dict[str, str], args: object = ARGS, session: str = "stdio:s1") -> str:
    ident = call_identity(REFUND, args, meta, session)
    if ident.key is not None:
        return ident.key
    assert ident.run_id and ident.step
    return effect_key(REFUND.target, REFUND.operation, ident.run_id, ident.step)


def test_key_rule_vectors() -> None:
    run = {"effect-ledger/runId": "run-42"}
    assert key_of(run) == "payments:5ffa1dc7cd3d3c9f3dbad09ce181c18b8bd257ceb1f85c58c9c2121fdbdd466c"
    step = {**run, "effect-ledger/stepId": "refund-A-1"}
    assert key_of(step) == "payments:7ddd9993628448c0c33c05374306cf2e632c3807591c6086b8b340b4977e303f"
    assert key_of({"idempotencyKey": "agent-key-1"}) == "agent-key-1"


def test_retry_same_key_new_call_new_key() -> None:
    run = {"effect-ledger/runId": "run-42"}
    assert key_of(run, {"amount": 4800, "order": "A-1"}) == key_of(run)  # argument order does not matter
    assert key_of(run, {**ARGS, "amount": 1}) != key_of(run)  # other arguments: another call
    assert key_of({**run, "effect-ledger/stepId": "2"}) != key_of(run)  # its own step: another call
    assert key_of(run, session="stdio:s2") == key_of(run)  # the run outlives the session
    assert key_of({}, session="stdio:s2") != key_of({})  # without a run: the session scopes it


def test_bad_meta_is_refused() -> None:
    with pytest.raises(InvalidEffect, match="idempotencyKey"):
        call_identity(REFUND, ARGS, {"idempotencyKey": "has space"}, "s")
    with pytest.raises(InvalidEffect, match="runId"):
        call_identity(REFUND, ARGS, {"effect-ledger/runId": 7}, "s")


TARGETS = """
[targets.payments]
lookup = "none"

[targets.mail]
lookup = "none"

[mcp.writes.refund]
target = "payments"
lookup_tool = "find_refund"
timeout = "30s"
"""


def test_declarations_from_file_and_flags(tmp_path: Path) -> None:
    f = tmp_path / "targets.toml"
    f.write_text(TARGETS)
    assert [t.name for t in parse_targets(TARGETS)] == ["payments", "mail"]  # [mcp] is not a mistake
    p = load_policy(f, ["payments", "mail"], writes=["send_email"], target="mail", lookups=["send_email=find_mail"])
    assert p.writes["refund"] == WriteTool("refund", "payments", "refund", "find_refund", timeout_s=30.0)
    assert p.writes["send_email"].target == "mail" and p.writes["send_email"].lookup_tool == "find_mail"
    assert p.write("balance") is None


@pytest.mark.parametrize(
    ("extra", "flags", "message"),
    [
        ('[mcp.writes.x]\ntarget = "nope"\n', {}, "target 'nope' is not declared"),
        ('[mcp.writes.x]\ntarget = "mail"\ncolour = 1\n', {}, "unknown setting 'colour'"),
        ('[mcp.writes."a/b"]\ntarget = "mail"\n', {}, "set operation"),
        ('[mcp.writes.x]\ntarget = "mail"\ntool_errors = "maybe"\n', {}, "tool_errors"),
        ("", {"writes": ["x"]}, "--writes needs --target"),
        ("", {"lookups": ["x=y"]}, "not declared as a write tool"),
    ],
)
def test_declaration_mistakes(tmp_path: Path, extra: str, flags: dict[str, list[str]], message: str) -> None:
    f = tmp_path / "targets.toml"
    f.write_text(TARGETS + extra)
    with pytest.raises(TargetsError, match=message):
        load_policy(f, ["payments", "mail"], **flags)  # type: ignore[arg-type]


def test_lookup_mapping() -> None:
    def answer(result: object) -> object:
        return lookup_answer(REFUND, {"jsonrpc": "2.0", "id": 1, "result": result})

    found = answer({"content": [], "structuredContent": {"found": True, "id": "rf_1", "record": {"refund_id": "rf_1"}}})
    assert isinstance(found, Found) and found.receipt_id == "rf_1"
    assert found.value["structuredContent"] == {"refund_id": "rf_1"}
    assert isinstance(answer({"content": [], "structuredContent": {"found": False}}), Absent)
    assert isinstance(answer({"content": [], "structuredContent": {"refund": None}}), Unknown)
    assert isinstance(answer({"content": [{"type": "text", "text": "db down"}], "isError": True}), Unknown)
    assert isinstance(lookup_answer(REFUND, {"id": 1, "error": {"code": -32601, "message": "no"}}), Unknown)


def test_read_lines_skips_a_line_over_the_limit() -> None:
    async def lines(data: bytes) -> list[bytes | None]:
        reader = asyncio.StreamReader()
        reader.feed_data(data)
        reader.feed_eof()
        return [line async for line in read_lines(reader, limit=8)]

    assert asyncio.run(lines(b"one\n" + b"x" * 100 + b"\ntwo\nlast")) == [b"one", None, b"two", b"last"]


def test_late_answer_to_an_abandoned_request_is_dropped() -> None:
    from effect_ledger.mcp.wire import Pending

    async def scenario() -> tuple[bool, bool, bool]:
        pending = Pending()
        fut = pending.expect(7)
        pending.release(7)  # the deadline passed: the agent was told the outcome is unknown
        assert fut.cancelled()
        late = pending.deliver({"jsonrpc": "2.0", "id": 7, "result": {}})
        again = pending.deliver({"jsonrpc": "2.0", "id": 7, "result": {}})
        other = pending.deliver({"jsonrpc": "2.0", "id": "7", "result": {}})
        return late, again, other

    assert asyncio.run(scenario()) == (True, False, False)

"""The MCP proxy's safe default (issue 34): a write tool's call that repeats the same tool and
canonical arguments within the tool's repeat window is the same effect, whichever MCP session (or
restarted proxy) it comes through, unless the agent names its own run, step or key, the proxy has
a --run-id, or the tool is declared ``repeats = "per-session"``. The key rule of a windowed call is
pinned here: NEVER CHANGE IT SILENTLY."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from effect_ledger.core.keys import effect_key
from effect_ledger.core.reconcile import Target
from effect_ledger.errors import TargetsError
from effect_ledger.mcp.calls import WriteCalls
from effect_ledger.mcp.policy import (
    WINDOW_RUN,
    CallIdentity,
    Policy,
    WriteTool,
    call_identity,
    load_policy,
    window_identity,
    windowed,
)
from effect_ledger.sdk.ledger import Ledger
from tests.sdk_contract import FakeClock

REFUND = WriteTool("refund", "payments", "refund")
ARGS = {"order": "A-1", "amount": 4800}
HOUR_MS = 3600 * 1000


def _key(ident: CallIdentity) -> str:
    assert ident.run_id is not None and ident.step is not None
    return effect_key(REFUND.target, REFUND.operation, ident.run_id, ident.step)


def test_windowed_key_rule_vectors() -> None:
    base = call_identity(REFUND, ARGS, {}, "stdio:session-1")
    other_session = call_identity(REFUND, {"amount": 4800, "order": "A-1"}, {}, "stdio:session-2")
    first, second = window_identity(base, 0), window_identity(base, 2)
    assert window_identity(other_session, 0) == first  # no session in it: a restarted proxy finds it
    assert (first.run_id, first.source) == (WINDOW_RUN, "arguments-window")
    assert _key(first) == "payments:9ec1af768d4fa1649465b12feb2c143345bdeaf99b860ae910eb7fc54821d6b9"
    assert _key(second) == "payments:703cf0ae4ebcce10eed79272f6102337f178af31cbd0cd6b0d36983c76ad2467"


def test_which_calls_are_windowed() -> None:
    assert windowed(REFUND, {}, None)
    assert not windowed(REFUND, {}, "run-from-flag")  # --run-id scopes keys as before
    for meta in ({"effect-ledger/runId": "r"}, {"effect-ledger/stepId": "s"}, {"idempotencyKey": "k"}):
        assert not windowed(REFUND, meta, None)  # the agent said which call it is
    assert not windowed(WriteTool("refund", "payments", "refund", repeats="per-session"), {}, None)


def test_the_policy_says_which_rule_each_tool_runs_under(tmp_path: Path) -> None:
    f = tmp_path / "targets.toml"
    f.write_text(
        '[targets.payments]\nlookup = "none"\n\n[mcp.writes.refund]\ntarget = "payments"\nrepeat_window = "10m"\n'
        '\n[mcp.writes.note]\ntarget = "payments"\nrepeats = "per-session"\n'
    )
    p = load_policy(f, ["payments"])
    assert (p.writes["refund"].repeats, p.writes["refund"].repeat_window_s) == ("same-effect", 600.0)
    assert "same arguments within 10m is the same effect" in p.writes["refund"].describe(None)
    assert "may execute twice" in p.writes["note"].describe(None)
    assert "--run-id 'r1'" in p.writes["refund"].describe("r1")
    f.write_text('[targets.payments]\nlookup = "none"\n[mcp.writes.refund]\ntarget = "payments"\nrepeats = "x"\n')
    with pytest.raises(TargetsError, match="repeats must be one of same-effect, per-session"):
        load_policy(f, ["payments"])


def test_a_repeat_within_the_window_is_the_same_effect_and_after_it_a_new_one(tmp_path: Path) -> None:
    async def scenario() -> list[int]:
        clock = FakeClock()
        ledger = await Ledger.open(str(tmp_path / "effects.db"), targets=[Target("payments")], clock=clock)
        async with ledger:
            calls = WriteCalls(ledger, Policy({"refund": REFUND}))
            base = call_identity(REFUND, ARGS, {}, "stdio:s")
            seen = []

            async def call_now() -> int:
                ident = await calls._in_window(REFUND, base)
                gen = next(g for g in range(64) if window_identity(base, g) == ident)
                await ledger.execute(
                    target="payments", operation="refund", request=ARGS, call=lambda key: {"id": key},
                    run_id=ident.run_id, step=ident.step,
                )  # fmt: skip
                return gen

            seen.append(await call_now())  # the first call
            clock.advance(23 * HOUR_MS)
            seen.append(await call_now())  # within 24 h of the first: the same effect
            clock.advance(2 * HOUR_MS)
            seen.append(await call_now())  # 25 h after the first began: a new effect
            for _ in range(5):  # many windows later: found with a few reads, not one per window
                clock.advance(25 * HOUR_MS)
                seen.append(await call_now())
            return seen

    assert asyncio.run(scenario()) == [0, 0, 1, 2, 3, 4, 5, 6]

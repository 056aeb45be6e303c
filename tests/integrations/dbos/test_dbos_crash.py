"""Real DBOS on a SQLite system database: a child process is SIGKILLed inside the refund step right
after the gateway committed; a new process launches DBOS, which recovers the pending workflow."""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from effect_ledger import State, SyncLedger, effect_key
from effect_ledger.demo.gateway import Gateway
from effect_ledger.sdk import crashpoints
from tests.integrations.gateway_http import run_child

APP = "tests.integrations.dbos.app"
WORKFLOW = "refund-order-123"
# The key rule of effect_ledger.dbos: the workflow id and the step function's name.
KEY = effect_key("payments", "refund.create", WORKFLOW, "refund")


@pytest.fixture
def gateway(request: pytest.FixtureRequest) -> Iterator[Gateway]:
    with Gateway(request.param) as gw:
        yield gw


def app(gw: Gateway, workdir: Path, action: str, *extra: str, crash: str | None = None) -> tuple[int, Any]:
    args = ["--workdir", str(workdir), "--gateway", gw.url, "--kind", gw.state.kind, "--workflow", WORKFLOW]
    return run_child(APP, [*args, action, *extra], crash=crash)


def ledger_state(workdir: Path) -> State | None:
    with SyncLedger.open(str(workdir / "effects.db"), targets=str(workdir / "targets.toml")) as ledger:
        effect = ledger.get(KEY)
        return effect.state if effect else None


@pytest.mark.parametrize("gateway", ["lookup", "key+lookup"], indirect=True)
def test_killed_after_the_call_recovers_without_a_second_refund(gateway: Gateway, tmp_path: Path) -> None:
    code, _ = app(gateway, tmp_path, "start", crash=crashpoints.AFTER_CALL)
    assert code == -signal.SIGKILL
    assert len(gateway.refunds()) == 1
    assert ledger_state(tmp_path) is State.PENDING  # the outcome died with the process

    code, out = app(gateway, tmp_path, "recover")
    assert code == 0, out
    refunds = gateway.refunds()
    assert len(refunds) == 1
    assert out["status"] == "SUCCESS"
    assert out["result"] == {"refund_id": refunds[0].id, "called": False, "key": KEY}
    assert refunds[0].idempotency_key == KEY
    assert ledger_state(tmp_path) is State.CONFIRMED


@pytest.mark.parametrize("gateway", ["none"], indirect=True)
def test_escalation_waits_for_a_decision_across_restarts(gateway: Gateway, tmp_path: Path) -> None:
    """Nobody can ask the gateway: the recovered workflow publishes the escalation and waits; its
    worker goes away; a new one recovers it again, a person's decision arrives, the workflow ends."""
    code, _ = app(gateway, tmp_path, "start", crash=crashpoints.AFTER_CALL)
    assert code == -signal.SIGKILL
    code, out = app(gateway, tmp_path, "escalation")
    assert code == 0, out
    asked = out["escalation"]
    assert (asked["effect_ledger"], asked["effect_id"]) == ("escalated", KEY)
    assert asked["request"] == {"order": "123", "amount": 4800} and "no reconciler" in asked["reason"]
    assert ledger_state(tmp_path) is State.ESCALATED

    [made] = gateway.refunds()  # the person finds it in the gateway's dashboard
    answer = {"decision": "confirmed", "by": "alice", "reason": "in the dashboard", "receipt_id": made.id}
    code, out = app(gateway, tmp_path, "decide", json.dumps(answer))
    assert code == 0, out
    assert out["status"] == "SUCCESS"
    assert out["result"] == {"refund_id": made.id, "called": False, "key": KEY}
    assert len(gateway.refunds()) == 1
    assert ledger_state(tmp_path) is State.CONFIRMED

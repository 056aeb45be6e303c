"""Real LangGraph (a StateGraph checkpointed by SqliteSaver in real files), run in child processes
that are SIGKILLed inside the refund node, then resumed on the same thread in a new process."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from effect_ledger import State, SyncLedger, effect_key
from effect_ledger.core.deadlines import DECISION_GRACE_MS
from effect_ledger.core.model import Decision, DecisionKind
from effect_ledger.demo.gateway import Gateway
from effect_ledger.sdk import crashpoints
from tests.integrations.gateway_http import run_child
from tests.services import wait_for

APP = "tests.integrations.langgraph.app"
THREAD = "thread-7"
# The key rule of effect_ledger.langgraph: the thread id and the node's path ("refund").
KEY = effect_key("payments", "refund.create", THREAD, "refund")


@pytest.fixture
def gateway(request: pytest.FixtureRequest) -> Iterator[Gateway]:
    with Gateway(request.param) as gw:
        yield gw


def graph(gw: Gateway, workdir: Path, action: str, *extra: str, crash: str | None = None) -> tuple[int, Any]:
    args = ["--workdir", str(workdir), "--gateway", gw.url, "--kind", gw.state.kind, "--thread", THREAD, action]
    return run_child(APP, [*args, *extra], crash=crash)


def ledger_state(workdir: Path) -> Any:
    with SyncLedger.open(str(workdir / "effects.db"), targets=str(workdir / "targets.toml")) as ledger:
        return ledger.get(KEY)


@pytest.mark.parametrize("gateway", ["lookup", "key+lookup"], indirect=True)
def test_killed_after_the_call_resumes_without_a_second_refund(gateway: Gateway, tmp_path: Path) -> None:
    code, _ = graph(gateway, tmp_path, "start", crash=crashpoints.AFTER_CALL)
    assert code == -signal.SIGKILL
    assert len(gateway.refunds()) == 1
    assert ledger_state(tmp_path).state is State.PENDING  # the outcome died with the process

    code, out = graph(gateway, tmp_path, "resume")
    assert code == 0, out
    assert out["next"] == [] and out["interrupts"] == []
    assert out["values"]["status"] == "refunded" and out["values"]["notified"] is True
    assert out["values"]["called"] is False  # reconciled with the gateway, not called again
    refunds = gateway.refunds()
    assert len(refunds) == 1
    assert out["values"]["refund_id"] == refunds[0].id
    assert refunds[0].idempotency_key == KEY
    assert ledger_state(tmp_path).state is State.CONFIRMED


def _escalate(gw: Gateway, workdir: Path, crash: str) -> dict[str, Any]:
    """Start, kill at ``crash``, resume: the graph stops at the effect's interrupt."""
    code, _ = graph(gw, workdir, "start", crash=crash)
    assert code == -signal.SIGKILL
    code, out = graph(gw, workdir, "resume")
    assert code == 0, out
    assert out["next"] == ["refund"]
    [asked] = out["interrupts"]
    assert asked["effect_ledger"] == "escalated" and asked["effect_id"] == KEY
    assert asked["request"] == {"order": "123", "amount": 4800}
    assert "no reconciler" in asked["reason"]
    assert set(asked["decide"]) == {"confirmed", "absent", "abandon"}
    assert ledger_state(workdir).state is State.ESCALATED
    return asked


def _decided(workdir: Path) -> Decision:
    [d] = [f for f in ledger_state(workdir).facts if isinstance(f, Decision)]
    return d


@pytest.mark.parametrize("gateway", ["none"], indirect=True)
def test_escalation_confirmed_by_a_person(gateway: Gateway, tmp_path: Path) -> None:
    _escalate(gateway, tmp_path, crashpoints.AFTER_CALL)
    [made] = gateway.refunds()  # the person looks it up in the gateway's dashboard
    answer = f'{{"decision": "confirmed", "by": "alice", "reason": "in the dashboard", "receipt_id": "{made.id}"}}'
    code, out = graph(gateway, tmp_path, "decide", answer)
    assert code == 0, out
    assert out["next"] == [] and out["values"]["notified"] is True
    assert (out["values"]["status"], out["values"]["refund_id"]) == ("refunded", made.id)
    assert len(gateway.refunds()) == 1
    d = _decided(tmp_path)
    assert (d.decision, d.by, d.receipt_id) == (DecisionKind.CONFIRMED, "alice", made.id)
    assert ledger_state(tmp_path).state is State.CONFIRMED


@pytest.mark.parametrize("gateway", ["none"], indirect=True)
def test_escalation_decided_absent_executes_with_the_same_key(gateway: Gateway, tmp_path: Path) -> None:
    _escalate(gateway, tmp_path, crashpoints.AFTER_INTENT)
    assert gateway.refunds() == []  # killed before the call: the person sees nothing at the gateway
    # "Absent" is refused while the attempt could still land: the person answers after its deadline.
    deadline = ledger_state(tmp_path).intent.deadline_ms + DECISION_GRACE_MS
    wait_for(lambda: time.time() * 1000 > deadline, 30, "the attempt's deadline (and its grace) to pass")
    code, out = graph(gateway, tmp_path, "decide", '{"decision": "absent", "by": "bob", "reason": "not there"}')
    assert code == 0, out
    assert out["next"] == [] and out["values"]["status"] == "refunded" and out["values"]["called"] is True
    [made] = gateway.refunds()
    assert made.idempotency_key == KEY and out["values"]["refund_id"] == made.id
    assert _decided(tmp_path).decision is DecisionKind.ABSENT
    assert ledger_state(tmp_path).state is State.CONFIRMED


@pytest.mark.parametrize("gateway", ["none"], indirect=True)
def test_escalation_abandoned_closes_the_effect(gateway: Gateway, tmp_path: Path) -> None:
    _escalate(gateway, tmp_path, crashpoints.AFTER_CALL)
    code, out = graph(gateway, tmp_path, "decide", '{"decision": "abandon", "by": "carol", "reason": "refund by hand"}')
    assert code == 0, out
    assert out["next"] == [] and out["values"]["status"] == "abandoned" and out["values"]["notified"] is True
    assert len(gateway.refunds()) == 1  # the one the killed process made; nothing more
    assert _decided(tmp_path).decision is DecisionKind.ABANDONED
    assert ledger_state(tmp_path).state is State.ABANDONED

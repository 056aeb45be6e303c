"""Real Pydantic AI (an Agent driven by FunctionModel, its messages saved as it runs, deferred tool
approvals), run in child processes that are SIGKILLed right after the gateway committed the refund,
then run again on the saved messages in a new process: Pydantic AI tells the model the call was cut
off, and the model calls the tool again, with a new tool_call_id."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from effect_ledger import State, effect_key
from effect_ledger.core.deadlines import DECISION_GRACE_MS
from effect_ledger.demo.gateway import Gateway
from effect_ledger.sdk import crashpoints
from tests.integrations.agent_crash import TRIAL_TIMEOUT_S, AgentApp, crash_trials, report
from tests.services import wait_for

RUN = "conv-7"
APP = AgentApp("tests.integrations.pydantic_ai.app", RUN)
# The key rule of effect_ledger.pydantic_ai: the conversation_id and the tool's name.
KEY = effect_key("payments", "refund.create", RUN, "refund")


@pytest.fixture
def gateway(request: pytest.FixtureRequest) -> Iterator[Gateway]:
    with Gateway(request.param) as gw:
        yield gw


@pytest.mark.parametrize("gateway", ["lookup", "key+lookup"], indirect=True)
def test_killed_after_the_call_resumes_without_a_second_refund(gateway: Gateway, tmp_path: Path) -> None:
    code, _ = APP(gateway, tmp_path, "start", crash=crashpoints.AFTER_CALL)
    assert code == -signal.SIGKILL
    assert len(gateway.refunds()) == 1
    assert APP.effect(tmp_path, KEY).state is State.PENDING  # the outcome died with the process

    code, out = APP(gateway, tmp_path, "resume")
    assert code == 0, out
    [made] = gateway.refunds()
    assert made.idempotency_key == KEY
    assert out["asked"] is None and made.id in out["output"]  # the run completed with the gateway's receipt
    assert [r["id"] for r in out["refunds"]] == [made.id]
    assert APP.effect(tmp_path, KEY).state is State.CONFIRMED


@pytest.mark.timeout(TRIAL_TIMEOUT_S)
def test_crash_trials_with_and_without_the_ledger() -> None:
    with_ledger = crash_trials(APP, "lookup", plain=False)
    plain = crash_trials(APP, "lookup", plain=True)
    report("pydantic-ai", with_ledger, plain)
    assert with_ledger.duplicates == 0
    assert with_ledger.completed_with_receipt == with_ledger.runs
    # A plain tool keyed by the model's tool_call_id: the rerun's call has a new id, so a second refund.
    assert plain.duplicates == plain.runs


def _escalate(gw: Gateway, workdir: Path, crash: str) -> dict[str, Any]:
    """Start, kill at ``crash``, resume: the run stops with the tool call waiting for approval."""
    code, _ = APP(gw, workdir, "start", crash=crash)
    assert code == -signal.SIGKILL
    code, out = APP(gw, workdir, "resume")
    assert code == 0, out
    asked = out["asked"]
    assert out["output"] is None and asked["effect_ledger"] == "escalated" and asked["effect_id"] == KEY
    assert asked["request"] == {"order": "123", "amount": 4800} and "no reconciler" in asked["reason"]
    assert APP.effect(workdir, KEY).state is State.ESCALATED
    return asked


@pytest.mark.parametrize("gateway", ["none"], indirect=True)
def test_escalation_confirmed_by_a_person(gateway: Gateway, tmp_path: Path) -> None:
    _escalate(gateway, tmp_path, crashpoints.AFTER_CALL)
    [made] = gateway.refunds()  # the person finds it in the gateway's dashboard
    answer = {"decision": "confirmed", "by": "alice", "reason": "in the dashboard", "receipt_id": made.id}
    code, out = APP(gateway, tmp_path, "decide", json.dumps(answer))
    assert code == 0, out
    assert out["asked"] is None and made.id in out["output"]
    assert len(gateway.refunds()) == 1
    effect = APP.effect(tmp_path, KEY)
    assert effect.state is State.CONFIRMED and effect.receipt.receipt_id == made.id


@pytest.mark.parametrize("gateway", ["none"], indirect=True)
def test_escalation_decided_absent_executes_with_the_same_key(gateway: Gateway, tmp_path: Path) -> None:
    _escalate(gateway, tmp_path, crashpoints.AFTER_INTENT)
    assert gateway.refunds() == []  # killed before the call: the person sees nothing at the gateway
    # "Absent" is refused while the attempt could still land: the person answers after its deadline.
    deadline = APP.effect(tmp_path, KEY).intent.deadline_ms + DECISION_GRACE_MS
    wait_for(lambda: time.time() * 1000 > deadline, 30, "the attempt's deadline (and its grace) to pass")
    code, out = APP(gateway, tmp_path, "decide", '{"decision": "absent", "by": "bob", "reason": "not there"}')
    assert code == 0, out
    [made] = gateway.refunds()
    assert made.idempotency_key == KEY and made.id in out["output"]
    assert APP.effect(tmp_path, KEY).state is State.CONFIRMED


@pytest.mark.parametrize("gateway", ["none"], indirect=True)
def test_escalation_abandoned_denies_the_call(gateway: Gateway, tmp_path: Path) -> None:
    _escalate(gateway, tmp_path, crashpoints.AFTER_CALL)
    code, out = APP(gateway, tmp_path, "decide", '{"decision": "abandon", "by": "carol", "reason": "by hand"}')
    assert code == 0, out
    assert len(gateway.refunds()) == 1  # the one the killed process made; nothing more
    assert "Not refunded" in out["output"] and "abandoned" in out["output"]
    assert out["refunds"] == []  # the tool did not run: the model was told it was denied
    assert APP.effect(tmp_path, KEY).state is State.ABANDONED

"""Real Microsoft Agent Framework (an agent in a checkpointed workflow, a fake chat client that
always calls the refund tool): a child SIGKILLed right after the gateway committed the refund,
before the framework recorded the tool's result; a new process runs the workflow again from its
latest checkpoint (the superstep is replayed). With effect-ledger: one refund and the workflow
ends with the gateway's receipt. With a plain @tool: a second refund every time."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from effect_ledger import State, SyncLedger, effect_key
from effect_ledger.demo.gateway import Gateway
from effect_ledger.sdk import crashpoints
from tests.integrations.gateway_http import run_child
from tests.integrations.trials import crash_trials, report

APP = "tests.integrations.agent_framework.app"
RUN = "refund-order-123"
# The key rule of effect_ledger.agent_framework: the run id given to workflow.run and the tool's name.
KEY = effect_key("payments", "refund.create", RUN, "refund")


def app(
    gw: Gateway, workdir: Path, action: str, crash: str | None, *extra: str, plain: bool = False
) -> tuple[int, Any]:
    args = ["--workdir", str(workdir), "--gateway", gw.url, "--kind", gw.state.kind, "--run", RUN]
    return run_child(APP, [*args, *(["--plain"] if plain else []), action, *extra], crash=crash)


def ledger_state(workdir: Path) -> State | None:
    with SyncLedger.open(str(workdir / "effects.db"), targets=str(workdir / "targets.toml")) as ledger:
        effect = ledger.get(KEY)
        return effect.state if effect else None


def test_with_the_adapter_a_replayed_superstep_refunds_once() -> None:
    # "lookup": the gateway does not dedupe keys, so only the ledger stands between a replay and a
    # second refund (it asks the gateway by key and finds the first one).
    results = crash_trials(app, "lookup")
    report("Agent Framework (lookup)", True, [n for n, _ in results])
    for made, out in results:
        assert made == 1
        assert out["outputs"] == ["re_0001"] and out["state"] == "WorkflowRunState.IDLE" and out["asked"] == []


def test_without_the_adapter_a_replayed_superstep_refunds_twice() -> None:
    results = crash_trials(lambda gw, d, action, crash: app(gw, d, action, crash, plain=True), "lookup")
    made = [n for n, _ in results]
    report("Agent Framework (lookup)", False, made)
    assert made == [2] * len(made)


@pytest.fixture
def nobody() -> Iterator[Gateway]:
    with Gateway("none") as gw:
        yield gw


def escalated(nobody: Gateway, workdir: Path) -> dict[str, Any]:
    """Killed after the call, replayed: the workflow waits on an approval request for a person."""
    code, _ = app(nobody, workdir, "start", crashpoints.AFTER_CALL)
    assert code == -signal.SIGKILL
    code, out = app(nobody, workdir, "resume", None)
    assert code == 0, out
    assert out["state"] == "WorkflowRunState.IDLE_WITH_PENDING_REQUESTS" and out["outputs"] == []
    [asked] = out["asked"]
    assert (asked["effect_ledger"], asked["effect_id"]) == ("escalated", KEY)
    assert asked["request"] == {"order": "123", "amount": 4800}
    assert ledger_state(workdir) is State.ESCALATED
    return asked  # type: ignore[no-any-return]


def test_a_destination_nobody_can_ask_waits_for_a_person(nobody: Gateway, tmp_path: Path) -> None:
    escalated(nobody, tmp_path)
    assert len(nobody.refunds()) == 1  # not paid again
    [made] = nobody.refunds()  # the person finds it in the gateway's dashboard
    answer = {"decision": "confirmed", "by": "alice", "reason": "in the dashboard", "receipt_id": made.id}
    code, out = app(nobody, tmp_path, "decide", None, json.dumps(answer))
    assert code == 0, out
    assert out["outputs"] == [made.id] and out["state"] == "WorkflowRunState.IDLE"
    assert len(nobody.refunds()) == 1 and ledger_state(tmp_path) is State.CONFIRMED


def test_absent_makes_it_once_more_with_the_same_key(nobody: Gateway, tmp_path: Path) -> None:
    code, _ = app(nobody, tmp_path, "start", crashpoints.AFTER_CALL)
    assert code == -signal.SIGKILL
    nobody.state.reset()  # the refund bounced: the gateway has no trace of it
    code, out = app(nobody, tmp_path, "resume", None)
    assert code == 0 and len(out["asked"]) == 1
    absent = json.dumps({"decision": "absent", "by": "bob", "reason": "no"})
    # "absent" is refused while attempt 1 may still land (its deadline + grace): ask until accepted.
    give_up = time.monotonic() + 30
    while (answered := app(nobody, tmp_path, "decide", None, absent))[1].get("refused") is not None:
        assert time.monotonic() < give_up, "absent still refused 30 s after the deadline"
    code, out = answered
    assert code == 0, out
    [made] = nobody.refunds()
    assert made.idempotency_key == KEY and out["outputs"] == [made.id]
    assert ledger_state(tmp_path) is State.CONFIRMED


def test_abandon_rejects_the_call_and_nothing_is_paid_again(nobody: Gateway, tmp_path: Path) -> None:
    escalated(nobody, tmp_path)
    code, out = app(nobody, tmp_path, "decide", None, json.dumps({"decision": "abandon", "by": "eve", "reason": "x"}))
    assert code == 0, out
    [said] = out["outputs"]
    assert said.startswith("not refunded") and len(nobody.refunds()) == 1
    assert ledger_state(tmp_path) is State.ABANDONED

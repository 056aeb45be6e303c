"""Real CrewAI (a crew in a Flow persisted with @persist, a fake model that always calls the refund
tool): a child SIGKILLed right after the gateway committed the refund, before CrewAI recorded the
tool's result; a new process kicks the flow off again with the same id (CrewAI restores its saved
state and runs it). With effect-ledger: one refund and the flow ends with the gateway's receipt.
With a plain @tool: a second refund every time."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from effect_ledger import State, SyncLedger, effect_key
from effect_ledger.core.effect import attempt_deadline
from effect_ledger.demo.gateway import Gateway
from effect_ledger.sdk import crashpoints
from tests.integrations.gateway_http import run_child
from tests.integrations.trials import crash_trials, report

APP = "tests.integrations.crewai.app"
RUN = "refund-order-123"
# The key rule of effect_ledger.crewai: the run given to crew_run (the flow's state id), the task's
# name and the tool's name.
KEY = effect_key("payments", "refund.create", RUN, "refund|refund")


def app(
    gw: Gateway, workdir: Path, action: str, crash: str | None, *extra: str, plain: bool = False
) -> tuple[int, Any]:
    args = ["--workdir", str(workdir), "--gateway", gw.url, "--kind", gw.state.kind, "--run", RUN]
    return run_child(APP, [*args, *(["--plain"] if plain else []), action, *extra], crash=crash)


def ledger_state(workdir: Path) -> State | None:
    with SyncLedger.open(str(workdir / "effects.db"), targets=str(workdir / "targets.toml")) as ledger:
        effect = ledger.get(KEY)
        return effect.state if effect else None


def wait_until_it_can_no_longer_land(workdir: Path) -> None:
    """A person's "absent" is refused while the escalated attempt's call may still land (its deadline
    plus the target's lands_within): wait for that moment on the ledger's own figures, not on how
    long a child process takes to start."""
    from effect_ledger.targets.load import load_targets

    [target] = [t for t in load_targets(workdir / "targets.toml") if t.name == "payments"]
    with SyncLedger.open(str(workdir / "effects.db"), targets=str(workdir / "targets.toml")) as ledger:
        effect = ledger.get(KEY)
        assert effect is not None
        until_ms = target.may_still_land_until_ms(attempt_deadline(effect, effect.attempt))
    give_up = time.monotonic() + 60
    while time.time_ns() // 1_000_000 <= until_ms:
        assert time.monotonic() < give_up, f"the attempt may still land at {until_ms}"
        time.sleep(0.05)


def test_with_the_adapter_a_resumed_flow_refunds_once() -> None:
    # "lookup": the gateway does not dedupe keys, so only the ledger stands between a resume and a
    # second refund (it asks the gateway by key and finds the first one).
    results = crash_trials(app, "lookup")
    report("CrewAI (lookup)", True, [n for n, _ in results])
    for made, out in results:
        assert made == 1
        # The flow ends with the gateway's own receipt (the model's final answer is the tool's).
        assert out["state"]["refund_id"] == "re_0001" and out["paused"] is None


def test_without_the_adapter_a_resumed_flow_refunds_twice() -> None:
    results = crash_trials(lambda gw, d, action, crash: app(gw, d, action, crash, plain=True), "lookup")
    made = [n for n, _ in results]
    report("CrewAI (lookup)", False, made)
    assert made == [2] * len(made)


@pytest.fixture
def nobody() -> Iterator[Gateway]:
    with Gateway("none") as gw:
        yield gw


def test_a_destination_nobody_can_ask_pauses_the_flow_for_a_person(nobody: Gateway, tmp_path: Path) -> None:
    """The gateway neither dedupes nor answers lookups: the resumed flow pauses on CrewAI's human
    feedback with the escalation instead of paying again; the person's decision resumes it."""
    code, _ = app(nobody, tmp_path, "start", crashpoints.AFTER_CALL)
    assert code == -signal.SIGKILL
    code, out = app(nobody, tmp_path, "resume", None)
    assert code == 0, out
    asked = out["paused"]
    assert asked is not None and (asked["effect_ledger"], asked["effect_id"]) == ("escalated", KEY)
    assert asked["request"] == {"order": "123", "amount": 4800}
    assert out["state"]["refund_id"] is None
    assert len(nobody.refunds()) == 1 and ledger_state(tmp_path) is State.ESCALATED

    [made] = nobody.refunds()  # the person finds it in the gateway's dashboard
    answer = {"decision": "confirmed", "by": "alice", "reason": "in the dashboard", "receipt_id": made.id}
    code, out = app(nobody, tmp_path, "decide", None, json.dumps(answer))
    assert code == 0, out
    assert out["state"]["refund_id"] == made.id and out["paused"] is None
    assert len(nobody.refunds()) == 1 and ledger_state(tmp_path) is State.CONFIRMED


def test_a_person_who_finds_it_absent_has_it_made_once_more_with_the_same_key(nobody: Gateway, tmp_path: Path) -> None:
    code, _ = app(nobody, tmp_path, "start", crashpoints.AFTER_CALL)
    assert code == -signal.SIGKILL
    nobody.state.reset()  # the refund bounced: the gateway has no trace of it
    code, out = app(nobody, tmp_path, "resume", None)
    assert code == 0 and out["paused"] is not None
    wait_until_it_can_no_longer_land(tmp_path)
    answer = {"decision": "absent", "by": "bob", "reason": "not in the dashboard"}
    code, out = app(nobody, tmp_path, "decide", None, json.dumps(answer))
    assert code == 0, out
    [made] = nobody.refunds()
    assert made.idempotency_key == KEY and out["state"]["refund_id"] == made.id
    assert ledger_state(tmp_path) is State.CONFIRMED

"""``effect_ledger.core.plan``: the "what execute does" table of docs/guides/embedded.md, row by row, against the
pure plan (no file, no clock, no process table: every input is given)."""

from __future__ import annotations

import pytest

from effect_ledger.core.effect import Effect, fold
from effect_ledger.core.model import (
    Decision,
    DecisionKind,
    Event,
    Executed,
    Intent,
    Outcome,
    Receipt,
    ReceiptSource,
    Resolution,
    State,
    Verdict,
)
from effect_ledger.core.plan import (
    AskFirst,
    CallSpec,
    Execute,
    Known,
    Refuse,
    ReturnReceipt,
    after_answer,
    plan,
)
from effect_ledger.core.reconcile import Target
from effect_ledger.errors import EffectClosed, EffectConflict, EffectInProgress, EffectUncertain

KEY = "payments:" + "5ca1d0a8" * 8
T0 = 1_700_000_000_000
DEADLINE = T0 + 10_000
# Until when a call of attempt 1 may still take effect: its deadline + the default lands_within.
LANDS_UNTIL = DEADLINE + Target("payments").lands_within_ms
ME = "host-a:100:1:aaaa"
OTHER = "host-a:200:1:bbbb"
REQUEST = '{"amount":4800,"order":"123"}'
DIGEST = "d1" * 32
SPEC = CallSpec("payments", "refund.create", "default", "run-1", "refund-order-123", REQUEST, DIGEST, 10.0)


def intent(attempt: int = 1, digest: str = DIGEST) -> Intent:
    return Intent(f"intent-{attempt}", KEY, T0, attempt, "payments", "refund.create", "default", "run-1",
                  "refund-order-123", REQUEST, digest, DEADLINE, OTHER)  # fmt: skip


def executed(outcome: Outcome, attempt: int = 1) -> Executed:
    return Executed(f"exec-{attempt}", KEY, T0 + 500, attempt, outcome, None, T0 + 100, T0 + 500, None, OTHER)


def receipt() -> Receipt:
    return Receipt("receipt-1", KEY, T0 + 500, 1, "re_1", ReceiptSource.CALL, '{"id":"re_1"}')


def resolution(verdict: Verdict, tries: int = 1, at: int = DEADLINE + 2_000) -> Resolution:
    """A reconciler's answer, given (asked) at ``at``."""
    return Resolution(f"resolution:1:{tries}:{KEY}", KEY, at, 1, verdict, "gateway", "why", None, None,
                      tries)  # fmt: skip


def decision(kind: DecisionKind) -> Decision:
    return Decision(f"decision-{kind}", KEY, DEADLINE + 5_000, 1, kind, "alice", "checked", None, "ops")


def effect(*events: Event) -> Effect:
    e = fold(list(events))
    assert e is not None
    return e


# One effect per known state of the README's table.
STATES: dict[State, tuple[Event, ...]] = {
    State.PENDING: (intent(),),
    State.EXECUTED: (intent(), executed(Outcome.OK)),
    State.UNCERTAIN: (intent(), executed(Outcome.UNKNOWN)),
    State.CONFIRMED: (intent(), executed(Outcome.OK), receipt()),
    State.FAILED: (intent(), executed(Outcome.FAILED)),
    State.ABSENT: (intent(), executed(Outcome.UNKNOWN), resolution(Verdict.ABSENT)),
    State.ESCALATED: (intent(), executed(Outcome.UNKNOWN), resolution(Verdict.ESCALATE)),
    State.ABANDONED: (intent(), executed(Outcome.UNKNOWN), decision(DecisionKind.ABANDONED)),
    State.COMPENSATED: (intent(), executed(Outcome.OK), receipt(), decision(DecisionKind.COMPENSATED)),
}


def known(
    state: State | None,
    *,
    owner: str | None = None,
    until: int | None = None,
    alive: bool | None = None,
    now: int = DEADLINE + 3_000,
) -> Known:
    e = None if state is None else effect(*STATES[state])
    assert e is None or e.state is state
    return Known(e, owner, until, now, ME, alive)


# --- nothing, FAILED, ABSENT: the intent, then the call -----------------------------------------


def test_nothing_known_executes_attempt_1() -> None:
    assert plan(known(None), SPEC) == Execute(1, None)


@pytest.mark.parametrize("state", [State.FAILED, State.ABSENT])
def test_failed_or_absent_executes_the_next_attempt_with_the_same_key(state: State) -> None:
    assert plan(known(state), SPEC) == Execute(2, None)


@pytest.mark.parametrize("state", [State.FAILED, State.ABSENT])
def test_failed_or_absent_takes_over_a_claim_left_by_a_dead_worker(state: State) -> None:
    step = plan(known(state, owner=OTHER, until=DEADLINE + 60_000, alive=False), SPEC)
    assert step == Execute(2, OTHER)


# --- CONFIRMED: the recorded receipt ------------------------------------------------------------


def test_confirmed_returns_the_recorded_receipt() -> None:
    step = plan(known(State.CONFIRMED), SPEC)
    assert isinstance(step, ReturnReceipt)
    assert step.effect.receipt is not None and step.effect.receipt.receipt_id == "re_1"


def test_confirmed_returns_the_receipt_even_while_a_claim_is_held() -> None:
    assert isinstance(plan(known(State.CONFIRMED, owner=OTHER, alive=True), SPEC), ReturnReceipt)


# --- PENDING / EXECUTED / UNCERTAIN ----------------------------------------------------------------


OPEN = [State.PENDING, State.EXECUTED, State.UNCERTAIN]


@pytest.mark.parametrize("state", OPEN)
def test_open_with_its_worker_alive_is_in_progress(state: State) -> None:
    step = plan(known(state, owner=OTHER, until=DEADLINE, alive=True, now=T0 + 1_000), SPEC)
    assert isinstance(step, Refuse) and isinstance(step.error, EffectInProgress)
    assert step.error.retry_after_ms == DEADLINE - (T0 + 1_000)


@pytest.mark.parametrize("state", OPEN)
def test_open_whose_liveness_nobody_can_tell_is_in_progress_until_its_lease_ends(state: State) -> None:
    during = plan(known(state, owner=OTHER, until=DEADLINE, alive=None, now=DEADLINE - 1), SPEC)
    assert isinstance(during, Refuse) and isinstance(during.error, EffectInProgress)
    after = plan(known(state, owner=OTHER, until=DEADLINE, alive=None, now=DEADLINE), SPEC)
    assert isinstance(after, AskFirst) and after.take_over_from == OTHER


@pytest.mark.parametrize("state", OPEN)
def test_open_with_its_worker_gone_asks_the_destination_first(state: State) -> None:
    step = plan(known(state, owner=OTHER, until=DEADLINE + 60_000, alive=False, now=T0 + 1_000), SPEC)
    assert isinstance(step, AskFirst)
    assert step.take_over_from == OTHER and step.effect.state is state


@pytest.mark.parametrize("state", OPEN)
def test_open_claimed_by_this_worker_or_nobody_asks_first(state: State) -> None:
    assert plan(known(state, owner=ME, until=DEADLINE, alive=None, now=T0), SPEC) == AskFirst(
        effect(*STATES[state]), ME
    )
    assert plan(known(state), SPEC) == AskFirst(effect(*STATES[state]), None)


# --- after asking: found -> the receipt; absent -> execute; unknown -> uncertain ------------------


def asked() -> AskFirst:
    return AskFirst(effect(*STATES[State.UNCERTAIN]), OTHER)


def test_found_returns_it() -> None:
    found = Resolution(f"resolution:1:1:{KEY}", KEY, DEADLINE + 2_000, 1, Verdict.FOUND, "gateway", "found", "re_9",
                       '{"id":"re_9"}', 1)  # fmt: skip
    after = effect(*STATES[State.UNCERTAIN], found)
    step = after_answer(asked(), after, found, DEADLINE + 2_000, False, LANDS_UNTIL)
    assert isinstance(step, ReturnReceipt) and step.effect.state is State.CONFIRMED


def test_absent_after_the_old_deadline_executes_with_the_same_key() -> None:
    absent = resolution(Verdict.ABSENT)
    after = effect(*STATES[State.UNCERTAIN], absent)
    assert after_answer(asked(), after, absent, DEADLINE + 2_000, False, LANDS_UNTIL) == Execute(2, OTHER)


def test_unknown_after_the_deadline_is_uncertain_and_nothing_is_sent() -> None:
    unknown = resolution(Verdict.UNKNOWN)
    after = effect(*STATES[State.UNCERTAIN], unknown)
    step = after_answer(asked(), after, unknown, DEADLINE + 2_000, False, LANDS_UNTIL)
    assert isinstance(step, Refuse) and isinstance(step.error, EffectUncertain)
    assert step.error.state == State.UNCERTAIN.value


def test_unknown_before_the_deadline_is_in_progress_until_then() -> None:
    unknown = resolution(Verdict.UNKNOWN, at=DEADLINE - 4_000)
    after = effect(*STATES[State.UNCERTAIN], unknown)
    step = after_answer(asked(), after, unknown, DEADLINE - 4_000, False, LANDS_UNTIL)
    assert isinstance(step, Refuse) and isinstance(step.error, EffectInProgress)
    assert step.error.retry_after_ms == LANDS_UNTIL - (DEADLINE - 4_000)


@pytest.mark.parametrize("now", [DEADLINE, DEADLINE + 1_999])
def test_unknown_while_the_old_call_may_still_land_is_in_progress_until_then(now: int) -> None:
    """Past the deadline, the earlier call may still take effect for the target's lands_within."""
    unknown = resolution(Verdict.UNKNOWN, at=now)
    after = effect(*STATES[State.UNCERTAIN], unknown)
    step = after_answer(asked(), after, unknown, now, False, LANDS_UNTIL)
    assert isinstance(step, Refuse) and isinstance(step.error, EffectInProgress)
    assert step.error.retry_after_ms == LANDS_UNTIL - now


@pytest.mark.parametrize("late", [1, 500, 60_000])
def test_an_unknown_given_too_early_is_asked_again_even_when_it_arrives_late(late: int) -> None:
    """The answer is judged on when the destination was asked, not on when it came back: "absent so
    far" asked just before the old call could no longer land, and answered (or recorded) after,
    says nothing for the time after. Ask again at once (retry after 0), not "uncertain": a slow
    lookup must not hand the caller a verdict that one more question would settle."""
    unknown = resolution(Verdict.UNKNOWN, at=LANDS_UNTIL - 1)
    after = effect(*STATES[State.UNCERTAIN], unknown)
    step = after_answer(asked(), after, unknown, LANDS_UNTIL + late, False, LANDS_UNTIL)
    assert isinstance(step, Refuse) and isinstance(step.error, EffectInProgress), step
    assert step.error.retry_after_ms == 0


def test_an_escalating_answer_is_uncertain() -> None:
    escalate = resolution(Verdict.ESCALATE)
    after = effect(*STATES[State.UNCERTAIN], escalate)
    step = after_answer(asked(), after, escalate, DEADLINE + 2_000, False, LANDS_UNTIL)
    assert isinstance(step, Refuse) and isinstance(step.error, EffectUncertain)
    assert step.error.state == State.ESCALATED.value


# --- ESCALATED, ABANDONED / COMPENSATED ------------------------------------------------------------


def test_escalated_is_uncertain_until_a_person_decides() -> None:
    step = plan(known(State.ESCALATED), SPEC)
    assert isinstance(step, Refuse) and isinstance(step.error, EffectUncertain)
    assert step.error.state == State.ESCALATED.value


@pytest.mark.parametrize("state", [State.ABANDONED, State.COMPENSATED])
def test_closed_by_a_person_is_closed(state: State) -> None:
    step = plan(known(state), SPEC)
    assert isinstance(step, Refuse) and isinstance(step.error, EffectClosed)


# --- the same key with another request ------------------------------------------------------------


@pytest.mark.parametrize("state", list(STATES))
def test_the_same_key_with_another_request_is_a_conflict_in_every_state(state: State) -> None:
    other = CallSpec(
        SPEC.target, SPEC.operation, SPEC.namespace, SPEC.run_id, SPEC.step, '{"amount":1}', "e2" * 32, 10.0
    )
    step = plan(known(state), other)
    assert isinstance(step, Refuse) and isinstance(step.error, EffectConflict)


def test_the_same_key_for_another_operation_is_a_conflict() -> None:
    other = CallSpec(SPEC.target, "refund.cancel", SPEC.namespace, SPEC.run_id, SPEC.step, REQUEST, DIGEST, 10.0)
    step = plan(known(State.CONFIRMED), other)
    assert isinstance(step, Refuse) and isinstance(step.error, EffectConflict)


# --- the step between the intent and the call ------------------------------------------------------


def test_claims_confirmed_across_hosts_are_asked_for_on_every_execution() -> None:
    # Off today (nothing to wait for); the executor's ``_confirm_claim`` is where the verdict is awaited.
    e = effect(*STATES[State.FAILED])
    assert plan(Known(None, None, None, T0, ME, None, True), SPEC) == Execute(1, None, True)
    assert plan(Known(e, None, None, T0, ME, None, True), SPEC) == Execute(2, None, True)
    absent = resolution(Verdict.ABSENT)
    after = effect(*STATES[State.UNCERTAIN], absent)
    assert after_answer(asked(), after, absent, DEADLINE + 2_000, True, LANDS_UNTIL) == Execute(2, OTHER, True)

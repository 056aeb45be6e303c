"""Every transition in the derivation table of ``effect_ledger.core.effect``, one given/when/then test each.

The table (first rule that matches wins)::

    any COMPENSATED decision                                   -> COMPENSATED
    any receipt (Receipt, FOUND resolution, CONFIRMED decision) -> CONFIRMED
    then, for the latest attempt N only:
      ABANDONED decision                                       -> ABANDONED
      executed FAILED                                          -> FAILED
      ABSENT decision or ABSENT resolution                     -> ABSENT
        (an ABSENT decision made before the attempt's call deadline is ignored and flagged)
      ESCALATE resolution                                      -> ESCALATED
      executed OK, RECEIPT timeout                             -> UNCERTAIN
      executed OK                                              -> EXECUTED
      executed UNKNOWN, or CALL timeout                        -> UNCERTAIN
      intent                                                   -> PENDING

Plus the bookkeeping around it: flags, emission of ``UncertainEffect``, idempotence, ``expire`` and
``to_state``. Pure: no clock, no I/O.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from effect_ledger.core.deadlines import DECISION_GRACE_MS
from effect_ledger.core.effect import Effect, apply, decision_refusal, expire, fold, timeout_event_id, to_state
from effect_ledger.core.model import (
    Decision,
    DecisionKind,
    EffectState,
    Event,
    Executed,
    Flag,
    Intent,
    Outcome,
    Receipt,
    ReceiptSource,
    Resolution,
    State,
    Timeout,
    TimeoutPhase,
    UncertainEffect,
    Verdict,
)

KEY = "payments:" + "5ca1d0a8" * 8
OTHER_KEY = "payments:" + "0" * 64
T0 = 1_700_000_000_000
CALL_DEADLINE = T0 + 10_000
RECEIPT_DEADLINE = T0 + 60_000
REQUEST = '{"amount":4800,"currency":"CNY","order":"123"}'
DIGEST = "d1" * 32
OTHER_DIGEST = "d2" * 32


# --- builders -------------------------------------------------------------------------------------


def intent(
    attempt: int = 1,
    at: int = T0,
    deadline: int = CALL_DEADLINE,
    digest: str = DIGEST,
    eid: str | None = None,
    key: str = KEY,
) -> Intent:
    return Intent(
        eid or f"intent-{attempt}-{at}",
        key,
        at,
        attempt,
        "payments",
        "refund.create",
        "default",
        "run-1",
        "refund-order-123",
        REQUEST,
        digest,
        deadline,
        "worker-1",
    )


def executed(
    outcome: Outcome = Outcome.OK,
    attempt: int = 1,
    at: int = T0 + 500,
    receipt_deadline: int | None = RECEIPT_DEADLINE,
    error: str | None = None,
    eid: str | None = None,
) -> Executed:
    return Executed(
        eid or f"exec-{attempt}-{at}", KEY, at, attempt, outcome, error, at - 400, at - 10, receipt_deadline, "worker-1"
    )


def receipt(
    receipt_id: str = "re_1",
    attempt: int = 1,
    at: int = T0 + 600,
    source: ReceiptSource = ReceiptSource.CALL,
    eid: str | None = None,
) -> Receipt:
    return Receipt(
        eid or f"receipt-{attempt}-{at}-{receipt_id}", KEY, at, attempt, receipt_id, source, f'{{"id":"{receipt_id}"}}'
    )


def resolution(
    verdict: Verdict,
    attempt: int = 1,
    at: int = T0 + 20_000,
    receipt_id: str | None = None,
    reason: str = "",
    tries: int = 1,
    eid: str | None = None,
) -> Resolution:
    value = f'{{"id":"{receipt_id}"}}' if receipt_id else None
    return Resolution(
        eid or f"resolution-{attempt}-{at}-{verdict.value}",
        KEY,
        at,
        attempt,
        verdict,
        "gateway-reconciler",
        reason,
        receipt_id,
        value,
        tries,
    )


def decision(
    kind: DecisionKind, attempt: int = 1, at: int = T0 + 30_000, receipt_id: str | None = None, eid: str | None = None
) -> Decision:
    return Decision(
        eid or f"decision-{attempt}-{at}-{kind.value}",
        KEY,
        at,
        attempt,
        kind,
        "alice",
        "checked the dashboard",
        receipt_id,
    )


def timeout(
    phase: TimeoutPhase = TimeoutPhase.CALL, attempt: int = 1, at: int = CALL_DEADLINE, deadline: int = CALL_DEADLINE
) -> Timeout:
    return Timeout(timeout_event_id(KEY, attempt, phase), KEY, at, attempt, phase, deadline)


def effect_of(*events: Event) -> Effect:
    eff = fold(list(events))
    assert eff is not None
    return eff


def uncertain() -> Effect:
    """An effect UNCERTAIN because the call outcome is unknown (a read timeout)."""
    return effect_of(intent(attempt=1), executed(Outcome.UNKNOWN, error="read timeout"))


# --- intent, executed, receipt --------------------------------------------------------------------


def test_intent_makes_pending() -> None:
    """given no effect, when an intent is applied, then the effect is PENDING at attempt 1 with the
    intent's call deadline, no receipt, no flags, and nothing is emitted."""
    i = intent()
    eff, emitted = apply(None, i)
    assert eff.state is State.PENDING
    assert eff.effect_id == KEY
    assert eff.attempt == 1
    assert eff.intent == i and eff.first_intent == i
    assert eff.deadline_ms == CALL_DEADLINE
    assert eff.receipt is None and eff.receipt_ids == ()
    assert eff.executions == 0
    assert eff.flags == ()
    assert eff.reason is None
    assert emitted == ()


def test_executed_ok_makes_executed_with_receipt_deadline() -> None:
    """given a PENDING effect, when the call returns OK with a receipt deadline, then the effect is
    EXECUTED, counts one execution, and waits until the receipt deadline."""
    eff, emitted = apply(effect_of(intent()), executed(Outcome.OK))
    assert eff.state is State.EXECUTED
    assert eff.executions == 1
    assert eff.deadline_ms == RECEIPT_DEADLINE
    assert eff.flags == ()
    assert emitted == ()


def test_executed_ok_without_receipt_deadline_keeps_the_intent_deadline() -> None:
    """given a PENDING effect, when the call returns OK without a receipt deadline, then the effect
    is EXECUTED and its deadline falls back to the intent's deadline."""
    eff = effect_of(intent(), executed(Outcome.OK, receipt_deadline=None))
    assert eff.state is State.EXECUTED
    assert eff.deadline_ms == CALL_DEADLINE


def test_receipt_confirms_an_executed_effect() -> None:
    """given an EXECUTED effect, when the call's receipt is recorded, then the effect is CONFIRMED
    with that receipt as evidence and no deadline."""
    r = receipt("re_1")
    eff, emitted = apply(effect_of(intent(), executed(Outcome.OK)), r)
    assert eff.state is State.CONFIRMED
    assert eff.receipt is not None
    assert eff.receipt.receipt_id == "re_1"
    assert eff.receipt.value == r.value
    assert eff.receipt.source is ReceiptSource.CALL
    assert eff.receipt.attempt == 1
    assert eff.receipt_ids == ("re_1",)
    assert eff.deadline_ms is None
    assert eff.reason is None
    assert emitted == ()


def test_webhook_receipt_confirms_a_pending_effect() -> None:
    """given a PENDING effect (no executed event yet), when a webhook receipt arrives, then the
    effect is CONFIRMED: a receipt is proof whatever else is missing."""
    eff = effect_of(intent(), receipt("re_w", source=ReceiptSource.WEBHOOK))
    assert eff.state is State.CONFIRMED
    assert eff.receipt is not None and eff.receipt.source is ReceiptSource.WEBHOOK
    assert eff.executions == 0


def test_executed_failed_makes_failed() -> None:
    """given a PENDING effect, when the call is definitively rejected, then the effect is FAILED with
    the error as reason, no deadline, and nothing is emitted."""
    eff, emitted = apply(effect_of(intent()), executed(Outcome.FAILED, receipt_deadline=None, error="card declined"))
    assert eff.state is State.FAILED
    assert eff.reason == "card declined"
    assert eff.deadline_ms is None
    assert eff.executions == 0
    assert emitted == ()


def test_executed_unknown_makes_uncertain_and_emits() -> None:
    """given a PENDING effect, when the call outcome is unknown (timeout), then the effect is
    UNCERTAIN and exactly one UncertainEffect is emitted describing the attempt."""
    i = intent()
    x = executed(Outcome.UNKNOWN, receipt_deadline=None, error="read timeout")
    eff, emitted = apply(effect_of(i), x)
    assert eff.state is State.UNCERTAIN
    assert eff.reason is not None and "read timeout" in eff.reason
    assert eff.deadline_ms is None
    assert eff.executions == 0
    assert len(emitted) == 1
    u = emitted[0]
    assert isinstance(u, UncertainEffect)
    assert u.event_id == f"uncertain:1:0:{KEY}"
    assert u.effect_id == KEY
    assert u.attempt == 1
    assert (u.target, u.operation) == ("payments", "refund.create")
    assert (u.request, u.request_digest) == (REQUEST, DIGEST)
    assert u.intent_at_ms == i.at_ms
    assert u.deadline_ms == i.deadline_ms
    assert u.at_ms == x.at_ms
    assert u.reason == eff.reason


# --- deadlines: expire and timeouts ---------------------------------------------------------------


def test_expire_returns_nothing_before_the_call_deadline() -> None:
    """given a PENDING effect, when expire is asked one millisecond before its call deadline, then
    no timeout is due."""
    eff = effect_of(intent())
    assert expire(eff, T0) == []
    assert expire(eff, CALL_DEADLINE - 1) == []


@pytest.mark.parametrize("now", [CALL_DEADLINE, CALL_DEADLINE + 1, CALL_DEADLINE + 3_600_000])
def test_expire_returns_one_call_timeout_at_or_after_the_deadline(now: int) -> None:
    """given a PENDING effect, when expire is asked at or after its call deadline, then exactly one
    CALL Timeout is due, with a deterministic event id (same on every call)."""
    eff = effect_of(intent())
    due = expire(eff, now)
    assert due == [Timeout(f"timeout:call:1:{KEY}", KEY, now, 1, TimeoutPhase.CALL, CALL_DEADLINE)]
    assert due[0].event_id == timeout_event_id(KEY, 1, TimeoutPhase.CALL)
    assert expire(eff, now) == due  # a timer that fires twice produces the same command


def test_call_timeout_on_pending_makes_uncertain_and_expire_then_returns_nothing() -> None:
    """given a PENDING effect past its call deadline, when the CALL timeout is applied, then it is
    UNCERTAIN, one UncertainEffect is emitted, and expire returns nothing more (now or later)."""
    eff = effect_of(intent())
    [t] = expire(eff, CALL_DEADLINE)
    after, emitted = apply(eff, t)
    assert after.state is State.UNCERTAIN
    assert after.reason == "deadline passed without a recorded outcome"
    assert after.deadline_ms is None
    assert len(emitted) == 1 and emitted[0].attempt == 1
    assert expire(after, CALL_DEADLINE) == []
    assert expire(after, CALL_DEADLINE + 10**9) == []


def test_call_deadline_does_not_apply_once_executed() -> None:
    """given an EXECUTED effect whose receipt deadline is later than the call deadline, when expire
    is asked at the call deadline, then no timeout is due."""
    eff = effect_of(intent(), executed(Outcome.OK))
    assert expire(eff, CALL_DEADLINE) == []
    assert expire(eff, RECEIPT_DEADLINE - 1) == []


def test_receipt_timeout_on_executed_makes_uncertain() -> None:
    """given an EXECUTED effect with a receipt deadline, when expire is asked at that deadline and
    its RECEIPT timeout applied, then the effect is UNCERTAIN, one UncertainEffect is emitted, and
    nothing further is due."""
    eff = effect_of(intent(), executed(Outcome.OK))
    due = expire(eff, RECEIPT_DEADLINE)
    assert due == [
        Timeout(f"timeout:receipt:1:{KEY}", KEY, RECEIPT_DEADLINE, 1, TimeoutPhase.RECEIPT, RECEIPT_DEADLINE)
    ]
    after, emitted = apply(eff, due[0])
    assert after.state is State.UNCERTAIN
    assert after.reason == "executed, but no receipt by its deadline"
    assert after.executions == 1
    assert len(emitted) == 1
    assert expire(after, RECEIPT_DEADLINE + 1) == []


@pytest.mark.parametrize("final", ["confirmed", "failed", "uncertain"])
def test_expire_returns_nothing_for_effects_without_an_open_deadline(final: str) -> None:
    """given a CONFIRMED, FAILED or UNCERTAIN effect, when expire is asked long after every
    deadline, then no timeout is due."""
    by_state: dict[str, list[Event]] = {
        "confirmed": [intent(), executed(), receipt()],
        "failed": [intent(), executed(Outcome.FAILED, error="rejected")],
        "uncertain": [intent(), executed(Outcome.UNKNOWN, error="eof")],
    }
    eff = effect_of(*by_state[final])
    assert eff.deadline_ms is None
    assert expire(eff, T0 + 10**9) == []


# --- resolutions ----------------------------------------------------------------------------------


def test_found_resolution_confirms_with_its_receipt_id() -> None:
    """given an UNCERTAIN effect, when a reconciler finds it (FOUND with a receipt id), then the
    effect is CONFIRMED with that receipt id, sourced from the reconciler."""
    eff, emitted = apply(uncertain(), resolution(Verdict.FOUND, receipt_id="re_found"))
    assert eff.state is State.CONFIRMED
    assert eff.receipt is not None
    assert eff.receipt.receipt_id == "re_found"
    assert eff.receipt.source is ReceiptSource.RECONCILER
    assert eff.receipt.value == '{"id":"re_found"}'
    assert eff.receipt_ids == ("re_found",)
    assert emitted == ()


def test_absent_resolution_makes_absent() -> None:
    """given an UNCERTAIN effect, when a reconciler proves it ABSENT, then the effect is ABSENT
    (retry is safe), with the reconciler and its reason in the reason."""
    eff, _ = apply(uncertain(), resolution(Verdict.ABSENT, reason="no such refund"))
    assert eff.state is State.ABSENT
    assert eff.reason == "gateway-reconciler: no such refund"
    assert eff.deadline_ms is None


def test_escalate_resolution_makes_escalated() -> None:
    """given an UNCERTAIN effect, when the reconciler escalates, then the effect is ESCALATED with
    the escalation reason."""
    eff, emitted = apply(uncertain(), resolution(Verdict.ESCALATE, reason="no answer after 5 tries"))
    assert eff.state is State.ESCALATED
    assert eff.reason == "no answer after 5 tries"
    assert emitted == ()


def test_unknown_resolution_keeps_uncertain_and_emits_nothing() -> None:
    """given an UNCERTAIN effect, when the reconciler cannot tell (UNKNOWN), then the effect stays
    UNCERTAIN with its reason unchanged and nothing is emitted again."""
    before = uncertain()
    eff, emitted = apply(before, resolution(Verdict.UNKNOWN, reason="503"))
    assert eff.state is State.UNCERTAIN
    assert eff.reason == before.reason
    assert eff.version == before.version + 1
    assert emitted == ()


# --- decisions by a person ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "state"),
    [
        (DecisionKind.CONFIRMED, State.CONFIRMED),
        (DecisionKind.ABSENT, State.ABSENT),
        (DecisionKind.ABANDONED, State.ABANDONED),
        (DecisionKind.COMPENSATED, State.COMPENSATED),
    ],
)
def test_decision_on_escalated_sets_the_decided_state(kind: DecisionKind, state: State) -> None:
    """given an ESCALATED effect, when a person records a decision, then the effect takes the
    decided state."""
    escalated = effect_of(intent(), executed(Outcome.UNKNOWN, error="eof"), resolution(Verdict.ESCALATE))
    assert escalated.state is State.ESCALATED
    eff, emitted = apply(escalated, decision(kind))
    assert eff.state is state
    assert emitted == ()
    if state in (State.ABSENT, State.ABANDONED, State.COMPENSATED):
        assert eff.reason is not None and "alice" in eff.reason and "checked the dashboard" in eff.reason


def test_confirmed_decision_with_a_receipt_id_is_the_receipt() -> None:
    """given an ESCALATED effect, when a person confirms it naming the receipt id, then the effect
    is CONFIRMED with that id, sourced from a person."""
    d = decision(DecisionKind.CONFIRMED, receipt_id="re_p")
    eff = effect_of(intent(), resolution(Verdict.ESCALATE), d)
    assert eff.state is State.CONFIRMED
    assert eff.receipt is not None
    assert eff.receipt.receipt_id == "re_p"
    assert eff.receipt.source is ReceiptSource.PERSON
    assert eff.receipt_ids == ("re_p",)


def test_confirmed_decision_without_a_receipt_id_gets_a_synthetic_one() -> None:
    """given an ESCALATED effect, when a person confirms it without a receipt id, then the receipt id
    is derived from the decision's event id."""
    d = decision(DecisionKind.CONFIRMED, eid="dec-42")
    eff = effect_of(intent(), resolution(Verdict.ESCALATE), d)
    assert eff.state is State.CONFIRMED
    assert eff.receipt is not None and eff.receipt.receipt_id == "decision:dec-42"


def test_compensated_decision_wins_over_a_receipt() -> None:
    """given a CONFIRMED effect, when a person records it COMPENSATED, then the effect is
    COMPENSATED (the first rule of the table), keeping its receipt as evidence."""
    eff = effect_of(intent(), executed(), receipt("re_1"), decision(DecisionKind.COMPENSATED))
    assert eff.state is State.COMPENSATED
    assert eff.receipt is not None and eff.receipt.receipt_id == "re_1"
    assert eff.reason == "compensated by alice: checked the dashboard"


def test_abandoned_decision_wins_over_failed() -> None:
    """given a FAILED attempt, when a person abandons it, then ABANDONED wins (it comes first in the
    table for the latest attempt)."""
    eff = effect_of(intent(), executed(Outcome.FAILED, error="x"), decision(DecisionKind.ABANDONED))
    assert eff.state is State.ABANDONED


def test_a_receipt_wins_over_abandoned() -> None:
    """given an ABANDONED effect, when a late webhook receipt arrives, then it is CONFIRMED: proof
    that it happened beats a person's guess."""
    late = receipt("re_late", source=ReceiptSource.WEBHOOK)
    eff = effect_of(intent(), decision(DecisionKind.ABANDONED), late)
    assert eff.state is State.CONFIRMED


# --- an ABSENT decision while the call may still land ----------------------------------------------


def test_absent_decision_before_the_call_deadline_is_ignored_and_flagged() -> None:
    """given an UNCERTAIN effect whose call was cut off, when a person's ABSENT decision made before
    the call deadline arrives, then the effect stays UNCERTAIN (the call may still land: ABSENT would
    let a second execution run), keeps the decision as a fact, flags DECISION_IGNORED and says why."""
    d = decision(DecisionKind.ABSENT, at=CALL_DEADLINE - 1)
    eff, emitted = apply(uncertain(), d)
    assert eff.state is State.UNCERTAIN
    assert Flag.DECISION_IGNORED in eff.flags
    # ... and so within the lands_within that follows the deadline (2 s for an intent that carries none).
    d = decision(DecisionKind.ABSENT, at=CALL_DEADLINE + DECISION_GRACE_MS - 1)
    eff, emitted = apply(uncertain(), d)
    assert eff.state is State.UNCERTAIN
    assert eff.has(d.event_id) and eff.version == 3
    assert Flag.DECISION_IGNORED in eff.flags
    assert eff.reason is not None and "ABSENT decision by alice ignored" in eff.reason
    assert emitted == ()


def test_absent_decision_before_the_deadline_leaves_a_pending_effect_pending() -> None:
    """given a PENDING effect, when an early ABSENT decision arrives, then it stays PENDING with its
    deadline (the timer still fires), flagged, the reason naming the ignored decision."""
    eff = effect_of(intent(), decision(DecisionKind.ABSENT, at=T0 + 1))
    assert eff.state is State.PENDING and eff.deadline_ms == CALL_DEADLINE
    assert Flag.DECISION_IGNORED in eff.flags and eff.reason is not None and "ignored" in eff.reason


def test_absent_decision_once_the_call_can_no_longer_land_makes_absent() -> None:
    """given an UNCERTAIN effect, when an ABSENT decision made at the call deadline plus lands_within
    arrives, then it counts: ABSENT, no flag."""
    at = CALL_DEADLINE + DECISION_GRACE_MS
    eff = effect_of(intent(), executed(Outcome.UNKNOWN, error="eof"), decision(DecisionKind.ABSENT, at=at))
    assert eff.state is State.ABSENT
    assert Flag.DECISION_IGNORED not in eff.flags


def test_the_intent_carries_how_long_its_call_may_land_after_its_deadline() -> None:
    """given an intent whose target declares lands_within 60 s, when an ABSENT decision or answer
    arrives 59 s after its deadline, then it is ignored; at 60 s it counts."""
    i = replace(intent(), lands_within_ms=60_000)
    for at, state in ((CALL_DEADLINE + 59_999, State.UNCERTAIN), (CALL_DEADLINE + 60_000, State.ABSENT)):
        by_person = effect_of(i, executed(Outcome.UNKNOWN, error="eof"), decision(DecisionKind.ABSENT, at=at))
        by_reconciler = effect_of(i, executed(Outcome.UNKNOWN, error="eof"), resolution(Verdict.ABSENT, at=at))
        assert by_person.state is state and by_reconciler.state is state
        assert (Flag.ANSWER_IGNORED in by_reconciler.flags) == (state is State.UNCERTAIN)


# --- the log's time decides, never a writer's clock ------------------------------------------------


def test_a_decision_stamped_in_the_future_counts_by_when_the_log_took_it() -> None:
    """given an UNCERTAIN effect, when an operator whose clock runs two hours ahead writes ABSENT (its
    at_ms far past the deadline) but the log takes it before the call can no longer land, then it is
    ignored: the log's time decides; its claimed time stays a fact."""
    d = decision(DecisionKind.ABSENT, at=CALL_DEADLINE + 2 * 3_600_000)
    eff, _ = apply(uncertain(), d, log_ms=CALL_DEADLINE + 500)
    assert eff.state is State.UNCERTAIN and Flag.DECISION_IGNORED in eff.flags
    assert eff.log_time(d) == CALL_DEADLINE + 500 and eff.has(d.event_id)
    # Once the call can no longer land the log's time allows it, but a writer whose clock ran more
    # than 5 s ahead of the log's is flagged and its ABSENT refused.
    later, _ = apply(uncertain(), d, log_ms=CALL_DEADLINE + DECISION_GRACE_MS)
    assert later.state is State.UNCERTAIN and Flag.CLOCK_SKEW in later.flags
    honest = decision(DecisionKind.ABSENT, at=CALL_DEADLINE + DECISION_GRACE_MS + 3_000)
    taken, _ = apply(uncertain(), honest, log_ms=CALL_DEADLINE + DECISION_GRACE_MS)
    assert taken.state is State.ABSENT and Flag.CLOCK_SKEW not in taken.flags


def test_a_slow_writers_deadline_is_a_duration_from_when_the_log_took_its_intent() -> None:
    """given an intent from an agent whose clock runs two hours behind (its deadline already past for
    everyone else), when the log took it at T0, then its deadline is T0 plus its timeout, and an
    ABSENT answer logged before then plus lands_within is ignored."""
    slow = 2 * 3_600_000
    i = intent(at=T0 - slow, deadline=CALL_DEADLINE - slow)
    eff, _ = apply(None, i, log_ms=T0)
    assert eff.state is State.PENDING and eff.deadline_ms == CALL_DEADLINE
    eff, _ = apply(eff, executed(Outcome.UNKNOWN, error="eof", at=T0 - slow + 5_000), log_ms=T0 + 5_000)
    r = resolution(Verdict.ABSENT, at=CALL_DEADLINE + 1)
    early, _ = apply(eff, r, log_ms=CALL_DEADLINE + 1)
    assert early.state is State.UNCERTAIN and Flag.ANSWER_IGNORED in early.flags
    r = resolution(Verdict.ABSENT, at=CALL_DEADLINE + DECISION_GRACE_MS)  # a reconciler with a right clock
    on_time, _ = apply(eff, r, log_ms=CALL_DEADLINE + DECISION_GRACE_MS)
    assert on_time.state is State.ABSENT


def test_a_timeout_the_log_took_before_its_deadline_is_not_admitted() -> None:
    """given a PENDING effect, when a timeout command from a processor whose clock runs ahead reaches
    the log before the deadline, then it is not a fact (the same id sent again later can be); at or
    after the deadline it is."""
    eff, _ = apply(None, intent(), log_ms=T0)
    t = timeout(at=CALL_DEADLINE + 3_600_000)
    early, emitted = apply(eff, t, log_ms=CALL_DEADLINE - 1)
    assert early is eff and emitted == ()
    due, emitted = apply(early, t, log_ms=CALL_DEADLINE)
    assert due.state is State.UNCERTAIN and due.has(t.event_id) and len(emitted) == 1


def test_created_and_updated_are_the_log_times() -> None:
    """given facts from writers with skewed clocks, the effect's created/updated (stuck, retention,
    what people are shown) are the times the log took them."""
    eff, _ = apply(None, intent(at=T0 + 7_200_000, deadline=CALL_DEADLINE + 7_200_000), log_ms=T0)
    eff, _ = apply(eff, executed(Outcome.UNKNOWN, error="eof", at=T0 - 7_200_000), log_ms=T0 + 3_000)
    assert (eff.created_ms, eff.updated_ms) == (T0, T0 + 3_000)


def test_an_early_absent_decision_stays_ignored_after_the_deadline_passes() -> None:
    """given an early ABSENT decision on a PENDING effect, when the CALL timeout is applied later,
    then the effect is UNCERTAIN, not ABSENT: the decision was made while the call could land, and
    that does not change with time."""
    eff = effect_of(intent(), decision(DecisionKind.ABSENT, at=T0 + 1), timeout(TimeoutPhase.CALL))
    assert eff.state is State.UNCERTAIN
    assert Flag.DECISION_IGNORED in eff.flags


def test_absent_decision_before_its_intent_arrives_is_judged_once_the_intent_is_known() -> None:
    """given an early ABSENT decision that arrives before the intent (another producer), when the
    intent arrives, then the result equals in-order delivery: ignored. Without any intent of its
    attempt the decision is ignored too (nothing says when the call would stop)."""
    d = decision(DecisionKind.ABSENT, at=T0 + 1)
    alone = effect_of(d)
    assert alone.state is not State.ABSENT and Flag.DECISION_IGNORED in alone.flags
    assert effect_of(d, intent()) == effect_of(intent(), d)
    assert effect_of(d, intent()).state is State.PENDING


@pytest.mark.parametrize("kind", [DecisionKind.ABANDONED, DecisionKind.CONFIRMED, DecisionKind.COMPENSATED])
def test_decisions_that_cannot_cause_an_execution_count_before_the_deadline(kind: DecisionKind) -> None:
    """given a PENDING effect, when a person abandons, confirms or compensates it before its
    deadline, then the decision counts: none of them lets an agent execute again."""
    eff = effect_of(intent(), decision(kind, at=T0 + 1, receipt_id="re_p" if kind is DecisionKind.CONFIRMED else None))
    assert eff.state.value == kind.value
    assert Flag.DECISION_IGNORED not in eff.flags


# --- decision_refusal: where a person decides -------------------------------------------------------


@pytest.mark.parametrize(
    ("events", "now", "refused", "retry"),
    [
        pytest.param([intent()], T0, True, CALL_DEADLINE + DECISION_GRACE_MS - T0, id="pending-before-deadline"),
        pytest.param([intent()], CALL_DEADLINE + 60_000, True, None, id="pending-after-deadline"),
        pytest.param([intent(), executed()], RECEIPT_DEADLINE + 1, True, None, id="executed"),
        pytest.param([intent(), executed(Outcome.UNKNOWN, error="eof")], T0 + 600, True,
                     CALL_DEADLINE + DECISION_GRACE_MS - T0 - 600, id="uncertain-within-deadline-and-grace"),
        pytest.param([intent(), executed(Outcome.UNKNOWN, error="eof")], CALL_DEADLINE + DECISION_GRACE_MS - 1, True,
                     1, id="uncertain-in-the-grace"),
        pytest.param([intent(), executed(Outcome.UNKNOWN, error="eof")], CALL_DEADLINE + DECISION_GRACE_MS, False,
                     None, id="uncertain-after-deadline-and-grace"),
        pytest.param([intent(), resolution(Verdict.ESCALATE, at=T0 + 700)], T0 + 800, True,
                     CALL_DEADLINE + DECISION_GRACE_MS - T0 - 800, id="escalated-within-deadline"),
        pytest.param([intent(), timeout(), resolution(Verdict.ESCALATE)], CALL_DEADLINE + DECISION_GRACE_MS, False,
                     None, id="escalated-after-deadline"),
        pytest.param([executed(Outcome.UNKNOWN, error="eof")], T0 + 10**9, True, None, id="no-intent-known"),
    ],
)  # fmt: skip
def test_decision_refusal_of_absent(events: list[Event], now: int, refused: bool, retry: int | None) -> None:
    """given an effect, when a person asks to record ABSENT at ``now``, then it is refused exactly while
    the attempt may still land (PENDING/EXECUTED, before deadline + grace, or no intent known), with
    how long to wait when waiting helps."""
    r = decision_refusal(effect_of(*events), DecisionKind.ABSENT, now)
    assert (r is not None) is refused
    if r is not None:
        assert r.retry_after_ms == retry
        assert r.reason


@pytest.mark.parametrize("kind", [DecisionKind.ABANDONED, DecisionKind.CONFIRMED, DecisionKind.COMPENSATED])
def test_decision_refusal_never_refuses_what_cannot_cause_an_execution(kind: DecisionKind) -> None:
    """given a PENDING effect within its deadline, when a person abandons, confirms or compensates,
    then nothing is refused."""
    assert decision_refusal(effect_of(intent()), kind, T0) is None


@pytest.mark.parametrize("record", [
    EffectState(KEY, State.CONFIRMED, "payments", "refund.create", "default", "run-1", "s", DIGEST, 1, 1, T0, T0),
    UncertainEffect(f"uncertain:1:0:{KEY}", KEY, T0, 1, "payments", "refund.create", REQUEST, DIGEST, "x", T0, T0),
], ids=["EffectState", "UncertainEffect"])  # fmt: skip
def test_apply_refuses_a_record_that_is_not_an_event(record: object) -> None:
    """given any effect (or none), when a state record or a reconcilers' work item is applied, then
    TypeError: only events are facts."""
    with pytest.raises(TypeError, match="is not an event"):
        apply(None, record)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="is not an event"):
        apply(uncertain(), record)  # type: ignore[arg-type]


# --- re-execution ---------------------------------------------------------------------------------


@pytest.mark.parametrize("closed_by", ["absent", "failed"])
def test_re_execution_after_absent_or_failed(closed_by: str) -> None:
    """given attempt 1 ABSENT (reconciled) or FAILED, when an attempt-2 intent is applied, then the
    effect is PENDING at attempt 2 with attempt 2's deadline; and when attempt 2 executes OK and gets a
    receipt, then it is CONFIRMED with one execution and no flags."""
    if closed_by == "absent":
        first: list[Event] = [intent(), executed(Outcome.UNKNOWN, error="eof"), resolution(Verdict.ABSENT)]
        expected = State.ABSENT
    else:
        first = [intent(), executed(Outcome.FAILED, error="declined")]
        expected = State.FAILED
    eff = effect_of(*first)
    assert eff.state is expected
    i2 = intent(attempt=2, at=T0 + 100_000, deadline=T0 + 110_000)
    eff, emitted = apply(eff, i2)
    assert eff.state is State.PENDING
    assert eff.attempt == 2
    assert eff.intent == i2
    assert eff.first_intent is not None and eff.first_intent.attempt == 1
    assert eff.deadline_ms == T0 + 110_000
    assert emitted == ()
    done = fold([executed(Outcome.OK, attempt=2, at=T0 + 100_500), receipt("re_2", attempt=2, at=T0 + 100_600)], eff)
    assert done is not None
    eff = done
    assert eff.state is State.CONFIRMED
    assert eff.attempt == 2
    assert eff.executions == 1
    assert eff.receipt_ids == ("re_2",)
    assert eff.flags == ()


def test_uncertain_attempt_2_emits_again() -> None:
    """given attempt 1 was uncertain (emitted once) and then ABSENT, when attempt 2 also ends with an
    unknown outcome, then a second UncertainEffect is emitted, for attempt 2."""
    eff = effect_of(intent(), executed(Outcome.UNKNOWN, error="eof"), resolution(Verdict.ABSENT))
    eff, _ = apply(eff, intent(attempt=2, at=T0 + 100_000, deadline=T0 + 110_000))
    eff, emitted = apply(eff, executed(Outcome.UNKNOWN, attempt=2, at=T0 + 100_500, error="eof"))
    assert eff.state is State.UNCERTAIN
    assert len(emitted) == 1
    assert emitted[0].attempt == 2
    assert emitted[0].event_id == f"uncertain:2:0:{KEY}"
    assert emitted[0].deadline_ms == T0 + 110_000


# --- order tolerance and flags --------------------------------------------------------------------


def test_receipt_before_intent_flags_no_intent_until_the_intent_arrives() -> None:
    """given nothing, when a webhook receipt arrives before its intent, then the effect is CONFIRMED
    and flagged NO_INTENT; when the intent and execution then arrive, then the flag is gone and the
    effect equals the one built in order."""
    i, x, r = intent(), executed(), receipt("re_1", source=ReceiptSource.WEBHOOK)
    early, _ = apply(None, r)
    assert early.state is State.CONFIRMED
    assert early.flags == (Flag.NO_INTENT,)
    assert early.intent is None and early.first_intent is None
    assert to_state(early).target == ""
    late = fold([i, x], early)
    assert late is not None
    assert Flag.NO_INTENT not in late.flags
    assert late.flags == ()
    assert late.state is State.CONFIRMED
    assert late == fold([i, x, r])


def test_two_ok_executions_flag_duplicate_execution() -> None:
    """given attempt 1 executed OK (then wrongly judged ABSENT), when attempt 2 also executes OK,
    then the effect counts two executions and is flagged DUPLICATE_EXECUTION."""
    eff = effect_of(
        intent(),
        executed(Outcome.OK),
        timeout(TimeoutPhase.RECEIPT, at=RECEIPT_DEADLINE, deadline=RECEIPT_DEADLINE),
        resolution(Verdict.ABSENT, at=RECEIPT_DEADLINE + 1),
        intent(attempt=2, at=T0 + 100_000, deadline=T0 + 110_000),
        executed(Outcome.OK, attempt=2, at=T0 + 100_500),
    )
    assert eff.executions == 2
    assert Flag.DUPLICATE_EXECUTION in eff.flags
    assert Flag.DUPLICATE_RECEIPT not in eff.flags


def test_one_ok_execution_is_not_a_duplicate() -> None:
    """given one OK and one UNKNOWN execution, when folded, then only the OK one counts and nothing is
    flagged."""
    eff = effect_of(intent(), executed(Outcome.UNKNOWN, at=T0 + 100, error="eof"), executed(Outcome.OK, at=T0 + 200))
    assert eff.executions == 1
    assert Flag.DUPLICATE_EXECUTION not in eff.flags


def test_two_distinct_receipt_ids_flag_duplicate_receipt() -> None:
    """given a CONFIRMED effect with receipt re_1, when a second receipt with a different id arrives,
    then DUPLICATE_RECEIPT is flagged, both ids are kept sorted, and the earliest stays the receipt."""
    eff = effect_of(intent(), executed(), receipt("re_b", at=T0 + 600))
    eff, _ = apply(eff, receipt("re_a", at=T0 + 700, source=ReceiptSource.WEBHOOK))
    assert eff.state is State.CONFIRMED
    assert Flag.DUPLICATE_RECEIPT in eff.flags
    assert eff.receipt_ids == ("re_a", "re_b")
    assert eff.receipt is not None and eff.receipt.receipt_id == "re_b"


def test_same_receipt_id_from_call_and_reconciler_is_not_a_duplicate() -> None:
    """given a receipt re_1 from the call, when a reconciler later FOUND the same re_1, then there is
    one receipt id and no DUPLICATE_RECEIPT flag."""
    eff = effect_of(intent(), executed(), receipt("re_1"), resolution(Verdict.FOUND, receipt_id="re_1"))
    assert eff.state is State.CONFIRMED
    assert eff.receipt_ids == ("re_1",)
    assert eff.flags == ()
    assert eff.version == 4


def test_second_intent_with_a_different_digest_flags_conflict() -> None:
    """given an effect whose first intent has digest d1, when an intent with a different digest
    arrives for the same key, then CONFLICT is flagged and the first intent is kept as first."""
    first = intent()
    eff = effect_of(first, executed(Outcome.FAILED, error="x"))
    eff, _ = apply(eff, intent(attempt=2, at=T0 + 100_000, digest=OTHER_DIGEST))
    assert Flag.CONFLICT in eff.flags
    assert eff.first_intent == first
    assert to_state(eff).request_digest == DIGEST


def test_second_intent_with_the_same_digest_is_not_a_conflict() -> None:
    """given an effect with a first intent, when a re-execution intent with the same digest arrives,
    then nothing is flagged."""
    eff = effect_of(intent(), executed(Outcome.FAILED, error="x"), intent(attempt=2, at=T0 + 100_000))
    assert eff.flags == ()


# --- emission, idempotence, effect ids ------------------------------------------------------------


def test_becoming_uncertain_emits_once_and_unrelated_events_after_emit_nothing() -> None:
    """given a PENDING effect, when it becomes UNCERTAIN it emits exactly one UncertainEffect; when
    unrelated events follow (an UNKNOWN resolution, a late CALL timeout) then nothing more is
    emitted while it stays UNCERTAIN."""
    total: list[UncertainEffect] = []
    eff: Effect | None = None
    stream: list[Event] = [
        intent(),
        executed(Outcome.UNKNOWN, error="eof"),
        resolution(Verdict.UNKNOWN, reason="503"),
        timeout(TimeoutPhase.CALL),
        resolution(Verdict.UNKNOWN, at=T0 + 25_000, tries=2),
    ]
    for e in stream:
        eff, emitted = apply(eff, e)
        total.extend(emitted)
    assert eff is not None and eff.state is State.UNCERTAIN
    assert len(total) == 1
    assert total[0].event_id == f"uncertain:1:0:{KEY}"


def test_no_emission_for_non_uncertain_transitions() -> None:
    """given a fresh key, when a full happy path is applied (intent, OK, receipt), then nothing is
    emitted at any step."""
    eff: Effect | None = None
    happy: list[Event] = [intent(), executed(), receipt()]
    for e in happy:
        eff, emitted = apply(eff, e)
        assert emitted == ()


@pytest.mark.parametrize("step", range(4))
def test_applying_an_event_twice_returns_the_identical_object(step: int) -> None:
    """given an effect that already holds an event, when the same event is applied again, then the
    very same Effect object is returned and nothing is emitted."""
    events: list[Event] = [
        intent(),
        executed(Outcome.UNKNOWN, error="eof"),
        resolution(Verdict.UNKNOWN),
        decision(DecisionKind.ABSENT),
    ]
    eff = effect_of(*events)
    again, emitted = apply(eff, events[step])
    assert again is eff
    assert emitted == ()


def test_re_applying_the_uncertain_event_does_not_emit_again() -> None:
    """given an effect that just became UNCERTAIN, when the event that made it uncertain is
    redelivered, then nothing is emitted (at-least-once delivery must not duplicate the work item)."""
    x = executed(Outcome.UNKNOWN, error="eof")
    eff, first = apply(effect_of(intent()), x)
    assert len(first) == 1
    _, second = apply(eff, x)
    assert second == ()


def test_an_event_for_another_effect_raises() -> None:
    """given an effect for KEY, when an event for another effect id is applied, then ValueError is
    raised (and the effect is untouched)."""
    eff = effect_of(intent())
    with pytest.raises(ValueError, match="applied to effect"):
        apply(eff, intent(key=OTHER_KEY, eid="other"))
    assert eff.version == 1


# --- to_state -------------------------------------------------------------------------------------


def test_to_state_fields() -> None:
    """given an effect with two attempts, a duplicate-delivered event and two receipts, when it is
    published with to_state, then version counts distinct events, executions/receipt_ids/flags are
    reported (flags as strings, ids sorted), identity comes from the first intent, and created/updated
    are the min/max event times."""
    first = intent(at=T0)
    events: list[Event] = [
        first,
        executed(Outcome.OK, at=T0 + 500),
        timeout(TimeoutPhase.RECEIPT, at=RECEIPT_DEADLINE, deadline=RECEIPT_DEADLINE),
        resolution(Verdict.ABSENT, at=RECEIPT_DEADLINE + 5),
        intent(attempt=2, at=T0 + 100_000, deadline=T0 + 110_000),
        executed(Outcome.OK, attempt=2, at=T0 + 100_500),
        receipt("re_z", attempt=2, at=T0 + 100_600),
        receipt("re_a", attempt=1, at=T0 + 200_000, source=ReceiptSource.WEBHOOK),
    ]
    eff = effect_of(*events, events[1], events[6])  # two redeliveries
    s = to_state(eff)
    assert isinstance(s, EffectState)
    assert s.effect_id == KEY
    assert s.state is State.CONFIRMED
    assert (s.target, s.operation, s.namespace, s.run_id, s.step) == (
        "payments",
        "refund.create",
        "default",
        "run-1",
        "refund-order-123",
    )
    assert s.request_digest == DIGEST
    assert s.attempt == 2
    assert s.version == len(events) == 8
    assert s.created_ms == T0
    assert s.updated_ms == T0 + 200_000
    assert s.deadline_ms is None
    assert s.receipt_id == "re_z"  # the earliest receipt
    assert s.executions == 2
    assert s.receipt_ids == ("re_a", "re_z")
    assert s.flags == ("DUPLICATE_EXECUTION", "DUPLICATE_RECEIPT")
    assert all(type(f) is str for f in s.flags)
    assert s.reason is None


def test_to_state_of_a_pending_effect() -> None:
    """given a PENDING effect, when published, then it carries its deadline, version 1, no receipt,
    and created == updated == the intent time."""
    s = to_state(effect_of(intent(at=T0 + 7)))
    assert s.state is State.PENDING
    assert s.deadline_ms == CALL_DEADLINE
    assert s.version == 1
    assert s.receipt_id is None and s.receipt_ids == () and s.flags == ()
    assert s.created_ms == s.updated_ms == T0 + 7


def test_an_absent_answer_counts_from_when_it_was_asked_not_only_when_the_log_took_it() -> None:
    """given an intent whose call may land until T+12 s (10 s timeout, 2 s lands_within), when an
    "absent" asked at T+5 s (its writer's clock is right) reaches the log only at T+40 s (held in an
    outbox), then it does not count: the destination was asked while the call could still land. The
    earlier of the writer's claim and the log's time is when it was asked at the latest."""
    t0 = T0
    i = intent(at=t0, deadline=t0 + 10_000)
    eff, _ = apply(None, i, log_ms=t0)
    eff, _ = apply(eff, executed(Outcome.UNKNOWN, error="eof", at=t0 + 10_000), log_ms=t0 + 10_000)
    stale = resolution(Verdict.ABSENT, at=t0 + 5_000)
    late, _ = apply(eff, stale, log_ms=t0 + 40_000)
    assert late.state is State.UNCERTAIN and Flag.ANSWER_IGNORED in late.flags
    fresh = resolution(Verdict.ABSENT, at=t0 + 12_000, eid="fresh")
    taken, _ = apply(eff, fresh, log_ms=t0 + 12_050)
    assert taken.state is State.ABSENT


def test_an_absent_for_a_refused_attempt_waits_for_the_attempt_before_it() -> None:
    """given attempt 1 with a 600 s timeout (never settled) and an attempt 2 whose claim the log
    refused, when an ABSENT for attempt 2 is logged after attempt 2's own short window but within
    attempt 1's, then it does not count: attempt 1's call may still land."""
    from effect_ledger.core.effect import REFUSED_CLAIM, claimed_event_id
    from effect_ledger.core.model import Claimed

    i1 = intent(attempt=1, at=T0, deadline=T0 + 600_000)
    i2 = intent(attempt=2, at=T0 + 1_000, deadline=T0 + 2_000)
    refused = Claimed(claimed_event_id(KEY, 2), KEY, T0 + 1_000, 2, REFUSED_CLAIM, REFUSED_CLAIM)
    r = resolution(Verdict.ABSENT, attempt=2, at=T0 + 20_000)
    eff = effect_of(i1, executed(Outcome.UNKNOWN, error="eof", at=T0 + 600_000), i2, refused, r)
    assert eff.state is not State.ABSENT and Flag.ANSWER_IGNORED in eff.flags

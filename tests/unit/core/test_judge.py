"""``effect_ledger.core.reconcile.judge``: a reconciler's answer becomes a Resolution event under the rules
that keep retries safe; and ``Backoff``."""

from __future__ import annotations

import json

import pytest

from effect_ledger.core.effect import Effect, apply, fold
from effect_ledger.core.model import Executed, Intent, Outcome, Resolution, State, Verdict
from effect_ledger.core.reconcile import (
    Absent,
    Backoff,
    Found,
    Target,
    Unknown,
    judge,
    next_check_ms,
    previous_tries,
)

KEY = "payments:" + "5ca1d0a8" * 8
T0 = 1_700_000_000_000
DEADLINE = T0 + 10_000
RETENTION_S = 3600.0
TARGET = Target("payments", retention_s=RETENTION_S)
AFTER_DEADLINE = DEADLINE + 1_000
# The first moment a call of attempt 1 can no longer land (deadline + the target's lands_within).
LANDED = DEADLINE + TARGET.lands_within_ms
RECON = "gateway-reconciler"


def intent(attempt: int = 1, at: int = T0, deadline: int = DEADLINE) -> Intent:
    return Intent(
        f"intent-{attempt}",
        KEY,
        at,
        attempt,
        "payments",
        "refund.create",
        "default",
        "run-1",
        "refund-order-123",
        '{"amount":4800,"order":"123"}',
        "d1" * 32,
        deadline,
        "worker-1",
    )


def unknown_exec(attempt: int = 1, at: int = T0 + 500) -> Executed:
    return Executed(f"exec-{attempt}", KEY, at, attempt, Outcome.UNKNOWN, "read timeout", at - 400, at, None, "w")


def uncertain(*more: Resolution) -> Effect:
    """Attempt 1, call outcome unknown, plus the given earlier resolutions."""
    eff = fold([intent(), unknown_exec(), *more])
    assert eff is not None
    assert eff.state is State.UNCERTAIN
    return eff


def earlier_unknowns(n: int, attempt: int = 1) -> list[Resolution]:
    """``n`` previous UNKNOWN resolutions, as judge would have written them (tries 1..n)."""
    return [
        Resolution(
            f"resolution:{attempt}:{t}:{KEY}",
            KEY,
            AFTER_DEADLINE + t,
            attempt,
            Verdict.UNKNOWN,
            RECON,
            "503",
            None,
            None,
            t,
        )
        for t in range(1, n + 1)
    ]


# --- Found ----------------------------------------------------------------------------------------


def test_found_is_found_with_the_receipt() -> None:
    eff = uncertain()
    r = judge(eff, TARGET, Found("re_1", {"id": "re_1", "amount": 4800}), RECON, AFTER_DEADLINE)
    assert r.verdict is Verdict.FOUND
    assert r.receipt_id == "re_1"
    assert json.loads(r.value or "") == {"id": "re_1", "amount": 4800}
    assert (r.effect_id, r.attempt, r.at_ms, r.reconciler, r.tries) == (KEY, 1, AFTER_DEADLINE, RECON, 1)
    assert r.event_id == f"resolution:1:1:{KEY}"
    after, _ = apply(eff, r)
    assert after.state is State.CONFIRMED
    assert after.receipt is not None and after.receipt.receipt_id == "re_1"


def test_found_is_proof_even_before_the_deadline_and_past_retention() -> None:
    eff = uncertain()
    assert judge(eff, TARGET, Found("re_1"), RECON, T0 + 600).verdict is Verdict.FOUND
    late = T0 + int(RETENTION_S * 1000) * 10
    assert judge(eff, TARGET, Found("re_1"), RECON, late).verdict is Verdict.FOUND


# --- Absent ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("now", [LANDED, LANDED + 1_000, T0 + int(RETENTION_S * 1000)])
def test_absent_once_the_call_can_no_longer_land_is_absent(now: int) -> None:
    eff = uncertain()
    r = judge(eff, TARGET, Absent("no such refund"), RECON, now)
    assert r.verdict is Verdict.ABSENT
    assert r.reason == "no such refund"
    assert r.tries == 1
    after, _ = apply(eff, r)
    assert after.state is State.ABSENT


def test_absent_without_a_reason_gets_one() -> None:
    r = judge(uncertain(), TARGET, Absent(), RECON, LANDED)
    assert r.verdict is Verdict.ABSENT
    assert r.reason


def test_absent_before_the_deadline_is_unknown_and_consumes_no_try() -> None:
    eff = uncertain()
    now = DEADLINE - 1
    r1 = judge(eff, TARGET, Absent(), RECON, now)
    assert r1.verdict is Verdict.UNKNOWN
    assert "deadline" in r1.reason
    assert r1.tries == previous_tries(eff) == 0
    after, _ = apply(eff, r1)
    assert after.state is State.UNCERTAIN
    # asked again before the deadline: the same event, so it is folded once
    r2 = judge(after, TARGET, Absent(), RECON, DEADLINE - 100)
    assert r2.event_id == r1.event_id
    again, emitted = apply(after, r2)
    assert again is after and emitted == ()
    assert again.version == eff.version + 1
    # the next real try is still try 1
    assert judge(again, TARGET, Unknown("503"), RECON, AFTER_DEADLINE).tries == 1


@pytest.mark.parametrize(
    ("lands_within_s", "now", "verdict"),
    [
        # A call cut off at its deadline may still take effect for lands_within after it: an
        # "absent" answer then proves nothing (ABSENT would let attempt 2 call a second time).
        (2.0, DEADLINE, Verdict.UNKNOWN),
        (2.0, DEADLINE + 1_999, Verdict.UNKNOWN),
        (2.0, DEADLINE + 2_000, Verdict.ABSENT),
        (30.0, DEADLINE + 29_999, Verdict.UNKNOWN),
        (30.0, DEADLINE + 30_000, Verdict.ABSENT),
        (0.001, DEADLINE + 1, Verdict.ABSENT),
    ],
)
def test_absent_while_the_call_may_still_land_is_unknown(lands_within_s: float, now: int, verdict: Verdict) -> None:
    target = Target("payments", retention_s=RETENTION_S, lands_within_s=lands_within_s)
    eff = uncertain()
    r = judge(eff, target, Absent("no such refund"), RECON, now)
    assert r.verdict is verdict
    if verdict is Verdict.UNKNOWN:
        assert f"may still land until {DEADLINE + target.lands_within_ms}" in r.reason
        assert r.tries == 0  # not a try: the escalation count is not run down by waiting
        # Asked again once it can no longer land, and not sooner than the backoff.
        until = DEADLINE + target.lands_within_ms
        assert next_check_ms(apply(eff, r)[0], target, now) == max(until, now + target.backoff.delay_ms(0))
    else:
        assert r.tries == 1


def test_the_next_check_after_an_early_unknown_is_not_before_the_backoff() -> None:
    target = Target("payments", lands_within_s=0.5, backoff=Backoff(first_s=5.0))
    eff, _ = apply(uncertain(), judge(uncertain(), target, Absent(), RECON, DEADLINE))
    assert next_check_ms(eff, target, DEADLINE) == DEADLINE + 5_000


def test_absent_before_the_deadline_after_earlier_unknowns_keeps_the_count() -> None:
    eff = uncertain(*earlier_unknowns(2))
    r = judge(eff, TARGET, Absent(), RECON, DEADLINE - 1)
    assert r.verdict is Verdict.UNKNOWN
    assert r.tries == 2
    after, _ = apply(eff, r)
    assert previous_tries(after) == 2


def test_absent_past_retention_since_the_first_intent_escalates() -> None:
    eff = uncertain()
    past = T0 + int(RETENTION_S * 1000) + 1
    r = judge(eff, TARGET, Absent(), RECON, past)
    assert r.verdict is Verdict.ESCALATE
    assert "retention" in r.reason
    after, _ = apply(eff, r)
    assert after.state is State.ESCALATED


def test_retention_counts_from_the_first_intent_not_the_latest() -> None:
    """Attempt 2 started recently, but attempt 1's intent is older than the retention: escalate."""
    retention_ms = int(RETENTION_S * 1000)
    absent1 = Resolution(f"resolution:1:1:{KEY}", KEY, AFTER_DEADLINE, 1, Verdict.ABSENT, RECON)
    start2 = T0 + retention_ms - 60_000
    eff = fold(
        [
            intent(),
            unknown_exec(),
            absent1,
            intent(2, at=start2, deadline=start2 + 10_000),
            unknown_exec(2, at=start2 + 500),
        ]
    )
    assert eff is not None and eff.state is State.UNCERTAIN and eff.attempt == 2
    r = judge(eff, TARGET, Absent(), RECON, T0 + retention_ms + 1)
    assert r.verdict is Verdict.ESCALATE
    assert r.attempt == 2


def test_no_retention_never_escalates_an_absent() -> None:
    forever = Target("payments", retention_s=None)
    r = judge(uncertain(), forever, Absent(), RECON, T0 + 365 * 24 * 3600 * 1000)
    assert r.verdict is Verdict.ABSENT


# --- Unknown and None -----------------------------------------------------------------------------


def test_unknown_is_unknown_at_try_1() -> None:
    r = judge(uncertain(), TARGET, Unknown("503 from the gateway"), RECON, AFTER_DEADLINE)
    assert r.verdict is Verdict.UNKNOWN
    assert r.reason == "503 from the gateway"
    assert r.tries == 1
    assert r.event_id == f"resolution:1:1:{KEY}"


@pytest.mark.parametrize("previous", [1, 2, 3])
def test_unknown_increments_tries(previous: int) -> None:
    eff = uncertain(*earlier_unknowns(previous))
    r = judge(eff, TARGET, Unknown("503"), RECON, AFTER_DEADLINE + 100)
    assert r.verdict is Verdict.UNKNOWN
    assert r.tries == previous + 1
    assert r.event_id == f"resolution:1:{previous + 1}:{KEY}"
    after, emitted = apply(eff, r)
    assert after.state is State.UNCERTAIN and emitted == ()
    assert after.version == eff.version + 1  # a new event, not a duplicate


@pytest.mark.parametrize("max_tries", [2, 5])
def test_unknown_escalates_at_max_tries(max_tries: int) -> None:
    target = Target("payments", backoff=Backoff(max_tries=max_tries))
    below = judge(uncertain(*earlier_unknowns(max_tries - 2)), target, Unknown("503"), RECON, AFTER_DEADLINE + 100)
    assert below.verdict is Verdict.UNKNOWN and below.tries == max_tries - 1
    eff = uncertain(*earlier_unknowns(max_tries - 1))
    r = judge(eff, target, Unknown("503"), RECON, AFTER_DEADLINE + 100)
    assert r.verdict is Verdict.ESCALATE
    assert r.tries == max_tries
    assert "503" in r.reason
    after, _ = apply(eff, r)
    assert after.state is State.ESCALATED


def test_default_backoff_escalates_at_five_tries() -> None:
    assert TARGET.backoff.max_tries == 5
    r = judge(uncertain(*earlier_unknowns(4)), TARGET, Unknown("503"), RECON, AFTER_DEADLINE + 100)
    assert r.verdict is Verdict.ESCALATE


def test_tries_of_an_earlier_attempt_do_not_count() -> None:
    absent1 = Resolution(f"resolution:1:5:{KEY}", KEY, AFTER_DEADLINE + 10, 1, Verdict.ABSENT, RECON, tries=5)
    start2 = T0 + 100_000
    eff = fold(
        [
            intent(),
            unknown_exec(),
            *earlier_unknowns(4),
            absent1,
            intent(2, at=start2, deadline=start2 + 10_000),
            unknown_exec(2, at=start2 + 500),
        ]
    )
    assert eff is not None and eff.attempt == 2
    r = judge(eff, TARGET, Unknown("503"), RECON, start2 + 20_000)
    assert r.verdict is Verdict.UNKNOWN
    assert (r.attempt, r.tries) == (2, 1)
    assert r.event_id == f"resolution:2:1:{KEY}"


def test_no_answer_escalates_at_once() -> None:
    eff = uncertain()
    r = judge(eff, TARGET, None, "none", AFTER_DEADLINE)
    assert r.verdict is Verdict.ESCALATE
    assert "payments" in r.reason
    assert r.tries == 1
    after, _ = apply(eff, r)
    assert after.state is State.ESCALATED


# --- Backoff --------------------------------------------------------------------------------------


def test_backoff_delay_grows_then_is_capped() -> None:
    b = Backoff()
    delays = [b.delay_ms(t) for t in range(1, 15)]
    assert delays[:5] == [1000, 2000, 4000, 8000, 16000]
    assert all(x <= y for x, y in zip(delays, delays[1:], strict=False))
    assert max(delays) == delays[-1] == 300_000
    assert b.delay_ms(0) == 1000  # tries below 1 never shrink the first delay


def test_backoff_custom_parameters() -> None:
    b = Backoff(first_s=0.5, factor=3.0, max_s=10.0)
    assert [b.delay_ms(t) for t in range(1, 6)] == [500, 1500, 4500, 10_000, 10_000]


def test_backoff_is_capped_for_very_many_tries() -> None:
    """BUG (effect_ledger/core/reconcile.py:94, Backoff.delay_ms): ``self.factor ** (tries - 1)`` is a float
    power, which raises OverflowError once tries exceeds ~1025 (factor 2) instead of returning the cap.
    Fix: return ``max_s`` once the exponent passes the cap (e.g. compare ``tries - 1`` with
    ``math.log(max_s / first_s, factor)``), or catch OverflowError and return ``max_s``."""
    b = Backoff(max_tries=10_000)
    assert b.delay_ms(2_000) == 300_000


def test_absent_waits_for_the_latest_deadline_of_the_attempts_intents() -> None:
    """Two intents of attempt 1 (two hosts raced for the key): the later deadline is the one whose
    call may still land, whichever intent owns the attempt."""
    late = Intent(
        "intent-1b",
        KEY,
        T0 + 50,
        1,
        "payments",
        "refund.create",
        "default",
        "run-1",
        "refund-order-123",
        '{"amount":4800,"order":"123"}',
        "d1" * 32,
        DEADLINE + 60_000,
        "worker-2",
    )
    from effect_ledger.core.model import Claimed

    owner = Claimed("claimed-1", KEY, T0 + 60, 1, "intent-1", "worker-1")  # the first intent owns it
    eff = fold([intent(), late, owner, unknown_exec()])
    assert eff is not None and eff.state is State.UNCERTAIN
    assert eff.intent is not None and eff.intent.deadline_ms == DEADLINE  # the owner's, the earlier
    assert judge(eff, TARGET, Absent(), RECON, LANDED).verdict is Verdict.UNKNOWN
    assert judge(eff, TARGET, Absent(), RECON, DEADLINE + 60_000 + TARGET.lands_within_ms).verdict is Verdict.ABSENT
    # The reconcilers' work item carries that deadline too (Kafka mode judges from it).
    from effect_ledger.core.effect import uncertain_event

    assert uncertain_event(eff).deadline_ms == DEADLINE + 60_000


@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf"), 8 * 86400.0, "2s"])
def test_a_lands_within_no_call_can_have_is_refused(bad: object) -> None:
    from effect_ledger.errors import TargetsError

    with pytest.raises(TargetsError, match="lands_within_s must be between 0 and"):
        Target("payments", lands_within_s=bad)  # type: ignore[arg-type]


def test_only_an_early_answers_own_event_id_marks_it_early() -> None:
    from effect_ledger.core.reconcile import answered_too_early

    odd = "early:" + "5ca1d0a8" * 8  # a key that holds the marker's text
    r = judge(uncertain(), TARGET, Unknown("503"), RECON, AFTER_DEADLINE)
    assert not answered_too_early(r)
    looks_early = Resolution(f"resolution:1:1:{odd}", odd, AFTER_DEADLINE, 1, Verdict.UNKNOWN, RECON, "503", tries=1)
    assert not answered_too_early(looks_early)
    assert answered_too_early(judge(uncertain(), TARGET, Absent(), RECON, DEADLINE))

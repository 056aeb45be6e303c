"""Property tests of the effect fold over random, realistic event histories of one effect_id.

Hypothesis profile note: no global profile is registered or loaded here; every property carries its
own ``@settings(max_examples=EXAMPLES, deadline=None)`` with EXAMPLES = 500, so the file runs
8 properties x 500 = 4,000 examples (about 5-10 s on a laptop). ``deadline=None`` because a fold of
~30 events can take a few ms on a loaded CI machine; that is not a failure.

A history has 1-3 attempts; each attempt has (usually) an intent, sometimes a second one with another
request digest, optional executed events with random outcomes, optional receipts drawn from a small
pool of receipt ids (so the same id recurs across sources), optional CALL/RECEIPT timeouts (with the
deterministic ids ``expire`` would give them), reconciler resolutions with random verdicts, and
decisions by a person. Every event has its own event id.
"""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from streams.effect import Effect, apply, expire, fold, timeout_event_id
from streams.model import (
    Decision,
    DecisionKind,
    Event,
    Executed,
    Flag,
    Intent,
    Outcome,
    Receipt,
    ReceiptSource,
    Resolution,
    State,
    TimeoutPhase,
    UncertainEffect,
    Verdict,
)
from streams.model import Timeout as TimeoutEvent

EXAMPLES = 500
SETTINGS = settings(max_examples=EXAMPLES, deadline=None)

KEY = "payments:" + "ab" * 32
T0 = 1_700_000_000_000
ATTEMPT_SPAN = 100_000
DIGESTS = ("d1" * 32, "d2" * 32)
RECEIPT_IDS = ("re_1", "re_2", "re_3")


@st.composite
def histories(draw: st.DrawFn) -> list[Event]:
    counter = itertools.count()

    def eid(kind: str) -> str:
        return f"{kind}-{next(counter)}"

    events: list[Event] = []
    for a in range(1, draw(st.integers(1, 3)) + 1):
        base = T0 + (a - 1) * ATTEMPT_SPAN
        # A narrow window of times, so that equal timestamps (ties in the canonical order) happen.
        times = st.integers(base, base + 40)
        deadline = base + draw(st.sampled_from([15, 30, 5_000]))
        attempt_of_receipt = st.sampled_from([a, a, a, 0])  # webhooks may not know the attempt

        for k in range(draw(st.sampled_from([1, 1, 1, 1, 0, 2]))):
            digest = DIGESTS[0] if k == 0 and a == 1 else draw(st.sampled_from(DIGESTS))
            events.append(Intent(eid("intent"), KEY, draw(times), a, "payments", "refund.create", "default",
                                 "run-1", "refund-order-123", "{}", digest, deadline, f"worker-{a}"))
        for _ in range(draw(st.integers(0, 2))):
            t = draw(times)
            events.append(Executed(eid("exec"), KEY, t, a, draw(st.sampled_from(list(Outcome))),
                                   draw(st.sampled_from([None, "eof", "declined"])), t - 5, t,
                                   draw(st.sampled_from([None, base + 20, base + 3_000])), f"worker-{a}"))
        for _ in range(draw(st.integers(0, 2))):
            rid = draw(st.sampled_from(RECEIPT_IDS))
            events.append(Receipt(eid("receipt"), KEY, draw(times), draw(attempt_of_receipt), rid,
                                  draw(st.sampled_from(list(ReceiptSource))), f'{{"id":"{rid}"}}'))
        for phase in draw(st.sets(st.sampled_from(list(TimeoutPhase)), max_size=2)):
            events.append(TimeoutEvent(timeout_event_id(KEY, a, phase), KEY, draw(times), a, phase, deadline))
        for _ in range(draw(st.integers(0, 2))):
            verdict = draw(st.sampled_from(list(Verdict)))
            rid = draw(st.sampled_from([*RECEIPT_IDS, None])) if verdict is Verdict.FOUND else None
            events.append(Resolution(eid("resolution"), KEY, draw(times), a, verdict, "recon", "why", rid,
                                     f'{{"id":"{rid}"}}' if rid else None, draw(st.integers(1, 3))))
        for _ in range(draw(st.integers(0, 1))):
            kind = draw(st.sampled_from(list(DecisionKind)))
            rid = draw(st.sampled_from([*RECEIPT_IDS, None])) if kind is DecisionKind.CONFIRMED else None
            events.append(Decision(eid("decision"), KEY, draw(times), a, kind, "alice", "looked", rid))
    if not events:  # an attempt drew nothing at all: give it an intent so there is something to fold
        events.append(Intent(eid("intent"), KEY, T0, 1, "payments", "refund.create", "default", "run-1",
                             "refund-order-123", "{}", DIGESTS[0], T0 + 30, "worker-1"))
    return events


def folded(events: list[Event]) -> Effect:
    eff = fold(events)
    assert eff is not None
    return eff


@SETTINGS
@given(events=histories(), data=st.data())
def test_idempotence_duplicates_change_nothing(events: list[Event], data: st.DataObject) -> None:
    """(a) Redelivering any events, anywhere in the stream, folds to the same effect."""
    with_dups = list(events)
    for _ in range(data.draw(st.integers(1, 8))):
        dup = data.draw(st.sampled_from(events))
        with_dups.insert(data.draw(st.integers(0, len(with_dups))), dup)
    assert folded(with_dups) == folded(events)


@SETTINGS
@given(events=histories(), data=st.data())
def test_order_tolerance_any_permutation_folds_equal(events: list[Event], data: st.DataObject) -> None:
    """(b) Any arrival order (with redeliveries) folds to an equal Effect: facts and derived fields."""
    shuffled = data.draw(st.permutations(events))
    shuffled = shuffled + data.draw(st.lists(st.sampled_from(events), max_size=3))
    a, b = folded(events), folded(shuffled)
    assert a == b
    assert (a.state, a.flags, a.receipt, a.deadline_ms, a.reason) == (b.state, b.flags, b.receipt, b.deadline_ms,
                                                                      b.reason)


@SETTINGS
@given(events=histories(), data=st.data())
def test_version_is_the_number_of_distinct_events(events: list[Event], data: st.DataObject) -> None:
    """(c) version == number of distinct event ids, however often they were delivered."""
    stream = events + data.draw(st.lists(st.sampled_from(events), max_size=5))
    eff = folded(data.draw(st.permutations(stream)))
    assert eff.version == len({e.event_id for e in events})


@SETTINGS
@given(events=histories(), data=st.data())
def test_a_fold_never_loses_an_event(events: list[Event], data: st.DataObject) -> None:
    """(d) Every event folded is among the effect's facts, unchanged, and nothing else is."""
    eff = folded(data.draw(st.permutations(events)))
    assert all(eff.has(e.event_id) for e in events)
    assert set(eff.facts) == set(events)


@SETTINGS
@given(events=histories())
def test_two_receipt_ids_are_flagged_and_confirmed(events: list[Event]) -> None:
    """(e) Two distinct receipt ids: DUPLICATE_RECEIPT is flagged and the state is CONFIRMED (or
    COMPENSATED), never overwritten into something else."""
    eff = folded(events)
    if len(eff.receipt_ids) > 1:
        assert Flag.DUPLICATE_RECEIPT in eff.flags
        assert eff.state in (State.CONFIRMED, State.COMPENSATED)
    else:
        assert Flag.DUPLICATE_RECEIPT not in eff.flags
    ok = sum(1 for e in events if isinstance(e, Executed) and e.outcome is Outcome.OK)
    assert eff.executions == ok
    assert (Flag.DUPLICATE_EXECUTION in eff.flags) == (ok > 1)


@SETTINGS
@given(events=histories(), data=st.data())
def test_expire_is_idempotent(events: list[Event], data: st.DataObject) -> None:
    """(f) Applying what expire returns, then calling expire again at the same time, returns []."""
    eff = folded(events)
    candidates = [T0, T0 + 3 * ATTEMPT_SPAN]
    if eff.deadline_ms is not None:
        candidates += [eff.deadline_ms - 1, eff.deadline_ms, eff.deadline_ms + 1]
    now = data.draw(st.sampled_from(candidates) | st.integers(T0, T0 + 3 * ATTEMPT_SPAN))
    due = expire(eff, now)
    assert len(due) <= 1
    if eff.deadline_ms is None or now < eff.deadline_ms:
        assert due == []
    after = fold(due, eff)
    assert after is not None
    if due:
        assert after.state is State.UNCERTAIN
        assert expire(after, now) == []
        assert expire(after, now + 10**9) == []
    assert expire(after, now) == []


@SETTINGS
@given(events=histories(), data=st.data())
def test_state_is_a_state_and_uncertainty_is_always_emitted(events: list[Event], data: st.DataObject) -> None:
    """(g) The state is one of State; and an effect that ends UNCERTAIN emitted an UncertainEffect for
    its current attempt at some point (reconcilers never miss one)."""
    emitted: list[UncertainEffect] = []
    eff: Effect | None = None
    for e in data.draw(st.permutations(events)):
        eff, out = apply(eff, e)
        assert len(out) <= 1
        emitted.extend(out)
    assert eff is not None
    assert isinstance(eff.state, State)
    assert eff.state in set(State)
    if eff.state is State.UNCERTAIN:
        assert any(u.attempt == eff.attempt and u.event_id == f"uncertain:{eff.attempt}:{KEY}" for u in emitted)


@SETTINGS
@given(events=histories(), data=st.data())
def test_apply_one_at_a_time_equals_fold(events: list[Event], data: st.DataObject) -> None:
    """Re-applying a known event returns the identical object; an effect grown event by event equals
    the effect folded from the whole set."""
    eff: Effect | None = None
    for e in events:
        eff, _ = apply(eff, e)
        again, out = apply(eff, data.draw(st.sampled_from(events[: events.index(e) + 1])))
        assert again is eff and out == ()
    assert eff == folded(list(reversed(events)))

"""Property tests of the effect fold over random, realistic event histories of one effect_id.

Hypothesis profile note: no global profile is registered or loaded here; every property carries its
own ``@settings(max_examples=EXAMPLES, deadline=None)`` with EXAMPLES = 500, so the file runs
9 tests x 500 = 4,500 examples (about 12-18 s, nearly all of it generating histories).
``deadline=None`` because a fold of ~30 events can take a few ms on a loaded CI machine; that is not a
failure.

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

from effect_ledger.core.effect import Effect, absorb, apply, expire, fold, merge, timeout_event_id, to_state
from effect_ledger.core.model import (
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
from effect_ledger.core.model import Timeout as TimeoutEvent
from effect_ledger.sdk.store.tables import effect_row, state_row

EXAMPLES = 500
SETTINGS = settings(max_examples=EXAMPLES, deadline=None)

KEY = "payments:" + "ab" * 32
T0 = 1_700_000_000_000
ATTEMPT_SPAN = 100_000
DIGESTS = ("d1" * 32, "d2" * 32)
RECEIPT_IDS = ("re_1", "re_2", "re_3")


# Strategies built once: building them inside the composite for every example costs more than the fold.
OUTCOMES = st.sampled_from(list(Outcome))
ERRORS = st.sampled_from([None, "eof", "declined"])
SOURCES = st.sampled_from(list(ReceiptSource))
VERDICTS = st.sampled_from(list(Verdict))
KINDS = st.sampled_from(list(DecisionKind))
RIDS = st.sampled_from(RECEIPT_IDS)
MAYBE_RIDS = st.sampled_from([*RECEIPT_IDS, None])
PHASES = st.sets(st.sampled_from(list(TimeoutPhase)), max_size=2)
DIGEST = st.sampled_from(DIGESTS)
N_INTENTS = st.sampled_from([1, 1, 1, 1, 0, 2])
ZERO_TO_TWO = st.integers(0, 2)
N_EXECUTED = st.sampled_from([0, 1, 1, 1, 2])
N_RECEIPTS = st.sampled_from([0, 0, 0, 0, 1, 2])  # rare enough that open states stay common
N_RESOLUTIONS = st.sampled_from([0, 0, 1, 1, 2])
A_DECISION = st.sampled_from([False, False, False, True])
OFFSET = st.integers(0, 40)  # a narrow window of times, so that ties in the canonical order happen
DEADLINE_AFTER = st.sampled_from([15, 30, 5_000])
RECEIPT_DEADLINE_AFTER = st.sampled_from([None, 20, 3_000])
RECEIPT_ATTEMPT_ZERO = st.sampled_from([False, False, False, True])  # webhooks may not know the attempt


@st.composite
def histories(draw: st.DrawFn) -> list[Event]:
    counter = itertools.count()

    def eid(kind: str) -> str:
        return f"{kind}-{next(counter)}"

    events: list[Event] = []
    for a in range(1, draw(st.integers(1, 3)) + 1):
        base = T0 + (a - 1) * ATTEMPT_SPAN
        deadline = base + draw(DEADLINE_AFTER)

        for k in range(draw(N_INTENTS)):
            digest = DIGESTS[0] if k == 0 and a == 1 else draw(DIGEST)
            events.append(
                Intent(
                    eid("intent"),
                    KEY,
                    base + draw(OFFSET),
                    a,
                    "payments",
                    "refund.create",
                    "default",
                    "run-1",
                    "refund-order-123",
                    "{}",
                    digest,
                    deadline,
                    f"worker-{a}",
                )
            )
        for _ in range(draw(N_EXECUTED)):
            t = base + draw(OFFSET)
            after = draw(RECEIPT_DEADLINE_AFTER)
            events.append(
                Executed(
                    eid("exec"),
                    KEY,
                    t,
                    a,
                    draw(OUTCOMES),
                    draw(ERRORS),
                    t - 5,
                    t,
                    None if after is None else base + after,
                    f"worker-{a}",
                )
            )
        for _ in range(draw(N_RECEIPTS)):
            rid = draw(RIDS)
            events.append(
                Receipt(
                    eid("receipt"),
                    KEY,
                    base + draw(OFFSET),
                    0 if draw(RECEIPT_ATTEMPT_ZERO) else a,
                    rid,
                    draw(SOURCES),
                    f'{{"id":"{rid}"}}',
                )
            )
        for phase in sorted(draw(PHASES)):
            events.append(TimeoutEvent(timeout_event_id(KEY, a, phase), KEY, base + draw(OFFSET), a, phase, deadline))
        for _ in range(draw(N_RESOLUTIONS)):
            verdict = draw(VERDICTS)
            frid = draw(MAYBE_RIDS) if verdict is Verdict.FOUND else None
            events.append(
                Resolution(
                    eid("resolution"),
                    KEY,
                    base + draw(OFFSET),
                    a,
                    verdict,
                    "recon",
                    "why",
                    frid,
                    f'{{"id":"{frid}"}}' if frid else None,
                    1 + draw(ZERO_TO_TWO),
                )
            )
        if draw(A_DECISION):
            kind = draw(KINDS)
            drid = draw(MAYBE_RIDS) if kind is DecisionKind.CONFIRMED else None
            events.append(Decision(eid("decision"), KEY, base + draw(OFFSET), a, kind, "alice", "looked", drid))
    if not events:  # nothing drawn at all: give it an intent so that there is something to fold
        events.append(
            Intent(
                eid("intent"),
                KEY,
                T0,
                1,
                "payments",
                "refund.create",
                "default",
                "run-1",
                "refund-order-123",
                "{}",
                DIGESTS[0],
                T0 + 30,
                "worker-1",
            )
        )
    return events


def folded(events: list[Event]) -> Effect:
    eff = fold(events)
    assert eff is not None
    return eff


@SETTINGS
@given(events=histories(), data=st.data())
def test_idempotence_redeliveries_change_nothing(events: list[Event], data: st.DataObject) -> None:
    """(a) Redelivering any events, anywhere in the stream, folds to the same effect; a redelivered
    event returns the identical object and emits nothing. (c) version == number of distinct event
    ids. (d) No event is lost."""
    stream = list(events)
    for _ in range(data.draw(st.integers(1, 8))):
        stream.insert(data.draw(st.integers(0, len(stream))), data.draw(st.sampled_from(events)))
    eff: Effect | None = None
    for e in stream:
        known = eff is not None and eff.has(e.event_id)
        new, out = apply(eff, e)
        if known:
            assert new is eff and out == ()
        eff = new
    assert eff is not None
    assert eff == folded(events)
    assert eff.version == len({e.event_id for e in events}) == len(events)
    assert set(eff.facts) == set(events)


@SETTINGS
@given(events=histories(), data=st.data())
def test_order_tolerance_any_permutation_folds_equal(events: list[Event], data: st.DataObject) -> None:
    """(b) Any arrival order (with redeliveries) folds to an equal Effect: facts and derived fields.
    (c) version == number of distinct event ids. (d) every event_id is in effect.facts."""
    shuffled = data.draw(st.permutations(events)) + data.draw(st.lists(st.sampled_from(events), max_size=3))
    a, b = folded(events), folded(shuffled)
    assert a == b
    assert (a.state, a.flags, a.receipt, a.deadline_ms, a.reason, a.attempt) == (
        b.state,
        b.flags,
        b.receipt,
        b.deadline_ms,
        b.reason,
        b.attempt,
    )
    assert b.version == len({e.event_id for e in events})
    assert all(b.has(e.event_id) for e in events)
    assert set(b.facts) == set(events)


@SETTINGS
@given(events=histories())
def test_duplicates_are_flagged_not_overwritten(events: list[Event]) -> None:
    """(e) Two distinct receipt ids: DUPLICATE_RECEIPT is flagged and the state is CONFIRMED (or
    COMPENSATED). Likewise every OK execution is counted and two of them are flagged."""
    eff = folded(events)
    expected_ids = {e.receipt_id for e in events if isinstance(e, Receipt)}
    expected_ids |= {
        e.receipt_id
        for e in events
        if isinstance(e, Resolution) and e.verdict is Verdict.FOUND and e.receipt_id is not None
    }
    expected_ids |= {
        e.receipt_id or f"decision:{e.event_id}"
        for e in events
        if isinstance(e, Decision) and e.decision is DecisionKind.CONFIRMED
    }
    assert eff.receipt_ids == tuple(sorted(expected_ids))
    if len(expected_ids) > 1:
        assert Flag.DUPLICATE_RECEIPT in eff.flags
        assert eff.state in (State.CONFIRMED, State.COMPENSATED)
    else:
        assert Flag.DUPLICATE_RECEIPT not in eff.flags
    ok = sum(1 for e in events if isinstance(e, Executed) and e.outcome is Outcome.OK)
    assert eff.executions == ok
    assert (Flag.DUPLICATE_EXECUTION in eff.flags) == (ok > 1)
    assert (Flag.NO_INTENT in eff.flags) == (not any(isinstance(e, Intent) for e in events))


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
    assert expire(eff, now) == due  # deterministic: a timer firing twice gives the same command
    after = fold(list[Event](due), eff)
    assert after is not None
    if due:
        assert after.state is State.UNCERTAIN
        assert expire(after, now + 10**9) == []
    assert expire(after, now) == []


@SETTINGS
@given(events=histories())
def test_an_absent_decision_made_while_the_call_could_land_never_makes_absent(events: list[Event]) -> None:
    """(h) An ABSENT state of the latest attempt is always backed by an ABSENT resolution or decision
    made once that attempt's call could no longer land (its deadline plus the intent's lands_within,
    2 s when it carries none), never by an earlier one; DECISION_IGNORED and ANSWER_IGNORED are
    flagged exactly when some ABSENT decision or answer was made earlier (or on an attempt whose
    intent is unknown). A deadline is a duration from the intent (``deadline_ms - at_ms``, from the
    writer's one clock, clamped to [0, a week]): a writer's absolute time never decides."""
    eff = folded(events)
    deadlines: dict[int, int] = {}
    for e in events:
        if isinstance(e, Intent):
            lands = 2000 if e.lands_within_ms is None else e.lands_within_ms
            d = e.at_ms + min(max(e.deadline_ms - e.at_ms, 0), 7 * 86_400_000) + lands
            deadlines[e.attempt] = max(d, deadlines.get(e.attempt, d))
    # an attempt's window never ends before an earlier attempt's (a refused claim leaves it unsettled)
    latest = 0
    for attempt in sorted(deadlines):
        latest = deadlines[attempt] = max(latest, deadlines[attempt])

    def is_early(e: Decision | Resolution) -> bool:
        return e.attempt not in deadlines or e.at_ms < deadlines[e.attempt]

    absent_decisions = [e for e in events if isinstance(e, Decision) and e.decision is DecisionKind.ABSENT]
    absent_answers = [e for e in events if isinstance(e, Resolution) and e.verdict is Verdict.ABSENT]
    early = [d for d in absent_decisions if is_early(d)]
    assert (Flag.DECISION_IGNORED in eff.flags) == bool(early)
    assert (Flag.ANSWER_IGNORED in eff.flags) == any(is_early(r) for r in absent_answers)
    if eff.state is State.ABSENT:
        latest = [e for e in events if e.attempt == eff.attempt]
        assert any(
            isinstance(e, Resolution | Decision) and e in absent_answers + absent_decisions and not is_early(e)
            for e in latest
        )


@SETTINGS
@given(events=histories(), data=st.data())
def test_state_is_a_state_and_uncertainty_is_always_emitted(events: list[Event], data: st.DataObject) -> None:
    """(g) The state is one of State; and an effect that ends UNCERTAIN with its intent known emitted an
    UncertainEffect for its current attempt at some point, in any arrival order (reconcilers never
    miss one they could act on; without an intent there is nothing to ask a destination about)."""
    emitted: list[UncertainEffect] = []
    eff: Effect | None = None
    for e in data.draw(st.permutations(events)):
        eff, out = apply(eff, e)
        assert len(out) <= 1
        assert all(u.target for u in out)  # never an item reconcilers cannot act on
        emitted.extend(out)
    assert eff is not None
    assert type(eff.state) is State
    assert eff.state in set(State)
    if eff.state is State.UNCERTAIN and eff.intent is not None:
        assert any(
            u.attempt == eff.attempt and u.event_id == f"uncertain:{eff.attempt}:{u.tries}:{KEY}" for u in emitted
        )


@SETTINGS
@given(events=histories(), data=st.data())
def test_absorbing_several_events_at_once_is_the_fold(events: list[Event], data: st.DataObject) -> None:
    """(h) ``absorb`` (one derive for several events, the SDK's writes and loads) gives the effect the
    event-by-event fold gives, from any known prefix, with repeats; its new events are those the
    effect did not hold, once each."""
    cut = data.draw(st.integers(0, len(events)))
    before = fold(events[:cut])
    rest = list(events[cut:])
    for _ in range(data.draw(st.integers(0, 3))):
        rest.insert(data.draw(st.integers(0, len(rest))), data.draw(st.sampled_from(events)))
    after, new = absorb(before, rest)
    assert after == fold(rest, before)
    held = {f.event_id for f in before.facts} if before is not None else set()
    assert [e.event_id for e in new] == list(dict.fromkeys(e.event_id for e in rest if e.event_id not in held))


@SETTINGS
@given(events=histories(), data=st.data())
def test_merging_two_partial_folds_is_the_fold_of_their_union(events: list[Event], data: st.DataObject) -> None:
    """(i) ``merge`` (two values of one key in the processor's table, each folded from part of its
    history: processors/late_records.py) gives the fold of the union of their events, whichever
    comes first; a part that holds every fact of the other merges to itself."""
    a_part = data.draw(st.lists(st.sampled_from(events), min_size=1))
    b_part = data.draw(st.lists(st.sampled_from(events), min_size=1))
    a, b = folded(a_part), folded(b_part)
    union = folded(a_part + b_part)
    assert merge(a, b) == union == merge(b, a)
    assert merge(union, a) is union


@SETTINGS
@given(
    offsets=st.tuples(OFFSET, OFFSET, OFFSET),
    attempt=st.integers(1, 3),
    value=st.sampled_from(['{"id":"re_1"}', '{"effect_ledger.inexact":"x"}', "null"]),
    source=SOURCES,
    receipt_deadline=RECEIPT_DEADLINE_AFTER,
)
def test_a_call_and_its_receipt_settle_as_the_fold_does(
    offsets: tuple[int, int, int], attempt: int, value: str, source: ReceiptSource, receipt_deadline: int | None
) -> None:
    """(i) The SDK's common outcome (an intent, then a successful call and its receipt), built without
    the fold, is what the fold gives."""
    i = Intent("intent-0", KEY, T0 + offsets[0], attempt, "payments", "refund.create", "default", "run-1",
               "refund-order-123", "{}", DIGESTS[0], T0 + 30, "worker-1")  # fmt: skip
    x = Executed("exec-0", KEY, T0 + offsets[1], attempt, Outcome.OK, None, T0, T0 + offsets[1],
                 None if receipt_deadline is None else T0 + receipt_deadline, "worker-1")  # fmt: skip
    r = Receipt("receipt-0", KEY, T0 + offsets[2], attempt, "re_1", source, value)
    before = fold([i])
    assert before is not None
    after, new = absorb(before, [x, r])
    assert after == fold([x, r], before)
    assert new == [x, r]


@SETTINGS
@given(events=histories())
def test_the_files_row_is_the_state_records_row(events: list[Event]) -> None:
    """(j) The ``effects`` row the store writes (built straight from the effect) is the row of the
    state record published for it, the sink's row."""
    eff = folded(events)
    assert effect_row(eff) == state_row(to_state(eff))

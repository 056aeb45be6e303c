"""Claim verdicts in the pure fold (issue 11, item 1): the first intent of an attempt in the
partition's order owns it; the processor records that as a ``Claimed`` fact, and the fold applies
the recorded verdict whatever order the facts arrive in."""

from __future__ import annotations

import itertools

from effect_ledger.core.effect import apply, claim_of, claim_verdict, fold, to_state
from effect_ledger.core.model import (
    Claimed,
    Executed,
    Flag,
    Intent,
    Outcome,
    Receipt,
    ReceiptSource,
    State,
    misplaced,
)

KEY = "payments:refund.create:run:step"


def intent(event_id: str, worker: str, at_ms: int, deadline_ms: int, attempt: int = 1) -> Intent:
    return Intent(event_id, KEY, at_ms, attempt, "payments", "refund.create", "default", "run", "step",
                  '{"amount":1}', "d" * 64, deadline_ms, worker)  # fmt: skip


X = intent("x", "host-a", 1_000, 11_000)
Y = intent("y", "host-b", 999, 20_000)  # the loser: an earlier clock and a later deadline


def verdict_for(first: Intent, *others: Intent) -> Claimed:
    """What the processor records, folding ``first`` then ``others`` in partition order."""
    effect, _ = apply(None, first)
    v = claim_verdict(effect, first)
    assert v is not None
    effect, _ = apply(effect, v)
    for o in others:
        effect, _ = apply(effect, o)
        assert claim_verdict(effect, o) is None  # a verdict once given never changes
    return v


def test_the_first_intent_in_partition_order_owns_the_attempt_whatever_its_clock_says() -> None:
    v = verdict_for(X, Y)
    assert (v.intent_id, v.worker, v.attempt, v.at_ms) == ("x", "host-a", 1, X.at_ms)
    assert v == verdict_for(X, Y)  # the same partition gives the same verdict, whoever folds it
    assert verdict_for(Y, X).intent_id == "y"


def test_the_recorded_verdict_decides_in_every_arrival_order() -> None:
    v = verdict_for(X, Y)
    results = set()
    for order in itertools.permutations([X, Y, v]):
        e = fold(list(order))
        assert e is not None
        results.add((e.state, e.intent, e.first_intent, e.deadline_ms, e.flags, e.executions))
    assert results == {(State.PENDING, X, X, X.deadline_ms, (Flag.LOST_CLAIM,), 0)}
    assert claim_of(fold([Y, v, X]), 1) == v  # type: ignore[arg-type]


def test_without_a_verdict_nothing_changes() -> None:
    e = fold([X, Y])
    assert e is not None and Flag.LOST_CLAIM not in e.flags
    assert e.intent == X  # the latest of the attempt by (kind, at_ms, id): X at 1000 after Y at 999
    assert claim_of(e, 1) is None


def test_outcomes_a_lost_claims_worker_records_do_not_decide_the_attempt() -> None:
    v = verdict_for(X, Y)
    refused = Executed("yx", KEY, 1_010, 1, Outcome.FAILED, "lost the claim", 1_005, 1_005, None, "host-b")
    e = fold([X, Y, v, refused])
    assert e is not None and e.state is State.PENDING and e.deadline_ms == X.deadline_ms
    ok = Executed("xx", KEY, 1_020, 1, Outcome.OK, None, 1_001, 1_019, None, "host-a")
    r = Receipt("xr", KEY, 1_021, 1, "re_1", ReceiptSource.CALL, '{"id":"re_1"}')
    e = fold([r, refused, ok, v, Y, X])
    assert e is not None and e.state is State.CONFIRMED and e.executions == 1
    assert Flag.DUPLICATE_EXECUTION not in e.flags and Flag.LOST_CLAIM in e.flags


def test_a_lost_claim_that_called_anyway_is_still_an_execution() -> None:
    v = verdict_for(X, Y)
    ok_a = Executed("xa", KEY, 1_020, 1, Outcome.OK, None, 1_001, 1_019, None, "host-a")
    ok_b = Executed("xb", KEY, 1_021, 1, Outcome.OK, None, 1_002, 1_020, None, "host-b")
    e = fold([X, Y, v, ok_a, ok_b])
    assert e is not None and e.executions == 2
    assert Flag.DUPLICATE_EXECUTION in e.flags and Flag.LOST_CLAIM in e.flags


def test_a_verdict_on_an_earlier_attempt_does_not_touch_a_later_one() -> None:
    v = verdict_for(X, Y)
    failed = Executed("xf", KEY, 1_020, 1, Outcome.FAILED, "declined", 1_001, 1_019, None, "host-a")
    z = intent("z", "host-b", 2_000, 30_000, attempt=2)
    e = fold([X, Y, v, failed, z])
    assert e is not None and e.state is State.PENDING and e.attempt == 2 and e.intent == z
    assert e.first_intent == X


def test_the_published_version_counts_the_facts_others_wrote_not_the_verdicts() -> None:
    v = verdict_for(X, Y)
    with_verdict, without = fold([X, Y, v]), fold([X, Y])
    assert with_verdict is not None and without is not None
    assert with_verdict.version == 3  # the file's own optimistic concurrency counts every fact
    assert to_state(with_verdict).version == to_state(without).version == 2


def test_only_the_processor_gives_verdicts_a_claimed_record_on_a_topic_is_refused() -> None:
    v = verdict_for(X, Y)
    assert "only the processor" in str(misplaced(v, decisions_topic=False))
    assert misplaced(v, decisions_topic=True) is not None

"""The soak's verdict (tests/soak/report.py): what counts as lost, doubled, a passed deadline and
its detection latency, and how lag and latency are aggregated per minute."""

from __future__ import annotations

from tests.soak.report import (
    Seen,
    compute,
    lag_per_minute,
    late_outcome,
    markdown,
    outcome,
    passed_deadline,
    per_minute,
    verdict,
)

T0 = 1_700_000_000_000
GRACE = 1000


def effect(key: str, **kw: object) -> Seen:
    base: dict[str, object] = {"target": "keyed", "intent_ms": T0 + 100, "deadline_ms": T0 + 2100,
                               "state": "CONFIRMED"}  # fmt: skip
    base.update(kw)
    return Seen(key, **base)  # type: ignore[arg-type]


def test_a_deadline_passed_when_no_outcome_came_or_the_call_timed_out() -> None:
    assert passed_deadline(effect("a"))  # the agent died during the call
    assert passed_deadline(effect("b", outcome="UNKNOWN", outcome_ms=T0 + 2150))  # timed out
    assert not passed_deadline(effect("c", outcome="UNKNOWN", outcome_ms=T0 + 500))  # lost reply, before it
    assert not passed_deadline(effect("d", outcome="OK", outcome_ms=T0 + 300))
    late = effect("e", outcome="OK", outcome_ms=T0 + 2100 + GRACE + 1)
    assert not passed_deadline(late) and late_outcome(late, GRACE)
    assert not late_outcome(effect("f", outcome="OK", outcome_ms=T0 + 2100 + GRACE), GRACE)


def test_lost_doubled_and_undetected_are_counted_from_what_was_seen() -> None:
    seen = {
        "ok": effect("ok", outcome="OK", outcome_ms=T0 + 300),
        "stuck": effect("stuck", state="PENDING"),  # passed, never flagged, never settled
        "escalated": effect("escalated", uncertain_ms=T0 + 3100, state="ESCALATED"),
        "unpublished": effect("unpublished", outcome="OK", outcome_ms=T0 + 300, state=None),
        "no-intent": Seen("no-intent", state="CONFIRMED"),  # a stray state: not an effect of the soak
    }
    executions = {"keyed": {"ok": 1, "escalated": 1}, "blind": {"x": 2, "y": 1, "z": 3}}
    r = compute(seen, executions, [], t0_ms=T0, grace_ms=GRACE)
    assert r["effects"] == 4
    assert r["lost"] == 2 and r["lost_sample"] == ["stuck", "unpublished"]
    assert r["doubled"] == 2 and r["doubled_sample"] == {"blind": ["x", "z"]}
    assert r["executions"] == {"keyed": 2, "blind": 6}
    assert (r["passed_deadline"], r["detected"], r["undetected"]) == (2, 1, 1)
    assert r["undetected_sample"] == ["stuck"]
    assert r["detection_ms"]["p50"] == 1000.0  # T0+3100 - deadline T0+2100
    assert not verdict(r)


def test_latency_starts_at_the_intents_arrival_when_it_reached_kafka_after_its_deadline() -> None:
    # The broker was down: the intent arrived 5 s after its deadline; flagged 700 ms after arriving.
    e = effect("late-intent", intent_ms=T0 + 7100, uncertain_ms=T0 + 7800, state="ABSENT")
    r = compute({"late-intent": e}, {}, [], t0_ms=T0, grace_ms=GRACE)
    assert r["detection_ms"]["max"] == 700.0
    assert r["detection_per_minute"] == [{"minute": 0, "count": 1, "p50": 700.0, "p99": 700.0, "max": 700.0}]
    assert verdict(r)


def test_detection_is_bucketed_by_minute_and_lag_samples_without_an_answer_are_kept_apart() -> None:
    rows = per_minute([(5, 10.0), (20, 20.0), (59.9, 30.0), (60, 1000.0), (200, 7.0)])
    assert [(m["minute"], m["count"], m["p50"], m["max"]) for m in rows] == [
        (0, 3, 20.0, 30.0), (1, 1, 1000.0, 1000.0), (3, 1, 7.0, 7.0)
    ]  # fmt: skip
    samples = [{"t_s": 0, "w": 5}, {"t_s": 30, "w": None}, {"t_s": 50, "w": 3}, {"t_s": 65, "w": None}]
    lag = lag_per_minute(samples, "w")
    assert lag == [
        {"minute": 0, "samples": 3, "max": 5, "last": 3, "unanswered": 1},
        {"minute": 1, "samples": 1, "max": None, "last": None, "unanswered": 1},
    ]


def test_the_markdown_states_the_verdict_and_the_figures() -> None:
    seen = {"a": effect("a", uncertain_ms=T0 + 2600, state="ESCALATED"), "b": effect("b", state="PENDING")}
    r = compute(seen, {"blind": {"a": 1}}, [{"t_s": 1, "workers_lag": 12, "reconcilers_lag": 0}],
                t0_ms=T0, grace_ms=GRACE)  # fmt: skip
    text = markdown(r, {"minutes": 1, "rate": 10, "timeline": [{"t_s": 0, "what": "load starts"}]}, "soak.png")
    assert text.startswith("# Soak report: FAIL")
    assert "| lost (not final nor escalated after the drain) | 1 |" in text
    assert "lost_sample: b" in text and "![lag and detection latency over time](soak.png)" in text
    assert "- 0 s: load starts" in text and "| 0 | 12 | 12 |" in text
    assert verdict(compute({"a": seen["a"]}, {}, [], t0_ms=T0, grace_ms=GRACE))
    assert not verdict(compute({}, {}, [], t0_ms=T0, grace_ms=GRACE))  # no load is no pass


def test_open_effects_while_the_workers_are_behind_are_inconclusive_but_a_double_always_fails() -> None:
    seen = {"a": effect("a", state="PENDING"), "b": effect("b", uncertain_ms=T0 + 2600, state="ESCALATED")}
    behind = compute(seen, {}, [], t0_ms=T0, grace_ms=GRACE, backlog=5000)
    assert (outcome(behind), behind["lost"], behind["settled"]) == ("INCONCLUSIVE", 1, False)
    assert not verdict(behind)
    assert markdown(behind, {}, None).startswith("# Soak report: INCONCLUSIVE")
    assert outcome(compute(seen, {}, [], t0_ms=T0, grace_ms=GRACE, backlog=None)) == "INCONCLUSIVE"
    assert outcome(compute(seen, {}, [], t0_ms=T0, grace_ms=GRACE, backlog=0)) == "FAIL"
    doubled = compute({"b": seen["b"]}, {"blind": {"b": 2}}, [], t0_ms=T0, grace_ms=GRACE, backlog=5000)
    assert outcome(doubled) == "FAIL"
    assert outcome(compute({"b": seen["b"]}, {}, [], t0_ms=T0, grace_ms=GRACE, backlog=5000)) == "PASS"

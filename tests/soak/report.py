"""The soak's verdict, computed from what it observed (pure: no Kafka, no clock, unit-tested).

Inputs: one ``Seen`` per effect (from the topics), the executions each destination counted per
key, and samples of consumer-group lag. Outputs: the report's dict (``compute``) and its markdown
(``markdown``).

Definitions (the report states them too):

* **lost**: an effect whose intent reached ``effects.events`` but whose last state on
  ``effects.state`` is still open (PENDING, EXECUTED, UNCERTAIN) or never appeared, after the drain.
  ESCALATED counts as reached (a person has it), so do CONFIRMED, FAILED and ABSENT. Only a drain
  that ended with the workers caught up (nothing left to fold) can tell lost from not folded yet:
  otherwise the verdict is INCONCLUSIVE.
* **doubled**: a key a destination executed more than once.
* **passed deadline**: no outcome ever reached Kafka (the agent died during the call), or the
  outcome was UNKNOWN at or after the deadline (the call timed out). Each must be **detected**: an
  ``UncertainEffect`` on ``effects.uncertain`` or UNCERTAIN on ``effects.state``. An OK/FAILED that
  arrived after deadline + grace (a late outcome) may or may not be flagged; counted apart.
* **detection latency**: first uncertain signal - max(deadline, the intent's arrival on Kafka): an
  intent that reached Kafka after its deadline (the broker was down) could not be flagged earlier.
  Bucketed by the minute of that start, relative to the start of the load.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from effect_ledger.core.model import OPEN_STATES, Outcome
from tests.bench.common import fmt, percentile

UNKNOWN = Outcome.UNKNOWN.value
OPEN = frozenset(s.value for s in OPEN_STATES)


@dataclass
class Seen:
    """What the topics showed about one effect (broker timestamps, ms since the epoch)."""

    key: str
    target: str = ""
    intent_ms: int | None = None  # when the (first) intent reached effects.events
    deadline_ms: int | None = None
    outcome: str | None = None  # the first Executed's outcome
    outcome_ms: int | None = None
    uncertain_ms: int | None = None  # the first UncertainEffect, or UNCERTAIN on effects.state
    state: str | None = None  # the last state on effects.state
    states: list[str] = field(default_factory=list)  # every distinct state change, in order
    executions: int = 0  # the most executions effects.state counted (above 1: a flagged duplicate)


def passed_deadline(e: Seen) -> bool:
    """Whether the effect's deadline passed without an outcome (see the module docstring)."""
    if e.deadline_ms is None:
        return False
    if e.outcome_ms is None:
        return True
    # An OK/FAILED outcome is never a miss, even a late one (``late_outcome``): the processor may
    # fold it before its timer fires, and then there is nothing uncertain to flag.
    return e.outcome == UNKNOWN and e.outcome_ms >= e.deadline_ms


def late_outcome(e: Seen, grace_ms: int) -> bool:
    """An OK/FAILED outcome that reached Kafka after deadline + grace: flagging it is optional."""
    return (
        e.deadline_ms is not None and e.outcome_ms is not None and e.outcome != UNKNOWN
        and e.outcome_ms > e.deadline_ms + grace_ms
    )  # fmt: skip


def latency_start(e: Seen) -> int:
    """From when the processor could flag it: the deadline, or the intent's arrival if later."""
    assert e.deadline_ms is not None
    return max(e.deadline_ms, e.intent_ms or e.deadline_ms)


def per_minute(points: Iterable[tuple[float, float]]) -> list[dict[str, Any]]:
    """(seconds since start, value) -> one row per minute: count, p50, p99, max. Minutes with no
    point are left out."""
    buckets: dict[int, list[float]] = defaultdict(list)
    for t, v in points:
        buckets[int(t // 60)].append(v)
    return [
        {"minute": m, "count": len(vs), "p50": percentile(vs, 50), "p99": percentile(vs, 99), "max": max(vs)}
        for m, vs in sorted(buckets.items())
    ]


def lag_per_minute(samples: Iterable[Mapping[str, Any]], key: str) -> list[dict[str, Any]]:
    """Samples (``t_s`` and ``key``, None when the broker did not answer) -> per minute: the
    samples taken, the max and the last lag, and how many samples had no answer."""
    rows: dict[int, dict[str, Any]] = {}
    for s in samples:
        m = int(s["t_s"] // 60)
        row = rows.setdefault(m, {"minute": m, "samples": 0, "max": None, "last": None, "unanswered": 0})
        row["samples"] += 1
        v = s.get(key)
        if v is None:
            row["unanswered"] += 1
            continue
        row["max"] = v if row["max"] is None else max(row["max"], v)
        row["last"] = v
    return [rows[m] for m in sorted(rows)]


def compute(
    seen: Mapping[str, Seen],
    executions: Mapping[str, Mapping[str, int]],
    lag_samples: list[dict[str, Any]],
    *,
    t0_ms: int,
    grace_ms: int,
    backlog: int | None = 0,
) -> dict[str, Any]:
    """The soak's figures. ``executions``: destination kind -> key -> times executed; ``backlog``:
    events the workers had not folded when the drain ended (None: unknown)."""
    intents = [e for e in seen.values() if e.intent_ms is not None]
    lost = [e.key for e in intents if e.state is None or e.state in OPEN]
    doubled = {kind: sorted(k for k, n in per_key.items() if n > 1) for kind, per_key in executions.items()}
    passed = [e for e in intents if passed_deadline(e)]
    undetected = [e.key for e in passed if e.uncertain_ms is None]
    latencies = [
        ((latency_start(e) - t0_ms) / 1000, float(e.uncertain_ms - latency_start(e)))
        for e in passed if e.uncertain_ms is not None
    ]  # fmt: skip
    late = [e for e in intents if late_outcome(e, grace_ms)]
    values = [v for _, v in latencies]
    by_cause = Counter("no outcome" if e.outcome_ms is None else "timed out (UNKNOWN)" for e in passed)
    return {
        "effects": len(intents),
        "by_target": dict(Counter(e.target for e in intents)),
        "final_states": dict(Counter(e.state or "none" for e in intents)),
        "executions": {kind: sum(per_key.values()) for kind, per_key in executions.items()},
        "lost": len(lost),
        "lost_sample": sorted(lost)[:20],
        "doubled": sum(len(v) for v in doubled.values()),
        "doubled_sample": {k: v[:20] for k, v in doubled.items() if v},
        "flagged_duplicates": sum(1 for e in intents if e.executions > 1),
        "passed_deadline": len(passed),
        "passed_deadline_by_cause": dict(by_cause),
        "detected": len(passed) - len(undetected),
        "undetected": len(undetected),
        "undetected_sample": sorted(undetected)[:20],
        "late_outcomes": len(late),
        "late_outcomes_flagged": sum(1 for e in late if e.uncertain_ms is not None),
        "detection_ms": {
            "p50": percentile(values, 50),
            "p99": percentile(values, 99),
            "max": max(values) if values else float("nan"),
        },
        "detection_per_minute": per_minute(latencies),
        "lag_workers_per_minute": lag_per_minute(lag_samples, "workers_lag"),
        "lag_workers_unfolded_per_minute": lag_per_minute(lag_samples, "workers_unfolded"),
        "lag_reconcilers_per_minute": lag_per_minute(lag_samples, "reconcilers_lag"),
        "grace_ms": grace_ms,
        "workers_backlog_at_end": backlog,
        "settled": backlog == 0,
    }


def verdict(r: Mapping[str, Any]) -> bool:
    """lost 0, doubled 0, every passed deadline detected, and some load at all (see ``outcome``)."""
    return outcome(r) == "PASS"


def outcome(r: Mapping[str, Any]) -> str:
    """PASS, FAIL, or INCONCLUSIVE: effects still open, or deadlines not flagged yet, while the
    workers had events left to fold (not folded is not lost). Doubled is never inconclusive."""
    if r["doubled"] or not r["effects"]:
        return "FAIL"
    if r["lost"] == 0 and r["undetected"] == 0:
        return "PASS"  # nothing open is left to judge, whatever the workers still had to fold
    return "FAIL" if r["settled"] else "INCONCLUSIVE"


def markdown(r: Mapping[str, Any], meta: Mapping[str, Any], plot: str | None) -> str:
    """The report as markdown (the plot named relative to the report)."""
    det = r["detection_ms"]
    backlog = r["workers_backlog_at_end"]
    lines = [
        f"# Soak report: {outcome(r)}",
        "",
        f"{meta.get('minutes')} min at {meta.get('rate')} effects/s requested "
        f"({fmt(meta.get('achieved_rate'))} achieved), {meta.get('partitions')} partitions, "
        f"{meta.get('cpu_count')} cores, started {meta.get('started')}. {meta.get('note', '')}".rstrip(),
        "",
        "| figure | value |",
        "|---|---|",
        f"| effects (intents on effects.events) | {r['effects']:,} |",
        f"| executions at the destinations | {', '.join(f'{k} {v:,}' for k, v in r['executions'].items())} |",
        f"| lost (not final nor escalated after the drain) | {r['lost']} |",
        f"| events the workers had not folded when the drain ended | {_n(backlog)} |",
        f"| doubled (a key executed twice at a destination) | {r['doubled']} |",
        f"| duplicates flagged on effects.state (executions > 1) | {r['flagged_duplicates']} |",
        f"| passed deadlines | {r['passed_deadline']:,} ({_causes(r['passed_deadline_by_cause'])}) |",
        f"| detected | {r['detected']:,} of {r['passed_deadline']:,} |",
        f"| detection latency p50 / p99 / max | {fmt(det['p50'])} / {fmt(det['p99'])} / {fmt(det['max'])} ms |",
        f"| late outcomes (after deadline + grace; flagged) | {r['late_outcomes']} ({r['late_outcomes_flagged']}) |",
        f"| final states | {_causes(r['final_states'])} |",
        f"| what the agents' calls returned | {_causes(meta.get('agents', {}))} |",
        f"| services that exited on their own | {len(meta.get('unexpected_exits', []))} |",
        "",
        "## Timeline",
        "",
        *[f"- {p['t_s']:.0f} s: {p['what']}" for p in meta.get("timeline", [])],
        "",
        "## Detection latency per minute (deadline -> uncertain, ms)",
        "",
        "| minute | passed deadlines | p50 | p99 | max |",
        "|---|---|---|---|---|",
        *[f"| {m['minute']} | {m['count']} | {fmt(m['p50'])} | {fmt(m['p99'])} | {fmt(m['max'])} |"
          for m in r["detection_per_minute"]],
        "",
        "## Consumer-group lag per minute (events not yet committed)",
        "",
        "| minute | workers max | workers last | workers unfolded max | reconcilers max | unanswered samples |",
        "|---|---|---|---|---|---|",
    ]  # fmt: skip
    rec = {m["minute"]: m for m in r["lag_reconcilers_per_minute"]}
    unfolded = {m["minute"]: m for m in r["lag_workers_unfolded_per_minute"]}
    for m in r["lag_workers_per_minute"]:
        lines.append(
            f"| {m['minute']} | {_n(m['max'])} | {_n(m['last'])} | {_n(unfolded.get(m['minute'], {}).get('max'))} "
            f"| {_n(rec.get(m['minute'], {}).get('max'))} | {m['unanswered']} |"
        )
    if plot:
        lines += ["", f"![lag and detection latency over time]({plot})"]
    lines += ["", "## Definitions", "", __doc__.split("Definitions (the report states them too):", 1)[1].strip()]
    for name in ("lost_sample", "undetected_sample"):
        if r.get(name):
            lines += ["", f"{name}: {', '.join(r[name])}"]
    if r.get("doubled_sample"):
        lines += ["", f"doubled_sample: {r['doubled_sample']}"]
    return "\n".join(lines) + "\n"


def _causes(c: Mapping[str, int]) -> str:
    return ", ".join(f"{k} {v:,}" for k, v in sorted(c.items())) or "-"


def _n(v: Any) -> str:
    return "-" if v is None else f"{v:,}"


__all__ = ["Seen", "compute", "late_outcome", "markdown", "passed_deadline", "per_minute", "verdict"]

"""``effects audit``: replay ``effects.events`` for a time window, fold it fresh, and check it.

One row per check, each with numerator, denominator, criterion and pass/fail:

| check | numerator / denominator | criterion |
|---|---|---|
| keyed_writes | attempts that handed the key to the destination / attempts | all |
| recorded_outcomes | attempts past their deadline with a recorded outcome / such attempts | all |
| receipts | effects executed OK that have a receipt / effects executed OK | all |
| uncertain | effects that became uncertain / effects | informational |
| resolved_by_reconciliation | uncertain effects settled by a reconciler or a person / uncertain effects | all |
| duplicate_executions | effects executed more than once (or with two receipt ids) / effects | none |
| stuck_over_10m | effects in an intermediate state longer than 10 min / effects | none |
| sent_unrecorded_window | p50/p99/max ms from a call's end to its durable record | p99 <= 1000 ms |
| undecodable_records | records that do not decode / records replayed | none |

Which effects are in the window is decided by positions in the log, never by the clocks written
into events (agents, webhook hosts, reconcilers and processors each stamp their own):

* The window is a range of positions: on each partition of ``effects.events`` (an embedded ledger:
  its one sequence of rows) it starts at the first record whose timestamp is at or after ``--from``
  and ends at the first at or after ``--to`` (``offsets_for_times``; embedded: the row's time). The
  replay reads from the start to the end of the log as it stands when the audit begins, and folds
  every record it reads, whatever time its event carries.
* An effect is in the window when the replay holds one of its intents positioned inside it: an
  attempt of it began there. Its later events (a receipt after the window, a webhook whose clock is
  an hour slow) count too. A key's records share one partition, so they are in one order.
* An effect whose replayed records hold no intent began before the window (or its intent does not
  decode): it is counted as "continuing" and left out of the ratios, except that a double
  execution its records show is still counted in ``duplicate_executions`` and listed: the audit
  never reports fewer duplicates than ``effects trace`` shows for the records it read.
* A record that does not decode fails ``undecodable_records``, its key listed: nothing vanishes.

The replay streams: per effect it keeps a small accumulator, never the events.
"""

from __future__ import annotations

import csv
import gc
import io
import json
import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field

from effect_ledger.processors.ops.sources import Replayed
from effect_ledger.streams.model import (
    Decision,
    DecisionKind,
    Executed,
    Intent,
    Outcome,
    Receipt,
    Resolution,
    Timeout,
    TimeoutPhase,
    Verdict,
)

STUCK_MS = 10 * 60 * 1000
WINDOW_P99_MS = 1000
MAX_LISTED_KEYS = 100  # keys of undecodable records named in the report; the count is always whole


class _Acc:
    """What the audit needs to know about one effect. Every update is order-independent (sets,
    minima, counters over distinct event ids), like the fold itself."""

    __slots__ = (
        "target",
        "first_intent_ms",
        "opened",
        "seen",
        "attempts",
        "keyed",
        "outcome",
        "deadline",
        "ok_execs",
        "receipt_ids",
        "uncertain",
        "resolved",
        "escalated",
        "settled",
        "windows",
        "executed_at",
        "timeouts",
    )

    def __init__(self) -> None:
        self.target = ""
        self.first_intent_ms: int | None = None
        self.opened = False  # one of its intents lies in the window's part of the log
        self.seen: set[int] = set()
        self.attempts: set[int] = set()
        self.keyed: set[int] = set()
        self.outcome: set[int] = set()
        self.deadline: dict[int, int] = {}
        self.ok_execs = 0
        self.receipt_ids: set[str] = set()
        self.uncertain = False
        self.resolved = False
        self.escalated = False
        self.settled: dict[int, int] = {}  # attempt -> when its outcome became final
        self.windows: list[int] = []
        self.executed_at: dict[int, int] = {}  # attempt -> its earliest recorded outcome
        self.timeouts: list[tuple[int, TimeoutPhase, int]] = []  # (attempt, phase, at)

    def add(self, e: object) -> None:
        h = hash(e.event_id)  # type: ignore[attr-defined]
        if h in self.seen:
            return  # a replayed duplicate (at-least-once delivery)
        self.seen.add(h)
        at: int = e.at_ms  # type: ignore[attr-defined]
        a: int = e.attempt  # type: ignore[attr-defined]
        if isinstance(e, Intent):
            self.target = e.target
            self.attempts.add(a)
            if e.keyed:
                self.keyed.add(a)
            self.deadline[a] = e.deadline_ms
            self.first_intent_ms = at if self.first_intent_ms is None else min(self.first_intent_ms, at)
        elif isinstance(e, Executed):
            prev_x = self.executed_at.get(a)
            self.executed_at[a] = at if prev_x is None else min(prev_x, at)
            self.windows.append(max(0, e.at_ms - e.call_ended_ms))
            if e.outcome is Outcome.OK:
                self.ok_execs += 1
                self.outcome.add(a)
            elif e.outcome is Outcome.FAILED:
                self.outcome.add(a)
                self._settle(a, at)
            else:
                self.uncertain = True
        elif isinstance(e, Receipt):
            self.receipt_ids.add(e.receipt_id)
            self._settle(a, at)
        elif isinstance(e, Timeout):
            self.timeouts.append((a, e.phase, at))
        elif isinstance(e, Resolution):
            if e.verdict is Verdict.FOUND:
                if e.receipt_id:
                    self.receipt_ids.add(e.receipt_id)
                self.resolved = True
                self.outcome.add(a)
                self._settle(a, at)
            elif e.verdict is Verdict.ABSENT:
                self.resolved = True
                self.outcome.add(a)
                self._settle(a, at)
            elif e.verdict is Verdict.ESCALATE:
                self.escalated = True
        elif isinstance(e, Decision):
            self.resolved = True
            self.outcome.add(a)
            if e.decision is DecisionKind.CONFIRMED and e.receipt_id:
                self.receipt_ids.add(e.receipt_id)
            self._settle(a, at)

    def _settle(self, attempt: int, at: int) -> None:
        prev = self.settled.get(attempt)
        self.settled[attempt] = at if prev is None else min(prev, at)

    def became_uncertain(self) -> bool:
        """An unknown call outcome, or a deadline that passed before the attempt had its outcome
        (a timeout written after the outcome changes nothing in the fold and is not counted)."""
        if self.uncertain:
            return True
        for a, phase, at in self.timeouts:
            settled = self.settled.get(a)
            if settled is not None and settled <= at:
                continue
            executed = self.executed_at.get(a)
            if phase is TimeoutPhase.CALL and executed is not None and executed <= at:
                continue
            return True
        return False

    def settled_at(self) -> int | None:
        """When the effect stopped being intermediate: a receipt settles it for good; otherwise
        its latest attempt must have settled."""
        if self.receipt_ids:
            return min(self.settled.values()) if self.settled else None
        latest = max(self.attempts, default=0)
        return self.settled.get(latest)


@dataclass
class Check:
    name: str
    numerator: int
    denominator: int
    criterion: str
    passed: bool
    detail: str = ""

    @property
    def ratio(self) -> str:
        return "-" if self.denominator == 0 else f"{100 * self.numerator / self.denominator:.2f}%"


@dataclass
class TargetRow:
    target: str
    effects: int = 0
    attempts: int = 0
    keyed: int = 0
    uncertain: int = 0
    resolved: int = 0
    duplicates: int = 0
    stuck: int = 0
    window_p99_ms: float | None = None


@dataclass
class AuditReport:
    from_ms: int
    to_ms: int
    as_of_ms: int
    events: int = 0
    undecodable: int = 0
    continuing: int = 0  # effects that began before the window
    undecodable_keys: list[str] = field(default_factory=list)  # at most MAX_LISTED_KEYS
    checks: list[Check] = field(default_factory=list)
    targets: list[TargetRow] = field(default_factory=list)
    duplicate_keys: list[str] = field(default_factory=list)
    stuck_keys: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.checks)

    def to_json(self) -> str:
        d = asdict(self)
        d["passed"] = self.passed
        for c in d["checks"]:
            c["ratio"] = Check(**{k: c[k] for k in ("name", "numerator", "denominator", "criterion", "passed")}).ratio
        return json.dumps(d, indent=2)

    def to_csv(self) -> str:
        out = io.StringIO()
        w = csv.writer(out)
        w.writerow(["scope", "check", "numerator", "denominator", "ratio", "criterion", "passed", "detail"])
        for c in self.checks:
            w.writerow(["all", c.name, c.numerator, c.denominator, c.ratio, c.criterion, c.passed, c.detail])
        for t in self.targets:
            for name, num, den in (
                ("keyed_writes", t.keyed, t.attempts),
                ("uncertain", t.uncertain, t.effects),
                ("resolved_by_reconciliation", t.resolved, t.uncertain),
                ("duplicate_executions", t.duplicates, t.effects),
                ("stuck_over_10m", t.stuck, t.effects),
            ):
                w.writerow([t.target, name, num, den, "-" if not den else f"{100 * num / den:.2f}%", "", "", ""])
        return out.getvalue()


def _label(ms: int) -> str:
    if ms % 3_600_000 == 0:
        return f"{ms // 3_600_000}h"
    if ms % 60_000 == 0:
        return f"{ms // 60_000}m"
    return f"{ms / 1000:g}s"


def _listed(what: str, keys: list[str], total: int) -> str:
    more = f" (the first {MAX_LISTED_KEYS} of {total:,} records)" if len(keys) >= MAX_LISTED_KEYS else ""
    return f"{what}{more}: {', '.join(keys)}"


def _percentile(sorted_values: list[int], q: float) -> float | None:
    if not sorted_values:
        return None
    i = min(len(sorted_values) - 1, max(0, math.ceil(q * len(sorted_values)) - 1))
    return float(sorted_values[i])


def audit(
    records: Iterable[Replayed], from_ms: int, to_ms: int, as_of_ms: int, stuck_ms: int = STUCK_MS
) -> AuditReport:
    """Fold a replay into the report. ``as_of_ms``: "now" for effects still open at the end.
    ``records`` carry the window (a source read from ``from_ms`` and marked what lies before
    ``to_ms``: ``db_events`` / ``replay_events``); ``from_ms`` and ``to_ms`` only label the report."""
    report = AuditReport(from_ms, to_ms, as_of_ms)
    accs: dict[str, _Acc] = {}
    # The accumulators hold no reference cycles: the cyclic collector would only rescan them.
    gc_was_on = gc.isenabled()
    gc.disable()
    try:
        _fold(records, accs, report)
    finally:
        if gc_was_on:
            gc.enable()
    return _report(accs, report, as_of_ms, stuck_ms)


def _fold(records: Iterable[Replayed], accs: dict[str, _Acc], report: AuditReport) -> None:
    damaged: set[str] = set()
    for r in records:
        if r.event is None:
            report.undecodable += 1
            if len(damaged) < MAX_LISTED_KEYS:
                damaged.add(r.key if r.key is not None else f"(no key: partition {r.partition} offset {r.offset})")
            continue
        report.events += 1
        acc = accs.get(r.event.effect_id)
        if acc is None:
            acc = accs[r.event.effect_id] = _Acc()
        acc.add(r.event)
        if r.in_window and isinstance(r.event, Intent):
            acc.opened = True
    report.undecodable_keys = sorted(damaged)


def _report(accs: dict[str, _Acc], report: AuditReport, as_of_ms: int, stuck_ms: int) -> AuditReport:
    totals = TargetRow("all")
    per_target: dict[str, TargetRow] = {}
    attempts_due = outcomes = executed = with_receipt = 0
    windows: list[int] = []
    target_windows: dict[str, list[int]] = {}
    continuing_dups = 0
    for key, acc in accs.items():
        dup = acc.ok_execs > 1 or len(acc.receipt_ids) > 1
        if not acc.opened or acc.first_intent_ms is None:
            if acc.first_intent_ms is None:  # no intent replayed: it began before the window
                report.continuing += 1
                if dup:  # partial history, but two executions are two executions
                    continuing_dups += 1
                    report.duplicate_keys.append(key)
            continue  # otherwise every intent of it lies after the window's end
        row = per_target.setdefault(acc.target, TargetRow(acc.target))
        settled = acc.settled_at()
        stuck = ((settled if settled is not None else as_of_ms) - acc.first_intent_ms) > stuck_ms
        uncertain = acc.became_uncertain()
        for t in (totals, row):
            t.effects += 1
            t.attempts += len(acc.attempts)
            t.keyed += len(acc.keyed)
            t.uncertain += uncertain
            t.resolved += uncertain and acc.resolved
            t.duplicates += dup
            t.stuck += stuck
        if dup:
            report.duplicate_keys.append(key)
        if stuck:
            report.stuck_keys.append(key)
        for a in acc.attempts:
            if acc.deadline.get(a, 0) <= as_of_ms:
                attempts_due += 1
                outcomes += a in acc.outcome
        if acc.ok_execs:
            executed += 1
            with_receipt += bool(acc.receipt_ids)
        windows.extend(acc.windows)
        target_windows.setdefault(acc.target, []).extend(acc.windows)

    windows.sort()
    p50, p99 = _percentile(windows, 0.50), _percentile(windows, 0.99)
    mx = float(windows[-1]) if windows else None
    report.checks = [
        Check("keyed_writes", totals.keyed, totals.attempts, "all", totals.keyed == totals.attempts),
        Check("recorded_outcomes", outcomes, attempts_due, "all", outcomes == attempts_due),
        Check("receipts", with_receipt, executed, "all", with_receipt == executed),
        Check("uncertain", totals.uncertain, totals.effects, "informational", True),
        Check(
            "resolved_by_reconciliation", totals.resolved, totals.uncertain, "all", totals.resolved == totals.uncertain
        ),
        Check(
            "duplicate_executions",
            totals.duplicates + continuing_dups,
            totals.effects + continuing_dups,
            "none",
            totals.duplicates + continuing_dups == 0,
            f"{continuing_dups} of them began before the window" if continuing_dups else "",
        ),
        Check(f"stuck_over_{_label(stuck_ms)}", totals.stuck, totals.effects, "none", totals.stuck == 0),
        Check(
            "sent_unrecorded_window",
            len(windows),
            len(windows),
            f"p99 <= {WINDOW_P99_MS} ms",
            p99 is None or p99 <= WINDOW_P99_MS,
            "no executions" if p99 is None else f"p50 {p50:.0f} ms, p99 {p99:.0f} ms, max {mx:.0f} ms",
        ),
        Check(
            "undecodable_records",
            report.undecodable,
            report.events + report.undecodable,
            "none",
            report.undecodable == 0,
            _listed("keys", report.undecodable_keys, report.undecodable) if report.undecodable else "",
        ),
    ]
    for name, row in sorted(per_target.items()):
        w = sorted(target_windows.get(name, []))
        row.window_p99_ms = _percentile(w, 0.99)
        report.targets.append(row)
    report.duplicate_keys.sort()
    report.stuck_keys.sort()
    return report

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

Memory is bounded whatever the window: the replay turns each event into a small tuple of what the
checks need and groups the tuples by effect with ``effect_ledger.ops.spill.KeyedSpill``:
up to ``MEMORY_EVENTS`` of them in memory, beyond that in a temporary folder (about 80 bytes per
event on disk; ``spill_dir``, else TMPDIR), read back one bucket of effects at a time. What the
report keeps is bounded too: the sent-but-unrecorded windows as a count per millisecond value, and
at most ``MAX_REPORTED_KEYS`` duplicate and stuck keys, and as many of each failed check's keys
(``Check.keys``; the counts, ``Check.failing``, are always whole). The sent-but-unrecorded check
lists the effects with a window over its bound.
"""

from __future__ import annotations

import csv
import gc
import io
import json
import math
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, NamedTuple
from urllib.parse import quote, urlsplit, urlunsplit

from effect_ledger.core.model import (
    Decision,
    Event,
    Executed,
    Intent,
    Receipt,
    Resolution,
    Timeout,
)
from effect_ledger.errors import ConfigError
from effect_ledger.ops.sources import Replayed
from effect_ledger.ops.spill import KeyedSpill

STUCK_MS = 10 * 60 * 1000
WINDOW_P99_MS = 1000
MAX_LISTED_KEYS = 100  # keys of undecodable records named in the report; the count is always whole
MAX_REPORTED_KEYS = 1000  # duplicate and stuck keys listed in the report; the counts are always whole
MEMORY_EVENTS = 250_000  # events grouped in memory before the audit spills to disk (about 100 MB)

# An event as the audit keeps it: (effect id, kind, attempt, at_ms, hash of the event id, x, y).
# Intent: x target, y deadline_ms << 2 | keyed << 1 | positioned in the window; Executed: x outcome,
# y the sent-but-unrecorded ms; Receipt: x receipt id; Timeout: x the CALL phase; Resolution and
# Decision: x the verdict or decision, y the receipt id.
INTENT, EXECUTED, RECEIPT, TIMEOUT, RESOLUTION, DECISION = range(6)
_OK, _FAILED, _UNKNOWN = 0, 1, 2
_OUTCOME = {"OK": _OK, "FAILED": _FAILED, "UNKNOWN": _UNKNOWN}  # StrEnum members hash as their str
_FOUND, _ABSENT, _ESCALATE, _OTHER = 0, 1, 2, 3
_VERDICT = {"FOUND": _FOUND, "ABSENT": _ABSENT, "ESCALATE": _ESCALATE}
Compact = tuple[str, int, int, int, int, object, object]


class _Attrs:
    """An event read like a dict of its fields (``compact`` takes either)."""

    __slots__ = ("e",)

    def __init__(self, e: Event) -> None:
        self.e = e

    def __getitem__(self, name: str) -> Any:
        return getattr(self.e, name)


def compact(model: type, d: Mapping[str, Any] | _Attrs, in_window: bool) -> Compact | None:
    """What the checks need of one event (see ``Compact``), from its class and fields (as decoded:
    enum symbols may be str or StrEnum, compared by value); None for a record that is no event."""
    key = sys.intern(d["effect_id"])  # one string per effect, shared by its tuples (and on disk)
    h = hash(d["event_id"])
    if model is Intent:
        return (
            key, INTENT, d["attempt"], d["at_ms"], h, d["target"],
            (d["deadline_ms"] << 2) | (bool(d["keyed"]) << 1) | in_window,
        )  # fmt: skip
    if model is Executed:
        window = max(0, d["at_ms"] - d["call_ended_ms"])
        return (key, EXECUTED, d["attempt"], d["at_ms"], h, _OUTCOME.get(d["outcome"], _UNKNOWN), window)
    if model is Receipt:
        return (key, RECEIPT, d["attempt"], d["at_ms"], h, d["receipt_id"], None)
    if model is Timeout:
        return (key, TIMEOUT, d["attempt"], d["at_ms"], h, d["phase"] == "CALL", None)
    if model is Resolution:
        return (key, RESOLUTION, d["attempt"], d["at_ms"], h, _VERDICT.get(d["verdict"], _OTHER), d["receipt_id"])
    if model is Decision:
        return (key, DECISION, d["attempt"], d["at_ms"], h, d["decision"] == "CONFIRMED", d["receipt_id"])
    return None


class _Effect(NamedTuple):
    """What the checks take from one effect's events."""

    opened: bool  # one of its intents lies in the window's part of the log
    first_intent_ms: int | None  # None: no intent replayed (it began before the window)
    target: str
    duplicate: bool  # executed OK more than once, or two receipt ids
    stuck: bool
    uncertain: bool
    resolved: bool
    attempts: int
    keyed: int
    attempts_due: int  # attempts past their deadline at as_of_ms
    outcomes: int  # of those, the ones with a recorded outcome
    executed: bool  # executed OK
    with_receipt: bool
    windows: list[int]  # sent-but-unrecorded ms, one per execution


def _summarize(events: list[Compact], as_of_ms: int, stuck_ms: int) -> _Effect:
    """Fold one effect's compact events. Every update is order-independent (sets, minima, counters
    over distinct event ids), like the fold itself. One function with local variables: it runs
    once per effect of the window."""
    if len(events) > 1 and len({c[4] for c in events}) < len(events):
        seen: set[int] = set()
        unique = []
        for c in events:
            if c[4] not in seen:  # a replayed duplicate (at-least-once delivery)
                seen.add(c[4])
                unique.append(c)
        events = unique
    target = ""
    first: int | None = None
    opened = uncertain = resolved = False
    deadline: dict[int, int] = {}  # attempt -> its deadline (the attempts of its intents)
    keyed: set[int] = set()
    outcome: set[int] = set()
    ok_execs = 0
    receipts: set[str] = set()
    settled: dict[int, int] = {}  # attempt -> when its outcome became final
    executed_at: dict[int, int] = {}  # attempt -> its earliest recorded outcome
    windows: list[int] = []
    timeouts: list[tuple[int, object, int]] = []  # (attempt, CALL phase, at)
    for _key, kind, a, at, _h, x, y in events:
        if kind == INTENT:
            target = x  # type: ignore[assignment]
            deadline[a] = y >> 2  # type: ignore[operator]
            if y & 2:  # type: ignore[operator]
                keyed.add(a)
            if y & 1:  # type: ignore[operator]
                opened = True
            if first is None or at < first:
                first = at
        elif kind == EXECUTED:
            prev = executed_at.get(a)
            if prev is None or at < prev:
                executed_at[a] = at
            windows.append(y)  # type: ignore[arg-type]
            if x == _OK:
                ok_execs += 1
                outcome.add(a)
            elif x == _FAILED:
                outcome.add(a)
                prev = settled.get(a)
                if prev is None or at < prev:
                    settled[a] = at
            else:
                uncertain = True
        elif kind == RECEIPT:
            receipts.add(x)  # type: ignore[arg-type]
            prev = settled.get(a)
            if prev is None or at < prev:
                settled[a] = at
        elif kind == TIMEOUT:
            timeouts.append((a, x, at))
        elif kind == RESOLUTION or kind == DECISION:
            if kind == RESOLUTION:
                if x == _ESCALATE or x == _OTHER:
                    continue
                if x == _FOUND and y:
                    receipts.add(y)  # type: ignore[arg-type]
            elif x and y:  # a person confirmed it, with a receipt id
                receipts.add(y)  # type: ignore[arg-type]
            resolved = True
            outcome.add(a)
            prev = settled.get(a)
            if prev is None or at < prev:
                settled[a] = at
    # When it stopped being intermediate: a receipt settles it for good; otherwise its latest
    # attempt must have settled.
    if receipts:
        settled_at = min(settled.values()) if settled else None
    else:
        settled_at = settled.get(max(deadline, default=0))
    stuck = first is not None and ((settled_at if settled_at is not None else as_of_ms) - first) > stuck_ms
    due = [a for a, d in deadline.items() if d <= as_of_ms]
    return _Effect(
        opened,
        first,
        target,
        ok_execs > 1 or len(receipts) > 1,
        stuck,
        uncertain or _late(timeouts, settled, executed_at),
        resolved,
        len(deadline),
        len(keyed),
        len(due),
        sum(1 for a in due if a in outcome),
        ok_execs > 0,
        bool(receipts),
        windows,
    )


def _late(timeouts: list[tuple[int, object, int]], settled: dict[int, int], executed_at: dict[int, int]) -> bool:
    """A deadline that passed before the attempt had its outcome (a timeout written after the
    outcome changes nothing in the fold and is not counted)."""
    for a, call_phase, at in timeouts:
        s = settled.get(a)
        if s is not None and s <= at:
            continue
        executed = executed_at.get(a)
        if call_phase and executed is not None and executed <= at:
            continue
        return True
    return False


@dataclass
class Check:
    name: str
    numerator: int
    denominator: int
    criterion: str
    passed: bool
    detail: str = ""
    # A failed check's effects, so that each can be opened (`effects trace KEY`, the console's
    # /effect/KEY): the first MAX_REPORTED_KEYS in sorted order, and how many there are in all.
    keys: list[str] = field(default_factory=list)
    failing: int = 0

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

    def to_json(self, link: Callable[[str], str] | None = None) -> str:
        """The report as JSON; with ``link``, each failed check's keys get their console links."""
        d = asdict(self)
        d["passed"] = self.passed
        for c in d["checks"]:
            c["ratio"] = Check(**{k: c[k] for k in ("name", "numerator", "denominator", "criterion", "passed")}).ratio
            if link is not None:
                c["links"] = [link(k) for k in c["keys"]]
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


def console_base(url: str) -> str:
    """The console's address as audit links are built on it: an ``http://`` or ``https://`` URL with
    a host and no query or fragment. A ``user:password@`` in it is dropped, since the links are printed
    and go into reports (a console behind a login asks for it itself). Anything else is a ConfigError
    whose message does not repeat the URL (it may hold a secret)."""
    try:
        parts = urlsplit(url.strip())
        host = parts.hostname
        port = parts.port  # raises ValueError for a port that is not a number
    except ValueError:
        raise ConfigError("--console-url is not a URL; expected http://HOST[:PORT][/PATH]") from None
    if parts.scheme.lower() not in ("http", "https") or not host:
        raise ConfigError("--console-url must be an http:// or https:// URL with a host, such as http://HOST:8080")
    if parts.query or parts.fragment:
        raise ConfigError("--console-url must not have a query or fragment: links add /effect/KEY to its path")
    netloc = f"[{host}]" if ":" in host else host
    netloc += f":{port}" if port is not None else ""
    return urlunsplit((parts.scheme.lower(), netloc, parts.path, "", ""))


def effect_link(console_url: str | None, key: str) -> str:
    """Where the console shows one effect: ``/effect/{effect_id}`` under ``console_url``, or the path
    alone when no console address is known. The key is one path segment (``/``, ``?``, ``#``, ``%``
    and the like escaped), so any key a caller chose opens its own page."""
    path = "/effect/" + quote(key, safe=":@!$&'()*+,;=-._~")
    return console_url.rstrip("/") + path if console_url else path


def _label(ms: int) -> str:
    if ms % 3_600_000 == 0:
        return f"{ms // 3_600_000}h"
    if ms % 60_000 == 0:
        return f"{ms // 60_000}m"
    return f"{ms / 1000:g}s"


def _listed(what: str, keys: list[str], total: int) -> str:
    more = f" (the first {MAX_LISTED_KEYS} of {total:,} records)" if len(keys) >= MAX_LISTED_KEYS else ""
    return f"{what}{more}: {', '.join(keys)}"


def _percentile(counts: Counter[int], q: float) -> float | None:
    """The ``q`` quantile (nearest rank) of the values counted in ``counts`` (value -> how often)."""
    n = sum(counts.values())
    if not n:
        return None
    rank = min(n, max(1, math.ceil(q * n)))
    seen = 0
    for v in sorted(counts):
        seen += counts[v]
        if seen >= rank:
            return float(v)
    raise AssertionError("unreachable")


class _Keys:
    """The first ``MAX_REPORTED_KEYS`` keys in sorted order of any number added, in bounded memory."""

    def __init__(self) -> None:
        self.keys: list[str] = []
        self.count = 0  # every key added, listed or not

    def add(self, key: str) -> None:
        self.count += 1
        self.keys.append(key)
        if len(self.keys) >= 2 * MAX_REPORTED_KEYS:
            self.keys.sort()
            del self.keys[MAX_REPORTED_KEYS:]

    def result(self) -> list[str]:
        return sorted(self.keys)[:MAX_REPORTED_KEYS]


def audit(
    records: Iterable[Replayed],
    from_ms: int,
    to_ms: int,
    as_of_ms: int,
    stuck_ms: int = STUCK_MS,
    *,
    memory_events: int = MEMORY_EVENTS,
    spill_dir: str | None = None,
) -> AuditReport:
    """Fold a replay into the report. ``as_of_ms``: "now" for effects still open at the end.
    ``records`` carry the window (a source read from ``from_ms`` and marked what lies before
    ``to_ms``: ``db_events`` / ``replay_events``); ``from_ms`` and ``to_ms`` only label the report.
    Past ``memory_events`` events the replay is grouped on disk under ``spill_dir`` (see the module
    docstring)."""
    report = AuditReport(from_ms, to_ms, as_of_ms)
    spill = KeyedSpill(memory_events, spill_dir)
    # The tuples and accumulators hold no reference cycles: the cyclic collector would only rescan
    # them, over and over as they pile up.
    gc_was_on = gc.isenabled()
    gc.disable()
    try:
        _collect(records, spill, report)
        return _report(spill, report, as_of_ms, stuck_ms)
    finally:
        spill.close()
        if gc_was_on:
            gc.enable()


def _collect(records: Iterable[Replayed], spill: KeyedSpill, report: AuditReport) -> None:
    damaged: set[str] = set()
    add = spill.add
    events = 0
    for r in records:
        e = r.event
        if e is not None:
            c = compact(type(e), _Attrs(e), r.in_window)
        elif r.fields is not None:
            c = compact(r.model, r.fields, r.in_window)  # type: ignore[arg-type]
        else:
            c = None
        if c is None:
            report.undecodable += 1
            if len(damaged) < MAX_LISTED_KEYS:
                damaged.add(r.key if r.key is not None else f"(no key: partition {r.partition} offset {r.offset})")
            continue
        events += 1
        add(c)
    report.events = events
    report.undecodable_keys = sorted(damaged)


def _report(spill: KeyedSpill, report: AuditReport, as_of_ms: int, stuck_ms: int) -> AuditReport:
    totals = TargetRow("all")
    per_target: dict[str, TargetRow] = {}
    attempts_due = outcomes = executed = with_receipt = 0
    windows: Counter[int] = Counter()
    target_windows: dict[str, Counter[int]] = {}
    continuing_dups = 0
    dup_keys, stuck_keys = _Keys(), _Keys()
    # The effects failing each all/none check; counted always, listed on the check only if it fails.
    unkeyed, unrecorded, no_receipt, unresolved, slow = _Keys(), _Keys(), _Keys(), _Keys(), _Keys()
    for key, events in spill.groups():
        e = _summarize(events, as_of_ms, stuck_ms)
        if not e.opened or e.first_intent_ms is None:
            if e.first_intent_ms is None:  # no intent replayed: it began before the window
                report.continuing += 1
                if e.duplicate:  # partial history, but two executions are two executions
                    continuing_dups += 1
                    dup_keys.add(key)
            continue  # otherwise every intent of it lies after the window's end
        row = per_target.get(e.target)
        if row is None:
            row = per_target[e.target] = TargetRow(e.target)
            target_windows[e.target] = Counter()
        for t in (totals, row):
            t.effects += 1
            t.attempts += e.attempts
            t.keyed += e.keyed
            t.uncertain += e.uncertain
            t.resolved += e.uncertain and e.resolved
            t.duplicates += e.duplicate
            t.stuck += e.stuck
        if e.duplicate:
            dup_keys.add(key)
        if e.stuck:
            stuck_keys.add(key)
        if e.keyed < e.attempts:
            unkeyed.add(key)
        if e.outcomes < e.attempts_due:
            unrecorded.add(key)
        if e.executed and not e.with_receipt:
            no_receipt.add(key)
        if e.uncertain and not e.resolved:
            unresolved.add(key)
        if any(w > WINDOW_P99_MS for w in e.windows):
            slow.add(key)
        attempts_due += e.attempts_due
        outcomes += e.outcomes
        if e.executed:
            executed += 1
            with_receipt += e.with_receipt
        if e.windows:
            tw = target_windows[e.target]
            for w in e.windows:
                windows[w] += 1
                tw[w] += 1
    report.duplicate_keys = dup_keys.result()
    report.stuck_keys = stuck_keys.result()

    n_windows = sum(windows.values())
    p50, p99 = _percentile(windows, 0.50), _percentile(windows, 0.99)
    mx = float(max(windows)) if windows else None
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
            n_windows,
            n_windows,
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
    failing = {
        "keyed_writes": unkeyed,
        "recorded_outcomes": unrecorded,
        "receipts": no_receipt,
        "resolved_by_reconciliation": unresolved,
        "duplicate_executions": dup_keys,
        f"stuck_over_{_label(stuck_ms)}": stuck_keys,
        "sent_unrecorded_window": slow,
    }
    for c in report.checks:
        if c.passed:
            continue
        if c.name == "undecodable_records":
            c.keys, c.failing = list(report.undecodable_keys), report.undecodable
        elif c.name in failing:
            c.keys, c.failing = failing[c.name].result(), failing[c.name].count
    for name, row in sorted(per_target.items()):
        row.window_p99_ms = _percentile(target_windows[name], 0.99)
        report.targets.append(row)
    return report

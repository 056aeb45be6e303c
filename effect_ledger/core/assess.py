"""The eight-row check of an execution log, and its arithmetic: pure, no I/O.

Readers (``effect_ledger.ops.assess_formats``) turn each format's records into :class:`Call`; the
:class:`Assessor` folds calls one at a time in bounded memory and :func:`rows` and :func:`arithmetic`
turn what it counted into the table. Every cell carries its numerator, denominator and criterion; a
row whose data the log does not carry says what it needs instead of showing a zero.

Memory is bounded by the identities remembered (the last attempt per logical call, per key and per
business arguments, for :data:`HORIZON_MS` of log time and at most :data:`MAX_TRACKED` of them: the
oldest are forgotten first, and a stuck row counts as noticed only when followed up within the
horizon), by :data:`MAX_SAMPLES` durations per series (beyond it a seeded reservoir keeps a uniform
sample; counts, the maximum and every numerator stay exact), and by the started rows kept to decide
which are stuck (at most :data:`MAX_TRACKED`).
"""

from __future__ import annotations

import random
import re
from array import array
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

Status = Literal["ok", "error", "unknown", "pending"]
#: Identities remembered to pair retries and duplicates (about 200 bytes each).
MAX_TRACKED = 1_000_000
#: Durations kept per series for the percentiles (8 bytes each).
MAX_SAMPLES = 1_000_000
#: How long an attempt is remembered to pair a later one with it (a stuck row's follow-up, a retry):
#: at least the duplicate window.
HORIZON_MS = 6 * 3600 * 1000
#: A row in an intermediate state longer than this is stuck (the issue's ten minutes).
STUCK_MS = 10 * 60 * 1000
DAY_MS = 86_400_000
_EXAMPLES = 5

# A key carries time when it holds an epoch in seconds or milliseconds, an ISO-like date, or is a
# time-based UUID (v1, v6, v7): such a key changes when the same call is made again later.
# Digit runs count only between non-alphanumerics, so a hex digest (an effect key) is not read as time.
_TIME_IN_KEY = re.compile(
    r"(?<![0-9A-Za-z])1\d{9}(?:\d{3})?(?![0-9A-Za-z])"  # epoch seconds or milliseconds
    r"|20\d\d-[01]\d-[0-3]\d|(?<![0-9A-Za-z])20\d\d[01]\d[0-3]\d"  # a date
    r"|[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[167][0-9a-fA-F]{3}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"  # a time-based UUID
)


def key_carries_time(key: str) -> bool:
    """Whether an idempotency key embeds a time (so a retry made later would carry another key)."""
    return _TIME_IN_KEY.search(key) is not None


class Call(NamedTuple):
    """One attempt of a tool call or HTTP request, as any reader sees it.

    ``args`` is a digest of the business arguments (never the values); ``call_id`` names the logical
    call when the log has one (attempts sharing it are retries); ``intent_ms`` is when an intent was
    recorded before the call, when the log carries intents at all. A named tuple: one is made per
    record read, several times faster than a frozen dataclass."""

    tool: str
    start_ms: int | None
    end_ms: int | None
    status: Status
    write: bool = True
    key: str | None = None
    args: str | None = None
    call_id: str | None = None
    intent_ms: int | None = None
    line: int = 0


@dataclass(frozen=True)
class Carries:
    """What a log format can say at all: a row whose data it lacks is "not measurable"."""

    keys: bool = True
    args: bool = True
    ends: bool = True
    pending: bool = False
    intents: bool = False


class _Samples:
    """Durations in ms: exact up to ``cap`` values, then a seeded reservoir; the max stays exact."""

    def __init__(self, cap: int = MAX_SAMPLES, seed: int = 0) -> None:
        self.values: array[int] = array("q")
        self.count = 0
        self.max: int | None = None
        self._cap = cap
        self._rng = random.Random(seed)

    def add(self, v: int) -> None:
        self.count += 1
        self.max = v if self.max is None or v > self.max else self.max
        if len(self.values) < self._cap:
            self.values.append(v)
        else:
            j = self._rng.randrange(self.count)
            if j < self._cap:
                self.values[j] = v

    def quantile(self, q: float) -> int | None:
        """The nearest-rank quantile (q in [0, 1]) of the kept values."""
        if not self.values:
            return None
        s = sorted(self.values)
        rank = max(1, -(-int(q * 1000) * len(s) // 1000))  # ceil(q * n) without float error
        return s[min(rank, len(s)) - 1]


@dataclass
class ToolCounts:
    """Per tool: the counts behind the per-tool breakdown."""

    tool: str
    calls: int = 0
    writes: int = 0
    keyed: int = 0
    ok: int = 0
    unknown: int = 0
    retries: int = 0
    early_retries: int = 0
    duplicates: int = 0
    stuck: int = 0

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class Assessor:
    """Folds :class:`Call` values; ``window_ms`` pairs semantic duplicates (same tool and business
    arguments, both succeeded, no shared key) and retries (a new attempt after an error or an unknown
    outcome)."""

    carries: Carries = field(default_factory=Carries)
    window_ms: int = 600_000
    tracked: int = MAX_TRACKED
    samples: int = MAX_SAMPLES
    tools: dict[str, ToolCounts] = field(default_factory=dict)
    first_ms: int | None = None
    last_ms: int | None = None
    writes: int = 0
    keyed: int = 0
    keyed_with_time: int = 0
    key_changed: set[str] = field(default_factory=set)
    retries: int = 0
    retries_keyed: int = 0
    retries_same_key: int = 0
    retries_unsafe: int = 0
    intents_before: int = 0
    timed: int = 0
    unknown: int = 0
    ok_writes: int = 0
    duplicates: int = 0
    pending: int = 0
    examples: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    forgotten: int = 0
    stuck_rows: int = 0
    stuck_noticed: int = 0
    early: int = 0
    settle_ms: dict[str, int | None] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.windows = _Samples(self.samples, 1)
        self.ok_durations: dict[str, _Samples] = {}
        self.delays: dict[str, _Samples] = {}
        self._last: OrderedDict[tuple[str, str, str], Call] = OrderedDict()
        self._pending: list[Call] = []
        self._followed: set[int] = set()
        self._horizon = max(self.window_ms, HORIZON_MS)

    def _tool(self, name: str) -> ToolCounts:
        t = self.tools.get(name)
        if t is None:
            t = self.tools[name] = ToolCounts(name)
        return t

    def _example(self, kind: str, call: Call, **extra: Any) -> None:
        ex = self.examples.setdefault(kind, [])
        if len(ex) < _EXAMPLES:
            ex.append({"line": call.line, "tool": call.tool, "at_ms": call.start_ms, **extra})

    def _remember(self, ident: tuple[str, str, str], call: Call) -> Call | None:
        last = self._last
        prev = last.pop(ident, None)
        last[ident] = call
        start = call.start_ms
        if start is not None:
            # the oldest first (a log is about in time order): what is older than the horizon can pair
            # with nothing any more, so memory follows the calls of the last few hours, not the month
            limit = start - self._horizon
            values = last.values()
            while last:
                first = next(iter(values)).start_ms
                if first is None or first >= limit:
                    break
                last.popitem(last=False)
        if len(last) > self.tracked:
            last.popitem(last=False)
            self.forgotten += 1
        return prev

    def add(self, c: Call) -> None:
        """Fold one attempt (any order within ``window_ms``; a log sorted by time pairs exactly).

        The hot loop of ``effects assess`` (one call per record): attributes are read once into
        locals and the common paths inlined, which halves its cost on a log of only tool calls."""
        tool, start, end, status, write, key, args, call_id, intent, _line = c
        t = self.tools.get(tool)
        if t is None:
            t = self.tools[tool] = ToolCounts(tool)
        t.calls += 1
        if start is not None:
            first_ms = self.first_ms
            if first_ms is None or start < first_ms:
                self.first_ms = start
            last_end = end if end is not None else start
            last_ms = self.last_ms
            if last_ms is None or last_end > last_ms:
                self.last_ms = last_end
        if not write:
            return
        self.writes += 1
        t.writes += 1
        if key is not None:
            self.keyed += 1
            t.keyed += 1
            if _TIME_IN_KEY.search(key) is not None:
                self.keyed_with_time += 1
                self._example("key carries time", c, key=key)
        if intent is not None and start is not None and intent <= start:
            self.intents_before += 1
        duration = None
        if start is not None and end is not None:
            duration = end - start
            if duration < 0:
                duration = 0
            self.timed += 1
            self.windows.add(duration)
        if status == "ok":
            self.ok_writes += 1
            t.ok += 1
            if duration is not None:
                od = self.ok_durations.get(tool)
                if od is None:
                    od = self.ok_durations[tool] = _Samples(self.samples, 2)
                od.add(duration)
        elif status == "unknown" or status == "pending":
            self.unknown += 1
            t.unknown += 1
            if status == "pending":
                self.pending += 1
                if len(self._pending) < self.tracked:
                    self._pending.append(c)
        # the identities in pairing order: the logical call, the business arguments, the key
        paired = False
        remember = self._remember
        for kind, value in (("call", call_id), ("args", args), ("key", key)):
            if value is None:
                continue
            prev = remember((kind, tool, value), c)
            if prev is None:
                continue
            if prev.status == "pending":
                self._followed.add(id(prev))  # alive in self._pending: its id names it
            if not paired and kind != "key":
                self._pair(prev, c, t, same_call=kind == "call")
                paired = True

    def _pair(self, prev: Call, c: Call, t: ToolCounts, same_call: bool) -> None:
        if prev.start_ms is None or c.start_ms is None:
            return  # without times nothing says the two were close
        if c.start_ms - prev.start_ms > self.window_ms or c.start_ms < prev.start_ms:
            return
        if prev.status in ("error", "unknown", "pending"):
            self.retries += 1
            t.retries += 1
            after = prev.end_ms if prev.end_ms is not None else prev.start_ms
            if c.tool not in self.delays:
                self.delays[c.tool] = _Samples(self.samples, 3)
            self.delays[c.tool].add(max(0, c.start_ms - after))
            if prev.key is not None or c.key is not None:
                self.retries_keyed += 1
                if prev.key == c.key:
                    self.retries_same_key += 1
                else:
                    for k in (prev.key, c.key):
                        if k is not None and not key_carries_time(k):  # those are counted already
                            self.key_changed.add(k)
                    self._example("key changed on retry", c, key=c.key)
            if prev.status != "error" and (prev.key is None or prev.key != c.key):
                self.retries_unsafe += 1
        elif prev.status == "ok" and c.status == "ok":  # a second success: it happened twice
            if prev.key is not None and prev.key == c.key:
                return  # the destination saw the same key: it may have answered from its record
            self.duplicates += 1
            t.duplicates += 1
            self._example("semantic duplicate", c, first_line=prev.line)

    def finish(self) -> None:
        """Settle what needs the whole log: stuck rows, retries sent before a result could show."""
        end = self.last_ms
        for c in self._pending:
            if end is None or c.start_ms is None or end - c.start_ms <= STUCK_MS:
                continue
            self._tool(c.tool).stuck += 1
            noticed = id(c) in self._followed
            self.stuck_rows += 1
            if noticed:
                self.stuck_noticed += 1
            else:
                self._example("stuck, nothing noticed", c)
        self.early = 0
        for tool, d in self.delays.items():
            p99 = self.ok_durations[tool].quantile(0.99) if tool in self.ok_durations else None
            self.settle_ms[tool] = p99
            if p99 is None:
                continue
            early = sum(1 for v in d.values if v < p99)
            self.early += early
            self._tool(tool).early_retries = early

    @property
    def span_days(self) -> float | None:
        if self.first_ms is None or self.last_ms is None or self.last_ms <= self.first_ms:
            return None
        return (self.last_ms - self.first_ms) / DAY_MS

    @property
    def keys_stable(self) -> int:
        """Keyed writes whose key carries no time and was never replaced on a retry."""
        return self.keyed - self.keyed_with_time - len(self.key_changed)


Verdict = Literal["pass", "fail", "fix first", "not measurable", "no data"]


@dataclass(frozen=True)
class Row:
    """One technical item: its counts, criterion, verdict, and what closing the gap needs."""

    id: str
    item: str
    numerator: int | None
    denominator: int | None
    criterion: str
    verdict: Verdict
    needs: Literal["schema", "code"]
    fix: str
    detail: dict[str, Any] = field(default_factory=dict)
    missing: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _na(rid: str, item: str, criterion: str, needs: Literal["schema", "code"], fix: str, what: str) -> Row:
    return Row(rid, item, None, None, criterion, "not measurable", needs, fix, missing=what)


def _ratio(rid: str, item: str, num: int, den: int, criterion: str, ok: bool, needs: Literal["schema", "code"],
           fix: str, **detail: Any) -> Row:  # fmt: skip
    verdict: Verdict = "no data" if den == 0 else ("pass" if ok else "fail")
    return Row(rid, item, num, den, criterion, verdict, needs, fix, detail)


def rows(a: Assessor) -> list[Row]:
    """The eight rows, those whose fix needs a schema change (a field in the call or the log, an
    intent record) first, then those needing only code or configuration."""
    cr = a.carries
    out: list[Row] = []
    # 1. keyed writes, by tool: below half, fix this before anything else
    item = "writes carry an idempotency key"
    crit = "every tool >= 50% keyed (below: fix first); 100% to pass"
    fix = "add an idempotency key field to each write call"
    if not cr.keys:
        out.append(_na("keyed", item, crit, "schema", fix, "needs the key sent with each call (a header or argument)"))
    else:
        low = sorted(t.tool for t in a.tools.values() if t.writes and t.keyed * 2 < t.writes)
        r = _ratio("keyed", item, a.keyed, a.writes, crit, a.keyed == a.writes, "schema", fix, below_half=low)
        if low:
            r = Row(**{**r.__dict__, "verdict": "fix first"})
        out.append(r)
    # 2. an intent recorded before the call
    item, crit = "an intent is recorded before the call", "100% of writes"
    fix = "write an intent record (key, arguments) before calling"
    if not cr.intents:
        out.append(_na("intent", item, crit, "schema", fix, "needs an intent record written before each call"))
    else:
        out.append(
            _ratio("intent", item, a.intents_before, a.writes, crit, a.intents_before == a.writes, "schema", fix)
        )
    # 3. rows stuck in an intermediate state
    item = "rows in an intermediate state > 10 min are noticed"
    crit = "stuck rows nobody followed up = 0"
    fix = "record a state per call (started/finished) and alert on old started rows"
    if not cr.pending:
        out.append(_na("stuck", item, crit, "schema", fix, "needs a record when a call starts, not only when it ends"))
    else:
        unnoticed = a.stuck_rows - a.stuck_noticed
        out.append(
            Row("stuck", item, a.stuck_rows, a.writes, crit, "pass" if unnoticed == 0 else "fail", "schema", fix,
                {"noticed": a.stuck_noticed, "unnoticed": unnoticed, "pending": a.pending})
        )  # fmt: skip
    # 4. keys stable across retries of the same logical call
    item, crit = "keys stable across retries", "retries keeping the key = retries carrying one"
    fix = "make the key once per logical call and reuse it on every attempt"
    if not cr.keys:
        out.append(_na("stable", item, crit, "code", fix, "needs the key sent with each call"))
    else:
        r = _ratio("stable", item, a.retries_same_key, a.retries_keyed, crit,
                   a.retries_same_key == a.retries_keyed, "code", fix, retries=a.retries)  # fmt: skip
        out.append(r)
    # 5. keys derived from a stable rule
    item, crit = "keys derived from a stable rule", "keys with no time in them and never replaced on a retry = all"
    fix = "derive the key from the business identity (e.g. refund:<order>), never from a clock or a fresh UUID"
    if not cr.keys:
        out.append(_na("derived", item, crit, "code", fix, "needs the key sent with each call"))
    else:
        out.append(_ratio("derived", item, a.keys_stable, a.keyed, crit, a.keys_stable == a.keyed, "code", fix,
                          with_time=a.keyed_with_time, replaced_on_retry=len(a.key_changed)))  # fmt: skip
    # 6. the call->record window
    item, crit = "call->record window", "writes whose outcome the caller never learned = 0"
    fix = "record the outcome where the call returns; reconcile the rest by key"
    if not cr.ends:
        out.append(_na("window", item, crit, "code", fix, "needs the start and end time of each call"))
    else:
        w = a.windows
        out.append(_ratio("window", item, a.unknown, a.writes, crit, a.unknown == 0, "code", fix,
                          timed=a.timed, p50_ms=w.quantile(0.5), p99_ms=w.quantile(0.99), max_ms=w.max))  # fmt: skip
    # 7. the retry rhythm
    item = "retry rhythm"
    crit = "retries sent before the destination shows a result (its p99 success time) = 0"
    fix = "wait at least the destination's p99 before retrying, or look the key up first"
    if not cr.ends:
        out.append(_na("rhythm", item, crit, "code", fix, "needs the start and end time of each call"))
    else:
        allq = _Samples()
        for d in a.delays.values():
            for v in d.values:
                allq.add(v)
        out.append(_ratio("rhythm", item, a.early, a.retries, crit, a.early == 0, "code", fix,
                          delay_p50_ms=allq.quantile(0.5), settle_ms=dict(a.settle_ms)))  # fmt: skip
    # 8. likely semantic duplicates
    item = "likely semantic duplicates"
    crit = f"same tool and business arguments, both succeeded within {a.window_ms // 1000}s = 0"
    fix = "key each write on its business identity so a repeat is answered from the record"
    if not cr.args:
        out.append(_na("duplicates", item, crit, "code", fix, "needs the call's arguments (or its URL path)"))
    else:
        out.append(_ratio("duplicates", item, a.duplicates, a.ok_writes, crit, a.duplicates == 0, "code", fix))
    return sorted(out, key=lambda r: r.needs != "schema")  # stable: the order above within each group


@dataclass(frozen=True)
class Costs:
    """The inputs of the arithmetic (the CLI's flags, with these defaults)."""

    minutes_per_duplicate: float = 30.0
    cost_per_duplicate: float = 50.0
    hourly_cost: float = 100.0
    fix_hours: float = 80.0


def arithmetic(a: Assessor, costs: Costs) -> dict[str, Any]:
    """Writes per month, the share landing in the window, cost per duplicate, the monthly cost and
    the verdict "a year of duplicates against ten times the work", with every input shown."""
    days = a.span_days
    scale = 30.0 / days if days else None
    writes_month = a.writes * scale if scale else None
    share = a.unknown / a.writes if a.writes else 0.0
    dup_month = (a.unknown + a.duplicates) * scale if scale else None
    per_dup = costs.cost_per_duplicate + costs.minutes_per_duplicate / 60 * costs.hourly_cost
    month = dup_month * per_dup if dup_month is not None else None
    year = month * 12 if month is not None else None
    work = costs.fix_hours * costs.hourly_cost
    if year is None:
        verdict = "not measurable from this log: needs call times spanning more than an instant"
    elif year >= 10 * work:
        verdict = f"fix it: a year of duplicates ({year:,.0f}) is more than ten times the work ({10 * work:,.0f})"
    else:
        verdict = f"not yet: a year of duplicates ({year:,.0f}) is less than ten times the work ({10 * work:,.0f})"
    return {
        "log_days": days,
        "writes": a.writes,
        "writes_per_month": writes_month,
        "in_window": a.unknown,
        "share_in_window": share,
        "semantic_duplicates": a.duplicates,
        "duplicates_per_month": dup_month,
        "minutes_per_duplicate": costs.minutes_per_duplicate,
        "cost_per_duplicate": costs.cost_per_duplicate,
        "hourly_cost": costs.hourly_cost,
        "cost_each": per_dup,
        "monthly_cost": month,
        "yearly_cost": year,
        "fix_hours": costs.fix_hours,
        "work_cost": work,
        "verdict": verdict,
    }

"""Where the console reads and writes: an embedded ledger file or the Kafka topics, through the same
views, audit and decision functions as the command line. Every method blocks (SQLite, Kafka
consumers): the web app calls them in a thread.

Sizes are bounded: the effects table lists at most ``MAX_ROWS`` rows (the counts are always whole),
the chart has ``BUCKETS`` columns."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from effect_ledger.console.query import Query
from effect_ledger.core.model import DecisionKind, State
from effect_ledger.ops import views
from effect_ledger.ops.audit import AuditReport
from effect_ledger.ops.audit import audit as run_audit
from effect_ledger.ops.sources import SourceError, db_events, latest_states, replay_events
from effect_ledger.streams.config import KafkaConfig

MAX_ROWS = 500
BUCKETS = 24


@dataclass
class EffectsPage:
    rows: list[views.Row]  # the newest first, at most MAX_ROWS
    matched: int  # rows matching every filter
    by_state: Counter[str] = field(default_factory=Counter)  # the window, whatever the filters
    by_target: Counter[str] = field(default_factory=Counter)


@dataclass
class Chart:
    """Effects begun in each of ``BUCKETS`` equal slices of the window, per current state."""

    from_ms: int
    to_ms: int
    buckets: list[Counter[str]]


class Source:
    """``db``: an embedded ledger file; else ``cfg``: the Kafka topics."""

    def __init__(self, *, db: str | None = None, cfg: KafkaConfig | None = None) -> None:
        if (db is None) == (cfg is None):
            raise ValueError("a console reads a ledger file or Kafka, one of them")
        self.db, self.cfg = db, cfg

    def check(self, broker_timeout: float) -> None:
        """Fail now, before the console serves, on what every page would fail on: a file that is
        not a ledger (or is damaged where every page reads), or a broker that does not answer."""
        if self.db is not None:
            with views.ledger_file(self.db) as reader:
                reader.check()
            return
        from effect_ledger.streams.admin import wait_ready

        assert self.cfg is not None
        wait_ready(self.cfg, timeout=broker_timeout)

    @property
    def name(self) -> str:
        return f"ledger file {self.db}" if self.db is not None else f"Kafka {self.cfg.bootstrap}"  # type: ignore[union-attr]

    def _window(self, q: Query) -> Iterable[views.Row]:
        """Every effect begun inside the window (``created_ms`` in [from, to))."""
        if self.db is not None:
            with views.ledger_file(self.db) as reader:
                found = reader.created_between(q.from_ms, q.to_ms)
            return [views.row_of_sql(r) for r in found]
        assert self.cfg is not None
        states = [s for s in latest_states(self.cfg).values() if q.from_ms <= s.created_ms < q.to_ms]
        return [views.row_of_state(s) for s in sorted(states, key=lambda s: -s.created_ms)]

    def effects(self, q: Query) -> tuple[EffectsPage, Chart]:
        """The effects of a window with the state and target filters, the counts, and the chart."""
        page = EffectsPage([], 0)
        chart = Chart(q.from_ms, q.to_ms, [Counter() for _ in range(BUCKETS)])
        span = q.to_ms - q.from_ms
        for r in self._window(q):
            page.by_state[r.state] += 1
            page.by_target[r.target] += 1
            chart.buckets[min(BUCKETS - 1, (r.created_ms - q.from_ms) * BUCKETS // span)][r.state] += 1
            if (q.states and r.state not in q.states) or (q.targets and r.target not in q.targets):
                continue
            page.matched += 1
            if len(page.rows) < MAX_ROWS:
                page.rows.append(r)
        return page, chart

    def stuck(self, older_than_ms: int) -> list[views.Row]:
        return views.stuck(older_than_ms, db=self.db, cfg=self.cfg)

    def escalations(self) -> list[views.Escalation]:
        return views.escalations(db=self.db, cfg=self.cfg)

    def trace(self, key: str) -> views.Trace:
        t = views.trace(key, db=self.db, cfg=self.cfg)
        if t.effect is None:
            raise SourceError(f"no effect with key {key!r}")
        return t

    def audit(self, q: Query, now_ms: int) -> AuditReport:
        if self.db is not None:
            records = db_events(self.db, q.from_ms, q.to_ms, build=False)
        else:
            assert self.cfg is not None
            records = replay_events(self.cfg, q.from_ms, None, q.to_ms, build=False)
        return run_audit(records, q.from_ms, q.to_ms, now_ms, q.stuck_ms)

    def decide(self, key: str, kind: DecisionKind, by: str, reason: str, receipt_id: str | None) -> str:
        """Record a person's decision with the command line's own function (``Ledger.decide``, or
        ``views.decide`` on Kafka): the same rules, ``DecisionRefused`` included. Returns a line
        saying what was recorded."""
        if self.cfg is not None:
            from effect_ledger.targets.load import resolve

            # The declaration in EFFECTS_TARGETS (as Ledger.open reads it for a file): its lands_within.
            declared = {t.name: t for t in resolve(None)}
            d = views.decide(key, kind, by, reason, receipt_id, cfg=self.cfg, targets=declared)
            return f"decision {kind.value} (attempt {d.attempt}) written to {self.cfg.topics.decisions} by {by}"
        from effect_ledger.sdk.ledger import Ledger

        db = self.db
        assert db is not None
        views.read_only(db).close()  # a missing file or one that is not a ledger: refused, not written

        async def go() -> State:
            async with await Ledger.open(db) as ledger:
                if await ledger.get(key) is None:
                    raise SourceError(f"no effect with key {key!r} in {db}")
                return (await ledger.decide(key, kind, by=by, reason=reason, receipt_id=receipt_id)).state

        state = asyncio.run(go())
        return f"decision {kind.value} recorded by {by}; state {state.value}"

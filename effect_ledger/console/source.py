"""Where the console reads and writes: an embedded ledger file or the Kafka topics, through the same
views, audit and decision functions as the command line. Every method blocks (SQLite, Kafka
consumers): the web app calls them in a thread.

Sizes are bounded: the effects table lists at most ``MAX_ROWS`` rows (the counts are always whole),
the chart has ``BUCKETS`` columns, an effect's page lists at most ``MAX_SIBLINGS`` other effects of
its run.

A search (``Query.search``) is matched here, in Python, over the effects of the window: its values
never become SQL text. A request field is searched in the request as recorded (the intents of the
window's effects), and only on the targets that declare that field ``searchable``."""

from __future__ import annotations

import asyncio
import json
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from effect_ledger.console.query import Query, Searchable, Term
from effect_ledger.core.bodies import field_values
from effect_ledger.core.model import DecisionKind, Intent, State
from effect_ledger.core.reconcile import Target
from effect_ledger.ops import views
from effect_ledger.ops.audit import AuditReport
from effect_ledger.ops.audit import audit as run_audit
from effect_ledger.ops.sources import SourceError, db_events, latest_states, replay_events
from effect_ledger.sdk.erasure import is_sealed
from effect_ledger.streams.codec import default_codec
from effect_ledger.streams.config import KafkaConfig

MAX_ROWS = 500
BUCKETS = 24
MAX_SIBLINGS = 100

Requests = dict[str, list[Any]]  # effect id -> its recorded requests (one per intent), decoded


def recorded_request(text: str) -> Any:
    """A recorded request as JSON, or None when it cannot be searched (sealed, not JSON)."""
    if is_sealed(text):
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None


def matches(row: views.Row, term: Term, requests: Requests, searchable: Searchable) -> bool:
    """Whether one effect matches one search term (see ``Term``)."""
    v = term.value
    if term.name == "key":
        return row.effect_id.startswith(v)
    if term.name == "run":
        return row.run_id == v
    if term.name == "step":
        return row.step == v
    if term.name == "target":
        return row.target == v
    if term.name == "operation":
        return row.operation == v
    paths = searchable.fields.get(row.target, ())
    if term.name == "field":
        paths = tuple(p for p in paths if p == term.path)
    elif row.effect_id.startswith(v) or row.run_id == v or row.step == v:
        return True
    return any(v in field_values(req, p) for p in paths for req in requests.get(row.effect_id, ()))


@dataclass
class EffectView:
    """What an effect's page shows: its trace (every fact folded) and the other effects of its run."""

    trace: views.Trace
    siblings: list[views.Row]  # the other effects of the same run, oldest first, at most MAX_SIBLINGS
    more_siblings: bool


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

    def __init__(
        self, *, db: str | None = None, cfg: KafkaConfig | None = None, targets: Iterable[Target] = ()
    ) -> None:
        if (db is None) == (cfg is None):
            raise ValueError("a console reads a ledger file or Kafka, one of them")
        self.db, self.cfg = db, cfg
        self.targets = tuple(targets)
        self.searchable = Searchable({t.name: tuple(t.searchable) for t in targets if t.searchable})

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

    def _requests(self, q: Query) -> Requests:
        """The recorded requests of the window's effects, decoded, when the search needs them (a
        field term, or a bare value while some target declares searchable fields)."""
        out: Requests = defaultdict(list)
        needed = any(t.name == "field" or (t.name == "any" and self.searchable.fields) for t in q.search)
        if not needed:
            return out
        if self.db is not None:
            codec = default_codec()
            with views.ledger_file(self.db) as reader:
                found = reader.intents_created_between(q.from_ms, q.to_ms)
            intents: Iterable[Any] = (codec.decode(r["body"]) for r in found)
        else:
            assert self.cfg is not None
            intents = (r.event for r in replay_events(self.cfg, q.from_ms))
        for e in intents:
            if isinstance(e, Intent) and e.target in self.searchable.fields:
                req = recorded_request(e.request)
                if req is not None:
                    out[e.effect_id].append(req)
        return out

    def effects(self, q: Query) -> tuple[EffectsPage, Chart]:
        """The effects of a window with the state, target and search filters, the counts, and the
        chart. The counts and the chart are the window's; ``matched`` and the rows, the filtered."""
        page = EffectsPage([], 0)
        chart = Chart(q.from_ms, q.to_ms, [Counter() for _ in range(BUCKETS)])
        span = q.to_ms - q.from_ms
        requests = self._requests(q)
        for r in self._window(q):
            page.by_state[r.state] += 1
            page.by_target[r.target] += 1
            chart.buckets[min(BUCKETS - 1, (r.created_ms - q.from_ms) * BUCKETS // span)][r.state] += 1
            if (q.states and r.state not in q.states) or (q.targets and r.target not in q.targets):
                continue
            if not all(matches(r, t, requests, self.searchable) for t in q.search):
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

    def effect(self, key: str) -> EffectView:
        """One effect's page: its trace and the other effects of its run (same namespace)."""
        t = self.trace(key)
        e = t.effect
        assert e is not None  # trace() refuses a key without events
        intent = e.first_intent or e.intent
        if intent is None:  # a receipt or an answer arrived before any intent: no run to show
            return EffectView(t, [], False)
        if self.db is not None:
            with views.ledger_file(self.db) as reader:
                found = reader.same_run(intent.namespace, intent.run_id, MAX_SIBLINGS + 2)
            rows = [views.row_of_sql(r) for r in found]
        else:
            assert self.cfg is not None
            states = [
                s
                for s in latest_states(self.cfg).values()
                if s.run_id == intent.run_id and s.namespace == intent.namespace
            ]
            rows = [views.row_of_state(s) for s in sorted(states, key=lambda s: s.created_ms)]
        others = [r for r in rows if r.effect_id != key]
        return EffectView(t, others[:MAX_SIBLINGS], len(others) > MAX_SIBLINGS)

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

            # The console's --targets, else EFFECTS_TARGETS (as Ledger.open reads it): its lands_within.
            declared = {t.name: t for t in (self.targets or resolve(None))}
            d = views.decide(key, kind, by, reason, receipt_id, cfg=self.cfg, targets=declared)
            return f"decision {kind.value} (attempt {d.attempt}) written to {self.cfg.topics.decisions} by {by}"
        from effect_ledger.sdk.ledger import Ledger

        db = self.db
        assert db is not None
        views.read_only(db).close()  # a missing file or one that is not a ledger: refused, not written

        async def go() -> State:
            async with await Ledger.open(db, targets=self.targets or None) as ledger:
                if await ledger.get(key) is None:
                    raise SourceError(f"no effect with key {key!r} in {db}")
                return (await ledger.decide(key, kind, by=by, reason=reason, receipt_id=receipt_id)).state

        state = asyncio.run(go())
        return f"decision {kind.value} recorded by {by}; state {state.value}"

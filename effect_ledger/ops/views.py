"""Read models for operators: stuck effects, escalations, one effect's timeline, decisions.

Each reads an embedded ledger file (``db=``, base install) or the Kafka topics (``cfg=``, the
``[kafka]`` extra, imported only on that path)."""

from __future__ import annotations

import sqlite3
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from effect_ledger.core.effect import Effect, apply, decision_refusal, fold
from effect_ledger.core.model import (
    UNSETTLED_STATES,
    Claimed,
    Decision,
    DecisionKind,
    EffectState,
    Event,
    Executed,
    Intent,
    Receipt,
    Resolution,
    State,
    Timeout,
)
from effect_ledger.core.reconcile import Target, target_for, target_name
from effect_ledger.errors import DecisionRefused, StorageError
from effect_ledger.ops.sources import SourceError, db_events, key_events, latest_states, replay_events
from effect_ledger.sdk.store.reader import LedgerReader
from effect_ledger.streams.config import KafkaConfig, operator_identity
from effect_ledger.streams.schema_topic import kafka_codec

INTERMEDIATE = UNSETTLED_STATES  # open, or escalated to a person


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def read_only(path: str | Path) -> LedgerReader:
    """A read-only reader of a ledger file; a missing file or one that is not a ledger is a
    ``SourceError`` naming it."""
    try:
        return LedgerReader.open(path)
    except StorageError as e:
        raise SourceError(str(e)) from None


@contextmanager
def ledger_file(path: str | Path) -> Iterator[LedgerReader]:
    """A read-only reader of a ledger file, closed afterwards; a damaged file (a corrupt page
    met by a query) is a ``SourceError`` naming it."""
    reader = read_only(path)
    try:
        yield reader
    except StorageError as e:
        raise SourceError(str(e)) from None
    finally:
        reader.close()


@dataclass(frozen=True)
class Row:
    effect_id: str
    state: str
    target: str
    operation: str
    attempt: int
    created_ms: int
    updated_ms: int
    reason: str | None


def row_of_sql(r: sqlite3.Row) -> Row:
    return Row(*(r[f] for f in Row.__dataclass_fields__))


def row_of_state(s: EffectState) -> Row:
    return Row(s.effect_id, s.state.value, s.target, s.operation, s.attempt, s.created_ms, s.updated_ms, s.reason)


def stuck(
    older_than_ms: int, *, db: str | None = None, cfg: KafkaConfig | None = None, now: int | None = None
) -> list[Row]:
    """Effects in an intermediate state (PENDING, EXECUTED, UNCERTAIN, ESCALATED) that began
    more than ``older_than_ms`` ago, oldest first."""
    cutoff = (now or now_ms()) - older_than_ms
    if db is not None:
        with ledger_file(db) as reader:
            rows = reader.unsettled(cutoff)
        return [row_of_sql(r) for r in rows]
    assert cfg is not None
    found = [s for s in latest_states(cfg).values() if s.state in INTERMEDIATE and s.created_ms < cutoff]
    return [row_of_state(s) for s in sorted(found, key=lambda s: s.created_ms)]


@dataclass
class Escalation:
    row: Row
    attempts: int
    answers: list[str] = field(default_factory=list)  # "reconciler: VERDICT (reason)"


def escalations(*, db: str | None = None, cfg: KafkaConfig | None = None) -> list[Escalation]:
    """ESCALATED effects with their evidence: attempts and every reconciler answer."""
    if db is not None:
        with ledger_file(db) as reader:
            rows = reader.in_state(State.ESCALATED)
        base = {r["effect_id"]: row_of_sql(r) for r in rows}
        records: Iterable[Event] = (r.event for r in db_events(db) if r.event and r.event.effect_id in base)
    else:
        assert cfg is not None
        base = {k: row_of_state(s) for k, s in latest_states(cfg).items() if s.state is State.ESCALATED}
        records = (r.event for r in replay_events(cfg, None) if r.event and r.event.effect_id in base) if base else ()
    out = {k: Escalation(row, row.attempt) for k, row in base.items()}
    for e in records:
        if isinstance(e, Resolution):
            out[e.effect_id].answers.append(f"{e.reconciler}: {e.verdict.value} ({e.reason})")
    return list(out.values())


def history(
    key: str, *, db: str | None = None, cfg: KafkaConfig | None = None, since_ms: int | None = None
) -> list[Event]:
    """Every event of one key. Kafka: read from where the key's records begin (``key_events``), or
    from ``since_ms``."""
    if db is not None:
        events = [r.event for r in db_events(db) if r.event is not None and r.event.effect_id == key]
    else:
        assert cfg is not None
        events = list(key_events(cfg, key, since_ms=since_ms))
    return events


def describe(e: Event) -> tuple[str, str]:
    """(what happened, who said so) for one event."""
    if isinstance(e, Intent):
        return (
            f"intent attempt {e.attempt} {e.operation} (deadline +{(e.deadline_ms - e.at_ms) / 1000:g} s"
            f"{'' if e.keyed else ', key NOT sent'})"
        ), e.worker
    if isinstance(e, Executed):
        took = e.call_ended_ms - e.call_started_ms
        return f"executed {e.outcome.value} (call {took} ms){': ' + e.error if e.error else ''}", e.worker
    if isinstance(e, Receipt):
        return f"receipt {e.receipt_id}", e.source.value.lower()
    if isinstance(e, Timeout):
        return f"{e.phase.value.lower()} deadline passed", "processor"
    if isinstance(e, Claimed):
        return f"attempt {e.attempt} claimed by intent {e.intent_id} ({e.worker}): later intents lost", "processor"
    if isinstance(e, Resolution):
        return (
            f"{e.verdict.value}{' ' + e.receipt_id if e.receipt_id else ''}: {e.reason} (try {e.tries})",
            e.reconciler,
        )
    if isinstance(e, Decision):
        who = f"person:{e.by}" + (f" ({e.principal})" if e.principal else "")
        return f"decision {e.decision.value}: {e.reason}", who
    return type(e).__name__, "-"


@dataclass
class TraceLine:
    at_ms: int
    event: str
    source: str
    state_after: str


@dataclass
class Trace:
    key: str
    lines: list[TraceLine]
    effect: Effect | None
    sent_unrecorded_ms: list[int]  # per execution: call end -> durable record
    intermediate_ms: int | None  # first intent -> settled (or now)


def trace(key: str, *, db: str | None = None, cfg: KafkaConfig | None = None, since_ms: int | None = None) -> Trace:
    # By time, then in the order recorded (a stable sort): event ids are random within a millisecond.
    events = sorted(history(key, db=db, cfg=cfg, since_ms=since_ms), key=lambda e: e.at_ms)
    lines: list[TraceLine] = []
    effect: Effect | None = None
    settled_at: int | None = None
    for e in events:
        before = effect
        effect, _ = apply(effect, e)
        if effect is before:
            continue  # a duplicate delivery
        what, who = describe(e)
        lines.append(TraceLine(e.at_ms, what, who, effect.state.value))
        if settled_at is None and effect.state not in INTERMEDIATE:
            settled_at = e.at_ms
    windows = [max(0, e.at_ms - e.call_ended_ms) for e in (effect.facts if effect else ()) if isinstance(e, Executed)]
    first = effect.first_intent.at_ms if effect and effect.first_intent else None
    inter = None if first is None else ((settled_at or now_ms()) - first)
    return Trace(key, lines, effect, windows, inter)


def decide(
    key: str,
    decision: DecisionKind,
    by: str,
    reason: str,
    receipt_id: str | None,
    *,
    cfg: KafkaConfig,
    targets: Mapping[str, Target] | None = None,
) -> Decision:
    """Kafka mode: write a person's decision to ``effects.decisions`` (embedded mode uses
    ``Ledger.decide``), the topic Kafka ACLs can keep to operators. Refuses a key nobody has
    written, and (``DecisionRefused``) a decision that could cause a second execution: ABSENT
    while the attempt may still land (``effect_ledger.core.effect.decision_refusal``), judged on
    every event and decision Kafka holds for the key."""
    from confluent_kafka import Producer

    from effect_ledger.sdk.kafka.relay import producer_config

    effect = fold(list(key_events(cfg, key)))
    if effect is None:
        raise SourceError(f"no effect with key {key!r} on {cfg.topics.events}")
    now = now_ms()
    # How long a cut-off call may still land: the declared target's lands_within, else the default.
    grace = target_for(targets or {}, target_name(effect))[0].lands_within_ms
    refused = decision_refusal(effect, decision, now, grace)
    if refused is not None:
        raise DecisionRefused(key, refused.reason, refused.retry_after_ms)
    d = Decision(uuid.uuid4().hex, key, now, effect.attempt, decision, by, reason, receipt_id, operator_identity(cfg))
    codec = kafka_codec(cfg, writes=True)  # publishes its schemas first
    p = Producer(producer_config(cfg, **{"message.timeout.ms": 30_000}))
    errors: list[str] = []
    p.produce(
        cfg.topics.decisions,
        key=key.encode(),
        value=codec.encode(d),
        headers=[codec.header(d)],
        on_delivery=lambda err, _m: errors.append(str(err)) if err else None,
    )
    if p.flush(30) or errors:
        raise SourceError(
            f"the decision was not acknowledged by Kafka on {cfg.topics.decisions}: {'; '.join(errors) or 'timeout'}"
        )
    return d

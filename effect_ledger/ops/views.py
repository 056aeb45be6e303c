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
from typing import Any

from effect_ledger import schemas
from effect_ledger.core.effect import Effect, apply, decision_refusal
from effect_ledger.core.model import (
    UNSETTLED_STATES,
    Claimed,
    Decision,
    DecisionKind,
    EffectState,
    Event,
    Executed,
    Flag,
    Intent,
    Receipt,
    Resolution,
    State,
    Timeout,
)
from effect_ledger.core.reconcile import Target, target_for, target_name
from effect_ledger.core.timeparse import iso
from effect_ledger.errors import DecisionRefused, StorageError
from effect_ledger.ops.sources import SourceError, db_events, key_records, latest_states, replay_events
from effect_ledger.sdk.store.reader import LedgerReader
from effect_ledger.streams.config import KafkaConfig, operator_identity
from effect_ledger.streams.log_clock import log_time_of
from effect_ledger.streams.schema_topic import broker_now, kafka_codec

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
    run_id: str = ""
    step: str = ""


def row_of_sql(r: sqlite3.Row) -> Row:
    return Row(*(r[f] for f in Row.__dataclass_fields__))


def row_of_state(s: EffectState) -> Row:
    return Row(
        s.effect_id, s.state.value, s.target, s.operation, s.attempt, s.created_ms, s.updated_ms, s.reason,
        s.run_id, s.step,
    )  # fmt: skip


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
) -> list[tuple[Event, int | None]]:
    """Every event of one key with the time its log took it (None: the writer's clock is the log's,
    as in a ledger file). Kafka: read from where the key's records begin (``key_records``), or from
    ``since_ms``."""
    if db is not None:
        return [(r.event, None) for r in db_events(db) if r.event is not None and r.event.effect_id == key]
    assert cfg is not None
    return list(key_records(cfg, key, since_ms=since_ms))


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
    at_ms: int  # when the log took it (the writer's claim where its clock is the log's)
    event: str
    source: str
    state_after: str
    claimed_ms: int  # what its writer's clock said (data, not authority)

    @property
    def skew_ms(self) -> int:
        """The writer's clock against the log's: positive, the writer's runs ahead (or the record
        reached the log late, for a negative value)."""
        return self.claimed_ms - self.at_ms


@dataclass
class Trace:
    key: str
    lines: list[TraceLine]
    effect: Effect | None
    sent_unrecorded_ms: list[int]  # per execution: call end -> durable record
    intermediate_ms: int | None  # first intent -> settled (or now)


def trace(key: str, *, db: str | None = None, cfg: KafkaConfig | None = None, since_ms: int | None = None) -> Trace:
    # By the log's time, then in the order recorded (a stable sort): never by a writer's clock, which
    # can be hours off. A ledger file's events carry the file's one clock.
    events = sorted(history(key, db=db, cfg=cfg, since_ms=since_ms), key=lambda r: r[0].at_ms if r[1] is None else r[1])
    lines: list[TraceLine] = []
    effect: Effect | None = None
    settled_at: int | None = None
    for e, log_ms in events:
        before = effect
        effect, _ = apply(effect, e, log_ms)
        if effect is before:
            continue  # a duplicate delivery, or a timeout the log took before its deadline
        what, who = describe(e)
        at = e.at_ms if log_ms is None else log_ms
        lines.append(TraceLine(at, what, who, effect.state.value, e.at_ms))
        if settled_at is None and effect.state not in INTERMEDIATE:
            settled_at = at
    windows = [
        max(0, e.at_ms - e.call_ended_ms) for e in (effect.facts if effect else ()) if isinstance(e, Executed)
    ]  # one writer's clock at both ends: its offset cancels
    first = effect.log_time(effect.first_intent) if effect and effect.first_intent else None
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
    from effect_ledger.streams import rights

    # Who may decide is whoever Kafka's ACLs allow to write effects.decisions: one line naming
    # the missing right, before anything is read or written.
    rights.require(cfg, "decide", "effects resolve")
    effect: Effect | None = None
    logged_times = False
    for e, log_ms in key_records(cfg, key):
        effect, _ = apply(effect, e, log_ms)
        logged_times = logged_times or log_ms is not None
    if effect is None:
        raise SourceError(f"no effect with key {key!r} on {cfg.topics.events}")
    now = now_ms()  # what the decision claims
    # How long a cut-off call may still land: the declared target's lands_within, else the default.
    grace = target_for(targets or {}, target_name(effect))[0].lands_within_ms
    # On topics the broker stamps, this host's clock is a claim: the check runs on the broker's time
    # (asked of it), and the time the log takes the decision decides below all the same.
    log_now = broker_now(cfg, schemas.load("Decision")) if logged_times else now
    refused = decision_refusal(effect, decision, log_now, grace)
    if refused is not None:
        raise DecisionRefused(key, refused.reason, refused.retry_after_ms)
    # It claims the time it was checked at: the broker's, asked of it (this host's clock is a claim
    # the fold trusts only when it says earlier).
    claimed = log_now if log_now is not None else now
    d = Decision(
        uuid.uuid4().hex, key, claimed, effect.attempt, decision, by, reason, receipt_id, operator_identity(cfg)
    )
    codec = kafka_codec(cfg, writes=True)  # publishes its schemas first
    p = Producer(producer_config(cfg, **{"message.timeout.ms": 30_000}))
    errors: list[str] = []
    logged: list[int | None] = []

    def report(err: Any, msg: Any) -> None:
        if err:
            errors.append(str(err))
        else:
            logged.append(log_time_of(*msg.timestamp()))

    p.produce(
        cfg.topics.decisions, key=key.encode(), value=codec.encode(d), headers=[codec.header(d)], on_delivery=report
    )
    if p.flush(30) or errors:
        raise SourceError(
            f"the decision was not acknowledged by Kafka on {cfg.topics.decisions}: {'; '.join(errors) or 'timeout'}"
        )
    # The log's time decides: a decision the log took while the call could still land is kept, and
    # changes nothing (this host's clock may be ahead). Say so now rather than let it look taken.
    if logged and logged[0] is not None and d.decision is DecisionKind.ABSENT:
        after, _ = apply(effect, d, logged[0])
        if after.state is not State.ABSENT:
            if Flag.CLOCK_SKEW in after.flags and Flag.CLOCK_SKEW not in effect.flags:
                why = f"the decision claims {iso(d.at_ms)}, ahead of the log's {iso(logged[0])}: set this host's clock"
            else:
                why = f"the log took it at {iso(logged[0])}, while attempt {effect.attempt} could still land"
            late = decision_refusal(effect, decision, logged[0], grace)
            raise DecisionRefused(
                key, f"{why}: it is recorded and changes nothing; decide again later",
                late.retry_after_ms if late is not None else None,
            )  # fmt: skip
    return d

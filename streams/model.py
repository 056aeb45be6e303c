"""The event model: one frozen dataclass per Avro record in ``schemas/``.

Status names are defined here once (``State``, ``Outcome``, ...); the Avro enums must list the same
symbols, which ``tests/unit/test_codec.py`` checks. Pure data: no I/O imports.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import TypeGuard


class State(StrEnum):
    """Where an effect stands (DESIGN.md, "States"). Open: PENDING, EXECUTED, UNCERTAIN; settled:
    CONFIRMED, FAILED, ABSENT; waiting for a person: ESCALATED; closed by one: ABANDONED,
    COMPENSATED."""

    PENDING = "PENDING"
    EXECUTED = "EXECUTED"
    CONFIRMED = "CONFIRMED"
    FAILED = "FAILED"
    UNCERTAIN = "UNCERTAIN"
    ABSENT = "ABSENT"
    ESCALATED = "ESCALATED"
    ABANDONED = "ABANDONED"
    COMPENSATED = "COMPENSATED"


#: States in which an attempt is open: the outcome is not known yet.
OPEN_STATES = frozenset({State.PENDING, State.EXECUTED, State.UNCERTAIN})
#: States after which the same key may be executed (again): nothing happened at the destination.
RETRYABLE_STATES = frozenset({State.FAILED, State.ABSENT})
#: States that need a person or a reconciler; an agent must not act on them.
HELD_STATES = frozenset({State.ESCALATED})
#: Closed for good.
FINAL_STATES = frozenset({State.CONFIRMED, State.ABANDONED, State.COMPENSATED})


class Outcome(StrEnum):
    OK = "OK"
    FAILED = "FAILED"
    UNKNOWN = "UNKNOWN"


class ReceiptSource(StrEnum):
    """Who delivered an effect's receipt: the call's own return, a webhook, a reconciler, or a
    person (``effects resolve --confirmed``)."""

    CALL = "CALL"
    WEBHOOK = "WEBHOOK"
    RECONCILER = "RECONCILER"
    PERSON = "PERSON"


class Verdict(StrEnum):
    FOUND = "FOUND"
    ABSENT = "ABSENT"
    UNKNOWN = "UNKNOWN"
    ESCALATE = "ESCALATE"


class DecisionKind(StrEnum):
    """A person's decision on an effect (``Ledger.decide``, ``effects resolve``): it happened
    (CONFIRMED, with a receipt id), it never happened (ABSENT: the agent may execute it), close it
    (ABANDONED), or it was undone (COMPENSATED)."""

    CONFIRMED = "CONFIRMED"
    ABSENT = "ABSENT"
    ABANDONED = "ABANDONED"
    COMPENSATED = "COMPENSATED"


class TimeoutPhase(StrEnum):
    CALL = "CALL"
    RECEIPT = "RECEIPT"


class Flag(StrEnum):
    DUPLICATE_EXECUTION = "DUPLICATE_EXECUTION"  # two successful executions of one key
    DUPLICATE_RECEIPT = "DUPLICATE_RECEIPT"  # two distinct receipt ids for one key
    CONFLICT = "CONFLICT"  # the same key with a different request digest
    NO_INTENT = "NO_INTENT"  # events seen, but no intent (yet)
    DECISION_IGNORED = "DECISION_IGNORED"  # an ABSENT decision made while the attempt could still land
    INEXACT_RECEIPT = "INEXACT_RECEIPT"  # a receipt value recorded as a representation (see limits.py)
    LOST_CLAIM = "LOST_CLAIM"  # an intent of an attempt another intent claimed first (never called)


#: The reserved key of a receipt value the ledger could not record exactly (not JSON, or too
#: large): ``{"effect_ledger.inexact": {"reason": ..., "type": ..., "repr" | "sha256", ...}}``.
INEXACT = "effect_ledger.inexact"
INEXACT_PREFIX = '{"' + INEXACT + '":'  # how such a value's JSON text starts


@dataclass(frozen=True, slots=True)
class Intent:
    event_id: str
    effect_id: str
    at_ms: int
    attempt: int
    target: str
    operation: str
    namespace: str
    run_id: str
    step: str
    request: str
    request_digest: str
    deadline_ms: int
    worker: str
    keyed: bool = True


@dataclass(frozen=True, slots=True)
class Executed:
    event_id: str
    effect_id: str
    at_ms: int
    attempt: int
    outcome: Outcome
    error: str | None
    call_started_ms: int
    call_ended_ms: int
    receipt_deadline_ms: int | None
    worker: str


@dataclass(frozen=True, slots=True)
class Receipt:
    event_id: str
    effect_id: str
    at_ms: int
    attempt: int
    receipt_id: str
    source: ReceiptSource
    value: str


@dataclass(frozen=True, slots=True)
class Resolution:
    event_id: str
    effect_id: str
    at_ms: int
    attempt: int
    verdict: Verdict
    reconciler: str
    reason: str = ""
    receipt_id: str | None = None
    value: str | None = None
    tries: int = 1


@dataclass(frozen=True, slots=True)
class Decision:
    event_id: str
    effect_id: str
    at_ms: int
    attempt: int
    decision: DecisionKind
    by: str
    reason: str
    receipt_id: str | None = None
    principal: str = ""  # who wrote it: the Kafka principal (SASL) or the OS user, beside the stated ``by``


@dataclass(frozen=True, slots=True)
class Timeout:
    event_id: str
    effect_id: str
    at_ms: int
    attempt: int
    phase: TimeoutPhase
    deadline_ms: int


@dataclass(frozen=True, slots=True)
class Claimed:
    """The processor's verdict on an attempt (Kafka mode): ``intent_id`` is the first intent of
    ``attempt`` in the key's partition, and owns it. Any other intent of that attempt is a lost claim:
    its agent must not call the destination. Written by the processor into its table only, once per
    attempt (``claimed_event_id``), and handed to agents by lookups; never accepted from a topic."""

    event_id: str
    effect_id: str
    at_ms: int
    attempt: int
    intent_id: str
    worker: str


#: Everything the fold accepts as a fact about an effect.
Event = Intent | Executed | Receipt | Resolution | Decision | Timeout | Claimed
EVENT_TYPES: tuple[type, ...] = (Intent, Executed, Receipt, Resolution, Decision, Timeout, Claimed)


def is_event(record: object) -> TypeGuard[Event]:
    """True for the records the fold accepts as facts; False for a state, a work item, a dead letter."""
    return isinstance(record, EVENT_TYPES)


#: What each source topic of the fold may carry. People's decisions have a topic of their own
#: (``effects.decisions``) so that Kafka ACLs can keep it to operators: a Decision on
#: ``effects.events`` could have been written by any agent, and is not folded.
EVENTS_TOPIC_TYPES: tuple[type, ...] = (Intent, Executed, Receipt, Resolution, Timeout)
DECISIONS_TOPIC_TYPES: tuple[type, ...] = (Decision,)


def misplaced(record: object, *, decisions_topic: bool) -> str | None:
    """Why ``record`` must not be folded from the topic it was read from (None: it may).
    ``decisions_topic``: it was read from ``effects.decisions`` rather than ``effects.events``."""
    allowed = DECISIONS_TOPIC_TYPES if decisions_topic else EVENTS_TOPIC_TYPES
    if isinstance(record, allowed):
        return None
    name = type(record).__name__
    if decisions_topic:
        return f"{name} on the decisions topic: only Decision records belong there"
    if isinstance(record, Decision):
        return "Decision on the events topic: decisions are read from the decisions topic only (Kafka ACLs guard it)"
    if isinstance(record, Claimed):
        return "Claimed on the events topic: only the processor gives claim verdicts, in its own table"
    return f"{name} is not an event: only Intent, Executed, Receipt, Resolution and Timeout belong on the events topic"


@dataclass(frozen=True, slots=True)
class EffectState:
    effect_id: str
    state: State
    target: str
    operation: str
    namespace: str
    run_id: str
    step: str
    request_digest: str
    attempt: int
    version: int
    created_ms: int
    updated_ms: int
    deadline_ms: int | None = None
    receipt_id: str | None = None
    executions: int = 0
    receipt_ids: tuple[str, ...] = ()
    flags: tuple[str, ...] = ()
    reason: str | None = None


@dataclass(frozen=True, slots=True)
class UncertainEffect:
    event_id: str
    effect_id: str
    at_ms: int
    attempt: int
    target: str
    operation: str
    request: str
    request_digest: str
    reason: str
    intent_at_ms: int
    deadline_ms: int
    tries: int = 0
    executed: bool = False


@dataclass(frozen=True, slots=True)
class DeadLetter:
    at_ms: int
    consumer: str
    topic: str
    partition: int
    offset: int
    error: str
    key: bytes | None = field(default=None)
    value: bytes | None = field(default=None)


RECORD_TYPES: tuple[type, ...] = (*EVENT_TYPES, EffectState, UncertainEffect, DeadLetter)

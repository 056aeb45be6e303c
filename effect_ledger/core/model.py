"""The event model: one frozen dataclass per Avro record in ``schemas/``.

Status names are defined here once (``State``, ``Outcome``, ...); the Avro enums must list the same
symbols, which ``tests/unit/streams/test_codec.py`` checks. Pure data: no I/O imports.
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
#: Open states whose attempt still waits for its call or receipt: its deadline has yet to fire.
IN_FLIGHT_STATES = frozenset({State.PENDING, State.EXECUTED})
#: Not settled: open, or escalated to a person (what an operator sees as stuck).
UNSETTLED_STATES = OPEN_STATES | {State.ESCALATED}


class Outcome(StrEnum):
    """How one call to the destination ended: OK (accepted), FAILED (definitively rejected, nothing
    happened) or UNKNOWN (a timeout or transport error: it may or may not have happened)."""

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
    """A reconciler's answer: FOUND (it happened), ABSENT (it never happened, a retry is safe),
    UNKNOWN (no answer this time, ask again later) or ESCALATE (nobody can tell: a person decides)."""

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
    """Which deadline a ``Timeout`` records: the call's (no outcome in time) or the receipt's (an OK
    call whose receipt never came)."""

    CALL = "CALL"
    RECEIPT = "RECEIPT"


class Flag(StrEnum):
    """An anomaly the fold found in one key's events, derived again on every fold: each stays while
    its cause is among the facts (NO_INTENT ends when the intent arrives)."""

    DUPLICATE_EXECUTION = "DUPLICATE_EXECUTION"  # two successful executions of one key
    DUPLICATE_RECEIPT = "DUPLICATE_RECEIPT"  # two distinct receipt ids for one key
    CONFLICT = "CONFLICT"  # the same key with a different request digest
    NO_INTENT = "NO_INTENT"  # events seen, but no intent (yet)
    DECISION_IGNORED = "DECISION_IGNORED"  # an ABSENT decision logged while the attempt could still land
    CLOCK_SKEW = "CLOCK_SKEW"  # a writer's clock ran over 5 s ahead of the log's (core.deadlines)
    ANSWER_IGNORED = "ANSWER_IGNORED"  # a reconciler's ABSENT logged while its attempt's call could still land
    INEXACT_RECEIPT = "INEXACT_RECEIPT"  # a receipt value recorded as a representation (see limits.py)
    LOST_CLAIM = "LOST_CLAIM"  # an intent of an attempt another intent claimed first (never called)


#: The reserved key of a receipt value the ledger could not record exactly (not JSON, or too
#: large): ``{"effect_ledger.inexact": {"reason": ..., "type": ..., "repr" | "sha256", ...}}``.
INEXACT = "effect_ledger.inexact"
INEXACT_PREFIX = '{"' + INEXACT + '":'  # how such a value's JSON text starts


@dataclass(frozen=True, slots=True)
class Intent:
    """Records that one attempt is about to call the destination, written durably before the call.
    ``effect_id`` is the idempotency key handed to the destination (``keyed``: whether it was);
    ``request`` is the canonical JSON and ``deadline_ms`` when the call counts as overdue."""

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
    # How long after deadline_ms the call may still take effect at the destination (the target's
    # lands_within): no ABSENT counts before that, on the log's time. None: DECISION_GRACE_MS.
    lands_within_ms: int | None = None


@dataclass(frozen=True, slots=True)
class Executed:
    """Records how one attempt's call ended, written when the call returned or raised; ``error`` says
    what went wrong, when something did. After an OK call without a receipt, ``receipt_deadline_ms``
    (None: the intent's deadline) is when the missing receipt makes the effect uncertain."""

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
    """Records the destination's confirmation that the effect happened: its id for it
    (``receipt_id``) and what it returned (JSON), from the call, a webhook, a reconciler or a person.
    ``attempt`` is 0 when the sender cannot tell which attempt it confirms."""

    event_id: str
    effect_id: str
    at_ms: int
    attempt: int
    receipt_id: str
    source: ReceiptSource
    value: str


@dataclass(frozen=True, slots=True)
class Resolution:
    """Records a reconciler's answer about an uncertain attempt, written by the reconciliation
    consumers after asking the destination. ``receipt_id`` and ``value`` are set on FOUND; ``tries``
    counts how often the destination has been asked about this attempt."""

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
    """Records a person's decision on an effect (``Ledger.decide``, ``effects resolve``), typically an
    escalated one. Written to ``effects.decisions`` (one on ``effects.events`` is not folded); ``by`` is
    who the person says they are, ``principal`` who the writing client was."""

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
    """Records that an attempt passed its deadline without an outcome (CALL) or a receipt (RECEIPT),
    written by the processor's timer. Its event id is deterministic, so a timer firing twice applies
    once."""

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
    """One effect's latest state as the processor folded it, published to the compacted
    ``effects.state`` on every change. ``version`` counts the events folded in; ``executions`` above 1
    is a duplicate execution; None fields are not known (or not applicable) in this state."""

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
    """A work item for the reconcilers: an effect whose outcome is unknown, published to
    ``effects.uncertain`` when the effect becomes UNCERTAIN (once per attempt and round of asking).
    It carries the intent's target, operation and request so a reconciler can ask the destination."""

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
    """A record that could not be decoded or applied, copied to ``effects.dlq`` with the reason
    (``error``) and where it was read from; ``key`` and ``value`` are the raw bytes (None: absent)."""

    at_ms: int
    consumer: str
    topic: str
    partition: int
    offset: int
    error: str
    key: bytes | None = field(default=None)
    value: bytes | None = field(default=None)


@dataclass(frozen=True, slots=True)
class Retirement:
    """A command on ``effects.events``: retire a closed effect (``effect_ledger.core.retention``).
    Not a fact about the effect: the fold never sees it; the processor checks and applies it."""

    event_id: str
    effect_id: str
    at_ms: int
    version: int
    after_ms: int
    by: str


RECORD_TYPES: tuple[type, ...] = (*EVENT_TYPES, EffectState, UncertainEffect, DeadLetter, Retirement)

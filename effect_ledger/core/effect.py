"""The effect state machine: the pure core of effect-ledger.

An effect is the set of events ("facts") known about one idempotency key. Its state is *derived*
from that set, never accumulated step by step, which is what makes the fold

* idempotent: an event whose ``event_id`` is already known changes nothing;
* order-tolerant: the same set of events gives the same effect whatever order they arrived in
  (a receipt before its intent converges to the same state as in-order delivery);
* honest about duplicates: a second successful execution, a second distinct receipt id, or a
  request digest that differs from the first intent's is *flagged*, never overwritten.

Claims (Kafka mode): two agents may write an intent of the same attempt at the same moment. The
processor folds a key's partition in its total order and, when it folds the first intent of an
attempt, records a ``Claimed`` verdict naming it (``claim_verdict``). The verdict is a fact like
any other, so the fold stays order-tolerant: it never looks at arrival order, only at the recorded
verdict. An intent of a claimed attempt that the verdict does not name is a lost claim: flagged
LOST_CLAIM, never the attempt's intent (its deadline, its request), and the outcomes its worker
records for that attempt do not decide the state (its agent did not call; a successful call it
reports anyway still counts as an execution, and is flagged as a duplicate). Without a verdict
(embedded mode) every intent counts, as before.

Time is an argument (``expire(effect, now_ms)``); nothing here reads a clock or does I/O. Time is
data, not authority: every event keeps its writer's ``at_ms``, and every comparison of times uses
the time the log took each fact (``log_time``): the broker's append time in Kafka mode, recorded by
the processor as it folds (``apply(effect, event, log_ms)``), the file's one clock in embedded mode
(where it is ``at_ms``). A deadline is a duration from its intent's log time (``core.deadlines``).
An ABSENT decision or answer logged while its attempt's call may still land changes nothing (flagged);
a timeout command logged before its deadline is not admitted at all, so the next one can be.

How the state is derived (first rule that matches wins)::

    any COMPENSATED decision                                   -> COMPENSATED
    any receipt (Receipt, FOUND resolution, CONFIRMED decision) -> CONFIRMED
    then, for the latest attempt N only:
      ABANDONED decision                                       -> ABANDONED
      executed FAILED (a definitive rejection)                 -> FAILED
      ABSENT decision or ABSENT resolution                     -> ABSENT
        (an ABSENT decision or answer counts only if the log took it once the attempt's
        call could no longer land, its deadline plus the intent's lands_within: before, the
        call may still land, and "absent" would let a second execution run; an earlier one is
        kept as a fact, flagged DECISION_IGNORED or ANSWER_IGNORED)
      ESCALATE resolution                                      -> ESCALATED
      executed OK, receipt deadline passed (RECEIPT timeout)   -> UNCERTAIN
      executed OK                                              -> EXECUTED
      executed UNKNOWN, or call deadline passed (CALL timeout) -> UNCERTAIN
      intent                                                   -> PENDING
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import NamedTuple

from effect_ledger.core.deadlines import (
    DECISION_GRACE_MS,
    MAX_CLOCK_AHEAD_MS,
    attempt_deadline_ms,
    attempt_windows,
    intent_deadline_ms,
    may_still_land_until_ms,
    receipt_deadline_ms,
)
from effect_ledger.core.model import (
    IN_FLIGHT_STATES,
    INEXACT_PREFIX,
    OPEN_STATES,
    UNSETTLED_STATES,
    Claimed,
    Decision,
    DecisionKind,
    EffectState,
    Event,
    Executed,
    Flag,
    Intent,
    Outcome,
    Receipt,
    ReceiptSource,
    Resolution,
    State,
    Timeout,
    TimeoutPhase,
    UncertainEffect,
    Verdict,
    is_event,
)

_KIND_ORDER = {Intent: 0, Executed: 1, Receipt: 2, Timeout: 3, Resolution: 4, Decision: 5, Claimed: 6}


def _sort_key(e: Event) -> tuple[int, int, int, str]:
    return (e.attempt, _KIND_ORDER[type(e)], e.at_ms, e.event_id)


@dataclass(frozen=True, slots=True)
class Evidence:
    """A receipt as far as the ledger knows it: the destination's id and what it returned (JSON)."""

    receipt_id: str
    value: str
    source: ReceiptSource
    attempt: int
    at_ms: int


@dataclass(frozen=True, slots=True)
class Effect:
    """Everything known about one key. ``facts`` is in canonical order, so two effects built from the
    same events compare equal. The other fields are derived from ``facts`` by ``_derive``."""

    effect_id: str
    facts: tuple[Event, ...]
    state: State
    attempt: int
    intent: Intent | None  # the intent of the latest attempt
    first_intent: Intent | None
    receipt: Evidence | None  # the earliest receipt, the one returned to callers
    receipt_ids: tuple[str, ...]
    executions: int
    flags: tuple[Flag, ...]
    deadline_ms: int | None  # when an open attempt becomes uncertain, on the log's time (None when not open)
    created_ms: int  # the log times of the first and latest facts
    updated_ms: int
    reason: str | None
    # When the log took each fact whose log time differs from its writer's at_ms: (event_id, ms),
    # sorted. Kafka mode: the broker's append time; empty in embedded mode (the file's one clock).
    logged: tuple[tuple[str, int], ...] = ()

    @property
    def version(self) -> int:
        """How many distinct events have been folded in; it grows by one with each new fact."""
        return len(self.facts)

    def has(self, event_id: str) -> bool:
        """Whether the event with this id is already among the facts (a redelivery is a no-op)."""
        for f in self.facts:  # a loop, not any() over a generator: this runs for every event folded
            if f.event_id == event_id:
                return True
        return False

    def log_time(self, fact: Event) -> int:
        """When the log took ``fact``: its recorded log time, else its writer's ``at_ms``."""
        if self.logged:
            for eid, ms in self.logged:
                if eid == fact.event_id:
                    return ms
        return fact.at_ms

    @property
    def resolutions(self) -> list[Resolution]:
        """The reconcilers' answers for this key, every attempt, in canonical order."""
        return [f for f in self.facts if isinstance(f, Resolution)]


def apply(effect: Effect | None, event: Event, log_ms: int | None = None) -> tuple[Effect, tuple[UncertainEffect, ...]]:
    """Fold one event into an effect. Returns the new effect and what the change emits: an
    ``UncertainEffect`` when the effect has just become uncertain. An event already known returns
    the effect unchanged and emits nothing. Anything that is not an event (an ``EffectState``, an
    ``UncertainEffect``, a ``DeadLetter``) raises ``TypeError``: it is never a fact.

    ``log_ms``: when the log took the event (Kafka mode: its record's append time); None when the
    writer's clock is the log's (embedded mode). A timeout command the log took before the deadline
    it enforces is not admitted (returned unchanged): whoever sent it early sends it again."""
    if not is_event(event):
        raise TypeError(f"{type(event).__name__} is not an event and cannot be folded")
    logged = effect.logged if effect is not None else ()
    if effect is not None:
        if event.effect_id != effect.effect_id:
            raise ValueError(f"event for {event.effect_id!r} applied to effect {effect.effect_id!r}")
        if effect.has(event.event_id):
            return effect, ()
        if type(event) is Timeout and log_ms is not None and _early_timeout(effect, event, log_ms):
            return effect, ()
        facts = list(effect.facts)
        bisect.insort(facts, event, key=_sort_key)
    else:
        facts = [event]
    if log_ms is not None and log_ms != event.at_ms:
        logged = tuple(sorted((*logged, (event.event_id, log_ms))))
    new = _derive(event.effect_id, tuple(facts), logged)
    emitted: tuple[UncertainEffect, ...] = ()
    # Reconcilers need the intent (target, request) to ask anyone: emit once the effect is
    # uncertain *and* its intent is known, whichever came last.
    if new.state is State.UNCERTAIN and new.intent is not None:
        was_actionable = (
            effect is not None
            and effect.state is State.UNCERTAIN
            and effect.attempt == new.attempt
            and effect.intent is not None
        )
        if not was_actionable:
            emitted = (uncertain_event(new),)
    return new, emitted


def _early_timeout(effect: Effect, timeout: Timeout, log_ms: int) -> bool:
    """A timeout of the open attempt that the log took before that attempt's deadline (on the log's
    time): its sender's clock ran ahead. Other timeouts change nothing either way."""
    return (
        effect.deadline_ms is not None
        and timeout.attempt == effect.attempt
        and effect.state in IN_FLIGHT_STATES
        and log_ms < effect.deadline_ms
    )


def begin(intent: Intent) -> Effect:
    """The effect a first intent makes on a key nobody has used: what ``apply(None, intent)``
    returns, without the fold (the SDK's common case, on its hot path)."""
    return Effect(
        effect_id=intent.effect_id,
        facts=(intent,),
        state=State.PENDING,
        attempt=intent.attempt,
        intent=intent,
        first_intent=intent,
        receipt=None,
        receipt_ids=(),
        executions=0,
        flags=(),
        deadline_ms=intent_deadline_ms(intent),
        created_ms=intent.at_ms,
        updated_ms=intent.at_ms,
        reason=None,
    )


def merge(a: Effect, b: Effect) -> Effect:
    """The effect of the union of two effects' facts: two values of one key that writers folded
    from different parts of its history, neither holding every fact of the other (the processor's
    table, ``processors/late_records.py``). The state is a function of the set of facts, so the
    union is what folding every fact of both gives. Where both know a fact, ``a``'s log time of it
    is kept."""
    if a.effect_id != b.effect_id:
        raise ValueError(f"effect {b.effect_id!r} merged into effect {a.effect_id!r}")
    known = {f.event_id for f in a.facts}
    new = [f for f in b.facts if f.event_id not in known]
    if not new:
        return a
    facts = sorted((*a.facts, *new), key=_sort_key)
    logged = tuple(sorted({**dict(b.logged), **dict(a.logged)}.items()))
    return _derive(a.effect_id, tuple(facts), logged)


def absorb(effect: Effect | None, events: Sequence[Event]) -> tuple[Effect | None, list[Event]]:
    """Fold several events at once: the effect ``fold(events, effect)`` gives, derived once instead
    of once per event (the state is a function of the set of facts, so the order of folding does not
    matter), and the events that were new to it, in the order given (a known event id, or one
    repeated in ``events``, is not new). Unlike ``apply`` it emits nothing: its callers (the SDK's
    writes) publish no reconcilers' work items. Raises like ``apply`` for a non-event or an event
    of another key."""
    known = {f.event_id for f in effect.facts} if effect is not None else set()
    key = effect.effect_id if effect is not None else None
    new: list[Event] = []
    for e in events:
        if not is_event(e):
            raise TypeError(f"{type(e).__name__} is not an event and cannot be folded")
        if key is None:
            key = e.effect_id
        elif e.effect_id != key:
            raise ValueError(f"event for {e.effect_id!r} applied to effect {key!r}")
        if e.event_id not in known:
            known.add(e.event_id)
            new.append(e)
    if not new:
        return effect, new
    if effect is None and len(new) == 1 and type(new[0]) is Intent:
        return begin(new[0]), new
    if effect is not None and len(new) == 2 and not effect.logged:
        settled = _settled(effect, new[0], new[1])
        if settled is not None:
            return settled, new
    facts = sorted((*effect.facts, *new) if effect is not None else new, key=_sort_key)
    return _derive(new[0].effect_id, tuple(facts), effect.logged if effect is not None else ()), new


def _settled(effect: Effect, executed: Event, receipt: Event) -> Effect | None:
    """The SDK's common outcome, without the fold: a successful call and the receipt it returned,
    on an effect that holds only the intent of their attempt. What ``_derive`` gives for those
    three facts (``tests/unit/core/test_effect_properties.py`` checks it against the fold); None for
    any other shape."""
    if len(effect.facts) != 1 or type(executed) is not Executed or type(receipt) is not Receipt:
        return None
    intent = effect.facts[0]
    if (
        type(intent) is not Intent
        or executed.outcome is not Outcome.OK
        or not intent.attempt == executed.attempt == receipt.attempt
    ):
        return None
    ats = (intent.at_ms, executed.at_ms, receipt.at_ms)
    return Effect(
        effect_id=intent.effect_id,
        facts=(intent, executed, receipt),  # the canonical order: one attempt, kinds in _KIND_ORDER
        state=State.CONFIRMED,
        attempt=intent.attempt,
        intent=intent,
        first_intent=intent,
        receipt=Evidence(receipt.receipt_id, receipt.value, receipt.source, receipt.attempt, receipt.at_ms),
        receipt_ids=(receipt.receipt_id,),
        executions=1,
        flags=(Flag.INEXACT_RECEIPT,) if receipt.value.startswith(INEXACT_PREFIX) else (),
        deadline_ms=None,
        created_ms=min(ats),
        updated_ms=max(ats),
        reason=None,
    )


def fold(events: list[Event] | tuple[Event, ...], effect: Effect | None = None) -> Effect | None:
    """Apply events in order; convenience for replays and tests."""
    for e in events:
        effect, _ = apply(effect, e)
    return effect


def expire(effect: Effect, now_ms: int) -> list[Timeout]:
    """The timeout commands due for an effect at ``now_ms``: an attempt still PENDING after its
    call deadline, or EXECUTED without a receipt after its receipt deadline. Their event ids are
    deterministic, so a timer that fires twice (or two processors) applies once."""
    if effect.deadline_ms is None or now_ms < effect.deadline_ms:
        return []
    if effect.state is State.PENDING:
        phase = TimeoutPhase.CALL
    elif effect.state is State.EXECUTED:
        phase = TimeoutPhase.RECEIPT
    else:
        return []
    event_id = timeout_event_id(effect.effect_id, effect.attempt, phase)
    if effect.has(event_id):
        return []
    return [Timeout(event_id, effect.effect_id, now_ms, effect.attempt, phase, effect.deadline_ms)]


def timeout_event_id(effect_id: str, attempt: int, phase: TimeoutPhase) -> str:
    """The deterministic event id of an attempt's timeout in one phase, the same on every processor."""
    return f"timeout:{phase.value.lower()}:{attempt}:{effect_id}"


def claimed_event_id(effect_id: str, attempt: int) -> str:
    """The id of the one claim verdict an attempt can have."""
    return f"claim:{attempt}:{effect_id}"


def claim_verdict(effect: Effect, event: Event) -> Claimed | None:
    """The verdict to record when ``event`` was just folded into ``effect`` in its partition's order
    (the processor's fold): an intent of an attempt with no verdict yet owns that attempt. None for
    anything else, including any later intent of a claimed attempt: a verdict once given never
    changes. Every field derives from the intent, so whoever folds the partition records the same. An
    intent of attempt n > 1 gets a verdict naming nobody (``REFUSED_CLAIM``) unless the facts before
    it settle attempt n-1 as FAILED or ABSENT: the log, not an agent's view, says when a retry is safe."""
    if not isinstance(event, Intent):
        return None
    event_id = claimed_event_id(event.effect_id, event.attempt)
    if effect.has(event_id):
        return None
    if event.attempt > 1 and not _may_start(effect, event.attempt):
        # The log has not settled the attempt before (FAILED or ABSENT on its own time): whatever
        # an agent's own view said, nobody owns this one. Its intents are lost claims: never called.
        return Claimed(event_id, event.effect_id, event.at_ms, event.attempt, REFUSED_CLAIM, REFUSED_CLAIM)
    return Claimed(event_id, event.effect_id, event.at_ms, event.attempt, event.event_id, event.worker)


#: The intent id and worker of a claim verdict that gives an attempt to nobody (``claim_verdict``).
REFUSED_CLAIM = ""


def _may_start(effect: Effect, attempt: int) -> bool:
    """Whether the facts before ``attempt`` settle the attempt before it as FAILED or ABSENT: only
    then may another attempt call the destination."""
    before = tuple(f for f in effect.facts if f.attempt < attempt)
    if not before:
        return False
    prior = _derive(effect.effect_id, before, effect.logged)
    return prior.attempt == attempt - 1 and prior.state in (State.FAILED, State.ABSENT)


def claim_of(effect: Effect, attempt: int) -> Claimed | None:
    """The recorded verdict on ``attempt`` (None: nobody has arbitrated it)."""
    return next((f for f in effect.facts if isinstance(f, Claimed) and f.attempt == attempt), None)


def uncertain_event(effect: Effect) -> UncertainEffect:
    """The reconcilers' work item. Its event id names the attempt and how often reconcilers were
    asked already, so a re-publication after a backoff is a new item and a repeat is not."""
    i = effect.intent
    first = effect.first_intent
    tries = max((r.tries for r in effect.resolutions if r.attempt == effect.attempt), default=0)
    return UncertainEffect(
        event_id=f"uncertain:{effect.attempt}:{tries}:{effect.effect_id}",
        effect_id=effect.effect_id,
        at_ms=effect.updated_ms,
        attempt=effect.attempt,
        target=i.target if i else "",
        operation=i.operation if i else "",
        request=i.request if i else "",
        request_digest=i.request_digest if i else "",
        reason=effect.reason or "uncertain",
        intent_at_ms=effect.log_time(first) if first else effect.created_ms,
        # The attempt's latest deadline on the log's time: a lost claim's intent may carry a later
        # one, and its call may still land until then (reconcilers judge "absent" against it).
        deadline_ms=attempt_deadline(effect, effect.attempt) or effect.created_ms,
        tries=tries,
        executed=any(
            isinstance(f, Executed) and f.outcome is Outcome.OK and f.attempt == effect.attempt for f in effect.facts
        ),
    )


def attempt_deadline(effect: Effect, attempt: int) -> int | None:
    """The call deadline of ``attempt`` on the log's time (None: no intent of it is known)."""
    return attempt_deadline_ms(effect.facts, attempt, effect.log_time)


class Refusal(NamedTuple):
    """Why a decision is refused, and when asking again may succeed (None: not by waiting)."""

    reason: str
    retry_after_ms: int | None


def decision_refusal(
    effect: Effect, decision: DecisionKind, now_ms: int | None, grace_ms: int = DECISION_GRACE_MS
) -> Refusal | None:
    """Whether a person may record ``decision`` on ``effect`` at ``now_ms`` (None: they may).
    ``now_ms`` is on the log's time; None when the writer cannot know it (an operator's tool that
    reads the topics: its host's clock is a claim): then only what no time can change is refused,
    and the time the log takes the decision decides.

    ABSENT tells agents that the effect never happened, so the next ``execute`` runs it again. It is
    refused while the current attempt may still be in flight: its state is PENDING or EXECUTED (the
    ledger itself still waits for it), or its call deadline plus ``grace_ms`` has not passed (a call
    cut off or lost may land at the destination until then), or no intent of the attempt is known
    (nothing tells when it would stop). The fold applies the same rule to the time the log took the
    decision, so a decision written past this check, or stamped with a clock that runs ahead,
    changes nothing either."""
    if decision is not DecisionKind.ABSENT:
        return None
    deadline = attempt_deadline(effect, effect.attempt)
    if deadline is None:
        return Refusal(f"no intent of attempt {effect.attempt} is known: nothing says when its call would stop", None)
    until = may_still_land_until_ms(deadline, grace_ms)
    wait = until - now_ms if now_ms is not None and now_ms < until else None
    if effect.state in IN_FLIGHT_STATES:
        return Refusal(
            f"attempt {effect.attempt} is {effect.state.value}: its call may still land; wait until its deadline "
            "passes and the effect is UNCERTAIN, or ask the destination",
            wait,
        )
    if wait is not None and (effect.state in OPEN_STATES or effect.state is State.ESCALATED):
        return Refusal(
            f"attempt {effect.attempt} may still land at the destination until its deadline "
            f"{_utc(deadline)} (+ {grace_ms / 1000:g} s grace): ask again in {wait / 1000:.1f} s",
            wait,
        )
    return None


def _utc(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def to_state(effect: Effect) -> EffectState:
    """The record published on the intermediate-state stream."""
    i = effect.first_intent
    return EffectState(
        effect_id=effect.effect_id,
        state=effect.state,
        target=i.target if i else "",
        operation=i.operation if i else "",
        namespace=i.namespace if i else "",
        run_id=i.run_id if i else "",
        step=i.step if i else "",
        request_digest=i.request_digest if i else "",
        attempt=effect.attempt,
        version=state_version(effect),
        created_ms=effect.created_ms,
        updated_ms=effect.updated_ms,
        deadline_ms=effect.deadline_ms,
        receipt_id=effect.receipt.receipt_id if effect.receipt else None,
        executions=effect.executions,
        receipt_ids=effect.receipt_ids,
        flags=tuple(f.value for f in effect.flags),
        reason=effect.reason,
    )


def state_version(effect: Effect) -> int:
    """The version a state record publishes: the facts agents, reconcilers and people wrote. The
    processor's own claim verdicts are not counted, so an agent's file that never asked the
    processor publishes the same version."""
    return effect.version - sum(1 for f in effect.facts if isinstance(f, Claimed))


def _evidence_of(f: Event) -> Evidence | None:
    if isinstance(f, Receipt):
        return Evidence(f.receipt_id, f.value, f.source, f.attempt, f.at_ms)
    if isinstance(f, Resolution) and f.verdict is Verdict.FOUND and f.receipt_id is not None:
        return Evidence(f.receipt_id, f.value or "null", ReceiptSource.RECONCILER, f.attempt, f.at_ms)
    if isinstance(f, Decision) and f.decision is DecisionKind.CONFIRMED:
        return Evidence(f.receipt_id or f"decision:{f.event_id}", "null", ReceiptSource.PERSON, f.attempt, f.at_ms)
    return None


def _derive(effect_id: str, facts: tuple[Event, ...], logged: tuple[tuple[str, int], ...] = ()) -> Effect:
    # One pass (this runs for every event folded): each fact's log time, the intents, claims and
    # receipts, and the writers' clocks that ran ahead, gathered together. Facts are sorted by
    # attempt first, so the latest attempt's facts are the tail of the tuple.
    times: dict[str, int] | None = dict(logged) if logged else None
    if times is not None:
        known = times

        def log_of(f: Event) -> int:
            return known.get(f.event_id, f.at_ms)

    else:

        def log_of(f: Event) -> int:
            return f.at_ms

    attempt = facts[-1].attempt
    intents: list[Intent] = []
    claims: dict[int, Claimed] = {}
    evidence: list[Evidence] = []
    absent_decisions: list[Decision] = []
    absent_answers: list[Resolution] = []
    compensated: Decision | None = None
    ahead: set[str] = set()
    ok_execs = 0
    created = updated = log_of(facts[0])
    first_latest = len(facts)
    for i, f in enumerate(facts):
        at = f.at_ms if times is None else times.get(f.event_id, f.at_ms)
        if at < created:
            created = at
        elif at > updated:
            updated = at
        if f.at_ms - at > MAX_CLOCK_AHEAD_MS:  # never without log times: at is at_ms then
            ahead.add(f.event_id)
        if f.attempt == attempt and i < first_latest:
            first_latest = i
        if isinstance(f, Intent):
            intents.append(f)
        elif isinstance(f, Executed):
            if f.outcome is Outcome.OK:
                ok_execs += 1
        elif isinstance(f, Claimed):
            claims[f.attempt] = f
        else:
            ev = _evidence_of(f)
            if ev is not None:
                evidence.append(ev)
            elif isinstance(f, Decision) and f.decision is DecisionKind.ABSENT:
                absent_decisions.append(f)
            elif isinstance(f, Resolution) and f.verdict is Verdict.ABSENT:
                absent_answers.append(f)
            if compensated is None and isinstance(f, Decision) and f.decision is DecisionKind.COMPENSATED:
                compensated = f
    latest = facts[first_latest:]
    owned, lost = intents, False
    if claims:
        owned, latest, lost = _arbitrated(intents, latest, claims)
    intent = owned[-1] if owned else None
    if intent is not None and intent.attempt != attempt:
        intent = next((f for f in reversed(owned) if f.attempt == attempt), intent)
    if len(evidence) > 1:
        evidence.sort(key=lambda e: (e.at_ms, e.receipt_id))
        receipt_ids = tuple(sorted({e.receipt_id for e in evidence}))
    else:
        receipt_ids = (evidence[0].receipt_id,) if evidence else ()

    flags: list[Flag] = []
    if ok_execs > 1:
        flags.append(Flag.DUPLICATE_EXECUTION)
    if len(receipt_ids) > 1:
        flags.append(Flag.DUPLICATE_RECEIPT)
    if len(intents) > 1 and len({i.request_digest for i in intents}) > 1:
        flags.append(Flag.CONFLICT)
    if not intents:
        flags.append(Flag.NO_INTENT)
    if lost:
        flags.append(Flag.LOST_CLAIM)
    for e in evidence:
        if e.value.startswith(INEXACT_PREFIX):
            flags.append(Flag.INEXACT_RECEIPT)
            break
    # A writer's clock that ran ahead of the log's: flagged, and its ABSENT claims refused (_early).
    if ahead:
        flags.append(Flag.CLOCK_SKEW)
    # Only ABSENT decisions and answers need the windows; each counts once the log took it at or
    # after its attempt's call could no longer land (its deadline plus the intent's lands_within).
    early: list[Decision] = []
    deadlines: dict[int, int] = {}
    if absent_decisions or absent_answers:
        deadlines = _windows(intents, log_of)
        early = [d for d in absent_decisions if _early(d, deadlines, log_of) or d.event_id in ahead]
        if early:
            flags.append(Flag.DECISION_IGNORED)
        early_answers = [r for r in absent_answers if _early(r, deadlines, log_of) or r.event_id in ahead]
        if early_answers:
            flags.append(Flag.ANSWER_IGNORED)

    if compensated is not None:
        state, reason, deadline = State.COMPENSATED, f"compensated by {compensated.by}: {compensated.reason}", None
    elif evidence:
        state, reason, deadline = State.CONFIRMED, None, None
    else:
        state, reason, deadline = _state_of(latest, intent, deadlines, log_of, ahead)
    if early:
        ignored = [d for d in early if d.attempt == attempt]
        if ignored and state in UNSETTLED_STATES:
            d = ignored[0]
            note = f"ABSENT decision by {d.by} ignored: made while attempt {d.attempt} could still land"
            reason = f"{reason}; {note}" if reason else note
    return Effect(
        effect_id=effect_id,
        facts=facts,
        state=state,
        attempt=attempt,
        intent=intent,
        first_intent=owned[0] if owned else (intents[0] if intents else None),
        receipt=evidence[0] if evidence else None,
        receipt_ids=receipt_ids,
        executions=ok_execs,
        flags=tuple(flags),
        deadline_ms=deadline,
        created_ms=created,
        updated_ms=updated,
        reason=reason,
        logged=logged,
    )


def _arbitrated(
    intents: list[Intent], latest: tuple[Event, ...], claims: dict[int, Claimed]
) -> tuple[list[Intent], tuple[Event, ...], bool]:
    """Apply the recorded claim verdicts: (the intents that own their attempt or were not
    arbitrated, the latest attempt's facts without the outcomes its lost claims' workers recorded,
    whether any claim was lost)."""
    owned: list[Intent] = []
    losers: set[str] = set()  # workers of the latest attempt's lost claims
    lost = False
    for i in intents:
        c = claims.get(i.attempt)
        if c is None or c.intent_id == i.event_id:
            owned.append(i)
            continue
        lost = True
        if i.attempt == latest[0].attempt and i.worker != c.worker:
            losers.add(i.worker)
    if losers:
        latest = tuple(f for f in latest if not (isinstance(f, Executed) and f.worker in losers))
    return owned, latest, lost


def _early(f: Decision | Resolution, windows: dict[int, int], log_of: Callable[[Event], int]) -> bool:
    """An ABSENT decision or answer made while its attempt's call, or an earlier attempt's, could still
    land (``_windows``), or on an attempt whose intent is unknown: it must not make the effect ABSENT.
    It was made at the latest when the log took it, and at the latest when its writer's clock says
    (a clock trusted only in that direction: one that runs ahead is flagged and refused, and one that
    runs behind makes the answer count later, never earlier)."""
    until = windows.get(f.attempt)
    return until is None or min(log_of(f), f.at_ms) < until


def _windows(intents: list[Intent], log_of: Callable[[Event], int]) -> dict[int, int]:
    """Per attempt with a known intent: until when its call, or any earlier attempt's, may still land.
    An attempt the log refused (``REFUSED_CLAIM``) leaves the one before it unsettled, and that one's
    call may run longer than its own."""
    own = attempt_windows(intents, log_of)
    out: dict[int, int] = {}
    latest = 0
    for attempt in sorted(own):
        latest = max(latest, own[attempt])
        out[attempt] = latest
    return out


def _state_of(
    latest: tuple[Event, ...],
    intent: Intent | None,
    deadlines: dict[int, int],
    log_of: Callable[[Event], int],
    ahead: set[str],
) -> tuple[State, str | None, int | None]:
    """(state, reason, deadline) per the table in the module docstring, from the latest attempt's
    facts, for an effect neither compensated nor confirmed (``_derive`` decides those)."""
    decisions: list[Decision] = []
    execs: list[Executed] = []
    resolutions: list[Resolution] = []
    timeouts: set[TimeoutPhase] = set()
    for f in latest:  # one pass, each kind in its order
        if isinstance(f, Executed):
            execs.append(f)
        elif isinstance(f, Decision):
            decisions.append(f)
        elif isinstance(f, Resolution):
            resolutions.append(f)
        elif isinstance(f, Timeout):
            timeouts.add(f.phase)

    for d in decisions:
        if d.decision is DecisionKind.ABANDONED:
            return State.ABANDONED, f"abandoned by {d.by}: {d.reason}", None
    for x in execs:
        if x.outcome is Outcome.FAILED:
            return State.FAILED, x.error, None
    for d in decisions:
        if d.decision is DecisionKind.ABSENT and not _early(d, deadlines, log_of) and d.event_id not in ahead:
            return State.ABSENT, f"absent per {d.by}: {d.reason}", None
    for r in resolutions:
        if r.verdict is Verdict.ABSENT and not _early(r, deadlines, log_of) and r.event_id not in ahead:
            return State.ABSENT, f"{r.reconciler}: {r.reason}" if r.reason else r.reconciler, None
    for r in resolutions:
        if r.verdict is Verdict.ESCALATE:
            return State.ESCALATED, r.reason or "escalated", None
    ok = next((x for x in execs if x.outcome is Outcome.OK), None)
    if ok is not None:
        if TimeoutPhase.RECEIPT in timeouts:
            return State.UNCERTAIN, "executed, but no receipt by its deadline", None
        deadline = receipt_deadline_ms(ok, log_of)
        if deadline is None and intent is not None:
            deadline = intent_deadline_ms(intent, log_of)
        return State.EXECUTED, None, deadline
    unknown = next((x for x in execs if x.outcome is Outcome.UNKNOWN), None)
    if unknown is not None:
        return State.UNCERTAIN, f"call outcome unknown: {unknown.error}", None
    if TimeoutPhase.CALL in timeouts:
        return State.UNCERTAIN, "deadline passed without a recorded outcome", None
    if intent is not None and intent.attempt == (latest[0].attempt if latest else 0):
        return State.PENDING, None, intent_deadline_ms(intent, log_of)
    # Events of an attempt whose intent has not arrived (yet): nothing proves what happened.
    return State.UNCERTAIN, "events without an intent", None

"""Reconciliation: asking a destination, by idempotency key, whether an effect happened.

A ``Reconciler`` answers one question for one target: ``Found(receipt)``, ``Absent()`` or
``Unknown(reason)``. ``judge`` turns that answer into a ``Resolution`` event under the rules that
keep retries safe:

* ``Found`` is proof: the effect is CONFIRMED with the receipt found.
* ``Absent`` makes a retry safe only once the attempt's deadline has passed (a request sent just
  before a crash may still land until then) and only while the destination still remembers keys
  (its idempotency retention since the intent): past retention, "absent" may mean "forgotten",
  so the effect is escalated to a person instead.
* ``Unknown`` is retried with backoff, then escalated. A target with no way to ask is escalated
  at once: nobody can tell.

What a resolution carries is bounded, so that it can always be written (a destination that answers
with a 1.5 MB body must not make the resolution unproducible, and the reconcilers crash-loop): the
receipt value is recorded like a call's (``limits.receipt_text``: past ``MAX_RECEIPT_BYTES``, or not
JSON, a stand-in under the reserved key ``effect_ledger.inexact`` with its size, SHA-256 and head),
the receipt id to ``MAX_RECEIPT_ID_BYTES`` (past it, ``sha256:`` and the digest of the value) and
the reason to ``MAX_TEXT_BYTES``.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from effect_ledger.streams.bodies import BodyPolicy
from effect_ledger.streams.effect import Effect
from effect_ledger.streams.errors import DefiniteFailure
from effect_ledger.streams.limits import MAX_RECEIPT_ID_BYTES, bounded_text, digest_id, receipt_text
from effect_ledger.streams.model import Executed, Outcome, Resolution, UncertainEffect, Verdict


@dataclass(frozen=True, slots=True)
class Found:
    """A reconciler's answer: the destination has the effect, under ``receipt_id``."""

    receipt_id: str
    value: Any = None


@dataclass(frozen=True, slots=True)
class Absent:
    """A reconciler's answer: the destination proves the effect never happened."""

    reason: str = ""


@dataclass(frozen=True, slots=True)
class Unknown:
    """A reconciler's answer: it cannot tell (yet); asked again with backoff, then escalated."""

    reason: str


Answer = Found | Absent | Unknown


@dataclass(frozen=True, slots=True)
class EffectView:
    """What a reconciler is told about an effect."""

    effect_id: str
    target: str
    operation: str
    request: Any  # the decoded JSON request
    attempt: int
    intent_at_ms: int  # when the key was first used (the destination's key retention counts from it)
    deadline_ms: int  # the current attempt's deadline
    tries: int = 0  # how often the destination was asked about this attempt already
    executed: bool = False  # the call of this attempt returned OK (so "absent" contradicts the record)


class Reconciler(Protocol):
    """Asks one destination whether an effect happened, by its idempotency key: ``check`` returns
    ``Found``, ``Absent`` or ``Unknown`` (see ``HttpReconciler``, ``CallableReconciler``)."""

    name: str

    async def check(self, effect: EffectView) -> Answer: ...


class CallableReconciler:
    """A reconciler from a plain (sync or async) function ``fn(effect: EffectView) -> Answer``."""

    def __init__(self, fn: Callable[[EffectView], Answer | Awaitable[Answer]], name: str | None = None) -> None:
        self._fn = fn
        self.name: str = name or str(getattr(fn, "__name__", "callable"))

    async def check(self, effect: EffectView) -> Answer:
        result = self._fn(effect)
        if inspect.isawaitable(result):
            result = await result
        if not isinstance(result, Found | Absent | Unknown):
            return Unknown(f"reconciler {self.name} returned {result!r}, not Found/Absent/Unknown")
        return result


@dataclass(frozen=True)
class Backoff:
    """Unknown answers are retried after ``first_s * factor**(tries-1)`` (at most ``max_s``), and
    escalated after ``max_tries``."""

    first_s: float = 1.0
    factor: float = 2.0
    max_s: float = 300.0
    max_tries: int = 5

    def delay_ms(self, tries: int) -> int:
        try:
            delay = self.first_s * self.factor ** max(0, tries - 1)
        except OverflowError:
            delay = self.max_s
        return int(min(self.max_s, delay) * 1000)


@dataclass(frozen=True)
class Target:
    """How effect-ledger treats one destination.

    ``honours_keys``: the destination deduplicates by idempotency key, so calling it again with
    the same key within ``retention_s`` returns the original result instead of a second effect.
    ``definite_errors``: exception types that mean "rejected, nothing happened" (FAILED); any other
    exception, and every timeout, leaves the outcome unknown (UNCERTAIN).
    """

    name: str
    reconciler: Reconciler | None = None
    honours_keys: bool = False
    retention_s: float | None = 24 * 3600.0
    definite_errors: tuple[type[BaseException], ...] = ()
    receipt_id: Callable[[Any], str] | None = None
    backoff: Backoff = field(default_factory=Backoff)
    body: BodyPolicy = field(default_factory=BodyPolicy)  # what of a request is recorded (bodies.py)

    @property
    def definite(self) -> tuple[type[BaseException], ...]:
        """Every exception type that counts as a definite rejection for this target."""
        return (DefiniteFailure, *self.definite_errors)

    def rejects(self, error: BaseException) -> bool:
        """Whether ``error`` raised by a call means "rejected, nothing happened". Never a timeout
        or a cancellation, whatever types are declared (``OSError`` includes ``TimeoutError``):
        their outcome is unknown, and calling FAILED what may have happened would re-run it."""
        return isinstance(error, self.definite) and isinstance(error, Exception) and not isinstance(error, TimeoutError)


def view(effect: Effect) -> EffectView:
    i = effect.intent or effect.first_intent
    first = effect.first_intent
    tries = previous_tries(effect)
    executed = any(
        isinstance(f, Executed) and f.outcome is Outcome.OK and f.attempt == effect.attempt for f in effect.facts
    )
    if i is None or first is None:
        return EffectView(
            effect.effect_id, "", "", None, effect.attempt, effect.created_ms, effect.created_ms, tries, executed
        )
    request = json.loads(i.request)
    return EffectView(
        effect.effect_id, i.target, i.operation, request, effect.attempt, first.at_ms, i.deadline_ms, tries, executed
    )


def view_of_uncertain(u: UncertainEffect) -> EffectView:
    """The view a reconciliation consumer builds from an ``effects.uncertain`` record."""
    request = json.loads(u.request) if u.request else None
    return EffectView(
        u.effect_id, u.target, u.operation, request, u.attempt, u.intent_at_ms, u.deadline_ms, u.tries, u.executed
    )


def retention_passed(effect: Effect | EffectView, target: Target, now_ms: int) -> bool:
    if isinstance(effect, Effect):
        effect = view(effect)
    if target.retention_s is None or not effect.target:
        return False
    return now_ms - effect.intent_at_ms > target.retention_s * 1000


def only_the_agent_can_ask(effect: Effect | EffectView, target: Target, now_ms: int) -> bool:
    """A destination without a reconciler that honours keys can only be asked by replaying the
    key, which needs the call: services leave such an effect to the agent while the key is
    remembered (its retention), and escalate it after."""
    return target.reconciler is None and target.honours_keys and not retention_passed(effect, target, now_ms)


def previous_tries(effect: Effect) -> int:
    return max((r.tries for r in effect.resolutions if r.attempt == effect.attempt), default=0)


def judge(
    effect: Effect | EffectView, target: Target, answer: Answer | None, reconciler: str, now_ms: int
) -> Resolution:
    """The resolution event for a reconciler's answer (``None``: nobody could be asked)."""
    if isinstance(effect, Effect):
        effect = view(effect)
    tries = effect.tries + 1
    attempt = effect.attempt
    eid = f"resolution:{attempt}:{tries}:{effect.effect_id}"

    def res(verdict: Verdict, reason: str, receipt_id: str | None = None, value: str | None = None) -> Resolution:
        # A reconciler's reason can be any text (an HTTP body, an exception): bounded, like every event.
        return Resolution(
            eid, effect.effect_id, now_ms, attempt, verdict, reconciler, bounded_text(reason), receipt_id, value, tries
        )

    if answer is None:
        return res(Verdict.ESCALATE, f"no reconciler for target {target.name!r} and it does not honour keys")
    if isinstance(answer, Found):
        # Recorded like a call's value: never lost for not being JSON or too large (flagged instead).
        text, inexact = receipt_text(answer.value)
        rid = answer.receipt_id
        notes = ["found at the destination"]
        if inexact is not None:
            notes.append(f"receipt value recorded as a flagged stand-in ({inexact})")
        if not isinstance(rid, str) or not rid or len(rid.encode("utf-8", "replace")) > MAX_RECEIPT_ID_BYTES:
            rid = digest_id(text)
            notes.append("receipt id replaced by the digest of the value (missing or too long)")
        return res(Verdict.FOUND, "; ".join(notes), bounded_text(rid, MAX_RECEIPT_ID_BYTES), text)
    if isinstance(answer, Absent):
        if effect.executed:
            return res(
                Verdict.ESCALATE,
                "the call returned OK, but the destination reports no record of it: the two disagree",
            )
        if retention_passed(effect, target, now_ms):
            return res(
                Verdict.ESCALATE,
                f"destination reports absent, but its key retention ({target.retention_s:.0f} s) has passed "
                "since the intent: it may have forgotten the key",
            )
        deadline = effect.deadline_ms if effect.target else 0
        if now_ms < deadline:
            # Not a try: asking again before the deadline must not run down the escalation count.
            tries -= 1
            eid = f"resolution:{attempt}:{tries}:early:{effect.effect_id}"
            return res(Verdict.UNKNOWN, f"absent so far, but the call may still land until its deadline ({deadline})")
        return res(Verdict.ABSENT, answer.reason or "not found at the destination")
    if tries >= target.backoff.max_tries:
        return res(Verdict.ESCALATE, f"no answer after {tries} tries: {answer.reason}")
    return res(Verdict.UNKNOWN, answer.reason)

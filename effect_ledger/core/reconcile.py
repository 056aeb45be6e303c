"""Reconciliation verdicts, decided purely: what a destination's answer about an effect means.

A ``Reconciler`` answers one question for one target: ``Found(receipt)``, ``Absent()`` or
``Unknown(reason)`` (asked by ``effect_ledger.targets.ask``). ``judge`` turns that answer into a
``Resolution`` event under the rules that keep retries safe:

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

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from effect_ledger.core.bodies import BodyPolicy, check_searchable
from effect_ledger.core.deadlines import DECISION_GRACE_MS, may_still_land_until_ms
from effect_ledger.core.effect import Effect, attempt_deadline, uncertain_event
from effect_ledger.core.limits import MAX_RECEIPT_ID_BYTES, bounded_text, digest_id, receipt_text
from effect_ledger.core.model import Resolution, UncertainEffect, Verdict
from effect_ledger.errors import DefiniteFailure, TargetsError


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

    async def check(self, effect: EffectView) -> Answer:
        """Ask the destination about ``effect.effect_id``: Found only with proof it happened, Absent only
        with proof it did not, else Unknown. An exception, or an ask longer than the target's timeout,
        counts as Unknown."""


@dataclass(frozen=True)
class Backoff:
    """Unknown answers are retried after ``first_s * factor**(tries-1)`` (at most ``max_s``), and
    escalated after ``max_tries``."""

    first_s: float = 1.0
    factor: float = 2.0
    max_s: float = 300.0
    max_tries: int = 5

    def delay_ms(self, tries: int) -> int:
        """Milliseconds to wait before asking again after ``tries`` asks, capped at ``max_s``."""
        try:
            delay = self.first_s * self.factor ** max(0, tries - 1)
        except OverflowError:
            delay = self.max_s
        return int(min(self.max_s, delay) * 1000)


#: The longest ``Target.lands_within_s``: a call that may land a week late is a queue to reconcile by hand.
MAX_LANDS_WITHIN_S = 7 * 86400.0


@dataclass(frozen=True)
class Target:
    """How effect-ledger treats one destination.

    ``honours_keys``: the destination deduplicates by idempotency key, so calling it again with
    the same key within ``retention_s`` returns the original result instead of a second effect.
    ``definite_errors``: exception types that mean "rejected, nothing happened" (FAILED); any other
    exception, and every timeout, leaves the outcome unknown (UNCERTAIN).
    ``lands_within_s``: how long after an attempt's deadline its call, cut off or lost on the way,
    may still take effect at the destination (a request being processed, a queue, a retrying
    proxy). Until then an "absent" answer proves nothing: it is never ABSENT, and no person may
    declare it ABSENT either (``decision_refusal``).
    """

    name: str
    reconciler: Reconciler | None = None
    honours_keys: bool = False
    retention_s: float | None = 24 * 3600.0
    definite_errors: tuple[type[BaseException], ...] = ()
    receipt_id: Callable[[Any], str] | None = None
    backoff: Backoff = field(default_factory=Backoff)
    # How long one ask of ``reconciler`` may take (None: the reconciler's own ``timeout_s``, such as
    # an HTTP lookup's ``timeout``, else ``DEFAULT_ASK_TIMEOUT_S``); past it the answer is Unknown.
    timeout_s: float | None = None
    body: BodyPolicy = field(default_factory=BodyPolicy)  # what of a request is recorded (bodies.py)
    lands_within_s: float = DECISION_GRACE_MS / 1000
    # Request fields (dotted paths) the console can search by value, such as an order id; only
    # fields the body policy records (``bodies.check_searchable``).
    searchable: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        try:
            check_searchable(self.body, tuple(self.searchable))
        except ValueError as e:
            raise TargetsError(f"target {self.name!r}: {e}") from None
        w = self.lands_within_s
        if not isinstance(w, int | float) or not 0 <= w <= MAX_LANDS_WITHIN_S:  # NaN fails both
            raise TargetsError(
                f"target {self.name!r}: lands_within_s must be between 0 and {MAX_LANDS_WITHIN_S:g} s, not {w!r}"
            )

    @property
    def lands_within_ms(self) -> int:
        """``lands_within_s`` in milliseconds."""
        return int(self.lands_within_s * 1000)

    def may_still_land_until_ms(self, deadline_ms: int | None) -> int:
        """Until when a call with this deadline may still take effect: the deadline plus
        ``lands_within_s`` (0 for no known deadline)."""
        return may_still_land_until_ms(deadline_ms, self.lands_within_ms)

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
    """What a reconciler is told about ``effect``: the same view a reconciliation consumer builds
    from the effect's ``effects.uncertain`` work item, so tries and executed are derived once
    (``effect_ledger.core.effect.uncertain_event``) in both modes."""
    return view_of_uncertain(uncertain_event(effect))


def view_of_uncertain(u: UncertainEffect) -> EffectView:
    """The view a reconciliation consumer builds from an ``effects.uncertain`` record."""
    request = json.loads(u.request) if u.request else None
    return EffectView(
        u.effect_id, u.target, u.operation, request, u.attempt, u.intent_at_ms, u.deadline_ms, u.tries, u.executed
    )


def retention_passed(effect: Effect | EffectView, target: Target, now_ms: int) -> bool:
    """Whether the destination may have forgotten the key at ``now_ms`` (epoch ms, on the log's time
    like every ``now_ms`` here): more than the target's ``retention_s`` since the key was first used
    (its first intent's log time). Never with no retention (None) or no known target."""
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


def target_name(effect: Effect | EffectView) -> str:
    """The target an effect was executed on: its intent's, else the key's prefix (a receipt or a
    resolution whose intent has not arrived)."""
    if isinstance(effect, Effect):
        if effect.intent is not None:
            return effect.intent.target
    elif effect.target:
        return effect.target
    return effect.effect_id.split(":", 1)[0]


def target_for(targets: Mapping[str, Target], name: str) -> tuple[Target, bool]:
    """The declared target ``name`` and True; for a target nobody declared, a default ``Target``
    and False. The one rule for an undeclared target, in every mode: nobody is asked, the answer
    is Unknown (``ask``), so it is asked again after the default backoff (time to fix the
    declaration), then escalated."""
    declared = targets.get(name)
    if declared is not None:
        return declared, True
    return Target(name or "unknown"), False


def _early_id(attempt: int, tries: int, effect_id: str) -> str:
    """The event id of an "absent" answered while the call could still land (``judge``)."""
    return f"resolution:{attempt}:{tries}:early:{effect_id}"


def answered_too_early(resolution: Resolution) -> bool:
    """Whether ``resolution`` is an "absent" given while the call could still land (``judge``
    recorded it as an unknown that used up no try): its event id is exactly that of one."""
    r = resolution
    return r.event_id == _early_id(r.attempt, r.tries, r.effect_id)


def last_resolution(effect: Effect) -> Resolution | None:
    """The latest answer recorded about the effect's current attempt (None: never asked)."""
    tries = [r for r in effect.resolutions if r.attempt == effect.attempt]
    return max(tries, key=lambda r: (r.tries, r.at_ms)) if tries else None


def next_check_ms(effect: Effect, target: Target, now_ms: int) -> int | None:
    """When to ask about an uncertain effect next, by the target's backoff: ``None`` when it was
    never asked about its current attempt (ask now). An effect only the agent can ask (see
    ``only_the_agent_can_ask``) is looked at again when the destination's key retention is over
    (then escalated), or after the longest backoff when the destination never forgets keys."""
    if only_the_agent_can_ask(effect, target, now_ms):
        first = effect.first_intent
        if target.retention_s is not None and first is not None:
            return effect.log_time(first) + int(target.retention_s * 1000) + 1
        return now_ms + target.backoff.delay_ms(target.backoff.max_tries)
    last = last_resolution(effect)
    if last is None:
        return None
    after = effect.log_time(last) + target.backoff.delay_ms(last.tries)
    if answered_too_early(last):  # "absent" while the call could still land: again once it cannot
        return max(after, target.may_still_land_until_ms(attempt_deadline(effect, effect.attempt)))
    return after


def previous_tries(effect: Effect) -> int:
    """How often the destination was asked about the effect's current attempt already."""
    return uncertain_event(effect).tries


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
        until = target.may_still_land_until_ms(effect.deadline_ms) if effect.target else 0
        if now_ms < until:
            # Not a try: asking again before the call can no longer land must not run down the
            # escalation count (``next_check_ms`` asks again once it cannot).
            tries -= 1
            eid = _early_id(attempt, tries, effect.effect_id)
            return res(
                Verdict.UNKNOWN,
                f"absent so far, but the call may still land until {until} (its deadline "
                f"{until - target.lands_within_ms} + lands_within {target.lands_within_s:g} s)",
            )
        return res(Verdict.ABSENT, answer.reason or "not found at the destination")
    if tries >= target.backoff.max_tries:
        return res(Verdict.ESCALATE, f"no answer after {tries} tries: {answer.reason}")
    return res(Verdict.UNKNOWN, answer.reason)

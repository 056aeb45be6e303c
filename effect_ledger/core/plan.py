"""The per-call decision of ``Ledger.execute``, as a pure function: what is known -> what to do.

``plan`` is given what is known about the key (the folded effect and its claim), the time, this
worker's identity and whether the claim's owner still lives, and returns one step; ``after_answer``
decides again once the destination has been asked. Neither reads a clock, a file or the process
table: the executor (``effect_ledger.sdk._executor``) gathers the inputs and carries the steps
out. This is the "what execute does" table of docs/guides/embedded.md, row by row (``tests/unit/core/test_plan.py``):

==========================================  ==================================================
known state                                 plan
==========================================  ==================================================
the same key with another request           ``Refuse(EffectConflict)``
nothing                                     ``Execute(attempt 1)``
``FAILED``, ``ABSENT``                      ``Execute(attempt n+1)``, the same key
``CONFIRMED``                               ``ReturnReceipt``: the recorded receipt, no call
``ESCALATED``                               ``Refuse(EffectUncertain)`` until a person decides
``ABANDONED``, ``COMPENSATED``              ``Refuse(EffectClosed)``
claim held by a live worker (or its lease)  ``Refuse(EffectInProgress)``, retry after the lease
open (PENDING/EXECUTED/UNCERTAIN), owner    ``AskFirst``, then ``after_answer``: found ->
gone                                        ``ReturnReceipt``; absent -> ``Execute(n+1)``; unknown
                                            -> ``Refuse(EffectInProgress)`` when asked before
                                            the old call could no longer land,
                                            ``Refuse(EffectUncertain)`` after
==========================================  ==================================================

Every ``Execute`` names the owner it takes the claim over from (``take_over_from``; None when nobody
holds it), which the intent's write checks, and whether the claim must be confirmed across hosts
before the destination is called (``confirm_claim``: the step between the intent and the call; a
no-op until cross-host claims exist).
"""

from __future__ import annotations

from dataclasses import dataclass

from effect_ledger.core.effect import Effect
from effect_ledger.core.keys import digest
from effect_ledger.core.model import OPEN_STATES, Resolution, State, Verdict
from effect_ledger.errors import (
    EffectClosed,
    EffectConflict,
    EffectInProgress,
    EffectUncertain,
    LedgerError,
)

#: How often a write that finds the effect changed since it was loaded (someone else wrote it) is
#: tried again on what was written, before the call gives up with ``EffectInProgress``.
CONFLICT_RETRIES = 16


@dataclass(frozen=True, slots=True)
class CallSpec:
    """One ``execute`` call, checked: what it asks the destination to do, and its deadline."""

    target: str
    operation: str
    namespace: str
    run_id: str
    step: str
    canonical: str  # the canonical JSON request
    digest: str  # its request digest
    timeout: float  # seconds; the intent's deadline is now + timeout
    stored: str | None = None  # the body as the intent records it (effect_ledger/core/bodies.py); None: canonical

    @property
    def recorded(self) -> str:
        """The request body the intent carries: the target's body policy applied, or as given."""
        return self.canonical if self.stored is None else self.stored


@dataclass(frozen=True, slots=True)
class Known:
    """What the plan is given: the effect (None: nobody used the key) and who holds its claim.

    ``owner_alive`` is the claim owner's liveness (``effect_ledger.sdk._workers.owner_alive``):
    True/False when it can be told, None when only the lease (``claim_until_ms``) can tell."""

    effect: Effect | None
    claim_owner: str | None
    claim_until_ms: int | None
    now_ms: int
    worker: str  # this worker's identity
    owner_alive: bool | None = None
    confirm_claims: bool = False  # claims must be confirmed across hosts before a call


@dataclass(frozen=True, slots=True)
class ReturnReceipt:
    """The effect is CONFIRMED: return its recorded receipt; the destination is not called."""

    effect: Effect


@dataclass(frozen=True, slots=True)
class Refuse:
    """Nothing is written or sent: raise ``error``."""

    error: LedgerError


@dataclass(frozen=True, slots=True)
class AskFirst:
    """An earlier attempt is open and its worker gone: ask the destination (after recording a
    deadline that has passed), then decide with ``after_answer``."""

    effect: Effect
    take_over_from: str | None


@dataclass(frozen=True, slots=True)
class Execute:
    """Write the intent of ``attempt`` (claiming the key from ``take_over_from``), confirm the claim
    when ``confirm_claim``, then call the destination with the key."""

    attempt: int
    take_over_from: str | None
    confirm_claim: bool = False


Plan = ReturnReceipt | Refuse | AskFirst | Execute


def plan(known: Known, spec: CallSpec) -> Plan:
    """What ``execute`` does with what is known about the key, before the destination is touched."""
    effect = known.effect
    if effect is None:
        return Execute(1, None, known.confirm_claims)
    conflict = _conflict(effect, spec)
    if conflict is not None:
        return Refuse(conflict)
    key = effect.effect_id
    if effect.state is State.CONFIRMED:
        return ReturnReceipt(effect)
    if effect.state in (State.ABANDONED, State.COMPENSATED):
        return Refuse(EffectClosed(key, effect.state.value, effect.reason))
    if effect.state is State.ESCALATED:
        return Refuse(EffectUncertain(key, effect.reason or "escalated: a person must decide", effect.state.value))
    # The claim of an earlier attempt: refused while its worker lives, else taken over.
    owner = known.claim_owner
    if owner is not None and owner != known.worker:
        leased = known.claim_until_ms is not None and known.now_ms < known.claim_until_ms
        if known.owner_alive or (known.owner_alive is None and leased):
            retry = max(0, known.claim_until_ms - known.now_ms) if known.claim_until_ms else None
            return Refuse(EffectInProgress(key, f"worker {owner} is executing attempt {effect.attempt}", retry))
    if effect.state in OPEN_STATES:
        return AskFirst(effect, owner)
    # FAILED or ABSENT: nothing happened at the destination; execute with the same key.
    return Execute(effect.attempt + 1, owner, known.confirm_claims)


def after_answer(
    asked: AskFirst, effect: Effect, resolution: Resolution, now_ms: int, confirm_claims: bool, lands_until_ms: int
) -> Plan:
    """What ``execute`` does once the destination was asked about an earlier attempt: ``effect`` as
    recorded after the answer, ``resolution`` the answer as judged, ``lands_until_ms`` until when
    asking again may change an unknown answer: the earlier attempt's deadline, or for an "absent"
    given while its call could still land, the end of that (``Target.may_still_land_until_ms``)."""
    key = effect.effect_id
    if effect.state is State.CONFIRMED:
        return ReturnReceipt(effect)
    if effect.state is State.ABSENT:
        return Execute(effect.attempt + 1, asked.take_over_from, confirm_claims)
    if resolution.verdict is Verdict.UNKNOWN and resolution.at_ms < lands_until_ms:
        # Asked while the earlier call could still be running, or land: ask again then. Judged on
        # when the destination was asked (the answer's time), not on now: an answer that came back
        # after that time still says nothing about it, and one more question settles it.
        return Refuse(EffectInProgress(key, resolution.reason, max(0, lands_until_ms - now_ms)))
    return Refuse(EffectUncertain(key, resolution.reason, effect.state.value))


def _conflict(effect: Effect, spec: CallSpec) -> EffectConflict | None:
    """The same key with another request (or another target or operation) is a conflict."""
    return conflict_with(effect, spec.target, spec.operation, spec.digest, spec.canonical)


def conflict_with(
    effect: Effect, target: str, operation: str, request_digest: str, canonical: str | None = None
) -> EffectConflict | None:
    """Whether a call of ``target``/``operation`` with this request conflicts with what the key was
    first used for: its owning first intent (a lost claim's intent never owns it). Every path that
    could hand a caller a receipt asks this first (the plan, a claim settled by the log), so a
    caller whose request differs from the winner's gets ``EffectConflict``, never another's receipt.
    ``canonical`` names a call of another target or operation by the digest of all three (the
    request's own digest when it is not given)."""
    first = effect.first_intent
    if first is None:
        return None
    same_call = first.target == target and first.operation == operation
    if first.request_digest == request_digest and same_call:
        return None
    given = request_digest
    if not same_call and canonical is not None:
        given = digest(f"{target}\0{operation}\0{canonical}")
    return EffectConflict(effect.effect_id, first.request_digest, given)


__all__ = [
    "CONFLICT_RETRIES",
    "AskFirst",
    "CallSpec",
    "Execute",
    "Known",
    "Plan",
    "Refuse",
    "ReturnReceipt",
    "after_answer",
    "conflict_with",
    "plan",
]

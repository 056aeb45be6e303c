"""A person's decision on an escalated effect, as an engine hands it back (a LangGraph resume value,
a DBOS message): parsed and checked here once, recorded with ``decide``.

The shape (JSON)::

    {"decision": "confirmed" | "absent" | "abandon",   # what the person found out
     "by": "alice",                                     # who decided (required)
     "reason": "seen in the gateway dashboard",         # why (required)
     "receipt_id": "re_0001",                           # confirmed: the destination's id (optional)
     "effect_id": "payments:…"}                         # optional: if given, must be the escalated key

* ``confirmed`` — it happened: recorded CONFIRMED, the call returns the recorded receipt (its value is
  ``None`` when a person confirmed it; ``receipt_id`` is theirs);
* ``absent`` — it did not happen: recorded ABSENT, the call executes again with the same key;
* ``abandon`` — do not do it: recorded ABANDONED, the call raises ``EffectClosed``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from effect_ledger.core.effect import Effect
from effect_ledger.core.model import Decision, DecisionKind
from effect_ledger.errors import InvalidEffect

CHOICES: dict[str, DecisionKind] = {
    "confirmed": DecisionKind.CONFIRMED,
    "absent": DecisionKind.ABSENT,
    "abandon": DecisionKind.ABANDONED,
}
MAX_FIELD = 1000  # by / reason / receipt_id: a name and a sentence, not a document


@dataclass(frozen=True, slots=True)
class PersonDecision:
    kind: DecisionKind
    by: str
    reason: str
    receipt_id: str | None = None
    effect_id: str | None = None


def what_a_person_can_decide() -> dict[str, str]:
    """The choices, as shown to a person in an interrupt or a log line."""
    return {
        "confirmed": "it happened at the destination: record it (give receipt_id if you know it)",
        "absent": "it did not happen: execute it again with the same idempotency key",
        "abandon": "do not do it: the effect is closed and the caller gets EffectClosed",
    }


def escalation(effect: Effect, reason: str) -> dict[str, Any]:
    """What a person is shown about an escalated effect (a LangGraph interrupt's value, a DBOS event):
    ``"effect_ledger": "escalated"``, the effect, why, the choices and the answer's shape (JSON)."""
    intent = effect.first_intent
    return {
        "effect_ledger": "escalated",
        "effect_id": effect.effect_id,
        "attempt": effect.attempt,
        "target": intent.target if intent else effect.effect_id.split(":", 1)[0],
        "operation": intent.operation if intent else None,
        "request": json.loads(intent.request) if intent else None,
        "reason": reason,
        "decide": what_a_person_can_decide(),
        "answer": {
            "decision": "confirmed | absent | abandon",
            "by": "who",
            "reason": "why",
            "receipt_id": "the destination's id (confirmed only, optional)",
        },
    }


def parse_decision(value: Any) -> PersonDecision:
    """Check a decision handed back by an engine; ``InvalidEffect`` says what is wrong."""
    if not isinstance(value, Mapping):
        raise InvalidEffect(f"a decision is a mapping with decision, by and reason, not {type(value).__name__}")
    unknown = set(value) - {"decision", "by", "reason", "receipt_id", "effect_id"}
    if unknown:
        raise InvalidEffect(f"a decision has no field(s) {', '.join(sorted(map(str, unknown)))}")
    choice = value.get("decision")
    kind = CHOICES.get(choice.lower()) if isinstance(choice, str) else None
    if kind is None:
        raise InvalidEffect(f"decision must be one of {', '.join(CHOICES)}, not {choice!r}")
    fields: dict[str, str | None] = {}
    for name in ("by", "reason", "receipt_id", "effect_id"):
        v = value.get(name)
        if v is not None and (not isinstance(v, str) or not v.strip() or len(v) > MAX_FIELD):
            raise InvalidEffect(f"decision field {name!r} must be a non-empty string of at most {MAX_FIELD} characters")
        fields[name] = v
    if not fields["by"] or not fields["reason"]:
        raise InvalidEffect("a decision needs who made it (by) and why (reason)")
    if fields["receipt_id"] is not None and kind is not DecisionKind.CONFIRMED:
        raise InvalidEffect("receipt_id goes only with decision 'confirmed'")
    return PersonDecision(kind, fields["by"] or "", fields["reason"] or "", fields["receipt_id"], fields["effect_id"])


def already_applied(effect: Effect, decision: PersonDecision) -> bool:
    """True when this very decision was recorded on an earlier attempt of the effect: an engine that
    hands the same answer back again (a LangGraph resume value outlives a failed node run) must not
    decide a new escalation with an answer given for an old one."""
    given = (decision.kind, decision.by, decision.reason, decision.receipt_id)
    return any(
        isinstance(f, Decision) and f.attempt < effect.attempt and (f.decision, f.by, f.reason, f.receipt_id) == given
        for f in effect.facts
    )

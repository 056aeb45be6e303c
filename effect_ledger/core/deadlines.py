"""Deadlines, computed in one place: when an attempt's call must stop, the latest such deadline
of an attempt, and until when a call cut off at its deadline may still land at the destination.

Pure: every time is an argument (epoch milliseconds). The fold (``core.effect``), the per-call
plan and its executor, reconciliation verdicts (``core.reconcile``) and people's decisions all ask
these functions, so the rule for "may it still land?" is written once.
"""

from __future__ import annotations

from collections.abc import Iterable

from effect_ledger.core.model import Intent

#: How long after an attempt's call deadline a person may first declare it ABSENT, and a target's
#: default ``lands_within_s``: a call cut off at its deadline can still be on its way.
DECISION_GRACE_MS = 2_000


def call_deadline_ms(start_ms: int, timeout_s: float) -> int:
    """The deadline of a call started at ``start_ms`` that may run ``timeout_s`` seconds."""
    return start_ms + int(timeout_s * 1000)


def attempt_deadlines(facts: Iterable[object]) -> dict[int, int]:
    """The call deadline of every attempt with a known intent: the latest among its intents (a lost
    claim's intent may carry a later one)."""
    out: dict[int, int] = {}
    for f in facts:
        if isinstance(f, Intent):
            out[f.attempt] = max(f.deadline_ms, out.get(f.attempt, f.deadline_ms))
    return out


def attempt_deadline_ms(facts: Iterable[object], attempt: int) -> int | None:
    """The call deadline of ``attempt`` (see ``attempt_deadlines``); None when no intent of it is known."""
    return max((f.deadline_ms for f in facts if isinstance(f, Intent) and f.attempt == attempt), default=None)


def may_still_land_until_ms(deadline_ms: int | None, lands_within_ms: int) -> int:
    """Until when a call with this deadline may still take effect at the destination: the deadline
    plus ``lands_within_ms`` (0 for no known deadline)."""
    return deadline_ms + lands_within_ms if deadline_ms else 0


__all__ = [
    "DECISION_GRACE_MS", "call_deadline_ms", "attempt_deadlines", "attempt_deadline_ms", "may_still_land_until_ms",
]  # fmt: skip

"""Deadlines, computed in one place, on the log's time.

A writer's clock is a claim it makes about itself: every event keeps its writer's ``at_ms`` as
data, and nothing compares one writer's time with another's. A deadline travels as a *duration*
(an intent's ``deadline_ms - at_ms``: both from the same clock, so that clock's offset cancels)
and starts at the point the log fixed for the intent: its log time (``log_of``), the broker's
append time in Kafka mode, the ledger file's one clock in embedded mode (where the two agree).

Pure: every time is an argument (epoch milliseconds); ``log_of(fact)`` is supplied by the fold
(``core.effect.log_time``). The fold, the per-call plan and its executor, reconciliation verdicts
and people's decisions all ask these functions, so "may the call still land?" is written once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from effect_ledger.core.model import Executed, Intent

#: How long after an attempt's call deadline a person may first declare it ABSENT, and a target's
#: default ``lands_within_s``: a call cut off at its deadline can still be on its way.
DECISION_GRACE_MS = 2_000

#: The longest duration a deadline may claim (an intent's timeout, a receipt's wait): a week. A
#: longer or negative one from a writer is clamped, so no writer can push a deadline out of reach.
MAX_DURATION_MS = 7 * 86_400_000

#: How far ahead of the log's time a writer's clock may claim to be before the fold flags the fact
#: (CLOCK_SKEW) and refuses its time-dependent claims (an ABSENT decision or answer): a record cannot
#: reach the log before it was written, so a claim that far ahead is a clock that runs ahead. An
#: ABSENT counts from the earlier of its writer's claim and its log time, so a clock within this bound
#: can bring it forward by at most this much; NTP keeps hosts within milliseconds. A clock that runs
#: behind looks like a record that reached the log late, and is harmless: every deadline counts from
#: the log's time, and an ABSENT from it counts later, never earlier.
MAX_CLOCK_AHEAD_MS = 5_000

LogOf = Callable[[Any], int]  # a fact -> when the log took it


def _at(fact: Any) -> int:
    return fact.at_ms  # type: ignore[no-any-return]


def call_deadline_ms(start_ms: int, timeout_s: float) -> int:
    """The deadline of a call started at ``start_ms`` that may run ``timeout_s`` seconds."""
    return start_ms + int(timeout_s * 1000)


def duration_ms(start_ms: int, end_ms: int) -> int:
    """A writer's claimed duration (two times from its one clock), clamped to [0, MAX_DURATION_MS]."""
    return min(max(end_ms - start_ms, 0), MAX_DURATION_MS)


def intent_deadline_ms(intent: Intent, log_of: LogOf = _at) -> int:
    """When an intent's call must have stopped, on the log's time: its log time plus its timeout."""
    return log_of(intent) + duration_ms(intent.at_ms, intent.deadline_ms)


def receipt_deadline_ms(executed: Executed, log_of: LogOf = _at) -> int | None:
    """When an OK call's missing receipt makes the effect uncertain, on the log's time (None: the
    intent's deadline applies)."""
    if executed.receipt_deadline_ms is None:
        return None
    return log_of(executed) + duration_ms(executed.at_ms, executed.receipt_deadline_ms)


def lands_within_of(intent: Intent) -> int:
    """How long after its deadline an intent's call may still land: what it carries (the target's
    ``lands_within``), else ``DECISION_GRACE_MS`` (an older writer's intent), clamped like a duration."""
    ms = intent.lands_within_ms
    return DECISION_GRACE_MS if ms is None else min(max(ms, 0), MAX_DURATION_MS)


def attempt_windows(facts: Iterable[object], log_of: LogOf = _at) -> dict[int, int]:
    """Until when each attempt's call may still land, on the log's time: the latest, among its
    intents, of the deadline plus ``lands_within``. No ABSENT counts before then."""
    out: dict[int, int] = {}
    for f in facts:
        if isinstance(f, Intent):
            until = intent_deadline_ms(f, log_of) + lands_within_of(f)
            out[f.attempt] = max(until, out.get(f.attempt, until))
    return out


def attempt_deadline_ms(facts: Iterable[object], attempt: int, log_of: LogOf = _at) -> int | None:
    """The call deadline of ``attempt``: the latest among its intents (a lost claim's intent may carry a
    later one), on the log's time; None when no intent of it is known."""
    return max(
        (intent_deadline_ms(f, log_of) for f in facts if isinstance(f, Intent) and f.attempt == attempt), default=None
    )


def may_still_land_until_ms(deadline_ms: int | None, lands_within_ms: int) -> int:
    """Until when a call with this deadline may still take effect at the destination: the deadline
    plus ``lands_within_ms`` (0 for no known deadline)."""
    return deadline_ms + lands_within_ms if deadline_ms else 0


__all__ = [
    "DECISION_GRACE_MS", "MAX_DURATION_MS", "MAX_CLOCK_AHEAD_MS", "call_deadline_ms", "duration_ms",
    "intent_deadline_ms",
    "receipt_deadline_ms", "attempt_deadline_ms", "may_still_land_until_ms", "lands_within_of",
    "attempt_windows",
]  # fmt: skip

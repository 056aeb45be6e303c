"""The notable changes of an effect, counted and said the same way by every process that folds
effects: the Kafka worker (per folded event), the embedded ledger file (per write, in the SDK and in
``effects run``).

* **uncertain**: the effect entered UNCERTAIN, whatever the way: its deadline passed (``cause`` =
  ``deadline``), the call's outcome was unknown to the agent (``unknown_outcome``: a timeout, a
  transport error), or anything else that leaves it UNCERTAIN (``other``: for example a decision
  or a claim verdict). A reconciler's "unknown" answer keeps an effect UNCERTAIN: not counted again.
* **escalated**: the effect entered ESCALATED (a person must decide).
* **duplicate**: the ledger holds evidence that the destination executed one key twice: a second
  *successful* Executed record (``kind`` = ``execution``: two attempts both returned ok) or a second
  distinct receipt id (``receipt``). These are the fold's ``DUPLICATE_EXECUTION`` and
  ``DUPLICATE_RECEIPT`` flags, which are also what ``effects audit`` counts as
  ``duplicate_executions``; each is counted once per effect, when it is first raised.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from effect_ledger.core.effect import Effect
from effect_ledger.core.model import Event, Executed, Flag, Outcome, State, Timeout

_DUPLICATES = {Flag.DUPLICATE_EXECUTION: "execution", Flag.DUPLICATE_RECEIPT: "receipt"}


@dataclass(frozen=True, slots=True)
class Change:
    kind: str  # "uncertain", "escalated" or "duplicate"
    effect_id: str
    target: str
    operation: str
    detail: str  # uncertain: the cause; duplicate: execution or receipt; escalated: the reason


def _cause(events: Sequence[Event]) -> str:
    if any(isinstance(e, Timeout) for e in events):
        return "deadline"
    if any(isinstance(e, Executed) and e.outcome is Outcome.UNKNOWN for e in events):
        return "unknown_outcome"
    return "other"


def changes(before: Effect | None, after: Effect, events: Sequence[Event]) -> list[Change]:
    """The notable changes from ``before`` to ``after`` caused by ``events`` (pure)."""
    target = after.intent.target if after.intent else ""
    operation = after.intent.operation if after.intent else ""
    was = before.state if before is not None else None
    out: list[Change] = []
    if after.state is State.UNCERTAIN and was is not State.UNCERTAIN:
        out.append(Change("uncertain", after.effect_id, target, operation, _cause(events)))
    if after.state is State.ESCALATED and was is not State.ESCALATED:
        reason = after.resolutions[-1].reason if after.resolutions else ""
        out.append(Change("escalated", after.effect_id, target, operation, reason[:200]))
    had = set(before.flags) if before is not None else set()
    for flag, kind in _DUPLICATES.items():
        if flag in after.flags and flag not in had:
            out.append(Change("duplicate", after.effect_id, target, operation, kind))
    return out


_SAID = {
    "uncertain": ("effect %s made UNCERTAIN (%s)", logging.INFO),
    "escalated": ("effect %s ESCALATED to a person (%s)", logging.WARNING),
    "duplicate": ("effect %s was executed twice at the destination (duplicate %s)", logging.ERROR),
}


class EffectWatch:
    """Counts each change on ``metrics`` (a ``LedgerMetrics``, or None), says it on ``log`` (None:
    silent) and adds it to ``summary``; call it with (before, after, events) after each change."""

    def __init__(self, metrics: Any = None, log: logging.Logger | None = None, summary: Any = None) -> None:
        self.metrics = metrics
        self.log = log
        self.summary = summary

    def __call__(self, before: Effect | None, after: Effect, events: Sequence[Event]) -> None:
        if before is not None and before.state is after.state and before.flags == after.flags:
            return  # the common case (a receipt after its call, a replayed event): nothing to say
        for c in changes(before, after, events):
            m = self.metrics
            if m is not None:
                if c.kind == "uncertain":
                    m.uncertain.labels(target=c.target, cause=c.detail).inc()
                elif c.kind == "escalated":
                    m.escalated.labels(target=c.target).inc()
                else:
                    m.duplicate_executions.labels(target=c.target, kind=c.detail).inc()
            if self.summary is not None:
                self.summary.count(c.kind)
            if self.log is not None:
                text, level = _SAID[c.kind]
                self.log.log(
                    level, text, c.effect_id, c.detail or "no reason given",
                    extra={"event": c.kind, "effect_id": c.effect_id, "target": c.target,
                           "operation": c.operation, "detail": c.detail},
                )  # fmt: skip

"""Retiring closed effects: the rule, decided purely (no I/O; time is an argument).

Retention is off unless someone runs it (``effects retire --older-than 30d``, from cron or a systemd
timer): nothing is deleted by default. An effect is *due* for retirement when

* its state is closed (``RETIRABLE_STATES``: CONFIRMED, FAILED, ABSENT, ABANDONED, COMPENSATED;
  never PENDING, EXECUTED, UNCERTAIN or ESCALATED: an open or held effect is never retired), and
* nothing has happened to it for at least the retention period (``updated_ms + after_ms <= now``).

Retiring an effect deletes its events (request bodies included) and its state row, and leaves a
small *retired marker*: the key, its last state, its request digest, its receipt id and when it was
retired. Every reader honours the marker the same way:

* the embedded ledger (the SQLite file) keeps it in a ``retired`` table, and the file refuses to
  create the key again (a trigger), whoever writes;
* the ledger processor keeps it as the key's table value; its lookup answers ``410`` ("retired")
  and an event for the key is dead-lettered, never folded;
* ``effects.state`` gets a tombstone (null value) for the key: the SQL sink deletes its row and a
  compacted-table subscriber drops the key.

A later ``execute`` with a retired key raises ``EffectRetired`` and never calls the destination,
whatever the last state was (even FAILED or ABSENT, where a retry would have been safe): the ledger
no longer holds the facts that made it safe, and the destination may have forgotten the key
(its own key retention). A retired key is done for good; a new write needs a new key. The markers
are what is kept for ever: about 200 bytes per retired key.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from effect_ledger.core.effect import Effect
from effect_ledger.core.model import State

#: States an effect may be retired in: closed, nothing left to wait for.
RETIRABLE_STATES = frozenset({State.CONFIRMED, State.FAILED, State.ABSENT, State.ABANDONED, State.COMPENSATED})

#: The shortest retention ``effects retire`` accepts unless told otherwise: under it a late receipt
#: (a webhook), a reconciler's answer or an agent's retry may still arrive for the key.
MIN_RETENTION_MS = 24 * 3600 * 1000


@dataclass(frozen=True, slots=True)
class Retired:
    """What is remembered of a retired key."""

    effect_id: str
    state: str
    request_digest: str
    receipt_id: str | None
    updated_ms: int
    retired_ms: int

    @classmethod
    def of(cls, effect: Effect, retired_ms: int) -> Retired:
        """The marker of ``effect``, retired at ``retired_ms``: the same in a ledger file and in the
        processor's table."""
        return cls(
            effect_id=effect.effect_id,
            state=effect.state.value,
            request_digest=effect.first_intent.request_digest if effect.first_intent else "",
            receipt_id=effect.receipt.receipt_id if effect.receipt else None,
            updated_ms=effect.updated_ms,
            retired_ms=retired_ms,
        )

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | bytes) -> Retired:
        d = json.loads(text)
        return cls(
            effect_id=str(d["effect_id"]),
            state=str(d["state"]),
            request_digest=str(d["request_digest"]),
            receipt_id=None if d.get("receipt_id") is None else str(d["receipt_id"]),
            updated_ms=int(d["updated_ms"]),
            retired_ms=int(d["retired_ms"]),
        )


def due(state: State | str, updated_ms: int, now_ms: int, after_ms: int) -> bool:
    """Whether an effect in ``state``, last changed at ``updated_ms``, is due for retirement at
    ``now_ms`` under a retention of ``after_ms``."""
    try:
        s = State(state)
    except ValueError:
        return False  # a state this version does not know is never retired
    return s in RETIRABLE_STATES and updated_ms + after_ms <= now_ms


def why_not(
    state: State | str, updated_ms: int, version: int, now_ms: int, after_ms: int, seen_version: int
) -> str | None:
    """Why a retirement command must not be applied to the effect as it stands now (None: apply
    it). The processor asks this when the command arrives: the effect may have changed (a new
    attempt, a late receipt) since the sweep that wrote the command saw it."""
    if version != seen_version:
        return f"changed since the sweep (version {version}, the sweep saw {seen_version})"
    if not due(state, updated_ms, now_ms, after_ms):
        return f"not due: {state}, last changed at {updated_ms}"
    return None


__all__ = ["RETIRABLE_STATES", "MIN_RETENTION_MS", "Retired", "due", "why_not"]

"""Retirement in the ledger file (embedded mode, and an agent's outbox in Kafka mode).

``retire`` deletes the events and the state row of closed effects past the retention period and
keeps a marker per key in the ``retired`` table (``effect_ledger.core.retention`` has the rule).
A trigger keeps a retired key from being created again, whoever writes (an ``execute``, a receipt
with ``allow_unknown``, events imported from the processor): the effect row's insert is ignored,
which every writer already reads as "someone else was first", and the SDK then finds the marker
(``retired``) and raises ``EffectRetired``.

Deleted rows are overwritten (``secure_delete``) and the WAL is truncated afterwards, so a request
body does not linger in free pages or in the log. Two cases are left for a later run: an effect
with an event not yet acknowledged by Kafka (an outbox row, ``require_sent``), and an effect that
holds the file's newest event (SQLite would give a deleted last row's seq to the next event, and
the relay's acknowledgement watermark would then count that new event as sent).
"""

from __future__ import annotations

import sqlite3
from typing import TYPE_CHECKING

from effect_ledger.core.effect import Effect, apply
from effect_ledger.core.retention import RETIRABLE_STATES, Retired, due

if TYPE_CHECKING:
    from effect_ledger.sdk.store.sqlite import Store

MAX_PER_RUN = 10_000  # effects retired per transaction; run again for more


async def retired(store: Store, effect_id: str) -> Retired | None:
    """The marker of a retired key, or None."""
    rows = await store.query(
        "SELECT effect_id, state, request_digest, receipt_id, updated_ms, retired_ms FROM retired WHERE effect_id = ?",
        (effect_id,),
    )
    return Retired(**rows[0]) if rows else None


async def has_relayed(store: Store) -> bool:
    """Whether the file has ever handed an event to Kafka (it is an outbox, not an embedded ledger)."""
    return bool(await store.query("SELECT 1 AS x FROM events WHERE sent != 0 LIMIT 1"))


async def retire(
    store: Store, now_ms: int, after_ms: int, *, require_sent: bool, limit: int = MAX_PER_RUN
) -> list[Retired]:
    """Retire the closed effects due at ``now_ms`` under a retention of ``after_ms``, in one
    transaction; returns their markers. ``require_sent``: the file is a Kafka outbox, so an effect
    with an event Kafka has not acknowledged is kept (for a later run)."""
    if after_ms < 0:
        raise ValueError("the retention period cannot be negative")

    # Deleted bodies are overwritten on disk and leave the WAL too (Store.purge).
    return await store.purge(  # type: ignore[no-any-return]
        lambda conn: _retire(store, conn, now_ms, after_ms, require_sent, limit)
    )


def _retire(
    store: Store, conn: sqlite3.Connection, now_ms: int, after_ms: int, require_sent: bool, limit: int
) -> list[Retired]:
    states = sorted(s.value for s in RETIRABLE_STATES)
    marks = ",".join("?" * len(states))
    last_seq = conn.execute("SELECT max(seq) FROM events").fetchone()[0]
    rows = conn.execute(
        f"SELECT effect_id FROM effects WHERE state IN ({marks}) AND updated_ms <= ? "
        "AND (claim_owner IS NULL OR claim_until_ms < ?) ORDER BY updated_ms LIMIT ?",
        (*states, now_ms - after_ms, now_ms, limit),
    ).fetchall()
    done: list[Retired] = []
    for (effect_id,) in rows:
        events = conn.execute(
            "SELECT seq, body, sent FROM events WHERE effect_id = ? ORDER BY seq", (effect_id,)
        ).fetchall()
        if not events or events[-1][0] == last_seq:
            continue
        if require_sent and any(sent == 0 for _, _, sent in events):
            continue
        effect: Effect | None = None
        for _, body, _ in events:
            effect, _ = apply(effect, store.codec.decode(body))
        # The row is a projection; decide on the facts themselves.
        if effect is None or not due(effect.state, effect.updated_ms, now_ms, after_ms):
            continue
        marker = Retired.of(effect, now_ms)
        conn.execute(
            "INSERT OR REPLACE INTO retired (effect_id, state, request_digest, receipt_id, updated_ms, retired_ms) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            (marker.effect_id, marker.state, marker.request_digest, marker.receipt_id, marker.updated_ms,
             marker.retired_ms),
        )  # fmt: skip
        conn.execute("DELETE FROM dead_letters WHERE seq IN (SELECT seq FROM events WHERE effect_id = ?)", (effect_id,))
        conn.execute("DELETE FROM events WHERE effect_id = ?", (effect_id,))
        conn.execute("DELETE FROM effects WHERE effect_id = ?", (effect_id,))
        done.append(marker)
    return done


__all__ = ["MAX_PER_RUN", "retired", "retire", "has_relayed"]

"""The tables of a ledger file, the one builder of an effect row, and the reads every user of the
file shares: the store (``Store``), the read-only reader (``LedgerReader``), the embedded runner
and the ops views. SQL about the ``effects`` table lives here and nowhere else.

Indexes exist only where a query needs them, since every index is pages written per effect:

* ``events_by_effect``: loading one effect's events (every call on a known key);
* ``events_unsent``: the outbox (the relay); a partial index, so sent rows leave it;
* ``effects_unsettled``: due deadlines, due checks, stuck and escalated effects; a partial index
  over the unsettled states only, so a settled effect (nearly all of them) has no entry. SQLite
  uses a partial index only for a query whose WHERE repeats the index's condition word for word:
  every such query below adds ``UNSETTLED``.
"""

from __future__ import annotations

import sqlite3
from typing import Any, NamedTuple

from effect_ledger.core.effect import Effect, state_version
from effect_ledger.core.model import IN_FLIGHT_STATES, OPEN_STATES, UNSETTLED_STATES, EffectState, State


def _sql_set(states: frozenset[State]) -> str:
    return "(" + ", ".join(f"'{s.value}'" for s in sorted(states)) + ")"


#: The condition of the partial index ``effects_unsettled`` (see the module docstring).
UNSETTLED = f"state IN {_sql_set(UNSETTLED_STATES)}"
_IN_FLIGHT = f"state IN {_sql_set(IN_FLIGHT_STATES)}"
_OPEN = f"state IN {_sql_set(OPEN_STATES)}"

SCHEMA = f"""
CREATE TABLE IF NOT EXISTS events (
    seq         INTEGER PRIMARY KEY,    -- rowid: never reused, rows are never deleted
    event_id    TEXT NOT NULL,          -- unique per effect: the fold admits an event id once
    effect_id   TEXT NOT NULL,
    kind        TEXT NOT NULL,
    at_ms       INTEGER NOT NULL,
    body        BLOB NOT NULL,          -- Avro single-object encoding: the bytes the relay sends
    sent        INTEGER NOT NULL DEFAULT 0  -- 0 not yet on Kafka, 1 acknowledged, 2 dead-lettered
);
CREATE INDEX IF NOT EXISTS events_by_effect ON events(effect_id, seq);
CREATE INDEX IF NOT EXISTS events_unsent ON events(seq) WHERE sent = 0;
CREATE TABLE IF NOT EXISTS effects (
    effect_id       TEXT PRIMARY KEY,
    state           TEXT NOT NULL,
    target          TEXT NOT NULL,
    operation       TEXT NOT NULL,
    namespace       TEXT NOT NULL,
    run_id          TEXT NOT NULL,
    step            TEXT NOT NULL,
    attempt         INTEGER NOT NULL,
    version         INTEGER NOT NULL,
    deadline_ms     INTEGER,
    created_ms      INTEGER NOT NULL,
    updated_ms      INTEGER NOT NULL,
    receipt_id      TEXT,
    executions      INTEGER NOT NULL,
    flags           TEXT NOT NULL,
    reason          TEXT,
    claim_owner     TEXT,               -- the worker executing the current attempt
    claim_until_ms  INTEGER,
    check_tries     INTEGER NOT NULL DEFAULT 0,   -- reconciler backoff (operational, not folded)
    next_check_ms   INTEGER
);
-- Files written before this index existed had two full indexes instead (by state, by deadline).
DROP INDEX IF EXISTS effects_by_state;
DROP INDEX IF EXISTS effects_by_deadline;
CREATE INDEX IF NOT EXISTS effects_unsettled ON effects(state, deadline_ms) WHERE {UNSETTLED};
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
INSERT OR IGNORE INTO meta(key, value) VALUES ('schema_version', '1');
-- Rows Kafka refused for good (too large, invalid, refused by its ACLs): the relay marked them
-- sent = 2 and went on.
CREATE TABLE IF NOT EXISTS dead_letters (
    seq     INTEGER PRIMARY KEY,        -- the events row
    at_ms   INTEGER NOT NULL,
    reason  TEXT NOT NULL
);
-- Retired effects (``sdk/store/retire.py``): what is kept of a closed effect once its events are gone.
CREATE TABLE IF NOT EXISTS retired (
    effect_id       TEXT PRIMARY KEY,
    state           TEXT NOT NULL,
    request_digest  TEXT NOT NULL,
    receipt_id      TEXT,
    updated_ms      INTEGER NOT NULL,
    retired_ms      INTEGER NOT NULL
);
-- A retired key is never created again: the insert is ignored, as if someone else had been first.
CREATE TRIGGER IF NOT EXISTS retired_keys_stay_retired BEFORE INSERT ON effects
WHEN EXISTS (SELECT 1 FROM retired WHERE effect_id = NEW.effect_id)
BEGIN SELECT RAISE(IGNORE); END;
-- The keys of erasable request bodies (``sdk/erasure.py``); erasing a subject deletes its rows.
CREATE TABLE IF NOT EXISTS erasure_keys (
    kid             TEXT PRIMARY KEY,   -- random: names the key in sealed bodies, says nothing of the subject
    subject_digest  TEXT NOT NULL,      -- sha256 of the subject, to find its keys when it is erased
    key             BLOB NOT NULL,      -- AES-256 key
    created_ms      INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS erasure_keys_by_subject ON erasure_keys(subject_digest);
"""

#: The tables every effect-ledger file has: a file with other tables and not these is not ours.
LEDGER_TABLES = frozenset({"events", "effects", "meta"})

#: The columns of an effect row, in the order of the table (the sink's table has the same ones).
ROW_COLUMNS = (
    "effect_id", "state", "target", "operation", "namespace", "run_id", "step", "attempt", "version",
    "created_ms", "updated_ms", "deadline_ms", "receipt_id", "executions", "flags", "reason",
)  # fmt: skip


def state_row(st: EffectState) -> dict[str, Any]:
    """One row of an ``effects`` table for a state record: the one builder of an effect row, used by
    the ledger file (``effect_row``) and the ops sink's tables alike."""
    return {
        "effect_id": st.effect_id,
        "state": st.state.value,
        "target": st.target,
        "operation": st.operation,
        "namespace": st.namespace,
        "run_id": st.run_id,
        "step": st.step,
        "attempt": st.attempt,
        "version": st.version,
        "created_ms": st.created_ms,
        "updated_ms": st.updated_ms,
        "deadline_ms": st.deadline_ms,
        "receipt_id": st.receipt_id,
        "executions": st.executions,
        "flags": ",".join(st.flags),
        "reason": st.reason,
    }


def effect_row(effect: Effect) -> dict[str, Any]:
    """The ``effects`` row of a folded effect: its state record's row, ``state_row(to_state(effect))``
    (``tests/unit/core/test_effect_properties.py`` checks that), built without the state record on the
    SDK's hot path."""
    i = effect.first_intent
    receipt = effect.receipt
    return {
        "effect_id": effect.effect_id,
        "state": effect.state.value,
        "target": i.target if i else "",
        "operation": i.operation if i else "",
        "namespace": i.namespace if i else "",
        "run_id": i.run_id if i else "",
        "step": i.step if i else "",
        "attempt": effect.attempt,
        "version": state_version(effect),
        "created_ms": effect.created_ms,
        "updated_ms": effect.updated_ms,
        "deadline_ms": effect.deadline_ms,
        "receipt_id": receipt.receipt_id if receipt else None,
        "executions": effect.executions,
        "flags": ",".join([f.value for f in effect.flags]),
        "reason": effect.reason,
    }


class Due(NamedTuple):
    effect_id: str
    at_ms: int  # the deadline (due deadlines), or the tries so far (due checks)


def due_deadlines(conn: sqlite3.Connection, cutoff_ms: int, limit: int) -> list[Due]:
    """Attempts still waiting for their call or receipt (PENDING, EXECUTED) whose deadline is at or
    before ``cutoff_ms``, earliest first: (effect_id, deadline_ms)."""
    found = conn.execute(
        f"SELECT effect_id, deadline_ms FROM effects WHERE {UNSETTLED} AND {_IN_FLIGHT} AND deadline_ms <= ? "
        "ORDER BY deadline_ms LIMIT ?",
        (cutoff_ms, limit),
    ).fetchall()
    return [Due(*r) for r in found]


def due_checks(conn: sqlite3.Connection, now_ms: int, limit: int) -> list[Due]:
    """UNCERTAIN effects whose reconciler backoff has elapsed at ``now_ms``, longest unchanged
    first: (effect_id, check_tries)."""
    found = conn.execute(
        f"SELECT effect_id, check_tries FROM effects WHERE {UNSETTLED} AND state = 'UNCERTAIN' "
        "AND (next_check_ms IS NULL OR next_check_ms <= ?) ORDER BY updated_ms LIMIT ?",
        (now_ms, limit),
    ).fetchall()
    return [Due(*r) for r in found]


def set_aside(conn: sqlite3.Connection) -> list[Any]:
    """The outbox rows the relay set aside (Kafka refused them for good), oldest first: seq,
    effect_id, kind, size, at_ms, reason."""
    return rows(
        conn,
        "SELECT d.seq, e.effect_id, e.kind, length(e.body) AS size, d.at_ms, d.reason"
        " FROM dead_letters d JOIN events e ON e.seq = d.seq ORDER BY d.seq",
    )


def unsettled(conn: sqlite3.Connection, created_before_ms: int | None = None) -> list[sqlite3.Row]:
    """Effects in an unsettled state (open, or escalated to a person), created before
    ``created_before_ms`` (None: all), oldest first. Rows carry the table's columns by name."""
    cutoff = "" if created_before_ms is None else " AND created_ms < ?"
    return rows(
        conn,
        f"SELECT * FROM effects WHERE {UNSETTLED}{cutoff} ORDER BY created_ms",
        () if created_before_ms is None else (created_before_ms,),
    )


def in_state(conn: sqlite3.Connection, state: State) -> list[sqlite3.Row]:
    """Effects in ``state`` (an unsettled one: the index covers no other), oldest first."""
    if state not in UNSETTLED_STATES:
        raise ValueError(f"{state.value} is a settled state: list those with a query of your own")
    return rows(conn, f"SELECT * FROM effects WHERE {UNSETTLED} AND state = ? ORDER BY created_ms", (state.value,))


def created_between(conn: sqlite3.Connection, from_ms: int, to_ms: int) -> list[sqlite3.Row]:
    """Effects created in [``from_ms``, ``to_ms``), newest first (a scan: a console's window)."""
    return rows(
        conn,
        "SELECT * FROM effects WHERE created_ms >= ? AND created_ms < ? ORDER BY created_ms DESC",
        (from_ms, to_ms),
    )


def intents_created_between(conn: sqlite3.Connection, from_ms: int, to_ms: int) -> list[sqlite3.Row]:
    """The intent events (effect_id, body) of the effects created in [``from_ms``, ``to_ms``), in
    the order written: what the console's search by request field reads."""
    return rows(
        conn,
        "SELECT effect_id, body FROM events WHERE kind = 'Intent' AND effect_id IN "
        "(SELECT effect_id FROM effects WHERE created_ms >= ? AND created_ms < ?) ORDER BY seq",
        (from_ms, to_ms),
    )


def same_run(conn: sqlite3.Connection, namespace: str, run_id: str, limit: int) -> list[sqlite3.Row]:
    """The effects of one run, oldest first, at most ``limit``."""
    return rows(
        conn,
        "SELECT * FROM effects WHERE namespace = ? AND run_id = ? ORDER BY created_ms, effect_id LIMIT ?",
        (namespace, run_id, limit),
    )


def counts(conn: sqlite3.Connection) -> list[tuple[str, str, int]]:
    """(state, target, effects) for every pair present: one pass over the table."""
    return conn.execute("SELECT state, target, COUNT(*) FROM effects GROUP BY state, target").fetchall()


def oldest_due_ms(conn: sqlite3.Connection) -> int | None:
    """When the most overdue open effect fell due: an UNCERTAIN one's next check (else its last
    change), a PENDING or EXECUTED one's deadline. None when nothing is open."""
    row = conn.execute(
        "SELECT MIN(CASE WHEN state = 'UNCERTAIN' THEN COALESCE(next_check_ms, updated_ms) ELSE deadline_ms END) "
        f"FROM effects WHERE {UNSETTLED} AND {_OPEN}"
    ).fetchone()
    return row[0] if row else None


def rows(conn: sqlite3.Connection, sql: str, params: tuple[Any, ...] = ()) -> list[Any]:
    """The rows of a query: ``sqlite3.Row`` on a connection that makes them, else dicts by column."""
    cur = conn.execute(sql, params)
    if conn.row_factory is sqlite3.Row:
        return cur.fetchall()
    cols = [d[0] for d in cur.description or ()]
    return [dict(zip(cols, r, strict=True)) for r in cur.fetchall()]  # type: ignore[misc]

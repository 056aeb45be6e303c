"""The SQLite file behind a ledger: the event log (and Kafka outbox) plus the folded effects table.

Durable-write order, in the one function that writes (``_append``), inside one transaction:

1. the conditional upsert of the effect row — it succeeds only if the row still has the version
   the caller folded from (optimistic concurrency across tasks and processes), and it carries the
   claim of the key, so claiming is one SQL statement, never a read-then-write;
2. the new events, with ``sent = 0`` (the relay marks them sent only after the broker's ack);
3. COMMIT — with ``synchronous=NORMAL`` it survives a killed process, with ``FULL`` power loss.

The effect row is a projection of the events (``effect_ledger.streams.effect``); the events are the truth.

Errors: every database error leaves this module as ``StorageError`` (its ``__cause__`` the
sqlite3 error), translated in one place (``Store._call``; ``Store.open`` for opening). A file that
is not an effect-ledger file is refused without being written to (``_refuse_foreign``).
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any, NamedTuple

import aiosqlite

from effect_ledger.streams import erasure, retire_store
from effect_ledger.streams.codec import Codec, default_codec
from effect_ledger.streams.effect import Effect, apply
from effect_ledger.streams.errors import LedgerClosed, StorageError
from effect_ledger.streams.model import Event, State, UncertainEffect


class Durability(StrEnum):
    """SQLite ``synchronous`` level. NORMAL: a committed write survives a killed process (not a power
    loss). FULL: it survives power loss too (an fsync per commit)."""

    NORMAL = "NORMAL"
    FULL = "FULL"


SCHEMA = """
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
CREATE INDEX IF NOT EXISTS effects_by_state ON effects(state, updated_ms);
CREATE INDEX IF NOT EXISTS effects_by_deadline ON effects(deadline_ms) WHERE deadline_ms IS NOT NULL;
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
INSERT OR IGNORE INTO meta(key, value) VALUES ('schema_version', '1');
-- Rows Kafka refused for good (too large, invalid): the relay marked them sent = 2 and went on.
CREATE TABLE IF NOT EXISTS dead_letters (
    seq     INTEGER PRIMARY KEY,        -- the events row
    at_ms   INTEGER NOT NULL,
    reason  TEXT NOT NULL
);
"""

# The tables every effect-ledger file has: a file with other tables and not these is not ours.
_LEDGER_TABLES = frozenset({"events", "effects", "meta"})
_SQLITE_MAGIC = b"SQLite format 3\x00"

# A key nobody has used: a plain insert (OR IGNORE: a row that exists means someone else was
# first, which the caller treats as a version conflict).
_INSERT_EFFECT = """
INSERT OR IGNORE INTO effects (effect_id, state, target, operation, namespace, run_id, step, attempt, version,
                               deadline_ms, created_ms, updated_ms, receipt_id, executions, flags, reason,
                               claim_owner, claim_until_ms)
VALUES (:effect_id, :state, :target, :operation, :namespace, :run_id, :step, :attempt, :version,
        :deadline_ms, :created_ms, :updated_ms, :receipt_id, :executions, :flags, :reason,
        :claim_owner, :claim_until_ms)
"""

# A known key: only if nobody wrote it since the caller folded it (the version), and, to claim it,
# only if nobody live holds it. One statement: the claim is never a read-then-write.
_UPDATE_EFFECT = """
UPDATE effects SET
    state = :state, target = :target, operation = :operation, namespace = :namespace, run_id = :run_id,
    step = :step, attempt = :attempt, version = :version, deadline_ms = :deadline_ms, created_ms = :created_ms,
    updated_ms = :updated_ms, receipt_id = :receipt_id, executions = :executions, flags = :flags, reason = :reason,
    claim_owner = CASE :claim_op WHEN 'keep' THEN claim_owner ELSE :claim_owner END,
    claim_until_ms = CASE :claim_op WHEN 'keep' THEN claim_until_ms ELSE :claim_until_ms END,
    check_tries = CASE WHEN :state = state THEN check_tries ELSE 0 END,
    next_check_ms = CASE WHEN :state = state THEN next_check_ms ELSE NULL END
WHERE effect_id = :effect_id AND version = :expected
  AND (:claim_op != 'take' OR claim_owner IS NULL OR claim_owner IS :observed_owner OR claim_until_ms < :now)
"""


_INSERT_EVENT = "INSERT OR IGNORE INTO events (event_id, effect_id, kind, at_ms, body, sent) VALUES (?, ?, ?, ?, ?, ?)"


class ClaimOp(StrEnum):
    KEEP = "keep"  # leave the claim as it is
    TAKE = "take"  # claim the key for this worker (with the intent)
    RELEASE = "release"  # drop the claim (the attempt has an outcome)


@dataclass(frozen=True, slots=True)
class Claim:
    owner: str | None
    until_ms: int | None


@dataclass(frozen=True, slots=True)
class _Write:
    row: dict[str, Any]
    encoded: list[tuple[str, str, str, int, bytes]]
    sent: int
    durable: bool  # needs the store's durability level (an intent); else NORMAL is enough


class Appended(NamedTuple):
    effect: Effect
    emitted: list[UncertainEffect]
    seq: int | None  # the last new event's seq (None: nothing new was written)


@dataclass(frozen=True, slots=True)
class Loaded:
    effect: Effect | None
    claim: Claim


class VersionConflict(Exception):
    """Someone else wrote the effect (or holds its claim) since it was loaded; reload and decide again."""


def _refuse_foreign(p: Path) -> None:
    """Raise ``StorageError`` if ``p`` holds something other than an effect-ledger file (or nothing
    yet), without writing to it. A ledger file is an SQLite database with the ledger's tables, or
    one with no tables yet. The look is read-only and, when no ``-wal`` file exists (everything is
    in the database file), ``immutable``: even a read-only connection to a WAL-mode file would
    otherwise create its ``-wal`` and ``-shm`` and leave them behind."""
    try:
        with open(p, "rb") as f:
            head = f.read(len(_SQLITE_MAGIC))
    except FileNotFoundError:
        return
    except OSError as e:
        raise StorageError(f"cannot read {p}: {e}") from e
    if not head:
        return  # an empty file: SQLite makes it a new database
    if head != _SQLITE_MAGIC:
        raise StorageError(f"{p} is not an effect-ledger file (not an SQLite database); it was left as it was")
    wal = p.with_name(p.name + "-wal")
    uri = p.resolve().as_uri() + ("?mode=ro" if wal.exists() else "?mode=ro&immutable=1")
    try:
        conn = sqlite3.connect(uri, uri=True)
        try:
            tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        finally:
            conn.close()
    except sqlite3.Error as e:
        raise StorageError(f"{p} is not an effect-ledger file ({e}); it was left as it was") from e
    if tables and not _LEDGER_TABLES <= tables:
        shown = ", ".join(sorted(tables)[:8]) + (", …" if len(tables) > 8 else "")
        raise StorageError(
            f"{p} is not an effect-ledger file (an SQLite database with tables {shown}); it was left as it was"
        )


def _storage_error(path: Path, e: sqlite3.Error) -> StorageError:
    code = getattr(e, "sqlite_errorname", None)
    return StorageError(f"ledger {path}: {code + ': ' if code else ''}{e}")


def _rollback(conn: sqlite3.Connection) -> None:
    """Roll back after an error, if SQLite has not already: on SQLITE_FULL, IOERR, NOMEM or BUSY it
    may roll back by itself, and a second ROLLBACK would fail ("no transaction is active") and
    hide the real error."""
    if conn.in_transaction:
        try:
            conn.execute("ROLLBACK")
        except sqlite3.Error:
            pass  # the error being raised is the one that says what happened


class Store:
    """An aiosqlite connection to one ledger file. Every write is one hop to the connection's thread:
    the whole transaction runs there (aiosqlite's ``_execute``), because each separate aiosqlite call
    costs a thread hop (~60 us) and the intent write sits in front of every external call."""

    def __init__(self, db: aiosqlite.Connection, path: Path, durability: Durability, codec: Codec) -> None:
        self._db = db
        self.path = path
        self.durability = durability
        self.codec = codec
        self._closed = False
        self._listeners: list[Callable[[int], None]] = []
        self._pending: list[tuple[_Write, asyncio.Future[int | None]]] = []
        self._sync_level = durability.value
        self._checkpointer: asyncio.Task[None] | None = None
        self._closing = asyncio.Event()
        self._flusher: asyncio.Task[None] | None = None

    @classmethod
    async def open(cls, path: str | os.PathLike[str], durability: Durability = Durability.NORMAL) -> Store:
        """Open (or create) the ledger file. ``StorageError`` for a missing folder, a file that is
        not an effect-ledger file (left untouched) or any database error."""
        p = Path(path)
        if p.parent and not p.parent.is_dir():
            raise StorageError(f"folder {p.parent} does not exist (for ledger {p})")
        await asyncio.to_thread(_refuse_foreign, p)
        try:
            db = await aiosqlite.connect(str(p), isolation_level=None, timeout=30.0)
        except sqlite3.Error as e:
            raise _storage_error(p, e) from e
        try:
            await db.execute("PRAGMA journal_mode=WAL")
            await db.execute(f"PRAGMA synchronous={Durability(durability).value}")
            await db.execute("PRAGMA busy_timeout=30000")
            # Checkpoints run off the commit path, from their own connection (see _checkpoints).
            await db.execute("PRAGMA wal_autocheckpoint=0")
            # One transaction: a file has all of the ledger's tables or none (see _refuse_foreign).
            await db.executescript(f"BEGIN IMMEDIATE;\n{SCHEMA}\n{retire_store.SCHEMA}\n{erasure.SCHEMA}\nCOMMIT;")
        except BaseException as e:
            await db.close()
            if isinstance(e, sqlite3.Error):
                raise _storage_error(p, e) from e
            raise
        store = cls(db, p, Durability(durability), default_codec())
        store._checkpointer = asyncio.create_task(store._checkpoints(), name="effect-ledger-checkpoints")
        return store

    async def _checkpoints(self, every_s: float = 1.0) -> None:
        """Copy the WAL back into the database now and then, in a thread of its own. SQLite would
        otherwise do it inside whichever commit crosses 1,000 pages — a latency spike on that
        write. PASSIVE: it never blocks a writer; what it cannot copy yet waits for the next round."""
        conn = sqlite3.connect(self.path, timeout=0.1, check_same_thread=False)
        try:
            while not self._closed:
                try:
                    await asyncio.wait_for(self._closing.wait(), every_s)
                except TimeoutError:
                    pass
                if self._closed:
                    break
                try:
                    await asyncio.to_thread(conn.execute, "PRAGMA wal_checkpoint(PASSIVE)")
                except sqlite3.Error:
                    continue  # busy: next round
        finally:
            conn.close()

    async def close(self) -> None:
        if not self._closed:
            self._closed = True
            if self._flusher is not None:
                await asyncio.shield(self._flusher)  # writes already accepted are committed first
            self._closing.set()
            if self._checkpointer is not None:
                await self._checkpointer
            await self._db.close()

    @property
    def closed(self) -> bool:
        return self._closed

    async def _run(self, fn: Any, *args: Any) -> Any:
        if self._closed:
            raise LedgerClosed(f"ledger {self.path} is closed")
        return await self._call(fn, *args)

    async def _call(self, fn: Any, *args: Any) -> Any:
        """Run ``fn`` on the connection's thread. The one place database errors become ``StorageError``."""
        try:
            return await self._db._execute(fn, *args)
        except sqlite3.Error as e:
            raise _storage_error(self.path, e) from e

    # -- reads -------------------------------------------------------------------------------

    async def load(self, effect_id: str) -> Loaded:
        return await self._run(self._load, effect_id)  # type: ignore[no-any-return]

    def _load(self, effect_id: str) -> Loaded:
        conn: sqlite3.Connection = self._db._conn
        rows = conn.execute("SELECT body FROM events WHERE effect_id = ? ORDER BY seq", (effect_id,)).fetchall()
        effect: Effect | None = None
        for (body,) in rows:
            effect, _ = apply(effect, self.codec.decode(body))
        row = conn.execute(
            "SELECT claim_owner, claim_until_ms FROM effects WHERE effect_id = ?", (effect_id,)
        ).fetchone()
        return Loaded(effect, Claim(row[0], row[1]) if row else Claim(None, None))

    async def run(self, fn: Callable[[sqlite3.Connection], Any]) -> Any:
        """Run ``fn(connection)`` on the connection's thread, database errors as ``StorageError``:
        for the modules that keep tables of their own in the file (``retire_store``, ``erasure``)."""
        return await self._run(lambda: fn(self._db._conn))

    async def query(self, sql: str, params: Sequence[Any] = ()) -> list[sqlite3.Row]:
        """Read-only SQL over the ledger (``effects`` and ``events`` tables)."""
        return await self._run(self._query, sql, tuple(params))  # type: ignore[no-any-return]

    def _query(self, sql: str, params: tuple[Any, ...]) -> list[sqlite3.Row]:
        conn: sqlite3.Connection = self._db._conn
        cur = conn.execute(sql, params)
        cols = [d[0] for d in cur.description or ()]
        return [dict(zip(cols, r, strict=True)) for r in cur.fetchall()]  # type: ignore[misc]

    async def events(self, effect_id: str) -> list[tuple[int, Event, bool]]:
        rows = await self.query("SELECT seq, body, sent FROM events WHERE effect_id = ? ORDER BY seq", (effect_id,))
        return [(r["seq"], self.codec.decode(r["body"]), bool(r["sent"])) for r in rows]

    # -- writes ------------------------------------------------------------------------------

    async def append(
        self,
        before: Effect | None,
        events: Sequence[Event],
        *,
        now_ms: int,
        claim_op: ClaimOp = ClaimOp.KEEP,
        owner: str | None = None,
        claim_until_ms: int | None = None,
        observed_owner: str | None = None,
        sent: bool = False,
    ) -> Appended:
        """Fold ``events`` into ``before`` and write them durably in one transaction, if nobody
        wrote the effect since ``before`` was loaded; raises ``VersionConflict`` otherwise.
        ``sent``: the events are already on Kafka (imported from the processor), not for the relay."""
        after = before
        emitted: list[UncertainEffect] = []
        new: list[Event] = []
        for e in events:
            folded, out = apply(after, e)
            if folded is not after:
                new.append(e)  # an event the effect already holds is not stored twice
            after = folded
            emitted.extend(out)
        assert after is not None
        if after is before:
            return Appended(after, [], None)  # every event was already known: nothing to write
        # Events built by the SDK are typed by construction: skip the codec's value validation here.
        encoded = [
            (e.event_id, e.effect_id, type(e).__name__, e.at_ms, self.codec.encode(e, validate=False)) for e in new
        ]
        row = _row(after)
        row.update(
            expected=before.version if before else 0,
            claim_op=claim_op.value,
            claim_owner=owner if claim_op is ClaimOp.TAKE else None,
            claim_until_ms=claim_until_ms if claim_op is ClaimOp.TAKE else None,
            observed_owner=observed_owner,
            now=now_ms,
        )
        seq = await self._commit(_Write(row, encoded, int(sent), claim_op is ClaimOp.TAKE))
        if seq is None:
            raise VersionConflict(after.effect_id)
        if not sent:
            for listener in self._listeners:
                listener(seq)
        return Appended(after, emitted, seq)

    async def _commit(self, write: _Write) -> int | None:
        """Group commit: writes that arrive while a transaction is in flight go, together, into the
        next one — one hop to the connection's thread and one fsync for all of them. Each write keeps
        its own version check, so batching changes no outcome, only the cost."""
        if self._closed:
            raise LedgerClosed(f"ledger {self.path} is closed")
        fut: asyncio.Future[int | None] = asyncio.get_running_loop().create_future()
        self._pending.append((write, fut))
        if self._flusher is None:
            self._flusher = asyncio.create_task(self._flush())
        return await fut

    async def _flush(self) -> None:
        try:
            while self._pending:
                batch, self._pending = self._pending, []
                try:
                    results = await self._call(self._append_batch, [w for w, _ in batch])
                except BaseException as e:
                    for _, fut in batch:
                        if not fut.done():
                            fut.set_exception(e if isinstance(e, Exception) else RuntimeError(str(e)))
                    if not isinstance(e, Exception):
                        raise
                    continue
                for (_, fut), result in zip(batch, results, strict=True):
                    if not fut.done():
                        fut.set_result(result)
        finally:
            self._flusher = None

    def _append_batch(self, writes: list[_Write]) -> list[int | None]:
        """The transaction (see the module docstring for its order), for one or more writes. Per
        write: the last new event's seq (0 when every event was already stored), or None when its
        version check failed (its events are then not inserted)."""
        conn: sqlite3.Connection = self._db._conn
        if self.durability is Durability.FULL:
            # FULL fsyncs before an intent's call may start. Later records of an effect (outcome,
            # receipt, resolution) commit at NORMAL: the WAL makes them durable with the next fsync,
            # and one lost to a power cut leaves the effect open, to be reconciled, never re-run.
            level = "FULL" if any(w.durable for w in writes) else "NORMAL"
            if level != self._sync_level:
                conn.execute(f"PRAGMA synchronous={level}")
                self._sync_level = level
        conn.execute("BEGIN IMMEDIATE")
        try:
            results: list[int | None] = []
            for w in writes:
                sql = _UPDATE_EFFECT if w.row["expected"] else _INSERT_EFFECT
                if conn.execute(sql, w.row).rowcount != 1:
                    results.append(None)
                    continue
                seq = 0
                for values in w.encoded:
                    cur = conn.execute(_INSERT_EVENT, (*values, w.sent))
                    if cur.rowcount == 1:
                        seq = cur.lastrowid or seq
                results.append(seq)
            conn.execute("COMMIT")
            return results
        except BaseException:
            _rollback(conn)
            raise

    def add_listener(self, fn: Callable[[int], None]) -> None:
        """Called (in the event loop) with the seq of each committed write meant for the relay."""
        self._listeners.append(fn)

    # -- the outbox --------------------------------------------------------------------------

    async def unsent(self, limit: int, after: int = 0) -> list[tuple[int, str, str, bytes]]:
        """The oldest events not yet acknowledged by Kafka, after seq ``after``:
        (seq, effect_id, kind, body)."""
        return await self._run(self._unsent, limit, after)  # type: ignore[no-any-return]

    def _unsent(self, limit: int, after: int) -> list[tuple[int, str, str, bytes]]:
        conn: sqlite3.Connection = self._db._conn
        return conn.execute(
            "SELECT seq, effect_id, kind, body FROM events WHERE sent = 0 AND seq > ? ORDER BY seq LIMIT ?",
            (after, limit),
        ).fetchall()

    async def mark_sent(self, seqs: Sequence[int]) -> None:
        """Mark events acknowledged by the broker. Called only after their delivery reports."""
        await self._run(self._mark_sent, list(seqs))

    def _mark_sent(self, seqs: list[int]) -> None:
        conn: sqlite3.Connection = self._db._conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            if seqs and seqs[-1] - seqs[0] + 1 == len(seqs):
                conn.execute("UPDATE events SET sent = 1 WHERE seq BETWEEN ? AND ? AND sent = 0", (seqs[0], seqs[-1]))
            else:
                conn.executemany("UPDATE events SET sent = 1 WHERE seq = ?", [(s,) for s in seqs])
            conn.execute("COMMIT")
        except BaseException:
            _rollback(conn)
            raise

    async def mark_dead(self, dead: Sequence[tuple[int, str]], at_ms: int) -> None:
        """Mark events Kafka refused for good (too large, invalid) as dead-lettered, with the reason:
        ``sent = 2`` takes them out of the outbox, ``dead_letters`` keeps why, for an operator."""
        await self._run(self._mark_dead, list(dead), at_ms)

    def _mark_dead(self, dead: list[tuple[int, str]], at_ms: int) -> None:
        conn: sqlite3.Connection = self._db._conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.executemany("UPDATE events SET sent = 2 WHERE seq = ? AND sent = 0", [(seq,) for seq, _ in dead])
            conn.executemany(
                "INSERT OR REPLACE INTO dead_letters (seq, at_ms, reason) VALUES (?, ?, ?)",
                [(seq, at_ms, reason) for seq, reason in dead],
            )
            conn.execute("COMMIT")
        except BaseException:
            _rollback(conn)
            raise

    async def outbox_depth(self) -> int:
        rows = await self.query("SELECT count(*) AS n FROM events WHERE sent = 0")
        return int(rows[0]["n"])

    async def dead_letters(self) -> list[dict[str, Any]]:
        """Events Kafka refused for good, oldest first: seq, effect_id, kind, size, at_ms, reason."""
        return await self.query(  # type: ignore[return-value]
            "SELECT d.seq, e.effect_id, e.kind, length(e.body) AS size, d.at_ms, d.reason "
            "FROM dead_letters d JOIN events e ON e.seq = d.seq ORDER BY d.seq"
        )

    async def set_backoff(self, effect_id: str, tries: int, next_check_ms: int | None) -> None:
        await self.query(
            "UPDATE effects SET check_tries = ?, next_check_ms = ? WHERE effect_id = ?",
            (tries, next_check_ms, effect_id),
        )

    async def checkpoint(self) -> None:
        await self._run(lambda: self._db._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)"))


def _row(e: Effect) -> dict[str, Any]:
    i = e.first_intent
    return {
        "effect_id": e.effect_id,
        "state": e.state.value,
        "target": i.target if i else "",
        "operation": i.operation if i else "",
        "namespace": i.namespace if i else "",
        "run_id": i.run_id if i else "",
        "step": i.step if i else "",
        "attempt": e.attempt,
        "version": e.version,
        "deadline_ms": e.deadline_ms,
        "created_ms": e.created_ms,
        "updated_ms": e.updated_ms,
        "receipt_id": e.receipt.receipt_id if e.receipt else None,
        "executions": e.executions,
        "flags": ",".join(f.value for f in e.flags),
        "reason": e.reason,
    }


__all__ = ["Store", "Durability", "ClaimOp", "Claim", "Loaded", "VersionConflict", "State"]

"""The SQLite file behind a ledger: the event log (and Kafka outbox) plus the folded effects table
(the tables, the effect row and the shared reads: ``effect_ledger.sdk.store.tables``).

Durable-write order, in the one function that writes (``Store._write_effect``), inside one
transaction (``Store._write_batch``):

1. the conditional upsert of the effect row — it succeeds only if the row still has the version
   the caller folded from (optimistic concurrency across tasks and processes), and it carries the
   claim of the key, so claiming is one SQL statement, never a read-then-write;
2. the new events, with ``sent = 0`` (the relay marks them sent only after the broker's ack);
3. COMMIT — with ``synchronous=NORMAL`` it survives a killed process, with ``FULL`` power loss.
   ``append`` returns only after the COMMIT: the SDK calls the destination after that.

The effect row is a projection of the events (``effect_ledger.core.effect``); the events are the truth.

Threads: at NORMAL a lone write commits on the event loop's thread (a commit is a write() into
the OS's cache, cheaper than a hop to a thread and back, ~60-80 us); a group commit of several
writes takes one hop for all of them, so SQLite runs beside the loop's Python. A lone intent at
FULL (an fsync) commits on the loop's thread too while the disk is fast (``INLINE_FSYNC_MAX_US``:
the last 16 such commits each under 1 ms): a hop to the store's thread and back costs as much as
such an fsync, on a virtual machine more. The first slow one sends them to the store's own thread,
as do a file another process has locked and the checkpoint that bounds the WAL: the loop waits
for one slow disk flush at most, and never for a lock (a write() can still wait for the kernel
when the machine has too much dirty memory). Reads use a second, read-only
connection, on the loop's thread.

A store is opened on one event loop, its home. A write from any other loop (``SyncLedger``
runs a caller's operations on a loop of the caller's own thread, see ``effect_ledger.sdk.sync``)
commits at once on that thread, alone, waiting for the disk and for a locked file there: that
thread belongs to a caller who is waiting anyway. Each connection is used by one thread at a
time (``_writing``, ``_reading``); the home loop never waits for those locks: a write that finds
the writer taken goes to the store's thread, a read waits only for another read (microseconds).

The WAL is bounded: ``WAL_LIMIT_BYTES`` (see ``Store._bound_wal``).

Errors: every database error leaves this module as ``StorageError`` (its ``__cause__`` the
sqlite3 error), translated in ``Store._transact`` and ``Store._kick`` (writes), ``Store._read`` (reads) and
``Store.open``. A file that is not an effect-ledger file is refused without being written to
(``_refuse_foreign``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any, NamedTuple

from effect_ledger.core.effect import Effect, absorb
from effect_ledger.core.model import Event, State
from effect_ledger.errors import LedgerClosed, StorageError
from effect_ledger.sdk.store import tables
from effect_ledger.sdk.store.reader import SQLITE_MAGIC, read_only_uri
from effect_ledger.sdk.store.tables import LEDGER_TABLES, SCHEMA, Due, effect_row
from effect_ledger.streams.codec import Codec, default_codec

log = logging.getLogger("effect_ledger.store")

#: How a row refused by Kafka's ACLs is marked in ``dead_letters`` (the relay writes it; an operator
#: sends such rows again with ``effects relay --resend-refused`` once the right is given).
ACL_REFUSED = "refused by Kafka's ACLs"


class Durability(StrEnum):
    """SQLite ``synchronous`` level. NORMAL: a committed write survives a killed process (not a power
    loss). FULL: it survives power loss too (an fsync per commit)."""

    NORMAL = "NORMAL"
    FULL = "FULL"


#: The write-ahead log stays under about this size whatever the write rate: past it, the writer
#: copies the log into the database and starts it over before its next transaction (``_bound_wal``).
#: Only a reader that holds one snapshot for long (another process) can keep it from starting over.
WAL_LIMIT_BYTES = 32 * 1024 * 1024
#: Page size of a new file (an existing file keeps its own). Small pages: an effect changes a
#: few rows scattered over several b-trees, and every changed page goes to the WAL whole.
PAGE_SIZE = 1024
#: Lone commits look at the WAL's size once they wrote about this much (a stat per commit costs more
#: than the rest of the check): the WAL can pass ``WAL_LIMIT_BYTES`` by this, and one write, at most.
_CHECK_WAL_EVERY_BYTES = 256 * 1024
_PAGES_PER_WRITE = 16  # a generous count of the pages one effect's write changes
#: A group commit of this many writes or more goes to the store's thread (one hop for all).
_HOP_BATCH = 2
#: A lone intent at FULL commits on the event loop's thread once the store's last
#: ``_FAST_IN_A_ROW`` lone durable commits each took under this: the loop then waits for the disk
#: about as long as it runs the ledger's own Python for a call, and less than a hop to the store's
#: thread and back costs. The first one over it sends them to the store's thread again (the loop
#: waits for one slow fsync at most), where they are timed until that many in a row are fast.
INLINE_FSYNC_MAX_US = 1_000
_FAST_IN_A_ROW = 16
#: How long a write waits for a file another process has locked (on the store's thread).
BUSY_TIMEOUT_MS = 30_000
#: How long the WAL-bounding checkpoint waits for readers of another process before trying later.
_CHECKPOINT_WAIT_MS = 2_000

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
    """What a write does to the key's claim, the lease that lets one worker run the call."""

    KEEP = "keep"  # leave the claim as it is
    TAKE = "take"  # claim the key for this worker (with the intent)
    RELEASE = "release"  # drop the claim (the attempt has an outcome)


@dataclass(frozen=True, slots=True)
class Claim:
    """Who holds a key's claim (a worker name) and until when (epoch ms); None and None: nobody.
    A claim past ``until_ms`` can be taken over."""

    owner: str | None
    until_ms: int | None


@dataclass(frozen=True, slots=True)
class _Write:
    row: dict[str, Any]
    encoded: list[tuple[str, str, str, int, bytes]]
    sent: int
    durable: bool  # needs the store's durability level (an intent); else NORMAL is enough

    @property
    def size(self) -> int:
        """About what the write adds to the WAL: its events and a few pages of rows and indexes."""
        return sum(len(e[4]) for e in self.encoded) + _PAGES_PER_WRITE * PAGE_SIZE


class _Queued:
    """A write of a caller's thread waiting for the writer (``Store._commit_here``)."""

    __slots__ = ("op", "done", "result", "error")

    def __init__(self, op: _Op) -> None:
        self.op = op
        self.done = False
        self.result: Any = None
        self.error: BaseException | None = None


def _size(op: _Op) -> int:
    """About how many bytes a write adds to the WAL (an operation of its own counts as a lot)."""
    return op.size if isinstance(op, _Write) else _CHECK_WAL_EVERY_BYTES


class Appended(NamedTuple):
    effect: Effect
    seq: int | None  # the last new event's seq (None: nothing new was written)


@dataclass(frozen=True, slots=True)
class Loaded:
    """What ``load`` read: the effect (None: no event for the key yet) and its claim."""

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
            head = f.read(len(SQLITE_MAGIC))
    except FileNotFoundError:
        return
    except OSError as e:
        raise StorageError(f"cannot read {p}: {e}") from e
    if not head:
        return  # an empty file: SQLite makes it a new database
    if head != SQLITE_MAGIC:
        raise StorageError(f"{p} is not an effect-ledger file (not an SQLite database); it was left as it was")
    try:
        conn = sqlite3.connect(read_only_uri(p), uri=True)
        try:
            tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        finally:
            conn.close()
    except sqlite3.Error as e:
        raise StorageError(f"{p} is not an effect-ledger file ({e}); it was left as it was") from e
    if tables and not LEDGER_TABLES <= tables:
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


def _is_busy(e: sqlite3.Error) -> bool:
    return (getattr(e, "sqlite_errorcode", 0) & 0xFF) == sqlite3.SQLITE_BUSY


def _connect(p: Path, durability: Durability) -> tuple[sqlite3.Connection, sqlite3.Connection]:
    """The writer and the read-only reader of a ledger file, its tables created (one transaction:
    a file has all of the ledger's tables or none, see ``_refuse_foreign``)."""
    writer = sqlite3.connect(p, isolation_level=None, timeout=BUSY_TIMEOUT_MS / 1000, check_same_thread=False)
    reader: sqlite3.Connection | None = None
    try:
        writer.execute(f"PRAGMA page_size={PAGE_SIZE}")  # a new file only: it is fixed once written
        writer.execute("PRAGMA journal_mode=WAL")
        writer.execute(f"PRAGMA synchronous={durability.value}")
        # Checkpoints never run inside a commit: a background one copies the WAL back now and then,
        # and the writer bounds it (see Store._bound_wal).
        writer.execute("PRAGMA wal_autocheckpoint=0")
        writer.execute(f"PRAGMA journal_size_limit={WAL_LIMIT_BYTES}")
        writer.executescript(f"BEGIN IMMEDIATE;\n{SCHEMA}\nCOMMIT;")
        # On the event loop's thread a locked file is never waited for (see Store._transact).
        writer.execute("PRAGMA busy_timeout=0")
        reader = sqlite3.connect(p, isolation_level=None, timeout=BUSY_TIMEOUT_MS / 1000, check_same_thread=False)
        reader.execute("PRAGMA query_only=1")  # Store.query is read-only, for real
        reader.execute(f"PRAGMA synchronous={durability.value}")
        return writer, reader
    except BaseException:
        if reader is not None:
            reader.close()
        writer.close()
        raise


_Op = _Write | Callable[[sqlite3.Connection], Any]


class Store:
    """One ledger file: a writer connection (group commit, see ``_commit``) and a read-only reader.
    Writes of a store are serialised; several processes may write the same file (SQLite's lock)."""

    def __init__(
        self, writer: sqlite3.Connection, reader: sqlite3.Connection, path: Path, durability: Durability, codec: Codec
    ) -> None:
        self._conn = writer
        self._reader = reader
        self.path = path
        self.durability = durability
        self.codec = codec
        self._closed = False
        self._listeners: list[Callable[[int], None]] = []
        # Told of each effect this store changed (before, after, the new events), after the write
        # is durable: the metrics and the service's log lines (effect_ledger.metrics.effects).
        self._observers: dict[object, Callable[[Effect | None, Effect, Sequence[Event]], None]] = {}
        self._pending: list[tuple[_Op, asyncio.Future[Any]]] = []
        self._sync_level: str | None = durability.value
        self._checkpointer: asyncio.Task[None] | None = None
        self._closing = asyncio.Event()
        self._flusher: asyncio.Task[None] | None = None
        self._kicked = False  # a _kick is scheduled
        # The store's thread: fsyncs, waits for a locked file, the WAL-bounding checkpoint.
        self._thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="effect-ledger-store")
        self._wal = str(path) + "-wal"  # a str: os.stat of a Path converts it on every commit
        self._wal_retry_bytes = 0  # a bounding checkpoint that could not finish is retried past this size
        self._unchecked = 0  # about how many bytes lone commits wrote since the WAL's size was looked at
        # Held by a checkpoint of this store: the bounding one waits for a background round to end
        # rather than failing on SQLite's checkpoint lock (and a round skips while it runs).
        self._checkpointing = threading.Lock()
        # The writer and the reader connection, each used by one thread at a time: the home loop's,
        # the store's, or a caller's on a loop of its own (see the module's note on threads).
        self._writing = threading.Lock()
        self._writer_closed = False
        self._queue_lock = threading.Lock()
        self._queued: list[_Queued] = []  # writes of callers' threads, for the next to take the writer
        # The results of the last transaction once its COMMIT returned (None before): set under the writer.
        self._committed: list[Any] | None = None
        self._reading = threading.Lock()
        # How many lone durable commits in a row, wherever they ran, took under
        # ``INLINE_FSYNC_MAX_US``: from ``_FAST_IN_A_ROW`` on, a lone intent commits on the loop's thread.
        self._fast_in_a_row = 0
        try:
            self._home: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            self._home = None  # built outside a loop: the first loop that writes is its home

    @classmethod
    async def open(cls, path: str | os.PathLike[str], durability: Durability = Durability.NORMAL) -> Store:
        """Open (or create) the ledger file. ``StorageError`` for a missing folder, a file that is
        not an effect-ledger file (left untouched) or any database error."""
        p = Path(path)
        if p.parent and not p.parent.is_dir():
            raise StorageError(f"folder {p.parent} does not exist (for ledger {p})")
        await asyncio.to_thread(_refuse_foreign, p)
        level = Durability(durability)
        try:
            writer, reader = await asyncio.to_thread(_connect, p, level)
        except sqlite3.Error as e:
            raise _storage_error(p, e) from e
        store = cls(writer, reader, p, level, default_codec())
        store._checkpointer = asyncio.create_task(store._checkpoints(), name="effect-ledger-checkpoints")
        return store

    async def _checkpoints(self, every_s: float = 1.0) -> None:
        """Copy the WAL back into the database now and then, in a thread, from a connection of its
        own. PASSIVE: it never blocks a writer; what it cannot copy yet waits for the next round.
        Under sustained writes these never let the WAL start over: ``_bound_wal`` does."""
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
                    await asyncio.to_thread(self._passive, conn)
                except sqlite3.Error:
                    continue  # busy: next round
        finally:
            conn.close()

    def _passive(self, conn: sqlite3.Connection) -> None:
        if self._checkpointing.acquire(blocking=False):  # else the bounding checkpoint is at work
            try:
                conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
            finally:
                self._checkpointing.release()

    async def close(self) -> None:
        """Commit the writes already accepted, then close the file (the last connection to close
        copies the WAL back and removes it: on the store's thread, not the loop's)."""
        if not self._closed:
            self._closed = True
            while self._flusher is not None or self._pending:  # writes accepted are committed first
                if self._flusher is not None:
                    await asyncio.shield(self._flusher)
                else:
                    await asyncio.sleep(0)  # the scheduled _kick commits them
            self._closing.set()
            if self._checkpointer is not None:
                await self._checkpointer
            with self._reading:
                self._reader.close()
            await asyncio.get_running_loop().run_in_executor(self._thread, self._close_writer)
            self._thread.shutdown(wait=False)

    def _close_writer(self) -> None:
        with self._writing:  # a caller's write on its own thread ends first
            self._conn.close()
            self._writer_closed = True

    @property
    def closed(self) -> bool:
        """True once ``close`` has begun; reads and writes after it raise ``LedgerClosed``."""
        return self._closed

    # -- reads (the reader connection, on the loop's thread) ---------------------------------

    def _read(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run a read on the reader connection. One of the places database errors become ``StorageError``."""
        with self._reading:
            if self._closed:
                raise LedgerClosed(f"ledger {self.path} is closed")
            try:
                return fn(*args)
            except sqlite3.Error as e:
                raise _storage_error(self.path, e) from e

    async def load(self, effect_id: str) -> Loaded:
        """The effect folded from its events, and who holds its claim."""
        return self._read(self._load, effect_id)  # type: ignore[no-any-return]

    def _load(self, effect_id: str) -> Loaded:
        conn = self._reader
        try:
            conn.execute("BEGIN")  # the events and the claim from one snapshot
            rows = conn.execute("SELECT body FROM events WHERE effect_id = ? ORDER BY seq", (effect_id,)).fetchall()
            row = conn.execute(
                "SELECT claim_owner, claim_until_ms FROM effects WHERE effect_id = ?", (effect_id,)
            ).fetchone()
        finally:
            if conn.in_transaction:
                conn.execute("COMMIT")
        effect, _ = absorb(None, [self.codec.decode(body) for (body,) in rows])  # derived once
        return Loaded(effect, Claim(row[0], row[1]) if row else Claim(None, None))

    async def run(self, fn: Callable[[sqlite3.Connection], Any]) -> Any:
        """Run ``fn(connection)`` on a connection of its own, in a thread, database errors as
        ``StorageError``: for the modules that keep tables of their own in the file and run their
        own transactions (``retire_store``, ``erasure``). Their writes are rare (a retention sweep,
        an erasure, a subject's first key): a connection per call keeps them out of the group
        commit, and SQLite's lock orders them with this store's writes."""
        if self._closed:
            raise LedgerClosed(f"ledger {self.path} is closed")

        def work() -> Any:
            conn = sqlite3.connect(self.path, isolation_level=None, timeout=BUSY_TIMEOUT_MS / 1000)
            try:
                conn.execute(f"PRAGMA synchronous={self.durability.value}")
                return fn(conn)
            finally:
                conn.close()

        try:
            return await asyncio.to_thread(work)
        except sqlite3.Error as e:
            raise _storage_error(self.path, e) from e

    async def purge(self, fn: Callable[[sqlite3.Connection], Any]) -> Any:
        """Run ``fn(connection)`` as one write transaction that deletes data for good: SQLite's
        ``secure_delete`` overwrites the freed pages, and when ``fn`` returns something truthy the
        WAL is truncated so it keeps no copy either (a reader holding it: the next checkpoint does).
        For retention and erasure; returns what ``fn`` returns."""

        def work(conn: sqlite3.Connection) -> Any:
            conn.execute("PRAGMA secure_delete = ON")
            conn.execute("BEGIN IMMEDIATE")
            try:
                result = fn(conn)
                conn.execute("COMMIT")
            except BaseException:
                _rollback(conn)
                raise
            if result:
                try:
                    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
                except sqlite3.OperationalError:
                    pass  # busy readers: the next checkpoint truncates it
            return result

        return await self.run(work)

    async def query(self, sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
        """Read-only SQL over the ledger (``effects`` and ``events`` tables), rows as dicts. A
        statement that would write is refused (``StorageError``): the reader is ``query_only``."""
        return self._read(tables.rows, self._reader, sql, tuple(params))  # type: ignore[no-any-return]

    async def events(self, effect_id: str) -> list[tuple[int, Event, bool]]:
        """(seq, event, sent to Kafka) of one effect, in the order written."""
        rows = await self.query("SELECT seq, body, sent FROM events WHERE effect_id = ? ORDER BY seq", (effect_id,))
        return [(r["seq"], self.codec.decode(r["body"]), bool(r["sent"])) for r in rows]

    async def due_deadlines(self, cutoff_ms: int, limit: int) -> list[Due]:
        """Attempts waiting for their call or receipt whose deadline is at or before ``cutoff_ms``."""
        return self._read(tables.due_deadlines, self._reader, cutoff_ms, limit)  # type: ignore[no-any-return]

    async def due_checks(self, now_ms: int, limit: int) -> list[Due]:
        """UNCERTAIN effects whose reconciler backoff has elapsed (``Due.at_ms``: tries so far)."""
        return self._read(tables.due_checks, self._reader, now_ms, limit)  # type: ignore[no-any-return]

    async def unsettled(self, created_before_ms: int | None = None) -> list[dict[str, Any]]:
        """Effects open or escalated, created before ``created_before_ms``, oldest first."""
        return self._read(tables.unsettled, self._reader, created_before_ms)  # type: ignore[no-any-return]

    async def counts(self) -> list[tuple[str, str, int]]:
        """(state, target, effects) for every pair present."""
        return self._read(tables.counts, self._reader)  # type: ignore[no-any-return]

    async def oldest_due_ms(self) -> int | None:
        """When the most overdue open effect fell due (None: nothing is open)."""
        return self._read(tables.oldest_due_ms, self._reader)  # type: ignore[no-any-return]

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
        after, new = absorb(before, events)
        if not new:
            assert after is not None
            return Appended(after, None)  # every event was already known: nothing to write
        assert after is not None
        # Events built by the SDK are typed by construction: skip the codec's value validation here.
        encoded = [
            (e.event_id, e.effect_id, type(e).__name__, e.at_ms, self.codec.encode(e, validate=False)) for e in new
        ]
        row = effect_row(after)
        row.update(
            # The file's optimistic concurrency counts every fact, claim verdicts included
            # (``Effect.version``); the published state's version does not count verdicts.
            version=after.version,
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
        for observe in self._observers.values():
            try:
                observe(before, after, new)
            except Exception:  # a metric or a log line must never undo or fail a durable write
                log.exception("observing a change of %s failed", after.effect_id)
        return Appended(after, seq)

    def observe(self, key: object, fn: Callable[[Effect | None, Effect, Sequence[Event]], None]) -> None:
        """Call ``fn(before, after, new_events)`` after each durable change of an effect; one
        observer per ``key`` (a second one under the same key replaces the first)."""
        self._observers[key] = fn

    async def _commit(self, op: _Op) -> Any:
        """Group commit: writes that arrive while a transaction is in flight (or in the same turn
        of the event loop) go, together, into the next one — one commit, and at FULL one fsync,
        for all of them. Each write keeps its own version check, so batching changes no outcome,
        only the cost."""
        if self._closed:
            raise LedgerClosed(f"ledger {self.path} is closed")
        loop = asyncio.get_running_loop()
        if self._home is None:
            self._home = loop
        elif loop is not self._home:
            return self._commit_here(op)
        fut: asyncio.Future[Any] = loop.create_future()
        self._pending.append((op, fut))
        if self._flusher is None and not self._kicked:
            self._kicked = True
            # The tasks that are ready in this turn of the loop add their writes first (one commit
            # for all of them), then this task commits: one turn of the loop per write, not two
            # (a turn for the commit, another for the waiter's wake-up). Cancelled meanwhile, it
            # commits all the same: the writes of the other tasks are waiting for it.
            try:
                await asyncio.sleep(0)
            finally:
                self._kick()
        return await fut

    def _commit_here(self, op: _Op) -> Any:
        """A write from a loop other than the store's home (a ``SyncLedger`` caller's): committed on
        this thread, which waits for the disk, for a locked file, and for the writer while another
        thread holds it. Group commit between threads: whoever takes the writer commits every write
        queued by then, in one transaction (one fsync at FULL); the others find theirs done. Durable
        when this returns, as every commit."""
        mine = _Queued(op)
        with self._queue_lock:
            self._queued.append(mine)
        try:
            self._writing.acquire()
        except BaseException:  # interrupted while waiting (Ctrl-C): taken back, unless already taken
            with self._queue_lock:
                if mine in self._queued:
                    self._queued.remove(mine)
            raise
        try:
            if not mine.done:
                self._lead(mine)
        finally:
            self._writing.release()
        if mine.error is not None:
            raise mine.error
        return mine.result

    def _lead(self, mine: _Queued) -> None:
        """Commit every queued write in one transaction, holding the writer."""
        with self._queue_lock:
            batch, self._queued = self._queued, []
        try:
            results = self._waiting_locked(self._write_batch, [q.op for q in batch])
        except sqlite3.Error as e:
            err = _storage_error(self.path, e)
            err.__cause__ = e
            for q in batch:
                q.error, q.done = err, True
        except Exception as e:  # LedgerClosed: each caller gets it
            for q in batch:
                q.error, q.done = e, True
        except BaseException:
            # This thread interrupted: if the batch committed, it stands for everyone; else nothing
            # was written and the others' writes wait for the next writer.
            if self._committed is not None:
                for q, result in zip(batch, self._committed, strict=True):
                    q.result, q.done = result, True
            else:
                with self._queue_lock:
                    self._queued[:0] = [q for q in batch if q is not mine]
            raise
        else:
            for q, result in zip(batch, results, strict=True):
                q.result, q.done = result, True
            if self._wal_due(sum(_size(q.op) for q in batch)):
                self._bound_wal_locked()

    def _wal_due(self, written: int) -> bool:
        """Count ``written`` bytes of commits made outside the flusher; True once enough have
        accumulated for the WAL's size to be looked at again."""
        self._unchecked += written
        if self._unchecked < _CHECK_WAL_EVERY_BYTES:
            return False
        self._unchecked = 0
        return True

    def _bound_wal_locked(self) -> None:
        """``_bound_wal`` on this thread, holding the writer (the home loop's from the store's thread,
        a caller's thread after its group commit)."""
        size = self._wal_over()
        if not size:
            return
        try:
            done = self._restart_wal_locked()
        except sqlite3.Error:
            done = False
        self._wal_retry_bytes = 0 if done else size + WAL_LIMIT_BYTES // 2

    def _kick(self) -> None:
        """Run by the task whose write arrived with nothing in flight, one turn of the loop later:
        what is pending by now commits together. A lone write that needs no fsync commits right
        here, on the loop's thread, in that task; anything else (several writes, an fsync, a locked
        file, a WAL to bound) is the flusher task's."""
        self._kicked = False
        if self._flusher is not None or not self._pending:
            return  # the flusher takes what is pending
        if len(self._pending) == 1:
            op, fut = self._pending[0]
            if not self._waits_for_disk([op]) and self._writing.acquire(
                blocking=False
            ):  # else a caller's thread writes: the flusher waits for it
                try:
                    try:
                        (result,) = self._write_batch([op])
                    finally:
                        self._writing.release()
                except sqlite3.Error as e:
                    if not _is_busy(e):
                        self._pending = []
                        err = _storage_error(self.path, e)
                        err.__cause__ = e
                        fut.set_exception(err)
                        return
                    # locked by another process: the flusher waits for it on the store's thread
                except Exception as e:
                    self._pending = []
                    fut.set_exception(e)
                    return
                else:
                    self._pending = []
                    if not fut.done():
                        fut.set_result(result)
                    # The WAL's size is looked at once some writing has accumulated, not per commit.
                    if not self._wal_due(_size(op)) or not self._wal_over():
                        return
        self._flusher = asyncio.create_task(self._flush())

    async def _flush(self) -> None:
        try:
            await self._bound_wal()
            while self._pending:
                batch, self._pending = self._pending, []
                ops = [op for op, _ in batch]
                try:
                    # One write: on the loop's thread (no hop). Several (concurrent tasks): one hop
                    # for all of them, and SQLite works in parallel with the loop's Python.
                    inline = len(ops) < _HOP_BATCH and not self._waits_for_disk(ops)
                    results = await self._transact(self._write_batch, ops, inline)
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
                await self._bound_wal()
        finally:
            self._flusher = None

    async def _transact(self, fn: Callable[[Any], Any], arg: Any, inline: bool) -> Any:
        """Run the write transaction ``fn(arg)`` on the writer: ``inline`` on the event loop's
        thread, else on the store's. Inline only when it needs no fsync, or a fast one
        (``_waits_for_disk``: the loop must not wait for a slow disk); a file locked by another
        process (SQLITE_BUSY at BEGIN, nothing written) sends it to the store's thread too, which
        waits for the lock up to ``BUSY_TIMEOUT_MS``.
        The one place write errors become ``StorageError``."""
        try:
            if inline and self._writing.acquire(blocking=False):  # else a caller's thread writes
                try:
                    return fn(arg)
                except sqlite3.OperationalError as e:
                    if not _is_busy(e):
                        raise
                finally:
                    self._writing.release()
            return await asyncio.get_running_loop().run_in_executor(self._thread, self._waiting, fn, arg)
        except sqlite3.Error as e:
            raise _storage_error(self.path, e) from e

    def _waits_for_disk(self, ops: Sequence[_Op]) -> bool:
        """Whether committing ``ops`` would make the loop wait for a slow disk: an fsync (an intent
        at FULL) while the disk's recent durable commits were slow, or not timed yet."""
        if self.durability is not Durability.FULL or self._fast_in_a_row >= _FAST_IN_A_ROW:
            return False
        return any(isinstance(op, _Write) and op.durable for op in ops)

    def _durable_took(self, us: float) -> None:
        """Time one lone durable commit (``INLINE_FSYNC_MAX_US``). Called holding the writer."""
        self._fast_in_a_row = self._fast_in_a_row + 1 if us < INLINE_FSYNC_MAX_US else 0

    def _waiting(self, fn: Callable[[Any], Any], arg: Any) -> Any:
        """``fn(arg)`` on the store's thread, waiting for a locked file. Tried at once first (a file
        nobody else holds, the common case, costs no setting of the timeout and back); on
        SQLITE_BUSY the transaction was rolled back, and it runs again, waiting for the lock.
        Holds the writer meanwhile (any thread but the home loop's may wait for it)."""
        with self._writing:
            return self._waiting_locked(fn, arg)

    def _waiting_locked(self, fn: Callable[[Any], Any], arg: Any) -> Any:
        try:
            return fn(arg)
        except sqlite3.OperationalError as e:
            if not _is_busy(e):
                raise
        try:
            self._conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
            return fn(arg)
        finally:
            self._conn.execute("PRAGMA busy_timeout=0")

    def _write_batch(self, ops: list[_Op]) -> list[Any]:
        """The transaction, for one or more writes (see the module docstring for its order).
        Runs holding ``_writing``."""
        if self._writer_closed:  # a caller's thread came to write as the ledger closed
            raise LedgerClosed(f"ledger {self.path} is closed")
        conn = self._conn
        if self.durability is Durability.FULL:
            # FULL fsyncs before an intent's call may start. Later records of an effect (outcome,
            # receipt, resolution) commit at NORMAL: the WAL makes them durable with the next fsync,
            # and one lost to a power cut leaves the effect open, to be reconciled, never re-run.
            level = "FULL" if any(isinstance(op, _Write) and op.durable for op in ops) else "NORMAL"
            if level != self._sync_level:
                # Unknown until set: an interruption in between must not leave FULL believed.
                self._sync_level = None
                conn.execute(f"PRAGMA synchronous={level}")
                self._sync_level = level
            # A lone intent's commit is timed: its fsync is what decides where the next one runs.
            started = time.perf_counter() if level == "FULL" and len(ops) == 1 else None
        else:
            started = None
        self._committed = None
        try:
            conn.execute("BEGIN IMMEDIATE")  # inside: an interruption as it returns still rolls back
            results = [self._write_effect(conn, op) if isinstance(op, _Write) else op(conn) for op in ops]
            conn.execute("COMMIT")  # 3. durable from here: only then does the caller go on
            self._committed = results  # what an interruption from here on must not undo
            if started is not None:
                self._durable_took((time.perf_counter() - started) * 1e6)
            return results
        except BaseException:
            _rollback(conn)
            raise

    @staticmethod
    def _write_effect(conn: sqlite3.Connection, w: _Write) -> int | None:
        """One append: the last new event's seq (0 when every event was already stored), or None
        when its version check failed (its events are then not inserted)."""
        # 1. the effect row, if its version is still the one folded from (and, to claim, if free)
        sql = _UPDATE_EFFECT if w.row["expected"] else _INSERT_EFFECT
        if conn.execute(sql, w.row).rowcount != 1:
            return None
        # 2. its new events, for the relay (sent = 0) unless they came from Kafka
        seq = 0
        for values in w.encoded:
            cur = conn.execute(_INSERT_EVENT, (*values, w.sent))
            if cur.rowcount == 1:
                seq = cur.lastrowid or seq
        return seq

    async def _bound_wal(self) -> None:
        """Keep the WAL under ``WAL_LIMIT_BYTES``: past it, a RESTART checkpoint on the store's
        thread copies the whole log into the database, and the next transaction writes the log
        from its start again, over the same file (``journal_size_limit`` cuts the file back to the
        limit then). RESTART, not TRUNCATE: a log written over in place never grows its file, so
        an fsync (an intent at FULL) flushes the frames alone, not the file's size and block map
        too (an fsync of a growing file costs about 1.7x here). It waits for this store's
        writes (the next batch queues meanwhile) and, up to ``_CHECKPOINT_WAIT_MS``, for other
        connections; a reader holding an old snapshot makes it give up until the WAL has grown by
        half the limit again. Below the limit nothing happens here: no checkpoint per commit."""
        if self._wal_over():
            await asyncio.get_running_loop().run_in_executor(self._thread, self._bound_wal_holding)

    def _bound_wal_holding(self) -> None:
        with self._writing:
            self._bound_wal_locked()

    def _wal_over(self) -> int:
        """The WAL's size when it is past the limit (and not waiting for a retry), else 0."""
        try:
            size = os.stat(self._wal).st_size
        except OSError:
            return 0
        return size if size > max(WAL_LIMIT_BYTES, self._wal_retry_bytes) else 0

    def _restart_wal_locked(self) -> bool:
        with self._checkpointing:  # a background round ends first (it only copies: it is short)
            self._conn.execute(f"PRAGMA busy_timeout={_CHECKPOINT_WAIT_MS}")
            try:
                busy, _, _ = self._conn.execute("PRAGMA wal_checkpoint(RESTART)").fetchone()
            finally:
                self._conn.execute("PRAGMA busy_timeout=0")
        return busy == 0

    async def limit_pages(self, pages: int | None) -> None:
        """Let the file grow to ``pages`` pages at most (None: no limit): a write that needs more
        fails with ``StorageError`` (SQLITE_FULL), as on a full disk."""
        n = 1_073_741_823 if pages is None else pages

        def limit(conn: sqlite3.Connection) -> None:
            conn.execute(f"PRAGMA max_page_count = {int(n)}")

        await self._commit(limit)

    async def page_count(self) -> int:
        """The file's size in pages."""
        return int(self._read(lambda: self._reader.execute("PRAGMA page_count").fetchone()[0]))

    def add_listener(self, fn: Callable[[int], None]) -> None:
        """Called (in the event loop) with the seq of each committed write meant for the relay."""
        self._listeners.append(fn)

    # -- the outbox --------------------------------------------------------------------------

    async def unsent(self, limit: int, after: int = 0) -> list[tuple[int, str, str, bytes]]:
        """The oldest events not yet acknowledged by Kafka, after seq ``after``:
        (seq, effect_id, kind, body)."""
        return self._read(  # type: ignore[no-any-return]
            lambda: self._reader.execute(
                "SELECT seq, effect_id, kind, body FROM events WHERE sent = 0 AND seq > ? ORDER BY seq LIMIT ?",
                (after, limit),
            ).fetchall()
        )

    async def mark_sent(self, seqs: Sequence[int]) -> None:
        """Mark events acknowledged by the broker. Called only after their delivery reports."""
        ids = list(seqs)

        def mark(conn: sqlite3.Connection) -> None:
            if ids and ids[-1] - ids[0] + 1 == len(ids):
                conn.execute("UPDATE events SET sent = 1 WHERE seq BETWEEN ? AND ? AND sent = 0", (ids[0], ids[-1]))
            else:
                conn.executemany("UPDATE events SET sent = 1 WHERE seq = ?", [(s,) for s in ids])

        await self._commit(mark)

    async def mark_dead(self, dead: Sequence[tuple[int, str]], at_ms: int) -> None:
        """Mark events Kafka refused for good (too large, invalid) as dead-lettered, with the reason:
        ``sent = 2`` takes them out of the outbox, ``dead_letters`` keeps why, for an operator."""
        rows = list(dead)

        def mark(conn: sqlite3.Connection) -> None:
            conn.executemany("UPDATE events SET sent = 2 WHERE seq = ? AND sent = 0", [(seq,) for seq, _ in rows])
            conn.executemany(
                "INSERT OR REPLACE INTO dead_letters (seq, at_ms, reason) VALUES (?, ?, ?)",
                [(seq, at_ms, reason) for seq, reason in rows],
            )

        await self._commit(mark)

    async def resend_refused(self) -> int:
        """Put the rows Kafka's ACLs refused (set aside by the relay, reason starting with
        ``ACL_REFUSED``) back in the outbox, once an administrator gave the right: the relay sends
        them (the fold puts each event in its place whatever the order it arrives in). Returns how
        many. Rows refused for what they are (too large, invalid) stay set aside."""

        def put_back(conn: sqlite3.Connection) -> int:
            seqs = [
                (r[0],) for r in conn.execute("SELECT seq FROM dead_letters WHERE instr(reason, ?) = 1", (ACL_REFUSED,))
            ]
            conn.executemany("UPDATE events SET sent = 0 WHERE seq = ? AND sent = 2", seqs)
            conn.executemany("DELETE FROM dead_letters WHERE seq = ?", seqs)
            return len(seqs)

        return int(await self._commit(put_back))

    async def outbox_depth(self) -> int:
        """Events not yet acknowledged by Kafka."""
        rows = await self.query("SELECT count(*) AS n FROM events WHERE sent = 0")
        return int(rows[0]["n"])

    async def dead_letters(self) -> list[dict[str, Any]]:
        """Events Kafka refused for good, oldest first: seq, effect_id, kind, size, at_ms, reason."""
        return self._read(tables.set_aside, self._reader)  # type: ignore[no-any-return]

    async def record_check(self, effect_id: str, tries: int, next_check_ms: int | None) -> None:
        """Record that reconcilers were asked ``tries`` times, and when to ask next (the backoff:
        operational, not an event; reset when the effect changes state)."""

        def record(conn: sqlite3.Connection) -> None:
            conn.execute(
                "UPDATE effects SET check_tries = ?, next_check_ms = ? WHERE effect_id = ?",
                (tries, next_check_ms, effect_id),
            )

        await self._commit(record)


__all__ = ["Store", "Durability", "ClaimOp", "Claim", "Loaded", "VersionConflict", "State"]

"""A read-only look at an embedded ledger file, for operators' tools (``effects stuck``,
``escalations``, ``trace``, ``audit`` on ``--db``): synchronous, opened ``mode=ro``, so the
ledger is never written through it.

Its queries are the store's (``effect_ledger.sdk.store.tables``); its errors are ``StorageError``
(a missing file, a file that is not a ledger, a damaged page met while reading).
"""

from __future__ import annotations

import sqlite3
import stat
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Any

from effect_ledger.core.model import State
from effect_ledger.errors import StorageError
from effect_ledger.sdk.store import tables

SQLITE_MAGIC = b"SQLite format 3\x00"  # the first 16 bytes of every SQLite database file
_WAL = 2  # the file format's read and write version bytes (offsets 18, 19) in WAL mode


def read_only_uri(p: Path) -> str:
    """The read-only URI of ``p``, for every look at a file that must change nothing (this reader,
    the store's check of a file before it opens it): its path escaped (``Path.as_uri``: a ``#``,
    ``?`` or ``%`` in a name is the name, never a URI's fragment or parameters), ``immutable`` for
    a WAL-mode file without a ``-wal`` (see ``LedgerReader.open``)."""
    real = p.resolve()  # SQLite names the -wal after the file a symlink points to
    uri = real.as_uri() + "?mode=ro"
    try:
        with open(real, "rb") as f:
            head = f.read(20)
    except OSError:
        return uri  # SQLite says what is wrong with it
    wal_mode = head[:16] == SQLITE_MAGIC and head[18:20] == bytes([_WAL, _WAL])
    if wal_mode and not real.with_name(real.name + "-wal").exists():
        uri += "&immutable=1"
    return uri


class LedgerReader:
    """Read-only queries over one ledger file. Rows are ``sqlite3.Row`` (columns by name)."""

    def __init__(self, conn: sqlite3.Connection, path: Path) -> None:
        self._conn = conn
        self.path = path

    @classmethod
    def open(cls, path: str | Path) -> LedgerReader:
        """Open ``path`` read-only; ``StorageError`` when there is no such file, it is not a regular
        file (a folder, a FIFO, a device: never opened, so never waited on) or it is not a ledger.

        Nothing is created beside the file: a read-only connection to a WAL-mode file would create
        its ``-wal`` and ``-shm`` (and leave them behind, a damaged file's too), so a WAL-mode file
        with no ``-wal`` (everything is in the database file: no writer has it open) is read
        ``immutable``, as the store's own look at a file does (``store._refuse_foreign``)."""
        p = Path(path)
        try:
            st = p.stat()
        except FileNotFoundError:
            raise StorageError(f"no ledger file at {p}") from None
        except OSError as e:
            raise StorageError(f"cannot open {p}: {e.strerror or e}") from None
        if not stat.S_ISREG(st.st_mode):
            raise StorageError(f"{p} is not a ledger file (not a regular file)")
        try:
            conn = sqlite3.connect(read_only_uri(p), uri=True)
        except sqlite3.Error as e:
            raise StorageError(f"cannot open {p}: {e}") from e
        conn.row_factory = sqlite3.Row
        try:
            conn.execute("SELECT 1 FROM effects LIMIT 1").fetchall()
        except sqlite3.DatabaseError as e:
            conn.close()
            raise StorageError(f"{p} is not an effect-ledger file: {e}") from e
        return cls(conn, p)

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> LedgerReader:
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.close()

    def _run(self, fn: Any, *args: Any) -> Any:
        try:
            return fn(self._conn, *args)
        except sqlite3.DatabaseError as e:
            raise StorageError(f"{self.path} is not an effect-ledger file, or is damaged: {e}") from e

    def unsettled(self, created_before_ms: int | None = None) -> list[sqlite3.Row]:
        """Effects open or escalated, created before ``created_before_ms`` (None: all), oldest first."""
        return self._run(tables.unsettled, created_before_ms)  # type: ignore[no-any-return]

    def in_state(self, state: State) -> list[sqlite3.Row]:
        """Effects in an unsettled ``state``, oldest first."""
        return self._run(tables.in_state, state)  # type: ignore[no-any-return]

    def check(self) -> None:
        """Read a row of each table: ``StorageError`` now for a file damaged where every reader
        would fail. Rows, not ``count(*)``: a count may come from an index without the table's pages."""
        self._run(lambda c: (c.execute("SELECT * FROM effects LIMIT 1").fetchall(),
                             c.execute("SELECT * FROM events LIMIT 1").fetchall()))  # fmt: skip

    def set_aside(self) -> list[sqlite3.Row]:
        """Outbox rows Kafka refused for good (seq, effect_id, kind, size, at_ms, reason), oldest first."""
        return self._run(tables.set_aside)  # type: ignore[no-any-return]

    def created_between(self, from_ms: int, to_ms: int) -> list[sqlite3.Row]:
        """Effects created in [``from_ms``, ``to_ms``), newest first."""
        return self._run(tables.created_between, from_ms, to_ms)  # type: ignore[no-any-return]

    def intents_created_between(self, from_ms: int, to_ms: int) -> list[sqlite3.Row]:
        """The intents (effect_id, body) of the effects created in [``from_ms``, ``to_ms``)."""
        return self._run(tables.intents_created_between, from_ms, to_ms)  # type: ignore[no-any-return]

    def same_run(self, namespace: str, run_id: str, limit: int) -> list[sqlite3.Row]:
        """The effects of one run, oldest first, at most ``limit``."""
        return self._run(tables.same_run, namespace, run_id, limit)  # type: ignore[no-any-return]

    def events(self) -> Iterator[tuple[int, str, int, bytes]]:
        """Every event row in the order written: (seq, effect_id, at_ms, body)."""
        try:
            cur = self._conn.execute("SELECT seq, effect_id, at_ms, body FROM events ORDER BY seq")
            for r in cur:
                yield r[0], r[1], r[2], r[3]
        except sqlite3.DatabaseError as e:
            raise StorageError(f"{self.path} is not an effect-ledger file, or is damaged: {e}") from e

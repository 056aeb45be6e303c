"""A read-only look at an embedded ledger file, for operators' tools (``effects stuck``,
``escalations``, ``trace``, ``audit`` on ``--db``): synchronous, opened ``mode=ro``, so the
ledger is never written through it.

Its queries are the store's (``effect_ledger.streams.tables``); its errors are ``StorageError``
(a missing file, a file that is not a ledger, a damaged page met while reading).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Any

from effect_ledger.streams import tables
from effect_ledger.streams.errors import StorageError
from effect_ledger.streams.model import State


class LedgerReader:
    """Read-only queries over one ledger file. Rows are ``sqlite3.Row`` (columns by name)."""

    def __init__(self, conn: sqlite3.Connection, path: Path) -> None:
        self._conn = conn
        self.path = path

    @classmethod
    def open(cls, path: str | Path) -> LedgerReader:
        """Open ``path`` read-only; ``StorageError`` when there is no such file or it is not a ledger."""
        p = Path(path)
        if not p.exists():
            raise StorageError(f"no ledger file at {p}")
        try:
            conn = sqlite3.connect(f"file:{p}?mode=ro", uri=True)
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

    def created_between(self, from_ms: int, to_ms: int) -> list[sqlite3.Row]:
        """Effects created in [``from_ms``, ``to_ms``), newest first."""
        return self._run(tables.created_between, from_ms, to_ms)  # type: ignore[no-any-return]

    def events(self) -> Iterator[tuple[int, str, int, bytes]]:
        """Every event row in the order written: (seq, effect_id, at_ms, body)."""
        try:
            cur = self._conn.execute("SELECT seq, effect_id, at_ms, body FROM events ORDER BY seq")
            for r in cur:
                yield r[0], r[1], r[2], r[3]
        except sqlite3.DatabaseError as e:
            raise StorageError(f"{self.path} is not an effect-ledger file, or is damaged: {e}") from e

"""The sink's two databases, SQLite and PostgreSQL: every dialect difference lives here.

Both get the same table ``effects`` (same columns, same indexes) and ``sink_offsets``; ``write``
stores a batch of rows and the consumed offsets in ONE transaction, so a crash never leaves rows
without their offsets or offsets without their rows. A row is only replaced by a state of the
same or a newer version. psycopg (the ``[postgres]`` extra) is imported only for a
``postgresql://`` URL, so the base install never needs it.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from effect_ledger.core.urls import safe_url
from effect_ledger.ops.sources import SourceError
from effect_ledger.sdk.store.tables import ROW_COLUMNS

# BIGINT: epoch milliseconds overflow PostgreSQL's 4-byte INTEGER; SQLite reads it as INTEGER.
SCHEMA = (
    """CREATE TABLE IF NOT EXISTS effects (
    effect_id      TEXT PRIMARY KEY,
    state          TEXT NOT NULL,
    target         TEXT NOT NULL,
    operation      TEXT NOT NULL,
    namespace      TEXT NOT NULL,
    run_id         TEXT NOT NULL,
    step           TEXT NOT NULL,
    attempt        BIGINT NOT NULL,
    version        BIGINT NOT NULL,
    created_ms     BIGINT NOT NULL,
    updated_ms     BIGINT NOT NULL,
    deadline_ms    BIGINT,
    receipt_id     TEXT,
    executions     BIGINT NOT NULL,
    flags          TEXT NOT NULL,
    reason         TEXT
)""",
    "CREATE INDEX IF NOT EXISTS effects_state_updated ON effects(state, updated_ms)",
    "CREATE INDEX IF NOT EXISTS effects_updated ON effects(updated_ms)",
    "CREATE INDEX IF NOT EXISTS effects_target ON effects(target, state)",
    """CREATE TABLE IF NOT EXISTS sink_offsets (
    topic       TEXT NOT NULL,
    partition   INTEGER NOT NULL,
    next_offset BIGINT NOT NULL,
    PRIMARY KEY (topic, partition)
)""",
)

COLUMNS = ROW_COLUMNS  # the ledger file's effect row (``tables.state_row`` builds both)


def _upsert(param: str) -> str:
    """The row upsert with ``param`` (``:{}`` or ``%({})s``) as the named-placeholder style."""
    names = ", ".join(COLUMNS)
    values = ", ".join(param.format(c) for c in COLUMNS)
    updates = ", ".join(f"{c} = excluded.{c}" for c in COLUMNS[1:])
    return (
        f"INSERT INTO effects ({names}) VALUES ({values}) ON CONFLICT (effect_id) DO UPDATE SET {updates} "
        "WHERE excluded.version >= effects.version"
    )


def _offset_upsert(param: str) -> str:
    t, p, o = (param.format(n) for n in ("topic", "partition", "next_offset"))
    return (
        f"INSERT INTO sink_offsets (topic, partition, next_offset) VALUES ({t}, {p}, {o}) "
        "ON CONFLICT (topic, partition) DO UPDATE SET next_offset = excluded.next_offset"
    )


class SinkStore(Protocol):
    describe: str  # where the rows go, for messages (never a password)

    def offsets(self, topic: str) -> dict[int, int]: ...

    def write(
        self, rows: Sequence[dict[str, Any]], topic: str, offsets: dict[int, int], deletes: Sequence[str] = ()
    ) -> None: ...

    def close(self) -> None: ...


def _offset_rows(topic: str, offsets: dict[int, int]) -> list[dict[str, Any]]:
    return [{"topic": topic, "partition": p, "next_offset": o} for p, o in sorted(offsets.items())]


class SqliteStore:
    """``sqlite:///ops.db`` (relative) or ``sqlite:////abs/ops.db``."""

    def __init__(self, url: str) -> None:
        self.path = Path(url[len("sqlite:///") :])
        self.describe = str(self.path)
        try:
            self.db = sqlite3.connect(self.path, isolation_level=None)
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.executescript(";\n".join(SCHEMA) + ";")
        except sqlite3.Error as e:
            raise SourceError(f"--to {url}: cannot open {self.path}: {e}") from None

    def offsets(self, topic: str) -> dict[int, int]:
        rows = self.db.execute("SELECT partition, next_offset FROM sink_offsets WHERE topic = ?", (topic,))
        return {p: o for p, o in rows}

    def write(
        self, rows: Sequence[dict[str, Any]], topic: str, offsets: dict[int, int], deletes: Sequence[str] = ()
    ) -> None:
        self.db.execute("BEGIN IMMEDIATE")
        try:
            self.db.executemany(_upsert(":{}"), rows)
            self.db.executemany("DELETE FROM effects WHERE effect_id = ?", [(k,) for k in deletes])
            self.db.executemany(_offset_upsert(":{}"), _offset_rows(topic, offsets))
            self.db.execute("COMMIT")
        except BaseException:
            self.db.execute("ROLLBACK")
            raise

    def close(self) -> None:
        self.db.close()


CONNECT_TIMEOUT_S = 10  # an unreachable server is reported after this long, never waited on forever


def _redacted(url: str) -> str:
    """The URL without its password or query values, for messages and evidence (one rule for every URL
    the ledger shows: ``effect_ledger.core.urls.safe_url``)."""
    return safe_url(url)


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split())  # libpq's messages run over several lines


class PostgresStore:
    """``postgresql://[user[:password]@]host[:port]/dbname[?options]`` (libpq's URL)."""

    def __init__(self, url: str) -> None:
        from effect_ledger._extras import require

        require("postgres", "effects sink --to postgresql://")
        import psycopg

        self.describe = _redacted(url)
        self._error = psycopg.Error
        try:
            self.db = psycopg.connect(url, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S)
        except psycopg.Error as e:
            raise SourceError(f"--to {self.describe}: cannot connect: {_one_line(e)}") from None
        try:
            with self.db.transaction():
                for statement in SCHEMA:
                    self.db.execute(statement)
        except psycopg.Error as e:
            self.db.close()
            raise SourceError(f"--to {self.describe}: cannot create the tables: {_one_line(e)}") from None

    def offsets(self, topic: str) -> dict[int, int]:
        rows = self.db.execute("SELECT partition, next_offset FROM sink_offsets WHERE topic = %s", (topic,))
        return {p: o for p, o in rows.fetchall()}

    def write(
        self, rows: Sequence[dict[str, Any]], topic: str, offsets: dict[int, int], deletes: Sequence[str] = ()
    ) -> None:
        try:
            with self.db.transaction(), self.db.cursor() as cur:
                cur.executemany(_upsert("%({})s"), rows)
                if deletes:
                    cur.executemany("DELETE FROM effects WHERE effect_id = %s", [(k,) for k in deletes])
                cur.executemany(_offset_upsert("%({})s"), _offset_rows(topic, offsets))
        except self._error as e:
            raise SourceError(f"--to {self.describe}: {_one_line(e)} (the batch was rolled back)") from None

    def close(self) -> None:
        self.db.close()


def open_store(url: str) -> SinkStore:
    """The store a ``--to`` URL names; ``SourceError`` (one line) for anything else."""
    if url.startswith("sqlite:///"):
        return SqliteStore(url)
    if url.startswith(("postgresql://", "postgres://")):
        return PostgresStore(url)
    raise SourceError(f"--to {url!r}: give sqlite:///PATH or postgresql://HOST/DB")

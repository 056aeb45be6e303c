"""``kind = "sql"``: the effect is a row in the destination's own database, guarded by its key.

Key placement: the effect key goes into a column with a UNIQUE constraint (``key_column``) of the
row the effect writes, in the same transaction as the effect itself:

* ``insert(key, row)``: ``INSERT ... ON CONFLICT (key_column) DO NOTHING RETURNING id_column``; a
  second insert with the same key changes nothing and returns the first row's id.
* ``decrement(key, item, quantity)`` (with ``stock`` declared): the keyed row (the stock movement)
  and ``UPDATE stock SET qty = qty - n WHERE item = ? AND qty >= n`` commit together or not at
  all. A decrement that would go below zero rolls back and raises ``OutOfStock`` (FAILED, nothing
  changed); a repeated key decrements nothing.

Lookup (``check``): ``SELECT id_column, key_column FROM table WHERE key_column = ? LIMIT 2``. One
row whose key is exactly the effect's is Found with the row's id (the destination's own id); no
row is Absent, because the key row commits in the same transaction as the effect, so "no row" is
the database's own word that nothing committed. Anything else (two rows: the column is not unique;
a key that only collates equal; a NULL id) is not in the expected shape and, by the evidence rule
(``effect_ledger.targets.evidence``), Unknown. A database that cannot be reached or read, a missing
table or SQLite file, is Unknown: the lookup never creates or changes anything (SQLite is opened
read-only).

``database`` is ``sqlite:////ABSOLUTE/PATH`` or ``sqlite:///RELATIVE/PATH`` (to the working
directory of each process that reads the targets; the standard library's sqlite3) or
``postgresql://...`` (libpq's URL; psycopg, the ``[postgres]`` extra). Table and column names are
plain SQL names (letters, digits, ``_``, at most 63, optionally ``schema.table``); a row holds at
most ``MAX_COLUMNS`` columns of strings, numbers, booleans, NULL or bytes, ``MAX_ROW_BYTES`` in all.
"""

from __future__ import annotations

import asyncio
import re
import sqlite3
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from effect_ledger.core.reconcile import Absent, Answer, EffectView, Found, Unknown
from effect_ledger.core.urls import safe_url
from effect_ledger.errors import DestinationError, OutOfStock
from effect_ledger.targets.ask import DEFAULT_ASK_TIMEOUT_S
from effect_ledger.targets.evidence import Provenance, admit

__all__ = ["MAX_COLUMNS", "MAX_ROW_BYTES", "SqlDestination", "Stock"]

MAX_COLUMNS = 64  # columns of one row written by insert/decrement, the key and id not counted
MAX_ROW_BYTES = 1 << 20  # the values of one row together: an effect is a record, not a data load
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")
_VALUE = (str, int, float, bool, bytes, type(None))


def _name(text: str, what: str, *, dotted: bool = False) -> str:
    """``text`` double-quoted as an SQL identifier, or ``ValueError``."""
    parts = text.split(".") if dotted else [text]
    if not text or len(parts) > 2 or not all(_NAME.match(p) for p in parts):
        raise ValueError(f"{what} {text!r} must be a plain SQL name (letters, digits, _; at most 63)")
    return ".".join(f'"{p}"' for p in parts)


@dataclass(frozen=True, slots=True)
class Stock:
    """The stock a ``decrement`` takes from: ``table`` has one row per ``item_column`` value with
    its quantity in ``quantity_column``; the keyed row records the movement in the same columns."""

    table: str
    item_column: str = "item"
    quantity_column: str = "quantity"


class SqlDestination:
    """A table in a destination database, written with the effect key in ``key_column`` and asked by
    it (see the module docstring). It is the target's reconciler (``check``) and the call
    (``insert``, ``decrement``) at once, so both use the same declaration."""

    def __init__(
        self,
        database: str,
        table: str,
        *,
        name: str = "sql",
        key_column: str = "effect_key",
        id_column: str = "id",
        stock: Stock | None = None,
        timeout: float = DEFAULT_ASK_TIMEOUT_S,
    ) -> None:
        self._table, self._key, self._id = (
            _name(table, "table", dotted=True),
            _name(key_column, "key_column"),
            _name(id_column, "id_column"),
        )
        self._stock = None
        if stock is not None:
            self._stock = (
                _name(stock.table, "stock table", dotted=True),
                _name(stock.item_column, "stock item_column"),
                _name(stock.quantity_column, "stock quantity_column"),
            )
        if database.startswith("sqlite:///"):
            self._path = Path(database[len("sqlite:///") :])
            self._postgres = False
        elif database.startswith(("postgresql://", "postgres://")):
            from effect_ledger._extras import require

            # At declaration, not at the first call: a call that cannot even start would be uncertain.
            require("postgres", f'target {name!r} (kind = "sql" on PostgreSQL)')
            self._path = Path()
            self._postgres = True
        else:
            raise ValueError(f"database {_redacted(database)!r}: give sqlite:////ABSOLUTE/PATH or postgresql://HOST/DB")
        if not 0 < timeout <= 3600:
            raise ValueError("timeout must be from 0 to 3600 seconds")
        self.database = database
        self.table = table
        self.name = name
        self._timeout_s = timeout
        self.where = f"{_redacted(database)}#{table}"  # the resource the lookup names

    @property
    def timeout_s(self) -> float:
        """How long one lookup or write may take."""
        return self._timeout_s

    # --- the calls -------------------------------------------------------------------------------

    async def insert(self, key: str, row: Mapping[str, Any]) -> dict[str, Any]:
        """Insert ``row`` with ``key`` in the key column: ``{"table", "id"}`` of the new row, or of
        the row the key already wrote (nothing is written twice); the id is the receipt.
        ``DestinationError`` before anything is sent for a row it cannot write."""
        columns, values = self._row(key, row)
        return {"table": self.table, "id": await asyncio.to_thread(self._write, columns, values, None)}

    async def decrement(
        self, key: str, item: str | int, quantity: int, row: Mapping[str, Any] | None = None
    ) -> dict[str, Any]:
        """Take ``quantity`` of ``item`` from the stock and record the movement row (``row`` plus
        the item and quantity) under ``key``, in one transaction: ``{"table", "id"}`` of the movement. Raises
        ``OutOfStock`` (nothing changed) when the stock holds less than ``quantity``."""
        if self._stock is None:
            raise DestinationError(f"target {self.name!r}: decrement needs a declared stock table")
        if isinstance(quantity, bool) or not isinstance(quantity, int) or quantity <= 0:
            raise DestinationError(f"decrement quantity must be a whole number above zero, not {quantity!r}")
        _, item_col, qty_col = self._stock
        extra = dict(row or {})
        columns, values = self._row(key, extra)
        columns += [item_col, qty_col]
        values += [item, quantity]
        return {"table": self.table, "id": await asyncio.to_thread(self._write, columns, values, (item, quantity))}

    def _row(self, key: str, row: Mapping[str, Any]) -> tuple[list[str], list[Any]]:
        if not isinstance(key, str) or not key:
            raise DestinationError("the effect key must be a non-empty string")
        if len(row) > MAX_COLUMNS:
            raise DestinationError(f"a row holds at most {MAX_COLUMNS} columns, not {len(row)}")
        columns: list[str] = [self._key]
        values: list[Any] = [key]
        size = len(key)
        for column, value in row.items():
            try:
                columns.append(_name(column, "column"))
            except ValueError as e:
                raise DestinationError(str(e)) from None
            if not isinstance(value, _VALUE):
                raise DestinationError(
                    f"column {column!r}: {type(value).__name__} is not a string, number, bool, bytes or None"
                )
            size += len(value) if isinstance(value, str | bytes) else 8
            values.append(value)
        if size > MAX_ROW_BYTES:
            raise DestinationError(f"a row holds at most {MAX_ROW_BYTES} bytes")
        if len(set(columns)) != len(columns):
            raise DestinationError("a column is named twice (or is the key column)")
        return columns, values

    def _write(self, columns: list[str], values: list[Any], take: tuple[Any, int] | None) -> Any:
        p = "%s" if self._postgres else "?"
        insert = (
            f"INSERT INTO {self._table} ({', '.join(columns)}) VALUES ({', '.join([p] * len(values))}) "
            f"ON CONFLICT ({self._key}) DO NOTHING RETURNING {self._id}"
        )
        key = values[0]
        with self._connect(write=True) as (db, commit, rollback):
            cur = db.cursor()
            cur.execute(insert, values)
            new = cur.fetchone()
            if new is None:  # the key wrote its row before: that row is the effect, do nothing again
                rollback()
                cur.execute(f"SELECT {self._id} FROM {self._table} WHERE {self._key} = {p}", (key,))
                old = cur.fetchone()
                if old is None:
                    raise DestinationError(f"{self.where}: the key conflicts but no row holds it")
                return old[0]
            if take is not None and self._stock is not None:
                table, item_col, qty_col = self._stock
                item, n = take
                cur.execute(
                    f"UPDATE {table} SET {qty_col} = {qty_col} - {p} WHERE {item_col} = {p} AND {qty_col} >= {p}",
                    (n, item, n),
                )
                if cur.rowcount != 1:
                    rollback()
                    raise OutOfStock(f"{self.where}: fewer than {n} of {item!r} in stock; nothing changed")
            commit()
            return new[0]

    # --- the lookup ------------------------------------------------------------------------------

    async def check(self, effect: EffectView) -> Answer:
        """Found (the row's id), Absent (no row holds the key) or Unknown; never raises."""
        try:
            rows = await asyncio.to_thread(self._lookup, effect.effect_id)
        except Exception as e:  # a database that cannot answer: whatever its driver raises
            return Unknown(f"{self.where}: {type(e).__name__}: {_one_line(e)}")
        return self.interpret(effect.effect_id, rows)

    def interpret(self, key: str, rows: list[tuple[Any, ...]]) -> Answer:
        """Map the lookup's rows (at most two of ``(id, key)``) to an answer, through the evidence rule."""
        shape: str | None = None
        answer: Answer
        if not rows:
            answer = Absent(f"no row of {self.table} holds the key")
        else:
            row_id, row_key = rows[0]
            answer = Found(str(row_id), {"table": self.table, "id": row_id})
            if len(rows) > 1:
                shape = f"{len(rows)} rows hold the key: the key column is not unique"
            elif row_key != key:
                shape = f"the row found holds key {str(row_key)[:100]!r}, not the effect's"
            elif row_id is None:
                shape = "the row found has no id"
        return admit(answer, Provenance(self.where, self.where, shape_error=shape))

    def _lookup(self, key: str) -> list[tuple[Any, ...]]:
        p = "%s" if self._postgres else "?"
        query = f"SELECT {self._id}, {self._key} FROM {self._table} WHERE {self._key} = {p} LIMIT 2"
        with self._connect(write=False) as (db, _, rollback):
            cur = db.cursor()
            cur.execute(query, (key,))
            rows = [tuple(r) for r in cur.fetchall()]
            rollback()
            return rows

    def _connect(self, *, write: bool) -> _Connection:
        return _Connection(self, write)


class _Connection:
    """One connection for one write or lookup: ``(connection, commit, rollback)``; closed on exit,
    rolled back when nothing committed."""

    def __init__(self, dest: SqlDestination, write: bool) -> None:
        self._dest = dest
        self._write = write
        self._db: Any = None

    def __enter__(self) -> tuple[Any, Callable[[], None], Callable[[], None]]:
        d = self._dest
        if d._postgres:
            import psycopg  # present: the declaration required the [postgres] extra

            ms = int(d.timeout_s * 1000)
            self._db = psycopg.connect(
                d.database,
                connect_timeout=max(1, int(d.timeout_s)),
                options=f"-c statement_timeout={ms} -c lock_timeout={ms}",
            )
        else:
            if self._write:
                self._db = sqlite3.connect(d._path, timeout=d.timeout_s, isolation_level=None)
                self._db.execute("BEGIN IMMEDIATE")
            else:
                # Read-only, and never created: a missing file is "cannot tell", not an empty database.
                self._db = sqlite3.connect(
                    d._path.absolute().as_uri() + "?mode=ro", uri=True, timeout=d.timeout_s, isolation_level=None
                )
                self._db.execute("BEGIN")
        db = self._db
        return db, lambda: _finish(db, "COMMIT", d._postgres), lambda: _finish(db, "ROLLBACK", d._postgres)

    def __exit__(self, *exc: object) -> None:
        try:
            if self._db is not None and exc[0] is not None:
                _finish(self._db, "ROLLBACK", self._dest._postgres)
        except Exception:  # the connection is going away anyway; the first error is the one to report
            pass
        finally:
            if self._db is not None:
                self._db.close()


def _finish(db: Any, how: str, postgres: bool) -> None:
    if postgres:
        db.commit() if how == "COMMIT" else db.rollback()
    elif db.in_transaction:
        db.execute(how)


def _redacted(url: str) -> str:
    """The URL without its password or query values, for messages and evidence (one rule for every URL
    the ledger shows: ``effect_ledger.core.urls.safe_url``)."""
    return safe_url(url)


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split())[:300]

"""The sink's store layer without a broker: the URL picks the database, PostgreSQL without the
``[postgres]`` extra is one ``MissingExtra`` naming it, and a batch that fails leaves neither its
rows nor its offsets."""

from __future__ import annotations

import sqlite3
import sys
from pathlib import Path

import pytest

from effect_ledger.errors import MissingExtra
from effect_ledger.ops.sink_db import COLUMNS, SqliteStore, open_store
from effect_ledger.ops.sources import SourceError


def row(key: str, version: int) -> dict[str, object]:
    r: dict[str, object] = {c: "x" for c in COLUMNS}
    r.update(effect_id=key, attempt=1, version=version, created_ms=1, updated_ms=2, executions=0, deadline_ms=None)
    return r


def test_postgres_without_the_extra_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "psycopg", None)  # as if not installed
    with pytest.raises(MissingExtra) as e:
        open_store("postgresql://127.0.0.1/ops")
    assert str(e.value) == (
        "effects sink --to postgresql:// needs the postgres extra: pip install 'effect-ledger-kafka[postgres]'"
    )


def test_an_unknown_scheme_is_refused() -> None:
    with pytest.raises(SourceError, match="give sqlite:///PATH or postgresql://HOST/DB"):
        open_store("mysql://h/db")


def test_rows_and_offsets_commit_together_or_not_at_all(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'ops.db'}")
    assert isinstance(store, SqliteStore)
    store.write([row("a", 1)], "t", {0: 1})
    store.write([row("a", 2), row("b", 1)], "t", {0: 3})
    store.write([row("a", 1)], "t", {0: 4})  # an older version never replaces a newer one
    with pytest.raises(sqlite3.IntegrityError):
        store.write([row("c", 1), {**row("d", 1), "state": None}], "t", {0: 9})  # NOT NULL fails mid-batch
    assert store.offsets("t") == {0: 4}
    with sqlite3.connect(tmp_path / "ops.db") as conn:
        assert conn.execute("SELECT effect_id, version FROM effects ORDER BY 1").fetchall() == [("a", 2), ("b", 1)]
    store.close()

"""The WAL reader of ``python -m tests.bench.wal_frames``: transactions and their pages, read from a
real SQLite WAL, and each page named by SQLite's own ``dbstat``."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

from tests.bench.wal_frames import frames, owners


def _wal_db(tmp_path: Path) -> tuple[Path, bytes]:
    db = tmp_path / "t.db"
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("PRAGMA page_size=1024")
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA wal_autocheckpoint=0")
    conn.execute("CREATE TABLE a (k INTEGER PRIMARY KEY, v BLOB)")
    conn.execute("CREATE TABLE b (k INTEGER PRIMARY KEY, v BLOB)")
    for i in range(3):  # three transactions, each one row of a only
        conn.execute("INSERT INTO a (v) VALUES (?)", (bytes(100 + i),))
    conn.execute("BEGIN")  # one transaction over both tables, a row too large for one page in b
    conn.execute("INSERT INTO a (v) VALUES (?)", (b"x",))
    conn.execute("INSERT INTO b (v) VALUES (?)", (bytes(3000),))
    conn.execute("COMMIT")
    snap = tmp_path / "snap.db"
    shutil.copyfile(db, snap)
    shutil.copyfile(str(db) + "-wal", str(snap) + "-wal")
    conn.close()
    return snap, (tmp_path / "snap.db-wal").read_bytes()


def test_transactions_and_their_pages(tmp_path: Path) -> None:
    snap, wal = _wal_db(tmp_path)
    page_size, txns = frames(wal)
    assert page_size == 1024
    # journal_mode and the two CREATEs are transactions too: 2 schema + 3 + 1 at the end
    assert len(txns) == 6
    names = owners(snap)
    root_a = {p for p, n in names.items() if n.startswith("a:")}
    for txn in txns[2:5]:  # a single-page table: each insert rewrote its one leaf
        assert set(txn) == root_a
    last = [names.get(p, "?") for p in txns[-1]]
    assert any(n.startswith("a:") for n in last)
    assert sum(n.startswith("b:") for n in last) >= 3  # b's row overflowed onto more pages


def test_a_torn_tail_is_not_a_transaction(tmp_path: Path) -> None:
    _, wal = _wal_db(tmp_path)
    page_size, txns = frames(wal)
    cut = wal[: len(wal) - page_size // 2]  # the last frame only half written
    assert frames(cut)[1] == txns[:-1]  # its commit frame is gone: the transaction never happened
    assert frames(b"") == (0, [])

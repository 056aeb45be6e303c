"""``effects sink --to postgresql://...`` against a real PostgreSQL server (tests/postgres.py) and
the shared broker: the known incident sunk into both databases gives the same table and the same
answers to the on-call queries of docs/guides/oncall-sql.md; a sink killed mid-transaction leaves rows and offsets
consistent and a restart completes it with no row lost or doubled; an unreachable database is
one line and exit 1.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from effect_ledger.core.urls import safe_url
from effect_ledger.ops.sink import effect_row
from effect_ledger.ops.sink_db import COLUMNS, SCHEMA
from tests.integration import test_ops_kafka
from tests.integration.test_ops_kafka import (
    ROOT,
    SQL_BY_TARGET,
    SQL_CONFIRMED_BY_RECONCILIATION,
    SQL_DUPLICATES,
    SQL_STUCK,
    SQL_UNCERTAIN_LAST_HOUR,
    Setup,
    cli,
    final_state,
    ok,
)
from tests.topic_io import TopicReader

setup = test_ops_kafka.setup  # the known incident on fresh topics, folded by the processor (module scope)

pytestmark = pytest.mark.integration

WAIT = 60.0

# The PostgreSQL forms (docs/guides/oncall-sql.md) of the two queries that read the clock (SQLite's
# strftime('%s','now') is extract(epoch from now()) in PostgreSQL); the other three run unchanged.
PG_UNCERTAIN_LAST_HOUR = (
    "SELECT effect_id FROM effects WHERE state = 'UNCERTAIN' "
    "AND updated_ms > (extract(epoch from now())::bigint - 3600) * 1000"
)
PG_STUCK = (
    "SELECT effect_id, state, target, created_ms FROM effects "
    "WHERE state IN ('PENDING','EXECUTED','UNCERTAIN','ESCALATED') "
    "AND created_ms < (extract(epoch from now())::bigint - 600) * 1000 ORDER BY created_ms"
)
# (SQLite form, PostgreSQL form) of each query of docs/guides/oncall-sql.md.
ON_CALL = {
    "uncertain in the last hour": (SQL_UNCERTAIN_LAST_HOUR, PG_UNCERTAIN_LAST_HOUR),
    "stuck": (SQL_STUCK, PG_STUCK),
    "by target": (SQL_BY_TARGET, SQL_BY_TARGET),
    "executed more than once": (SQL_DUPLICATES, SQL_DUPLICATES),
    "confirmed by a reconciler": (SQL_CONFIRMED_BY_RECONCILIATION, SQL_CONFIRMED_BY_RECONCILIATION),
}


@pytest.fixture
def pg_db(postgres_url: str) -> Iterator[str]:
    """A fresh database on the session's server; the URL to it."""
    name = f"t{uuid.uuid4().hex[:12]}"
    with psycopg.connect(postgres_url, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name}")
    yield postgres_url.rsplit("/", 1)[0] + f"/{name}"
    with psycopg.connect(postgres_url, autocommit=True) as admin:
        admin.execute(f"DROP DATABASE {name} WITH (FORCE)")


def pg(url: str, sql: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(url, autocommit=True) as conn:
        return [tuple(r) for r in conn.execute(sql).fetchall()]


def lite(db: Path, sql: str) -> list[tuple[Any, ...]]:
    with sqlite3.connect(db) as conn:
        return [tuple(r) for r in conn.execute(sql)]


ALL_ROWS = f"SELECT {', '.join(COLUMNS)} FROM effects ORDER BY effect_id"


def sqlite_reference(setup: Setup, tmp_path: Path) -> Path:
    ok(cli("sink", *setup.p, "--to", f"sqlite:///{tmp_path / 'ref.db'}", "--once"))
    return tmp_path / "ref.db"


def test_postgres_sink_gives_the_sqlite_sinks_answers(setup: Setup, pg_db: str, tmp_path: Path) -> None:
    inc = setup.inc
    first = ok(cli("sink", *setup.p, "--to", pg_db, "--once"))
    assert first.startswith("sink: ") and safe_url(pg_db) in first, first  # its user name is not shown
    ref = sqlite_reference(setup, tmp_path)
    rows = pg(pg_db, ALL_ROWS)
    assert len(rows) == len(inc.doubled + inc.stuck + inc.uncertain + inc.normal)
    assert rows == lite(ref, ALL_ROWS)  # the same columns, the same values

    # Three queries have no ORDER BY: the same rows, in whichever order each database returns them.
    answers = {name: sorted(pg(pg_db, pg_sql)) for name, (_, pg_sql) in ON_CALL.items()}
    assert answers == {name: sorted(lite(ref, lite_sql)) for name, (lite_sql, _) in ON_CALL.items()}
    assert pg(pg_db, PG_STUCK) == sorted(pg(pg_db, PG_STUCK), key=lambda r: r[3])
    assert pg(pg_db, SQL_BY_TARGET) == answers["by target"]
    # ... and they are the incident's known answers, not two equally empty results.
    assert sorted(k for (k,) in answers["uncertain in the last hour"]) == sorted(inc.stuck)
    assert sorted(k for k, *_ in answers["stuck"]) == sorted(inc.stuck)
    assert sorted(k for (k,) in answers["executed more than once"]) == sorted(inc.doubled)
    assert len(answers["confirmed by a reconciler"]) == len(inc.uncertain)
    assert sum(n for *_, n in answers["by target"]) == len(rows)
    assert {(t, s) for t, s, _ in answers["by target"]} == {(k.split(":", 1)[0], final_state(inc, k)) for k, *_ in rows}

    # Restart: nothing new on effects.state, nothing added, nothing doubled.
    again = ok(cli("sink", *setup.p, "--to", pg_db, "--once"))
    assert again.startswith("sink: 0 state records"), again
    assert pg(pg_db, ALL_ROWS) == rows


GATE = 4242  # the advisory lock the test holds to stop the sink inside a transaction


def test_killed_mid_transaction_then_restarted(setup: Setup, pg_db: str, tmp_path: Path) -> None:
    """A trigger makes the sink wait (on a lock the test holds) in the middle of a batch once 100
    rows exist; the sink is killed there. The committed rows are exactly the states below the
    committed offsets; a restart consumes exactly the rest and ends equal to the SQLite sink."""
    with psycopg.connect(pg_db, autocommit=True) as conn:
        for statement in SCHEMA:
            conn.execute(statement)
        conn.execute(
            "CREATE FUNCTION gate() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            f"IF (SELECT count(*) FROM effects) >= 100 THEN PERFORM pg_advisory_xact_lock_shared({GATE}); END IF; "
            "RETURN NEW; END $$"
        )
        conn.execute("CREATE TRIGGER gate BEFORE INSERT ON effects FOR EACH ROW EXECUTE FUNCTION gate()")
    with TopicReader(setup.cfg, setup.cfg.topics.state) as reader:
        records = reader.drain(WAIT)
    total = len(records)

    holder = psycopg.connect(pg_db, autocommit=True)
    try:
        holder.execute(f"SELECT pg_advisory_lock({GATE})")
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
        app = f"{pg_db}?application_name=killed-sink"
        sink = subprocess.Popen(
            [sys.executable, "-m", "effect_ledger", "sink", *setup.p, "--to", app, "--batch", "50"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        waiting = "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
        try:
            until(lambda: holder.execute(waiting).fetchone() == (1,), "the sink waiting inside a transaction")
        finally:
            sink.send_signal(signal.SIGKILL)
            sink.communicate(timeout=WAIT)
        holder.execute(f"SELECT pg_advisory_unlock({GATE})")
        gone = "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'killed-sink'"
        until(lambda: holder.execute(gone).fetchone() == (0,), "the killed sink's session to end")
        holder.execute("DROP TRIGGER gate ON effects")
    finally:
        holder.close()

    committed = dict(pg(pg_db, "SELECT partition, next_offset FROM sink_offsets"))
    done = sum(committed.values())
    assert 0 < done < total, (committed, total)
    # The committed rows are the latest state per effect among the records below the offsets.
    below: dict[str, Any] = {}
    for r in sorted(records, key=lambda r: (r.partition, r.offset)):
        if r.value is not None and r.offset < committed.get(r.partition, 0):
            below[r.value.effect_id] = r.value
    want = sorted(tuple(effect_row(st)[c] for c in COLUMNS) for st in below.values())
    assert pg(pg_db, ALL_ROWS) == want

    rest = ok(cli("sink", *setup.p, "--to", pg_db, "--once"))
    assert rest.startswith(f"sink: {total - done:,} state records"), (rest, total, done)
    ends = {}
    for r in records:
        ends[r.partition] = max(ends.get(r.partition, 0), r.offset + 1)
    assert dict(pg(pg_db, "SELECT partition, next_offset FROM sink_offsets")) == ends
    assert pg(pg_db, ALL_ROWS) == lite(sqlite_reference(setup, tmp_path), ALL_ROWS)


def until(condition: Any, what: str, timeout: float = WAIT) -> None:
    end = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > end:
            raise TimeoutError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_unreachable_database_is_one_line(setup: Setup, postgres_url: str) -> None:
    """Nobody listening, and a database that does not exist: one line, exit 1, nothing created."""
    base = postgres_url.rsplit("/", 1)[0]
    nobody = f"postgresql://app:secret@127.0.0.1:{free_port()}/ops"
    for url in (nobody, f"{base}/no_such_database"):
        r = cli("sink", *setup.p, "--to", url, "--once")
        assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("effects: --to ") and "cannot connect" in lines[0], r.stderr
        assert "secret" not in r.stderr  # the password is not echoed
    assert pg(postgres_url, "SELECT count(*) FROM pg_database WHERE datname = 'no_such_database'") == [(0,)]

"""Every crash point x every built-in destination kind (issue 34): a real mail server (SMTP and
IMAP, tests/mailserver.py), a SQLite file and a real PostgreSQL server; the agent
(tests/crash/destination_agent.py) is killed with SIGKILL at each point of the crash matrix and
started again, then the runner settles what is open.

Each cell must end CONFIRMED with exactly one email (one in the customer's mailbox, one copy in the
archive) or one row and one stock decrement, and the receipt must be the destination's own id: the
Message-ID, the row's id. The cells after the destination accepted the call (after_call) are
confirmed by the reconciler's lookup, which is what this file proves for each kind."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from effect_ledger.core.keys import effect_key
from effect_ledger.sdk import crashpoints
from effect_ledger.targets.mail import message_id_for
from tests.crash.destination_agent import OPERATION, STEP, TARGET
from tests.crash.matrix import Cell, Run, table
from tests.destinations import SqlDb, evidence, mail_count, mail_declaration, settle
from tests.mailserver import MailServer

KINDS = ("smtp", "sqlite", "postgresql")


def agent(
    targets: Path, workdir: Path, kind: str, run_id: str, crash: str | None, mode: str = "ledger", order: str = "123"
) -> int:
    env = dict(os.environ)
    env.pop(crashpoints.ENV, None)
    if crash:
        env[crashpoints.ENV] = crash
    cmd = [sys.executable, "-m", "tests.crash.destination_agent", "--targets", str(targets), "--workdir", str(workdir)]
    cmd += ["--kind", "smtp" if kind == "smtp" else "sql", "--run-id", run_id, "--mode", mode, "--order", order]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    if p.returncode not in (0, 3, 5, -signal.SIGKILL):
        raise RuntimeError(f"agent crashed unexpectedly ({p.returncode}): {p.stderr[-3000:]}")
    if p.returncode == 0:
        json.loads(p.stdout.strip().splitlines()[-1])
    return p.returncode


def naive_run(kind: str, tmp: Path, mail_server: MailServer, postgres_url: str) -> Run:
    """The usual way, killed after the destination committed and run again: how many it made."""
    order = uuid.uuid4().hex[:12]
    if kind == "smtp":
        text, db = mail_declaration(mail_server), None
    else:
        db = SqlDb(f"sqlite:///{tmp}/shop.db" if kind == "sqlite" else postgres_url)
        text = db.declaration()
    targets = tmp / "targets.toml"
    targets.write_text(text)
    code = agent(targets, tmp, kind, "naive", crashpoints.AFTER_CALL, mode="naive", order=order)
    agent(targets, tmp, kind, "naive", None, mode="naive", order=order)
    if db is None:
        made = len(
            mail_server.messages(
                "customer@example.test", password="customer@example.test", header="Subject", value=order
            )
        )
    else:
        made = len(db.sql(f"SELECT id FROM {db.table}"))
        assert db.on_hand() == 10 - 2 * made
    return Run(code == -signal.SIGKILL, made, None, False)


def run_cell(kind: str, point: str, tmp: Path, naive_tmp: Path, mail_server: MailServer, postgres_url: str) -> Cell:
    run_id = f"run-{uuid.uuid4().hex[:12]}"
    target = TARGET["smtp" if kind == "smtp" else "sql"]
    key = effect_key(target, OPERATION["smtp" if kind == "smtp" else "sql"], run_id, STEP)
    db: SqlDb | None = None
    if kind == "smtp":
        text = mail_declaration(mail_server)
    else:
        db = SqlDb(f"sqlite:///{tmp}/shop.db" if kind == "sqlite" else postgres_url)
        text = db.declaration()
    targets = tmp / "targets.toml"
    targets.write_text(text)
    code = agent(targets, tmp, kind, run_id, point)
    agent(targets, tmp, kind, run_id, None)
    effect = asyncio.run(settle(tmp / "effects.db", targets, key))
    if db is None:
        delivered, copies = mail_count(mail_server, key)
        made, own_id = (delivered if delivered == copies else -1), message_id_for(key, "shop.example.test")
    else:
        rows = db.rows(key)
        made = len(rows) if db.on_hand() == 10 - 2 * len(rows) else -1
        own_id = str(rows[0][0]) if rows else ""
    state = effect.state.value if effect is not None else None
    receipt = effect.receipt.receipt_id if effect is not None and effect.receipt is not None else None
    lost = state != "CONFIRMED" or made != 1 or receipt != own_id
    cell = Cell(point, kind)
    cell.ledger.append(Run(code == -signal.SIGKILL, made, state, lost, evidence(effect) if effect else ""))
    if point == crashpoints.AFTER_CALL:
        cell.naive.append(naive_run(kind, naive_tmp, mail_server, postgres_url))
    return cell


@pytest.fixture(scope="module")
def cells(mail_server: MailServer, postgres_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Cell]]:
    # Cells run side by side (each waits mostly on its child processes), as in tests/crash/matrix.py.
    # Folders made here, not in the threads: tmp_path_factory is not thread-safe.
    jobs = [
        (kind, point, tmp_path_factory.mktemp(f"{kind}-{point}"), tmp_path_factory.mktemp(f"naive-{kind}-{point}"))
        for kind in KINDS
        for point in crashpoints.POINTS
    ]
    with ThreadPoolExecutor(3) as pool:
        out = list(pool.map(lambda job: run_cell(*job, mail_server, postgres_url), jobs))
    print("\n" + table(out))
    yield out


def test_every_crash_killed_the_agent(cells: list[Cell]) -> None:
    assert [(c.point, c.kind) for c in cells if not all(r.crashed for r in c.ledger)] == []


def test_exactly_one_effect_at_the_destination_and_confirmed_with_its_own_id(cells: list[Cell]) -> None:
    wrong = {
        (c.point, c.kind): [(r.state, r.refunds, r.evidence) for r in c.ledger] for c in cells if Cell.lost(c.ledger)
    }
    assert wrong == {}


def test_the_usual_way_sends_or_takes_twice_after_the_call(cells: list[Cell]) -> None:
    """The same destinations, with a fresh key per attempt and a checkpoint after the call: the
    crash after the commit makes a second email or decrement (so this file can see a duplicate)."""
    naive = {c.kind: [(r.crashed, r.refunds) for r in c.naive] for c in cells if c.naive}
    assert naive == {kind: [(True, 2)] for kind in KINDS}


def test_the_lookup_confirmed_the_crash_after_the_destination_committed(cells: list[Cell]) -> None:
    """after_call: the destination committed, the agent died before recording it; only the kind's
    own lookup can have confirmed it (the restarted agent must not have called again)."""
    for c in cells:
        if c.point == crashpoints.AFTER_CALL:
            assert all("FOUND" in r.evidence.upper() for r in c.ledger), f"{c.kind}: {c.ledger}"

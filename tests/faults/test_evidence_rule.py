"""Issue 34: only the destination's own answer is evidence of absence. For the smtp and sql kinds
(and the HTTP lookup, which goes through the same rule, effect_ledger.targets.evidence): an answer
from a mailbox that keeps no copy, from a server that cannot be reached, from a database file that
is not there, or in a shape the kind does not expect, is never ABSENT and never a receipt. A crash
after the destination committed, followed by such a destination, ends ESCALATED with the evidence,
and the effect was made exactly once: never sent or written again.

(Stripe-shaped payments and ticketing pin the same rule in test_evidence_rule_payments.py.)"""

from __future__ import annotations

import asyncio
import shutil
import signal
import smtplib
import socket
import sqlite3
import uuid
from email.message import EmailMessage
from pathlib import Path

import pytest

from effect_ledger.core.effect import Effect
from effect_ledger.core.keys import effect_key
from effect_ledger.core.model import State
from effect_ledger.core.reconcile import Absent, EffectView, Found, Unknown
from effect_ledger.sdk import crashpoints
from effect_ledger.targets.http import HttpReconciler
from effect_ledger.targets.load import parse_targets
from effect_ledger.targets.mail import KEY_HEADER, MailDestination, message_id_for
from effect_ledger.targets.sql import SqlDestination
from tests.crash.destination_agent import OPERATION, STEP, TARGET
from tests.crash.test_crash_destinations import agent
from tests.destinations import SqlDb, evidence, mail_count, mail_declaration, settle
from tests.faults.http_servers import LoopbackServer, Reply
from tests.mailserver import ARCHIVE, MailServer
from tests.sdk_contract import run

T0 = 1_700_000_000_000


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def view(key: str, target: str = "mail") -> EffectView:
    return EffectView(key, target, "x", {}, 1, T0, T0 + 10_000)


def crash_after_the_call_then_restart(
    tmp: Path, kind: str, declaration: str, before_restart: str | None = None
) -> tuple[str, Effect | None]:
    """The agent commits at the destination and is SIGKILLed before recording it; ``before_restart``
    (a second declaration) is what the restarted agent and the runner are given. The settled effect."""
    run_id = f"run-{uuid.uuid4().hex[:12]}"
    key = effect_key(TARGET[kind], OPERATION[kind], run_id, STEP)
    targets = tmp / "targets.toml"
    targets.write_text(declaration)
    assert (
        agent(targets, tmp, "smtp" if kind == "smtp" else "sqlite", run_id, crashpoints.AFTER_CALL) == -signal.SIGKILL
    )
    if before_restart is not None:
        targets.write_text(before_restart)
    assert agent(targets, tmp, "smtp" if kind == "smtp" else "sqlite", run_id, None) == 3  # uncertain: held
    return key, asyncio.run(settle(tmp / "effects.db", targets, key))


def assert_escalated_never_absent(effect: Effect | None, why: str) -> None:
    assert effect is not None and effect.state == State.ESCALATED, effect
    text = evidence(effect)
    assert ":ABSENT:" not in text and ":FOUND:" not in text and why in text, text


# --- smtp -----------------------------------------------------------------------------------------


def test_a_mailbox_that_keeps_no_copy_escalates_and_never_sends_twice(mail_server: MailServer, tmp_path: Path) -> None:
    key, effect = crash_after_the_call_then_restart(tmp_path, "smtp", mail_declaration(mail_server, sent_copy="none"))
    assert_escalated_never_absent(effect, "nobody can tell")
    assert mail_count(mail_server, key) == (1, 0)  # delivered once, no copy anywhere


def test_an_imap_server_that_cannot_be_reached_escalates(mail_server: MailServer, tmp_path: Path) -> None:
    down = mail_declaration(mail_server, imap=f"imap://127.0.0.1:{closed_port()}")
    key, effect = crash_after_the_call_then_restart(tmp_path, "smtp", mail_declaration(mail_server), down)
    assert_escalated_never_absent(effect, "ConnectionRefusedError")
    assert mail_count(mail_server, key) == (1, 1)


def test_a_declared_mailbox_that_does_not_exist_is_unknown(mail_server: MailServer) -> None:
    text = mail_declaration(mail_server).replace('mailbox = "INBOX"', 'mailbox = "Sent Items"')
    d = parse_targets(text)[0].reconciler
    assert isinstance(d, MailDestination)
    answer = run(d.check(view(f"mail:{uuid.uuid4().hex}")))
    assert isinstance(answer, Unknown) and "Sent Items" in answer.reason


def test_a_match_that_is_not_the_effects_message_is_no_receipt(mail_server: MailServer) -> None:
    """A message with the effect's Message-ID but another X-Effect-Key (a forged or colliding id):
    the search finds it, and the kind's shape check refuses it as evidence."""
    d = parse_targets(mail_declaration(mail_server))[0].reconciler
    assert isinstance(d, MailDestination)
    key = f"mail:{uuid.uuid4().hex}"
    forged = EmailMessage()
    forged["From"] = "someone@example.test"
    forged["To"] = ARCHIVE
    forged["Message-ID"] = message_id_for(key, "shop.example.test")
    forged[KEY_HEADER] = "mail:another-key"
    forged.set_content("not the effect")
    with smtplib.SMTP("127.0.0.1", mail_server.smtp_port, timeout=5) as s:
        s.send_message(forged)
    answer = run(d.check(view(key)))
    assert isinstance(answer, Unknown) and "not in the expected shape" in answer.reason
    assert "mail:another-key" in answer.reason


# --- sql ------------------------------------------------------------------------------------------


def test_a_sqlite_file_gone_from_its_path_escalates_and_is_never_created(tmp_path: Path) -> None:
    db = SqlDb(f"sqlite:///{tmp_path}/shop.db")
    moved = tmp_path / "elsewhere"
    moved.mkdir()

    run_id = f"run-{uuid.uuid4().hex[:12]}"
    key = effect_key("orders", "stock.take", run_id, STEP)
    targets = tmp_path / "targets.toml"
    targets.write_text(db.declaration())
    assert agent(targets, tmp_path, "sqlite", run_id, crashpoints.AFTER_CALL) == -signal.SIGKILL
    shutil.move(tmp_path / "shop.db", moved / "shop.db")  # the database is not where the target says
    assert agent(targets, tmp_path, "sqlite", run_id, None) == 3
    effect = asyncio.run(settle(tmp_path / "effects.db", targets, key))
    assert_escalated_never_absent(effect, "unable to open database file")
    assert not (tmp_path / "shop.db").exists()  # the lookup never creates an empty database
    with sqlite3.connect(moved / "shop.db") as conn:
        assert conn.execute(f"SELECT count(*) FROM {db.table}").fetchone() == (1,)


def test_a_postgresql_server_that_cannot_be_reached_escalates(postgres_url: str, tmp_path: Path) -> None:
    db = SqlDb(postgres_url)
    down = db.declaration().replace(postgres_url, f"postgresql://postgres@127.0.0.1:{closed_port()}/postgres")
    key, effect = crash_after_the_call_then_restart(tmp_path, "sql", db.declaration(), down)
    assert_escalated_never_absent(effect, "OperationalError")
    assert len(db.rows(key)) == 1 and db.on_hand() == 8


@pytest.mark.parametrize("flaw", ["not unique", "collates equal"])
def test_rows_in_a_shape_the_kind_does_not_expect_are_no_receipt(tmp_path: Path, flaw: str) -> None:
    path = tmp_path / "shop.db"
    key = "orders:abc"
    with sqlite3.connect(path) as conn:
        if flaw == "not unique":  # a table whose key column lost its UNIQUE constraint
            conn.execute("CREATE TABLE shipments (id INTEGER PRIMARY KEY, effect_key TEXT)")
            conn.executemany("INSERT INTO shipments (effect_key) VALUES (?)", [(key,), (key,)])
        else:  # a case-insensitive key column: another key's row answers the lookup
            conn.execute("CREATE TABLE shipments (id INTEGER PRIMARY KEY, effect_key TEXT COLLATE NOCASE UNIQUE)")
            conn.execute("INSERT INTO shipments (effect_key) VALUES (?)", (key.upper(),))
    answer = run(SqlDestination(f"sqlite:///{path}", "shipments").check(view(key, "orders")))
    assert isinstance(answer, Unknown) and "not in the expected shape" in answer.reason
    assert not isinstance(answer, Absent | Found)


# --- http: the same rule, whichever redirect setting -----------------------------------------------


@pytest.mark.parametrize("redirects", ["none", "same-origin"])
@pytest.mark.parametrize("final", [404, 200])
def test_an_answer_after_a_same_origin_redirect_is_never_absent_nor_a_receipt(redirects: str, final: int) -> None:
    def answer(path: str) -> Reply:
        if path.startswith("/by-key/"):
            return Reply(302, b"", {"Location": "/login"})
        return Reply(final, b'{"id": "re_1"}')

    with LoopbackServer(answer) as srv:
        r = HttpReconciler(f"{srv.url}/by-key/{{key}}", redirects=redirects, timeout=5)  # type: ignore[arg-type]
        got = run(r.check(view("k")))
    assert isinstance(got, Unknown) and "redirect" in got.reason

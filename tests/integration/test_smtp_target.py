"""kind = "smtp" against a real SMTP server and IMAP mailbox (GreenMail, tests/mailserver.py):
where the key travels (Message-ID, X-Effect-Key), the server-made copy, attachments, the IMAP
lookup, the ledger's receipt, and the bounds refused before anything is sent."""

from __future__ import annotations

import email
import email.policy
import socketserver
import threading
import uuid
from email.message import EmailMessage
from pathlib import Path
from typing import Any

import pytest

from effect_ledger.core.reconcile import Absent, EffectView, Found
from effect_ledger.errors import DestinationError, MailRejected, TargetsError
from effect_ledger.targets.load import parse_targets
from effect_ledger.targets.mail import KEY_HEADER, MAX_MESSAGE_BYTES, MailDestination, message_id_for
from tests.crash.destination_agent import confirmation_mail
from tests.destinations import mail_count, mail_declaration
from tests.mailserver import ARCHIVE, MailServer
from tests.sdk_contract import run

T0 = 1_700_000_000_000


def dest(server: MailServer, **settings: str) -> MailDestination:
    target = parse_targets(mail_declaration(server, **settings))[0]
    assert isinstance(target.reconciler, MailDestination)
    return target.reconciler


def view(key: str) -> EffectView:
    return EffectView(key, "mail", "mail.send", {"order": "123"}, 1, T0, T0 + 10_000)


def test_the_key_travels_as_message_id_and_header_with_the_attachment_intact(mail_server: MailServer) -> None:
    key = f"mail:{uuid.uuid4().hex}"
    sent = run(dest(mail_server).send(key, confirmation_mail()))
    assert sent == {"id": message_id_for(key, "shop.example.test"), "refused": {}}
    [raw] = mail_server.messages("customer@example.test", password="customer@example.test", value=key)
    got = email.message_from_bytes(raw, policy=email.policy.default)
    assert got["Message-ID"] == sent["id"] and got[KEY_HEADER] == key
    assert "archive" not in raw.decode(errors="replace").lower()  # the copy's address is envelope-only
    [attachment] = list(got.iter_attachments())  # type: ignore[attr-defined]
    assert attachment.get_filename() == "invoice.pdf"
    assert attachment.get_content() == b"%PDF-1.4 invoice 123\n" * 200
    assert mail_count(mail_server, key) == (1, 1)  # the server filed the copy from the same DATA


def test_lookup_finds_the_copy_by_message_id_and_proves_absence_where_copies_are_kept(
    mail_server: MailServer,
) -> None:
    d = dest(mail_server)
    key = f"mail:{uuid.uuid4().hex}"
    assert isinstance(run(d.check(view(key))), Absent)
    run(d.send(key, confirmation_mail()))
    found = run(d.check(view(key)))
    assert isinstance(found, Found) and found.receipt_id == message_id_for(key, "shop.example.test")
    assert found.value["mailbox"] == "INBOX" and found.value["copies"] == 1 and found.value["uid"]
    other = f"mail:{uuid.uuid4().hex}"
    assert isinstance(run(d.check(view(other))), Absent)


def test_through_the_ledger_the_receipt_is_the_message_id(mail_server: MailServer, tmp_path: Path) -> None:
    from effect_ledger.sdk.ledger import Ledger

    targets = tmp_path / "targets.toml"
    targets.write_text(mail_declaration(mail_server))

    async def body() -> tuple[str, str, bool]:
        async with await Ledger.open(str(tmp_path / "effects.db"), targets=targets) as ledger:
            d = ledger.target("mail").reconciler
            assert isinstance(d, MailDestination)
            args = dict(target="mail", operation="mail.send", run_id=uuid.uuid4().hex, step="order-1", request={})
            first = await ledger.execute(**args, call=lambda key: d.send(key, confirmation_mail()))  # type: ignore[arg-type]
            again = await ledger.execute(**args, call=lambda key: d.send(key, confirmation_mail()))  # type: ignore[arg-type]
            return first.effect_id, first.receipt_id, again.called

    key, receipt, called_again = run(body())
    assert receipt == message_id_for(key, "shop.example.test") and not called_again
    assert mail_count(mail_server, key) == (1, 1)


def test_what_cannot_be_sent_is_refused_before_anything_is_sent(mail_server: MailServer) -> None:
    d = dest(mail_server)
    key = f"mail:{uuid.uuid4().hex}"
    big = confirmation_mail()
    big.add_attachment(b"\0" * MAX_MESSAGE_BYTES, maintype="application", subtype="octet-stream", filename="big")
    own_id = confirmation_mail()
    own_id["Message-ID"] = "<mine@example.test>"
    nobody = EmailMessage()
    nobody["From"] = "sender@example.test"
    for message in (big, own_id, nobody):
        with pytest.raises(DestinationError):
            run(d.send(key, message))
    with pytest.raises(DestinationError):
        run(d.send("line\r\nBcc: everyone@example.test", confirmation_mail()))
    assert mail_count(mail_server, key) == (0, 0)


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ('sent_copy = "outbox"', "sent_copy must be one of"),
        ('mailbox = "a\\"b"', "mailbox"),
        ('id_domain = "not a domain"', "id_domain"),
        ('smtp = "http://127.0.0.1:25"', "smtp"),
    ],
)
def test_targets_file_mistakes_name_the_line(mail_server: MailServer, setting: str, message: str) -> None:
    text = mail_declaration(mail_server)
    field = setting.split(" ")[0]
    lines = text.splitlines()
    at = next((i for i, ln in enumerate(lines) if ln.startswith(f"{field} ")), len(lines))
    lines[at : at + 1] = [setting]  # in place of the setting, or added at the end
    with pytest.raises(TargetsError) as e:
        parse_targets("\n".join(lines) + "\n", "t.toml")
    assert message in str(e.value) and str(e.value).startswith(f"t.toml:{at + 1}:")


def test_envelope_copy_needs_an_address_and_a_mailbox_to_search(mail_server: MailServer) -> None:
    no_copy_to = mail_declaration(mail_server).replace('copy_to = "archive@example.test"\n', "")
    with pytest.raises(TargetsError, match="copy_to"):
        parse_targets(no_copy_to)
    with pytest.raises(TargetsError, match="needs imap"):
        parse_targets(mail_declaration(mail_server, imap=""))


class _RefusingSmtp(socketserver.StreamRequestHandler):
    """A destination fake speaking SMTP as a real server does, which refuses one mailbox (550 on
    its RCPT TO), like a full or disabled archive account; it records every command it got."""

    def handle(self) -> None:
        server: Any = self.server
        self.wfile.write(b"220 fake ESMTP\r\n")
        while line := self.rfile.readline(1000):
            cmd = line.decode().strip()
            server.seen.append(cmd)
            verb = cmd.split(" ")[0].upper()
            if verb in ("EHLO", "HELO"):
                reply = b"250 fake\r\n"
            elif verb == "RCPT" and server.refuse in cmd:
                reply = b"550 5.2.1 mailbox disabled\r\n"
            elif verb == "DATA":
                reply = b"354 go ahead\r\n"
            elif verb == "QUIT":
                self.wfile.write(b"221 bye\r\n")
                return
            else:
                reply = b"250 ok\r\n"
            self.wfile.write(reply)


def test_a_refused_copy_address_sends_nothing() -> None:
    """The copy's RCPT comes first; refused, the transaction is reset before DATA: the customer
    gets nothing (a message without its copy could later be called absent and sent again)."""
    with socketserver.ThreadingTCPServer(("127.0.0.1", 0), _RefusingSmtp) as srv:
        srv.daemon_threads = True
        srv.seen, srv.refuse = [], ARCHIVE  # type: ignore[attr-defined]
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        try:
            d = MailDestination(f"smtp://127.0.0.1:{srv.server_address[1]}", sent_copy="envelope", copy_to=ARCHIVE,
                                imap="imap://127.0.0.1:1", imap_user="a", imap_password="b", timeout=5)  # fmt: skip
            with pytest.raises(MailRejected, match="copy"):
                run(d.send(f"mail:{uuid.uuid4().hex}", confirmation_mail()))
        finally:
            srv.shutdown()
    verbs = [c.split(" ")[0].upper() for c in srv.seen]  # type: ignore[attr-defined]
    assert "DATA" not in verbs and "RSET" in verbs
    assert not any("customer@" in c for c in srv.seen)  # type: ignore[attr-defined]

"""A real SMTP server and a real IMAP mailbox on loopback, for the smtp kind's tests.

GreenMail standalone (``scripts/install-mailserver.sh`` fetches the jar; why GreenMail is said
there) runs as a child JVM on 127.0.0.1 at two free ports. Its accounts: ``sender`` (who sends),
``archive`` (the mailbox that keeps the sent copies, address ``archive@example.test``) and any
recipient, whose account the server makes on first delivery, as a catch-all domain does. The
server delivers a message to every envelope recipient's INBOX before it answers DATA with 250.
"""

from __future__ import annotations

import imaplib
import os
import socket
import subprocess
import time
from pathlib import Path

VERSION = "2.1.8"
PASSWORD = "mail-test-pw"
ARCHIVE = "archive@example.test"
SENDER = "sender@example.test"


def _jar() -> Path:
    cache = Path(os.environ.get("EFFECT_LEDGER_CACHE", Path.home() / ".cache" / "effect-ledger"))
    return cache / "greenmail" / f"greenmail-standalone-{VERSION}.jar"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class MailServer:
    """One GreenMail process; ``smtp_url`` and ``imap_url`` reach it."""

    def __init__(self) -> None:
        if not _jar().exists():
            raise RuntimeError(f"no {_jar()}: run scripts/install-mailserver.sh")
        self.smtp_port = _free_port()
        self.imap_port = _free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def smtp_url(self) -> str:
        return f"smtp://127.0.0.1:{self.smtp_port}"

    @property
    def imap_url(self) -> str:
        return f"imap://127.0.0.1:{self.imap_port}"

    def start(self, timeout: float = 60) -> MailServer:
        cmd = [
            "java", "-Xmx128m", "-XX:TieredStopAtLevel=1",
            "-Dgreenmail.smtp.hostname=127.0.0.1", f"-Dgreenmail.smtp.port={self.smtp_port}",
            "-Dgreenmail.imap.hostname=127.0.0.1", f"-Dgreenmail.imap.port={self.imap_port}",
            f"-Dgreenmail.users=sender:{PASSWORD}@example.test,archive:{PASSWORD}@example.test",
            "-jar", str(_jar()),
        ]  # fmt: skip
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"GreenMail exited with {self.proc.returncode}")
            try:
                self.login("archive").logout()
                with socket.create_connection(("127.0.0.1", self.smtp_port), timeout=2) as s:
                    if s.recv(3) == b"220":
                        return self
            except (OSError, imaplib.IMAP4.error):
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"GreenMail did not answer within {timeout}s")
            time.sleep(0.1)

    def login(self, user: str, password: str = PASSWORD) -> imaplib.IMAP4:
        conn = imaplib.IMAP4("127.0.0.1", self.imap_port, timeout=5)
        conn.login(user, password)
        return conn

    def messages(
        self, user: str, *, password: str = PASSWORD, header: str = "X-Effect-Key", value: str = ""
    ) -> list[bytes]:
        """The whole messages in ``user``'s INBOX whose ``header`` contains ``value`` (a recipient
        account the server made on delivery logs in with its address as password; none yet: [])."""
        try:
            conn = self.login(user, password)
        except imaplib.IMAP4.error:
            return []
        try:
            conn.select("INBOX", readonly=True)
            _, data = conn.uid("SEARCH", "HEADER", header, f'"{value}"')
            out = []
            for uid in data[0].split():
                _, parts = conn.uid("FETCH", uid, "(BODY.PEEK[])")
                out += [p[1] for p in parts if isinstance(p, tuple)]
            return out
        finally:
            conn.logout()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

"""``kind = "smtp"``: the effect is an email sent over SMTP; the reconciler searches the mailbox
that keeps the sent copies over IMAP.

Key placement: the effect key decides the message's ``Message-ID``
(``<SHA-256 of the key, 40 hex>.effect@ID_DOMAIN>``, so any key fits the header's syntax) and travels
as it is in a header of its own, ``X-Effect-Key``.

The sent copy is made by the mail server, from the same accepted ``DATA``, never by the client
afterwards. A client that submits and then APPENDs to "Sent" (as desktop mail clients do) can crash
between the two: the mail went out and no copy exists, so "not in Sent" would prove nothing.
``sent_copy`` says how the server makes it:

* ``"envelope"``: the ledger adds ``copy_to`` (an address whose mailbox is ``mailbox``) as one more
  envelope recipient (a Bcc), so the server accepts the message for the recipients and for the copy
  in one transaction. A server that delivers the copy later (a queue) makes the search lag: declare
  that delay as the target's ``lands_within``, and "no match" counts as absent only after it.
* ``"server"``: the server files a copy of every submitted message itself (a hosted provider's
  Sent folder, postfix ``sender_bcc_maps``).
* ``"none"``: nothing keeps a copy. A search (when ``imap`` is declared) can still find one, a
  message that was delivered to ``mailbox``, but "no match" proves nothing: nobody can tell, the
  effect is escalated, never ABSENT (``effect_ledger.targets.evidence``).

Lookup (``check``): log in over IMAP, ``EXAMINE mailbox`` (read-only), ``UID SEARCH HEADER
Message-ID <id>``, and read the headers of the first match to see that its ``Message-ID`` and
``X-Effect-Key`` are exactly the effect's (a server's substring search may match more; a message in
another shape is not evidence). Found carries the ``Message-ID`` (the receipt) and the IMAP UID. A
server that cannot be reached, a refused login, a missing mailbox: Unknown.

Bounds: a message is at most ``MAX_MESSAGE_BYTES`` (attachments included) and ``MAX_RECIPIENTS``
envelope recipients; a search answer of more than ``MAX_MATCHES`` UIDs is not in the expected shape.
"""

from __future__ import annotations

import asyncio
import copy
import email.policy
import hashlib
import re
from email.message import EmailMessage
from email.utils import getaddresses
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from effect_ledger.core.reconcile import Absent, Answer, EffectView, Found, Unknown
from effect_ledger.core.urls import credentials_in, safe_url
from effect_ledger.errors import DestinationError, MailRejected
from effect_ledger.targets.ask import DEFAULT_ASK_TIMEOUT_S
from effect_ledger.targets.evidence import Provenance, admit

if TYPE_CHECKING:
    import imaplib

__all__ = [
    "KEY_HEADER",
    "MAX_MATCHES",
    "MAX_MESSAGE_BYTES",
    "MAX_RECIPIENTS",
    "SENT_COPY",
    "MailDestination",
    "message_id_for",
]

KEY_HEADER = "X-Effect-Key"
MAX_MESSAGE_BYTES = 25 << 20  # what most providers accept for one message, attachments included
MAX_RECIPIENTS = 100  # recipients of one message (To, Cc, Bcc), the copy's address not counted
MAX_MATCHES = 1000  # UIDs in one search answer; more is not the answer to a search by a unique id
MAX_KEY_BYTES = 512  # what X-Effect-Key carries (keys are much shorter: target:sha256)
SENT_COPY = ("envelope", "server", "none")
_DOMAIN = re.compile(
    r"^[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$"
)
# Lines up to RFC 5322's hard limit: a Message-ID folded onto a continuation line is legal, but
# some servers' HEADER search then misses it.
_WIRE = email.policy.SMTP.clone(max_line_length=998)
_MAILBOX = re.compile(r"^[\x20-\x7e]{1,200}$")


def message_id_for(key: str, id_domain: str) -> str:
    """The ``Message-ID`` an effect key gives a message."""
    return f"<{hashlib.sha256(key.encode()).hexdigest()[:40]}.effect@{id_domain}>"


def _server(url: str, schemes: dict[str, int], what: str) -> tuple[str, str, int]:
    if credentials_in(url):
        # Never echoed: the URL's user name and password are not used, and this message may be printed.
        raise ValueError(
            f"{what} must not hold a user name or password (user:password@); "
            f'set {what}_user and {what}_password = "${{VAR}}" (from the environment) instead'
        )
    parts = urlsplit(url)
    if parts.scheme not in schemes or not parts.hostname or parts.path not in ("", "/"):
        raise ValueError(f"{what} {safe_url(url)!r} must be {' or '.join(s + '://HOST[:PORT]' for s in schemes)}")
    return parts.scheme, parts.hostname, parts.port or schemes[parts.scheme]


class MailDestination:
    """An SMTP server that sends the effect's message and an IMAP mailbox that keeps its copies (see
    the module docstring). It is the target's reconciler (``check``) and the call (``send``)."""

    def __init__(
        self,
        smtp: str,
        *,
        name: str = "smtp",
        imap: str | None = None,
        mailbox: str = "INBOX",
        sent_copy: str = "envelope",
        copy_to: str | None = None,
        id_domain: str = "effect-ledger.invalid",
        smtp_user: str | None = None,
        smtp_password: str | None = None,
        imap_user: str | None = None,
        imap_password: str | None = None,
        timeout: float = DEFAULT_ASK_TIMEOUT_S,
    ) -> None:
        self._smtp = _server(smtp, {"smtp": 25, "smtps": 465, "smtp+starttls": 587}, "smtp")
        self._imap = _server(imap, {"imap": 143, "imaps": 993}, "imap") if imap else None
        if sent_copy not in SENT_COPY:
            raise ValueError(f"sent_copy must be one of {', '.join(SENT_COPY)}, not {sent_copy!r}")
        if sent_copy != "none" and self._imap is None:
            raise ValueError(f'sent_copy = "{sent_copy}" needs imap (where the copies are searched)')
        if sent_copy == "envelope" and not copy_to:
            raise ValueError('sent_copy = "envelope" needs copy_to, the address whose mailbox keeps the copies')
        if copy_to is not None and (len(getaddresses([copy_to])) != 1 or "@" not in copy_to or "\n" in copy_to):
            raise ValueError(f"copy_to {copy_to!r} must be one address")
        if self._imap is not None and not (imap_user and imap_password):
            raise ValueError("imap needs imap_user and imap_password")
        if not _MAILBOX.match(mailbox) or '"' in mailbox or "\\" in mailbox:
            raise ValueError(f"mailbox {mailbox!r} must be printable ASCII without quotes or backslashes")
        if not _DOMAIN.match(id_domain) or len(id_domain) > 253:
            raise ValueError(f"id_domain {id_domain!r} must be a domain name")
        if not 0 < timeout <= 3600:
            raise ValueError("timeout must be from 0 to 3600 seconds")
        self.name = name
        self.mailbox = mailbox
        self.sent_copy = sent_copy
        self.copy_to = copy_to
        self.id_domain = id_domain
        self._smtp_login = (smtp_user, smtp_password) if smtp_user and smtp_password else None
        self._imap_login = (imap_user or "", imap_password or "")
        self._timeout_s = timeout
        host = f"{self._imap[1]}:{self._imap[2]}" if self._imap else "(no imap)"
        self.where = f"{self._imap[0] if self._imap else 'imap'}://{host}/{mailbox}"  # what the lookup names

    @property
    def timeout_s(self) -> float:
        """How long one lookup or send may take."""
        return self._timeout_s

    # --- the call --------------------------------------------------------------------------------

    async def send(self, key: str, message: EmailMessage) -> dict[str, Any]:
        """Send ``message`` with the key's ``Message-ID`` and ``X-Effect-Key``: ``{"id": Message-ID,
        "refused": {address: reply}}`` (the id is the receipt). ``DestinationError`` before anything
        is sent (too large, too many recipients, a Message-ID of its own); ``MailRejected`` when the
        server refused it permanently. Any other failure leaves the outcome unknown."""
        message_id = message_id_for(key, self.id_domain)
        sender, recipients, data = self._prepare(key, message, message_id)
        copy = self.copy_to if self.sent_copy == "envelope" else None
        refused = await asyncio.to_thread(self._submit, sender, recipients, copy, data)
        return {"id": message_id, "refused": refused}

    def _prepare(self, key: str, message: EmailMessage, message_id: str) -> tuple[str, list[str], bytes]:
        if not isinstance(message, EmailMessage):
            raise DestinationError("send takes an email.message.EmailMessage")
        if not key or len(key.encode()) > MAX_KEY_BYTES or not key.isascii() or not key.isprintable():
            raise DestinationError(f"the effect key must be printable ASCII of at most {MAX_KEY_BYTES} bytes")
        own = message.get("Message-ID")
        if own is not None and str(own).strip() != message_id:
            raise DestinationError("the message has a Message-ID of its own; the effect key decides it")
        recipients = [a for _, a in getaddresses([str(v) for f in ("To", "Cc", "Bcc") for v in message.get_all(f, [])])]
        recipients = [a for a in recipients if a]
        if not recipients or len(recipients) > MAX_RECIPIENTS:
            raise DestinationError(f"a message goes to 1 to {MAX_RECIPIENTS} recipients, not {len(recipients)}")
        sender = [a for _, a in getaddresses([str(message.get("From", ""))]) if a]
        if len(sender) != 1:
            raise DestinationError("the message needs one From address")
        msg = copy.deepcopy(message)  # the caller's message is left as it was
        for field in ("Message-ID", KEY_HEADER, "Bcc"):
            del msg[field]
        msg["Message-ID"] = message_id
        msg[KEY_HEADER] = key
        try:
            data = msg.as_bytes(policy=_WIRE)
        except (ValueError, TypeError, UnicodeError) as e:
            raise DestinationError(f"the message cannot be written: {e}") from None
        if len(data) > MAX_MESSAGE_BYTES:
            raise DestinationError(f"the message is {len(data)} bytes; at most {MAX_MESSAGE_BYTES} are sent")
        return sender[0], recipients, data

    def _submit(self, sender: str, recipients: list[str], copy: str | None, data: bytes) -> dict[str, Any]:
        """One SMTP transaction. The copy's address is the first RCPT: if the server refuses it,
        nothing is sent (RSET before DATA)."""
        # Imported here, not at the top: the targets declaration imports this module, and most programs
        # that read it never send mail (the same reason http.py imports aiohttp late).
        import smtplib
        import ssl

        scheme, host, port = self._smtp
        cls = smtplib.SMTP_SSL if scheme == "smtps" else smtplib.SMTP
        with cls(host, port, timeout=self._timeout_s) as s:
            if scheme == "smtp+starttls":
                s.starttls(context=ssl.create_default_context())
            if self._smtp_login is not None:
                s.login(*self._smtp_login)
            s.ehlo_or_helo_if_needed()
            try:
                code, reply = s.mail(sender)
                if code != 250:
                    raise smtplib.SMTPSenderRefused(code, reply, sender)
                if copy is not None:
                    code, reply = s.rcpt(copy)
                    if code not in (250, 251):
                        # Without its copy, "not found" could not prove absence later: send nothing.
                        s.rset()
                        raise MailRejected(f"the copy's address {copy} was refused: {code} {_text(reply)}; not sent")
                refused: dict[str, tuple[int, bytes]] = {}
                for address in recipients:
                    code, reply = s.rcpt(address)
                    if code not in (250, 251):
                        refused[address] = (code, reply)
                if len(refused) == len(recipients):  # every recipient refused: nothing is sent
                    s.rset()
                    raise MailRejected(f"every recipient was refused: {_replies(refused)}")
                s.data(data)
            except (smtplib.SMTPSenderRefused, smtplib.SMTPDataError) as e:
                if e.smtp_code >= 500:  # a permanent refusal before the message was accepted
                    raise MailRejected(f"SMTP {e.smtp_code}: {_text(e.smtp_error)}") from None
                raise
        return {a: _text(r[1]) for a, r in refused.items()}

    # --- the lookup ------------------------------------------------------------------------------

    async def check(self, effect: EffectView) -> Answer:
        """Found (the Message-ID), Absent (no copy, where copies are kept) or Unknown; never raises."""
        if self._imap is None:
            return Unknown(f"target {self.name!r} declares no imap mailbox: nobody can tell whether it was sent")
        message_id = message_id_for(effect.effect_id, self.id_domain)
        try:
            found = await asyncio.to_thread(self._search, message_id)
        except Exception as e:  # a server that cannot answer, whatever imaplib raises
            return Unknown(f"{self.where}: {type(e).__name__}: {_text(e)}")
        return self.interpret(effect.effect_id, message_id, *found)

    def interpret(self, key: str, message_id: str, uids: list[str], headers: dict[str, str]) -> Answer:
        """Map a search's UIDs and the first match's headers to an answer, through the evidence rule."""
        shape: str | None = None
        answer: Answer
        if not uids:
            answer = Absent(f"no message with Message-ID {message_id} in {self.mailbox}")
        else:
            answer = Found(message_id, {"id": message_id, "mailbox": self.mailbox, "uid": uids[0], "copies": len(uids)})
            if len(uids) > MAX_MATCHES:
                shape = f"{len(uids)} messages match one Message-ID"
            elif headers.get("message-id") != message_id:
                shape = f"the match's Message-ID is {headers.get('message-id', '(none)')[:200]!r}"
            elif headers.get(KEY_HEADER.lower()) != key:
                shape = f"the match's {KEY_HEADER} is {headers.get(KEY_HEADER.lower(), '(none)')[:200]!r}"
        return admit(
            answer, Provenance(self.where, self.where, shape_error=shape, sees_absence=self.sent_copy != "none")
        )

    def _search(self, message_id: str) -> tuple[list[str], dict[str, str]]:
        import imaplib

        assert self._imap is not None
        scheme, host, port = self._imap
        if scheme == "imaps":
            conn: imaplib.IMAP4 = imaplib.IMAP4_SSL(host, port, timeout=self._timeout_s)
        else:
            conn = imaplib.IMAP4(host, port, timeout=self._timeout_s)
        try:
            conn.login(*self._imap_login)
            status, data = conn.select(f'"{self.mailbox}"', readonly=True)
            if status != "OK":
                raise imaplib.IMAP4.error(f"cannot open mailbox {self.mailbox!r}: {_text(data)}")
            status, data = conn.uid("SEARCH", "HEADER", "Message-ID", f'"{message_id}"')
            if status != "OK":
                raise imaplib.IMAP4.error(f"search failed: {_text(data)}")
            uids = b" ".join(d for d in data if isinstance(d, bytes)).decode("ascii", "replace").split()
            if not uids or len(uids) > MAX_MATCHES:
                return uids, {}
            status, data = conn.uid("FETCH", uids[0], f"(BODY.PEEK[HEADER.FIELDS (MESSAGE-ID {KEY_HEADER.upper()})])")
            if status != "OK":
                raise imaplib.IMAP4.error(f"fetch failed: {_text(data)}")
            parts: list[Any] = list(data)
            raw = b"".join(p[1] for p in parts if isinstance(p, tuple) and len(p) > 1 and isinstance(p[1], bytes))
            return uids, _headers(raw)
        finally:
            try:
                conn.logout()
            except Exception:  # the answer (or the error being raised) is what matters
                pass


def _headers(raw: bytes) -> dict[str, str]:
    """Header fields (lower-case names, unfolded values) of a fetched header block."""
    out: dict[str, str] = {}
    text = raw.decode("utf-8", "replace")
    for line in re.sub(r"\r?\n[ \t]+", " ", text).splitlines():
        name, sep, value = line.partition(":")
        if sep and name.strip():
            out.setdefault(name.strip().lower(), value.strip())
    return out


def _replies(recipients: dict[str, tuple[int, bytes]]) -> str:
    return "; ".join(f"{a}: {code} {_text(msg)}" for a, (code, msg) in list(recipients.items())[:5])


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    return " ".join(str(value).split())[:300]

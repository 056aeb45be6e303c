"""The destinations of the built-in target kinds, as the tests set them up: a real mail server
(``tests/mailserver.py``), a SQLite file, a real PostgreSQL database (``tests/postgres.py``); their
targets declarations; counting what landed there; and settling an effect with the runner."""

from __future__ import annotations

import asyncio
import sqlite3
import uuid
from pathlib import Path
from typing import Any

from effect_ledger.core.effect import Effect
from effect_ledger.core.model import State
from effect_ledger.sdk.ledger import Ledger
from effect_ledger.sdk.runner import Runner
from tests.mailserver import ARCHIVE, PASSWORD, MailServer

#: Fast re-asks, so a destination that cannot answer is escalated within a test's patience.
FAST_BACKOFF = 'backoff = { first = "50ms", factor = 1, max = "50ms", tries = 3 }\n'


def mail_declaration(server: MailServer, *, sent_copy: str = "envelope", imap: str | None = None) -> str:
    text = (
        "[targets.mail]\n"
        'kind = "smtp"\n'
        f'smtp = "{server.smtp_url}"\n'
        f'sent_copy = "{sent_copy}"\n'
        'id_domain = "shop.example.test"\n'
        'timeout = "5s"\n' + FAST_BACKOFF
    )
    imap = server.imap_url if imap is None else imap
    if imap:
        text += f'imap = "{imap}"\nmailbox = "INBOX"\nimap_user = "archive"\nimap_password = "{PASSWORD}"\n'
    if sent_copy == "envelope":
        text += f'copy_to = "{ARCHIVE}"\n'
    return text


def mail_count(server: MailServer, key: str) -> tuple[int, int]:
    """(messages the customer got, copies the archive holds) carrying ``key``."""
    return len(server.messages("customer@example.test", password="customer@example.test", value=key)), len(
        server.messages("archive", value=key)
    )


class SqlDb:
    """Fresh ``shipments`` and ``stock`` tables (10 of sku-1) in a SQLite file or a PostgreSQL
    database, under names of their own so that tests sharing a server do not meet."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.suffix = uuid.uuid4().hex[:8]
        self.table, self.stock = f"shipments_{self.suffix}", f"stock_{self.suffix}"
        self.postgres = url.startswith("postgresql://")
        ident = "BIGSERIAL PRIMARY KEY" if self.postgres else "INTEGER PRIMARY KEY"
        self.sql(
            f"CREATE TABLE {self.table} (id {ident}, effect_key TEXT NOT NULL UNIQUE, order_id TEXT, "
            "item TEXT NOT NULL, quantity INTEGER NOT NULL)",
            f"CREATE TABLE {self.stock} (item TEXT PRIMARY KEY, quantity INTEGER NOT NULL CHECK (quantity >= 0))",
            f"INSERT INTO {self.stock} VALUES ('sku-1', 10)",
        )

    def sql(self, *statements: str) -> list[tuple[Any, ...]]:
        rows: list[tuple[Any, ...]] = []
        if self.postgres:
            import psycopg

            with psycopg.connect(self.url, autocommit=True) as db:
                for s in statements:
                    cur = db.execute(s)
                    rows = [tuple(r) for r in cur.fetchall()] if cur.description else []
        else:
            db = sqlite3.connect(self.url[len("sqlite://") :], isolation_level=None)
            try:
                for s in statements:
                    rows = [tuple(r) for r in db.execute(s).fetchall()]
            finally:
                db.close()
        return rows

    def declaration(self) -> str:
        return (
            "[targets.orders]\n"
            'kind = "sql"\n'
            f'database = "{self.url}"\n'
            f'table = "{self.table}"\n'
            f'stock = {{ table = "{self.stock}", item_column = "item", quantity_column = "quantity" }}\n'
            'timeout = "5s"\n' + FAST_BACKOFF
        )

    def rows(self, key: str) -> list[tuple[Any, ...]]:
        p = "%s" if self.postgres else "?"
        return self._query(f"SELECT id, effect_key, item, quantity FROM {self.table} WHERE effect_key = {p}", key)

    def on_hand(self) -> int:
        return int(self.sql(f"SELECT quantity FROM {self.stock} WHERE item = 'sku-1'")[0][0])

    def _query(self, query: str, *args: Any) -> list[tuple[Any, ...]]:
        if self.postgres:
            import psycopg

            with psycopg.connect(self.url, autocommit=True) as db:
                return [tuple(r) for r in db.execute(query, args).fetchall()]
        db = sqlite3.connect(self.url[len("sqlite://") :])
        try:
            return [tuple(r) for r in db.execute(query, args).fetchall()]
        finally:
            db.close()


async def settle(db: Path, targets: str | Path, key: str, patience: float = 20) -> Effect | None:
    """Let the runner settle whatever is open for ``key`` (deadlines, reconciliation), then read it."""
    async with await Ledger.open(str(db), targets=targets) as ledger:
        runner = Runner(ledger, interval=0.05, grace_ms=0)
        loop = asyncio.get_running_loop()
        end = loop.time() + patience
        effect = await ledger.get(key)
        while effect is not None and effect.state in (State.PENDING, State.EXECUTED, State.UNCERTAIN):
            if loop.time() > end:
                break
            await runner.tick()
            await asyncio.sleep(0.05)
            effect = await ledger.get(key)
        return effect


def evidence(effect: Effect) -> str:
    return "; ".join(f"{r.reconciler}:{r.verdict.value}:{r.reason}" for r in effect.resolutions)

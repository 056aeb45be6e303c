"""Helpers shared by the fault suite: one ledger file per test, the contract's fake clock and keys."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from effect_ledger.sdk.ledger import Confirmation, Ledger
from tests.sdk_contract import OPERATION, REQUEST, RUN_ID, STEP, TARGET


async def execute(ledger: Ledger, call: Any, **kw: Any) -> Confirmation:
    """``execute`` with the contract's defaults (target, operation, run_id, step, request)."""
    args: dict[str, Any] = dict(
        target=TARGET, operation=OPERATION, run_id=RUN_ID, step=STEP, request=REQUEST, timeout=30.0
    )
    args.update(kw)
    return await ledger.execute(call=call, **args)


def event_bodies(path: str | Path) -> list[tuple[str, str, int]]:
    """(effect_id, kind, body size in bytes) of every row of the file's event log, in seq order."""
    conn = sqlite3.connect(str(path))
    try:
        return conn.execute("SELECT effect_id, kind, length(body) FROM events ORDER BY seq").fetchall()
    finally:
        conn.close()

"""The SDK contract (``tests/sdk_contract.py``) against the embedded backend: ``Ledger.open`` on a
SQLite file."""

from __future__ import annotations

from typing import Any

from effect_ledger.sdk.ledger import Ledger
from tests.sdk_contract import DECLARED, LedgerContract


class TestEmbeddedLedger(LedgerContract):
    async def open_ledger(self, path: str, **kwargs: Any) -> Ledger:
        kwargs.setdefault("targets", DECLARED)
        return await Ledger.open(path, **kwargs)

"""The key rule of effect_ledger.dbos outside a workflow: refused, nothing recorded or sent."""

from __future__ import annotations

from pathlib import Path

import pytest

from effect_ledger import InvalidEffect, SyncLedger, Target
from effect_ledger.dbos import ledger_step


def test_a_write_outside_a_workflow_is_refused(tmp_path: Path) -> None:
    calls: list[str] = []
    with SyncLedger.open(str(tmp_path / "effects.db"), targets=[Target("payments", honours_keys=True)]) as ledger:

        @ledger_step(ledger, target="payments")
        def refund_create(order: str, *, idempotency_key: str) -> str:
            calls.append(idempotency_key)
            return "re_1"

        with pytest.raises(InvalidEffect, match="refund_create runs outside a DBOS workflow"):
            refund_create("123")
        assert calls == []

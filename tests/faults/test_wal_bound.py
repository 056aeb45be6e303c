"""The WAL stays bounded under sustained writes (issue 12, item 6).

Before: checkpoints were PASSIVE only (``wal_autocheckpoint=0``, one every second from a thread of
its own). A PASSIVE checkpoint never makes the WAL start over while writes go on, so the ``-wal``
file grew for as long as the writes did (9.5 GB after 400,000 effects). Now the writer starts it
over once it passes ``WAL_LIMIT_BYTES`` (and the file is cut back to the limit). Here the limit is
lowered to 1 MiB and tasks write without a pause; the ``-wal`` file is measured after every effect.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from effect_ledger.core.reconcile import Target
from effect_ledger.sdk.ledger import Ledger
from effect_ledger.sdk.store import sqlite as store

LIMIT = 1024 * 1024
TASKS = 32
EFFECTS = 1_600


async def _ok(key: str) -> dict[str, str]:
    return {"id": "re_" + key[-8:], "statement": "x" * 2_000}  # about 3 KB of events per effect


def test_sustained_writes_keep_the_wal_under_its_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(store, "WAL_LIMIT_BYTES", LIMIT, raising=False)
    path = tmp_path / "effects.db"
    wal = tmp_path / "effects.db-wal"
    sizes: list[int] = []

    async def body() -> None:
        ledger = await Ledger.open(str(path), targets=[Target("payments")])
        try:

            async def worker(w: int) -> None:
                for i in range(w, EFFECTS, TASKS):
                    await ledger.execute(
                        target="payments", operation="refund", run_id="r", step=f"s{i}", request={"i": i}, call=_ok
                    )
                    sizes.append(os.stat(wal).st_size)

            await asyncio.gather(*(worker(w) for w in range(TASKS)))
            rows = await ledger.store.query("SELECT count(*) AS n FROM effects WHERE state = 'CONFIRMED'")
            assert rows[0]["n"] == EFFECTS
        finally:
            await ledger.close()

    asyncio.run(body())
    assert any(b < a for a, b in zip(sizes, sizes[1:], strict=False)), "the WAL never started over"
    # The limit, plus what one group commit adds before the writer looks (at most TASKS effects).
    assert max(sizes) <= LIMIT + TASKS * 64 * 1024, f"peak WAL {max(sizes):,} bytes"

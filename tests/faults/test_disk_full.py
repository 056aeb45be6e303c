"""A full disk is a typed error, and a call the ledger could not record is uncertain (issue 10, item 12).

The disk is made full for real, the way SQLite meets it: ``PRAGMA max_page_count`` on the ledger's
own connection caps the database at the pages it has, so the next write that needs a page fails
with SQLITE_FULL inside the store's transaction. Before the fix that surfaced as
``OperationalError: cannot rollback - no transaction is active`` (SQLite had already rolled back;
the store's ROLLBACK failed and hid the cause), and a successful call whose outcome could not be
recorded gave the caller that raw error instead of ``EffectUncertain``.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from effect_ledger.core.model import State
from effect_ledger.core.reconcile import Found, Target
from effect_ledger.errors import EffectUncertain, LedgerError, StorageError
from effect_ledger.sdk.ledger import Ledger
from effect_ledger.sdk.runner import Runner
from tests.faults._common import execute
from tests.sdk_contract import KEY, TARGET, FakeClock, db_counts, event_kinds, reconciler_of, run


async def fill_the_disk(ledger: Ledger) -> None:
    """From now on the database may not grow by a single page."""
    await ledger.store.limit_pages(await ledger.store.page_count())


async def free_the_disk(ledger: Ledger) -> None:
    await ledger.store.limit_pages(None)


def test_disk_full_after_a_successful_call_is_uncertain_and_the_intent_stays_recoverable(tmp_path: Path) -> None:
    path = str(tmp_path / "effects.db")
    clock = FakeClock()
    target = Target(TARGET, reconciler=reconciler_of(Found("re_1")))
    calls: list[str] = []

    async def body() -> None:
        ledger = await Ledger.open(path, targets=[target], clock=clock)
        try:

            async def call(key: str) -> dict[str, Any]:
                calls.append(key)
                await fill_the_disk(ledger)  # the disk fills while the destination works
                return {"id": "re_1", "statement": "x" * 20_000}  # its record needs new pages

            with pytest.raises(EffectUncertain) as ei:
                await execute(ledger, call, timeout=10)
            storage = ei.value.__cause__
            assert isinstance(storage, StorageError), repr(storage)
            assert isinstance(storage.__cause__, sqlite3.OperationalError)
            assert "full" in str(storage) and "cannot rollback" not in str(storage)
            assert "outcome could not be recorded" in str(ei.value)
            # The intent is durable: the effect is open, for the runner to reconcile.
            effect = await ledger.get(KEY)
            assert effect is not None and effect.state is State.PENDING
            assert event_kinds(path, KEY) == ["Intent"]

            await free_the_disk(ledger)
            clock.advance(10_000 + 1_001)  # past the deadline and the runner's grace
            report = await Runner(ledger).tick()
            assert report.timed_out == [KEY] and report.reconciled == {KEY: "CONFIRMED"}
            c = await execute(ledger, call, timeout=10)
            assert not c.called and c.receipt_id == "re_1" and calls == [KEY]
        finally:
            await ledger.close()

    run(body())


def test_disk_full_before_the_call_is_a_storage_error_and_nothing_is_called(tmp_path: Path) -> None:
    path = str(tmp_path / "effects.db")
    calls: list[str] = []

    async def call(key: str) -> dict[str, Any]:
        calls.append(key)
        return {"id": "re_1"}

    async def body() -> None:
        ledger = await Ledger.open(path, targets=[Target(TARGET)], clock=FakeClock())
        try:
            # Fill what the file has, so that the intent needs a new page.
            await execute(ledger, call, step="warm-up", request={"pad": "p" * 3000})
            await fill_the_disk(ledger)
            before = db_counts(path)
            with pytest.raises(LedgerError) as ei:
                await execute(ledger, call, request={"pad": "q" * 20_000})
            assert isinstance(ei.value, StorageError), repr(ei.value)
            assert isinstance(ei.value.__cause__, sqlite3.OperationalError)
            assert "full" in str(ei.value)
            assert db_counts(path) == before and len(calls) == 1
            # The store is still usable once there is room again.
            await free_the_disk(ledger)
            assert (await execute(ledger, call, request={"pad": "q" * 20_000})).called
        finally:
            await ledger.close()

    run(body())

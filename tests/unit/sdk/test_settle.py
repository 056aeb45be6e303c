"""``Ledger.settle``: ``execute``'s first step alone (what an agent framework asks before it decides
whether a person must approve a call). It asks about an earlier attempt whose worker is gone, exactly
as ``execute`` would, and never executes anything."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from effect_ledger.core.model import State
from effect_ledger.core.reconcile import Found, Target
from effect_ledger.sdk.ledger import Ledger
from tests.sdk_contract import (
    KEY,
    OPERATION,
    REQUEST,
    RUN_ID,
    STEP,
    TARGET,
    Destination,
    FakeClock,
    dead_owner,
    reconciler_of,
    run,
    write_pending,
)


def settle(ledger: Ledger, dest: Any) -> Any:
    return ledger.settle(
        target=TARGET, operation=OPERATION, request=REQUEST, call=dest, run_id=RUN_ID, step=STEP, timeout=20
    )


def test_a_key_nobody_used_stays_unused(tmp_path: Path) -> None:
    dest = Destination()

    async def body() -> None:
        async with await Ledger.open(str(tmp_path / "e.db"), targets=[Target(TARGET)]) as ledger:
            assert await settle(ledger, dest) is None
            assert await ledger.get(KEY) is None and dest.calls == []

    run(body())


def test_an_attempt_whose_worker_is_gone_is_asked_about(tmp_path: Path) -> None:
    dest, asked = Destination(), []
    target = Target(TARGET, reconciler=reconciler_of(Found("re_77", {"id": "re_77"}), asked))

    async def body() -> None:
        async with await Ledger.open(str(tmp_path / "e.db"), targets=[target]) as ledger:
            key = await write_pending(ledger, owner=dead_owner())
            effect = await settle(ledger, dest)
            assert effect.state is State.CONFIRMED and effect.receipt.receipt_id == "re_77"
            assert [v.effect_id for v in asked] == [key] and dest.calls == []

    run(body())


def test_what_nobody_can_ask_escalates_and_nothing_is_sent(tmp_path: Path) -> None:
    dest = Destination()

    async def body() -> None:
        async with await Ledger.open(str(tmp_path / "e.db"), targets=[Target(TARGET)]) as ledger:
            await write_pending(ledger, owner=dead_owner())
            effect = await settle(ledger, dest)
            assert effect.state is State.ESCALATED and "no reconciler" in effect.reason
            assert dest.calls == []

    run(body())


def test_an_attempt_in_flight_in_a_live_worker_is_left_alone(tmp_path: Path) -> None:
    clock, asked = FakeClock(), []
    target = Target(TARGET, reconciler=reconciler_of(Found("re_1", {"id": "re_1"}), asked))
    path = str(tmp_path / "e.db")

    async def body() -> None:
        entered, release = asyncio.Event(), asyncio.Event()

        async def slow(key: str) -> dict[str, Any]:
            entered.set()
            await release.wait()
            return {"id": "re_a"}

        a = await Ledger.open(path, targets=[target], clock=clock)
        b = await Ledger.open(path, targets=[target], clock=clock)
        try:
            task = asyncio.create_task(settle_then_execute(a, slow))
            await asyncio.wait_for(entered.wait(), 10)
            effect = await settle(b, slow)
            assert effect.state is State.PENDING and asked == []  # its worker lives: nobody is asked
            release.set()
            assert (await task).called
        finally:
            await a.close()
            await b.close()

    run(body())


async def settle_then_execute(ledger: Ledger, call: Any) -> Any:
    assert await settle(ledger, call) is None
    return await ledger.execute(
        target=TARGET, operation=OPERATION, request=REQUEST, call=call, run_id=RUN_ID, step=STEP, timeout=20
    )

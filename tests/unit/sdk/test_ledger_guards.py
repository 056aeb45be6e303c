"""Guards beside the fault suite's fixes (tests/faults): what the fixes must keep working. A claim
of this process stays live while its ledger object is open with the key in flight, even past the
deadline; an empty file is a new ledger, and a ledger file reopens."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from effect_ledger.core.reconcile import Absent, Target
from effect_ledger.errors import ConfigError, EffectInProgress
from effect_ledger.sdk.ledger import Ledger
from tests.faults._common import execute
from tests.sdk_contract import KEY, TARGET, Destination, FakeClock, reconciler_of, run


async def open_ledger(path: str) -> Ledger:
    return await Ledger.open(path, targets=[Target(TARGET)], clock=FakeClock())


def test_a_live_in_flight_call_of_another_open_ledger_still_holds_the_key(tmp_path: Path) -> None:
    """The other side of the rule: while ledger A is open and its call is in flight, B must wait,
    even past A's deadline (A's own timeout ends the call and records the outcome)."""
    path = str(tmp_path / "effects.db")
    clock = FakeClock()
    target = Target(TARGET, reconciler=reconciler_of(Absent("no such refund")))
    dest = Destination()

    async def body() -> None:
        entered, release = asyncio.Event(), asyncio.Event()

        async def slow(key: str) -> Any:
            entered.set()
            await release.wait()
            return {"id": "re_a"}

        a = await Ledger.open(path, targets=[target], clock=clock)
        b = await Ledger.open(path, targets=[target], clock=clock)
        try:
            task = asyncio.create_task(execute(a, slow, timeout=10))
            await asyncio.wait_for(entered.wait(), 10)
            clock.advance(10_001)
            with pytest.raises(EffectInProgress):
                await execute(b, dest, timeout=10)
            release.set()
            assert (await task).receipt_id == "re_a"
            again = await execute(b, dest, timeout=10)
            assert not again.called and again.receipt_id == "re_a" and dest.calls == []
        finally:
            await a.close()
            await b.close()

    run(body())


def test_open_accepts_an_empty_file_and_reopens_its_own_ledger(tmp_path: Path) -> None:
    path = tmp_path / "effects.db"
    path.write_bytes(b"")
    dest = Destination()

    async def body() -> None:
        for _ in range(2):
            ledger = await open_ledger(str(path))
            try:
                await execute(ledger, dest)
            finally:
                await ledger.close()

    run(body())
    assert dest.calls == [KEY]


@pytest.mark.parametrize("confirm_within", [-1, 601, float("nan"), "10", True])
def test_open_refuses_a_confirm_within_out_of_bounds_before_touching_the_file(
    tmp_path: Path, confirm_within: Any
) -> None:
    path = tmp_path / "effects.db"
    with pytest.raises(ConfigError, match="confirm_within must be a number of seconds from 0 to 600"):
        asyncio.run(Ledger.open(str(path), targets=[Target(TARGET)], confirm_within=confirm_within))
    assert not path.exists()

"""A ledger reopened in the same process takes over its predecessor's dead claim once the lease ends
(issue 10, item 7).

The claim's owner is a worker identity ``host:pid:start:nonce``. Before the fix, an owner in this
process counted as alive because the pid was, so a claim left by a ledger object that was closed
(or lost) mid-call answered ``EffectInProgress`` (retry after 0) for ever, long past its deadline.
Now an identity of this process is alive only while that ledger object is open and has the key in
flight; otherwise, like any owner nobody can vouch for, its lease (the attempt's deadline) decides.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import pytest

from effect_ledger.core.model import State
from effect_ledger.core.reconcile import Absent, Found, Target
from effect_ledger.errors import EffectInProgress
from effect_ledger.sdk.ledger import Ledger
from tests.faults._common import execute
from tests.sdk_contract import KEY, TARGET, Destination, FakeClock, reconciler_of, run


def test_reopened_ledger_takes_over_a_claim_its_closed_predecessor_left_after_the_deadline(tmp_path: Path) -> None:
    path = str(tmp_path / "effects.db")
    clock = FakeClock()
    target = Target(TARGET, reconciler=reconciler_of(Absent("no such refund")))
    dest = Destination()

    async def body() -> None:
        entered, never = asyncio.Event(), asyncio.Event()

        async def hangs(key: str) -> Any:
            entered.set()
            await never.wait()

        a = await Ledger.open(path, targets=[target], clock=clock)
        stuck = asyncio.create_task(execute(a, hangs, timeout=10))
        await asyncio.wait_for(entered.wait(), 10)
        await a.close()  # closed mid-call: the claim stays in the file, as after a crash of that object
        b = await Ledger.open(path, targets=[target], clock=clock)
        try:
            assert b.worker != a.worker
            with pytest.raises(EffectInProgress) as ei:
                await execute(b, dest, timeout=10)
            assert ei.value.retry_after_ms == 10_000  # within the lease: the call may still be running
            # Past the deadline, the old call may still land for the target's lands_within: then it cannot.
            clock.advance(10_000 + target.lands_within_ms)
            c = await execute(b, dest, timeout=10)
            assert c.called and c.attempt == 2 and dest.calls == [KEY]
            effect = await b.get(KEY)
            assert effect is not None and effect.state is State.CONFIRMED
        finally:
            stuck.cancel()
            with contextlib.suppress(BaseException):
                await stuck
            await b.close()

    run(body())


def test_reopened_ledger_asks_the_reconciler_about_a_dead_same_process_claim(tmp_path: Path) -> None:
    """The same takeover with a destination that did act: found, confirmed, never called again."""
    path = str(tmp_path / "effects.db")
    clock = FakeClock()
    target = Target(TARGET, reconciler=reconciler_of(Found("re_first")))
    dest = Destination()

    async def body() -> None:
        entered, never = asyncio.Event(), asyncio.Event()

        async def hangs(key: str) -> Any:
            entered.set()
            await never.wait()

        a = await Ledger.open(path, targets=[target], clock=clock)
        stuck = asyncio.create_task(execute(a, hangs, timeout=10))
        await asyncio.wait_for(entered.wait(), 10)
        await a.close()
        b = await Ledger.open(path, targets=[target], clock=clock)
        try:
            clock.advance(60_000)
            for _ in range(3):  # never "in progress, retry after 0" again
                c = await execute(b, dest, timeout=10)
                assert not c.called and c.receipt_id == "re_first"
            assert dest.calls == []
        finally:
            stuck.cancel()
            with contextlib.suppress(BaseException):
                await stuck
            await b.close()

    run(body())

"""A call cut off at its deadline may still take effect at the destination afterwards: a request a
queue or a busy server holds, processed after the caller gave up. "Absent" asked before then proves
nothing, yet the reconcilers judged it ABSENT as soon as the deadline had passed, and the next
execute paid a second time (a destination that answers lookups and does not deduplicate keys).

An absent answer is ABSENT only once the call can no longer land: its deadline plus the target's
``lands_within`` (2 s by default; ``streams.reconcile.judge``). Before that it is an UNKNOWN that
uses up no try, asked again once it can no longer land (``next_check_ms``), and an ``execute`` that
asked is refused with ``EffectInProgress`` until then (``plan.after_answer``). The rule is the one
home of reconciliation, so the embedded runner, the SDK's own asking and the reconciliation
consumers (``processors/reconcile_service.py``) share it.

Real HTTP on loopback: the demo gateway of kind ``lookup`` in its ``late`` mode (the refund is made
``delay`` seconds after the request arrived), the real HTTP reconciler, a real ledger file."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from effect_ledger.core.model import State
from effect_ledger.demo.client import GatewayClient
from effect_ledger.demo.gateway import Gateway
from effect_ledger.errors import EffectInProgress, EffectUncertain
from effect_ledger.sdk.ledger import Ledger
from effect_ledger.sdk.receipts import wall_clock_ms
from effect_ledger.sdk.runner import Runner
from tests.faults.http_servers import LoopbackServer, Reply
from tests.sdk_contract import run

TIMEOUT_S = 0.5
LATE_S = 1.5  # after the deadline (0.5 s), within the default lands_within (2 s)
DEADLINE_S = 20.0  # how long a scenario may take at most
REQUEST = {"order": "123", "amount": 4800}


@pytest.fixture
def gateway() -> Iterator[Gateway]:
    gw = Gateway("lookup").start()  # answers lookups by key, does not deduplicate them
    yield gw
    gw.stop()


def targets(tmp_path: Path, gw: Gateway, extra: str = "") -> Path:
    path = tmp_path / "targets.toml"
    path.write_text(f'[targets.payments]\nlookup = "{gw.url}/refunds/by-key/{{key}}"\n{extra}')
    return path


async def refund(gw: Gateway, key: str) -> dict[str, object]:
    async with GatewayClient(gw.url) as client:
        return await client.refund("123", 4800, idempotency_key=key)


async def first_call_cut_off(ledger: Ledger, gw: Gateway) -> str:
    """Attempt 1 times out while the gateway holds its request: recorded UNCERTAIN."""
    gw.state.failures.append(("late", LATE_S))
    with pytest.raises(EffectUncertain) as e:
        await execute(ledger, gw)
    return e.value.effect_id


async def execute(ledger: Ledger, gw: Gateway):  # type: ignore[no-untyped-def]
    return await ledger.execute(
        target="payments", operation="refund.create", run_id="run-1", step="refund-order-123",
        request=REQUEST, call=lambda key: refund(gw, key), timeout=TIMEOUT_S,
    )  # fmt: skip


async def until_settled(gw: Gateway, key: str) -> None:
    """Wait for the held request to take effect (the refund exists), with a deadline."""
    end = time.monotonic() + DEADLINE_S
    while not gw.refunds():
        assert time.monotonic() < end, "the gateway never made the held refund"
        await asyncio.sleep(0.02)


def test_the_runner_does_not_judge_absent_while_the_call_may_still_land(tmp_path: Path, gateway: Gateway) -> None:
    async def body() -> None:
        async with await Ledger.open(tmp_path / "effects.db", targets=targets(tmp_path, gateway)) as ledger:
            key = await first_call_cut_off(ledger, gateway)
            runner = Runner(ledger)
            end = time.monotonic() + DEADLINE_S
            states = []
            while (effect := await ledger.get(key)) is not None and effect.state is State.UNCERTAIN:
                assert time.monotonic() < end, f"still UNCERTAIN after {DEADLINE_S} s: {states}"
                states.append((await runner.tick()).reconciled.get(key))
                await asyncio.sleep(0.05)
            await until_settled(gateway, key)
            assert effect is not None
            # The gateway made the refund after the deadline: the ledger must have found it.
            assert effect.state is State.CONFIRMED, (effect.state, effect.resolutions)
            c = await execute(ledger, gateway)
            assert not c.called and c.receipt_id == gateway.refunds()[0].id
        assert [r.id for r in gateway.refunds()] == ["re_0001"], "the refund was paid twice"

    run(body())


def test_execute_waits_for_the_old_call_to_be_unable_to_land(tmp_path: Path, gateway: Gateway) -> None:
    async def body() -> None:
        async with await Ledger.open(tmp_path / "effects.db", targets=targets(tmp_path, gateway)) as ledger:
            key = await first_call_cut_off(ledger, gateway)
            refused = []
            end = time.monotonic() + DEADLINE_S
            while True:  # the agent retries, as an orchestrator replaying the step would
                assert time.monotonic() < end, f"never answered after {DEADLINE_S} s: {refused}"
                try:
                    c = await execute(ledger, gateway)
                    break
                except EffectInProgress as e:  # "ask again in retry_after_ms"
                    refused.append(e.retry_after_ms)
                    await asyncio.sleep(min(0.2, (e.retry_after_ms or 100) / 1000))
            assert refused, "asked while the call could still land, and went on at once"
            assert not c.called and c.attempt == 1, c
            assert c.receipt_id == gateway.refunds()[0].id
            effect = await ledger.get(key)
            assert effect is not None and effect.state is State.CONFIRMED
        assert [r.id for r in gateway.refunds()] == ["re_0001"], "the refund was paid twice"

    run(body())


def test_a_targets_lands_within_widens_the_window(tmp_path: Path, gateway: Gateway) -> None:
    """A request held for longer than the default: the declaration says how long it may be."""

    async def body() -> None:
        path = targets(tmp_path, gateway, 'lands_within = "6s"\n')
        async with await Ledger.open(tmp_path / "effects.db", targets=path) as ledger:
            gateway.state.failures.append(("late", 4.0))  # past the default 2 s, within 6 s
            with pytest.raises(EffectUncertain) as e:
                await execute(ledger, gateway)
            key = e.value.effect_id
            runner = Runner(ledger)
            end = time.monotonic() + DEADLINE_S
            while (effect := await ledger.get(key)) is not None and effect.state is State.UNCERTAIN:
                assert time.monotonic() < end
                await runner.tick()
                await asyncio.sleep(0.05)
            assert effect is not None and effect.state is State.CONFIRMED, (effect.state, effect.resolutions)
        assert len(gateway.refunds()) == 1

    run(body())


def test_an_answer_asked_too_early_is_asked_again_however_late_it_comes_back(tmp_path: Path) -> None:
    """The lookup is asked just before the cut-off call can no longer land and answers "absent"
    after that time has passed (a slow destination, a loaded host: the crash matrix met it under
    CI's load). "Absent so far" says nothing about the time after it was asked, so the caller is
    told to ask again (``EffectInProgress``, retry after 0), not handed ``EffectUncertain``: the next
    question gets a real ABSENT and the one call is made. Before, execute judged the answer on the
    clock after it came back and gave up with "uncertain" on an effect one more question settles.

    The ledger's clock is the test's (``Ledger.open(clock=...)``) and the lookup, a real HTTP server
    on loopback, moves it past the window while it answers: no real seconds are waited."""
    skew = [0]
    slow = [True]

    def clock() -> int:
        return wall_clock_ms() + skew[0]

    def answer(path: str) -> Reply:
        if slow[0]:  # the answer takes "3 s": past the deadline + lands_within (2 s)
            skew[0] += 3_000
            slow[0] = False
        return Reply(404, b'{"error": "no refund with this key"}')

    calls: list[str] = []

    async def refund_call(key: str) -> dict[str, object]:
        calls.append(key)
        if len(calls) == 1:
            await asyncio.sleep(DEADLINE_S)  # hangs before anything is sent: cut off at the deadline
        return {"id": f"re_{len(calls)}"}

    async def body() -> None:
        with LoopbackServer(answer) as srv:
            path = tmp_path / "targets.toml"
            path.write_text(f'[targets.payments]\nlookup = "{srv.url}/refunds/by-key/{{key}}"\n')
            async with await Ledger.open(tmp_path / "effects.db", targets=path, clock=clock) as ledger:

                async def go():  # type: ignore[no-untyped-def]
                    return await ledger.execute(
                        target="payments", operation="refund.create", run_id="run-1", step="refund-order-123",
                        request=REQUEST, call=refund_call, timeout=TIMEOUT_S,
                    )  # fmt: skip

                with pytest.raises(EffectUncertain):
                    await go()  # attempt 1 cut off: UNCERTAIN
                with pytest.raises(EffectInProgress) as refused:
                    await go()  # asked before the window closed, answered after it: ask again
                assert refused.value.retry_after_ms == 0
                c = await go()  # asked again: absent for good, attempt 2 makes the one call
                assert c.called and c.attempt == 2 and c.receipt_id == "re_2", c
                assert len(srv.seen) == 2, [s.path for s in srv.seen]
        assert len(calls) == 2

    run(body())

"""The embedded runner (``effect_ledger.sdk.runner.Runner``) on a real SQLite ledger with a fake clock:
deadlines fire a Timeout event (after the grace, not before), uncertain effects are reconciled with
backoff, and escalated when nobody can tell."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from effect_ledger.core.effect import timeout_event_id
from effect_ledger.core.model import Executed, Outcome, State, Timeout, TimeoutPhase, Verdict
from effect_ledger.core.reconcile import Absent, Backoff, EffectView, Found, Target, Unknown
from effect_ledger.errors import EffectUncertain
from effect_ledger.sdk.ledger import Ledger
from effect_ledger.sdk.runner import Runner
from effect_ledger.targets.ask import CallableReconciler
from tests.sdk_contract import (
    KEY,
    OPERATION,
    REQUEST,
    RUN_ID,
    STEP,
    T0,
    TARGET,
    Destination,
    FakeClock,
    effect_row,
    event_kinds,
    reconciler_of,
    run,
    write_pending,
)

GRACE = 1_000


def with_ledger(tmp_path: Path, body: Callable[[Ledger, FakeClock], Awaitable[None]], *targets: Target) -> None:
    clock = FakeClock()

    async def main() -> None:
        ledger = await Ledger.open(str(tmp_path / "effects.db"), clock=clock, targets=targets or (Target(TARGET),))
        try:
            await body(ledger, clock)
        finally:
            await ledger.close()

    run(main())


async def uncertain(ledger: Ledger, timeout: float = 10.0) -> str:
    """An effect whose call outcome is unknown (a transport error) at the clock's now: UNCERTAIN,
    with its deadline ``timeout`` seconds later."""
    dest = Destination()
    dest.fail.append(ConnectionError("connection reset"))
    with pytest.raises(EffectUncertain):
        await ledger.execute(
            target=TARGET,
            operation=OPERATION,
            run_id=RUN_ID,
            step=STEP,
            request=REQUEST,
            call=dest,
            timeout=timeout,
        )
    assert (await ledger.get(KEY)).state is State.UNCERTAIN  # type: ignore[union-attr]
    return KEY


def counting(answer: Any) -> tuple[Any, list[EffectView]]:
    asked: list[EffectView] = []
    return reconciler_of(answer, asked), asked


# --- deadlines -----------------------------------------------------------------------------------------


def test_pending_past_deadline_plus_grace_times_out_not_before(tmp_path: Path) -> None:
    rec, asked = counting(Unknown("no answer yet"))

    async def body(ledger: Ledger, clock: FakeClock) -> None:
        runner = Runner(ledger, grace_ms=GRACE)
        key = await write_pending(ledger, timeout_s=10)
        for at in (0, 10_000, 10_000 + GRACE - 1):
            clock.now = T0 + at
            report = await runner.tick()
            assert not report and report.timed_out == []
            assert (await ledger.get(key)).state is State.PENDING  # type: ignore[union-attr]
        assert asked == []
        clock.now = T0 + 10_000 + GRACE
        report = await runner.tick()
        assert report.timed_out == [key]
        effect = await ledger.get(key)
        assert effect.state is State.UNCERTAIN  # type: ignore[union-attr]
        timeouts = [f for f in effect.facts if isinstance(f, Timeout)]  # type: ignore[union-attr]
        assert [(t.phase, t.deadline_ms, t.event_id) for t in timeouts] == [
            (TimeoutPhase.CALL, T0 + 10_000, timeout_event_id(key, 1, TimeoutPhase.CALL))
        ]
        # The same tick asks the reconciler about the now-uncertain effect.
        assert len(asked) == 1 and report.reconciled == {key: "UNCERTAIN"}
        # Firing again changes nothing: the timeout's event id is deterministic.
        await runner.tick()
        assert event_kinds(ledger.store.path, key).count("Timeout") == 1

    with_ledger(tmp_path, body, Target(TARGET, reconciler=rec))


def test_executed_without_receipt_past_deadline_times_out(tmp_path: Path) -> None:
    async def body(ledger: Ledger, clock: FakeClock) -> None:
        runner = Runner(ledger, grace_ms=GRACE)
        key = await write_pending(ledger, timeout_s=10)
        before = await ledger.get(key)
        ok = Executed(uuid.uuid4().hex, key, T0 + 50, 1, Outcome.OK, None, T0 + 10, T0 + 50, None, ledger.worker)
        await ledger.store.append(before, [ok], now_ms=T0 + 50)
        assert (await ledger.get(key)).state is State.EXECUTED  # type: ignore[union-attr]
        clock.now = T0 + 10_000 + GRACE - 1
        assert not await runner.tick()
        clock.now = T0 + 10_000 + GRACE
        report = await runner.tick()
        assert report.timed_out == [key]
        effect = await ledger.get(key)
        assert effect.state is State.UNCERTAIN  # type: ignore[union-attr]
        assert [f.phase for f in effect.facts if isinstance(f, Timeout)] == [TimeoutPhase.RECEIPT]  # type: ignore[union-attr]

    with_ledger(tmp_path, body, Target(TARGET, reconciler=reconciler_of(Unknown("later"))))


def test_pending_past_deadline_found_in_the_same_tick(tmp_path: Path) -> None:
    async def body(ledger: Ledger, clock: FakeClock) -> None:
        key = await write_pending(ledger, timeout_s=10)
        clock.now = T0 + 60_000
        report = await Runner(ledger, grace_ms=GRACE).tick()
        assert report.timed_out == [key] and report.reconciled == {key: "CONFIRMED"}
        effect = await ledger.get(key)
        assert effect.state is State.CONFIRMED and effect.receipt.receipt_id == "re_5"  # type: ignore[union-attr]

    with_ledger(tmp_path, body, Target(TARGET, reconciler=reconciler_of(Found("re_5", {"id": "re_5"}))))


def test_confirmed_and_not_yet_due_effects_are_left_alone(tmp_path: Path) -> None:
    rec, asked = counting(Found("re_x"))

    async def body(ledger: Ledger, clock: FakeClock) -> None:
        dest = Destination()
        await ledger.execute(target=TARGET, operation=OPERATION, run_id="r", step="done", request={}, call=dest)
        key = await write_pending(ledger, timeout_s=3600)
        clock.advance(60_000)
        assert not await Runner(ledger, grace_ms=GRACE).tick()
        assert asked == [] and (await ledger.get(key)).state is State.PENDING  # type: ignore[union-attr]

    with_ledger(tmp_path, body, Target(TARGET, reconciler=rec))


# --- reconciliation ------------------------------------------------------------------------------------


def test_uncertain_found_is_confirmed(tmp_path: Path) -> None:
    rec, asked = counting(Found("re_42", {"id": "re_42", "status": "succeeded"}))

    async def body(ledger: Ledger, clock: FakeClock) -> None:
        key = await uncertain(ledger)
        report = await Runner(ledger, grace_ms=GRACE).tick()
        assert report.reconciled == {key: "CONFIRMED"} and report.timed_out == []
        effect = await ledger.get(key)
        assert effect.state is State.CONFIRMED and effect.receipt.receipt_id == "re_42"  # type: ignore[union-attr]
        assert [v.effect_id for v in asked] == [key] and asked[0].request == REQUEST
        c = await ledger.execute(
            target=TARGET, operation=OPERATION, run_id=RUN_ID, step=STEP, request=REQUEST, call=Destination()
        )
        assert c.receipt_id == "re_42" and not c.called and c.value == {"id": "re_42", "status": "succeeded"}

    with_ledger(tmp_path, body, Target(TARGET, reconciler=rec))


def test_uncertain_absent_after_deadline_is_absent(tmp_path: Path) -> None:
    async def body(ledger: Ledger, clock: FakeClock) -> None:
        key = await uncertain(ledger, timeout=10)
        runner = Runner(ledger, grace_ms=GRACE)
        # Before the call's deadline "absent" proves nothing: the request may still land.
        report = await runner.tick()
        assert report.reconciled == {key: "UNCERTAIN"}
        # Nor until the target's lands_within has passed since the deadline: not asked again before.
        clock.now = T0 + 10_000 + Target(TARGET).lands_within_ms - 1
        assert (await runner.tick()).reconciled == {}
        clock.now += 1
        report = await runner.tick()
        assert report.reconciled == {key: "ABSENT"}
        effect = await ledger.get(key)
        assert effect.state is State.ABSENT  # type: ignore[union-attr]
        assert [r.verdict for r in effect.resolutions] == [Verdict.UNKNOWN, Verdict.ABSENT]  # type: ignore[union-attr]
        # Absent: the next execute runs the call again, with the same key.
        dest = Destination()
        c = await ledger.execute(
            target=TARGET, operation=OPERATION, run_id=RUN_ID, step=STEP, request=REQUEST, call=dest
        )
        assert c.called and c.attempt == 2 and dest.calls == [key]

    with_ledger(tmp_path, body, Target(TARGET, reconciler=reconciler_of(Absent("404"))))


def test_unknown_backs_off_then_escalates_after_max_tries(tmp_path: Path) -> None:
    rec, asked = counting(Unknown("gateway 503"))
    backoff = Backoff(first_s=1.0, factor=2.0, max_s=300.0, max_tries=3)

    async def body(ledger: Ledger, clock: FakeClock) -> None:
        key = await uncertain(ledger)
        runner = Runner(ledger, grace_ms=GRACE)

        report = await runner.tick()
        assert report.reconciled == {key: "UNCERTAIN"} and len(asked) == 1
        row = effect_row(ledger.store.path, key)
        assert (row["check_tries"], row["next_check_ms"]) == (1, T0 + 1_000)  # type: ignore[index]

        # Not asked again before next_check_ms.
        assert not await runner.tick()
        clock.now = T0 + 999
        assert not await runner.tick()
        assert len(asked) == 1

        clock.now = T0 + 1_000
        report = await runner.tick()
        assert report.reconciled == {key: "UNCERTAIN"} and len(asked) == 2
        row = effect_row(ledger.store.path, key)
        assert (row["check_tries"], row["next_check_ms"]) == (2, T0 + 1_000 + 2_000)  # type: ignore[index]

        clock.now = T0 + 2_999
        assert not await runner.tick()
        clock.now = T0 + 3_000
        report = await runner.tick()
        assert report.reconciled == {key: "ESCALATED"} and len(asked) == 3
        effect = await ledger.get(key)
        assert effect.state is State.ESCALATED  # type: ignore[union-attr]
        assert [(r.verdict, r.tries) for r in effect.resolutions] == [  # type: ignore[union-attr]
            (Verdict.UNKNOWN, 1),
            (Verdict.UNKNOWN, 2),
            (Verdict.ESCALATE, 3),
        ]
        assert "gateway 503" in (effect.reason or "")  # type: ignore[union-attr]
        # Escalated effects are a person's business now: the runner leaves them alone.
        clock.advance(3_600_000)
        assert not await runner.tick()
        assert len(asked) == 3

    with_ledger(tmp_path, body, Target(TARGET, reconciler=rec, backoff=backoff))


def test_absent_past_retention_is_escalated(tmp_path: Path) -> None:
    async def body(ledger: Ledger, clock: FakeClock) -> None:
        key = await uncertain(ledger, timeout=10)
        clock.now = T0 + 60_001
        report = await Runner(ledger, grace_ms=GRACE).tick()
        assert report.reconciled == {key: "ESCALATED"}
        effect = await ledger.get(key)
        assert effect.state is State.ESCALATED and "retention" in (effect.reason or "")  # type: ignore[union-attr]

    with_ledger(tmp_path, body, Target(TARGET, reconciler=reconciler_of(Absent()), retention_s=60))


def test_no_reconciler_and_no_keys_is_escalated_on_the_first_tick(tmp_path: Path) -> None:
    async def body(ledger: Ledger, clock: FakeClock) -> None:
        key = await uncertain(ledger)
        report = await Runner(ledger, grace_ms=GRACE).tick()
        assert report.reconciled == {key: "ESCALATED"}
        assert (await ledger.get(key)).state is State.ESCALATED  # type: ignore[union-attr]

    with_ledger(tmp_path, body, Target(TARGET))  # declared with no way to ask (lookup = "none")


def test_undeclared_target_is_asked_again_after_backoff_then_escalated(tmp_path: Path) -> None:
    """A runner that was not told about a target does not escalate at once (the declaration may be
    fixed meanwhile): each tick records an unknown answer naming the problem, then it escalates."""

    async def body(ledger: Ledger, clock: FakeClock) -> None:
        key = await uncertain(ledger)
        runner_ledger = await Ledger.open(ledger.store.path, clock=clock, targets=[Target("other")])
        try:
            runner = Runner(runner_ledger, grace_ms=GRACE)
            assert (await runner.tick()).reconciled == {key: "UNCERTAIN"}
            effect = await ledger.get(key)
            assert effect is not None and effect.resolutions[-1].reconciler == "undeclared"
            assert "'payments' is not declared" in effect.resolutions[-1].reason
            assert (await runner.tick()).reconciled == {}  # backing off
            for _ in range(Backoff().max_tries - 1):
                clock.advance(int(Backoff().max_s * 1000))
                await runner.tick()
            assert (await ledger.get(key)).state is State.ESCALATED  # type: ignore[union-attr]
        finally:
            await runner_ledger.close()

    with_ledger(tmp_path, body, Target(TARGET, honours_keys=False))


def test_honours_keys_without_reconciler_is_left_for_the_agent(tmp_path: Path) -> None:
    async def body(ledger: Ledger, clock: FakeClock) -> None:
        key = await uncertain(ledger)
        runner = Runner(ledger, grace_ms=GRACE)
        report = await runner.tick()
        assert report.reconciled == {} and not report
        assert (await ledger.get(key)).state is State.UNCERTAIN  # type: ignore[union-attr]
        row = effect_row(ledger.store.path, key)
        assert row["next_check_ms"] == T0 + 3_600_000 + 1  # look again when the retention is over  # type: ignore[index]
        clock.now = T0 + 3_600_000
        assert not await runner.tick()
        # The agent replays the key (the destination returns the original): CONFIRMED.
        dest = Destination()
        c = await ledger.execute(
            target=TARGET, operation=OPERATION, run_id=RUN_ID, step=STEP, request=REQUEST, call=dest
        )
        assert dest.calls == [key] and not c.called and c.receipt_id == "re_0001"

    with_ledger(tmp_path, body, Target(TARGET, honours_keys=True, retention_s=3600))


def test_honours_keys_without_reconciler_escalates_after_retention(tmp_path: Path) -> None:
    async def body(ledger: Ledger, clock: FakeClock) -> None:
        key = await uncertain(ledger)
        runner = Runner(ledger, grace_ms=GRACE)
        assert not await runner.tick()
        clock.now = T0 + 60_001
        report = await runner.tick()
        assert report.reconciled == {key: "ESCALATED"}

    with_ledger(tmp_path, body, Target(TARGET, honours_keys=True, retention_s=60))


def test_runner_unknown_does_not_swallow_the_agents_concurrent_found(tmp_path: Path) -> None:
    """The agent and the runner ask about the same uncertain effect at once: the runner's lookup
    gets a 503 (Unknown) and records it first; the agent's lookup then finds the refund. The agent
    must get the receipt and the effect must be CONFIRMED."""
    asks: list[str] = []
    agent_asked, answer_agent = asyncio.Event(), asyncio.Event()

    async def lookup(effect: EffectView) -> Any:
        asks.append(effect.effect_id)
        if len(asks) == 1:  # the agent's
            agent_asked.set()
            await answer_agent.wait()
            return Found("re_1", {"id": "re_1"})
        return Unknown("gateway 503")  # the runner's

    async def body(ledger: Ledger, clock: FakeClock) -> None:
        key = await uncertain(ledger, timeout=10)
        clock.now = T0 + 10_001
        dest = Destination()
        task = asyncio.create_task(
            ledger.execute(target=TARGET, operation=OPERATION, run_id=RUN_ID, step=STEP, request=REQUEST, call=dest)
        )
        await asyncio.wait_for(agent_asked.wait(), 10)
        report = await Runner(ledger, grace_ms=GRACE).tick()
        assert report.reconciled == {key: "UNCERTAIN"}
        answer_agent.set()
        c = await task
        assert (c.receipt_id, c.called) == ("re_1", False)
        assert (await ledger.get(key)).state is State.CONFIRMED  # type: ignore[union-attr]

    with_ledger(tmp_path, body, Target(TARGET, reconciler=CallableReconciler(lookup, name="lookup")))


def test_run_ticks_until_stopped(tmp_path: Path) -> None:
    async def body(ledger: Ledger, clock: FakeClock) -> None:
        key = await uncertain(ledger)
        stop = asyncio.Event()
        task = asyncio.create_task(Runner(ledger, interval=0.01, grace_ms=GRACE).run(stop))
        loop = asyncio.get_running_loop()
        end = loop.time() + 10
        while (await ledger.get(key)).state is not State.CONFIRMED:  # type: ignore[union-attr]
            assert loop.time() < end, "the runner never reconciled the effect"
            await asyncio.sleep(0.01)
        stop.set()
        await asyncio.wait_for(task, 5)

    with_ledger(tmp_path, body, Target(TARGET, reconciler=reconciler_of(Found("re_1"))))

"""The producer SDK's behaviour, written once for every backend.

``LedgerContract`` is an abstract base: a backend's test module subclasses it as ``Test<Backend>``
and implements ``open_ledger`` (embedded mode: ``tests/unit/sdk/test_sdk_embedded.py``; a Kafka-mode
backend opens its ledger the same way with ``kafka=...``). The base's name does not start with
``Test`` and this module is not a ``test_*.py`` file, so pytest never collects it on its own.

Everything here is real: a SQLite file under ``tmp_path``, the real store, real processes. Time that
the ledger reads comes from ``FakeClock``; where real waiting cannot be avoided (a call that must
outlast its timeout, another process), a condition is polled with a deadline. There is no
pytest-asyncio: each test is a sync function that runs one coroutine with ``run``.
"""

from __future__ import annotations

import abc
import asyncio
import functools
import json
import math
import os
import socket
import sqlite3
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import pytest

from effect_ledger.core.deadlines import DECISION_GRACE_MS
from effect_ledger.core.keys import DEFAULT_NAMESPACE, canonical_json, digest, effect_key
from effect_ledger.core.model import (
    DecisionKind,
    Executed,
    Flag,
    Intent,
    Outcome,
    ReceiptSource,
    State,
    Verdict,
)
from effect_ledger.core.reconcile import Absent, EffectView, Found, Target, Unknown
from effect_ledger.errors import (
    DecisionRefused,
    DefiniteFailure,
    EffectClosed,
    EffectConflict,
    EffectInProgress,
    EffectUncertain,
    InvalidEffect,
    LedgerClosed,
    UnknownEffect,
)
from effect_ledger.sdk.ledger import Confirmation, Ledger
from effect_ledger.sdk.store.sqlite import ClaimOp
from effect_ledger.targets.ask import CallableReconciler

ROOT = Path(__file__).resolve().parent.parent
T = TypeVar("T")

T0 = 1_700_000_000_000  # the fake clock's start (epoch ms)
TARGET = "payments"
# What the contract's ledgers are told about the destination unless a test says more: nothing can
# ask it (the Python form of `lookup = "none"`).
DECLARED = (Target(TARGET), Target("mail"))
OPERATION = "refund.create"
RUN_ID = "run-7"
STEP = "refund-order-123"
REQUEST = {"order": "123", "amount": 4800, "currency": "CNY"}
KEY = effect_key(TARGET, OPERATION, RUN_ID, STEP)


# --- helpers shared by the SDK, runner and reconciler tests -----------------------------------------


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run one coroutine to completion on a fresh event loop (there is no pytest-asyncio)."""
    return asyncio.run(coro)


class FakeClock:
    """A controllable clock in epoch milliseconds, for ``Ledger.open(path, clock=...)``."""

    def __init__(self, start_ms: int = T0) -> None:
        self.now = start_ms

    def __call__(self) -> int:
        return self.now

    def advance(self, ms: int) -> int:
        self.now += ms
        return self.now


class Destination:
    """A fake external destination: records every call and returns ``{"id": "re_<n>", "key": key}``.
    ``fail`` (an exception instance) is raised instead, once per queued entry."""

    def __init__(self, *, delay: float = 0.0) -> None:
        self.calls: list[str] = []
        self.delay = delay
        self.fail: list[BaseException] = []

    async def __call__(self, key: str) -> dict[str, Any]:
        self.calls.append(key)
        if self.delay:
            await asyncio.sleep(self.delay)
        if self.fail:
            raise self.fail.pop(0)
        return {"id": f"re_{len(self.calls):04d}", "key": key}


def db_counts(path: str | Path) -> tuple[int, int]:
    """(rows in events, rows in effects), read with a separate plain sqlite3 connection."""
    with sqlite3.connect(str(path)) as conn:
        events = conn.execute("SELECT COUNT(*) FROM events").fetchone()[0]
        effects = conn.execute("SELECT COUNT(*) FROM effects").fetchone()[0]
    return events, effects


def effect_row(path: str | Path, key: str) -> dict[str, Any] | None:
    conn = sqlite3.connect(str(path))
    try:
        conn.row_factory = sqlite3.Row
        row = conn.execute("SELECT * FROM effects WHERE effect_id = ?", (key,)).fetchone()
        return dict(row) if row else None
    finally:
        conn.close()


def event_kinds(path: str | Path, key: str) -> list[str]:
    conn = sqlite3.connect(str(path))
    try:
        return [r[0] for r in conn.execute("SELECT kind FROM events WHERE effect_id = ? ORDER BY seq", (key,))]
    finally:
        conn.close()


def set_claim_owner(path: str | Path, key: str, owner: str) -> None:
    conn = sqlite3.connect(str(path), isolation_level=None, timeout=30)
    try:
        assert conn.execute("UPDATE effects SET claim_owner = ? WHERE effect_id = ?", (owner, key)).rowcount == 1
    finally:
        conn.close()


@functools.cache
def dead_owner() -> str:
    """A worker identity (``host:pid:start:nonce``) of a process on this host that has exited."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return f"{socket.gethostname()}:{proc.pid}:1:deadbeef"


async def write_pending(
    ledger: Ledger,
    *,
    owner: str | None = None,
    target: str = TARGET,
    operation: str = OPERATION,
    run_id: str = RUN_ID,
    step: str = STEP,
    request: Any = None,
    timeout_s: float = 30.0,
    namespace: str = DEFAULT_NAMESPACE,
) -> str:
    """An earlier attempt that never recorded an outcome: the intent exactly as ``execute`` writes it
    (with the claim taken in the same statement), through the ledger's own store. ``owner``, if
    given, then replaces the claim's owner (as if that worker had written it). Returns the key."""
    key = effect_key(target, operation, run_id, step, namespace)
    now = ledger.now_ms()
    canonical = canonical_json(REQUEST if request is None else request)
    intent = Intent(
        uuid.uuid4().hex,
        key,
        now,
        1,
        target,
        operation,
        namespace,
        run_id,
        step,
        canonical,
        digest(canonical),
        now + int(timeout_s * 1000),
        owner or ledger.worker,
    )
    await ledger.store.append(
        None, [intent], now_ms=now, claim_op=ClaimOp.TAKE, owner=ledger.worker, claim_until_ms=intent.deadline_ms
    )
    if owner is not None:
        set_claim_owner(ledger.store.path, key, owner)
    return key


async def wait_for(cond: Callable[[], bool], timeout: float = 10.0, what: str = "condition") -> None:
    """Poll ``cond`` on the event loop until it holds; fail after ``timeout`` seconds."""
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(0.005)


def wait_until(cond: Callable[[], bool], timeout: float = 10.0, what: str = "condition") -> None:
    """Poll ``cond`` from a thread until it holds; fail after ``timeout`` seconds."""
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.005)


class Rejected(DefiniteFailure):
    """A destination's definite no."""


class CardDeclined(ValueError):
    """Not a DefiniteFailure: definite only because a target lists it in ``definite_errors``."""


def reconciler_of(answer: Any, asked: list[EffectView] | None = None) -> CallableReconciler:
    def check(effect: EffectView) -> Any:
        if asked is not None:
            asked.append(effect)
        if isinstance(answer, BaseException):
            raise answer
        return answer

    return CallableReconciler(check, name="fake-lookup")


# --- the contract ------------------------------------------------------------------------------------

_RACE_SCRIPT = textwrap.dedent(
    """
    import asyncio, json, os, sys, time
    from pathlib import Path
    from effect_ledger.errors import EffectInProgress
    from effect_ledger.sdk.ledger import Ledger
    from effect_ledger.core.reconcile import Target

    db, me, workdir = sys.argv[1], sys.argv[2], Path(sys.argv[3])

    async def main():
        ledger = await Ledger.open(db, targets=[Target("payments")])
        (workdir / f"ready-{me}").touch()
        end = time.monotonic() + 30
        while len(list(workdir.glob("ready-*"))) < 2:  # start together
            if time.monotonic() > end:
                sys.exit(9)
            await asyncio.sleep(0.002)

        async def call(key):
            fd = os.open(workdir / "destination.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT)
            os.write(fd, f"{me} {key}\\n".encode())
            os.close(fd)
            await asyncio.sleep(1.0)
            return {"id": f"re_{me}"}

        try:
            c = await ledger.execute(
                target="payments", operation="refund.create", run_id="race", step="refund",
                request={"order": "9", "amount": 1}, call=call, timeout=20,
            )
            out = {"result": "confirmed", "called": c.called, "receipt_id": c.receipt_id}
        except EffectInProgress as e:
            out = {"result": "in_progress", "retry_after_ms": e.retry_after_ms}
        await ledger.close()
        print(json.dumps(out))

    asyncio.run(main())
    """
)


class LedgerContract(abc.ABC):
    """The SDK behaviour every ledger backend must show. Subclass as ``Test...`` and implement
    ``open_ledger``; every test opens its ledgers only through it."""

    #: What the backend's deadlines add to a call's timeout (ms): Kafka mode with ``sync`` allows
    #: ``confirm_within`` for the broker's and the processor's confirmations.
    deadline_extra_ms = 0

    @abc.abstractmethod
    async def open_ledger(self, path: str, **kwargs: Any) -> Ledger:
        """Open the ledger on ``path``; ``kwargs`` are ``Ledger.open``'s (clock, targets, ...)."""

    # helpers

    @staticmethod
    def db(tmp_path: Path) -> str:
        return str(tmp_path / "effects.db")

    async def execute(self, ledger: Ledger, call: Any, **kw: Any) -> Confirmation:
        args: dict[str, Any] = dict(
            target=TARGET, operation=OPERATION, run_id=RUN_ID, step=STEP, request=REQUEST, timeout=30.0
        )
        args.update(kw)
        return await ledger.execute(call=call, **args)

    async def with_ledger(self, path: str, body: Callable[[Ledger], Awaitable[T]], **kw: Any) -> T:
        kw.setdefault("clock", FakeClock())
        ledger = await self.open_ledger(path, **kw)
        try:
            return await body(ledger)
        finally:
            await ledger.close()

    # -- at most once, and the key --------------------------------------------------------------------

    def test_first_execute_calls_once_with_the_key(self, tmp_path: Path) -> None:
        dest = Destination()

        async def body(ledger: Ledger) -> None:
            c = await self.execute(ledger, dest)
            assert dest.calls == [KEY]
            assert c == Confirmation(KEY, "re_0001", {"id": "re_0001", "key": KEY}, ReceiptSource.CALL, 1, True)
            effect = await ledger.get(KEY)
            assert effect is not None and effect.state is State.CONFIRMED and effect.executions == 1
            assert event_kinds(ledger.store.path, KEY) == ["Intent", "Executed", "Receipt"]

        run(self.with_ledger(self.db(tmp_path), body))

    def test_second_execute_returns_the_recorded_receipt_without_calling(self, tmp_path: Path) -> None:
        dest = Destination()

        async def body(ledger: Ledger) -> None:
            first = await self.execute(ledger, dest)
            counts = db_counts(ledger.store.path)
            second = await self.execute(ledger, dest)
            assert dest.calls == [KEY]
            assert second.called is False
            assert (second.effect_id, second.receipt_id, second.value, second.attempt) == (
                first.effect_id,
                first.receipt_id,
                first.value,
                first.attempt,
            )
            assert db_counts(ledger.store.path) == counts

        run(self.with_ledger(self.db(tmp_path), body))

    def test_recorded_receipt_survives_reopening_the_file(self, tmp_path: Path) -> None:
        dest = Destination()
        path = self.db(tmp_path)

        async def body() -> None:
            await self.with_ledger(path, lambda ledger: self.execute(ledger, dest))
            c = await self.with_ledger(path, lambda ledger: self.execute(ledger, dest))
            assert dest.calls == [KEY] and c.called is False and c.receipt_id == "re_0001"

        run(body())

    def test_key_is_the_documented_effect_key(self, tmp_path: Path) -> None:
        dest = Destination()

        async def body(ledger: Ledger) -> None:
            c = await self.execute(ledger, dest)
            assert c.effect_id == KEY == effect_key(TARGET, OPERATION, RUN_ID, STEP, "default")
            c2 = await self.execute(ledger, dest, namespace="shop-eu")
            assert c2.effect_id == effect_key(TARGET, OPERATION, RUN_ID, STEP, "shop-eu") != KEY
            c3 = await self.execute(ledger, dest, step="refund-order-124")
            assert c3.effect_id == effect_key(TARGET, OPERATION, RUN_ID, "refund-order-124")
            assert dest.calls == [KEY, c2.effect_id, c3.effect_id]
            assert all(k.startswith("payments:") and len(k) == len("payments:") + 64 for k in dest.calls)

        run(self.with_ledger(self.db(tmp_path), body))

    def test_ledger_namespace_option_changes_the_key(self, tmp_path: Path) -> None:
        dest = Destination()

        async def body(ledger: Ledger) -> None:
            c = await self.execute(ledger, dest)
            assert c.effect_id == effect_key(TARGET, OPERATION, RUN_ID, STEP, "tenant-a")

        run(self.with_ledger(self.db(tmp_path), body, namespace="tenant-a"))

    def test_caller_supplied_key_is_used_as_is(self, tmp_path: Path) -> None:
        dest = Destination()
        mine = "order-123/refund#1?x=%41"

        async def body(ledger: Ledger) -> None:
            c = await self.execute(ledger, dest, key=mine, run_id=None, step=None)
            assert c.effect_id == mine and dest.calls == [mine]
            # A key wins over run_id/step when both are given.
            c2 = await self.execute(ledger, dest, key="k-2")
            assert c2.effect_id == "k-2" and dest.calls == [mine, "k-2"]
            assert (await ledger.get(mine)).state is State.CONFIRMED  # type: ignore[union-attr]
            assert await ledger.get(KEY) is None

        run(self.with_ledger(self.db(tmp_path), body))

    def test_intent_is_durable_before_the_call(self, tmp_path: Path) -> None:
        path = self.db(tmp_path)
        clock = FakeClock()
        seen: dict[str, Any] = {}

        async def call(key: str) -> dict[str, Any]:
            # Another connection (a plain sqlite3 one, and a second ledger) already sees the intent.
            seen["row"] = effect_row(path, key)
            seen["kinds"] = event_kinds(path, key)
            other = await self.open_ledger(path, clock=clock)
            try:
                seen["effect"] = await other.get(key)
            finally:
                await other.close()
            return {"id": "re_1"}

        async def body(ledger: Ledger) -> None:
            await self.execute(ledger, call, timeout=12.5)

        run(self.with_ledger(path, body, clock=clock))
        row, effect = seen["row"], seen["effect"]
        assert seen["kinds"] == ["Intent"]
        deadline = T0 + 12_500 + self.deadline_extra_ms
        assert row["state"] == "PENDING" and row["attempt"] == 1 and row["deadline_ms"] == deadline
        assert row["claim_owner"] is not None and row["claim_until_ms"] == deadline
        assert effect.state is State.PENDING and effect.intent.deadline_ms == deadline
        assert json.loads(effect.intent.request) == REQUEST
        assert effect.intent.request_digest == digest(canonical_json(REQUEST))

    # -- classifying the outcome ------------------------------------------------------------------------

    def test_definite_failure_is_failed_and_a_later_execute_runs_attempt_2(self, tmp_path: Path) -> None:
        dest = Destination()
        dest.fail.append(Rejected("card declined"))

        async def body(ledger: Ledger) -> None:
            with pytest.raises(Rejected, match="card declined"):
                await self.execute(ledger, dest)
            effect = await ledger.get(KEY)
            assert effect.state is State.FAILED and effect.attempt == 1  # type: ignore[union-attr]
            assert effect_row(ledger.store.path, KEY)["claim_owner"] is None  # type: ignore[index]
            c = await self.execute(ledger, dest)
            assert c.called and c.attempt == 2 and c.receipt_id == "re_0002"
            assert dest.calls == [KEY, KEY]
            effect = await ledger.get(KEY)
            assert effect.state is State.CONFIRMED and effect.executions == 1  # type: ignore[union-attr]

        run(self.with_ledger(self.db(tmp_path), body))

    def test_type_listed_in_definite_errors_is_failed(self, tmp_path: Path) -> None:
        dest = Destination()
        dest.fail.append(CardDeclined("declined"))

        async def body(ledger: Ledger) -> None:
            with pytest.raises(CardDeclined):
                await self.execute(ledger, dest)
            assert (await ledger.get(KEY)).state is State.FAILED  # type: ignore[union-attr]
            # The same exception type for a target that does not list it: the outcome is unknown.
            dest.fail.append(CardDeclined("declined"))
            with pytest.raises(EffectUncertain):
                await self.execute(ledger, dest, target="mail")
            assert (await ledger.get(effect_key("mail", OPERATION, RUN_ID, STEP))).state is State.UNCERTAIN  # type: ignore[union-attr]

        declared = [Target(TARGET, definite_errors=(CardDeclined,)), Target("mail")]
        run(self.with_ledger(self.db(tmp_path), body, targets=declared))

    def test_timeout_is_uncertain_with_unknown_outcome(self, tmp_path: Path) -> None:
        dest = Destination(delay=5.0)

        async def body(ledger: Ledger) -> None:
            started = time.monotonic()
            with pytest.raises(EffectUncertain) as ei:
                await self.execute(ledger, dest, timeout=0.2)
            assert time.monotonic() - started < 3.0
            assert ei.value.effect_id == KEY and ei.value.state == "UNCERTAIN"
            effect = await ledger.get(KEY)
            assert effect.state is State.UNCERTAIN  # type: ignore[union-attr]
            execs = [f for f in effect.facts if isinstance(f, Executed)]  # type: ignore[union-attr]
            assert [(x.outcome, x.error) for x in execs] == [(Outcome.UNKNOWN, "timed out")]
            assert effect_row(ledger.store.path, KEY)["claim_owner"] is None  # type: ignore[index]

        run(self.with_ledger(self.db(tmp_path), body))

    def test_transport_error_is_uncertain(self, tmp_path: Path) -> None:
        dest = Destination()
        dest.fail.append(ConnectionError("connection reset by peer"))

        async def body(ledger: Ledger) -> None:
            with pytest.raises(EffectUncertain) as ei:
                await self.execute(ledger, dest)
            assert isinstance(ei.value.__cause__, ConnectionError)
            effect = await ledger.get(KEY)
            assert effect.state is State.UNCERTAIN  # type: ignore[union-attr]
            execs = [f for f in effect.facts if isinstance(f, Executed)]  # type: ignore[union-attr]
            assert len(execs) == 1 and execs[0].outcome is Outcome.UNKNOWN
            assert "ConnectionError" in (execs[0].error or "")

        run(self.with_ledger(self.db(tmp_path), body))

    def test_cancelled_call_is_recorded_unknown_and_frees_the_key(self, tmp_path: Path) -> None:
        async def body(ledger: Ledger) -> None:
            entered = asyncio.Event()

            async def hangs(key: str) -> dict[str, Any]:
                entered.set()
                await asyncio.Event().wait()
                return {}

            task = asyncio.create_task(self.execute(ledger, hangs))
            await asyncio.wait_for(entered.wait(), 10)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            effect = await ledger.get(KEY)
            assert effect.state is State.UNCERTAIN  # type: ignore[union-attr]
            execs = [f for f in effect.facts if isinstance(f, Executed)]  # type: ignore[union-attr]
            assert [x.outcome for x in execs] == [Outcome.UNKNOWN] and "CancelledError" in (execs[0].error or "")
            # Not "another task of this worker is executing it": the ledger asks (and escalates).
            dest = Destination()
            with pytest.raises(EffectUncertain) as ei:
                await self.execute(ledger, dest)
            assert ei.value.state == "ESCALATED" and dest.calls == []

        run(self.with_ledger(self.db(tmp_path), body))

    def test_plain_function_call_and_non_dict_values(self, tmp_path: Path) -> None:
        async def body(ledger: Ledger) -> None:
            c = await self.execute(ledger, lambda key: {"id": 17, "key": key})
            assert c.receipt_id == "17" and c.value == {"id": 17, "key": KEY}
            c2 = await self.execute(ledger, lambda key: ["ok", key], step="list-value")
            assert c2.receipt_id.startswith("sha256:") and c2.value == ["ok", c2.effect_id]
            again = await self.execute(ledger, lambda key: ["other"], step="list-value")
            assert again.receipt_id == c2.receipt_id and again.value == c2.value and not again.called

        run(self.with_ledger(self.db(tmp_path), body))

    def test_target_receipt_id_function(self, tmp_path: Path) -> None:
        target = Target(TARGET, receipt_id=lambda v: v["refund"]["ref"])

        async def body(ledger: Ledger) -> None:
            c = await self.execute(ledger, lambda key: {"refund": {"ref": "R-1"}})
            assert c.receipt_id == "R-1"

        run(self.with_ledger(self.db(tmp_path), body, targets=[target]))

    # -- an earlier attempt whose worker died -----------------------------------------------------------

    def test_dead_owner_found_is_confirmed_without_calling(self, tmp_path: Path) -> None:
        dest = Destination()
        asked: list[EffectView] = []
        target = Target(TARGET, reconciler=reconciler_of(Found("re_77", {"id": "re_77"}), asked))

        async def body(ledger: Ledger) -> None:
            key = await write_pending(ledger, owner=dead_owner())
            c = await self.execute(ledger, dest)
            assert dest.calls == []
            assert (c.effect_id, c.receipt_id, c.value, c.called, c.source) == (
                key,
                "re_77",
                {"id": "re_77"},
                False,
                ReceiptSource.RECONCILER,
            )
            assert [(v.effect_id, v.request, v.attempt) for v in asked] == [(key, REQUEST, 1)]
            assert (await ledger.get(key)).state is State.CONFIRMED  # type: ignore[union-attr]

        run(self.with_ledger(self.db(tmp_path), body, targets=[target]))

    def test_dead_owner_absent_once_the_call_cannot_land_executes_attempt_2(self, tmp_path: Path) -> None:
        dest = Destination()
        clock = FakeClock()
        target = Target(TARGET, reconciler=reconciler_of(Absent("no refund with that key")))

        async def body(ledger: Ledger) -> None:
            key = await write_pending(ledger, owner=dead_owner(), timeout_s=10)
            clock.advance(10_000 + target.lands_within_ms)  # the old call can no longer land
            c = await self.execute(ledger, dest)
            assert dest.calls == [key]  # the same key, once
            assert c.called and c.attempt == 2
            effect = await ledger.get(key)
            verdicts = [r.verdict for r in effect.resolutions]  # type: ignore[union-attr]
            assert verdicts == [Verdict.ABSENT] and effect.state is State.CONFIRMED  # type: ignore[union-attr]
            row = effect_row(ledger.store.path, key)
            assert row["claim_owner"] is None and row["attempt"] == 2  # type: ignore[index]

        run(self.with_ledger(self.db(tmp_path), body, clock=clock, targets=[target]))

    def test_dead_owner_absent_before_deadline_is_in_progress(self, tmp_path: Path) -> None:
        dest = Destination()
        clock = FakeClock()
        target = Target(TARGET, reconciler=reconciler_of(Absent()))

        async def body(ledger: Ledger) -> None:
            await write_pending(ledger, owner=dead_owner(), timeout_s=10)
            clock.advance(4_000)
            with pytest.raises(EffectInProgress) as ei:
                await self.execute(ledger, dest)
            assert ei.value.retry_after_ms == 6_000 + target.lands_within_ms
            assert dest.calls == []
            assert (await ledger.get(KEY)).state is State.PENDING  # type: ignore[union-attr]
            # Past the deadline, the old call may still land for the target's lands_within.
            clock.advance(6_001)
            with pytest.raises(EffectInProgress) as ei:
                await self.execute(ledger, dest)
            assert ei.value.retry_after_ms == target.lands_within_ms - 1 and dest.calls == []
            # Once it can no longer land, the same answer makes a retry safe.
            clock.advance(target.lands_within_ms)
            c = await self.execute(ledger, dest)
            assert c.called and c.attempt == 2 and dest.calls == [KEY]

        run(self.with_ledger(self.db(tmp_path), body, clock=clock, targets=[target]))

    @pytest.mark.parametrize(
        "answer",
        [Unknown("lookup timed out"), RuntimeError("lookup crashed"), "not an answer"],
        ids=["unknown", "raises", "bad-answer"],
    )
    def test_dead_owner_unknown_is_uncertain_and_nothing_sent(self, tmp_path: Path, answer: Any) -> None:
        dest = Destination()
        clock = FakeClock()
        target = Target(TARGET, reconciler=reconciler_of(answer))

        async def body(ledger: Ledger) -> None:
            await write_pending(ledger, owner=dead_owner(), timeout_s=10)
            clock.advance(10_001)
            with pytest.raises(EffectUncertain) as ei:
                await self.execute(ledger, dest)
            assert ei.value.effect_id == KEY
            assert ei.value.state == "UNCERTAIN"  # the due timeout is recorded before asking
            assert dest.calls == []
            effect = await ledger.get(KEY)
            assert effect.state is State.UNCERTAIN  # type: ignore[union-attr]
            assert [r.verdict for r in effect.resolutions] == [Verdict.UNKNOWN]  # type: ignore[union-attr]
            assert event_kinds(ledger.store.path, KEY) == ["Intent", "Timeout", "Resolution"]

        run(self.with_ledger(self.db(tmp_path), body, clock=clock, targets=[target]))

    def test_dead_owner_honours_keys_replays_the_same_key(self, tmp_path: Path) -> None:
        dest = Destination()
        target = Target(TARGET, honours_keys=True)

        async def body(ledger: Ledger) -> None:
            key = await write_pending(ledger, owner=dead_owner())
            c = await self.execute(ledger, dest)
            assert dest.calls == [key]  # one replay, with the recorded key
            assert c.receipt_id == "re_0001" and c.called is False and c.source is ReceiptSource.RECONCILER
            assert c.attempt == 1
            effect = await ledger.get(key)
            assert effect.state is State.CONFIRMED  # type: ignore[union-attr]
            assert [(r.verdict, r.reconciler) for r in effect.resolutions] == [(Verdict.FOUND, "replay")]  # type: ignore[union-attr]

        run(self.with_ledger(self.db(tmp_path), body, targets=[target]))

    def test_honours_keys_past_retention_escalates_without_replaying(self, tmp_path: Path) -> None:
        dest = Destination()
        clock = FakeClock()
        target = Target(TARGET, honours_keys=True, retention_s=60)

        async def body(ledger: Ledger) -> None:
            await write_pending(ledger, owner=dead_owner(), timeout_s=10)
            clock.advance(60_001)
            with pytest.raises(EffectUncertain) as ei:
                await self.execute(ledger, dest)
            assert ei.value.state == "ESCALATED" and dest.calls == []

        run(self.with_ledger(self.db(tmp_path), body, clock=clock, targets=[target]))

    @pytest.mark.parametrize("found", [True, False], ids=["found", "no-way-to-ask"])
    def test_executed_without_receipt(self, tmp_path: Path, found: bool) -> None:
        """The call returned ok and that was recorded, then the worker died before the receipt."""
        dest = Destination()
        targets = [Target(TARGET, reconciler=reconciler_of(Found("re_3", {"id": "re_3"})) if found else None)]

        async def body(ledger: Ledger) -> None:
            key = await write_pending(ledger, owner=dead_owner())
            before = await ledger.get(key)
            now = ledger.now_ms()
            ok = Executed(uuid.uuid4().hex, key, now, 1, Outcome.OK, None, now, now, None, dead_owner())
            await ledger.store.append(before, [ok], now_ms=now, claim_op=ClaimOp.RELEASE)
            assert (await ledger.get(key)).state is State.EXECUTED  # type: ignore[union-attr]
            if found:
                c = await self.execute(ledger, dest)
                assert (c.receipt_id, c.called) == ("re_3", False)
            else:
                with pytest.raises(EffectUncertain) as ei:
                    await self.execute(ledger, dest)
                assert ei.value.state == "ESCALATED"
            assert dest.calls == []

        run(self.with_ledger(self.db(tmp_path), body, targets=targets))

    def test_no_way_to_ask_escalates(self, tmp_path: Path) -> None:
        dest = Destination()

        async def body(ledger: Ledger) -> None:
            await write_pending(ledger, owner=dead_owner())
            with pytest.raises(EffectUncertain) as ei:
                await self.execute(ledger, dest)
            assert ei.value.state == "ESCALATED" and dest.calls == []
            with pytest.raises(EffectUncertain, match="ESCALATED"):
                await self.execute(ledger, dest)
            assert dest.calls == []

        run(self.with_ledger(self.db(tmp_path), body))

    def test_owner_on_another_host_holds_until_its_lease_ends(self, tmp_path: Path) -> None:
        dest = Destination()
        clock = FakeClock()
        target = Target(TARGET, reconciler=reconciler_of(Found("re_9")))

        async def body(ledger: Ledger) -> None:
            await write_pending(ledger, owner="elsewhere.example:4242:99:cafe0001", timeout_s=10)
            with pytest.raises(EffectInProgress) as ei:
                await self.execute(ledger, dest)
            assert ei.value.retry_after_ms == 10_000
            clock.advance(10_000)
            c = await self.execute(ledger, dest)
            assert c.receipt_id == "re_9" and not c.called and dest.calls == []

        run(self.with_ledger(self.db(tmp_path), body, clock=clock, targets=[target]))

    # -- a live owner --------------------------------------------------------------------------------

    def test_live_owner_in_another_ledger_is_in_progress(self, tmp_path: Path) -> None:
        path = self.db(tmp_path)
        clock = FakeClock()

        async def body() -> None:
            entered, release = asyncio.Event(), asyncio.Event()
            calls: list[str] = []

            async def slow(key: str) -> dict[str, Any]:
                calls.append(key)
                entered.set()
                await release.wait()
                return {"id": "re_a"}

            a = await self.open_ledger(path, clock=clock)
            b = await self.open_ledger(path, clock=clock)
            try:
                assert a.worker != b.worker
                task = asyncio.create_task(self.execute(a, slow, timeout=20))
                await asyncio.wait_for(entered.wait(), 10)
                clock.advance(5_000)
                with pytest.raises(EffectInProgress) as ei:
                    await self.execute(b, slow, timeout=20)
                assert ei.value.retry_after_ms == 15_000 + self.deadline_extra_ms
                assert calls == [KEY]
                release.set()
                first = await task
                assert first.called and first.receipt_id == "re_a"
                again = await self.execute(b, slow, timeout=20)
                assert again.receipt_id == "re_a" and not again.called and calls == [KEY]
            finally:
                await a.close()
                await b.close()

        run(body())

    def test_same_ledger_two_tasks_same_key_is_in_progress(self, tmp_path: Path) -> None:
        async def body(ledger: Ledger) -> None:
            entered, release = asyncio.Event(), asyncio.Event()
            calls: list[str] = []

            async def slow(key: str) -> dict[str, Any]:
                calls.append(key)
                entered.set()
                await release.wait()
                return {"id": "re_a"}

            task = asyncio.create_task(self.execute(ledger, slow))
            await asyncio.wait_for(entered.wait(), 10)
            with pytest.raises(EffectInProgress):
                await self.execute(ledger, slow)
            release.set()
            assert (await task).called
            assert calls == [KEY]

        run(self.with_ledger(self.db(tmp_path), body))

    def test_a_found_answer_is_not_lost_to_a_concurrent_unknown_one(self, tmp_path: Path) -> None:
        """Two workers reconcile the same uncertain effect at once. The lookup answers the first one
        late with Found, the second one early with Unknown (a 503). The Unknown is recorded first;
        the Found must still land (CONFIRMED) and the first worker must get the receipt."""
        path = self.db(tmp_path)
        clock = FakeClock()

        async def body() -> None:
            first_asked, answer_first = asyncio.Event(), asyncio.Event()
            asks: list[str] = []

            async def lookup(effect: EffectView) -> Any:
                asks.append(effect.effect_id)
                if len(asks) == 1:
                    first_asked.set()
                    await answer_first.wait()
                    return Found("re_1", {"id": "re_1"})
                return Unknown("gateway 503")

            target = Target(TARGET, reconciler=CallableReconciler(lookup, name="lookup"))
            a = await self.open_ledger(path, clock=clock, targets=[target])
            b = await self.open_ledger(path, clock=clock, targets=[target])
            try:
                dest = Destination()
                dest.fail.append(ConnectionError("reset"))
                with pytest.raises(EffectUncertain):
                    await self.execute(a, dest, timeout=10)
                clock.advance(10_001 + self.deadline_extra_ms)
                task = asyncio.create_task(self.execute(a, dest, timeout=10))
                await asyncio.wait_for(first_asked.wait(), 10)
                with pytest.raises(EffectUncertain):
                    await self.execute(b, dest, timeout=10)
                answer_first.set()
                c = await task
                assert (c.receipt_id, c.called) == ("re_1", False)
                effect = await b.get(KEY)
                assert effect.state is State.CONFIRMED  # type: ignore[union-attr]
                assert dest.calls == [KEY]
            finally:
                await a.close()
                await b.close()

        run(body())

    # -- conflicts ------------------------------------------------------------------------------------

    def test_same_key_different_request_is_a_conflict_and_writes_nothing(self, tmp_path: Path) -> None:
        dest = Destination()

        async def body(ledger: Ledger) -> None:
            await self.execute(ledger, dest)
            counts = db_counts(ledger.store.path)
            with pytest.raises(EffectConflict) as ei:
                await self.execute(ledger, dest, request={**REQUEST, "amount": 4801})
            assert ei.value.effect_id == KEY
            assert ei.value.recorded_digest == digest(canonical_json(REQUEST))
            assert ei.value.given_digest == digest(canonical_json({**REQUEST, "amount": 4801}))
            with pytest.raises(EffectConflict):
                await self.execute(ledger, dest, key=KEY, operation="refund.cancel")
            assert db_counts(ledger.store.path) == counts
            assert dest.calls == [KEY]
            # Key order in the request does not matter: it is canonical JSON.
            c = await self.execute(ledger, dest, request=dict(reversed(list(REQUEST.items()))))
            assert not c.called

        run(self.with_ledger(self.db(tmp_path), body))

    def test_conflict_with_an_open_attempt_writes_nothing(self, tmp_path: Path) -> None:
        dest = Destination()

        async def body(ledger: Ledger) -> None:
            await write_pending(ledger, owner=dead_owner())
            counts = db_counts(ledger.store.path)
            with pytest.raises(EffectConflict):
                await self.execute(ledger, dest, request={"order": "999"})
            assert db_counts(ledger.store.path) == counts and dest.calls == []

        run(self.with_ledger(self.db(tmp_path), body))

    # -- escalation and decisions -----------------------------------------------------------------------

    async def _escalated(self, ledger: Ledger, dest: Destination) -> None:
        """An attempt whose outcome is unknown, then a target nobody can ask: ESCALATED."""
        dest.fail.append(ConnectionError("reset"))
        with pytest.raises(EffectUncertain):
            await self.execute(ledger, dest)
        with pytest.raises(EffectUncertain) as ei:
            await self.execute(ledger, dest)
        assert ei.value.state == "ESCALATED"
        assert (await ledger.get(KEY)).state is State.ESCALATED  # type: ignore[union-attr]
        assert dest.calls == [KEY]

    def test_escalated_is_uncertain_then_decide_absent_runs_again(self, tmp_path: Path) -> None:
        dest = Destination()
        clock = FakeClock()

        async def body(ledger: Ledger) -> None:
            await self._escalated(ledger, dest)
            with pytest.raises(EffectUncertain) as ei:
                await self.execute(ledger, dest)
            assert ei.value.state == "ESCALATED" and dest.calls == [KEY]
            # The cut-off call may still land until its deadline: "absent" is refused until then.
            with pytest.raises(DecisionRefused) as refused:
                await ledger.decide(KEY, DecisionKind.ABSENT, by="oncall", reason="checked the gateway")
            assert refused.value.retry_after_ms is not None and refused.value.retry_after_ms > 0
            clock.advance(refused.value.retry_after_ms)
            effect = await ledger.decide(KEY, DecisionKind.ABSENT, by="oncall", reason="checked the gateway")
            assert effect.state is State.ABSENT
            c = await self.execute(ledger, dest)
            assert c.called and c.attempt == 2 and dest.calls == [KEY, KEY]

        run(self.with_ledger(self.db(tmp_path), body, clock=clock))

    def test_decide_absent_while_a_dead_owners_lease_runs_is_refused(self, tmp_path: Path) -> None:
        """A worker died mid-call; the target cannot be asked, so the effect is escalated at once; a
        person checks and wants to decide ABSENT. A request sent just before the death may still land
        until the attempt's deadline, so ABSENT is refused until then (a second execution could
        follow it); after the deadline it is accepted and the next execute runs attempt 2."""
        dest = Destination()
        clock = FakeClock()

        async def body(ledger: Ledger) -> None:
            await write_pending(ledger, owner=dead_owner(), timeout_s=600)
            with pytest.raises(EffectUncertain):
                await self.execute(ledger, dest)
            with pytest.raises(DecisionRefused):
                await ledger.decide(KEY, "ABSENT", by="oncall", reason="not in the gateway's books")
            clock.advance(600_000 + DECISION_GRACE_MS)
            await ledger.decide(KEY, "ABSENT", by="oncall", reason="not in the gateway's books")
            c = await self.execute(ledger, dest)
            assert c.called and c.attempt == 2 and dest.calls == [KEY]

        run(self.with_ledger(self.db(tmp_path), body, clock=clock))

    @pytest.mark.parametrize("decision", [DecisionKind.ABANDONED, DecisionKind.COMPENSATED])
    def test_decide_abandoned_closes_the_effect(self, tmp_path: Path, decision: DecisionKind) -> None:
        dest = Destination()

        async def body(ledger: Ledger) -> None:
            await self._escalated(ledger, dest)
            effect = await ledger.decide(KEY, decision, by="oncall", reason="customer cancelled")
            assert effect.state.value == decision.value
            with pytest.raises(EffectClosed) as ei:
                await self.execute(ledger, dest)
            assert ei.value.state == decision.value and dest.calls == [KEY]
            assert "customer cancelled" in str(ei.value)

        run(self.with_ledger(self.db(tmp_path), body))

    def test_decide_confirmed_returns_that_receipt_without_calling(self, tmp_path: Path) -> None:
        dest = Destination()

        async def body(ledger: Ledger) -> None:
            await self._escalated(ledger, dest)
            await ledger.decide(KEY, DecisionKind.CONFIRMED, by="oncall", reason="in the books", receipt_id="re_x")
            c = await self.execute(ledger, dest)
            assert (c.receipt_id, c.called, c.source) == ("re_x", False, ReceiptSource.PERSON)
            assert dest.calls == [KEY]

        run(self.with_ledger(self.db(tmp_path), body))

    def test_decide_needs_who_why_and_an_existing_effect(self, tmp_path: Path) -> None:
        async def body(ledger: Ledger) -> None:
            with pytest.raises(InvalidEffect):
                await ledger.decide(KEY, "ABSENT", by="", reason="x")
            with pytest.raises(InvalidEffect):
                await ledger.decide(KEY, "ABSENT", by="me", reason="")
            with pytest.raises(InvalidEffect):
                await ledger.decide(KEY, "ABSENT", by="me", reason="no such effect")
            assert db_counts(ledger.store.path) == (0, 0)

        run(self.with_ledger(self.db(tmp_path), body))

    # -- receipts recorded later ------------------------------------------------------------------------

    def test_receipt_before_any_intent_then_execute_returns_it(self, tmp_path: Path) -> None:
        dest = Destination()

        async def body(ledger: Ledger) -> None:
            # A receipt that may come first is said so; without it an unknown key is refused.
            with pytest.raises(UnknownEffect):
                await ledger.record_receipt(KEY, "re_hook", {"id": "re_hook", "status": "succeeded"})
            assert db_counts(ledger.store.path) == (0, 0)
            effect = await ledger.record_receipt(
                KEY, "re_hook", {"id": "re_hook", "status": "succeeded"}, allow_unknown=True
            )
            assert effect.state is State.CONFIRMED and Flag.NO_INTENT in effect.flags
            c = await self.execute(ledger, dest)
            assert dest.calls == []
            assert (c.receipt_id, c.called, c.source) == ("re_hook", False, ReceiptSource.WEBHOOK)
            assert c.value == {"id": "re_hook", "status": "succeeded"}

        run(self.with_ledger(self.db(tmp_path), body))

    def test_webhook_receipt_confirms_an_executed_effect(self, tmp_path: Path) -> None:
        dest = Destination()
        clock = FakeClock()

        async def body(ledger: Ledger) -> None:
            key = await write_pending(ledger, owner=dead_owner())
            effect = await ledger.record_receipt(key, "re_hook", {"id": "re_hook"}, attempt=1)
            assert effect.state is State.CONFIRMED and Flag.NO_INTENT not in effect.flags
            c = await self.execute(ledger, dest)
            assert c.receipt_id == "re_hook" and dest.calls == []
            with pytest.raises(InvalidEffect):
                await ledger.record_receipt(key, "")
            # A second, different receipt id is kept and flagged, not overwritten.
            effect = await ledger.record_receipt(key, "re_other")
            assert effect.receipt.receipt_id == "re_hook"  # type: ignore[union-attr]
            assert Flag.DUPLICATE_RECEIPT in effect.flags

        run(self.with_ledger(self.db(tmp_path), body, clock=clock))

    # -- bad input: a typed error, nothing half-written --------------------------------------------------

    def _refused(self, tmp_path: Path, error: type[Exception], **kw: Any) -> None:
        dest = Destination()

        async def body(ledger: Ledger) -> None:
            await self.execute(ledger, dest, step="a-good-one")
            counts = db_counts(ledger.store.path)
            with pytest.raises(error):
                await self.execute(ledger, kw.pop("call", dest), **kw)
            assert db_counts(ledger.store.path) == counts
            assert len(dest.calls) == 1

        run(self.with_ledger(self.db(tmp_path), body))

    @pytest.mark.parametrize("target", ["bad target", "", "a/b", "x" * 65, "-lead", None, 7])
    def test_invalid_target(self, tmp_path: Path, target: Any) -> None:
        self._refused(tmp_path, InvalidEffect, target=target)

    @pytest.mark.parametrize("operation", ["refund create", "", "refund/create", "o" * 65, None])
    def test_invalid_operation(self, tmp_path: Path, operation: Any) -> None:
        self._refused(tmp_path, InvalidEffect, operation=operation)

    @pytest.mark.parametrize(
        "request_",
        [{"tags": {"a"}}, {"who": object()}, {"amount": float("nan")}, math.inf, {1: "a", "b": 2}],
        ids=["set", "object", "nan", "inf", "mixed-keys"],
    )
    def test_request_not_json(self, tmp_path: Path, request_: Any) -> None:
        self._refused(tmp_path, InvalidEffect, request=request_)

    @pytest.mark.parametrize("key", ["k" * 256, "has space", "tab\there", "", "nön-ascii", 12, "k\n"])
    def test_invalid_key(self, tmp_path: Path, key: Any) -> None:
        self._refused(tmp_path, InvalidEffect, key=key)

    def test_key_of_255_characters_is_fine(self, tmp_path: Path) -> None:
        dest = Destination()
        key = "k" * 255

        async def body(ledger: Ledger) -> None:
            assert (await self.execute(ledger, dest, key=key)).effect_id == key

        run(self.with_ledger(self.db(tmp_path), body))

    @pytest.mark.parametrize("missing", [{"run_id": None}, {"step": None}, {"run_id": None, "step": None}])
    def test_missing_run_id_or_step_and_no_key(self, tmp_path: Path, missing: dict[str, Any]) -> None:
        self._refused(tmp_path, InvalidEffect, **missing)

    @pytest.mark.parametrize("run_id", ["", 5])
    def test_invalid_run_id(self, tmp_path: Path, run_id: Any) -> None:
        self._refused(tmp_path, InvalidEffect, run_id=run_id)

    @pytest.mark.parametrize(
        "given", [{"run_id": 5}, {"step": ["x"]}, {"namespace": 5}], ids=["run_id", "step", "namespace"]
    )
    def test_non_string_ids_with_an_explicit_key(self, tmp_path: Path, given: dict[str, Any]) -> None:
        """With ``key=`` the ids are not needed for the key, but they are still recorded in the intent:
        a wrong type must be refused as InvalidEffect, like every other bad input."""
        self._refused(tmp_path, InvalidEffect, key="my-key", **given)

    @pytest.mark.parametrize("timeout", [0, -1, 0.0, float("nan"), float("inf"), "10", 8 * 24 * 3600])
    def test_invalid_timeout(self, tmp_path: Path, timeout: Any) -> None:
        self._refused(tmp_path, InvalidEffect, timeout=timeout)

    @pytest.mark.parametrize("call", [None, "gateway.refund", 42])
    def test_call_not_callable(self, tmp_path: Path, call: Any) -> None:
        self._refused(tmp_path, InvalidEffect, call=call)

    def test_closed_ledger_refuses_everything(self, tmp_path: Path) -> None:
        dest = Destination()
        path = self.db(tmp_path)

        async def body() -> None:
            ledger = await self.open_ledger(path, clock=FakeClock())
            await self.execute(ledger, dest)
            await ledger.close()
            counts = db_counts(path)
            with pytest.raises(LedgerClosed):
                await self.execute(ledger, dest, step="another")
            with pytest.raises(LedgerClosed):
                await self.execute(ledger, dest)
            with pytest.raises(LedgerClosed):
                await ledger.record_receipt(KEY, "re_x")
            with pytest.raises(LedgerClosed):
                await ledger.decide(KEY, "ABANDONED", by="me", reason="x")
            with pytest.raises(LedgerClosed):
                await ledger.get(KEY)
            await ledger.close()  # closing twice is harmless
            assert db_counts(path) == counts and dest.calls == [KEY]

        run(body())

    # -- the decorator ---------------------------------------------------------------------------------

    def test_decorator_returns_the_value_and_executes_once(self, tmp_path: Path) -> None:
        async def body(ledger: Ledger) -> None:
            calls: list[tuple[str, int, str]] = []

            @ledger.effect(target="payments")
            async def refund(order: str, amount: int, *, idempotency_key: str) -> dict[str, Any]:
                calls.append((order, amount, idempotency_key))
                return {"id": f"re_{len(calls)}", "order": order, "amount": amount}

            assert refund.__name__ == "refund"
            v1 = await refund("123", 4800, run_id="run-1", step="refund-123")
            key = effect_key("payments", "refund", "run-1", "refund-123")
            assert v1 == {"id": "re_1", "order": "123", "amount": 4800}
            assert calls == [("123", 4800, key)]
            v2 = await refund("123", 4800, run_id="run-1", step="refund-123")
            assert v2 == v1 and len(calls) == 1
            effect = await ledger.get(key)
            assert json.loads(effect.intent.request) == {"order": "123", "amount": 4800}  # type: ignore[union-attr]
            with pytest.raises(EffectConflict):
                await refund("123", 1, run_id="run-1", step="refund-123")
            v3 = await refund(order="124", amount=10, key="my-key")
            assert v3["id"] == "re_2" and calls[-1] == ("124", 10, "my-key")

        run(self.with_ledger(self.db(tmp_path), body))

    def test_decorator_operation_and_key_arg_options(self, tmp_path: Path) -> None:
        async def body(ledger: Ledger) -> None:
            @ledger.effect(target="mail", operation="send.receipt", key_arg="dedupe")
            async def send_mail(to: str, *, dedupe: str) -> str:
                return f"msg-{dedupe[-4:]}"

            v = await send_mail("a@example.com", run_id="r", step="s")
            key = effect_key("mail", "send.receipt", "r", "s")
            assert v == f"msg-{key[-4:]}"

        run(self.with_ledger(self.db(tmp_path), body))

    def test_decorator_without_the_key_parameter_is_refused(self, tmp_path: Path) -> None:
        async def body(ledger: Ledger) -> None:
            async def refund(order: str, amount: int) -> None:
                return None

            with pytest.raises(InvalidEffect, match="idempotency_key"):
                ledger.effect(target="payments")(refund)
            with pytest.raises(InvalidEffect):
                ledger.effect(target="payments", operation="bad op")(refund)

        run(self.with_ledger(self.db(tmp_path), body))

    # -- durability ------------------------------------------------------------------------------------

    @pytest.mark.parametrize("durability,level", [("FULL", 2), ("NORMAL", 1), (None, 1)])
    def test_durability_sets_sqlite_synchronous(self, tmp_path: Path, durability: str | None, level: int) -> None:
        dest = Destination()

        async def body(ledger: Ledger) -> None:
            rows = await ledger.store.query("PRAGMA synchronous")
            assert list(rows[0].values()) == [level]
            assert (await self.execute(ledger, dest)).called

        kw = {} if durability is None else {"durability": durability}
        run(self.with_ledger(self.db(tmp_path), body, **kw))

    # -- concurrency -----------------------------------------------------------------------------------

    def test_64_concurrent_distinct_keys_each_called_once(self, tmp_path: Path) -> None:
        dest = Destination(delay=0.01)

        async def body(ledger: Ledger) -> None:
            results = await asyncio.gather(
                *(self.execute(ledger, dest, step=f"step-{i}", request={"i": i}) for i in range(64))
            )
            assert all(c.called for c in results)
            keys = [effect_key(TARGET, OPERATION, RUN_ID, f"step-{i}") for i in range(64)]
            assert [c.effect_id for c in results] == keys
            assert sorted(dest.calls) == sorted(keys)
            rows = await ledger.store.query("SELECT state, COUNT(*) AS n FROM effects GROUP BY state")
            assert rows == [{"state": "CONFIRMED", "n": 64}]

        run(self.with_ledger(self.db(tmp_path), body))

    def race_command(self, db: str, me: str, workdir: Path) -> list[str]:
        """The command of one racing process (a backend may pass its own options)."""
        script = workdir / "race.py"
        if not script.exists():
            script.write_text(_RACE_SCRIPT)
        return [sys.executable, str(script), db, me, str(workdir)]

    def test_two_processes_race_on_the_same_key(self, tmp_path: Path) -> None:
        path = self.db(tmp_path)

        async def prepare(ledger: Ledger) -> None:
            pass  # create the file (and schema) once, before the race

        run(self.with_ledger(path, prepare))
        env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        env.pop("EFFECT_LEDGER_CRASH", None)
        procs = [
            subprocess.Popen(
                self.race_command(path, me, tmp_path),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=env,
                cwd=ROOT,
                text=True,
            )
            for me in ("a", "b")
        ]
        outs = []
        for p in procs:
            out, err = p.communicate(timeout=45)
            assert p.returncode == 0, err
            outs.append(json.loads(out.strip().splitlines()[-1]))
        lines = (tmp_path / "destination.log").read_text().splitlines()
        assert len(lines) == 1, lines  # exactly one process called the destination
        winner = lines[0].split()[0]
        key = effect_key("payments", "refund.create", "race", "refund")
        assert lines[0].split()[1] == key
        by_me = dict(zip(("a", "b"), outs, strict=True))
        assert by_me[winner] == {"result": "confirmed", "called": True, "receipt_id": f"re_{winner}"}
        loser = by_me["b" if winner == "a" else "a"]
        assert loser == {"result": "confirmed", "called": False, "receipt_id": f"re_{winner}"} or (
            loser["result"] == "in_progress"
        ), loser
        row = effect_row(path, key)
        assert row["state"] == "CONFIRMED" and row["executions"] == 1 and row["attempt"] == 1  # type: ignore[index]

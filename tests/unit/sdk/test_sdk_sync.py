"""``SyncLedger``, the SDK for synchronous callers.

First the whole SDK contract (``tests/sdk_contract.py``) through the sync door: ``ThroughSync``
shows the contract the async ``Ledger`` interface, but every decision goes through ``SyncLedger``'s
public sync methods, called from a worker thread (``asyncio.to_thread``), as a LangGraph node or a
Celery task would call them. The contract's destinations are coroutines of the test's event loop;
the adapter turns each into a plain blocking function that runs the coroutine on that loop and waits
for it, so the ledger sees a sync ``call`` and runs it in its own call thread.

Then what only the sync form has: a blocking call cut off at its deadline while it still blocks,
the caller's context variables inside the call, threads, ``with``, closing with calls in flight, a
caller interrupted with Ctrl-C, and refusing async functions.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import functools
import inspect
import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Coroutine
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest

from effect_ledger import SyncLedger
from effect_ledger.core.keys import effect_key
from effect_ledger.core.model import DecisionKind, Executed, Outcome, ReceiptSource, State
from effect_ledger.core.reconcile import Absent, Answer, EffectView, Reconciler, Target
from effect_ledger.errors import (
    EffectConflict,
    EffectInProgress,
    EffectUncertain,
    InvalidEffect,
    LedgerClosed,
    UnknownTarget,
)
from effect_ledger.sdk.ledger import Confirmation
from effect_ledger.sdk.store.sqlite import Store
from tests.sdk_contract import (
    DECLARED,
    KEY,
    OPERATION,
    REQUEST,
    ROOT,
    RUN_ID,
    STEP,
    TARGET,
    Destination,
    LedgerContract,
    db_counts,
    effect_row,
    event_kinds,
    run,
    wait_until,
)

# --- the adapter: the async Ledger interface, through the sync door ----------------------------------


async def _awaited(value: Any) -> Any:
    return await value


class _OnLoop:
    """A target's reconciler whose ``check`` runs on the test's loop: the contract's reconcilers
    wait on asyncio events of that loop, which must not be touched from the ledger's own loop."""

    def __init__(self, inner: Reconciler, loop: asyncio.AbstractEventLoop) -> None:
        self.inner = inner
        self.loop = loop
        self.name = inner.name

    async def check(self, effect: EffectView) -> Answer:
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(self.inner.check(effect), self.loop))


class _StoreOnItsLoop:
    """The ledger's store for the contract's test set-up (``write_pending`` appends an earlier
    attempt's raw events, some tests read rows with SQL). The store belongs to the SyncLedger's
    loop, so its coroutines are run there; no decision of the SDK goes this way."""

    def __init__(self, sync: SyncLedger) -> None:
        self._store: Store = sync.store
        self._loop: asyncio.AbstractEventLoop = sync._loop

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._store, name)
        if not inspect.iscoroutinefunction(attr):
            return attr

        async def on_its_loop(*args: Any, **kwargs: Any) -> Any:
            return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(attr(*args, **kwargs), self._loop))

        return on_its_loop


class ThroughSync:
    """What the contract calls a ledger: awaits on it become ``SyncLedger`` calls in a worker thread."""

    def __init__(self, sync: SyncLedger, loop: asyncio.AbstractEventLoop) -> None:
        self.sync = sync
        self.loop = loop  # the test's loop, where the contract's destinations and reconcilers live
        self.worker = sync.worker
        self.store = _StoreOnItsLoop(sync)

    def now_ms(self) -> int:
        return self.sync.now_ms()

    def blocking(self, call: Any) -> Any:
        """The contract's destination as a sync function. Anything not callable is passed as is, for
        the contract's bad-input tests."""
        if not callable(call):
            return call

        def sync_call(key: str) -> Any:
            value = call(key)
            if inspect.isawaitable(value):
                return asyncio.run_coroutine_threadsafe(_awaited(value), self.loop).result()
            return value

        return sync_call

    async def execute(self, *, call: Any, **kwargs: Any) -> Confirmation:
        return await asyncio.to_thread(self.sync.execute, call=self.blocking(call), **kwargs)

    async def get(self, key: str) -> Any:
        return await asyncio.to_thread(self.sync.get, key)

    async def expire(self, key: str) -> Any:
        return await asyncio.to_thread(self.sync.expire, key)

    async def record_receipt(self, *args: Any, **kwargs: Any) -> Any:
        return await asyncio.to_thread(self.sync.record_receipt, *args, **kwargs)

    async def decide(self, *args: Any, **kwargs: Any) -> Any:
        return await asyncio.to_thread(self.sync.decide, *args, **kwargs)

    async def close(self, relay_timeout: float = 10.0) -> None:
        await asyncio.to_thread(self.sync.close, relay_timeout)

    def effect(self, **options: Any) -> Callable[[Any], Any]:
        """The sync decorator over a plain function that runs the contract's coroutine function on
        the test's loop; the contract awaits the result."""

        def wrap(fn: Callable[..., Coroutine[Any, Any, Any]]) -> Callable[..., Any]:
            @functools.wraps(fn)  # keeps the signature: the request and the key argument come from it
            def plain(*args: Any, **kwargs: Any) -> Any:
                return asyncio.run_coroutine_threadsafe(fn(*args, **kwargs), self.loop).result()

            wrapped = self.sync.effect(**options)(plain)

            @functools.wraps(fn)
            async def awaitable(*args: Any, **kwargs: Any) -> Any:
                return await asyncio.to_thread(wrapped, *args, **kwargs)

            return awaitable

        return wrap


class TestSyncLedger(LedgerContract):
    async def open_ledger(self, path: str, **kwargs: Any) -> ThroughSync:  # type: ignore[override]
        loop = asyncio.get_running_loop()
        targets = [
            dataclasses.replace(t, reconciler=_OnLoop(t.reconciler, loop)) if t.reconciler is not None else t
            for t in kwargs.pop("targets", DECLARED)
        ]
        sync = await asyncio.to_thread(SyncLedger.open, path, targets=targets, **kwargs)
        return ThroughSync(sync, loop)

    @pytest.mark.skip(
        reason="a synchronous caller cannot be cancelled from outside (there is no task to cancel); its "
        "interruption is Ctrl-C in the calling thread: test_interrupted_caller_records_the_call_unknown"
    )
    def test_cancelled_call_is_recorded_unknown_and_frees_the_key(self, tmp_path: Path) -> None:
        pass

    def race_command(self, db: str, me: str, workdir: Path) -> list[str]:
        """The racing processes are sync programs."""
        script = workdir / "race_sync.py"
        if not script.exists():
            script.write_text(_SYNC_RACE_SCRIPT)
        return [sys.executable, str(script), db, me, str(workdir)]


# The contract's two-process race, written as a sync program (same output).
_SYNC_RACE_SCRIPT = textwrap.dedent(
    """
    import json, os, sys, time
    from pathlib import Path
    from effect_ledger import EffectInProgress, SyncLedger, Target

    db, me, workdir = sys.argv[1], sys.argv[2], Path(sys.argv[3])

    with SyncLedger.open(db, targets=[Target("payments")]) as ledger:
        (workdir / f"ready-{me}").touch()
        end = time.monotonic() + 30
        while len(list(workdir.glob("ready-*"))) < 2:  # start together
            if time.monotonic() > end:
                sys.exit(9)
            time.sleep(0.002)

        def call(key):
            fd = os.open(workdir / "destination.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT)
            os.write(fd, f"{me} {key}\\n".encode())
            os.close(fd)
            time.sleep(1.0)  # the destination is slow: the other process arrives meanwhile
            return {"id": f"re_{me}"}

        try:
            c = ledger.execute(
                target="payments", operation="refund.create", run_id="race", step="refund",
                request={"order": "9", "amount": 1}, call=call, timeout=20,
            )
            out = {"result": "confirmed", "called": c.called, "receipt_id": c.receipt_id}
        except EffectInProgress as e:
            out = {"result": "in_progress", "retry_after_ms": e.retry_after_ms}
    print(json.dumps(out))
    """
)


# --- what only the sync form has ----------------------------------------------------------------------


def db(tmp_path: Path) -> str:
    return str(tmp_path / "effects.db")


def execute(ledger: SyncLedger, call: Any, **kw: Any) -> Confirmation:
    args: dict[str, Any] = dict(
        target=TARGET, operation=OPERATION, run_id=RUN_ID, step=STEP, request=REQUEST, timeout=30.0
    )
    args.update(kw)
    return ledger.execute(call=call, **args)


def call_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("effect-ledger call")]


def executions(ledger: SyncLedger, key: str) -> list[tuple[Outcome, str | None]]:
    effect = ledger.get(key)
    assert effect is not None
    return [(f.outcome, f.error) for f in effect.facts if isinstance(f, Executed)]


def test_a_call_that_outlives_its_timeout_is_cut_off_while_it_still_blocks(tmp_path: Path) -> None:
    entered, release, returned = threading.Event(), threading.Event(), threading.Event()

    def hangs(key: str) -> dict[str, Any]:
        entered.set()
        release.wait(60)
        returned.set()
        return {"id": "re_late"}  # the destination answered, too late

    with SyncLedger.open(db(tmp_path), targets=DECLARED) as ledger:
        with pytest.raises(EffectUncertain) as ei:
            execute(ledger, hangs, timeout=0.3)
        # The caller has its answer while the call is still blocked in its thread.
        assert entered.is_set() and not returned.is_set()
        assert [t for t in call_threads() if t.is_alive()], "the call's thread should still be blocked"
        assert ei.value.effect_id == KEY and ei.value.state == "UNCERTAIN"
        assert executions(ledger, KEY) == [(Outcome.UNKNOWN, "timed out")]
        assert ledger.get(KEY).state is State.UNCERTAIN  # type: ignore[union-attr]
        counts = db_counts(ledger.store.path)

        release.set()
        wait_until(lambda: returned.is_set() and not any(t.is_alive() for t in call_threads()), what="the late return")
        # The late result reached the ledger's loop before this read (both go through its queue, in
        # order): it was dropped, not recorded.
        effect = ledger.get(KEY)
        assert effect is not None and effect.state is State.UNCERTAIN and effect.receipt is None
        assert db_counts(ledger.store.path) == counts
        assert event_kinds(ledger.store.path, KEY) == ["Intent", "Executed"]


def test_a_late_exception_of_a_cut_off_call_is_not_recorded_either(tmp_path: Path) -> None:
    release = threading.Event()

    def hangs_then_fails(key: str) -> None:
        release.wait(60)
        raise ConnectionError("reset, long after the deadline")

    with SyncLedger.open(db(tmp_path), targets=DECLARED) as ledger:
        with pytest.raises(EffectUncertain):
            execute(ledger, hangs_then_fails, timeout=0.2)
        counts = db_counts(ledger.store.path)
        release.set()
        wait_until(lambda: not any(t.is_alive() for t in call_threads()), what="the call thread to end")
        assert executions(ledger, KEY) == [(Outcome.UNKNOWN, "timed out")]
        assert db_counts(ledger.store.path) == counts


def test_the_call_sees_the_callers_context_variables(tmp_path: Path) -> None:
    request_id: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="unset")
    seen: list[tuple[str, str]] = []

    def call(key: str) -> dict[str, Any]:
        seen.append((threading.current_thread().name, request_id.get()))
        request_id.set("changed inside the call")
        return {"id": "re_1"}

    with SyncLedger.open(db(tmp_path), targets=DECLARED) as ledger:
        request_id.set("req-42")
        execute(ledger, call)
        assert seen == [(seen[0][0], "req-42")] and seen[0][0].startswith("effect-ledger call")
        assert request_id.get() == "req-42"  # the call ran in a copy: nothing leaks back

        # Another thread's own value, not this one's.
        def other() -> None:
            request_id.set("req-other")
            execute(ledger, call, step="another")

        t = threading.Thread(target=other)
        t.start()
        t.join(30)
        assert seen[1][1] == "req-other"


def test_eight_threads_on_distinct_keys_each_call_once(tmp_path: Path) -> None:
    lock = threading.Lock()
    calls: list[str] = []
    results: dict[int, Confirmation | BaseException] = {}
    start = threading.Barrier(8)

    def call(key: str) -> dict[str, Any]:
        with lock:
            calls.append(key)
        return {"id": f"re_{key[-8:]}"}

    with SyncLedger.open(db(tmp_path), targets=DECLARED) as ledger:

        def worker(i: int) -> None:
            start.wait(30)
            try:
                results[i] = execute(ledger, call, step=f"step-{i}", request={"i": i})
            except BaseException as e:  # reported by the assertion below
                results[i] = e

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        keys = [effect_key(TARGET, OPERATION, RUN_ID, f"step-{i}") for i in range(8)]
        assert all(isinstance(r, Confirmation) and r.called for r in results.values()), results
        assert [results[i].effect_id for i in range(8)] == keys  # type: ignore[union-attr]
        assert sorted(calls) == sorted(keys)
        with sqlite3.connect(ledger.store.path) as conn:
            assert conn.execute("SELECT state, COUNT(*) FROM effects GROUP BY state").fetchall() == [("CONFIRMED", 8)]


def test_same_key_from_another_thread_while_the_call_runs_is_in_progress(tmp_path: Path) -> None:
    entered, release = threading.Event(), threading.Event()
    calls: list[str] = []
    first: list[Confirmation] = []

    def slow(key: str) -> dict[str, Any]:
        calls.append(key)
        entered.set()
        release.wait(60)
        return {"id": "re_a"}

    with SyncLedger.open(db(tmp_path), targets=DECLARED) as ledger:
        t = threading.Thread(target=lambda: first.append(execute(ledger, slow)))
        t.start()
        assert entered.wait(30)
        with pytest.raises(EffectInProgress):
            execute(ledger, slow)
        release.set()
        t.join(30)
        assert first and first[0].called and calls == [KEY]
        again = execute(ledger, slow)
        assert (again.receipt_id, again.called) == ("re_a", False) and calls == [KEY]


def test_same_key_from_two_threads_at_once_calls_once(tmp_path: Path) -> None:
    lock = threading.Lock()
    calls: list[str] = []
    outcomes: list[Confirmation | BaseException] = []
    start = threading.Barrier(2)

    def call(key: str) -> dict[str, Any]:
        with lock:
            calls.append(key)
        return {"id": "re_1"}

    with SyncLedger.open(db(tmp_path), targets=DECLARED) as ledger:

        def worker() -> None:
            start.wait(30)
            try:
                outcomes.append(execute(ledger, call))
            except BaseException as e:
                outcomes.append(e)

        threads = [threading.Thread(target=worker) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
    assert calls == [KEY]
    called = [o for o in outcomes if isinstance(o, Confirmation) and o.called]
    others = [o for o in outcomes if o not in called]
    assert len(called) == 1 and len(others) == 1
    other = others[0]
    assert isinstance(other, EffectInProgress) or (
        isinstance(other, Confirmation) and (other.receipt_id, other.called) == ("re_1", False)
    ), other


def test_with_closes_the_ledger_and_its_thread(tmp_path: Path) -> None:
    path = db(tmp_path)
    with SyncLedger.open(path, targets=DECLARED) as ledger:
        execute(ledger, lambda key: {"id": "re_1"})
        loop_thread = ledger._thread
        assert loop_thread.is_alive()
    assert ledger.store.closed and not loop_thread.is_alive()
    with pytest.raises(LedgerClosed):
        execute(ledger, lambda key: {"id": "re_2"}, step="another")
    ledger.close()  # closing twice is harmless
    # Another process can take the file over: nothing of the closed ledger holds it.
    with SyncLedger.open(path, targets=DECLARED) as again:
        assert execute(again, lambda key: {"id": "re_x"}).receipt_id == "re_1"


def test_with_closes_the_ledger_when_the_body_raises(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="the agent's own bug"):
        with SyncLedger.open(db(tmp_path), targets=DECLARED) as ledger:
            raise RuntimeError("the agent's own bug")
    assert ledger.store.closed


def test_a_closed_ledger_refuses_everything(tmp_path: Path) -> None:
    path = db(tmp_path)
    ledger = SyncLedger.open(path, targets=DECLARED)
    execute(ledger, lambda key: {"id": "re_1"})

    @ledger.effect(target=TARGET)
    def refund(order: str, *, idempotency_key: str) -> dict[str, Any]:
        return {"id": "re_d"}

    ledger.close()
    counts = db_counts(path)
    calls: list[str] = []
    refused: list[Callable[[], Any]] = [
        lambda: execute(ledger, lambda key: calls.append(key), step="another"),
        lambda: execute(ledger, lambda key: calls.append(key)),
        lambda: ledger.get(KEY),
        lambda: ledger.expire(KEY),
        lambda: ledger.record_receipt(KEY, "re_x"),
        lambda: ledger.decide(KEY, DecisionKind.ABANDONED, by="me", reason="x"),
        lambda: refund("1", run_id="r", step="s"),
    ]
    for attempt in refused:
        with pytest.raises(LedgerClosed):
            attempt()
    assert calls == [] and db_counts(path) == counts


def test_close_lets_a_call_in_flight_end_by_its_deadline(tmp_path: Path) -> None:
    """Closing while another thread's call blocks: that thread gets its answer (the call is cut off
    at its deadline and recorded unknown), instead of waiting forever on a stopped loop."""
    path = db(tmp_path)
    entered, release = threading.Event(), threading.Event()
    outcome: list[BaseException | Confirmation] = []

    def hangs(key: str) -> dict[str, Any]:
        entered.set()
        release.wait(60)
        return {"id": "re_late"}

    ledger = SyncLedger.open(path, targets=DECLARED)

    def agent() -> None:
        try:
            outcome.append(execute(ledger, hangs, timeout=0.5))
        except BaseException as e:
            outcome.append(e)

    t = threading.Thread(target=agent)
    t.start()
    assert entered.wait(30)
    ledger.close()
    t.join(30)
    try:
        assert not t.is_alive(), "the agent's thread is stuck in execute after close"
        assert len(outcome) == 1 and isinstance(outcome[0], EffectUncertain), outcome
        with sqlite3.connect(path) as conn:
            assert conn.execute("SELECT state FROM effects").fetchall() == [("UNCERTAIN",)]
    finally:
        release.set()


def test_an_async_function_as_call_is_refused_and_nothing_is_written(tmp_path: Path) -> None:
    path = db(tmp_path)

    async def refund(key: str) -> dict[str, Any]:
        return {"id": "re_1"}

    with SyncLedger.open(path, targets=DECLARED) as ledger:
        refused: list[Any] = [
            refund,
            Destination(),  # an object whose __call__ is async
            functools.partial(refund),
        ]
        for call in refused:
            with pytest.raises(InvalidEffect, match="async"):
                execute(ledger, call)
        with pytest.raises(InvalidEffect, match="async"):
            ledger.effect(target=TARGET)(_async_refund)
        assert db_counts(path) == (0, 0)


async def _async_refund(order: str, *, idempotency_key: str) -> dict[str, Any]:
    return {"id": "re_1"}


def test_not_callable_and_undeclared_target_write_nothing(tmp_path: Path) -> None:
    path = db(tmp_path)
    with SyncLedger.open(path, targets=DECLARED) as ledger:
        with pytest.raises(InvalidEffect):
            execute(ledger, "gateway.refund")
        with pytest.raises(UnknownTarget):
            execute(ledger, lambda key: {"id": "re_1"}, target="sms")
        assert db_counts(path) == (0, 0)


def test_the_sync_decorator(tmp_path: Path) -> None:
    calls: list[tuple[str, int, str]] = []

    with SyncLedger.open(db(tmp_path), targets=DECLARED) as ledger:

        @ledger.effect(target="payments", timeout=5.0)
        def refund(order: str, amount: int, currency: str = "CNY", *, idempotency_key: str) -> dict[str, Any]:
            calls.append((order, amount, idempotency_key))
            return {"id": f"re_{len(calls)}", "order": order, "amount": amount}

        assert refund.__name__ == "refund" and not inspect.iscoroutinefunction(refund)
        key = effect_key("payments", "refund", "run-1", "refund-123")
        v1 = refund("123", 4800, run_id="run-1", step="refund-123")
        assert v1 == {"id": "re_1", "order": "123", "amount": 4800} and calls == [("123", 4800, key)]
        assert refund("123", amount=4800, run_id="run-1", step="refund-123") == v1 and len(calls) == 1
        effect = ledger.get(key)
        assert effect is not None and effect.intent is not None
        assert json.loads(effect.intent.request) == {"order": "123", "amount": 4800, "currency": "CNY"}
        assert effect.intent.deadline_ms - effect.intent.at_ms == 5_000
        with pytest.raises(EffectConflict):
            refund("123", 1, run_id="run-1", step="refund-123")
        assert refund("124", 10, key="my-key")["id"] == "re_2" and calls[-1] == ("124", 10, "my-key")

        @ledger.effect(target="mail", operation="send.receipt", key_arg="dedupe")
        def send(to: str, *, dedupe: str) -> str:
            return f"msg-{dedupe[-4:]}"

        mail_key = effect_key("mail", "send.receipt", "r", "s")
        assert send("a@example.com", run_id="r", step="s") == f"msg-{mail_key[-4:]}"

        with pytest.raises(InvalidEffect, match="idempotency_key"):

            @ledger.effect(target="payments")
            def no_key(order: str) -> None:
                return None


def test_a_receipt_recorded_later_and_a_decision_through_the_sync_door(tmp_path: Path) -> None:
    with SyncLedger.open(db(tmp_path), targets=DECLARED) as ledger:
        with pytest.raises(EffectUncertain):
            execute(ledger, _raises(ConnectionError("reset")))
        effect = ledger.record_receipt(KEY, "re_hook", {"id": "re_hook"}, attempt=1)
        assert effect.state is State.CONFIRMED
        c = execute(ledger, _raises(AssertionError("must not be called")))
        assert (c.receipt_id, c.called, c.source) == ("re_hook", False, ReceiptSource.WEBHOOK)


def _raises(e: BaseException) -> Callable[[str], Any]:
    def call(key: str) -> Any:
        raise e

    return call


_INTERRUPTED_SCRIPT = textwrap.dedent(
    """
    import signal, sys, threading
    from pathlib import Path
    from effect_ledger import SyncLedger, Target

    # Ctrl-C as in a terminal: a test run started in the background inherits SIGINT ignored.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    db, ready, inline = sys.argv[1], Path(sys.argv[2]), sys.argv[3:] == ["inline"]

    def call(key):
        ready.touch()
        threading.Event().wait()  # a destination that never answers

    try:
        with SyncLedger.open(db, targets=[Target("payments")], inline_calls=inline) as ledger:
            ledger.execute(target="payments", operation="refund.create", run_id="r", step="s",
                           request={"order": "1"}, call=call, timeout=600)
    except KeyboardInterrupt:
        print("interrupted")
    """
)


@pytest.mark.parametrize("inline", [False, True], ids=["call-thread", "inline-calls"])
def test_interrupted_caller_records_the_call_unknown(tmp_path: Path, inline: bool) -> None:
    """Ctrl-C while a sync call blocks (the sync form of a cancelled task): the caller gets its
    KeyboardInterrupt at once, the ledger records the call's outcome as unknown before the ``with``
    closes it, and the process exits although the call's thread still blocks. With
    ``inline_calls`` the interruption is raised inside the call, in the caller's thread."""
    path, ready = db(tmp_path), tmp_path / "ready"
    script = tmp_path / "interrupted.py"
    script.write_text(_INTERRUPTED_SCRIPT)
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen(
        [sys.executable, str(script), path, str(ready), *(["inline"] if inline else [])],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        wait_until(lambda: ready.exists() or proc.poll() is not None, timeout=30, what="the call to start")
        assert proc.poll() is None, proc.stderr.read()  # type: ignore[union-attr]
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0 and out.strip() == "interrupted", err
    key = effect_key("payments", "refund.create", "r", "s")
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT state, claim_owner FROM effects").fetchall() == [("UNCERTAIN", None)]
        kinds = [r[0] for r in conn.execute("SELECT kind FROM events WHERE effect_id = ? ORDER BY seq", (key,))]
    assert kinds == ["Intent", "Executed"]


def test_a_reconciler_may_read_the_ledger_through_the_sync_door(tmp_path: Path) -> None:
    """Embedded, a reconciler runs on the caller's thread (on its own loop): reading the ledger
    from there through the same SyncLedger is answered (by the ledger's loop), not a deadlock."""
    holder: list[SyncLedger] = []
    seen: list[str] = []

    def lookup(effect: EffectView) -> Any:
        found = holder[0].get(effect.effect_id)
        assert found is not None
        seen.append(found.state.value)
        return Absent("no such refund")

    from effect_ledger.targets.ask import CallableReconciler

    targets = [Target(TARGET, reconciler=CallableReconciler(lookup))]
    with SyncLedger.open(db(tmp_path), targets=targets) as ledger:
        holder.append(ledger)
        with pytest.raises(EffectUncertain):
            execute(ledger, _raises(ConnectionError("reset")), timeout=0.2)
        wait_until(lambda: ledger.now_ms() > ledger.get(KEY).intent.deadline_ms, what="the deadline")  # type: ignore[union-attr]
        # Absent, but the first call may still land for the target's lands_within: not yet retried.
        with pytest.raises(EffectInProgress, match="may still land"):
            execute(ledger, _raises(AssertionError("must not be called")), timeout=0.2)
        assert seen == ["UNCERTAIN"]


def test_sync_ledger_from_its_own_loop_is_refused(tmp_path: Path) -> None:
    """On the ledger's own loop (where a reconciler runs in Kafka mode) a SyncLedger call would
    wait on itself forever: it is refused instead."""
    with SyncLedger.open(db(tmp_path), targets=DECLARED) as ledger:
        answer: Future[BaseException | None] = Future()

        def on_its_loop() -> None:
            try:
                ledger.get(KEY)
                answer.set_result(None)
            except BaseException as e:
                answer.set_result(e)

        ledger._loop.call_soon_threadsafe(on_its_loop)
        err = answer.result(timeout=10)
        assert isinstance(err, InvalidEffect) and "own event loop" in str(err)


def test_a_call_that_exits_is_recorded_unknown_and_the_ledger_keeps_working(tmp_path: Path) -> None:
    """``sys.exit()`` inside a call reaches the caller, as it would without the ledger; it must not
    reach the ledger's loop, which it would stop (every later call would then wait forever)."""

    def exits(key: str) -> None:
        sys.exit(3)

    with SyncLedger.open(db(tmp_path), targets=DECLARED) as ledger:
        with pytest.raises(SystemExit) as ei:
            execute(ledger, exits)
        assert ei.value.code == 3
        assert executions(ledger, KEY) == [(Outcome.UNKNOWN, "CallExited: SystemExit(3)")]
        assert ledger._thread.is_alive()
        c = execute(ledger, lambda key: {"id": "re_2"}, step="another")
        assert c.called and c.receipt_id == "re_2"


class TestSyncLedgerInlineCalls(TestSyncLedger):
    """The whole contract again with ``inline_calls``: every call in the caller's thread."""

    async def open_ledger(self, path: str, **kwargs: Any) -> ThroughSync:  # type: ignore[override]
        kwargs.setdefault("inline_calls", True)
        return await super().open_ledger(path, **kwargs)

    def test_timeout_is_uncertain_with_unknown_outcome(self, tmp_path: Path) -> None:
        """No cut-off: the caller waits for the call, which returns after its deadline. It counts as
        cut off there: recorded unknown, what it returned not recorded, the claim released."""
        dest = Destination(delay=1.0)

        async def body(ledger: Any) -> None:
            started = time.monotonic()
            with pytest.raises(EffectUncertain) as ei:
                await self.execute(ledger, dest, timeout=0.2)
            assert time.monotonic() - started >= 1.0  # held by the call, past its deadline
            assert dest.calls == [KEY]
            assert ei.value.effect_id == KEY and ei.value.state == "UNCERTAIN"
            effect = await ledger.get(KEY)
            assert effect.state is State.UNCERTAIN and effect.receipt is None
            execs = [f for f in effect.facts if isinstance(f, Executed)]
            assert [(x.outcome, x.error) for x in execs] == [(Outcome.UNKNOWN, "timed out")]
            assert effect_row(ledger.store.path, KEY)["claim_owner"] is None

        run(self.with_ledger(self.db(tmp_path), body))

"""Where ``SyncLedger``'s work runs (``effect_ledger.sdk.sync``): embedded, on the caller's thread,
on a loop of that thread; from a thread that runs a loop already, on the ledger's loop. And what
that asks of the store: writes from several threads and from the ledger's loop at once, each
durable and none lost, and a ledger's loop that never waits while a caller's thread holds the
writer (``Store._commit_here``)."""

from __future__ import annotations

import asyncio
import gc
import json
import os
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from effect_ledger import SyncLedger
from effect_ledger.core.effect import Effect
from effect_ledger.core.keys import effect_key
from effect_ledger.core.model import Event, State
from effect_ledger.errors import EffectUncertain
from effect_ledger.sdk import sync as sync_module
from effect_ledger.sdk.store.sqlite import Durability
from tests.sdk_contract import DECLARED, OPERATION, REQUEST, TARGET, wait_until


class WritingThreads:
    """A store observer: the thread each durable change of an effect was written on."""

    def __init__(self) -> None:
        self.by_key: dict[str, list[str]] = {}

    def __call__(self, before: Effect | None, after: Effect, new: Sequence[Event]) -> None:
        self.by_key.setdefault(after.effect_id, []).append(threading.current_thread().name)


def execute(ledger: SyncLedger, step: str, calls: list[str] | None = None) -> Any:
    def call(key: str) -> dict[str, str]:
        if calls is not None:
            calls.append(threading.current_thread().name)
        return {"id": "re_" + key[-8:]}

    return ledger.execute(
        target=TARGET, operation=OPERATION, run_id="run-1", step=step, request=REQUEST, call=call, timeout=30
    )


def test_embedded_the_writes_are_made_on_the_callers_thread_and_the_call_on_another(tmp_path: Path) -> None:
    with SyncLedger.open(str(tmp_path / "effects.db"), targets=DECLARED) as ledger:
        seen = WritingThreads()
        ledger.store.observe("test", seen)
        calls: list[str] = []
        c = execute(ledger, "main", calls)
        out: dict[str, Any] = {}
        worker = threading.Thread(target=lambda: out.update(c=execute(ledger, "worker", calls)), name="caller-2")
        worker.start()
        worker.join(30)
        me = threading.current_thread().name
        assert seen.by_key[c.effect_id] == [me, me]  # the intent, then the outcome with its receipt
        assert seen.by_key[out["c"].effect_id] == ["caller-2", "caller-2"]
        assert len(calls) == 2 and all(name.startswith("effect-ledger call") for name in calls)


def test_from_a_thread_that_runs_a_loop_the_work_goes_to_the_ledgers_loop(tmp_path: Path) -> None:
    """Sync code called from a coroutine (it blocks that loop, as any sync call does): a second loop
    cannot run on that thread, so the ledger's own loop does the work."""
    with SyncLedger.open(str(tmp_path / "effects.db"), targets=DECLARED) as ledger:
        seen = WritingThreads()
        ledger.store.observe("test", seen)

        async def inside_a_coroutine() -> Any:
            return execute(ledger, "from-a-loop")

        c = asyncio.run(inside_a_coroutine())
        assert c.called
        assert seen.by_key[c.effect_id] == [ledger._thread.name, ledger._thread.name]


@pytest.mark.parametrize("durability", ["NORMAL", "FULL"])
def test_threads_and_the_ledgers_loop_writing_at_once_lose_nothing(tmp_path: Path, durability: str) -> None:
    """Eight caller threads write on their own loops while the ledger's loop writes too (receipts
    recorded later, as a webhook would): every write lands, each effect whole, the file sound."""
    threads, per_thread = 8, 40
    path = tmp_path / "effects.db"
    with SyncLedger.open(str(path), targets=DECLARED, durability=Durability(durability)) as ledger:
        first = [execute(ledger, f"early-{i}") for i in range(per_thread)]  # answered later on the loop
        errors: list[BaseException] = []
        start = threading.Barrier(threads + 1)

        def caller(n: int) -> None:
            try:
                start.wait(10)
                for i in range(per_thread):
                    c = execute(ledger, f"t{n}-{i}")
                    assert c.called and c.receipt_id == "re_" + c.effect_id[-8:]
            except BaseException as e:
                errors.append(e)

        def on_the_loop() -> None:
            async def receipts() -> None:
                for c in first:
                    await ledger.ledger.record_receipt(c.effect_id, "webhook-" + c.effect_id[-8:])

            try:
                start.wait(10)
                asyncio.run_coroutine_threadsafe(receipts(), ledger._loop).result(60)
            except BaseException as e:
                errors.append(e)

        workers = [threading.Thread(target=caller, args=(n,)) for n in range(threads)]
        workers.append(threading.Thread(target=on_the_loop))
        for w in workers:
            w.start()
        for w in workers:
            w.join(120)
        assert not errors, errors
        for c in first:
            effect = ledger.get(c.effect_id)
            assert effect is not None and effect.state is State.CONFIRMED
            assert len(effect.receipt_ids) == 2  # the call's, then the webhook's
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        states = dict(db.execute("SELECT state, count(*) FROM effects GROUP BY state").fetchall())
        assert states == {"CONFIRMED": per_thread * (threads + 1)}
        kinds = dict(db.execute("SELECT kind, count(*) FROM events GROUP BY kind").fetchall())
        assert kinds == {"Intent": 360, "Executed": 360, "Receipt": 400}


def test_the_ledgers_loop_goes_on_while_a_callers_thread_waits_for_a_locked_file(tmp_path: Path) -> None:
    """Another process holds the file's write lock: a caller's write waits for it on the caller's
    thread, holding the writer connection; the ledger's loop meanwhile keeps running (its own write
    is handed to the store's thread) and both writes land once the lock is let go."""
    path = tmp_path / "effects.db"
    with SyncLedger.open(str(path), targets=DECLARED) as ledger:
        other = sqlite3.connect(path, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")
        result: dict[str, Any] = {}
        caller = threading.Thread(target=lambda: result.update(c=execute(ledger, "waits")))
        caller.start()
        wait_until(lambda: ledger.store._writing.locked(), what="the caller's thread to hold the writer")

        ticks: list[float] = []

        async def loop_side() -> Effect:
            beat = asyncio.get_running_loop().create_task(_beat(ticks))
            try:
                # A write of the ledger's loop while the caller's thread holds the writer.
                key = effect_key(TARGET, OPERATION, "run-1", "receipt-first")
                return await ledger.ledger.record_receipt(key, "r-1", allow_unknown=True)
            finally:
                beat.cancel()

        fut = asyncio.run_coroutine_threadsafe(loop_side(), ledger._loop)
        time.sleep(0.3)  # the file stays locked a while: the loop must go on meanwhile
        assert not fut.done() or fut.exception() is None, fut.exception()
        assert len(ticks) >= 10, f"the ledger's loop stalled: {len(ticks)} beats in 0.3 s"
        assert not fut.done() and "c" not in result  # both still wait for the file
        other.execute("COMMIT")
        other.close()
        caller.join(30)
        assert result["c"].called
        assert fut.result(30).state is not None


async def _beat(ticks: list[float]) -> None:
    while True:
        ticks.append(time.monotonic())
        await asyncio.sleep(0.01)


def test_a_threads_own_loop_is_closed_when_the_thread_ends(tmp_path: Path) -> None:
    with SyncLedger.open(str(tmp_path / "effects.db"), targets=DECLARED) as ledger:
        loops: list[asyncio.AbstractEventLoop] = []

        def caller() -> None:
            execute(ledger, "short-lived")
            loops.append(sync_module._thread_loop())

        t = threading.Thread(target=caller)
        t.start()
        t.join(30)
        assert len(loops) == 1
        wait_until(lambda: gc.collect() >= 0 and loops[0].is_closed(), what="the thread's loop to close")


def test_writes_of_threads_that_arrive_together_commit_together(tmp_path: Path) -> None:
    """Group commit between callers' threads: while one commits (a slow disk here), the others'
    writes queue, and the next to take the writer commits them all in one transaction."""
    threads = 8
    with SyncLedger.open(str(tmp_path / "effects.db"), targets=DECLARED, durability=Durability.FULL) as ledger:
        store = ledger.store
        batches: list[int] = []
        real = store._write_batch

        def slow_disk(ops: list[Any]) -> list[Any]:
            batches.append(len(ops))
            time.sleep(0.05)
            return real(ops)

        store._write_batch = slow_disk  # type: ignore[method-assign]
        start = threading.Barrier(threads)
        done: list[Any] = []

        def caller(n: int) -> None:
            start.wait(10)
            done.append(execute(ledger, f"together-{n}"))

        workers = [threading.Thread(target=caller, args=(n,)) for n in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join(60)
        assert len(done) == threads and all(c.called for c in done)
        assert sum(batches) == 2 * threads  # every intent and every outcome, once
        assert max(batches) > 1 and len(batches) < 2 * threads, batches


# Signals reach Python on the main thread only, so these run a script whose main thread is the caller.
_SIGNAL_SCRIPT = textwrap.dedent(
    """
    import json, os, signal, sqlite3, sys, threading, time
    from effect_ledger import SyncLedger, Target

    # Ctrl-C as in a terminal: a test run started in the background inherits SIGINT ignored.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    path, mode = sys.argv[1], sys.argv[2]
    ledger = SyncLedger.open(path, targets=[Target("payments")])
    main, out, calls = threading.get_ident(), {}, []

    def execute(step, call):
        return ledger.execute(target="payments", operation="refund.create", run_id="r", step=step,
                              request={"step": step}, call=call, timeout=5)

    if mode == "locked":  # Ctrl-C while the intent waits for a file another connection holds
        other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        other.execute("BEGIN IMMEDIATE")

        def poke():
            time.sleep(0.3)
            signal.pthread_kill(main, signal.SIGINT)
            time.sleep(0.3)
            other.execute("COMMIT")

        threading.Thread(target=poke).start()
        try:
            execute("s1", lambda k: calls.append(k) or {"id": "x"})
            out["first"] = "returned"
        except KeyboardInterrupt:
            out["first"] = "interrupted"
        out["in_transaction"] = ledger.store._conn.in_transaction
        o2 = sqlite3.connect(path, isolation_level=None, timeout=2)
        o2.execute("BEGIN IMMEDIATE")
        o2.execute("ROLLBACK")
        out["next"] = execute("s2", lambda k: calls.append(k) or {"id": "y"}).receipt_id
    else:  # "close": a SIGTERM handler closes the ledger while the main thread is in execute
        signal.signal(signal.SIGTERM, lambda *_: ledger.close())
        threading.Thread(target=lambda: (time.sleep(0.3), signal.pthread_kill(main, signal.SIGTERM))).start()
        try:
            execute("s1", lambda k: time.sleep(1) or {"id": "x"})
            out["first"] = "returned"
        except Exception as e:
            out["first"] = type(e).__name__
    out["calls"] = len(calls)
    print(json.dumps(out), flush=True)
    ledger.close()
    """
)


def _signalled(tmp_path: Path, mode: str) -> dict[str, Any]:
    script = tmp_path / "signalled.py"
    script.write_text(_SIGNAL_SCRIPT)
    root = Path(__file__).resolve().parents[3]
    env = dict(os.environ, PYTHONPATH=str(root) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "effects.db"), mode],
        capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_ctrl_c_while_the_intent_waits_for_a_locked_file_leaves_the_writer_sound(tmp_path: Path) -> None:
    """Python raises KeyboardInterrupt between any two bytecodes of the main thread, and the intent is
    written there: raised just as BEGIN IMMEDIATE returned, it left the writer inside a transaction
    holding the file's lock (every later write failed, other processes could not write). The first
    Ctrl-C now cancels the operation at its next await instead, as asyncio.run does."""
    out = _signalled(tmp_path, "locked")
    assert out["first"] == "interrupted", out
    assert out["in_transaction"] is False, out
    assert out["next"] == "y", out  # the next execute writes and confirms


def test_a_signal_handler_that_closes_the_ledger_does_not_wait_for_its_own_thread(tmp_path: Path) -> None:
    """A graceful shutdown (``signal.signal(SIGTERM, lambda *_: ledger.close())``) while the main
    thread is inside execute: close() cannot wait for that operation (it is suspended under the
    handler); it closes, and the operation finds the ledger closed (its call's outcome unrecorded:
    ``EffectUncertain``, the intent left for reconciliation), instead of waiting for ever."""
    out = _signalled(tmp_path, "close")
    assert out["first"] == "EffectUncertain", out


def test_an_operation_on_the_callers_loop_leaves_no_loop_running_in_the_thread(tmp_path: Path) -> None:
    """After an operation on the caller's own loop, and after one whose call raised, the thread runs
    no loop, and a loop of the application's runs there."""
    with SyncLedger.open(str(tmp_path / "effects.db"), targets=DECLARED) as ledger:
        first = execute(ledger, "first")
        assert asyncio._get_running_loop() is None

        def refused(key: str) -> dict[str, str]:
            raise ValueError("declined")

        with pytest.raises(EffectUncertain):
            ledger.execute(target=TARGET, operation=OPERATION, request={"n": 2}, call=refused, key="k-refused")
        assert asyncio._get_running_loop() is None

        async def applications_own() -> asyncio.AbstractEventLoop:
            await asyncio.sleep(0)
            return asyncio.get_running_loop()

        assert asyncio.run(applications_own()) is not sync_module._thread_loop()
        after = execute(ledger, "after the application's loop")
        assert ledger.get(first.effect_id) is not None and ledger.get(after.effect_id) is not None

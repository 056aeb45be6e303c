"""The store's interface (issue 12, items 3 and 7): the reads the runner and ops views use, a
``query`` that is read-only for real, typed storage errors, the partial index those reads use, the
fresh-key path, and which writes leave the event loop's thread."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from pathlib import Path
from typing import Any

import pytest

from effect_ledger.core.effect import apply, begin
from effect_ledger.core.model import Intent, State
from effect_ledger.core.reconcile import Target
from effect_ledger.errors import StorageError
from effect_ledger.sdk.ledger import Ledger
from effect_ledger.sdk.store.reader import LedgerReader
from effect_ledger.sdk.store.sqlite import Store
from effect_ledger.sdk.store.tables import UNSETTLED, due_checks, due_deadlines, in_state, unsettled

TARGETS = [Target("payments")]


def run(coro: Any) -> Any:
    return asyncio.run(coro)


async def _ok(key: str) -> dict[str, str]:
    return {"id": "re_" + key[-6:]}


async def _confirmed_and_pending(path: Path, clock: list[int]) -> Ledger:
    """A ledger with one CONFIRMED effect (step a) and one UNCERTAIN (step b: its call was cut off)."""
    ledger = await Ledger.open(str(path), targets=TARGETS, clock=lambda: clock[0])
    await ledger.execute(target="payments", operation="refund", run_id="r", step="a", request={}, call=_ok)
    started = asyncio.Event()

    async def hangs(key: str) -> None:
        started.set()
        await asyncio.Event().wait()

    task = asyncio.create_task(
        ledger.execute(target="payments", operation="refund", run_id="r", step="b", request={}, call=hangs, timeout=5)
    )
    await started.wait()
    task.cancel()  # the call is abandoned mid-flight: its outcome is UNKNOWN, the effect UNCERTAIN
    with pytest.raises(asyncio.CancelledError):
        await task
    return ledger


def test_due_deadlines_due_checks_and_record_check(tmp_path: Path) -> None:
    clock = [1_000_000]

    async def body() -> None:
        ledger = await Ledger.open(str(tmp_path / "e.db"), targets=TARGETS, clock=lambda: clock[0])
        try:
            started = asyncio.Event()

            async def hangs(key: str) -> None:
                started.set()
                await asyncio.Event().wait()

            await ledger.execute(target="payments", operation="refund", run_id="r", step="a", request={}, call=_ok)
            task = asyncio.create_task(
                ledger.execute(
                    target="payments", operation="refund", run_id="r", step="p", request={}, call=hangs, timeout=5
                )
            )
            await started.wait()
            store = ledger.store
            (pending,) = await store.unsettled()
            assert pending["state"] == "PENDING" and pending["deadline_ms"] == clock[0] + 5_000
            assert await store.due_deadlines(clock[0] + 4_999, 10) == []
            assert [d.effect_id for d in await store.due_deadlines(clock[0] + 5_000, 10)] == [pending["effect_id"]]
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            (due,) = await store.due_checks(clock[0], 10)
            assert due == (pending["effect_id"], 0)
            await store.record_check(due.effect_id, 3, clock[0] + 60_000)
            assert await store.due_checks(clock[0] + 59_999, 10) == []
            assert await store.due_checks(clock[0] + 60_000, 10) == [(due.effect_id, 3)]
            assert sorted(await store.counts()) == [("CONFIRMED", "payments", 1), ("UNCERTAIN", "payments", 1)]
            assert await store.oldest_due_ms() == clock[0] + 60_000
        finally:
            await ledger.close()

    run(body())


def test_query_is_read_only_and_errors_are_typed(tmp_path: Path) -> None:
    async def body() -> None:
        ledger = await Ledger.open(str(tmp_path / "e.db"), targets=TARGETS)
        try:
            await ledger.execute(target="payments", operation="refund", run_id="r", step="a", request={}, call=_ok)
            with pytest.raises(StorageError) as ei:
                await ledger.store.query("DELETE FROM effects")
            assert isinstance(ei.value.__cause__, sqlite3.Error)
            with pytest.raises(StorageError):
                await ledger.store.query("SELECT nothing FROM nowhere")
            assert [r["state"] for r in await ledger.store.query("SELECT state FROM effects")] == ["CONFIRMED"]
        finally:
            await ledger.close()

    run(body())


def test_the_unsettled_reads_use_the_partial_index(tmp_path: Path) -> None:
    async def create() -> None:
        await (await Store.open(tmp_path / "e.db")).close()

    run(create())
    conn = sqlite3.connect(tmp_path / "e.db")
    try:
        traced: list[str] = []
        conn.set_trace_callback(traced.append)
        due_deadlines(conn, 0, 1)
        due_checks(conn, 0, 1)
        unsettled(conn, 0)
        in_state(conn, State.ESCALATED)
        conn.set_trace_callback(None)
        for sql in traced:
            plan = " ".join(str(r[-1]) for r in conn.execute(f"EXPLAIN QUERY PLAN {sql}"))
            assert "effects_unsettled" in plan, (sql, plan)
        indexes = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
        assert "effects_by_state" not in indexes and "effects_by_deadline" not in indexes
        assert UNSETTLED in conn.execute("SELECT sql FROM sqlite_master WHERE name = 'effects_unsettled'").fetchone()[0]
    finally:
        conn.close()


def test_the_reader_refuses_what_is_not_a_ledger_and_lists_unsettled(tmp_path: Path) -> None:
    with pytest.raises(StorageError, match="no ledger file"):
        LedgerReader.open(tmp_path / "missing.db")
    other = tmp_path / "other.db"
    sqlite3.connect(other).execute("CREATE TABLE t (x)").connection.close()
    with pytest.raises(StorageError, match="not an effect-ledger file"):
        LedgerReader.open(other)
    clock = [5_000_000]

    async def body() -> None:
        ledger = await _confirmed_and_pending(tmp_path / "e.db", clock)
        await ledger.close()

    run(body())
    with LedgerReader.open(tmp_path / "e.db") as reader:
        assert [r["state"] for r in reader.unsettled()] == ["UNCERTAIN"]
        assert reader.unsettled(clock[0]) == []  # created at clock[0], not before
        assert [r["state"] for r in reader.in_state(State.UNCERTAIN)] == ["UNCERTAIN"]
        keys = [key for _, key, _, _ in reader.events()]
        assert len(keys) == 5 and len(set(keys)) == 2  # intent, executed, receipt; intent, executed


def test_a_fresh_intent_is_the_effect_the_fold_makes() -> None:
    i = Intent("e1", "payments:k", 5, 1, "payments", "refund", "ns", "r", "s", "{}", "d", 99, "w")
    assert begin(i) == apply(None, i)[0]


def test_writes_stay_on_the_loop_at_normal_and_leave_it_for_an_fsync(tmp_path: Path) -> None:
    async def threads_used(durability: str) -> set[str]:
        ledger = await Ledger.open(str(tmp_path / f"{durability}.db"), targets=TARGETS, durability=durability)
        names: set[str] = set()
        store = ledger.store
        orig = store._write_batch

        def spy(ops: Any) -> Any:
            names.add(threading.current_thread().name)
            return orig(ops)

        store._write_batch = spy  # type: ignore[method-assign]
        try:
            await ledger.execute(target="payments", operation="refund", run_id="r", step="a", request={}, call=_ok)
        finally:
            await ledger.close()
        return names

    assert run(threads_used("NORMAL")) == {threading.main_thread().name}
    full = run(threads_used("FULL"))
    assert threading.main_thread().name in full and any(n.startswith("effect-ledger-store") for n in full), full


def test_a_lone_intent_at_full_commits_on_the_loop_while_the_disk_is_fast(tmp_path: Path) -> None:
    """At FULL a lone intent's fsync stays on the loop's thread once the store's last 16 lone
    durable commits were each fast (a hop to the store's thread and back costs as much), and leaves
    it at the first slow one; until that many are timed, it leaves it. Concurrent writes take one
    hop."""

    async def body() -> None:
        ledger = await Ledger.open(str(tmp_path / "full.db"), targets=TARGETS, durability="FULL")
        store = ledger.store
        names: list[tuple[str, bool]] = []
        orig = store._write_batch

        def spy(ops: Any) -> Any:
            durable = any(getattr(op, "durable", False) for op in ops)
            names.append((threading.current_thread().name, durable))
            return orig(ops)

        store._write_batch = spy  # type: ignore[method-assign]

        async def intents_on(step: str) -> set[str]:
            names.clear()
            done = await ledger.execute(
                target="payments", operation="refund", run_id="r", step=step, request={}, call=_ok
            )
            assert done.called and (await ledger.get(done.effect_id)).state is State.CONFIRMED  # type: ignore[union-attr]
            return {name for name, durable in names if durable}

        store_thread = "effect-ledger-store"
        main = threading.main_thread().name
        try:
            # Not timed yet: the first durable commits go to the store's thread, and are timed there.
            first = await intents_on("a")
            assert all(n.startswith(store_thread) for n in first), first
            assert store._fast_in_a_row in (0, 1)  # the real commit was timed, fast or not
            store._fast_in_a_row = 0
            for us in (200.0,) * 16:  # a fast disk's commits
                store._durable_took(us)
            assert await intents_on("b") == {main}
            store._durable_took(5_000.0)  # one slow fsync: the next goes to the store's thread
            slow = await intents_on("c")
            assert slow and all(n.startswith(store_thread) for n in slow), slow
            for us in (200.0,) * 15:  # fifteen fast ones are not enough to come back
                store._durable_took(us)
            store._durable_took(5_000.0)
            assert all(n.startswith(store_thread) for n in await intents_on("d"))
            for us in (200.0,) * 16:
                store._durable_took(us)
            # Several intents at once: one group commit, on the store's thread, fast disk or not.
            names.clear()
            await asyncio.gather(
                *(
                    ledger.execute(
                        target="payments", operation="refund", run_id="r", step=f"g{i}", request={}, call=_ok
                    )
                    for i in range(8)
                )
            )
            assert any(n.startswith(store_thread) for n, durable in names if durable), names
            assert sum(1 for _, durable in names if durable) < 8  # grouped
        finally:
            await ledger.close()

    run(body())


def test_a_file_locked_by_another_process_is_waited_for_off_the_loop(tmp_path: Path) -> None:
    """Another connection holds the write lock: the write waits on the store's thread while the
    event loop keeps running, and lands once the lock is released."""
    path = tmp_path / "e.db"

    async def body() -> None:
        ledger = await Ledger.open(str(path), targets=TARGETS)
        try:
            other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
            other.execute("BEGIN IMMEDIATE")
            write = asyncio.create_task(
                ledger.execute(target="payments", operation="refund", run_id="r", step="a", request={}, call=_ok)
            )
            ticks = 0
            while ticks < 20:  # the loop runs while the write waits
                await asyncio.sleep(0)
                ticks += 1
            assert not write.done()
            other.execute("COMMIT")
            other.close()
            confirmation = await asyncio.wait_for(write, 30)
            assert confirmation.called
        finally:
            await ledger.close()

    run(body())

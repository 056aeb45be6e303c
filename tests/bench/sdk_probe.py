"""One measurement of ``Ledger.execute`` (or ``SyncLedger.execute``: modes ``sync`` and
``sync-inline``, sequential, the call a plain function, in the process's main thread as a script's
would be) in a process of its own, for ``tests.bench.sdk_compare``.

Run as a script (``python tests/bench/sdk_probe.py MODE DURABILITY N FILE``), never as a module: the
comparison points ``PYTHONPATH`` at another build of ``effect_ledger`` (today's main, say), and a
script's folder holds no ``effect_ledger`` to shadow it. Uses only the API both builds share.
Prints one JSON line: wall and CPU (all threads) microseconds per effect, effects/s, and how
many effects ended CONFIRMED. A fifth argument ``--no-sql`` runs this tree with the store's SQL
replaced by nothing (``_without_sql``): the Python side alone; ``--parts`` adds the medians of the
parts of a write that no Python of the ledger's can go under (``_timed_parts``, this tree only);
``--snapshot=PATH`` copies the file and its WAL to ``PATH`` and ``PATH-wal`` before the ledger
closes (and checkpoints the WAL away), for ``tests.bench.wal_frames``.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import sqlite3
import statistics
import sys
import threading
import time
import uuid
from typing import Any

from effect_ledger.core.reconcile import Target
from effect_ledger.sdk.ledger import Ledger
from effect_ledger.sdk.sync import SyncLedger

CONCURRENCY = 64
WARMUP = 100  # effects executed before the clock starts, in every mode
REQUEST = {"order": "123", "amount": 4800, "currency": "CNY"}


def _sync_call(key: str) -> dict[str, Any]:
    return {"id": "re_" + key[-12:]}


async def _call(key: str) -> dict[str, Any]:
    return _sync_call(key)


def sync_main(mode: str, durability: str, n: int, path: str) -> dict[str, Any]:
    """``SyncLedger.execute``, sequential: with a call thread (``sync``) or ``inline_calls``."""
    with SyncLedger.open(
        path, durability=durability, targets=[Target("payments")], inline_calls=mode == "sync-inline"
    ) as ledger:
        run = uuid.uuid4().hex
        for i in range(-WARMUP, n):
            if i == 0:
                c0, t0 = time.process_time(), time.perf_counter()
            ledger.execute(
                target="payments", operation="refund.create", run_id=run, step=f"refund-{i}", request=REQUEST,
                call=_sync_call,
            )  # fmt: skip
        elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
    return _result(elapsed, cpu, n, _confirmed(path))


def _confirmed(path: str) -> int:
    conn = sqlite3.connect(path)
    try:
        return int(conn.execute("SELECT count(*) FROM effects WHERE state = 'CONFIRMED'").fetchone()[0])
    finally:
        conn.close()


def _result(elapsed: float, cpu: float, n: int, confirmed: int) -> dict[str, Any]:
    """The probe's line: per effect, the warm-up left out of ``confirmed``."""
    return {
        "us_per_effect": elapsed / n * 1e6,
        "cpu_us_per_effect": cpu / n * 1e6,
        "effects_per_s": n / elapsed,
        "confirmed": confirmed - WARMUP,
        "n": n,
        "warmup": WARMUP,
    }


def _without_sql() -> None:
    """Replace the store's write transaction by one that runs no SQL and reports every write as
    committed: what is left is the ledger's Python alone (the raw limit the SQL is measured
    against). This tree's store only (``Store._write_batch``)."""
    from effect_ledger.sdk.store.sqlite import Store

    Store._write_batch = lambda self, ops: [1 for _ in ops]  # type: ignore[method-assign]


#: Seconds per write, by part (``_timed_parts``); ``intent_on_loop`` holds 1.0 or 0.0 per intent.
PARTS: dict[str, list[float]] = {"intent_txn": [], "intent_on_loop": [], "hop": [], "outcome_commit": []}


def _timed_parts() -> None:
    """Time each write's parts that are not the ledger's Python (this tree's store only): the
    intent's transaction with its fsync (on the loop's thread while the disk is fast, else on the
    store's), the hop to the store's thread and back when there was one (from the submission to
    the thread's start, and from its end to the caller's resumption), and the outcome's commit (no
    fsync, on the loop's thread)."""
    from effect_ledger.sdk.store.sqlite import Store, _Write

    waiting, transact, write_batch = Store._waiting, Store._transact, Store._write_batch
    ran: list[tuple[float, float]] = []

    def timed_waiting(self: Any, fn: Any, arg: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return waiting(self, fn, arg)
        finally:
            ran.append((t0, time.perf_counter()))

    async def timed_transact(self: Any, fn: Any, arg: Any, inline: bool) -> Any:
        ran.clear()
        t0 = time.perf_counter()
        result = await transact(self, fn, arg, inline)
        if ran:
            (t1, t2), t3 = ran[-1], time.perf_counter()
            PARTS["hop"].append((t1 - t0) + (t3 - t2))
        return result

    def timed_write_batch(self: Any, ops: Any) -> Any:
        durable = any(isinstance(op, _Write) and op.durable for op in ops)
        t0 = time.perf_counter()
        try:
            return write_batch(self, ops)
        finally:
            took = time.perf_counter() - t0
            if durable:
                PARTS["intent_txn"].append(took)
                PARTS["intent_on_loop"].append(float(threading.current_thread() is threading.main_thread()))
            else:
                PARTS["outcome_commit"].append(took)

    Store._waiting = timed_waiting  # type: ignore[method-assign]
    Store._transact = timed_transact  # type: ignore[method-assign]
    Store._write_batch = timed_write_batch  # type: ignore[method-assign]


async def main(mode: str, durability: str, n: int, path: str, snapshot: str | None = None) -> dict[str, Any]:
    ledger = await Ledger.open(path, durability=durability, targets=[Target("payments")])
    run = uuid.uuid4().hex

    async def one(i: int) -> None:
        await ledger.execute(
            target="payments", operation="refund.create", run_id=run, step=f"refund-{i}", request=REQUEST, call=_call
        )

    try:
        for i in range(WARMUP):
            await one(-1 - i)
        for samples in PARTS.values():
            samples.clear()
        c0 = time.process_time()
        t0 = time.perf_counter()
        if mode == "sequential":
            for i in range(n):
                await one(i)
        else:
            per = max(1, n // CONCURRENCY)

            async def worker(w: int) -> None:
                for j in range(per):
                    await one(w * per + j)

            await asyncio.gather(*(worker(w) for w in range(CONCURRENCY)))
            n = per * CONCURRENCY
        elapsed = time.perf_counter() - t0
        cpu = time.process_time() - c0
        if snapshot:
            shutil.copyfile(path, snapshot)
            shutil.copyfile(path + "-wal", snapshot + "-wal")
    finally:
        await ledger.close()
    confirmed = n + WARMUP if NO_SQL else _confirmed(path)  # nothing written with no SQL: nothing to count
    parts = {f"{k}_us": statistics.median(v) * 1e6 for k, v in PARTS.items() if v and k != "intent_on_loop"}
    if PARTS["intent_on_loop"]:
        parts["intent_on_loop_share"] = statistics.fmean(PARTS["intent_on_loop"])
    return {**({"parts": parts} if parts else {}), **_result(elapsed, cpu, n, confirmed)}


NO_SQL = False

if __name__ == "__main__":
    mode, durability, n, path = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    if "--no-sql" in sys.argv[5:]:
        NO_SQL = True
        _without_sql()
    if "--parts" in sys.argv[5:]:
        _timed_parts()
    snapshot = next((a.split("=", 1)[1] for a in sys.argv[5:] if a.startswith("--snapshot=")), None)
    if mode.startswith("sync"):
        print(json.dumps(sync_main(mode, durability, n, path)))
    else:
        print(json.dumps(asyncio.run(main(mode, durability, n, path, snapshot))))

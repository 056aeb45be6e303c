"""sdk_overhead_embedded: what ``Ledger.execute`` adds around an in-process async call, on a SQLite
file on the working disk.

Per repetition and durability (fresh files each time):

* sequential: N executes one after the other; overhead = (time of the executes - time of the same
  N bare calls) / N. Raw limit: N bare one-row INSERT+COMMIT transactions through aiosqlite (WAL,
  same ``synchronous``, one thread hop each: autocommit), and plain ``sqlite3`` for reference.
* concurrent: 64 tasks share the ledger; effects/s. Raw limit: the same 64 tasks doing one-row
  INSERT+COMMIT through one aiosqlite connection (commits/s).

A counting pass before the timed runs records how many thread hops and commits one execute costs
(at NORMAL none: the store writes on the event loop's thread; at FULL one per intent, for its fsync).
"""

from __future__ import annotations

import asyncio
import sqlite3
import statistics
import time
import uuid
from pathlib import Path
from typing import Any

import aiosqlite

from effect_ledger.core.reconcile import Target
from effect_ledger.sdk.ledger import Ledger
from tests.bench.common import BenchResult, Context, Metric, disk_info, fmt, percentile

CONCURRENCY = 64
TARGETS = {  # from the issue
    ("sequential", "NORMAL"): 150.0,  # us of overhead per effect, at most
    ("sequential", "FULL"): 500.0,
    ("concurrent", "NORMAL"): 10_000.0,  # effects/s, at least
    ("concurrent", "FULL"): 2_000.0,
}
REQUEST = {"order": "123", "amount": 4800, "currency": "CNY"}
BODY = b"\xc3\x01" + b"x" * 290  # about an encoded Intent


async def _call(key: str) -> dict[str, Any]:
    return {"id": "re_" + key[-12:]}


async def _execute(ledger: Ledger, run: str, i: int) -> None:
    await ledger.execute(
        target="payments", operation="refund.create", run_id=run, step=f"refund-{i}", request=REQUEST, call=_call
    )


async def _bare_calls(n: int) -> float:
    t = time.perf_counter()
    for i in range(n):
        await _call(f"payments:{i:032x}")
    return time.perf_counter() - t


async def _count_pass(path: Path, durability: str, n: int = 50) -> dict[str, float]:
    """Thread hops and SQLite commits per execute (not timed): hops by wrapping the store's
    thread, commits with SQLite's statement trace on its writer."""
    ledger = await Ledger.open(str(path), durability=durability, targets=[Target("payments")])
    store = ledger.store
    hops = commits = 0
    pool = store._thread
    orig = pool.submit

    def counting(fn: Any, /, *args: Any, **kwargs: Any) -> Any:
        nonlocal hops
        hops += 1
        return orig(fn, *args, **kwargs)

    def trace(sql: str) -> None:
        nonlocal commits
        if sql.lstrip().upper().startswith(("COMMIT", "END")):
            commits += 1

    store._conn.set_trace_callback(trace)
    pool.submit = counting  # type: ignore[method-assign]
    try:
        run_id = uuid.uuid4().hex
        for i in range(n):
            await _execute(ledger, run_id, i)
    finally:
        pool.submit = orig  # type: ignore[method-assign]
        store._conn.set_trace_callback(None)
        await ledger.close()
    return {"thread_hops_per_effect": hops / n, "commits_per_effect": commits / n}


async def _sdk_sequential(path: Path, durability: str, n: int) -> tuple[float, list[float], float]:
    """Returns (overhead us/effect, per-execute latencies in us, event-loop thread CPU us/effect)."""
    ledger = await Ledger.open(str(path), durability=durability, targets=[Target("payments")])
    try:
        warm = uuid.uuid4().hex
        for i in range(min(100, n)):
            await _execute(ledger, warm, i)
        run = uuid.uuid4().hex
        lat: list[float] = []
        pc = time.perf_counter
        cpu0 = time.thread_time()
        t0 = pc()
        for i in range(n):
            t = pc()
            await _execute(ledger, run, i)
            lat.append((pc() - t) * 1e6)
        elapsed = pc() - t0
        cpu = time.thread_time() - cpu0
    finally:
        await ledger.close()
    bare = await _bare_calls(n)
    return (elapsed - bare) / n * 1e6, lat, cpu / n * 1e6


async def _sdk_concurrent(path: Path, durability: str, n: int) -> tuple[float, float]:
    """Returns (effects/s, event-loop thread CPU us/effect)."""
    ledger = await Ledger.open(str(path), durability=durability, targets=[Target("payments")])
    try:
        warm = uuid.uuid4().hex
        await asyncio.gather(*(_execute(ledger, warm, i) for i in range(CONCURRENCY)))
        run = uuid.uuid4().hex
        per_task = max(1, n // CONCURRENCY)

        async def worker(w: int) -> None:
            for j in range(per_task):
                await _execute(ledger, run, w * per_task + j)

        cpu0 = time.thread_time()
        t0 = time.perf_counter()
        await asyncio.gather(*(worker(w) for w in range(CONCURRENCY)))
        elapsed = time.perf_counter() - t0
        cpu = time.thread_time() - cpu0
    finally:
        await ledger.close()
    done = per_task * CONCURRENCY
    return done / elapsed, cpu / done * 1e6


async def _open_raw(path: Path, durability: str) -> aiosqlite.Connection:
    db = await aiosqlite.connect(str(path), isolation_level=None)
    await db.execute("PRAGMA journal_mode=WAL")
    await db.execute(f"PRAGMA synchronous={durability}")
    await db.execute("CREATE TABLE IF NOT EXISTS t (id INTEGER PRIMARY KEY, k TEXT NOT NULL, body BLOB NOT NULL)")
    return db


_INSERT = "INSERT INTO t (k, body) VALUES (?, ?)"


async def _raw_aiosqlite(path: Path, durability: str, n: int, concurrency: int = 1) -> float:
    """Seconds per bare one-row INSERT+COMMIT (autocommit: one thread hop) through aiosqlite;
    with ``concurrency`` tasks sharing the connection."""
    db = await _open_raw(path, durability)
    try:
        for i in range(20):
            await db.execute(_INSERT, (f"warm{i}", BODY))
        per_task = max(1, n // concurrency)

        async def worker(w: int) -> None:
            for j in range(per_task):
                await db.execute(_INSERT, (f"k{w}-{j}", BODY))

        t0 = time.perf_counter()
        if concurrency == 1:
            await worker(0)
        else:
            await asyncio.gather(*(worker(w) for w in range(concurrency)))
        return (time.perf_counter() - t0) / (per_task * concurrency)
    finally:
        await db.close()


def _raw_sqlite3(path: Path, durability: str, n: int) -> float:
    c = sqlite3.connect(str(path), isolation_level=None)
    try:
        c.execute("PRAGMA journal_mode=WAL")
        c.execute(f"PRAGMA synchronous={durability}")
        c.execute("CREATE TABLE IF NOT EXISTS t (id INTEGER PRIMARY KEY, k TEXT NOT NULL, body BLOB NOT NULL)")
        t0 = time.perf_counter()
        for i in range(n):
            c.execute(_INSERT, (f"k{i}", BODY))
        return (time.perf_counter() - t0) / n
    finally:
        c.close()


def run(ctx: Context) -> BenchResult:
    wd = ctx.workdir("sdk")
    n_seq = {"NORMAL": ctx.size(2000, 300), "FULL": ctx.size(2000, 200)}
    n_conc = {"NORMAL": ctx.size(6400, 1280), "FULL": ctx.size(1920, 320)}
    res = BenchResult("sdk_overhead_embedded", "ran", info={"disk": disk_info(wd), "concurrency": CONCURRENCY})
    files = iter(range(1_000_000))

    def f(tag: str) -> Path:
        return wd / f"{tag}-{next(files)}.db"

    async def main() -> None:
        counts = {d: await _count_pass(f(f"count-{d}"), d) for d in ("NORMAL", "FULL")}
        res.info["per_execute"] = counts
        ctx.progress(f"sdk: one execute = {counts['NORMAL']['thread_hops_per_effect']:g} thread hops, "
                     f"{counts['NORMAL']['commits_per_effect']:g} commits")  # fmt: skip
        for d in ("NORMAL", "FULL"):
            seq = Metric(f"sequential overhead {d}", "us/effect", [], higher_is_better=False,
                         target=TARGETS[("sequential", d)],
                         raw_what="1 bare INSERT+COMMIT via aiosqlite (1 hop), us")  # fmt: skip
            conc = Metric(f"{CONCURRENCY} concurrent {d}", "effects/s", [], higher_is_better=True,
                          target=TARGETS[("concurrent", d)],
                          raw_what=f"bare INSERT+COMMIT/s via aiosqlite, {CONCURRENCY} tasks")  # fmt: skip
            lat_all: list[float] = []
            ref: list[float] = []
            cpu_seq: list[float] = []
            cpu_conc: list[float] = []
            for rep in range(ctx.reps):
                n = n_seq[d]
                raw = await _raw_aiosqlite(f("raw"), d, n) * 1e6
                over, lat, cpu = await _sdk_sequential(f("sdk"), d, n)
                cpu_seq.append(cpu)
                ref.append(_raw_sqlite3(f("ref"), d, n) * 1e6)
                seq.runs.append(over)
                seq.raw_limit_runs.append(raw)
                lat_all.extend(lat)
                nc = n_conc[d]
                raw_c = 1 / await _raw_aiosqlite(f("rawc"), d, nc, CONCURRENCY)
                thr, cpu = await _sdk_concurrent(f("sdkc"), d, nc)
                cpu_conc.append(cpu)
                conc.runs.append(thr)
                conc.raw_limit_runs.append(raw_c)
                ctx.progress(
                    f"sdk {d} rep {rep + 1}/{ctx.reps}: sequential {fmt(over)} us/effect (raw commit {fmt(raw)} us, "
                    f"sqlite3 {fmt(ref[-1])} us; loop CPU {fmt(cpu_seq[-1])} us); {CONCURRENCY} concurrent "
                    f"{fmt(thr)} effects/s (raw {fmt(raw_c)}/s; loop CPU {fmt(cpu_conc[-1])} us/effect)"
                )
            seq.percentiles = {"p50_execute_us": percentile(lat_all, 50), "p99_execute_us": percentile(lat_all, 99)}
            seq.extra = {
                "effects": n_seq[d],
                "raw_sqlite3_us": statistics.median(ref),
                "raw_sqlite3_runs": ref,
                **counts[d],
                "event_loop_cpu_us_per_effect": statistics.median(cpu_seq),
            }
            conc.extra = {
                "effects": n_conc[d],
                "concurrency": CONCURRENCY,
                "raw_sqlite3_sequential_per_s": 1e6 / seq.extra["raw_sqlite3_us"],
                "event_loop_cpu_us_per_effect": statistics.median(cpu_conc),
            }
            res.metrics += [seq, conc]

    asyncio.run(main())
    return res

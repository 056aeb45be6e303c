"""relay_throughput: ``Relay(store, cfg).drain()`` of an outbox of N events to a fresh topic set.

The outbox is filled once, through the ledger's own store connection (one bulk transaction of
encoded Intent/Executed/Receipt rows; timed separately, not the benchmark). Each repetition marks
every row unsent again and drains it to a fresh topic set. Raw limit, in the same repetition: a bare
confluent-kafka Producer with the relay's settings (``effect_ledger.sdk.kafka.relay.producer_config``) sending the
same keys, values and headers to another fresh topic set (no per-record delivery callback; the
record count on the topic is checked afterwards), then ``flush()``. The two alternate which goes
first. Both producers are warmed with one record to the prefix's dlq topic before the clock starts:
a new idempotent producer waits ~0.5 s for its producer id on this broker (reported as
``producer_ready_s``), which would swamp a 20,000-event run.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from typing import Any

from effect_ledger.sdk.kafka.relay import Relay
from effect_ledger.sdk.store.sqlite import Durability, Store
from effect_ledger.streams.codec import HEADER
from tests.bench.common import (
    BenchResult,
    Context,
    EventFactory,
    Headers,
    Metric,
    Watermarks,
    bare_producer,
    fmt,
    produce_all,
    warm_producer,
)

TARGET_EVENTS_PER_S = 50_000.0
TARGET_RATIO = 0.5

_INSERT = "INSERT INTO events (event_id, effect_id, kind, at_ms, body, sent) VALUES (?, ?, ?, ?, ?, 0)"


def _bulk_insert(store: Store, rows: list[tuple[str, str, str, int, bytes]]) -> None:
    conn: sqlite3.Connection = store._conn
    conn.execute("BEGIN IMMEDIATE")
    conn.executemany(_INSERT, rows)
    conn.execute("COMMIT")


def _reset(store: Store) -> None:
    conn: sqlite3.Connection = store._conn
    conn.execute("BEGIN IMMEDIATE")
    conn.execute("UPDATE events SET sent = 0")
    conn.execute("COMMIT")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")


async def _on_writer(store: Store, fn: Any, *args: Any) -> None:
    """``fn(store, *args)`` on the store's writer thread, where its connection lives."""
    await asyncio.get_running_loop().run_in_executor(store._thread, fn, store, *args)


def run(ctx: Context) -> BenchResult:
    n = ctx.size(200_000, 20_000)
    n -= n % 3
    wd = ctx.workdir("relay")
    factory = EventFactory()
    factory.check()
    m = Metric(
        "outbox drained to Kafka", "events/s", [], higher_is_better=True, target=TARGET_EVENTS_PER_S,
        ratio_target=TARGET_RATIO, raw_what="bare Producer, same bytes and settings, produce+flush, events/s",
    )  # fmt: skip
    info: dict[str, Any] = {"events": n}

    async def main() -> None:
        store = await Store.open(wd / "outbox.db", Durability.NORMAL)
        try:
            rows = [
                (f"{kind}-{i}", key.decode(), kind, 1_700_000_000_000 + i, value)
                for i in range(n // 3)
                for key, value, kind, _ in factory.bodies(i)
            ]
            t = time.perf_counter()
            await _on_writer(store, _bulk_insert, rows)
            fill = time.perf_counter() - t
            info["fill_s"] = round(fill, 2)
            info["fill_events_per_s"] = round(n / fill)
            info["mean_body_bytes"] = round(sum(len(r[4]) for r in rows) / len(rows), 1)
            ctx.progress(f"relay: outbox filled with {n} events in {fill:.2f} s ({fmt(n / fill)} events/s)")
            # What the relay reads is what the raw producer sends.
            unsent = await store.unsent(n)
            raw_records: list[tuple[bytes, bytes, Headers | None]] = [
                (eid.encode(), body, [(HEADER, f"effect_ledger.{kind}".encode())]) for _, eid, kind, body in unsent
            ]
            del rows, unsent
            for rep in range(ctx.reps):
                order = ("raw", "relay") if rep % 2 == 0 else ("relay", "raw")
                got: dict[str, float] = {}
                cfgs = {which: ctx.kafka(f"relay-{which}") for which in order}
                await _on_writer(store, _reset)
                for which in order:
                    cfg = cfgs[which]
                    if which == "raw":
                        p = bare_producer(cfg)
                        info.setdefault("producer_ready_s", []).append(round(warm_producer(p, cfg.topics.dlq), 3))
                        t = time.perf_counter()
                        sent = produce_all(p, cfg.topics.events, raw_records, reports=False)
                        got["raw"] = sent / (time.perf_counter() - t)
                    else:
                        relay = Relay(store, cfg)
                        producer = getattr(relay, "_producer", None)  # private: warmed like the raw one
                        if producer is not None:
                            warm_producer(producer, cfg.topics.dlq)
                        t = time.perf_counter()
                        sent = await relay.drain()
                        got["relay"] = sent / (time.perf_counter() - t)
                        await relay.stop()
                        info.setdefault("relay_batches", []).append(relay.stats.batches)
                    if sent != n:
                        raise RuntimeError(f"{which}: sent {sent} of {n} events")
                    wm = Watermarks(cfg, cfg.topics.events)
                    try:
                        on_topic = wm.total()
                    finally:
                        wm.close()
                    if on_topic != n:
                        raise RuntimeError(f"{which}: {on_topic} of {n} events on the topic")
                    ctx.drop(cfg)
                m.runs.append(got["relay"])
                m.raw_limit_runs.append(got["raw"])
                ctx.progress(
                    f"relay rep {rep + 1}/{ctx.reps}: {fmt(got['relay'])} events/s, raw producer {fmt(got['raw'])} "
                    f"events/s (ratio {got['relay'] / got['raw']:.2f})"
                )
        finally:
            await store.close()

    asyncio.run(main())
    return BenchResult("relay_throughput", "ran", [m], info=info)

"""claims: how long an agent that may race waits for the processor's verdict, and how long a lookup
takes (issue 11, item 1).

One processor on a fresh topic set; one agent in this process: ``Ledger.open(kafka=..., sync=True,
lookup=...)``, executing fresh keys one after another with a call that does nothing.

* claim round trip: from the moment the ledger starts waiting for Kafka to acknowledge its intent
  until ``claims.settle`` has the verdict (the intent's produce, the processor's fold of its offset,
  the HTTP answer, the copy into the file). At idle, and under a background load of complete
  effects written by a bare producer (``BACKGROUND_EFFECTS_PER_S``, 3 events each; env
  ``EFFECTS_BENCH_CLAIMS_LOAD``).
* lookup at idle: ``ProcessorLookup.events(key)`` of a known key (the agent reads the partition's
  high watermarks, the processor answers once folded through them).
* lookup without offsets at idle: a plain ``GET /effects/{key}`` (``effects lookup``, any HTTP
  client): the worker asks the broker for the high watermarks itself.

Raw limit, interleaved with the samples in the same run: a bare produce + consume round trip (a
confluent-kafka Producer with acks=all sends one record, a Consumer assigned to its partition
receives it): what any answer that has to pass through Kafka costs at least.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import Callable
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition

from effect_ledger.core.reconcile import Target
from effect_ledger.errors import LedgerUnavailable
from effect_ledger.sdk.kafka import claims
from effect_ledger.sdk.kafka.relay import Relay
from effect_ledger.sdk.ledger import Ledger
from effect_ledger.streams.config import KafkaConfig
from tests.bench.common import BenchResult, Context, Metric, fmt, percentile
from tests.bench.detection import Background
from tests.bench.processor import start_processor

TARGET_P99_MS = 100.0
# 150 events/s by default: well within one worker's fold rate, even on a busy machine.
BACKGROUND_EFFECTS_PER_S = int(os.environ.get("EFFECTS_BENCH_CLAIMS_LOAD", "50"))
MAX_LAGGING = 5  # a phase stops after this many answers refused as lagging (each waits the 5 s bound)


class RawRoundTrip:
    """One record produced (acks=all) and consumed back: the floor of any answer through Kafka."""

    def __init__(self, cfg: KafkaConfig) -> None:
        self.topic = cfg.topics.dlq  # a topic of the fresh set nobody else writes during the run
        self.producer = Producer(cfg.confluent(**{"acks": "all", "linger.ms": 0}))
        self.consumer = Consumer(cfg.confluent(**{
            "group.id": f"bench-raw-{uuid.uuid4().hex[:6]}", "enable.auto.commit": False,
            "fetch.wait.max.ms": 100, "fetch.min.bytes": 1,
        }))  # fmt: skip
        _low, high = self.consumer.get_watermark_offsets(TopicPartition(self.topic, 0), 10, False)
        self.consumer.assign([TopicPartition(self.topic, 0, high)])
        self.once()  # connections and metadata before the clock starts

    def once(self) -> float:
        """Milliseconds from produce to the record in the consumer's hands."""
        marker = uuid.uuid4().bytes
        t0 = time.perf_counter()
        self.producer.produce(self.topic, value=marker, partition=0)
        self.producer.flush(10)
        end = t0 + 10
        while time.perf_counter() < end:
            msg = self.consumer.poll(0.5)
            if msg is not None and msg.error() is None and msg.value() == marker:
                return (time.perf_counter() - t0) * 1000
        raise TimeoutError("the raw round trip did not come back in 10 s")

    def close(self) -> None:
        self.consumer.close()
        self.producer.flush(5)


class ClaimTimer:
    """Times each claim round trip of the ledger (sequential executes): from the start of the sync
    wait to the end of ``claims.settle``, by wrapping both for the run."""

    def __init__(self) -> None:
        self.samples: list[float] = []
        self.acked: list[float] = []  # of which: until Kafka acknowledged the intent
        self._t0 = 0.0
        self._wait = Relay.wait_acked
        self._settle = claims.settle

    def __enter__(self) -> ClaimTimer:
        wait, settle = self._wait, self._settle

        async def timed_wait(relay: Relay, seq: int, timeout: float) -> bool:
            self._t0 = time.perf_counter()
            try:
                return await wait(relay, seq, timeout)
            finally:
                self.acked.append((time.perf_counter() - self._t0) * 1000)

        async def timed_settle(*a: Any, **kw: Any) -> Any:
            r = await settle(*a, **kw)
            self.samples.append((time.perf_counter() - self._t0) * 1000)
            return r

        Relay.wait_acked = timed_wait  # type: ignore[method-assign]
        claims.settle = timed_settle
        return self

    def __exit__(self, *exc: object) -> None:
        Relay.wait_acked = self._wait  # type: ignore[method-assign]
        claims.settle = self._settle


def _metric(name: str, samples: list[float], raw: list[float], pct: float) -> Metric:
    """A latency metric whose figure is the ``pct`` percentile of ``samples``, beside the same
    percentile of the raw round trips measured interleaved with them."""
    label = f"p{int(pct * 100)}"
    return Metric(
        f"{name} {label}", "ms", [percentile(samples, pct * 100)], higher_is_better=False,
        target=TARGET_P99_MS if pct >= 0.99 and "load" not in name else None,
        raw_limit=percentile(raw, pct * 100), raw_what=f"bare produce (acks=all) + consume round trip, {label}",
        percentiles={"p50": percentile(samples, 50), "p99": percentile(samples, 99), "max": max(samples)},
        extra={"samples": len(samples), "raw_p50": percentile(raw, 50), "raw_p99": percentile(raw, 99)},
    )  # fmt: skip


def run(ctx: Context) -> BenchResult:
    n = ctx.size(300, 80)
    cfg = ctx.kafka("claims")
    wd = ctx.workdir("claims")
    proc = start_processor(ctx, cfg, wd, "claims")
    proc.wait_ready()
    raw = RawRoundTrip(cfg)
    ctx.on_cleanup(raw.close)
    out: dict[str, tuple[list[float], list[float]]] = {}
    info: dict[str, Any] = {"samples_per_phase": n, "background_events_per_effect": 3}
    keys: list[str] = []
    acks: list[float] = []

    async def phase(ledger: Ledger, name: str, step: Callable[[int], Any]) -> None:
        acks.clear()
        mine: list[float] = []
        floor: list[float] = []
        lagging = 0
        for i in range(n):
            try:
                mine.append(await step(i))
            except LedgerUnavailable:  # the processor did not fold the offset within its bound (5 s)
                lagging += 1
                if lagging >= MAX_LAGGING:
                    break
            floor.append(await asyncio.to_thread(raw.once))
        out[name] = (mine, floor)
        info[f"{name}: answers refused as lagging"] = lagging
        ctx.progress(
            f"{name}: p50 {fmt(percentile(mine, 50))} ms, p99 {fmt(percentile(mine, 99))} ms ({lagging} lagging); "
            f"raw produce+consume p50 {fmt(percentile(floor, 50))} ms, p99 {fmt(percentile(floor, 99))} ms"
            + (f"; of which Kafka's ack of the intent p50 {fmt(percentile(acks, 50))} ms, "
               f"p99 {fmt(percentile(acks, 99))} ms" if acks else "")
        )  # fmt: skip
        if acks:
            info[f"{name}: intent acknowledged p50/p99 ms"] = [percentile(acks, 50), percentile(acks, 99)]

    async def main() -> None:
        async with await Ledger.open(
            str(wd / "agent.db"), targets=[Target("payments")], kafka=cfg, sync=True, lookup=proc.url
        ) as ledger:

            async def claim(i: int) -> float:
                key = f"claim-{uuid.uuid4().hex}"
                keys.append(key)
                with ClaimTimer() as timer:
                    c = await ledger.execute(
                        target="payments", operation="refund.create", key=key, request={"i": i},
                        call=lambda k: {"id": f"re-{k}"},
                    )  # fmt: skip
                assert c.called and len(timer.samples) == 1
                acks.append(timer.acked[0])
                return timer.samples[0]

            async def lookup(i: int) -> float:
                assert ledger._lookup is not None
                t = time.perf_counter()
                events = await ledger._lookup.events(keys[i % len(keys)])
                assert events
                return (time.perf_counter() - t) * 1000

            async def plain_lookup(i: int) -> float:
                # What `effects lookup` and any HTTP client without offsets does: the worker asks the
                # broker for the partition's high watermarks and answers once folded through them.
                t = time.perf_counter()
                status, body = await asyncio.to_thread(proc.lookup, keys[i % len(keys)])
                assert status == 200 and body["known"], (status, body)
                return (time.perf_counter() - t) * 1000

            for _ in range(5):  # warm: the first answers open connections
                await claim(-1)
            await phase(ledger, "claim round trip, idle", claim)
            await phase(ledger, "lookup, idle", lookup)
            await phase(ledger, "lookup without offsets (HTTP), idle", plain_lookup)
            bg = Background(cfg, BACKGROUND_EFFECTS_PER_S)
            bg.start()
            try:
                await asyncio.sleep(2)  # the load reaches the processor before the first sample
                await phase(ledger, f"claim round trip, {BACKGROUND_EFFECTS_PER_S} effects/s load", claim)
            finally:
                bg.stop.set()
                bg.join(30)
            if bg.error is not None:
                raise RuntimeError(f"background load failed: {bg.error}")
            info["background_effects_per_s_achieved"] = round(bg.effects / bg.elapsed, 1) if bg.elapsed else None

    asyncio.run(main())
    metrics = []
    for name, (mine, floor) in out.items():
        if mine:
            metrics.append(_metric(name, mine, floor, 0.5))
            metrics.append(_metric(name, mine, floor, 0.99))
    return BenchResult("claims", "ran", metrics, info=info)

"""Reconciliation consumers: a consumer group on ``effects.uncertain``.

For each uncertain effect: ask the target's reconciler, judge the answer
(``effect_ledger.streams.reconcile.judge``: found -> CONFIRMED, absent -> ABSENT, unknown -> retried with
backoff by the processor, then ESCALATED), and write the resolution to ``effects.events``.

Order of durable writes, per batch: produce every resolution, wait for their delivery reports,
then commit the consumed offsets. A crash in between asks the destination again and writes the
same resolution again (its event id is deterministic): harmless. Instances share the partitions,
so reconciliation scales with ``effects.uncertain``'s partition count.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from confluent_kafka import Consumer, KafkaError, Message, Producer, TopicPartition

from effect_ledger.streams.codec import DecodeError, default_codec
from effect_ledger.streams.config import KafkaConfig
from effect_ledger.streams.model import DeadLetter, Resolution, UncertainEffect
from effect_ledger.streams.reconcile import Answer, Target, Unknown, judge, only_the_agent_can_ask, view_of_uncertain
from effect_ledger.streams.relay import producer_config

log = logging.getLogger("effect_ledger.reconcilers")


@dataclass
class ServiceStats:
    consumed: int = 0
    resolutions: dict[str, int] = field(default_factory=dict)
    skipped: int = 0
    dead_letters: int = 0


class ReconcileService:
    def __init__(
        self,
        cfg: KafkaConfig,
        targets: Mapping[str, Target],
        *,
        group: str = "effect-ledger-reconcilers",
        batch: int = 100,
        concurrency: int = 32,
    ) -> None:
        self.cfg = cfg
        self.targets = dict(targets)
        self.codec = default_codec()
        self.stats = ServiceStats()
        self.batch = batch
        self._sem = asyncio.Semaphore(concurrency)
        self._consumer = Consumer(
            cfg.confluent(
                **{
                    "group.id": f"{cfg.prefix}{group}",
                    "enable.auto.commit": False,
                    "auto.offset.reset": "earliest",
                    "partition.assignment.strategy": "cooperative-sticky",
                }
            )
        )
        self._producer = Producer(producer_config(cfg, **{"message.timeout.ms": 30_000}))
        self._consumer.subscribe([cfg.topics.uncertain])

    async def run(self, stop: asyncio.Event | None = None) -> None:
        stop = stop or asyncio.Event()
        try:
            while not stop.is_set():
                await self.run_once(timeout=0.5)
        finally:
            await asyncio.to_thread(self._consumer.close)

    async def run_once(self, timeout: float = 0.5) -> int:
        """Consume one batch, reconcile it, write the resolutions, commit. Returns how many
        records were handled."""
        msgs: list[Message] = await asyncio.to_thread(self._consumer.consume, self.batch, timeout)
        msgs = [m for m in msgs if not _partition_eof(m)]
        if not msgs:
            return 0
        results = await asyncio.gather(*(self._one(m) for m in msgs))
        failures: list[str] = []

        def report(err: KafkaError | None, _msg: object) -> None:
            if err is not None:
                failures.append(str(err))

        for m, out in zip(msgs, results, strict=True):
            if out is None:
                continue
            topic, record = out
            self._producer.produce(
                topic,
                key=m.key(),
                value=self.codec.encode(record),
                headers=[self.codec.header(record)],
                on_delivery=report,
            )
        remaining = await asyncio.to_thread(self._producer.flush, 30.0)
        if remaining or failures:
            # Not committing: the batch is consumed again and asked again after a restart.
            raise RuntimeError(f"resolutions not acknowledged ({remaining} pending, errors: {failures[:3]})")
        offsets: dict[tuple[str, int], int] = {}
        for m in msgs:
            k = (str(m.topic()), int(m.partition() or 0))
            offsets[k] = max(offsets.get(k, -1), int(m.offset() or 0) + 1)
        await asyncio.to_thread(
            self._consumer.commit,
            offsets=[TopicPartition(t, p, o) for (t, p), o in offsets.items()],
            asynchronous=False,
        )
        self.stats.consumed += len(msgs)
        return len(msgs)

    async def _one(self, m: Message) -> tuple[str, Resolution | DeadLetter] | None:
        try:
            u = self.codec.decode(m.value())
            if not isinstance(u, UncertainEffect):
                raise DecodeError(f"{type(u).__name__} on the uncertain topic")
        except DecodeError as e:
            self.stats.dead_letters += 1
            dl = DeadLetter(
                _now(),
                "reconcilers",
                str(m.topic()),
                int(m.partition() or 0),
                int(m.offset() or 0),
                str(e),
                m.key(),
                m.value(),
            )
            return self.cfg.topics.dlq, dl
        declared = self.targets.get(u.target)
        target = declared or Target(u.target or "unknown")
        v = view_of_uncertain(u)
        answer: Answer | None
        name = "none"
        if declared is None:
            # Asked again after a backoff (time to fix the declaration), then escalated.
            name = "undeclared"
            answer = Unknown(f"target {u.target!r} is not declared in the reconcilers' targets; nobody was asked")
        elif target.reconciler is not None:
            name = target.reconciler.name
            async with self._sem:
                try:
                    answer = await asyncio.wait_for(target.reconciler.check(v), 30)
                except Exception as e:  # a failing reconciler is an unknown answer
                    answer = Unknown(f"{type(e).__name__}: {e}")
        elif only_the_agent_can_ask(v, target, _now()):
            self.stats.skipped += 1
            return None
        else:
            answer = None
        resolution = judge(v, target, answer, name, _now())
        self.stats.resolutions[resolution.verdict.value] = self.stats.resolutions.get(resolution.verdict.value, 0) + 1
        log.info("%s attempt %d: %s (%s)", u.effect_id, u.attempt, resolution.verdict.value, resolution.reason)
        return self.cfg.topics.events, resolution


def _partition_eof(m: Message) -> bool:
    """True for records that are not records: end-of-partition notices and transient errors (a
    topic not created yet, a broker restarting), which the consumer recovers from by itself."""
    err = m.error()
    if err is None:
        return False
    if err.code() == KafkaError._PARTITION_EOF:
        return True
    if err.fatal():
        raise RuntimeError(f"consumer error: {err}")
    log.warning("consumer: %s", err)
    return True


def _now() -> int:
    return time.time_ns() // 1_000_000

"""Reconciliation consumers: a consumer group on ``effects.uncertain``.

For each uncertain effect: ask the target's reconciler, under the target's timeout, and judge the
answer (``effect_ledger.targets.ask.ask`` and ``core.reconcile.judge``: found -> CONFIRMED, absent -> ABSENT,
unknown -> asked again after the target's backoff, re-published by the processor, then ESCALATED),
and write the resolution to ``effects.events``.

Order of durable writes, per batch: produce every resolution, wait for their delivery reports,
(for a record that cannot be written, a bounded dead letter in its place, and wait for those), then
commit the consumed offsets. A crash in between asks the destination again and writes the
same resolution again (its event id is deterministic): harmless. Instances share the partitions,
so reconciliation scales with ``effects.uncertain``'s partition count.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition

from effect_ledger.core.model import DeadLetter, Resolution, UncertainEffect, Verdict
from effect_ledger.core.reconcile import Target, judge, only_the_agent_can_ask, target_for, view_of_uncertain
from effect_ledger.errors import DecodeError, EncodeError, NotAuthorized
from effect_ledger.metrics import logs, tracing
from effect_ledger.metrics.logs import DEFAULT_SUMMARY_S, Summary
from effect_ledger.sdk.kafka.relay import producer_config
from effect_ledger.streams.acl import RECONCILER_GROUP
from effect_ledger.streams.admin import refused_by_acls
from effect_ledger.streams.config import KafkaConfig, operator_identity
from effect_ledger.streams.dlq import dead_letter
from effect_ledger.streams.log_clock import LogClock, log_time_of
from effect_ledger.streams.schema_topic import kafka_codec
from effect_ledger.targets.ask import ask

log = logging.getLogger("effect_ledger.reconcilers")

#: The largest record the service writes: librdkafka's default ``message.max.bytes``. Anything
#: larger would be refused by the producer; it is dead-lettered instead, before it is produced.
MAX_RECORD_BYTES = 1_000_000
# Delivery errors that belong to one record, not to the broker: producing it again cannot help.
_RECORD_ERRORS = frozenset(
    {KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.RECORD_LIST_TOO_LARGE, KafkaError.INVALID_RECORD, KafkaError.INVALID_MSG}
)
_Out = tuple[str, bytes | None, Resolution | DeadLetter]  # (topic, key, record)
#: How long the group waits for a silent instance (killed, frozen, cut off) before its partitions go
#: to the others: the workers' 10 s, not librdkafka's 45 s. Heartbeats come from librdkafka's own
#: thread, so a long batch of asks does not count against it (that is ``max.poll.interval.ms``).
SESSION_TIMEOUT_MS = 10_000
#: The pause after a batch the broker failed, doubled each time it fails again, up to the maximum.
_FIRST_BACKOFF_S = 0.5
MAX_BACKOFF_S = 10.0


def _forbidden(e: BaseException) -> str | None:
    """The right Kafka's ACLs refused, when ``e`` is such a refusal."""
    err = e.args[0] if isinstance(e, KafkaException) and e.args else None
    if err is None or not refused_by_acls(err):
        return None
    return f"{err.name()}: {err.str()}"


@dataclass
class ServiceStats:
    consumed: int = 0
    resolutions: dict[str, int] = field(default_factory=dict)
    skipped: int = 0
    dead_letters: int = 0
    retries: int = 0  # batches the broker failed, consumed again


class ReconcileService:
    def __init__(
        self,
        cfg: KafkaConfig,
        targets: Mapping[str, Target],
        *,
        group: str = RECONCILER_GROUP,
        batch: int = 100,
        concurrency: int = 32,
        metrics: Any = None,
        summary_s: float = DEFAULT_SUMMARY_S,
    ) -> None:
        self.cfg = cfg
        self.group = f"{cfg.prefix}{group}"
        # What the service says (effect_ledger.metrics.logs): a line per rebalance and per verdict,
        # a summary of its counts every ``summary_s`` seconds.
        self.summary = Summary(log, summary_s)
        self.metrics = metrics  # a LedgerMetrics, or None
        self.targets = dict(targets)
        self.codec = kafka_codec(cfg, writes=True)  # publishes its schemas, learns newer ones
        self.stats = ServiceStats()
        self.batch = batch
        self.max_record_bytes = MAX_RECORD_BYTES
        self._sem = asyncio.Semaphore(concurrency)
        # "Now" for every judgement: the log's time, from each work item's append time plus this
        # process's monotonic clock since (streams/log_clock.py), never this host's wall clock: a
        # reconciler whose clock runs ahead must not skip the wait for a call that may still land.
        self.log_clock = LogClock(_now)
        self._consumer = Consumer(
            cfg.confluent(
                **{
                    "group.id": f"{cfg.prefix}{group}",
                    "enable.auto.commit": False,
                    "auto.offset.reset": "earliest",
                    "partition.assignment.strategy": "cooperative-sticky",
                    "session.timeout.ms": SESSION_TIMEOUT_MS,
                    "heartbeat.interval.ms": SESSION_TIMEOUT_MS // 5,
                }
            )
        )
        self._producer = Producer(producer_config(cfg, **{"message.timeout.ms": 30_000}))
        self._consumer.subscribe([cfg.topics.uncertain], on_assign=self._assigned, on_revoke=self._revoked)

    def _assigned(self, _consumer: Any, tps: list[TopicPartition]) -> None:
        self._say("partitions_assigned", "assigned", tps)

    def _revoked(self, _consumer: Any, tps: list[TopicPartition]) -> None:
        self._say("partitions_revoked", "revoked", tps)

    def _say(self, name: str, verb: str, tps: list[TopicPartition]) -> None:
        parts = sorted(tp.partition for tp in tps)
        topic = self.cfg.topics.uncertain
        self.summary.count(name.replace("partitions_", "rebalances_"))
        said = f"partitions {verb}: {parts or 'none'} of {topic}"
        logs.event(log, name, said, topic=topic, partitions=parts, group=self.group)

    async def run(self, stop: asyncio.Event | None = None) -> None:
        """Reconcile until ``stop``. A batch the broker fails (its coordinator died, a leader moved,
        the cluster is away) is rewound and consumed again after a pause that grows to
        ``MAX_BACKOFF_S``: the service heals by itself when the cluster does. Only a refusal of
        Kafka's ACLs stops it (``NotAuthorized``: asking again cannot help)."""
        stop = stop or asyncio.Event()
        backoff = _FIRST_BACKOFF_S
        try:
            while not stop.is_set():
                try:
                    await self.run_once(timeout=0.5)
                    backoff = _FIRST_BACKOFF_S
                except (KafkaException, RuntimeError) as e:
                    forbidden = _forbidden(e)
                    if forbidden is not None:
                        raise NotAuthorized("effects reconcile", operator_identity(self.cfg), [forbidden]) from e
                    self.stats.retries += 1
                    log.warning("a batch failed (%s); consuming it again in %.1f s", e, backoff)
                    try:
                        await asyncio.wait_for(stop.wait(), backoff)
                    except TimeoutError:
                        pass
                    backoff = min(MAX_BACKOFF_S, backoff * 2)
                    continue
                if self.metrics is not None:  # after an empty poll too: a lag that drained reads 0
                    await asyncio.to_thread(self._record_lag)
                self.summary.tick()
        finally:
            self.summary.emit()
            await asyncio.to_thread(self._consumer.close)

    async def run_once(self, timeout: float = 0.5) -> int:
        """Consume one batch, reconcile it, write the resolutions, commit. Returns how many
        records were handled.

        One bad record never stops the batch: a record that cannot be decoded or reconciled, or
        whose resolution Kafka refuses for the record itself (too large, invalid), is replaced by a
        bounded dead letter, and the offsets move past it. Only errors of the broker (unreachable,
        timed out) leave the batch uncommitted, to be consumed again."""
        msgs: list[Message] = await asyncio.to_thread(self._consumer.consume, self.batch, timeout)
        msgs = [m for m in msgs if not _partition_eof(m)]
        if not msgs:
            return 0
        for m in msgs:
            log_ms = log_time_of(*m.timestamp())
            if log_ms is not None:
                self.log_clock.observe(log_ms)
        try:
            return await self._handle(msgs)
        except BaseException:
            # Not committed: consume the batch again (the consumer's position moved past it).
            await asyncio.to_thread(self._rewind, msgs)
            raise

    def _rewind(self, msgs: list[Message]) -> None:
        """Seek each partition of ``msgs`` back to the batch's first offset in it. A partition no
        longer assigned is left alone: its next owner starts at the committed offset."""
        first: dict[tuple[str, int], int] = {}
        for m in msgs:
            k = (str(m.topic()), int(m.partition() or 0))
            first[k] = min(first.get(k, int(m.offset() or 0)), int(m.offset() or 0))
        for (topic, partition), offset in first.items():
            try:
                self._consumer.seek(TopicPartition(topic, partition, offset))
            except KafkaException as e:
                log.info("not rewinding %s[%d] to %d: %s", topic, partition, offset, e)

    async def _handle(self, msgs: list[Message]) -> int:
        results = await asyncio.gather(*(self._one(m) for m in msgs))
        items = [(m, out) for m, out in zip(msgs, results, strict=True) if out is not None]
        refused = await asyncio.to_thread(self._produce, [out for _, out in items])
        if refused:
            # Second round: a dead letter (bounded, so it always fits) in place of each refused record.
            letters = []
            for i, why in refused:
                m, (_, _, record) = items[i]
                self._count_dead_letter()
                kind = type(record).__name__
                log.warning("%s of %s[%s]@%s refused: %s", kind, m.topic(), m.partition(), m.offset(), why)
                letters.append(self._dead_letter(m, f"cannot write the {kind} for this record: {why}"))
            if await asyncio.to_thread(self._produce, letters):
                raise RuntimeError("dead letters refused by Kafka: not committing")
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
        self.summary.count("uncertain_consumed", len(msgs))
        return len(msgs)

    def _record_lag(self) -> None:
        """Lag per assigned partition from the watermarks the consumer already holds (no round trip)."""
        assigned = self._consumer.assignment()
        for tp in self._consumer.position(assigned) if assigned else []:
            try:
                _low, high = self._consumer.get_watermark_offsets(tp, cached=True)
            except KafkaException:
                continue
            if high < 0 or tp.offset < 0:
                continue
            self.metrics.consumer_lag.labels(topic=tp.topic, partition=str(tp.partition)).set(max(0, high - tp.offset))

    def _produce(self, items: list[_Out]) -> list[tuple[int, str]]:
        """Produce every item and wait for the delivery reports (in a worker thread). Returns the
        items refused for what they are, with the reason; raises on any other error (nothing is
        committed then)."""
        refused: list[tuple[int, str]] = []
        failures: list[str] = []
        denied: list[KafkaError] = []  # Kafka's ACLs: not a failure that asking again can fix

        def reporter(i: int) -> Any:
            def report(err: KafkaError | None, msg: Any) -> None:
                if err is None:  # a fresh append: the log's time now (its work items may be a backlog)
                    log_ms = log_time_of(*msg.timestamp())
                    if log_ms is not None:
                        self.log_clock.observe(log_ms)
                    return
                if err.code() in _RECORD_ERRORS:
                    refused.append((i, f"Kafka refused it: {err.str()}"))
                elif refused_by_acls(err):
                    denied.append(err)
                else:
                    failures.append(str(err))

            return report

        for i, (topic, key, record) in enumerate(items):
            try:
                value = self.codec.encode(record)
            except EncodeError as e:
                refused.append((i, str(e)))
                continue
            size = len(value) + len(key or b"")
            if size > self.max_record_bytes:
                refused.append((i, f"{size:,} bytes, more than the {self.max_record_bytes:,} a record may have"))
                continue
            while True:
                try:
                    self._producer.produce(
                        topic, key=key, value=value, headers=[self.codec.header(record)], on_delivery=reporter(i)
                    )
                    break
                except BufferError:
                    self._producer.poll(0.05)
                except KafkaException as e:
                    if e.args[0].code() not in _RECORD_ERRORS:
                        raise
                    refused.append((i, f"Kafka refused it: {e.args[0].str()}"))
                    break
        remaining = self._producer.flush(30.0)
        if denied:
            raise KafkaException(denied[0])
        if remaining or failures:
            # Not committing: the batch is consumed again and asked again after a restart.
            raise RuntimeError(f"records not acknowledged ({remaining} pending, errors: {failures[:3]})")
        return refused

    def _count_dead_letter(self) -> None:
        self.stats.dead_letters += 1
        if self.metrics is not None:
            self.metrics.dead_letters.inc()

    def _dead_letter(self, m: Message, reason: str) -> _Out:
        where = (str(m.topic()), int(m.partition() or 0), int(m.offset() or 0))
        dl, key = dead_letter(_now(), "reconcilers", *where, reason, m.key(), m.value())
        return self.cfg.topics.dlq, key, dl

    async def _one(self, m: Message) -> _Out | None:
        """The record to write for one uncertain effect: its resolution, or a dead letter when the
        record is not one (or reconciling it failed for a reason asking again cannot fix)."""
        try:
            u = self.codec.decode(m.value())
        except DecodeError as e:
            self._count_dead_letter()
            return self._dead_letter(m, str(e))
        if not isinstance(u, UncertainEffect):
            self._count_dead_letter()
            why = f"{type(u).__name__} on the uncertain topic: only UncertainEffect belongs there"
            return self._dead_letter(m, why)
        try:
            resolution = await self._resolve(u)
        except Exception as e:  # a bug or a poisoned record: never a reason to stop the partition
            log.exception("cannot reconcile %s[%s]@%s", m.topic(), m.partition(), m.offset())
            self._count_dead_letter()
            return self._dead_letter(m, f"cannot reconcile: {type(e).__name__}: {e}")
        if resolution is None:
            return None
        return self.cfg.topics.events, u.effect_id.encode(), resolution

    async def _resolve(self, u: UncertainEffect) -> Resolution | None:
        """Ask about one uncertain effect and judge the answer (``effect_ledger.core.reconcile``:
        the same target rule, ask and judge as the SDK and the embedded runner). None: only the
        agent can ask this destination, so nothing is written."""
        target, declared = target_for(self.targets, u.target)
        v = view_of_uncertain(u)
        now = self.log_clock.now
        if declared and only_the_agent_can_ask(v, target, now()):
            self.stats.skipped += 1
            return None
        with tracing.effect_span("reconcile", u.effect_id, u.target, u.operation, u.attempt) as span:
            async with self._sem:
                # An "absent" is what the destination said when it was asked: judged at that time, not
                # when the answer came back (a slow answer must not carry an early ask past the window).
                asked = now()
                answer, name = await ask(v, target, asked, declared=declared)
            resolution = judge(v, target, answer, name, asked)
            if span is not None:
                span.span.set_attribute("effect_ledger.verdict", resolution.verdict.value)
                span.end_state(_STATE_AFTER.get(resolution.verdict, "UNCERTAIN"))
        self.stats.resolutions[resolution.verdict.value] = self.stats.resolutions.get(resolution.verdict.value, 0) + 1
        if self.metrics is not None:
            self.metrics.resolutions.labels(verdict=resolution.verdict.value).inc()
        verdict = resolution.verdict.value
        self.summary.count(f"verdicts_{verdict}")
        fields = {"effect_id": u.effect_id, "target": u.target, "attempt": u.attempt, "verdict": verdict}
        if resolution.verdict is Verdict.ESCALATE:
            log.warning(
                "effect %s ESCALATED to a person: %s", u.effect_id, resolution.reason[:500],
                extra={"event": "escalated", **fields, "reason": resolution.reason[:500]},
            )  # fmt: skip
        else:
            logs.event(
                log, "verdict", f"effect {u.effect_id} attempt {u.attempt}: {verdict} ({resolution.reason[:500]})",
                **fields, reason=resolution.reason[:500],
            )  # fmt: skip
        return resolution


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
    if err.code() in _COORDINATOR_STARTING:
        # The group's coordinator is being elected or loaded (a broker just started, a new group):
        # librdkafka retries by itself, and it is normal at every start. Not a warning.
        log.info("consumer: %s (normal while the group coordinator starts; retried)", err)
    else:
        log.warning("consumer: %s", err)
    return True


# The state a verdict leads the effect to, once the worker folds it (for the reconcile span).
_STATE_AFTER = {Verdict.FOUND: "CONFIRMED", Verdict.ABSENT: "ABSENT", Verdict.ESCALATE: "ESCALATED"}

_COORDINATOR_STARTING = frozenset(
    {KafkaError.COORDINATOR_NOT_AVAILABLE, KafkaError.NOT_COORDINATOR, KafkaError.COORDINATOR_LOAD_IN_PROGRESS}
)


def _now() -> int:
    return time.time_ns() // 1_000_000

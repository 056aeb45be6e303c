"""The ledger processor: folds ``effects.events`` and ``effects.decisions`` (people's decisions, on a
topic of their own so that Kafka ACLs can keep it to operators; co-partitioned with the events)
into a table of effects (faust-streaming).

Per event, in this order (at-least-once: faust commits source offsets periodically, so after a
crash the events since the last commit are delivered again; the fold ignores what it has seen, and
a replayed event re-sends its table record and state, in case the crash came before they were
delivered):

1. decode; a record that cannot be decoded, that does not belong on its topic (anything but an
   Intent, Executed, Receipt, Resolution or Timeout on ``effects.events``; anything but a Decision
   on ``effects.decisions``), or whose key is not its effect_id, goes to ``effects.dlq`` with the
   reason (a bounded copy), and processing continues;
2. fold it into the effect (``effect_ledger.streams.effect.apply``) and write the table (RocksDB, changelog
   topic co-partitioned with ``effects.events``);
3. publish the new state to ``effects.state`` (compacted) and, when the effect has just become
   uncertain, an ``UncertainEffect`` to ``effects.uncertain``.

Deadlines: a timer scans an in-memory index of *this worker's* open effects (rebuilt from the table
after every rebalance, skipped while the table recovers) and sends a Timeout command through
``effects.events``, so the change happens inside the stream like any other event. Uncertain
effects whose reconciler answered "unknown" are re-published to ``effects.uncertain`` when their
backoff has passed, so a restarted reconciler loses no work.

Claims: folding the first intent of an attempt (in the partition's order), the fold records a
``Claimed`` verdict naming it, in the same table write (``effect.claim_verdict``); any later intent
of that attempt is a lost claim. The verdict is never sent to a topic (nor accepted from one):
lookups hand it to agents, and a fold of the same partition from scratch records the same.

Lookup: ``GET /effects/{key}`` is routed to the worker that owns the key's partition and answers
only once the table has consumed that partition (of both source topics) up to the offsets the
request names (``partition``, ``offset``, ``decisions_offset``: an agent names its own intent's
offset to learn the verdict on its claim, or the high watermarks it read), or else up to the high
watermarks seen when the request arrived (read-your-writes); after ``lookup_bound_s`` it answers 503
"lagging". It hands out only events (an SDK copies them into its own ledger), and every answer
names the ``effect_id`` it is about. The view listens on ``web_host`` only; bound beyond loopback it
needs a token (``web_token``), and with a token every lookup must carry it
(``Authorization: Bearer``), else 401. faust's own pages (``/router``, ``/table``, statistics) are
not served: they show the table's keys and the cluster's layout to whoever asks.
"""

from __future__ import annotations

import asyncio
import base64
import bisect
import hmac
import logging
import struct
import time
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import faust
from faust.types import TP
from faust.web import Request, Response, View

from effect_ledger.processors import retirement
from effect_ledger.streams import codec as codec_mod
from effect_ledger.streams.config import KafkaConfig, is_loopback
from effect_ledger.streams.dlq import dead_letter as bounded_dead_letter
from effect_ledger.streams.effect import Effect, apply, claim_verdict, expire, to_state, uncertain_event
from effect_ledger.streams.errors import ConfigError
from effect_ledger.streams.keyurl import key_url
from effect_ledger.streams.lookup import TOKEN_ENV, FoldedThrough, folded_through_asked
from effect_ledger.streams.model import IN_FLIGHT_STATES, Executed, Retirement, State, Timeout, is_event, misplaced
from effect_ledger.streams.partition import partition_for
from effect_ledger.streams.reconcile import Target, next_check_ms, target_for, target_name
from effect_ledger.streams.schema_topic import kafka_codec

log = logging.getLogger("effect_ledger.processor")

# Table value: a small header (read without decoding the events, when the index is rebuilt), then
# the effect's events, each length-prefixed in Avro single-object encoding.
_HEADER = struct.Struct(">Bq")  # format version, due_ms (-1: nothing due)
_LEN = struct.Struct(">I")
_FORMAT = 1


def append_packed(previous: bytes | None, encoded_event: bytes, due_ms: int | None) -> bytes:
    """The table value after one more event: the previous events' bytes untouched (the fold does
    not depend on their order), the new event's bytes as they came from the topic, a new header."""
    header = _HEADER.pack(_FORMAT, -1 if due_ms is None else due_ms)
    body = previous[_HEADER.size :] if previous is not None else b""
    return b"".join((header, body, _LEN.pack(len(encoded_event)), encoded_event))


def unpack_due(value: bytes) -> int | None:
    _, due = _HEADER.unpack_from(value)
    return None if due < 0 else int(due)


def encoded_events(value: bytes) -> list[bytes]:
    """The events of a table value, each as its Avro single-object bytes."""
    out = []
    pos = _HEADER.size
    while pos < len(value):
        (n,) = _LEN.unpack_from(value, pos)
        pos += _LEN.size
        out.append(value[pos : pos + n])
        pos += n
    return out


def unpack(value: bytes, decode: Any) -> Effect | None:
    effect: Effect | None = None
    for body in encoded_events(value):
        ev = decode(body)
        if is_event(ev):  # a table written before non-events were refused may hold one
            effect, _ = apply(effect, ev)
    return effect


def event_bodies(value: bytes, decode: Any) -> list[bytes]:
    """The bodies of a table value that are events: what a lookup may hand to an SDK, which copies
    them into its own ledger."""
    out = []
    for body in encoded_events(value):
        try:
            if is_event(decode(body)):
                out.append(body)
        except codec_mod.DecodeError:
            out.append(body)  # not ours to judge here: the SDK refuses an answer it cannot decode
    return out


def due_of(effect: Effect, targets: Mapping[str, Target], first_check_ms: int) -> int | None:
    """When the timer must next look at this effect: the deadline of an open attempt, or the time to
    ask the reconcilers again about an uncertain one, by its target's backoff
    (``effect_ledger.streams.reconcile.next_check_ms``, the embedded runner's rule too); an effect
    nobody answered about yet, ``first_check_ms`` after it became uncertain."""
    if effect.state in IN_FLIGHT_STATES:
        return effect.deadline_ms
    if effect.state is State.UNCERTAIN:
        target, _ = target_for(targets, target_name(effect))
        due = next_check_ms(effect, target, effect.updated_ms)
        return due if due is not None else effect.updated_ms + first_check_ms
    return None


@dataclass
class ProcessorSettings:
    kafka: KafkaConfig = field(default_factory=KafkaConfig.from_env)
    app_id: str = "effect-ledger"
    data_dir: Path = Path("./effect-ledger-data")
    store: str = "rocksdb://"
    web_host: str = "127.0.0.1"  # the address the lookup view listens on
    web_port: int = 6066
    web_token: str | None = None  # required by lookups when set; needed when web_host is not loopback
    advertised_url: str | None = None  # how other workers reach this one's view (default: host:port)
    timer_interval_s: float = 0.25
    grace_ms: int = 1000
    lookup_bound_s: float = 5.0
    # The declared targets (``effects worker --targets``): each one's backoff spaces the checks of
    # its uncertain effects; a target not declared here gets the default backoff.
    targets: Mapping[str, Target] = field(default_factory=dict)
    first_check_ms: int = 60_000  # re-publish an uncertain effect nobody has answered for this long

    @property
    def full_app_id(self) -> str:
        return f"{self.kafka.prefix}{self.app_id}"

    def check_web(self) -> None:
        """Refuse a lookup view reachable beyond this machine without a token: it answers every
        event of an effect, request bodies included."""
        if not is_loopback(self.web_host) and not self.web_token:
            raise ConfigError(
                f"the lookup view would listen on {self.web_host}, beyond loopback, without a token: "
                f"set --web-token or {TOKEN_ENV}, or listen on 127.0.0.1"
            )


class LedgerProcessor:
    """Builds and holds the faust app. ``app`` is what ``faust.Worker`` runs."""

    def __init__(self, settings: ProcessorSettings, metrics: Any = None) -> None:
        settings.check_web()
        self.s = settings
        self.metrics = metrics  # a LedgerMetrics (effect_ledger.streams.metrics), or None
        self.codec = kafka_codec(settings.kafka, writes=True)  # publishes its schemas, learns newer ones
        k = settings.kafka
        topics = k.topics
        self.app = faust.App(
            settings.full_app_id,
            broker=[f"kafka://{b.strip()}" for b in k.bootstrap.split(",")],
            broker_credentials=faust_credentials(k),
            store=settings.store,
            datadir=str(settings.data_dir),
            topic_partitions=k.partitions,
            topic_replication_factor=k.replication,
            processing_guarantee="at_least_once",
            consumer_auto_offset_reset="earliest",
            web_host=settings.web_host,
            web_bind=settings.web_host,  # faust binds 0.0.0.0 unless told; web_host only names it
            web_port=settings.web_port,
            # faust's own pages list the table's keys and the cluster's layout: not served.
            web_router_enabled=False,
            web_tables_enabled=False,
            web_graph_enabled=False,
            web_stats_enabled=False,
            web_metrics_enabled=False,
            canonical_url=settings.advertised_url or f"http://{settings.web_host}:{settings.web_port}",
            web_in_thread=False,
            table_standby_replicas=0,
            stream_wait_empty=False,
            producer_acks=-1,
        )
        raw: dict[str, Any] = {
            "key_type": bytes,
            "value_type": bytes,
            "key_serializer": "raw",
            "value_serializer": "raw",
        }
        self.events = self.app.topic(topics.events, partitions=k.partitions, **raw)
        self.decisions = self.app.topic(topics.decisions, partitions=k.partitions, **raw)
        # The fold's source: both topics in one agent, so faust assigns their partitions together
        # (co-partitioned: same count, same keys) and one table holds every fact of a key.
        self.sources = self.app.topic(topics.events, topics.decisions, partitions=k.partitions, **raw)
        self.state_topic = self.app.topic(topics.state, partitions=k.partitions, **raw)
        self.uncertain = self.app.topic(topics.uncertain, partitions=k.partitions, **raw)
        self.dlq = self.app.topic(topics.dlq, partitions=k.partitions, **raw)
        self.table = self.app.Table(
            "effects",
            default=None,
            partitions=k.partitions,
            key_type=str,
            value_type=bytes,  # the store picks the "raw" codec for bytes: our own encoding, untouched
            # RocksDB's defaults are per partition (a 64 MB write buffer x 3, a 2 GB block cache):
            # far more than a table of small values needs, and resident memory grows into them.
            options=(
                {
                    "driver": "rocksdict",
                    "write_buffer_size": 8 << 20,
                    "max_write_buffer_number": 2,
                    "block_cache_size": 64 << 20,
                    "block_cache_compressed_size": 16 << 20,
                }
                if settings.store.startswith("rocksdb")
                else None
            ),
        )
        # key -> (partition, due_ms, last_sent_ms): this worker's effects that need the timer.
        self.index: dict[str, tuple[int, int, int]] = {}
        self.processed: dict[int, int] = {}  # partition -> last offset of effects.events folded
        self.processed_decisions: dict[int, int] = {}  # the same for effects.decisions
        # partition -> (tick times, high watermarks then): where each partition stood at each tick
        self._hw_samples: dict[int, tuple[list[int], list[int]]] = {}
        self._indexed_assignment: frozenset[int] | None = None
        self._cache: dict[str, tuple[bytes, Effect]] = {}
        self._progress: asyncio.Event | None = None  # set (and replaced) when an event was folded
        self._register()

    # -- the fold --------------------------------------------------------------------------

    def _register(self) -> None:
        app = self.app

        @app.agent(self.sources, name="fold")
        async def fold(stream: Any) -> None:
            async for event in stream.events():
                await self.handle(event)

        def rewind_uncommitted(sender: Any, *args: Any, signal: Any, **kwargs: Any) -> Awaitable[None]:
            return self.rewind_uncommitted()

        # (mode's handler type names the signal's generic sender type, which a plain function here
        # cannot spell; faust calls it as receiver(sender, signal=...) and awaits what it returns.)
        app.on_rebalance_complete.connect(cast(Any, rewind_uncommitted))

        @app.timer(interval=self.s.timer_interval_s, name="deadlines")
        async def deadlines() -> None:
            await self.tick()

        processor = self

        @app.page("/effects/{key}")
        class EffectPage(View):
            async def get(self, request: Request, key: str) -> Response:
                if not processor.authorized(request):
                    return self.json({"error": "a lookup token is required (Authorization: Bearer)"}, status=401)
                # faust serves the web view before the worker owns partitions: until then nobody
                # can say whether the table is complete.
                if not processor.ready:
                    return self.json({"lagging": True, "reason": "the processor is starting"}, status=503)
                p = partition_for(key.encode(), processor.s.kafka.partitions)
                asked = folded_through_asked(request.query, p)
                if isinstance(asked, str):
                    return self.json({"effect_id": key, "error": asked}, status=400)
                if p in processor._assigned():
                    return await processor.lookup(self, key, asked)
                if request.query.get("owner-only"):
                    return self.json({"not_owner": True, "partition": p}, status=421)
                return await processor.forward(self, key, p, asked)

        @app.page("/health")
        class Health(View):
            async def get(self, request: Request) -> Response:
                return self.json(
                    {
                        "ready": processor.ready,
                        "in_recovery": bool(getattr(app, "in_recovery", True)),
                        "partitions": sorted(processor._indexed_assignment or ()),
                        "processed": processor.processed,
                        "open": len(processor.index),
                    }
                )

    async def rewind_uncommitted(self) -> None:
        """Put every source partition that has no committed offset back at its first record.

        faust sends ``on_rebalance_complete`` after table recovery, just before it seeks the
        stream partitions to their committed offsets. The consumer may already have fetched
        records of those partitions while recovery was running; faust drops them (the stream
        is paused) and seeks the partitions back, but only the ones with a committed offset
        (aiokafka's ``seek_to_committed`` skips a partition with none, or with 0). A worker
        killed before its first commit therefore came back past records it never folded: its
        restart skipped them for good (an intent never folded, a deadline never watched). The
        group's policy for a partition without a commit is "from the earliest record": say it
        with an explicit seek, which also drops whatever was fetched ahead."""
        consumer: Any = self.app.consumer  # faust's Consumer (ConsumerT does not declare the seeks)
        sources = {self.events.get_topic_name(), self.decisions.get_topic_name()}
        tps = [tp for tp in consumer.assignment() if tp.topic in sources]
        if not tps:
            return
        committed = await consumer.seek_to_committed()
        fresh = [tp for tp in tps if not committed.get(tp)]
        if not fresh:
            return
        earliest = await consumer.earliest_offsets(*fresh)
        await consumer.seek_wait({tp: int(earliest.get(tp) or 0) for tp in fresh})
        log.debug("no committed offset: reading from the first record on %s", sorted(str(tp) for tp in fresh))

    def authorized(self, request: Request) -> bool:
        """No token configured (loopback only, see ``check_web``), or the request carries it."""
        token = self.s.web_token
        if not token:
            return True
        given = request.headers.get("Authorization", "")
        return hmac.compare_digest(given.encode(), f"Bearer {token}".encode())

    @property
    def ready(self) -> bool:
        """Recovered and owning its partitions (the deadline index was built after the last
        rebalance)."""
        app = self.app
        return (
            self._indexed_assignment is not None
            and not getattr(app, "in_recovery", True)
            and not app.rebalancing
            and self._indexed_assignment == self._assigned()
        )

    async def handle(self, event: Any) -> None:
        msg = event.message
        from_decisions = msg.topic == self.decisions.get_topic_name()
        (self.processed_decisions if from_decisions else self.processed)[msg.partition] = msg.offset
        if self._progress is not None:
            # Lookups waiting for this offset run at this handler's first await, after the table write.
            self._progress.set()
            self._progress = None
        try:
            ev = self.codec.decode(event.value)
        except codec_mod.DecodeError as e:
            await self.dead_letter(msg, str(e))
            return
        if self.metrics is not None:
            self.metrics.events.labels(kind=type(ev).__name__).inc()
        if isinstance(ev, Retirement) and not from_decisions:
            await retirement.apply(self, msg, ev)  # a command to the table, not a fact (retention)
            return
        why = misplaced(ev, decisions_topic=from_decisions)
        if why is not None:
            # Folded, a state record or a reconcilers' work item would be taken for a fact about
            # the key and poison every later event of it; a DeadLetter has no key at all.
            await self.dead_letter(msg, why)
            return
        key = ev.effect_id
        if msg.key is not None and msg.key != key.encode():
            await self.dead_letter(msg, f"record key {msg.key!r} is not its effect_id {key!r}")
            return
        if from_decisions and msg.partition != partition_for(key.encode(), self.s.kafka.partitions):
            # The table keeps a key in its events partition: a decision elsewhere would be folded
            # into a copy of the effect that no lookup and no timer ever reads.
            await self.dead_letter(msg, f"decision for {key!r} on partition {msg.partition}, not the key's")
            return
        try:
            previous = self.table.get(key)
            if previous is not None and retirement.is_marker(previous):
                await self.dead_letter(msg, retirement.refusal(previous))  # a retired key stays retired
                return
            before = self._load(key, previous)
            after, emitted = apply(before, ev)
            # The first intent of an attempt in the partition's order owns it: record that verdict
            # now, as a fact in the same table write (a later intent of the attempt gets none).
            verdict = claim_verdict(after, ev) if after is not before else None
            if verdict is not None:
                after, more = apply(after, verdict)
                emitted += more
        except Exception as e:  # a record that cannot be applied must not stop the partition
            await self.dead_letter(msg, f"cannot apply: {type(e).__name__}: {e}")
            return
        if after is before:
            # Already folded — most often a replay after a crash, which may have come after the
            # table write but before its changelog record and the state were delivered. Both
            # writes are idempotent: write them again rather than risk them being lost.
            if previous is not None:
                self.table[key] = previous
                st = to_state(before)
                await self.state_topic.send(
                    key=key.encode(),
                    value=self.codec.encode(st, validate=False),
                    headers=[self.codec.header(st)],
                    partition=msg.partition,
                )
            return
        if self.metrics is not None:
            self._observe(before, after, ev)
        due = due_of(after, self.s.targets, self.s.first_check_ms)
        value = append_packed(previous, bytes(event.value), due)
        if verdict is not None:
            value = append_packed(value, self.codec.encode(verdict), due)
        self.table[key] = value
        self._cache[key] = (value, after)
        if len(self._cache) > 10_000:
            self._cache.pop(next(iter(self._cache)))
        if due is None:
            self.index.pop(key, None)
        else:
            self.index[key] = (msg.partition, due, 0)
        kb = key.encode()
        st = to_state(after)
        # The outputs are co-partitioned with effects.events (same key, same partition count):
        # naming the partition saves the producer a pure-Python murmur2 per record.
        part = msg.partition
        await self.state_topic.send(
            key=kb, value=self.codec.encode(st, validate=False), headers=[self.codec.header(st)], partition=part
        )
        for u in emitted:
            await self.uncertain.send(
                key=kb, value=self.codec.encode(u), headers=[self.codec.header(u)], partition=part
            )

    def _observe(self, before: Effect | None, after: Effect, ev: Any) -> None:
        """Counters for one folded change (the effect is decoded already: nothing is read)."""
        m = self.metrics
        target = after.intent.target if after.intent else ""
        was = before.state if before is not None else None
        if isinstance(ev, Executed):
            m.unrecorded_window.observe(max(0, ev.at_ms - ev.call_ended_ms) / 1000)
        if after.state is State.UNCERTAIN and was is not State.UNCERTAIN and isinstance(ev, Timeout):
            if before is not None and before.deadline_ms is not None:
                m.detection_latency.observe(max(0, int(time.time() * 1000) - before.deadline_ms) / 1000)
            m.uncertain.labels(target=target).inc()
        if after.state is State.ESCALATED and was is not State.ESCALATED:
            m.escalated.labels(target=target).inc()

    def _load(self, key: str, value: bytes | None = None) -> Effect | None:
        if value is None:
            value = self.table.get(key)
        if value is None:
            return None
        cached = self._cache.get(key)
        if cached is not None and cached[0] == value:
            return cached[1]
        return unpack(value, self.codec.decode)

    async def dead_letter(self, msg: Any, reason: str) -> None:
        log.warning("dead letter %s[%d]@%d: %s", msg.topic, msg.partition, msg.offset, reason[:500])
        dl, dlq_key = bounded_dead_letter(
            int(time.time() * 1000),
            self.s.full_app_id,
            msg.topic,
            msg.partition,
            msg.offset,
            reason,
            msg.key,
            msg.value,
        )
        await self.dlq.send(
            key=dlq_key, value=self.codec.encode(dl), headers=[self.codec.header(dl)], partition=msg.partition
        )
        if self.metrics is not None:
            self.metrics.dead_letters.inc()

    # -- deadlines -------------------------------------------------------------------------

    def _assigned(self) -> frozenset[int]:
        return frozenset(
            tp.partition for tp in self.app.consumer.assignment() if tp.topic == self.events.get_topic_name()
        )

    async def tick(self) -> None:
        if getattr(self.app, "in_recovery", False) or self.app.rebalancing:
            return  # the table is not complete yet: a deadline could fire on stale state
        assigned = self._assigned()
        if assigned != self._indexed_assignment:
            self._rebuild_index(assigned)
        # A deadline fires only once the partition is folded up to where it stood when the
        # deadline (plus grace) passed: an outcome produced before then must be seen first (a
        # timeout after it would change nothing in the fold, but be a false fact in the audit).
        topic = self.events.get_topic_name()
        tps = [TP(topic, p) for p in sorted(assigned)]
        now = int(time.time() * 1000)
        hws = await self._highwaters(tps)
        for tp in tps:
            samples = self._hw_samples.setdefault(tp.partition, ([], []))
            samples[0].append(now)
            samples[1].append(int(hws.get(tp) or 0))
            if len(samples[0]) > 2000:  # keep a few minutes of ticks
                del samples[0][:1000], samples[1][:1000]
        if self.metrics is not None:
            self._gauges(tps, hws, now)
        resend_after = 5000
        for key, (partition, due, sent) in list(self.index.items()):
            times, marks = self._hw_samples.get(partition, ([], []))
            i = bisect.bisect_left(times, due + self.s.grace_ms)
            if i == len(times) or self.folded_through(partition) < marks[i] - 1:
                continue  # not due yet, or events from before the deadline are still unfolded
            if due + self.s.grace_ms > now or (sent and now - sent < resend_after):
                continue
            effect = self._load(key)
            if effect is None:
                self.index.pop(key, None)
                continue
            kb = key.encode()
            if effect.state is State.UNCERTAIN:
                # Ask the reconcilers again; if nobody answers, again after first_check_ms.
                u = uncertain_event(effect)
                await self.uncertain.send(
                    key=kb, value=self.codec.encode(u), headers=[self.codec.header(u)], partition=partition
                )
                self.index[key] = (partition, now + self.s.first_check_ms, now)
            else:
                # A timeout command; sent again after resend_after if it was not folded by then.
                for t in expire(effect, now):
                    await self.events.send(
                        key=kb, value=self.codec.encode(t), headers=[self.codec.header(t)], partition=partition
                    )
                self.index[key] = (partition, due, now)

    def _gauges(self, tps: list[TP], hws: dict[TP, int], now: int) -> None:
        """Lag per partition from the high watermarks the timer fetched anyway; the open effects
        and the most overdue from the deadline index (no table read)."""
        m = self.metrics
        for tp in tps:
            lag = int(hws.get(tp) or 0) - self.folded_through(tp.partition) - 1
            m.consumer_lag.labels(topic=tp.topic, partition=str(tp.partition)).set(max(0, lag))
        m.open_effects.set(len(self.index))
        oldest = min((due for _p, due, _s in self.index.values()), default=None)
        m.oldest_overdue.set(max(0, now - oldest - self.s.grace_ms) / 1000 if oldest is not None else 0)

    async def _highwaters(self, tps: list[TP]) -> dict[TP, int]:
        """The high watermarks the consumer learnt from its last fetch responses (no round trip:
        a timer that asks the broker every 250 ms overlaps itself); asked only for a partition
        that has not been fetched yet."""
        out: dict[TP, int] = {}
        missing = []
        for tp in tps:
            try:
                hw = self.app.consumer.highwater(tp)
            except Exception:
                hw = None
            if hw is None or hw < 0:
                missing.append(tp)
            else:
                out[tp] = int(hw)
        if missing:
            out.update({tp: int(v or 0) for tp, v in (await self.app.consumer.highwaters(*missing)).items()})
        return out

    def _rebuild_index(self, assigned: frozenset[int]) -> None:
        n = self.s.kafka.partitions
        index = {}
        for key, value in self.table.items():
            due = unpack_due(value)
            if due is not None:
                p = partition_for(key.encode(), n)
                if p in assigned:
                    index[key] = (p, due, 0)
        self.index = index
        self._indexed_assignment = assigned
        # Everything before a partition's committed offset was folded before the commit (faust
        # commits after processing): count it as processed, or a partition with nothing new to
        # read would look lagging for ever, to lookups and to the deadline gate. (faust keeps the
        # offsets it sought to after the rebalance in Consumer._committed_offset.)
        for p in assigned:
            self.processed[p] = self.folded_through(p)
            self.processed_decisions[p] = self.folded_through(p, self.decisions.get_topic_name())
        log.info("deadline index rebuilt: %d open effects on partitions %s", len(index), sorted(assigned))

    def folded_through(self, partition: int, topic: str | None = None) -> int:
        """The last offset of ``effects.events[partition]`` (or of ``topic``: effects.decisions)
        known to be in the table: what this worker folded, or what the group committed (faust
        commits only after processing; it keeps the offsets in Consumer._committed_offset after
        seeking there on assignment)."""
        events = self.events.get_topic_name()
        topic = topic or events
        done = (self.processed if topic == events else self.processed_decisions).get(partition, -1)
        committed = getattr(self.app.consumer, "_committed_offset", {}).get(TP(topic, partition))
        return max(done, int(committed) - 1) if committed else done

    # -- lookup ----------------------------------------------------------------------------

    async def forward(self, view: View, key: str, partition: int, asked: FoldedThrough | None = None) -> Response:
        """Ask the other workers for a key this one does not own. The owner is found by asking:
        it is whoever owns the key's partition of effects.events (faust's own table routing goes
        by the changelog's assignment, which is not always the same worker)."""
        import aiohttp

        own = self.app.conf.canonical_url
        urls = {str(u) for u in getattr(self.app.assignor, "_tps_url", {}).values()} - {str(own)}
        timeout = aiohttp.ClientTimeout(total=self.s.lookup_bound_s + 5)
        # The workers of one app share the token (one setting for the cluster).
        headers = {"Authorization": f"Bearer {self.s.web_token}"} if self.s.web_token else {}
        async with aiohttp.ClientSession(timeout=timeout, headers=headers) as session:
            for url in sorted(urls):
                template = url.rstrip("/").replace("{", "{{").replace("}", "}}") + "/effects/{key}?owner-only=1"
                if asked is not None:
                    template += asked.query()
                try:
                    async with session.get(key_url(template, key), allow_redirects=False) as r:
                        if r.status == 421:
                            continue
                        return view.json(await r.json(content_type=None), status=r.status)
                except (aiohttp.ClientError, TimeoutError, ValueError):
                    continue
        return view.json(
            {"lagging": True, "partition": partition, "reason": "no worker owns the partition right now"}, status=503
        )

    async def lookup(self, view: View, key: str, asked: FoldedThrough | None = None) -> Response:
        """Answer once the key's partition is folded through the offsets the agent asked for (the
        offset of its own intent: a claim answer), or else through the high watermarks now."""
        p = partition_for(key.encode(), self.s.kafka.partitions)
        tp = TP(self.events.get_topic_name(), p)
        dtp = TP(self.decisions.get_topic_name(), p)  # a decision acknowledged before the request counts too
        if asked is not None:
            # The agent knows what it waits for: no broker round trip (which queues behind the
            # consumer's fetch long-poll, ~1 s).
            hw, dhw = asked.events + 1, asked.decisions + 1
        else:
            hws = await self.app.consumer.highwaters(tp, dtp)
            hw, dhw = int(hws.get(tp) or 0), int(hws.get(dtp) or 0)
        loop = asyncio.get_running_loop()
        give_up = loop.time() + self.s.lookup_bound_s
        while self.folded_through(p) < hw - 1 or self.folded_through(p, dtp.topic) < dhw - 1:
            if loop.time() >= give_up:
                return view.json(
                    {
                        "lagging": True,
                        "partition": p,
                        "high_watermark": hw,
                        "processed": self.folded_through(p),
                        "owned": p in self._assigned(),
                    },
                    status=503,
                )
            await self._folded_more(min(0.05, give_up - loop.time()))
        value = self.table.get(key)
        if value is None:
            return view.json({"effect_id": key, "known": False, "partition": p, "high_watermark": hw}, status=404)
        if retirement.is_marker(value):
            return view.json(retirement.lookup_answer(key, value), status=410)
        effect = self._load(key)
        assert effect is not None
        st = to_state(effect)
        return view.json(
            {
                "effect_id": key,
                "known": True,
                "state": st.state.value,
                "attempt": st.attempt,
                "version": st.version,
                "receipt_id": st.receipt_id,
                "events": [base64.b64encode(b).decode() for b in event_bodies(value, self.codec.decode)],
            }
        )


    async def _folded_more(self, timeout: float) -> None:
        """Wait until the fold has handled another event (or ``timeout`` s)."""
        if self._progress is None:
            self._progress = asyncio.Event()
        try:
            await asyncio.wait_for(self._progress.wait(), max(0.0, timeout))
        except TimeoutError:
            pass


def faust_credentials(k: KafkaConfig) -> Any:
    """The SASL/SSL settings of ``KafkaConfig`` as faust credentials (aiokafka transport), so the
    processor authenticates like the confluent-kafka clients do."""
    proto = (k.security_protocol or "PLAINTEXT").upper()
    if proto == "PLAINTEXT":
        return None
    ssl_context = None
    if proto in ("SSL", "SASL_SSL"):
        import ssl

        ssl_context = ssl.create_default_context(cafile=k.ssl_cafile)
    if proto.startswith("SASL"):
        return faust.SASLCredentials(
            username=k.sasl_username,
            password=k.sasl_password,
            mechanism=(k.sasl_mechanism or "PLAIN").upper(),
            ssl_context=ssl_context,
        )
    return faust.SSLCredentials(ssl_context)

"""The relay: pushes the SQLite outbox to ``effects.events`` (a person's decision, recorded with
``Ledger.decide``, to ``effects.decisions``: only principals its ACLs allow may write there).

Order of durable writes, per batch:

1. read the oldest unsent rows (``sent = 0``, in ``seq`` order);
2. produce them with an idempotent producer (``acks=all``, ``enable.idempotence``), keyed by
   effect_id, partitioned like Kafka's Java client (murmur2), headers naming the schema;
3. wait for every delivery report;
4. only then mark the delivered rows sent.

A batch is produced in a thread of the relay's own and settled before the next is produced, so a
key's events never pass one another on the topic (batches produced from several threads interleave
their rows, and a failed one would be sent again after later ones were delivered:
``tests/integration/test_relay.py`` caught it under load); a ``sync`` caller's intent is
acknowledged as soon as its own delivery report is in (``wait_acked``).

A crash between 3 and 4 sends those rows again on restart: at-least-once, and harmless, because
every event carries its ``event_id`` and the fold ignores one it has seen. While the broker is down
the producer retries without a deadline (``message.timeout.ms=0``) so per-key order survives an
outage; the SDK keeps writing to the outbox meanwhile, and the relay catches up when the broker
returns.

One row cannot block the others. A row Kafka refuses for good — over ``MAX_EVENT_BYTES`` (not
even produced), or refused by the producer or the broker as too large or invalid
(``PERMANENT``) — is dead-lettered, in this order: a ``DeadLetter`` (reason, bounded copy of the
value) is produced to ``effects.dlq`` and waited for (best effort: the outbox is the record), then
the row is marked ``sent = 2`` with its reason in ``dead_letters``. The relay goes on with the other
rows, in their order. Any other error fails the batch, which is retried as before.

A row Kafka's ACLs refuse (``refused_by_acls``: this principal may not write its topic, a person's
decision written with an agent's credential) is set aside the same way, with the missing right as
its reason: retrying cannot succeed until an administrator changes the ACLs, and it must not hold
back the rows behind it. Once the right is given, ``effects relay --db FILE --resend-refused``
puts such rows back in the outbox (``Store.resend_refused``): set aside is never lost. The relay
remembers the refusal (``forbidden``): while the events topic itself refuses this principal,
``execute`` refuses to call a destination (``NotAuthorized``), whatever the ``sync`` setting,
since nothing it records could ever reach Kafka.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, ConfigResource

from effect_ledger.core.limits import MAX_DEAD_LETTER_COPY_BYTES, MAX_EVENT_BYTES
from effect_ledger.core.model import DeadLetter
from effect_ledger.errors import LedgerError
from effect_ledger.sdk.store.sqlite import ACL_REFUSED, Store
from effect_ledger.streams.admin import refused_by_acls
from effect_ledger.streams.codec import HEADER, Codec
from effect_ledger.streams.config import KafkaConfig
from effect_ledger.streams.schema_topic import kafka_codec

log = logging.getLogger("effect_ledger.relay")

#: Errors that refuse one record for good, whatever is retried: it is dead-lettered, never retried.
PERMANENT = frozenset(
    {
        KafkaError.MSG_SIZE_TOO_LARGE,  # over the producer's or the broker's / topic's message size
        KafkaError.RECORD_LIST_TOO_LARGE,
        KafkaError.INVALID_MSG_SIZE,
        KafkaError.INVALID_RECORD,  # the broker's validation refused the record
    }
)


#: How long a produce request may wait for the broker (librdkafka's ``request.timeout.ms``).
_REQUEST_TIMEOUT_MS = 5000


def producer_config(cfg: KafkaConfig, **extra: Any) -> dict[str, Any]:
    """The producer settings every effect-ledger writer to ``effects.events`` uses."""
    return cfg.confluent(
        **{
            "enable.idempotence": True,
            "acks": "all",
            "partitioner": "murmur2_random",  # the partition Kafka's Java client and faust compute
            "linger.ms": 2,
            "message.timeout.ms": 0,  # retry until the broker is back: never reorder a key's events
            # A leader that stopped answering (paused, cut off) holds a request until the socket
            # times out (librdkafka's default: 60 s): give up on it sooner, so the retry goes to
            # the new leader the cluster elected meanwhile (a fenced broker: 4-9 s). The broker's
            # own wait for the in-sync replicas stays within it.
            "request.timeout.ms": _REQUEST_TIMEOUT_MS,
            "socket.timeout.ms": _REQUEST_TIMEOUT_MS + 1000,
            "socket.connection.setup.timeout.ms": _REQUEST_TIMEOUT_MS,
            "queue.buffering.max.messages": 1_000_000,
            **extra,
        }
    )


@dataclass
class RelayStats:
    sent: int = 0
    batches: int = 0
    errors: int = 0
    dead_letters: int = 0  # rows Kafka refused for good, dead-lettered by this relay


_MAX_OFFSETS = 10_000  # intents' offsets kept for claim waiters (they ask within a second)
_BATCH_OVERHEAD = 1024  # what a record batch adds to its records, with room to spare (Kafka: 61 bytes + per record)


@dataclass
class _Produced:
    """What became of a batch: the rows acknowledged, the rows refused for good (seq, reason), the
    rows the broker refused with their batch (seq, reason: maybe not their fault), and the first
    other error (the batch is then retried)."""

    acked: list[int]
    refused: list[tuple[int, str]]
    by_broker: list[tuple[int, str]]
    error: str | None


class Relay:
    """Runs as a task in the agent's event loop (``start``), or drains a file (``drain``)."""

    def __init__(
        self, store: Store, cfg: KafkaConfig, *, batch: int = 10_000, metrics: Any = None, **producer: Any
    ) -> None:
        self.store = store
        self.cfg = cfg
        self.topic = cfg.topics.events
        self.decisions_topic = cfg.topics.decisions
        self.batch = batch
        self.stats = RelayStats()
        self._producer_extra = producer
        self._max_message = MAX_EVENT_BYTES  # what the producer accepts; fitted to the topic's limit
        self._producer = self._new_producer()
        # Set by the first send: its schemas are published to effects.schemas (readers learn the
        # outbox's bytes from there) and, with a schema registry, registered; it frames each body.
        self._wire: Codec | None = None
        self._fitted = False  # the topic's limit was read (see _fit_topic_limit)
        self._next_fit = 0.0
        self._wake = asyncio.Event()
        self._stop = threading.Event()
        self._task: asyncio.Task[None] | None = None
        self._acked_through = 0  # every event with seq <= this is on Kafka, or dead-lettered
        self._dead: dict[int, str] = {}  # dead-lettered seqs above the watermark at start: why
        # The right Kafka's ACLs refused this relay, per topic ("Write on topic X"): set on a
        # refusal, cleared when a later write to that topic is acknowledged (the ACLs changed).
        self.forbidden: dict[str, str] = {}
        self._acked = asyncio.Condition()
        self._headers: dict[str, list[tuple[str, str | bytes | None]]] = {}
        self._appended_through = 0  # the newest seq this relay saw appended (or found at start)
        # seq -> (partition, offset) of the intents this relay delivered: an agent waits for the
        # processor to have folded its own intent's offset (a claim). The newest _MAX_OFFSETS only.
        self._offsets: dict[int, tuple[int, int] | None] = {}
        self._offsets_lock = threading.Lock()  # delivery reports add on the relay's thread; _advance prunes
        self._waiters = 0  # wait_acked calls waiting now: a delivered intent wakes them
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pool: ThreadPoolExecutor | None = None
        store.add_listener(self._appended)
        self.metrics = metrics  # a LedgerMetrics: the outbox depth is read at scrape time, free here
        if metrics is not None:
            metrics.outbox_depth.set_function(lambda: max(0, self._appended_through - self._acked_through))

    def _appended(self, seq: int) -> None:
        self._appended_through = max(self._appended_through, seq)
        self._wake.set()

    async def _init_watermark(self) -> None:
        """Advance the watermark to what the file says is on Kafka (or dead-lettered, by any relay
        of the file: those are remembered, so a sync waiter is not told they are on Kafka)."""
        rows = await self.store.query(
            "SELECT min(seq) AS lo, (SELECT max(seq) FROM events) AS hi FROM events WHERE sent = 0"
        )
        lo, hi = rows[0]["lo"], rows[0]["hi"]
        self._appended_through = max(self._appended_through, hi or 0)
        through = (lo - 1) if lo is not None else (hi or 0)
        if through > self._acked_through:
            dead = await self.store.query(
                "SELECT seq, reason FROM dead_letters WHERE seq > ? AND seq <= ?", (self._acked_through, through)
            )
            self._dead.update((r["seq"], r["reason"]) for r in dead)
        async with self._acked:
            if through > self._acked_through:
                self._acked_through = through
                self._acked.notify_all()

    def start(self) -> asyncio.Task[None]:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="effect-ledger-relay")
        return self._task

    async def _run(self) -> None:
        await self._init_watermark()
        try:  # early, so the first send does not wait for it; _send tries again if this failed
            await asyncio.to_thread(self._wire_codec)
        except LedgerError as e:
            log.warning("%s; retrying before the first send", e)
        backoff = 0.1
        while not self._stop.is_set():
            # Cleared before looking for rows, never after: a row appended while send_all looks
            # sets it again, instead of waiting for the next 0.5 s poll (a sync caller's intent).
            self._wake.clear()
            try:
                n = await self.send_all()
                backoff = 0.1
            except Exception:
                self.stats.errors += 1
                log.exception("relay batch failed; retrying in %.1f s", backoff)
                await asyncio.sleep(backoff)
                backoff = min(5.0, backoff * 2)
                continue
            if n == 0:
                try:
                    await asyncio.wait_for(self._wake.wait(), 0.5)
                except TimeoutError:
                    pass

    async def send_all(self, max_batches: int | None = None, progress: Callable[[int], None] | None = None) -> int:
        """Send unsent rows batch by batch until none are left (or ``max_batches``), one batch at a
        time (see the module docstring). Pipelined: the rows of batch N are marked sent (on the
        database's thread) while batch N+1 is produced (on the relay's thread); a batch is marked
        only after all its delivery reports came back, and its acknowledged rows are marked even
        when others of it failed (those are sent again)."""
        loop = self._loop = asyncio.get_running_loop()
        if self._pool is None:
            # A thread of its own: a batch never queues behind the loop's other threaded work.
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="effect-ledger-relay")
        total = 0
        batches = 0
        after = 0
        marking: asyncio.Future[None] | None = None
        try:
            while max_batches is None or batches < max_batches:
                rows = await self.store.unsent(self.batch, after)
                if not rows:
                    break
                producing = loop.run_in_executor(self._pool, self._send, rows)
                try:
                    if marking is not None:
                        await marking
                        marking = None
                finally:
                    # Nothing is left producing when this returns: a retry must not send rows
                    # twice at once.
                    produced = await producing
                if produced.refused and produced.error is None:
                    await self._dead_letter(rows, produced.refused)
                if produced.acked:
                    marking = asyncio.ensure_future(self.store.mark_sent(produced.acked))
                total += len(produced.acked)
                self.stats.sent += len(produced.acked)
                if produced.error is not None:
                    missing = len(rows) - len(produced.acked) - len(produced.refused)
                    raise RuntimeError(f"{missing} of {len(rows)} events not acknowledged: {produced.error}")
                after = rows[-1][0]
                batches += 1
                self.stats.batches += 1
                await self._advance(after)  # on Kafka: a sync waiter may go on
                if progress is not None:
                    progress(total)
        finally:
            if marking is not None:
                await marking
        if total == 0:
            # Another relay on the same file (a second agent, `effects relay --db`) may have sent
            # rows this one was waiting for: a row is marked sent only after some relay's ack.
            await self._init_watermark()
        return total

    async def _advance(self, through: int) -> None:
        with self._offsets_lock:
            if len(self._offsets) > _MAX_OFFSETS:
                for seq in list(itertools.islice(self._offsets, len(self._offsets) - _MAX_OFFSETS)):
                    del self._offsets[seq]
        async with self._acked:
            if through > self._acked_through:
                self._acked_through = through
                self._acked.notify_all()

    def _new_producer(self) -> Producer:
        fitted = {"message.max.bytes": self._max_message, "batch.size": self._max_message}
        return Producer(producer_config(self.cfg, **fitted, **self._producer_extra))

    def _send(self, rows: list[tuple[int, str, str, bytes]]) -> _Produced:
        """Produce a batch (in a worker thread); rows the broker refused with their batch are sent
        again until each is acknowledged or refused on its own (see the module docstring)."""
        wire = self._wire_codec()
        rows = [(seq, key, kind, wire.to_wire(body)) for seq, key, kind, body in rows] if wire.frame_writes else rows
        if not self._fitted and time.monotonic() >= self._next_fit:
            self._fit_topic_limit()
        first = self._produce(rows)
        if not first.by_broker or first.error is not None:
            return _Produced(first.acked, first.refused + first.by_broker, [], first.error)
        log.warning("the broker refused %d rows with their batches; sending them again", len(first.by_broker))
        self._fit_topic_limit()
        by_seq = {r[0]: r for r in rows}
        again = self._produce([by_seq[seq] for seq, _ in first.by_broker])
        acked, refused, error = first.acked + again.acked, first.refused + again.refused, again.error
        for seq, _ in again.by_broker:  # still refused: each alone, so its refusal is its own
            alone = self._produce([by_seq[seq]])
            acked += alone.acked
            refused += alone.refused + alone.by_broker
            error = error or alone.error
        return _Produced(sorted(acked), sorted(refused), [], error)

    def _wire_codec(self) -> Codec:
        if self._wire is None:
            # In a thread of the loop's executor, which ``asyncio.run`` waits for: ``stop`` ends
            # its wait for a broker that is gone.
            self._wire = kafka_codec(self.cfg, writes=True, cancel=self._stop)
        return self._wire

    def _fit_topic_limit(self) -> None:
        """Lower the producer's limits to the events topic's ``max.message.bytes`` (when it is below
        them), so a row too large for the topic is refused alone by the producer instead of taking
        a batch down with it. Runs before the first batch and after a batch the broker refused,
        between batches (nothing in flight); best effort: without an answer it is tried again in
        30 s, and the broker's refusals are still handled row by row (``_send``)."""
        try:
            resource = ConfigResource(ConfigResource.Type.TOPIC, self.topic)
            admin = AdminClient(self.cfg.confluent(log_level=0))  # a dead broker's refusals are not news
            described = admin.describe_configs([resource], request_timeout=2)
            limit = int(described[resource].result(timeout=3)["max.message.bytes"].value)
        except Exception as e:
            log.warning("could not read %s's max.message.bytes: %s", self.topic, e)
            self._next_fit = time.monotonic() + 30
            return
        self._fitted = True
        fit = min(MAX_EVENT_BYTES, limit - _BATCH_OVERHEAD)
        if fit != self._max_message and fit > _BATCH_OVERHEAD:
            log.warning("fitting the producer to %s's max.message.bytes (%d)", self.topic, limit)
            old, self._max_message = self._producer, fit
            self._producer = self._new_producer()
            old.flush(5)

    def _produce(self, rows: list[tuple[int, str, str, bytes]]) -> _Produced:
        """Produce rows and wait for every delivery report (runs in a worker thread)."""
        acked: list[int] = []
        refused: list[tuple[int, str]] = []
        by_broker: list[tuple[int, str]] = []
        first_error: str | None = None

        offsets = self._offsets
        offsets_lock = self._offsets_lock
        forbidden = self.forbidden
        reports = 0  # delivery reports of this batch that came back

        def report_for(seq: int, size: int, intent: bool) -> Any:
            def report(err: KafkaError | None, msg: Any) -> None:
                nonlocal first_error, reports
                reports += 1
                if err is None:
                    acked.append(seq)
                    if intent:
                        with offsets_lock:
                            # No offset when the broker acknowledged a retried request as a
                            # duplicate of one it had stored (idempotence, after a timeout):
                            # delivered, but where is unknown; the claim then waits for the
                            # partition's high watermark, which covers it.
                            offset = msg.offset()
                            offsets[seq] = (msg.partition(), offset) if offset is not None and offset >= 0 else None
                        if self._waiters and self._loop is not None:  # a sync caller may go on now
                            self._loop.call_soon_threadsafe(self._poke)
                    if forbidden:
                        forbidden.pop(msg.topic(), None)
                elif refused_by_acls(err):  # set aside (like a dead letter), with the missing right
                    right = f"Write on topic {msg.topic()}"
                    forbidden[msg.topic()] = right
                    refused.append((seq, f"{ACL_REFUSED} ({err.name()}): this principal lacks {right}"))
                elif err.code() in PERMANENT:
                    by_broker.append((seq, _refusal(size, err)))
                elif first_error is None:
                    first_error = str(err)

            return report

        p = self._producer
        produced = 0
        events, decisions = self.topic, self.decisions_topic
        headers = self._headers
        for seq, effect_id, kind, body in rows:
            if len(body) > MAX_EVENT_BYTES:
                refused.append((seq, f"{len(body)}-byte event too large: over MAX_EVENT_BYTES ({MAX_EVENT_BYTES})"))
                continue
            header = headers.get(kind)
            if header is None:
                header = headers[kind] = [(HEADER, f"effect_ledger.{kind}".encode())]
            topic = decisions if kind == "Decision" else events
            while True:
                try:
                    report = report_for(seq, len(body), kind == "Intent")
                    p.produce(topic, body, effect_id, headers=header, on_delivery=report)
                    produced += 1
                    break
                except BufferError:
                    p.poll(0.05)
                except KafkaException as e:  # refused before it was queued (the producer's own limits)
                    err = e.args[0]
                    if err.code() not in PERMANENT:
                        raise
                    refused.append((seq, _refusal(len(body), err)))
                    break
        # Until this batch's own reports are in (counted, so a stop ends the wait at once).
        while reports < produced:
            if self._stop.is_set():
                break
            p.poll(0.05)
        acked.sort()  # delivery reports come per partition; marking wants seq order
        refused.sort()
        by_broker.sort()
        if first_error is None and len(acked) + len(refused) + len(by_broker) < len(rows):
            first_error = "stopped before every delivery report came back"
        return _Produced(acked, refused, by_broker, first_error)

    async def _dead_letter(self, rows: list[tuple[int, str, str, bytes]], refused: list[tuple[int, str]]) -> None:
        """Dead-letter the rows Kafka refused for good (see the module docstring for the order)."""
        by_seq = {r[0]: r for r in rows}
        letters = [
            (
                by_seq[seq][1],
                DeadLetter(
                    _now_ms(),
                    "relay",
                    self.topic,
                    -1,
                    seq,
                    reason,
                    by_seq[seq][1].encode(),
                    by_seq[seq][3][:MAX_DEAD_LETTER_COPY_BYTES],
                ),
            )
            for seq, reason in refused
        ]
        for key, letter in letters:
            log.warning("dead-lettered outbox row %d of %s: %s", letter.offset, key, letter.error)
        try:
            await asyncio.to_thread(self._produce_dead_letters, letters)
        except Exception:
            log.exception("could not copy %d dead-lettered rows to %s", len(letters), self.cfg.topics.dlq)
        await self.store.mark_dead(refused, _now_ms())
        self._dead.update(refused)
        self.stats.dead_letters += len(refused)
        if self.metrics is not None:
            self.metrics.dead_letters.inc(len(refused))

    def _produce_dead_letters(self, letters: list[tuple[str, DeadLetter]]) -> None:
        codec = self._wire_codec()
        p = self._producer
        failed: list[str] = []

        def report(err: KafkaError | None, _msg: Any) -> None:
            if err is not None:
                failed.append(str(err))

        dlq = self.cfg.topics.dlq
        for key, letter in letters:
            p.produce(dlq, codec.encode(letter), key, headers=[codec.header(letter)], on_delivery=report)
        deadline = time.monotonic() + 30
        while p.flush(0.5) > 0:
            if self._stop.is_set() or time.monotonic() > deadline:
                raise RuntimeError("dead letters not acknowledged in time")
        if failed:
            raise RuntimeError(f"dead letters refused: {failed[0]}")

    def offset_of(self, seq: int) -> tuple[int, int] | None:
        """(partition, offset) on effects.events of the intent with ``seq``, once this relay has
        delivered it (None: not an intent, not delivered by this relay, long ago, or delivered as a
        retried duplicate whose offset the broker did not say)."""
        return self._offsets.get(seq)

    def refusal(self, seq: int) -> str | None:
        """Why Kafka refused the event with ``seq`` for good (it was dead-lettered), or None."""
        return self._dead.get(seq)

    async def wait_acked(self, seq: int, timeout: float) -> bool:
        """Wait until the intent with ``seq`` is on Kafka (its own delivery report, or the watermark
        past it) or dead-lettered; False on timeout. ``refusal(seq)`` tells a dead-lettered one
        apart. Its key's earlier events are on Kafka before it: one partition, one producer, in
        order."""
        self._waiters += 1
        try:
            async with self._acked:
                try:
                    await asyncio.wait_for(
                        self._acked.wait_for(lambda: self._acked_through >= seq or seq in self._offsets), timeout
                    )
                    return True
                except TimeoutError:
                    return False
        finally:
            self._waiters -= 1

    def _poke(self) -> None:
        """(On the loop's thread.) Wake the ``wait_acked`` callers: an intent was delivered."""
        asyncio.ensure_future(self._notify())

    async def _notify(self) -> None:
        async with self._acked:
            self._acked.notify_all()

    async def drain(self, progress: Callable[[int], None] | None = None) -> int:
        """Send everything unsent, then return the count (``effects relay --db``)."""
        await self._init_watermark()
        return await self.send_all(progress=progress)

    async def stop(self, timeout: float = 10.0) -> None:
        """Stop after the batch in flight; rows not acknowledged stay unsent for the next start."""
        if self._task is not None:
            try:
                await asyncio.wait_for(self._drain_quietly(), timeout)
            except TimeoutError:
                pass
            self._stop.set()
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass
            self._task = None
        self._stop.set()
        await asyncio.to_thread(self._producer.flush, min(1.0, timeout))
        if self._pool is not None:
            self._pool.shutdown(wait=False)
            self._pool = None

    async def _drain_quietly(self) -> None:
        while await self.store.outbox_depth() > 0:
            self._wake.set()
            await asyncio.sleep(0.02)


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _refusal(size: int, err: KafkaError) -> str:
    return f"{size}-byte event refused by Kafka: {err.name()}: {err.str()}"

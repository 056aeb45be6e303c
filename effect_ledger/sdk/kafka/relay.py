"""The relay: pushes the SQLite outbox to ``effects.events`` (a person's decision, recorded with
``Ledger.decide``, to ``effects.decisions``: only principals its ACLs allow may write there).

Order of durable writes, per row:

1. read the oldest unsent rows (``sent = 0``, in ``seq`` order);
2. produce them with an idempotent producer (``acks=all``, ``enable.idempotence``), keyed by
   effect_id, partitioned like Kafka's Java client (murmur2), headers naming the schema;
3. wait for the row's delivery report;
4. only then mark it sent.

Rows are produced, and their reports collected, in a thread of the relay's own, by one producer,
as they are read: a row does not wait for the reports of rows of other keys, so a partition that
cannot take writes (its leader dead or cut off) holds back its own keys only
(``tests/cluster/test_stalled_partition.py``). A row whose key already has a row in flight waits
for that one's report: a key's events never pass one another on the topic, even when one in
flight fails and is sent again (``tests/integration/test_relay.py`` caught that under load, when
batches were sent from several threads). A ``sync`` caller's intent is acknowledged as soon as its
own delivery report is in (``wait_acked``).

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
rows, in their order. Any other error stops the producing: once the rows in flight are reported
on, the relay reads the outbox again (the rows not acknowledged are still unsent) after a backoff.

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
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
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


#: How long this producer waits for a broker's answer to a request (librdkafka's
#: ``socket.timeout.ms``), after which it drops the connection and looks the partition's leader up
#: again, from another broker while that one reconnects. A leader that stopped answering (paused,
#: cut off) holds what was sent to it until then; shorter is sooner: with a 4 s fence
#: (``broker.session.timeout.ms``), records on a paused leader's partitions were acknowledged
#: 7.0-8.0 s after the pause at 5 s, 4.0-6.6 s at 2.5 s (three brokers on this machine, three pauses
#: each).
_REQUEST_TIMEOUT_MS = 2500
#: How long the broker may hold a produce request waiting for the in-sync replicas (librdkafka's
#: ``request.timeout.ms``, sent in the request): longer than this producer waits, so that the
#: producer, not the broker, gives up first. A leader cut off from the other brokers but not from
#: this producer cannot learn that the controllers moved its partitions; it holds each request for
#: followers that no longer fetch from it, then answers "timed out", and librdkafka retries on the
#: same connection to the same broker, whose metadata still names itself (librdkafka kept asking
#: that broker for metadata too). With the broker giving up first, a worker's writes waited on the
#: stale leader for the whole cut in 6 of 21 runs (25 s cuts); with the producer giving up first,
#: in 0 of 10, every call completing again 3-4 s after the cut began.
_BROKER_HOLD_MS = 2 * _REQUEST_TIMEOUT_MS


def producer_config(cfg: KafkaConfig, **extra: Any) -> dict[str, Any]:
    """The producer settings every effect-ledger writer to ``effects.events`` uses."""
    return cfg.confluent(
        **{
            "enable.idempotence": True,
            "acks": "all",
            "partitioner": "murmur2_random",  # the partition Kafka's Java client and faust compute
            "linger.ms": 2,
            "message.timeout.ms": 0,  # retry until the broker is back: never reorder a key's events
            # A leader that stopped answering holds a request until the socket times out
            # (librdkafka's default: 60 s): give up on it sooner (``_REQUEST_TIMEOUT_MS``), and
            # before the broker does (``_BROKER_HOLD_MS``).
            "request.timeout.ms": _BROKER_HOLD_MS,
            "socket.timeout.ms": _REQUEST_TIMEOUT_MS,
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


Row = tuple[int, str, str, bytes]  # an outbox row: (seq, effect_id, kind, body)

# What a delivery report says of its row (``Relay._report_for``).
_ACKED, _REFUSED, _BY_BROKER, _FAILED = range(4)
_PUMP_WAIT_S = 0.2  # how long the relay's thread collects reports before the loop marks what came back
_POLL_S = 0.005  # a poll's wait while reports are awaited: how soon appended rows are noticed


@dataclass
class _Produced:
    """What the reports collected say: the rows acknowledged, the rows refused for good (seq,
    reason) with their ``rows`` (for the dead letters), the rows the broker refused with their
    batch (seq, reason: maybe not their fault), and the first other error."""

    acked: list[int]
    refused: list[tuple[int, str]]
    by_broker: list[tuple[int, str]]
    error: str | None
    rows: dict[int, Row] = field(default_factory=dict)


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
        # What is in flight, touched only by the relay's thread (and by send_all between pumps):
        self._flight: dict[int, Row] = {}  # produced, not reported on yet
        self._busy: dict[str, int] = {}  # effect_id -> its rows in flight or in _again
        self._again: dict[int, Row] = {}  # refused with their batch: sent again once nothing is in flight
        self._window = max(1, 2 * batch)  # rows in flight at most
        # Delivery reports, appended by whichever thread polls the producer, read by _collect.
        self._reports: deque[tuple[int, int, str | None]] = deque()
        self._more = threading.Event()  # rows were appended: a pump waiting for reports returns
        store.add_listener(self._appended)
        self.metrics = metrics  # a LedgerMetrics: the outbox depth is read at scrape time, free here
        if metrics is not None:
            metrics.outbox_depth.set_function(lambda: max(0, self._appended_through - self._acked_through))

    def _appended(self, seq: int) -> None:
        self._appended_through = max(self._appended_through, seq)
        self._wake.set()
        self._more.set()

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

    async def send_all(self, progress: Callable[[int], None] | None = None) -> int:
        """Send unsent rows until none are left; returns how many Kafka acknowledged (see the
        module docstring for the order of writes).

        Rows are produced as they are read, while earlier ones are still in flight, except a row
        whose key has one in flight (or one to send again): it waits for that one. At most
        ``2 * batch`` rows are in flight. Acknowledged rows are marked sent (on the database's
        thread) as their reports come back, and the watermark advances to the end of the prefix of
        rows all reported on. An error other than a refusal stops the producing; once nothing is in
        flight it is raised, and the next call starts again from the outbox."""
        loop = self._loop = asyncio.get_running_loop()
        if self._pool is None:
            # A thread of its own: producing and polling never queue behind the loop's other work.
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="effect-ledger-relay")
        self._flight.clear()
        self._busy.clear()
        self._again.clear()
        total = 0
        cursor = 0  # the newest seq read from the outbox
        deferred: list[Row] = []  # read, waiting for a row of their key in flight
        error: str | None = None
        marking: asyncio.Future[None] | None = None
        full = True  # the last read found a whole batch: there may be more
        try:
            while not self._stop.is_set():
                rows: list[Row] = []
                producing = error is None and not self._again
                # Reading: while there is room, and there may be rows not read yet (this process
                # appended some, or the last read was cut at a whole batch).
                reading = producing and len(self._flight) < self._window and len(deferred) < self.batch
                if producing:
                    new: list[Row] = []
                    if reading and (full or self._more.is_set()):
                        self._more.clear()  # before reading: a row appended meanwhile sets it again
                        new = await self.store.unsent(self.batch, cursor)
                        full = len(new) == self.batch
                        if new:
                            cursor = new[-1][0]
                    if deferred or new:
                        rows, deferred = self._ready(deferred + new if deferred else new)
                if rows or self._flight:
                    produced = await loop.run_in_executor(self._pool, self._pump, rows, reading)
                elif self._again:
                    produced = await loop.run_in_executor(self._pool, self._send_again)
                elif error is not None:
                    raise RuntimeError(f"events not acknowledged by Kafka: {error}")
                elif deferred:
                    continue  # their keys' rows were reported on meanwhile
                else:
                    break
                if produced.refused:
                    await self._dead_letter(produced.rows, produced.refused)
                if produced.acked:
                    if marking is not None:
                        await marking
                    marking = asyncio.ensure_future(self.store.mark_sent(produced.acked))
                    total += len(produced.acked)
                    self.stats.sent += len(produced.acked)
                    self.stats.batches += 1
                error = error or produced.error
                # On Kafka (or dead-lettered): every row up to the oldest still to be reported on.
                through = cursor
                for pending in (min(self._flight, default=None), min(self._again, default=None)):
                    if pending is not None:
                        through = min(through, pending - 1)
                if deferred:
                    through = min(through, deferred[0][0] - 1)
                await self._advance(through)  # a sync waiter may go on
                if progress is not None and produced.acked:
                    progress(total)
        finally:
            if marking is not None:
                await marking
        if total == 0:
            # Another relay on the same file (a second agent, `effects relay --db`) may have sent
            # rows this one was waiting for: a row is marked sent only after some relay's ack.
            await self._init_watermark()
        return total

    def _ready(self, rows: list[Row]) -> tuple[list[Row], list[Row]]:
        """``rows`` (in seq order) split into those to produce now and those whose key has a row in
        flight or to be sent again: they wait for it, so a key's events never pass one another."""
        busy = self._busy
        if not busy:
            return rows, []
        ready: list[Row] = []
        waiting: list[Row] = []
        for row in rows:
            (waiting if row[1] in busy else ready).append(row)
        return ready, waiting

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

    def _pump(self, rows: list[Row], wake: bool) -> _Produced:
        """(In the relay's thread.) Produce ``rows``, then collect delivery reports until nothing is
        in flight, ``_PUMP_WAIT_S`` passed or (``wake``) rows were appended: the loop then marks
        what came back and produces the new rows without waiting for the others."""
        out = _Produced([], [], [], None)
        if rows:
            if not self._fitted and not self._flight and time.monotonic() >= self._next_fit:
                self._fit_topic_limit()
            self._enqueue(rows, out)
        p = self._producer
        deadline = time.monotonic() + _PUMP_WAIT_S
        while True:
            # Reports already back are served on every pass, even one that new rows cut short: a
            # steady stream of appends must not keep the acknowledged rows from being collected.
            p.poll(0)
            self._collect(out)
            if not self._flight or self._stop.is_set() or (wake and self._more.is_set()):
                break
            if time.monotonic() >= deadline:
                break
            p.poll(_POLL_S)
        out.acked.sort()  # delivery reports come per partition; marking wants seq order
        out.refused.sort()
        return out

    def _send_again(self) -> _Produced:
        """(In the relay's thread, nothing in flight.) The rows the broker refused with their
        batches, sent again after fitting the producer to the topic's limit: together, then each
        still refused alone, so that its refusal is its own."""
        rows = [self._again[seq] for seq in sorted(self._again)]
        for row in rows:
            self._unbusy(row[1])
        self._again.clear()
        log.warning("the broker refused %d rows with their batches; sending them again", len(rows))
        self._fit_topic_limit()
        out = self._settle(rows)
        by_seq = {row[0]: row for row in rows}
        for seq, _ in out.by_broker:
            alone = self._settle([by_seq[seq]])
            out.acked += alone.acked
            out.refused += alone.refused + alone.by_broker
            out.rows.update(alone.rows)
            out.error = out.error or alone.error
        out.by_broker = []
        out.acked.sort()
        out.refused.sort()
        return out

    def _settle(self, rows: list[Row]) -> _Produced:
        """(In the relay's thread, nothing in flight.) Produce ``rows`` and wait for every report;
        the rows refused with their batch are returned as such (in ``by_broker`` and ``rows``),
        not kept to send again."""
        out = _Produced([], [], [], None)
        self._enqueue(rows, out)
        while self._flight and not self._stop.is_set():
            self._producer.poll(0.05)
            self._collect(out)
        for seq, _ in out.by_broker:
            row = self._again.pop(seq)
            self._unbusy(row[1])
            out.rows[seq] = row
        if out.error is None and self._flight:
            out.error = "stopped before every delivery report came back"
        return out

    def _wire_codec(self) -> Codec:
        if self._wire is None:
            # In a thread of the loop's executor, which ``asyncio.run`` waits for: ``stop`` ends
            # its wait for a broker that is gone.
            self._wire = kafka_codec(self.cfg, writes=True, cancel=self._stop)
        return self._wire

    def _fit_topic_limit(self) -> None:
        """Lower the producer's limits to the events topic's ``max.message.bytes`` (when it is below
        them), so a row too large for the topic is refused alone by the producer instead of taking
        a batch down with it. Runs before the first rows are produced and before rows the broker
        refused with their batch are sent again, with nothing in flight; best effort: without an
        answer it is tried again in 30 s, and the broker's refusals are still handled row by row
        (``_send_again``)."""
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

    def _enqueue(self, rows: list[Row], out: _Produced) -> None:
        """(In the relay's thread.) Produce ``rows`` in their order, each into ``_flight``; a row
        refused before it is queued (too large) goes to ``out.refused`` at once."""
        wire = self._wire_codec()
        frame = wire.to_wire if wire.frame_writes else None
        p = self._producer
        flight, busy, headers = self._flight, self._busy, self._headers
        events, decisions = self.topic, self.decisions_topic
        on_report = self._report
        for row in rows:
            seq, effect_id, kind, body = row
            if frame is not None:
                body = frame(body)
            if len(body) > MAX_EVENT_BYTES:
                out.refused.append((seq, f"{len(body)}-byte event too large: over MAX_EVENT_BYTES ({MAX_EVENT_BYTES})"))
                out.rows[seq] = row
                continue
            header = headers.get(kind)
            if header is None:
                header = headers[kind] = [(HEADER, f"effect_ledger.{kind}".encode())]
            topic = decisions if kind == "Decision" else events
            report = partial(on_report, seq, len(body), kind == "Intent")
            while True:
                try:
                    p.produce(topic, body, effect_id, headers=header, on_delivery=report)
                except BufferError:
                    p.poll(0.05)
                    continue
                except KafkaException as e:  # refused before it was queued (the producer's own limits)
                    err = e.args[0]
                    if err.code() not in PERMANENT:
                        raise
                    out.refused.append((seq, _refusal(len(body), err)))
                    out.rows[seq] = row
                    break
                # Reports are served only by a poll, after this: the row is in flight before its report.
                flight[seq] = row
                busy[effect_id] = busy.get(effect_id, 0) + 1
                break

    def _report(self, seq: int, size: int, intent: bool, err: KafkaError | None, msg: Any) -> None:
        """The delivery report of one row (``functools.partial`` binds the row): queued for
        ``_collect``, since reports are served by whichever thread polls the producer; a delivered
        intent's offset is kept for claim waiters at once."""
        if err is None:
            if intent:
                with self._offsets_lock:
                    # No offset when the broker acknowledged a retried request as a duplicate of one
                    # it had stored (idempotence, after a timeout): delivered, but where is unknown;
                    # the claim then waits for the partition's high watermark, which covers it.
                    offset = msg.offset()
                    self._offsets[seq] = (msg.partition(), offset) if offset is not None and offset >= 0 else None
                if self._waiters and self._loop is not None:  # a sync caller may go on now
                    self._loop.call_soon_threadsafe(self._poke)
            if self.forbidden:
                self.forbidden.pop(msg.topic(), None)
            self._reports.append((seq, _ACKED, None))
        elif refused_by_acls(err):  # set aside (like a dead letter), with the missing right
            right = f"Write on topic {msg.topic()}"
            self.forbidden[msg.topic()] = right
            self._reports.append((seq, _REFUSED, f"{ACL_REFUSED} ({err.name()}): this principal lacks {right}"))
        elif err.code() in PERMANENT:
            self._reports.append((seq, _BY_BROKER, _refusal(size, err)))
        else:
            self._reports.append((seq, _FAILED, str(err)))

    def _collect(self, out: _Produced) -> None:
        """(In the relay's thread.) The reports that came back, into ``out``; their rows leave
        ``_flight``. A row refused with its batch waits in ``_again``, its key still busy; so does
        the key of a row that failed (the outbox is read again once nothing is in flight)."""
        reports, flight = self._reports, self._flight
        while reports:
            seq, outcome, reason = reports.popleft()
            row = flight.pop(seq, None)
            if row is None:
                continue  # a row produced by an earlier call of send_all, read and produced again
            if outcome == _ACKED:
                out.acked.append(seq)
                self._unbusy(row[1])
            elif outcome == _REFUSED:
                out.refused.append((seq, reason or ""))
                out.rows[seq] = row
                self._unbusy(row[1])
            elif outcome == _BY_BROKER:
                out.by_broker.append((seq, reason or ""))
                self._again[seq] = row
            elif out.error is None:
                out.error = reason

    def _unbusy(self, key: str) -> None:
        n = self._busy[key] - 1
        if n:
            self._busy[key] = n
        else:
            del self._busy[key]

    async def _dead_letter(self, by_seq: dict[int, Row], refused: list[tuple[int, str]]) -> None:
        """Dead-letter the rows Kafka refused for good (see the module docstring for the order)."""
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

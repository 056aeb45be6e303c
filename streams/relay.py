"""The relay: pushes the SQLite outbox to ``effects.events`` (a person's decision, recorded with
``Ledger.decide``, to ``effects.decisions``: only principals its ACLs allow may write there).

Order of durable writes, per batch:

1. read the oldest unsent rows (``sent = 0``, in ``seq`` order);
2. produce them with an idempotent producer (``acks=all``, ``enable.idempotence``), keyed by
   effect_id, partitioned like Kafka's Java client (murmur2), headers naming the schema;
3. wait for every delivery report;
4. only then mark the delivered rows sent.

A crash between 3 and 4 sends those rows again on restart: at-least-once, and harmless, because
every event carries its ``event_id`` and the fold ignores one it has seen. While the broker is down
the producer retries without a deadline (``message.timeout.ms=0``) so per-key order survives an
outage; the SDK keeps writing to the outbox meanwhile, and the relay catches up when the broker
returns.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaError, Producer

from effect_ledger.streams.codec import HEADER
from effect_ledger.streams.config import KafkaConfig
from effect_ledger.streams.store import Store

log = logging.getLogger("effect_ledger.relay")


def producer_config(cfg: KafkaConfig, **extra: Any) -> dict[str, Any]:
    """The producer settings every effect-ledger writer to ``effects.events`` uses."""
    return cfg.confluent(
        **{
            "enable.idempotence": True,
            "acks": "all",
            "partitioner": "murmur2_random",  # the partition Kafka's Java client and faust compute
            "linger.ms": 2,
            "message.timeout.ms": 0,  # retry until the broker is back: never reorder a key's events
            "queue.buffering.max.messages": 1_000_000,
            **extra,
        }
    )


@dataclass
class RelayStats:
    sent: int = 0
    batches: int = 0
    errors: int = 0


class Relay:
    """Runs as a task in the agent's event loop (``start``), or drains a file (``drain``)."""

    def __init__(self, store: Store, cfg: KafkaConfig, *, batch: int = 10_000, **producer: Any) -> None:
        self.store = store
        self.cfg = cfg
        self.topic = cfg.topics.events
        self.decisions_topic = cfg.topics.decisions
        self.batch = batch
        self.stats = RelayStats()
        self._producer = Producer(producer_config(cfg, **producer))
        self._wake = asyncio.Event()
        self._stop = threading.Event()
        self._task: asyncio.Task[None] | None = None
        self._acked_through = 0  # every event with seq <= this is on Kafka
        self._acked = asyncio.Condition()
        self._headers: dict[str, list[tuple[str, str | bytes | None]]] = {}
        store.add_listener(lambda seq: self._wake.set())

    async def _init_watermark(self) -> None:
        """Advance the watermark to what the file says is on Kafka."""
        rows = await self.store.query(
            "SELECT min(seq) AS lo, (SELECT max(seq) FROM events) AS hi FROM events WHERE sent = 0"
        )
        lo, hi = rows[0]["lo"], rows[0]["hi"]
        through = (lo - 1) if lo is not None else (hi or 0)
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
        backoff = 0.1
        while not self._stop.is_set():
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
                self._wake.clear()
                try:
                    await asyncio.wait_for(self._wake.wait(), 0.5)
                except TimeoutError:
                    pass

    async def send_batch(self) -> int:
        """Send one batch of unsent rows; returns how many were acknowledged and marked sent."""
        return await self.send_all(max_batches=1)

    async def send_all(self, max_batches: int | None = None, progress: Callable[[int], None] | None = None) -> int:
        """Send unsent rows batch by batch until none are left (or ``max_batches``). Pipelined: the
        rows of batch N are marked sent (on the database's thread) while batch N+1 is produced
        (on a worker thread); a batch is marked only after all its delivery reports came back."""
        total = 0
        batches = 0
        after = 0
        marking: asyncio.Task[None] | None = None
        try:
            while max_batches is None or batches < max_batches:
                rows = await self.store.unsent(self.batch, after)
                if not rows:
                    break
                producing = asyncio.ensure_future(asyncio.to_thread(self._produce, rows))
                try:
                    if marking is not None:
                        await marking
                        marking = None
                finally:
                    delivered, error = await producing
                if error is not None:
                    raise RuntimeError(f"{len(rows) - delivered} of {len(rows)} events not acknowledged: {error}")
                after = rows[-1][0]
                marking = asyncio.ensure_future(self.store.mark_sent([r[0] for r in rows]))
                total += len(rows)
                batches += 1
                self.stats.sent += len(rows)
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
        async with self._acked:
            if through > self._acked_through:
                self._acked_through = through
                self._acked.notify_all()

    def _produce(self, rows: list[tuple[int, str, str, bytes]]) -> tuple[int, str | None]:
        """Produce a batch and wait for every delivery report (runs in a worker thread). Returns
        how many were acknowledged and the first error, if any."""
        delivered = 0
        first_error: str | None = None

        def report(err: KafkaError | None, _msg: Any) -> None:
            nonlocal delivered, first_error
            if err is None:
                delivered += 1
            elif first_error is None:
                first_error = str(err)

        p = self._producer
        events, decisions = self.topic, self.decisions_topic
        headers = self._headers
        for _seq, effect_id, kind, body in rows:
            header = headers.get(kind)
            if header is None:
                header = headers[kind] = [(HEADER, f"effect_ledger.{kind}".encode())]
            topic = decisions if kind == "Decision" else events
            while True:
                try:
                    p.produce(topic, body, effect_id, headers=header, on_delivery=report)
                    break
                except BufferError:
                    p.poll(0.05)
        while p.flush(0.5) > 0:
            if self._stop.is_set():
                break
        if first_error is None and delivered < len(rows):
            first_error = "stopped before every delivery report came back"
        return delivered, first_error

    async def wait_acked(self, seq: int, timeout: float) -> bool:
        """Wait until the event with ``seq`` (and every one before it) is on Kafka."""
        async with self._acked:
            try:
                await asyncio.wait_for(self._acked.wait_for(lambda: self._acked_through >= seq), timeout)
                return True
            except TimeoutError:
                return False

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

    async def _drain_quietly(self) -> None:
        while await self.store.outbox_depth() > 0:
            self._wake.set()
            await asyncio.sleep(0.02)

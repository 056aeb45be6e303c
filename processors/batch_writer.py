"""One batch's writes, made together: the processor's table (its RocksDB partitions and its
changelog) and the records it publishes (``effects.state``, ``effects.uncertain``).

Folding a batch, the processor hands every changed key's table value and every output record to a
``BatchWriter``; ``flush`` then makes them durable in this order, before the batch's source offsets
can be acknowledged (faust commits only acknowledged offsets, after the batch returns):

1. the table values, one RocksDB write batch per partition (faust's store of the table: reads in
   the same process see them at once);
2. the changelog records and the output records, produced through one librdkafka producer
   (idempotent, ``acks=all``, retried until the broker is back: a key's records are never
   reordered);
3. wait until every record of the batch is acknowledged;
4. remember the last changelog offset per partition in the store (faust's "persisted offset": a
   restarted worker recovers the changelog from there).

While the worker holds a partition it is the changelog's only rightful writer there, so its own
records follow each other (and the end of the changelog it recovered, ``expect``). An offset
between two of them is a record another writer put there: a batch a previous owner had in flight,
delivered late (``late_records``). ``foreign`` lists those stretches, for the processor to read
and answer; until it has, the offset recorded as held in step 4 stays before them.

A crash anywhere in between loses nothing: the batch's events were not acknowledged, so they are
delivered again and folded again; the fold ignores what it has seen and the writes repeat (a
table value and a compacted state record written twice are the same record). A record Kafka
refuses for good (too large, no such topic) raises ``OutputRefused``: the batch is not
acknowledged and the worker stops, rather than acknowledge events whose outputs are lost.

Why not faust's own table writes and producer: per record they make a future, a callback and a
RocksDB put of the changelog offset, and aiokafka builds record batches in Python; with this path a
worker's CPU per event went from 0.61-0.68 ms to 0.31-0.34 ms (``make bench``,
processor_throughput).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from effect_ledger.errors import OutputRefused
from effect_ledger.streams.log_clock import log_time_of

#: The ``client.id`` of the worker's fold writer (its producer), as the broker's logs and quotas see it.
CLIENT_ID = "effect-ledger-fold"
_FLUSH_SLICE_S = 1.0  # one wait for deliveries in the flushing thread; repeated until all are in


class BatchWriter:
    """Collects one batch's table values and output records; ``flush`` writes them (module docstring).

    ``producer``: a confluent-kafka ``Producer`` (idempotent, acks=all); ``db_for``: partition ->
    the table's RocksDB of that partition; ``write_batch``: a new empty write batch;
    ``persist_offset``: (partition, changelog offset) -> remember it; ``changelog``: the table's
    changelog topic."""

    def __init__(
        self,
        producer: Any,
        changelog: str,
        db_for: Callable[[int], Any],
        write_batch: Callable[[], Any],
        persist_offset: Callable[[int, int], None],
    ) -> None:
        self._producer = producer
        # Called with the broker's append time of each output record acknowledged: the freshest log
        # time there is, even while the worker catches up on a backlog of older records.
        self.on_log_time: Callable[[int], None] | None = None
        self._changelog = changelog
        self._db_for = db_for
        self._write_batch = write_batch
        self._persist_offset = persist_offset
        self._table: dict[int, dict[bytes, bytes]] = {}
        self._records: list[tuple[str, int, bytes, bytes | None, list[tuple[str, bytes]] | None]] = []
        self._errors: list[str] = []
        self._changelog_offsets: dict[int, int] = {}
        # partition -> the offset this worker's next changelog record takes, if nobody else writes
        self._expected: dict[int, int] = {}
        # (partition, first, end): offsets first..end-1 of the changelog hold records another
        # writer put between this worker's own
        self.foreign: list[tuple[int, int, int]] = []
        # The wait for deliveries runs on a thread of its own: on the default executor it queued
        # behind whatever else of the worker blocks there (the lookups' high watermark questions to
        # a slow broker took all of its threads for seconds), and every lookup waits for the fold.
        self._waiter: ThreadPoolExecutor | None = None

    def __len__(self) -> int:
        return len(self._records) + sum(len(v) for v in self._table.values())

    def put(self, partition: int, key: bytes, value: bytes) -> None:
        """The key's new table value (and its changelog record), in ``partition``."""
        self._table.setdefault(partition, {})[key] = value

    def produce(self, topic: str, partition: int, key: bytes, value: bytes | None,
                headers: list[tuple[str, bytes]] | None = None) -> None:  # fmt: skip
        """An output record (in the order given)."""
        self._records.append((topic, partition, key, value, headers))

    def expect(self, partition: int, offset: int) -> None:
        """The changelog of ``partition`` ends before ``offset`` (a recovery read it to there): the
        worker's next record there is expected at ``offset``."""
        self._expected[partition] = offset

    def forget_expected(self) -> None:
        """The worker's partitions were revoked: another worker may write their changelog now."""
        self._expected.clear()

    def discard(self) -> None:
        """Forget what was collected and not written yet (a batch given up before its writes)."""
        self._table, self._records = {}, []

    async def flush(self) -> None:
        """Write everything collected, in the module docstring's order; return once Kafka has
        acknowledged every record. Raises ``OutputRefused`` when Kafka refused one for good."""
        if not self._table and not self._records:
            return
        table, records = self._table, self._records
        self._table, self._records = {}, []
        self._errors, self._changelog_offsets = [], {}
        # 1. the table's RocksDB partitions
        for partition, values in table.items():
            batch = self._write_batch()
            for key, value in values.items():
                batch.put(key, value)
            self._db_for(partition).write(batch)
        # 2. the changelog and the outputs (``_send`` only when the producer's queue is full)
        produce, changelog, on_changelog, on_output = (
            self._producer.produce,
            self._changelog,
            self._on_changelog,
            self._on_output,
        )
        for partition, values in table.items():
            for key, value in values.items():
                try:
                    produce(changelog, value, key, partition=partition, on_delivery=on_changelog)
                except BufferError:
                    self._send(changelog, partition, key, value, None, on_changelog)
        for topic, partition, key, record, headers in records:
            try:
                produce(topic, record, key, partition=partition, headers=headers, on_delivery=on_output)
            except BufferError:
                self._send(topic, partition, key, record, headers, on_output)
        # 3. every record acknowledged (the wait runs in a thread: the loop keeps serving lookups)
        if self._waiter is None:
            self._waiter = ThreadPoolExecutor(1, thread_name_prefix="effect-ledger-fold-writer")
        loop = asyncio.get_running_loop()
        while len(self._producer) > 0:
            await loop.run_in_executor(self._waiter, self._producer.flush, _FLUSH_SLICE_S)
        if self._errors:
            raise OutputRefused(f"Kafka refused {len(self._errors)} record(s) of the batch: {self._errors[0]}")
        # 4. where a restarted worker recovers the changelog from: not past another writer's records
        #    not answered yet (``foreign``), so that a restart's recovery weighs them
        before: dict[int, int] = {}
        for partition, first, _ in self.foreign:
            before[partition] = min(first - 1, before.get(partition, first - 1))
        for partition, offset in self._changelog_offsets.items():
            self._persist_offset(partition, min(offset, before.get(partition, offset)))

    def close(self, timeout_s: float = 10.0) -> None:
        """Deliver what is still queued (nothing, after a flush) and let the producer go."""
        self._producer.flush(timeout_s)
        if self._waiter is not None:
            self._waiter.shutdown(wait=False)
            self._waiter = None

    def _send(self, topic: str, partition: int, key: bytes, value: bytes | None,
              headers: list[tuple[str, bytes]] | None, on_delivery: Callable[[Any, Any], None]) -> None:  # fmt: skip
        while True:
            try:
                self._producer.produce(topic, value, key, partition=partition, headers=headers, on_delivery=on_delivery)
                return
            except BufferError:  # the local queue is full: let deliveries drain it
                self._producer.poll(0.05)

    def _on_changelog(self, err: Any, msg: Any) -> None:
        if err is not None:
            self._errors.append(f"{msg.topic()}[{msg.partition()}]: {err}")
            return
        p, off = msg.partition(), msg.offset()
        if off > self._changelog_offsets.get(p, -1):
            self._changelog_offsets[p] = off
        # Delivery reports come in offset order per partition (one idempotent producer).
        expected = self._expected.get(p)
        if expected is not None and off > expected:
            self.foreign.append((p, expected, off))
        if expected is None or off >= expected:
            self._expected[p] = off + 1

    def _on_output(self, err: Any, msg: Any) -> None:
        if err is not None:
            self._errors.append(f"{msg.topic()}[{msg.partition()}]: {err}")
            return
        if self.on_log_time is not None:
            log_ms = log_time_of(*msg.timestamp())
            if log_ms is not None:
                self.on_log_time(log_ms)

"""A fetch that comes back while the consumer's flow is stopped: faust drops its records
(``Consumer.getmany``) and seeks only the source partitions back to their commits. A long poll
started before a rebalance could so return, between the recovery's seek of a changelog partition
and faust's "Resuming flow", the records the recovery was about to read: the worker read the
changelog to its end and waited for them for ever ("No event received for active tp", never
ready; seen in tests/faults/test_rebalance_under_load.py under load). Here faust's own ``getmany``
runs over a real aiokafka consumer of a real broker's partition, the flow stopping while the fetch
is out (what a rebalance does); the records must be fetched again afterwards."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import faust
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from faust.types import TP

from effect_ledger.processors import _faust_internals as faust_internals
from effect_ledger.streams.config import KafkaConfig

RECORDS = 10


class _Thread:
    """The consumer's thread, here the test's own loop, shaped as faust's: ``getmany`` calls
    ``_fetch_records`` through ``call_thread``. The flow stops while the fetch is out (what a
    rebalance does); ``seek_meanwhile``: a seek of the recovery's runs after the fetch returned."""

    def __init__(self, aio: AIOKafkaConsumer, consumer: Any, seek_meanwhile: int | None) -> None:
        self.aio = aio
        self.consumer = consumer
        self.seek_meanwhile = seek_meanwhile

    def _ensure_consumer(self) -> AIOKafkaConsumer:
        return self.aio

    async def call_thread(self, fun: Any, *args: Any, **kwargs: Any) -> Any:
        return await fun(*args, **kwargs)

    def assignment(self) -> set[TP]:
        return {TP(tp.topic, tp.partition) for tp in self.aio.assignment()}

    def highwater(self, tp: TP) -> int:
        return RECORDS

    async def _fetch_records(self, aio: AIOKafkaConsumer, active: Any, timeout: float, max_records: int) -> Any:
        tps = [TopicPartition(tp.topic, tp.partition) for tp in active]
        records = await aio.getmany(*tps, timeout_ms=int(timeout * 1000), max_records=max_records)
        self.consumer.stop_flow()  # a rebalance began while the fetch was out
        return records

    async def getmany(self, active_partitions: Any, timeout: float) -> Any:
        records = await self.call_thread(
            self._fetch_records, self.aio, active_partitions, timeout=timeout, max_records=500
        )
        if self.seek_meanwhile is not None:  # the recovery's seek, queued behind the fetch
            for tp in self.aio.assignment():
                self.aio.seek(tp, self.seek_meanwhile)
        return records


async def _scenario(
    kafka_config: KafkaConfig,
    tmp_path: Path,
    *,
    rewind: bool,
    seek_meanwhile: int | None = None,
    transaction: bool = False,
) -> tuple[int, int, list[int]]:
    """Returns (records faust handed on, the partition's position afterwards, offsets fetched again).
    ``transaction``: the records are written in one, whose commit marker follows them in the log: a
    fetch then leaves the position past the marker, not at the last record + 1 (as past a compacted
    batch's end)."""
    topic = kafka_config.topics.events
    producer = AIOKafkaProducer(
        bootstrap_servers=kafka_config.bootstrap, transactional_id=f"{topic}-tx" if transaction else None
    )
    await producer.start()
    try:
        if transaction:
            await producer.begin_transaction()
        for i in range(RECORDS):
            await producer.send_and_wait(topic, f"v{i}".encode(), key=b"k", partition=0)
        if transaction:
            await producer.commit_transaction()
    finally:
        await producer.stop()
    tp = TopicPartition(topic, 0)
    aio = AIOKafkaConsumer(bootstrap_servers=kafka_config.bootstrap, enable_auto_commit=False)
    await aio.start()
    try:
        aio.assign([tp])
        await aio.seek_to_beginning(tp)
        app = faust.App("dropped-fetch", broker=f"kafka://{kafka_config.bootstrap}", datadir=str(tmp_path))
        consumer: Any = app.consumer
        consumer._thread = _Thread(aio, consumer, seek_meanwhile)
        consumer._active_partitions = {TP(topic, 0)}

        async def seek_to_committed() -> dict[Any, Any]:  # the sources' way back: nothing committed here
            return {}

        consumer.seek_to_committed = seek_to_committed
        if rewind:
            faust_internals.rewind_dropped_fetches(app)
        handed = [m async for m in consumer.getmany(timeout=5.0)]
        position = await aio.position(tp)
        again = await aio.getmany(tp, timeout_ms=5000)
        return len(handed), position, [r.offset for r in again.get(tp, [])]
    finally:
        await aio.stop()


@pytest.mark.parametrize("transaction", [False, True], ids=["plain", "past-a-marker"])
def test_records_fetched_while_the_flow_stopped_are_fetched_again(
    kafka_config: KafkaConfig, tmp_path: Path, transaction: bool
) -> None:
    handed, position, again = asyncio.run(_scenario(kafka_config, tmp_path, rewind=True, transaction=transaction))
    assert handed == 0  # faust hands nothing on while its flow is stopped, as before
    assert position == 0, f"the partition stayed at {position}, past records nobody read"
    assert again == list(range(RECORDS))


def test_without_the_rewind_faust_loses_them(kafka_config: KafkaConfig, tmp_path: Path) -> None:
    """What the processor did before: faust's own getmany drops the records and the position stays
    past them (this scenario is the one the fix must change)."""
    handed, position, again = asyncio.run(_scenario(kafka_config, tmp_path, rewind=False))
    assert (handed, position, again) == (0, RECORDS, [])


def test_a_seek_since_the_fetch_is_kept(kafka_config: KafkaConfig, tmp_path: Path) -> None:
    """The recovery sought the partition after the fetch left: its seek wins (rewinding to the
    fetch's start would re-read changelog records older than what the table holds)."""
    handed, position, again = asyncio.run(_scenario(kafka_config, tmp_path, rewind=True, seek_meanwhile=3))
    assert (handed, position, again) == (0, 3, list(range(3, RECORDS)))

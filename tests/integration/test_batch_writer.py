"""The processor's batch writer against the real broker and a real RocksDB (processors/batch_writer.py):
what ``flush`` returns from is in the store, acknowledged on the topics, and the changelog offset
remembered; nothing is written before ``flush``."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest
import rocksdict
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from effect_ledger.errors import OutputRefused
from effect_ledger.processors.batch_writer import BatchWriter
from effect_ledger.sdk.kafka.relay import producer_config
from effect_ledger.streams.config import KafkaConfig


def _read_all(cfg: KafkaConfig, topic: str, partition: int, want: int) -> list[tuple[bytes, bytes | None]]:
    c = Consumer(cfg.confluent(**{"group.id": "unused", "enable.auto.commit": False}))
    c.assign([TopicPartition(topic, partition, OFFSET_BEGINNING)])
    out: list[tuple[bytes, bytes | None]] = []
    try:
        for _ in range(100):  # bounded: 100 polls of up to 0.2 s
            if len(out) >= want:
                break
            m = c.poll(0.2)
            if m is not None and m.error() is None:
                out.append((m.key(), m.value()))
    finally:
        c.close()
    return out


def test_flush_writes_the_store_then_the_topics_then_the_changelog_offset(
    kafka_config: KafkaConfig, tmp_path: Path
) -> None:
    cfg = kafka_config
    changelog = f"{cfg.prefix}writer-changelog"
    admin = AdminClient(cfg.confluent())
    for f in admin.create_topics([NewTopic(changelog, num_partitions=3, replication_factor=1)]).values():
        f.result(30)
    dbs: dict[int, rocksdict.Rdict] = {}

    def db_for(p: int) -> rocksdict.Rdict:
        if p not in dbs:
            dbs[p] = rocksdict.Rdict(str(tmp_path / f"p{p}"), options=rocksdict.Options(raw_mode=True))
        return dbs[p]

    persisted: dict[int, int] = {}
    w = BatchWriter(Producer(producer_config(cfg)), changelog, db_for, lambda: rocksdict.WriteBatch(raw_mode=True),
                    persisted.__setitem__)  # fmt: skip
    w.put(1, b'"k1"', b"v1")
    w.put(1, b'"k2"', b"v2")
    w.put(2, b'"k3"', b"v3")
    w.produce(cfg.topics.state, 1, b"k1", b"state-1", [("h", b"x")])
    w.produce(cfg.topics.state, 1, b"k2", None)  # a tombstone
    assert len(w) == 5
    assert db_for(1).get(b'"k1"') is None and not persisted  # nothing before flush

    asyncio.run(w.flush())
    assert db_for(1)[b'"k1"'] == b"v1" and db_for(1)[b'"k2"'] == b"v2" and db_for(2)[b'"k3"'] == b"v3"
    assert _read_all(cfg, cfg.topics.state, 1, 2) == [(b"k1", b"state-1"), (b"k2", None)]
    assert sorted(_read_all(cfg, changelog, 1, 2)) == [(b'"k1"', b"v1"), (b'"k2"', b"v2")]
    assert persisted == {1: 1, 2: 0}  # the last changelog offset per partition
    assert len(w) == 0
    asyncio.run(w.flush())  # nothing collected: nothing written
    assert persisted == {1: 1, 2: 0}
    w.close()
    for db in dbs.values():
        db.close()


def test_a_record_kafka_refuses_for_good_fails_the_flush(kafka_config: KafkaConfig, tmp_path: Path) -> None:
    """Too large for the topic: the batch must not count as written (its events are not acknowledged)."""
    cfg = kafka_config
    persisted: dict[int, int] = {}
    db = rocksdict.Rdict(str(tmp_path / "p0"), options=rocksdict.Options(raw_mode=True))
    w = BatchWriter(Producer(producer_config(cfg, **{"message.max.bytes": 20_000_000})), f"{cfg.prefix}cl",
                    lambda p: db, lambda: rocksdict.WriteBatch(raw_mode=True), persisted.__setitem__)  # fmt: skip
    w.produce(cfg.topics.state, 0, b"k", b"x" * 5_000_000)  # over the broker's 1 MB default

    with pytest.raises(OutputRefused, match="state"):
        asyncio.run(w.flush())
    w.close()
    db.close()


def test_the_wait_for_deliveries_does_not_queue_behind_the_default_executor(
    kafka_config: KafkaConfig, tmp_path: Path
) -> None:
    """Every thread of the default executor blocked (as the lookups' high watermark questions to a
    slow broker blocked them): the batch's writes are acknowledged all the same. Before, the wait ran
    there, and the fold stood still behind them."""
    cfg = kafka_config
    db = rocksdict.Rdict(str(tmp_path / "p0"), options=rocksdict.Options(raw_mode=True))
    w = BatchWriter(Producer(producer_config(cfg)), cfg.topics.state, lambda p: db,
                    lambda: rocksdict.WriteBatch(raw_mode=True), lambda p, off: None)  # fmt: skip
    w.produce(cfg.topics.state, 0, b"k", b"v")

    async def main() -> None:
        loop = asyncio.get_running_loop()
        release = threading.Event()
        blocked = [loop.run_in_executor(None, release.wait, 60) for _ in range(64)]
        try:
            await asyncio.wait_for(w.flush(), 20)
        finally:
            release.set()
            await asyncio.gather(*blocked)

    asyncio.run(main())
    assert _read_all(cfg, cfg.topics.state, 0, 1) == [(b"k", b"v")]
    w.close()
    db.close()


def test_another_writers_records_between_the_workers_own_are_found_and_read(
    kafka_config: KafkaConfig, tmp_path: Path
) -> None:
    """The worker holds partition 0 of the changelog from offset 1 on (``expect``): its own records
    follow each other; two records another producer puts between them (a previous owner's late
    batch) show as one stretch in ``foreign``, and ``late_records.foreign_keys`` reads their keys.
    After the partitions are revoked (``forget_expected``), nothing is expected."""
    from effect_ledger.processors.late_records import foreign_keys

    cfg = kafka_config
    changelog = f"{cfg.prefix}gap-changelog"
    admin = AdminClient(cfg.confluent())
    for f in admin.create_topics([NewTopic(changelog, num_partitions=2, replication_factor=1)]).values():
        f.result(30)
    other = Producer(producer_config(cfg))
    other.produce(changelog, b"recovered", b'"k0"', partition=0)  # offset 0: what a recovery read
    assert other.flush(30) == 0
    db = rocksdict.Rdict(str(tmp_path / "p0"), options=rocksdict.Options(raw_mode=True))
    persisted: dict[int, int] = {}
    w = BatchWriter(Producer(producer_config(cfg)), changelog, lambda p: db,
                    lambda: rocksdict.WriteBatch(raw_mode=True), persisted.__setitem__)  # fmt: skip
    w.expect(0, 1)
    w.put(0, b'"k1"', b"own-1")  # offset 1
    asyncio.run(w.flush())
    assert w.foreign == []
    for key in (b'"late-a"', b'"late-b"'):  # offsets 2 and 3
        other.produce(changelog, b"late", key, partition=0)
    assert other.flush(30) == 0
    w.put(0, b'"k2"', b"own-2")  # offset 4
    w.put(1, b'"k3"', b"own-3")  # partition 1: nothing expected there before this record
    asyncio.run(w.flush())
    assert w.foreign == [(0, 2, 4)]
    # Until the stretch is answered, a restart must recover it: recorded as held up to before it.
    assert persisted == {0: 1, 1: 0}
    reader = Consumer(cfg.confluent(**{"group.id": f"{cfg.prefix}gap-reader", "enable.auto.commit": False}))
    try:
        assert foreign_keys(reader, changelog, w.foreign) == ([(0, b'"late-a"', 2), (0, b'"late-b"', 3)], None)
        assert foreign_keys(reader, changelog, w.foreign, limit=1) == ([(0, b'"late-a"', 2)], "more than 1 records")
    finally:
        reader.close()
    w.foreign = []  # answered
    w.put(0, b'"k2"', b"own-2 again")  # offset 5
    asyncio.run(w.flush())
    assert w.foreign == [] and persisted[0] == 5
    w.forget_expected()
    other.produce(changelog, b"next-owner", b'"k4"', partition=0)  # offset 6: the partition's next owner
    assert other.flush(30) == 0
    w.put(0, b'"k5"', b"own-5")  # offset 7, held again: from here on
    asyncio.run(w.flush())
    assert w.foreign == []
    w.close()
    db.close()

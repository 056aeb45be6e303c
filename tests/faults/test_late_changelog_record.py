"""A late changelog record: a batch an old owner of a table partition had in flight when it was paused
or cut from the brokers is acknowledged after the new owner's records of the same key. The first
run of the whole chaos schedule lost two keys to it (docs/chaos/README.md, "The last report"): the
old owner's PENDING value landed after the new owner's CONFIRMED, and the next worker to recover the
partition took it, timed the effect out again and escalated it, while the caller held its receipt.

Here the late record is written to the changelog as the old owner's producer would have delivered
it: the key's value folded from its first intent alone, after the worker's own CONFIRMED record. A
worker recovering the partition from an empty store must still serve CONFIRMED (it served PENDING
before ``late_records``), and then write its CONFIRMED value again, so that the changelog's last
record of the key, the one compaction keeps, is the newer value."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

from effect_ledger.core.effect import fold
from effect_ledger.core.model import State
from effect_ledger.processors import table_value
from effect_ledger.streams.acl import WORKER_APP_ID
from effect_ledger.streams.config import KafkaConfig
from effect_ledger.streams.partition import partition_for
from tests.faults._flow import answered, committed_through_end, key_events, now_ms
from tests.services import Processor, wait_for
from tests.topic_io import RawProducer, running

WAIT = 90.0


def _changelog(cfg: KafkaConfig) -> str:
    return f"{cfg.prefix}{WORKER_APP_ID}-effects-changelog"


def _records(cfg: KafkaConfig, key: str) -> list[tuple[int, int, bytes, bytes]]:
    """(partition, offset, record key, value) of every changelog record of ``key``, in the log's
    order per partition (the changelog's record key is the table's encoding of ``key``)."""
    topic = _changelog(cfg)
    c = Consumer(cfg.confluent(**{"group.id": "unused", "enable.auto.commit": False}))
    try:
        ends = {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in range(cfg.partitions)}
        c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p, end in ends.items() if end > 0])
        out = []
        pending = {p for p, end in ends.items() if end > 0}
        for _ in range(600):  # bounded: 600 polls of up to 0.2 s
            if not pending:
                break
            m = c.poll(0.2)
            if m is None or m.error() is not None:
                continue
            if m.offset() >= ends[m.partition()] - 1:
                pending.discard(m.partition())
            if key.encode() in (m.key() or b""):
                out.append((m.partition(), m.offset(), m.key(), m.value()))
        assert not pending, f"the changelog was not read to its end: partitions {sorted(pending)}"
        return out
    finally:
        c.close()


def _write_late(cfg: KafkaConfig, events: list[Any], partition: int, record_key: bytes) -> bytes:
    """Write an old owner's late record of the key: its value folded from the first intent alone."""
    stale = fold(events[:1])
    assert stale is not None
    value = table_value.encode(stale, None)
    late = Producer(cfg.confluent())
    late.produce(_changelog(cfg), value, record_key, partition=partition)
    assert late.flush(30) == 0
    return value


def _confirmed(value: bytes) -> bool:
    effect = table_value.decode(value, lambda _: None)
    return effect is not None and effect.state is State.CONFIRMED


def test_a_recovery_keeps_the_newer_value_over_an_old_owners_late_record(
    kafka_config: KafkaConfig, tmp_path: Path
) -> None:
    cfg = kafka_config
    key = "payments:late-changelog-record"
    events = key_events(key, "confirmed", now_ms())
    producer = RawProducer(cfg)
    # Other keys beside it, so that every partition has events for the group to commit.
    for ev in events + [ev for i in range(12) for ev in key_events(f"payments:beside-{i}", "confirmed", now_ms())]:
        producer.event(ev)
    producer.flush()
    assert not producer.errors, producer.errors

    first = Processor(cfg, tmp_path / "data-1")
    with running(first):
        first.wait_ready()
        wait_for(lambda: answered(first, key, "CONFIRMED"), WAIT, "the key folded CONFIRMED")
        wait_for(lambda: committed_through_end(cfg), WAIT, "the group to commit")
        first.stop()
    written = _records(cfg, key)
    assert written, "the worker wrote no changelog record of the key"
    partition, _, record_key, newest = written[-1]

    # The old owner's batch, delivered late: the key's first intent alone, after CONFIRMED.
    assert table_value.compare(newest, _write_late(cfg, events, partition, record_key)) == table_value.KEEP
    assert _records(cfg, key)[-1][3] != newest

    second = Processor(cfg, tmp_path / "data-2")  # an empty store: it recovers the changelog from its start
    with running(second):
        second.wait_ready()
        status, body = second.lookup(key)
        assert status == 200 and body["state"] == "CONFIRMED", (status, body, second.log()[-3000:])
        # Its next batch writes the kept value again.
        producer.event(key_events("payments:late-changelog-next", "pending", now_ms())[0])
        producer.flush()

        def rewritten() -> bool:
            last = _records(cfg, key)[-1]
            return last[0] == partition and last[3] == newest

        wait_for(rewritten, WAIT, "the worker to write the kept value again after the late record")
        assert "hold only facts the value held has" in second.log()


def test_the_owner_answers_a_late_record_that_lands_while_it_holds_the_partition(
    kafka_config: KafkaConfig, tmp_path: Path
) -> None:
    """The late record lands while the worker holds the partition: it never reads its own changelog,
    so only its own offsets show it (``batch_writer``, ``foreign``). Its next record in that
    partition comes after a gap; it reads the record in the gap and writes the key's value again at
    once. Before, the late value stayed the key's last record until a recovery of the partition
    weighed it, and compaction could leave it alone first."""
    cfg = kafka_config
    key = "payments:late-while-held"
    events = key_events(key, "confirmed", now_ms())
    producer = RawProducer(cfg)
    for ev in events:
        producer.event(ev)
    producer.flush()
    assert not producer.errors, producer.errors

    worker = Processor(cfg, tmp_path / "data")
    with running(worker):
        worker.wait_ready()
        wait_for(lambda: answered(worker, key, "CONFIRMED"), WAIT, "the key folded CONFIRMED")
        wait_for(lambda: _confirmed(_records(cfg, key)[-1][3]), WAIT, "the key's CONFIRMED changelog record")
        partition, _, record_key, newest = _records(cfg, key)[-1]
        _write_late(cfg, events, partition, record_key)
        assert _records(cfg, key)[-1][3] != newest
        # A new key in the same partition: the worker's next changelog record there.
        beside = next(
            k for i in range(1000) if partition_for((k := f"payments:beside-{i}").encode(), cfg.partitions) == partition
        )
        producer.event(key_events(beside, "pending", now_ms())[0])
        producer.flush()

        def rewritten() -> bool:
            last = _records(cfg, key)[-1]
            return last[3] == newest

        wait_for(rewritten, WAIT, "the worker to write the key's value again after the late record")
        assert "were written by another worker between this worker's own records" in worker.log()
        assert answered(worker, key, "CONFIRMED")

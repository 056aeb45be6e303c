"""The real broker: topics as effect_ledger.streams.admin creates them, and codec-encoded events through a real
producer and consumer. Every wait is a poll loop against a monotonic deadline."""

from __future__ import annotations

import time
import uuid
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, Message, Producer
from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

from effect_ledger.core import model as m
from effect_ledger.streams.admin import (
    BrokerUnavailable,
    delete_topics,
    ensure_topics,
    list_topics,
    topic_specs,
    wait_ready,
)
from effect_ledger.streams.codec import HEADER, default_codec
from effect_ledger.streams.config import KafkaConfig

TIMEOUT = 30.0


def _topic_configs(cfg: KafkaConfig, name: str) -> dict[str, str]:
    admin = AdminClient(cfg.confluent())
    futures = admin.describe_configs([ConfigResource(ResourceType.TOPIC, name)])
    (fut,) = futures.values()
    return {k: entry.value for k, entry in fut.result(timeout=TIMEOUT).items()}


def test_ensure_topics_is_idempotent(kafka_config: KafkaConfig) -> None:
    # The fixture created them; a second run (a restarted process) must find, not recreate, them.
    topics = kafka_config.topics
    assert ensure_topics(kafka_config) == {name: "exists" for name in topics.all()}
    assert ensure_topics(kafka_config) == {name: "exists" for name in topics.all()}

    listed = list_topics(kafka_config)
    for spec in topic_specs(kafka_config.for_cluster(wait_ready(kafka_config))):
        assert listed[spec.name] == spec.partitions, spec.name


def test_topic_configs(kafka_config: KafkaConfig) -> None:
    topics = kafka_config.topics
    # effects.state holds the latest state per effect: compaction keeps exactly that.
    assert _topic_configs(kafka_config, topics.state)["cleanup.policy"] == "compact"
    # effects.events is the audit record: never deleted by age.
    events = _topic_configs(kafka_config, topics.events)
    assert events["cleanup.policy"] == "delete"
    assert events["retention.ms"] == "-1"


def test_ensure_topics_refuses_a_different_partition_count(kafka_bootstrap: str) -> None:
    prefix = f"t{uuid.uuid4().hex[:12]}."
    two = KafkaConfig(bootstrap=kafka_bootstrap, prefix=prefix, partitions=2)
    try:
        assert set(ensure_topics(two).values()) == {"created"}
        three = KafkaConfig(bootstrap=kafka_bootstrap, prefix=prefix, partitions=3)
        with pytest.raises(ValueError, match=r"exists with 2 partitions, expected 3"):
            ensure_topics(three)
        # nothing was changed
        assert all(list_topics(two)[s.name] == s.partitions for s in topic_specs(two.for_cluster(wait_ready(two))))
    finally:
        delete_topics(two, list(two.topics.all()))


def testdelete_topics(kafka_bootstrap: str) -> None:
    cfg = KafkaConfig(bootstrap=kafka_bootstrap, prefix=f"t{uuid.uuid4().hex[:12]}.", partitions=1)
    ensure_topics(cfg)
    names = list(cfg.topics.all())
    try:
        delete_topics(cfg, names)
        deadline = time.monotonic() + TIMEOUT
        while set(names) & set(list_topics(cfg)) and time.monotonic() < deadline:
            pass  # list_topics is itself a broker round trip; deletion is asynchronous
        assert not set(names) & set(list_topics(cfg))
    finally:
        remaining = sorted(set(names) & set(list_topics(cfg)))
        if remaining:
            delete_topics(cfg, remaining)


def _events() -> list[Any]:
    """Three effects' histories, interleaved the way several workers would produce them."""
    out: list[Any] = []
    for i, key in enumerate(["refund:order-1", "refund:ördér-2", "mail:3"]):
        t = 1_700_000_000_000 + i
        out += [
            m.Intent(
                f"{key}/i", key, t, 1, "stripe", "refund.create", "shop", "run-1", "s", "{}", "d" * 64, t + 30_000, "w1"
            ),
            m.Executed(f"{key}/x", key, t + 10, 1, m.Outcome.UNKNOWN, "timeout", t + 1, t + 9, None, "w1"),
            m.Resolution(f"{key}/r", key, t + 20, 1, m.Verdict.FOUND, "rec", receipt_id=f"re-{i}"),
            m.Receipt(f"{key}/c", key, t + 30, 1, f"re-{i}", m.ReceiptSource.RECONCILER, "{}"),
        ]
    # Interleave the keys: per-key order must survive sharing partitions with other keys.
    return [out[j * 4 + n] for n in range(4) for j in range(3)]


def test_produce_and_consume_encoded_events(kafka_config: KafkaConfig, group_id: Callable[[], str]) -> None:
    codec = default_codec()
    topic = kafka_config.topics.events
    sent = _events()

    delivered: set[tuple[bytes | None, int | None, int | None]] = set()
    errors: list[KafkaError] = []

    def on_delivery(err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            errors.append(err)
        else:
            delivered.add((msg.key(), msg.partition(), msg.offset()))

    producer = Producer(kafka_config.confluent(**{"acks": "all", "enable.idempotence": True}))
    for event in sent:
        producer.produce(
            topic,
            key=event.effect_id.encode(),
            value=codec.encode(event),
            headers=[codec.header(event)],
            on_delivery=on_delivery,
        )
    assert producer.flush(TIMEOUT) == 0, "messages still queued after flush"
    assert errors == []
    assert len(delivered) == len(sent)

    consumer = Consumer(
        kafka_config.confluent(
            **{
                "group.id": group_id(),
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
            }
        )
    )
    received: list[Message] = []
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + TIMEOUT
        while len(received) < len(sent) and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            received.append(msg)
    finally:
        consumer.close()
    assert len(received) == len(sent), f"got {len(received)} of {len(sent)} within {TIMEOUT} s"

    decoded = [codec.decode(msg.value()) for msg in received]
    assert sorted(decoded, key=sent.index) == sent  # every event once, each exactly as sent
    # The producer was told where each message went; the consumer found them there.
    assert {(msg.key(), msg.partition(), msg.offset()) for msg in received} == delivered

    by_key: dict[bytes | None, list[tuple[Message, Any]]] = defaultdict(list)
    for msg, event in zip(received, decoded, strict=True):
        assert msg.key() == event.effect_id.encode()
        assert msg.headers() == [(HEADER, f"effect_ledger.{type(event).__name__}".encode())]
        by_key[msg.key()].append((msg, event))

    assert len(by_key) == 3
    for key, pairs in by_key.items():
        # One key, one partition, and within it the order the events were produced in.
        assert len({msg.partition() for msg, _ in pairs}) == 1, key
        offsets = [msg.offset() or 0 for msg, _ in pairs]
        assert offsets == sorted(offsets), key
        assert [event for _, event in pairs] == [e for e in sent if e.effect_id.encode() == key]


def test_wait_ready_without_a_broker() -> None:
    cfg = KafkaConfig(bootstrap="127.0.0.1:1")  # nothing listens on port 1
    started = time.monotonic()
    with pytest.raises(BrokerUnavailable, match=r"127\.0\.0\.1:1 within 2 s"):
        wait_ready(cfg, timeout=2)
    elapsed = time.monotonic() - started
    # It keeps trying until the deadline, and gives up soon after (one metadata request may overrun).
    assert 1.9 <= elapsed < 5.0, elapsed

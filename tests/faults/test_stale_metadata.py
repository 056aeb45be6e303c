"""A client whose metadata is stale does not fail an agent's call: when a broker dies its partitions'
leaders move, and until librdkafka asks for metadata again (on its own, every few minutes) a
watermark query answers "Local: Unknown partition". Agents read the high watermarks of their key's
partition before every claimed call (``claims.Watermarks``): that error was not asked again, and a
third to three quarters of the calls failed for minutes after one broker of three died.

One broker reproduces the stale cache the same way: partitions added after the client read the
topic's metadata are unknown to it until it asks again.
"""

from __future__ import annotations

import asyncio
import time

from confluent_kafka import Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions

from effect_ledger.sdk.kafka.claims import Watermarks
from effect_ledger.streams.config import KafkaConfig
from effect_ledger.streams.watermarks import watermarks


def add_partition(cfg: KafkaConfig, *topics: str) -> None:
    admin = AdminClient(cfg.confluent())
    for fut in admin.create_partitions([NewPartitions(t, cfg.partitions + 1) for t in topics]).values():
        fut.result(30)


def test_a_watermark_read_survives_a_stale_partition_map(kafka_config: KafkaConfig) -> None:
    topic = kafka_config.topics.state
    c = Consumer(kafka_config.confluent(**{"group.id": "stale-map"}))
    try:
        assert watermarks(c, TopicPartition(topic, 0), time.monotonic() + 10) == (0, 0)
        add_partition(kafka_config, topic)
        new = TopicPartition(topic, kafka_config.partitions)
        try:  # what the client answers on its own: the partition is unknown to its cache
            c.get_watermark_offsets(new, 2, False)
            stale = False
        except KafkaException:
            stale = True
        assert stale, "the client learnt the new partition by itself: this test no longer shows the stale cache"
        assert watermarks(c, new, time.monotonic() + 10) == (0, 0)
    finally:
        c.close()


def test_the_claims_watermarks_survive_a_stale_partition_map(kafka_config: KafkaConfig) -> None:
    marks = Watermarks(kafka_config)
    try:
        assert asyncio.run(marks.highs(0)) == (0, 0)  # the consumer exists, its metadata cached
        add_partition(kafka_config, kafka_config.topics.events, kafka_config.topics.decisions)
        assert asyncio.run(marks.highs(kafka_config.partitions)) == (0, 0)
    finally:
        marks.close()

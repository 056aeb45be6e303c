"""A key's partition, as the broker sees it: a confluent-kafka producer configured like the relay
(``effect_ledger.sdk.kafka.relay.producer_config``) puts each key on
``effect_ledger.streams.partition.partition_for(key, n)``,
the partition Kafka's Java client and aiokafka (hence faust, the processor, its timeout commands and
its table's changelog) compute."""

from __future__ import annotations

import random
import string
import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka import KafkaError, Message, Producer

from effect_ledger.sdk.kafka.relay import producer_config
from effect_ledger.streams.admin import delete_topics, ensure_topics
from effect_ledger.streams.config import KafkaConfig
from effect_ledger.streams.partition import partition_for

TIMEOUT = 30.0
KEYS = 300


def random_keys(seed: int) -> list[bytes]:
    """Keys of every shape the SDK produces or accepts: derived ``target:sha256`` keys, caller keys of
    1..255 printable characters, and a few non-ASCII ones (UTF-8 bytes on the wire)."""
    rnd = random.Random(seed)
    alphabet = string.ascii_letters + string.digits + "-_.:/#?%=+"
    keys: set[bytes] = set()
    while len(keys) < KEYS:
        kind = rnd.randrange(4)
        if kind == 0:
            keys.add(f"payments:{rnd.getrandbits(256):064x}".encode())
        elif kind == 1:
            keys.add("".join(rnd.choices(alphabet, k=rnd.randint(1, 255))).encode())
        elif kind == 2:
            keys.add(f"order-{rnd.randint(0, 10**6)}/réfund-ü{rnd.randint(0, 99)}".encode())
        else:
            keys.add(uuid.UUID(int=rnd.getrandbits(128)).hex.encode())
    return sorted(keys)


@pytest.fixture(params=[3, 6], ids=["3-partitions", "6-partitions"])
def topics(request: pytest.FixtureRequest, kafka_bootstrap: str) -> Iterator[KafkaConfig]:
    cfg = KafkaConfig(bootstrap=kafka_bootstrap, prefix=f"t{uuid.uuid4().hex[:12]}.", partitions=request.param)
    ensure_topics(cfg)
    try:
        yield cfg
    finally:
        delete_topics(cfg, list(cfg.topics.all()))


def test_relay_producer_puts_each_key_on_partition_for(topics: KafkaConfig) -> None:
    cfg = topics
    keys = random_keys(seed=cfg.partitions)
    placed: dict[bytes, int] = {}
    errors: list[KafkaError] = []

    def on_delivery(err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            errors.append(err)
        else:
            placed[msg.key()] = msg.partition()

    producer = Producer(producer_config(cfg))
    for key in keys:
        producer.produce(cfg.topics.events, key=key, value=b"x", on_delivery=on_delivery)
        producer.poll(0)
    assert producer.flush(TIMEOUT) == 0, "messages still queued after flush"
    assert errors == []
    assert len(placed) == KEYS

    expected = {k: partition_for(k, cfg.partitions) for k in keys}
    wrong = {k: (p, expected[k]) for k, p in placed.items() if p != expected[k]}
    assert wrong == {}, f"{len(wrong)} of {KEYS} keys not on partition_for's partition: {list(wrong.items())[:3]}"
    # Not vacuous: the keys spread over every partition.
    assert set(placed.values()) == set(range(cfg.partitions))


def test_partition_for_matches_known_java_client_values() -> None:
    """Reference values of Kafka's Java ``Utils.toPositive(Utils.murmur2(key)) % n`` (from
    ``org.apache.kafka.common.utils.UtilsTest``: murmur2 of these strings), so the function is
    checked against the Java client, not only against librdkafka's murmur2."""
    java_murmur2 = {  # signed 32-bit results, as UtilsTest lists them
        b"21": -973932308,
        b"foobar": -790332482,
        b"a-little-bit-long-string": -985981536,
        b"a-little-bit-longer-string": -1486304829,
        b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
        b"abc": 479470107,
    }
    for key, signed in java_murmur2.items():
        for n in (1, 3, 6, 7):
            assert partition_for(key, n) == (signed & 0x7FFFFFFF) % n, (key, n)

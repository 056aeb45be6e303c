"""Which partition a key lands on: Kafka's default partitioner, ``toPositive(murmur2(key)) % n``,
as the Java client and aiokafka (hence faust) compute it. The relay's confluent-kafka producer is
configured with the same (``partitioner=murmur2_random``), so an agent's event, the processor's
timeout command and the table's changelog agree on a key's partition
(``tests/integration/test_partitioning.py`` checks it against the broker)."""

from __future__ import annotations

from aiokafka.partitioner import murmur2


def partition_for(key: bytes, partitions: int) -> int:
    return (murmur2(key) & 0x7FFFFFFF) % partitions

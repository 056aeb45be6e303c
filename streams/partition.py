"""Which partition a key lands on: Kafka's default partitioner, ``toPositive(murmur2(key)) % n``,
as the Java client and aiokafka (hence faust) compute it. The relay's confluent-kafka producer is
configured with the same (``partitioner=murmur2_random``), so an agent's event, the processor's
timeout command and the table's changelog agree on a key's partition
(``tests/integration/test_partitioning.py`` checks it against the broker).

murmur2 is written out here rather than imported from aiokafka so that the base install (no Kafka
client) can name a key's partition too. ``tests/unit/streams/test_partition.py`` pins it to the Java
client's reference values and to aiokafka's function. Never change it: a key would move partition.
"""

from __future__ import annotations

_SEED = 0x9747B28C
_M = 0x5BD1E995
_MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's ``Utils.murmur2``: MurmurHash2 (32 bit, seed 0x9747b28c), as a signed 32-bit int
    like Java's."""
    length = len(data)
    h = (_SEED ^ length) & _MASK
    end = length - length % 4
    for i in range(0, end, 4):
        k = int.from_bytes(data[i : i + 4], "little")
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = ((h * _M) & _MASK) ^ k
    rest = length % 4
    # Java's switch falls through: 3 then 2 then 1.
    if rest == 3:
        h ^= data[end + 2] << 16
    if rest >= 2:
        h ^= data[end + 1] << 8
    if rest >= 1:
        h ^= data[end]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def partition_for(key: bytes, partitions: int) -> int:
    """The partition of ``key`` among ``partitions``: ``toPositive(murmur2(key)) % partitions``."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions

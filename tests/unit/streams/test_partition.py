"""``partition_for`` is Kafka's default partitioner (``toPositive(murmur2(key)) % n``): pinned to the
Java client's reference values, and to aiokafka's murmur2 (what faust partitions by) when it is
installed. A change here would move keys between partitions: the processor would stop finding them."""

from __future__ import annotations

import random

import pytest

from effect_ledger.streams.partition import murmur2, partition_for

# org.apache.kafka.common.utils.UtilsTest#testMurmur2: signed 32-bit results.
JAVA_MURMUR2 = {
    b"21": -973932308,
    b"foobar": -790332482,
    b"a-little-bit-long-string": -985981536,
    b"a-little-bit-longer-string": -1486304829,
    b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    b"abc": 479470107,
}

EXPECTED_TAILS = {b"a": -1563381124, b"ab": 316155434, b"abcd": -1323649548, b"abcde": 461995741}


@pytest.mark.parametrize("key", list(JAVA_MURMUR2))
def test_murmur2_is_the_java_clients(key: bytes) -> None:
    assert murmur2(key) == JAVA_MURMUR2[key]


@pytest.mark.parametrize("n", [1, 3, 6, 7, 12])
def test_partition_is_to_positive_murmur2_mod_n(n: int) -> None:
    for key, signed in JAVA_MURMUR2.items():
        assert partition_for(key, n) == (signed & 0x7FFFFFFF) % n


def test_every_tail_length_and_the_empty_key() -> None:
    # Keys of 0-3 bytes beyond a multiple of four take different branches of the tail; the values
    # are aiokafka's (kafka-python's) murmur2, read as signed 32-bit ints.
    assert murmur2(b"") == 275646681
    assert {k: murmur2(k) for k in (b"a", b"ab", b"abcd", b"abcde")} == EXPECTED_TAILS


def test_matches_aiokafka() -> None:
    partitioner = pytest.importorskip("aiokafka.partitioner", reason="aiokafka is in the [processor] extra")
    rng = random.Random(9)
    keys = [rng.randbytes(rng.randrange(0, 70)) for _ in range(2000)]
    keys += [f"effect-{i}".encode() for i in range(500)] + [bytes([b]) * 5 for b in (0, 127, 128, 255)]
    default = partitioner.DefaultPartitioner()
    for key in keys:
        assert murmur2(key) & 0xFFFFFFFF == partitioner.murmur2(key) & 0xFFFFFFFF, key
        for n in (1, 6, 7):
            assert partition_for(key, n) == default(key, list(range(n)), list(range(n))), (key, n)

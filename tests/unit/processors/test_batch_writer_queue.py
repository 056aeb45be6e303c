"""The processor's batch writer (processors/batch_writer.py) when the producer's local queue is full:
every record is still produced, once, in the order given, and the flush returns once all are
delivered. (The writes against a real broker: tests/integration/test_batch_writer.py.)"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from effect_ledger.processors.batch_writer import BatchWriter


class _Msg:
    def __init__(self, topic: str, partition: int, offset: int) -> None:
        self._t, self._p, self._o = topic, partition, offset

    def topic(self) -> str:
        return self._t

    def partition(self) -> int:
        return self._p

    def offset(self) -> int:
        return self._o


class _QueueFullProducer:
    """Refuses every other produce with BufferError (a full local queue) until polled."""

    def __init__(self) -> None:
        self.produced: list[tuple[str, int, bytes, bytes | None]] = []
        self._queued: list[tuple[str, int, Callable[[Any, Any], None]]] = []
        self._full = False

    def produce(self, topic: str, value: bytes | None, key: bytes, partition: int,
                headers: Any = None, on_delivery: Callable[[Any, Any], None] | None = None) -> None:  # fmt: skip
        self._full = not self._full
        if self._full:
            raise BufferError("Local: Queue full")
        assert on_delivery is not None
        self.produced.append((topic, partition, key, value))
        self._queued.append((topic, partition, on_delivery))

    def poll(self, timeout: float) -> int:
        self._full = False
        return 0

    def flush(self, timeout: float) -> int:
        for i, (topic, partition, cb) in enumerate(self._queued):
            cb(None, _Msg(topic, partition, i))
        self._queued = []
        return 0

    def __len__(self) -> int:
        return len(self._queued)


class _Db:
    def __init__(self) -> None:
        self.written: list[list[tuple[bytes, bytes]]] = []

    def write(self, batch: list[tuple[bytes, bytes]]) -> None:
        self.written.append(list(batch))


class _Batch(list[tuple[bytes, bytes]]):
    def put(self, key: bytes, value: bytes) -> None:
        self.append((key, value))


def test_a_full_queue_delays_records_and_loses_none() -> None:
    producer, db, offsets = _QueueFullProducer(), _Db(), {}
    w = BatchWriter(producer, "changelog", lambda p: db, _Batch, offsets.__setitem__)
    w.put(0, b"k1", b"v1")
    w.put(0, b"k2", b"v2")
    w.produce("state", 0, b"k1", b"s1", [("h", b"x")])
    w.produce("state", 0, b"k2", b"s2")
    w.produce("uncertain", 0, b"k2", b"u2")
    asyncio.run(w.flush())
    assert producer.produced == [
        ("changelog", 0, b"k1", b"v1"), ("changelog", 0, b"k2", b"v2"),
        ("state", 0, b"k1", b"s1"), ("state", 0, b"k2", b"s2"), ("uncertain", 0, b"k2", b"u2"),
    ]  # fmt: skip
    assert db.written == [[(b"k1", b"v1"), (b"k2", b"v2")]]
    assert offsets == {0: 1}  # the last changelog record's offset

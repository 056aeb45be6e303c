"""The effects table's memory store (``--store memory://``): faust's, applying a recovery's
changelog records through ``late_records.weigh``, as the RocksDB store does (``rocks.Store``), so a
late record of a previous owner does not replace the newer value held. Registered under the
``faust.stores`` entry point as ``effects-memory`` (pyproject.toml)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from faust.stores import memory as faust_memory

from effect_ledger.processors.late_records import LateRecords, weigh

#: The store's URL scheme (the ``faust.stores`` entry point in pyproject.toml).
SCHEME = "effects-memory"


class Store(faust_memory.Store):
    """faust's memory store (decoded keys in a dict), its recoveries weighed."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.late = LateRecords()
        # (held, incoming) -> their union's value: set by the processor (``late_records.weigh``)
        self.merge: Callable[[bytes, bytes], bytes | None] | None = None

    def apply_changelog_batch(
        self, batch: Iterable[Any], to_key: Callable[[Any], Any], to_value: Callable[[Any], Any]
    ) -> None:
        records, keys, topic = [], {}, ""
        for event in batch:
            msg = event.message
            records.append((msg.partition, msg.key, msg.value, msg.offset))
            keys[msg.key] = to_key(event.key)
            topic = msg.topic
        writes = weigh(records, lambda _p, raw: self.data.get(keys[raw]), self.late, topic, self.merge)
        for partition, values in writes.items():
            for raw, value in values.items():
                key = keys[raw]
                if value is None:
                    self.data.pop(key, None)
                    self._key_partition.pop(key, None)
                else:
                    self.data[key] = value
                    self._key_partition[key] = partition

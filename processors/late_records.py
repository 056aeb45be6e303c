"""Late changelog records: a value an old owner of a table partition wrote, landing after the new
owner's.

A worker writes a batch's table values to the changelog and waits for Kafka to acknowledge them
(``batch_writer``). If it is paused or cut from the brokers while a batch is on its way, the group
gives its partitions to another worker, which folds on and writes newer values of the same keys;
the old batch is delivered when the worker wakes or the network heals, *after* the new owner's
records. Whoever recovers the partition next reads the changelog in the log's order and, as faust
does, would take the last record of a key: the old value, with facts the effect had long passed (a
key a caller holds a receipt for, back to PENDING; timed out again; escalated).

Every table value says how many facts of each topic it folds, and every owner folds a key's facts
in the log's order, so of two values, one holding at least as many of each topic's facts holds all
of the other's (``table_value.compare``). Three parts:

1. ``weigh``: the changelog records a store applies while it recovers, each weighed against the
   value held (in the store, or earlier in the same batch). A record whose facts the value held
   all has is not applied; one holding facts the value held lacks while lacking some of its own
   (a late record folding a decision the next owner had not reached) is merged with it (the union
   of their facts: ``core.effect.merge``). Either way the key is noted.
2. ``LateRecords``: the keys noted, per partition, until the partition's owner writes the value it
   holds again (``LedgerProcessor._write_kept_again``), so that the log's last record of the key is
   the newest value again: a compacted changelog keeps only the last record of a key, and a worker
   recovering the partition from an empty store would otherwise find the late value alone. A key
   whose later record is applied in the same recovery needs nothing: it is no longer noted.

Both stores (``rocks.Store``, ``memory_store.Store``) apply their recoveries through ``weigh``.

3. ``foreign_keys``: a late record that lands while the new owner holds the partition is not read
   by it (a worker writes its changelog, it does not read it). It shows as a gap between the owner's
   own offsets (``batch_writer``, ``foreign``); the owner reads the records in the gap and writes
   its values of their keys again at once, so the late value is not the key's last record for
   long, whether or not anyone recovers the partition before compaction.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

from effect_ledger.processors import table_value

log = logging.getLogger("effect_ledger.processor")

#: Keys noted and not yet written again, over all partitions. Past it, further keys are counted and
#: not noted: a recovery reading a stretch of the changelog that this worker's store already holds
#: (``processor._persist_changelog_offset``) notes every key of it, and the count stays bounded.
MAX_NOTED = 100_000
#: At most this many noted keys are written again with one batch (each a table read and a changelog
#: record): the rest with the next ones.
MAX_REWRITE = 1_000

#: At most this many records are read from the gaps after one batch, for at most this long: a late
#: batch is one batch (the fold writer's records of one flush), and the fold waits for the read.
MAX_FOREIGN_RECORDS = 20_000
FOREIGN_READ_S = 10.0


class LateRecords:
    """The keys, per table partition, whose changelog records were not applied because the value
    held was newer; taken by the partition's owner, which writes the held values again."""

    def __init__(self, limit: int = MAX_NOTED) -> None:
        self._keys: dict[int, dict[bytes, int]] = {}  # partition -> key -> offset of the late record
        self._limit = limit
        self._noted = 0
        self.kept = 0  # records not applied, since the worker started
        self.dropped = 0  # of which, keys not noted (over the limit)

    def __len__(self) -> int:
        return self._noted

    def forget(self, partition: int, key: bytes) -> None:
        """A later record of the key was applied: the log's last record of it is the value held."""
        keys = self._keys.get(partition)
        if keys is not None and keys.pop(key, None) is not None:
            self._noted -= 1

    def note(self, partition: int, key: bytes, offset: int) -> None:
        self.kept += 1
        keys = self._keys.setdefault(partition, {})
        if key in keys:
            keys[key] = max(keys[key], offset)
            return
        if self._noted >= self._limit:
            self.dropped += 1
            return
        keys[key] = offset
        self._noted += 1

    def take(self, partitions: Iterable[int], limit: int = MAX_REWRITE) -> dict[int, list[bytes]]:
        """At most ``limit`` of the keys noted in ``partitions`` (forgotten here, until ``again``):
        their owner writes them again."""
        out: dict[int, list[bytes]] = {}
        for p in partitions:
            keys = self._keys.get(p)
            while keys and limit > 0:
                key, _ = keys.popitem()
                out.setdefault(p, []).append(key)
                self._noted -= 1
                limit -= 1
            if keys is not None and not keys:
                del self._keys[p]
        return out

    def again(self, taken: dict[int, list[bytes]]) -> None:
        """Keys ``take`` gave whose values were not written after all (the batch was let go, or
        failed): noted again."""
        for p, keys in taken.items():
            for key in keys:
                self.note(p, key, -1)
            self.kept -= len(keys)  # counted once, when first kept


def weigh(
    records: Iterable[tuple[int, Any, bytes | None, int]],
    held: Callable[[int, Any], bytes | None],
    late: LateRecords,
    changelog: str = "",
    merge: Callable[[bytes, bytes], bytes | None] | None = None,
) -> dict[int, dict[Any, bytes | None]]:
    """The writes a store makes for changelog ``records`` (partition, key, value or None for a
    tombstone, offset; in the log's order): per partition, each key's value after the last record,
    weighed (``table_value.compare``) against the value held before it (``held(partition, key)``:
    the store's, or the batch's own). A record not applied, or merged (``merge(held, incoming)``:
    the value of the union of their facts, None if it cannot be made; without ``merge`` the record
    is applied as faust would), is noted in ``late``, and logged once per partition and batch."""
    writes: dict[int, dict[Any, bytes | None]] = {}
    weighed: dict[int, list[int]] = {}  # partition -> [kept, merged, last offset]
    for partition, key, value, offset in records:
        pending = writes.setdefault(partition, {})
        before = pending[key] if key in pending else held(partition, key)
        raw = key if isinstance(key, bytes) else bytes(key)
        how = table_value.compare(before, value)
        if how == table_value.MERGE and merge is not None and before is not None and value is not None:
            union = merge(before, value)
            if union is not None:
                pending[key] = union
                late.note(partition, raw, offset)
                w = weighed.setdefault(partition, [0, 0, offset])
                w[1], w[2] = w[1] + 1, offset
                continue
        if how == table_value.KEEP:
            late.note(partition, raw, offset)
            w = weighed.setdefault(partition, [0, 0, offset])
            w[0], w[2] = w[0] + 1, offset
            continue
        pending[key] = value
        late.forget(partition, raw)
    for partition, (kept, merged, offset) in sorted(weighed.items()):
        log.warning(
            "changelog %s partition %d: of its records up to offset %d, %d hold only facts the value held has (late "
            "records of a previous owner, or records this store holds newer values of): not applied; %d merged with "
            "the value held; the owner writes those values again",
            changelog, partition, offset, kept, merged,
        )  # fmt: skip
    return writes


def foreign_keys(
    consumer: Any,
    topic: str,
    gaps: list[tuple[int, int, int]],
    limit: int = MAX_FOREIGN_RECORDS,
    timeout_s: float = FOREIGN_READ_S,
) -> tuple[list[tuple[int, bytes, int]], str | None]:
    """The (partition, key, offset) of the records in ``gaps`` ((partition, first, end): offsets
    first..end-1) of ``topic``, read with ``consumer`` (a confluent-kafka ``Consumer``, assigned
    here, not subscribed), and why the read stopped short (None: every gap was read). Runs in a
    thread: it blocks."""
    from confluent_kafka import TopicPartition

    found: list[tuple[int, bytes, int]] = []
    end_by = time.monotonic() + timeout_s
    try:
        for partition, first, end in gaps:
            consumer.assign([TopicPartition(topic, partition, first)])
            while True:
                if len(found) >= limit:
                    return found, f"more than {limit} records"
                if time.monotonic() > end_by:
                    return found, f"not read within {timeout_s:.0f} s"
                m = consumer.poll(0.5)
                if m is None:
                    continue
                if m.error() is not None:
                    if m.error().fatal() or not m.error().retriable():
                        return found, str(m.error())
                    continue
                if m.offset() >= end:  # compaction removed the rest of the gap: this is the owner's own
                    break
                if m.key() is not None:
                    found.append((partition, bytes(m.key()), m.offset()))
                if m.offset() >= end - 1:
                    break
        return found, None
    finally:
        # Assigned, the client would go on fetching the partition in the background for nothing.
        consumer.unassign()


__all__ = ["FOREIGN_READ_S", "MAX_FOREIGN_RECORDS", "MAX_NOTED", "MAX_REWRITE", "LateRecords", "foreign_keys", "weigh"]

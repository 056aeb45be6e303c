"""The effects table's RocksDB store, with one memory bound for a worker.

faust's own RocksDB options (``faust.stores.rocksdb.RocksDBOptions.as_options``) give each
partition's database its own block cache and keep every table file's index and filter blocks
outside any cache. Those blocks grow with the table (~1.4 MB per 100,000 effects), so a worker's
memory grew with every effect it had ever seen, and with the number of partitions it held.

Here every database a worker opens shares one LRU cache of ``cache_bytes``; the index and filter
blocks live in it (those of level 0 pinned while their file is open, since every read touches
them), and the memtables are charged to it through one write buffer manager of
``memtables_bytes``. RocksDB's memory in a worker is then about ``cache_bytes`` whatever the
table's size or how many partitions the worker holds.

The store is faust's RocksDB store (rocksdict driver) with these options, registered under the
``faust.stores`` entry point as ``effects-rocksdb`` (pyproject.toml): faust's documented way to
add a store. It applies a recovery's changelog records through ``late_records.weigh``: a late
record of a previous owner does not replace the newer value held.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import rocksdict
from faust.stores import rocksdb as faust_rocksdb

from effect_ledger.processors import _faust_internals as faust_internals
from effect_ledger.processors.late_records import LateRecords, weigh

log = logging.getLogger("effect_ledger.processor")

#: The store's URL scheme (the ``faust.stores`` entry point in pyproject.toml).
SCHEME = "effects-rocksdb"

#: A worker's RocksDB memory: the shared cache, of which the memtables may take ``memtables_bytes``.
#: Reads are of recent keys (in the fold's own cache of 10,000 keys, the memtables or the OS's page
#: cache), so the cache holds the index and filter blocks above all: ~14 MB for 1,000,000 effects.
CACHE_BYTES = 96 << 20
MEMTABLES_BYTES = 48 << 20
#: One memtable of a partition is flushed at this size; two at most per partition.
WRITE_BUFFER_BYTES = 8 << 20
MAX_WRITE_BUFFERS = 2


class _Shared:
    """The process's one cache and write buffer manager, made on first use (a worker process opens
    its partitions' databases one by one, as faust assigns them)."""

    cache: rocksdict.Cache | None = None
    buffers: rocksdict.WriteBufferManager | None = None

    sizes: tuple[int, int] | None = None

    @classmethod
    def get(cls, cache_bytes: int, memtables_bytes: int) -> tuple[rocksdict.Cache, rocksdict.WriteBufferManager]:
        if cls.cache is None or cls.buffers is None:
            cls.cache = rocksdict.Cache(cache_bytes)
            # allow_stall=False: past the limit RocksDB flushes the largest memtable, it does not
            # stop writers (a soft limit: the memtables may pass it while a flush runs).
            cls.buffers = rocksdict.WriteBufferManager.new_write_buffer_manager_with_cache(
                memtables_bytes, False, cls.cache
            )
            cls.sizes = (cache_bytes, memtables_bytes)
        elif cls.sizes != (cache_bytes, memtables_bytes):
            log.warning(
                "RocksDB cache already made with %s; %s asked for later is not applied", cls.sizes,
                (cache_bytes, memtables_bytes),
            )  # fmt: skip
        return cls.cache, cls.buffers


class BoundedOptions(faust_rocksdb.RocksDBOptions):
    """faust's options with the shared cache: index and filter blocks in it, memtables charged
    to it."""

    def __init__(
        self, *, cache_bytes: int = CACHE_BYTES, memtables_bytes: int = MEMTABLES_BYTES, **kwargs: Any
    ) -> None:
        kwargs.setdefault("write_buffer_size", WRITE_BUFFER_BYTES)
        kwargs.setdefault("max_write_buffer_number", MAX_WRITE_BUFFERS)
        super().__init__(use_rocksdict=True, **kwargs)
        self.cache_bytes = cache_bytes
        self.memtables_bytes = memtables_bytes

    def open(self, path: Path, *, read_only: bool = False) -> rocksdict.Rdict:
        """Open (or create) one partition's database with these options. rocksdict opens an existing
        database's column families with the options saved in its OPTIONS file, where the cache and
        the write buffer manager cannot be (pointers): a reopened partition got RocksDB's default
        8 MB cache of its own, its index and filter blocks outside it. Naming the default column
        family's options keeps ours."""
        access = rocksdict.AccessType.read_write() if self.ttl is None else rocksdict.AccessType.with_ttl(self.ttl)
        db = rocksdict.Rdict(
            str(path), options=self.as_options(), column_families={"default": self.as_options()}, access_type=access
        )
        db.set_read_options(rocksdict.ReadOptions())
        return db

    def as_options(self) -> rocksdict.Options:
        cache, buffers = _Shared.get(self.cache_bytes, self.memtables_bytes)
        o = rocksdict.Options(raw_mode=True)
        o.create_if_missing(True)
        o.set_max_open_files(-1 if self.max_open_files is None else self.max_open_files)  # -1: no limit
        o.set_write_buffer_size(self.write_buffer_size)
        o.set_target_file_size_base(self.target_file_size_base)
        o.set_max_write_buffer_number(self.max_write_buffer_number)
        o.set_write_buffer_manager(buffers)
        t = rocksdict.BlockBasedOptions()
        t.set_bloom_filter(self.bloom_filter_size, True)
        t.set_index_type(rocksdict.BlockBasedIndexType.binary_search())
        t.set_block_cache(cache)
        t.set_cache_index_and_filter_blocks(True)
        t.set_pin_l0_filter_and_index_blocks_in_cache(True)
        o.set_block_based_table_factory(t)
        return o


class Store(faust_rocksdb.Store):
    """faust's RocksDB store (rocksdict) opening its partitions with :class:`BoundedOptions`.

    The table's ``options`` may set ``cache_bytes`` and ``memtables_bytes`` (the first store of a
    process sizes the shared cache) and any of faust's own RocksDB options."""

    def __init__(self, *args: Any, options: dict[str, Any] | None = None, **kwargs: Any) -> None:
        opts = dict(options or {})  # faust's store pops keys from the dict it is given
        opts.pop("driver", None)
        bounded = {k: opts.pop(k) for k in ("cache_bytes", "memtables_bytes") if k in opts}
        super().__init__(*args, options={**opts, "driver": "rocksdict"}, **kwargs)
        self.rocksdb_options = BoundedOptions(**bounded, **dict(self.options or {}))
        self.late = LateRecords()
        # (held, incoming) -> their union's value: set by the processor (``late_records.weigh``)
        self.merge: Callable[[bytes, bytes], bytes | None] | None = None

    def apply_changelog_batch(
        self, batch: Iterable[Any], to_key: Callable[[Any], Any], to_value: Callable[[Any], Any]
    ) -> None:
        """faust's recovery (and standby) write of changelog records, each weighed against the value
        held (``late_records.weigh``): one RocksDB write batch per partition, then the last offset
        read per partition (the records not applied were read all the same)."""
        offsets: dict[Any, int] = {}
        records = []
        for event in batch:
            msg = event.message
            tp = msg.tp
            offsets[tp] = max(msg.offset, offsets.get(tp, -1))
            records.append((msg.partition, msg.key, msg.value, msg.offset))
        topic = next(iter(offsets)).topic if offsets else ""
        writes = weigh(records, lambda p, key: self._db_for_partition(p).get(key), self.late, topic, self.merge)
        for partition, values in writes.items():
            wb = rocksdict.WriteBatch(raw_mode=True)
            for key, value in values.items():
                if value is None:
                    wb.delete(key)
                else:
                    wb.put(key, value)
            self._db_for_partition(partition).write(wb)
        for tp, offset in offsets.items():
            self.set_persisted_offset(tp, offset)

    def memory(self) -> dict[str, int]:
        """RocksDB's counts of its memory over the partitions this store has open (:func:`memory`)."""
        return memory(faust_internals.open_databases(self))


def memory(dbs: Any) -> dict[str, int]:
    """RocksDB's own counts of its memory, in bytes, over the databases ``dbs`` (an iterable of
    rocksdict databases): the shared cache's use and capacity (index and filter blocks, data
    blocks and the memtables' reservation), the memtables, and table readers outside the cache."""
    dbs = list(dbs)
    out = {"cache_capacity": 0, "cache_usage": 0, "cache_pinned": 0, "memtables": 0, "table_readers": 0}
    if not dbs:
        return out
    first = dbs[0]
    # One cache for all: read its figures once.
    out["cache_capacity"] = int(first.property_int_value("rocksdb.block-cache-capacity") or 0)
    out["cache_usage"] = int(first.property_int_value("rocksdb.block-cache-usage") or 0)
    out["cache_pinned"] = int(first.property_int_value("rocksdb.block-cache-pinned-usage") or 0)
    for db in dbs:
        out["memtables"] += int(db.property_int_value("rocksdb.cur-size-all-mem-tables") or 0)
        out["table_readers"] += int(db.property_int_value("rocksdb.estimate-table-readers-mem") or 0)
    return out


def store_url(url: str) -> str:
    """The store faust opens for a worker's ``--store``: ``rocksdb://`` is this module's store
    (same files on disk as faust's own), ``memory://`` ``memory_store``'s (faust's, its recoveries
    weighed); anything else is faust's."""
    if url.startswith("rocksdb:"):
        return f"{SCHEME}://"
    if url.startswith("memory:"):
        from effect_ledger.processors import memory_store

        return f"{memory_store.SCHEME}://"
    return url

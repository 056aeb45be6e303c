"""The worker's RocksDB store (processors/rocks.py): one memory bound for every partition it opens.

Each test sets the shared cache's size itself (``fresh_cache``): the first store of a process sizes
it, as in a worker."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import faust
import pytest
import rocksdict
from faust.stores import rocksdb as faust_rocksdb

from effect_ledger.processors import memory_store, rocks
from tests.services import wait_for


@pytest.fixture
def fresh_cache() -> Iterator[None]:
    rocks._Shared.cache = rocks._Shared.buffers = rocks._Shared.sizes = None
    yield
    rocks._Shared.cache = rocks._Shared.buffers = rocks._Shared.sizes = None


def _fill(db: rocksdict.Rdict, n: int, tag: bytes = b"") -> None:
    wb = rocksdict.WriteBatch(raw_mode=True)
    for i in range(n):
        wb.put(tag + b"effect-%09d" % i, os.urandom(24))
    db.write(wb)


def _prop(db: rocksdict.Rdict, name: str) -> int:
    return int(db.property_int_value(f"rocksdb.{name}") or 0)


_BACKGROUND = ("num-running-flushes", "num-running-compactions", "mem-table-flush-pending", "compaction-pending")


def _cache_usage(*dbs: rocksdict.Rdict) -> list[int]:
    """Each database's block cache usage once none of them flushes or compacts: RocksDB's background
    work (and the memtables the write buffer manager charges to the cache) changes it at any moment."""
    wait_for(lambda: not any(_prop(db, name) for db in dbs for name in _BACKGROUND), 20.0, "background work to end")
    return [_prop(db, "block-cache-usage") for db in dbs]


def test_faust_finds_the_store_through_its_entry_point() -> None:
    assert faust.stores.by_url(f"{rocks.SCHEME}://") is rocks.Store
    assert rocks.store_url("rocksdb://") == f"{rocks.SCHEME}://"
    assert rocks.store_url("memory://") == f"{memory_store.SCHEME}://"
    assert faust.stores.by_url(f"{memory_store.SCHEME}://") is memory_store.Store


def test_a_workers_table_opens_its_partitions_with_the_bounded_options(tmp_path: Path, fresh_cache: None) -> None:
    """What the worker does (processor.py): the app's store URL is rocks.store_url("rocksdb://")."""
    app = faust.App("rocks-test", store=rocks.store_url("rocksdb://"), datadir=str(tmp_path))
    table = app.Table("effects", default=None, partitions=2, key_type=str, value_type=bytes)
    store = table.data
    assert isinstance(store, rocks.Store)
    dbs = [store._db_for_partition(p) for p in (0, 1)]
    try:
        _fill(dbs[0], 1000, b"a")
        _fill(dbs[1], 40_000, b"b")
        for db in dbs:  # one cache, with RocksDB's default of 2 GB per database replaced
            assert _prop(db, "block-cache-capacity") == rocks.CACHE_BYTES
        mem = store.memory()
        assert mem["cache_capacity"] == rocks.CACHE_BYTES
        assert mem["memtables"] == sum(_prop(db, "cur-size-all-mem-tables") for db in dbs)
        assert mem["memtables"] > _prop(dbs[1], "cur-size-all-mem-tables") > _prop(dbs[0], "cur-size-all-mem-tables")
    finally:
        for db in dbs:
            db.close()


def test_index_and_filter_blocks_live_in_the_shared_cache(tmp_path: Path, fresh_cache: None) -> None:
    """A table file's index and filter blocks grow with the table: with faust's own options they
    are held by the file's reader outside any cache; here they are in the one cache, whose capacity
    bounds them."""
    theirs = faust_rocksdb.RocksDBOptions(use_rocksdict=True).open(tmp_path / "faust")
    ours = [rocks.BoundedOptions(cache_bytes=4 << 20).open(tmp_path / f"ours-{i}") for i in range(2)]
    try:
        for db in (theirs, *ours):
            for part in range(4):  # four table files each
                _fill(db, 50_000, b"%d" % part)
                db.flush()
        assert _prop(theirs, "estimate-table-readers-mem") > 100_000
        for db in ours:
            assert _prop(db, "estimate-table-readers-mem") < 10_000
        usage = set(_cache_usage(*ours))
        assert len(usage) == 1  # one cache
        # Level 0's blocks are pinned while their file is open (RocksDB compacts level 0 away from
        # four files on): the cache may hold them beyond its capacity, and nothing else.
        pinned = _prop(ours[0], "block-cache-pinned-usage")
        assert 100_000 < usage.pop() <= (4 << 20) + pinned
    finally:
        for db in (theirs, *ours):
            db.close()


def test_every_partitions_memtables_are_charged_to_one_limit(tmp_path: Path, fresh_cache: None) -> None:
    """Three partitions with 64 MB write buffers each under a 4 MB write buffer manager: RocksDB
    flushes as the memtables together pass the limit. faust's options let each keep its own."""
    limit = 4 << 20
    big = {"write_buffer_size": 64 << 20, "max_write_buffer_number": 2}
    ours = [rocks.BoundedOptions(cache_bytes=16 << 20, memtables_bytes=limit, **big).open(tmp_path / f"o{i}")
            for i in range(3)]  # fmt: skip
    theirs = [faust_rocksdb.RocksDBOptions(use_rocksdict=True, **big).open(tmp_path / f"t{i}") for i in range(3)]
    try:
        for rnd in range(30):  # the manager looks at the memtables before each write
            for i in range(3):
                _fill(ours[i], 2_000, b"%d-%d" % (i, rnd))
                _fill(theirs[i], 2_000, b"%d-%d" % (i, rnd))
        total_theirs = sum(_prop(db, "cur-size-all-mem-tables") for db in theirs)
        total_ours = sum(_prop(db, "cur-size-all-mem-tables") for db in ours)
        assert total_theirs > 3 * limit
        assert total_ours < 2 * limit
    finally:
        for db in (*ours, *theirs):
            db.close()


def test_a_reopened_partition_keeps_the_shared_cache(tmp_path: Path, fresh_cache: None) -> None:
    """A worker restarted on its data dir reopens its partitions: they must join the one cache
    again (rocksdict would otherwise take the column family's options from the OPTIONS file, with
    RocksDB's default 8 MB cache per database)."""
    opts = rocks.BoundedOptions(cache_bytes=32 << 20, memtables_bytes=2 << 20, write_buffer_size=64 << 20)
    db = opts.open(tmp_path / "p0")
    db[b"k"] = b"v"
    db.close()
    again, other = opts.open(tmp_path / "p0"), opts.open(tmp_path / "p1")
    try:
        assert again[b"k"] == b"v"
        assert _prop(again, "block-cache-capacity") == 32 << 20
        # and the write buffer manager: a reopened partition's memtable is flushed at its 2 MB
        # limit, not at its own 64 MB
        for rnd in range(60):
            _fill(again, 2_000, b"%d" % rnd)
        # (a soft limit: a memtable being flushed still counts until its flush ends)
        wait_for(lambda: _prop(again, "cur-size-all-mem-tables") < 2 * (2 << 20), 20.0, "memtables under the limit")
        _fill(other, 20_000)
        other.flush()
        other.get(b"effect-000000001")  # reads through the cache
        mine, theirs = _cache_usage(again, other)
        assert mine == theirs > 0  # one cache
    finally:
        again.close()
        other.close()

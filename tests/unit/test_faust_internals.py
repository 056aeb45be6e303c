"""One test per private faust part the processor uses (processors/faust_internals.py): an upgrade
of faust-streaming that moves one fails here, by name."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import faust
import faust.streams
from faust.types import TP

from effect_ledger.processors import faust_internals


def test_pinned_to_the_faust_release_it_was_read_from() -> None:
    assert faust.__version__ == faust_internals.FAUST_VERSION


class _Event:
    message = SimpleNamespace(partition=2, topic="t")


def test_as_current_event_is_what_faust_tables_read() -> None:
    event = _Event()
    assert faust.streams.current_event() is None
    with faust_internals.as_current_event(event):
        assert faust.streams.current_event() is event
    assert faust.streams.current_event() is None


def _app(tmp_path: Path) -> faust.App:
    return faust.App("internals-test", broker="kafka://127.0.0.1:1", datadir=str(tmp_path), store="memory://")


def test_committed_offset_reads_the_consumers_map(tmp_path: Path) -> None:
    async def check() -> None:
        app = _app(tmp_path)
        assert faust_internals.committed_offset(app, "t", 0) is None
        app.consumer._committed_offset[TP("t", 0)] = 42
        assert faust_internals.committed_offset(app, "t", 0) == 42

    asyncio.run(check())


def test_peer_urls_reads_the_assignors_map(tmp_path: Path) -> None:
    async def check() -> None:
        app = _app(tmp_path)
        assert faust_internals.peer_urls(app) == set()
        app.assignor._tps_url[TP("t", 0)] = "http://127.0.0.1:6066"
        assert faust_internals.peer_urls(app) == {"http://127.0.0.1:6066"}

    asyncio.run(check())


def test_recovery_calls_table_callbacks_before_it_resumes_seeks_clears_and_resumes_flow() -> None:
    """``hold_fetching_until_streams_resume`` is right only in this order (faust 0.15.3)."""
    import inspect

    from faust.tables.recovery import Recovery

    src = inspect.getsource(Recovery.on_recovery_completed)
    steps = ["table.on_recovery_completed", "consumer.resume_partitions", "consumer.perform_seek",
             "self.app.flow_control.resume()", "consumer.resume_flow()"]  # fmt: skip
    where = [src.index(s) for s in steps]
    assert where == sorted(where), dict(zip(steps, where, strict=True))


def test_hold_fetching_stops_the_consumers_flow(tmp_path: Path) -> None:
    async def check() -> None:
        app = _app(tmp_path)
        app.consumer.resume_flow()
        faust_internals.hold_fetching_until_streams_resume(app)
        assert not app.consumer.flow_active and not app.consumer.can_resume_flow.is_set()

    asyncio.run(check())


def test_no_current_event_hides_the_ambient_one() -> None:
    event = _Event()
    with faust_internals.as_current_event(event):
        with faust_internals.no_current_event():
            assert faust.streams.current_event() is None
        assert faust.streams.current_event() is event


def _table(tmp_path: Path, store: str) -> object:
    app = faust.App("internals-table", broker="kafka://127.0.0.1:1", datadir=str(tmp_path), store=store)
    options = {"driver": "rocksdict"} if store.startswith("rocksdb") else None
    return app.Table("effects", default=None, partitions=4, key_type=str, value_type=bytes, options=options)


def test_table_partitions_write_where_the_table_reads(tmp_path: Path) -> None:
    """A batch written through ``table_partitions`` under ``table_key`` is what the table reads, in
    the key's partition (current event) and by key alone, in both stores."""
    for store in ("rocksdb://", "memory://"):

        async def check(store: str = store) -> None:
            table: Any = _table(tmp_path / store[:-3], store)
            db_for, write_batch = faust_internals.table_partitions(table)
            batch = write_batch()
            batch.put(faust_internals.table_key(table, "payments:é1"), b"value-1")
            db_for(2).write(batch)
            event = _Event()
            with faust_internals.as_current_event(event):
                assert table.get("payments:é1") == b"value-1"
            with faust_internals.no_current_event():
                assert table.get("payments:é1") == b"value-1"
                assert table.get("payments:other") is None

        asyncio.run(check())


def test_table_key_is_the_changelogs_key(tmp_path: Path) -> None:
    async def check() -> None:
        table: Any = _table(tmp_path, "rocksdb://")
        # what faust's own changelog send uses for the key (the table's key serializer: JSON)
        assert faust_internals.table_key(table, "payments:é1") == '"payments:é1"'.encode()

    asyncio.run(check())


def test_persist_changelog_offset_is_what_recovery_reads(tmp_path: Path) -> None:
    async def check() -> None:
        table: Any = _table(tmp_path, "rocksdb://")
        faust_internals.persist_changelog_offset(table, 3, 41)
        tp = TP(table.changelog_topic.get_topic_name(), 3)
        assert table.data.persisted_offset(tp) == 41

    asyncio.run(check())

"""One test per private faust part the processor uses (processors/faust_internals.py): an upgrade
of faust-streaming that moves one fails here, by name."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace

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

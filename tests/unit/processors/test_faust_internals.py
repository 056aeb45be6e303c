"""One test per private faust part the processor uses (processors/_faust_internals.py): an upgrade
of faust-streaming that moves one fails here, by name."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import faust
import faust.streams
import pytest
from aiokafka.errors import IllegalStateError
from faust.types import TP

from effect_ledger.processors import _faust_internals as faust_internals
from effect_ledger.processors import rocks


def test_pinned_to_the_faust_release_it_was_read_from() -> None:
    assert faust.__version__ == faust_internals.FAUST_VERSION


def test_a_fetch_is_given_twice_what_the_broker_may_hold_it(tmp_path: Path) -> None:
    """``FETCH_WAIT_S`` is read from faust's consumer: the broker answers a fetch within its
    ``fetch_max_wait_ms`` even with nothing to send, so a fetch bounded at twice that times out only
    on a leader that stopped answering."""
    from effect_ledger.processors.faust_settings import FETCH_WAIT_S

    async def held_ms() -> int:
        app = faust.App("fetching", broker="kafka://127.0.0.1:1", datadir=str(tmp_path))
        consumer = app.consumer._thread._create_worker_consumer(app.transport)
        try:
            return int(consumer._fetch_max_wait_ms)
        finally:
            await consumer.stop()

    assert FETCH_WAIT_S == 2 * asyncio.run(held_ms()) / 1000


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
    """The worker's table, on the store ``--store`` names (processors/rocks.py for rocksdb://)."""
    app = faust.App(
        "internals-table", broker="kafka://127.0.0.1:1", datadir=str(tmp_path), store=rocks.store_url(store)
    )
    return app.Table("effects", default=None, partitions=4, key_type=str, value_type=bytes)


def test_table_partitions_write_where_the_table_reads(tmp_path: Path) -> None:
    """A batch written through ``table_partitions`` under ``table_key`` is what the table reads, in
    the key's partition (current event) and by key alone, in both stores; ``table_reader`` reads
    what either wrote."""
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
            read = faust_internals.table_reader(table)
            assert read(2, faust_internals.table_key(table, "payments:é1")) == b"value-1"
            assert read(2, faust_internals.table_key(table, "payments:other")) is None
            with faust_internals.as_current_event(event):
                table["payments:faust-2"] = b"value-3"
            assert read(2, faust_internals.table_key(table, "payments:faust-2")) == b"value-3"

        asyncio.run(check())


def test_open_databases_are_the_partitions_the_store_opened(tmp_path: Path) -> None:
    async def check() -> None:
        table: Any = _table(tmp_path / "rocks", "rocksdb://")
        assert faust_internals.open_databases(table.data) == []
        db_for, _ = faust_internals.table_partitions(table)
        opened = [db_for(3), db_for(1)]
        assert sorted(map(id, faust_internals.open_databases(table.data))) == sorted(map(id, opened))
        memory_table: Any = _table(tmp_path / "mem", "memory://")
        assert faust_internals.open_databases(memory_table.data) == []

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
        assert faust_internals.persisted_changelog_offset(table, 3) == 41
        assert faust_internals.persisted_changelog_offset(table, 2) is None
        memory_table: Any = _table(tmp_path / "mem", "memory://")
        assert faust_internals.persisted_changelog_offset(memory_table, 3) is None

    asyncio.run(check())


def test_the_fetcher_hands_each_record_off_with_wait_first() -> None:
    """``quick_handoff`` replaces exactly this call of ``Consumer._drain_messages`` (faust 0.15.3)."""
    import inspect

    from faust.transport.consumer import Consumer

    source = " ".join(inspect.getsource(Consumer._drain_messages).split())
    assert "await self.wait_first( callback(message), self.suspend_flow.wait() )" in source


def _counting_tasks(loop: asyncio.AbstractEventLoop) -> list[int]:
    made = [0]

    def factory(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> asyncio.Task[Any]:
        made[0] += 1
        return asyncio.Task(coro, loop=loop, **kwargs)

    loop.set_task_factory(factory)  # type: ignore[arg-type]
    return made


def test_quick_handoff_runs_a_callback_that_does_not_wait_without_a_task(tmp_path: Path) -> None:
    async def check() -> None:
        app = _app(tmp_path)
        consumer: Any = app.consumer
        faust_internals.quick_handoff(app)
        faust_internals.quick_handoff(app)  # idempotent
        made = _counting_tasks(asyncio.get_running_loop())
        handed: list[str] = []

        async def callback(message: str) -> None:
            handed.append(message)

        for m in ("a", "b", "c"):
            await consumer.wait_first(callback(m), consumer.suspend_flow.wait())
        assert handed == ["a", "b", "c"]
        assert made[0] == 0  # faust's own makes four per record

        async def broken() -> None:
            raise ValueError("no")

        with pytest.raises(ValueError, match="no"):
            await consumer.wait_first(broken(), consumer.suspend_flow.wait())

    asyncio.run(check())


def test_quick_handoff_waits_for_a_callback_that_waits_and_gives_up_when_the_flow_is_suspended(
    tmp_path: Path,
) -> None:
    async def check() -> None:
        app = _app(tmp_path)
        consumer: Any = app.consumer
        faust_internals.quick_handoff(app)
        room: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        steps: list[str] = []

        async def callback() -> None:
            steps.append("started")
            steps.append(await room)  # a full stream buffer: until the agent takes an event

        waiting = asyncio.ensure_future(consumer.wait_first(callback(), consumer.suspend_flow.wait()))
        await asyncio.sleep(0.01)
        assert steps == ["started"] and not waiting.done()
        room.set_result("put")
        await asyncio.wait_for(waiting, 5)
        assert steps == ["started", "put"]

        # Suspended while it waits: abandoned (cancelled), as faust's own wait_first does.
        never: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        seen: list[str] = []

        async def blocked() -> None:
            try:
                await never
            except asyncio.CancelledError:
                seen.append("cancelled")
                raise

        waiting = asyncio.ensure_future(consumer.wait_first(blocked(), consumer.suspend_flow.wait()))
        await asyncio.sleep(0.01)
        consumer.suspend_flow.set()
        await asyncio.wait_for(waiting, 5)
        await asyncio.sleep(0)
        assert seen == ["cancelled"]

        async def late_failure() -> None:
            await asyncio.sleep(0)
            raise KeyError("late")

        consumer.suspend_flow.clear()
        with pytest.raises(KeyError):
            await consumer.wait_first(late_failure(), consumer.suspend_flow.wait())

    asyncio.run(check())


def test_quick_handoff_leaves_every_other_wait_first_to_faust(tmp_path: Path) -> None:
    async def check() -> None:
        app = _app(tmp_path)
        consumer: Any = app.consumer
        faust_internals.quick_handoff(app)
        never: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        result = await consumer.wait_first(never, timeout=0.01)
        assert result.stopped and not result.done  # timed out, the way faust's wait_first says it
        event, other = asyncio.Event(), asyncio.Event()
        event.set()
        result = await consumer.wait_first(event.wait(), other.wait())
        assert result.done  # another event than the flow's: faust's own, which says what finished
        never.cancel()

    asyncio.run(check())


def test_faust_goes_back_to_the_committed_offsets_through_seek_to_committed() -> None:
    """``seek_uncommitted_to_start`` wraps the call both of faust's ways back go through (0.15.3):
    the seek after recovery and the one after a fetch that returned while the flow was stopped."""
    import inspect

    from faust.transport.consumer import Consumer

    assert "await self.seek_to_committed()" in inspect.getsource(Consumer.perform_seek)
    getmany = inspect.getsource(Consumer.getmany)
    assert getmany.index("if self.flow_active:") < getmany.index("await self.perform_seek()")


def test_faust_drops_what_a_fetch_returns_after_the_flow_stopped() -> None:
    """``rewind_dropped_fetches`` wraps the call whose records faust then drops when its flow has
    stopped meanwhile (0.15.3), and reads aiokafka's subscription state of the release pinned."""
    import inspect

    import aiokafka
    from faust.transport.consumer import Consumer
    from faust.transport.drivers.aiokafka import AIOKafkaConsumerThread

    assert aiokafka.__version__ == faust_internals.AIOKAFKA_VERSION
    # the fetch runs on the consumer's thread as _fetch_records, whose return the ends are read at
    assert "self.call_thread(\n            self._fetch_records," in inspect.getsource(AIOKafkaConsumerThread.getmany)
    getmany = inspect.getsource(Consumer.getmany)
    fetch = getmany.index("await self._wait_next_records(timeout)")
    assert fetch < getmany.index("if self.flow_active:") < getmany.index("await self.perform_seek()")


def test_rewind_dropped_fetches_hands_faust_nothing_fetched_while_the_flow_stopped(tmp_path: Path) -> None:
    """The fetch's end positions are read on the consumer's thread as it returns (here 12: past a
    marker after the last record, 9); a fetch returning while the flow is stopped is handed on as
    nothing, and its partitions go back from those ends to their first records."""

    async def check() -> None:
        app = _app(tmp_path)
        consumer: Any = app.consumer
        c1, e0, gone = TP("c", 1), TP("e", 0), TP("c", 2)
        first, last = SimpleNamespace(offset=4), SimpleNamespace(offset=9)
        fetched = {c1: [first, last], e0: [], gone: [SimpleNamespace(offset=1)]}
        state = SimpleNamespace(has_valid_position=True, position=12)
        assignment = SimpleNamespace(tps={c1, e0}, state_value=lambda tp: state)
        aio = SimpleNamespace(_subscription=SimpleNamespace(subscription=SimpleNamespace(assignment=assignment)))
        rewound: list[dict[Any, tuple[int, int]]] = []

        async def fetch_records(aio: Any, active: Any, timeout: float = 1.0, max_records: int = 1) -> Any:
            return dict(fetched)

        async def call_thread(fun: Any, *args: Any, **kwargs: Any) -> Any:
            if fun is faust_internals.rewind_unmoved:
                rewound.append(args[1])
                return []
            return await fun(*args, **kwargs)

        thread = SimpleNamespace(call_thread=call_thread, _ensure_consumer=lambda: aio, _fetch_records=fetch_records)

        async def wait_next_records(timeout: float) -> tuple[Any, Any]:  # faust's, through the thread
            return await thread.call_thread(thread._fetch_records, aio, {c1}, timeout=timeout), {c1}

        consumer._thread = thread
        consumer._wait_next_records = wait_next_records
        faust_internals.rewind_dropped_fetches(app)
        faust_internals.rewind_dropped_fetches(app)  # idempotent
        records, active = await consumer._wait_next_records(1.0)  # flowing: handed on as fetched
        assert (records, active) == (fetched, {c1}) and records.ends == {c1: 12, e0: 12}
        assert rewound == []
        consumer.stop_flow()
        assert await consumer._wait_next_records(1.0) == ({}, {c1})
        assert rewound == [{c1: (4, 12)}]  # not the empty batch, not the partition no longer assigned

    asyncio.run(check())


def test_rewind_unmoved_puts_back_only_a_partition_where_the_fetch_left_it() -> None:
    positions = {TP("c", 0): 12, TP("c", 1): 30}
    seeks: list[tuple[TP, int]] = []
    assignment = SimpleNamespace(
        tps=set(positions), state_value=lambda tp: SimpleNamespace(has_valid_position=True, position=positions[tp])
    )
    aio = SimpleNamespace(
        _subscription=SimpleNamespace(subscription=SimpleNamespace(assignment=assignment)),
        seek=lambda tp, offset: seeks.append((tp, offset)),
    )
    spans = {TP("c", 0): (4, 12), TP("c", 1): (5, 13), TP("c", 9): (0, 3)}  # c1 sought since; c9 revoked
    assert asyncio.run(faust_internals.rewind_unmoved(aio, spans)) == [TP("c", 0)]
    assert seeks == [(TP("c", 0), 4)]


def test_seek_uncommitted_to_start_rewinds_source_partitions_without_a_commit(tmp_path: Path) -> None:
    """A source partition with no committed offset (None) or 0 goes to its first record; one with a
    commit, and any partition of another topic (a changelog), are left to faust."""
    from faust.transport.consumer import Consumer

    async def check() -> None:
        app = _app(tmp_path)
        consumer: Any = app.consumer
        committed = {TP("events", 0): None, TP("events", 1): 0, TP("events", 2): 17,
                     TP("decisions", 0): None, TP("changelog", 0): None}  # fmt: skip
        seeks: list[dict[TP, int]] = []

        async def seek_to_committed() -> dict[TP, int | None]:
            return dict(committed)

        async def earliest_offsets(*tps: TP) -> dict[TP, int]:
            return {tp: 5 if tp.partition == 1 else 0 for tp in tps}

        async def seek_wait(offsets: dict[TP, int]) -> None:
            seeks.append(dict(offsets))

        consumer.seek_to_committed = seek_to_committed
        consumer.earliest_offsets = earliest_offsets
        consumer.seek_wait = seek_wait
        consumer.assignment = lambda: set(committed)
        faust_internals.seek_uncommitted_to_start(app, frozenset({"events", "decisions"}))
        faust_internals.seek_uncommitted_to_start(app, frozenset({"events", "decisions"}))  # idempotent
        assert await consumer.seek_to_committed() == committed  # what faust reads is unchanged
        assert seeks == [{TP("events", 0): 0, TP("events", 1): 5, TP("decisions", 0): 0}]
        # faust's own way back reaches the wrapper.
        consumer._read_offset[TP("events", 0)] = 9
        await Consumer.perform_seek(consumer)
        assert len(seeks) == 2 and consumer._read_offset[TP("events", 0)] is None
        committed.update({TP("events", 0): 3, TP("events", 1): 4, TP("decisions", 0): 1})
        await consumer.seek_to_committed()
        assert len(seeks) == 2  # every source partition has a commit now: no seek of ours
        # A partition no longer assigned (a rebalance meanwhile) is not sought; one taken away
        # during the seek ends it quietly (the next assignment seeks again).
        committed.update({TP("events", 0): None, TP("events", 1): None})
        consumer.assignment = lambda: {TP("events", 1)}
        await consumer.seek_to_committed()
        assert seeks[-1] == {TP("events", 1): 5}

        async def taken_away(offsets: dict[TP, int]) -> None:
            raise IllegalStateError("No current assignment for partition")

        consumer.seek_wait = taken_away
        assert await consumer.seek_to_committed() == committed

    asyncio.run(check())


def test_leave_unacknowledged_keeps_the_offset_out_of_the_consumers_count(tmp_path: Path) -> None:
    """faust counts an offset as processed when the stream acknowledges the message's last
    reference (``Message.ack`` -> ``ConsumerMessage.on_final_ack`` -> ``Consumer.ack``): a message
    left unacknowledged is not counted, and its neighbour still is."""
    import inspect

    from faust.streams import Stream
    from faust.types.tuples import ConsumerMessage

    # Why the processor needs it: take_events acknowledges every event of a batch once it returns.
    take = inspect.getsource(Stream.take_events)
    assert take.index("yield list(events)") < take.index("for event in events:") < take.index("await self.ack(event)")

    async def check() -> None:
        app = _app(tmp_path)
        app.topics._acking_topics.add("events")  # faust counts acks of its subscribed topics only
        consumer: Any = app.consumer
        tp = TP("events", 0)

        def message(offset: int) -> Any:
            m = ConsumerMessage("events", 0, offset, 0.0, 0, [], b"k", b"v", None)
            m.incref()
            return m

        kept, left = message(7), message(8)
        faust_internals.leave_unacknowledged(SimpleNamespace(message=left))
        assert kept.ack(consumer) is True
        assert left.ack(consumer) is False
        assert list(consumer._acked[tp]) == [7]
        assert 8 not in consumer._acked_index[tp]

    asyncio.run(check())


def test_refused_authorization_reads_the_topics_aiokafka_names_down_the_chain() -> None:
    from aiokafka.errors import GroupAuthorizationFailedError, TopicAuthorizationFailedError

    try:
        try:
            raise TopicAuthorizationFailedError({"p.effects.events", "p.effects.decisions"})
        except TopicAuthorizationFailedError as inner:
            raise RuntimeError("faust's commit failed") from inner
    except RuntimeError as outer:
        assert faust_internals.refused_authorization(outer) == ("topic", ("p.effects.decisions", "p.effects.events"))
    assert faust_internals.refused_authorization(TopicAuthorizationFailedError()) == ("topic", ())
    # The fetcher and the metadata client name the one topic as a string (the offset commit and the
    # sender a set): a refused fetch is the worker's usual first sign of a Read taken away.
    one = TopicAuthorizationFailedError("p.effects.events")
    assert faust_internals.refused_authorization(one) == ("topic", ("p.effects.events",))
    assert faust_internals.refused_authorization(GroupAuthorizationFailedError()) == ("group", ())
    assert faust_internals.refused_authorization(IllegalStateError("x")) is None


def test_aiokafka_confirms_membership_where_confirm_membership_listens() -> None:
    """``confirm_membership`` wraps the coordinator's calls that say what the group thinks of the
    worker (aiokafka 0.14.0): a join completes through ``_on_join_complete`` before the heartbeats
    start again, each heartbeat goes through ``_do_heartbeat``, and a lost membership through
    ``reset_generation``; the consumer thread keeps its aiokafka consumer as ``_consumer``."""
    import inspect

    import aiokafka
    from aiokafka.consumer.group_coordinator import GroupCoordinator
    from faust.transport.drivers.aiokafka import AIOKafkaConsumerThread

    assert aiokafka.__version__ == faust_internals.AIOKAFKA_VERSION
    rejoin = inspect.getsource(GroupCoordinator._do_rejoin_group)
    assert "await self._on_join_complete(" in rejoin
    active = inspect.getsource(GroupCoordinator.ensure_active_group)
    assert active.index("await self._do_rejoin_group(") < active.index("self._start_heartbeat_task()")
    assert "success = await self._do_heartbeat()" in inspect.getsource(GroupCoordinator._heartbeat_routine)
    beat = inspect.getsource(GroupCoordinator._do_heartbeat)
    assert beat.count("self.reset_generation()") == 2  # an unknown member, a stale generation
    assert "self._consumer = self._create_consumer(" in inspect.getsource(AIOKafkaConsumerThread.on_start)


def test_confirm_membership_hears_joins_and_answered_heartbeats_and_forgets_on_a_reset(tmp_path: Path) -> None:
    now = [100.0]

    class Coordinator:
        generation = 3
        coordinator_id = 1
        answer = True
        rejoined_meanwhile = False

        async def _on_join_complete(self, generation: int, *args: Any) -> str:
            self.generation = generation
            return "joined"

        async def _do_heartbeat(self) -> bool:
            now[0] += 4.0  # the answer takes 4 s: the session counts from when it was sent
            if self.rejoined_meanwhile:
                self.generation += 1
            return self.answer

        def reset_generation(self) -> None:
            self.generation = -1

    coordinator = Coordinator()
    app = faust.App("membership", broker="kafka://127.0.0.1:1", datadir=str(tmp_path))
    app.consumer._thread._consumer = SimpleNamespace(_coordinator=coordinator)
    membership = faust_internals.Membership(clock=lambda: now[0])
    assert membership.age() is None

    async def scenario() -> None:
        assert faust_internals.confirm_membership(app, membership, 60.0) is True  # before the first join
        assert faust_internals.confirm_membership(app, membership, 60.0) is False  # idempotent
        assert membership.age() is None  # nothing heard yet
        assert await coordinator._on_join_complete(3, "member", "protocol", b"") == "joined"
        assert membership.age() == 0 and membership.epoch == 1
        now[0] = 107.0
        assert await coordinator._do_heartbeat() is True
        assert membership.heard == 107.0 and membership.age() == 4.0  # sent at 107, answered at 111
        coordinator.rejoined_meanwhile = True  # its answer was for the generation before
        now[0] = 109.0
        assert await coordinator._do_heartbeat() is True
        assert membership.heard == 107.0  # not confirmed by it
        coordinator.rejoined_meanwhile = False
        coordinator.answer = False  # not answered for the member: nothing heard
        assert await coordinator._do_heartbeat() is False
        assert membership.heard == 107.0
        coordinator.reset_generation()  # the coordinator no longer knows the member
        assert coordinator.generation == -1 and membership.age() is None and membership.epoch == 2
        coordinator.answer = True  # an answer of the old generation does not make it one again
        await coordinator._do_heartbeat()
        assert membership.age() is None
        now[0] = 200.0
        assert await coordinator._on_join_complete(4, "member", "protocol", b"") == "joined"
        assert membership.heard == 200.0 and coordinator.generation == 4 and membership.epoch == 3

    asyncio.run(scenario())


def test_aiokafka_handles_a_timed_out_request_as_bound_requests_does() -> None:
    """``bound_requests`` and the heartbeat's bound do, sooner, what aiokafka 0.14.0 does when a
    request outlives the request timeout (the connection closed as timed out, ``RequestTimedOutError``,
    retriable), and rely on where aiokafka goes through the client's instance: every request through
    ``send``, every connection through ``_get_conn``, the coordinator's lookup with ``send`` and its
    connect with ``ready``; a heartbeat that fails makes the routine look the coordinator up first."""
    import inspect

    from aiokafka.client import AIOKafkaClient, ConnectionGroup
    from aiokafka.conn import CloseReason
    from aiokafka.consumer.group_coordinator import GroupCoordinator
    from aiokafka.errors import RequestTimedOutError
    from aiokafka.protocol.coordination import FindCoordinatorRequest
    from aiokafka.protocol.group import JoinGroupRequest

    send = inspect.getsource(AIOKafkaClient.send)
    assert "self._conns[(node_id, group)].close(reason=CloseReason.CONNECTION_TIMEOUT)" in send
    assert "raise RequestTimedOutError()" in send and RequestTimedOutError.retriable
    assert "await self.ready(node_id, group=group)" in send
    assert "conn = await self._get_conn(node_id, group=group)" in inspect.getsource(AIOKafkaClient.ready)
    assert "conn = await self._get_conn(node_id)" in inspect.getsource(AIOKafkaClient._metadata_update)
    lookup = inspect.getsource(AIOKafkaClient.coordinator_lookup)
    assert "node_id = self.get_random_node()" in lookup and "resp = await self.send(node_id, request)" in lookup
    known = inspect.getsource(GroupCoordinator.ensure_coordinator_known)
    assert "await self._client.coordinator_lookup(" in known and "await self._client.ready(" in known
    assert "group=ConnectionGroup.COORDINATION" in inspect.getsource(GroupCoordinator._send_req)
    routine = inspect.getsource(GroupCoordinator._heartbeat_routine)
    assert routine.index("await self.ensure_coordinator_known()") < routine.index("await self._do_heartbeat()")
    assert JoinGroupRequest.API_KEY == faust_internals._JOIN_GROUP
    assert FindCoordinatorRequest.API_KEY == faust_internals._FIND_COORDINATOR
    assert CloseReason.CONNECTION_TIMEOUT and ConnectionGroup.COORDINATION


class _Conn:
    def __init__(self) -> None:
        self.closed: list[Any] = []

    def close(self, reason: Any = None) -> None:
        self.closed.append(reason)


def test_a_heartbeat_unanswered_in_time_drops_the_coordinator_and_hears_nothing(tmp_path: Path) -> None:
    from aiokafka.client import ConnectionGroup
    from aiokafka.conn import CloseReason

    conn = _Conn()

    class Coordinator:
        generation = 3
        coordinator_id = 2
        dead = 0
        _client = SimpleNamespace(_conns={(2, ConnectionGroup.COORDINATION): conn})

        async def _on_join_complete(self, *args: Any) -> None:
            return None

        async def _do_heartbeat(self) -> bool:
            await asyncio.sleep(3600)  # sent into a cut: no answer
            return True

        def reset_generation(self) -> None:
            return None

        def coordinator_dead(self) -> None:
            self.dead += 1

    coordinator = Coordinator()
    app = faust.App("membership-bound", broker="kafka://127.0.0.1:1", datadir=str(tmp_path))
    app.consumer._thread._consumer = SimpleNamespace(_coordinator=coordinator)
    membership = faust_internals.Membership()

    async def scenario() -> None:
        faust_internals.confirm_membership(app, membership, 0.05)
        await coordinator._on_join_complete(3)
        heard = membership.heard
        assert await asyncio.wait_for(coordinator._do_heartbeat(), 5.0) is False
        assert membership.heard == heard  # not confirmed by a heartbeat without an answer
        assert coordinator.dead == 1 and conn.closed == [CloseReason.CONNECTION_TIMEOUT]

    asyncio.run(scenario())


def test_bound_requests_times_out_every_request_but_a_join_and_every_connect(tmp_path: Path) -> None:
    from aiokafka.client import ConnectionGroup
    from aiokafka.conn import CloseReason
    from aiokafka.errors import RequestTimedOutError
    from aiokafka.protocol.coordination import FindCoordinatorRequest
    from aiokafka.protocol.fetch import FetchRequest
    from aiokafka.protocol.group import HeartbeatRequest, JoinGroupRequest

    conn = _Conn()
    metadata = []
    answer_in = {"lookup": 0.3, "other": 0.3}

    class Client:
        _conns = {(1, ConnectionGroup.DEFAULT): conn, (1, ConnectionGroup.COORDINATION): conn}
        cluster = SimpleNamespace(brokers=lambda: [SimpleNamespace(nodeId=n) for n in (1, 2, 3)])

        async def send(self, node_id: int, request: Any, *, group: Any = ConnectionGroup.DEFAULT) -> str:
            lookup = isinstance(request, FindCoordinatorRequest)
            await asyncio.sleep(answer_in["lookup" if lookup else "other"])
            return "answered"

        async def _get_conn(self, node_id: int, *, group: Any = ConnectionGroup.DEFAULT) -> Any:
            await asyncio.sleep(3600)  # a connect into a cut

        def force_metadata_update(self) -> None:
            metadata.append(1)

    client = Client()
    app = faust.App("bounded", broker="kafka://127.0.0.1:1", datadir=str(tmp_path))
    app.consumer._thread._consumer = SimpleNamespace(_client=client)

    async def scenario() -> None:
        assert faust_internals.bound_requests(app, 0.2, 0.05, 0.05, 0.15) is True
        assert faust_internals.bound_requests(app, 0.2, 0.05, 0.05, 0.15) is False  # idempotent
        beat = HeartbeatRequest("g", 3, "m")
        with pytest.raises(RequestTimedOutError):
            await client.send(1, beat, group=ConnectionGroup.COORDINATION)
        assert conn.closed == [CloseReason.CONNECTION_TIMEOUT]
        with pytest.raises(RequestTimedOutError):
            await client.send(1, beat)  # the default group, positional or not
        assert len(conn.closed) == 2
        join = JoinGroupRequest("g", 10_000, 60_000, "", "", "consumer", [])
        assert await client.send(1, join, group=ConnectionGroup.COORDINATION) == "answered"  # waits its rebalance
        assert len(conn.closed) == 2
        answer_in.update(lookup=0.1, other=0.1)  # within the request wait, past the lookup's
        assert await client.send(1, beat) == "answered"
        answer_in.update(other=0.18)  # within the request wait, past the fetch's
        assert await client.send(1, beat) == "answered"
        with pytest.raises(RequestTimedOutError):
            await client.send(1, FetchRequest(1500, 1, 1 << 20, 0, []))
        assert len(conn.closed) == 3
        answer_in.update(other=0.1)
        with pytest.raises(RequestTimedOutError):
            await client.send(1, FindCoordinatorRequest("g", 0))
        assert len(conn.closed) == 4
        # Broker 1 failed to answer: the lookup asks the others while it is silent.
        assert {client.get_random_node() for _ in range(200)} == {2, 3}  # type: ignore[attr-defined]
        assert await asyncio.wait_for(client._get_conn(2), 5.0) is None  # as aiokafka's failed connect
        assert metadata == [1]
        assert {client.get_random_node() for _ in range(200)} == {3}  # type: ignore[attr-defined]
        await asyncio.sleep(0.25)  # past the silence (the request wait)
        assert {client.get_random_node() for _ in range(200)} == {1, 2, 3}  # type: ignore[attr-defined]

    asyncio.run(scenario())


def _metadata(leaders: dict[int, int], brokers: tuple[int, ...] = (1, 2, 3)) -> Any:
    """A MetadataResponse v5 (the newest aiokafka 0.14 speaks, and what Kafka 4 answers it) for
    topic ``t``: partition -> leader."""
    from aiokafka.protocol.metadata import MetadataResponse_v5

    parts = [(0, p, leader, [1, 2, 3], [1, 2, 3], []) for p, leader in sorted(leaders.items())]
    return MetadataResponse_v5(0, [(n, f"10.0.0.{n}", 9092, None) for n in brokers], "c", brokers[0],
                               [(0, "t", False, parts)])  # fmt: skip


def test_majority_answer_outvotes_a_broker_that_still_names_itself_leader() -> None:
    stale = _metadata({0: 1, 1: 2, 2: 1})  # cut off: its last view of the controllers' decisions
    fresh = _metadata({0: 2, 1: 2, 2: 3}, brokers=(2, 3))  # the cluster fenced broker 1 and moved on
    assert faust_internals.majority_answer([stale, fresh, fresh]) is fresh
    assert faust_internals.majority_answer([fresh, stale, fresh]) is fresh
    # Two answers that disagree: the one that leaves the fenced broker out.
    assert faust_internals.majority_answer([stale, fresh]) is fresh
    assert faust_internals.majority_answer([fresh, stale]) is fresh
    assert faust_internals.majority_answer([stale]) is stale  # one answer is all there is
    # Before the fence every answer lists all three brokers: the vote alone decides.
    moved = _metadata({0: 2, 1: 2, 2: 3})
    assert faust_internals.majority_answer([stale, moved, moved]) is moved
    assert faust_internals.majority_answer([moved, stale, moved]) is moved


def test_majority_metadata_asks_every_broker_and_keeps_what_most_say(tmp_path: Path) -> None:
    """aiokafka's refresh task calls the client's ``_metadata_update(cluster, topics)``, which asks
    one broker chosen at random and takes its answer whole: one time in three, a broker cut off
    from the others. Installed, every broker is asked, and the majority's leaders are kept."""
    import inspect

    from aiokafka.client import AIOKafkaClient
    from aiokafka.cluster import ClusterMetadata
    from aiokafka.protocol.metadata import MetadataRequest
    from aiokafka.structs import TopicPartition

    assert "self._metadata_update(self.cluster, topics)" in inspect.getsource(AIOKafkaClient._md_synchronizer)
    answers = {1: _metadata({0: 1, 1: 1}), 2: _metadata({0: 2, 1: 3}, (2, 3)), 3: _metadata({0: 2, 1: 3}, (2, 3))}
    asked: list[int] = []
    slow: set[int] = set()

    class Client:
        _conns: dict[Any, Any] = {}

        def __init__(self) -> None:
            self.cluster = ClusterMetadata()
            self.cluster.update_metadata(answers[1])  # it knows all three brokers

        async def send(self, node_id: int, request: Any) -> Any:
            assert isinstance(request, MetadataRequest)
            asked.append(node_id)
            if node_id in slow:
                await asyncio.sleep(3600)  # a broker that does not answer
            return answers[node_id]

        async def _metadata_update(self, cluster: Any, topics: Any) -> bool:
            raise AssertionError("the one-broker read is replaced")

    consumer_client, producer_client = Client(), Client()
    app = faust.App("majority", broker="kafka://127.0.0.1:1", datadir=str(tmp_path))
    app.consumer._thread._consumer = SimpleNamespace(_client=consumer_client)
    app.producer._producer = SimpleNamespace(client=producer_client)

    async def scenario() -> None:
        assert faust_internals.majority_metadata(app, 0.2) == 2
        assert faust_internals.majority_metadata(app, 0.2) == 0  # idempotent
        for client in (consumer_client, producer_client):
            assert await client._metadata_update(client.cluster, {"t"}) is True
            assert client.cluster.leader_for_partition(TopicPartition("t", 0)) == 2
            assert client.cluster.leader_for_partition(TopicPartition("t", 1)) == 3
        assert sorted(asked) == [1, 1, 2, 2, 3, 3]
        # The cluster leaves the fenced broker out of its answers: the client now asks the other two.
        assert sorted(b.nodeId for b in consumer_client.cluster.brokers()) == [2, 3]
        slow.add(3)  # one of them stops answering: the other's answer is kept, and 3 is left out a while
        assert await consumer_client._metadata_update(consumer_client.cluster, {"t"}) is True
        asked.clear()
        assert await consumer_client._metadata_update(consumer_client.cluster, {"t"}) is True
        assert asked == [2]
        slow.add(2)  # nobody answers: the refresh failed, the view stays
        assert await consumer_client._metadata_update(consumer_client.cluster, {"t"}) is False
        assert consumer_client.cluster.leader_for_partition(TopicPartition("t", 0)) == 2

    asyncio.run(scenario())

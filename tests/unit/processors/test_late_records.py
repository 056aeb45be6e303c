"""A late changelog record (an old owner's value landing after the new owner's) does not replace the
newer value in a recovery, in either store, and its key is noted for the owner to write again
(processors/late_records.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import faust
import pytest
from faust.types import TP

from effect_ledger.core.effect import Effect, apply, merge
from effect_ledger.core.model import Decision, DecisionKind, Outcome
from effect_ledger.processors import _faust_internals as faust_internals
from effect_ledger.processors import rocks, table_value
from effect_ledger.processors.late_records import LateRecords, weigh
from tests.unit.processors.test_table_value import CODEC, T, executed, intent


def _versions() -> list[bytes]:
    """One key's table values as the fold writes them: one fact, then two, then three."""
    e: Effect | None = None
    out = []
    for ev in (
        intent(1),
        executed(1, Outcome.FAILED),
        intent(2),
    ):
        e, _ = apply(e, ev, T)
        assert e is not None
        out.append(table_value.encode(e, None))
    return out


V1, V2, V3 = _versions()


def test_the_values_fold_one_more_fact_each() -> None:
    assert [table_value.counts_of(v) for v in (V1, V2, V3)] == [(1, 0), (2, 0), (3, 0)]


def _decided() -> bytes:
    """The key's first intent and a decision about it: (1, 1), facts ``V2`` lacks and lacking one."""
    first, _ = apply(None, intent(1), T)
    d = Decision("dec-1", "payments:k", T + 5, 1, DecisionKind.ABANDONED, "ops", "no", None, "alice")
    decided, _ = apply(first, d, T + 5)
    assert decided is not None
    return table_value.encode(decided, None)


def _merge(held: bytes, incoming: bytes) -> bytes:
    a, b = table_value.decode(held, CODEC.decode), table_value.decode(incoming, CODEC.decode)
    assert a is not None and b is not None
    return table_value.encode(merge(a, b), None)


def test_weigh_keeps_the_value_that_folds_more_in_the_logs_order() -> None:
    held = {(0, b"a"): V3, (0, b"b"): V1}
    late = LateRecords()
    records = [
        (0, b"a", V1, 10),  # late: the store holds V3
        (0, b"b", V3, 11),  # newer than held: applied
        (0, b"b", V2, 12),  # late against the batch's own V3 before it
        (1, b"c", V2, 5),  # nothing held
        (1, b"c", None, 6),  # a tombstone is applied
        (0, b"a", V3, 13),  # the same facts as held: applied, and the key's last record is its value again
    ]
    writes = weigh(records, lambda p, k: held.get((p, k)), late, "effects-changelog")
    assert writes == {0: {b"b": V3, b"a": V3}, 1: {b"c": None}}
    assert late.kept == 2 and len(late) == 1  # "a" needs no rewrite: its last record is the value held
    assert late.take([1]) == {}
    assert late.take([0, 1]) == {0: [b"b"]}
    assert len(late) == 0 and late.take([0]) == {}


def test_weigh_merges_values_that_each_lack_facts_of_the_other() -> None:
    """The old owner's late value folded a decision the next owner had not reached; the next owner's
    folded more of the events topic: the store holds their union. Without a merge function the record
    is applied, as faust does."""
    decided = _decided()
    late = LateRecords()
    writes = weigh([(0, b"k", decided, 7)], lambda p, k: V2, late, "effects-changelog", _merge)
    union = writes[0][b"k"]
    assert union is not None and table_value.counts_of(union) == (2, 1)
    assert late.take([0]) == {0: [b"k"]}
    assert weigh([(0, b"k", decided, 7)], lambda p, k: V2, LateRecords()) == {0: {b"k": decided}}


def test_keys_taken_and_not_written_are_noted_again() -> None:
    late = LateRecords()
    for i in range(5):
        late.note(0, b"k%d" % i, i)
    taken = late.take([0], limit=3)
    assert sum(map(len, taken.values())) == 3 and len(late) == 2
    late.again(taken)  # the batch was let go
    assert len(late) == 5 and late.kept == 5
    assert sorted(late.take([0])[0]) == [b"k%d" % i for i in range(5)]


def _table(tmp_path: Path, store: str) -> Any:
    """The worker's effects table (processors/processor.py) on ``store``, as ``--store`` names it."""
    app = faust.App("late-records", broker="kafka://127.0.0.1:1", datadir=str(tmp_path), store=rocks.store_url(store))
    return app.Table("effects", default=None, partitions=4, key_type=str, value_type=bytes)


def _records(table: Any, rows: list[tuple[int, str, bytes | None, int]]) -> list[Any]:
    """Changelog events as faust's recovery hands them to a store: the key decoded, the message raw."""
    topic = table.changelog_topic.get_topic_name()
    out = []
    for partition, key, value, offset in rows:
        raw = faust_internals.table_key(table, key)
        msg = SimpleNamespace(topic=topic, partition=partition, tp=TP(topic, partition), key=raw, value=value,
                              offset=offset)  # fmt: skip
        out.append(SimpleNamespace(key=key, value=value, message=msg))
    return out


@pytest.mark.parametrize("store", ["rocksdb://", "memory://"])
def test_a_recovery_keeps_the_newer_value_over_a_late_record(tmp_path: Path, store: str) -> None:
    """The chaos run's lost keys, at the store: the new owner's records (V3) are in the changelog
    before the old owner's late one (V1). faust's own stores kept V1 (checked: with faust's
    ``rocksdb://``/``memory://`` stores this test fails on the value read)."""

    async def check() -> None:
        table = _table(tmp_path, store)
        read = faust_internals.table_reader(table)
        key = faust_internals.table_key(table, "payments:k")
        other = faust_internals.table_key(table, "payments:other")
        # Recovered in two batches, as faust reads them: the late record is in the second.
        table.data.apply_changelog_batch(
            _records(table, [(2, "payments:k", V2, 100), (2, "payments:other", V1, 101), (2, "payments:k", V3, 102)]),
            table._to_key,
            table._to_value,
        )
        table.data.apply_changelog_batch(
            _records(table, [(2, "payments:k", V1, 105), (2, "payments:other", V2, 106)]),
            table._to_key,
            table._to_value,
        )
        assert read(2, key) == V3
        assert read(2, other) == V2
        assert table.data.late.take([2]) == {2: [key]}
        if store == "rocksdb://":  # the records not applied were read: a recovery starts past them
            tp = TP(table.changelog_topic.get_topic_name(), 2)
            assert table.data.persisted_offset(tp) == 106

    asyncio.run(check())

"""The audit's memory bound: ``KeyedSpill`` groups any number of tuples by key in bounded memory
(spilling to a temporary folder, splitting a bucket again when it is still too large), and the
audit's report is the same whether the replay was grouped in memory or on disk."""

from __future__ import annotations

import json
import random
from pathlib import Path

from effect_ledger.ops.audit import MAX_REPORTED_KEYS, _Keys, audit
from effect_ledger.ops.sources import db_events
from effect_ledger.ops.spill import FANOUT, KeyedSpill
from tests.incident import incident
from tests.ops_expected import now_ms, write_ledger


def test_groups_are_whole_in_memory_and_on_disk(tmp_path: Path) -> None:
    rng = random.Random(5)
    items = [(f"k{rng.randrange(3000)}", i) for i in range(40_000)]
    expected: dict[str, list[tuple[str, int]]] = {}
    for it in items:
        expected.setdefault(it[0], []).append(it)
    for memory in (100_000, 1000, 20):  # all in memory; spilled; spilled and every bucket split again
        spill = KeyedSpill(memory, str(tmp_path))
        for it in items:
            spill.add(it)
        assert spill.spilling == (memory < len(items))
        # nothing beyond the bound stays in memory (chunks of at most 4096 per bucket while spilling)
        assert spill.items - spill.spilled_items <= max(memory, FANOUT * 4096)
        got = dict(spill.groups())
        assert got == expected
        assert list(tmp_path.iterdir()) == []  # the temporary folder is gone once read


def test_an_abandoned_spill_leaves_no_files(tmp_path: Path) -> None:
    spill = KeyedSpill(10, str(tmp_path))
    for i in range(1000):
        spill.add((f"k{i}", i))
    assert list(tmp_path.iterdir())
    groups = spill.groups()
    next(groups)
    groups.close()  # the reader stopped early (an error, ^C)
    assert list(tmp_path.iterdir()) == []


def test_the_report_is_the_same_when_the_replay_spills(tmp_path: Path) -> None:
    now = now_ms()
    inc = incident(now)
    path = write_ledger(tmp_path / "incident.db", inc.events)
    start, end = now - 3_600_000, now
    in_memory = audit(db_events(path, start, end), start, end, now)
    assert in_memory.duplicate_keys == sorted(inc.doubled) and in_memory.stuck_keys == sorted(inc.stuck)
    spilled_dir = tmp_path / "spill"
    spilled_dir.mkdir()
    for memory in (500, 3):
        for build in (True, False):  # from events, or from their fields as decoded (what the command reads)
            records = db_events(path, start, end, build=build)
            spilled = audit(records, start, end, now, memory_events=memory, spill_dir=str(spilled_dir))
            assert json.loads(spilled.to_json()) == json.loads(in_memory.to_json())
            assert list(spilled_dir.iterdir()) == []


def test_listed_keys_are_bounded_and_the_first_in_order() -> None:
    keys = _Keys()
    names = [f"key-{i:06d}" for i in range(5 * MAX_REPORTED_KEYS)]
    random.Random(1).shuffle(names)
    for n in names:
        keys.add(n)
        assert len(keys.keys) < 2 * MAX_REPORTED_KEYS
    assert keys.result() == sorted(names)[:MAX_REPORTED_KEYS]

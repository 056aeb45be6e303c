"""Retiring closed effects in the ledger file (embedded mode): the rule (``effect_ledger/core/retention.py``)
row by row, what a retirement deletes and keeps, and that a retired key is never executed again."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from effect_ledger.core.model import State
from effect_ledger.core.reconcile import Target
from effect_ledger.core.retention import Retired, due, why_not
from effect_ledger.errors import DefiniteFailure, EffectRetired
from effect_ledger.sdk.ledger import Ledger
from effect_ledger.sdk.store import retire as retire_store
from tests.sdk_contract import KEY, OPERATION, RUN_ID, STEP, TARGET, Destination, FakeClock, run

DAY = 24 * 3600 * 1000
SECRET = "jane.doe@example.com"


@pytest.mark.parametrize(
    ("state", "age", "expected"),
    [
        (State.CONFIRMED, DAY, True),
        (State.FAILED, DAY, True),
        (State.ABSENT, DAY, True),
        (State.ABANDONED, DAY, True),
        (State.COMPENSATED, DAY, True),
        (State.CONFIRMED, DAY - 1, False),  # not long enough
        (State.PENDING, 10 * DAY, False),  # open: never
        (State.EXECUTED, 10 * DAY, False),
        (State.UNCERTAIN, 10 * DAY, False),
        (State.ESCALATED, 10 * DAY, False),  # held by a person: never
        ("SOMETHING_NEW", 10 * DAY, False),  # a state this version does not know: never
    ],
)
def test_the_rule_row_by_row(state: State | str, age: int, expected: bool) -> None:
    assert due(state, 1_000, 1_000 + age, DAY) is expected


def test_a_command_is_refused_when_the_effect_changed_since_the_sweep() -> None:
    assert why_not(State.CONFIRMED, 0, 3, DAY, DAY, seen_version=3) is None
    assert "changed since the sweep" in (why_not(State.CONFIRMED, 0, 4, DAY, DAY, seen_version=3) or "")
    assert "not due" in (why_not(State.PENDING, 0, 3, DAY, DAY, seen_version=3) or "")


def test_the_marker_round_trips() -> None:
    m = Retired("k", "CONFIRMED", "d" * 64, None, 5, 6)
    assert Retired.from_json(m.to_json()) == m


async def _execute(ledger: Ledger, dest: Destination, step: str = STEP, request: object = None) -> object:
    return await ledger.execute(
        target=TARGET,
        operation=OPERATION,
        run_id=RUN_ID,
        step=step,
        request=request if request is not None else {"order": "123", "email": SECRET},
        call=dest,
    )


def test_a_retired_effect_leaves_the_file_and_its_key_is_never_executed_again(tmp_path: Path) -> None:
    path = tmp_path / "effects.db"
    clock = FakeClock()
    dest = Destination()

    async def body() -> None:
        ledger = await Ledger.open(str(path), targets=[Target(TARGET)], clock=clock)
        try:
            await _execute(ledger, dest)
            clock.advance(DAY)
            # newer: not due, and it holds the file's last event
            await _execute(ledger, dest, step="later", request={"order": "456"})
            assert await retire_store.retire(ledger.store, clock(), DAY, require_sent=False) != []
            marker = await retire_store.retired(ledger.store, KEY)
            assert marker is not None and marker.state == "CONFIRMED" and marker.receipt_id == "re_0001"
            assert await ledger.get(KEY) is None
            rows = await ledger.store.query("SELECT count(*) AS n FROM events WHERE effect_id = ?", (KEY,))
            assert rows[0]["n"] == 0
            # Same key, same request: never executed again, never silently paid twice.
            with pytest.raises(EffectRetired) as info:
                await _execute(ledger, dest)
            assert info.value.state == "CONFIRMED" and info.value.retired_ms == clock()
            assert dest.calls == [KEY, dest.calls[1]]  # the first call and "later" only
        finally:
            await ledger.close()
        # The request body is gone from the file's bytes (overwritten, and not left in the WAL).
        wal = path.with_name(path.name + "-wal")
        data = path.read_bytes() + (wal.read_bytes() if wal.exists() else b"")
        assert SECRET.encode() not in data

    run(body())


def test_a_failed_key_is_retired_too_and_refused_even_though_a_retry_was_safe(tmp_path: Path) -> None:
    clock = FakeClock()
    dest = Destination()
    dest.fail.append(DefiniteFailure("card declined"))

    async def body() -> None:
        ledger = await Ledger.open(str(tmp_path / "e.db"), targets=[Target(TARGET)], clock=clock)
        try:
            with pytest.raises(DefiniteFailure):
                await _execute(ledger, dest)
            clock.advance(2 * DAY)
            await _execute(ledger, dest, step="other")
            done = await retire_store.retire(ledger.store, clock(), DAY, require_sent=False)
            assert [m.effect_id for m in done] == [KEY]
            with pytest.raises(EffectRetired):
                await _execute(ledger, dest)
            assert len(dest.calls) == 2
        finally:
            await ledger.close()

    run(body())


def test_open_effects_unsent_events_and_the_files_last_event_are_kept(tmp_path: Path) -> None:
    clock = FakeClock()
    dest = Destination()

    async def body() -> None:
        ledger = await Ledger.open(str(tmp_path / "e.db"), targets=[Target(TARGET)], clock=clock)
        try:
            await _execute(ledger, dest)
            clock.advance(30 * DAY)
            # The file's newest event belongs to this effect: kept (its seq must not be reused).
            assert await retire_store.retire(ledger.store, clock(), DAY, require_sent=False) == []
            await _execute(ledger, dest, step="later")
            # An outbox whose events Kafka has not acknowledged: kept.
            assert await retire_store.retire(ledger.store, clock(), DAY, require_sent=True) == []
            # (the broker's acknowledgement, as the relay records it; Store.query is read-only)
            await ledger.store.run(lambda conn: conn.execute("UPDATE events SET sent = 1 WHERE effect_id = ?", (KEY,)))
            assert [m.effect_id for m in await retire_store.retire(ledger.store, clock(), DAY, require_sent=True)] == [
                KEY
            ]
        finally:
            await ledger.close()

    run(body())


def test_the_file_refuses_to_recreate_a_retired_key_whoever_writes(tmp_path: Path) -> None:
    path = tmp_path / "e.db"
    clock = FakeClock()
    dest = Destination()

    async def body() -> None:
        ledger = await Ledger.open(str(path), targets=[Target(TARGET)], clock=clock)
        try:
            await _execute(ledger, dest)
            clock.advance(DAY)
            await _execute(ledger, dest, step="later")
            await retire_store.retire(ledger.store, clock(), DAY, require_sent=False)
        finally:
            await ledger.close()

    run(body())
    conn = sqlite3.connect(path)
    try:
        cur = conn.execute(
            "INSERT OR IGNORE INTO effects (effect_id, state, target, operation, namespace, run_id, step, attempt, "
            "version, created_ms, updated_ms, executions, flags) VALUES (?, 'PENDING', 't', 'o', 'n', 'r', 's', 1, 1, "
            "0, 0, 0, '')",
            (KEY,),
        )
        assert cur.rowcount == 0
    finally:
        conn.close()


def test_a_late_receipt_for_a_retired_key_is_refused_not_recorded(tmp_path: Path) -> None:
    clock = FakeClock()
    dest = Destination()

    async def body() -> None:
        ledger = await Ledger.open(str(tmp_path / "e.db"), targets=[Target(TARGET)], clock=clock)
        try:
            await _execute(ledger, dest)
            clock.advance(DAY)
            await _execute(ledger, dest, step="later", request={"order": "456"})
            await retire_store.retire(ledger.store, clock(), DAY, require_sent=False)
            with pytest.raises(EffectRetired):
                await ledger.record_receipt(KEY, "re_late", {"late": True}, allow_unknown=True)
            assert await ledger.get(KEY) is None
        finally:
            await ledger.close()

    run(body())


def test_effects_retire_cli_on_a_ledger_file(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from effect_ledger.cli.main import main

    path = tmp_path / "e.db"
    dest = Destination()

    async def body() -> None:
        ledger = await Ledger.open(str(path), targets=[Target(TARGET)], clock=FakeClock())  # a date long past
        try:
            await _execute(ledger, dest)
            await _execute(ledger, dest, step="later", request={"order": "456"})
        finally:
            await ledger.close()

    run(body())
    cli = CliRunner()
    unsure = cli.invoke(main, ["retire", "--db", str(path), "--older-than", "30d"])
    assert unsure.exit_code == 1 and unsure.output.count("\n") == 1 and "give --embedded" in unsure.output
    short = cli.invoke(main, ["retire", "--db", str(path), "--older-than", "1h", "--embedded"])
    assert short.exit_code == 1 and "under 1 day" in short.output and short.output.count("\n") == 1
    done = cli.invoke(main, ["retire", "--db", str(path), "--older-than", "30d", "--embedded", "--json"])
    assert done.exit_code == 0, done.output
    assert json.loads(done.output) == {"retired": [KEY], "count": 1}  # the file's newest effect is kept
    missing = cli.invoke(main, ["retire", "--db", str(tmp_path / "none.db"), "--older-than", "30d", "--embedded"])
    assert missing.exit_code == 1 and missing.output.count("\n") == 1

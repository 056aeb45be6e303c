"""Bad input is a typed error, nothing is half-written, and a refused file is never modified
(issue 10, item 13).

Before the fix: a lone surrogate in an id or the request escaped as ``UnicodeEncodeError`` (or the
codec's ``EncodeError``); wrong argument types to ``record_receipt``/``decide`` escaped as
``ValueError``/``TypeError`` or were written; ``record_receipt`` on a key never executed silently
created a CONFIRMED effect; and ``Ledger.open`` on another application's SQLite file switched it to
WAL and added the ledger's tables to it.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from effect_ledger import errors
from effect_ledger.core.model import Flag, State
from effect_ledger.core.reconcile import Target
from effect_ledger.errors import EffectUncertain, InvalidEffect, LedgerError, StorageError
from effect_ledger.sdk.ledger import Ledger
from tests.faults._common import execute
from tests.sdk_contract import KEY, TARGET, Destination, FakeClock, db_counts, run

SURROGATE = "\ud800"


async def open_ledger(path: str) -> Ledger:
    return await Ledger.open(path, targets=[Target(TARGET)], clock=FakeClock())


# --- a lone surrogate ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "given",
    [
        {"run_id": f"run-{SURROGATE}"},
        {"step": f"step-{SURROGATE}"},
        {"namespace": f"ns-{SURROGATE}"},
        {"key": "k-1", "run_id": f"run-{SURROGATE}"},
        {"key": "k-1", "step": f"step-{SURROGATE}"},
        {"request": {"note": f"x{SURROGATE}"}},
        {"request": {f"k{SURROGATE}": 1}},
    ],
    ids=["run_id", "step", "namespace", "run_id-with-key", "step-with-key", "request-value", "request-key"],
)
def test_lone_surrogate_is_invalid_effect_and_nothing_is_written(tmp_path: Path, given: dict[str, Any]) -> None:
    path = str(tmp_path / "effects.db")
    dest = Destination()

    async def body() -> None:
        ledger = await open_ledger(path)
        try:
            with pytest.raises(InvalidEffect):
                await execute(ledger, dest, **given)
        finally:
            await ledger.close()

    run(body())
    assert db_counts(path) == (0, 0) and dest.calls == []


# --- record_receipt and decide ------------------------------------------------------------------------


async def uncertain_effect(ledger: Ledger) -> None:
    dest = Destination()
    dest.fail.append(ConnectionError("reset"))
    with pytest.raises(EffectUncertain):
        await execute(ledger, dest)


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [
        ((KEY, 5), {}),
        ((KEY, b"re_1"), {}),
        ((KEY, f"re_{SURROGATE}"), {}),
        ((KEY, "re_1"), {"source": "FAX"}),
        ((KEY, "re_1"), {"source": 3}),
        ((KEY, "re_1"), {"attempt": "1"}),
        ((KEY, "re_1"), {"attempt": -1}),
        ((KEY, "re_1"), {"attempt": True}),
        ((KEY, "re_1"), {"attempt": 1.5}),
    ],
    ids=[
        "receipt_id-int",
        "receipt_id-bytes",
        "receipt_id-surrogate",
        "source-bogus",
        "source-int",
        "attempt-str",
        "attempt-negative",
        "attempt-bool",
        "attempt-float",
    ],
)
def test_record_receipt_with_wrong_argument_types_is_invalid_effect(
    tmp_path: Path, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    path = str(tmp_path / "effects.db")

    async def body() -> None:
        ledger = await open_ledger(path)
        try:
            await uncertain_effect(ledger)
            before = db_counts(path)
            with pytest.raises(InvalidEffect):
                await ledger.record_receipt(*args, **kwargs)
            assert db_counts(path) == before
        finally:
            await ledger.close()

    run(body())


@pytest.mark.parametrize(
    "given",
    [
        {"decision": "MAYBE"},
        {"decision": 5},
        {"decision": None},
        {"by": 5},
        {"reason": ["checked"]},
        {"reason": f"checked {SURROGATE}"},
        {"by": f"on{SURROGATE}call"},
        {"decision": "CONFIRMED", "receipt_id": 5},
        {"decision": "CONFIRMED", "receipt_id": ""},
    ],
    ids=[
        "decision-bogus",
        "decision-int",
        "decision-none",
        "by-int",
        "reason-list",
        "reason-surrogate",
        "by-surrogate",
        "receipt_id-int",
        "receipt_id-empty",
    ],
)
def test_decide_with_wrong_argument_types_is_invalid_effect(tmp_path: Path, given: dict[str, Any]) -> None:
    path = str(tmp_path / "effects.db")

    async def body() -> None:
        ledger = await open_ledger(path)
        try:
            await uncertain_effect(ledger)
            before = db_counts(path)
            args: dict[str, Any] = {"key": KEY, "decision": "ABANDONED", "by": "oncall", "reason": "checked", **given}
            with pytest.raises(InvalidEffect):
                await ledger.decide(args.pop("key"), args.pop("decision"), **args)
            assert db_counts(path) == before
        finally:
            await ledger.close()

    run(body())


def test_record_receipt_on_a_key_never_executed_is_refused_unless_allowed(tmp_path: Path) -> None:
    path = str(tmp_path / "effects.db")

    async def body() -> None:
        ledger = await open_ledger(path)
        try:
            with pytest.raises(InvalidEffect) as ei:
                await ledger.record_receipt(KEY, "re_hook", {"id": "re_hook"})
            assert isinstance(ei.value, errors.UnknownEffect), repr(ei.value)
            assert db_counts(path) == (0, 0)
            # A receipt that may legitimately come first (another host executed it) is said so.
            effect = await ledger.record_receipt(KEY, "re_hook", {"id": "re_hook"}, allow_unknown=True)
            assert effect.state is State.CONFIRMED and Flag.NO_INTENT in effect.flags
        finally:
            await ledger.close()

    run(body())


# --- a file that is not a ledger ----------------------------------------------------------------------


def _snapshot(path: Path) -> tuple[bytes, int, list[str]]:
    side = sorted(p.name for p in path.parent.iterdir() if p.name != path.name)
    return path.read_bytes(), path.stat().st_mtime_ns, side


def _journal_mode(path: Path) -> str:
    """From the database header (bytes 18-19: 1 rollback journal, 2 WAL), without opening the file:
    even a read-only SQLite connection to a WAL file creates its -wal and -shm."""
    header = path.read_bytes()[:100]
    return {(1, 1): "rollback", (2, 2): "wal"}[(header[18], header[19])]


def _foreign_db(path: Path, journal: str) -> None:
    conn = sqlite3.connect(str(path))
    try:
        conn.execute(f"PRAGMA journal_mode={journal}")
        conn.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)")
        conn.executemany("INSERT INTO users(name) VALUES (?)", [("ada",), ("grace",)])
        conn.commit()
    finally:
        conn.close()


@pytest.mark.parametrize("kind", ["sqlite-delete-journal", "sqlite-wal", "sqlite-with-an-events-table", "text"])
def test_open_refuses_a_foreign_file_without_modifying_it(tmp_path: Path, kind: str) -> None:
    folder = tmp_path / "data"
    folder.mkdir()
    path = folder / "app.db"
    if kind == "sqlite-delete-journal":
        _foreign_db(path, "DELETE")
    elif kind == "sqlite-wal":
        _foreign_db(path, "WAL")
    elif kind == "sqlite-with-an-events-table":
        _foreign_db(path, "DELETE")
        with sqlite3.connect(str(path)) as conn:
            conn.execute("CREATE TABLE events (id INTEGER PRIMARY KEY, what TEXT)")
    else:
        path.write_text("name,amount\nada,4800\n" * 50)
    mode = _journal_mode(path) if kind != "text" else None
    before = _snapshot(path)
    os.utime(path, ns=(before[1] - 10_000_000_000, before[1] - 10_000_000_000))  # an older mtime, to see a touch
    before = _snapshot(path)

    async def body() -> None:
        with pytest.raises(LedgerError) as ei:
            await Ledger.open(str(path), targets=[Target(TARGET)])
        assert isinstance(ei.value, StorageError), repr(ei.value)
        assert "not an effect-ledger file" in str(ei.value) and str(path) in str(ei.value)

    run(body())
    assert _snapshot(path) == before  # same bytes, same mtime, no -wal / -shm / -journal left
    if mode is not None:
        assert _journal_mode(path) == mode


# --- reads and Ledger.open with arguments of the wrong kind (a hostile probe, later) ------------------


@pytest.mark.parametrize("key", [SURROGATE, "payments:" + SURROGATE, 42, "", "a b"])
def test_get_and_expire_with_what_cannot_be_a_key_are_invalid_effect(tmp_path: Path, key: Any) -> None:
    """Before: ``get("\\ud800")`` and ``expire("\\ud800")`` escaped as ``UnicodeEncodeError``."""

    async def body() -> None:
        ledger = await open_ledger(str(tmp_path / "l.db"))
        try:
            for read in (ledger.get, ledger.expire):
                with pytest.raises(InvalidEffect):
                    await read(key)
        finally:
            await ledger.close()

    run(body())


@pytest.mark.parametrize(
    ("kwargs", "error", "says"),
    [
        ({"path": 42}, errors.ConfigError, "str or os.PathLike"),
        ({"path": b"/tmp/x.db"}, errors.ConfigError, "str or os.PathLike"),
        ({"path": "{tmp}/a\0b.db"}, errors.ConfigError, "NUL"),
        ({"path": ""}, errors.ConfigError, "empty"),
        ({"durability": "BOGUS"}, errors.ConfigError, "durability must be one of NORMAL, FULL"),
        ({"targets": 5}, errors.TargetsError, "targets must be"),
    ],
    ids=["int-path", "bytes-path", "nul-in-path", "empty-path", "durability", "targets-int"],
)
def test_open_with_arguments_of_the_wrong_kind_is_a_typed_error(
    tmp_path: Path, kwargs: dict[str, Any], error: type[LedgerError], says: str
) -> None:
    """Before: ``ValueError`` (durability, a NUL) or ``TypeError`` (the path's or the targets' type)."""
    args = {"path": str(tmp_path / "l.db"), "targets": [Target(TARGET)], **kwargs}
    if isinstance(args["path"], str):
        args["path"] = args["path"].format(tmp=tmp_path)
    with pytest.raises(error, match=says):
        run(Ledger.open(args.pop("path"), **args))
    assert os.listdir(tmp_path) == []  # nothing created

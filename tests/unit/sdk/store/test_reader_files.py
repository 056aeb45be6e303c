"""The read-only reader (``effect_ledger.sdk.store.reader``) on hostile paths and files.

* A path is a path: ``#``, ``?`` and ``%`` in a file's name were read as the SQLite URI's fragment
  and parameters (``f"file:{p}?mode=ro"``): ``led#1.db`` was refused and an empty ``led`` created
  beside it; ``x?mode=rwc&.db`` opened ``x``, read-write, creating it.
* A reader creates nothing: a read-only connection to a WAL-mode file created its ``-wal`` and
  ``-shm`` and left them behind, beside a good ledger and beside a damaged one it refused.
* A FIFO (or a device) is refused at once: opening a FIFO waited for a writer for ever.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from effect_ledger.cli.main import main
from effect_ledger.errors import StorageError
from effect_ledger.sdk.store.reader import LedgerReader
from tests.incident import incident
from tests.ops_expected import now_ms, write_ledger


@pytest.fixture(scope="module")
def ledger(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """The bytes of a WAL-mode ledger with no ``-wal`` beside it (the store closed it)."""
    d = tmp_path_factory.mktemp("ledger")
    write_ledger(d / "ledger.db", incident(now_ms()).events[:60])
    assert sorted(os.listdir(d)) == ["ledger.db"]
    data = (d / "ledger.db").read_bytes()
    assert data[18:20] == b"\x02\x02", "the store writes WAL-mode files"
    return data


def listing(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())}


def finishes(fn: Callable[[], Any], seconds: float = 10.0) -> BaseException | None:
    """Run ``fn`` in a thread: what it raised (None: nothing); fails the test if it is still
    running after ``seconds``."""
    out: list[BaseException | None] = []

    def run() -> None:
        try:
            fn()
            out.append(None)
        except BaseException as e:  # noqa: BLE001 - handed to the test
            out.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    assert out, f"still running after {seconds} s"
    return out[0]


@pytest.mark.parametrize("name", ["led#1.db", "x?mode=rwc&.db", "a%20b.db", "q?.db#"])
def test_a_name_with_uri_characters_is_that_file(name: str, ledger: bytes, tmp_path: Path) -> None:
    (tmp_path / name).write_bytes(ledger)
    before = listing(tmp_path)
    with LedgerReader.open(tmp_path / name) as reader:
        reader.check()
        assert len(reader.unsettled()) > 0
    assert listing(tmp_path) == before, "a file was created or changed beside it"


def test_escalations_reads_a_ledger_named_with_a_hash(ledger: bytes, tmp_path: Path) -> None:
    (tmp_path / "led#1.db").write_bytes(ledger)
    before = listing(tmp_path)
    r = CliRunner().invoke(main, ["escalations", "--db", str(tmp_path / "led#1.db"), "--json"])
    assert r.exit_code == 0, r.stderr
    assert listing(tmp_path) == before


def test_reading_a_wal_mode_ledger_creates_nothing(ledger: bytes, tmp_path: Path) -> None:
    (tmp_path / "ledger.db").write_bytes(ledger)
    before = listing(tmp_path)
    with LedgerReader.open(tmp_path / "ledger.db") as reader:
        reader.check()
        assert len(list(reader.events())) == 60
    assert listing(tmp_path) == before, "-wal / -shm left beside it"


@pytest.mark.parametrize("size", [4096, 8192, 16384])
def test_a_truncated_ledger_is_refused_and_left_as_it_was(size: int, ledger: bytes, tmp_path: Path) -> None:
    (tmp_path / "ledger.db").write_bytes(ledger[:size])
    before = listing(tmp_path)
    with pytest.raises(StorageError):
        with LedgerReader.open(tmp_path / "ledger.db") as reader:
            reader.check()
            list(reader.events())
    assert listing(tmp_path) == before, "-wal / -shm left beside a refused file"


@pytest.mark.parametrize("command", [["audit", "--from", "-1h"], ["stuck", "--older-than", "1s"], ["escalations"],
                                     ["trace", "payments:x"]])  # fmt: skip
def test_operator_reads_of_a_truncated_ledger_leave_its_folder_unchanged(
    command: list[str], ledger: bytes, tmp_path: Path
) -> None:
    (tmp_path / "ledger.db").write_bytes(ledger[:8192])
    before = listing(tmp_path)
    r = CliRunner().invoke(main, [command[0], "--db", str(tmp_path / "ledger.db"), *command[1:]])
    lines = r.stderr.strip().splitlines()
    assert r.exit_code == 1 and len(lines) == 1 and lines[0].startswith("effects: "), r.stderr
    assert listing(tmp_path) == before, "-wal / -shm left beside a refused file"


def test_a_wal_file_beside_the_ledger_is_still_read(ledger: bytes, tmp_path: Path) -> None:
    """A ledger a writer has open (its ``-wal`` there) is read as SQLite reads it, not ``immutable``:
    what is only in the ``-wal`` is seen."""
    src = tmp_path / "src"
    src.mkdir()
    write_ledger(src / "ledger.db", incident(now_ms()).events[:30])
    writer = sqlite3.connect(src / "ledger.db")
    try:
        writer.execute("PRAGMA wal_autocheckpoint=0")
        writer.execute("UPDATE effects SET reason = 'only in the wal'")
        writer.commit()
        assert (src / "ledger.db-wal").stat().st_size > 0
        with LedgerReader.open(src / "ledger.db") as reader:
            assert {r["reason"] for r in reader.unsettled()} == {"only in the wal"}
    finally:
        writer.close()


def test_a_fifo_is_refused_at_once(tmp_path: Path) -> None:
    fifo = tmp_path / "ledger.db"
    os.mkfifo(fifo)
    try:
        e = finishes(lambda: LedgerReader.open(fifo).close())
        assert isinstance(e, StorageError) and "not a regular file" in str(e), e
    finally:
        _release(fifo)
    assert os.listdir(tmp_path) == ["ledger.db"]


def test_a_device_is_refused() -> None:
    with pytest.raises(StorageError, match="not a regular file"):
        LedgerReader.open("/dev/zero")


def _release(fifo: Path) -> None:
    """Let a reader blocked on opening ``fifo`` (the code before the fix) go on: open it for writing."""
    try:
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    except OSError:
        pass  # nobody is waiting on it

"""The command line's validated option types (``effect_ledger.cli._boundary``)."""

from __future__ import annotations

import os
from pathlib import Path

import click
import pytest

from effect_ledger.cli._boundary import MAX_SECONDS, POSITIVE_SECONDS, LedgerPath, Seconds
from effect_ledger.sdk.ledger import MAX_TIMEOUT_S


@pytest.mark.parametrize("value", ["nan", "NaN", "inf", "-inf", "1e309", "0", "-1", str(MAX_SECONDS + 1)])
def test_seconds_that_are_not_finite_or_in_range_are_refused(value: str) -> None:
    """``nan`` passed every comparison of the range and ``inf`` (``1e309``) had no upper bound: a
    wait that never ended (``tail --give-up-after nan``, ``--broker-timeout inf``)."""
    with pytest.raises(click.BadParameter):
        POSITIVE_SECONDS.convert(value, None, None)


def test_seconds_in_range_pass() -> None:
    assert POSITIVE_SECONDS.convert("0.5", None, None) == 0.5
    assert POSITIVE_SECONDS.convert(str(MAX_SECONDS), None, None) == MAX_SECONDS
    assert Seconds(min=0, min_open=True, max=300).convert("300", None, None) == 300
    with pytest.raises(click.BadParameter, match="finite"):
        Seconds(min=0, min_open=True, max=300).convert("nan", None, None)


def test_the_longest_wait_is_the_sdks_longest_call_deadline() -> None:
    assert MAX_SECONDS == MAX_TIMEOUT_S  # demo --timeout is a call deadline


def test_a_ledger_path_that_is_not_a_regular_file_is_refused(tmp_path: Path) -> None:
    fifo = tmp_path / "ledger.db"
    os.mkfifo(fifo)
    for bad in (str(fifo), "/dev/zero", "/dev/null"):
        with pytest.raises(click.BadParameter, match="not a regular file"):
            LedgerPath().convert(bad, None, None)
    assert LedgerPath().convert(str(tmp_path / "new.db"), None, None) == str(tmp_path / "new.db")  # created later
    (tmp_path / "file.db").write_bytes(b"")
    os.symlink(tmp_path / "file.db", tmp_path / "link.db")
    assert LedgerPath(exists=True).convert(str(tmp_path / "link.db"), None, None) == str(tmp_path / "link.db")

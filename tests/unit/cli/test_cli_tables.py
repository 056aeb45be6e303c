"""Effect ids are printed whole in every table: an id is what an operator copies into
``effects resolve`` or ``effects trace``. On a narrow terminal an id folds onto more lines (never cut
with an ellipsis); with ``--wide``, or into a file or a pipe, each row is one line."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from effect_ledger.cli import _shared as cli_shared
from tests.incident import incident
from tests.ops_expected import now_ms, write_ledger

ROOT = Path(__file__).resolve().parents[3]
KEY = "payments:" + "0123456789abcdef" * 4  # as long as a real effect id (target + sha256 hex)


def terminal(monkeypatch: pytest.MonkeyPatch, width: int) -> io.StringIO:
    buf = io.StringIO()
    monkeypatch.setattr(
        cli_shared, "out", Console(file=buf, width=width, force_terminal=True, color_system=None, highlight=False)
    )
    return buf


def rows(title: str = "stuck") -> object:
    t = cli_shared.table(title, "effect", "state", "target", "operation", "since (UTC)", "reason")
    t.add_row(KEY, "PENDING", "payments", "refund.create", "2026-12-01T01:00:00.000Z", "the call timed out")
    return t


def test_a_narrow_terminal_folds_the_id_and_never_cuts_it(monkeypatch: pytest.MonkeyPatch) -> None:
    buf = terminal(monkeypatch, 60)
    cli_shared.print_table(rows())  # type: ignore[arg-type]
    text = buf.getvalue()
    assert "…" not in text
    first_cells = [line.split("│")[1].strip() for line in text.splitlines() if line.count("│") >= 3]
    assert "".join(first_cells).endswith(KEY)  # the folded pieces, in order, are the whole id
    assert all(len(line) <= 60 for line in text.splitlines())


def test_wide_prints_each_row_on_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    buf = terminal(monkeypatch, 60)
    cli_shared.print_table(rows(), wide=True)  # type: ignore[arg-type]
    assert any(KEY in line and "the call timed out" in line for line in buf.getvalue().splitlines())


def test_stuck_into_a_pipe_prints_whole_ids_one_row_a_line(tmp_path: Path) -> None:
    inc = incident(now_ms())
    path = write_ledger(tmp_path / "incident.db", inc.events)
    r = subprocess.run(
        [sys.executable, "-m", "effect_ledger", "stuck", "--db", str(path), "--older-than", "10m"],
        cwd=ROOT, env=dict(os.environ, COLUMNS="80"), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert r.returncode == 3, r.stderr
    lines = r.stdout.splitlines()
    for key in inc.stuck:
        assert any(key in line for line in lines), f"{key} not whole in\n{r.stdout}"
    assert "…" not in r.stdout

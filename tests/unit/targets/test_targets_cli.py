"""``effects run`` and ``effects reconcile`` read the targets declaration (``--targets FILE`` or
``EFFECTS_TARGETS``), as real child processes (``python -m effect_ledger``): a missing or malformed
declaration is one line on stderr and exit 1, and nothing starts (no ledger file, no broker
connection). Then the scenario that made the declaration necessary: an effect left open by a crash
after the call is confirmed by the runner through the lookup its declaration names, where a bare
``effects run --db FILE`` used to escalate it."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from effect_ledger.core.keys import effect_key
from effect_ledger.demo.gateway import Gateway

ROOT = Path(__file__).resolve().parents[3]
GOOD = '[targets.payments]\nlookup = "none"\n'
BAD = '[targets.payments]\nlookup = "none"\nhonors_keys = true\n'  # a misspelt setting, line 3


def effects(*args: str | Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if k != "EFFECTS_TARGETS"}
    full.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "effect_ledger", *map(str, args)],
        cwd=ROOT, env=full, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def one_line(stderr: str) -> str:
    lines = stderr.splitlines()
    assert len(lines) == 1, stderr
    return lines[0]


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    (tmp_path / "good.toml").write_text(GOOD)
    (tmp_path / "bad.toml").write_text(BAD)
    return {"good": tmp_path / "good.toml", "bad": tmp_path / "bad.toml", "db": tmp_path / "effects.db"}


def test_run_without_a_declaration_is_one_line_and_exit_1(files: dict[str, Path]) -> None:
    r = effects("run", "--db", files["db"], "--once")
    assert r.returncode == 1
    line = one_line(r.stderr)
    assert line.startswith("effects: no targets declared: give --targets FILE or set EFFECTS_TARGETS"), line
    assert not files["db"].exists()


@pytest.mark.parametrize("how", ["option", "environment"])
def test_run_with_a_bad_declaration_names_file_and_line(files: dict[str, Path], how: str) -> None:
    if how == "option":
        r = effects("run", "--db", files["db"], "--targets", files["bad"], "--once")
    else:
        r = effects("run", "--db", files["db"], "--once", env={"EFFECTS_TARGETS": str(files["bad"])})
    assert r.returncode == 1 and r.stdout == ""
    assert one_line(r.stderr) == f"effects: {files['bad']}:3: target 'payments': unknown setting 'honors_keys' " + (
        "(known: absent_status, absent_values, backoff, body, definite_errors, found_status, headers, "
        "honours_keys, key_retention, lands_within, lookup, max_body, pending_values, receipt_field, receipt_id, "
        "reconciler, redact, redirects, searchable, state_field, subject, timeout)"
    )
    assert not files["db"].exists()  # nothing started


def test_run_with_a_missing_declaration_file(files: dict[str, Path], tmp_path: Path) -> None:
    r = effects("run", "--db", files["db"], "--targets", tmp_path / "nowhere.toml", "--once")
    assert r.returncode == 1
    assert one_line(r.stderr).startswith(f"effects: {tmp_path / 'nowhere.toml'}:1: cannot read the targets file")
    assert not files["db"].exists()


@pytest.mark.parametrize("how", ["option", "environment"])
def test_run_with_a_good_declaration_works(files: dict[str, Path], how: str) -> None:
    if how == "option":
        r = effects("run", "--db", files["db"], "--targets", files["good"], "--once")
    else:
        r = effects("run", "--db", files["db"], "--once", env={"EFFECTS_TARGETS": str(files["good"])})
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"timed_out": [], "reconciled": {}}
    assert files["db"].exists()


def test_run_on_a_folder_that_does_not_exist_is_one_line(files: dict[str, Path], tmp_path: Path) -> None:
    r = effects("run", "--db", tmp_path / "no" / "effects.db", "--targets", files["good"], "--once")
    assert r.returncode == 1
    assert "does not exist" in one_line(r.stderr)


@pytest.mark.parametrize("declared", [False, True], ids=["missing", "malformed"])
def test_reconcile_refuses_a_bad_declaration_before_any_broker(files: dict[str, Path], declared: bool) -> None:
    """Nothing listens on port 9 here: a command that reached for the broker first would fail with
    the broker's message instead."""
    args = ["reconcile", "--bootstrap", "127.0.0.1:9"] + (["--targets", str(files["bad"])] if declared else [])
    r = effects(*args)
    assert r.returncode == 1
    line = one_line(r.stderr)
    if declared:
        assert line.startswith(f"effects: {files['bad']}:3: target 'payments': unknown setting 'honors_keys'"), line
    else:
        assert line.startswith("effects: no targets declared"), line


# --- the scenario: a crash after the call, resolved through the declared lookup -------------------------


@pytest.fixture
def gateway() -> Iterator[Gateway]:
    with Gateway("lookup") as gw:  # answers "refund by key?", does not deduplicate keys
        yield gw


def crash_after_the_call(workdir: Path, gateway: Gateway, declaration: Path) -> str:
    """The demo agent, killed (SIGKILL) after the gateway made the refund and before anything was
    recorded. Returns the effect's key."""
    env = dict(os.environ, EFFECT_LEDGER_CRASH="after_call")
    env.pop("EFFECTS_TARGETS", None)
    cmd = [
        sys.executable, "-m", "effect_ledger.demo.agent", "--mode", "ledger", "--workdir", str(workdir),
        "--gateway", gateway.url, "--kind", "lookup", "--targets", str(declaration), "--timeout", "0.5",
    ]  # fmt: skip
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == -9, p.stderr  # killed at the crash point
    assert len(gateway.refunds()) == 1  # the destination made the refund
    return effect_key("payments", "refund.create", "run-1", "refund-order-123")


def row(db: Path, key: str) -> dict[str, Any]:
    conn = sqlite3.connect(db)
    try:
        conn.row_factory = sqlite3.Row
        found = conn.execute("SELECT * FROM effects WHERE effect_id = ?", (key,)).fetchone()
        assert found is not None
        return dict(found)
    finally:
        conn.close()


def past_deadline_and_grace(db: Path, key: str) -> None:
    """Wait until the runner may fire the effect's deadline (its grace is 1 s)."""
    deadline = row(db, key)["deadline_ms"]
    end = time.monotonic() + 30
    while time.time() * 1000 <= deadline + 1_000:
        assert time.monotonic() < end, "the clock did not pass the deadline"
        time.sleep(0.05)


@pytest.mark.parametrize(
    "lookup,state", [(True, "CONFIRMED"), (False, "ESCALATED")], ids=["declared-lookup", "declared-none"]
)
def test_a_crash_after_the_call_is_settled_through_the_declared_lookup(
    tmp_path: Path, gateway: Gateway, lookup: bool, state: str
) -> None:
    declaration = tmp_path / "targets.toml"
    declaration.write_text(
        "[targets.payments]\n"
        + (f'lookup = "{gateway.url}/refunds/by-key/{{key}}"\n' if lookup else 'lookup = "none"\n')
        + 'definite_errors = ["effect_ledger.demo.client:RefundRejected"]\n'
    )
    key = crash_after_the_call(tmp_path, gateway, declaration)
    db = tmp_path / "effects.db"
    assert row(db, key)["state"] == "PENDING"
    past_deadline_and_grace(db, key)

    r = effects("run", "--db", db, "--targets", declaration, "--once")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"timed_out": [key], "reconciled": {key: state}}
    settled = row(db, key)
    assert settled["state"] == state
    refund = gateway.refunds()[0]
    if lookup:
        assert settled["receipt_id"] == refund.id  # found at the gateway by its key
        # The agent, restarted, gets the recorded receipt: still one refund.
        env = {k: v for k, v in os.environ.items() if k != "EFFECT_LEDGER_CRASH"}
        p = subprocess.run(
            [sys.executable, "-m", "effect_ledger.demo.agent", "--mode", "ledger", "--workdir",
             str(tmp_path), "--gateway", gateway.url, "--kind", "lookup", "--targets", str(declaration)],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert p.returncode == 0, p.stderr
        assert json.loads(p.stdout.splitlines()[-1])["receipt_id"] == refund.id
    assert len(gateway.refunds()) == 1

"""``effects audit`` output an on-call can act on: a failed check names its effects (a bounded list and
the whole count), each with its console link (``/effect/{effect_id}``, under ``--console-url`` or
``EFFECTS_CONSOLE_URL``), and a failed check exits 1 when stdout is not a terminal unless
``--report-only``. Over real ledger files, through the real command line (in process, as a child
with piped output, and as a child on a pseudo-terminal)."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from effect_ledger.cli.main import main
from effect_ledger.core.keys import effect_key
from effect_ledger.core.model import Event, Intent
from effect_ledger.ops.audit import effect_link
from tests.incident import Incident, incident
from tests.ops_expected import now_ms, write_ledger

ROOT = Path(__file__).resolve().parents[3]
CONSOLE = "http://127.0.0.1:8080"


@pytest.fixture(scope="module")
def incident_ledger(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Incident]:
    inc = incident(now_ms())
    return write_ledger(tmp_path_factory.mktemp("incident") / "incident.db", inc.events), inc


def cli(*args: str | Path, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args], env=env)


def child(*args: str | Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if k != "EFFECTS_CONSOLE_URL"}
    full.update(COLUMNS="200", **(env or {}))
    return subprocess.run(
        [sys.executable, "-m", "effect_ledger", *map(str, args)],
        cwd=ROOT, env=full, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_each_failed_check_names_its_keys_and_their_console_links(incident_ledger: tuple[Path, Incident]) -> None:
    path, inc = incident_ledger
    r = cli("audit", "--db", path, "--from", "-1h", "--json", "--console-url", CONSOLE + "/")
    assert r.exit_code == 1, r.output
    checks = {c["name"]: c for c in json.loads(r.stdout)["checks"]}
    want = {
        "keyed_writes": sorted(inc.doubled),  # the doubled ones were sent without their key
        "recorded_outcomes": sorted(inc.stuck),  # the stuck ones never recorded an outcome
        "duplicate_executions": sorted(inc.doubled),
        "stuck_over_10m": sorted(inc.stuck),
    }
    failed = {name for name, c in checks.items() if not c["passed"]}
    assert failed == set(want)
    for name, keys in want.items():
        assert checks[name]["keys"] == keys, name
        assert checks[name]["failing"] == len(keys), name
        assert checks[name]["links"] == [f"{CONSOLE}/effect/{k}" for k in keys], name
    for name in set(checks) - failed:  # a passing check lists nothing
        assert checks[name]["keys"] == [] and checks[name]["failing"] == 0, name


def test_without_a_console_address_the_link_is_the_path(incident_ledger: tuple[Path, Incident]) -> None:
    path, inc = incident_ledger
    r = cli("audit", "--db", path, "--from", "-1h", "--json", env={"EFFECTS_CONSOLE_URL": ""})
    checks = {c["name"]: c for c in json.loads(r.stdout)["checks"]}
    assert checks["stuck_over_10m"]["links"] == [f"/effect/{k}" for k in sorted(inc.stuck)]
    # The environment variable gives the address when no flag does.
    r = cli("audit", "--db", path, "--from", "-1h", "--json", env={"EFFECTS_CONSOLE_URL": "http://c.example:9"})
    checks = {c["name"]: c for c in json.loads(r.stdout)["checks"]}
    assert checks["duplicate_executions"]["links"] == [f"http://c.example:9/effect/{k}" for k in sorted(inc.doubled)]


def test_the_table_lists_each_failed_check_with_keys_and_links_and_exits_1_when_piped(
    incident_ledger: tuple[Path, Incident],
) -> None:
    path, inc = incident_ledger
    r = child("audit", "--db", path, "--from", "-1h", env={"EFFECTS_CONSOLE_URL": CONSOLE})
    assert r.returncode == 1, r.stderr
    lines = r.stdout.splitlines()
    for name, keys in (("duplicate_executions", inc.doubled), ("stuck_over_10m", inc.stuck)):
        head = next(i for i, ln in enumerate(lines) if ln.startswith(f"FAIL {name}:"))
        assert f"{len(keys)} failing" in lines[head], lines[head]
        listed = [ln.split() for ln in lines[head + 1 : head + 1 + len(keys)]]
        assert listed == [[k, f"{CONSOLE}/effect/{k}"] for k in sorted(keys)]
    assert not any(ln.startswith("FAIL receipts") for ln in lines)  # a passing check is not listed


def test_report_only_exits_0_and_fail_on_check_exits_3(incident_ledger: tuple[Path, Incident]) -> None:
    path, _ = incident_ledger
    assert child("audit", "--db", path, "--from", "-1h", "--report-only").returncode == 0
    assert child("audit", "--db", path, "--from", "-1h", "--fail-on-check").returncode == 3
    assert cli("audit", "--db", path, "--from", "-1h", "--json", "--report-only").exit_code == 0


def test_a_passing_audit_exits_0_when_piped(incident_ledger: tuple[Path, Incident]) -> None:
    path, _ = incident_ledger
    r = child("audit", "--db", path, "--from", "-5m")  # a window before everything: every check passes
    assert r.returncode == 0, r.stderr
    assert "FAIL" not in r.stdout


def test_at_a_terminal_a_failed_check_is_read_not_an_exit_status(incident_ledger: tuple[Path, Incident]) -> None:
    """A person runs ``effects audit`` at a terminal and reads the FAIL rows: the status stays 0."""
    path, inc = incident_ledger
    leader, follower = pty.openpty()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "effect_ledger", "audit", "--db", str(path), "--from", "-1h"],
            cwd=ROOT, stdin=subprocess.DEVNULL, stdout=follower, stderr=subprocess.PIPE,
            env=dict(os.environ, COLUMNS="200"),
        )  # fmt: skip
        os.close(follower)
        seen = b""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # the child closed the terminal: everything is read
                break
            if not chunk:
                break
            seen += chunk
        assert proc.wait(timeout=60) == 0, proc.stderr.read() if proc.stderr else ""
    finally:
        os.close(leader)
    text = seen.decode(errors="replace")
    assert "FAIL" in text and all(k in text for k in inc.doubled)


def test_a_long_list_is_bounded_on_screen_and_whole_in_the_count(tmp_path: Path) -> None:
    t = now_ms() - 20 * 60_000
    keys = [effect_key("payments", "create", "many", f"step-{i}") for i in range(25)]
    events: list[Event] = [
        Intent(f"i-{i}", k, t + i, 1, "payments", "create", "default", "many", f"step-{i}", "{}", "d", t + 10_000, "w")
        for i, k in enumerate(keys)
    ]  # 25 intents 20 minutes old, nothing after them: stuck, and no outcome recorded
    path = write_ledger(tmp_path / "many.db", events)
    r = child("audit", "--db", path, "--from", "-1h")
    assert r.returncode == 1
    lines = r.stdout.splitlines()
    head = next(i for i, ln in enumerate(lines) if ln.startswith("FAIL stuck_over_10m:"))
    assert "25 failing" in lines[head] and "the first 10" in lines[head], lines[head]
    assert [ln.split()[0] for ln in lines[head + 1 : head + 11]] == sorted(keys)[:10]
    assert lines[head + 1].split()[1] == f"/effect/{sorted(keys)[0]}"
    assert not lines[head + 11].startswith("  payments:")
    report = json.loads(cli("audit", "--db", path, "--from", "-1h", "--json").stdout)
    stuck = next(c for c in report["checks"] if c["name"] == "stuck_over_10m")
    assert stuck["keys"] == sorted(keys) and stuck["failing"] == 25


@pytest.mark.parametrize(
    ("key", "path"),
    [
        ("payments:ab12", "/effect/payments:ab12"),
        ("my/key?x=1#y", "/effect/my%2Fkey%3Fx=1%23y"),
        ("100%", "/effect/100%25"),
    ],
)
def test_a_key_is_one_path_segment_of_its_link(key: str, path: str) -> None:
    assert effect_link(None, key) == path
    assert effect_link("https://console.example/ops/", key) == "https://console.example/ops" + path

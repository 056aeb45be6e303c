"""A secret written in a URL never reaches the ledger, a terminal or a report.

Found by review: a target whose ``api`` or ``lookup`` URL held ``user:password@`` (or a token in its
query) wrote that URL into the reasons of its Unknown answers, and so into the ledger's events (which
are immutable and replicated to Kafka), and ``effects trace`` and ``effects escalations`` printed
it. Now:

* ``user:password@`` in ``lookup``, ``api``, ``smtp`` or ``imap`` is refused when the targets file
  is loaded, in one line that names the file, the line and the setting and does not repeat the
  password (credentials go in ``headers`` from the environment, or ``smtp_user``/``smtp_password``);
* a query-string value of a lookup URL (some APIs take their key as ``?token=``) is masked in every
  reason: the reason still says which resource was asked, with ``token=***``;
* ``effects audit --console-url`` takes only an http(s) URL and prints no ``user:password@`` of it.

Real child processes (``python -m effect_ledger``), real ledger files read back with SQL, the
destination a closed loopback port (a destination that is down)."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from effect_ledger.core.keys import effect_key
from effect_ledger.demo.gateway import Gateway
from tests.faults.test_evidence_rule import closed_port
from tests.incident import incident
from tests.ops_expected import now_ms, write_ledger

ROOT = Path(__file__).resolve().parents[2]
SECRETS = ("APISECRET", "LOOKUPSECRET", "QTOKSECRET", "SECRETPW", "IMAPSECRET", "CONSOLESECRET")


def effects(*args: str | Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if k not in ("EFFECTS_TARGETS", "EFFECTS_CONSOLE_URL")}
    full.update(COLUMNS="200", **(env or {}))
    return subprocess.run(
        [sys.executable, "-m", "effect_ledger", *map(str, args)],
        cwd=ROOT, env=full, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def no_secret(*texts: str) -> None:
    for text in texts:
        for secret in SECRETS:
            assert secret not in text, f"{secret} shown in: {text[:2000]}"


def ledger_text(db: Path) -> str:
    """Every value of every table of the ledger file, as text: where a secret would be kept."""
    conn = sqlite3.connect(db)
    try:
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        out = []
        for table in tables:
            for row in conn.execute(f'SELECT * FROM "{table}"'):
                out.extend(v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v) for v in row)
        return "\n".join(out)
    finally:
        conn.close()


# --- refused at load: user:password@ in a URL setting ------------------------------------------------


@pytest.mark.parametrize(
    "declaration,line,setting",
    [
        ('[targets.refunds]\nkind = "payment"\napi = "http://u:APISECRET@127.0.0.1:9"\n', 3, "api"),
        ('[targets.jira]\nkind = "ticket"\nkey_field = "labels"\napi = "https://u:APISECRET@jira.example"\n', 4, "api"),
        (
            '[targets.payments]\nlookup = "http://u:LOOKUPSECRET@127.0.0.1:9/r/{key}?token=QTOKSECRET"\n',
            2,
            "lookup",
        ),
        ('[targets.payments]\nlookup = "http://LOOKUPSECRET@127.0.0.1:9/r/{key}"\n', 2, "lookup"),
        ('[targets.mail]\nkind = "smtp"\nsmtp = "smtp://u:SECRETPW@127.0.0.1:2525"\n', 3, "smtp"),
        (
            '[targets.mail]\nkind = "smtp"\nsmtp = "smtp://127.0.0.1:2525"\nimap = "imap://u:IMAPSECRET@127.0.0.1:1143"\n',
            4,
            "imap",
        ),
    ],
    ids=["payment-api", "ticket-api", "lookup-user-password", "lookup-token-as-user", "smtp", "imap"],
)
def test_credentials_in_a_url_setting_are_refused_without_being_echoed(
    tmp_path: Path, declaration: str, line: int, setting: str
) -> None:
    targets = tmp_path / "t.toml"
    targets.write_text(declaration)
    before = targets.read_bytes()
    db = tmp_path / "e.db"
    r = effects("run", "--once", "--db", db, "--targets", targets)
    assert r.returncode == 1 and r.stdout == ""
    lines = r.stderr.splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith(f"effects: {targets}:{line}: target "), lines[0]
    assert f"{setting} must not hold a user name or password" in lines[0], lines[0]
    no_secret(r.stderr)
    assert not db.exists()  # nothing started
    assert targets.read_bytes() == before


# --- masked in reasons: a token in a lookup URL's query -----------------------------------------------


def crash_after_the_call(workdir: Path, gateway: Gateway, declaration: Path) -> str:
    """The demo agent SIGKILLed after the gateway made the refund and before anything was recorded:
    an effect the runner must ask the lookup about. Returns its key."""
    env = {k: v for k, v in os.environ.items() if k != "EFFECTS_TARGETS"}
    env["EFFECT_LEDGER_CRASH"] = "after_call"
    cmd = [
        sys.executable, "-m", "effect_ledger.demo.agent", "--mode", "ledger", "--workdir", str(workdir),
        "--gateway", gateway.url, "--kind", "lookup", "--targets", str(declaration), "--timeout", "0.5",
    ]  # fmt: skip
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == -9, p.stderr
    return effect_key("payments", "refund.create", "run-1", "refund-order-123")


def past_deadline_and_grace(db: Path, key: str) -> None:
    conn = sqlite3.connect(db)
    try:
        (deadline,) = conn.execute("SELECT deadline_ms FROM effects WHERE effect_id = ?", (key,)).fetchone()
    finally:
        conn.close()
    end = time.monotonic() + 30
    while time.time() * 1000 <= deadline + 1_000:  # the runner's grace is 1 s
        assert time.monotonic() < end, "the clock did not pass the deadline"
        time.sleep(0.05)


def test_a_query_token_of_a_lookup_is_in_no_event_and_no_output(tmp_path: Path) -> None:
    port = closed_port()  # the destination's lookup is down: every answer is Unknown, with its reason
    declaration = tmp_path / "t.toml"
    declaration.write_text(
        "[targets.payments]\n"
        f'lookup = "http://127.0.0.1:{port}/r/{{key}}?token=QTOKSECRET&page=1"\n'
        'definite_errors = ["effect_ledger.demo.client:RefundRejected"]\n'
        "backoff = { tries = 1 }\n"  # one Unknown answer escalates it: it reaches the queue too
    )
    with Gateway("lookup") as gateway:
        key = crash_after_the_call(tmp_path, gateway, declaration)
    db = tmp_path / "effects.db"
    past_deadline_and_grace(db, key)

    r = effects("run", "--once", "--db", db, "--targets", declaration)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["timed_out"] == [key]
    no_secret(r.stdout, r.stderr)
    kept = ledger_text(db)
    # The reason was written (the path this test is about), with the resource and without the token.
    assert f"GET http://127.0.0.1:{port}/r/" in kept and "token=***" in kept, kept[-3000:]
    no_secret(kept)

    for args in (["trace", key, "--db", db], ["escalations", "--db", db], ["escalations", "--db", db, "--json"]):
        shown = effects(*args)
        assert shown.returncode == 0, shown.stderr
        no_secret(shown.stdout, shown.stderr)
    trace = effects("trace", key, "--db", db, "--json")
    assert trace.returncode == 0 and "token=***" in trace.stdout, trace.stdout[-3000:]
    no_secret(trace.stdout, trace.stderr)


# --- effects audit --console-url ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def failing_ledger(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The known incident: checks fail, so the audit prints a console link per failing key."""
    return write_ledger(tmp_path_factory.mktemp("incident") / "incident.db", incident(now_ms()).events)


@pytest.mark.parametrize(
    "url", ["javascript:alert(1)", "file:///etc/passwd", "ftp://u:CONSOLESECRET@h/", "http://", "CONSOLESECRET"]
)
def test_audit_takes_only_an_http_console_url(failing_ledger: Path, url: str) -> None:
    for how in ("option", "environment"):
        args = ["audit", "--db", failing_ledger, "--from", "-1h", "--json"]
        r = (
            effects(*args, "--console-url", url)
            if how == "option"
            else effects(*args, env={"EFFECTS_CONSOLE_URL": url})
        )
        assert r.returncode == 1 and r.stdout == "", (how, r.stdout[:500])
        lines = r.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("effects: --console-url "), r.stderr
        no_secret(r.stderr)


def test_audit_links_carry_no_credentials_of_the_console_url(failing_ledger: Path) -> None:
    url = "http://ops:CONSOLESECRET@127.0.0.1:8080/console/"
    for args in (["--json"], ["--csv"], []):
        r = effects("audit", "--db", failing_ledger, "--from", "-1h", *args, "--console-url", url)
        assert r.returncode == 1, r.stderr  # checks fail, output is a pipe
        no_secret(r.stdout, r.stderr)
    r = effects("audit", "--db", failing_ledger, "--from", "-1h", "--json", env={"EFFECTS_CONSOLE_URL": url})
    links = [link for check in json.loads(r.stdout)["checks"] for link in check.get("links", [])]
    assert links and all(link.startswith("http://127.0.0.1:8080/console/effect/") for link in links), links[:3]
    no_secret(r.stdout, r.stderr)

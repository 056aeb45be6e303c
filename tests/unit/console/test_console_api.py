"""The console's JSON API and pages over a real ledger file with known contents
(``tests/console_ledger.py``), through real HTTP on loopback: the counts, the window, the bad-input
rules (400 and a message on the page), authentication (401 and nothing written), refused decisions
(409, nothing written) and the loopback rule of ``effects console``."""

from __future__ import annotations

import base64
import json
import os
import sqlite3
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from effect_ledger.cli.main import main
from effect_ledger.console.auth import Credentials
from tests.console_ledger import ConsoleLedger, console_ledger
from tests.console_server import serve
from tests.ops_expected import now_ms

TOKEN = "console-test-token"
CREDS = Credentials(TOKEN, {"alice": "wonderland"})


@pytest.fixture(scope="module")
def ledger(tmp_path_factory: pytest.TempPathFactory) -> ConsoleLedger:
    return console_ledger(tmp_path_factory.mktemp("console") / "console.db", now_ms())


@pytest.fixture(scope="module")
def url(ledger: ConsoleLedger) -> Iterator[str]:
    with serve(str(ledger.path), CREDS) as base:
        yield base


def call(
    url: str, path: str, body: dict[str, Any] | None = None, auth: str | None = None, form: bool = False
) -> tuple[int, str]:
    headers = {"Authorization": auth} if auth else {}
    data = None
    if body is not None:
        data = (urllib.parse.urlencode(body) if form else json.dumps(body)).encode()
        headers["Content-Type"] = "application/x-www-form-urlencoded" if form else "application/json"
    req = urllib.request.Request(url + path, data=data, headers=headers, method="POST" if body is not None else "GET")
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def get_json(url: str, path: str) -> dict[str, Any]:
    status, text = call(url, path)
    assert status == 200, text
    return json.loads(text)


def written(path: Path) -> tuple[int, list[tuple[str, str]]]:
    """What the file holds: its events and every effect's state."""
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as conn:
        events = conn.execute("SELECT count(*) FROM events").fetchone()[0]
        states = conn.execute("SELECT effect_id, state FROM effects ORDER BY effect_id").fetchall()
    return events, states


def q(**params: str) -> str:
    return urllib.parse.urlencode(params)


# -- reading --------------------------------------------------------------------------------------


def test_effects_counts_per_state_and_target_and_the_filters(url: str, ledger: ConsoleLedger) -> None:
    d = get_json(url, "/api/effects?" + q(**{"from": "-1h"}))
    assert d["by_state"] == {"CONFIRMED": 995, "PENDING": 5, "ESCALATED": 2}
    assert d["by_target"] == {"payments": 902, "tickets": 100}
    assert d["matched"] == 1002 and len(d["effects"]) == 500  # bounded; the counts are whole
    assert sum(sum(b.values()) for b in d["chart"]) == 1002
    stuck = get_json(url, "/api/effects?" + q(**{"from": "-1h", "state": "pending"}))
    assert sorted(e["effect_id"] for e in stuck["effects"]) == sorted(ledger.incident.stuck)
    tickets = get_json(url, "/api/effects?" + q(**{"from": "-1h", "state": "CONFIRMED,PENDING", "target": "tickets"}))
    assert tickets["matched"] == 100 and {e["target"] for e in tickets["effects"]} == {"tickets"}


def test_the_window_decides_which_effects_are_listed(url: str) -> None:
    # The incident began 30 to 20 minutes ago, the escalations 15 minutes ago.
    assert get_json(url, "/api/effects?" + q(**{"from": "-10m"}))["matched"] == 0
    assert get_json(url, "/api/effects?" + q(**{"from": "-16m", "to": "-14m"}))["by_state"] == {"ESCALATED": 2}


def test_stuck_escalations_and_trace(url: str, ledger: ConsoleLedger) -> None:
    d = get_json(url, "/api/stuck?older_than=10m")
    assert {r["effect_id"] for r in d["stuck"]} == set(ledger.incident.stuck) | {ledger.escalated, ledger.in_flight}
    queue = {e["effect_id"]: e["answers"] for e in d["escalations"]}
    assert queue[ledger.escalated] == [
        "http:gw: UNKNOWN (gateway answered 503)",
        "http:gw: ESCALATE (no answer after 5 tries)",
    ]
    t = get_json(url, "/api/trace/" + urllib.parse.quote(ledger.incident.doubled[0], safe=""))
    assert t["sent_unrecorded_ms"] == [2, 2] and "DUPLICATE_EXECUTION" in " ".join(t["flags"]).upper()
    status, text = call(url, "/api/trace/nobody")
    assert status == 404 and "no effect with key 'nobody'" in text


def test_audit_checks_the_window(url: str) -> None:
    d = get_json(url, "/api/audit?" + q(**{"from": "-1h"}))
    checks = {c["name"]: c for c in d["checks"]}
    assert checks["duplicate_executions"]["numerator"] == 3 and not checks["duplicate_executions"]["passed"]
    assert checks["stuck_over_10m"]["numerator"] == 5 + 2


# -- bad input ----------------------------------------------------------------------------------------

BAD = {
    "from after to": ({"from": "-1h", "to": "-2h"}, "empty window"),
    "from equal to": ({"from": "2026-01-01T00:00:00Z", "to": "2026-01-01T00:00:00Z"}, "empty window"),
    "unknown state": ({"state": "PENDING,SLEEPING"}, "unknown state SLEEPING"),
    "malformed from": ({"from": "yesterday"}, "not a time: 'yesterday'"),
    "malformed to": ({"to": "2026-13-45"}, "not a time: '2026-13-45'"),
    "time out of range": ({"from": "-100000d"}, "out of range"),
    "malformed duration": ({"older_than": "ten minutes"}, "not a duration"),
    # int() refuses these digits, or over 4300 of them: a plain ValueError, a 500, before.
    "unicode digits": ({"from": "²" * 12}, "ASCII digits only"),
    "5000 digits": ({"to": "1" * 5000}, "5000 characters, at most 64"),
    "unicode duration": ({"older_than": "²s"}, "not a duration"),
}


@pytest.mark.parametrize("api", ["/api/effects", "/api/stuck", "/api/audit"])
@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_is_a_400_from_the_api(url: str, api: str, case: str) -> None:
    params, message = BAD[case]
    status, text = call(url, f"{api}?{q(**params)}")
    assert status == 400 and message in json.loads(text)["error"]


@pytest.mark.parametrize("page", ["/", "/stuck", "/audit"])
@pytest.mark.parametrize("case", ["from after to", "unknown state", "malformed from", "unicode digits", "5000 digits"])
def test_bad_input_is_a_message_on_the_page(url: str, page: str, case: str) -> None:
    params, message = BAD[case]
    status, text = call(url, f"{page}?{q(**params)}")
    assert status == 400 and 'id="error"' in text and message in text.replace("&#x27;", "'")
    assert 'name="from"' in text or 'name="older_than"' in text  # the form is back, to correct it


# -- decisions ----------------------------------------------------------------------------------------


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


@pytest.mark.parametrize(
    "auth",
    # A byte that is not UTF-8 (sent as latin-1 by http.client) reaches the app as a lone surrogate.
    [None, "Bearer wrong", basic("alice", "wrong"), basic("mallory", "wonderland"), "Basic !!!", "Digest x",
     "Bearer \xff", "Basic \xff", f"Bearer {TOKEN}\xff"],
)  # fmt: skip
def test_wrong_credentials_are_a_401_and_nothing_is_written(url: str, ledger: ConsoleLedger, auth: str | None) -> None:
    before = written(ledger.path)
    body = {"key": ledger.escalated, "decision": "ABANDONED", "reason": "r", "by": "someone"}
    status, text = call(url, "/api/resolve", body, auth)
    assert status == 401 and "error" in json.loads(text)
    status, text = call(url, "/resolve", {**body, "user": "alice", "secret": "wrong"}, form=True)
    assert status == 401 and "nothing was written" in text
    assert written(ledger.path) == before


def test_a_decision_that_could_cause_a_second_execution_is_a_409(url: str, ledger: ConsoleLedger) -> None:
    before = written(ledger.path)
    body = {"key": ledger.in_flight, "decision": "ABSENT", "reason": "looks lost", "by": "bob"}
    status, text = call(url, "/api/resolve", body, f"Bearer {TOKEN}")
    assert status == 409 and "may still land at the destination" in json.loads(text)["error"]
    assert written(ledger.path) == before


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"decision": "ABANDONED", "reason": "r", "by": "bob"}, "no effect key"),
        ({"decision": "MAYBE", "reason": "r", "by": "bob"}, "decision: one of"),
        ({"decision": "ABANDONED", "by": "bob"}, "reason is required"),
        ({"decision": "ABANDONED", "reason": "r"}, "say who decides"),
        ({"decision": "CONFIRMED", "reason": "r", "by": "bob"}, "receipt id"),
    ],
)
def test_an_incomplete_decision_is_a_400(url: str, ledger: ConsoleLedger, body: dict[str, str], message: str) -> None:
    before = written(ledger.path)
    full = {"key": ledger.escalated, **body} if message != "no effect key" else body
    status, text = call(url, "/api/resolve", full, f"Bearer {TOKEN}")
    assert status == 400 and message in json.loads(text)["error"]
    assert written(ledger.path) == before


def post(url: str, path: str, data: bytes, content_type: str, auth: str | None = None) -> tuple[int, str]:
    """A body as it is, with the Content-Type as it is."""
    headers = {"Content-Type": content_type, **({"Authorization": auth} if auth else {})}
    req = urllib.request.Request(url + path, data=data, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


DECISION = b'"decision": "ABANDONED", "reason": "r", "by": "bob"'
UNREADABLE_JSON = {
    "a 5000-digit number": (b'{"key": 1' + b"1" * 5000 + b", " + DECISION + b"}", "a number too long"),
    "a lone surrogate in the key": (b'{"key": "\\ud800", ' + DECISION + b"}", "'key' is not text"),
    "a lone surrogate in the reason": (
        b'{"key": "k", "decision": "ABANDONED", "reason": "\\udfff", "by": "bob"}',
        "'reason' is not text",
    ),
    "nested deeper than the recursion limit": (b"[" * 8000 + b"]" * 8000, "nested too deeply"),
}


@pytest.mark.parametrize("case", sorted(UNREADABLE_JSON))
def test_json_python_cannot_read_is_a_400(url: str, ledger: ConsoleLedger, case: str) -> None:
    before = written(ledger.path)
    data, message = UNREADABLE_JSON[case]
    status, text = post(url, "/api/resolve", data, "application/json", f"Bearer {TOKEN}")
    assert status == 400 and message in json.loads(text)["error"], text
    assert written(ledger.path) == before


def test_a_body_in_an_unknown_charset_is_a_400(url: str, ledger: ConsoleLedger) -> None:
    before = written(ledger.path)
    form = urllib.parse.urlencode({"key": ledger.escalated, "decision": "ABANDONED", "reason": "r",
                                   "user": "alice", "secret": "wonderland"}).encode()  # fmt: skip
    status, text = post(url, "/resolve", form, "application/x-www-form-urlencoded; charset=bogus")
    assert status == 400 and "the form could not be read: unknown encoding: bogus" in text
    status, text = post(url, "/resolve", b"--x\r\n\r\nzzz\r\n--x--\r\n", "multipart/form-data; boundary=x")
    assert status == 400 and "the form could not be read" in text  # a part without a name
    status, text = post(url, "/api/resolve", b"{}", "application/json; charset=bogus", f"Bearer {TOKEN}")
    assert status == 400 and "unknown encoding: bogus" in json.loads(text)["error"]
    assert written(ledger.path) == before


def test_a_decision_must_be_posted_as_json(url: str, ledger: ConsoleLedger) -> None:
    """A cross-site form (or text/plain) cannot carry a browser's cached credentials into a decision."""
    before = written(ledger.path)
    body = {"key": ledger.escalated, "decision": "ABANDONED", "reason": "r", "by": "bob"}
    status, text = call(url, "/api/resolve", body, basic("alice", "wonderland"), form=True)
    assert status == 400 and "application/json" in json.loads(text)["error"]
    assert written(ledger.path) == before


def test_a_read_only_console_refuses_every_decision(ledger: ConsoleLedger) -> None:
    before = written(ledger.path)
    with serve(str(ledger.path), Credentials()) as base:
        body = {"key": ledger.escalated, "decision": "ABANDONED", "reason": "r", "by": "bob"}
        status, text = call(base, "/api/resolve", body, f"Bearer {TOKEN}")
        assert status == 401 and "read-only" in json.loads(text)["error"]
        assert "read-only" in call(base, "/")[1]
    assert written(ledger.path) == before


def test_a_decision_with_basic_auth_records_the_user(tmp_path: Path) -> None:
    led = console_ledger(tmp_path / "decide.db", now_ms())
    with serve(str(led.path), CREDS) as base:
        body = {"key": led.escalated, "decision": "ABANDONED", "reason": "customer refunded by hand", "by": "x"}
        status, text = call(base, "/api/resolve", body, basic("alice", "wonderland"))
        assert status == 200 and "recorded by alice" in json.loads(text)["recorded"]
        t = get_json(base, "/api/trace/" + urllib.parse.quote(led.escalated, safe=""))
    assert t["state"] == "ABANDONED"
    last = t["events"][-1]
    assert last["source"].startswith("person:alice") and "customer refunded by hand" in last["event"]


# -- where it listens -----------------------------------------------------------------------------------


def test_the_console_refuses_to_listen_beyond_loopback_without_credentials(ledger: ConsoleLedger) -> None:
    r = CliRunner().invoke(
        main, ["console", "--db", str(ledger.path), "--host", "0.0.0.0"], env={"EFFECTS_CONSOLE_TOKEN": ""}
    )
    assert r.exit_code == 1
    assert r.output.strip().splitlines() == [
        "effects: the console would listen on 0.0.0.0, beyond loopback, without credentials: set --token or "
        "EFFECTS_CONSOLE_TOKEN, or --basic-auth-file, or listen on 127.0.0.1"
    ]


def test_beyond_loopback_every_page_needs_the_credentials(ledger: ConsoleLedger) -> None:
    with serve(str(ledger.path), CREDS, guard_reads=True) as base:
        for path in ("/", "/api/effects", "/api/trace/x", "/audit"):
            status, _ = call(base, path)
            assert status == 401, path
            assert call(base, path, auth="Bearer wrong")[0] == 401
            assert call(base, path, auth="Bearer \xff")[0] == 401
            assert call(base, path, auth="Basic \xff")[0] == 401
        assert call(base, "/api/effects", auth=f"Bearer {TOKEN}")[0] == 200
        assert call(base, "/", auth=basic("alice", "wonderland"))[0] == 200


def test_a_malformed_basic_auth_file_is_one_line(ledger: ConsoleLedger, tmp_path: Path) -> None:
    f = tmp_path / "users"
    f.write_text("alice\n")
    r = CliRunner().invoke(main, ["console", "--db", str(ledger.path), "--basic-auth-file", str(f)])
    assert r.exit_code == 1 and r.output.strip() == f"effects: {f} line 1: expected user:password"


@pytest.mark.timeout(60)  # a FIFO with no writer held the console's start for ever
@pytest.mark.parametrize("kind", ["/dev/zero", "a FIFO"])
def test_a_basic_auth_file_that_is_not_a_regular_file_is_one_line(
    ledger: ConsoleLedger, tmp_path: Path, kind: str
) -> None:
    """/dev/zero has st_size 0: the console read it without bound (gigabytes in seconds)."""
    path = Path("/dev/zero") if kind == "/dev/zero" else tmp_path / "users"
    if kind == "a FIFO":
        os.mkfifo(path)
    r = CliRunner().invoke(main, ["console", "--db", str(ledger.path), "--basic-auth-file", str(path)])
    assert r.exit_code == 1 and r.output.strip() == f"effects: {path}: a basic-auth file must be a regular file"


def test_an_oversized_basic_auth_file_is_one_line(ledger: ConsoleLedger, tmp_path: Path) -> None:
    f = tmp_path / "users"
    f.write_text("alice:wonderland\n" * 4000)
    r = CliRunner().invoke(main, ["console", "--db", str(ledger.path), "--basic-auth-file", str(f)])
    assert r.exit_code == 1 and r.output.strip() == f"effects: {f}: a basic-auth file is at most 65536 bytes"

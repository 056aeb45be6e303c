"""The operator and auditor commands (``effects audit | stuck | trace | escalations | resolve``) on an
embedded ledger file, no broker.

The known incident of ``tests/incident.py`` (1,000 effects: 3 double-executed, 5 stuck, 20 uncertain
then reconciled) is written event by event into a real ledger file with ``Store.append``, and the
real command line reads it: in process through click's ``CliRunner`` where only the output matters,
as a child process (``python -m effect_ledger``) where the error contract (one line on stderr, no
traceback) or the terminal width matters."""

from __future__ import annotations

import asyncio
import csv
import io
import json
import os
import sqlite3
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from effect_ledger.cli.main import main
from effect_ledger.core.effect import Effect
from effect_ledger.core.keys import effect_key
from effect_ledger.core.model import (
    Decision,
    DecisionKind,
    Event,
    Executed,
    Intent,
    Outcome,
    Receipt,
    ReceiptSource,
    Resolution,
    State,
    Timeout,
    TimeoutPhase,
    Verdict,
)
from effect_ledger.core.reconcile import Target
from effect_ledger.errors import EffectClosed, EffectUncertain
from effect_ledger.sdk.ledger import Confirmation, Ledger
from tests.incident import EXPECTED, Incident, incident
from tests.ops_expected import CHECKS, checks_of, expected_checks, expected_targets, now_ms, write_ledger

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def incident_ledger(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Incident]:
    """The incident in a ledger file, written once for the module (the tests only read it)."""
    inc = incident(now_ms())
    return write_ledger(tmp_path_factory.mktemp("incident") / "incident.db", inc.events), inc


@pytest.fixture(scope="module")
def clean_ledger(tmp_path_factory: pytest.TempPathFactory, incident_ledger: tuple[Path, Incident]) -> Path:
    """Only the incident's normal effects: intent -> executed -> receipt."""
    inc = incident_ledger[1]
    normal = set(inc.normal)
    return write_ledger(tmp_path_factory.mktemp("clean") / "clean.db", [e for e in inc.events if e.effect_id in normal])


# -- running the command line ------------------------------------------------------------------------


def cli(*args: str | Path) -> Result:
    """In process (fast): for the commands whose JSON/CSV output is checked."""
    return CliRunner().invoke(main, [str(a) for a in args])


def cli_process(*args: str | Path, columns: int = 200) -> subprocess.CompletedProcess[str]:
    """A real child process with stdout and stderr piped, as in a cron job, CI or ``| tee``: what a
    person reads (tables, sized by COLUMNS as rich does for a non-terminal) and the error contract."""
    env = dict(os.environ, COLUMNS=str(columns))
    return subprocess.run(
        [sys.executable, "-m", "effect_ledger", *map(str, args)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def json_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


# -- audit -------------------------------------------------------------------------------------------


def test_audit_json_reports_exactly_the_known_answers(incident_ledger: tuple[Path, Incident]) -> None:
    path, inc = incident_ledger
    r = cli("audit", "--db", path, "--from", "-1h", "--json")
    assert r.exit_code == 1, r.output  # checks failed, and click's runner is no terminal
    report = json.loads(r.stdout)

    assert [c["name"] for c in report["checks"]] == list(CHECKS)
    assert checks_of(report) == expected_checks()
    assert checks_of(report)["sent_unrecorded_window"]["detail"] == "p50 2 ms, p99 2 ms, max 2 ms"
    assert report["passed"] is False

    assert report["duplicate_keys"] == sorted(inc.doubled)
    assert report["stuck_keys"] == sorted(inc.stuck)
    assert report["events"] == len(inc.events)
    assert report["continuing"] == 0 and report["undecodable"] == 0
    assert report["to_ms"] - report["from_ms"] == 3_600_000 and report["as_of_ms"] == report["to_ms"]

    targets = {t.pop("target"): t for t in report["targets"]}
    assert targets == expected_targets(inc)
    assert sum(t["effects"] for t in targets.values()) == EXPECTED.effects


def test_audit_csv_has_the_same_numbers(incident_ledger: tuple[Path, Incident]) -> None:
    path, inc = incident_ledger
    r = cli("audit", "--db", path, "--from", "-1h", "--csv", "--report-only")
    assert r.exit_code == 0, r.output
    rows = list(csv.DictReader(io.StringIO(r.stdout)))
    assert rows and set(rows[0]) == {
        "scope", "check", "numerator", "denominator", "ratio", "criterion", "passed", "detail",
    }  # fmt: skip

    overall = {row["check"]: row for row in rows if row["scope"] == "all"}
    assert list(overall) == list(CHECKS)
    for name, want in expected_checks().items():
        row = overall[name]
        assert (int(row["numerator"]), int(row["denominator"])) == (want["numerator"], want["denominator"]), name
        assert row["criterion"] == want["criterion"], name
        assert row["passed"] == str(want["passed"]), name
        assert row["ratio"] == f"{100 * want['numerator'] / want['denominator']:.2f}%", name
    assert overall["sent_unrecorded_window"]["detail"] == "p50 2 ms, p99 2 ms, max 2 ms"

    # The per-target rows agree with the JSON's breakdown.
    per_target: dict[str, dict[str, tuple[int, int]]] = {}
    for row in rows:
        if row["scope"] != "all":
            per_target.setdefault(row["scope"], {})[row["check"]] = (int(row["numerator"]), int(row["denominator"]))
    for target, t in expected_targets(inc).items():
        assert per_target[target] == {
            "keyed_writes": (t["keyed"], t["attempts"]),
            "uncertain": (t["uncertain"], t["effects"]),
            "resolved_by_reconciliation": (t["resolved"], t["uncertain"]),
            "duplicate_executions": (t["duplicates"], t["effects"]),
            "stuck_over_10m": (t["stuck"], t["effects"]),
        }, target
    assert set(per_target) == set(expected_targets(inc))


def test_audit_table_shows_every_check_with_its_numbers(incident_ledger: tuple[Path, Incident]) -> None:
    path, inc = incident_ledger
    r = cli_process("audit", "--db", path, "--from", "-1h", "--report-only", columns=200)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert f"{len(inc.events):,} events" in out
    rows = {line.split("│")[1].strip(): line for line in out.splitlines() if line.count("│") >= 7}
    for name, want in expected_checks().items():
        assert name in rows, f"{name} missing from\n{out}"
        cells = [c.strip() for c in rows[name].split("│")[1:-1]]
        assert cells[1:3] == [f"{want['numerator']:,}", f"{want['denominator']:,}"], cells
        assert cells[5] == ("pass" if want["passed"] else "FAIL"), cells
    assert "p50 2 ms, p99 2 ms, max 2 ms" in out
    for target in expected_targets(inc):
        assert target in out
    for key in inc.doubled:
        assert key in out  # the duplicate_executions FAIL names them


def test_audit_table_at_the_default_width_shows_every_check_name(incident_ledger: tuple[Path, Incident]) -> None:
    """Piped to a file, a cron mail or CI (no terminal), rich lays the table out for 80 columns. The
    check names are what a reader looks for; they must not be cut to "keyed_wr…"."""
    path, _ = incident_ledger
    r = cli_process("audit", "--db", path, "--from", "-1h", "--report-only", columns=80)
    assert r.returncode == 0, r.stderr
    missing = [name for name in CHECKS if name not in r.stdout]
    assert not missing, f"check names cut off at 80 columns: {missing}\n{r.stdout}"


def test_audit_window_before_everything_is_empty(incident_ledger: tuple[Path, Incident]) -> None:
    path, _ = incident_ledger
    r = cli("audit", "--db", path, "--from", "-5m", "--json")
    assert r.exit_code == 0, r.output
    report = json.loads(r.stdout)
    assert report["events"] == 0 and report["continuing"] == 0 and report["targets"] == []
    assert report["duplicate_keys"] == [] and report["stuck_keys"] == []
    assert all(c["denominator"] == 0 and c["passed"] for c in report["checks"])


def test_audit_does_not_count_a_late_timeout_of_a_settled_attempt_as_uncertain(tmp_path: Path) -> None:
    """A CALL timeout for an attempt whose execution and receipt were already recorded changes
    nothing in the fold (``trace`` never shows the effect UNCERTAIN); the audit must agree. Such a
    timeout is what a processor's deadline timer writes when it fires on a table that has not yet
    consumed the backlog of ``effects.events`` (seen in tests/integration/test_ops_kafka.py)."""
    t = now_ms() - 20 * 60_000
    key = effect_key("payments", "create", "late-timeout", "step-1")
    events: list[Event] = [
        Intent("i1", key, t, 1, "payments", "create", "default", "late-timeout", "step-1", "{}", "d", t + 10_000, "w"),
        Executed("x1", key, t + 42, 1, Outcome.OK, None, t + 1, t + 40, None, "w"),
        Receipt("r1", key, t + 43, 1, "re-1", ReceiptSource.CALL, "{}"),
        Timeout(f"timeout:call:1:{key}", key, t + 15 * 60_000, 1, TimeoutPhase.CALL, t + 10_000),
    ]
    path = write_ledger(tmp_path / "late.db", events)

    tr = cli("trace", key, "--db", path, "--json")
    assert tr.exit_code == 0, tr.output
    assert "UNCERTAIN" not in [e["state_after"] for e in json.loads(tr.stdout)["events"]]

    r = cli("audit", "--db", path, "--from", "-1h", "--json")
    assert r.exit_code == 0, r.output
    checks = {c["name"]: c for c in json.loads(r.stdout)["checks"]}
    assert (checks["uncertain"]["numerator"], checks["uncertain"]["denominator"]) == (0, 1)
    assert checks["resolved_by_reconciliation"]["passed"]


# -- stuck -------------------------------------------------------------------------------------------


def test_stuck_lists_exactly_the_five_and_exits_3(incident_ledger: tuple[Path, Incident]) -> None:
    path, inc = incident_ledger
    r = cli("stuck", "--db", path, "--older-than", "10m", "--json")
    assert r.exit_code == 3, r.output
    rows = json_lines(r.stdout)
    assert sorted(row["effect_id"] for row in rows) == sorted(inc.stuck)
    assert {row["state"] for row in rows} == {State.PENDING.value}
    assert [row["created_ms"] for row in rows] == sorted(row["created_ms"] for row in rows)  # oldest first

    # They began 20 to 30 minutes ago: not stuck for longer than an hour.
    later = cli("stuck", "--db", path, "--older-than", "1h", "--json")
    assert later.exit_code == 0 and later.stdout == ""


def test_stuck_on_a_clean_ledger_exits_0(clean_ledger: Path) -> None:
    r = cli("stuck", "--db", clean_ledger, "--older-than", "10m", "--json")
    assert r.exit_code == 0, r.output
    assert r.stdout == ""
    table = cli("stuck", "--db", clean_ledger, "--older-than", "10m")
    assert table.exit_code == 0 and "no effect stuck for longer than 10m" in table.stdout


# -- trace -------------------------------------------------------------------------------------------


def test_trace_of_a_doubled_effect_shows_both_executions(incident_ledger: tuple[Path, Incident]) -> None:
    path, inc = incident_ledger
    key = inc.doubled[0]
    r = cli("trace", key, "--db", path, "--json")
    assert r.exit_code == 0, r.output
    t = json.loads(r.stdout)
    events = [e["event"] for e in t["events"]]
    assert t["effect_id"] == key and t["state"] == "CONFIRMED" and t["attempt"] == 2
    assert len([e for e in events if e.startswith("intent")]) == 2
    assert all("key NOT sent" in e for e in events if e.startswith("intent"))
    assert len([e for e in events if e.startswith("executed OK")]) == 2
    assert len([e for e in events if e.startswith("receipt")]) == 2
    assert "DUPLICATE_EXECUTION" in t["flags"]
    assert t["sent_unrecorded_ms"] == [EXPECTED.window_ms, EXPECTED.window_ms]
    assert [e["at_ms"] for e in t["events"]] == sorted(e["at_ms"] for e in t["events"])


def test_trace_of_an_uncertain_effect_shows_the_timeout_and_the_reconciler(
    incident_ledger: tuple[Path, Incident],
) -> None:
    path, inc = incident_ledger
    key = inc.uncertain[0]
    found = next(e for e in inc.events if isinstance(e, Resolution) and e.effect_id == key)
    r = cli("trace", key, "--db", path, "--json")
    assert r.exit_code == 0, r.output
    t = json.loads(r.stdout)
    assert t["state"] == "CONFIRMED" and t["receipt_id"] == found.receipt_id
    lines = t["events"]
    assert [ln["state_after"] for ln in lines] == ["PENDING", "UNCERTAIN", "CONFIRMED"]
    assert "deadline passed" in lines[1]["event"]
    assert lines[2]["event"].startswith(f"FOUND {found.receipt_id}")
    assert lines[2]["source"] == found.reconciler == "http:gw"
    assert lines[2]["at_ms"] == found.at_ms
    assert t["sent_unrecorded_ms"] == []  # no execution was ever recorded


# -- escalations and decisions -----------------------------------------------------------------------


def escalated_events(key: str, t: int) -> list[Event]:
    return [
        Intent(uuid.uuid4().hex, key, t, 1, "payments", "refund.create", "default", "run-9", "refund-9",
               '{"amount":4800}', "d" * 64, t + 10_000, "worker-1"),
        Timeout(f"timeout:call:1:{key}", key, t + 11_000, 1, TimeoutPhase.CALL, t + 10_000),
        Resolution(uuid.uuid4().hex, key, t + 12_000, 1, Verdict.UNKNOWN, "http:gw", "gateway answered 503", tries=1),
        Resolution(uuid.uuid4().hex, key, t + 60_000, 1, Verdict.ESCALATE, "http:gw", "no answer after 5 tries",
                   tries=5),
    ]  # fmt: skip


def test_escalations_lists_the_escalated_effect_with_the_reconciler_answers(
    tmp_path: Path, incident_ledger: tuple[Path, Incident]
) -> None:
    key = effect_key("payments", "refund.create", "run-9", "refund-9")
    t = now_ms() - 5 * 60_000
    inc = incident_ledger[1]
    normal = inc.normal[0]
    path = write_ledger(
        tmp_path / "escalated.db", escalated_events(key, t) + [e for e in inc.events if e.effect_id == normal]
    )

    r = cli("escalations", "--db", path, "--json")
    assert r.exit_code == 0, r.output
    [item] = json_lines(r.stdout)
    assert item["effect_id"] == key and item["state"] == "ESCALATED" and item["attempts"] == 1
    assert item["target"] == "payments" and item["operation"] == "refund.create"
    assert item["answers"] == ["http:gw: UNKNOWN (gateway answered 503)", "http:gw: ESCALATE (no answer after 5 tries)"]

    table = cli_process("escalations", "--db", path, columns=250)
    assert table.returncode == 0, table.stderr
    assert key in table.stdout and "ESCALATE (no answer after 5 tries)" in table.stdout

    # A person decides: the queue empties.
    d = cli(
        "resolve", key, "--db", path, "--confirmed", "--receipt", "re_77", "--by", "carol", "--reason", "in the bank"
    )
    assert d.exit_code == 0, d.output
    assert "state CONFIRMED" in d.stdout
    after = cli("escalations", "--db", path)
    assert after.exit_code == 0 and "the escalation queue is empty" in after.stdout


def test_escalations_on_the_incident_is_empty(incident_ledger: tuple[Path, Incident]) -> None:
    r = cli("escalations", "--db", incident_ledger[0])
    assert r.exit_code == 0, r.output
    assert "the escalation queue is empty" in r.stdout


REQUEST = {"order": "123", "amount": 4800, "currency": "CNY"}


async def _execute(path: Path, call: Callable[[str], Any], at_ms: int | None = None) -> Confirmation:
    clock = {} if at_ms is None else {"clock": lambda: at_ms}
    async with await Ledger.open(str(path), targets=[Target("payments")], **clock) as ledger:
        return await ledger.execute(
            target="payments", operation="refund.create", run_id="run-1", step="refund-123",
            request=REQUEST, call=call, timeout=5,
        )  # fmt: skip


def uncertain_refund(path: Path, ago_ms: int = 10 * 60_000) -> str:
    """A refund whose call was cut off (connection reset) ``ago_ms`` ago: UNCERTAIN, nothing can
    tell. By default long enough ago that its deadline has passed, so a person may decide ABSENT."""

    def lost(_key: str) -> Any:
        raise ConnectionResetError("connection reset by peer")

    with pytest.raises(EffectUncertain) as info:
        asyncio.run(_execute(path, lost, at_ms=now_ms() - ago_ms))
    return info.value.effect_id


async def _state_and_events(path: Path, key: str) -> tuple[Effect | None, list[Event]]:
    async with await Ledger.open(str(path), targets=[Target("payments")]) as ledger:
        return await ledger.get(key), [e for _, e, _ in await ledger.store.events(key)]


def test_resolve_absent_lets_the_agent_execute_again(tmp_path: Path) -> None:
    path = tmp_path / "agent.db"
    key = uncertain_refund(path)
    r = cli("resolve", key, "--db", path, "--absent", "--by", "alice", "--reason", "checked by phone")
    assert r.exit_code == 0, r.output
    assert r.stdout.strip() == f"{key}: decision ABSENT recorded by alice; state ABSENT"
    effect, events = asyncio.run(_state_and_events(path, key))
    assert effect is not None and effect.state is State.ABSENT
    [decision] = [e for e in events if isinstance(e, Decision)]
    assert (decision.decision, decision.by, decision.reason, decision.attempt) == (
        DecisionKind.ABSENT, "alice", "checked by phone", 1,
    )  # fmt: skip

    calls: list[str] = []
    c = asyncio.run(_execute(path, lambda k: calls.append(k) or {"id": "re_2"}))
    assert calls == [key]
    assert (c.attempt, c.called, c.receipt_id) == (2, True, "re_2")


def test_resolve_abandon_makes_the_agent_refuse(tmp_path: Path) -> None:
    path = tmp_path / "agent.db"
    key = uncertain_refund(path)
    r = cli("resolve", key, "--db", path, "--abandon", "--by", "alice", "--reason", "customer cancelled")
    assert r.exit_code == 0, r.output
    assert "state ABANDONED" in r.stdout
    calls: list[str] = []
    with pytest.raises(EffectClosed):
        asyncio.run(_execute(path, lambda k: calls.append(k) or {"id": "re_2"}))
    assert calls == []


def test_resolve_confirmed_returns_the_receipt_without_calling(tmp_path: Path) -> None:
    path = tmp_path / "agent.db"
    key = uncertain_refund(path)
    r = cli(
        "resolve", key, "--db", path, "--confirmed", "--receipt", "re_9", "--by", "alice", "--reason", "in the bank"
    )
    assert r.exit_code == 0, r.output
    assert "state CONFIRMED" in r.stdout
    calls: list[str] = []
    c = asyncio.run(_execute(path, lambda k: calls.append(k) or {"id": "re_2"}))
    assert calls == []
    assert (c.receipt_id, c.called, c.source) == ("re_9", False, ReceiptSource.PERSON)


# -- the error contract: one line on stderr, non-zero, no traceback ----------------------------------


# ``{ledger}``: the incident's file; ``{missing}``: no such file; ``{garbage}``: a text file;
# ``{key}``: a well-formed key the incident does not hold.
WHO = ["--by", "a", "--reason", "r"]
BAD: dict[str, list[str]] = {
    "inverted window": ["audit", "--db", "{ledger}", "--from", "now", "--to", "-1h"],
    "unparsable time": ["audit", "--db", "{ledger}", "--from", "yesterday-ish"],
    "unparsable relative time": ["audit", "--db", "{ledger}", "--from", "-1 fortnight"],
    "bad duration (stuck)": ["stuck", "--db", "{ledger}", "--older-than", "10 minutes"],
    "bad duration (audit)": ["audit", "--db", "{ledger}", "--from", "-1h", "--stuck-after", "ten"],
    "missing ledger (audit)": ["audit", "--db", "{missing}", "--from", "-1h"],
    "missing ledger (stuck)": ["stuck", "--db", "{missing}"],
    "missing ledger (trace)": ["trace", "{key}", "--db", "{missing}"],
    "missing ledger (escalations)": ["escalations", "--db", "{missing}"],
    "missing ledger (resolve)": ["resolve", "{key}", "--db", "{missing}", "--absent", *WHO],
    "not a ledger (audit)": ["audit", "--db", "{garbage}", "--from", "-1h"],
    "not a ledger (trace)": ["trace", "{key}", "--db", "{garbage}"],
    "not a ledger (stuck)": ["stuck", "--db", "{garbage}"],
    "not a ledger (escalations)": ["escalations", "--db", "{garbage}"],
    "not a ledger (resolve)": ["resolve", "{key}", "--db", "{garbage}", "--absent", *WHO],
    "unknown key (trace)": ["trace", "{key}", "--db", "{ledger}"],
    "unknown key (resolve)": ["resolve", "{key}", "--db", "{ledger}", "--absent", *WHO],
    "resolve without a verdict": ["resolve", "{key}", "--db", "{ledger}", *WHO],
    "--confirmed without --receipt": ["resolve", "{key}", "--db", "{ledger}", "--confirmed", *WHO],
}


@pytest.mark.parametrize("case", BAD)
def test_bad_arguments_are_one_line_on_stderr(
    case: str, incident_ledger: tuple[Path, Incident], tmp_path: Path
) -> None:
    garbage = tmp_path / "not-a-ledger.db"
    garbage.write_text("these are my notes, not a ledger\n")
    names = {
        "ledger": str(incident_ledger[0]),
        "missing": str(tmp_path / "no-such-ledger.db"),
        "garbage": str(garbage),
        "key": effect_key("payments", "create", "incident-run", "no-such-step"),
    }
    r = cli_process(*(a.format(**names) for a in BAD[case]))
    assert r.returncode != 0, f"{case}: exit 0\n{r.stdout}"
    assert "Traceback" not in r.stderr + r.stdout, f"{case}:\n{r.stderr}"
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("effects: "), f"{case}: stderr was\n{r.stderr}"


def _tables(p: Path) -> list[str]:
    with sqlite3.connect(p) as conn:
        return [name for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]


def test_a_refused_resolve_leaves_the_ledger_as_it_was(incident_ledger: tuple[Path, Incident]) -> None:
    path, inc = incident_ledger

    def events() -> tuple[int, int]:
        with sqlite3.connect(path) as conn:
            return conn.execute("SELECT count(*), max(seq) FROM events").fetchone()  # type: ignore[no-any-return]

    before = events()
    for verdict in ([], ["--confirmed"]):
        r = cli("resolve", inc.stuck[0], "--db", path, *verdict, "--by", "a", "--reason", "r")
        assert r.exit_code == 1, r.output
    assert events() == before


def test_resolve_does_not_turn_another_sqlite_file_into_a_ledger(tmp_path: Path) -> None:
    """``--db`` naming some other application's SQLite file (a typo, the wrong path) is refused
    without writing the ledger's tables into it."""
    other = tmp_path / "someone-elses.db"
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE notes (body TEXT)")
    key = effect_key("payments", "create", "incident-run", "step-500")
    r = cli_process("resolve", key, "--db", other, "--absent", "--by", "a", "--reason", "r")
    assert r.returncode == 1 and r.stderr.startswith("effects: "), r.stderr
    assert _tables(other) == ["notes"], "resolve wrote the ledger schema into a file that is not a ledger"


def test_trace_keeps_the_recorded_order_of_events_in_the_same_millisecond(tmp_path: Path) -> None:
    """Event ids are random past their millisecond prefix: two events of one millisecond must keep
    the order the ledger recorded them in (intent before its outcome), not the order of their ids."""
    from effect_ledger.core.keys import canonical_json, digest
    from effect_ledger.core.model import Executed, Intent, Outcome
    from effect_ledger.ops import views
    from effect_ledger.sdk.store.sqlite import Durability, Store

    path = tmp_path / "effects.db"
    key = effect_key("payments", "refund.create", "run-1", "same-ms")
    t = 1_800_000_000_000
    body = canonical_json({"order": "1"})
    intent = Intent("f" * 32, key, t, 1, "payments", "refund.create", "default", "run-1", "same-ms", body,
                    digest(body), t + 10_000, "w")  # fmt: skip
    outcome = Executed("0" * 32, key, t, 1, Outcome.UNKNOWN, "timed out", t, t, None, "w")

    async def write() -> None:
        store = await Store.open(str(path), Durability.NORMAL)
        try:
            effect = (await store.append(None, [intent], now_ms=t)).effect
            await store.append(effect, [outcome], now_ms=t)
        finally:
            await store.close()

    asyncio.run(write())
    lines = views.trace(key, db=str(path)).lines
    assert [ln.state_after for ln in lines] == ["PENDING", "UNCERTAIN"]

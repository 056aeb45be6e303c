"""The console's search, each effect's page and the decision's confirmation step, over a real
ledger file with known contents (``tests/console_ledger.py``) through real HTTP on loopback; the
search's parser and the targets file's ``searchable`` setting on their own.

Hostile searches (too long, too many terms, control characters, unbalanced quotes, SQL) are a
message or an empty result, and never change the file."""

from __future__ import annotations

import json
import re
import sqlite3
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pytest

from effect_ledger import Target
from effect_ledger.console.auth import Credentials
from effect_ledger.console.pages import DECISION_EFFECTS, short
from effect_ledger.console.query import MAX_SEARCH_CHARS, MAX_TERMS, BadInput, Searchable, Term, parse_search
from effect_ledger.console.source import Source
from effect_ledger.core.bodies import BodyMode, BodyPolicy
from effect_ledger.errors import TargetsError
from effect_ledger.targets.load import parse_targets
from tests.console_ledger import TARGETS, ConsoleLedger, console_ledger
from tests.console_server import serve
from tests.ops_expected import now_ms
from tests.unit.console.test_console_api import call, get_json, q

TOKEN = "search-test-token"
CREDS = Credentials(TOKEN, {"alice": "wonderland"})
SEARCHABLE = Searchable({"payments": ("order_id",)})


def source(path: Path) -> Source:
    return Source(db=str(path), targets=parse_targets(TARGETS))


@pytest.fixture(scope="module")
def ledger(tmp_path_factory: pytest.TempPathFactory) -> ConsoleLedger:
    return console_ledger(tmp_path_factory.mktemp("search") / "console.db", now_ms())


@pytest.fixture(scope="module")
def url(ledger: ConsoleLedger) -> Iterator[str]:
    with serve(source(ledger.path), CREDS) as base:
        yield base


def written(path: Path) -> tuple[int, list[tuple[str, str]], list[str]]:
    """What the file holds: its events, every effect's state, its tables."""
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as conn:
        events = conn.execute("SELECT count(*) FROM events").fetchone()[0]
        states = conn.execute("SELECT effect_id, state FROM effects ORDER BY effect_id").fetchall()
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master ORDER BY name")]
    return events, states, tables


def found(url: str, search: str, window: str = "-1h") -> list[str]:
    d = get_json(url, "/api/effects?" + q(**{"from": window, "q": search}))
    keys = [e["effect_id"] for e in d["effects"]]
    assert d["matched"] == len(keys)
    return sorted(keys)


# -- the parser -------------------------------------------------------------------------------------


def test_terms_by_name_and_bare_values() -> None:
    terms = parse_search('order_id:1001 run:run-9 step:"refund escalated" op:refund.create payments:3fa2', SEARCHABLE)
    assert terms == (
        Term("field", "1001", "order_id"),
        Term("run", "run-9"),
        Term("step", "refund escalated"),
        Term("operation", "refund.create"),
        Term("any", "payments:3fa2"),  # an effect id holds a colon: a prefix, not a name
    )
    # A field no target declares searchable is no name: the whole word is a value.
    assert parse_search("email:bob@example.com", SEARCHABLE) == (Term("any", "email:bob@example.com"),)
    assert parse_search("", SEARCHABLE) == ()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("x" * (MAX_SEARCH_CHARS + 1), f"at most {MAX_SEARCH_CHARS} characters"),
        (" ".join(["a"] * (MAX_TERMS + 1)), f"at most {MAX_TERMS} terms"),
        ("order\x00id:1", "no control characters"),
        ("run:a\nb", "no control characters"),
        ("\ud800", "no control characters"),
        ('step:"unbalanced', "could not be read"),
        ("run:", "nothing to search for after run:"),
        ("order_id:", "nothing to search for after order_id:"),
    ],
)
def test_a_search_outside_the_bounds_is_bad_input(text: str, message: str) -> None:
    with pytest.raises(BadInput, match=re.escape(message)):
        parse_search(text, SEARCHABLE)


# -- the targets file's searchable fields ---------------------------------------------------------------


def test_searchable_fields_are_declared_on_a_target() -> None:
    (t,) = parse_targets(TARGETS)
    assert t.searchable == ("order_id",) and t.body.redact == ("email",)


@pytest.mark.parametrize(
    ("settings", "line", "message"),
    [
        ('searchable = ["email"]', 5, "'email' cannot be searchable: its value is redacted ('email')"),
        ('searchable = ["customer"]', 5, "'customer' cannot be searchable: its value is redacted ('customer.email')"),
        ('searchable = "order_id"', 5, "searchable must be a list of strings"),
        ('searchable = ["order..id"]', 5, "'order..id' is not a field path (names joined by dots: customer.email)"),
        ('searchable = [""]', 5, "searchable must be a list of strings"),
    ],
)
def test_a_field_that_is_not_recorded_cannot_be_searchable(settings: str, line: int, message: str) -> None:
    text = f'[targets.payments]\nlookup = "none"\nbody = "redact"\nredact = ["email", "customer.email"]\n{settings}\n'
    with pytest.raises(TargetsError) as e:
        parse_targets(text, "t.toml")
    assert str(e.value) == f"t.toml:{line}: target 'payments': {message}"


@pytest.mark.parametrize("mode", ["digest", "encrypt"])
def test_a_body_kept_out_of_the_ledger_has_no_searchable_field(mode: str) -> None:
    text = f'[targets.payments]\nlookup = "none"\nbody = "{mode}"\nsearchable = ["order_id"]\n'
    with pytest.raises(TargetsError, match=f'body = "{mode}" keeps none of it'):
        parse_targets(text, "t.toml")
    with pytest.raises(TargetsError, match="keeps none of it"):
        Target("payments", body=BodyPolicy(BodyMode(mode)), searchable=("order_id",))
    with pytest.raises(TargetsError, match="at most 16 searchable fields"):
        Target("payments", searchable=tuple(f"f{i}" for i in range(17)))


# -- searching ------------------------------------------------------------------------------------------


def test_the_refund_of_an_order_is_found_in_one_search(url: str, ledger: ConsoleLedger) -> None:
    assert found(url, "order_id:1001") == [ledger.escalated]
    assert found(url, "1001") == [ledger.escalated]  # a bare value: the declared fields too
    assert found(url, "order_id:1002") == [ledger.in_flight]
    assert found(url, "order_id:1001", window="-10m") == []  # the window still applies


def test_search_by_run_step_target_operation_and_id_prefix(url: str, ledger: ConsoleLedger) -> None:
    assert found(url, "run:run-9") == sorted([ledger.escalated, ledger.in_flight])
    assert found(url, "run-9") == sorted([ledger.escalated, ledger.in_flight])
    assert found(url, "step:refund-in-flight") == [ledger.in_flight]
    assert found(url, "op:refund.create run:run-9 order_id:1002") == [ledger.in_flight]  # every term must match
    assert len(found(url, "target:tickets")) == 100
    doubled = ledger.incident.doubled[0]
    prefix = short(doubled).rstrip("…")  # what a table shows is a prefix of the id
    assert found(url, prefix) == [doubled] and found(url, f"key:{prefix}") == [doubled]
    assert found(url, "step:step-3") == [ledger.incident.stuck[0]]


@pytest.mark.parametrize(
    "search",
    [
        "' OR 1=1 --",
        "order_id:1001' OR '1'='1",
        '"; DROP TABLE effects; --"',
        "run:x'); DELETE FROM events; --",
        "%",
        "_",
        "payments:%",
        "effect_ledger.redacted",  # the marker of a redacted value is no value
        "注文 １００１",
        "𝓇𝓊𝓃",
        "../../etc/passwd",
        "<script>alert(1)</script>",
    ],
)
def test_a_hostile_search_finds_nothing_and_changes_nothing(url: str, ledger: ConsoleLedger, search: str) -> None:
    before = written(ledger.path)
    assert found(url, search) == []
    status, page = call(url, "/?" + q(**{"from": "-1h", "q": search}))
    assert status == 200 and "<script>alert" not in page
    assert written(ledger.path) == before
    assert found(url, "order_id:1001") == [ledger.escalated]  # and the tables are all still there


def test_a_search_outside_the_bounds_is_a_400_and_a_message(url: str) -> None:
    status, text = call(url, "/api/effects?" + q(q="x" * 1_000))
    assert status == 400 and json.loads(text) == {"error": f"a search is at most {MAX_SEARCH_CHARS} characters"}
    status, page = call(url, "/?" + q(q='step:"open'))
    assert status == 400 and "the search could not be read" in page and 'value="step:&quot;open"' in page


def test_no_match_names_the_searchable_fields(url: str) -> None:
    status, page = call(url, "/?" + q(**{"from": "-1h", "q": "order_id:9999"}))
    assert status == 200 and "nothing matches in this window" in page and "order_id (payments)" in page


# -- an effect's page -----------------------------------------------------------------------------------


def test_the_effect_page_shows_what_the_effect_was(url: str, ledger: ConsoleLedger) -> None:
    key = ledger.escalated
    status, page = call(url, "/effect/" + urllib.parse.quote(key, safe=""))
    assert status == 200
    assert f'data-copy="{key}"' in page and "run-9" in page and "refund-escalated" in page
    request = page[page.index('<table id="request">') : page.index("</table>", page.index('<table id="request">'))]
    assert "order_id" in request and "&quot;1001&quot;" in request and "searchable" in request
    assert 'class="redacted-row"><td>email</td>' in request  # marked, and its value is not there
    assert "no receipt recorded" in page
    answers = page[page.index('<table id="answers">') :]
    assert "gateway answered 503" in answers and "no answer after 5 tries" in answers
    assert f'href="/effect/{urllib.parse.quote(ledger.in_flight, safe="")}"' in page  # the same run
    # The decision: every choice with what it causes, none chosen in advance, posted to /confirm.
    assert 'action="/confirm"' in page and " checked" not in page.split('id="decide"')[1]
    for text in DECISION_EFFECTS.values():
        assert text.replace("'", "&#x27;") in page


def test_a_confirmed_effect_shows_its_receipt_and_attempts(url: str, ledger: ConsoleLedger) -> None:
    key = ledger.incident.doubled[0]
    status, page = call(url, "/effect/" + urllib.parse.quote(key, safe=""))
    assert status == 200
    receipts = page[page.index('<table id="receipts">') : page.index('<table id="attempts">')]
    assert receipts.count("<tr><td>re-") == 2  # two receipt ids: the double execution
    attempts = page[page.index('<table id="attempts">') : page.index("reconciler answers")]
    assert attempts.count("<tr><td>") == 2 and "OK" in attempts


def test_the_old_trace_address_leads_to_the_effect_page(url: str, ledger: ConsoleLedger) -> None:
    status, page = call(url, "/trace/" + urllib.parse.quote(ledger.escalated, safe=""))
    assert status == 200 and 'id="summary"' in page  # urllib followed the redirect
    status, page = call(url, "/effect/nobody")
    assert status == 404 and "no effect with key &#x27;nobody&#x27;" in page


def test_ids_are_short_in_tables_with_the_full_id_in_the_title(url: str, ledger: ConsoleLedger) -> None:
    key = ledger.escalated
    status, page = call(url, "/?" + q(**{"from": "-1h", "q": "run:run-9"}))
    assert status == 200
    assert f'title="{key}" data-copy="{key}">{short(key)}</a>' in page
    assert len(short(key)) < 30 < len(key)
    assert 'id="header-search"' in page and 'name="q"' in page


# -- the decision's confirmation ------------------------------------------------------------------------


@pytest.fixture
def fresh(tmp_path: Path) -> Iterator[tuple[str, ConsoleLedger]]:
    ledger = console_ledger(tmp_path / "console.db", now_ms())
    with serve(source(ledger.path), CREDS) as base:
        yield base, ledger


@pytest.mark.parametrize(
    ("form", "message"),
    [
        ({"reason": "checked with the gateway"}, "decision: one of"),
        ({"decision": "ABANDONED"}, "say why: a reason is required"),
        ({"decision": "CONFIRMED", "reason": "r"}, "CONFIRMED needs the destination's receipt id"),
    ],
)
def test_an_incomplete_choice_comes_back_to_the_effect_page(
    fresh: tuple[str, ConsoleLedger], form: dict[str, str], message: str
) -> None:
    url, ledger = fresh
    before = written(ledger.path)
    status, page = call(url, "/confirm", {"key": ledger.escalated, **form}, form=True)
    assert status == 400 and message.replace("'", "&#x27;") in page and 'action="/confirm"' in page
    assert written(ledger.path) == before


def test_a_decision_is_recorded_only_after_its_confirmation(fresh: tuple[str, ConsoleLedger]) -> None:
    url, ledger = fresh
    key = ledger.escalated
    before = written(ledger.path)
    choice = {"key": key, "decision": "ABSENT", "reason": "the gateway has no such refund"}
    status, page = call(url, "/confirm", choice, form=True)
    assert status == 200 and "Allows a new call with the same key" in page
    assert 'action="/resolve"' in page and 'id="confirm"' in page
    assert written(ledger.path) == before  # the first step writes nothing
    form = page[page.index('action="/resolve"') :]
    hidden = dict(re.findall(r'<input type="hidden" name="(\w+)" value="([^"]*)">', form))
    assert hidden == {**choice, "receipt_id": ""}
    status, page = call(url, "/resolve", {**hidden, "user": "alice", "secret": "wonderland"}, form=True)
    assert status == 200 and "decision ABSENT recorded by alice; state ABSENT" in page
    assert 'href="/stuck#queue"' in page
    events, states, _ = written(ledger.path)
    assert events == before[0] + 1 and dict(states)[key] == "ABSENT"


def test_a_confirmation_for_an_unknown_effect_is_a_404(fresh: tuple[str, ConsoleLedger]) -> None:
    url, ledger = fresh
    status, _page = call(url, "/confirm", {"key": "nobody", "decision": "ABANDONED", "reason": "r"}, form=True)
    assert status == 404


def test_field_values_reads_what_is_recorded_only() -> None:
    from effect_ledger.core.bodies import REDACTED, field_values

    request = {
        "order_id": 1001,
        "paid": True,
        "customer": {"id": "c-7", "email": REDACTED},
        "lines": [{"sku": "a-1"}, {"sku": 2}, {"sku": None}, {"other": 1}],
        "tags": ["x", "y"],
    }
    assert field_values(request, "order_id") == ["1001"]
    assert field_values(request, "paid") == []  # a boolean is no id
    assert field_values(request, "customer.id") == ["c-7"]
    assert field_values(request, "customer.email") == []  # the redaction mark is no value
    assert field_values(request, "lines.sku") == ["a-1", "2"]
    assert field_values(request, "tags") == ["x", "y"]
    assert field_values(request, "customer") == [] and field_values(request, "missing.path") == []
    assert field_values("not an object", "order_id") == []


def test_an_effect_page_as_json(url: str, ledger: ConsoleLedger) -> None:
    d = get_json(url, "/api/effect/" + urllib.parse.quote(ledger.escalated, safe=""))
    assert d["state"] == "ESCALATED" and d["run_id"] == "run-9" and d["step"] == "refund-escalated"
    assert d["request"] == {"amount": 4800, "currency": "EUR", "email": "effect_ledger.redacted", "order_id": "1001"}
    assert [f["kind"] for f in d["facts"]] == ["Intent", "Timeout", "Resolution", "Resolution"]
    assert [f["verdict"] for f in d["facts"] if f["kind"] == "Resolution"] == ["UNKNOWN", "ESCALATE"]
    assert [r["effect_id"] for r in d["same_run"]] == [ledger.in_flight]
    status, text = call(url, "/api/effect/nobody")
    assert status == 404 and json.loads(text) == {"error": "no effect with key 'nobody'"}


def test_a_console_with_a_redacted_field_declared_searchable_does_not_start(
    ledger: ConsoleLedger, tmp_path: Path
) -> None:
    from click.testing import CliRunner

    from effect_ledger.cli.main import main

    bad = tmp_path / "targets.toml"
    bad.write_text(TARGETS.replace('searchable = ["order_id"]', 'searchable = ["email"]'))
    r = CliRunner().invoke(
        main, ["console", "--db", str(ledger.path), "--targets", str(bad)], env={"EFFECTS_TARGETS": ""}
    )
    assert r.exit_code == 1
    assert r.output.strip().splitlines() == [
        f"effects: {bad}:6: target 'payments': 'email' cannot be searchable: its value is redacted ('email')"
    ]


def test_an_effect_whose_receipt_came_before_its_intent_has_a_page(tmp_path: Path) -> None:
    from effect_ledger.core.model import Receipt, ReceiptSource
    from tests.ops_expected import write_ledger

    key = "payments:" + "e" * 64
    path = write_ledger(
        tmp_path / "early.db", [Receipt("r1", key, now_ms(), 0, "re-early", ReceiptSource.WEBHOOK, "{}")]
    )
    with serve(source(path), CREDS) as base:
        status, page = call(base, "/effect/" + urllib.parse.quote(key, safe=""))
        assert status == 200 and "no intent recorded: the request is unknown" in page and "re-early" in page
        assert '<p id="same-run">no other effect</p>' in page

"""The targets declaration (``effect_ledger.targets.load``): a valid file gives the expected
``Target`` objects; every mistake is a ``TargetsError`` whose message starts with ``FILE:LINE:`` and
names the problem; the ledger refuses undeclared targets and never creates its file on a bad
declaration."""

from __future__ import annotations

import json
import os
import sqlite3
import textwrap
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from effect_ledger import SyncLedger
from effect_ledger.core.model import Executed, Outcome, State
from effect_ledger.core.reconcile import Absent, Backoff, EffectView, Found, Target, Unknown
from effect_ledger.errors import EffectUncertain, TargetsError, UnknownTarget
from effect_ledger.sdk.ledger import Ledger
from effect_ledger.targets.ask import CallableReconciler
from effect_ledger.targets.http import HttpReconciler
from effect_ledger.targets.load import ENV_VAR, MAX_FILE_BYTES, load_targets, parse_targets, resolve
from tests.sdk_contract import KEY, OPERATION, REQUEST, RUN_ID, STEP, db_counts, run

FIXTURE_MODULE = "h2targets_fixture"
FIXTURE = textwrap.dedent(
    """
    from effect_ledger import Absent, Found, Target


    class RefundRejected(Exception):
        pass


    class NotAnError:
        pass


    NOT_A_CLASS = 42


    def find_ticket(effect):
        return Found("t-1", {"ticket": effect.effect_id})


    class TicketLookup:
        name = "ticket-lookup"

        async def check(self, effect):
            return Absent("no ticket")


    TICKETS = TicketLookup()


    def receipt_of(value):
        return value["ref"]


    TARGETS = [Target("payments"), Target("mail")]

    DUPLICATES = [Target("payments"), Target("mail"), Target("payments")]
    """
)


@pytest.fixture(autouse=True)
def fixture_module(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Importable modules the declarations name: the fixture above and one that fails to import."""
    folder = tmp_path_factory.getbasetemp() / "targets-modules"
    if not folder.exists():
        folder.mkdir()
        (folder / f"{FIXTURE_MODULE}.py").write_text(FIXTURE)
        (folder / "h2targets_broken.py").write_text("raise RuntimeError('boom at import')\n")
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.delenv(ENV_VAR, raising=False)
    return folder / f"{FIXTURE_MODULE}.py"


def write(tmp_path: Path, text: str | bytes, name: str = "targets.toml") -> Path:
    path = tmp_path / name
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    return path


def error_of(path: Path | str) -> str:
    with pytest.raises(TargetsError) as ei:
        load_targets(path)
    message = str(ei.value)
    assert "\n" not in message, message
    return message


# --- a loopback HTTP server that answers lookups and records the headers it got ------------------------


class _Lookups(ThreadingHTTPServer):
    daemon_threads = True
    replies: dict[str, tuple[int, Any]]
    seen: list[tuple[str, dict[str, str]]]


class _Handler(BaseHTTPRequestHandler):
    server: _Lookups

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        self.server.seen.append((self.path, dict(self.headers)))
        status, body = self.server.replies.get(self.path.rsplit("/", 1)[-1], (404, {"error": "no such key"}))
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture
def lookups() -> Iterator[_Lookups]:
    server = _Lookups(("127.0.0.1", 0), _Handler)
    server.replies, server.seen = {}, []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def view(key: str, target: str = "payments") -> EffectView:
    return EffectView(key, target, "refund.create", {"order": "1"}, 1, 0, 10_000)


# --- a valid declaration ---------------------------------------------------------------------------------


def test_a_full_valid_file_gives_the_declared_targets(
    tmp_path: Path, lookups: _Lookups, monkeypatch: pytest.MonkeyPatch
) -> None:
    from h2targets_fixture import TICKETS, RefundRejected  # type: ignore[import-not-found]

    monkeypatch.setenv("H2_GATEWAY_TOKEN", "s3cret")
    port = lookups.server_address[1]
    text = textwrap.dedent(
        f"""
        # Every destination the agents may call, and how to ask it.
        [targets.payments]
        lookup = "http://127.0.0.1:{port}/refunds/{{target}}/by-key/{{key}}"
        honours_keys = true
        key_retention = "48h"
        lands_within = "45s"
        definite_errors = ["{FIXTURE_MODULE}:RefundRejected", "builtins:ValueError"]
        headers = {{ Authorization = "Bearer ${{H2_GATEWAY_TOKEN}}", X-Static = "$plain ${{not closed" }}
        timeout = "5s"
        found_status = [200, 201]
        absent_status = [404]
        receipt_field = "refund.id"
        state_field = "status"
        absent_values = ["failed"]
        pending_values = ["pending"]
        backoff = {{ first = "2s", factor = 3, max = "10m", tries = 7 }}
        receipt_id = "{FIXTURE_MODULE}:receipt_of"

        [targets.tickets]
        reconciler = "{FIXTURE_MODULE}:find_ticket"

        [targets.crm]
        reconciler = "{FIXTURE_MODULE}:TICKETS"
        key_retention = "forever"

        [targets.sms]
        lookup = "none"   # nothing can ask it: an uncertain effect goes to a person
        """
    )
    path = write(tmp_path, text)
    targets = {t.name: t for t in load_targets(path)}
    assert list(targets) == ["payments", "tickets", "crm", "sms"]

    pay = targets["payments"]
    assert pay.honours_keys is True and pay.retention_s == 48 * 3600 and pay.lands_within_s == 45.0
    assert pay.definite_errors == (RefundRejected, ValueError)
    assert pay.backoff == Backoff(first_s=2.0, factor=3.0, max_s=600.0, max_tries=7)
    assert pay.receipt_id is not None and pay.receipt_id({"ref": "R-9"}) == "R-9"
    rec = pay.reconciler
    assert isinstance(rec, HttpReconciler) and rec.name == "http:payments"
    # Asked over HTTP: the URL template, the headers (with the variable expanded) and the mappings.
    lookups.replies.update({
        "k-found": (201, {"refund": {"id": "re_9"}, "status": "succeeded"}),
        "k-pending": (200, {"refund": {"id": "re_8"}, "status": "pending"}),
        "k-failed": (200, {"refund": {"id": "re_7"}, "status": "failed"}),
        "k-410": (410, {}),
    })  # fmt: skip
    assert run(rec.check(view("k-found"))) == Found("re_9", {"refund": {"id": "re_9"}, "status": "succeeded"})
    assert isinstance(run(rec.check(view("k-pending"))), Unknown)
    assert isinstance(run(rec.check(view("k-failed"))), Absent)
    assert isinstance(run(rec.check(view("k-missing"))), Absent)  # 404
    assert isinstance(run(rec.check(view("k-410"))), Unknown)  # 410 is not in absent_status here
    path_seen, headers = lookups.seen[0]
    assert path_seen == "/refunds/payments/by-key/k-found"
    assert headers["Authorization"] == "Bearer s3cret" and headers["X-Static"] == "$plain ${not closed"

    tickets = targets["tickets"]
    assert isinstance(tickets.reconciler, CallableReconciler)
    assert tickets.reconciler.name == f"{FIXTURE_MODULE}:find_ticket"
    assert run(tickets.reconciler.check(view("k-1", "tickets"))) == Found("t-1", {"ticket": "k-1"})
    assert tickets.honours_keys is False and tickets.retention_s == 24 * 3600 and tickets.backoff == Backoff()
    assert tickets.lands_within_s == 2.0  # the default

    crm = targets["crm"]
    assert crm.reconciler is TICKETS and crm.retention_s is None

    sms = targets["sms"]
    assert sms == Target("sms")  # "nobody can ask", said explicitly


def test_lookup_defaults(tmp_path: Path) -> None:
    (t,) = load_targets(write(tmp_path, '[targets.payments]\nlookup = "https://gw.example/by-key/{key}"\n'))
    rec = t.reconciler
    assert isinstance(rec, HttpReconciler)
    assert rec.url_for(view("a/b c")) == "https://gw.example/by-key/a%2Fb%20c"
    assert isinstance(rec.interpret(200, '{"id": "re_1"}'), Found)
    assert isinstance(rec.interpret(404, ""), Absent) and isinstance(rec.interpret(410, ""), Absent)
    assert isinstance(rec.interpret(501, ""), Unknown)
    assert (t.honours_keys, t.retention_s, t.definite_errors, t.backoff) == (False, 86_400.0, (), Backoff())


@pytest.mark.parametrize(
    "text",
    [
        '[targets]\npayments = { lookup = "none" }\nmail = { reconciler = "h2targets_fixture:find_ticket" }\n',
        '[targets]\npayments.lookup = "none"\nmail.reconciler = "h2targets_fixture:find_ticket"\n',
        'targets.payments.lookup = "none"\ntargets.mail.reconciler = "h2targets_fixture:find_ticket"\n',
    ],
    ids=["inline-tables", "dotted-keys", "top-level-dotted-keys"],
)
def test_other_toml_spellings_of_the_same_declaration(tmp_path: Path, text: str) -> None:
    targets = load_targets(write(tmp_path, text))
    assert [t.name for t in targets] == ["payments", "mail"]
    assert targets[0].reconciler is None and isinstance(targets[1].reconciler, CallableReconciler)


def test_parse_targets_names_its_origin(tmp_path: Path) -> None:
    assert parse_targets('[targets.sms]\nlookup = "none"\n') == (Target("sms"),)
    with pytest.raises(TargetsError, match=r"^inline:2: target 'sms': unknown setting 'lokup'"):
        parse_targets('[targets.sms]\nlokup = "none"\n', "inline")


# --- every mistake: FILE:LINE: what is wrong -------------------------------------------------------------

BAD = [
    # (id, the file, the line reported, what the message says)
    ("invalid-toml", '[targets.payments]\nlookup = "none"\nhonours_keys =\n', 3, "not valid TOML"),
    ("unclosed-table", '[targets.payments\nlookup = "none"\n', 1, "not valid TOML"),
    ("duplicate-table", '[targets.sms]\nlookup = "none"\n\n[targets.sms]\nlookup = "none"\n', 4, "not valid TOML"),
    ("empty-file", "# nothing yet\n", 1, "no targets declared"),
    ("empty-targets-table", "# the destinations\n\n[targets]\n", 3, "no targets declared"),
    ("targets-not-a-table", 'targets = "payments"\n', 1, "no targets declared"),
    (
        "unknown-section",
        '[targets.sms]\nlookup = "none"\n\n[target.mail]\nlookup = "none"\n',
        4,
        "unknown section 'target'",
    ),
    ("unknown-top-level-key", 'version = 2\n[targets.sms]\nlookup = "none"\n', 1, "unknown section 'version'"),
    ("unknown-setting", '[targets.sms]\nlookup = "none"\nhonors_keys = true\n', 3, "unknown setting 'honors_keys'"),
    (
        "unknown-setting-inline",
        '[targets]\nsms = { lookup = "none" }\nmail = { lookup = "none", tries = 3 }\n',
        3,
        "unknown setting 'tries'",
    ),
    ("unknown-setting-dotted", '[targets]\nsms.lookup = "none"\nsms.retries = 3\n', 3, "unknown setting 'retries'"),
    ("not-a-table", '[targets]\nsms = "none"\n', 2, "expected a table"),
    ("neither-lookup-nor-reconciler", "\n[targets.sms]\nhonours_keys = true\n", 2, "exactly one of"),
    ("both", '[targets.sms]\nreconciler = "h2targets_fixture:find_ticket"\nlookup = "none"\n', 3, "exactly one of"),
    ("url-without-key", '[targets.p]\nlookup = "http://gw/refunds"\n', 2, "with {key}"),
    ("url-not-http", '[targets.p]\nlookup = "ftp://gw/refunds/{key}"\n', 2, "http(s) URL"),
    ("url-unknown-placeholder", '[targets.p]\nlookup = "http://gw/{key}?tenant={tenant}"\n', 2, "{key}"),
    ("url-broken-brace", '[targets.p]\nlookup = "http://gw/{key}/{"\n', 2, "Single '{'"),
    ("lookup-empty", '[targets.p]\nlookup = ""\n', 2, "non-empty string"),
    ("lookup-not-a-string", "[targets.p]\nlookup = 8080\n", 2, "non-empty string"),
    (
        "http-setting-with-reconciler",
        '[targets.t]\nreconciler = "h2targets_fixture:find_ticket"\ntimeout = "5s"\n',
        3,
        "'timeout' applies to an HTTP lookup, not to a reconciler",
    ),
    (
        "http-setting-with-none",
        '[targets.sms]\nlookup = "none"\n\nheaders = { A = "b" }\n',
        4,
        "'headers' applies to an HTTP lookup",
    ),
    ("bad-duration", '[targets.sms]\nlookup = "none"\nkey_retention = "24 hours"\n', 3, "not a duration"),
    ("duration-not-a-string", '[targets.sms]\nlookup = "none"\nkey_retention = 86400\n', 3, "must be a duration"),
    ("lands-within-not-a-duration", '[targets.sms]\nlookup = "none"\nlands_within = 30\n', 3, "must be a duration"),
    ("lands-within-too-long", '[targets.sms]\nlookup = "none"\nlands_within = "30d"\n', 3, "at most 7 days"),
    ("duration-zero", '[targets.p]\nlookup = "http://gw/{key}"\ntimeout = "0s"\n', 3, "longer than zero"),
    ("honours-keys-not-bool", '[targets.sms]\nlookup = "none"\nhonours_keys = "yes"\n', 3, "true or false"),
    (
        "definite-not-a-class",
        '[targets.sms]\nlookup = "none"\ndefinite_errors = ["h2targets_fixture:NOT_A_CLASS"]\n',
        3,
        "is not an exception class",
    ),
    (
        "definite-not-an-exception",
        '[targets.sms]\nlookup = "none"\ndefinite_errors = ["h2targets_fixture:NotAnError"]\n',
        3,
        "is not an exception class",
    ),
    (
        "definite-matches-timeouts",
        '[targets.sms]\nlookup = "none"\ndefinite_errors = ["builtins:OSError"]\n',
        3,
        "also matches TimeoutError",
    ),
    (
        "definite-not-a-list",
        '[targets.sms]\nlookup = "none"\ndefinite_errors = "builtins:ValueError"\n',
        3,
        "list of strings",
    ),
    (
        "definite-no-colon",
        '[targets.sms]\nlookup = "none"\ndefinite_errors = ["ValueError"]\n',
        3,
        '"package.module:name"',
    ),
    (
        "module-not-importable",
        '[targets.t]\n\nreconciler = "h2targets_no_such_module:find"\n',
        3,
        "ModuleNotFoundError: No module named 'h2targets_no_such_module' (install it, or add its folder to PYTHONPATH)",
    ),
    (
        "module-fails-at-import",
        '[targets.t]\nreconciler = "h2targets_broken:find"\n',
        2,
        "RuntimeError: boom at import",
    ),
    ("attribute-missing", '[targets.t]\nreconciler = "h2targets_fixture:find_tickets"\n', 2, "AttributeError"),
    (
        "reconciler-not-callable",
        '[targets.t]\nreconciler = "h2targets_fixture:NOT_A_CLASS"\n',
        2,
        "neither a Reconciler nor a function",
    ),
    (
        "receipt-id-not-callable",
        '[targets.sms]\nlookup = "none"\nreceipt_id = "h2targets_fixture:NOT_A_CLASS"\n',
        3,
        "is not callable",
    ),
    (
        "env-var-not-set",
        '[targets.p]\nlookup = "http://gw/{key}"\nheaders = { Authorization = "Bearer ${H2_UNSET_TOKEN}" }\n',
        3,
        "${H2_UNSET_TOKEN}, which is not set",
    ),
    (
        "env-var-in-sub-table",
        '[targets.p]\nlookup = "http://gw/{key}"\n\n[targets.p.headers]\nAuthorization = "Bearer ${H2_UNSET_TOKEN}"\n',
        4,
        "${H2_UNSET_TOKEN}, which is not set",
    ),
    (
        "headers-not-strings",
        '[targets.p]\nlookup = "http://gw/{key}"\nheaders = { Retry = 3 }\n',
        3,
        "table of strings",
    ),
    (
        "status-not-a-code",
        '[targets.p]\nlookup = "http://gw/{key}"\nfound_status = ["200"]\n',
        3,
        "list of HTTP status codes",
    ),
    (
        "status-both-found-and-absent",
        '[targets.p]\nlookup = "http://gw/{key}"\nabsent_status = [200, 404]\n',
        3,
        "both found and absent",
    ),
    ("backoff-not-a-table", '[targets.sms]\nlookup = "none"\nbackoff = "fast"\n', 3, "backoff must be a table"),
    (
        "backoff-unknown-setting",
        '[targets.sms]\nlookup = "none"\nbackoff = { firts = "1s" }\n',
        3,
        "unknown setting 'firts'",
    ),
    ("backoff-tries", '[targets.sms]\nlookup = "none"\nbackoff = { tries = 0 }\n', 3, "backoff.tries"),
    ("backoff-factor", '[targets.sms]\nlookup = "none"\nbackoff = { factor = true }\n', 3, "backoff.factor"),
    ("backoff-duration", '[targets.sms]\nlookup = "none"\nbackoff = { max = "soon" }\n', 3, "not a duration"),
    ("name-not-valid", '[targets."refund gateway"]\nlookup = "none"\n', 1, "invalid target 'refund gateway'"),
    ("name-too-long", f'[targets.sms]\nlookup = "none"\n[targets.{"x" * 65}]\nlookup = "none"\n', 3, "invalid target"),
]


@pytest.mark.parametrize("text,line,what", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_a_mistake_names_the_file_the_line_and_the_problem(tmp_path: Path, text: str, line: int, what: str) -> None:
    path = write(tmp_path, text)
    before = path.read_bytes()
    message = error_of(path)
    assert message.startswith(f"{path}:{line}: "), message
    assert what in message, message
    assert path.read_bytes() == before  # a refused file is never modified


def test_a_header_value_with_a_line_break_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("H2_TOKEN", "abc\r\nX-Injected: 1")
    path = write(tmp_path, '[targets.p]\nlookup = "http://gw/{key}"\nheaders = { Authorization = "${H2_TOKEN}" }\n')
    assert error_of(path).startswith(f"{path}:3: target 'p': header 'Authorization' holds a line break")


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nowhere.toml"
    message = error_of(path)
    assert message.startswith(f"{path}:1: cannot read the targets file") and "No such file" in message


def test_a_folder_is_not_a_targets_file(tmp_path: Path) -> None:
    assert error_of(tmp_path).startswith(f"{tmp_path}:1: cannot read the targets file")


def test_not_utf8_names_the_line_of_the_first_bad_byte(tmp_path: Path) -> None:
    path = write(tmp_path, b'[targets.sms]\nlookup = "none"\n# caf\xe9 au lait\n')
    assert error_of(path).startswith(f"{path}:3: not UTF-8 text")


def test_size_bound(tmp_path: Path) -> None:
    body = b'[targets.sms]\nlookup = "none"\n'
    fits = write(tmp_path, body + b"#" * (MAX_FILE_BYTES - len(body) - 1) + b"\n", "fits.toml")
    assert fits.stat().st_size == MAX_FILE_BYTES
    assert load_targets(fits) == (Target("sms"),)
    over = write(tmp_path, body + b"#" * (MAX_FILE_BYTES - len(body)) + b"\n", "over.toml")
    message = error_of(over)
    assert message.startswith(f"{over}:1: more than {MAX_FILE_BYTES} bytes"), message


def test_an_endless_file_is_not_read_whole() -> None:
    message = error_of("/dev/zero")
    assert message.startswith("/dev/zero:1: ")


def test_a_fifo_is_refused_not_waited_on(tmp_path: Path) -> None:
    """Opening a FIFO for reading waited for a writer, for ever (``effects run --targets FIFO``)."""
    fifo = tmp_path / "targets.toml"
    os.mkfifo(fifo)
    got: list[str] = []
    t = threading.Thread(target=lambda: got.append(error_of(fifo)), daemon=True)
    t.start()
    t.join(10)
    if not got:  # the reader before the fix: let it go, then fail
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        pytest.fail("load_targets(FIFO) still waiting after 10 s")
    assert got[0] == f"{fifo}:1: cannot read the targets file: not a regular file", got[0]


# --- the Python forms --------------------------------------------------------------------------------


def test_a_python_list(fixture_module: Path) -> None:
    assert resolve([Target("a"), Target("b")]) == (Target("a"), Target("b"))
    assert resolve(f"{FIXTURE_MODULE}:TARGETS") == (Target("payments"), Target("mail"))
    with pytest.raises(TargetsError, match="target 'a' is declared twice"):
        resolve([Target("a"), Target("b"), Target("a")])
    with pytest.raises(TargetsError, match="invalid target 'bad name'"):
        resolve([Target("bad name")])
    with pytest.raises(TargetsError, match="'payments' is not an effect_ledger.Target"):
        resolve(["payments"])  # type: ignore[list-item]


def test_a_module_list_names_the_module_file_and_line(fixture_module: Path) -> None:
    line = (
        fixture_module.read_text()
        .splitlines()
        .index('DUPLICATES = [Target("payments"), Target("mail"), Target("payments")]')
        + 1
    )
    message = error_of(f"{FIXTURE_MODULE}:DUPLICATES")
    assert message == f"{fixture_module}:{line}: target 'payments' is declared twice"
    assert error_of("h2targets_no_such_module:TARGETS").startswith(
        "h2targets_no_such_module:TARGETS:1: cannot load the targets: ModuleNotFoundError"
    )
    assert "AttributeError" in error_of(f"{FIXTURE_MODULE}:NOPE")


# --- the ledger and the declaration ----------------------------------------------------------------------


def test_execute_on_an_undeclared_target_writes_nothing(tmp_path: Path) -> None:
    path = str(tmp_path / "effects.db")
    calls: list[str] = []

    async def body() -> None:
        async with await Ledger.open(path, targets=[Target("payments"), Target("sms")]) as ledger:
            with pytest.raises(UnknownTarget) as ei:
                await ledger.execute(
                    target="mail", operation=OPERATION, run_id=RUN_ID, step=STEP, request=REQUEST,
                    call=lambda key: calls.append(key),
                )  # fmt: skip
            assert "'mail' is not declared (declared: payments, sms)" in str(ei.value)
            with pytest.raises(UnknownTarget):
                ledger.target("mail")

    run(body())
    assert calls == [] and db_counts(path) == (0, 0)


def test_no_declaration_means_no_target(tmp_path: Path) -> None:
    path = str(tmp_path / "effects.db")

    async def body() -> None:
        async with await Ledger.open(path) as ledger:  # EFFECTS_TARGETS unset
            assert ledger.targets == {}
            with pytest.raises(UnknownTarget, match=r"declared: none"):
                await ledger.execute(
                    target="payments", operation=OPERATION, run_id=RUN_ID, step=STEP, request=REQUEST,
                    call=lambda key: {"id": "re_1"},
                )  # fmt: skip

    run(body())
    assert db_counts(path) == (0, 0)


def test_open_without_targets_reads_effects_targets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    declared = write(tmp_path, '[targets.payments]\nlookup = "none"\nhonours_keys = true\n')
    monkeypatch.setenv(ENV_VAR, str(declared))
    path = str(tmp_path / "effects.db")

    async def body() -> None:
        async with await Ledger.open(path, targets=None) as ledger:
            assert ledger.targets == {"payments": Target("payments", honours_keys=True)}
            c = await ledger.execute(
                target="payments", operation=OPERATION, run_id=RUN_ID, step=STEP, request=REQUEST,
                call=lambda key: {"id": "re_1"},
            )  # fmt: skip
            assert c.effect_id == KEY and c.called

    run(body())
    with SyncLedger.open(str(tmp_path / "sync.db")) as ledger:
        assert list(ledger.targets) == ["payments"]


@pytest.mark.parametrize("how", ["argument", "environment"])
def test_a_bad_declaration_does_not_create_the_ledger_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    bad = write(tmp_path, '[targets.payments]\nlookup = "http://gw/refunds"\n')
    path = tmp_path / "effects.db"
    if how == "environment":
        monkeypatch.setenv(ENV_VAR, str(bad))
    targets = str(bad) if how == "argument" else None
    with pytest.raises(TargetsError, match=rf"^{bad}:2: "):
        run(Ledger.open(str(path), targets=targets))
    before = set(threading.enumerate())
    with pytest.raises(TargetsError, match=rf"^{bad}:2: "):
        SyncLedger.open(str(path), targets=targets)
    # the sync form's loop thread is gone too (threads of earlier tests may end meanwhile: not counted)
    assert [t.name for t in set(threading.enumerate()) - before if t.name.startswith("effect-ledger")] == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["targets.toml"]


def test_a_timeout_is_never_a_definite_error(tmp_path: Path) -> None:
    """``OSError`` includes ``TimeoutError``: declared definite in Python (where the declaration
    file's check does not apply), a call cut off at its deadline is still unknown, not FAILED: a
    FAILED effect would be executed again."""
    path = str(tmp_path / "effects.db")
    release = threading.Event()

    def slow(key: str) -> dict[str, Any]:
        release.wait(30)
        return {"id": "re_1"}

    try:
        with SyncLedger.open(path, targets=[Target("payments", definite_errors=(OSError,))]) as ledger:
            with pytest.raises(EffectUncertain):
                ledger.execute(
                    target="payments", operation=OPERATION, run_id=RUN_ID, step=STEP, request=REQUEST,
                    call=slow, timeout=0.2,
                )  # fmt: skip
            effect = ledger.get(KEY)
            assert effect is not None and effect.state is State.UNCERTAIN
            assert [f.outcome for f in effect.facts if isinstance(f, Executed)] == [Outcome.UNKNOWN]

            def refused(key: str) -> None:
                raise ConnectionRefusedError("nothing listens")  # an OSError: declared definite

            with pytest.raises(ConnectionRefusedError):
                ledger.execute(
                    target="payments", operation=OPERATION, run_id=RUN_ID, step="other", request=REQUEST,
                    call=refused,
                )  # fmt: skip
    finally:
        release.set()
    with sqlite3.connect(path) as conn:
        assert sorted(conn.execute("SELECT state FROM effects").fetchall()) == [("FAILED",), ("UNCERTAIN",)]


def test_the_demo_declaration_parses(tmp_path: Path) -> None:
    from effect_ledger.demo.agent import payments_target
    from effect_ledger.demo.client import RefundRejected

    t = payments_target("http://127.0.0.1:9", "key+lookup")
    assert t.honours_keys and t.definite_errors == (RefundRejected,) and isinstance(t.reconciler, HttpReconciler)
    assert payments_target("http://127.0.0.1:9", "none").reconciler is None

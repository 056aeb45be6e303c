"""``effects assess LEDGER.db``: the eight rows from an embedded ledger file (the known incident of
``tests/incident.py``, written by the SDK's store), so the check before adoption can be compared with
the same check after it."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from effect_ledger.cli.main import main
from effect_ledger.core.model import Executed, Intent, Outcome, Receipt, ReceiptSource
from tests.incident import DOUBLED, STUCK, UNCERTAIN, N, incident
from tests.ops_expected import now_ms, write_ledger


def test_assess_reads_the_ledgers_own_file(tmp_path: Path) -> None:
    inc = incident(now_ms())
    # one effect 25 minutes after the incident's traffic: the stuck intents are then over 10 minutes old
    t = inc.start_ms + 35 * 60 * 1000
    later = [
        Intent("i-late", "k-late", t, 1, "payments", "create", "default", "r", "s", "{}", "dl", t + 10_000, "w"),
        Executed("x-late", "k-late", t + 50, 1, Outcome.OK, None, t + 1, t + 45, None, "w"),
        Receipt("r-late", "k-late", t + 51, 1, "re-late", ReceiptSource.CALL, "{}"),
    ]
    path = write_ledger(tmp_path / "ledger.db", inc.events + later)
    r = CliRunner().invoke(main, ["assess", str(path), "--json"])
    assert r.exit_code == 0, r.output
    report = json.loads(r.stdout)
    assert report["format"] == "ledger"
    writes = N + DOUBLED + 1  # a doubled effect has two attempts
    ok = writes - STUCK - UNCERTAIN
    rows = {x["id"]: (x["numerator"], x["denominator"], x["verdict"]) for x in report["rows"]}
    assert rows == {
        "keyed": (writes - 2 * DOUBLED, writes, "fail"),  # the naive producer's intents: no key handed over
        "intent": (writes, writes, "pass"),
        "stuck": (STUCK, writes, "fail"),
        "stable": (0, 0, "no data"),
        "derived": (writes - 2 * DOUBLED, writes - 2 * DOUBLED, "pass"),
        "window": (STUCK + UNCERTAIN, writes, "fail"),
        "rhythm": (0, 0, "no data"),
        "duplicates": (DOUBLED, ok, "fail"),  # executed twice, both OK, without a key
    }
    refused = CliRunner().invoke(main, ["assess", str(path), "--redact", str(tmp_path / "out.jsonl")])
    assert refused.exit_code == 1 and not (tmp_path / "out.jsonl").exists()

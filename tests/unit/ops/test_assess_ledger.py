"""``effects assess LEDGER.db``: the eight rows from an embedded ledger file (the known incident of
``tests/incident.py``, written by the SDK's store), so the check before adoption can be compared with
the same check after it. The same answers from the ledger's Kafka topics:
``tests/integration/test_assess_kafka.py``."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from effect_ledger.cli.main import main
from tests.assess_gen import ledger_incident
from tests.ops_expected import now_ms, write_ledger


def test_assess_reads_the_ledgers_own_file(tmp_path: Path) -> None:
    events, expected = ledger_incident(now_ms())
    path = write_ledger(tmp_path / "ledger.db", events)
    r = CliRunner().invoke(main, ["assess", str(path), "--json"])
    assert r.exit_code == 0, r.output
    report = json.loads(r.stdout)
    assert report["format"] == "ledger"
    assert {x["id"]: (x["numerator"], x["denominator"], x["verdict"]) for x in report["rows"]} == expected
    refused = CliRunner().invoke(main, ["assess", str(path), "--redact", str(tmp_path / "out.jsonl")])
    assert refused.exit_code == 1 and not (tmp_path / "out.jsonl").exists()


def test_log_or_topics_not_both() -> None:
    r = CliRunner().invoke(main, ["assess", "x.jsonl", "--topics"])
    assert r.exit_code == 1 and "or --topics" in r.stderr
    r = CliRunner().invoke(main, ["assess"])
    assert r.exit_code == 1 and "give a LOG" in r.stderr

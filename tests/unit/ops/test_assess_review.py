"""``effects assess`` on input that used to mislead or half-write: a line nested deeper than the
redactor's bound, two outputs named alike, ``--writes`` names the log never calls, a forced format the
log is not in, an empty or random file. Real child processes over real files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from effect_ledger.ops.assess import assess
from effect_ledger.ops.assess_report import Redactor

ROOT = Path(__file__).resolve().parents[3]
SAMPLE = str(ROOT / "effect_ledger/demo/assess-sample.jsonl")
GOOD = b'{"ts":"2026-11-02T09:00:00Z","tool":"t","arguments":{"a":1}}'


def run_cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "effect_ledger.cli.main", "assess", *args]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, timeout=120)


def nested(depth: int) -> bytes:
    args = '{"a":' * depth + "1" + "}" * depth
    return ('{"ts":"2026-11-02T09:00:00Z","tool":"t","arguments":' + args + "}").encode()


def test_a_line_nested_500_deep_is_a_bad_line_left_out_of_the_redacted_log(tmp_path: Path) -> None:
    log = tmp_path / "d.jsonl"
    log.write_bytes(GOOD + b"\n" + nested(500) + b"\n" + GOOD + b"\n")
    red = tmp_path / "x.red"
    out = run_cli(str(log), "--redact", str(red), "--json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["bad_lines"]["by_reason"] == {"nested too deep": 1}
    assert report["bad_lines"]["examples"] == [{"line": 2, "reason": "nested too deep"}]
    assert len(red.read_bytes().splitlines()) == 2  # the two good lines, never the deep one


def test_the_redactor_stops_at_its_depth_bound() -> None:
    from effect_ledger.ops.assess_report import MAX_DEPTH

    r = Redactor(b"salt")
    ok: object = 1
    for _ in range(MAX_DEPTH):
        ok = {"a": ok}
    assert json.dumps(r.redact(ok)).count("{") == MAX_DEPTH  # at the bound: redacted whole
    with pytest.raises(ValueError, match="nested too deep"):
        r.redact({"a": ok})
    inner = '{"a":' * 5000 + "1" + "}" * 5000  # JSON inside a string, deeper than the parser goes
    with pytest.raises(ValueError, match="nested too deep"):
        r.redact({"arguments": inner})


def test_assess_counts_the_deep_line_in_process() -> None:
    written: list[object] = []
    r = Redactor()
    result = assess([GOOD, nested(500)], redact_to=lambda raw, obj: written.append(r.redact(obj)))
    assert result.bad == {"nested too deep": 1} and len(written) == 1


def test_one_path_for_html_and_redact_writes_nothing(tmp_path: Path) -> None:
    out = run_cli(SAMPLE, "--html", "same.html", "--redact", "./same.html", cwd=tmp_path)
    assert out.returncode == 1 and len(out.stderr.splitlines()) == 1, out.stderr
    assert "same file" in out.stderr
    assert list(tmp_path.iterdir()) == []


def test_a_later_output_that_cannot_be_committed_takes_the_earlier_ones_back(tmp_path: Path) -> None:
    # what the command does at its end: commit the outputs in turn; one whose place was taken
    # meanwhile (by another process, after the up-front checks) fails, and the earlier ones go again
    from effect_ledger.ops.assess_report import NewFile

    first, second = NewFile(str(tmp_path / "a.html")), NewFile(str(tmp_path / "b.red"))
    first.fp.write(b"page")
    second.fp.write(b"log")
    first.commit()
    (tmp_path / "b.red").write_text("appeared meanwhile")
    with pytest.raises(Exception, match="cannot write"):
        second.commit()
    first.uncommit()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.red"]  # only what another wrote


def test_writes_naming_no_tool_of_the_log_is_refused() -> None:
    out = run_cli(SAMPLE, "--writes", "Refund")
    assert out.returncode == 1 and out.stdout == ""
    assert out.stderr.splitlines() == [
        "effects: --writes Refund: no such tool in the log "
        "(tools seen: create_ticket, lookup_order, refund, send_email)"
    ]


def test_writes_naming_some_unknown_tool_warns_and_assesses() -> None:
    out = run_cli(SAMPLE, "--writes", "refund,Refnud", "--json")
    assert out.returncode == 0, out.stderr
    assert out.stderr.splitlines() == [
        "effects: warning: --writes Refnud: no such tool in the log "
        "(tools seen: create_ticket, lookup_order, refund, send_email)"
    ]
    assert {t["tool"]: t["writes"] for t in json.loads(out.stdout)["tools"]}["refund"] == 12


def test_a_forced_format_counts_records_of_another_shape() -> None:
    out = run_cli(SAMPLE, "--format", "otlp", "--json")
    report = json.loads(out.stdout)
    lines = report["lines"]
    accounted = report["bad_lines"]["count"] + report["records_not_tool_calls"]
    assert out.returncode == 0 and lines > 30
    assert report["bad_lines"]["by_reason"].get("not a otlp record", 0) >= lines - 3, report["bad_lines"]
    assert accounted >= lines - 1  # every line is somewhere in the counts (an empty last line aside)


@pytest.mark.parametrize("content", [b"", os.urandom(4096).replace(b"\n", b" ")], ids=["empty", "random"])
def test_no_record_of_any_known_format_is_one_line_and_exit_1(tmp_path: Path, content: bytes) -> None:
    log = tmp_path / "log.bin"
    log.write_bytes(content)
    for extra in ([], ["--json"]):
        out = run_cli(str(log), *extra, "--html", str(tmp_path / "r.html"))
        assert out.returncode == 1 and out.stdout == ""
        assert out.stderr == f"effects: no record of any known format in {log}\n"
        assert sorted(p.name for p in tmp_path.iterdir()) == ["log.bin"]

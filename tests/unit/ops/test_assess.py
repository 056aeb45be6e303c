"""``effects assess`` on generated logs whose answers are known by construction."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from effect_ledger.core.assess import Costs
from effect_ledger.ops.assess import MAX_LINE_BYTES, AssessError, assess, field_paths, read_lines

ROOT = Path(__file__).resolve().parents[3]
T0 = datetime(2026, 10, 1, tzinfo=UTC)


SECRETS = ("sk_live_SECRET123", "Bearer XYZ", "AbCdEfGhIjKlMnOpQrSt", "customer@example.com", "idem-7")


def http_log() -> list[bytes]:
    """An access log (Caddy/nginx JSON shape): two orders cancelled once each, one cancelled twice,
    a keyed charge that timed out (504) and was retried with its key, a download by a token in the path."""
    t = datetime(2026, 10, 1, tzinfo=UTC)

    def req(s: float, method: str, url: str, status: int, **extra: Any) -> bytes:
        headers = {"Authorization": "Bearer XYZ", **extra.pop("headers", {})}
        rec = {"ts": (t + timedelta(seconds=s)).isoformat(), "method": method, "url": url, "status": status,
               "duration": 0.12, "request_headers": headers}  # fmt: skip
        return json.dumps({**rec, **extra}).encode()

    cancel = "https://shop.example/v1/orders/{}/cancel?token=sk_live_SECRET123"
    return [
        req(0, "POST", cancel.format(1001), 200, body={"reason": "customer@example.com asked"}),
        req(10, "POST", cancel.format(1002), 200, body={"reason": "customer@example.com asked"}),
        req(20, "POST", cancel.format(1003), 200),
        req(80, "POST", cancel.format(1003), 200),
        req(100, "POST", "https://pay.example/v1/charges", 504, headers={"Idempotency-Key": "idem-7"}),
        req(100.3, "POST", "https://pay.example/v1/charges", 200, headers={"Idempotency-Key": "idem-7"}),
        req(200, "GET", "https://files.example/share/AbCdEfGhIjKlMnOpQrSt/download", 200),
    ]


def test_http_access_log_rows() -> None:
    """Two different orders' cancellations are not "same arguments" (the path's ids count); a retry
    after a 504 is a retry with a stable key."""
    report = assess(http_log()).as_dict(Costs())
    assert report["format"] == "http"
    rows = {r["id"]: (r["numerator"], r["denominator"]) for r in report["rows"]}
    assert rows["duplicates"] == (1, 5)  # order 1003 twice; 1001 and 1002 are different orders
    assert rows["keyed"] == (2, 6)
    assert rows["stable"] == (1, 1)
    assert rows["window"] == (1, 6)
    tools = {t["tool"]: t["writes"] for t in report["tools"]}
    assert tools == {
        "POST shop.example/v1/orders/{id}/cancel": 4,
        "POST pay.example/v1/charges": 2,
        "GET files.example/share/{token}/download": 0,
    }


def test_no_secret_reaches_any_output(tmp_path: Path) -> None:
    log = tmp_path / "access.jsonl"
    log.write_bytes(b"\n".join(http_log()) + b"\n")
    html, red = tmp_path / "report.html", tmp_path / "redacted.jsonl"
    text = run_cli(str(log))
    as_json = run_cli(str(log), "--json", "--html", str(html), "--redact", str(red))
    assert text.returncode == 0 and as_json.returncode == 0, text.stderr + as_json.stderr
    for out in (text.stdout + text.stderr, as_json.stdout, html.read_text(), red.read_text()):
        for secret in SECRETS:
            assert secret not in out
    assert "1003" not in red.read_text() and "[redacted]" in red.read_text()
    # the redacted log still shows the same rows
    assert json.loads(run_cli(str(red), "--json").stdout)["rows"] == json.loads(as_json.stdout)["rows"]


def test_outputs_are_new_files_and_a_refusal_leaves_them_alone(tmp_path: Path) -> None:
    log = tmp_path / "access.jsonl"
    log.write_bytes(b"\n".join(http_log()))
    existing = tmp_path / "report.html"
    existing.write_text("mine")
    out = run_cli(str(log), "--html", str(existing))
    assert out.returncode == 1 and out.stderr == f"effects: {existing} exists: not overwritten\n"
    assert existing.read_text() == "mine"
    out = run_cli("/nonexistent.jsonl", "--redact", str(tmp_path / "red.jsonl"))
    assert out.returncode == 1 and sorted(p.name for p in tmp_path.iterdir()) == ["access.jsonl", "report.html"]


def test_window_and_field_overrides() -> None:
    lines = [
        json.dumps({"when": 1_700_000_000 + s, "call": {"fn": "pay"}, "input": {"a": 1}}).encode()
        for s in (0, 300, 1300)
    ]
    paths = field_paths(["tool=call.fn", "time=when"])
    assert assess(lines, paths=paths, window_s=600).assessor.tools["pay"].duplicates == 1  # 300 s: yes; 1000 s: no
    assert assess(lines, paths=paths, window_s=1200).assessor.tools["pay"].duplicates == 2


def test_mcp_log_lines_keep_their_key() -> None:
    params = {"name": "refund", "arguments": {"o": 1}, "_meta": {"idempotencyKey": "k"}}
    report = assess([json.dumps({"method": "tools/call", "params": params}).encode()] * 3)
    assert report.assessor.tools["refund"].keyed == 3
    rows = {r.id: r for r in rows_of(report)}
    assert rows["window"].verdict == "not measurable" and rows["window"].missing


def rows_of(result: Any) -> list[Any]:
    from effect_ledger.core.assess import rows

    return rows(result.assessor)


def test_bad_lines_are_counted_by_reason() -> None:
    lines = [b"{not json", b"[1, 2]", b'{"ts": "2026-10-01T00:00:00Z", "msg": "no tool"}', None, b'{"tool": "x"}']
    report = assess(lines).as_dict(Costs())
    assert report["lines"] == 5
    assert report["bad_lines"]["by_reason"] == {
        "not JSON": 1,
        "not a JSON object": 1,
        "no tool name (nor HTTP method and URL)": 1,
        f"longer than {MAX_LINE_BYTES} bytes": 1,
    }


def test_read_lines_is_bounded() -> None:
    data = b"a\n" + b"b" * 50 + b"\nc\n" + b"d" * 50
    assert list(read_lines(io.BytesIO(data), limit=10)) == [b"a", None, b"c", None]


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "effect_ledger.cli.main", "assess", *args]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=60)


def test_sample_log() -> None:
    out = run_cli("effect_ledger/demo/assess-sample.jsonl", "--writes", "refund,send_email,create_ticket", "--json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    got = {t["tool"]: (t["writes"], t["keyed"], t["duplicates"]) for t in report["tools"]}
    assert got == {
        "refund": (12, 8, 1),
        "send_email": (10, 0, 2),
        "create_ticket": (6, 6, 0),
        "lookup_order": (0, 0, 0),
    }
    rows = {r["id"]: r for r in report["rows"]}
    assert rows["keyed"]["verdict"] == "fix first" and rows["keyed"]["detail"]["below_half"] == ["send_email"]
    assert report["bad_lines"]["count"] == 2


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["/nonexistent/calls.jsonl"], "effects: cannot read /nonexistent/calls.jsonl: No such file or directory"),
        (["effect_ledger/demo", "--json"], "effects: cannot read effect_ledger/demo: Is a directory"),
        (["effect_ledger/demo/assess-sample.jsonl", "--window", "soon"], "effects: not a duration: 'soon'"),
        (["effect_ledger/demo/assess-sample.jsonl", "--field", "colour=x"], "effects: --field 'colour=x'"),
    ],
)
def test_cli_errors_are_one_line(args: list[str], message: str) -> None:
    out = run_cli(*args)
    assert out.returncode == 1 and out.stdout == ""
    assert len(out.stderr.strip().splitlines()) == 1 and out.stderr.startswith(message)


def test_a_log_is_read_up_to_max_log_bytes() -> None:
    """What one run reads is bounded: ``-`` fed an endless stream (or a device) ended never."""
    data = b'{"tool": "refund", "arguments": {"n": 1}}\n' * 100
    assert sum(1 for _ in read_lines(io.BytesIO(data), max_bytes=len(data))) == 100
    with pytest.raises(AssessError, match=f"more than {len(data) - 1} bytes"):
        list(read_lines(io.BytesIO(data), max_bytes=len(data) - 1))


def test_cli_stdin_over_max_log_bytes_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    from click.testing import CliRunner

    from effect_ledger.cli.main import main
    from effect_ledger.ops import assess as assess_module

    monkeypatch.setattr(assess_module, "MAX_LOG_BYTES", 1000)
    r = CliRunner().invoke(main, ["assess", "-"], input=b'{"tool": "refund"}\n' * 100)
    assert r.exit_code == 1 and r.stderr.startswith("effects: -: more than 1000 bytes"), r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("what", ["fifo", "device"])
def test_cli_log_that_is_not_a_regular_file_is_refused_at_once(what: str, tmp_path: Path) -> None:
    """``effects assess /dev/zero`` read for ever; a FIFO waited for a writer for ever."""
    if what == "fifo":
        path = tmp_path / "calls.jsonl"
        os.mkfifo(path)
    else:
        path = Path("/dev/zero")
    try:
        out = run_cli(str(path))
    except subprocess.TimeoutExpired:
        pytest.fail(f"assess {path}: still running after 60 s")
    assert out.returncode == 1 and out.stdout == ""
    assert out.stderr == f"effects: cannot read {path}: not a regular file (give - to read a pipe)\n"


def test_hostile_records_are_bad_lines_not_a_crash() -> None:
    deep = "[" * 100_000 + "]" * 100_000
    lines = [
        json.dumps({"tool": "refund", "arguments": deep}).encode(),  # JSON text nested past any limit
        json.dumps({"tool": "refund", "arguments": json.loads("[" * 900 + "]" * 900)}).encode(),
        b'{"tool": "refund", "ts": "not a time", "end": 1e400, "status": {"x": []}}',
        json.dumps({"tool": ["not", "a", "name"]}).encode(),
        json.dumps({"tool": "refund", "arguments": {"order": 1}}).encode(),
    ]
    report = assess(lines).as_dict(Costs())
    assert report["lines"] == 5
    assert report["bad_lines"]["by_reason"] == {
        "nested too deep": 1,  # before: a RecursionError ended the run
        "not JSON": 1,  # 1e400 is not a number JSON parsers accept
        "no tool name (nor HTTP method and URL)": 1,
    }
    assert [(t["tool"], t["calls"]) for t in report["tools"]] == [("refund", 2)]  # the deep text is compared as text


def test_an_unreachable_broker_leaves_no_output(tmp_path: Path) -> None:
    """``--topics`` with nothing listening: one line, exit 1, and the --html file never appears."""
    from click.testing import CliRunner

    from effect_ledger.cli.main import main

    page = tmp_path / "report.html"
    args = ["--broker-timeout", "1", "assess", "--topics", "--bootstrap", "127.0.0.1:1", "--html", str(page)]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 1 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert list(tmp_path.iterdir()) == []

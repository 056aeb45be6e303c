"""``effects assess`` on generated logs whose answers are known by construction."""

from __future__ import annotations

import io
import json
import os
import random
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from effect_ledger.ops.assess import MAX_LINE_BYTES, AssessError, assess, field_paths, read_lines

ROOT = Path(__file__).resolve().parents[3]
T0 = datetime(2026, 10, 1, tzinfo=UTC)


def at(minutes: float) -> str:
    return (T0 + timedelta(minutes=minutes)).isoformat()


def generated_log(seed: int = 7) -> tuple[list[bytes], dict[str, Any]]:
    """A month of calls with planted duplicates. Returns the lines (shuffled: a log need not be in
    time order) and the answers."""
    rng = random.Random(seed)
    recs: list[dict[str, Any]] = []
    # refund: 200 writes, 150 keyed; 10 retries with the same key; 5 keyless retries 2 min later;
    # 4 repeats of earlier arguments a day later (not duplicates)
    for i in range(185):
        r: dict[str, Any] = {"ts": at(i * 60), "tool": "refund", "arguments": {"order": i, "amount": 100 + i}}
        if i < 140:
            r["idempotency_key"] = f"k{i}"
        recs.append(r)
    for i in range(10):
        recs.append(
            {
                "ts": at(i * 60 + 1),
                "tool": "refund",
                "arguments": {"order": i, "amount": 100 + i},
                "idempotency_key": f"k{i}",
            }
        )
    for i in range(150, 155):
        recs.append({"ts": at(i * 60 + 2), "tool": "refund", "arguments": {"amount": 100 + i, "order": i}})
    for i in range(160, 164):
        recs.append({"ts": at(i * 60 + 1440), "tool": "refund", "arguments": {"order": i, "amount": 100 + i}})
    # lookup: 50 reads, all identical: never duplicates
    recs += [{"ts": at(i), "tool": "lookup", "arguments": {"order": 1}} for i in range(50)]
    # HTTP: 30 POSTs to /v1/charges/<id> (20 with the header), 3 keyless resends within the window
    # with the JSON body re-serialized, 2 resends with a NEW key (a key per attempt: not deduplicable)
    for i in range(30):
        req: dict[str, Any] = {
            "ts": at(i * 30),
            "method": "POST",
            "url": f"https://pay.example/v1/charges/{1000 + i}",
            "body": json.dumps({"amount": i}),
        }
        if i < 20:
            req["headers"] = {"Idempotency-Key": f"c{i}"}
        recs.append(req)
    for i in range(25, 28):
        recs.append(
            {
                "ts": at(i * 30 + 5),
                "method": "post",
                "url": f"https://pay.example/v1/charges/{1000 + i}",
                "body": json.dumps({"amount": i}, indent=2),
            }
        )
    for i in range(2):
        recs.append(
            {
                "ts": at(i * 30 + 3),
                "method": "POST",
                "url": f"https://pay.example/v1/charges/{1000 + i}",
                "body": json.dumps({"amount": i}),
                "headers": {"Idempotency-Key": f"c{i}-retry"},
            }
        )
    recs += [{"ts": at(i), "method": "GET", "url": "https://pay.example/v1/charges/1000"} for i in range(12)]
    lines = [json.dumps(r).encode() for r in recs]
    rng.shuffle(lines)
    lines += [b"{not json", b"[1, 2]", b'{"ts": "2026-10-01T00:00:00Z", "msg": "no tool"}', b"x" * (MAX_LINE_BYTES + 1)]
    answers = {
        "refund": {"calls": 204, "writes": 204, "keyed": 150, "dup_same_key": 10, "dup_same_args": 5},
        "lookup": {"calls": 50, "writes": 0, "keyed": 0, "dup_same_key": 0, "dup_same_args": 0},
        "POST pay.example/v1/charges/{id}": {
            "calls": 35,
            "writes": 35,
            "keyed": 22,
            "dup_same_key": 0,
            "dup_same_args": 5,
        },
        "GET pay.example/v1/charges/{id}": {
            "calls": 12,
            "writes": 0,
            "keyed": 0,
            "dup_same_key": 0,
            "dup_same_args": 0,
        },
    }
    return lines, answers


def test_generated_log_known_answers() -> None:
    lines, answers = generated_log()
    report = assess(lines, writes=["refund"], window_s=600).as_dict()
    got = {t["tool"]: {k: t[k] for k in answers["refund"]} for t in report["tools"]}
    assert got == answers
    total = report["total"]
    assert (total["writes"], total["keyed"], total["ledger_would_catch"]) == (239, 172, 20)
    assert total["keyed_share"] == round(172 / 239, 4)
    assert report["lines"] == len(lines)
    assert report["bad_lines"]["count"] == 4
    assert report["bad_lines"]["by_reason"] == {
        "not JSON": 1,
        "not a JSON object": 1,
        "no tool name (nor HTTP method and URL)": 1,
        f"longer than {MAX_LINE_BYTES} bytes": 1,
    }


def test_window_and_field_overrides() -> None:
    lines = [
        json.dumps({"when": 1_700_000_000 + s, "call": {"fn": "pay"}, "input": {"a": 1}}).encode()
        for s in (0, 300, 1300)
    ]
    paths = field_paths(["tool=call.fn", "time=when"])
    assert assess(lines, paths=paths, window_s=600).tools["pay"].dup_same_args == 1  # 300 s: yes; 1000 s: no
    assert assess(lines, paths=paths, window_s=1200).tools["pay"].dup_same_args == 2


def test_mcp_log_lines_and_untimed_writes() -> None:
    params = {"name": "refund", "arguments": {"o": 1}, "_meta": {"idempotencyKey": "k"}}
    call = {"method": "tools/call", "params": params}
    report = assess([json.dumps(call).encode()] * 3)
    assert report.tools["refund"].keyed == 3 and report.tools["refund"].dup_same_key == 2
    assert report.untimed_writes == 3 and report.all_tools_are_writes


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
    got = {t["tool"]: (t["writes"], t["keyed"], t["dup_same_key"], t["dup_same_args"]) for t in report["tools"]}
    assert got == {
        "refund": (12, 8, 1, 1),
        "send_email": (10, 0, 0, 2),
        "create_ticket": (6, 6, 1, 0),
        "lookup_order": (0, 0, 0, 0),
    }
    assert report["total"]["ledger_would_catch"] == 5 and report["bad_lines"]["count"] == 2


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

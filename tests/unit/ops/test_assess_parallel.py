"""``effects assess`` on two cores (a forked child parses, the parent folds) gives exactly the result
of one process: same rows, counts, samples, examples and bad lines, whatever the batch boundaries."""

from __future__ import annotations

import json
import os
import random
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from effect_ledger.core.assess import Costs
from effect_ledger.ops import assess as assess_module
from effect_ledger.ops.assess import AssessError, assess, read_lines
from tests.bench.assess import write_calls, write_traces

ROOT = Path(__file__).resolve().parents[3]
T0 = datetime(2026, 10, 1, tzinfo=UTC)


def month_log(path: Path, calls: int = 20_000, seed: int = 7) -> None:
    """A month of tool calls with every pattern the rows count, close together: duplicates a few
    seconds apart, errors and time-outs retried with the same, a new or no key, rows left started
    (some followed up, some not), keys carrying a time, reads, and bad lines in between."""
    rng = random.Random(seed)
    step = 30 * 86_400 / calls
    out: list[str] = []

    def rec(s: float, tool: str, args: dict[str, Any], status: str, **extra: Any) -> str:
        r = {"ts": (T0 + timedelta(seconds=s)).isoformat(), "tool": tool, "arguments": args, "status": status}
        if status != "pending":
            r["end"] = (T0 + timedelta(seconds=s + rng.uniform(0.05, 3))).isoformat()
        return json.dumps({**r, **extra})

    for n in range(calls):
        s = n * step
        tool = rng.choice(["refund", "send_email", "create_ticket", "lookup"])
        args = {"order": f"A-{rng.randrange(400)}", "amount": rng.randrange(5)}
        key = rng.choice([None, f"{tool}:{args['order']}", f"{tool}-{1790812800 + n}"])
        if key is not None:
            args["idempotency_key"] = key
        cid = {"call_id": f"c-{n}"} if rng.random() < 0.5 else {}
        kind = rng.random()
        if kind < 0.15:  # a semantic duplicate a few seconds later
            out.append(rec(s, tool, args, "ok", **cid))
            out.append(rec(s + rng.uniform(1, 20), tool, args, "ok"))
        elif kind < 0.3:  # a time-out or an error, then a retry (same key, a new key, or none)
            out.append(rec(s, tool, args, rng.choice(["TimeoutError: timed out", "ValueError: bad"]), **cid))
            if rng.random() < 0.3:
                args = {**args, "idempotency_key": f"{tool}:{n}:retry"}
            out.append(rec(s + rng.uniform(0.1, 40), tool, args, "ok", **cid))
        elif kind < 0.35:  # started, maybe never finished
            out.append(rec(s, tool, args, "pending", **cid))
            if rng.random() < 0.5:
                out.append(rec(s + rng.uniform(5, 50), tool, args, "ok", **cid))
        elif kind < 0.37:
            out.append(rng.choice(["{not json", "[1, 2]", '{"msg": "no tool"}', ""]))
        else:
            out.append(rec(s, tool, args, "ok", **cid))
    path.write_text("\n".join(out) + "\n")


def both(path: Path, **kw: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """The report of one process and of two, each with the sample arrays the HTML page plots."""
    got = []
    for parallel in (False, True):
        with path.open("rb") as fp:
            r = assess(read_lines(fp), parallel=parallel, **kw)
        a = r.assessor
        samples = {
            "windows": list(a.windows.values),
            "ok": {t: list(s.values) for t, s in a.ok_durations.items()},
            "delays": {t: list(s.values) for t, s in a.delays.items()},
        }
        got.append({**r.as_dict(Costs(), show_values=True), "samples": samples})
    return got[0], got[1]


@pytest.mark.parametrize("batch", [1, 7, 2048])
def test_a_month_is_assessed_the_same_on_two_cores(batch: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Batch boundaries fall inside duplicate and retry windows (a batch of 7 cuts most pairs)."""
    path = tmp_path / "month.jsonl"
    month_log(path)
    monkeypatch.setattr(assess_module, "_BATCH", batch)
    one, two = both(path, writes=["refund", "send_email", "create_ticket"], window_s=60)
    assert one == two
    rows = {r["id"]: r for r in one["rows"]}
    # the log holds every pattern, so equality above is not equality of empty reports
    assert rows["duplicates"]["numerator"] > 500 and rows["stable"]["denominator"] > 500
    assert rows["stuck"]["detail"]["noticed"] > 50 and rows["stuck"]["detail"]["unnoticed"] > 50
    assert one["bad_lines"]["count"] > 100 and len(one["bad_lines"]["examples"]) == 5
    assert one["examples"]["semantic duplicate"] and one["examples"]["key changed on retry"]


@pytest.mark.parametrize("writer", [write_calls, write_traces])
def test_the_bench_logs_are_assessed_the_same_on_two_cores(writer: Any, tmp_path: Path) -> None:
    """The two logs ``make bench`` measures (a tool-calls layout and a LangSmith export)."""
    path = tmp_path / "log.jsonl"
    writer(path, 3)
    one, two = both(path)
    assert one == two and one["lines"] > 1000
    assert sum(t["calls"] for t in one["tools"]) > 500


def test_the_sample_log_and_its_bad_lines_are_the_same_on_two_cores() -> None:
    one, two = both(ROOT / "effect_ledger/demo/assess-sample.jsonl", writes=["refund", "send_email"])
    assert one == two and one["bad_lines"]["count"] == 2


def test_over_max_log_bytes_in_the_child_is_the_same_error(tmp_path: Path) -> None:
    path = tmp_path / "calls.jsonl"
    path.write_bytes(b'{"tool": "refund", "arguments": {"n": 1}}\n' * 100_000)
    with path.open("rb") as fp, pytest.raises(AssessError, match="more than 1000000 bytes"):
        assess(read_lines(fp, max_bytes=1_000_000), parallel=True)


def test_a_read_error_in_the_child_is_an_os_error() -> None:
    def lines() -> Any:
        yield b'{"tool": "refund"}'
        raise OSError(5, "Input/output error")

    with pytest.raises(OSError, match="Input/output error") as e:
        assess(lines(), parallel=True)
    assert e.value.errno == 5


def test_a_child_that_dies_is_a_typed_error_not_a_hang() -> None:
    def lines() -> Any:
        yield b'{"tool": "refund"}'
        os._exit(3)  # killed mid-read (the OOM killer, a signal): nothing more is sent

    with pytest.raises(AssessError, match="ended without a result"):
        assess(lines(), parallel=True)


def test_the_cli_gives_the_one_process_report(tmp_path: Path) -> None:
    """``effects assess LOG`` uses two cores where it has them; its report is the sequential one."""
    from click.testing import CliRunner

    from effect_ledger.cli.main import main

    path = tmp_path / "month.jsonl"
    month_log(path, calls=3000)
    r = CliRunner().invoke(main, ["assess", str(path), "--json", "--show-values"])
    assert r.exit_code == 0, r.stderr
    with path.open("rb") as fp:
        expected = assess(read_lines(fp)).as_dict(Costs(), show_values=True)
    assert json.loads(r.stdout) == json.loads(json.dumps(expected))


def test_an_interrupted_fold_leaves_no_child_behind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C (or any error) in the folding parent: the child is killed and reaped, not left parsing."""
    from effect_ledger.core.assess import Assessor

    path = tmp_path / "calls.jsonl"
    write_calls(path, 3)
    forked: list[int] = []
    real_fork = os.fork

    def fork() -> int:
        pid = real_fork()
        if pid:
            forked.append(pid)
        return pid

    def add(self: Assessor, call: Any) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "fork", fork)
    monkeypatch.setattr(Assessor, "add", add)
    with path.open("rb") as fp, pytest.raises(KeyboardInterrupt):
        assess(read_lines(fp), parallel=True)
    assert len(forked) == 1 and not Path(f"/proc/{forked[0]}").exists()  # gone, not a zombie

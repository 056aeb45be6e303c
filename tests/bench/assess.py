"""assess_speed: ``effects assess`` over a month-sized log, in MB/s, beside a bare parse of the same file.

Two logs are written once per run (``EFFECTS_BENCH_ASSESS_MB``, default 1024; 200 with ``--quick``):

* **traces**: a LangSmith run export as a team has it: per agent turn, two LLM runs carrying their
  prompt and completion (a few KB each) and one tool run (refund, send_email or create_ticket, with
  retries, time-outs and duplicates); most bytes are model traffic, which the byte pre-filter skips
  without parsing.
* **calls**: only tool calls, 300 bytes each (the worst case: every line parsed and folded), a fifth
  of the traces' size. ``effects assess`` parses in a forked child while the parent folds (two
  cores), so this case is bound by the per-record Python of the reader, not by one core doing all.

Figures per log: ``effects assess LOG --json`` as a child process (wall MB/s, its peak RSS), and in
the same run a bare ``orjson.loads`` and ``json.loads`` of every line of the same file (the raw
limit). The peak RSS is the larger of the two processes' (``RUSAGE_CHILDREN`` is a maximum).
Standalone: ``python -m tests.bench.assess [MB]``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tests.bench.common import ROOT, BenchResult, Context, Metric

TARGET_MB_S = 100.0
_PROMPT = "You are a support agent for an online shop. " * 40


def write_traces(path: Path, mb: int) -> int:
    """A LangSmith-shaped run export of about ``mb`` MB; returns the tool runs written."""
    limit = mb * 1_000_000
    t0 = 1_790_812_800_000
    n = tools = 0
    with path.open("w") as fp:
        while fp.tell() < limit:
            t = t0 + n * 900
            tool = ("refund", "send_email", "create_ticket")[n % 3]
            args: dict[str, Any] = {"order": f"A-{n % 50_000}", "amount": n % 997}
            if tool == "refund":
                args["idempotency_key"] = f"refund:A-{n % 50_000}"
            for k in range(2):
                llm = {"id": f"l{n}-{k}", "run_type": "llm", "name": "ChatModel", "trace_id": f"t{n}",
                       "start_time": _iso(t - 800 + k * 300), "end_time": _iso(t - 600 + k * 300),
                       "inputs": {"messages": [{"role": "system", "content": _PROMPT}, {"role": "user",
                                  "content": f"please help with order A-{n}"}]},
                       "outputs": {"generations": [{"text": "Calling the tool now. " * 20}]}}  # fmt: skip
                fp.write(json.dumps(llm) + "\n")
            err = "TimeoutError: timed out" if n % 50 == 0 else None
            run = {"id": f"r{n}", "run_type": "tool", "name": tool, "trace_id": f"t{n}", "start_time": _iso(t),
                   "end_time": _iso(t + 200 + n % 300), "inputs": args, "outputs": None if err else {"ok": True},
                   "error": err, "extra": {"metadata": {"tool_call_id": f"c{n}"}}}  # fmt: skip
            fp.write(json.dumps(run) + "\n")
            n += 1
            tools += 1
    return tools


def write_calls(path: Path, mb: int) -> int:
    limit = mb * 1_000_000
    t0 = 1_790_812_800_000
    n = 0
    with path.open("w") as fp:
        while fp.tell() < limit:
            t = t0 + n * 300
            tool = ("refund", "send_email", "create_ticket", "lookup")[n % 4]
            rec = {"ts": _iso(t), "end": _iso(t + 200 + n % 300), "tool": tool, "call_id": f"c-{n}",
                   "arguments": {"order": f"A-{n % 50_000}", "amount": n % 1000, "idempotency_key": f"{tool}:A-{n}"},
                   "status": "ok", "service": "agent-7", "trace_id": f"{n:032x}"}  # fmt: skip
            fp.write(json.dumps(rec) + "\n")
            n += 1
    return n


def _iso(ms: int) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(ms / 1000, UTC).isoformat()


def bare_parse(path: Path, loads: Any) -> float:
    """Seconds to parse every line of ``path`` with ``loads`` and nothing else."""
    t = time.perf_counter()
    with path.open("rb") as fp:
        for line in fp:
            loads(line)
    return time.perf_counter() - t


def assess_child(path: Path) -> tuple[float, float, dict[str, Any]]:
    """``effects assess PATH --json`` in a child: wall seconds, its peak RSS in MB, the report."""
    cmd = [sys.executable, "-m", "effect_ledger.cli.main", "assess", str(path), "--json"]
    t = time.perf_counter()
    p = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = p.communicate()
    seconds = time.perf_counter() - t
    # the child's own rusage (wait4 would race communicate; RUSAGE_CHILDREN is the max over children)
    import resource

    rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    if p.returncode != 0:
        raise RuntimeError(f"effects assess failed: {err.decode()[-500:]}")
    return seconds, rss, json.loads(out)


def measure(path: Path, reps: int, progress: Any = print) -> dict[str, Any]:
    import orjson

    mb = path.stat().st_size / 1e6
    runs, raw, std, rss = [], [], [], 0.0
    report: dict[str, Any] = {}
    for _ in range(reps):
        raw.append(mb / bare_parse(path, orjson.loads))
        std.append(mb / bare_parse(path, json.loads))
        seconds, peak, report = assess_child(path)
        runs.append(mb / seconds)
        rss = max(rss, peak)
        progress(f"assess {path.name}: {mb:,.0f} MB in {seconds:.1f} s = {runs[-1]:.0f} MB/s "
                 f"(orjson {raw[-1]:.0f}, json {std[-1]:.0f} MB/s); peak RSS {peak:.0f} MB")  # fmt: skip
    return {"mb": mb, "runs": runs, "raw": raw, "json": std, "rss_mb": rss, "lines": report.get("lines")}


def run(ctx: Context) -> BenchResult:
    mb = int(os.environ.get("EFFECTS_BENCH_ASSESS_MB", ctx.size(1024, 200)))
    wd = ctx.workdir("assess")
    res = BenchResult("assess_speed", "ran", info={"log_mb": mb})
    traces, calls = wd / "traces.jsonl", wd / "calls.jsonl"
    ctx.progress(f"assess: writing {mb} MB of traces and {mb // 5} MB of tool calls")
    write_traces(traces, mb)
    write_calls(calls, max(1, mb // 5))
    reps = min(ctx.reps, 3)
    for name, path in (("traces", traces), ("tool calls only", calls)):
        r = measure(path, reps, ctx.progress)
        res.metrics.append(
            Metric(f"assess {name}, {r['mb']:,.0f} MB", "MB/s", r["runs"], higher_is_better=True,
                   target=TARGET_MB_S, raw_limit_runs=r["raw"],
                   raw_what="orjson.loads of every line, same file, same run",
                   extra={"json_loads_mb_s": r["json"], "peak_rss_mb": r["rss_mb"], "lines": r["lines"]})
        )  # fmt: skip
    return res


if __name__ == "__main__":
    import tempfile

    size = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    with tempfile.TemporaryDirectory() as tmp:
        traces, calls = Path(tmp) / "traces.jsonl", Path(tmp) / "calls.jsonl"
        write_traces(traces, size)
        write_calls(calls, max(1, size // 5))
        for p in (traces, calls):
            print(measure(p, 1))

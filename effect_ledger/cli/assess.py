"""``effects assess LOG``: the eight-row check of an execution log a team already has (OpenTelemetry,
LangSmith, Langfuse, OpenAI Agents SDK, HTTP access logs, plain JSON lines), with the cost arithmetic;
a table, ``--json`` or ``--html FILE`` (see ``effect_ledger.ops.assess``)."""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any, BinaryIO

import click

from effect_ledger._files import open_regular
from effect_ledger.cli._shared import fail, kafka_options
from effect_ledger.ops.assess_formats import FORMATS


@click.command("assess")
@click.argument("log", metavar="LOG", required=False)
@click.option("--topics", is_flag=True, help="assess the ledger's own Kafka topics instead of a LOG")
@kafka_options
@click.option(
    "--format", "fmt", type=click.Choice((*FORMATS, "ledger")), default=None, help="the log's format [detected]"
)
@click.option("--field", "fields", multiple=True, metavar="NAME=PATH", help="where a field is (dotted path)")
@click.option("--writes", multiple=True, metavar="TOOL,...", help="the write tools [every tool call]")
@click.option("--window", default="10m", show_default=True, help="same arguments within this long: a duplicate")
@click.option("--json", "as_json", is_flag=True, help="JSON output")
@click.option("--html", "html_out", metavar="FILE", help="also write a self-contained HTML report (a new file)")
@click.option("--redact", "redact_out", metavar="OUT", help="also write the log redacted to OUT (a new file)")
@click.option("--show-values", is_flag=True, help="show idempotency keys in the examples [redacted]")
@click.option(
    "--minutes-per-duplicate", type=float, default=30.0, show_default=True, help="a person's time per duplicate"
)
@click.option("--cost-per-duplicate", type=float, default=50.0, show_default=True, help="money lost per duplicate")
@click.option("--hourly-cost", type=float, default=100.0, show_default=True, help="cost of an hour of work")
@click.option("--fix-hours", type=float, default=80.0, show_default=True, help="the work of closing the gaps")
def assess_command(
    log: str | None,
    topics: bool,
    bootstrap: str | None,
    prefix: str | None,
    fmt: str | None,
    fields: tuple[str, ...],
    writes: tuple[str, ...],
    window: str,
    as_json: bool,
    html_out: str | None,
    redact_out: str | None,
    show_values: bool,
    minutes_per_duplicate: float,
    cost_per_duplicate: float,
    hourly_cost: float,
    fix_hours: float,
) -> None:
    """Assess an execution log (LOG, or - for stdin): eight rows, each with numerator, denominator,
    criterion and verdict, and what a year of duplicates costs."""
    from effect_ledger.core.assess import Costs
    from effect_ledger.core.timeparse import TimeSpecError, duration_ms
    from effect_ledger.errors import AssessError
    from effect_ledger.ops.assess import assess, field_paths, read_lines
    from effect_ledger.ops.assess_report import NewFile, Redactor, html_report

    if topics == (log is not None):
        fail("give a LOG (or - for standard input), or --topics for the ledger's Kafka topics")
    for name, v in (("--minutes-per-duplicate", minutes_per_duplicate), ("--cost-per-duplicate", cost_per_duplicate),
                    ("--hourly-cost", hourly_cost), ("--fix-hours", fix_hours)):  # fmt: skip
        if not (v >= 0 and v < 1e12):
            fail(f"{name} {v}: expected a number from 0")
    costs = Costs(minutes_per_duplicate, cost_per_duplicate, hourly_cost, fix_hours)
    try:
        window_s = duration_ms(window) / 1000
        paths = field_paths(fields)
    except (TimeSpecError, AssessError) as e:
        fail(str(e))
    named = [t for spec in writes for t in spec.split(",") if t]
    if html_out and redact_out and _same_path(html_out, redact_out):
        fail(f"--html and --redact name the same file {html_out}: give two")
    outputs: list[NewFile] = []
    try:
        html_file = NewFile(html_out) if html_out else None
        outputs += [html_file] if html_file else []
        redact_file = NewFile(redact_out) if redact_out else None
        outputs += [redact_file] if redact_file else []
    except AssessError as e:
        for o in outputs:
            o.abort()
        fail(str(e))
    redact_to = None
    if redact_file is not None:
        redactor, rfp = Redactor(), redact_file.fp

        def redact_to(raw: bytes | None, obj: Any) -> None:
            if obj is not None:  # a line that is not JSON (or too long) is left out: it may be anything
                rfp.write(json.dumps(redactor.redact(obj), separators=(",", ":")).encode() + b"\n")

    from effect_ledger.ops.assess_ledger import assess_ledger, is_ledger_file

    if topics:
        log = f"{prefix or 'effects.'}* topics"
    assert log is not None
    ledger = topics or fmt == "ledger" or (fmt is None and log != "-" and is_ledger_file(log))
    if ledger and redact_file is not None:
        for o in outputs:
            o.abort()
        fail("--redact reads a JSON-lines log, not a ledger file")
    try:
        pipe_hint = "not a regular file (give - to read a pipe)"
        if topics:
            result = assess_ledger(_replayed(bootstrap, prefix), writes=named, window_s=window_s)
        elif ledger:
            open_regular(log, pipe_hint).close()  # the same refusals as a log (a FIFO, a device)
            result = assess_ledger(log, writes=named, window_s=window_s)
        else:
            fp: BinaryIO = sys.stdin.buffer if log == "-" else open_regular(log, pipe_hint)
            with fp:
                lines = read_lines(fp, progress=_progress(fp, log))
                # two cores or more: parse in a child while this process folds (identical results)
                two = (os.cpu_count() or 1) > 1
                result = assess(lines, fmt=fmt, paths=paths, writes=named, window_s=window_s, redact_to=redact_to,
                                parallel=two)  # fmt: skip
        if result.format is None:  # an empty file, random bytes: no verdict on nothing
            fail(f"no record of any known format in {log}")
        _check_writes(named, result.assessor.tools)
        report = result.as_dict(costs, show_values=show_values)
        if html_file is not None:
            a = result.assessor
            delays = [v for d in a.delays.values() for v in d.values]
            durations = [v for d in a.ok_durations.values() for v in d.values]
            page = html_report(report, list(a.windows.values), delays, durations, os.path.basename(log))
            html_file.fp.write(page.encode())
        committed: list[NewFile] = []
        try:
            for o in outputs:
                o.commit()
                committed.append(o)
        except BaseException:  # all outputs or none: those already in place go again
            for o in committed:
                o.uncommit()
            raise
    except OSError as e:
        for o in outputs:
            o.abort()
        fail(f"cannot read {log}: {e.strerror or e}")
    except AssessError as e:  # more than MAX_LOG_BYTES, an output that appeared meanwhile
        for o in outputs:
            o.abort()
        fail(f"{log}: {e}")
    except BaseException:  # a broker that failed mid-replay, Ctrl-C: no half-written output stays
        for o in outputs:
            o.abort()
        raise
    if as_json:
        click.echo(json.dumps(report, indent=2))
        return
    _print(report)


def _same_path(a: str, b: str) -> bool:
    """Whether two output paths name one file (``r.html``, ``./r.html``, through a symlinked folder)."""

    def norm(p: str) -> str:
        return os.path.join(os.path.realpath(os.path.dirname(os.path.abspath(p))), os.path.basename(p))

    return norm(a) == norm(b)


#: The tools named at most in the ``--writes`` warning (a log may have thousands of HTTP routes).
_TOOLS_SHOWN = 20


def _check_writes(named: list[str], tools: Any) -> None:
    """``--writes`` names the log never calls: a warning line on stderr naming the tools it does call;
    when none of them is in the log, exit 1 (a verdict on zero writes would be confidently wrong)."""
    if not named:
        return
    missing = [t for t in named if t not in tools]
    if not missing:
        return
    seen = sorted(tools)
    listed = ", ".join(seen[:_TOOLS_SHOWN]) + (
        f" and {len(seen) - _TOOLS_SHOWN} more" if len(seen) > _TOOLS_SHOWN else ""
    )
    text = f"--writes {','.join(missing)}: no such tool in the log (tools seen: {listed or 'none'})"
    if len(missing) == len(named):
        fail(text)
    click.echo(f"effects: warning: {text}", err=True)


def _replayed(bootstrap: str | None, prefix: str | None) -> Any:
    """Every event of the ledger's topics (a broker that does not answer: one line, exit 1)."""
    from effect_ledger.cli._shared import kafka_config, ready
    from effect_ledger.errors import LedgerError
    from effect_ledger.ops.sources import SourceError, replay_events

    try:
        yield from replay_events(ready(kafka_config(bootstrap, prefix), 10.0), None)
    except (LedgerError, SourceError) as e:
        fail(str(e))


def _progress(fp: BinaryIO, log: str) -> Any:
    """Bytes read, on stderr once a second when it is a terminal (a file's size gives a share)."""
    if not sys.stderr.isatty():
        return None
    size = os.fstat(fp.fileno()).st_size if log != "-" else 0
    last = [time.monotonic()]
    t0 = last[0]

    def show(done: int) -> None:
        now = time.monotonic()
        if now - last[0] < 1.0:
            return
        last[0] = now
        rate = done / max(now - t0, 1e-9) / 1e6
        share = f" {done / size:.0%}" if size else ""
        click.echo(f"\r{done / 1e6:,.0f} MB{share}, {rate:,.0f} MB/s ", err=True, nl=False)

    return show


def _print(report: dict[str, Any]) -> None:
    from rich.table import Table

    from effect_ledger.cli._shared import out, print_table
    from effect_ledger.ops.assess_report import cell

    table = Table("#", "item", "measured (num/den)", "criterion", "verdict", "needs")
    for i, r in enumerate(report["rows"], 1):
        need = "schema" if r["needs"] == "schema" else "code/config"
        table.add_row(str(i), r["item"], cell(r), r["criterion"], r["verdict"], need)
    print_table(table)
    ar = report["arithmetic"]

    def f(v: Any) -> str:
        return "-" if v is None else (f"{v:,.1f}" if isinstance(v, float) else f"{v:,}")

    out.print(
        f"writes {f(ar['writes'])} over {f(ar['log_days'])} days = {f(ar['writes_per_month'])}/month; "
        f"in the window {f(ar['in_window'])} ({ar['share_in_window']:.2%}); semantic duplicates "
        f"{f(ar['semantic_duplicates'])}; duplicates/month {f(ar['duplicates_per_month'])}"
    )
    out.print(
        f"each: {f(ar['cost_per_duplicate'])} + {f(ar['minutes_per_duplicate'])} min at {f(ar['hourly_cost'])}/h "
        f"= {f(ar['cost_each'])}; monthly {f(ar['monthly_cost'])}; yearly {f(ar['yearly_cost'])}; "
        f"work {f(ar['fix_hours'])} h = {f(ar['work_cost'])}"
    )
    out.print(ar["verdict"])
    tools = Table("tool", "calls", "writes", "keyed", "unknown", "retries", "early", "duplicates", "stuck")
    for t in report["tools"]:
        tools.add_row(t["tool"], *(f(t[k]) for k in ("calls", "writes", "keyed", "unknown", "retries",
                                                       "early_retries", "duplicates", "stuck")))  # fmt: skip
    print_table(tools)
    bad = report["bad_lines"]
    reasons = ", ".join(f"{why}: {n}" for why, n in bad["by_reason"].items())
    why = f" ({reasons})" if bad["count"] else ""
    out.print(
        f"format {report['format']}; {report['lines']:,} lines, {bad['count']} bad{why}; "
        f"{report['records_not_tool_calls']:,} records not tool calls"
    )

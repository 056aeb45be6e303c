"""``effects assess LOG``: count a call log's external writes, how many carried an idempotency key,
and the likely duplicates a ledger would have caught (see ``effect_ledger.ops.assess``)."""

from __future__ import annotations

import json
import sys
from typing import BinaryIO

import click

from effect_ledger._files import open_regular
from effect_ledger.cli._shared import fail


@click.command("assess")
@click.argument("log", metavar="LOG")
@click.option("--field", "fields", multiple=True, metavar="NAME=PATH", help="where a field is (dotted path)")
@click.option("--writes", multiple=True, metavar="TOOL,...", help="the write tools [every tool call]")
@click.option("--window", default="10m", show_default=True, help="same arguments within this long: a duplicate")
@click.option("--json", "as_json", is_flag=True, help="JSON output")
def assess_command(log: str, fields: tuple[str, ...], writes: tuple[str, ...], window: str, as_json: bool) -> None:
    """Assess a JSON-lines log of tool calls or HTTP requests (LOG, or - for stdin)."""
    from effect_ledger.core.timeparse import TimeSpecError, duration_ms
    from effect_ledger.ops.assess import AssessError, assess, field_paths, read_lines

    try:
        window_s = duration_ms(window) / 1000
        paths = field_paths(fields)
    except (TimeSpecError, AssessError) as e:
        fail(str(e))
    named = [t for spec in writes for t in spec.split(",") if t]
    try:
        pipe_hint = "not a regular file (give - to read a pipe)"
        fp: BinaryIO = sys.stdin.buffer if log == "-" else open_regular(log, pipe_hint)
        with fp:
            report = assess(read_lines(fp), paths=paths, writes=named, window_s=window_s)
    except OSError as e:
        fail(f"cannot read {log}: {e.strerror or e}")
    except AssessError as e:  # more than MAX_LOG_BYTES
        fail(f"{log}: {e}")
    if as_json:
        click.echo(json.dumps(report.as_dict(), indent=2))
        return
    _print(report, window)


def _print(report: object, window: str) -> None:
    from rich.table import Table

    from effect_ledger.cli._shared import out, print_table
    from effect_ledger.ops.assess import Report, ToolStats

    assert isinstance(report, Report)
    table = Table("tool", "calls", "writes", "keyed", "same key", "same args", "ledger would catch")
    for col in table.columns[1:]:
        col.justify = "right"

    def row(s: ToolStats, bold: bool = False) -> None:
        share = "-" if s.keyed_share is None else f"{s.keyed} ({s.keyed_share:.0%})"
        cells = [s.tool, str(s.calls), str(s.writes), share, str(s.dup_same_key), str(s.dup_same_args)]
        table.add_row(*cells, str(s.ledger_would_catch), style="bold" if bold else None)

    for s in sorted(report.tools.values(), key=lambda s: (-s.writes, s.tool)):
        row(s)
    table.add_section()
    row(report.total(), bold=True)
    print_table(table)  # a file or a pipe: one line per row, no 80-column wrapping
    bad = sum(report.bad.values())
    reasons = ", ".join(f"{why}: {n}" for why, n in report.bad.most_common())
    out.print(f"{report.lines} lines, {bad} bad{f' ({reasons})' if bad else ''}; duplicate window {window}")
    if report.all_tools_are_writes:
        out.print("every tool call counted as a write (name the write tools with --writes)")
    if report.untimed_writes:
        out.print(f"{report.untimed_writes} writes had no readable time: never counted as same-arguments duplicates")

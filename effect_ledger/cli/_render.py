"""How the operator commands print their results for people: one function per result, tables
from ``cli_shared.table`` (effect ids whole), ``wide`` for one line per row. ``--json`` output is
built beside each command, from the same objects."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from effect_ledger.cli._shared import out, print_table, table
from effect_ledger.core.model import EffectState
from effect_ledger.core.timeparse import iso

SHOWN_KEYS = 10  # failing keys printed per failed check; --json holds up to 1,000 and the count


def audit_report(report: Any, wide: bool = False, link: Callable[[str], str] | None = None) -> None:
    """``effects audit``: the checks, their details, each failed check's keys with their console
    links, the per-target rows and the notes."""
    t = table(
        f"audit {iso(report.from_ms)} .. {iso(report.to_ms)}: {report.events:,} events",
        "check",
        "numerator",
        "denominator",
        "ratio",
        "criterion",
        "result",
        right=("numerator", "denominator", "ratio"),
    )
    for c in report.checks:
        result = "[green]pass[/]" if c.passed else "[red]FAIL[/]"
        t.add_row(c.name, f"{c.numerator:,}", f"{c.denominator:,}", c.ratio, c.criterion, result)
    print_table(t, wide)
    for c in report.checks:
        if c.detail:
            out.print(f"{c.name}: {c.detail}")
    for c in report.checks:
        if c.passed or not c.keys:
            continue
        shown = c.keys[:SHOWN_KEYS]
        more = f", the first {len(shown)} here (up to 1,000 in --json)" if c.failing > len(shown) else ""
        out.print(f"[red]FAIL[/] {c.name}: {c.failing:,} failing{more}:")
        for k in shown:
            # Whole keys, one a line, each with its console page: pasted into `effects trace` or a browser.
            out.print(f"  {k}  {link(k) if link else ''}".rstrip(), soft_wrap=True)
    cols = ("target", "effects", "keyed", "uncertain", "resolved", "duplicates", "stuck", "window p99 ms")
    tt = table("per target", *cols, right=cols[1:])
    for r in report.targets:
        tt.add_row(
            r.target,
            f"{r.effects:,}",
            f"{r.keyed:,}/{r.attempts:,}",
            f"{r.uncertain:,}",
            f"{r.resolved:,}",
            f"{r.duplicates:,}",
            f"{r.stuck:,}",
            "-" if r.window_p99_ms is None else f"{r.window_p99_ms:.0f}",
        )
    print_table(tt, wide)
    if report.continuing:
        out.print(
            f"[dim]{report.continuing:,} effects began before the window and are left out (but for their duplicates)[/]"
        )


def trace(t: Any, wide: bool = False) -> None:
    """``effects trace``: the timeline, the state and the windows."""
    e = t.effect
    # Times are the log's (when it took each event); a writer whose clock disagrees with the log's by
    # a second or more shows by how much (its claimed time is data: it decides nothing).
    tt = table(f"effect {t.key}", "time (UTC)", "+s", "event", "source", "state after", "writer's clock")
    t0 = t.lines[0].at_ms if t.lines else 0
    for ln in t.lines:
        skew = f"{ln.skew_ms / 1000:+.1f} s" if abs(ln.skew_ms) >= 1000 else ""
        tt.add_row(iso(ln.at_ms), f"{(ln.at_ms - t0) / 1000:.3f}", ln.event, ln.source, ln.state_after, skew)
    print_table(tt, wide)
    out.print(
        f"state: [bold]{e.state.value}[/]{' (' + e.reason + ')' if e.reason else ''}; attempt {e.attempt}; "
        f"flags: {', '.join(f.value for f in e.flags) or 'none'}"
    )
    windows = ", ".join(f"{w} ms" for w in t.sent_unrecorded_ms) or "no execution recorded"
    inter = "-" if t.intermediate_ms is None else f"{t.intermediate_ms / 1000:.1f} s"
    out.print(f"sent-but-unrecorded window: {windows}; time in an intermediate state: {inter}")


def stuck_rows(rows: list[Any], older_than: str, wide: bool = False) -> None:
    """``effects stuck``: one row per stuck effect, its id whole."""
    if not rows:
        out.print(f"no effect stuck for longer than {older_than}")
        return
    t = table(
        f"{len(rows)} effects stuck for longer than {older_than}",
        "effect",
        "state",
        "target",
        "operation",
        "attempt",
        "since (UTC)",
        "reason",
    )
    for r in rows:
        t.add_row(r.effect_id, r.state, r.target, r.operation, str(r.attempt), iso(r.created_ms), r.reason or "")
    print_table(t, wide)


def escalations(items: list[Any], wide: bool = False) -> None:
    """``effects escalations``: the queue with its evidence, ids whole."""
    if not items:
        out.print("the escalation queue is empty")
        return
    t = table(
        f"{len(items)} escalated effects",
        "effect",
        "target",
        "operation",
        "attempts",
        "since (UTC)",
        "why",
        "reconciler answers",
    )
    for it in items:
        r = it.row
        t.add_row(
            r.effect_id, r.target, r.operation, str(it.attempts), iso(r.created_ms), r.reason or "",
            "\n".join(it.answers) or "-",
        )  # fmt: skip
    print_table(t, wide)


def state_line(st: EffectState) -> str:
    """``effects tail``: one line per state change, the effect id whole."""
    reason = f" {st.reason}" if st.reason else ""
    return f"{iso(st.updated_ms)} {st.state.value:<11} {st.target:<12} {st.effect_id} v{st.version}{reason}"

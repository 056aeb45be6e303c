"""Inline SVG drawings for the console: a stacked bar chart of effects per state over a window, and
one effect's timeline with its sent-but-unrecorded windows. Plain strings, escaped: no library."""

from __future__ import annotations

from html import escape

from effect_ledger.console.source import Chart
from effect_ledger.core.model import Executed, State
from effect_ledger.core.timeparse import iso
from effect_ledger.ops.views import Trace

# One colour per state, defined once here and in console.css (.st-NAME).
COLOURS = {
    State.PENDING: "#d9a400",
    State.EXECUTED: "#4a90d9",
    State.CONFIRMED: "#3b9c4b",
    State.FAILED: "#8c8c8c",
    State.UNCERTAIN: "#e06c00",
    State.ABSENT: "#9b7bd4",
    State.ESCALATED: "#d7263d",
    State.ABANDONED: "#5c5c5c",
    State.COMPENSATED: "#2bb3b1",
}


def state_chart(chart: Chart, width: int = 900, height: int = 220) -> str:
    """Stacked bars: effects begun in each slice of the window, coloured by their current state."""
    top = max((sum(b.values()) for b in chart.buckets), default=0) or 1
    n = len(chart.buckets)
    plot_h, left, bottom = height - 40, 40, 20
    bar_w = (width - left) / n
    parts = [
        f'<svg class="chart" role="img" aria-label="effects per state over time" viewBox="0 0 {width} {height}" '
        f'width="{width}" height="{height}">',
        f'<text x="0" y="12" class="axis">{top}</text><text x="0" y="{plot_h + 10}" class="axis">0</text>',
    ]
    for i, bucket in enumerate(chart.buckets):
        y: float = plot_h + 10
        for st in State:
            count = bucket.get(st.value, 0)
            if not count:
                continue
            h = count * plot_h / top
            y -= h
            parts.append(
                f'<rect x="{left + i * bar_w:.1f}" y="{y:.1f}" width="{bar_w - 2:.1f}" height="{h:.1f}" '
                f'fill="{COLOURS[st]}"><title>{escape(st.value)}: {count}</title></rect>'
            )
    parts.append(f'<text x="{left}" y="{height - bottom + 16}" class="axis">{iso(chart.from_ms)}</text>')
    parts.append(
        f'<text x="{width}" y="{height - bottom + 16}" class="axis" text-anchor="end">{iso(chart.to_ms)}</text>'
    )
    parts.append("</svg>")
    return "".join(parts)


def legend() -> str:
    return "".join(
        f'<span class="legend"><i style="background:{c}"></i>{escape(s.value)}</span>' for s, c in COLOURS.items()
    )


def timeline(t: Trace, width: int = 900) -> str:
    """Every event as a numbered tick on one time axis, with the time spent in an intermediate state
    as a bar; below it, each execution on its own scale: the call (blue) and its sent-but-unrecorded
    window (red: the call had ended, nothing was durable yet)."""
    if not t.lines:
        return ""
    t0, t1 = t.lines[0].at_ms, t.lines[-1].at_ms
    span = max(1, t1 - t0)
    left, right = 10, width - 10
    execs = [e for e in (t.effect.facts if t.effect else ()) if isinstance(e, Executed)]
    height = 96 + 30 * len(execs)

    def x(ms: int) -> float:
        return left + (min(max(ms, t0), t1) - t0) * (right - left) / span

    parts = [
        f'<svg class="timeline" role="img" aria-label="timeline" viewBox="0 0 {width} {height}" width="{width}" '
        f'height="{height}">',
        f'<line x1="{left}" y1="44" x2="{right}" y2="44" class="axis-line"/>',
    ]
    if t.intermediate_ms is not None:
        end = t0 + t.intermediate_ms
        parts.append(
            f'<rect x="{x(t0):.1f}" y="52" width="{max(3.0, x(end) - x(t0)):.1f}" height="8" class="intermediate">'
            f"<title>in an intermediate state: {t.intermediate_ms} ms</title></rect>"
        )
    for i, ln in enumerate(t.lines):
        parts.append(
            f'<line x1="{x(ln.at_ms):.1f}" y1="36" x2="{x(ln.at_ms):.1f}" y2="52" class="tick"/>'
            f'<text x="{x(ln.at_ms):.1f}" y="{30 - 10 * (i % 3)}" class="axis" text-anchor="middle">{i + 1}</text>'
        )
    parts.append(
        f'<text x="{left}" y="76" class="axis">{iso(t0)}</text>'
        f'<text x="{right}" y="76" class="axis" text-anchor="end">+{(t1 - t0) / 1000:.3f} s</text>'
    )
    bar_left, bar_w = 230, right - 230
    for n, e in enumerate(execs):
        y = 92 + 30 * n
        call = max(0, e.call_ended_ms - e.call_started_ms)
        gap = max(0, e.at_ms - e.call_ended_ms)
        whole = max(1, call + gap)
        cw, gw = call * bar_w / whole, max(3.0, gap * bar_w / whole)
        parts.append(
            f'<text x="{left}" y="{y + 10}" class="axis">attempt {e.attempt}: call {call} ms, unrecorded {gap} ms'
            f'</text><rect x="{bar_left}" y="{y}" width="{cw:.1f}" height="12" class="call">'
            f"<title>call: {call} ms</title></rect>"
            f'<rect x="{bar_left + cw:.1f}" y="{y}" width="{gw:.1f}" height="12" class="unrecorded">'
            f"<title>sent but unrecorded: {gap} ms</title></rect>"
        )
    parts.append("</svg>")
    return "".join(parts)

"""The console's HTML: one layout and one function per page, every value escaped."""

from __future__ import annotations

from html import escape
from urllib.parse import quote, urlencode

from effect_ledger.console import svg
from effect_ledger.console.query import DEFAULT_FROM, DEFAULT_STUCK, DEFAULT_TO, Query
from effect_ledger.console.source import MAX_ROWS, Chart, EffectsPage
from effect_ledger.core.model import UNSETTLED_STATES, DecisionKind, State
from effect_ledger.core.timeparse import iso
from effect_ledger.ops.audit import AuditReport
from effect_ledger.ops.views import Escalation, Row, Trace

NAV = (("/", "effects"), ("/stuck", "stuck & escalations"), ("/audit", "audit"))


def layout(title: str, body: str, *, source: str, writable: bool, error: str | None = None) -> str:
    nav = "".join(f'<a href="{href}">{escape(label)}</a>' for href, label in NAV)
    mode = "decisions need credentials" if writable else "read-only"
    err = f'<p class="error" id="error">{escape(error)}</p>' if error else ""
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        f"<title>{escape(title)} · effect-ledger</title>"
        '<link rel="stylesheet" href="/static/console.css"><script src="/static/console.js" defer></script>'
        f'</head><body><header><b>effect-ledger</b> {nav}<span class="src">{escape(source)} · {mode}</span>'
        f"</header><main><h1>{escape(title)}</h1>{err}{body}</main></body></html>"
    )


def _field(name: str, label: str, value: str, hint: str = "") -> str:
    return (
        f'<label>{escape(label)} <input name="{name}" id="f-{name}" value="{escape(value)}" '
        f'placeholder="{escape(hint)}"></label>'
    )


def window_form(action: str, q: Query | None, params: dict[str, str], *, filters: bool, window: bool = True) -> str:
    """The window (and filter) form; on a bad request it keeps what the person typed. The stuck
    page has no window (``window=False``): only how long counts as stuck."""
    get = params.get
    parts = [f'<form class="filters" method="get" action="{action}">']
    if window:
        parts.append(_field("from", "from", get("from", q.from_text if q else DEFAULT_FROM), "-1h, ISO time, epoch ms"))
        parts.append(_field("to", "to", get("to", q.to_text if q else DEFAULT_TO), "now"))
    if filters:
        chosen = set(q.states) if q else {s.strip().upper() for s in get("state", "").split(",")}
        parts.append('<fieldset class="states">')
        for st in State:
            on = " checked" if st.value in chosen else ""
            parts.append(
                f'<label class="st st-{st.value}"><input type="checkbox" name="state" value="{st.value}"{on}>'
                f"{st.value}</label>"
            )
        parts.append("</fieldset>")
        parts.append(_field("target", "target", get("target", ",".join(q.targets) if q else ""), "any"))
    else:
        parts.append(_field("older_than", "stuck after", get("older_than", q.stuck_text if q else DEFAULT_STUCK)))
    parts.append('<button type="submit" id="apply">apply</button></form>')
    return "".join(parts)


def _counts(title: str, counts: dict[str, int], param: str, q: Query) -> str:
    cls = "st st-{}" if param == "state" else "tgt"
    items = "".join(
        f'<li><a href="/?{urlencode({"from": q.from_text, "to": q.to_text, param: k})}">'
        f'<span class="{cls.format(escape(k))}">{escape(k)}</span></a> <b>{n:,}</b></li>'
        for k, n in sorted(counts.items())
    )
    return f'<div class="counts" id="counts-{param}"><h3>{escape(title)}</h3><ul>{items or "<li>none</li>"}</ul></div>'


def _trace_link(key: str) -> str:
    return f'<a class="key" href="/trace/{quote(key, safe="")}">{escape(key)}</a>'


def _rows_table(rows: list[Row], table_id: str, stuck_ms: int | None = None, now_ms: int = 0) -> str:
    head = "".join(
        f"<th>{c}</th>" for c in ("effect", "state", "target", "operation", "attempt", "began", "updated", "reason")
    )
    body = []
    for r in rows:
        late = stuck_ms is not None and now_ms - r.created_ms > stuck_ms
        cls = ' class="stuck"' if late and r.state in UNSETTLED_STATES else ""
        body.append(
            f'<tr{cls}><td>{_trace_link(r.effect_id)}</td><td><span class="st st-{escape(r.state)}">'
            f"{escape(r.state)}</span></td><td>{escape(r.target)}</td><td>{escape(r.operation)}</td>"
            f"<td>{r.attempt}</td><td>{iso(r.created_ms)}</td><td>{iso(r.updated_ms)}</td>"
            f"<td>{escape(r.reason or '')}</td></tr>"
        )
    return f'<table id="{table_id}"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>'


def effects_page(q: Query, page: EffectsPage, now_ms: int, params: dict[str, str]) -> str:
    shown = f"{len(page.rows):,} of {page.matched:,} matching" + (
        f" (the newest {MAX_ROWS})" if page.matched > MAX_ROWS else ""
    )
    return (
        window_form("/", q, params, filters=True)
        + f'<div class="row">{_counts("per state (window)", page.by_state, "state", q)}'
        + f"{_counts('per target (window)', page.by_target, 'target', q)}</div>"
        + f'<p id="shown">{shown}; effects begun from {iso(q.from_ms)} to {iso(q.to_ms)}; '
        + f"rows stuck over {escape(q.stuck_text)} are highlighted.</p>"
        + _rows_table(page.rows, "effects", q.stuck_ms, now_ms)
    )


def resolve_form(key: str, *, users: bool) -> str:
    options = "".join(f'<option value="{k.value}">{k.value}</option>' for k in DecisionKind)
    who = "user (basic auth) or your name (token)" if users else "your name"
    return (
        f'<form class="resolve" method="post" action="/resolve"><input type="hidden" name="key" '
        f'value="{escape(key)}"><select name="decision">{options}</select>'
        '<input name="receipt_id" placeholder="receipt id (with CONFIRMED)">'
        '<input name="reason" placeholder="reason" required>'
        f'<input name="user" placeholder="{escape(who)}" autocomplete="username">'
        '<input name="secret" type="password" placeholder="token or password" autocomplete="current-password">'
        '<button type="submit">decide</button></form>'
    )


def stuck_page(
    q: Query, rows: list[Row], queue: list[Escalation], now_ms: int, params: dict[str, str], *, users: bool
) -> str:
    items = []
    for it in queue:
        r = it.row
        answers = "".join(f"<li>{escape(a)}</li>" for a in it.answers) or "<li>none</li>"
        items.append(
            f'<div class="escalation" data-key="{escape(r.effect_id)}"><p>{_trace_link(r.effect_id)} '
            f"{escape(r.target)} {escape(r.operation)} · {it.attempts} attempt(s) · since {iso(r.created_ms)} · "
            f'{escape(r.reason or "")}</p><ul class="answers">{answers}</ul>{resolve_form(r.effect_id, users=users)}'
            "</div>"
        )
    return (
        window_form("/stuck", q, params, filters=False, window=False)
        + f"<h2>{len(rows)} stuck for longer than {escape(q.stuck_text)}</h2>"
        + _rows_table(rows, "stuck", q.stuck_ms, now_ms)
        + f'<h2 id="queue">escalation queue: {len(queue)}</h2>'
        + ("".join(items) or "<p>the escalation queue is empty</p>")
    )


def trace_page(t: Trace) -> str:
    e = t.effect
    assert e is not None
    rows = "".join(
        f"<tr><td>{i}</td><td>{iso(ln.at_ms)}</td><td>{(ln.at_ms - t.lines[0].at_ms) / 1000:.3f}</td>"
        f"<td>{escape(ln.event)}</td><td>{escape(ln.source)}</td>"
        f'<td><span class="st st-{escape(ln.state_after)}">{escape(ln.state_after)}</span></td></tr>'
        for i, ln in enumerate(t.lines, 1)
    )
    windows = ", ".join(f"{w} ms" for w in t.sent_unrecorded_ms) or "no execution recorded"
    inter = "-" if t.intermediate_ms is None else f"{t.intermediate_ms / 1000:.3f} s"
    flags = ", ".join(f.value for f in e.flags) or "none"
    return (
        f'<p id="state">state <span class="st st-{e.state.value}">{e.state.value}</span>'
        f"{' (' + escape(e.reason) + ')' if e.reason else ''}; attempt {e.attempt}; flags: {escape(flags)}</p>"
        f'<p id="windows">sent-but-unrecorded window: <b class="unrecorded-text">{windows}</b>; '
        f"time in an intermediate state: {inter}</p>"
        f"{svg.timeline(t)}"
        '<p class="legend-line"><span class="legend"><i class="intermediate"></i>intermediate</span>'
        '<span class="legend"><i class="call"></i>call</span>'
        '<span class="legend"><i class="unrecorded"></i>sent but unrecorded</span></p>'
        '<table id="timeline"><thead><tr><th>#</th><th>time (UTC)</th><th>+s</th><th>event</th><th>source</th>'
        f"<th>state after</th></tr></thead><tbody>{rows}</tbody></table>"
    )


def audit_page(q: Query, report: AuditReport, chart: Chart, params: dict[str, str]) -> str:
    checks = "".join(
        f'<tr class="{"pass" if c.passed else "fail"}"><td>{escape(c.name)}</td><td>{c.numerator:,}</td>'
        f"<td>{c.denominator:,}</td><td>{c.ratio}</td><td>{escape(c.criterion)}</td>"
        f"<td>{'pass' if c.passed else 'FAIL'}</td><td>{escape(c.detail)}</td></tr>"
        for c in report.checks
    )
    dups = ", ".join(_trace_link(k) for k in report.duplicate_keys[:20]) or "none"
    return (
        window_form("/audit", q, params, filters=False)
        + f"<p>{report.events:,} events; {report.continuing:,} effects began before the window</p>"
        + '<table id="checks"><thead><tr><th>check</th><th>numerator</th><th>denominator</th><th>ratio</th>'
        + f"<th>criterion</th><th>result</th><th>detail</th></tr></thead><tbody>{checks}</tbody></table>"
        + f'<p id="duplicates">duplicates: {dups}</p>'
        + f"<h2>effects per state over the window</h2>{svg.state_chart(chart)}<p>{svg.legend()}</p>"
    )


def decided_page(key: str, line: str) -> str:
    return f'<p id="decided">{_trace_link(key)}: {escape(line)}</p>'

"""The console's HTML: one layout and one function per page, every value escaped."""

from __future__ import annotations

import json
from html import escape
from typing import Any
from urllib.parse import quote, urlencode

from effect_ledger.console import svg
from effect_ledger.console.query import DEFAULT_FROM, DEFAULT_STUCK, DEFAULT_TO, MAX_SEARCH_CHARS, Query, Searchable
from effect_ledger.console.source import MAX_ROWS, MAX_SIBLINGS, Chart, EffectsPage, EffectView
from effect_ledger.core.bodies import REDACTED, WITHHELD
from effect_ledger.core.model import (
    UNSETTLED_STATES,
    Decision,
    DecisionKind,
    Executed,
    Intent,
    Receipt,
    Resolution,
    State,
)
from effect_ledger.core.timeparse import iso
from effect_ledger.ops.audit import AuditReport
from effect_ledger.ops.views import Escalation, Row, Trace
from effect_ledger.sdk.erasure import is_sealed

NAV = (("/", "effects"), ("/stuck", "stuck & escalations"), ("/audit", "audit"))
HEADER_SEARCH_FROM = "-7d"  # the header's search looks a week back; the effects page sets any window
MAX_REQUEST_ROWS = 500  # leaves of a request shown on an effect's page

#: What each decision will cause, in the words shown beside its choice and on the confirmation.
DECISION_EFFECTS = {
    DecisionKind.CONFIRMED: "It happened at the destination. Records the receipt id you give as the effect's "
    "receipt: no new call is made, and the agent's next try returns this receipt.",
    DecisionKind.ABSENT: "It never happened at the destination. Allows a new call with the same key: the next "
    "time the agent runs this step it calls the destination again. Refused while an attempt may still land.",
    DecisionKind.ABANDONED: "Stop without knowing. Closes the effect: no new call is made, and the agent's next "
    "try fails with EffectClosed.",
    DecisionKind.COMPENSATED: "It happened and has been undone (a refund reversed, an order cancelled). Closes "
    "the effect: no new call is made, and the agent's next try fails with EffectClosed.",
}


def short(key: str) -> str:
    """An effect id as tables show it: the target and the first 10 characters of the hash (the full
    id is in the link's title and on the effect's page)."""
    target, sep, rest = key.rpartition(":")
    if sep and len(rest) > 12:
        return f"{target}:{rest[:10]}…"
    return key if len(key) <= 40 else key[:38] + "…"


def effect_href(key: str) -> str:
    return f"/effect/{quote(key, safe='')}"


def layout(title: str, body: str, *, source: str, writable: bool, error: str | None = None) -> str:
    nav = "".join(f'<a href="{href}">{escape(label)}</a>' for href, label in NAV)
    mode = "decisions need credentials" if writable else "read-only"
    err = f'<p class="error" id="error">{escape(error)}</p>' if error else ""
    search = (
        '<form class="search" id="header-search" role="search" method="get" action="/">'
        f'<input type="hidden" name="from" value="{HEADER_SEARCH_FROM}">'
        f'<input type="search" name="q" id="h-q" maxlength="{MAX_SEARCH_CHARS}" aria-label="search effects" '
        'placeholder="order id, run, step, id prefix"><button type="submit" id="h-search">search</button></form>'
    )
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{escape(title)} · effect-ledger</title>"
        '<link rel="stylesheet" href="/static/console.css"><script src="/static/console.js" defer></script>'
        f"</head><body><header><b>effect-ledger</b> {nav}{search}"
        f'<span class="src">{escape(source)} · {mode}</span>'
        f"</header><main><h1>{escape(title)}</h1>{err}{body}</main></body></html>"
    )


def _field(name: str, label: str, value: str, hint: str = "", extra: str = "") -> str:
    return (
        f'<label>{escape(label)} <input name="{name}" id="f-{name}" value="{escape(value)}" '
        f'placeholder="{escape(hint)}"{extra}></label>'
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
        parts.append(
            _field("q", "search", get("q", q.search_text if q else ""), "order_id:1001, run:…, step:…, key prefix",
                   f' maxlength="{MAX_SEARCH_CHARS}" class="wide"')
        )  # fmt: skip
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
    """A link to an effect's page, the id shortened, the full id in its title and copyable."""
    return (
        f'<a class="key" href="{effect_href(key)}" title="{escape(key)}" data-copy="{escape(key)}">'
        f"{escape(short(key))}</a>"
    )


def _search_href(term: str, value: str) -> str:
    quoted = f'"{value}"' if any(c.isspace() or c in "\"'" for c in value) else value
    return "/?" + urlencode({"from": HEADER_SEARCH_FROM, "q": f"{term}:{quoted}"})


def _rows_table(rows: list[Row], table_id: str, stuck_ms: int | None = None, now_ms: int = 0) -> str:
    head = "".join(
        f"<th>{c}</th>"
        for c in ("effect", "state", "target", "operation", "run", "step", "attempt", "began", "updated", "reason")
    )
    body = []
    for r in rows:
        late = stuck_ms is not None and now_ms - r.created_ms > stuck_ms
        cls = ' class="stuck"' if late and r.state in UNSETTLED_STATES else ""
        body.append(
            f'<tr{cls}><td>{_trace_link(r.effect_id)}</td><td><span class="st st-{escape(r.state)}">'
            f"{escape(r.state)}</span></td><td>{escape(r.target)}</td><td>{escape(r.operation)}</td>"
            f'<td class="clip" title="{escape(r.run_id)}">{escape(r.run_id)}</td>'
            f'<td class="clip" title="{escape(r.step)}">{escape(r.step)}</td><td>{r.attempt}</td>'
            f"<td>{iso(r.created_ms)}</td><td>{iso(r.updated_ms)}</td>"
            f"<td>{escape(r.reason or '')}</td></tr>"
        )
    return f'<table id="{table_id}"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>'


def effects_page(q: Query, page: EffectsPage, now_ms: int, params: dict[str, str], searchable: Searchable) -> str:
    shown = f"{len(page.rows):,} of {page.matched:,} matching" + (
        f" (the newest {MAX_ROWS})" if page.matched > MAX_ROWS else ""
    )
    declared = ", ".join(f"{p} ({t})" for t, ps in sorted(searchable.fields.items()) for p in ps) or "none declared"
    search = ""
    if q.search:
        search = f'<p id="searched">search <code>{escape(q.search_text)}</code>: {page.matched:,} found'
        if not page.matched:
            search += (
                f"; nothing matches in this window (from {escape(q.from_text)}: widen it?). "
                f"Searchable request fields: {escape(declared)}"
            )
        search += "</p>"
    return (
        window_form("/", q, params, filters=True)
        + search
        + f'<div class="row">{_counts("per state (window)", page.by_state, "state", q)}'
        + f"{_counts('per target (window)', page.by_target, 'target', q)}</div>"
        + f'<p id="shown">{shown}; effects begun from {iso(q.from_ms)} to {iso(q.to_ms)}; '
        + f"rows stuck over {escape(q.stuck_text)} are highlighted.</p>"
        + _rows_table(page.rows, "effects", q.stuck_ms, now_ms)
    )


def stuck_page(q: Query, rows: list[Row], queue: list[Escalation], now_ms: int, params: dict[str, str]) -> str:
    items = []
    for it in queue:
        r = it.row
        answers = "".join(f"<li>{escape(a)}</li>" for a in it.answers) or "<li>none</li>"
        items.append(
            f'<div class="escalation" data-key="{escape(r.effect_id)}"><p>{_trace_link(r.effect_id)} '
            f"{escape(r.target)} {escape(r.operation)} · run {escape(r.run_id)} · step {escape(r.step)} · "
            f"{it.attempts} attempt(s) · since {iso(r.created_ms)} · "
            f'{escape(r.reason or "")}</p><ul class="answers">{answers}</ul>'
            f'<p><a class="decide" href="{effect_href(r.effect_id)}#decide">decide on its page</a></p></div>'
        )
    return (
        window_form("/stuck", q, params, filters=False, window=False)
        + f"<h2>{len(rows)} stuck for longer than {escape(q.stuck_text)}</h2>"
        + _rows_table(rows, "stuck", q.stuck_ms, now_ms)
        + f'<h2 id="queue">escalation queue: {len(queue)}</h2>'
        + ("".join(items) or "<p>the escalation queue is empty</p>")
    )


def trace_page(t: Trace) -> str:
    """The timeline of one effect: every event in the log's order, with the windows."""
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
    return (
        f'<p id="decided">{_trace_link(key)}: {escape(line)}</p>'
        f'<p class="next"><a id="back-to-queue" href="/stuck#queue">back to the escalation queue</a> · '
        f'<a id="back-to-effect" href="{effect_href(key)}">the effect\'s page</a></p>'
    )


def _leaves(value: Any, path: str = "") -> list[tuple[str, Any]]:
    """(dotted path, value) for every scalar of a JSON value; a list's items as ``path[i]``."""
    if isinstance(value, dict) and value:
        return [leaf for k, v in value.items() for leaf in _leaves(v, f"{path}.{k}" if path else str(k))]
    if isinstance(value, list) and value:
        return [leaf for i, v in enumerate(value) for leaf in _leaves(v, f"{path}[{i}]")]
    return [(path or "(the request)", value)]


def request_section(intent: Intent | None, searchable: tuple[str, ...]) -> str:
    """The request as recorded, one row per field: redacted values marked, a withheld or sealed body
    said to be so (its content is not in the ledger, or not readable here)."""
    if intent is None:
        return '<p id="request">no intent recorded: the request is unknown</p>'
    text = intent.request
    if is_sealed(text):
        return (
            '<p id="request" class="withheld">the request is <b>sealed</b> (body = "encrypt"): '
            "encrypted under its subject's erasable key; not shown here</p>"
        )
    try:
        value = json.loads(text)
    except ValueError:
        return f'<pre id="request">{escape(text)}</pre>'
    if isinstance(value, dict) and set(value) == {WITHHELD}:
        digest = value[WITHHELD].get("sha256", "") if isinstance(value[WITHHELD], dict) else ""
        return (
            '<p id="request" class="withheld">the request is <b>withheld</b> (body = "digest"): only its '
            f"SHA-256 is recorded, <code>{escape(str(digest))}</code></p>"
        )
    leaves = _leaves(value)
    rows = []
    for path, v in leaves[:MAX_REQUEST_ROWS]:
        tag = ' <span class="tag">searchable</span>' if path in searchable else ""
        if v == REDACTED:
            shown = '<span class="redacted" title="not recorded: the target redacts this field">redacted</span>'
            rows.append(f'<tr class="redacted-row"><td>{escape(path)}</td><td>{shown}</td></tr>')
        else:
            rows.append(f"<tr><td>{escape(path)}{tag}</td><td><code>{escape(json.dumps(v))}</code></td></tr>")
    more = f"<p>{len(leaves) - MAX_REQUEST_ROWS:,} more fields not shown</p>" if len(leaves) > MAX_REQUEST_ROWS else ""
    return (
        '<table id="request"><thead><tr><th>field</th><th>value as recorded</th></tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table>{more}"
        f'<p class="small">request digest (SHA-256 of the request as given): <code>{escape(intent.request_digest)}'
        "</code></p>"
    )


def _json_block(text: str | None) -> str:
    if not text:
        return "-"
    try:
        pretty = json.dumps(json.loads(text), indent=2, sort_keys=True, ensure_ascii=False)
    except ValueError:
        pretty = text
    return f"<pre>{escape(pretty)}</pre>"


def _table(table_id: str, head: tuple[str, ...], rows: list[str], empty: str) -> str:
    if not rows:
        return f'<p id="{table_id}">{escape(empty)}</p>'
    th = "".join(f"<th>{escape(h)}</th>" for h in head)
    return f'<table id="{table_id}"><thead><tr>{th}</tr></thead><tbody>{"".join(rows)}</tbody></table>'


def effect_page(view: EffectView, searchable: Searchable, *, writable: bool, form: dict[str, str] | None = None) -> str:
    """Everything about one effect: what it was (request, run, step), what came back (receipts),
    every attempt and reconciler answer, people's decisions, the timeline, the other effects of its
    run, and the decision form."""
    t = view.trace
    e = t.effect
    assert e is not None
    intent = e.first_intent or e.intent
    facts = e.facts
    run = intent.run_id if intent else ""
    step = intent.step if intent else ""
    summary = [
        ("effect id", f'<code id="effect-id" class="copy" data-copy="{escape(t.key)}">{escape(t.key)}</code>'),
        ("state", f'<span class="st st-{e.state.value}">{e.state.value}</span> {escape(e.reason or "")}'),
        ("target", escape(intent.target if intent else "")),
        ("operation", escape(intent.operation if intent else "")),
        ("run", f'<a id="run-link" href="{_search_href("run", run)}">{escape(run)}</a>' if run else "-"),
        ("step", escape(step) or "-"),
        ("namespace", escape(intent.namespace if intent else "")),
        ("attempts", f"{e.attempt} ({e.executions} execution(s) recorded)"),
        ("began / last change", f"{iso(e.created_ms)} / {iso(e.updated_ms)}"),
        ("flags", escape(", ".join(f.value for f in e.flags)) or "none"),
    ]
    dl = "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in summary)

    # Every way a receipt was recorded: the call's or a webhook's, a reconciler that found it, a person.
    receipts = []
    for f in facts:
        if isinstance(f, Receipt):
            got: tuple[str, str, str | None] | None = (f.receipt_id, f.source.value, f.value)
        elif isinstance(f, Resolution) and f.receipt_id:
            got = (f.receipt_id, f"reconciler {f.reconciler}", f.value)
        elif isinstance(f, Decision) and f.decision is DecisionKind.CONFIRMED and f.receipt_id:
            got = (f.receipt_id, f"person {f.by}", None)
        else:
            got = None
        if got:
            receipts.append(
                f"<tr><td>{escape(got[0])}</td><td>{escape(got[1])}</td><td>{f.attempt}</td>"
                f"<td>{iso(f.at_ms)}</td><td>{_json_block(got[2])}</td></tr>"
            )
    execs = {x.attempt: x for x in facts if isinstance(x, Executed)}
    attempts = []
    for i in (f for f in facts if isinstance(f, Intent)):
        x = execs.get(i.attempt)
        outcome, call, gap = "no outcome recorded", "-", "-"
        if x is not None:
            outcome = x.outcome.value + (f": {x.error}" if x.error else "")
            call = f"{max(0, x.call_ended_ms - x.call_started_ms)} ms"
            gap = f"{max(0, x.at_ms - x.call_ended_ms)} ms"
        attempts.append(
            f"<tr><td>{i.attempt}</td><td>{iso(i.at_ms)}</td><td>{escape(i.worker)}</td><td>{iso(i.deadline_ms)}</td>"
            f"<td>{'yes' if i.keyed else 'no'}</td><td>{escape(outcome)}</td><td>{call}</td><td>{gap}</td></tr>"
        )
    answers = [
        f"<tr><td>{iso(r.at_ms)}</td><td>{r.attempt}</td><td>{escape(r.reconciler)}</td>"
        f"<td><b>{escape(r.verdict.value)}</b></td><td>{r.tries}</td><td>{escape(r.reason)}</td>"
        f"<td>{escape(r.receipt_id or '')}</td></tr>"
        for r in facts
        if isinstance(r, Resolution)
    ]
    decisions = [
        f"<tr><td>{iso(d.at_ms)}</td><td><b>{escape(d.decision.value)}</b></td><td>{escape(d.by)}</td>"
        f"<td>{escape(d.reason)}</td><td>{escape(d.receipt_id or '')}</td></tr>"
        for d in facts
        if isinstance(d, Decision)
    ]
    more = f"<p>only the first {MAX_SIBLINGS} are listed</p>" if view.more_siblings else ""
    siblings = _rows_table(view.siblings, "same-run") if view.siblings else '<p id="same-run">no other effect</p>'
    fields = searchable.fields.get(intent.target, ()) if intent else ()
    return (
        f'<dl id="summary">{dl}</dl>'
        f"<h2>request</h2>{request_section(intent, fields)}"
        "<h2>receipt</h2>"
        + _table("receipts", ("receipt id", "from", "attempt", "at", "content"), receipts, "no receipt recorded")
        + "<h2>attempts</h2>"
        + _table(
            "attempts",
            ("attempt", "intent at", "worker", "deadline", "keyed", "outcome", "call", "unrecorded"),
            attempts,
            "no attempt recorded",
        )
        + "<h2>reconciler answers</h2>"
        + _table(
            "answers",
            ("at", "attempt", "reconciler", "verdict", "tries", "reason", "receipt id"),
            answers,
            "no reconciler was asked",
        )
        + "<h2>decisions by people</h2>"
        + _table("decisions", ("at", "decision", "by", "reason", "receipt id"), decisions, "no decision recorded")
        + decide_form(t.key, e.state, writable=writable, form=form or {})
        + f"<h2>timeline</h2>{trace_page(t)}"
        + f"<h2>other effects of run {escape(run)}</h2>{siblings}{more}"
    )


def decide_form(key: str, state: State, *, writable: bool, form: dict[str, str]) -> str:
    """The decision's first step: no choice made in advance, each choice with what it will cause.
    It posts to ``/confirm``, which writes nothing and asks for the confirmation."""
    if not writable:
        return (
            '<h2 id="decide">decide</h2><p>this console is read-only (started without --token or '
            "--basic-auth-file): record a decision with <code>effects resolve</code></p>"
        )
    chosen = form.get("decision", "").upper()
    choices = "".join(
        f'<label class="choice"><input type="radio" name="decision" value="{k.value}" id="d-{k.value}"'
        f"{' checked' if chosen == k.value else ''}><b>{k.value}</b> <span>{escape(text)}</span></label>"
        for k, text in DECISION_EFFECTS.items()
    )
    note = (
        ""
        if state in UNSETTLED_STATES
        else f"<p>this effect is {state.value}: the ledger refuses a decision that does not apply to it.</p>"
    )
    return (
        f'<h2 id="decide">decide</h2>{note}<form class="decide" method="post" action="/confirm">'
        f'<input type="hidden" name="key" value="{escape(key)}"><fieldset><legend>what happened?</legend>'
        f"{choices}</fieldset>"
        f'<label>receipt id (with CONFIRMED) <input name="receipt_id" id="d-receipt" '
        f'value="{escape(form.get("receipt_id", ""))}"></label>'
        f'<label>reason <input name="reason" id="d-reason" class="wide" value="{escape(form.get("reason", ""))}">'
        '</label><button type="submit" id="d-next">review the decision</button>'
        '<p class="small">nothing is recorded yet: the next page shows what will happen and asks you to '
        "confirm</p></form>"
    )


def confirm_page(view: EffectView, kind: DecisionKind, fields: dict[str, str], *, users: bool) -> str:
    """The decision's second step: a summary and the button that records it (``/resolve``)."""
    e = view.trace.effect
    assert e is not None
    key = view.trace.key
    intent = e.first_intent or e.intent
    what = f"{intent.target} {intent.operation}, run {intent.run_id}, step {intent.step}" if intent else key
    who = "user (basic auth) or your name (with the token)" if users else "your name"
    hidden = (
        "".join(
            f'<input type="hidden" name="{n}" value="{escape(fields.get(n, ""))}">'
            for n in ("key", "reason", "receipt_id")
        )
        + f'<input type="hidden" name="decision" value="{kind.value}">'
    )
    receipt = (
        f"<dt>receipt id</dt><dd>{escape(fields.get('receipt_id', ''))}</dd>" if kind is DecisionKind.CONFIRMED else ""
    )
    return (
        f'<div id="confirm-summary"><dl><dt>effect</dt><dd>{_trace_link(key)} {escape(what)}</dd>'
        f'<dt>now</dt><dd><span class="st st-{e.state.value}">{e.state.value}</span></dd>'
        f"<dt>decision</dt><dd><b>{kind.value}</b></dd>{receipt}<dt>reason</dt><dd>{escape(fields.get('reason', ''))}"
        f'</dd></dl><p id="consequence">{escape(DECISION_EFFECTS[kind])}</p></div>'
        f'<form class="resolve" method="post" action="/resolve">{hidden}'
        f'<label>{escape(who)} <input name="user" id="c-user" autocomplete="username"></label>'
        '<label>token or password <input name="secret" id="c-secret" type="password" '
        'autocomplete="current-password"></label>'
        f'<button type="submit" id="confirm">confirm: record {kind.value}</button></form>'
        f'<p><a id="cancel" href="{effect_href(key)}">cancel, back to the effect</a></p>'
    )

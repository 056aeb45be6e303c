"""The console's aiohttp application: the pages and the JSON API behind them, over one ``Source``.

Reads are open on loopback; beyond loopback every request must carry the credentials (a browser:
basic auth; a script: ``Authorization: Bearer TOKEN``). A decision always needs them, and a console
started without any is read-only. Bad input is a message on the page and a 400 from the API;
wrong credentials a 401 before anything is read or written; a refused decision a 409."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from aiohttp import web

from effect_ledger.console import pages
from effect_ledger.console.auth import Credentials, Unauthorized
from effect_ledger.console.query import BadInput, Query, parse_query
from effect_ledger.console.source import Source, recorded_request
from effect_ledger.core.model import DecisionKind
from effect_ledger.core.timeparse import iso
from effect_ledger.errors import DecisionRefused, LedgerError
from effect_ledger.ops.sources import SourceError
from effect_ledger.ops.views import now_ms

STATIC = Path(__file__).parent / "static"
MAX_BODY_BYTES = 16 * 1024  # a decision: a key, a reason, a name

SOURCE: web.AppKey[Source] = web.AppKey("source", Source)
CREDENTIALS: web.AppKey[Credentials] = web.AppKey("credentials", Credentials)
GUARD_READS: web.AppKey[bool] = web.AppKey("guard_reads", bool)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _status(e: Exception) -> int:
    if isinstance(e, Unauthorized):
        return 401
    if isinstance(e, DecisionRefused):
        return 409
    if isinstance(e, BadInput | LedgerError):
        return 400
    if isinstance(e, SourceError) and str(e).startswith("no effect with key"):
        return 404
    return 503  # the source cannot be read (no file, no broker)


EXPECTED = (Unauthorized, DecisionRefused, BadInput, LedgerError, SourceError)


def _api(request: web.Request) -> bool:
    return request.path.startswith("/api/")


def _page(request: web.Request, title: str, body: str, status: int = 200, error: str | None = None) -> web.Response:
    html = pages.layout(
        title,
        body,
        source=request.app[SOURCE].name,
        writable=request.app[CREDENTIALS].configured,
        error=error,
    )
    return web.Response(text=html, content_type="text/html", status=status)


@web.middleware
async def errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every expected error as JSON ``{"error": ...}`` (API) or the page with the message (HTML)."""
    try:
        if request.app[GUARD_READS] and not request.path.startswith("/static/"):
            request.app[CREDENTIALS].identity(request.headers.get("Authorization"))
        return await handler(request)
    except EXPECTED as e:
        status = _status(e)
        headers = {"WWW-Authenticate": 'Basic realm="effects console"'} if status == 401 else None
        if _api(request):
            return web.json_response({"error": str(e)}, status=status, headers=headers)
        resp = _page(request, "error" if status != 400 else "bad input", "", status, str(e))
        if headers:
            resp.headers.update(headers)
        return resp


async def _blocking(fn: Callable[..., Any], *args: Any) -> Any:
    return await asyncio.to_thread(fn, *args)


def _query(request: web.Request) -> tuple[Query, int]:
    now = now_ms()
    return parse_query(request.query, now, request.app[SOURCE].searchable), now


def _form_params(request: web.Request) -> dict[str, str]:
    return {k: ",".join(request.query.getall(k)) for k in request.query}


async def _bad_input_page(request: web.Request, title: str, action: str, filters: bool, e: BadInput) -> web.Response:
    body = pages.window_form(action, None, _form_params(request), filters=filters, window=action != "/stuck")
    return _page(request, title, body, 400, str(e))


def _rows_json(rows: list[Any]) -> list[dict[str, Any]]:
    return [{**asdict(r), "created": iso(r.created_ms), "updated": iso(r.updated_ms)} for r in rows]


# -- pages ------------------------------------------------------------------------------------------


async def effects_view(request: web.Request) -> web.Response:
    try:
        q, now = _query(request)
    except BadInput as e:
        return await _bad_input_page(request, "effects", "/", True, e)
    page, _chart = await _blocking(request.app[SOURCE].effects, q)
    body = pages.effects_page(q, page, now, _form_params(request), request.app[SOURCE].searchable)
    return _page(request, "effects", body)


async def stuck_view(request: web.Request) -> web.Response:
    try:
        q, now = _query(request)
    except BadInput as e:
        return await _bad_input_page(request, "stuck & escalations", "/stuck", False, e)
    src = request.app[SOURCE]
    rows = await _blocking(src.stuck, q.stuck_ms)
    queue = await _blocking(src.escalations)
    body = pages.stuck_page(q, rows, queue, now, _form_params(request))
    return _page(request, "stuck & escalations", body)


async def effect_view(request: web.Request) -> web.Response:
    key = request.match_info["effect_id"]
    src = request.app[SOURCE]
    view = await _blocking(src.effect, key)
    body = pages.effect_page(view, src.searchable, writable=request.app[CREDENTIALS].configured)
    return _page(request, f"effect {pages.short(key)}", body)


async def trace_view(request: web.Request) -> web.Response:
    """The old address of an effect's page: the page is now ``/effect/{effect_id}``."""
    raise web.HTTPFound(pages.effect_href(request.match_info["key"]))


async def _form(request: web.Request, names: tuple[str, ...]) -> dict[str, str]:
    try:
        form = await request.post()
    except (ValueError, LookupError) as e:
        # aiohttp decodes the body with the charset the request names (LookupError for an unknown
        # one, UnicodeDecodeError for bytes it does not hold) and raises ValueError for a malformed
        # multipart body.
        raise BadInput(f"the form could not be read: {e}") from None
    return {k: str(form.get(k, "")).strip() for k in names}


async def confirm_view(request: web.Request) -> web.Response:
    """The decision's second step: what was chosen, what it will cause, and the button that records
    it (a form posting to ``/resolve``). Nothing is written here; a form missing its choice, reason
    or receipt id comes back to the effect's page with the message."""
    fields = await _form(request, ("key", "decision", "reason", "receipt_id"))
    key = fields["key"]
    src = request.app[SOURCE]
    try:
        if not key:
            raise BadInput("no effect key")
        kind = _decision_of(fields)
    except BadInput as e:
        if not key:
            raise
        view = await _blocking(src.effect, key)
        body = pages.effect_page(view, src.searchable, writable=request.app[CREDENTIALS].configured, form=fields)
        return _page(request, f"effect {pages.short(key)}", body, 400, str(e))
    view = await _blocking(src.effect, key)  # a key that is not there: 404 before any confirmation
    body = pages.confirm_page(view, kind, fields, users=bool(request.app[CREDENTIALS].users))
    return _page(request, "confirm the decision", body)


def _decision_of(fields: dict[str, str]) -> DecisionKind:
    """The decision a form asks for, with what it needs: a reason, and a receipt id for CONFIRMED."""
    try:
        kind = DecisionKind(fields.get("decision", "").upper())
    except ValueError:
        raise BadInput(f"decision: one of {', '.join(k.value for k in DecisionKind)}") from None
    if not fields.get("reason"):
        raise BadInput("say why: a reason is required")
    if kind is DecisionKind.CONFIRMED and not fields.get("receipt_id"):
        raise BadInput("CONFIRMED needs the destination's receipt id")
    return kind


async def audit_view(request: web.Request) -> web.Response:
    try:
        q, now = _query(request)
    except BadInput as e:
        return await _bad_input_page(request, "audit", "/audit", False, e)
    src = request.app[SOURCE]
    report = await _blocking(src.audit, q, now)
    _page_, chart = await _blocking(src.effects, q)
    return _page(request, "audit", pages.audit_page(q, report, chart, _form_params(request)))


async def resolve_view(request: web.Request) -> web.Response:
    fields = await _form(request, ("key", "decision", "reason", "receipt_id", "user", "secret"))
    key = fields["key"]
    try:
        line = await _decide(request, fields, None)
    except EXPECTED as e:
        status = _status(e)
        title = "decision refused" if status == 409 else "decision not recorded"
        return _page(request, title, pages.decided_page(key, "nothing was written"), status, str(e))
    return _page(request, "decision recorded", pages.decided_page(key, line))


async def _decide(request: web.Request, fields: dict[str, str], authorization: str | None) -> str:
    """Authenticate first (nothing is read or written for wrong credentials), then decide with the
    command line's function. The operator is the basic-auth user, or the name given with a token."""
    creds = request.app[CREDENTIALS]
    user = creds.identity(authorization, fields.get("user", ""), fields.get("secret", ""))
    for name, value in fields.items():
        try:
            value.encode()
        except UnicodeEncodeError:  # a lone surrogate (JSON "\ud800"): the ledger cannot store it
            raise BadInput(f"{name!r} is not text: it holds a lone surrogate") from None
    by = user or fields.get("by") or fields.get("user", "")
    if not by:
        raise BadInput("say who decides: a name beside the token")
    key = fields.get("key", "")
    if not key:
        raise BadInput("no effect key")
    kind = _decision_of(fields)
    receipt = fields.get("receipt_id") or None
    return str(await _blocking(request.app[SOURCE].decide, key, kind, by, fields["reason"], receipt))


# -- the JSON API -----------------------------------------------------------------------------------


async def api_effects(request: web.Request) -> web.Response:
    q, _now = _query(request)
    page, chart = await _blocking(request.app[SOURCE].effects, q)
    return web.json_response(
        {
            "from": iso(q.from_ms),
            "to": iso(q.to_ms),
            "matched": page.matched,
            "by_state": dict(page.by_state),
            "by_target": dict(page.by_target),
            "chart": [dict(b) for b in chart.buckets],
            "effects": _rows_json(page.rows),
        }
    )


async def api_stuck(request: web.Request) -> web.Response:
    q, _now = _query(request)
    src = request.app[SOURCE]
    rows = await _blocking(src.stuck, q.stuck_ms)
    queue = await _blocking(src.escalations)
    escalated = [{**_rows_json([it.row])[0], "attempts": it.attempts, "answers": it.answers} for it in queue]
    return web.json_response({"older_than": q.stuck_text, "stuck": _rows_json(rows), "escalations": escalated})


async def api_trace(request: web.Request) -> web.Response:
    t = await _blocking(request.app[SOURCE].trace, request.match_info["key"])
    e = t.effect
    return web.json_response(
        {
            "effect_id": t.key,
            "state": e.state.value,
            "attempt": e.attempt,
            "reason": e.reason,
            "flags": [f.value for f in e.flags],
            "sent_unrecorded_ms": t.sent_unrecorded_ms,
            "intermediate_ms": t.intermediate_ms,
            "events": [asdict(ln) | {"at": iso(ln.at_ms)} for ln in t.lines],
        }
    )


async def api_effect(request: web.Request) -> web.Response:
    """An effect's page as JSON: the summary, the request as recorded (``null`` when it is sealed),
    every fact in the log's order and the other effects of its run."""
    view = await _blocking(request.app[SOURCE].effect, request.match_info["effect_id"])
    e = view.trace.effect
    intent = e.first_intent or e.intent
    facts = [{"kind": type(f).__name__, **_fact_json(f)} for f in e.facts]
    return web.json_response(
        {
            "effect_id": view.trace.key,
            "state": e.state.value,
            "reason": e.reason,
            "target": intent.target if intent else None,
            "operation": intent.operation if intent else None,
            "run_id": intent.run_id if intent else None,
            "step": intent.step if intent else None,
            "attempt": e.attempt,
            "flags": [f.value for f in e.flags],
            "request": recorded_request(intent.request) if intent else None,
            "facts": facts,
            "same_run": _rows_json(view.siblings),
        }
    )


def _fact_json(fact: Any) -> dict[str, Any]:
    """A fact's fields (its enums are ``StrEnum``: JSON strings as they are), the intent's request
    left out: it is shown once, decoded, as ``request``."""
    return {k: getattr(fact, k) for k in fact.__dataclass_fields__ if k != "request"}


async def api_audit(request: web.Request) -> web.Response:
    q, now = _query(request)
    report = await _blocking(request.app[SOURCE].audit, q, now)
    return web.json_response(json.loads(report.to_json()))


def _unreadable(e: Exception) -> str:
    """Why ``request.json()`` could not read a body, in a few words."""
    if isinstance(e, json.JSONDecodeError):
        return str(e)
    if isinstance(e, UnicodeDecodeError):
        return "the body is not text in its charset"
    if isinstance(e, LookupError):  # the Content-Type names a charset Python does not know
        return str(e)
    if isinstance(e, RecursionError):  # 16 KiB of brackets nests deeper than the recursion limit
        return "nested too deeply"
    return "a number too long (over 4300 digits)"  # int()'s limit: json raises no other ValueError


async def api_resolve(request: web.Request) -> web.Response:
    auth = request.headers.get("Authorization")
    request.app[CREDENTIALS].identity(auth)  # 401 before the body is even read
    if request.content_type != "application/json":
        # A page elsewhere can post a form or text/plain here with credentials the browser has
        # cached (basic auth beyond loopback), but not application/json without asking first (CORS).
        raise BadInput("the body must be application/json")
    try:
        body = await request.json()
    except (ValueError, LookupError, RecursionError) as e:
        raise BadInput(f"the body must be a JSON object: {_unreadable(e)}") from None
    if not isinstance(body, dict):
        raise BadInput("the body must be a JSON object")
    fields = {k: str(v) for k, v in body.items() if isinstance(v, str | int)}
    line = await _decide(request, fields, auth)
    return web.json_response({"effect_id": fields.get("key"), "recorded": line})


def make_app(source: Source, credentials: Credentials, *, guard_reads: bool = False) -> web.Application:
    """The console over ``source``; ``guard_reads``: every request needs the credentials (beyond
    loopback)."""
    app = web.Application(middlewares=[errors], client_max_size=MAX_BODY_BYTES)
    app[SOURCE] = source
    app[CREDENTIALS] = credentials
    app[GUARD_READS] = guard_reads
    app.router.add_get("/", effects_view)
    app.router.add_get("/stuck", stuck_view)
    app.router.add_get("/effect/{effect_id}", effect_view)
    app.router.add_get("/trace/{key}", trace_view)
    app.router.add_post("/confirm", confirm_view)
    app.router.add_get("/audit", audit_view)
    app.router.add_post("/resolve", resolve_view)
    app.router.add_get("/api/effects", api_effects)
    app.router.add_get("/api/stuck", api_stuck)
    app.router.add_get("/api/trace/{key}", api_trace)
    app.router.add_get("/api/effect/{effect_id}", api_effect)
    app.router.add_get("/api/audit", api_audit)
    app.router.add_post("/api/resolve", api_resolve)
    app.router.add_static("/static/", STATIC)
    return app

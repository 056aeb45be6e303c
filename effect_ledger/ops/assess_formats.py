"""The log formats ``effects assess`` reads, each turned into :class:`effect_ledger.core.assess.Call`.

One JSON value per line in every format (a JSON array or a ``{"data": [...]}`` page on a line is read
element by element): OTLP/JSON (``resourceSpans``; GenAI ``execute_tool`` spans, MCP ``tools/call``
spans, OpenInference ``TOOL`` spans, HTTP client spans), LangSmith runs (``run_type = tool``), Langfuse
observations (``type = TOOL``), OpenAI Agents SDK spans (``span_data.type = function``), HTTP access
logs and the plain calls layout (``--field``). Values never leave a reader: arguments become a digest
of their business fields, keys stay keys (compared, never printed raw).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

from effect_ledger.core.assess import Call, Status


def _canonical_dumps() -> Callable[[Any], bytes]:
    """orjson sorts keys and serialises several times faster; json gives the same equalities."""
    try:
        import orjson
    except ImportError:  # pragma: no cover - without the [assess] extra
        return lambda v: json.dumps(v, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    option = orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS
    return lambda v: orjson.dumps(v, option=option)


_dumps = _canonical_dumps()


FORMATS = ("otlp", "langsmith", "langfuse", "openai-agents", "http", "calls")
READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
HTTP_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "POST", "PUT", "PATCH", "DELETE"})
FIELDS: dict[str, tuple[str, ...]] = {
    "tool": ("tool", "tool_name", "params.name", "name"),
    "method": ("method", "http.method", "request.method"),
    "url": ("url", "http.url", "request.url", "uri"),
    "host": ("host", "request.host"),
    "path": ("path", "request.path"),
    "arguments": ("arguments", "args", "params.arguments", "input", "body", "request.body"),
    "key": (
        "idempotency_key",
        "idempotencyKey",
        "params._meta.idempotencyKey",
        "headers.idempotency-key",
        "request.headers.idempotency-key",
        "request_headers.idempotency-key",
    ),
    "time": ("timestamp", "ts", "time", "@timestamp", "start_time", "started_at"),
    "end": ("end", "end_time", "ended_at", "finished_at"),
    "duration": ("duration_ms", "latency_ms", "duration", "request_time"),
    "status": ("status", "status_code", "response.status", "http.status_code", "outcome", "error"),
    "call_id": ("call_id", "tool_call_id", "params._meta.callId"),
    "intent": ("intent_at", "intent_ts", "intent_time"),
}
# Argument fields that identify an attempt, not the business operation: left out of the comparison.
NOT_BUSINESS = frozenset(
    {"idempotency_key", "idempotencykey", "idempotency-key", "request_id", "requestid", "nonce", "_meta",
     "timestamp", "ts", "trace_id", "traceid", "attempt", "retry", "run_id", "tool_call_id"}
)  # fmt: skip
_KEY_FIELDS = ("idempotency_key", "idempotencyKey", "idempotency-key", "Idempotency-Key")
_UUID = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")
UNKNOWN_ERROR = re.compile(r"time.?out|timed out|deadline|connect|reset|unavailable|eof|broken pipe|50[234]", re.I)


@dataclass
class Seen:
    """What the log showed it carries, so a row it cannot measure says so instead of showing 0."""

    args: bool = False
    ends: bool = False
    keys: bool = False
    pending: bool = False
    intents: bool = False
    skipped: int = 0  # records of the format that are not tool calls (model calls, chains, reads)


@dataclass
class Context:
    """What a reader needs besides the record."""

    paths: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: dict(FIELDS))
    writes: frozenset[str] = frozenset()
    seen: Seen = field(default_factory=Seen)
    line: int = 0

    def __post_init__(self) -> None:
        self.resolver = Resolver(self.paths)

    def is_write(self, tool: str) -> bool:
        return not self.writes or tool in self.writes


def detect(obj: Any) -> str | None:
    """The format of one parsed record, from its shape."""
    if not isinstance(obj, dict):
        return None
    if "resourceSpans" in obj:
        return "otlp"
    if "run_type" in obj:
        return "langsmith"
    if isinstance(obj.get("span_data"), dict):
        return "openai-agents"
    if "startTime" in obj and "type" in obj:
        return "langfuse"
    m = get(obj, FIELDS["method"])
    if isinstance(m, str) and m.upper() in HTTP_METHODS:
        return "http"
    return "calls"


def get(obj: Any, candidates: tuple[str, ...]) -> Any:
    """The value at the first dotted path present (a key differing only in case matches too)."""
    for path in candidates:
        cur = obj
        for part in path.split("."):
            if not isinstance(cur, dict):
                cur = None
                break
            nxt = cur.get(part)
            if nxt is None:
                nxt = _lowered(cur).get(part.lower())
            cur = nxt
        if cur is not None:
            return cur
    return None


class Resolver:
    """``get`` for every field of one record at once: which candidate paths can match is worked out
    once per set of top-level keys (logs repeat a handful of shapes), not per record."""

    def __init__(self, paths: Mapping[str, tuple[str, ...]]) -> None:
        self._paths = {f: [tuple(p.split(".")) for p in cands] for f, cands in paths.items()}
        self._plans: dict[tuple[Any, ...], dict[str, list[tuple[str, str]]]] = {}

    def fields(self, obj: dict[str, Any]) -> dict[str, Any]:
        sig = tuple(obj)
        plan = self._plans.get(sig)
        if plan is None:
            low = {k.lower(): k for k in obj if isinstance(k, str)}
            plan = {
                f: [
                    (c[0] if c[0] in obj else low[c[0].lower()], ".".join(c[1:]))
                    for c in cands
                    if c[0] in obj or c[0].lower() in low
                ]
                for f, cands in self._paths.items()
            }
            # a field none of whose paths can match is left out: not looked at per record
            plan = {f: cands for f, cands in plan.items() if cands}
            if len(self._plans) < 4096:
                self._plans[sig] = plan
        out: dict[str, Any] = {}
        for f, cands in plan.items():
            for first, rest in cands:
                cur = obj[first]
                if rest:
                    cur = get(cur, (rest,))
                if cur is not None:
                    out[f] = cur
                    break
        return out


_LOWERED: dict[int, tuple[dict[str, Any], dict[str, Any]]] = {}


def _lowered(d: dict[str, Any]) -> dict[str, Any]:
    """``d`` with lower-cased keys, made once per dict while it is the record being read."""
    hit = _LOWERED.get(id(d))
    if hit is not None and hit[0] is d:
        return hit[1]
    if len(_LOWERED) > 64:
        _LOWERED.clear()  # the dicts of earlier records: never looked at again
    low = {k.lower(): v for k, v in d.items() if isinstance(k, str)}
    _LOWERED[id(d)] = (d, low)
    return low


def time_ms(value: Any) -> int | None:
    """ISO 8601, or epoch seconds, milliseconds or nanoseconds, as epoch milliseconds."""
    if value is None:
        return None
    if isinstance(value, str):  # the usual case first: one call per record and field
        if not value:
            return None
        try:
            t = datetime.fromisoformat(value)
        except ValueError:
            try:
                return time_ms(int(value) if value.isdigit() else float(value))
            except ValueError:
                return None
        if t.tzinfo is None:
            t = t.replace(tzinfo=UTC)
        return int(t.timestamp() * 1000)
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        if value > 1e17:
            return int(value // 1_000_000)  # nanoseconds (OTLP)
        return int(value if value > 1e11 else value * 1000)
    return None


def _parsed(value: Any) -> Any:
    """A JSON object or array carried as text, parsed; anything else as it is."""
    if isinstance(value, str | bytes) and value[:1] in ("{", "[", b"{", b"["):
        try:
            return json.loads(value)
        except (ValueError, RecursionError):
            return value
    return value


def business(value: Any) -> Any:
    """The arguments without the fields that name an attempt (keys, request ids, timestamps)."""
    value = _parsed(value)
    if isinstance(value, dict):
        return {
            k: v if _plain(v) else business(v)  # most values: no call, nothing to parse or drop
            for k, v in value.items()
            if not (isinstance(k, str) and k.lower() in NOT_BUSINESS)
        }
    if isinstance(value, list):
        return [v if _plain(v) else business(v) for v in value]
    return value


# Values ``business`` returns as they are: numbers, and text that cannot hold JSON to parse.
_SCALARS = frozenset({int, float, bool, type(None)})


def _plain(v: Any) -> bool:
    t = type(v)
    return t in _SCALARS or (t is str and v[:1] not in ("{", "["))


def digest(value: Any) -> str:
    """A digest of canonical business arguments: equal arguments, equal digests. It only pairs calls
    within one run (never stored, never compared across runs), so Python's keyed hash of the
    canonical bytes is enough and costs a fraction of a cryptographic one."""
    try:
        canonical = _dumps(business(value))
    except (TypeError, ValueError):
        canonical = repr(value).encode()
    return f"{hash(canonical) & 0xFFFFFFFFFFFFFFFF:x}"


def key_in(args: Any) -> str | None:
    """An idempotency key carried inside the arguments (or their ``_meta``)."""
    args = _parsed(args)
    if not isinstance(args, dict):
        return None
    for holder in (args, args.get("_meta")):
        if isinstance(holder, dict):
            for k in _KEY_FIELDS:
                v = holder.get(k)
                if v not in (None, ""):
                    return str(v)
    return None


def status_of(error: Any, http_status: Any = None, ended: bool = True) -> Status:
    """ok, a definite error, or an unknown outcome (a timeout, a 5xx, a dropped connection: the
    destination may have done it)."""
    if not ended:
        return "pending"
    if isinstance(http_status, str) and http_status.isdigit():
        http_status = int(http_status)
    if isinstance(http_status, int) and not isinstance(http_status, bool) and 100 <= http_status < 600:
        if http_status < 400:
            return "ok"
        return "unknown" if http_status in (408, 499) or http_status >= 500 else "error"
    if error in (None, "", False) or (isinstance(error, str) and error.lower() in ("ok", "success", "succeeded")):
        return "ok"
    text = error if isinstance(error, str) else json.dumps(error, default=str)
    if isinstance(error, str) and error.lower() in ("pending", "started", "running", "in_progress"):
        return "pending"
    return "unknown" if UNKNOWN_ERROR.search(text) else "error"


def segment(s: str) -> str:
    """A URL path segment, or ``{id}``/``{token}`` when it names one thing (and may be a secret)."""
    if s.isdigit() or _UUID.match(s) or (len(s) >= 8 and any(c.isdigit() for c in s)):
        return "{id}"
    if len(s) >= 20 or (len(s) >= 12 and s.lower() != s and s.upper() != s):
        return "{token}"
    return s


def http_tool(method: str, url: Any, host: Any = None, path: Any = None) -> tuple[str, str] | None:
    """``METHOD host/template`` and the path with its ids (never the query string or userinfo)."""
    if isinstance(url, str) and url:
        parts = urlsplit(url)
        host, path = (parts.hostname or host or "") + (f":{parts.port}" if parts.port else ""), parts.path
    if not isinstance(path, str) or not path:
        return None
    path = path.split("?")[0]
    template = "/".join(segment(s) for s in path.split("/"))
    return f"{method} {host if isinstance(host, str) else ''}{template}", path


# -- OTLP/JSON ---------------------------------------------------------------------------------------


def _any_value(v: Any) -> Any:
    if not isinstance(v, dict):
        return v
    for k in ("stringValue", "boolValue", "doubleValue"):
        if k in v:
            return v[k]
    if "intValue" in v:
        return int(v["intValue"])
    if "arrayValue" in v:
        return [_any_value(x) for x in (v["arrayValue"] or {}).get("values", [])]
    if "kvlistValue" in v:
        return {x.get("key"): _any_value(x.get("value")) for x in (v["kvlistValue"] or {}).get("values", [])}
    return None


def _attrs(span: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for a in span.get("attributes") or []:
        if isinstance(a, dict) and isinstance(a.get("key"), str):
            out[a["key"]] = _any_value(a.get("value"))
    return out


def _first(v: Any) -> Any:
    return v[0] if isinstance(v, list) and v else v


def read_otlp(obj: dict[str, Any], ctx: Context) -> Iterator[Call]:
    if not isinstance(obj.get("resourceSpans"), list):
        # a record of another shape (``--format otlp`` on JSON lines): a bad line, never silently nothing
        raise TypeError("no resourceSpans")
    for rs in obj["resourceSpans"]:
        for ss in (rs or {}).get("scopeSpans") or (rs or {}).get("instrumentationLibrarySpans") or []:
            for span in (ss or {}).get("spans") or []:
                if isinstance(span, dict):
                    call = _otlp_span(span, ctx)
                    if call is not None:
                        yield call


def _otlp_span(span: dict[str, Any], ctx: Context) -> Call | None:
    a = _attrs(span)
    start = time_ms(_int_or(span.get("startTimeUnixNano")))
    end = time_ms(_int_or(span.get("endTimeUnixNano")))
    st = span.get("status") or {}
    code = st.get("code")
    failed = code in (2, "STATUS_CODE_ERROR", "ERROR")
    error = a.get("error.type") or (st.get("message") or "error" if failed else None)
    for ev in span.get("events") or []:
        if isinstance(ev, dict) and ev.get("name") == "exception":
            error = error or _attrs(ev).get("exception.type") or "exception"
            error = f"{error} {_attrs(ev).get('exception.message') or ''}"
    method = a.get("http.request.method") or a.get("http.method")
    kind = a.get("openinference.span.kind")
    if a.get("gen_ai.operation.name") == "execute_tool" or a.get("mcp.method.name") == "tools/call" or kind == "TOOL":
        tool = a.get("gen_ai.tool.name") or a.get("tool.name") or span.get("name") or "?"
        args = a.get("gen_ai.tool.call.arguments")
        if args is None and kind == "TOOL":
            args = a.get("input.value")
        if args is None:
            args = a.get("mcp.request.params.arguments")
        meta = a.get("mcp.request.meta") or a.get("params._meta")
        key = a.get("idempotency.key") or key_in(args) or key_in({"_meta": _parsed(meta)})
        call_id = a.get("gen_ai.tool.call.id") or a.get("tool_call.id") or a.get("jsonrpc.request.id")
        ctx.seen.keys = True
        if args is not None:
            ctx.seen.args = True
        ctx.seen.ends |= end is not None
        return Call(str(tool)[:200], start, end, status_of(error, ended=end is not None), ctx.is_write(str(tool)),
                    key, None if args is None else digest(args), None if call_id is None else str(call_id),
                    line=ctx.line)  # fmt: skip
    if isinstance(method, str) and method.upper() in HTTP_METHODS and span.get("kind") in (3, "SPAN_KIND_CLIENT"):
        named = http_tool(method.upper(), a.get("url.full") or a.get("http.url"), a.get("server.address"))
        if named is None:
            return None
        key = _first(a.get("http.request.header.idempotency-key"))
        ctx.seen.keys = ctx.seen.args = True
        ctx.seen.ends |= end is not None
        status = a.get("http.response.status_code") or a.get("http.status_code")
        return Call(named[0], start, end, status_of(error, status, end is not None),
                    method.upper() not in READ_METHODS, None if key is None else str(key),
                    digest(named[1]), line=ctx.line)  # fmt: skip
    ctx.seen.skipped += 1
    return None


def _int_or(v: Any) -> Any:
    return int(v) if isinstance(v, str) and v.isdigit() else v


# -- LangSmith, Langfuse, OpenAI Agents SDK ----------------------------------------------------------


def read_langsmith(obj: dict[str, Any], ctx: Context) -> Iterator[Call]:
    if obj.get("run_type") != "tool":
        ctx.seen.skipped += 1
        return
    tool = str(obj.get("name") or "?")[:200]
    inputs = obj.get("inputs")
    start, end = time_ms(obj.get("start_time")), time_ms(obj.get("end_time"))
    meta = _dict(_dict(obj.get("extra")).get("metadata"))
    call_id = meta.get("tool_call_id") or _dict(inputs).get("tool_call_id")
    ctx.seen.keys = ctx.seen.args = ctx.seen.pending = True
    ctx.seen.ends |= end is not None
    yield Call(tool, start, end, status_of(obj.get("error"), ended=end is not None), ctx.is_write(tool),
               key_in(inputs) or _str(meta.get("idempotency_key")), digest(inputs),
               _str(call_id), line=ctx.line)  # fmt: skip


def read_langfuse(obj: dict[str, Any], ctx: Context) -> Iterator[Call]:
    if obj.get("type") != "TOOL":
        ctx.seen.skipped += 1
        return
    tool = str(obj.get("name") or "?")[:200]
    start, end = time_ms(obj.get("startTime")), time_ms(obj.get("endTime"))
    error = obj.get("statusMessage") or "error" if obj.get("level") == "ERROR" else None
    meta = _dict(obj.get("metadata"))
    ctx.seen.keys = ctx.seen.args = ctx.seen.pending = True
    ctx.seen.ends |= end is not None
    yield Call(tool, start, end, status_of(error, ended=end is not None), ctx.is_write(tool),
               key_in(obj.get("input")) or _str(meta.get("idempotency_key")), digest(obj.get("input")),
               _str(meta.get("tool_call_id")), line=ctx.line)  # fmt: skip


def read_agents(obj: dict[str, Any], ctx: Context) -> Iterator[Call]:
    data = obj.get("span_data") or {}
    if data.get("type") != "function":
        ctx.seen.skipped += 1
        return
    tool = str(data.get("name") or "?")[:200]
    start, end = time_ms(obj.get("started_at")), time_ms(obj.get("ended_at"))
    err = obj.get("error")
    error = (err.get("message") or "error") if isinstance(err, dict) else err
    ctx.seen.keys = ctx.seen.args = True
    ctx.seen.ends |= end is not None
    ctx.seen.pending |= end is None
    args = data.get("input")
    yield Call(tool, start, end, status_of(error, ended=end is not None), ctx.is_write(tool), key_in(args),
               digest(args), line=ctx.line)  # fmt: skip


def _dict(v: Any) -> dict[str, Any]:
    return v if isinstance(v, dict) else {}


def _str(v: Any) -> str | None:
    return None if v in (None, "") else str(v)


# -- HTTP access logs and the plain calls layout -----------------------------------------------------


def read_calls(obj: dict[str, Any], ctx: Context) -> Iterator[Call]:
    v = ctx.resolver.fields(obj)
    m = v.get("method")
    method = m.upper() if isinstance(m, str) else None
    start = time_ms(v.get("time"))
    end = time_ms(v.get("end"))
    dur = v.get("duration")
    if end is None and start is not None and isinstance(dur, int | float) and not isinstance(dur, bool):
        # request_time and "duration" in nginx/caddy JSON logs are seconds; *_ms fields milliseconds
        ms = dur * 1000 if (isinstance(dur, float) and dur < 1000 and "duration_ms" not in obj) else dur
        end = start + int(ms)
    raw_status = v.get("status")
    is_code = isinstance(raw_status, int) or (isinstance(raw_status, str) and raw_status.isdigit())
    http_status, error = (raw_status, None) if is_code else (None, raw_status)
    status: Status = status_of(error, http_status) if raw_status is not None else "ok"
    intent = time_ms(v.get("intent"))
    seen = ctx.seen
    if intent is not None:
        seen.intents = True
    if end is not None:
        seen.ends = True
    if status == "pending":
        seen.pending = True
    key = v.get("key")
    key = str(key) if key not in (None, "") else None
    if method in HTTP_METHODS:
        named = http_tool(method, v.get("url"), v.get("host"), v.get("path"))
        if named is not None:
            seen.args = True
            seen.keys |= key is not None or any(
                isinstance(get(obj, (h,)), dict) for h in ("headers", "request.headers", "request_headers")
            )
            body = v.get("arguments")
            yield Call(named[0], start, end, status, method not in READ_METHODS, key,
                       digest([named[1], _parsed(body)]), None, intent, ctx.line)  # fmt: skip
            return
    tool = v.get("tool")
    if not isinstance(tool, str) or not tool:
        raise ValueError("no tool name (nor HTTP method and URL)")
    tool = tool[:200]
    args = v.get("arguments")
    key = key or key_in(args)
    seen.keys = True
    if args is not None:
        seen.args = True
    call_id = v.get("call_id")
    yield Call(tool, start, end, status, ctx.is_write(tool), key, None if args is None else digest(args),
               None if call_id in (None, "") else str(call_id), intent, ctx.line)  # fmt: skip


READERS: dict[str, Callable[[dict[str, Any], Context], Iterator[Call]]] = {
    "otlp": read_otlp,
    "langsmith": read_langsmith,
    "langfuse": read_langfuse,
    "openai-agents": read_agents,
    "http": read_calls,
    "calls": read_calls,
}
# Bytes a record of the format must hold to be a tool call: lines without them skip the JSON parse.
PREFILTER: dict[str, bytes] = {"langsmith": b'"tool"', "langfuse": b'"TOOL"', "openai-agents": b'"function"'}

"""``effects assess LOG``: what a call log a team already has says about its external writes.

Reads JSON lines of tool calls or HTTP requests and reports, per tool: calls, writes, the share of
writes that carried an idempotency key, likely duplicates, and what the ledger would have caught.

Each field is found at the first of its paths that is present (dotted paths into the JSON object;
a key that differs only in case matches too, so ``headers.idempotency-key`` finds
``Idempotency-Key``); ``--field NAME=PATH`` puts PATH first:

* tool: ``tool``, ``tool_name``, ``params.name``, ``name``; without one, an HTTP request's tool is
  ``METHOD host/path`` with id-like path segments (numbers, UUIDs, long tokens with digits) as ``{id}``
* method: ``method``, ``http.method``, ``request.method``; url: ``url``, ``http.url``, ``request.url``
  (or host: ``host``, ``request.host`` and path: ``path``, ``request.path``)
* arguments: ``arguments``, ``args``, ``params.arguments``, ``input``, ``body``, ``request.body``
  (a body that is JSON text is compared as JSON)
* key: ``idempotency_key``, ``idempotencyKey``, ``params._meta.idempotencyKey``,
  ``headers.idempotency-key``, ``request.headers.idempotency-key``
* time: ``timestamp``, ``ts``, ``time``, ``@timestamp`` (ISO 8601, or epoch seconds or milliseconds)

A write is an HTTP request whose method is not GET/HEAD/OPTIONS, or a call of a tool named by
``writes`` (every tool call when none is named). Likely duplicates of a write: **same key**, a key
already seen for that tool (the destination may have deduplicated it if it honours keys); **same
arguments**, the same tool and canonical arguments as a call within ``window`` before it, without
the same key (nothing could deduplicate it). The ledger would have caught both: with a stable key, a
retry gets the recorded result and never reaches the destination.

Bad lines (not JSON, not an object, no tool, over ``MAX_LINE_BYTES``) are counted by reason, never
fatal. Memory grows with the number of distinct (tool, key) and (tool, arguments) pairs.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, BinaryIO
from urllib.parse import urlsplit

MAX_LINE_BYTES = 1 << 20
#: What one run reads at most: a log is a file someone has, and a wrong LOG (a device, ``-`` fed an
#: endless stream) ends with an error instead of running, and growing, for ever.
MAX_LOG_BYTES = 1 << 30
FIELDS: dict[str, tuple[str, ...]] = {
    "tool": ("tool", "tool_name", "params.name", "name"),
    "method": ("method", "http.method", "request.method"),
    "url": ("url", "http.url", "request.url"),
    "host": ("host", "request.host"),
    "path": ("path", "request.path"),
    "arguments": ("arguments", "args", "params.arguments", "input", "body", "request.body"),
    "key": (
        "idempotency_key",
        "idempotencyKey",
        "params._meta.idempotencyKey",
        "headers.idempotency-key",
        "request.headers.idempotency-key",
    ),
    "time": ("timestamp", "ts", "time", "@timestamp"),
}
HTTP_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "POST", "PUT", "PATCH", "DELETE"})
READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
_UUID = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")
_EXAMPLES = 5


class AssessError(ValueError):
    """A field mapping the command cannot use, or a log over ``MAX_LOG_BYTES``."""


def field_paths(overrides: Iterable[str]) -> dict[str, tuple[str, ...]]:
    """The paths of each field, with ``NAME=PATH`` overrides tried first."""
    paths = dict(FIELDS)
    for spec in overrides:
        name, sep, path = spec.partition("=")
        if not sep or not path or name not in FIELDS:
            raise AssessError(f"--field {spec!r}: expected NAME=PATH with NAME one of {', '.join(FIELDS)}")
        paths[name] = (path, *paths[name])
    return paths


@dataclass
class ToolStats:
    """What one tool's calls show."""

    tool: str
    calls: int = 0
    writes: int = 0
    keyed: int = 0
    dup_same_key: int = 0
    dup_same_args: int = 0

    @property
    def keyed_share(self) -> float | None:
        return self.keyed / self.writes if self.writes else None

    @property
    def ledger_would_catch(self) -> int:
        return self.dup_same_key + self.dup_same_args

    def as_dict(self) -> dict[str, Any]:
        share = self.keyed_share
        return {
            "tool": self.tool,
            "calls": self.calls,
            "writes": self.writes,
            "keyed": self.keyed,
            "keyed_share": None if share is None else round(share, 4),
            "dup_same_key": self.dup_same_key,
            "dup_same_args": self.dup_same_args,
            "ledger_would_catch": self.ledger_would_catch,
        }


@dataclass
class Report:
    """The assessment of one log."""

    lines: int = 0
    window_s: float = 600.0
    all_tools_are_writes: bool = False
    bad: Counter[str] = field(default_factory=Counter)
    bad_examples: list[dict[str, Any]] = field(default_factory=list)
    untimed_writes: int = 0
    tools: dict[str, ToolStats] = field(default_factory=dict)

    def total(self) -> ToolStats:
        t = ToolStats("(all)")
        for s in self.tools.values():
            t.calls += s.calls
            t.writes += s.writes
            t.keyed += s.keyed
            t.dup_same_key += s.dup_same_key
            t.dup_same_args += s.dup_same_args
        return t

    def as_dict(self) -> dict[str, Any]:
        return {
            "lines": self.lines,
            "window_s": self.window_s,
            "all_tools_are_writes": self.all_tools_are_writes,
            "bad_lines": {"count": sum(self.bad.values()), "by_reason": dict(self.bad), "examples": self.bad_examples},
            "untimed_writes": self.untimed_writes,
            "tools": [s.as_dict() for s in sorted(self.tools.values(), key=lambda s: (-s.writes, s.tool))],
            "total": self.total().as_dict(),
        }


@dataclass(frozen=True)
class _Write:
    tool: str
    key: str | None
    args: str  # sha256 of the canonical arguments
    at_ms: int | None
    line: int


def read_lines(fp: BinaryIO, limit: int = MAX_LINE_BYTES, max_bytes: int | None = None) -> Iterator[bytes | None]:
    """The lines of a binary file; ``None`` for a line over ``limit`` bytes (never held whole).
    ``AssessError`` once more than ``max_bytes`` bytes (default ``MAX_LOG_BYTES``) were read."""
    if max_bytes is None:
        max_bytes = MAX_LOG_BYTES
    buf = bytearray()
    skipping = False
    total = 0
    while chunk := fp.read(1 << 16):
        total += len(chunk)
        if total > max_bytes:
            raise AssessError(f"more than {max_bytes} bytes: assess a part of the log (head -c {max_bytes} LOG | ...)")
        start = 0
        while (nl := chunk.find(b"\n", start)) >= 0:
            if skipping or len(buf) + nl - start > limit:
                yield None
            else:
                yield bytes(buf + chunk[start:nl])
            buf.clear()
            skipping = False
            start = nl + 1
        if not skipping:
            buf += chunk[start:]
            if len(buf) > limit:
                buf.clear()
                skipping = True
    if skipping:
        yield None
    elif buf:
        yield bytes(buf)


def assess(
    lines: Iterable[bytes | None],
    *,
    paths: Mapping[str, tuple[str, ...]] = FIELDS,
    writes: Iterable[str] = (),
    window_s: float = 600.0,
) -> Report:
    """Assess the log ``lines`` (bytes, with or without the newline; ``None``: a line too long)."""
    declared = frozenset(writes)
    report = Report(window_s=window_s, all_tools_are_writes=not declared)
    found: list[_Write] = []
    for n, raw in enumerate(lines, 1):
        report.lines = n
        reason, rec = _record(raw, paths)
        if rec is None:
            report.bad[reason] += 1
            if len(report.bad_examples) < _EXAMPLES:
                report.bad_examples.append({"line": n, "reason": reason})
            continue
        tool, is_http, method = rec["tool"], rec["http"], rec["method"]
        stats = report.tools.setdefault(tool, ToolStats(tool))
        stats.calls += 1
        is_write = (method not in READ_METHODS) if is_http else (not declared or tool in declared)
        if not is_write:
            continue
        stats.writes += 1
        if rec["key"] is not None:
            stats.keyed += 1
        if rec["at_ms"] is None:
            report.untimed_writes += 1
        found.append(_Write(tool, rec["key"], rec["args"], rec["at_ms"], n))
    _duplicates(found, report, int(window_s * 1000))
    return report


def _duplicates(found: list[_Write], report: Report, window_ms: int) -> None:
    """Count likely duplicates, in time order (the log's order breaks ties and orders untimed lines)."""
    found.sort(key=lambda w: (w.at_ms if w.at_ms is not None else -1, w.line))
    keys: set[tuple[str, str]] = set()
    last_by_args: dict[tuple[str, str], _Write] = {}
    for w in found:
        stats = report.tools[w.tool]
        if w.key is not None and (w.tool, w.key) in keys:
            stats.dup_same_key += 1
        else:
            prev = last_by_args.get((w.tool, w.args))
            if prev is not None and _within(prev, w, window_ms):
                stats.dup_same_args += 1
        if w.key is not None:
            keys.add((w.tool, w.key))
        last_by_args[(w.tool, w.args)] = w


def _within(prev: _Write, cur: _Write, window_ms: int) -> bool:
    if prev.at_ms is None or cur.at_ms is None:
        return False  # without times nothing says the two were close: not counted
    return cur.at_ms - prev.at_ms <= window_ms


def _record(raw: bytes | None, paths: Mapping[str, tuple[str, ...]]) -> tuple[str, dict[str, Any] | None]:
    if raw is None or len(raw) > MAX_LINE_BYTES:
        return f"longer than {MAX_LINE_BYTES} bytes", None
    text = raw.strip()
    if not text:
        return "empty", None
    try:
        obj = json.loads(text)
    except ValueError:
        return "not JSON", None
    if not isinstance(obj, dict):
        return "not a JSON object", None
    method_v = _get(obj, paths["method"])
    method = method_v.upper() if isinstance(method_v, str) else None
    is_http = method in HTTP_METHODS
    # An HTTP request is named by its method and path template; a tool call by its tool field.
    tool = _http_tool(obj, paths, method) if is_http else None
    if not tool:
        tool = _get(obj, paths["tool"])
        tool = tool if isinstance(tool, str) else None
    if not tool:
        return "no tool name (nor HTTP method and URL)", None
    key = _get(obj, paths["key"])
    return "", {
        "tool": tool[:200],
        "http": is_http,
        "method": method,
        "key": str(key) if key not in (None, "") else None,
        "args": _args_digest(_get(obj, paths["arguments"])),
        "at_ms": _time_ms(_get(obj, paths["time"])),
    }


def _get(obj: Any, candidates: tuple[str, ...]) -> Any:
    for path in candidates:
        cur = obj
        for part in path.split("."):
            if not isinstance(cur, dict):
                cur = None
                break
            if part in cur:
                cur = cur[part]
            else:
                lower = part.lower()
                cur = next((v for k, v in cur.items() if isinstance(k, str) and k.lower() == lower), None)
        if cur is not None:
            return cur
    return None


def _http_tool(obj: Any, paths: Mapping[str, tuple[str, ...]], method: str | None) -> str | None:
    url = _get(obj, paths["url"])
    host, path = _get(obj, paths["host"]), _get(obj, paths["path"])
    if isinstance(url, str) and url:
        parts = urlsplit(url)
        host, path = parts.netloc or host, parts.path
    if not isinstance(path, str) or not path:
        return None
    template = "/".join(_segment(s) for s in path.split("?")[0].split("/"))
    return f"{method} {host if isinstance(host, str) else ''}{template}"


def _segment(s: str) -> str:
    if s.isdigit() or _UUID.match(s) or (len(s) >= 8 and any(c.isdigit() for c in s)):
        return "{id}"
    return s


def _args_digest(value: Any) -> str:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            pass  # a body that is not JSON is compared as text
    try:
        canonical = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    except (TypeError, ValueError):
        canonical = repr(value)
    return hashlib.sha256(canonical.encode()).hexdigest()


def _time_ms(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return int(value if value > 1e11 else value * 1000)  # milliseconds, or seconds
    if isinstance(value, str) and value:
        try:
            t = datetime.fromisoformat(value)
        except ValueError:
            try:
                return _time_ms(float(value))
            except ValueError:
                return None
        if t.tzinfo is None:
            t = t.replace(tzinfo=UTC)
        return int(t.timestamp() * 1000)
    return None

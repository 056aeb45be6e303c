"""The targets declaration: every destination effect-ledger may call, declared once.

One TOML file is read by the SDK (``Ledger.open(..., targets="targets.toml")``), the embedded runner
(``effects run``), the reconciliation consumers (``effects reconcile``) and the compose services
(``EFFECTS_TARGETS``), so none of them can disagree about how a destination is asked::

    [targets.payments]
    lookup = "https://gateway.example/refunds/by-key/{key}"   # GET it: 200 found, 404/410 absent
    honours_keys = true                  # the destination deduplicates Idempotency-Key ...
    key_retention = "24h"                # ... for this long ("forever" if it never forgets)
    definite_errors = ["myapp.gateway:RefundRejected"]   # "rejected, nothing happened"
    headers = { Authorization = "Bearer ${GATEWAY_TOKEN}" }   # ${VAR}: from the environment;
                                         # sent to the lookup URL's own origin only
    redirects = "none"                   # "same-origin" follows redirects on the same host; a
                                         # redirect elsewhere is never followed (Unknown)
    max_body = 262144                    # bytes of an answer read at most (default 256 KiB)

    [targets.tickets]
    reconciler = "myapp.tickets:find_ticket"   # fn(EffectView) -> Found | Absent | Unknown

    [targets.sms]
    lookup = "none"   # nothing can ask this destination: an uncertain effect goes to a person

Every target says how it is asked: ``lookup`` (a URL with ``{key}``, or ``"none"``) or
``reconciler``. "Nobody can ask" is a declaration, never a default. A mistake is a
``TargetsError`` naming the file, the line and what is wrong; nothing starts on a bad file.
A Python module can declare the same list (``module:NAME``, a list of ``Target``).
"""

from __future__ import annotations

import importlib
import os
import re
import tomllib
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from effect_ledger.streams.errors import TargetsError
from effect_ledger.streams.http_reconciler import MAX_BODY_LIMIT, HttpReconciler
from effect_ledger.streams.keys import check_name
from effect_ledger.streams.reconcile import Backoff, CallableReconciler, Reconciler, Target
from effect_ledger.streams.timeparse import TimeSpecError, duration_ms

ENV_VAR = "EFFECTS_TARGETS"
MAX_FILE_BYTES = 1 << 20  # a declaration, not a data set
NONE = "none"
# Sections of the same file that another reader owns: [mcp] declares the write tools of an MCP
# server for `effects mcp-proxy` (effect_ledger.processors.mcp.policy), which records them on the
# targets declared here. Every other unknown section is a mistake.
SECTIONS_READ_ELSEWHERE = frozenset({"mcp"})

_COMMON = {"lookup", "reconciler", "honours_keys", "key_retention", "definite_errors", "receipt_id", "backoff"}
_HTTP = {
    "timeout",
    "headers",
    "found_status",
    "absent_status",
    "receipt_field",
    "state_field",
    "absent_values",
    "pending_values",
    "redirects",
    "max_body",
}
_BACKOFF = {"first", "factor", "max", "tries"}
_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")

TargetsSpec = str | os.PathLike[str] | Iterable[Target] | None


def resolve(spec: TargetsSpec) -> tuple[Target, ...]:
    """What ``Ledger.open(targets=...)`` and the CLI accept: a TOML file, ``module:NAME``, a list of
    ``Target``, or ``None`` for the file named by ``EFFECTS_TARGETS`` (no targets if unset)."""
    if spec is None:
        env = os.environ.get(ENV_VAR)
        return load_targets(env) if env else ()
    if isinstance(spec, str | os.PathLike):
        return load_targets(spec)
    targets = tuple(spec)
    for t in targets:
        if not isinstance(t, Target):
            raise TargetsError(f"targets: {t!r} is not a Target")
    _check_unique(targets, "targets")
    return targets


def load_targets(source: str | os.PathLike[str]) -> tuple[Target, ...]:
    """Read a targets declaration: a ``.toml`` file, or ``package.module:NAME`` naming a list of
    ``Target`` objects. Raises ``TargetsError`` (file, line, what is wrong) on any mistake."""
    text = os.fspath(source)
    if not text.endswith(".toml") and ":" in text and not Path(text).exists():
        return _from_module(text)
    return _from_file(Path(text))


def _from_module(spec: str) -> tuple[Target, ...]:
    mod_name, _, attr = spec.partition(":")
    try:
        loaded = getattr(importlib.import_module(mod_name), attr or "TARGETS")
        targets = tuple(loaded)
    except Exception as e:  # an import error of the user's module, whatever it is
        raise TargetsError(f"targets {spec}: {type(e).__name__}: {e}") from e
    for t in targets:
        if not isinstance(t, Target):
            raise TargetsError(f"targets {spec}: {t!r} is not an effect_ledger.Target")
    _check_unique(targets, f"targets {spec}")
    return targets


def _from_file(path: Path) -> tuple[Target, ...]:
    try:
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise TargetsError(f"{path}: {size} bytes; a targets file is at most {MAX_FILE_BYTES} bytes")
        raw = path.read_bytes()
    except OSError as e:
        raise TargetsError(f"{path}: cannot read the targets file: {e.strerror or e}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise TargetsError(f"{path}: not UTF-8 text") from None
    return parse_targets(text, path)


def parse_targets(text: str, origin: str | os.PathLike[str] = "<targets>") -> tuple[Target, ...]:
    """The targets declared by a TOML text; ``origin`` names it in error messages."""
    path = Path(origin)
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        line = getattr(e, "lineno", None) or _line_in_message(str(e))
        raise TargetsError(f"{path}:{line or 1}: not valid TOML: {_first_clause(str(e))}") from None
    where = _Where(path, text)
    extra = set(doc) - {"targets"} - SECTIONS_READ_ELSEWHERE
    if extra:
        name = sorted(extra)[0]
        raise TargetsError(f"{where.at(name)}: unknown section {name!r}; declare targets as [targets.NAME]")
    section = doc.get("targets")
    if not isinstance(section, dict) or not section:
        raise TargetsError(f"{path}:1: no targets declared; add a [targets.NAME] table per destination")
    return tuple(_target(name, body, where) for name, body in section.items())


def _target(name: str, body: Any, where: _Where) -> Target:
    def fail(msg: str, field: str | None = None) -> TargetsError:
        return TargetsError(f"{where.at(name, field)}: target {name!r}: {msg}")

    try:
        check_name("target", name)
    except ValueError as e:
        raise fail(str(e)) from None
    if not isinstance(body, dict):
        raise fail("expected a table [targets.NAME] of settings")
    unknown = set(body) - _COMMON - _HTTP
    if unknown:
        field = sorted(unknown)[0]
        raise fail(f"unknown setting {field!r} (known: {', '.join(sorted(_COMMON | _HTTP))})", field)
    lookup, reconciler_ref = body.get("lookup"), body.get("reconciler")
    if (lookup is None) == (reconciler_ref is None):
        raise fail(
            "say how to ask it, with exactly one of: lookup = \"URL with {key}\", reconciler = \"module:attr\", "
            "or lookup = \"none\" (nothing can ask it: uncertain effects go to a person)",
            "lookup" if lookup is not None else None,
        )
    http_fields = sorted(set(body) & _HTTP)
    reconciler: Reconciler | None
    if reconciler_ref is not None:
        if http_fields:
            raise fail(f"{http_fields[0]!r} applies to an HTTP lookup, not to a reconciler", http_fields[0])
        reconciler = _reconciler(_string(body, "reconciler", fail), fail)
    elif lookup == NONE:
        if http_fields:
            raise fail(f"{http_fields[0]!r} applies to an HTTP lookup, and lookup is \"none\"", http_fields[0])
        reconciler = None
    else:
        reconciler = _http(name, body, fail)
    honours = body.get("honours_keys", False)
    if not isinstance(honours, bool):
        raise fail("honours_keys must be true or false", "honours_keys")
    retention = body.get("key_retention", "24h")
    retention_s: float | None
    if retention == "forever":
        retention_s = None
    else:
        retention_s = _duration(retention, "key_retention", fail) / 1000
    errors = tuple(_error_class(ref, fail) for ref in _strings(body, "definite_errors", fail))
    receipt_id = body.get("receipt_id")
    receipt_fn: Callable[[Any], str] | None = None
    if receipt_id is not None:
        obj = _import(_string(body, "receipt_id", fail), "receipt_id", fail)
        if not callable(obj):
            raise fail(f"receipt_id {receipt_id!r} is not callable", "receipt_id")
        receipt_fn = obj
    return Target(
        name,
        reconciler=reconciler,
        honours_keys=honours,
        retention_s=retention_s,
        definite_errors=errors,
        receipt_id=receipt_fn,
        backoff=_backoff(body.get("backoff"), fail),
    )


def _http(name: str, body: Mapping[str, Any], fail: Callable[..., TargetsError]) -> HttpReconciler:
    url = _string(body, "lookup", fail)
    if "{key}" not in url or not url.startswith(("http://", "https://")):
        raise fail(f"lookup {url!r} must be an http(s) URL with {{key}}, or \"none\"", "lookup")
    headers = body.get("headers", {})
    if not isinstance(headers, dict) or not all(isinstance(v, str) for v in headers.values()):
        raise fail("headers must be a table of strings", "headers")
    expanded = {}
    for k, v in headers.items():
        missing = [m for m in _ENV_REF.findall(v) if m not in os.environ]
        if missing:
            raise fail(f"header {k!r} refers to ${{{missing[0]}}}, which is not set in the environment", "headers")
        expanded[k] = _ENV_REF.sub(lambda m: os.environ[m.group(1)], v)
    kwargs: dict[str, Any] = {"name": f"http:{name}", "headers": expanded}
    if "timeout" in body:
        kwargs["timeout"] = _duration(body["timeout"], "timeout", fail) / 1000
    for field in ("found_status", "absent_status"):
        if field in body:
            codes = body[field]
            if not isinstance(codes, list) or not all(isinstance(c, int) and 100 <= c <= 599 for c in codes):
                raise fail(f"{field} must be a list of HTTP status codes", field)
            kwargs[field] = tuple(codes)
    for field in ("receipt_field", "state_field"):
        if field in body:
            kwargs[field] = _string(body, field, fail)
    for field in ("absent_values", "pending_values"):
        if field in body:
            kwargs[field] = _strings(body, field, fail)
    if "redirects" in body:
        if body["redirects"] not in ("none", "same-origin"):
            raise fail('redirects must be "none" or "same-origin" (a redirect to another host is never followed)',
                       "redirects")  # fmt: skip
        kwargs["redirects"] = body["redirects"]
    if "max_body" in body:
        size = body["max_body"]
        if isinstance(size, bool) or not isinstance(size, int) or not 0 < size <= MAX_BODY_LIMIT:
            raise fail(f"max_body must be a number of bytes from 1 to {MAX_BODY_LIMIT}", "max_body")
        kwargs["max_body"] = size
    try:
        return HttpReconciler(url, **kwargs)
    except ValueError as e:
        raise fail(str(e), "lookup") from None


def _backoff(spec: Any, fail: Callable[..., TargetsError]) -> Backoff:
    if spec is None:
        return Backoff()
    if not isinstance(spec, dict):
        raise fail("backoff must be a table: { first = \"1s\", factor = 2, max = \"5m\", tries = 5 }", "backoff")
    unknown = set(spec) - _BACKOFF
    if unknown:
        raise fail(f"backoff: unknown setting {sorted(unknown)[0]!r} (known: first, factor, max, tries)", "backoff")
    d = Backoff()
    factor, tries = spec.get("factor", d.factor), spec.get("tries", d.max_tries)
    if isinstance(factor, bool) or not isinstance(factor, int | float) or not 1 <= factor <= 100:
        raise fail("backoff.factor must be a number from 1 to 100", "backoff")
    if isinstance(tries, bool) or not isinstance(tries, int) or not 1 <= tries <= 1000:
        raise fail("backoff.tries must be a whole number from 1 to 1000", "backoff")
    first = _duration(spec["first"], "backoff", fail) / 1000 if "first" in spec else d.first_s
    most = _duration(spec["max"], "backoff", fail) / 1000 if "max" in spec else d.max_s
    return Backoff(first_s=first, factor=float(factor), max_s=most, max_tries=tries)


def _reconciler(ref: str, fail: Callable[..., TargetsError]) -> Reconciler:
    obj = _import(ref, "reconciler", fail)
    if hasattr(obj, "check") and hasattr(obj, "name"):
        return obj  # a Reconciler object
    if callable(obj):
        return CallableReconciler(obj, name=ref)
    raise fail(f"reconciler {ref!r} is neither a Reconciler nor a function of an EffectView", "reconciler")


def _error_class(ref: str, fail: Callable[..., TargetsError]) -> type[BaseException]:
    obj = _import(ref, "definite_errors", fail)
    if not (isinstance(obj, type) and issubclass(obj, BaseException)):
        raise fail(f"definite_errors: {ref!r} is not an exception class", "definite_errors")
    return obj


def _import(ref: str, field: str, fail: Callable[..., TargetsError]) -> Any:
    mod_name, sep, attr = ref.partition(":")
    if not sep or not mod_name or not attr:
        raise fail(f"{field}: {ref!r} must be \"package.module:name\"", field)
    try:
        obj: Any = importlib.import_module(mod_name)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except Exception as e:  # the user's module may fail to import in any way
        raise fail(f"{field}: cannot load {ref!r}: {type(e).__name__}: {e}", field) from None
    return obj


def _string(body: Mapping[str, Any], field: str, fail: Callable[..., TargetsError]) -> str:
    value = body[field]
    if not isinstance(value, str) or not value:
        raise fail(f"{field} must be a non-empty string", field)
    return value


def _strings(body: Mapping[str, Any], field: str, fail: Callable[..., TargetsError]) -> tuple[str, ...]:
    value = body.get(field, [])
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise fail(f"{field} must be a list of strings", field)
    return tuple(value)


def _duration(value: Any, field: str, fail: Callable[..., TargetsError]) -> int:
    if not isinstance(value, str):
        raise fail(f"{field} must be a duration such as \"90s\", \"10m\", \"24h\"", field)
    try:
        ms = duration_ms(value)
    except TimeSpecError as e:
        raise fail(f"{field}: {e}", field) from None
    if ms <= 0:
        raise fail(f"{field} must be longer than zero", field)
    return ms


def _check_unique(targets: tuple[Target, ...], where: str) -> None:
    seen: set[str] = set()
    for t in targets:
        if t.name in seen:
            raise TargetsError(f"{where}: target {t.name!r} is declared twice")
        seen.add(t.name)


class _Where:
    """File and line of a target's table (and of one of its settings), for error messages: TOML
    parsers do not keep positions, so the line is found in the text."""

    def __init__(self, path: Path, text: str) -> None:
        self.path = path
        self.lines = text.splitlines()

    def at(self, name: str, field: str | None = None) -> str:
        header = re.compile(rf"^\s*\[\s*(targets\s*\.\s*)?[\"']?{re.escape(name)}[\"']?\s*\]")
        start = next((i for i, ln in enumerate(self.lines) if header.match(ln)), None)
        if start is None:
            return f"{self.path}:1"
        if field is not None:
            setting = re.compile(rf"^\s*[\"']?{re.escape(field)}[\"']?\s*=")
            for i in range(start + 1, len(self.lines)):
                if self.lines[i].lstrip().startswith("["):
                    break
                if setting.match(self.lines[i]):
                    return f"{self.path}:{i + 1}"
        return f"{self.path}:{start + 1}"


def _line_in_message(msg: str) -> int | None:
    m = re.search(r"line (\d+)", msg)
    return int(m.group(1)) if m else None


def _first_clause(msg: str) -> str:
    return re.sub(r"\s*\(at line \d+, column \d+\)", "", msg)

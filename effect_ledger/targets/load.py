"""The targets declaration: every destination effect-ledger may call, declared once.

One TOML file is read by the SDK (``Ledger.open(..., targets="targets.toml")``), the embedded runner
(``effects run``), the reconciliation consumers (``effects reconcile``) and the compose services
(``EFFECTS_TARGETS``), so none of them can disagree about how a destination is asked::

    [targets.payments]
    lookup = "https://gateway.example/refunds/by-key/{key}"   # GET it: 200 found, 404/410 absent
    honours_keys = true                  # the destination deduplicates Idempotency-Key ...
    key_retention = "24h"                # ... for this long ("forever" if it never forgets)
    lands_within = "30s"                 # a call cut off at its deadline may still take effect
                                         # this long after it (default 2s): "absent" before then
                                         # is not ABSENT
    definite_errors = ["myapp.gateway:RefundRejected"]   # "rejected, nothing happened"
    headers = { Authorization = "Bearer ${GATEWAY_TOKEN}" }   # ${VAR}: from the environment;
                                         # sent to the lookup URL's own origin only
    redirects = "none"                   # "same-origin" follows redirects on the same host (to
                                         # say what they answered); a redirect elsewhere is never
                                         # followed; an answer after any redirect is Unknown
                                         # (effect_ledger.targets.evidence)
    max_body = 262144                    # bytes of an answer read at most (default 256 KiB)

    [targets.tickets]
    reconciler = "myapp.tickets:find_ticket"   # fn(EffectView) -> Found | Absent | Unknown

    [targets.sms]
    lookup = "none"   # nothing can ask this destination: an uncertain effect goes to a person
    body = "redact"                      # what of a request is recorded: "full" (default),
    redact = ["phone", "text"]           # "redact" these fields, "digest" only, or "encrypt"
                                         # with subject = "customer.id" (erasable: bodies.py)
    searchable = ["order_id"]            # request fields the console can search by value
                                         # (recorded ones only: not redacted, not digest/encrypt)

A built-in destination kind is its own lookup: ``kind = "smtp"`` (an email; IMAP search by
Message-ID, ``effect_ledger.targets.mail``), ``kind = "sql"`` (a row guarded by a unique key
column, ``effect_ledger.targets.sql``), ``kind = "payment"`` or ``kind = "ticket"`` (an API searched
by the key, ``effect_ledger.targets.kinds``); docs/guides/reconcilers-mail-sql.md and
docs/guides/reconcilers-payments-tickets.md have a complete example of each. Every other target says
how it is asked: ``lookup`` (a URL with ``{key}``, optionally ``{target}`` and
``{operation}``; or ``"none"``) or ``reconciler``. "Nobody can ask" is a declaration, never a
default. A lookup may also set ``timeout``, ``found_status``, ``absent_status``, ``receipt_field``,
``state_field``, ``absent_values``, ``pending_values`` (see ``HttpReconciler``); any target may set
``backoff = { first, factor, max, tries }`` and ``receipt_id = "module:function"``.

A mistake is a ``TargetsError`` whose message is one line, ``FILE:LINE: what is wrong`` (problems
of the whole file, such as a missing file, at line 1); nothing starts on a bad file. A Python module
can declare the same list (``module:NAME``, a list of ``Target``).
"""

from __future__ import annotations

import importlib
import os
import re
import tomllib
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from effect_ledger._files import read_regular
from effect_ledger.core import bodies
from effect_ledger.core.deadlines import DECISION_GRACE_MS
from effect_ledger.core.keys import check_name
from effect_ledger.core.reconcile import MAX_LANDS_WITHIN_S, Backoff, Reconciler, Target
from effect_ledger.core.timeparse import TimeSpecError, duration_ms
from effect_ledger.core.urls import safe_url
from effect_ledger.errors import MissingExtra, TargetsError
from effect_ledger.targets import kinds
from effect_ledger.targets.ask import CallableReconciler
from effect_ledger.targets.http import MAX_BODY_LIMIT, HttpReconciler
from effect_ledger.targets.mail import MailDestination
from effect_ledger.targets.sql import SqlDestination, Stock

ENV_VAR = "EFFECTS_TARGETS"
BODY_SETTINGS = ("body", "redact", "subject")  # what of a request is recorded: effect_ledger.core.bodies
MAX_FILE_BYTES = 1 << 20  # a declaration, not a data set
NONE = "none"
# Sections of the same file that another reader owns: [mcp] declares the write tools of an MCP
# server for `effects mcp-proxy` (effect_ledger.mcp.policy), which records them on the
# targets declared here. Every other unknown section is a mistake.
SECTIONS_READ_ELSEWHERE = frozenset({"mcp"})

_COMMON = {
    "kind", "lookup", "reconciler", "honours_keys", "key_retention", "definite_errors", "receipt_id", "backoff",
    "lands_within", "searchable", *BODY_SETTINGS,
}  # fmt: skip
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
# Built-in destination kinds (kind = "..."): the kind is the call's helper and the lookup at once.
_SMTP = {
    "smtp", "imap", "mailbox", "sent_copy", "copy_to", "id_domain", "smtp_user", "smtp_password", "imap_user",
    "imap_password", "timeout",
}  # fmt: skip
_SQL = {"database", "table", "key_column", "id_column", "stock", "timeout"}
_STOCK = {"table", "item_column", "quantity_column"}
KINDS = {"http": _HTTP, "smtp": _SMTP, "sql": _SQL}
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
    return _checked(tuple(spec), "targets")


def load_targets(source: str | os.PathLike[str]) -> tuple[Target, ...]:
    """Read a targets declaration: a ``.toml`` file, or ``package.module:NAME`` naming a list of
    ``Target`` objects. Raises ``TargetsError`` (file, line, what is wrong) on any mistake."""
    text = os.fspath(source)
    if not text.endswith(".toml") and ":" in text and not Path(text).exists():
        return _from_module(text)
    return _from_file(Path(text))


def _from_module(spec: str) -> tuple[Target, ...]:
    mod_name, _, attr = spec.partition(":")
    attr = attr or "TARGETS"
    try:
        module = importlib.import_module(mod_name)
        targets = tuple(getattr(module, attr))
    except Exception as e:  # an import error of the user's module, whatever it is
        raise TargetsError(f"{spec}:1: cannot load the targets: {_why(e)}") from None
    # Errors name the module's file and the line that assigns the list, like a TOML file's.
    where = spec
    source = getattr(module, "__file__", None)
    if source and source.endswith(".py"):
        try:
            lines = Path(source).read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError):
            lines = []
        assign = re.compile(rf"^{re.escape(attr)}\s*[:=]")
        line = next((i + 1 for i, ln in enumerate(lines) if assign.match(ln)), 1)
        where = f"{source}:{line}"
    return _checked(targets, where)


def _checked(targets: tuple[Any, ...], where: str) -> tuple[Target, ...]:
    """A Python list of targets: each a ``Target`` with a valid name, no name twice."""
    seen: set[str] = set()
    for t in targets:
        if not isinstance(t, Target):
            raise TargetsError(f"{where}: {t!r} is not an effect_ledger.Target")
        try:
            check_name("target", t.name)
        except ValueError as e:
            raise TargetsError(f"{where}: {e}") from None
        if t.name in seen:
            raise TargetsError(f"{where}: target {t.name!r} is declared twice")
        seen.add(t.name)
    return targets


def _from_file(path: Path) -> tuple[Target, ...]:
    # Problems of the whole file are reported at its line 1, so every message reads FILE:LINE: ...
    try:
        raw = read_regular(path, MAX_FILE_BYTES + 1)  # bounded: a wrong path (a device, a log) is not read whole
    except OSError as e:
        raise TargetsError(f"{path}:1: cannot read the targets file: {e.strerror or e}") from None
    if len(raw) > MAX_FILE_BYTES:
        raise TargetsError(f"{path}:1: more than {MAX_FILE_BYTES} bytes; a targets file is a declaration, not data")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        raise TargetsError(f"{path}:{line}: not UTF-8 text (byte {e.start})") from None
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
        name = sorted(extra, key=where.top)[0]
        raise TargetsError(f"{path}:{where.top(name)}: unknown section {name!r}; declare targets as [targets.NAME]")
    section = doc.get("targets")
    if not isinstance(section, dict) or not section:
        raise TargetsError(
            f"{path}:{where.top('targets')}: no targets declared; add a [targets.NAME] table per destination"
        )
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
    kind = body.get("kind", "http")
    if kind in kinds.KINDS:  # an API searched by the key (targets/kinds.py): its own settings and defaults
        body = kinds.with_defaults(body, fail)
        allowed: set[str] | frozenset[str] = kinds.settings(body)
        bad = sorted((set(body) & _HTTP) - kinds.KIND_SETTINGS)
        if bad:
            raise fail(f"{bad[0]!r} applies to an HTTP lookup, not to kind {kind!r}", bad[0])
    elif kind in KINDS:
        allowed = KINDS[kind]
    else:
        known = sorted([*KINDS, *kinds.KINDS])
        raise fail(f"kind must be one of {', '.join(known)}, not {kind!r}", "kind")
    unknown = set(body) - _COMMON - allowed
    if unknown:
        field = sorted(unknown)[0]
        raise fail(f"unknown setting {field!r} (known: {', '.join(sorted(_COMMON | allowed))})", field)
    lookup, reconciler_ref = body.get("lookup"), body.get("reconciler")
    if kind != "http" and (lookup is not None or reconciler_ref is not None):
        field = "lookup" if lookup is not None else "reconciler"
        raise fail(f'kind = "{kind}" is its own lookup; remove {field!r}', field)
    if kind == "http" and (lookup is None) == (reconciler_ref is None):
        raise fail(
            'say how to ask it, with exactly one of: lookup = "URL with {key}", reconciler = "module:attr", '
            'or lookup = "none" (nothing can ask it: uncertain effects go to a person)',
            "lookup" if lookup is not None else None,
        )
    http_fields = sorted(set(body) & _HTTP)
    reconciler: Reconciler | None
    if kind == "smtp":
        reconciler = _mail(name, body, fail)
    elif kind == "sql":
        reconciler = _sql(name, body, fail)
    elif kind in kinds.KINDS:
        reconciler = kinds.reconciler(
            name, body, fail, headers=_headers(body, fail), lands_within_s=_lands_within_s(body, fail)
        )
    elif reconciler_ref is not None:
        if http_fields:
            raise fail(f"{http_fields[0]!r} applies to an HTTP lookup, not to a reconciler", http_fields[0])
        reconciler = _reconciler(_string(body, "reconciler", fail), fail)
    elif lookup == NONE:
        if http_fields:
            raise fail(f'{http_fields[0]!r} applies to an HTTP lookup, and lookup is "none"', http_fields[0])
        reconciler = None
    else:
        reconciler = _http(name, body, fail)
    honours = body.get("honours_keys", False)
    if not isinstance(honours, bool):
        raise fail("honours_keys must be true or false", "honours_keys")
    # A row keeps its key column as long as the row exists: the database never forgets it.
    retention = body.get("key_retention", "forever" if kind == "sql" else "24h")
    retention_s: float | None
    if retention == "forever":
        retention_s = None
    else:
        retention_s = _duration(retention, "key_retention", fail) / 1000
    # A kind that asks by search: an empty search proves nothing until the index has caught up.
    lands_within_s = _lands_within_s(body, fail) + kinds.search_lag_s(reconciler)
    if lands_within_s > MAX_LANDS_WITHIN_S:
        raise fail(f"lands_within plus search_lag must be at most {MAX_LANDS_WITHIN_S / 86400:g} days", "lands_within")
    errors = tuple(_error_class(ref, fail) for ref in _strings(body, "definite_errors", fail))
    receipt_id = body.get("receipt_id")
    receipt_fn: Callable[[Any], str] | None = None
    if receipt_id is not None:
        obj = _import(_string(body, "receipt_id", fail), "receipt_id", fail)
        if not callable(obj):
            raise fail(f"receipt_id {receipt_id!r} is not callable", "receipt_id")
        receipt_fn = obj
    elif kind in kinds.KINDS:
        receipt_fn = kinds.receipt_id(kind)
    policy = bodies.parse(body, fail)
    searchable = _strings(body, "searchable", fail)
    try:
        bodies.check_searchable(policy, searchable)
    except ValueError as e:
        raise fail(str(e), "searchable") from None
    return Target(
        name,
        reconciler=reconciler,
        honours_keys=honours,
        retention_s=retention_s,
        definite_errors=errors,
        receipt_id=receipt_fn,
        backoff=_backoff(body.get("backoff"), fail),
        body=policy,
        lands_within_s=lands_within_s,
        searchable=searchable,
    )


def _lands_within_s(body: Mapping[str, Any], fail: Callable[..., TargetsError]) -> float:
    if "lands_within" not in body:
        return DECISION_GRACE_MS / 1000
    lands_within_s = _duration(body["lands_within"], "lands_within", fail) / 1000
    if lands_within_s > MAX_LANDS_WITHIN_S:
        raise fail(f"lands_within must be at most {MAX_LANDS_WITHIN_S / 86400:g} days", "lands_within")
    return lands_within_s


def _headers(body: Mapping[str, Any], fail: Callable[..., TargetsError]) -> dict[str, str]:
    """The ``headers`` setting with ``${VAR}`` taken from the environment."""
    headers = body.get("headers", {})
    if not isinstance(headers, dict) or not all(isinstance(v, str) for v in headers.values()):
        raise fail("headers must be a table of strings", "headers")
    expanded = {}
    for k, v in headers.items():
        missing = [m for m in _ENV_REF.findall(v) if m not in os.environ]
        if missing:
            raise fail(f"header {k!r} refers to ${{{missing[0]}}}, which is not set in the environment", "headers")
        expanded[k] = _ENV_REF.sub(lambda m: os.environ[m.group(1)], v)
        if "\r" in expanded[k] or "\n" in expanded[k]:
            raise fail(f"header {k!r} holds a line break (from the environment?)", "headers")
    return expanded


def _http(name: str, body: Mapping[str, Any], fail: Callable[..., TargetsError]) -> HttpReconciler:
    url = _string(body, "lookup", fail)
    kinds.refuse_credentials(body, "lookup", fail)
    if "{key}" not in url or not url.startswith(("http://", "https://")):
        raise fail(f'lookup {safe_url(url)!r} must be an http(s) URL with {{key}}, or "none"', "lookup")
    kwargs: dict[str, Any] = {"name": f"http:{name}", "headers": _headers(body, fail)}
    if "timeout" in body:
        kwargs["timeout"] = _duration(body["timeout"], "timeout", fail) / 1000
    for field in ("found_status", "absent_status"):
        if field in body:
            codes = body[field]
            if not isinstance(codes, list) or not all(
                isinstance(c, int) and not isinstance(c, bool) and 100 <= c <= 599 for c in codes
            ):
                raise fail(f"{field} must be a list of HTTP status codes", field)
            kwargs[field] = tuple(codes)
    both = set(kwargs.get("found_status", (200,))) & set(kwargs.get("absent_status", (404, 410)))
    if both:
        raise fail(f"HTTP status {min(both)} cannot mean both found and absent", "absent_status")
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


def _expanded(body: Mapping[str, Any], field: str, fail: Callable[..., TargetsError]) -> str:
    """A string setting with ``${VAR}`` filled in from the environment (a password, a URL)."""
    value = _string(body, field, fail)
    missing = [m for m in _ENV_REF.findall(value) if m not in os.environ]
    if missing:
        raise fail(f"{field} refers to ${{{missing[0]}}}, which is not set in the environment", field)
    out = _ENV_REF.sub(lambda m: os.environ[m.group(1)], value)
    if "\r" in out or "\n" in out:
        raise fail(f"{field} holds a line break (from the environment?)", field)
    return out


def _mail(name: str, body: Mapping[str, Any], fail: Callable[..., TargetsError]) -> MailDestination:
    if "smtp" not in body:
        raise fail('kind = "smtp" needs smtp = "smtp://HOST:PORT" (or smtps://, smtp+starttls://)')
    kwargs: dict[str, Any] = {"name": f"smtp:{name}"}
    for field in ("imap", "mailbox", "sent_copy", "copy_to", "id_domain", "smtp_user", "imap_user"):
        if field in body:
            kwargs[field] = _string(body, field, fail)
    for field in ("smtp_password", "imap_password"):
        if field in body:
            kwargs[field] = _expanded(body, field, fail)
    if "timeout" in body:
        kwargs["timeout"] = _duration(body["timeout"], "timeout", fail) / 1000
    try:
        return MailDestination(_expanded(body, "smtp", fail), **kwargs)
    except ValueError as e:
        field = next((f for f in ("sent_copy", "copy_to", "imap", "mailbox", "id_domain") if f in str(e)), "smtp")
        raise fail(str(e), field if field in body else None) from None


def _sql(name: str, body: Mapping[str, Any], fail: Callable[..., TargetsError]) -> SqlDestination:
    for field in ("database", "table"):
        if field not in body:
            what = "sqlite:///PATH or postgresql://..." if field == "database" else "the table written"
            raise fail(f'kind = "sql" needs {field} ({what})')
    kwargs: dict[str, Any] = {"name": f"sql:{name}"}
    for field in ("key_column", "id_column"):
        if field in body:
            kwargs[field] = _string(body, field, fail)
    if "stock" in body:
        spec = body["stock"]
        if not isinstance(spec, dict) or "table" not in spec or set(spec) - _STOCK:
            raise fail(
                'stock must be a table: { table = "stock", item_column = "item", quantity_column = "quantity" }',
                "stock",
            )
        if not all(isinstance(v, str) and v for v in spec.values()):
            raise fail("stock settings must be non-empty strings", "stock")
        kwargs["stock"] = Stock(**spec)
    if "timeout" in body:
        kwargs["timeout"] = _duration(body["timeout"], "timeout", fail) / 1000
    try:
        return SqlDestination(_expanded(body, "database", fail), _string(body, "table", fail), **kwargs)
    except MissingExtra as e:
        raise fail(str(e), "database") from None
    except ValueError as e:
        where = next((f for f in ("stock", "key_column", "id_column", "table", "database") if f in str(e)), "")
        raise fail(str(e), where if where in body else None) from None


def _backoff(spec: Any, fail: Callable[..., TargetsError]) -> Backoff:
    if spec is None:
        return Backoff()
    if not isinstance(spec, dict):
        raise fail('backoff must be a table: { first = "1s", factor = 2, max = "5m", tries = 5 }', "backoff")
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
    if issubclass(TimeoutError, obj):
        # OSError, Exception, ...: a timed-out call would count as "nothing happened" and be re-run.
        raise fail(
            f"definite_errors: {ref!r} also matches TimeoutError, whose outcome is unknown; name the "
            "destination's rejections only",
            "definite_errors",
        )
    return obj


def _import(ref: str, field: str, fail: Callable[..., TargetsError]) -> Any:
    mod_name, sep, attr = ref.partition(":")
    if not sep or not mod_name or not attr:
        raise fail(f'{field}: {ref!r} must be "package.module:name"', field)
    try:
        obj: Any = importlib.import_module(mod_name)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except Exception as e:  # the user's module may fail to import in any way
        raise fail(f"{field}: cannot load {ref!r}: {_why(e)}", field) from None
    return obj


def _why(e: Exception) -> str:
    hint = ""
    if isinstance(e, ModuleNotFoundError):
        # The `effects` command does not put the current folder on the import path.
        hint = " (install it, or add its folder to PYTHONPATH)"
    return f"{type(e).__name__}: {e}{hint}"


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
        raise fail(f'{field} must be a duration such as "90s", "10m", "24h"', field)
    try:
        ms = duration_ms(value)
    except TimeSpecError as e:
        raise fail(f"{field}: {e}", field) from None
    if ms <= 0:
        raise fail(f"{field} must be longer than zero", field)
    return ms


class _Where:
    """The line of a section, a target or one of its settings, for error messages: TOML parsers do
    not keep positions, so it is found in the text. A target may be written as a table
    (``[targets.NAME]``), an inline table (``NAME = { ... }`` under ``[targets]``) or dotted keys
    (``NAME.lookup = ...``); a setting as ``field = ...``, inside an inline table, or as a sub-table
    (``[targets.NAME.headers]``). When nothing matches, line 1."""

    def __init__(self, path: Path, text: str) -> None:
        self.path = path
        self.lines = text.splitlines()

    def _first(self, pattern: str, start: int = 0, stop: int | None = None) -> int | None:
        rx = re.compile(pattern)
        return next((i for i in range(start, stop or len(self.lines)) if rx.search(self.lines[i])), None)

    def top(self, name: str) -> int:
        """The line of a top-level section or key."""
        q = _quoted(name)
        i = self._first(rf"^\s*\[\[?\s*{q}\s*[\].]|^\s*{q}\s*[=.]")
        return 1 if i is None else i + 1

    def at(self, name: str, field: str | None = None) -> str:
        q, sep = _quoted(name), r"\s*\.\s*"
        # The target's own table, or the [targets] table holding it as an inline table / dotted keys.
        start = self._first(rf"^\s*\[\s*targets{sep}{q}\s*\]")
        if start is None:
            section = self._first(r"^\s*\[\s*targets\s*\]")
            if section is not None:
                start = self._first(rf"^\s*{q}\s*[=.]", section + 1, self._next_header(section))
        if start is None:
            start = self._first(rf"^\s*targets{sep}{q}\s*[=.]")
        if start is None:
            return f"{self.path}:1"
        if field is not None:
            f = _quoted(field)
            setting = self._first(rf"(^\s*|[{{,]\s*|{q}{sep}){f}\s*=", start, self._next_header(start))
            if setting is None:
                setting = self._first(rf"^\s*\[\s*targets{sep}{q}{sep}{f}\s*\]", start)
            if setting is not None:
                return f"{self.path}:{setting + 1}"
        return f"{self.path}:{start + 1}"

    def _next_header(self, after: int) -> int:
        i = self._first(r"^\s*\[", after + 1)
        return len(self.lines) if i is None else i


def _quoted(name: str) -> str:
    """A TOML key as written: bare, or in double or single quotes."""
    return rf"[\"']?{re.escape(name)}[\"']?"


def _line_in_message(msg: str) -> int | None:
    m = re.search(r"line (\d+)", msg)
    return int(m.group(1)) if m else None


def _first_clause(msg: str) -> str:
    return re.sub(r"\s*\(at line \d+, column \d+\)", "", msg)

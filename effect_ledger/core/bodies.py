"""What of a request body is recorded, per target (``body`` in the targets file).

    [targets.payments]
    body = "full"                          # the default: the canonical request as given
    body = "redact"                        # these fields' values replaced (dotted paths; a path
    redact = ["email", "customer.name"]    # through a list applies to each of its items)
    body = "digest"                        # nothing of the body: its SHA-256 only
    body = "encrypt"                       # sealed with the subject's erasable key
    subject = "customer.id"                # (effect_ledger.sdk.erasure); default: the effect key

The request digest (``request_digest``, the SHA-256 of the canonical request *as given*) is always
computed from the full request and recorded, whatever the policy: the "same key, different
request" check (``EffectConflict``) compares digests and keeps working. What is recorded in the
intent (the file, ``effects.events``, reconcilers' work items) is ``effect_ledger.sdk.bodies.stored``: with ``redact``,
``digest`` or ``encrypt`` the personal data never reaches ``effects.events``.

A reconciler is shown the body as recorded: redacted fields read ``"effect_ledger.redacted"``; a
digest-only body is ``{"effect_ledger.withheld": {"sha256": ...}}``; a sealed body is opened
from the ledger file's keys when they are there (and stays sealed once erased).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from effect_ledger.core.limits import CANONICAL_JSON
from effect_ledger.errors import InvalidEffect

REDACTED = "effect_ledger.redacted"
WITHHELD = "effect_ledger.withheld"
MAX_PATHS = 64


class BodyMode(StrEnum):
    FULL = "full"
    REDACT = "redact"
    DIGEST = "digest"
    ENCRYPT = "encrypt"


@dataclass(frozen=True, slots=True)
class BodyPolicy:
    """How a target's request bodies are recorded (see the module docstring)."""

    mode: BodyMode = BodyMode.FULL
    redact: tuple[str, ...] = ()
    subject: str | None = None  # ENCRYPT: dotted path of the subject's id; None: the effect key

    def __post_init__(self) -> None:
        mode = BodyMode(self.mode)
        object.__setattr__(self, "mode", mode)
        if mode is BodyMode.REDACT and not self.redact:
            raise ValueError('body = "redact" needs the fields to redact: redact = ["email", ...]')
        if self.redact and mode is not BodyMode.REDACT:
            raise ValueError('redact = [...] applies to body = "redact" only')
        if self.subject is not None and mode is not BodyMode.ENCRYPT:
            raise ValueError('subject applies to body = "encrypt" only')
        if len(self.redact) > MAX_PATHS:
            raise ValueError(f"at most {MAX_PATHS} fields to redact")
        for p in (*self.redact, *((self.subject,) if self.subject is not None else ())):
            if not isinstance(p, str) or not p or any(not part for part in p.split(".")):
                raise ValueError(f"{p!r} is not a field path (names joined by dots: customer.email)")


MAX_SEARCHABLE = 16


def check_searchable(policy: BodyPolicy, paths: tuple[str, ...]) -> None:
    """Raise ``ValueError`` unless every path of ``searchable`` can be searched in what ``policy``
    records: the console matches a search against the recorded request only, so a field whose value
    is not recorded (redacted, or a body kept as a digest or sealed) cannot be declared searchable;
    searching it would need an index of the very values the policy keeps out of the ledger."""
    if len(paths) > MAX_SEARCHABLE:
        raise ValueError(f"at most {MAX_SEARCHABLE} searchable fields")
    for p in paths:
        if not isinstance(p, str) or not p or any(not part for part in p.split(".")):
            raise ValueError(f"{p!r} is not a field path (names joined by dots: customer.email)")
    if paths and policy.mode in (BodyMode.DIGEST, BodyMode.ENCRYPT):
        raise ValueError(f'searchable fields need the request recorded: body = "{policy.mode.value}" keeps none of it')
    for p in paths:
        for r in policy.redact:
            if p == r or p.startswith(r + ".") or r.startswith(p + "."):
                raise ValueError(f"{p!r} cannot be searchable: its value is redacted ({r!r})")


def field_values(request: Any, path: str) -> list[str]:
    """The recorded values at a dotted ``path`` of a request, as text (a path through a list gives
    each item's); only strings and integers count: a search compares text with text."""
    nodes = [request]
    for part in path.split("."):
        nxt: list[Any] = []
        for n in nodes:
            for item in n if isinstance(n, list) else (n,):
                if isinstance(item, dict) and part in item:
                    nxt.append(item[part])
        nodes = nxt
    out: list[str] = []
    for n in nodes:
        for v in n if isinstance(n, list) else (n,):
            if (isinstance(v, str) and v != REDACTED) or (isinstance(v, int) and not isinstance(v, bool)):
                out.append(str(v))
    return out


def canonical_text(value: Any) -> str:
    return CANONICAL_JSON.encode(value)


def redacted(value: Any, paths: tuple[str, ...]) -> Any:
    """``value`` with the value at each dotted path replaced by ``REDACTED`` (a copy)."""
    out = json.loads(canonical_text(value))
    for p in paths:
        _redact(out, p.split("."))
    return out


def _redact(node: Any, parts: list[str]) -> None:
    if isinstance(node, list):
        for item in node:
            _redact(item, parts)
        return
    if not isinstance(node, dict) or parts[0] not in node:
        return
    if len(parts) == 1:
        node[parts[0]] = REDACTED
    else:
        _redact(node[parts[0]], parts[1:])


def subject_of(policy: BodyPolicy, effect_id: str, canonical: str) -> str:
    """The subject whose key seals this body: the value at ``policy.subject``, else the key."""
    if policy.subject is None:
        return effect_id
    node: Any = json.loads(canonical)
    for part in policy.subject.split("."):
        if not isinstance(node, dict) or part not in node:
            raise InvalidEffect(
                f"the target seals request bodies per subject at {policy.subject!r}, which this request lacks"
            )
        node = node[part]
    if isinstance(node, bool) or not isinstance(node, str | int) or node == "":
        raise InvalidEffect(f"the subject at {policy.subject!r} must be a non-empty string or an integer")
    return str(node)


def parse(body: dict[str, Any], fail: Any) -> BodyPolicy:
    """The policy of a target's TOML table (``body``, ``redact``, ``subject``); ``fail(msg, field)``
    builds the ``TargetsError``."""
    mode = body.get("body", BodyMode.FULL.value)
    if mode not in {m.value for m in BodyMode}:
        raise fail(f"body must be one of {', '.join(repr(m.value) for m in BodyMode)}", "body")
    redact = body.get("redact", [])
    if not isinstance(redact, list) or not all(isinstance(p, str) for p in redact):
        raise fail("redact must be a list of field paths", "redact")
    subject = body.get("subject")
    if subject is not None and not isinstance(subject, str):
        raise fail("subject must be a field path", "subject")
    # Which setting is wrong, for the error's line: the one the message is about.
    field = "body" if mode == BodyMode.REDACT and not redact else "redact" if redact else "subject"
    if subject is not None and mode != BodyMode.ENCRYPT:
        field = "subject"
    try:
        return BodyPolicy(BodyMode(mode), tuple(redact), subject)
    except ValueError as e:
        raise fail(str(e), field) from None


__all__ = [
    "BodyMode", "BodyPolicy", "REDACTED", "WITHHELD", "redacted", "subject_of", "parse", "canonical_text",
    "check_searchable", "field_values", "MAX_SEARCHABLE",
]  # fmt: skip

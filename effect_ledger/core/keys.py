"""The effect key rule, and the canonical form of a request.

NEVER CHANGE ``effect_key``. Keys are stored in ledgers and handed to destinations as idempotency
keys; a different rule would turn a replay into a second effect. ``tests/unit/core/test_keys.py`` pins
vectors so that a change fails the build.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any
from urllib.parse import quote

from effect_ledger.core.limits import CANONICAL_JSON, MAX_ID_BYTES, MAX_REQUEST_BYTES, check_text
from effect_ledger.errors import EffectTooLarge, InvalidEffect

DEFAULT_NAMESPACE = "default"
MAX_KEY_LENGTH = 255  # what common payment and ticket APIs accept as an idempotency key
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}$")
_KEY = re.compile(r"^[\x21-\x7e]+$")  # printable ASCII, no spaces: safe in HTTP headers and URLs


def check_name(kind: str, value: object) -> str:
    """Return ``value`` if it is a valid target or operation name (``kind`` names it in the error).

    A name is 1-64 ASCII letters, digits, ``_``, ``.`` or ``-``, starting with a letter or digit;
    anything else raises ``InvalidEffect``.
    """
    if not isinstance(value, str) or not _NAME.fullmatch(value):
        raise InvalidEffect(
            f"invalid {kind} {value!r}: 1-64 letters, digits, '_', '.', '-', starting with a letter or digit"
        )
    return value


def check_key(key: object) -> str:
    """Return ``key`` if it can serve as an idempotency key, or raise ``InvalidEffect``.

    A key is 1-255 printable ASCII characters without spaces and not made only of dots, so that it
    is safe in HTTP headers and URLs.
    """
    if not isinstance(key, str) or not key:
        raise InvalidEffect(f"invalid effect key {key!r}: a non-empty string")
    if len(key) > MAX_KEY_LENGTH:
        raise InvalidEffect(f"effect key is {len(key)} characters; at most {MAX_KEY_LENGTH}")
    if not _KEY.fullmatch(key):
        raise InvalidEffect(f"invalid effect key {key!r}: printable ASCII without spaces")
    if not key.strip("."):
        # "." and ".." are the names of "this folder" and "the parent" in a URL path: a destination,
        # or a proxy in front of it, may resolve them even percent-encoded, and ask about another key.
        raise InvalidEffect(f"invalid effect key {key!r}: a key made only of dots is a URL path step, not a name")
    return key


def key_path_segment(key: str) -> str:
    """The key as one URL path segment, injective for every key: every byte outside
    ``A-Z a-z 0-9 - _ ~`` is percent-encoded, the dot included, so no key becomes ``.`` or ``..``
    (which a URL client or server resolves to another path) and none contains ``/``. ``%`` itself
    is encoded, so no two keys share a segment. Every client that puts a key in a URL uses this.

    The segment must reach the wire as it is: HTTP clients that normalise a URL decode ``%2E``
    back to ``.`` first (aiohttp does, for a ``str``): give aiohttp ``yarl.URL(url, encoded=True)``
    (``effect_ledger.targets.keyurl``)."""
    return quote(key, safe="").replace(".", "%2E")


def effect_key(target: str, operation: str, run_id: str, step: str, namespace: str = DEFAULT_NAMESPACE) -> str:
    """``<target>:<sha256 hex of the JSON array [namespace, run_id, step, operation]>``.

    Built only from the caller's logical identifiers — never from attempt numbers, engine run ids
    or clocks — so the same logical write gets the same key across process restarts, workflow
    retries and re-numbered steps. NEVER CHANGE THIS RULE (see the module docstring).
    """
    check_name("target", target)
    check_name("operation", operation)
    check_ids(run_id, step, namespace)
    return checked_effect_key(target, operation, run_id, step, namespace)


_KEY_MATERIAL = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))  # json.dumps with these options


def checked_effect_key(target: str, operation: str, run_id: str, step: str, namespace: str) -> str:
    """``effect_key`` for identifiers the caller has already checked (``Ledger.execute`` checks
    them once, for the intent too). The rule itself: NEVER CHANGE IT."""
    material = _KEY_MATERIAL.encode([namespace, run_id, step, operation])
    return f"{target}:{hashlib.sha256(material.encode()).hexdigest()}"


def check_ids(run_id: object, step: object, namespace: object) -> None:
    """The caller's logical identifiers (``None``: not given): non-empty strings UTF-8 can encode,
    at most ``MAX_ID_BYTES`` each. They are part of the key and recorded in every intent."""
    for kind, value in (("run_id", run_id), ("step", step), ("namespace", namespace)):
        if value is not None:
            check_text(kind, value, MAX_ID_BYTES)


def canonical_request(value: Any) -> tuple[str, str]:
    """The canonical JSON of a request and its sha256 (the ``request_digest``), checked before
    anything is written: JSON-serialisable, valid Unicode, at most ``MAX_REQUEST_BYTES``. The
    bytes are encoded once, for the digest and the size check both."""
    canonical = canonical_json(value)
    try:
        data = canonical.encode()
    except UnicodeEncodeError:
        raise InvalidEffect("request is not valid Unicode (a lone surrogate?)") from None
    if len(data) > MAX_REQUEST_BYTES:
        raise EffectTooLarge("request (canonical JSON)", len(data), MAX_REQUEST_BYTES)
    return canonical, hashlib.sha256(data).hexdigest()


def canonical_json(value: Any) -> str:
    """JSON with sorted keys and no whitespace: equal requests give equal bytes."""
    try:
        return CANONICAL_JSON.encode(value)
    except (TypeError, ValueError, RecursionError) as e:  # RecursionError: nested too deep, or circular
        raise InvalidEffect(f"request is not JSON-serialisable: {type(e).__name__}: {e}") from e


def digest(canonical: str) -> str:
    """The sha256 (hex) of a request's canonical JSON, as ``canonical_request`` computes it."""
    return hashlib.sha256(canonical.encode()).hexdigest()

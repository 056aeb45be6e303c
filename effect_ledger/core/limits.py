"""Size limits: every record effect-ledger writes is bounded, and checked before anything is written.

Why these numbers: Kafka refuses a record over its message size (the producer's
``message.max.bytes``, 1,000,000 bytes by default; the broker's ``message.max.bytes`` and a topic's
``max.message.bytes``, 1,048,588). One event carries at most one request or one receipt value plus
a few short texts, so with the limits below the largest event stays near 270 KiB: well inside
Kafka's default, with room for the Avro envelope, the headers, and a bounded copy in a DeadLetter.

What happens over a limit depends on who is speaking:

* what the caller gives (a request, ids, a receipt id, a person's decision) is refused with
  ``EffectTooLarge`` before anything is written or called;
* what comes back after the destination acted (a call's value, an error text, a reconciler's
  answer) is never refused, since the call already happened: it is stored bounded (a receipt value
  as a digest plus its head, flagged INEXACT_RECEIPT; a text truncated) so no event can exceed
  these limits and nothing is lost.
"""

from __future__ import annotations

import hashlib
import json
import reprlib
from typing import Any

from effect_ledger.core.model import INEXACT, INEXACT_PREFIX
from effect_ledger.errors import EffectTooLarge, InvalidEffect

#: The canonical JSON of requests and receipt values: sorted keys, no whitespace, no NaN. One
#: encoder for every call (``json.dumps`` with these options builds a new one each time); its
#: ``encode`` is exactly ``json.dumps(value, sort_keys=True, separators=(",", ":"),
#: ensure_ascii=False, allow_nan=False)``, so digests do not change.
CANONICAL_JSON = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)

MAX_REQUEST_BYTES = 256 * 1024  # canonical JSON of a request, UTF-8; over it: EffectTooLarge
MAX_RECEIPT_BYTES = 256 * 1024  # JSON of a receipt value; over it: stored digested, flagged
MAX_ID_BYTES = 1024  # run_id, step, namespace (the key itself: MAX_KEY_LENGTH in keys.py, 255)
MAX_RECEIPT_ID_BYTES = 1024  # a receipt id; from a caller: refused, from a target's function: digested
MAX_TEXT_BYTES = 4096  # a person's by/reason (refused over it); error texts, reasons (truncated)
MAX_EVENT_BYTES = 1_000_000  # an encoded event; the relay dead-letters a row over it without sending
MAX_DEAD_LETTER_COPY_BYTES = 64 * 1024  # the copy of a dead-lettered row's value on effects.dlq
# A processor table value (one folded effect, processors/table_value.py): it keeps one request and
# one receipt value (each bounded above) plus the facts without their payloads, and must fit in one
# changelog record under Kafka's 1,000,000-byte producer default with room for key and headers. The
# processor dead-letters an event that would make a value larger, rather than write it.
MAX_TABLE_VALUE_BYTES = 900_000
_HEAD_BYTES = 4096  # what an oversized receipt value keeps of its JSON, beside the digest
_REPR_BYTES = 16 * 1024  # what a value that is not JSON keeps of its repr

_repr = reprlib.Repr()
_repr.maxlevel = 8
_repr.maxdict = _repr.maxlist = _repr.maxtuple = _repr.maxset = _repr.maxfrozenset = _repr.maxdeque = 200
_repr.maxstring = _repr.maxother = 2000
_repr.maxlong = 400


def show(value: object, width: int = 60) -> str:
    """A short repr for error messages (a refused 2 MB string is not quoted whole)."""
    try:
        text = repr(value) if not isinstance(value, str) or len(value) <= width else repr(value[:width]) + "…"
    except Exception:
        text = f"<{type(value).__name__}>"
    return text if len(text) <= width + 4 else text[:width] + "…"


def error_text(e: BaseException, limit: int = 256) -> str:
    """``TypeName: message`` of an exception raised by someone else's code, bounded; its own
    ``__str__`` may raise too, and an error about a value must not become a second error."""
    try:
        message = str(e)
    except Exception:
        message = "<str() raised>"
    return f"{type(e).__name__}: {bounded_text(message, limit)}"


def check_text(kind: str, value: object, limit: int = MAX_TEXT_BYTES) -> str:
    """A non-empty string that UTF-8 can encode (no lone surrogate), at most ``limit`` bytes.
    ``InvalidEffect`` otherwise (``EffectTooLarge`` for the size)."""
    if not isinstance(value, str) or not value:
        raise InvalidEffect(f"invalid {kind} {show(value)}: a non-empty string")
    if value.isascii():
        size = len(value)
    else:
        try:
            size = len(value.encode())
        except UnicodeEncodeError:
            raise InvalidEffect(f"invalid {kind} {show(value)}: not valid Unicode (a lone surrogate?)") from None
    if size > limit:
        raise EffectTooLarge(kind, size, limit)
    return value


def bounded_text(text: str, limit: int = MAX_TEXT_BYTES) -> str:
    """``text`` as it can be recorded: lone surrogates escaped, cut to ``limit`` UTF-8 bytes with a
    note of how much was cut. For texts the ledger records but nobody can be asked to shorten (an
    exception's message, a reconciler's reason)."""
    if text.isascii() and len(text) <= limit:
        return text
    data = text.encode("utf-8", "backslashreplace")
    if len(data) <= limit:
        return data.decode()
    note = f" … [cut: {len(data)} bytes]"
    return data[: limit - len(note)].decode("utf-8", "ignore") + note


def receipt_text(value: Any) -> tuple[str, str | None]:
    """The JSON text recorded for what a destination returned, and why it is not the exact value
    (None when it is). Never raises. A value that is not JSON (a datetime, a dict with mixed key
    types, a circular structure, an object) is recorded as its bounded ``repr`` plus, when it can
    be had, an approximation with ``str()`` for what JSON cannot hold (``value``); one over
    ``MAX_RECEIPT_BYTES`` as its size, sha256 and head. Both go under the reserved key ``INEXACT``
    (``{"effect_ledger.inexact": {"reason": ..., "type": ..., ...}}``), which the fold flags
    INEXACT_RECEIPT."""
    try:
        text = CANONICAL_JSON.encode(value)
        size = len(text) if text.isascii() else len(text.encode())
    # Not only TypeError, ValueError (UnicodeEncodeError) and RecursionError: encoding runs the
    # value's own code (a mapping's items(), a __str__ of a key), and whatever that raises, the
    # call has happened and must be recorded.
    except Exception as e:
        why = f"not JSON: {error_text(e)}"
        return _not_json(value, why), why
    if size > MAX_RECEIPT_BYTES:
        data = text.encode()
        why = f"{len(data)} bytes of JSON, over the {MAX_RECEIPT_BYTES}-byte limit"
        return _marker(
            value,
            why,
            bytes=len(data),
            sha256=hashlib.sha256(data).hexdigest(),
            head=data[:_HEAD_BYTES].decode("utf-8", "ignore"),
        ), why
    if text.startswith(INEXACT_PREFIX):  # a value that looks like the marker must not pass for one
        why = f"uses the reserved key {INEXACT!r}"
        return _not_json(value, why), why
    return text, None


def _not_json(value: Any, why: str) -> str:
    try:
        shown = _repr.repr(value)
    except Exception as e:  # a __repr__ that raises is still an answer the ledger must record
        shown = f"<{type(value).__qualname__}: repr raised {type(e).__name__}>"
    extra: dict[str, Any] = {"repr": bounded_text(shown, _REPR_BYTES)}
    approx = _approximate(value)
    if approx is not None:
        extra["value"] = approx
    return _marker(value, why, **extra)


def _approximate(value: Any) -> Any:
    """The value as JSON with ``str()`` for what JSON cannot hold (a datetime, a Decimal, an object)
    and string keys, or None when even that fails (circular) or is over half the receipt limit."""
    for sort in (True, False):  # keys of mixed types cannot be sorted
        try:
            text = json.dumps(value, default=str, sort_keys=sort, ensure_ascii=False, allow_nan=False)
            if len(text.encode()) > MAX_RECEIPT_BYTES // 2:
                return None
            return json.loads(text)
        except Exception:  # circular, unsortable, or the value's own str()/items() raising
            continue
    return None


def _marker(original: Any, why: str, **extra: Any) -> str:
    try:
        kind = str(type(original).__qualname__)
    except Exception:  # a metaclass's own __qualname__ can raise too
        kind = "?"
    body = {"reason": bounded_text(why, 512), "type": bounded_text(kind, 256), **extra}
    return json.dumps({INEXACT: body}, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def digest_id(text: str) -> str:
    """The receipt id of a value that names none: ``sha256:`` and 32 hex digits of its JSON."""
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()[:32]

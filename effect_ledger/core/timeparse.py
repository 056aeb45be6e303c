"""Times and durations on the command line: ``2026-11-29T10:00:00Z``, ``2026-11-29 10:00``,
``now``, ``-1h`` (relative to now), epoch milliseconds; durations ``90s``, ``10m``, ``2h``, ``1d``.

Times are bounded to what Kafka timestamps and ``iso`` can hold: from 1970-01-01 (epoch 0) to the
end of year 9999; durations to that span. Only ASCII text of at most ``MAX_TEXT`` characters is
read. Anything else is a ``TimeSpecError``, never an overflow or a plain ``ValueError``."""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime

# ASCII: ``\d`` would also match other scripts' digits, which ``float`` reads but ``int`` may not.
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$", re.ASCII)
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, None: 1000}


MAX_MS = 253_402_300_799_999  # 9999-12-31T23:59:59.999Z
# The longest text a valid time can be is an ISO time with microseconds and an offset (32
# characters); the rest is room for spaces. Longer text is refused before any parsing: int() of
# thousands of digits raises a plain ValueError, and the message would quote it all.
MAX_TEXT = 64


class TimeSpecError(ValueError):
    pass


_DURATION_EXAMPLES = "examples: 90s, 10m, 2h, 1d"
_TIME_EXAMPLES = "examples: 2026-11-29T10:00:00Z, now, -1h, epoch ms"


def _readable(text: str, what: str, examples: str) -> None:
    """Refuse, as a ``TimeSpecError``, text no time or duration can be: too long, or not ASCII (so
    ``int``, ``float``, ``isdigit`` and ``fromisoformat`` below only ever see ASCII digits)."""
    if len(text) > MAX_TEXT:
        raise TimeSpecError(f"not a {what}: {text[:24]!r}... is {len(text)} characters, at most {MAX_TEXT}")
    if not text.isascii():
        raise TimeSpecError(f"not a {what}: {text!r} ({examples}; ASCII digits only)")


def duration_ms(text: str) -> int:
    _readable(text, "duration", _DURATION_EXAMPLES)
    m = _DURATION.match(text)
    if not m:
        raise TimeSpecError(f"not a duration: {text!r} ({_DURATION_EXAMPLES})")
    ms = float(m.group(1)) * _UNIT_MS[m.group(2)]
    if not ms <= MAX_MS:
        raise TimeSpecError(f"duration out of range: {text!r} (at most the span from 1970 to 9999)")
    return int(ms)


def time_ms(text: str, now_ms: int | None = None) -> int:
    now = now_ms if now_ms is not None else time.time_ns() // 1_000_000
    _readable(text, "time", _TIME_EXAMPLES)
    t = text.strip()
    if t == "now":
        ms = now
    elif t.startswith("-"):
        ms = now - duration_ms(t[1:])
    elif t.isdigit() and len(t) >= 12:
        ms = int(t)
    else:
        try:
            dt = datetime.fromisoformat(t.replace("Z", "+00:00"))
        except ValueError:
            raise TimeSpecError(f"not a time: {text!r} ({_TIME_EXAMPLES})") from None
        if dt.tzinfo is None:
            dt = dt.replace(tzinfo=UTC)
        ms = int(dt.timestamp() * 1000)
    if not 0 <= ms <= MAX_MS:
        raise TimeSpecError(f"time out of range: {text!r} (from 1970-01-01 to 9999-12-31)")
    return ms


def iso(ms: int | None) -> str:
    if ms is None:
        return "-"
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")[:-4] + "Z"

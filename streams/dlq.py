"""Dead letters: a record that could not be decoded, applied or passed on, kept with the reason.

A dead letter must itself always be deliverable, or the consumer that writes it could not move past
the bad record: so it holds a bounded copy. The limits below keep a ``DeadLetter`` far under
Kafka's default record limit (1 MB) whatever it copies; what is cut off is named in the error
(original size and SHA-256), so the copy is still evidence.
"""

from __future__ import annotations

import hashlib

from effect_ledger.core.model import DeadLetter

#: Bytes of the original record value kept in a dead letter.
MAX_VALUE_COPY = 64 * 1024
#: Bytes of the original record key kept (and used as the dead letter's own Kafka key).
MAX_KEY_COPY = 1024
#: Characters of the error text.
MAX_ERROR = 4000


def _cut(data: bytes | None, limit: int, what: str) -> tuple[bytes | None, str]:
    if data is None or len(data) <= limit:
        return data, ""
    digest = hashlib.sha256(data).hexdigest()
    return data[:limit], f"; {what} cut to its first {limit:,} of {len(data):,} bytes (sha256 {digest})"


def dead_letter(
    at_ms: int,
    consumer: str,
    topic: str,
    partition: int,
    offset: int,
    error: str,
    key: bytes | None,
    value: bytes | None,
) -> tuple[DeadLetter, bytes | None]:
    """The bounded dead letter for one record, and the Kafka key to send it with."""
    key = bytes(key) if key is not None else None
    value = bytes(value) if value is not None else None
    kept_key, key_note = _cut(key, MAX_KEY_COPY, "key")
    kept_value, value_note = _cut(value, MAX_VALUE_COPY, "value")
    notes = key_note + value_note
    text = error if len(error) <= MAX_ERROR - len(notes) else error[: max(0, MAX_ERROR - len(notes) - 1)] + "…"
    return DeadLetter(at_ms, consumer, topic, partition, offset, text + notes, kept_key, kept_value), kept_key

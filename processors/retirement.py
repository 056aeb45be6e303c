"""Retirement in the ledger processor (the rule: ``effect_ledger.core.retention``).

A ``Retirement`` command arrives on ``effects.events`` (written by ``effects retire``). Inside the
stream, as every table write must be, the processor checks it against the table (the effect is
still closed, at the version the sweep saw, and old enough at the command's time), then:

1. replaces the key's table value with a *retired marker* (the table's value format 3: the usual
   header, due "never", then the marker's JSON; a few hundred bytes instead of every event);
2. forgets the key in its caches and its deadline index;
3. writes a tombstone (a null value) for the key to ``effects.state``: the SQL sink deletes the row,
   a compacted-table subscriber drops the key, and compaction removes the key's states.

A command replayed after a crash finds the marker and writes the tombstone again (idempotent). The
lookup answers a retired key with ``410`` and the marker (the SDK raises ``EffectRetired``), and an
event for a retired key is dead-lettered, never folded: nothing can bring the key back.
"""

from __future__ import annotations

import logging
import struct
from typing import Any

from effect_ledger.core.effect import to_state
from effect_ledger.core.model import Retirement
from effect_ledger.core.retention import Retired, why_not
from effect_ledger.processors.table_value import MARKER_FORMAT
from effect_ledger.streams.log_clock import log_time_of_message

log = logging.getLogger("effect_ledger.processor")

_HEADER = struct.Struct(">Bq")  # the processor table value's header: format, due_ms (-1: nothing due)


def marker_value(marker: Retired) -> bytes:
    return _HEADER.pack(MARKER_FORMAT, -1) + marker.to_json().encode()


def is_marker(value: bytes | None) -> bool:
    return value is not None and len(value) >= _HEADER.size and value[0] == MARKER_FORMAT


def marker_of(value: bytes) -> Retired:
    return Retired.from_json(value[_HEADER.size :])


def lookup_answer(key: str, value: bytes) -> dict[str, Any]:
    """The lookup's answer (status 410) for a retired key."""
    m = marker_of(value)
    return {
        "effect_id": key,
        "known": True,
        "retired": True,
        "state": m.state,
        "request_digest": m.request_digest,
        "receipt_id": m.receipt_id,
        "updated_ms": m.updated_ms,
        "retired_ms": m.retired_ms,
    }


def refusal(value: bytes) -> str:
    """Why an event for a retired key is dead-lettered rather than folded."""
    m = marker_of(value)
    return f"effect {m.effect_id} was retired ({m.state}) at {m.retired_ms}: its events are no longer folded"


async def apply(processor: Any, msg: Any, cmd: Retirement) -> None:
    """Apply a retirement command (see the module docstring). ``processor`` is the
    ``LedgerProcessor``: its table, caches, index and ``effects.state`` topic."""
    key = cmd.effect_id
    if msg.key is not None and msg.key != key.encode():
        await processor.dead_letter(msg, f"record key {msg.key!r} is not its effect_id {key!r}")
        return
    previous = processor.table.get(key)
    if previous is None:
        log.info("retirement of %s ignored: the key is not known here", key)
        return
    if not is_marker(previous):
        effect = processor._load(key, previous)
        if effect is None:
            return
        # The sweep saw the published state's version, which does not count claim verdicts. Whether the
        # effect is due counts on the log's time (when the log took the command), not the sweeper's.
        now = log_time_of_message(msg)
        now = cmd.at_ms if now is None else now
        why = why_not(effect.state, effect.updated_ms, to_state(effect).version, now, cmd.after_ms, cmd.version)
        if why is not None:
            log.info("retirement of %s not applied: %s", key, why)
            return
        marker = Retired.of(effect, now)
        processor.out.put(msg.partition, processor.table_key(key), marker_value(marker))
        processor._cache.pop(key, None)
        processor.index.discard(key)
    # The tombstone (again, for a replayed command: it may be what the crash lost), written with the
    # batch's other records (``batch_writer``).
    processor.out.produce(processor.state_topic.get_topic_name(), msg.partition, key.encode(), None)


__all__ = ["MARKER_FORMAT", "apply", "is_marker", "marker_of", "marker_value", "lookup_answer", "refusal"]

"""Kafka mode with a lookup: importing into the ledger file what the processor knows about a key
(events other hosts wrote), so an agent restarted on another host decides on what its predecessor
did."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from effect_ledger.core.model import OPEN_STATES, Event, is_event
from effect_ledger.core.plan import CONFLICT_RETRIES
from effect_ledger.errors import DecodeError, LedgerUnavailable
from effect_ledger.sdk.store.sqlite import Claim, Loaded, Store, VersionConflict

if TYPE_CHECKING:  # aiohttp, which the lookup uses, loads only in Kafka mode
    from effect_ledger.sdk.kafka.lookup import ProcessorLookup

log = logging.getLogger("effect_ledger.sdk")


async def merge_remote(
    store: Store, lookup: ProcessorLookup, key: str, loaded: Loaded, clock: Callable[[], int]
) -> Loaded:
    """Import what the processor knows about the key; returns what is known after it. An open attempt
    made on another host is claimed by the worker its intent names, until its deadline."""
    decoded = remote_events(store, key, await lookup.events(key))
    if not decoded:
        return loaded
    before = loaded.effect
    for _ in range(CONFLICT_RETRIES):
        try:
            await store.append(before, decoded, now_ms=clock(), sent=True)
            break
        except VersionConflict:
            before = (await store.load(key)).effect
    merged = await store.load(key)
    e = merged.effect
    if e is not None and merged.claim.owner is None and e.state in OPEN_STATES and e.intent is not None:
        # The attempt was made on another host: its intent names the worker, its deadline the lease.
        return Loaded(e, Claim(e.intent.worker, e.intent.deadline_ms))
    return merged


def remote_events(store: Store, key: str, remote: list[bytes]) -> list[Event]:
    """The facts in a processor's answer. Only events of this key are ever copied into the file: a
    record that is not an event (a state or work item a processor table picked up before it refused
    them) is no fact and is left out; one that does not decode, or names another key, makes the
    answer one the SDK cannot vouch for."""
    out: list[Event] = []
    for body in remote:
        try:
            record = store.codec.decode(body)
        except DecodeError as e:
            raise LedgerUnavailable(f"the ledger processor answered an undecodable record for {key}: {e}") from e
        if not is_event(record):
            log.warning("lookup of %s: left out a %s record, which is not an event", key, type(record).__name__)
            continue
        if record.effect_id != key:
            raise LedgerUnavailable(f"the ledger processor answered an event of {record.effect_id!r} for {key!r}")
        out.append(record)
    return out


__all__ = ["merge_remote", "remote_events"]

"""Every access to faust-streaming's private parts, in one place, pinned to the version they were
read from. ``tests/unit/test_faust_internals.py`` has one test per access: an upgrade that moves any
of them fails there, loudly, instead of somewhere in the processor.

Why each is needed (faust 0.15.3 has no public way):

* ``as_current_event``: a table read or write goes to the RocksDB partition and the changelog
  partition of faust's *current event* (``faust.streams._current_event``). A batch from
  ``take_events`` mixes partitions, so each key is written with its own last event made current.
* ``committed_offset``: where the group's committed offset put a partition after a rebalance
  (``Consumer._committed_offset``); everything before it was folded before the commit.
* ``peer_urls``: the web URLs of the group's workers, from the assignor (``_tps_url``), to forward
  a lookup to the owner of a key's partition of effects.events.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import faust
import faust.streams
from faust.types import TP

#: The faust-streaming release the accesses below were read from (DEPENDENCIES.md: use it exactly).
FAUST_VERSION = "0.15.3"


@contextmanager
def as_current_event(event: Any) -> Iterator[None]:
    """Make ``event`` faust's current event for the block (the partition tables read and write)."""
    token = faust.streams._current_event.set(weakref.ref(event))
    try:
        yield
    finally:
        faust.streams._current_event.reset(token)


def committed_offset(app: faust.App, topic: str, partition: int) -> int | None:
    """The committed offset faust sought to for ``topic[partition]`` on assignment (None: unknown)."""
    offsets = getattr(app.consumer, "_committed_offset", None)
    if offsets is None:
        return None
    value = offsets.get(TP(topic, partition))
    return None if value is None else int(value)


def peer_urls(app: faust.App) -> set[str]:
    """The web URLs of every worker of the group (this one included), as the assignor knows them."""
    return {str(u) for u in app.assignor._tps_url.values()}

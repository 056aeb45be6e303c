"""Letting partitions go: the worker's batch in flight against faust's rebalances and its stop.

The next owner of a partition reads its changelog as soon as this worker rejoins the group (after a
revocation) or leaves it (when it stops). A batch still being written then would land after the
next owner's records, and the compacted changelog and effects.state would keep the older state; and
faust acknowledges a batch in flight when it closes the stream on the way out, and commits what was
acknowledged, so a stopping worker committed events whose fold never reached Kafka. So:

* a revocation, or a stop, waits for the batch being folded and written (at most ``drain_s``; the
  consumer keeps heartbeating meanwhile, and the group waits for a member's rejoin up to its
  rebalance timeout);
* past that wait, the batch never counts as processed, even if it ends later;
* after a revocation, events of the revoked partitions (still in faust's take buffer) are not
  folded; after a stop, no event is;
* an event fetched in an earlier generation of the group (``current``) is not folded either, even
  if its partition is this worker's again: faust's stream drops such messages as it takes them
  from the fetcher, but its take buffer keeps those it took before the rebalance. A partition given
  back is recovered from its changelog and read again from the group's commit; an event fetched
  before, folded against the table it had then, wrote a value after the interim owner's (seen in a
  short `make chaos` run: a worker held its fold through a cut, got its partitions back, and its
  next batch, from the take buffer, overwrote the second attempt the other worker had folded);
* a batch that raised (cancelled, or Kafka refused a record) never counts as processed either;
* a batch is folded only while the worker knows itself a member of the group (``member``: the
  coordinator confirmed it recently enough that its session cannot have expired). Otherwise the
  group may have given its partitions to another worker, which folds the same events: this one's
  writes would land after the owner's. The fold waits until the coordinator confirms it again,
  or its partitions are revoked (their events are then left to the next owner), or it stops. A
  revocation during that wait leaves the whole batch (``revoke`` then ``assign`` of the same
  partition: it is read again from the group's commit, against its recovered table). The writes
  of a batch are held the same way if the worker stopped knowing itself a member while it folded
  (``confirmed``), and given up when a revocation or a stop waits for the batch.

"Never counts as processed" is ``leave``: faust will not acknowledge the event
(``faust_internals.leave_unacknowledged``), so the group's commit stays before it and the
partition's next owner folds it. faust's signals drive ``revoke``, ``assign`` and ``stop``."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

log = logging.getLogger(__name__)


class LetGo(Exception):
    """A batch not written because its partitions are being let go (``Handover.confirmed``): its
    events are left to their next owner; the fold goes on with the next batch."""


class Handover:
    """One worker's fold against its partitions' comings and goings (module docstring).

    ``leave``: mark an event never to be acknowledged; ``forget``: drop what the worker holds about
    partitions it no longer owns (its deadline index and cache), run once a revocation took effect;
    ``clock``: monotonic seconds (the log says how long a wait took); ``member``: whether the
    worker knows itself a member of its group now (``why_not_member``: in the log's words, why not);
    ``poll_s``: how often a held fold looks again; ``current``: whether an event was fetched in
    the group's current generation."""

    def __init__(
        self,
        drain_s: float,
        leave: Callable[[Any], None],
        forget: Callable[[], None],
        clock: Callable[[], float] = time.monotonic,
        member: Callable[[], bool] = lambda: True,
        why_not_member: Callable[[], str] = lambda: "",
        poll_s: float = 0.05,
        current: Callable[[Any], bool] = lambda _event: True,
    ) -> None:
        self.drain_s = drain_s
        self._leave = leave
        self._forget = forget
        self._clock = clock
        self._member = member
        self._why_not_member = why_not_member
        self._poll_s = poll_s
        self._current = current
        self._lock = asyncio.Lock()  # held while a batch is folded and written
        self.revoked: frozenset[Any] = frozenset()  # revoked from this worker, not assigned to it again
        self.stopping = False  # the worker stops: no batch is folded any more
        self._in_flight: Sequence[Any] = ()
        self._revocations = 0  # revocations so far (a held batch learns of one that came meanwhile)
        self._waiting = 0  # revocations and stops waiting for the batch in flight

    @contextlib.asynccontextmanager
    async def batch(self, events: Sequence[Any]) -> AsyncIterator[list[Any]]:
        """Fold the events the block is given (those the worker may still fold), with no
        revocation or stop taking effect meanwhile; if the block raises, none of ``events`` counts
        as processed."""
        revocations = self._revocations
        await self._until_member()
        async with self._lock:
            revoked = self.revoked
            if self.stopping or self._revocations != revocations:
                # A revocation while the fold was held: a partition given back since is recovered
                # from its changelog and read again from the group's commit; these events were
                # fetched before, against a table that no longer is.
                keep = self._left(events, lambda _event: True)
            else:
                keep = self._left(events, lambda e: e.message.tp in revoked or not self._current(e))
            self._in_flight = keep
            try:
                yield keep
            except BaseException:
                for event in keep:
                    self._leave(event)
                log.warning("a batch of %d event(s) not folded and written to the end: left unacknowledged", len(keep))
                raise
            finally:
                self._in_flight = ()
            if self.revoked is not revoked:  # revoked meanwhile: the wait for this batch had run out
                self._forget()

    async def _until_member(self) -> None:
        """Wait until the worker knows itself a member of its group again, or stops (a revocation
        meanwhile is applied once the lock is taken)."""
        if self._member() or self.stopping:
            return
        log.warning("holding the fold: %s; its partitions may be another worker's now", self._why_not_member())
        began, revocations = self._clock(), self._revocations
        while not self._member() and not self.stopping:
            await asyncio.sleep(self._poll_s)
        then = (
            "the worker stops"
            if self.stopping
            else "its partitions were revoked meanwhile"
            if self._revocations != revocations
            else "the group confirmed it a member"
        )
        log.info("fold held for %.1f s, until %s", self._clock() - began, then)

    async def confirmed(self) -> bool:
        """Inside a batch, just before its writes: whether they may go out. The worker was a member
        when the batch began; if it no longer knows itself one (a pause, a cut while it folded),
        wait until the group confirms it again (True), or until a revocation or a stop waits for
        this batch (False: the batch is not to be written, and its events are left)."""
        if self._member():
            return True
        log.warning("holding the batch's writes: %s", self._why_not_member())
        began = self._clock()
        while not self._member():
            if self._waiting or self.stopping:
                log.info("a batch not written after %.1f s: its partitions are being let go", self._clock() - began)
                return False
            await asyncio.sleep(self._poll_s)
        log.info(
            "the batch's writes held for %.1f s, until the group confirmed the worker a member", self._clock() - began
        )
        return True

    def _left(self, events: Sequence[Any], gone: Callable[[Any], bool]) -> list[Any]:
        keep = []
        for event in events:
            if gone(event):
                self._leave(event)
            else:
                keep.append(event)
        if len(keep) < len(events):
            log.info("%d event(s) left to the partitions' next owner", len(events) - len(keep))
        return keep

    async def revoke(self, tps: frozenset[Any]) -> None:
        """faust revoked ``tps``: once the batch in flight is written, fold none of theirs."""
        self._revocations += 1
        async with self._batch_done("partitions revoked"):
            self.revoked |= tps
            self._forget()

    def assign(self, tps: frozenset[Any]) -> None:
        """faust assigned ``tps`` (the whole new assignment)."""
        self.revoked -= tps

    async def stop(self) -> None:
        """The worker stops: once the batch in flight is written, fold nothing more."""
        async with self._batch_done("stopping"):
            self.stopping = True

    @contextlib.asynccontextmanager
    async def _batch_done(self, why: str) -> AsyncIterator[None]:
        started = self._clock()
        self._waiting += 1  # a batch holding its writes (``confirmed``) gives way at once
        try:
            await asyncio.wait_for(self._lock.acquire(), self.drain_s)
            held = True
        except TimeoutError:
            held = False
            for event in self._in_flight:
                self._leave(event)
            log.error(
                "%s while a batch of %d event(s) was being written, not acknowledged by Kafka after %.0f s: "
                "left unacknowledged; its records may reach the changelog after the next owner's",
                why,
                len(self._in_flight),
                self.drain_s,
            )
        finally:
            self._waiting -= 1
        if held and (waited := self._clock() - started) >= 0.5:
            log.info("%s: waited %.1f s for the batch being written", why, waited)
        try:
            yield
        finally:
            if held:
                self._lock.release()

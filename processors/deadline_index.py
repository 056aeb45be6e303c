"""The deadline index: this worker's effects that the timer must look at, and when. Pure: the
processor feeds it the table after each rebalance (``rebuild``), every folded change (``set``), the
high watermarks it saw at each tick (``record_highwaters``), and asks it which keys are due
(``due``); time is always an argument."""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from effect_ledger.core.effect import Effect
from effect_ledger.core.model import IN_FLIGHT_STATES, State
from effect_ledger.core.reconcile import Target, next_check_ms, target_for, target_name

#: A timeout command or a re-published work item not folded after this long is sent again.
RESEND_AFTER_MS = 5000
_MAX_SAMPLES = 4000  # ticks of high watermarks kept per partition (a few minutes at 10 a second)


def due_of(effect: Effect, targets: Mapping[str, Target], first_check_ms: int) -> int | None:
    """When the timer must next look at this effect: the deadline of an open attempt, or the time to
    ask the reconcilers again about an uncertain one, by its target's backoff
    (``effect_ledger.core.reconcile.next_check_ms``, the embedded runner's rule too); an effect
    nobody answered about yet, ``first_check_ms`` after it became uncertain."""
    if effect.state in IN_FLIGHT_STATES:
        return effect.deadline_ms
    if effect.state is State.UNCERTAIN:
        target, _ = target_for(targets, target_name(effect))
        due = next_check_ms(effect, target, effect.updated_ms)
        return due if due is not None else effect.updated_ms + first_check_ms
    return None


@dataclass
class Entry:
    partition: int
    due_ms: int
    sent_ms: int = 0  # when the timer last acted on it (0: never)


@dataclass
class DeadlineIndex:
    """key -> (partition, due, last sent) for the effects of the partitions this worker owns, and
    per partition the high watermark at each tick (a deadline fires only once the partition is
    folded up to where it stood when the deadline passed).

    ``due`` runs at every tick and after every batch, so it costs what is actionable, not what is
    past due: one heap of (due, key) per partition, and within a partition the first entry not yet
    folded up to ends the look (every later entry waits for a mark at least as high: a worker
    catching up on a backlog with 100,000 deadlines past due pays one entry per partition). An
    entry's older due times stay in its heap until they come up, then are dropped; the heaps are
    built again from the entries when they hold twice as many."""

    grace_ms: int = 1000
    entries: dict[str, Entry] = field(default_factory=dict)
    assigned: frozenset[int] | None = None  # the partitions it was built for (None: not built)
    _samples: dict[int, tuple[list[int], list[int]]] = field(default_factory=dict)
    _heaps: dict[int, list[tuple[int, str]]] = field(default_factory=dict)
    _heaped: int = 0  # items in all heaps

    def _push(self, key: str, partition: int, due_ms: int) -> None:
        if self._heaped > 2 * len(self.entries) + 1024:
            self._reheap()
        heapq.heappush(self._heaps.setdefault(partition, []), (due_ms, key))
        self._heaped += 1

    def _reheap(self) -> None:
        heaps: dict[int, list[tuple[int, str]]] = {}
        for k, e in self.entries.items():
            heaps.setdefault(e.partition, []).append((e.due_ms, k))
        for h in heaps.values():
            heapq.heapify(h)
        self._heaps = heaps
        self._heaped = len(self.entries)

    def rebuild(self, items: Iterable[tuple[str, int | None]], assigned: frozenset[int],
                partition_of: Callable[[str], int]) -> None:  # fmt: skip
        """Start over from the table's (key, due) pairs, keeping the keys of ``assigned``."""
        entries = {}
        for key, due in items:
            if due is not None:
                p = partition_of(key)
                if p in assigned:
                    entries[key] = Entry(p, due)
        self.entries = entries
        self._reheap()
        self.assigned = assigned
        self._samples = {p: s for p, s in self._samples.items() if p in assigned}

    def forget(self) -> None:
        """Partitions were revoked: the index is not valid until the next ``rebuild``."""
        self.assigned = None

    def set(self, key: str, partition: int, due_ms: int | None) -> None:
        """A folded change: the key's new due time (None: nothing to watch)."""
        if due_ms is None:
            self.entries.pop(key, None)
            return
        old = self.entries.get(key)
        self.entries[key] = Entry(partition, due_ms)
        if old is None or old.due_ms != due_ms:
            self._push(key, partition, due_ms)

    def discard(self, key: str) -> None:
        self.entries.pop(key, None)

    def mark_sent(self, key: str, partition: int, due_ms: int, now_ms: int) -> None:
        old = self.entries.get(key)
        self.entries[key] = Entry(partition, due_ms, now_ms)
        if old is None or old.due_ms != due_ms:
            self._push(key, partition, due_ms)

    def record_highwaters(self, now_ms: int, highwaters: dict[int, int]) -> None:
        for p, hw in highwaters.items():
            times, marks = self._samples.setdefault(p, ([], []))
            times.append(now_ms)
            marks.append(hw)
            if len(times) > _MAX_SAMPLES:
                del times[: _MAX_SAMPLES // 2], marks[: _MAX_SAMPLES // 2]

    def due(self, now_ms: int, folded_through: Callable[[int], int]) -> list[tuple[str, Entry]]:
        """The keys the timer must act on at ``now_ms``: past due plus grace, folded up to where
        their partition stood then (an outcome produced before the deadline is seen first), and not
        acted on in the last ``RESEND_AFTER_MS``."""
        out = []
        entries, grace = self.entries, self.grace_ms
        for p, heap in self._heaps.items():
            times, marks = self._samples.get(p, ([], []))
            folded = folded_through(p)
            past: dict[str, int] = {}  # popped and still watched: back in the heap afterwards
            while heap and heap[0][0] + grace <= now_ms:
                due_ms, key = heap[0]
                e = entries.get(key)
                if e is None or e.due_ms != due_ms or key in past:
                    heapq.heappop(heap)  # an older due time of the key, a key gone, or the key twice
                    self._heaped -= 1
                    continue
                i = bisect.bisect_left(times, due_ms + grace)
                if i == len(times) or folded < marks[i] - 1:
                    break  # not folded up to where p stood: neither is any later entry of p
                heapq.heappop(heap)
                self._heaped -= 1
                past[key] = due_ms
                if e.sent_ms and now_ms - e.sent_ms < RESEND_AFTER_MS:
                    continue
                out.append((key, e))
            for key, due_ms in past.items():
                heapq.heappush(heap, (due_ms, key))
                self._heaped += 1
        return out

    def any_past_due(self, now_ms: int) -> bool:
        """Whether an entry may be past due plus grace at ``now_ms`` (``due`` says which): false
        means ``due`` would return nothing."""
        grace = self.grace_ms
        return any(h and h[0][0] + grace <= now_ms for h in self._heaps.values())

    def oldest_due(self) -> int | None:
        return min((e.due_ms for e in self.entries.values()), default=None)

    def __len__(self) -> int:
        return len(self.entries)

"""Folding a batch of one key's events: pure. The processor groups a batch from faust by key, folds
each key's events in their order with ``fold_key``, and writes the result once. ``log_ms_of`` gives
each event's log time (its record's LogAppendTime): what the fold compares, never a writer's clock."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from effect_ledger.core.effect import Effect, apply, claim_verdict
from effect_ledger.core.model import Event, UncertainEffect
from effect_ledger.processors.table_value import TableValueTooLarge

T = TypeVar("T")  # what the caller tags each event with (its Kafka message)


@dataclass
class KeyFold(Generic[T]):
    """The outcome of one key's events in a batch. ``value`` is the table value to write (None:
    nothing changed); ``steps`` are the changes, one per event that changed the effect, in order
    (for metrics); ``rejected`` the events that could not be folded, with the reason."""

    before: Effect | None
    after: Effect | None
    value: bytes | None = None
    emitted: list[UncertainEffect] = field(default_factory=list)
    steps: list[tuple[Effect | None, Effect, Event]] = field(default_factory=list)
    rejected: list[tuple[T, str]] = field(default_factory=list)


def _apply_all(before: Effect | None, events: Sequence[tuple[T, Event]], fold: KeyFold[T],
               encode: Callable[[Effect], bytes] | None,
               log_ms_of: Callable[[T], int | None] | None) -> Effect | None:  # fmt: skip
    cur = before
    for tag, ev in events:
        try:
            log_ms = log_ms_of(tag) if log_ms_of is not None else None
            new, emitted = apply(cur, ev, log_ms)
            # The first intent of an attempt in the partition's order owns it: its verdict is
            # recorded now, as a fact in the same table write (a later intent of the attempt gets
            # none: a lost claim).
            verdict = claim_verdict(new, ev) if new is not cur else None
            if verdict is not None:  # taken by the log with the intent it names
                new, more = apply(new, verdict, log_ms)
                emitted = (*emitted, *more)
            if new is not cur and encode is not None:
                fold.value = encode(new)  # one event at a time: the one that would be too large is refused
        except TableValueTooLarge as e:
            fold.rejected.append((tag, str(e)))
            continue
        except Exception as e:  # a record that cannot be applied must not stop the partition
            fold.rejected.append((tag, f"cannot apply: {type(e).__name__}: {e}"))
            continue
        if new is cur:
            continue
        fold.steps.append((cur, new, ev))
        fold.emitted.extend(emitted)
        cur = new
    return cur


def fold_key(
    before: Effect | None,
    events: Sequence[tuple[T, Event]],
    encode: Callable[[Effect], bytes],
    log_ms_of: Callable[[T], int | None] | None = None,
) -> KeyFold[T]:
    """Fold ``events`` (one key's, in order) into ``before`` and encode the result once. When the
    result would be over the table value's limit, fold again one event at a time and refuse the
    events that would take it over (each in ``rejected``)."""
    fold: KeyFold[T] = KeyFold(before, before)
    after = _apply_all(before, events, fold, None, log_ms_of)
    fold.after = after
    if after is before or after is None:
        return fold
    try:
        fold.value = encode(after)
    except TableValueTooLarge:
        fold = KeyFold(before, before)  # the same events again: the same ones fail to apply
        fold.after = _apply_all(before, events, fold, encode, log_ms_of)
        if fold.after is before:
            fold.value = None
    return fold


def group_by_key(items: Sequence[tuple[str, T, Event]]) -> dict[str, list[tuple[T, Event]]]:
    """(key, tag, event) in arrival order -> per key, its (tag, event) in the same order."""
    out: dict[str, list[tuple[T, Event]]] = {}
    for key, tag, ev in items:
        out.setdefault(key, []).append((tag, ev))
    return out

"""Errors survive pickling with their fields: DBOS records a step's exception that way and raises it
again when it replays the workflow (a recovered workflow must see the same EffectUncertain)."""

from __future__ import annotations

import pickle

import pytest

from effect_ledger import (
    EffectClosed,
    EffectConflict,
    EffectInProgress,
    EffectRetired,
    EffectUncertain,
    LedgerError,
    LedgerLagging,
    LedgerUnavailable,
    NotAuthorized,
    StorageError,
    UnknownTarget,
)


@pytest.mark.parametrize(
    ("error", "fields"),
    [
        (EffectUncertain("k", "nobody can ask", "ESCALATED"), ("effect_id", "reason", "state")),
        (EffectInProgress("k", "worker w", 250), ("effect_id", "reason", "retry_after_ms")),
        (EffectClosed("k", "ABANDONED", "by hand"), ("effect_id", "state", "reason")),
        (EffectConflict("k", "a" * 64, "b" * 64), ("effect_id", "recorded_digest", "given_digest")),
        (EffectRetired("k", "CONFIRMED", 1_700_000_000_000), ("effect_id", "state", "retired_ms")),
        (UnknownTarget("target 'x' is not declared"), ()),
        (StorageError("disk full"), ()),
        (NotAuthorized("execute", "User:a", ["Write on topic e"]), ("what", "principal", "missing")),
        (LedgerUnavailable("no leader yet", passing=True), ("passing",)),
        (LedgerUnavailable("refused the lookup (401)"), ("passing",)),
        (LedgerLagging("consumed through 3, high watermark 9"), ("passing",)),
    ],
)
def test_an_error_pickles_with_its_fields(error: LedgerError, fields: tuple[str, ...]) -> None:
    back = pickle.loads(pickle.dumps(error))
    assert type(back) is type(error) and str(back) == str(error)
    assert [getattr(back, f) for f in fields] == [getattr(error, f) for f in fields]


def test_whether_a_refusal_passes_by_itself_is_part_of_the_error() -> None:
    """``execute`` tries again only what passes by itself (a leader election, a lagging
    processor); a refused token or a wrong answer is raised at once."""
    assert LedgerLagging("lags").passing is True
    assert LedgerUnavailable("refused the lookup (401)").passing is False
    assert LedgerUnavailable("cannot ask", passing=True).passing is True

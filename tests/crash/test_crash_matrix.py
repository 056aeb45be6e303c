"""Every crash point x every destination kind, with real processes killed by SIGKILL.

The ledger, through ``Ledger`` and through ``SyncLedger``, must show zero duplicates and zero lost
effects; the naive retry, run against the same destinations, must show its duplicates (so this
test can see one)."""

from __future__ import annotations

import os

import pytest

from effect_ledger.sdk import crashpoints
from tests.crash.matrix import Cell, run_matrix, table

RUNS = int(os.environ.get("EFFECT_LEDGER_CRASH_RUNS", "2"))


@pytest.fixture(scope="module", params=["ledger", "ledger-sync", "ledger-sync-inline"])
def cells(request: pytest.FixtureRequest) -> list[Cell]:
    """The agent through ``Ledger`` and through ``SyncLedger`` (embedded), whose intent and outcome
    are written on the caller's own thread: the path of synchronous code and of the LangGraph, DBOS,
    CrewAI and Agent Framework adapters; and through ``SyncLedger`` with ``inline_calls``, whose
    call runs on that thread too."""
    result = run_matrix(RUNS, mode=request.param)
    print(f"\n{request.param}:\n" + table(result))
    return result


def test_every_crash_killed_the_agent(cells: list[Cell]) -> None:
    for c in cells:
        assert all(r.crashed for r in c.ledger), f"{c.point}/{c.kind}: the ledger agent was not killed"
        assert all(r.crashed for r in c.naive), f"{c.point}/{c.kind}: the naive agent was not killed"


def test_ledger_never_duplicates(cells: list[Cell]) -> None:
    dups = {(c.point, c.kind): Cell.duplicates(c.ledger) for c in cells if Cell.duplicates(c.ledger)}
    assert dups == {}


def test_ledger_never_loses_an_effect(cells: list[Cell]) -> None:
    lost = {(c.point, c.kind): [(r.state, r.refunds) for r in c.ledger] for c in cells if Cell.lost(c.ledger)}
    assert lost == {}


def test_naive_retry_duplicates_after_the_call(cells: list[Cell]) -> None:
    """The crash after the destination committed is where a checkpoint-after-call retry pays twice,
    whatever the destination supports (a fresh key per attempt defeats key deduplication)."""
    for c in cells:
        if c.point in (crashpoints.AFTER_CALL, crashpoints.AFTER_EXECUTED):
            assert Cell.duplicates(c.naive) == len(c.naive), f"{c.point}/{c.kind}: naive did not duplicate"
        else:
            assert Cell.duplicates(c.naive) == 0


def test_ledger_confirms_wherever_the_destination_can_tell(cells: list[Cell]) -> None:
    """Only a destination that neither deduplicates keys nor answers lookups leaves a person to
    decide, and only when the crash came before the outcome was recorded; every other cell ends
    CONFIRMED with exactly one refund (after_executed: the outcome and receipt were one write)."""
    for c in cells:
        for r in c.ledger:
            if c.kind != "none" or c.point in (crashpoints.BEFORE_INTENT, crashpoints.AFTER_EXECUTED):
                assert (r.state, r.refunds) == ("CONFIRMED", 1), f"{c.point}/{c.kind}: {r}"
            else:
                assert r.state == "ESCALATED" and r.evidence, f"{c.point}/{c.kind}: {r}"

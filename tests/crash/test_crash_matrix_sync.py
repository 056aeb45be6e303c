"""The crash matrix through ``SyncLedger`` (embedded): the path of synchronous code and of the
LangGraph, DBOS, CrewAI and Agent Framework adapters, whose intent and outcome are written on the
caller's own thread (``effect_ledger.sdk.sync``). Every crash point x every destination kind, real
processes killed by SIGKILL; the same verdicts as the async matrix (``test_crash_matrix.py``, which
also shows the naive retry's duplicates on the same destinations)."""

from __future__ import annotations

import os

import pytest

from effect_ledger.sdk import crashpoints
from tests.crash.matrix import Cell, run_matrix, table

RUNS = int(os.environ.get("EFFECT_LEDGER_CRASH_RUNS", "2"))


@pytest.fixture(scope="module")
def cells() -> list[Cell]:
    result = run_matrix(RUNS, mode="ledger-sync", naive=False)
    print("\n" + table(result))
    return result


def test_every_crash_killed_the_agent(cells: list[Cell]) -> None:
    for c in cells:
        assert len(c.ledger) == RUNS
        assert all(r.crashed for r in c.ledger), f"{c.point}/{c.kind}: the sync agent was not killed"


def test_sync_ledger_never_duplicates(cells: list[Cell]) -> None:
    dups = {(c.point, c.kind): Cell.duplicates(c.ledger) for c in cells if Cell.duplicates(c.ledger)}
    assert dups == {}


def test_sync_ledger_never_loses_an_effect(cells: list[Cell]) -> None:
    lost = {(c.point, c.kind): [(r.state, r.refunds) for r in c.ledger] for c in cells if Cell.lost(c.ledger)}
    assert lost == {}


def test_sync_ledger_confirms_wherever_the_destination_can_tell(cells: list[Cell]) -> None:
    for c in cells:
        for r in c.ledger:
            if c.kind != "none" or c.point in (crashpoints.BEFORE_INTENT, crashpoints.AFTER_EXECUTED):
                assert (r.state, r.refunds) == ("CONFIRMED", 1), f"{c.point}/{c.kind}: {r}"
            else:
                assert r.state == "ESCALATED" and r.evidence, f"{c.point}/{c.kind}: {r}"

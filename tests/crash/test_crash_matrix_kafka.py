"""The crash matrix through Kafka: the agent writes its intent to Kafka before the call (sync), is
killed with SIGKILL at each crash point, and is restarted on "another host" (an empty disk) that
learns what happened only through the ledger processor. Zero duplicates, zero lost."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.crash.matrix import Cell, kafka_setup, run_matrix, table

RUNS = int(os.environ.get("EFFECT_LEDGER_CRASH_RUNS", "1"))


@pytest.fixture(scope="module")
def cells(kafka_bootstrap: str) -> Iterator[list[Cell]]:
    os.environ.setdefault("KAFKA_BOOTSTRAP", kafka_bootstrap)
    with kafka_setup() as kafka:
        result = run_matrix(RUNS, kafka=kafka)
    print("\n" + table(result))
    yield result


def test_every_crash_killed_the_agent(cells: list[Cell]) -> None:
    for c in cells:
        assert all(r.crashed for r in c.ledger), f"{c.point}/{c.kind}: the ledger agent was not killed"


def test_no_duplicates_through_kafka(cells: list[Cell]) -> None:
    assert {(c.point, c.kind): Cell.duplicates(c.ledger) for c in cells if Cell.duplicates(c.ledger)} == {}


def test_nothing_lost_through_kafka(cells: list[Cell]) -> None:
    lost = {(c.point, c.kind): [(r.state, r.refunds) for r in c.ledger] for c in cells if Cell.lost(c.ledger)}
    assert lost == {}


def test_the_restarted_host_sees_the_predecessors_effect(cells: list[Cell]) -> None:
    """Only a destination that can neither dedupe nor be asked leaves it to a person. After
    after_executed the outcome is durable on host-a's disk but may or may not have reached Kafka
    before the kill, so host-b sees either the receipt or only the intent."""
    for c in cells:
        for r in c.ledger:
            if c.kind != "none" or c.point == "before_intent":
                assert (r.state, r.refunds) == ("CONFIRMED", 1), f"{c.point}/{c.kind}: {r}"
            elif c.point == "after_executed":
                assert (r.state, r.refunds) == ("CONFIRMED", 1) or (r.state == "ESCALATED" and r.evidence), r
            else:
                assert r.state == "ESCALATED" and r.evidence, f"{c.point}/{c.kind}: {r}"

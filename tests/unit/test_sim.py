"""The protocol simulator (``tests/sim``) as part of ``make test``: a short fixed-seed run of the
design as shipped breaks no invariant, and the same simulator, run on the design before the log's
time decided, finds each road to a second call (so a clean run means something). ``make sim`` runs
many more seeds."""

from __future__ import annotations

import pytest

from tests.sim.__main__ import main
from tests.sim.world import Violation, World, run_seed

SEEDS = range(3000)


def test_a_fixed_seed_run_breaks_no_invariant() -> None:
    broken = []
    for seed in SEEDS:
        try:
            run_seed(seed)
        except Violation as v:
            broken.append((seed, v.what))
    assert broken == []


@pytest.mark.parametrize(
    ("faults", "what"),
    [
        ("operator,skew_operator,late_landing", "executed 2 times"),  # an operator's fast clock
        ("operator,bypass,skew_operator,late_landing", "executed 2 times"),  # a decision stamped in the future
        ("skew_agent,late_landing", "executed 2 times"),  # an agent's slow clock
        ("skew_reconciler,late_landing", "executed 2 times"),  # a reconciler's fast clock
        ("skew_processor,late_landing", "executed 2 times"),  # a processor's fast clock
        ("race_requests,delay_log", "receipt of another request"),  # racing hosts, different requests
    ],
    ids=["operator-clock", "future-decision", "agent-clock", "reconciler-clock", "processor-clock", "race"],
)
def test_the_design_before_finds_each_road_and_the_design_now_none(faults: str, what: str) -> None:
    forced = tuple(faults.split(","))
    found = None
    for seed in range(4000):
        try:
            run_seed(seed, "before", faults=forced)
        except Violation as v:
            if what in v.what:
                found = seed
                break
    assert found is not None, f"no seed of 4000 found {what!r} with {faults}"
    run_seed(found, "fixed", faults=forced)  # the same seed, the design now: no violation
    for seed in range(found, found + 300):
        run_seed(seed, "fixed", faults=forced)


def test_a_seed_replays_exactly() -> None:
    a, b = World(1234), World(1234)
    a.run()
    b.run()
    assert a.trace == b.trace and a.trace


def test_the_command_line_reports_a_failing_seed_with_its_replay(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--seeds", "400", "--mode", "before", "--jobs", "1", "--show", "1"]) == 1
    out = capsys.readouterr().out
    assert "failing" in out and "replay: python -m tests.sim --seed" in out and "->" in out
    assert main(["--seeds", "200", "--jobs", "1"]) == 0

"""A call is not started with a sliver of its timeout (found by the chaos run, ``make chaos``).

After a paused group coordinator, agents' claims were all confirmed at once when the workers'
group came back; each intent's timeout had been running since it was written, and calls started
with a few milliseconds of it left. They timed out before the destination answered: UNCERTAIN, a
refund that may have landed, left to the reconcilers (and to a person where the destination
cannot be asked), where a call not made at all would have been a clean retry. Now, in Kafka mode
with ``sync``, an attempt confirmed with less than a quarter of its timeout left is not called:
it is FAILED (nothing sent) and ``execute`` tries a new attempt, with a deadline of its own,
within its ``sync_timeout``.
"""

from __future__ import annotations

from pathlib import Path

from effect_ledger.core.model import Executed, Intent, Outcome
from effect_ledger.streams.config import KafkaConfig
from tests.faults.late_verdict import verdict_held_back

TIMEOUT_S = 4.0
HELD_S = 3.3  # the verdict is held back this long after the intent: 0.7 s of 4 s left, less its own way back
CALL_S = 0.8  # how long the destination takes (more than that sliver, well within a whole timeout)


def test_a_call_confirmed_with_a_sliver_of_its_timeout_is_not_started(
    kafka_config: KafkaConfig, tmp_path: Path
) -> None:
    # The next call takes CALL_S, then lands.
    run = verdict_held_back(kafka_config, tmp_path, TIMEOUT_S, HELD_S, next_call=("late", CALL_S))
    second = [f for f in run.facts if isinstance(f, Executed) and f.attempt == run.held]
    # The held-back attempt was confirmed with less than a quarter of its timeout left, or none: not called.
    assert [(f.outcome, "not called" in (f.error or "")) for f in second] == [(Outcome.FAILED, True)], run.facts
    # A later attempt made the one call, with its whole timeout, and the caller has its receipt.
    assert run.answer["outcome"] == "called", (run.answer, run.facts)
    assert len(run.calls) == 1, run.calls
    later = [f for f in run.facts if isinstance(f, Intent) and f.attempt > run.held]
    assert later and run.calls[0].created_ms <= later[-1].deadline_ms, (later, run.calls)

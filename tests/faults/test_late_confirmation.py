"""A verdict that comes after the call's timeout but within ``confirm_within`` still gets its call
(found by the chaos run, ``make chaos``).

A broker that dies stops every ``acks=all`` write until the cluster fences it, the processor's
writes included, and with them its verdicts: 4 to 8 s on the cluster ``make chaos`` runs. An
intent's deadline was its call's timeout alone, so every attempt confirmed in that window was
refused (FAILED, nothing sent), written again and folded again: the processor, already behind, got
several times its load and stayed behind, and 3-60 % of the calls made while a broker was down
completed. Now an intent's deadline is the call's timeout plus ``confirm_within`` (10 s by
default): the attempt whose verdict was held back is the one called, with its whole timeout, and
still within its deadline.
"""

from __future__ import annotations

from pathlib import Path

from effect_ledger.core.model import Executed, Intent, Outcome
from effect_ledger.streams.config import KafkaConfig
from tests.faults.late_verdict import verdict_held_back

TIMEOUT_S = 2.0
HELD_S = 3.5  # past the call's timeout, well within the confirmations' allowance
CONFIRM_WITHIN_S = 8.0


def test_a_verdict_later_than_the_timeout_but_within_confirm_within_is_called(
    kafka_config: KafkaConfig, tmp_path: Path
) -> None:
    run = verdict_held_back(kafka_config, tmp_path, TIMEOUT_S, HELD_S, confirm_within=CONFIRM_WITHIN_S)
    held = [f for f in run.facts if isinstance(f, Intent) and f.attempt == run.held]
    outcomes = [f for f in run.facts if isinstance(f, Executed) and f.attempt == run.held]
    # The held-back attempt made the call: no refusal, no attempt after it.
    assert run.answer["outcome"] == "called", (run.answer, run.facts)
    assert [f.outcome for f in outcomes] == [Outcome.OK], run.facts
    assert max(f.attempt for f in run.facts if isinstance(f, Intent)) == run.held, run.facts
    # Its deadline allowed for the confirmations, and the one call started after the processor was
    # let go (the verdict came late) and within that deadline.
    assert len(held) == 1 and held[0].deadline_ms - held[0].at_ms == int((TIMEOUT_S + CONFIRM_WITHIN_S) * 1000), held
    assert len(run.calls) == 1, run.calls
    assert run.resumed_ms <= run.calls[0].created_ms <= held[0].deadline_ms, (run.calls, held, run.resumed_ms)

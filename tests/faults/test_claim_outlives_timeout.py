"""A call never starts after its intent's deadline (found by the protocol simulator, ``make sim``).

With claims across hosts, an agent writes its intent (deadline: now + timeout), waits for the
processor's verdict, and only then calls. The call used to get the whole timeout again from there:
a verdict that came late (a processor paused, a slow lookup) let the call run, and land, after the
intent's deadline, when the processor had already timed the attempt out, reconcilers had been told
the call could no longer land, and an "absent" answer could start a second attempt. Now the call
gets only what is left of the timeout since the intent was written, and none left means no call:
the attempt is recorded FAILED (nothing was sent). ``execute`` then tries a new attempt, with an
intent and a deadline of its own, within its ``sync_timeout`` (a caller used to get
``LedgerUnavailable`` and do the same): the one call made is that attempt's, made after the
processor was resumed, never the late one's.
"""

from __future__ import annotations

from pathlib import Path

from effect_ledger.core.model import Executed, Intent, Outcome
from effect_ledger.streams.config import KafkaConfig
from tests.faults.late_verdict import verdict_held_back

TIMEOUT_S = 2.0


def test_a_claim_confirmed_after_the_timeout_never_calls(kafka_config: KafkaConfig, tmp_path: Path) -> None:
    # The intent's deadline passes while the verdict is held back.
    run = verdict_held_back(kafka_config, tmp_path, TIMEOUT_S, TIMEOUT_S + 1.0)
    calls = [r for r in run.calls if r.status == "succeeded"]
    late = [f for f in run.facts if isinstance(f, Executed) and f.attempt == run.held]
    # The held-back attempt's verdict came after its deadline: FAILED, nothing sent.
    assert [(f.outcome, "not called" in (f.error or "")) for f in late] == [(Outcome.FAILED, True)], late
    # The one call made is a later attempt's, made after the processor was resumed, within that
    # attempt's own deadline; the held-back attempt's intent never led to one.
    assert run.answer["outcome"] == "called", run.answer
    assert len(calls) == 1 and calls[0].created_ms >= run.resumed_ms, (calls, run.resumed_ms)
    later = [f for f in run.facts if isinstance(f, Intent) and f.attempt > run.held]
    assert later and calls[0].created_ms <= later[-1].deadline_ms, (later, calls)

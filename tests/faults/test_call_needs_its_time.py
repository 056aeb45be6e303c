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

import asyncio
import signal
import time
import uuid
from pathlib import Path

from effect_ledger import Ledger, Target
from effect_ledger.core.model import Executed, Intent, Outcome
from effect_ledger.demo.gateway import Gateway
from effect_ledger.streams.config import KafkaConfig
from tests.claim_agent import AgentProcess
from tests.services import Processor, wait_for
from tests.topic_io import running

TIMEOUT_S = 4.0
HELD_S = 3.3  # the verdict is held back this long after the intent: 0.7 s of 4 s left, less its own way back
CALL_S = 0.8  # how long the destination takes (more than that sliver, well within a whole timeout)


def test_a_call_confirmed_with_a_sliver_of_its_timeout_is_not_started(
    kafka_config: KafkaConfig, tmp_path: Path
) -> None:
    proc = Processor(kafka_config, tmp_path / "data")
    with Gateway("none") as gateway, running(proc):
        proc.wait_ready()
        agent = AgentProcess(str(tmp_path / "host.db"), kafka_config, proc.url, gateway.url,
                             str(tmp_path / "host.log"), timeout_s=TIMEOUT_S)  # fmt: skip
        assert proc.proc is not None
        try:
            key = f"sliver-{uuid.uuid4().hex[:8]}"
            # Attempt 1 is rejected (FAILED): attempt 2 is planned from the file alone, with no
            # lookup before its intent; the processor is asked only for the verdict.
            gateway.state.failures.append(("reject", 0.0))
            agent.send(f"execute {key}")
            assert agent.answer(60)["outcome"] == "rejected"
            gateway.state.failures.append(("late", CALL_S))  # the next call takes CALL_S, then lands
            proc.proc.send_signal(signal.SIGSTOP)  # no verdict for now
            try:
                asked = time.time()
                agent.send(f"execute {key}")
                wait_for(lambda: time.time() > asked + HELD_S, 10, "most of the intent's timeout passing")
            finally:
                proc.proc.send_signal(signal.SIGCONT)
            out = agent.answer(60)
        finally:
            agent.stop()
        calls = [r for r in gateway.refunds() if r.idempotency_key == key]

    async def facts() -> list[object]:
        async with await Ledger.open(str(tmp_path / "host.db"), targets=[Target("payments")]) as ledger:
            effect = await ledger.get(key)
            assert effect is not None
            return list(effect.facts)

    events = asyncio.run(facts())
    second = [f for f in events if isinstance(f, Executed) and f.attempt == 2]
    # Attempt 2 was confirmed with less than a quarter of its timeout left, or none: not called.
    assert [(f.outcome, "not called" in (f.error or "")) for f in second] == [(Outcome.FAILED, True)], events
    # A later attempt made the one call, with its whole timeout, and the caller has its receipt.
    assert out["outcome"] == "called", (out, events)
    assert len(calls) == 1, calls
    later = [f for f in events if isinstance(f, Intent) and f.attempt > 2]
    assert later and calls[0].created_ms <= later[-1].deadline_ms, (later, calls)

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

TIMEOUT_S = 2.0


def test_a_claim_confirmed_after_the_timeout_never_calls(kafka_config: KafkaConfig, tmp_path: Path) -> None:
    proc = Processor(kafka_config, tmp_path / "data")
    with Gateway("none") as gateway, running(proc):
        proc.wait_ready()
        agent = AgentProcess(str(tmp_path / "host.db"), kafka_config, proc.url, gateway.url,
                             str(tmp_path / "host.log"), timeout_s=TIMEOUT_S)  # fmt: skip
        assert proc.proc is not None
        try:
            key = f"late-claim-{uuid.uuid4().hex[:8]}"
            # Attempt 1 is rejected (FAILED): the next execute plans attempt 2 from the file alone,
            # with no lookup before its intent; the processor is asked only for the verdict.
            gateway.state.failures.append(("reject", 0.0))
            agent.send(f"execute {key}")
            assert agent.answer(60)["outcome"] == "rejected"
            proc.proc.send_signal(signal.SIGSTOP)  # the processor freezes: no verdict for now
            try:
                asked = time.time()
                agent.send(f"execute {key}")
                # The intent's deadline passes while the verdict is held back.
                wait_for(lambda: time.time() > asked + TIMEOUT_S + 1.0, 10, "the intent's deadline passing")
            finally:
                resumed_ms = int(time.time() * 1000)
                proc.proc.send_signal(signal.SIGCONT)
            out = agent.answer(60)
        finally:
            agent.stop()
        calls = [r for r in gateway.refunds() if r.idempotency_key == key and r.status == "succeeded"]

    async def facts() -> list[object]:
        async with await Ledger.open(str(tmp_path / "host.db"), targets=[Target("payments")]) as ledger:
            effect = await ledger.get(key)
            assert effect is not None
            return list(effect.facts)

    events = asyncio.run(facts())
    late = [f for f in events if isinstance(f, Executed) and f.attempt == 2]
    # Attempt 2's verdict came after its deadline: FAILED, nothing sent.
    assert [(f.outcome, "not called" in (f.error or "")) for f in late] == [(Outcome.FAILED, True)], late
    # The one call made is a later attempt's, made after the processor was resumed, within that
    # attempt's own deadline; attempt 2's intent never led to one.
    assert out["outcome"] == "called", out
    assert len(calls) == 1 and calls[0].created_ms >= resumed_ms, (calls, resumed_ms)
    later = [f for f in events if isinstance(f, Intent) and f.attempt > 2]
    assert later and calls[0].created_ms <= later[-1].deadline_ms, (later, calls)

"""A call never starts after its intent's deadline (found by the protocol simulator, ``make sim``).

With claims across hosts, an agent writes its intent (deadline: now + timeout), waits for the
processor's verdict, and only then calls. The call used to get the whole timeout again from there:
a verdict that came late (a processor paused, a slow lookup) let the call run, and land, after the
intent's deadline, when the processor had already timed the attempt out, reconcilers had been told
the call could no longer land, and an "absent" answer could start a second attempt. Now the call
gets only what is left of the timeout since the intent was written, and none left means no call:
the attempt is recorded FAILED (nothing was sent) and the caller gets ``LedgerUnavailable``.
"""

from __future__ import annotations

import signal
import time
import uuid
from pathlib import Path

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
                proc.proc.send_signal(signal.SIGCONT)
            out = agent.answer(60)
        finally:
            agent.stop()
        calls = [r for r in gateway.refunds() if r.idempotency_key == key and r.status == "succeeded"]
    assert calls == [], f"the destination was called after the intent's deadline: {out}"
    assert out["outcome"] == "unavailable" and "not called" in out["reason"], out

"""The setting of the late-verdict fault tests: an agent process (Kafka mode, ``sync``, claims
through a real processor) executes a key whose first attempt the gateway rejects, then executes it
again while the processor is frozen (SIGSTOP) for a while after the intent, so that the claim's
verdict comes late."""

from __future__ import annotations

import asyncio
import signal
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from effect_ledger import Ledger, Target
from effect_ledger.core.model import Intent
from effect_ledger.demo.gateway import Gateway, Refund
from effect_ledger.streams.config import KafkaConfig
from tests.claim_agent import AgentProcess
from tests.services import Processor, wait_for
from tests.topic_io import running


@dataclass
class LateVerdict:
    key: str
    answer: dict[str, Any]  # the second execute's, as the agent printed it
    calls: list[Refund]  # the gateway's refunds under the key
    facts: list[Any]  # the key's facts in the agent's ledger file
    resumed_ms: int  # when the processor was let go (wall clock, ms)
    held: int  # the attempt whose verdict was held back: the first written after the processor froze


def verdict_held_back(cfg: KafkaConfig, tmp_path: Path, timeout_s: float, held_s: float,
                      next_call: tuple[str, float] | None = None,
                      confirm_within: float = 0.0) -> LateVerdict:  # fmt: skip
    """A first attempt rejected (so the next is planned from the file alone, with no lookup before
    its intent: the processor is asked only for the verdict); that next attempt's (``held``) verdict
    held back ``held_s`` after it was asked for; ``next_call``: a gateway failure mode for the next
    call (``late``...); ``confirm_within``: the agent's ledger's (0: the deadline is the call's
    timeout alone, where a late verdict is felt soonest)."""
    proc = Processor(cfg, tmp_path / "data")
    key = f"late-{uuid.uuid4().hex[:8]}"
    with Gateway("none") as gateway, running(proc):
        proc.wait_ready()
        agent = AgentProcess(str(tmp_path / "host.db"), cfg, proc.url, gateway.url, str(tmp_path / "host.log"),
                             timeout_s=timeout_s, confirm_within=confirm_within)  # fmt: skip
        assert proc.proc is not None
        try:
            gateway.state.failures.append(("reject", 0.0))
            agent.send(f"execute {key}")
            assert agent.answer(60)["outcome"] == "rejected"
            if next_call is not None:
                gateway.state.failures.append(next_call)
            stopped_ms = int(time.time() * 1000)
            proc.proc.send_signal(signal.SIGSTOP)  # the processor freezes: no verdict for now
            try:
                asked = time.time()
                agent.send(f"execute {key}")
                wait_for(lambda: time.time() > asked + held_s, held_s + 10, "the verdict's hold")
            finally:
                resumed_ms = int(time.time() * 1000)
                proc.proc.send_signal(signal.SIGCONT)
            answer = agent.answer(60)
        finally:
            agent.stop()
        calls = [r for r in gateway.refunds() if r.idempotency_key == key]

    async def facts() -> list[Any]:
        async with await Ledger.open(str(tmp_path / "host.db"), targets=[Target("payments")]) as ledger:
            effect = await ledger.get(key)
            assert effect is not None
            return list(effect.facts)

    known = asyncio.run(facts())
    # Not always attempt 2: on a loaded machine the first execute's own verdict can come too late for
    # its call, and the rejection it is set up with lands on a later attempt.
    held = min((f.attempt for f in known if isinstance(f, Intent) and f.at_ms >= stopped_ms), default=0)
    return LateVerdict(key, answer, calls, known, resumed_ms, held)

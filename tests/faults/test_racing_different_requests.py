"""Two hosts racing on one key with DIFFERENT requests: the loser gets ``EffectConflict``, never the
winner's receipt.

The same pair in sequence was always a conflict (the second caller's plan compares its request with
the key's first intent). Racing, the loser's claim was settled by the processor's verdict, and a
lost claim whose key was already CONFIRMED handed the winner's receipt back (``called=False``) for a
request that was not the loser's: 4 of 20 and 8 of 40 races before the fix. Now a lost claim is
checked against the owning intent's request like any other call (``core.plan.conflict_with``).
"""

from __future__ import annotations

import uuid
from collections import Counter
from pathlib import Path

from effect_ledger.demo.gateway import Gateway
from effect_ledger.streams.config import KafkaConfig
from tests.claim_agent import AgentProcess
from tests.services import Processor
from tests.topic_io import running

RACES = 40


def test_racing_hosts_with_different_requests_get_a_conflict_never_the_other_receipt(
    kafka_config: KafkaConfig, tmp_path: Path
) -> None:
    proc = Processor(kafka_config, tmp_path / "data")
    with Gateway("none") as gateway, running(proc):
        proc.wait_ready()
        agents = [
            AgentProcess(str(tmp_path / f"host-{h}.db"), kafka_config, proc.url, gateway.url,
                         str(tmp_path / f"host-{h}.log"))
            for h in "ab"
        ]  # fmt: skip
        try:
            keys = [f"conflict-race-{uuid.uuid4().hex[:8]}-{i}" for i in range(RACES)]
            outcomes: list[tuple[str, ...]] = []
            for key in keys:
                for tag, a in zip("ab", agents, strict=True):
                    a.send(f"execute {key} {tag}")  # the same key, each host its own request
                outcomes.append(tuple(sorted(a.answer()["outcome"] for a in agents)))
            # Each host asks again with its own request: the winner gets its receipt, the loser a conflict.
            again: list[tuple[str, ...]] = []
            for key in keys[:10]:
                answers = []
                for tag, a in zip("ab", agents, strict=True):
                    a.send(f"execute {key} {tag}")
                    answers.append(a.answer()["outcome"])
                again.append(tuple(sorted(answers)))
        finally:
            for a in agents:
                a.stop()
        calls = Counter(r.idempotency_key for r in gateway.refunds())
    kinds = Counter(outcomes)
    assert {k: n for k, n in calls.items() if n > 1} == {}
    assert "recorded" not in {o for pair in outcomes for o in pair}, f"a loser was handed the winner's receipt: {kinds}"
    assert set(outcomes) == {("called", "conflict")}, kinds
    assert set(again) == {("conflict", "recorded")}, Counter(again)

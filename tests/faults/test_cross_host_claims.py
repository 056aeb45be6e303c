"""Two agents on different hosts executing the same key at the same moment call the destination
once (issue 11, item 1).

Each agent is its own process (its own worker identity) with its own ledger file, on the same
Kafka, with ``sync=True`` and a lookup on the same processor: nothing local can exclude the other.
Before the fix each claim was a conditional write in its own file, so both called a destination that
does not deduplicate keys (87 of 100 races on main). Now the key's partition arbitrates: the
processor records the first intent of the attempt as its owner, and an agent calls only once the
processor has answered, for its own intent's offset, that the claim is its own.
"""

from __future__ import annotations

import uuid
from collections import Counter
from pathlib import Path

from effect_ledger.core.model import Flag, State
from effect_ledger.demo.gateway import Gateway
from effect_ledger.streams.config import KafkaConfig
from tests.claim_agent import AgentProcess
from tests.services import Processor
from tests.topic_io import TopicReader, running

RACES = 100


def test_two_hosts_racing_for_the_same_key_call_a_non_deduplicating_destination_once(
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
            assert agents[0].worker != agents[1].worker
            keys = [f"race-{uuid.uuid4().hex[:8]}-{i}" for i in range(RACES)]
            outcomes: list[tuple[str, str]] = []
            for key in keys:
                for a in agents:  # both at once: each agent executes as soon as it reads the line
                    a.send(f"execute {key}")
                outcomes.append(tuple(sorted(a.answer()["outcome"] for a in agents)))  # type: ignore[arg-type]
            # Once the winner's receipt is there, either host gets it without calling.
            again = []
            for key in keys[:10]:
                for a in agents:
                    a.send(f"execute {key}")
                    again.append(a.answer()["outcome"])
            # How many races both hosts wrote an intent for: the processor arbitrated those.
            with TopicReader(kafka_config, kafka_config.topics.state) as states:
                settled = states.until(
                    lambda _: all(getattr(states.latest().get(k), "state", None) is State.CONFIRMED for k in keys)
                    and states.latest(), 60, "every raced key CONFIRMED",
                )  # fmt: skip
            lost = sum(Flag.LOST_CLAIM.value in settled[k].flags for k in keys)
        finally:
            for a in agents:
                a.stop()
        calls = Counter(r.idempotency_key for r in gateway.refunds())
    doubled = {k: n for k, n in calls.items() if n > 1}
    assert doubled == {}, f"{len(doubled)} of {RACES} races called the destination twice"
    assert set(calls) == set(keys)  # every race called it once
    kinds = Counter(outcomes)
    assert all(o[0] == "called" and o[1] in ("in-progress", "recorded") for o in outcomes), kinds
    assert again == ["recorded"] * 20
    print(f"{RACES} races: {dict(kinds)}; both hosts wrote an intent (a lost claim) in {lost}")
    assert lost > 0  # the races did reach the log, not only the hosts' lookups

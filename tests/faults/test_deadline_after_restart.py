"""An intent whose call deadline passes while no worker runs (its worker was SIGKILLed or
stopped after folding it; or it was written while none ran) must still be reported uncertain once a
worker is back: a CALL Timeout folded (lookup UNCERTAIN) and an ``effects.uncertain`` work item.
Also through a rebalance: the worker owning the keys is killed and the survivor takes them over."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from effect_ledger.core.model import Intent, Timeout, UncertainEffect
from effect_ledger.streams.config import KafkaConfig
from tests.faults._flow import answered, committed_through_end, now_ms
from tests.faults._flow import intent as intent_at
from tests.services import Processor, wait_for
from tests.topic_io import RawProducer, TopicReader, running

WAIT = 90.0


def intent(key: str, deadline_ms: int) -> Intent:
    return intent_at(key, now_ms(), deadline_ms)


def reported(cfg: KafkaConfig, uncertain: TopicReader, events: TopicReader, keys: list[str]) -> bool:
    uncertain.poll()
    events.poll()
    got = {u.effect_id for u in uncertain.values(UncertainEffect)}
    timed = {t.effect_id for t in events.values(Timeout)}
    return set(keys) <= got and set(keys) <= timed


# (The other two pairs add nothing the worker does differently.)
@pytest.mark.parametrize(("data", "how"), [("same-dir", "kill"), ("empty-dir", "stop")])
def test_a_deadline_that_passed_while_no_worker_ran_is_detected(
    kafka_config: KafkaConfig, tmp_path: Path, how: str, data: str
) -> None:
    producer = RawProducer(kafka_config)
    folded = [f"payments:folded-{i}" for i in range(30)]  # folded first (every partition: commits)
    deadline = now_ms() + 25_000  # room to see them PENDING first (a lookup takes ~1 s)
    first = Processor(kafka_config, tmp_path / "data-1")
    with running(first):
        first.wait_ready()
        for k in folded:
            producer.event(intent(k, deadline))
        producer.flush()
        wait_for(lambda: answered(first, folded[-1], "PENDING"), WAIT, "the intents folded")
        wait_for(lambda: committed_through_end(kafka_config), WAIT, "the group to commit")
        assert now_ms() < deadline, "too slow: the deadline passed while the first worker ran"
        first.kill() if how == "kill" else first.stop()
    # Written while no worker runs, its deadline already past.
    unseen = [f"payments:unseen-{i}" for i in range(6)]
    for k in unseen:
        producer.event(intent(k, now_ms() - 1_000))
    producer.flush()
    wait_for(lambda: now_ms() > deadline + 2_000, 60, "the first deadlines to pass")
    if data == "empty-dir":
        shutil.rmtree(tmp_path / "data-1")
    second = Processor(kafka_config, tmp_path / "data-1")
    with (
        running(second),
        TopicReader(kafka_config, kafka_config.topics.uncertain) as uncertain,
        TopicReader(kafka_config, kafka_config.topics.events) as events,
    ):
        second.wait_ready()
        try:
            wait_for(lambda: reported(kafka_config, uncertain, events, folded + unseen), WAIT, "every key reported")
        except TimeoutError as e:
            got = {u.effect_id for u in uncertain.values(UncertainEffect)}
            missing = sorted(set(folded + unseen) - got)
            raise AssertionError(f"{e}: not reported uncertain: {missing}; health {second.health()}") from None
        for k in folded + unseen:
            wait_for(lambda k=k: answered(second, k, "UNCERTAIN"), WAIT, f"{k} UNCERTAIN")


def test_a_deadline_is_detected_by_the_worker_that_takes_over(kafka_config: KafkaConfig, tmp_path: Path) -> None:
    producer = RawProducer(kafka_config)
    a = Processor(kafka_config, tmp_path / "data-a")
    b = Processor(kafka_config, tmp_path / "data-b")
    keys = [f"payments:takeover-{i}" for i in range(12)]
    with running(a, b):
        a.wait_ready()
        b.wait_ready()
        wait_for(lambda: a.health() and b.health() and a.health()["partitions"] and b.health()["partitions"],  # type: ignore[index]
                 WAIT, "both workers to own partitions")  # fmt: skip
        deadline = now_ms() + 8_000
        for k in keys:
            producer.event(intent(k, deadline))
        producer.flush()
        wait_for(lambda: answered(b, keys[-1], "PENDING"), WAIT, "the intents folded")
        a.kill()  # its partitions go to b once the session times out (10 s), after the deadline
        with (
            TopicReader(kafka_config, kafka_config.topics.uncertain) as uncertain,
            TopicReader(kafka_config, kafka_config.topics.events) as events,
        ):
            try:
                wait_for(lambda: reported(kafka_config, uncertain, events, keys), WAIT, "every key reported")
            except TimeoutError as e:
                got = {u.effect_id for u in uncertain.values(UncertainEffect)}
                raise AssertionError(f"{e}: not reported: {sorted(set(keys) - got)}; health {b.health()}") from None

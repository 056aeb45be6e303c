"""A worker that starts with an empty data dir, whose group has no committed offsets, while the
table's changelog already holds keys (the previous worker folded them and was gone before its group
committed). It recovers the table from the changelog, then must fold every record of effects.events
from the first one, and go on folding what arrives after. It used to fold nothing at all after such
a recovery: every partition stayed at "processed -1", lookups of the recovered keys answered, but an
event written afterwards was never folded, and its deadline never detected."""

from __future__ import annotations

from pathlib import Path

import pytest

from effect_ledger.core.effect import fold, to_state
from effect_ledger.core.model import State
from effect_ledger.streams.config import KafkaConfig
from tests.faults._flow import answered, committed_through_end, forget_commits, key_events, mismatches, now_ms
from tests.faults.test_large_values import events_of
from tests.services import Processor, wait_for
from tests.topic_io import RawProducer, TopicReader, recorded_times, running

WAIT = 90.0


@pytest.mark.parametrize("large", [False, True], ids=["small-keys", "near-limit-key"])
def test_a_fresh_worker_without_commits_folds_from_the_first_record_after_recovery(
    kafka_config: KafkaConfig, tmp_path: Path, large: bool
) -> None:
    keys = [f"payments:recover-{i}" for i in range(6)]
    evs = {k: key_events(k, "confirmed", now_ms()) for k in keys}
    if large:
        evs["payments:large"] = events_of("payments:large")
        recorded_times(kafka_config)  # that history is folded with its writers' times (test_large_values)
    producer = RawProducer(kafka_config)
    for events in evs.values():
        for ev in events:
            producer.event(ev)
    producer.flush()
    assert not producer.errors, producer.errors
    expected = {k: to_state(fold(v)) for k, v in evs.items()}  # type: ignore[arg-type]

    first = Processor(kafka_config, tmp_path / "data-1")
    with running(first), TopicReader(kafka_config, kafka_config.topics.state) as states:
        first.wait_ready()

        def folded() -> bool:
            assert first.alive, f"the worker exited:\n{first.log()[-3000:]}"
            return not mismatches(states, expected)

        wait_for(folded, WAIT, "every key folded by the first worker")
        wait_for(lambda: committed_through_end(kafka_config), WAIT, "the group to commit")
        first.stop()
    assert not first.alive
    forget_commits(kafka_config)

    # Written while no worker runs: the new worker must fold it (from the first record on).
    late = "payments:written-while-down"
    producer.event(key_events(late, "pending", now_ms())[0])
    producer.flush()
    assert not producer.errors, producer.errors

    second = Processor(kafka_config, tmp_path / "data-2")
    with running(second), TopicReader(kafka_config, kafka_config.topics.state) as states:
        second.wait_ready()
        # And one written once it is running.
        after = "payments:written-after-recovery"
        producer.event(key_events(after, "pending", now_ms())[0])
        producer.flush()

        try:
            wait_for(lambda: answered(second, late, "PENDING"), WAIT, "the event written while no worker ran")
            wait_for(lambda: answered(second, after, "PENDING"), WAIT, "the event written after recovery")
        except TimeoutError as e:
            raise AssertionError(f"{e}; health {second.health()}; log:\n{second.log()[-6000:]}") from None
        for k in keys:
            status, body = second.lookup(k)
            assert status == 200 and body["state"] == State.CONFIRMED.value, (k, status, body)

"""A worker that starts with an empty data dir, whose group has no committed offsets, while the
table's changelog already holds keys (the previous worker folded them and was gone before its group
committed). It recovers the table from the changelog, then must fold every record of effects.events
from the first one, and go on folding what arrives after. It used to fold nothing at all after such
a recovery: every partition stayed at "processed -1", lookups of the recovered keys answered, but an
event written afterwards was never folded, and its deadline never detected."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient

from effect_ledger.streams.config import KafkaConfig
from effect_ledger.streams.effect import fold, to_state
from effect_ledger.streams.model import Executed, Intent, Outcome, Receipt, ReceiptSource, State
from tests.faults.test_large_values import committed_through_end, events_of
from tests.services import Processor, wait_for
from tests.topic_io import RawProducer, TopicReader, running

WAIT = 90.0


def small_events(key: str) -> list[object]:
    t = time.time_ns() // 1_000_000
    far = t + 3_600_000
    return [
        Intent(f"i-{uuid.uuid4().hex}", key, t, 1, "payments", "refund.create", "tests", "run-1", key,
               '{"amount": 1}', "d" * 64, far, "w"),  # fmt: skip
        Executed(f"x-{uuid.uuid4().hex}", key, t + 1, 1, Outcome.OK, None, t, t + 1, far, "w"),
        Receipt(f"rc-{uuid.uuid4().hex}", key, t + 2, 1, f"re_{key}", ReceiptSource.CALL, "{}"),
    ]


def forget_commits(cfg: KafkaConfig) -> None:
    """Delete the processors' consumer group (its members are gone): no partition has a commit."""
    group = f"{cfg.prefix}effect-ledger"
    admin = AdminClient(cfg.confluent())
    futures = admin.delete_consumer_groups([group], request_timeout=30)
    futures[group].result(timeout=30)


@pytest.mark.parametrize("large", [False, True], ids=["small-keys", "near-limit-key"])
def test_a_fresh_worker_without_commits_folds_from_the_first_record_after_recovery(
    kafka_config: KafkaConfig, tmp_path: Path, large: bool
) -> None:
    keys = [f"payments:recover-{i}" for i in range(6)]
    evs = {k: small_events(k) for k in keys}
    if large:
        evs["payments:large"] = events_of("payments:large")
    producer = RawProducer(kafka_config)
    for key_events in evs.values():
        for ev in key_events:
            producer.event(ev)
    producer.flush()
    assert not producer.errors, producer.errors
    expected = {k: to_state(fold(v)) for k, v in evs.items()}  # type: ignore[arg-type]

    first = Processor(kafka_config, tmp_path / "data-1")
    with running(first), TopicReader(kafka_config, kafka_config.topics.state) as states:
        first.wait_ready()

        def folded() -> bool:
            assert first.alive, f"the worker exited:\n{first.log()[-3000:]}"
            states.poll()
            latest = states.latest()
            return all(latest.get(k) == s for k, s in expected.items())

        wait_for(folded, WAIT, "every key folded by the first worker")
        wait_for(lambda: committed_through_end(kafka_config), WAIT, "the group to commit")
        first.stop()
    assert not first.alive
    forget_commits(kafka_config)

    # Written while no worker runs: the new worker must fold it (from the first record on).
    late = "payments:written-while-down"
    producer.event(small_events(late)[0])
    producer.flush()
    assert not producer.errors, producer.errors

    second = Processor(kafka_config, tmp_path / "data-2")
    with running(second), TopicReader(kafka_config, kafka_config.topics.state) as states:
        second.wait_ready()
        # And one written once it is running.
        after = "payments:written-after-recovery"
        producer.event(small_events(after)[0])
        producer.flush()

        def answered(key: str, state: str) -> bool:
            assert second.alive, second.log()[-3000:]
            status, body = second.lookup(key)
            return status == 200 and body.get("state") == state

        try:
            wait_for(lambda: answered(late, "PENDING"), WAIT, "the event written while no worker ran")
            wait_for(lambda: answered(after, "PENDING"), WAIT, "the event written after recovery")
        except TimeoutError as e:
            raise AssertionError(f"{e}; health {second.health()}; log:\n{second.log()[-6000:]}") from None
        for k in keys:
            status, body = second.lookup(k)
            assert status == 200 and body["state"] == State.CONFIRMED.value, (k, status, body)

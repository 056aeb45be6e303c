"""Which Kafka errors a service starting beside a cluster waits through (``rights.not_now``), row by
row: "not now" is asked again, "no" is the answer."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError

from effect_ledger.streams.rights import not_now


@pytest.mark.parametrize(
    ("code", "retriable", "expected"),
    [
        (KafkaError._DESTROY_BROKER, False, True),  # a broker dropped from the metadata while it restarts
        (KafkaError._TIMED_OUT, False, True),
        (KafkaError.LEADER_NOT_AVAILABLE, True, True),  # the client's own retriable flag
        (KafkaError.NOT_COORDINATOR, True, True),
        (KafkaError.TOPIC_AUTHORIZATION_FAILED, False, False),  # a refusal is the answer
        (KafkaError.CLUSTER_AUTHORIZATION_FAILED, False, False),
        (KafkaError._AUTHENTICATION, False, False),
        (KafkaError.UNKNOWN_TOPIC_OR_PART, False, False),
    ],
)
def test_not_now(code: int, retriable: bool, expected: bool) -> None:
    assert not_now(KafkaError(code, retriable=retriable)) is expected


def test_anything_else_is_no() -> None:
    assert not_now(None) is False
    assert not_now(RuntimeError("no")) is False

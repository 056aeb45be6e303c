"""``watermarks.high_watermark``: a reader of a compacted topic (``effects.schemas`` here) asks
again while the broker says "not yet" (a topic just created has no leader for a moment:
NOT_LEADER_FOR_PARTITION), within its deadline, and fails at once on anything else. Before, the
first NOT_LEADER answer made a reader report the schemas "could not be looked up" although they
were there a moment later (tests/integration/test_schema_upgrade.py met it on a fresh topic)."""

from __future__ import annotations

import time
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from effect_ledger.streams.watermarks import ATTEMPT_S, high_watermark

TP = TopicPartition("effects.schemas", 0)


class Answers:
    """What a consumer's ``get_watermark_offsets`` answers, one answer per call (an error code
    raises as confluent-kafka raises it)."""

    def __init__(self, *answers: int | tuple[int, int]) -> None:
        self.answers = list(answers)
        self.calls = 0
        self.waits: list[float] = []
        self.refreshed = 0

    def list_topics(self, topic: str, timeout: float) -> None:
        self.refreshed += 1

    def get_watermark_offsets(self, tp: Any, timeout: float) -> tuple[int, int]:
        self.calls += 1
        self.waits.append(timeout)
        answer = self.answers.pop(0)
        if isinstance(answer, int):
            raise KafkaException(KafkaError(answer))
        return answer


def test_not_leader_yet_is_asked_again_until_the_leader_answers() -> None:
    c = Answers(KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE, (0, 7))
    assert high_watermark(c, TP, time.monotonic() + 5) == 7
    assert c.calls == 3


def test_any_other_error_is_raised_at_once() -> None:
    c = Answers(KafkaError.TOPIC_AUTHORIZATION_FAILED, (0, 7))
    with pytest.raises(KafkaException):
        high_watermark(c, TP, time.monotonic() + 5)
    assert c.calls == 1


def test_not_leader_past_the_deadline_is_raised() -> None:
    c = Answers(*[KafkaError.NOT_LEADER_FOR_PARTITION] * 100)
    start = time.monotonic()
    with pytest.raises(KafkaException):
        high_watermark(c, TP, start + 0.3)
    assert time.monotonic() - start < 2.0
    assert 1 < c.calls < 100


def test_a_new_leader_without_its_high_watermark_yet_is_asked_again_after_new_metadata() -> None:
    # KIP-207: a leader elected a moment ago answers OFFSET_NOT_AVAILABLE until its high watermark
    # is established; the chaos run's broker kills met it on every agent's claim.
    c = Answers(KafkaError.OFFSET_NOT_AVAILABLE, KafkaError._DESTROY_BROKER, (0, 9))
    assert high_watermark(c, TP, time.monotonic() + 5) == 9
    assert c.calls == 3
    assert c.refreshed == 2


def test_each_query_waits_at_most_an_attempt_then_asks_who_leads_now() -> None:
    # A paused leader takes the query and never answers: the wait is cut at ATTEMPT_S, the metadata
    # asked again, and the next query goes to whoever leads by then, within the caller's deadline.
    c = Answers(KafkaError._TIMED_OUT, (0, 4))
    assert high_watermark(c, TP, time.monotonic() + 30) == 4
    assert c.waits[0] <= ATTEMPT_S
    assert c.refreshed == 1

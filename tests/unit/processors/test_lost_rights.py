"""A worker stopped by Kafka refusing a right the ACLs took away while it ran (an offset commit, a
fetch) names the right it lost, in the words of its rights check, not a client's traceback."""

from __future__ import annotations

from aiokafka import errors as ak

from effect_ledger.processors.processor import ProcessorSettings
from effect_ledger.processors.worker import lost_rights
from effect_ledger.streams.config import KafkaConfig


def _settings() -> ProcessorSettings:
    return ProcessorSettings(kafka=KafkaConfig(bootstrap="127.0.0.1:1", prefix="p."))


def test_a_refused_commit_on_the_events_topic_is_a_lost_read_right() -> None:
    s = _settings()
    assert lost_rights(ak.TopicAuthorizationFailedError({s.kafka.topics.events}), s) == [
        f"Read on topic {s.kafka.topics.events}"
    ]


def test_a_refused_write_is_a_lost_write_right_and_a_cause_down_the_chain_counts() -> None:
    s = _settings()
    try:
        try:
            raise ak.TopicAuthorizationFailedError({s.kafka.topics.state})
        except ak.KafkaError as inner:
            raise RuntimeError("the consumer's commit failed") from inner
    except RuntimeError as outer:
        assert lost_rights(outer, s) == [f"Write on topic {s.kafka.topics.state}"]


def test_a_refused_group_is_named_and_anything_else_is_not_a_right() -> None:
    s = _settings()
    assert lost_rights(ak.GroupAuthorizationFailedError(), s) == [f"Read on group {s.full_app_id}"]
    assert lost_rights(ak.KafkaConnectionError("down"), s) == []
    assert lost_rights(ValueError("x"), s) == []

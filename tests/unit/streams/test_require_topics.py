"""``require_topics`` (what a worker refuses to start on) asks again, for a few seconds, about a
topic it was told is missing: on a cluster, the broker a fresh client asks can trail the one that
just created the topics (two workers starting together exited with "does not exist")."""

from __future__ import annotations

import pytest

from effect_ledger.errors import TopicDrift
from effect_ledger.streams import admin
from effect_ledger.streams.admin import Drift, TopicSpec, TopicStatus, require_topics
from effect_ledger.streams.config import KafkaConfig

CFG = KafkaConfig(bootstrap="127.0.0.1:1", prefix="t.", partitions=3)
SPEC = TopicSpec(CFG.topics.events, 3, 1, {})


def _missing() -> list[TopicStatus]:
    return [TopicStatus(SPEC, False, 0, 0, {}, (Drift(SPEC.name, "missing", "-", "-"),))]


def _present() -> list[TopicStatus]:
    return [TopicStatus(SPEC, True, 3, 1, {}, ())]


def test_a_topic_that_appears_a_moment_later_is_not_a_drift(monkeypatch: pytest.MonkeyPatch) -> None:
    answers = [_missing(), _missing(), _present()]
    monkeypatch.setattr(admin, "check_topics", lambda cfg, timeout: answers.pop(0))
    require_topics(CFG)
    assert answers == []  # asked three times: it waited for the topic


def test_a_topic_still_missing_after_the_wait_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(admin, "_METADATA_SETTLE_S", 0.5)
    asked = []
    monkeypatch.setattr(admin, "check_topics", lambda cfg, timeout: asked.append(1) or _missing())
    with pytest.raises(TopicDrift, match="missing|does not exist"):
        require_topics(CFG)
    assert len(asked) >= 2


def test_a_wrong_partition_count_is_refused_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    asked = []
    wrong = [TopicStatus(SPEC, True, 2, 1, {}, (Drift(SPEC.name, "partitions", "2", "3"),))]
    monkeypatch.setattr(admin, "check_topics", lambda cfg, timeout: asked.append(1) or wrong)
    with pytest.raises(TopicDrift):
        require_topics(CFG)
    assert asked == [1]

"""``effects topics check`` / ``topics create`` / the worker against topics configured otherwise than
effect-ledger expects: pre-created on the real broker with a delete policy on ``effects.state`` and
a retention on ``effects.events``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from effect_ledger.errors import TopicDrift
from effect_ledger.streams.admin import (
    LOG_TIME,
    check_topics,
    delete_topics,
    ensure_topics,
    list_topics,
    require_topics,
)
from effect_ledger.streams.config import KafkaConfig
from tests.topic_io import recorded_times

TIMEOUT = 30


def effects(*args: str, cfg: KafkaConfig) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "effect_ledger", *args, "--bootstrap", cfg.bootstrap, "--prefix", cfg.prefix],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, EFFECTS_PARTITIONS=str(cfg.partitions)),
    )


@pytest.fixture
def drifted(kafka_bootstrap: str) -> Iterator[KafkaConfig]:
    """Topics under a fresh prefix: effects.state not compacted, effects.events deleted after a day."""
    cfg = KafkaConfig(bootstrap=kafka_bootstrap, prefix=f"t{uuid.uuid4().hex[:12]}.", partitions=2)
    admin = AdminClient(cfg.confluent())
    made = admin.create_topics(
        [
            NewTopic(
                cfg.topics.state,
                num_partitions=2,
                replication_factor=1,
                config={"cleanup.policy": "delete", **LOG_TIME},
            ),
            NewTopic(
                cfg.topics.events,
                num_partitions=2,
                replication_factor=1,
                config={"retention.ms": "86400000", **LOG_TIME},
            ),
        ]
    )
    for fut in made.values():
        fut.result(timeout=TIMEOUT)
    yield cfg
    delete_topics(cfg, [t for t in list_topics(cfg) if t.startswith(cfg.prefix)])


def test_check_is_clean_on_topics_it_created(kafka_config: KafkaConfig) -> None:
    statuses = check_topics(kafka_config)
    assert [s.spec.name for s in statuses] == list(kafka_config.topics.all())
    assert all(s.exists and not s.drifts for s in statuses), statuses
    assert all(s.config["min.insync.replicas"] == "1" for s in statuses)  # min(2, replication 1)
    r = effects("topics", "check", cfg=kafka_config)
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""
    assert kafka_config.topics.state in r.stdout and "compact" in r.stdout


def test_create_and_check_report_a_pre_created_drifted_topic(drifted: KafkaConfig) -> None:
    t = drifted.topics
    r = effects("topics", "create", cfg=drifted)
    assert r.returncode == 1, (r.stdout, r.stderr)
    lines = dict(line.split("\t", 1) for line in r.stdout.splitlines())
    # Not "exists" as if it were fine: the differences, on the topic's own line.
    assert lines[t.state].startswith("exists, DRIFTED: cleanup.policy is delete, expected compact"), lines
    assert lines[t.events].startswith("exists, DRIFTED: retention.ms is 86400000, expected -1"), lines
    assert lines[t.decisions] == "created"
    assert r.stderr.startswith("effects: ") and len(r.stderr.strip().splitlines()) == 1

    r = effects("topics", "check", cfg=drifted)
    assert r.returncode == 1
    assert r.stdout == ""
    assert r.stderr.splitlines() == [
        f"effects: {t.events}: retention.ms is 86400000, expected -1",
        f"effects: {t.state}: cleanup.policy is delete, expected compact",
    ]
    doc = json.loads(effects("topics", "check", "--json", cfg=drifted).stdout)
    assert {d["topic"]: d["drifts"] for d in doc}[t.uncertain] == []

    # A min.insync.replicas above the replication factor is refused before anything is asked.
    r = effects("topics", "check", "--min-insync-replicas", "2", cfg=drifted)
    assert r.returncode == 1 and "min.insync.replicas 2 must be between 1 and the replication factor 1" in r.stderr


def test_a_topic_that_keeps_the_writers_clock_is_a_drift(kafka_config: KafkaConfig) -> None:
    """A topic on which the producer stamps the records' times (CreateTime) lets a writer's clock
    into what the log decides: ``topics check`` reports it, naming the setting."""
    recorded_times(kafka_config)
    drifts = [str(d) for s in check_topics(kafka_config) for d in s.drifts]
    want = "message.timestamp.type is CreateTime, expected LogAppendTime"
    assert drifts == [f"{kafka_config.topics.events}: {want}", f"{kafka_config.topics.decisions}: {want}"]


def test_min_insync_replicas_is_checked(drifted: KafkaConfig) -> None:
    ensure_topics(drifted)
    # The cluster has min.insync.replicas 1 where the operator asked for 2 (with replication 2).
    want = KafkaConfig(bootstrap=drifted.bootstrap, prefix=drifted.prefix, partitions=2, replication=2)
    drifts = [str(d) for s in check_topics(want) for d in s.drifts]
    assert f"{drifted.topics.decisions}: min.insync.replicas is 1, expected 2" in drifts
    assert f"{drifted.topics.decisions}: replication is 1, expected at least 2" in drifts


def test_worker_refuses_a_drifted_state_topic(drifted: KafkaConfig, tmp_path: object) -> None:
    with pytest.raises(TopicDrift, match="cleanup.policy is delete, expected compact"):
        require_topics(drifted)
    r = effects("worker", "--data-dir", str(tmp_path), "--web-port", "6199", cfg=drifted)
    assert r.returncode == 1, r.stderr
    (line,) = r.stderr.splitlines()
    assert line.startswith(f"effects: {drifted.topics.state}: cleanup.policy is delete, expected compact")
    # events' retention is reported by `topics check`, but does not stop the processor
    assert drifted.topics.events not in line


def test_check_asks_again_about_a_topic_a_trailing_broker_does_not_show_yet(
    kafka_config: KafkaConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a cluster, the broker answering a check made right after the topics were created can
    trail the one that created them: its first answers lack a topic. That is not "missing"."""
    from effect_ledger.streams import admin

    ensure_topics(kafka_config)
    real = admin.admin_client(kafka_config)
    trailing = {"answers": 2}

    class TrailingBroker:
        def __getattr__(self, name: str) -> object:
            return getattr(real, name)

        def list_topics(self, *args: object, **kwargs: object) -> object:
            md = real.list_topics(*args, **kwargs)
            if trailing["answers"] > 0:
                trailing["answers"] -= 1
                md.topics.pop(kafka_config.topics.events, None)
            return md

    monkeypatch.setattr(admin, "admin_client", lambda cfg: TrailingBroker())
    drifts = [str(d) for s in check_topics(kafka_config) for d in s.drifts]
    assert drifts == [] and trailing["answers"] == 0, drifts


def _trailing_describer(cfg: KafkaConfig, answers: int | None) -> tuple[object, dict[str, int]]:
    """A client whose DescribeConfigs of ``cfg``'s events topic reaches, ``answers`` times (None:
    always), a broker that does not know the topic: the real broker is asked about a name it has
    never seen, and its own error comes back under the events topic's name."""
    from confluent_kafka.admin import ConfigResource, ResourceType

    from effect_ledger.streams import admin

    real = admin.admin_client(cfg)
    asked = {"unknown": 0}

    class TrailingBroker:
        def __getattr__(self, name: str) -> object:
            return getattr(real, name)

        def describe_configs(self, resources: list[ConfigResource], **kwargs: object) -> dict[object, object]:
            if answers is not None and asked["unknown"] >= answers:
                return real.describe_configs(resources, **kwargs)
            swapped = {}
            for r in resources:
                if r.name == cfg.topics.events:
                    asked["unknown"] += 1
                    swapped[ConfigResource(ResourceType.TOPIC, f"{cfg.prefix}never-created")] = r
                else:
                    swapped[r] = r
            futures = real.describe_configs(list(swapped), **kwargs)
            return {swapped[k]: f for k, f in futures.items()}

    return TrailingBroker(), asked


def test_check_asks_again_about_configs_a_trailing_broker_does_not_know_yet(
    kafka_config: KafkaConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The metadata showed the topic, and the broker that answers the DescribeConfigs does not know
    it yet (it trails the others): asked again, not a crash of the whole check."""
    from effect_ledger.streams import admin

    ensure_topics(kafka_config)
    client, asked = _trailing_describer(kafka_config, answers=2)
    monkeypatch.setattr(admin, "admin_client", lambda cfg: client)
    statuses = check_topics(kafka_config)
    assert [str(d) for s in statuses for d in s.drifts] == [] and asked["unknown"] == 2
    events = next(s for s in statuses if s.spec.name == kafka_config.topics.events)
    assert events.exists and events.config["cleanup.policy"] == "delete"


def test_a_topic_no_broker_describes_is_reported_missing(
    kafka_config: KafkaConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Listed, then unknown to every DescribeConfigs until the check gives up (deleted meanwhile):
    reported missing, the others checked as usual."""
    from effect_ledger.streams import admin

    ensure_topics(kafka_config)
    client, asked = _trailing_describer(kafka_config, answers=None)
    monkeypatch.setattr(admin, "admin_client", lambda cfg: client)
    drifts = [str(d) for s in check_topics(kafka_config, settle_s=1.0) for d in s.drifts]
    assert drifts == [f"{kafka_config.topics.events}: does not exist"] and asked["unknown"] >= 2, drifts

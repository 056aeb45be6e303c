"""KafkaConfig: settings from the documented environment variables, explicit overrides, the
confluent-kafka settings it hands to every client, and the prefixed topic names."""

from __future__ import annotations

import pytest

from effect_ledger.streams.config import DEFAULT_BOOTSTRAP, KafkaConfig, Topics

ENV_VARS = (
    "KAFKA_BOOTSTRAP",
    "EFFECTS_TOPIC_PREFIX",
    "EFFECTS_PARTITIONS",
    "EFFECTS_REPLICATION",
    "KAFKA_SECURITY_PROTOCOL",
    "KAFKA_SASL_MECHANISM",
    "KAFKA_SASL_USERNAME",
    "KAFKA_SASL_PASSWORD",
    "KAFKA_SSL_CAFILE",
    "EFFECTS_SCHEMA_REGISTRY",
)

SECURE_ENV = {
    "KAFKA_BOOTSTRAP": "broker-1.example:9093,broker-2.example:9093",
    "EFFECTS_TOPIC_PREFIX": "staging.",
    "EFFECTS_PARTITIONS": "12",
    "EFFECTS_REPLICATION": "3",
    "KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
    "KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
    "KAFKA_SASL_USERNAME": "ledger",
    "KAFKA_SASL_PASSWORD": "s3cret-ü",
    "KAFKA_SSL_CAFILE": "/etc/ssl/kafka-ca.pem",
}


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No Kafka variables from the shell (CI sets KAFKA_BOOTSTRAP) leak into a test."""
    for name in ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


@pytest.fixture
def secure_env(clean_env: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name, value in SECURE_ENV.items():
        clean_env.setenv(name, value)
    return clean_env


def test_defaults_without_environment(clean_env: pytest.MonkeyPatch) -> None:
    cfg = KafkaConfig.from_env()
    assert cfg == KafkaConfig()
    assert cfg.bootstrap == DEFAULT_BOOTSTRAP == "127.0.0.1:9092"
    assert (cfg.prefix, cfg.partitions, cfg.replication) == ("", 6, None)  # None: the cluster decides
    assert cfg.confluent() == {"bootstrap.servers": DEFAULT_BOOTSTRAP}


@pytest.mark.parametrize(
    ("brokers", "declared", "replication", "min_isr"),
    [
        (1, None, 1, 1),  # a development broker
        (1, 1, 1, 1),  # ... that says so (Kafka's default.replication.factor)
        (1, 3, 3, 2),  # one broker of a cluster that declares 3 answers (the others down or starting)
        (2, None, 3, 2),  # two answer: a cluster of three in a rolling restart, never "replicate twice"
        (2, 1, 3, 2),
        (3, None, 3, 2),
        (5, None, 3, 2),
    ],
)
def test_the_cluster_decides_the_replication_unless_it_is_set(
    brokers: int, declared: int | None, replication: int, min_isr: int
) -> None:
    decided = KafkaConfig().for_cluster(brokers, declared)
    assert (decided.replication, decided.min_insync) == (replication, min_isr)
    assert KafkaConfig(replication=1).for_cluster(brokers, declared).replication == 1  # set: kept


def test_reads_every_documented_variable(secure_env: pytest.MonkeyPatch) -> None:
    cfg = KafkaConfig.from_env()
    assert cfg == KafkaConfig(
        bootstrap="broker-1.example:9093,broker-2.example:9093",
        prefix="staging.",
        partitions=12,
        replication=3,
        security_protocol="SASL_SSL",
        sasl_mechanism="SCRAM-SHA-512",
        sasl_username="ledger",
        sasl_password="s3cret-ü",
        ssl_cafile="/etc/ssl/kafka-ca.pem",
    )
    assert isinstance(cfg.partitions, int) and isinstance(cfg.replication, int)


def test_overrides_win_over_environment(secure_env: pytest.MonkeyPatch) -> None:
    cfg = KafkaConfig.from_env(bootstrap="127.0.0.1:19092", prefix="", partitions=3)
    assert cfg.bootstrap == "127.0.0.1:19092"
    assert cfg.prefix == ""  # an explicit empty prefix is a value, not "unset"
    assert cfg.partitions == 3
    assert cfg.replication == 3  # not overridden: still from the environment


def test_none_override_keeps_environment(secure_env: pytest.MonkeyPatch) -> None:
    # The CLI passes bootstrap=None when --bootstrap is not given; that must not erase KAFKA_BOOTSTRAP.
    assert KafkaConfig.from_env(bootstrap=None).bootstrap == SECURE_ENV["KAFKA_BOOTSTRAP"]


def test_unknown_override_is_an_error(clean_env: pytest.MonkeyPatch) -> None:
    with pytest.raises(TypeError):
        KafkaConfig.from_env(bootstrap_servers="x:1")


def test_non_numeric_partitions_is_an_error(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("EFFECTS_PARTITIONS", "six")
    with pytest.raises(ValueError):
        KafkaConfig.from_env()


def test_confluent_passes_security_through(secure_env: pytest.MonkeyPatch) -> None:
    assert KafkaConfig.from_env().confluent() == {
        "bootstrap.servers": "broker-1.example:9093,broker-2.example:9093",
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "ledger",
        "sasl.password": "s3cret-ü",
        "ssl.ca.location": "/etc/ssl/kafka-ca.pem",
    }


def test_confluent_extra_settings_win(secure_env: pytest.MonkeyPatch) -> None:
    conf = KafkaConfig.from_env().confluent(**{"group.id": "g1", "security.protocol": "SSL"})
    assert conf["group.id"] == "g1"
    assert conf["security.protocol"] == "SSL"
    assert conf["sasl.username"] == "ledger"


def test_ssl_only(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("KAFKA_SECURITY_PROTOCOL", "SSL")
    clean_env.setenv("KAFKA_SSL_CAFILE", "/ca.pem")
    assert KafkaConfig.from_env().confluent() == {
        "bootstrap.servers": DEFAULT_BOOTSTRAP,
        "security.protocol": "SSL",
        "ssl.ca.location": "/ca.pem",
    }


def test_password_is_not_in_repr(secure_env: pytest.MonkeyPatch) -> None:
    # Configs end up in logs and error messages.
    assert "s3cret" not in repr(KafkaConfig.from_env())


def test_topics_with_prefix() -> None:
    t = KafkaConfig(prefix="t123.").topics
    assert t == Topics("t123.")
    assert (t.events, t.state, t.uncertain, t.dlq, t.decisions, t.keys, t.schemas) == (
        "t123.effects.events",
        "t123.effects.state",
        "t123.effects.uncertain",
        "t123.effects.dlq",
        "t123.effects.decisions",
        "t123.effects.keys",
        "t123.effects.schemas",
    )
    assert t.all() == (t.events, t.state, t.uncertain, t.dlq, t.decisions, t.keys, t.schemas)


def test_topics_without_prefix() -> None:
    assert Topics().all() == (
        "effects.events", "effects.state", "effects.uncertain", "effects.dlq", "effects.decisions", "effects.keys",
        "effects.schemas",
    )  # fmt: skip
    assert KafkaConfig().topics == Topics("")


def test_topics_from_env_prefix(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("EFFECTS_TOPIC_PREFIX", "dev-")
    assert KafkaConfig.from_env().topics.events == "dev-effects.events"

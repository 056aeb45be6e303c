"""docker-compose.yml, scripts/kafka.sh and the Python defaults describe the same broker: the Kafka
version pinned once in scripts/kafka.env, on 127.0.0.1:DEFAULT_PORT, single node (replication 1)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from effect_ledger.streams.config import DEFAULT_BOOTSTRAP, DEFAULT_PORT

ROOT = Path(__file__).resolve().parents[2]
# A Kafka release number (3.x.y or 4.x.y) standing alone: not part of 2.24.3 or kafka_2.13.
KAFKA_VERSION_LITERAL = re.compile(r"(?<![\w.])[34]\.\d+\.\d+(?![\w.])")
# kafka.sh writes a Maven POM: its namespace URL and <modelVersion> say 4.0.0, which is no Kafka version.
NOT_KAFKA = re.compile(r"https?://\S+|<modelVersion>[^<]*</modelVersion>")


def _version_literals(text: str) -> list[str]:
    return KAFKA_VERSION_LITERAL.findall(NOT_KAFKA.sub("", text))


def _kafka_env() -> dict[str, str]:
    values: dict[str, str] = {}
    for line in (ROOT / "scripts/kafka.env").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, sep, value = line.partition("=")
            assert sep, f"kafka.env line is not KEY=VALUE: {line!r}"
            assert key not in values, f"kafka.env sets {key} twice"
            values[key] = value
    return values


@pytest.fixture(scope="module")
def kafka_version() -> str:
    version = _kafka_env()["KAFKA_VERSION"]
    assert re.fullmatch(r"\d+\.\d+\.\d+", version), version
    return version


@pytest.fixture(scope="module")
def kafka_service() -> dict[str, Any]:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    return compose["services"]["kafka"]


@pytest.fixture(scope="module")
def kafka_environment(kafka_service: dict[str, Any]) -> dict[str, str]:
    env = kafka_service["environment"]
    if isinstance(env, list):  # compose also allows ["KEY=value", ...]
        env = dict(item.split("=", 1) for item in env)
    return {k: str(v) for k, v in env.items()}


def test_image_is_the_pinned_apache_kafka(kafka_service: dict[str, Any], kafka_version: str) -> None:
    assert kafka_service["image"] == f"apache/kafka:{kafka_version}"


def test_published_port_is_the_default(kafka_service: dict[str, Any]) -> None:
    published = []
    for p in kafka_service["ports"]:
        if isinstance(p, dict):  # long syntax
            published.append((int(p["published"]), int(p["target"])))
        else:  # "[ip:]host:container"
            *_, host, container = str(p).split(":")
            published.append((int(host), int(container)))
    assert (DEFAULT_PORT, DEFAULT_PORT) in published


def test_listeners_match_the_default_bootstrap(kafka_environment: dict[str, str]) -> None:
    advertised = kafka_environment["KAFKA_ADVERTISED_LISTENERS"].split(",")
    assert f"PLAINTEXT://{DEFAULT_BOOTSTRAP}" in advertised
    assert DEFAULT_BOOTSTRAP == f"127.0.0.1:{DEFAULT_PORT}"
    # The advertised address is only reachable if the broker listens on that port inside the container.
    assert f"PLAINTEXT://:{DEFAULT_PORT}" in kafka_environment["KAFKA_LISTENERS"].split(",")


def test_single_node_replication(kafka_environment: dict[str, str]) -> None:
    factors = {k: v for k, v in kafka_environment.items() if k.endswith("REPLICATION_FACTOR")}
    # A single broker cannot host the internal topics with any factor above 1.
    assert "KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR" in factors
    assert "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR" in factors
    assert set(factors.values()) == {"1"}, factors
    min_isr = {k: v for k, v in kafka_environment.items() if k.endswith("MIN_ISR")}
    assert set(min_isr.values()) <= {"1"}, min_isr


def test_kafka_sh_takes_its_version_from_kafka_env() -> None:
    script = (ROOT / "scripts/kafka.sh").read_text()
    assert re.search(r'^\. "\$here/kafka\.env"$', script, re.M), "kafka.sh must source kafka.env"
    # The jars Maven resolves are the pinned version.
    assert "<artifactId>kafka_2.13</artifactId><version>$KAFKA_VERSION</version>" in script
    assert not re.search(r"^\s*(export\s+)?KAFKA_VERSION=", script, re.M), "kafka.sh sets its own version"


def test_kafka_sh_default_port_is_the_python_default() -> None:
    script = (ROOT / "scripts/kafka.sh").read_text()
    assert f"port=${{KAFKA_PORT:-{DEFAULT_PORT}}}" in script
    assert re.search(rf"^KAFKA_PORT \?= {DEFAULT_PORT}$", (ROOT / "Makefile").read_text(), re.M)


@pytest.mark.parametrize("path", ["scripts/kafka.sh", "scripts/with-kafka.sh", "Makefile"])
def test_no_other_kafka_version_literal(path: str) -> None:
    assert _version_literals((ROOT / path).read_text()) == []


def test_compose_version_literal_is_kafka_env(kafka_version: str) -> None:
    # Compose cannot read kafka.env for an image tag without an env file, so it holds the literal.
    assert set(_version_literals((ROOT / "docker-compose.yml").read_text())) == {kafka_version}


def test_version_pattern_catches_versions() -> None:
    # The checks above are only as good as this pattern: it must see a bare version (also in a POM),
    # and must not mistake the POM model, log4j or Scala versions in kafka.sh for one.
    assert _version_literals("image: apache/kafka:4.1.1\nv=3.9.0") == ["4.1.1", "3.9.0"]
    assert _version_literals("<version>4.0.0</version>") == ["4.0.0"]
    pom = '<project xmlns="http://maven.apache.org/POM/4.0.0"><modelVersion>4.0.0</modelVersion>'
    assert _version_literals(f"{pom} kafka_2.13 log4j 2.24.3 kafka-$KAFKA_VERSION") == []


def test_services_reach_the_broker_on_a_listener_it_advertises() -> None:
    """The processor and reconciler services talk to the broker on the compose network; that
    address must be one the broker advertises, and their partition count the Python default."""
    from effect_ledger.streams.config import KafkaConfig

    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    advertised = compose["services"]["kafka"]["environment"]["KAFKA_ADVERTISED_LISTENERS"]
    for name in ("processor", "reconciler"):
        env = compose["services"][name]["environment"]
        assert env["KAFKA_BOOTSTRAP"].split(":")[0] in advertised, name
        assert int(env["EFFECTS_PARTITIONS"]) == KafkaConfig().partitions, name
        assert compose["services"][name]["depends_on"]["kafka"]["condition"] == "service_healthy"
    assert compose["services"]["processor"]["command"][0] == "worker"
    assert compose["services"]["reconciler"]["command"][0] == "reconcile"

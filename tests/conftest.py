"""Shared fixtures.

Tiers (see tests/README.md): ``tests/unit`` never touches a service; ``tests/integration`` gets a real
Kafka broker from the session-scoped ``kafka`` fixture; ``tests/crash`` kills real child processes.
"""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from effect_ledger.streams.config import KafkaConfig
from tests.mailserver import MailServer

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    """A real broker: the one named by KAFKA_BOOTSTRAP, or the repo's own started for this session."""
    # Imported here, not at the top: the DBOS tests run in an environment without a Kafka client.
    from effect_ledger.streams.admin import BrokerUnavailable, wait_ready

    given = os.environ.get("KAFKA_BOOTSTRAP")
    if given:
        try:
            wait_ready(KafkaConfig(bootstrap=given), timeout=30)
        except BrokerUnavailable as e:
            pytest.fail(f"KAFKA_BOOTSTRAP={given} does not answer: {e}")
        yield given
        return
    port = os.environ.get("KAFKA_PORT", "9092")
    env = dict(os.environ, KAFKA_PORT=port)
    script = str(ROOT / "scripts/kafka.sh")
    # Stop it afterwards only if this session started it (a developer's `make kafka-up` stays up).
    already = subprocess.run(["bash", script, "status"], env=env, capture_output=True).returncode == 0
    subprocess.run(["bash", script, "up"], check=True, env=env)
    try:
        yield f"127.0.0.1:{port}"
    finally:
        if not already:
            subprocess.run(["bash", script, "down"], check=False, env=env)


@pytest.fixture
def kafka_config(kafka_bootstrap: str) -> Iterator[KafkaConfig]:
    """A config with a fresh uuid topic prefix; its topics are created, and deleted afterwards."""
    from effect_ledger.streams.admin import delete_topics, ensure_topics, list_topics

    cfg = KafkaConfig(bootstrap=kafka_bootstrap, prefix=f"t{uuid.uuid4().hex[:12]}.", partitions=3)
    ensure_topics(cfg)
    yield cfg
    # Everything under the prefix: the four topics and a processor's changelog and assignor topics.
    delete_topics(cfg, [t for t in list_topics(cfg) if t.startswith(cfg.prefix)])


@pytest.fixture
def group_id() -> Callable[[], str]:
    """A factory of fresh consumer group ids."""
    return lambda: f"g-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def topic_name(kafka_bootstrap: str) -> Callable[[], str]:
    """A factory of fresh uuid topic names (not created)."""
    return lambda: f"t-{uuid.uuid4().hex[:12]}"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        parts = Path(str(item.fspath)).parts
        if "integration" in parts:
            item.add_marker(pytest.mark.integration)
        if "crash" in parts:
            item.add_marker(pytest.mark.crash)


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """A real PostgreSQL server in a temporary folder, started for this session and stopped after."""
    from tests.postgres import PostgresServer

    server = PostgresServer()
    try:
        server.start()
        yield server.url
    finally:
        server.stop()


@pytest.fixture(scope="session")
def mail_server() -> Iterator[MailServer]:
    """A real SMTP server and IMAP mailbox (GreenMail, tests/mailserver.py) for this session."""
    server = MailServer()
    try:
        yield server.start()
    finally:
        server.stop()

"""Topics created while a broker of the cluster is down (a rolling restart, a cluster still
starting) get the replication of the cluster, not of the brokers that answered at that moment.

The replication a topic is created with cannot be changed by a later start of the worker: topics
created with replication 2 on a three-broker cluster stay so, and every worker started afterwards
refuses them (``effects topics check``). So creation with fewer brokers registered than the
replication waits for them, within its timeout, and then says what is missing, creating nothing.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator

import pytest

from effect_ledger import ConfigError
from effect_ledger.streams.admin import admin_client, delete_topics, ensure_topics, list_topics
from effect_ledger.streams.config import KafkaConfig
from tests.cluster.conftest import Cluster
from tests.services import wait_for


def _brokers(cfg: KafkaConfig) -> int:
    return len(admin_client(cfg).list_topics(timeout=10).brokers)


@pytest.fixture
def one_down(cluster: Cluster) -> Iterator[KafkaConfig]:
    """Node 3 killed, and fenced: the metadata lists two brokers. Fresh prefix, nothing created."""
    cfg = KafkaConfig(bootstrap=cluster.bootstrap, prefix=f"d{uuid.uuid4().hex[:10]}.", partitions=3)
    cluster.kill(3)
    try:
        wait_for(lambda: _brokers(cfg) == 2, 30, "the controller to fence the killed broker")
        yield cfg
    finally:
        cluster.start(3)
        wait_for(lambda: _brokers(cfg) == 3, 60, "the broker to rejoin")
        delete_topics(cfg, [t for t in list_topics(cfg) if t.startswith(cfg.prefix)])


def _replication(cfg: KafkaConfig) -> dict[str, int]:
    md = admin_client(cfg).list_topics(timeout=10)
    return {
        name: min(len(p.replicas) for p in t.partitions.values())
        for name, t in md.topics.items()
        if name.startswith(cfg.prefix)
    }


def test_topics_created_while_a_broker_restarts_are_replicated_three_times(
    cluster: Cluster, one_down: KafkaConfig
) -> None:
    cfg = one_down
    back = threading.Thread(target=cluster.start, args=(3,))
    began = time.monotonic()
    back.start()  # the broker comes back while the creation waits for it
    try:
        created = ensure_topics(cfg, timeout=60)
    finally:
        back.join()
    assert set(created.values()) == {"created"}
    replication = _replication(cfg)
    assert set(replication) == {s for s in created}
    assert set(replication.values()) == {3}, replication
    assert time.monotonic() - began < 60


def test_creation_that_needs_more_brokers_than_registered_waits_then_says_why(cluster: Cluster) -> None:
    # Replication 4 on three brokers: the cluster's own answer to a creation with too few brokers
    # registered (INVALID_REPLICATION_FACTOR), as a cluster whose third broker has not registered
    # yet gives it for replication 3. (A broker killed stays registered, fenced: Kafka places
    # replicas on it, and they catch up when it is back, as the test above shows.)
    cfg = KafkaConfig(bootstrap=cluster.bootstrap, prefix=f"d{uuid.uuid4().hex[:10]}.", partitions=3, replication=4)
    began = time.monotonic()
    with pytest.raises(ConfigError) as e:
        ensure_topics(cfg, timeout=3)
    message = str(e.value)
    assert "replication 4" in message and "only 3 brokers answer" in message, message
    assert "EFFECTS_REPLICATION" in message, message
    assert time.monotonic() - began >= 3  # it waited for the brokers
    assert _replication(cfg) == {}  # nothing half-made

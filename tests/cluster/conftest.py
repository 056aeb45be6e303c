"""A replicated cluster (``scripts/cluster.sh``): three KRaft nodes on loopback, started for the
session (unless running) and stopped after. Faults are the script's: kill, start, pause, resume."""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from effect_ledger.streams.admin import delete_topics, ensure_topics, list_topics
from effect_ledger.streams.config import KafkaConfig

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = str(ROOT / "scripts" / "cluster.sh")


class Cluster:
    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap

    def run(self, *args: str) -> None:
        subprocess.run(["bash", SCRIPT, *args], check=True, capture_output=True)

    def kill(self, node: int) -> None:
        self.run("kill", str(node))

    def start(self, node: int) -> None:
        self.run("start", str(node))


# Package scope: its brokers stop once this tier is done, not at the end of the whole run.
@pytest.fixture(scope="package")
def cluster() -> Iterator[Cluster]:
    env = dict(os.environ)
    already = "down" not in subprocess.run(["bash", SCRIPT, "status"], capture_output=True, text=True).stdout
    subprocess.run(["bash", SCRIPT, "up"], check=True, env=env)
    bootstrap = subprocess.run(["bash", SCRIPT, "bootstrap"], check=True, capture_output=True, text=True).stdout.strip()
    try:
        yield Cluster(bootstrap)
    finally:
        if not already:
            subprocess.run(["bash", SCRIPT, "down"], check=False)


@pytest.fixture
def cluster_config(cluster: Cluster) -> Iterator[KafkaConfig]:
    """Fresh topics under a uuid prefix, replicated as the cluster decides (three brokers: 3)."""
    cfg = KafkaConfig(bootstrap=cluster.bootstrap, prefix=f"c{uuid.uuid4().hex[:10]}.", partitions=3)
    ensure_topics(cfg)
    yield cfg
    cluster.run("start", "1")
    cluster.run("start", "2")
    cluster.run("start", "3")
    delete_topics(cfg, [t for t in list_topics(cfg) if t.startswith(cfg.prefix)])

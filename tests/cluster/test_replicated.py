"""effect-ledger on a replicated cluster: replicated by default, checked as such, and available
while one broker of three is dead, with nothing paid twice.

The outage test runs refunds through the SDK in Kafka mode with claims (``sync`` and the
processor's lookups), as agents on several hosts do; one broker is killed (SIGKILL) in the middle
and started again later. A caller retries what the ledger refuses to guess about
(``LedgerUnavailable``, ``EffectInProgress``), as the demo agent does.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

from effect_ledger import EffectInProgress, Ledger, LedgerUnavailable, Target
from effect_ledger.streams.admin import check_topics
from effect_ledger.streams.config import KafkaConfig
from tests.cluster.conftest import ROOT, Cluster
from tests.services import Processor

CALLS = 45  # a third before the kill, a third while a broker is dead, a third after it is back
PATIENCE_S = 60.0  # how long a caller keeps asking again


def test_topics_are_replicated_three_times_by_default_and_checked(cluster_config: KafkaConfig) -> None:
    statuses = check_topics(cluster_config)
    assert [d for s in statuses for d in s.drifts] == []
    assert {s.replication for s in statuses} == {3}
    assert {s.config["min.insync.replicas"] for s in statuses} == {"2"}
    assert {s.config["unclean.leader.election.enable"] for s in statuses} == {"false"}
    # Asked for less than a replicated deployment needs: created as asked, and not called "ok".
    env = {"EFFECTS_REPLICATION": "1", "PATH": "/usr/bin:/bin"}
    one = KafkaConfig(bootstrap=cluster_config.bootstrap, prefix=cluster_config.prefix + "one.", partitions=3)
    args = ["topics", "create", "--bootstrap", one.bootstrap, "--prefix", one.prefix]
    r = subprocess.run(
        [sys.executable, "-m", "effect_ledger", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 1 and "DRIFTED: replication is 1, expected at least 3" in r.stdout, r.stdout + r.stderr
    drifts = [str(d) for s in check_topics(one) for d in s.drifts]
    assert f"{one.topics.events}: replication is 1, expected at least 3" in drifts
    assert f"{one.topics.events}: min.insync.replicas is 1, expected 2" in drifts


class Destination:
    def __init__(self) -> None:
        self.calls: dict[str, int] = {}

    async def refund(self, key: str) -> dict[str, str]:
        self.calls[key] = self.calls.get(key, 0) + 1
        return {"id": f"re_{len(self.calls)}"}


def test_one_broker_of_three_dies_and_the_agents_carry_on(
    cluster: Cluster, cluster_config: KafkaConfig, tmp_path: Path
) -> None:
    proc = Processor(cluster_config, tmp_path / "data").start().wait_ready(120)
    dest = Destination()
    took: list[tuple[int, float, bool]] = []  # (call, seconds, completed)

    async def one(ledger: Ledger, i: int) -> None:
        start = time.monotonic()
        while True:
            try:
                await ledger.execute(
                    target="payments", operation="refund.create", run_id=f"run-{i}", step="refund",
                    request={"order": i}, call=dest.refund, timeout=10,
                )  # fmt: skip
                took.append((i, time.monotonic() - start, True))
                return
            except (LedgerUnavailable, EffectInProgress):
                if time.monotonic() - start > PATIENCE_S:
                    took.append((i, time.monotonic() - start, False))
                    return
                await asyncio.sleep(0.5)

    async def go() -> None:
        async with await Ledger.open(
            tmp_path / "a.db", kafka=cluster_config, sync=True, lookup=proc.url, targets=[Target("payments")]
        ) as ledger:
            for i in range(CALLS):
                if i == CALLS // 3:
                    cluster.kill(2)
                if i == 2 * CALLS // 3:
                    cluster.start(2)
                await one(ledger, i)

    try:
        asyncio.run(go())
    finally:
        proc.kill()
    worst = max(s for _, s, _ in took)
    failed = [i for i, _, ok in took if not ok]
    print(f"{len(took)} calls, worst {worst:.1f} s, failed {failed}")
    assert failed == [] and len(took) == CALLS
    assert all(n == 1 for n in dest.calls.values()) and len(dest.calls) == CALLS  # nothing paid twice
    after = [s for i, s, _ in took if i >= 2 * CALLS // 3 + 3]
    assert max(after) < 10, after  # back on its feet by itself

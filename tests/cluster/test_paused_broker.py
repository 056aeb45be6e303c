"""A broker of three paused (SIGSTOP: a GC pause, a frozen VM) costs the callers time, not calls.

While a broker is paused, every partition's ``acks=all`` writes wait for it until the cluster
fences it (the cluster's ``broker.session.timeout.ms``) and its partitions get new leaders; the
clients notice when their requests to it time out. That takes longer than a short call's timeout:
an intent acknowledged after its call's time is gone is FAILED with nothing sent, and ``execute``
tries a new attempt (``effect_ledger.sdk._executor``: ``_Passing``) while its ``sync_timeout``
lasts, as the caller would. Here callers that do not retry run calls with a 2 s timeout through
the pause: each completes, and each refund is paid once.

The paused broker is not the processor group's coordinator: that fault (a rebalance) is the chaos
run's ``pause-coordinator``.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from confluent_kafka.admin import AdminClient

from effect_ledger import Ledger, Target
from effect_ledger.streams.acl import WORKER_APP_ID
from effect_ledger.streams.config import KafkaConfig
from tests.cluster.conftest import Cluster
from tests.cluster.test_replicated import Destination
from tests.services import Processor

CALLS = 12
PAUSED_S = 8.0  # longer than the cluster's 4 s fencing, and than each call's 2 s timeout


def _coordinator(cfg: KafkaConfig) -> int:
    """The node that coordinates the processor's consumer group."""
    admin = AdminClient(cfg.confluent())
    group = f"{cfg.prefix}{WORKER_APP_ID}"
    described = admin.describe_consumer_groups([group], request_timeout=10)[group].result(timeout=15)
    return int(described.coordinator.id)


def _healed(cfg: KafkaConfig, timeout: float = 90.0) -> None:
    """Wait until every broker, asked on its own, lists the run's topics with all three replicas in
    sync: a broker that was paused catches up with the cluster's metadata after it is resumed, and
    the next test must not ask it before (it would report fresh topics missing)."""
    end = time.monotonic() + timeout
    seen: dict[str, str] = {}
    for one in cfg.bootstrap.split(","):
        admin = AdminClient({"bootstrap.servers": one})
        while True:
            try:
                md = admin.list_topics(timeout=5)
                mine = [t for name, t in md.topics.items() if name.startswith(cfg.prefix)]
                if mine and all(len(p.isrs) == 3 for t in mine for p in t.partitions.values()):
                    break
                seen[one] = f"{len(mine)} topics, isrs {[len(p.isrs) for t in mine for p in t.partitions.values()]}"
            except Exception as e:  # noqa: BLE001 - asked again until the deadline
                seen[one] = repr(e)
            assert time.monotonic() < end, f"the cluster did not heal within {timeout:g} s: {seen}"
            time.sleep(0.5)


def test_a_paused_broker_costs_time_not_calls(cluster: Cluster, cluster_config: KafkaConfig, tmp_path: Path) -> None:
    proc = Processor(cluster_config, tmp_path / "data").start().wait_ready(120)
    dest = Destination()
    outcomes: list[tuple[int, float, str]] = []  # (call, seconds, "ok" or the error)
    paused = next(n for n in (1, 2, 3) if n != _coordinator(cluster_config))

    async def go() -> None:
        async with await Ledger.open(
            str(tmp_path / "a.db"), kafka=cluster_config, sync=True, lookup=proc.url, targets=[Target("payments")]
        ) as ledger:
            await ledger.execute(
                target="payments", operation="refund.create", key="warm", request={}, call=dest.refund, timeout=2
            )

            async def one(i: int) -> None:
                start = time.monotonic()
                try:
                    await ledger.execute(
                        target="payments", operation="refund.create", key=f"order-{i}", request={"order": i},
                        call=dest.refund, timeout=2,
                    )  # fmt: skip
                    outcomes.append((i, time.monotonic() - start, "ok"))
                except Exception as e:  # noqa: BLE001 - the assertion names it
                    outcomes.append((i, time.monotonic() - start, f"{type(e).__name__}: {e}"))

            cluster.run("pause", str(paused))
            resumed = False
            try:
                calls = []
                for i in range(CALLS):  # a call started every PAUSED_S / CALLS s while it is paused
                    calls.append(asyncio.create_task(one(i)))
                    await asyncio.sleep(PAUSED_S / CALLS)
                cluster.run("resume", str(paused))
                resumed = True
                await asyncio.gather(*calls)
            finally:
                if not resumed:
                    cluster.run("resume", str(paused))

    try:
        asyncio.run(go())
    finally:
        proc.kill()
        _healed(cluster_config)
    failed = [o for o in outcomes if o[2] != "ok"]
    print(f"broker {paused} paused {PAUSED_S:g} s; calls: " + ", ".join(f"{i}: {s:.1f} s" for i, s, _ in outcomes))
    assert failed == [], failed
    assert len(outcomes) == CALLS
    assert all(n == 1 for n in dest.calls.values()) and len(dest.calls) == CALLS + 1  # nothing paid twice

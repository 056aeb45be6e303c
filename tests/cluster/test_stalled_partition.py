"""A partition that cannot take writes holds back its own keys' events, not everyone's.

The events topic is laid out with one replica per partition, partition 0 on node 1, the others on
nodes 2 and 3; node 1 is killed, so that partition has no leader until node 1 is back, while the others
keep taking writes. An intent for a key on the dead partition waits for it (the relay never drops
or reorders a key's events); an intent for a key on a live partition, written after it, must be
on Kafka and its call made meanwhile. Once node 1 is back, everything is on the topic, each key's
events in the order they were written.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
import uuid
from collections import defaultdict
from pathlib import Path

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from effect_ledger import Ledger, LedgerUnavailable, Target
from effect_ledger.core.keys import effect_key
from effect_ledger.streams.admin import LOG_TIME, delete_topics, ensure_topics, list_topics
from effect_ledger.streams.codec import default_codec
from effect_ledger.streams.config import KafkaConfig
from effect_ledger.streams.partition import partition_for
from tests.cluster.conftest import Cluster
from tests.integration.test_relay import read_topic
from tests.services import wait_for

codec = default_codec()
LONE = 1  # the node that alone holds partition 0 of the events topic
LIVE_WITHIN_S = 20.0  # generous: the live partition's intent needs no more than a round trip


def _step_on(partition: int, taken: set[str]) -> str:
    """A step name whose effect (target payments, refund.create, run "stall") is on ``partition``."""
    for i in range(10_000):
        step = f"s{i}"
        eid = effect_key("payments", "refund.create", "stall", step)
        if step not in taken and partition_for(eid.encode(), 3) == partition:
            taken.add(step)
            return step
    raise AssertionError(f"no step found on partition {partition}")


def _create_laid_out(cfg: KafkaConfig, timeout: float = 90.0) -> None:
    """The events topic, one replica per partition, partition 0 on ``LONE``. Asked again while a
    node an earlier test restarted is still fenced (its replicas cannot be assigned yet)."""
    admin = AdminClient(cfg.confluent())
    end = time.monotonic() + timeout
    while True:
        topic = NewTopic(
            cfg.topics.events,
            num_partitions=3,
            replica_assignment=[[LONE], [2], [3]],
            config={"min.insync.replicas": "1", "unclean.leader.election.enable": "false", **LOG_TIME},
        )
        try:
            admin.create_topics([topic])[cfg.topics.events].result(timeout=30)
            return
        except KafkaException as e:
            if e.args[0].code() != KafkaError.INVALID_REPLICA_ASSIGNMENT or time.monotonic() > end:
                raise
            time.sleep(0.5)


def test_a_partition_without_a_leader_holds_back_only_its_own_keys(cluster: Cluster, tmp_path: Path) -> None:
    cfg = KafkaConfig(bootstrap=cluster.bootstrap, prefix=f"s{uuid.uuid4().hex[:10]}.", partitions=3)
    _create_laid_out(cfg)
    ensure_topics(cfg)
    db = tmp_path / "a.db"
    paid: dict[str, int] = defaultdict(int)
    taken: set[str] = set()
    warm = [_step_on(0, taken), _step_on(1, taken)]
    stalled, live = _step_on(0, taken), _step_on(1, taken)
    seen: dict[str, object] = {}

    def intent_written(step: str) -> bool:
        eid = effect_key("payments", "refund.create", "stall", step)
        with sqlite3.connect(db) as conn:
            return (
                conn.execute("SELECT 1 FROM events WHERE effect_id = ? AND kind = 'Intent'", (eid,)).fetchone()
                is not None
            )

    async def go() -> None:
        async with await Ledger.open(
            str(db), kafka=cfg, sync=True, sync_timeout=60, targets=[Target("payments")]
        ) as ledger:

            async def pay(step: str) -> dict[str, str]:
                paid[step] += 1
                return {"id": f"re_{step}"}

            async def run(step: str) -> None:
                await ledger.execute(
                    target="payments", operation="refund.create", run_id="stall", step=step,
                    request={"step": step}, call=lambda key: pay(step), timeout=10,
                )  # fmt: skip

            for step in warm:  # both partitions' leaders known and answering
                await run(step)
            cluster.kill(LONE)
            restarted = False
            try:
                waiting = asyncio.create_task(run(stalled))
                await asyncio.to_thread(
                    wait_for, lambda: intent_written(stalled), 30, "the stalled key's intent in the outbox"
                )
                try:  # on a live partition: acknowledged in milliseconds, whatever the dead one does
                    await asyncio.wait_for(run(live), LIVE_WITHIN_S)
                except (TimeoutError, LedgerUnavailable) as e:
                    seen["live"] = repr(e)
                seen["paid while the partition was dead"] = sorted(paid)
                cluster.start(LONE)
                restarted = True
                await asyncio.wait_for(waiting, 120)
            finally:
                if not restarted:
                    cluster.start(LONE)

    try:
        asyncio.run(go())
        while_dead = seen["paid while the partition was dead"]
        assert "live" not in seen, f"the live partition's intent waited for the dead one: {seen['live']}"
        assert while_dead == sorted([*warm, live]), while_dead
        assert dict(paid) == {s: 1 for s in [*warm, stalled, live]}
        # Everything reached the topic once node 1 was back (the ledger drained its outbox as it
        # closed), each key's events in the order they were written.
        with sqlite3.connect(db) as conn:
            rows = conn.execute("SELECT event_id, effect_id, sent FROM events ORDER BY seq").fetchall()
        assert all(sent == 1 for _, _, sent in rows), rows
        on_topic: dict[str, list[str]] = defaultdict(list)
        for m in read_topic(cfg):
            on_topic[m.key().decode()].append(codec.decode(m.value()).event_id)
        written: dict[str, list[str]] = defaultdict(list)
        for event_id, effect_id, _ in rows:
            written[effect_id].append(event_id)
        assert dict(on_topic) == dict(written)
    finally:
        delete_topics(cfg, [t for t in list_topics(cfg) if t.startswith(cfg.prefix)])

"""Topic administration: create the topics of effect-ledger idempotently, list them, and wait for a
broker to answer.

confluent-kafka (the ``[kafka]`` extra) is imported inside the functions that talk to the broker:
the operator CLI imports this module for ``BrokerUnavailable`` in the base install too."""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from effect_ledger.streams.config import KafkaConfig

if TYPE_CHECKING:
    from confluent_kafka.admin import AdminClient


class BrokerUnavailable(RuntimeError):
    """No broker answered a metadata request in time."""


@dataclass(frozen=True)
class TopicSpec:
    name: str
    partitions: int
    replication: int
    config: dict[str, str]


KEYS_TOPIC_CONFIG = {
    "cleanup.policy": "compact",
    "segment.ms": str(3600 * 1000),  # roll hourly: the cleaner only compacts closed segments
    "min.cleanable.dirty.ratio": "0.01",
    "delete.retention.ms": str(3600 * 1000),  # how long a tombstone (an erasure) stays readable
    "min.compaction.lag.ms": "0",
}


def topic_specs(cfg: KafkaConfig) -> list[TopicSpec]:
    """The topics of DESIGN.md with their configs. All share one partition count: the processor's
    table changelog must be co-partitioned with ``effects.events``."""
    t = cfg.topics
    keep = {"retention.ms": "-1", "cleanup.policy": "delete"}  # the event log is the audit record
    return [
        TopicSpec(t.events, cfg.partitions, cfg.replication, keep),
        # Compacted: the latest state per effect is what subscribers and the SQL sink need.
        TopicSpec(t.state, cfg.partitions, cfg.replication, {"cleanup.policy": "compact"}),
        TopicSpec(t.uncertain, cfg.partitions, cfg.replication, {"retention.ms": str(7 * 24 * 3600 * 1000)}),
        TopicSpec(t.dlq, cfg.partitions, cfg.replication, keep),
        # Decisions are facts of the event log too (kept forever), on a topic of their own so that
        # Kafka ACLs can allow only operators to write it. Co-partitioned with effects.events: the
        # processor folds both into one table.
        TopicSpec(t.decisions, cfg.partitions, cfg.replication, keep),
        # The keys of encrypted request bodies (streams/keyring_kafka.py): compacted, and cleaned
        # soon after a key is erased (its tombstone), so an erased key leaves the broker's disks
        # within hours (segment.ms + delete.retention.ms), not whenever a segment happens to fill.
        TopicSpec(t.keys, cfg.partitions, cfg.replication, KEYS_TOPIC_CONFIG),
        # Every writer schema, one record per fingerprint for ever (streams/schema_topic.py).
        TopicSpec(t.schemas, 1, cfg.replication, {"cleanup.policy": "compact"}),
    ]


def admin_client(cfg: KafkaConfig, **overrides: Any) -> AdminClient:
    from confluent_kafka.admin import AdminClient

    return AdminClient(cfg.confluent(**overrides))


def wait_ready(cfg: KafkaConfig, timeout: float = 30.0) -> int:
    """Block until a broker answers a metadata request; returns the number of brokers seen."""
    from confluent_kafka import KafkaException

    # Refused connections are expected while the broker starts: keep librdkafka quiet about them.
    admin = admin_client(cfg, log_level=0)
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            md = admin.list_topics(timeout=min(2.0, max(0.1, deadline - time.monotonic())))
            if md.brokers:
                return len(md.brokers)
        except KafkaException as e:
            last = e
        time.sleep(0.2)
    raise BrokerUnavailable(
        f"no Kafka broker answered at {cfg.bootstrap} within {timeout:.0f} s ({last or 'no brokers'})"
    )


def ensure_topics(cfg: KafkaConfig, timeout: float = 30.0) -> dict[str, str]:
    """Create every topic that does not exist yet. Returns ``{topic: 'created' | 'exists'}``.
    An existing topic with a different partition count is an error, not silently accepted: the
    processor's co-partitioning depends on it."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import NewTopic

    admin = admin_client(cfg)
    specs = topic_specs(cfg)
    md = admin.list_topics(timeout=timeout)
    result: dict[str, str] = {}
    new = []
    for s in specs:
        existing = md.topics.get(s.name)
        if existing is not None and existing.error is None:
            have = len(existing.partitions)
            if have != s.partitions:
                raise ValueError(f"topic {s.name} exists with {have} partitions, expected {s.partitions}")
            result[s.name] = "exists"
        else:
            new.append(NewTopic(s.name, num_partitions=s.partitions, replication_factor=s.replication, config=s.config))
    if new:
        futures = admin.create_topics(new, operation_timeout=timeout, request_timeout=timeout)
        for name, fut in futures.items():
            try:
                fut.result(timeout=timeout)
                result[name] = "created"
            except KafkaException as e:
                if e.args[0].code() == KafkaError.TOPIC_ALREADY_EXISTS:
                    result[name] = "exists"  # another process created it meanwhile
                else:
                    raise
    _wait_for_leaders(admin, [s.name for s in specs], timeout)
    return result


def _wait_for_leaders(admin: AdminClient, names: list[str], timeout: float) -> None:
    """Topic creation returns before every partition has a leader; producing before then fails."""
    deadline = time.monotonic() + timeout
    while True:
        md = admin.list_topics(timeout=timeout)
        ready = all(
            n in md.topics
            and md.topics[n].error is None
            and md.topics[n].partitions
            and all(p.leader >= 0 for p in md.topics[n].partitions.values())
            for n in names
        )
        if ready:
            return
        if time.monotonic() > deadline:
            raise BrokerUnavailable(f"topics {names} have no leaders after {timeout:.0f} s")
        time.sleep(0.05)


def list_topics(cfg: KafkaConfig, timeout: float = 10.0) -> dict[str, int]:
    """``{topic: partition count}`` of every topic on the cluster except Kafka's internal ones."""
    md = admin_client(cfg).list_topics(timeout=timeout)
    return {name: len(t.partitions) for name, t in sorted(md.topics.items()) if not name.startswith("__")}


def delete_topics(cfg: KafkaConfig, names: list[str], timeout: float = 30.0) -> None:
    if not names:
        return
    from confluent_kafka import KafkaError, KafkaException

    admin = admin_client(cfg)  # must outlive its futures: a destroyed client fails them all
    for fut in admin.delete_topics(names, operation_timeout=timeout).values():
        try:
            fut.result(timeout=timeout)
        except KafkaException as e:
            if e.args[0].code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
                raise


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m effect_ledger.streams.admin", description="Wait for a Kafka broker.")
    sub = p.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("wait", help="block until the broker answers a metadata request")
    w.add_argument("--bootstrap", default=None)
    w.add_argument("--timeout", type=float, default=30.0)
    args = p.parse_args(argv)
    cfg = KafkaConfig.from_env(bootstrap=args.bootstrap)
    try:
        n = wait_ready(cfg, args.timeout)
    except BrokerUnavailable as e:
        print(f"effect_ledger.streams.admin: {e}", file=sys.stderr)
        return 1
    print(f"effect_ledger.streams.admin: {cfg.bootstrap} answers ({n} broker{'s' if n != 1 else ''})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

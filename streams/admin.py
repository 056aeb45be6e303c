"""Topic administration: create the topics of effect-ledger idempotently, check that their settings
are still the ones they need (``check_topics``), list them, and wait for a broker to answer.

confluent-kafka (the ``[kafka]`` extra) is imported inside the functions that talk to the broker:
the operator CLI imports this module for ``BrokerUnavailable`` in the base install too."""

from __future__ import annotations

import argparse
import logging
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from effect_ledger.errors import BrokerRefusedLogin, BrokerUnavailable, ConfigError, NotAuthorized, TopicDrift
from effect_ledger.streams.config import DEFAULT_REPLICATION, KafkaConfig, operator_identity

if TYPE_CHECKING:
    from confluent_kafka.admin import AdminClient

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Drift:
    """One setting of one topic that differs from what effect-ledger expects."""

    topic: str
    setting: str  # "missing", "partitions", "replication" or a topic config name
    actual: str
    expected: str

    def line(self) -> str:
        """The difference, without the topic's name."""
        if self.setting == "missing":
            return "does not exist"
        return f"{self.setting} is {self.actual}, expected {self.expected}"

    def __str__(self) -> str:
        return f"{self.topic}: {self.line()}"


# The topic configs a drift check compares: what decides whether a record is kept (and for how
# long), how many replicas acknowledge it, and who stamps its time. Other configs (segment sizes,
# ...) are the operator's.
CHECKED_CONFIGS = (
    "cleanup.policy", "retention.ms", "min.insync.replicas", "message.timestamp.type", "unclean.leader.election.enable",
)  # fmt: skip
#: On every topic, faust's included: a replica that was not in sync never becomes the leader (it
#: would lose acknowledged writes), whatever the broker's default says.
SAFE_ELECTION = {"unclean.leader.election.enable": "false"}

# Every topic: the broker stamps each record as it appends it, so no writer's clock does. On the
# topics whose times decide something (events, decisions, uncertain) that is the log's time
# (streams/log_clock.py); on every topic it also means the broker never refuses a record for its
# writer's clock (a CreateTime topic refuses one stamped over log.message.timestamp.after.max.ms,
# an hour by default, ahead of the broker: a writer whose clock runs ahead could not write at all).
LOG_TIME = {"message.timestamp.type": "LogAppendTime"}


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
    if cfg.replication is None:
        raise ConfigError("the replication factor is decided by the cluster: KafkaConfig.for_cluster(brokers) first")
    if not 1 <= cfg.min_insync <= cfg.replication:
        raise ConfigError(
            f"min.insync.replicas {cfg.min_insync} must be between 1 and the replication factor {cfg.replication}"
        )
    # Every topic: an acks=all write is acknowledged only once min.insync.replicas replicas have it.
    isr = {"min.insync.replicas": str(cfg.min_insync), **SAFE_ELECTION, **LOG_TIME}
    keep = {"retention.ms": "-1", "cleanup.policy": "delete", **isr}  # the event log is the audit record
    return [
        TopicSpec(t.events, cfg.partitions, cfg.replication, keep),
        # Compacted: the latest state per effect is what subscribers and the SQL sink need.
        TopicSpec(t.state, cfg.partitions, cfg.replication, {"cleanup.policy": "compact", **isr}),
        TopicSpec(
            t.uncertain,
            cfg.partitions,
            cfg.replication,
            {"cleanup.policy": "delete", "retention.ms": str(7 * 24 * 3600 * 1000), **isr},
        ),
        TopicSpec(t.dlq, cfg.partitions, cfg.replication, keep),
        # Decisions are facts of the event log too (kept forever), on a topic of their own so that
        # Kafka ACLs can allow only operators to write it. Co-partitioned with effects.events: the
        # processor folds both into one table.
        TopicSpec(t.decisions, cfg.partitions, cfg.replication, keep),
        # The keys of encrypted request bodies (effect_ledger/sdk/kafka/keyring.py): compacted, and cleaned
        # soon after a key is erased (its tombstone), so an erased key leaves the broker's disks
        # within hours (segment.ms + delete.retention.ms), not whenever a segment happens to fill.
        TopicSpec(t.keys, cfg.partitions, cfg.replication, {**KEYS_TOPIC_CONFIG, **isr}),
        # Every writer schema, one record per fingerprint for ever (streams/schema_topic.py).
        TopicSpec(t.schemas, 1, cfg.replication, {"cleanup.policy": "compact", **isr}),
    ]


def admin_client(cfg: KafkaConfig, **overrides: Any) -> AdminClient:
    """A client for one-shot admin requests, whose outcome the caller reports (an exception, one
    line in the CLI). Unless ``cfg`` sets a log level, librdkafka logs only its errors: its info
    lines (such as "Purging 1 unserved events from background queue" when the client is
    destroyed) would otherwise precede a command's one line on stderr."""
    from confluent_kafka.admin import AdminClient

    if cfg.log_level is None:
        overrides.setdefault("log_level", 3)
    return AdminClient(cfg.confluent(**overrides))


#: How long a broker may refuse a login before that is the answer: a broker that has just started
#: may refuse SCRAM logins for a moment, until it has read the credentials from its metadata log.
LOGIN_GRACE_S = 3.0


def wait_ready(cfg: KafkaConfig, timeout: float = 30.0) -> int:
    """Block until a broker answers a metadata request; returns the number of brokers seen.
    ``BrokerRefusedLogin`` within ``LOGIN_GRACE_S`` (not after ``timeout``) when a broker keeps
    refusing the credentials or the TLS handshake; ``BrokerUnavailable`` when none answers in
    time."""
    from confluent_kafka import KafkaError, KafkaException

    refused: list[str] = []

    def on_error(err: KafkaError) -> None:
        # The broker's own verdict on who we are (a retry with the same settings will not succeed
        # once the broker is up: see LOGIN_GRACE_S).
        if err.code() in (KafkaError._AUTHENTICATION, KafkaError._SSL):
            refused.append(err.str())

    # Refused connections are expected while the broker starts: keep librdkafka quiet about them.
    admin = admin_client(cfg, log_level=0, error_cb=on_error)
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    first_refused: float | None = None
    while time.monotonic() < deadline:
        try:
            md = admin.list_topics(timeout=min(0.5, max(0.1, deadline - time.monotonic())))
            if md.brokers:
                return len(md.brokers)
        except KafkaException as e:
            last = e
        admin.poll(0)  # serves on_error
        if refused and first_refused is None:
            first_refused = time.monotonic()
        if first_refused is not None and time.monotonic() - first_refused >= min(LOGIN_GRACE_S, timeout):
            break
        time.sleep(0.1)
    admin.poll(0)
    if refused:  # refused for the grace, or the only answers were refusals: that is the answer
        raise BrokerRefusedLogin(f"Kafka at {cfg.bootstrap} refused this client: {_login_cause(refused[-1])}")
    raise BrokerUnavailable(
        f"no Kafka broker answered at {cfg.bootstrap} within {timeout:.0f} s ({last or 'no brokers'})"
    )


def _login_cause(reported: str) -> str:
    """librdkafka's report, without the connection's name, with what to check."""
    text = reported.split(": ", 1)[1] if reported.startswith(("sasl_", "ssl://", "plaintext://")) else reported
    if "SASL authentication" in text:
        return f"{text}: check KAFKA_SASL_USERNAME, KAFKA_SASL_PASSWORD and KAFKA_SASL_MECHANISM"
    if "certificate" in text or "SSL" in text:
        return f"{text}: check KAFKA_SSL_CAFILE and that the broker's certificate names the host in --bootstrap"
    return text


def refused_by_acls(err: object) -> bool:
    """Whether ``err`` (a client's ``KafkaError``) is Kafka's ACLs refusing this principal: asking
    again cannot help until an administrator changes them."""
    from confluent_kafka import KafkaError

    return isinstance(err, KafkaError) and err.code() in (
        KafkaError.TOPIC_AUTHORIZATION_FAILED, KafkaError.GROUP_AUTHORIZATION_FAILED,
        KafkaError.CLUSTER_AUTHORIZATION_FAILED, KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
    )  # fmt: skip


def ensure_topics(cfg: KafkaConfig, timeout: float = 30.0, *, check_partitions: bool = True) -> dict[str, str]:
    """Create every topic that does not exist yet. Returns ``{topic: 'created' | 'exists'}``.
    An existing topic with a different partition count is an error (``ValueError``), not silently
    accepted: the processor's co-partitioning depends on it (``check_partitions=False``: the caller
    reports it with ``check_topics``). "exists" says nothing about the other settings: see
    ``check_topics``."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import NewTopic

    admin = admin_client(cfg)
    md = admin.list_topics(timeout=timeout)
    deadline = time.monotonic() + timeout
    cfg = _decided(cfg, admin, md, timeout)
    specs = topic_specs(cfg)
    result: dict[str, str] = {}
    new = []
    for s in specs:
        existing = md.topics.get(s.name)
        if existing is not None and existing.error is None:
            have = len(existing.partitions)
            if have != s.partitions and check_partitions:
                raise ValueError(f"topic {s.name} exists with {have} partitions, expected {s.partitions}")
            result[s.name] = "exists"
        else:
            new.append(NewTopic(s.name, num_partitions=s.partitions, replication_factor=s.replication, config=s.config))
    waiting = False
    while new:
        futures = admin.create_topics(new, operation_timeout=timeout, request_timeout=timeout)
        short = set()  # refused for want of brokers: fewer registered than the replication
        for name, fut in futures.items():
            try:
                fut.result(timeout=timeout)
                result[name] = "created"
            except KafkaException as e:
                if e.args[0].code() == KafkaError.TOPIC_ALREADY_EXISTS:
                    result[name] = "exists"  # another process created it meanwhile
                elif e.args[0].code() == KafkaError.INVALID_REPLICATION_FACTOR:
                    short.add(name)
                elif refused_by_acls(e.args[0]):
                    who = operator_identity(cfg)
                    raise NotAuthorized("creating the topics", who, [f"Create on topic {name}"]) from e
                else:
                    raise
        new = [t for t in new if t.topic in short]
        if not new:
            break
        # A broker restarting, or a cluster still starting: created now, the topics would keep the
        # lower replication for good (KafkaConfig.for_cluster). Wait for it, then say what is missing.
        answering = len(admin.list_topics(timeout=timeout).brokers)
        if time.monotonic() >= deadline:
            raise ConfigError(
                f"cannot create {len(new)} topic(s) under {cfg.prefix!r} with replication {cfg.replication}: only "
                f"{answering} brokers answer (one down or starting?) after {timeout:g} s; start it, or set "
                "EFFECTS_REPLICATION to the replication this cluster can give"
            )
        if not waiting:
            waiting = True
            log.warning(
                "creating the topics with replication %d: %d brokers answer; waiting up to %.0f s for the others",
                cfg.replication, answering, max(0.0, deadline - time.monotonic()),
            )  # fmt: skip
        time.sleep(0.5)
    _wait_for_leaders(admin, [s.name for s in specs], timeout)
    return result


def _declared_replication(admin: AdminClient, md: Any, timeout: float) -> int | None:
    """The ``default.replication.factor`` the cluster declares, asked only when one broker answers:
    it tells a development broker (1, Kafka's default) from a cluster whose other brokers are down
    or starting (``KafkaConfig.for_cluster``). None when it cannot be read (the principal may not
    describe the cluster's configs)."""
    from confluent_kafka.admin import ConfigResource, ResourceType

    if len(md.brokers) != 1:
        return None
    res = ConfigResource(ResourceType.BROKER, str(next(iter(md.brokers))))
    try:
        entries = admin.describe_configs([res], request_timeout=timeout)[res].result(timeout=timeout)
        return int(entries["default.replication.factor"].value)
    except Exception:  # refused, or not said: the number of brokers alone decides
        return None


def for_this_cluster(cfg: KafkaConfig, timeout: float = 30.0) -> KafkaConfig:
    """``cfg`` with its replication decided by the cluster (``KafkaConfig.for_cluster``), once a
    broker answers (``wait_ready``'s errors)."""
    wait_ready(cfg, timeout)
    if cfg.replication is not None:
        return cfg
    admin = admin_client(cfg)
    return _decided(cfg, admin, admin.list_topics(timeout=timeout), timeout)


def _decided(cfg: KafkaConfig, admin: AdminClient, md: Any, timeout: float) -> KafkaConfig:
    """``cfg`` with the replication the cluster decides, from the metadata ``md`` (the broker's
    declared replication asked only when it matters: none set, one broker answering)."""
    if cfg.replication is not None:
        return cfg
    return cfg.for_cluster(len(md.brokers), _declared_replication(admin, md, timeout))


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


@dataclass(frozen=True)
class TopicStatus:
    """One topic as the cluster has it, beside what effect-ledger expects of it."""

    spec: TopicSpec
    exists: bool
    partitions: int
    replication: int
    config: dict[str, str]  # the CHECKED_CONFIGS the broker reports
    drifts: tuple[Drift, ...]


def check_topics(cfg: KafkaConfig, timeout: float = 30.0, settle_s: float | None = None) -> list[TopicStatus]:
    """Every topic of ``topic_specs`` compared with the cluster: partitions (exactly: the processor's
    co-partitioning depends on them), replication (at least), and cleanup policy, retention and
    ``min.insync.replicas`` (exactly, where the spec sets them; a config the broker leaves at its
    default is compared with that default). Reads only.

    A topic the metadata does not show is asked about again for up to ``settle_s`` (default
    ``_METADATA_SETTLE_S``) before it is called missing: on a cluster, the broker answering may not
    have learnt yet of a topic another broker has just created (``ensure_topics`` saw its leaders
    through another). Its configs are asked about the same way (``_describe_configs``).
    """
    admin = admin_client(cfg)
    md = admin.list_topics(timeout=timeout)
    settle = time.monotonic() + min(timeout, _METADATA_SETTLE_S if settle_s is None else settle_s)
    expected = [s.name for s in topic_specs(cfg.for_cluster(len(md.brokers)))]
    while time.monotonic() < settle and any(n not in md.topics or md.topics[n].error is not None for n in expected):
        time.sleep(0.2)
        md = admin.list_topics(timeout=timeout)
    brokers = len(md.brokers)
    declared = _declared_replication(admin, md, timeout)
    cfg = cfg.for_cluster(brokers, declared)
    # What a replicated deployment needs, whatever was configured: on three brokers or more (or a
    # cluster that declares a replication of 3), replication 3 and min.insync.replicas 2 (fewer
    # brokers: all of them, and at most 2).
    floor = min(DEFAULT_REPLICATION, max(brokers, declared or 1))
    specs = topic_specs(cfg)
    named = {s.name for s in specs}
    # The other topics under the prefix (the processor's changelog and assignor topics, whatever
    # its app id): their partitions are faust's business, their durability is checked the same way.
    for name, meta in sorted(md.topics.items()):
        if cfg.prefix and name.startswith(cfg.prefix) and name not in named and meta.error is None:
            durable = {"min.insync.replicas": str(min(2, floor)), **SAFE_ELECTION}
            specs.append(TopicSpec(name, len(meta.partitions), max(1, floor), durable))
    present = {s.name: md.topics[s.name] for s in specs if s.name in md.topics and md.topics[s.name].error is None}
    configs = _describe_configs(admin, list(present), timeout, settle)
    out = []
    for s in specs:
        t = present.get(s.name) if s.name in configs else None
        if t is None:
            out.append(TopicStatus(s, False, 0, 0, {}, (Drift(s.name, "missing", "-", "-"),)))
            continue
        partitions = len(t.partitions)
        replication = min((len(p.replicas) for p in t.partitions.values()), default=0)
        have = configs.get(s.name, {})
        drifts = []
        if partitions != s.partitions:
            drifts.append(Drift(s.name, "partitions", str(partitions), str(s.partitions)))
        wanted = max(s.replication, floor)
        if replication < wanted:
            drifts.append(Drift(s.name, "replication", str(replication), f"at least {wanted}"))
        for k in CHECKED_CONFIGS:
            if k in s.config and have.get(k) != s.config[k]:
                drifts.append(Drift(s.name, k, have.get(k, "unknown"), s.config[k]))
        out.append(TopicStatus(s, True, partitions, replication, have, tuple(drifts)))
    return out


def _describe_configs(admin: AdminClient, names: list[str], timeout: float, settle: float) -> dict[str, dict[str, str]]:
    """The CHECKED_CONFIGS of each topic in ``names``, by name. Kafka sends a DescribeConfigs to any
    broker, and one whose metadata trails the broker that listed the topic answers that it does
    not know it: such a topic is asked about again until ``settle`` (a monotonic deadline, at least
    a second from now), then left out (the caller calls it missing: it may have been deleted
    meanwhile)."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import ConfigResource, ResourceType

    settle = max(settle, time.monotonic() + 1.0)
    configs: dict[str, dict[str, str]] = {}
    pending = list(names)
    while pending:
        resources = [ConfigResource(ResourceType.TOPIC, name) for name in pending]
        unknown = []
        for res, fut in admin.describe_configs(resources, request_timeout=timeout).items():
            try:
                entries = fut.result(timeout=timeout)
            except KafkaException as e:
                if e.args[0].code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
                    raise
                unknown.append(res.name)
                continue
            configs[res.name] = {k: str(entries[k].value) for k in CHECKED_CONFIGS if k in entries}
        if not unknown or time.monotonic() >= settle:
            break
        pending = unknown
        time.sleep(0.2)
    return configs


def require_topics(cfg: KafkaConfig, timeout: float = 30.0) -> None:
    """What the processor refuses to start on (``TopicDrift``): a drifted ``effects.state`` (not
    compacted, a retention that deletes latest states, too few in-sync replicas) or a topic whose
    partition count differs (co-partitioning).

    A topic reported missing is asked about again for a few seconds: on a cluster, the broker this
    client asks may not have learnt yet of a topic another broker just created (``ensure_topics``
    saw its leaders through another connection)."""
    settle = time.monotonic() + min(timeout, _METADATA_SETTLE_S)
    while True:
        drifts = [
            d
            for st in check_topics(cfg, timeout)
            for d in st.drifts
            if st.spec.name == cfg.topics.state or d.setting in ("missing", "partitions")
        ]
        if not any(d.setting == "missing" for d in drifts) or time.monotonic() >= settle:
            break
        time.sleep(0.2)
    if drifts:
        raise TopicDrift(drifts)


#: How long ``check_topics`` and ``require_topics`` wait for topics they were told are missing to
#: appear (a broker's metadata can trail another's by a moment after a creation).
_METADATA_SETTLE_S = 10.0


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

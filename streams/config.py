"""Kafka connection settings shared by every client of effect-ledger.

Defaults match ``scripts/kafka.sh`` and ``docker-compose.yml`` (a unit test checks that they agree).
Each setting can come from the environment:

| variable                 | meaning                                              | default          |
|--------------------------|------------------------------------------------------|------------------|
| ``KAFKA_BOOTSTRAP``      | bootstrap servers                                    | 127.0.0.1:9092   |
| ``EFFECTS_TOPIC_PREFIX`` | prefix of every topic name                           | (empty)          |
| ``EFFECTS_PARTITIONS``   | partitions of the topics this project creates        | 6                |
| ``EFFECTS_REPLICATION``  | their replication factor                             | 3 (fewer brokers: all) |
| ``EFFECTS_SCHEMA_REGISTRY`` | a Confluent-compatible Schema Registry URL: frame records the registry way | none |
| ``EFFECTS_MIN_INSYNC_REPLICAS`` | their ``min.insync.replicas``                 | min(2, replication) |
| ``KAFKA_SECURITY_PROTOCOL``, ``KAFKA_SASL_MECHANISM``, ``KAFKA_SASL_USERNAME``,
  ``KAFKA_SASL_PASSWORD``, ``KAFKA_SSL_CAFILE`` | security, passed to every Kafka client | none |
"""

from __future__ import annotations

import getpass
import hmac
import ipaddress
import os
import socket
from dataclasses import dataclass, field, replace
from typing import Any

DEFAULT_PORT = 9092
DEFAULT_BOOTSTRAP = f"127.0.0.1:{DEFAULT_PORT}"
#: The replication factor of a deployment with at least this many brokers (min.insync.replicas 2).
DEFAULT_REPLICATION = 3


@dataclass(frozen=True)
class Topics:
    """The topics of effect-ledger, under one prefix."""

    prefix: str = ""

    @property
    def events(self) -> str:
        """The event log of every effect (intents, outcomes, receipts, resolutions, timeouts), keyed by effect key."""
        return f"{self.prefix}effects.events"

    @property
    def state(self) -> str:
        """Each effect's current state as the processor folds it (compacted: the latest per key)."""
        return f"{self.prefix}effects.state"

    @property
    def uncertain(self) -> str:
        """Effects newly UNCERTAIN, the work queue of the reconciliation consumers."""
        return f"{self.prefix}effects.uncertain"

    @property
    def dlq(self) -> str:
        """Dead letters: records that could not be decoded or applied, with the reason."""
        return f"{self.prefix}effects.dlq"

    @property
    def decisions(self) -> str:
        """People's decisions, apart from ``events`` so that Kafka ACLs can keep them to operators."""
        return f"{self.prefix}effects.decisions"

    @property
    def keys(self) -> str:
        """Erasable keys of encrypted request bodies (compacted; a tombstone erases a key)."""
        return f"{self.prefix}effects.keys"

    @property
    def schemas(self) -> str:
        """Every writer schema, keyed by fingerprint (compacted): how readers learn newer schemas."""
        return f"{self.prefix}effects.schemas"

    def all(self) -> tuple[str, ...]:
        """Every topic name, prefixed, in a fixed order."""
        return (self.events, self.state, self.uncertain, self.dlq, self.decisions, self.keys, self.schemas)


@dataclass(frozen=True)
class KafkaConfig:
    """Where the Kafka cluster is and how to reach it; ``from_env`` reads the variables above."""

    bootstrap: str = DEFAULT_BOOTSTRAP
    prefix: str = ""
    partitions: int = 6
    # None: decided by the cluster, min(3, its brokers) (``for_cluster``): a replicated deployment is
    # the default as soon as there are brokers to replicate to.
    replication: int | None = None
    # min.insync.replicas of the topics this project creates; None: min(2, replication), so that an
    # acks=all write is on two replicas before it is acknowledged wherever there are two.
    min_insync_replicas: int | None = None
    security_protocol: str | None = None
    sasl_mechanism: str | None = None
    sasl_username: str | None = None
    sasl_password: str | None = field(default=None, repr=False)
    ssl_cafile: str | None = None
    # librdkafka's log level (0-7) for every client made from this config; None: librdkafka's own
    # default. The operator commands set 0: a dead broker is their one-line error, not a log flood.
    log_level: int | None = None
    # A Confluent-compatible Schema Registry: writers register their schemas there and frame records
    # the registry way (magic byte 0 + 4-byte schema id); readers accept both framings. None: Avro
    # single-object encoding, no registry (the default).
    schema_registry: str | None = None

    @property
    def topics(self) -> Topics:
        """The topic names under this config's ``prefix``."""
        return Topics(self.prefix)

    @property
    def min_insync(self) -> int:
        """The ``min.insync.replicas`` the topics are created with and checked against (of the
        replication ``for_cluster`` decided, when none was set)."""
        if self.min_insync_replicas is not None:
            return self.min_insync_replicas
        return min(2, self.replication if self.replication is not None else DEFAULT_REPLICATION)

    def for_cluster(self, brokers: int, declared: int | None = None) -> KafkaConfig:
        """This config with the replication decided for the cluster when none was set:
        ``DEFAULT_REPLICATION`` (3), unless it is a development broker: one broker answers and the
        cluster declares no replication above 1 (``declared``: its ``default.replication.factor``,
        None when unknown).

        ``brokers`` is how many brokers answer now, not how many the cluster has: two of three
        answer during a rolling restart, or while a cluster starts. A topic's replication cannot be
        raised by a later start, so two brokers never mean "replicate twice": a cluster that really
        has two sets ``EFFECTS_REPLICATION``, and creation on fewer brokers than the replication
        waits for them (``streams.admin.ensure_topics``)."""
        if self.replication is not None:
            return self
        development = brokers <= 1 and (declared is None or declared <= 1)
        return replace(self, replication=1 if development else DEFAULT_REPLICATION)

    @classmethod
    def from_env(cls, **overrides: Any) -> KafkaConfig:
        """A config from the environment variables above; an override that is not None wins.

        Raises ValueError when ``EFFECTS_PARTITIONS`` or ``EFFECTS_REPLICATION`` is not an integer.
        """
        env = os.environ
        values: dict[str, Any] = {
            "bootstrap": env.get("KAFKA_BOOTSTRAP", DEFAULT_BOOTSTRAP),
            "prefix": env.get("EFFECTS_TOPIC_PREFIX", ""),
            "partitions": int(env.get("EFFECTS_PARTITIONS", "6")),
            "replication": int(env["EFFECTS_REPLICATION"]) if env.get("EFFECTS_REPLICATION") else None,
            "min_insync_replicas": int(env["EFFECTS_MIN_INSYNC_REPLICAS"])
            if env.get("EFFECTS_MIN_INSYNC_REPLICAS")
            else None,
            "security_protocol": env.get("KAFKA_SECURITY_PROTOCOL"),
            "sasl_mechanism": env.get("KAFKA_SASL_MECHANISM"),
            "sasl_username": env.get("KAFKA_SASL_USERNAME"),
            "sasl_password": env.get("KAFKA_SASL_PASSWORD"),
            "ssl_cafile": env.get("KAFKA_SSL_CAFILE"),
            "schema_registry": env.get("EFFECTS_SCHEMA_REGISTRY") or None,
        }
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)

    def confluent(self, **extra: Any) -> dict[str, Any]:
        """Settings for a confluent-kafka client (librdkafka names)."""
        conf: dict[str, Any] = {"bootstrap.servers": self.bootstrap}
        if self.security_protocol:
            conf["security.protocol"] = self.security_protocol
        if self.sasl_mechanism:
            conf["sasl.mechanism"] = self.sasl_mechanism
        if self.sasl_username is not None:
            conf["sasl.username"] = self.sasl_username
        if self.sasl_password is not None:
            conf["sasl.password"] = self.sasl_password
        if self.ssl_cafile:
            conf["ssl.ca.location"] = self.ssl_cafile
        if self.log_level is not None:
            conf["log_level"] = self.log_level
        if _client_logger is not None:
            conf["logger"] = _client_logger
        conf.update(extra)
        return conf


# Where librdkafka's own log lines go: its stderr (None), or a Python logger once a service has set
# up its logging (effect_ledger.metrics.logs), so they take the service's format and filters.
_client_logger: Any = None


def send_client_logs_to(logger: Any) -> None:
    """Route the log lines of every confluent-kafka client made from now on to ``logger``."""
    global _client_logger
    _client_logger = logger


def operator_identity(cfg: KafkaConfig | None = None) -> str:
    """Who is writing, as this process knows itself: the Kafka principal ``User:NAME`` when SASL is
    configured (the name the broker authenticated, and the one its ACLs check), else
    ``os:USER@HOST``. Recorded in every decision beside the name the person gives (``--by``)."""
    if cfg is not None and (cfg.security_protocol or "").upper().startswith("SASL") and cfg.sasl_username:
        return f"User:{cfg.sasl_username}"
    try:
        user = getpass.getuser()
    except (OSError, KeyError):  # no login name and no passwd entry (some containers)
        user = f"uid{os.getuid()}"
    return f"os:{user}@{socket.gethostname()}"


def same_secret(given: str, expected: str) -> bool:
    """Whether a credential a request carries is ``expected``, in constant time. Shared by every
    server that checks one (the console, the worker's lookups, the MCP proxy, ``/metrics``).
    aiohttp hands a header's bytes that are not UTF-8 over as lone surrogates (``\xff`` is
    ``\udcff``), which a strict ``encode()`` refuses: ``surrogatepass`` turns any str into bytes,
    and such a header then simply does not match (a 401, not a 500)."""
    return hmac.compare_digest(given.encode("utf-8", "surrogatepass"), expected.encode("utf-8", "surrogatepass"))


def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1 or "localhost"; anything else (0.0.0.0, ::, an interface address, another
    name) reaches beyond this machine. Shared by every server that refuses to listen beyond
    loopback without credentials (the worker's lookup view, the console)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False

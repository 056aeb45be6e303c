"""The ACL table of ``streams.acl`` against a real cluster: a part's check of its own rights when
it starts (``require``), and the admin's ``apply`` and ``compare`` (``effects acl``, ``effects
topics check --role``).

A client learns its own rights on a topic without any right to read the cluster's ACLs: a
metadata request asking for the topic's *authorized operations* (KIP-430) answers, for the
principal that asks, which operations the authorizer allows. A broker without an authorizer
answers "all of them"; a topic the principal may not even describe is refused, which means it has
none of the rights asked about.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from effect_ledger.errors import NotAuthorized
from effect_ledger.streams.acl import NEEDS, Grant, Right
from effect_ledger.streams.admin import admin_client
from effect_ledger.streams.config import KafkaConfig, operator_identity

_OPS = {
    "Read": "READ", "Write": "WRITE", "Describe": "DESCRIBE", "Create": "CREATE", "Delete": "DELETE",
    "DescribeConfigs": "DESCRIBE_CONFIGS", "AlterConfigs": "ALTER_CONFIGS", "Alter": "ALTER",
}  # fmt: skip
_NAMES = {v: k for k, v in _OPS.items()}  # AclOperation's names -> kafka-acls.sh's


def own_rights(cfg: KafkaConfig, topics: Iterable[str], timeout: float = 10.0) -> dict[str, frozenset[str]]:
    """What this client's principal may do on each topic (kafka-acls.sh names: ``Write``...): an
    empty set for a topic it may not describe; a topic that does not exist is left out (the topics
    check names it)."""
    from confluent_kafka import KafkaError, KafkaException, TopicCollection

    names = sorted(set(topics))
    admin = admin_client(cfg)
    out: dict[str, frozenset[str]] = {}
    futures = admin.describe_topics(TopicCollection(names), request_timeout=timeout, include_authorized_operations=True)
    for name, fut in futures.items():
        try:
            described = fut.result(timeout=timeout + 1)
        except KafkaException as e:
            err = e.args[0]
            if isinstance(err, KafkaError) and err.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                continue  # it may be described, and does not exist: not a question of rights
            if isinstance(err, KafkaError) and err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED:
                out[name] = frozenset()  # not even Describe (whether it exists is not told)
                continue
            raise
        ops = described.authorized_operations
        if ops is None:  # a broker that does not say (before KIP-430): unknown, not "nothing"
            out[name] = frozenset(_OPS)
            continue
        out[name] = frozenset(_NAMES[o.name] for o in ops if o.name in _NAMES)
    return out


def missing_rights(cfg: KafkaConfig, need: str, timeout: float = 10.0) -> list[str]:
    """The rights of ``NEEDS[need]`` this client lacks, as ``Write on topic NAME`` lines."""
    wanted = [(getattr(cfg.topics, attr), op) for attr, op in NEEDS[need]]
    have = own_rights(cfg, (t for t, _ in wanted), timeout)
    return [f"{op} on topic {t}" for t, op in wanted if t in have and op not in have[t]]


def not_now(err: object) -> bool:
    """Whether a Kafka error says "not now" rather than "no": the client's own retriable errors, a
    request timed out, and a broker handle destroyed (the cluster dropped a broker from its metadata
    while it starts or restarts: seen as ``effects reconcile`` exiting at its start, in a chaos run)."""
    from confluent_kafka import KafkaError

    if not isinstance(err, KafkaError):
        return False
    return bool(err.retriable()) or err.code() in (KafkaError._TIMED_OUT, KafkaError._DESTROY_BROKER)


def require(cfg: KafkaConfig, need: str, what: str, timeout: float = 10.0, patience: float = 60.0) -> None:
    """``NotAuthorized`` naming every right of ``NEEDS[need]`` this client lacks (``what``: the
    part or action that needs them). A cluster that answers "not now" (a broker starting, a leader
    being elected, a request timed out) is asked again for up to ``patience`` seconds: a service
    started beside a cluster that is still coming up waits for it instead of exiting."""
    from confluent_kafka import KafkaException

    end = time.monotonic() + patience
    while True:
        try:
            missing = missing_rights(cfg, need, timeout)
            break
        except KafkaException as e:
            if not not_now(e.args[0] if e.args else None) or time.monotonic() >= end:
                raise
            time.sleep(1.0)
    if missing:
        raise NotAuthorized(what, operator_identity(cfg), missing)


def _binding(principal: str, r: Right) -> Any:
    from confluent_kafka.admin import AclBinding, AclOperation, AclPermissionType, ResourcePatternType, ResourceType

    resource = ResourceType.TOPIC if r.resource == "topic" else ResourceType.GROUP
    pattern = ResourcePatternType.PREFIXED if r.pattern == "prefixed" else ResourcePatternType.LITERAL
    return AclBinding(
        resource, r.name, pattern, principal, "*", getattr(AclOperation, _OPS[r.operation]), AclPermissionType.ALLOW
    )


def apply(cfg: KafkaConfig, grants: Sequence[Grant], timeout: float = 30.0) -> int:
    """Create every binding of ``grants`` (creating one that exists changes nothing); the count.
    ``NotAuthorized`` when this client may not create ACLs."""
    from confluent_kafka import KafkaError, KafkaException

    bindings = [_binding(g.principal, r) for g in grants for r in g.rights]
    if not bindings:
        return 0
    admin = admin_client(cfg)  # held until every answer is in: a destroyed client fails its futures
    for fut in admin.create_acls(bindings, request_timeout=timeout).values():
        try:
            fut.result(timeout=timeout + 1)
        except KafkaException as e:
            err = e.args[0]
            if isinstance(err, KafkaError) and err.code() == KafkaError.CLUSTER_AUTHORIZATION_FAILED:
                raise NotAuthorized("effects acl --apply", operator_identity(cfg), ["Alter on the cluster"]) from e
            raise
    return len(bindings)


@dataclass(frozen=True)
class Comparison:
    """A principal's ALLOW bindings on the prefix's resources against its role's rights."""

    principal: str
    role: str
    missing: tuple[Right, ...]
    excess: tuple[Right, ...]


def compare(cfg: KafkaConfig, grants: Sequence[Grant], timeout: float = 30.0) -> list[Comparison]:
    """For each grant: the rights its role needs that the cluster does not give its principal, and
    the ALLOW bindings the principal has on this prefix's topics and groups that the role does not
    need. ``NotAuthorized`` when this client may not describe the cluster's ACLs."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import (
        AclBindingFilter,
        AclOperation,
        AclPermissionType,
        ResourcePatternType,
        ResourceType,
    )

    kinds = {ResourceType.TOPIC: "topic", ResourceType.GROUP: "group"}
    out: list[Comparison] = []
    admin = admin_client(cfg)
    for g in grants:
        # None matches any resource name and any host (the stubs say str; the library takes None).
        flt = AclBindingFilter(
            ResourceType.ANY, None, ResourcePatternType.ANY, g.principal, None,  # type: ignore[arg-type]
            AclOperation.ANY, AclPermissionType.ALLOW,
        )  # fmt: skip
        try:
            found = admin.describe_acls(flt, request_timeout=timeout).result(timeout=timeout + 1)
        except KafkaException as e:
            err = e.args[0]
            if isinstance(err, KafkaError) and err.code() == KafkaError.CLUSTER_AUTHORIZATION_FAILED:
                who = operator_identity(cfg)
                raise NotAuthorized("effects topics check --role", who, ["Describe on the cluster"]) from e
            raise
        have: set[Right] = set()
        for b in found:
            kind = kinds.get(b.restype)
            op = _NAMES.get(b.operation.name)
            # Only what concerns this prefix: another deployment's rights are not this one's excess.
            if kind is None or op is None or not b.name.startswith(cfg.prefix):
                continue
            pattern = "prefixed" if b.resource_pattern_type == ResourcePatternType.PREFIXED else "literal"
            have.add(Right(kind, b.name, pattern, op))  # type: ignore[arg-type]
        want = set(g.rights)
        out.append(Comparison(g.principal, g.role, tuple(sorted(want - have)), tuple(sorted(have - want))))
    return out


__all__ = ["own_rights", "missing_rights", "require", "apply", "compare", "Comparison"]

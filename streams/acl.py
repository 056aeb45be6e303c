"""Least privilege: the roles effect-ledger's parts play on Kafka, and the rights each needs.

One table, made from the same names the topics come from (``Topics``, the processor's app id and
the client groups below), so it cannot drift from what the code does: ``effects acl`` prints it as
``kafka-acls.sh`` lines or JSON, or applies it with the admin client; ``effects topics check
--role`` compares a cluster's ACLs with it (missing and excess rights); and each part checks its
own rights on the topics when it starts (``missing_rights``), so that a right it lacks is one
typed error naming it (``NotAuthorized``), before anything is written or called.

The roles:

==========  =====================================================================================
agent       the SDK and ``effects relay``: writes ``events`` (intents, outcomes, receipts), its
            dead letters, the erasable body keys and its schemas; reads the offsets of
            ``decisions`` (for lookups), never its records, and never writes it.
worker      ``effects worker``: reads ``events`` and ``decisions``, writes the timeouts to
            ``events`` and ``state``, ``uncertain``, ``dlq``; owns its app's internal topics
            (changelog, assignor) and consumer group.
reconciler  ``effects reconcile``: reads ``uncertain`` (its group), writes resolutions to
            ``events``.
sink        ``effects sink``: reads ``state``.
operator    ``effects resolve``, the console's decisions, ``trace``/``audit``/``tail``: reads
            every topic but the keys, writes ``decisions`` (and nothing else).
subscriber  a customer's consumer of the intermediate states: reads ``state`` and ``uncertain``.
auditor     replays every topic but the keys (``effects audit``, ``trace``): reads, writes nothing.
admin       creates, checks, retires and deletes the topics (``effects topics``, ``retire``).
==========  =====================================================================================

Consumer groups: effect-ledger's own readers use group ids under the topic prefix
(``CLIENT_GROUPS``); most of them never join a group (``assign()``, no commits), and the broker
asks for a group right only of those that do (the worker, the reconcilers, ``tail``).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Literal

from effect_ledger.errors import ConfigError
from effect_ledger.streams.config import Topics

#: The groups of the processor and the reconcilers (after the prefix): both join their group.
WORKER_APP_ID = "effect-ledger"
RECONCILER_GROUP = "effect-ledger-reconcilers"
#: The group id (after the prefix) of each of effect-ledger's own Kafka readers; ``-`` at the end:
#: followed by a random part (a prefixed ACL). librdkafka looks a consumer's group coordinator up
#: even when it only assigns partitions and never commits, and that needs a right on the group.
CLIENT_GROUPS = {
    "tool": "effects-tool-",  # trace, audit, resolve's reading, the console's sources
    "follow": "effects-follow-",  # effects tail
    "sink": "effects-sink-",
    "keys": "effects-keys-",  # the SDK's erasable body keys
    "schemas": "effects-schemas-reader",  # every reader that meets a newer schema
    "watermarks": "effect-ledger-watermarks",  # the SDK's claims
    "subscribers": "subscribers-",  # a customer's own consumer groups (subscriber role)
}


def client_group(prefix: str, reader: str) -> str:
    """The group id of one of effect-ledger's own readers (a key of ``CLIENT_GROUPS``) under the
    topic prefix; a name ending in ``-`` gets a random part, so each reader has its own group."""
    name = CLIENT_GROUPS[reader]
    return f"{prefix}{name}{uuid.uuid4().hex}" if name.endswith("-") else f"{prefix}{name}"


Resource = Literal["topic", "group"]
Pattern = Literal["literal", "prefixed"]
ROLES = ("agent", "worker", "reconciler", "sink", "operator", "subscriber", "auditor", "admin")

# Kafka's operation names, as kafka-acls.sh spells them.
READ, WRITE, DESCRIBE, CREATE, DELETE = "Read", "Write", "Describe", "Create", "Delete"
DESCRIBE_CONFIGS, ALTER_CONFIGS, ALTER = "DescribeConfigs", "AlterConfigs", "Alter"


@dataclass(frozen=True, order=True)
class Right:
    """One ALLOW binding of a principal: ``operation`` on a resource named ``name`` (or every name
    starting with it, ``prefixed``)."""

    resource: Resource
    name: str
    pattern: Pattern
    operation: str


def rights(
    role: str, topics: Topics, *, app_id: str = WORKER_APP_ID, reconciler_group: str = RECONCILER_GROUP
) -> tuple[Right, ...]:
    """The least rights of ``role`` on the topics and groups of ``topics.prefix``; ``app_id`` and
    ``reconciler_group``: the worker's ``--app-id`` and the reconcilers' ``--group``."""
    p = topics.prefix

    def topic(name: str, *ops: str) -> list[Right]:
        return [Right("topic", name, "literal", op) for op in ops]

    def group(*names: str) -> list[Right]:
        return [Right("group", p + n, "prefixed" if n.endswith("-") else "literal", READ) for n in names]

    g = CLIENT_GROUPS
    schemas = topic(topics.schemas, READ, WRITE, DESCRIBE)  # every writer publishes its schemas
    reads_schemas = topic(topics.schemas, READ, DESCRIBE)
    out: list[Right]
    if role == "agent":
        out = [
            *topic(topics.events, WRITE, DESCRIBE, DESCRIBE_CONFIGS),  # the relay fits its batches to the topic
            # Offsets only: a lookup names the decisions' high watermark the processor must have folded.
            *topic(topics.decisions, DESCRIBE),
            *topic(topics.dlq, WRITE, DESCRIBE),
            *topic(topics.keys, READ, WRITE, DESCRIBE),
            *schemas,
            *group(g["schemas"], g["watermarks"], g["keys"]),
        ]
    elif role == "worker":
        internal = p + app_id + "-"  # faust's changelog and assignor topics
        out = [
            *topic(topics.events, READ, WRITE, DESCRIBE),
            *topic(topics.decisions, READ, DESCRIBE),
            *topic(topics.state, WRITE, DESCRIBE),
            *topic(topics.uncertain, WRITE, DESCRIBE),
            *topic(topics.dlq, WRITE, DESCRIBE),
            *topic(topics.keys, DESCRIBE),
            *schemas,
            # It refuses to start on topics whose settings drifted (``require_topics``).
            *[r for t in topics.all() for r in topic(t, DESCRIBE_CONFIGS)],
            *[Right("topic", internal, "prefixed", op) for op in (CREATE, READ, WRITE, DESCRIBE, DESCRIBE_CONFIGS)],
            *group(app_id, g["schemas"]),
        ]
    elif role == "reconciler":
        out = [
            *topic(topics.uncertain, READ, DESCRIBE),
            *topic(topics.events, WRITE, DESCRIBE),
            *topic(topics.dlq, WRITE, DESCRIBE),  # a record it cannot reconcile is dead-lettered
            *schemas,
            *group(reconciler_group, g["schemas"]),
        ]
    elif role == "sink":
        out = [*topic(topics.state, READ, DESCRIBE), *reads_schemas, *group(g["sink"], g["schemas"])]
    elif role == "operator":
        out = [
            *[r for t in (topics.events, topics.state, topics.uncertain, topics.dlq) for r in topic(t, READ, DESCRIBE)],
            *topic(topics.decisions, READ, WRITE, DESCRIBE),
            *schemas,
            *group(g["tool"], g["follow"], g["schemas"]),
        ]
    elif role == "subscriber":
        out = [*topic(topics.state, READ, DESCRIBE), *topic(topics.uncertain, READ, DESCRIBE), *reads_schemas]
        out += group(g["follow"], g["subscribers"], g["schemas"])
    elif role == "auditor":
        readable = (topics.events, topics.decisions, topics.state, topics.uncertain, topics.dlq, topics.schemas)
        out = [r for t in readable for r in topic(t, READ, DESCRIBE)] + group(g["tool"], g["schemas"])
    elif role == "admin":
        ops = (CREATE, DELETE, DESCRIBE, DESCRIBE_CONFIGS, ALTER_CONFIGS, READ, WRITE)
        if p:
            out = [Right("topic", p, "prefixed", op) for op in ops]
        else:  # no prefix: an empty resource name is not a valid ACL; each topic by its name
            out = [r for t in topics.all() for r in topic(t, *ops)]
        out += group(g["tool"], g["schemas"], g["keys"])  # retire reads the states, erase the keys
    else:
        raise ConfigError(f"unknown role {role!r}: one of {', '.join(ROLES)}")
    return tuple(sorted(set(out)))


#: What a part needs on its topics to start: checked by the part itself (``missing_rights``).
#: Each is a (topic attribute of ``Topics``, operation) pair.
NEEDS: Mapping[str, tuple[tuple[str, str], ...]] = {
    "agent": (
        ("events", WRITE),
        ("decisions", DESCRIBE),
        ("dlq", WRITE),
        ("keys", READ),
        ("keys", WRITE),
        ("schemas", WRITE),
        ("schemas", READ),
    ),  # fmt: skip
    "decide": (("decisions", WRITE), ("events", READ), ("decisions", READ)),  # effects resolve
    "decide_sdk": (("decisions", WRITE),),  # Ledger.decide: the relay writes it
    "worker": (
        ("events", READ),
        ("events", WRITE),
        ("decisions", READ),
        ("state", WRITE),
        ("uncertain", WRITE),
        ("dlq", WRITE),
        ("schemas", READ),
        ("schemas", WRITE),
    ),  # fmt: skip
    "reconciler": (
        ("uncertain", READ),
        ("events", WRITE),
        ("dlq", WRITE),
        ("schemas", READ),
        ("schemas", WRITE),
    ),  # fmt: skip
    "sink": (("state", READ), ("schemas", READ)),
}


@dataclass(frozen=True)
class Grant:
    """A role's rights given to a principal (``User:NAME``)."""

    principal: str
    role: str
    rights: tuple[Right, ...]


def parse_roles(specs: Iterable[str]) -> list[tuple[str, str]]:
    """``ROLE=PRINCIPAL`` pairs (``agent=User:alice``; a bare name is ``User:NAME``)."""
    out: list[tuple[str, str]] = []
    for spec in specs:
        role, sep, principal = spec.partition("=")
        role, principal = role.strip(), principal.strip()
        if not sep or not principal:
            raise ConfigError(f"--role {spec!r}: give ROLE=PRINCIPAL, e.g. agent=User:alice")
        if role not in ROLES:
            raise ConfigError(f"--role {spec!r}: unknown role {role!r}: one of {', '.join(ROLES)}")
        if ":" not in principal:
            principal = f"User:{principal}"
        out.append((role, principal))
    if not out:
        raise ConfigError(f"name at least one --role ROLE=PRINCIPAL (roles: {', '.join(ROLES)})")
    return out


def grants(roles: Sequence[tuple[str, str]], topics: Topics, **names: str) -> list[Grant]:
    """Each role's rights given to its principal (``names``: ``rights``'s ``app_id`` and
    ``reconciler_group``)."""
    return [Grant(principal, role, rights(role, topics, **names)) for role, principal in roles]


def kafka_acls_lines(grants_: Sequence[Grant], bootstrap: str, command_config: str = "admin.properties") -> list[str]:
    """The grants as ``kafka-acls.sh --add`` lines, one per principal, resource and pattern."""
    lines: list[str] = []
    for g in grants_:
        lines.append(f"# {g.role}: {g.principal}")
        by_resource: dict[tuple[str, str, str], list[str]] = {}
        for r in g.rights:
            by_resource.setdefault((r.resource, r.name, r.pattern), []).append(r.operation)
        for (resource, name, pattern), ops in by_resource.items():
            target = f"--{resource} '{name}'"
            lines.append(
                f"kafka-acls.sh --bootstrap-server {bootstrap} --command-config {command_config} --add"
                f" --allow-principal '{g.principal}' {' '.join(f'--operation {op}' for op in ops)}"
                f" {target} --resource-pattern-type {pattern}"
            )
    return lines


def as_json(grants_: Sequence[Grant]) -> str:
    return json.dumps(
        [{"role": g.role, "principal": g.principal, "rights": [asdict(r) for r in g.rights]} for g in grants_],
        indent=2,
    )

"""The roles' rights (``streams.acl``), row by row: what each role may write, that a part's start
check asks only for rights its role is given, and the two output formats."""

from __future__ import annotations

import json

import pytest

from effect_ledger.errors import ConfigError
from effect_ledger.streams.acl import NEEDS, ROLES, Right, as_json, grants, kafka_acls_lines, parse_roles, rights
from effect_ledger.streams.config import Topics

T = Topics("prod.")


def writes(role: str) -> set[str]:
    return {r.name for r in rights(role, T) if r.resource == "topic" and r.operation == "Write"}


@pytest.mark.parametrize(
    ("role", "written"),
    [
        ("agent", {T.events, T.dlq, T.keys, T.schemas}),
        ("worker", {T.events, T.state, T.uncertain, T.dlq, T.schemas, "prod.effect-ledger-"}),
        ("reconciler", {T.events, T.dlq, T.schemas}),
        ("sink", set()),
        ("operator", {T.decisions, T.schemas}),
        ("subscriber", set()),
        ("auditor", set()),
        ("admin", {"prod."}),
    ],
)
def test_what_each_role_may_write(role: str, written: set[str]) -> None:
    assert writes(role) == written


def test_only_operators_write_decisions_and_nobody_but_the_agent_reads_the_keys() -> None:
    assert [r for r in ROLES if T.decisions in writes(r)] == ["operator"]
    readers = [r for r in ROLES if any(x.name == T.keys and x.operation == "Read" for x in rights(r, T))]
    assert readers == ["agent"]  # the admin's prefixed rights aside


@pytest.mark.parametrize("need", sorted(NEEDS))
def test_a_parts_start_check_asks_only_for_what_its_role_is_given(need: str) -> None:
    role = {"decide": "operator", "decide_sdk": "operator"}.get(need, need)
    given = {(r.name, r.operation) for r in rights(role, T)}
    for attr, op in NEEDS[need]:
        assert (getattr(T, attr), op) in given, (need, attr, op)


def test_every_right_is_under_the_prefix_and_none_is_on_the_cluster() -> None:
    for role in ROLES:
        for r in rights(role, T):
            assert r.name.startswith("prod.") and r.resource in ("topic", "group"), (role, r)


def test_the_outputs() -> None:
    g = grants(parse_roles(["sink=bob"]), T)
    lines = kafka_acls_lines(g, "b:9093")
    assert lines[0] == "# sink: User:bob"
    assert (
        "kafka-acls.sh --bootstrap-server b:9093 --command-config admin.properties --add --allow-principal 'User:bob'"
        " --operation Describe --operation Read --topic 'prod.effects.state' --resource-pattern-type literal"
    ) in lines
    assert "--group 'prod.effects-sink-' --resource-pattern-type prefixed" in "\n".join(lines)
    parsed = json.loads(as_json(g))
    assert parsed[0]["principal"] == "User:bob" and Right(**parsed[0]["rights"][0]) in g[0].rights


@pytest.mark.parametrize(
    ("spec", "says"),
    [("sink", "ROLE=PRINCIPAL"), ("root=User:x", "unknown role 'root'"), ("agent=", "ROLE=PRINCIPAL")],
)
def test_a_bad_role_is_refused(spec: str, says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        parse_roles([spec])
    with pytest.raises(ConfigError, match="at least one"):
        parse_roles([])


def test_without_a_prefix_no_right_has_an_empty_name() -> None:
    bare = Topics("")
    for role in ROLES:
        assert all(r.name for r in rights(role, bare)), role
    assert {r.name for r in rights("admin", bare) if r.resource == "topic"} == set(bare.all())


def test_the_worker_and_reconciler_group_names_follow_their_options() -> None:
    w = rights("worker", T, app_id="ledger-b")
    assert Right("group", "prod.ledger-b", "literal", "Read") in w
    assert Right("topic", "prod.ledger-b-", "prefixed", "Create") in w
    assert Right("group", "prod.recon-b", "literal", "Read") in rights("reconciler", T, reconciler_group="recon-b")

"""A person's decision as an engine hands it back (a LangGraph resume value, a DBOS message)."""

from __future__ import annotations

from typing import Any

import pytest

from effect_ledger import InvalidEffect
from effect_ledger.core.model import DecisionKind
from effect_ledger.integrations.decisions import PersonDecision, parse_decision


def test_the_three_decisions() -> None:
    assert parse_decision({"decision": "confirmed", "by": "a", "reason": "r", "receipt_id": "re_1"}) == PersonDecision(
        DecisionKind.CONFIRMED, "a", "r", "re_1"
    )
    assert parse_decision({"decision": "ABSENT", "by": "a", "reason": "r"}).kind is DecisionKind.ABSENT
    assert parse_decision({"decision": "abandon", "by": "a", "reason": "r", "effect_id": "k"}).effect_id == "k"


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("confirmed", "a mapping"),
        ({"decision": "maybe", "by": "a", "reason": "r"}, "one of confirmed, absent, abandon"),
        ({"decision": "absent", "reason": "r"}, "who made it"),
        ({"decision": "absent", "by": "a", "reason": "  "}, "non-empty"),
        ({"decision": "absent", "by": "a", "reason": "r", "receipt_id": "re_1"}, "only with decision 'confirmed'"),
        ({"decision": "absent", "by": "a", "reason": "r", "note": "x"}, "no field"),
        ({"decision": "absent", "by": "a", "reason": "r" * 1001}, "at most 1000"),
    ],
)
def test_a_bad_decision_says_what_is_wrong(value: Any, says: str) -> None:
    with pytest.raises(InvalidEffect, match=says):
        parse_decision(value)

"""A codec learns writer schemas it does not ship through its resolver (in production the
``effects.schemas`` topic: tests/integration/test_schema_upgrade.py), and fails with a typed
UnknownSchema when it cannot."""

from __future__ import annotations

import json
from typing import Any

import pytest

from effect_ledger.core import model as m
from effect_ledger.errors import UnknownSchema
from effect_ledger.streams.codec import Codec, schema_fingerprint
from effect_ledger.streams.schema_topic import schema_key, schema_value
from tests.newer_writer import encode, newer

EXECUTED = {
    "event_id": "e1",
    "effect_id": "k",
    "at_ms": 5,
    "attempt": 1,
    "outcome": "OUTCOME_NEXT",
    "error": None,
    "call_started_ms": 1,
    "call_ended_ms": 2,
    "receipt_deadline_ms": None,
    "worker": "w",
    "region": "us",
}


def test_a_newer_writer_is_learned_once_and_resolved_into_todays_model() -> None:
    new = newer("Executed")
    asked: list[bytes] = []

    def resolver(fp: bytes) -> dict[str, Any] | None:
        asked.append(fp)
        return new if fp == schema_fingerprint(new) else None

    codec = Codec(resolver=resolver)
    data = encode(new, EXECUTED)
    assert not codec.knows(data[2:10])
    for _ in range(3):
        back = codec.decode(data)
        # The added field is dropped, the unknown symbol becomes the enum's default: an unknown outcome.
        assert back == m.Executed("e1", "k", 5, 1, m.Outcome.UNKNOWN, None, 1, 2, None, "w")
    assert asked == [schema_fingerprint(new)]
    assert codec.knows(data[2:10]) and schema_fingerprint(new) in codec.writer_schemas()


def test_without_a_resolver_an_unknown_writer_is_a_typed_error() -> None:
    new = newer("Executed")
    with pytest.raises(UnknownSchema) as e:
        Codec().decode(encode(new, EXECUTED))
    assert e.value.fingerprint == schema_fingerprint(new)


@pytest.mark.parametrize(
    ("answer", "why"),
    [
        (None, "not in the schemas topic either"),
        ({"type": "record", "name": "Executed", "namespace": "effect_ledger", "fields": []}, "has fingerprint"),
        (
            {
                "type": "record",
                "name": "Other",
                "namespace": "effect_ledger",
                "fields": [{"name": "region", "type": "string"}],
            },
            "has fingerprint",
        ),
    ],
)
def test_a_resolver_without_the_right_schema_is_a_typed_error(answer: Any, why: str) -> None:
    codec = Codec(resolver=lambda fp: answer)
    with pytest.raises(UnknownSchema, match=why):
        codec.decode(encode(newer("Executed"), EXECUTED))


def test_a_learned_schema_of_a_record_this_release_does_not_have_is_refused() -> None:
    other = {"type": "record", "name": "Other", "namespace": "effect_ledger", "fields": [{"name": "x", "type": "int"}]}
    codec = Codec(resolver=lambda fp: other)
    with pytest.raises(UnknownSchema, match="effect_ledger.Other is not a record of this codec"):
        codec.decode(encode(other, {"x": 1}))


def test_a_resolver_that_cannot_look_is_a_typed_error() -> None:
    def resolver(fp: bytes) -> None:
        raise LookupError("effects.schemas could not be read: broker down")

    with pytest.raises(UnknownSchema, match="broker down"):
        Codec(resolver=resolver).decode(encode(newer("Executed"), EXECUTED))


def test_schema_record_layout() -> None:
    """What other languages rely on: the key is bytes 2..9 of a record as hex, the value the JSON."""
    new = newer("EffectState")
    fp = schema_fingerprint(new)
    assert schema_key(fp) == fp.hex() and len(schema_key(fp)) == 16
    assert json.loads(schema_value(new)) == new

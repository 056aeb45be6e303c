"""The Avro single-object codec: round trips, wire format, schema evolution, interop with the Apache
``avro`` package, and that bad bytes fail loudly with DecodeError instead of decoding to garbage."""

from __future__ import annotations

import copy
import dataclasses
import io
import json
from enum import StrEnum
from typing import Any

import avro.io
import avro.schema
import fastavro
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from effect_ledger import schemas
from effect_ledger.core import model as m
from effect_ledger.errors import DecodeError, EncodeError, LedgerError, UnknownSchema
from effect_ledger.streams.codec import HEADER, MAGIC, Codec, schema_fingerprint

INT_MIN, INT_MAX = -(2**31), 2**31 - 1
LONG_MIN, LONG_MAX = -(2**63), 2**63 - 1

# Enums the schemas use, by their Avro name. The model must define each status name once, here.
AVRO_ENUMS: dict[str, type[StrEnum]] = {
    "State": m.State,
    "Outcome": m.Outcome,
    "ReceiptSource": m.ReceiptSource,
    "Verdict": m.Verdict,
    "DecisionKind": m.DecisionKind,
    "TimeoutPhase": m.TimeoutPhase,
}

REQ = '{"amount":1250,"currency":"EUR","note":"Rückerstattung für Bestellung 42 – 返金"}'
DIGEST = "9f2c" * 16

# Realistic records, each type at least once; where a type has optional fields both with them set and
# with them None/default, and non-ASCII strings throughout.
SAMPLES: list[Any] = [
    m.Intent(
        "ev-1",
        "refund:order-42",
        1_700_000_000_000,
        1,
        "stripe",
        "refund.create",
        "shop-eu",
        "run-ä1",
        "step-refund",
        REQ,
        DIGEST,
        1_700_000_030_000,
        "worker-1@host",
    ),
    m.Intent(
        "ev-2",
        "mail:ü-7",
        1_700_000_000_001,
        3,
        "smtp",
        "send",
        "crm",
        "run-2",
        "notify-😀",
        "{}",
        DIGEST,
        1_700_000_000_500,
        "w2",
        keyed=False,
    ),
    m.Executed(
        "ev-3",
        "refund:order-42",
        1_700_000_000_100,
        1,
        m.Outcome.OK,
        None,
        1_700_000_000_010,
        1_700_000_000_090,
        1_700_000_060_000,
        "worker-1",
    ),
    m.Executed(
        "ev-4",
        "refund:order-42",
        1_700_000_000_200,
        2,
        m.Outcome.UNKNOWN,
        "read timeout après 30 s",
        1_700_000_000_110,
        1_700_000_000_190,
        None,
        "worker-2",
    ),
    m.Receipt(
        "ev-5",
        "refund:order-42",
        1_700_000_000_300,
        0,
        "re_3NxZ",
        m.ReceiptSource.WEBHOOK,
        '{"id":"re_3NxZ","status":"succeeded","memo":"Grüße"}',
    ),
    m.Resolution(
        "ev-6",
        "refund:order-42",
        1_700_000_000_400,
        2,
        m.Verdict.FOUND,
        "stripe-reconciler",
        "listed by the API – gefunden",
        "re_3NxZ",
        '{"id":"re_3NxZ"}',
        4,
    ),
    m.Resolution("ev-7", "mail:ü-7", 1_700_000_000_401, 1, m.Verdict.ESCALATE, "smtp-reconciler"),
    m.Decision(
        "ev-8",
        "mail:ü-7",
        1_700_000_000_500,
        1,
        m.DecisionKind.ABANDONED,
        "zoë@example.org",
        "customer withdrew – 取消",
    ),
    m.Decision(
        "ev-9",
        "refund:order-42",
        1_700_000_000_501,
        2,
        m.DecisionKind.CONFIRMED,
        "ops",
        "seen in the dashboard",
        receipt_id="re_3NxZ",
    ),
    m.Timeout(
        "timeout:refund:order-42:1:CALL",
        "refund:order-42",
        1_700_000_030_001,
        1,
        m.TimeoutPhase.CALL,
        1_700_000_030_000,
    ),
    m.EffectState(
        "refund:order-42",
        m.State.CONFIRMED,
        "stripe",
        "refund.create",
        "shop-eu",
        "run-ä1",
        "step-refund",
        DIGEST,
        2,
        7,
        1_700_000_000_000,
        1_700_000_000_501,
        1_700_000_030_000,
        "re_3NxZ",
        2,
        ("re_3NxZ", "re_4Ab"),
        (m.Flag.DUPLICATE_EXECUTION.value, m.Flag.DUPLICATE_RECEIPT.value),
        "zwei Ausführungen",
    ),
    m.EffectState(
        "mail:ü-7",
        m.State.PENDING,
        "smtp",
        "send",
        "crm",
        "run-2",
        "notify-😀",
        DIGEST,
        1,
        1,
        1_700_000_000_001,
        1_700_000_000_001,
    ),
    m.UncertainEffect(
        "ev-10",
        "refund:order-42",
        1_700_000_000_250,
        2,
        "stripe",
        "refund.create",
        REQ,
        DIGEST,
        "call outcome UNKNOWN: Zeitüberschreitung",
        1_700_000_000_000,
        1_700_000_030_000,
    ),
    m.DeadLetter(
        1_700_000_000_600,
        "processor",
        "effects.events",
        3,
        12_345,
        "cannot decode: ✗",
        b"refund:order-42",
        b"\xc3\x01\x00\xff",
    ),
    m.DeadLetter(1_700_000_000_601, "processor", "effects.events", 0, 0, "null record"),
    m.Retirement("ev-11", "refund:order-42", 1_702_592_000_000, 7, 30 * 86_400_000, "os:oncall@host-ß"),
    m.Claimed("claim:1:refund:order-42", "refund:order-42", 1_700_000_000_000, 1, "ev-1", "worker-1@höst"),
]


def _ids(x: Any) -> str:
    return type(x).__name__


@pytest.fixture(scope="module")
def codec() -> Codec:
    return Codec()


def _same_types(a: Any, b: Any) -> None:
    """Equality alone hides State.PENDING vs "PENDING" (a StrEnum equals its str) and would hide a
    list where the frozen model wants a tuple only when both are empty; check the types too."""
    for f in dataclasses.fields(a):
        assert type(getattr(a, f.name)) is type(getattr(b, f.name)), f.name


# --- round trips ------------------------------------------------------------------------------------


def test_samples_cover_every_record_type() -> None:
    assert {type(s) for s in SAMPLES} == set(m.RECORD_TYPES)


@pytest.mark.parametrize("obj", SAMPLES, ids=_ids)
def test_round_trip(codec: Codec, obj: Any) -> None:
    data = codec.encode(obj)
    back = codec.decode(data)
    assert back == obj
    _same_types(back, obj)
    assert codec.encode(back) == data  # deterministic: the same record always gives the same bytes


def _avro_strategy(avro_type: Any) -> st.SearchStrategy[Any]:
    """A strategy for values of one Avro field type, as the model holds them."""
    if isinstance(avro_type, list):  # a union such as ["null", "string"]
        return st.one_of(*[_avro_strategy(t) for t in avro_type])
    if isinstance(avro_type, dict):
        if avro_type["type"] == "enum":
            return st.sampled_from(list(AVRO_ENUMS[avro_type["name"]]))
        if avro_type["type"] == "array":
            return st.lists(_avro_strategy(avro_type["items"]), max_size=4).map(tuple)
        return _avro_strategy(avro_type["type"])
    return {
        "null": st.none(),
        "boolean": st.booleans(),
        "int": st.integers(INT_MIN, INT_MAX),
        "long": st.integers(LONG_MIN, LONG_MAX),
        "string": st.text(max_size=40),  # all of Unicode except lone surrogates
        "bytes": st.binary(max_size=40),
    }[avro_type]


def records(cls: type) -> st.SearchStrategy[Any]:
    """Random instances of ``cls``, with every field drawn from its Avro type."""
    raw = schemas.load(cls.__name__)
    return st.builds(cls, **{f["name"]: _avro_strategy(f["type"]) for f in raw["fields"]})


ANY_RECORD = st.one_of(*[records(cls) for cls in m.RECORD_TYPES])


@pytest.mark.parametrize("cls", m.RECORD_TYPES, ids=lambda c: c.__name__)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_round_trip_property(codec: Codec, cls: type, data: st.DataObject) -> None:
    obj = data.draw(records(cls))
    back = codec.decode(codec.encode(obj))
    assert back == obj
    _same_types(back, obj)


# --- wire format ------------------------------------------------------------------------------------


@pytest.mark.parametrize("obj", SAMPLES, ids=_ids)
def test_single_object_prefix_and_header(codec: Codec, obj: Any) -> None:
    name = type(obj).__name__
    data = codec.encode(obj)
    assert data[:2] == b"\xc3\x01" == MAGIC
    assert data[2:10] == schema_fingerprint(schemas.load(name))
    assert codec.header(obj) == (HEADER, f"effect_ledger.{name}".encode())
    assert HEADER == "effect-ledger.schema"
    assert codec.schema_name(obj) == codec.schema_name(type(obj)) == f"effect_ledger.{name}"


def test_fingerprints_are_distinct() -> None:
    # Distinct fingerprints are what lets decode pick the record type from the bytes alone.
    fps = {schema_fingerprint(schemas.load(n)) for n in schemas.NAMES}
    assert len(fps) == len(schemas.NAMES)


def test_decode_accepts_bytearray_and_memoryview(codec: Codec) -> None:
    data = codec.encode(SAMPLES[0])
    assert codec.decode(bytearray(data)) == SAMPLES[0]
    assert codec.decode(memoryview(data)) == SAMPLES[0]


# --- enums: status names are defined once -----------------------------------------------------------


def _enums(avro_type: Any) -> list[dict[str, Any]]:
    """Every enum definition inside an Avro type, however deeply nested."""
    if isinstance(avro_type, list):
        return [e for t in avro_type for e in _enums(t)]
    if not isinstance(avro_type, dict):
        return []
    if avro_type.get("type") == "enum":
        return [avro_type]
    found = [e for f in avro_type.get("fields", []) for e in _enums(f["type"])]
    return found + _enums(avro_type.get("items")) + _enums(avro_type.get("type"))


def test_avro_enums_match_model_enums() -> None:
    enums = [e for n in schemas.NAMES for e in _enums(schemas.load(n))]
    assert {e["name"] for e in enums} == set(AVRO_ENUMS)
    for e in enums:
        py = AVRO_ENUMS[e["name"]]
        assert len(e["symbols"]) == len(set(e["symbols"])), e["name"]
        assert sorted(e["symbols"]) == sorted(member.value for member in py), e["name"]
        assert all(member.name == member.value for member in py), py.__name__


# --- schema evolution -------------------------------------------------------------------------------


def _without(name: str, *dropped: str) -> dict[str, Any]:
    """The current schema ``name`` as an older writer would have had it: without ``dropped`` fields."""
    old = copy.deepcopy(schemas.load(name))
    old["fields"] = [f for f in old["fields"] if f["name"] not in dropped]
    assert len(old["fields"]) == len(schemas.load(name)["fields"]) - len(dropped)
    return old


def _encode_with(old: dict[str, Any], record: dict[str, Any]) -> bytes:
    """What an older producer would have written: its own fingerprint, its own body."""
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, fastavro.parse_schema(copy.deepcopy(old)), record)
    return MAGIC + schema_fingerprint(old) + buf.getvalue()


OLD_INTENT = {f.name: getattr(SAMPLES[0], f.name) for f in dataclasses.fields(m.Intent) if f.name != "keyed"}
OLD_RESOLUTION = {
    "event_id": "ev-r",
    "effect_id": "k-ß",
    "at_ms": 5,
    "attempt": 2,
    "verdict": "ABSENT",
    "reconciler": "r-1",
}
OLD_DECISION = {
    "event_id": "ev-d",
    "effect_id": "k-d",
    "at_ms": 6,
    "attempt": 1,
    "decision": "ABANDONED",
    "by": "zoë",
    "reason": "cancelled",
    "receipt_id": None,
}

EVOLUTION = [
    pytest.param("Intent", ("keyed",), OLD_INTENT, m.Intent(**OLD_INTENT, keyed=True), id="Intent-keyed"),
    pytest.param(
        "Resolution",
        ("reason", "receipt_id", "value", "tries"),
        OLD_RESOLUTION,
        m.Resolution("ev-r", "k-ß", 5, 2, m.Verdict.ABSENT, "r-1", reason="", receipt_id=None, value=None, tries=1),
        id="Resolution-defaults",
    ),
    pytest.param(
        "Decision",
        ("principal",),
        OLD_DECISION,
        m.Decision("ev-d", "k-d", 6, 1, m.DecisionKind.ABANDONED, "zoë", "cancelled", None, principal=""),
        id="Decision-principal",
    ),
]


@pytest.fixture
def fresh_codec(monkeypatch: pytest.MonkeyPatch) -> Codec:
    """A codec that knows only the current schemas: a history file someone adds later must not make
    the 'unknown fingerprint' case pass by accident."""
    monkeypatch.setattr(schemas, "history", lambda: [])
    return Codec()


@pytest.mark.parametrize(("name", "dropped", "record", "expected"), EVOLUTION)
def test_older_writer_decodes_with_reader_defaults(
    fresh_codec: Codec, name: str, dropped: tuple[str, ...], record: dict[str, Any], expected: Any
) -> None:
    old = _without(name, *dropped)
    data = _encode_with(old, record)
    assert data[2:10] != schema_fingerprint(schemas.load(name))

    assert fresh_codec.register_writer(old) == schema_fingerprint(old)
    back = fresh_codec.decode(data)
    assert back == expected
    _same_types(back, expected)
    # Registering an old writer changes decoding only: new bytes still carry the current fingerprint.
    assert fresh_codec.encode(back)[2:10] == schema_fingerprint(schemas.load(name))


@pytest.mark.parametrize(("name", "dropped", "record", "expected"), EVOLUTION)
def test_unregistered_older_writer_is_rejected(
    fresh_codec: Codec, name: str, dropped: tuple[str, ...], record: dict[str, Any], expected: Any
) -> None:
    old = _without(name, *dropped)
    with pytest.raises(DecodeError, match=f"unknown schema fingerprint {schema_fingerprint(old).hex()}"):
        fresh_codec.decode(_encode_with(old, record))


def test_released_decisions_without_a_principal_decode_with_the_shipped_history(codec: Codec) -> None:
    """Decisions written before ``principal`` existed (``schemas/history/v0/Decision.avsc``) decode
    with the default codec, the writer's identity left empty."""
    old = schemas.versions()[0]["Decision"]
    assert [f["name"] for f in old["fields"]] == list(OLD_DECISION)
    back = codec.decode(_encode_with(old, OLD_DECISION))
    assert isinstance(back, m.Decision) and back.principal == "" and back.by == "zoë"


def test_register_writer_rejects_unknown_record(fresh_codec: Codec) -> None:
    other = {"type": "record", "name": "Other", "namespace": "effect_ledger", "fields": [{"name": "x", "type": "int"}]}
    with pytest.raises(ValueError, match="effect_ledger.Other"):
        fresh_codec.register_writer(other)


# --- interop with the Apache avro package -----------------------------------------------------------


def _rabin_crc64(data: bytes) -> int:
    """CRC-64-AVRO exactly as the Avro specification gives it (a 64-bit number), written out here so
    neither library's byte order is taken on trust."""
    empty = 0xC15D213AA4D7A795
    table = []
    for i in range(256):
        fp = i
        for _ in range(8):
            fp = (fp >> 1) ^ (empty & -(fp & 1))
        table.append(fp)
    fp = empty
    for b in data:
        fp = (fp >> 8) ^ table[(fp ^ b) & 0xFF]
    return fp


def _avro_schema(name: str) -> avro.schema.Schema:
    return avro.schema.parse(json.dumps(schemas.load(name)))


def _as_avro_datum(obj: Any) -> dict[str, Any]:
    """The record as the avro package reads and writes it: plain str enums, lists for arrays."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(obj):
        v = getattr(obj, f.name)
        out[f.name] = list(v) if isinstance(v, tuple) else (str(v) if isinstance(v, StrEnum) else v)
    return out


@pytest.mark.parametrize("name", schemas.NAMES)
def test_fingerprint_matches_avro_package_and_spec(name: str) -> None:
    parsed = _avro_schema(name)
    fp = parsed.fingerprint("CRC-64-AVRO")
    # avro 1.12 returns the 8 bytes already little-endian, the order single-object encoding stores.
    assert isinstance(fp, bytes) and len(fp) == 8
    spec = _rabin_crc64(parsed.canonical_form.encode())
    assert fp == spec.to_bytes(8, "little")
    assert schema_fingerprint(schemas.load(name)) == fp


@pytest.mark.parametrize("obj", SAMPLES, ids=_ids)
def test_apache_avro_reads_our_bytes(codec: Codec, obj: Any) -> None:
    parsed = _avro_schema(type(obj).__name__)
    data = codec.encode(obj)
    assert data[2:10] == parsed.fingerprint("CRC-64-AVRO")
    body = io.BytesIO(data[10:])
    datum = avro.io.DatumReader(parsed).read(avro.io.BinaryDecoder(body))
    assert datum == _as_avro_datum(obj)
    assert body.tell() == len(data) - 10  # the body is exactly one record, nothing after it


@pytest.mark.parametrize("obj", SAMPLES, ids=_ids)
def test_we_read_apache_avro_bytes(codec: Codec, obj: Any) -> None:
    parsed = _avro_schema(type(obj).__name__)
    body = io.BytesIO()
    avro.io.DatumWriter(parsed).write(_as_avro_datum(obj), avro.io.BinaryEncoder(body))
    data = MAGIC + parsed.fingerprint("CRC-64-AVRO") + body.getvalue()
    back = codec.decode(data)
    assert back == obj
    _same_types(back, obj)
    assert data == codec.encode(obj)  # both libraries produce the same bytes


# --- bad input --------------------------------------------------------------------------------------

VALID = SAMPLES[0]


@pytest.mark.parametrize(
    ("data", "match"),
    [
        pytest.param(None, "null record", id="None"),
        pytest.param(b"", "0 bytes is shorter", id="empty"),
        pytest.param(b"\xc3\x01\x00\x00\x00", "5 bytes is shorter", id="5-bytes"),
        pytest.param(b"\xc3\x01" + b"\x00" * 7, "9 bytes is shorter", id="9-bytes"),
        pytest.param(b'{"event_id": "e"}', "not Avro single-object encoding", id="json"),
    ],
)
def test_decode_rejects_malformed(codec: Codec, data: bytes | None, match: str) -> None:
    with pytest.raises(DecodeError, match=match):
        codec.decode(data)


def test_decode_rejects_wrong_magic(codec: Codec) -> None:
    data = codec.encode(VALID)
    with pytest.raises(DecodeError, match="starts c302, expected c301"):
        codec.decode(b"\xc3\x02" + data[2:])


def test_decode_rejects_unknown_fingerprint(codec: Codec) -> None:
    data = bytearray(codec.encode(VALID))
    data[5] ^= 0xFF
    with pytest.raises(UnknownSchema, match=f"unknown schema fingerprint {bytes(data[2:10]).hex()}") as e:
        codec.decode(bytes(data))
    assert e.value.fingerprint == bytes(data[2:10]) and isinstance(e.value, LedgerError)


@pytest.mark.parametrize("obj", SAMPLES, ids=_ids)
def test_decode_rejects_every_truncation(codec: Codec, obj: Any) -> None:
    data = codec.encode(obj)
    for n in range(len(data)):
        with pytest.raises(DecodeError):
            codec.decode(data[:n])


@pytest.mark.parametrize("obj", SAMPLES, ids=_ids)
def test_decode_rejects_trailing_byte(codec: Codec, obj: Any) -> None:
    with pytest.raises(DecodeError, match="1 trailing bytes"):
        codec.decode(codec.encode(obj) + b"\x00")


def _decodes_or_decode_error(codec: Codec, data: bytes) -> None:
    try:
        result = codec.decode(data)
    except DecodeError as e:
        assert str(e)  # a message, not a bare exception
    else:
        assert isinstance(result, m.RECORD_TYPES)  # it really was a record: no half-built object


PREFIXES = [MAGIC + schema_fingerprint(schemas.load(n)) for n in schemas.NAMES]


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.binary(max_size=200))
def test_random_bytes(codec: Codec, data: bytes) -> None:
    _decodes_or_decode_error(codec, data)


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(prefix=st.sampled_from(PREFIXES), body=st.binary(max_size=200))
def test_random_body_behind_a_known_fingerprint(codec: Codec, prefix: bytes, body: bytes) -> None:
    # Past the header check, so this exercises fastavro's reader on hostile bytes.
    _decodes_or_decode_error(codec, prefix + body)


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(obj=ANY_RECORD, flips=st.lists(st.tuples(st.integers(0), st.integers(0, 255)), min_size=1, max_size=4))
def test_corrupted_body(codec: Codec, obj: Any, flips: list[tuple[int, int]]) -> None:
    data = bytearray(codec.encode(obj))
    if len(data) == 10:
        return
    for pos, value in flips:
        data[10 + pos % (len(data) - 10)] = value
    _decodes_or_decode_error(codec, bytes(data))


# --- encode errors ----------------------------------------------------------------------------------

EXECUTED = SAMPLES[2]
STATE = SAMPLES[10]


@pytest.mark.parametrize(
    ("obj", "changes", "match"),
    [
        pytest.param(VALID, {"at_ms": "x"}, "at_ms", id="str-for-long"),
        pytest.param(VALID, {"at_ms": None}, "at_ms", id="None-for-long"),
        pytest.param(VALID, {"effect_id": None}, "effect_id", id="None-for-string"),
        pytest.param(VALID, {"effect_id": 5}, "effect_id", id="int-for-string"),
        pytest.param(VALID, {"effect_id": b"k"}, "effect_id", id="bytes-for-string"),
        pytest.param(EXECUTED, {"outcome": "BOGUS"}, "BOGUS", id="unknown-enum-symbol"),
        pytest.param(EXECUTED, {"error": 5}, "error", id="int-for-optional-string"),
        pytest.param(STATE, {"receipt_ids": None}, "receipt_ids", id="None-for-array"),
        pytest.param(STATE, {"flags": (1,)}, "flags", id="int-in-string-array"),
    ],
)
def test_encode_rejects_wrong_types(codec: Codec, obj: Any, changes: dict[str, Any], match: str) -> None:
    with pytest.raises(EncodeError, match=match):
        codec.encode(dataclasses.replace(obj, **changes))


def test_encode_rejects_non_record(codec: Codec) -> None:
    with pytest.raises(EncodeError, match="dict is not a record"):
        codec.encode({"event_id": "e"})


# Values fastavro's writer does not check by itself; Codec.encode validates first.
@pytest.mark.parametrize(
    "changes",
    [
        pytest.param({"at_ms": 1.5}, id="float-for-long-truncated"),
        pytest.param({"keyed": None}, id="None-for-boolean-becomes-False"),
        pytest.param({"keyed": "no"}, id="str-for-boolean-becomes-True"),
        pytest.param({"attempt": 2**40}, id="int-field-outside-32-bits"),
        pytest.param({"at_ms": 2**70}, id="long-overflow-raises-OverflowError"),
    ],
)
def test_encode_rejects_values_outside_the_schema(codec: Codec, changes: dict[str, Any]) -> None:
    with pytest.raises(EncodeError):
        codec.encode(dataclasses.replace(VALID, **changes))

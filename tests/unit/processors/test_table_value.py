"""The processor table's value (processors/table_value.py): a round trip gives the same effect, large
payloads are kept once and only where the fold reads them, and no value is ever over the limit."""

from __future__ import annotations

import dataclasses
import enum
import json
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from effect_ledger.core.effect import Effect, apply, claim_verdict, fold, to_state
from effect_ledger.core.limits import MAX_RECEIPT_BYTES, MAX_REQUEST_BYTES, MAX_TABLE_VALUE_BYTES, MAX_TEXT_BYTES
from effect_ledger.core.model import (
    INEXACT_PREFIX,
    Decision,
    DecisionKind,
    Event,
    Executed,
    Flag,
    Intent,
    Outcome,
    Receipt,
    ReceiptSource,
    Resolution,
    State,
    Verdict,
)
from effect_ledger.core.retention import Retired
from effect_ledger.processors import retirement, table_value
from effect_ledger.processors.table_value import TableValueTooLarge, decode, encode, slim
from effect_ledger.streams.codec import default_codec
from tests.unit.core.test_effect_properties import histories

KEY = "payments:k"
T = 1_700_000_000_000
CODEC = default_codec()


def intent(attempt: int, request: str = "{}", n: int = 0) -> Intent:
    return Intent(f"i-{attempt}-{n}", KEY, T + attempt * 10, attempt, "payments", "refund.create", "default",
                  "run", "step", request, "d" * 64, T + 60_000 + attempt, "w")  # fmt: skip


def executed(attempt: int, outcome: Outcome = Outcome.OK) -> Executed:
    return Executed(f"x-{attempt}", KEY, T + attempt * 10 + 1, attempt, outcome, None, T, T + 1, None, "w")


def receipt(attempt: int, value: str, rid: str = "r-1") -> Receipt:
    return Receipt(f"rc-{attempt}-{rid}", KEY, T + attempt * 10 + 2, attempt, rid, ReceiptSource.CALL, value)


def big(n: int, fill: str = "x") -> str:
    return json.dumps({"blob": fill * (n - 12)})


def roundtrip(effect: Effect) -> Effect:
    out = decode(encode(effect, effect.deadline_ms), CODEC.decode)
    assert out is not None
    return out


def test_a_small_effect_round_trips_exactly() -> None:
    e = fold([intent(1, '{"a":1}'), executed(1), receipt(1, '{"ok":true}')])
    assert e is not None
    assert roundtrip(e) == e


def test_every_field_round_trips_including_decisions_and_flags() -> None:
    d = Decision("dec-1", KEY, T + 99, 2, DecisionKind.ABANDONED, "ops", "no", None, "alice")
    r = Resolution("res-1", KEY, T + 50, 1, Verdict.ABSENT, "rec", "gone", None, None, 2)
    e = fold([intent(1), executed(1, Outcome.UNKNOWN), r, intent(2, '{"b":2}'), d, receipt(2, "null", "r-9")])
    assert e is not None
    assert roundtrip(e) == e


def test_the_due_time_is_read_from_the_header_alone() -> None:
    e = fold([intent(1)])
    assert e is not None
    assert table_value.due_of_value(encode(e, 123)) == 123
    assert table_value.due_of_value(encode(e, None)) is None


def test_a_field_added_to_an_event_survives_generically() -> None:
    """Serialization walks the dataclass fields: nothing here names them."""
    e = fold([intent(1, '{"a":1}')])
    assert e is not None
    data = table_value._Writer().dump(e)
    assert data["@"] == "Effect" and data["facts"][0]["@"] == "Intent" and data["state"] == "PENDING"
    assert data["intent"] == {"^": 1}  # the same object as the fact: stored once
    assert set(data) - {"@"} == {f.name for f in dataclasses.fields(Effect)}


def test_large_payloads_the_fold_needs_are_kept_once() -> None:
    req = big(MAX_REQUEST_BYTES)
    val = big(MAX_RECEIPT_BYTES, "y")
    e = fold([intent(1, req), executed(1), receipt(1, val)])
    assert e is not None
    value = encode(e, None)
    # The request appears in the intent fact, e.intent and e.first_intent; the value in the fact
    # and the evidence: one copy each.
    assert len(value) < len(req) + len(val) + 4096
    assert roundtrip(e) == e


def test_payloads_the_fold_does_not_read_are_elided_and_the_state_is_unchanged() -> None:
    """Four large payloads (> 1 MB together, what broke the changelog): two attempts' requests, the
    receipt and a reconciler's later copy of it. Kept: the latest request and the earliest value."""
    old_req, new_req = big(MAX_REQUEST_BYTES, "a"), big(MAX_REQUEST_BYTES, "b")
    val = big(MAX_RECEIPT_BYTES, "c")
    found = Resolution("res-2", KEY, T + 99, 2, Verdict.FOUND, "rec", "", "r-1", big(MAX_RECEIPT_BYTES, "d"))
    r1 = Resolution("res-1", KEY, T + 15, 1, Verdict.ABSENT, "rec", "gone")
    e = fold([intent(1, old_req), executed(1, Outcome.UNKNOWN), r1, intent(2, new_req), executed(2),
              receipt(2, val), found])  # fmt: skip
    assert e is not None
    value = encode(e, None)
    assert len(value) < MAX_TABLE_VALUE_BYTES
    back = decode(value, CODEC.decode)
    assert back is not None and back == slim(e)
    assert to_state(back) == to_state(e)
    assert back.receipt == e.receipt and back.intent == e.intent
    assert [f.event_id for f in back.facts] == [f.event_id for f in e.facts]
    assert back.first_intent is not None and json.loads(back.first_intent.request)[table_value.ELIDED]["bytes"] == len(
        old_req
    )


def test_an_elided_inexact_receipt_stays_flagged_inexact() -> None:
    inexact = INEXACT_PREFIX + json.dumps({"reason": "big", "head": "z" * 3000}) + "}"
    e = fold([intent(1), executed(1), receipt(1, "null", "r-0"), receipt(1, inexact, "r-1")])
    assert e is not None and Flag.INEXACT_RECEIPT in e.flags
    back = roundtrip(e)
    assert to_state(back) == to_state(e)


def test_no_value_is_ever_over_the_limit() -> None:
    """Facts without payloads still add up: a key with thousands of maximal texts is refused at the
    limit rather than written."""
    facts: list[object] = [intent(1)]
    reason = "r" * MAX_TEXT_BYTES
    e = fold([intent(1)])
    assert e is not None
    with pytest.raises(TableValueTooLarge):
        for i in range(400):
            r = Resolution(f"res-{i}", KEY, T + 100 + i, 1, Verdict.UNKNOWN, "rec", reason + str(i), tries=i + 1)
            facts.append(r)
            e = fold([r], e)
            assert e is not None
            assert len(encode(e, None)) <= MAX_TABLE_VALUE_BYTES


def test_the_worst_ordinary_effect_fits() -> None:
    """Every payload at its limit, every text at its limit, a few attempts: well inside the value
    limit (so only a hostile writer can reach it)."""
    evs: list[object] = []
    for a in (1, 2, 3):
        err = "e" * MAX_TEXT_BYTES
        evs += [
            intent(a, big(MAX_REQUEST_BYTES, str(a))),
            Executed(f"x-{a}", KEY, T + a * 10 + 1, a, Outcome.UNKNOWN, err, T, T + 1, None, "w"),
            Resolution(f"res-{a}", KEY, T + a * 10 + 2, a, Verdict.ABSENT, "rec", "g" * MAX_TEXT_BYTES),
        ]
    evs += [receipt(3, big(MAX_RECEIPT_BYTES, "v")), receipt(3, big(MAX_RECEIPT_BYTES, "w"), "r-2")]
    e = fold(evs)  # type: ignore[arg-type]
    assert e is not None and e.state is State.CONFIRMED
    assert len(encode(e, None)) < MAX_TABLE_VALUE_BYTES * 0.8


# -- the value against a plain writer ----------------------------------------------------------


class _ReferenceWriter:
    """The format-2 walk, written plainly, and ``json.dumps``: what ``table_value.encode`` writes
    (with its own walk and a C encoder made once) must be this, byte for byte."""

    def __init__(self) -> None:
        self.blobs: dict[str, int] = {}
        self.seen: dict[int, int] = {}

    def dump(self, obj: object) -> object:
        if isinstance(obj, str) and not isinstance(obj, enum.Enum):
            return obj if len(obj) < table_value.BLOB_BYTES else {"$": self.blobs.setdefault(obj, len(self.blobs))}
        if obj is None or isinstance(obj, bool | int | float) and not isinstance(obj, enum.Enum):
            return obj
        if isinstance(obj, enum.Enum):
            return obj.value
        if dataclasses.is_dataclass(obj):
            if id(obj) in self.seen:
                return {"^": self.seen[id(obj)]}
            self.seen[id(obj)] = len(self.seen)
            return {
                "@": type(obj).__name__,
                **{f.name: self.dump(getattr(obj, f.name)) for f in dataclasses.fields(obj)},
            }
        if isinstance(obj, tuple | list):
            return [self.dump(x) for x in obj]
        raise TypeError(type(obj).__name__)


def reference_encode(effect: Effect, due_ms: int | None) -> bytes:
    w = _ReferenceWriter()
    skeleton = json.dumps(w.dump(slim(effect)), separators=(",", ":"), ensure_ascii=False).encode(
        "utf-8", "surrogatepass"
    )
    blobs = [text.encode("utf-8", "surrogatepass") for text in w.blobs]
    counted = b"".join(struct.pack(">I", len(b)) + b for b in blobs)
    header = struct.pack(
        ">BqIII", table_value.FORMAT, -1 if due_ms is None else due_ms, *table_value.counts(effect), len(blobs)
    )
    return header + counted + skeleton


TEXTS = st.sampled_from(["{}", '{"a":"é\\u2028"}', "x" * (table_value.BLOB_BYTES - 1), "y" * table_value.BLOB_BYTES,
                         big(table_value.ELIDE_OVER + 10, "z"), "\ud800 lone surrogate", ""])  # fmt: skip


@st.composite
def effects(draw: st.DrawFn) -> Effect:
    """Random histories (``test_effect_properties``), with claims, and texts around the blob and elision
    sizes in the requests, receipt values, errors and reasons."""
    events = draw(histories())
    out: list[Event] = []
    for ev in events:
        if isinstance(ev, Intent):
            ev = dataclasses.replace(ev, request=draw(TEXTS))
        elif isinstance(ev, Receipt):
            ev = dataclasses.replace(ev, value=draw(TEXTS))
        elif isinstance(ev, Executed) and ev.error is not None:
            ev = dataclasses.replace(ev, error=draw(TEXTS))
        elif isinstance(ev, Resolution):
            ev = dataclasses.replace(ev, reason=draw(TEXTS))
        out.append(ev)
    e: Effect | None = None
    for ev in out:
        e, _ = apply(e, ev)
        verdict = claim_verdict(e, ev) if draw(st.booleans()) else None
        if verdict is not None:
            e, _ = apply(e, verdict)
    assert e is not None
    return e


@settings(max_examples=300, deadline=None)
@given(effects(), st.sampled_from([None, 0, T]))
def test_the_value_is_what_a_plain_writer_writes(effect: Effect, due: int | None) -> None:
    try:
        expected = reference_encode(effect, due)
    except UnicodeEncodeError:
        expected = None
    if expected is not None and len(expected) > MAX_TABLE_VALUE_BYTES:
        with pytest.raises(TableValueTooLarge):
            encode(effect, due)
        return
    value = encode(effect, due)
    assert value == expected
    assert decode(value, CODEC.decode) == slim(effect)


# -- values already written ------------------------------------------------------------------------

# A value the encoder before orjson wrote (a claimed, confirmed effect with log times, a non-ASCII
# request; due 1234): what the changelog and the stores hold. It must decode, and the encoder must
# write the same bytes (the layout did not change, only how it is written).
WRITTEN_BEFORE = bytes.fromhex(
    "0200000000000004d2000000007b2240223a22456666656374222c226566666563745f6964223a227061796d656e74733a6b222c22666163"
    "7473223a5b7b2240223a22496e74656e74222c226576656e745f6964223a22692d312d30222c226566666563745f6964223a227061796d65"
    "6e74733a6b222c2261745f6d73223a313730303030303030303031302c22617474656d7074223a312c22746172676574223a227061796d65"
    "6e7473222c226f7065726174696f6e223a22726566756e642e637265617465222c226e616d657370616365223a2264656661756c74222c22"
    "72756e5f6964223a2272756e222c2273746570223a2273746570222c2272657175657374223a227b5c22615c223a5c22c3a95c5c75323032"
    "385c222c5c226e5c223a317d222c22726571756573745f646967657374223a22646464646464646464646464646464646464646464646464"
    "64646464646464646464646464646464646464646464646464646464646464646464646464646464222c22646561646c696e655f6d73223a"
    "313730303030303036303030312c22776f726b6572223a2277222c226b65796564223a747275652c226c616e64735f77697468696e5f6d73"
    "223a6e756c6c7d2c7b2240223a224578656375746564222c226576656e745f6964223a22782d31222c226566666563745f6964223a227061"
    "796d656e74733a6b222c2261745f6d73223a313730303030303030303031312c22617474656d7074223a312c226f7574636f6d65223a224f"
    "4b222c226572726f72223a6e756c6c2c2263616c6c5f737461727465645f6d73223a313730303030303030303030302c2263616c6c5f656e"
    "6465645f6d73223a313730303030303030303030312c22726563656970745f646561646c696e655f6d73223a6e756c6c2c22776f726b6572"
    "223a2277227d2c7b2240223a2252656365697074222c226576656e745f6964223a2272632d312d722d31222c226566666563745f6964223a"
    "227061796d656e74733a6b222c2261745f6d73223a313730303030303030303031322c22617474656d7074223a312c22726563656970745f"
    "6964223a22722d31222c22736f75726365223a2243414c4c222c2276616c7565223a227b5c2269645c223a5c2272655f315c227d227d2c7b"
    "2240223a22436c61696d6564222c226576656e745f6964223a22636c61696d3a313a7061796d656e74733a6b222c226566666563745f6964"
    "223a227061796d656e74733a6b222c2261745f6d73223a313730303030303030303031302c22617474656d7074223a312c22696e74656e74"
    "5f6964223a22692d312d30222c22776f726b6572223a2277227d5d2c227374617465223a22434f4e4649524d4544222c22617474656d7074"
    "223a312c22696e74656e74223a7b225e223a317d2c2266697273745f696e74656e74223a7b225e223a317d2c2272656365697074223a7b22"
    "40223a2245766964656e6365222c22726563656970745f6964223a22722d31222c2276616c7565223a227b5c2269645c223a5c2272655f31"
    "5c227d222c22736f75726365223a2243414c4c222c22617474656d7074223a312c2261745f6d73223a313730303030303030303031327d2c"
    "22726563656970745f696473223a5b22722d31225d2c22657865637574696f6e73223a312c22666c616773223a5b5d2c22646561646c696e"
    "655f6d73223a6e756c6c2c22637265617465645f6d73223a313730303030303030303031352c22757064617465645f6d73223a3137303030"
    "30303030303031382c22726561736f6e223a6e756c6c2c226c6f67676564223a5b5b22636c61696d3a313a7061796d656e74733a6b222c31"
    "3730303030303030303031355d2c5b22692d312d30222c313730303030303030303031355d2c5b2272632d312d722d31222c313730303030"
    "303030303031385d2c5b22782d31222c313730303030303030303031365d5d7d"
)


def _written_before_effect() -> Effect:
    e: Effect | None = None
    for ev, log_ms in ((intent(1, '{"a":"é\\u2028","n":1}'), T + 15), (executed(1), T + 16),
                       (receipt(1, '{"id":"re_1"}'), T + 18)):  # fmt: skip
        e, _ = apply(e, ev, log_ms)
        verdict = claim_verdict(e, ev)
        if verdict is not None:
            e, _ = apply(e, verdict, log_ms)
    assert e is not None
    return e


def _as_format_4(value: bytes, counts: tuple[int, int]) -> bytes:
    """A format-2 value as format 4: the counts of facts between the header and the body."""
    return bytes([table_value.FORMAT]) + value[1:9] + struct.pack(">II", *counts) + value[9:]


def test_a_value_written_before_decodes_and_is_written_the_same_with_its_version() -> None:
    """A format-2 value (no counts) an earlier release wrote reads as the same effect; written
    again it is format 4: the same header and body, the counts of its facts between them."""
    e = _written_before_effect()
    assert WRITTEN_BEFORE[0] == table_value.UNVERSIONED_FORMAT
    assert decode(WRITTEN_BEFORE, CODEC.decode) == e
    again = encode(e, 1234)
    assert again == _as_format_4(WRITTEN_BEFORE, table_value.counts(e))
    assert table_value.counts_of(again) == table_value.counts(e) == (3, 0)  # its claim verdict not counted
    assert table_value.counts_of(WRITTEN_BEFORE) is None
    assert table_value.due_of_value(again) == table_value.due_of_value(WRITTEN_BEFORE) == 1234


def test_compare_row_by_row() -> None:
    """What a store holding one value does with a changelog record arriving after it: keep the value
    held when it has every fact of the record and more, apply the record when it has every fact of
    the value held, merge when each has facts the other lacks; a retired key's marker outranks every
    effect value."""
    e = _written_before_effect()  # intent, claim verdict, executed, receipt: (3, 0)
    v3 = encode(e, None)
    first, _ = apply(None, intent(1, "{}"), T)
    v1 = encode(first, None)  # (1, 0)
    d = Decision("dec-1", KEY, T + 99, 1, DecisionKind.ABANDONED, "ops", "no", None, "alice")
    decided, _ = apply(first, d, T + 99)
    v1d = encode(decided, None)  # (1, 1): a decision the other value has not folded
    marker = retirement.marker_value(Retired.of(e, T + 100))
    KEEP, APPLY, MERGE = table_value.KEEP, table_value.APPLY, table_value.MERGE
    rows = [
        # held, incoming, what the store does
        (v3, v1, KEEP),  # a late record: the value held has all its facts and more
        (v1, v3, APPLY),  # the log's order: newer arrives later
        (v3, v3, APPLY),  # the same facts, taken as faust does
        (v1d, v1, KEEP),
        (v3, v1d, MERGE),  # each has facts the other lacks
        (v1d, v3, MERGE),
        (None, v1, APPLY),  # nothing held
        (v3, None, APPLY),  # a tombstone is applied
        (WRITTEN_BEFORE, v1, APPLY),  # a held value without counts cannot be weighed
        (v3, WRITTEN_BEFORE, APPLY),  # nor an incoming one
        (marker, v3, KEEP),  # nothing brings a retired key back
        (v3, marker, APPLY),
    ]
    for held, incoming, how in rows:
        assert table_value.compare(held, incoming) == how, (
            held[:13] if held else held,
            incoming[:13] if incoming else None,
        )
    assert table_value.counts_of(v1d) == (1, 1)
    assert table_value.counts_of(marker) == table_value.MARKER_COUNTS
    assert table_value.counts_of(b"\x04") is None  # too short to hold a header: not weighed


@pytest.mark.parametrize("orjson", [True, False], ids=["orjson", "stdlib"])
def test_both_json_writers_write_the_same_bytes(orjson: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without orjson (an install without the [processor] extra) the stdlib writes the same value."""
    if not orjson:
        monkeypatch.setattr(table_value, "_dumps", None)
    e = _written_before_effect()
    assert encode(e, 1234) == _as_format_4(WRITTEN_BEFORE, table_value.counts(e))


@pytest.mark.parametrize("text", ["\ud800 lone surrogate", "ok"], ids=["lone surrogate", "plain"])
def test_what_orjson_refuses_is_written_by_the_stdlib(text: str) -> None:
    """orjson refuses a lone surrogate (the stdlib's text keeps it, encoded with surrogatepass), an int
    beyond 64 bits, and writes floats its own way: each goes to the stdlib, and reads back."""
    e = fold([intent(1, text)])
    assert e is not None
    value = encode(e, None)
    assert value == reference_encode(e, None)
    assert decode(value, CODEC.decode) == e
    w = table_value._Writer()
    data = w.dump({"big": 2**70, "float": 0.1})
    assert not w.exact  # a float: the stdlib's text
    assert json.loads(table_value._skeleton(w, data)) == {"#": [["big", 2**70], ["float", 0.1]]}
    w = table_value._Writer()
    assert table_value._skeleton(w, w.dump([2**70])) == b"[1180591620717411303424]"

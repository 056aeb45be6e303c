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
from effect_ledger.processors import table_value
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
    return struct.pack(">BqI", table_value.FORMAT, -1 if due_ms is None else due_ms, len(blobs)) + counted + skeleton


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

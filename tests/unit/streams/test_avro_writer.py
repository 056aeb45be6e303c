"""The compiled Avro writer (``streams/_avro_writer.py``) writes what fastavro writes, byte for byte,
for every record type of the codec and values across each type's range (random, with hypothesis:
300 examples per record type), and refuses what fastavro refuses (and a float in a long, which
fastavro truncates)."""

from __future__ import annotations

import dataclasses
import io
import typing
from enum import StrEnum
from typing import Any

import fastavro
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from effect_ledger.core import model
from effect_ledger.errors import EncodeError
from effect_ledger.streams._avro_writer import compile_record
from effect_ledger.streams.codec import default_codec

CODEC = default_codec()
LONGS = st.one_of(
    st.integers(-(2**63), 2**63 - 1),
    st.sampled_from([0, 1, -1, 63, 64, -64, -65, 127, 128, 2**31 - 1, -(2**31), 1_700_000_000_000]),
)
TEXT = st.one_of(st.text(max_size=80), st.text(min_size=60, max_size=300), st.sampled_from(["", "é", "日本", "🎉"]))


def _strategy(hint: Any) -> st.SearchStrategy[Any]:
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, __import__("types").UnionType):
        inner = [a for a in args if a is not type(None)]
        assert len(inner) == 1, hint
        return st.one_of(st.none(), _strategy(inner[0]))
    if origin is tuple:
        return st.lists(_strategy(args[0]), max_size=5).map(tuple)
    if isinstance(hint, type) and issubclass(hint, StrEnum):
        return st.sampled_from(list(hint))
    if hint is bool:
        return st.booleans()
    if hint is int:
        return LONGS
    if hint is str:
        return TEXT
    if hint is bytes:
        return st.binary(max_size=200)
    raise AssertionError(f"no strategy for {hint}")


def _records(cls: type) -> st.SearchStrategy[Any]:
    hints = typing.get_type_hints(cls)
    return st.builds(cls, **{f.name: _strategy(hints[f.name]) for f in dataclasses.fields(cls)})


def _fastavro(obj: Any) -> bytes:
    w = CODEC._writer(type(obj))
    buf = io.BytesIO()
    buf.write(w.prefix)
    fastavro.schemaless_writer(buf, w.parsed, {n: getattr(obj, n) for n in w.fields})
    return buf.getvalue()


@pytest.mark.parametrize("cls", model.RECORD_TYPES, ids=lambda c: c.__name__)
def test_every_record_type_is_compiled(cls: type) -> None:
    assert CODEC._writer(cls).fast is not None


@pytest.mark.parametrize("cls", model.RECORD_TYPES, ids=lambda c: c.__name__)
def test_the_bytes_are_fastavros(cls: type) -> None:
    @settings(max_examples=300, deadline=None)
    @given(_records(cls))
    def check(obj: Any) -> None:
        expected = _fastavro(obj)
        assert CODEC.encode(obj, validate=False) == expected
        assert CODEC.decode(expected) == obj

    check()


def test_what_fastavro_refuses_is_refused() -> None:
    ok = model.Receipt("e", "k", 1, 1, "re_1", model.ReceiptSource.CALL, "{}")
    for bad in (
        dataclasses.replace(ok, at_ms=2**63),  # past a long
        dataclasses.replace(ok, at_ms=-(2**63) - 1),
        dataclasses.replace(ok, receipt_id=7),  # type: ignore[arg-type]
        dataclasses.replace(ok, source="NOPE"),  # type: ignore[arg-type]
        dataclasses.replace(ok, value="\ud800"),  # a lone surrogate: not UTF-8
    ):
        with pytest.raises(Exception):  # noqa: B017  # whatever fastavro raises, it raises
            _fastavro(bad)
        with pytest.raises(EncodeError):
            CODEC.encode(bad, validate=False)
    # Stricter than fastavro, which writes 1.5 into a long as 1.
    with pytest.raises(EncodeError):
        CODEC.encode(dataclasses.replace(ok, at_ms=1.5), validate=False)  # type: ignore[arg-type]


def test_a_schema_it_cannot_write_is_left_to_fastavro() -> None:
    schema = fastavro.parse_schema({"type": "record", "name": "X", "fields": [{"name": "f", "type": "double"}]})
    assert compile_record(schema) is None
    union = fastavro.parse_schema(
        {"type": "record", "name": "Y", "fields": [{"name": "f", "type": ["null", "string", "long"]}]}
    )
    assert compile_record(union) is None

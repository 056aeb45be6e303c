"""Avro single-object encoding for every effect-ledger record.

Wire format (Avro spec, "Single object encoding"): ``C3 01``, the 8-byte little-endian CRC-64-AVRO
fingerprint of the writer schema's parsing canonical form, then the schemaless Avro body. Any Avro
library can decode it without a schema registry. The schema's full name also travels in the Kafka
header ``HEADER`` so tools can route records without decoding them.

Python objects become dicts only here, at the boundary.
"""

from __future__ import annotations

import dataclasses
import io
from collections.abc import Callable
from enum import StrEnum
from typing import Any, cast, get_type_hints

import fastavro
from fastavro.schema import fingerprint, parse_schema, to_parsing_canonical_form
from fastavro.validation import ValidationError
from fastavro.validation import validate as _validate

from effect_ledger import schemas
from effect_ledger.streams import model

MAGIC = b"\xc3\x01"
HEADER = "effect-ledger.schema"
_PREFIX_LEN = len(MAGIC) + 8


class DecodeError(ValueError):
    """The bytes are not a record this codec knows: wrong magic, unknown fingerprint, truncated or
    trailing bytes, or a body that does not match its schema."""


class EncodeError(ValueError):
    """The object does not fit its schema (a missing field, a wrong type)."""


def schema_fingerprint(schema: dict[str, Any]) -> bytes:
    """CRC-64-AVRO of the parsing canonical form, little-endian, as single-object encoding wants."""
    return bytes.fromhex(fingerprint(to_parsing_canonical_form(parse_schema(schema)), "CRC-64-AVRO"))


@dataclasses.dataclass(frozen=True, slots=True)
class _Writer:
    name: str
    full_name: str
    parsed: Any
    prefix: bytes
    fields: tuple[str, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class _Reader:
    full_name: str
    writer: Any
    reader: Any  # None when writer is the current schema
    build: Callable[[dict[str, Any]], Any]
    model: type


def _builder(cls: type) -> Callable[[dict[str, Any]], Any]:
    """A function from a decoded dict to ``cls``, turning enum strings back into their StrEnum and
    Avro arrays into tuples."""
    hints = get_type_hints(cls)
    converters: dict[str, Callable[[Any], Any]] = {}
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        if isinstance(hint, type) and issubclass(hint, StrEnum):
            converters[f.name] = hint
        elif getattr(hint, "__origin__", None) is tuple:
            converters[f.name] = tuple
    names = [f.name for f in dataclasses.fields(cls)]

    def build(d: dict[str, Any]) -> Any:
        for name, conv in converters.items():
            d[name] = conv(d[name])
        return cls(**{n: d[n] for n in names})

    return build


class Codec:
    """Encodes and decodes the records of ``effect_ledger.streams.model`` with the schemas of ``schemas/``."""

    def __init__(self) -> None:
        self._writers: dict[type, _Writer] = {}
        self._readers: dict[bytes, _Reader] = {}
        self._current: dict[str, Any] = {}
        self._builders: dict[str, Callable[[dict[str, Any]], Any]] = {}
        self._models: dict[str, type] = {}
        for cls in model.RECORD_TYPES:
            raw = schemas.load(cls.__name__)
            parsed = cast(dict[str, Any], parse_schema(raw))
            full = parsed["name"]
            prefix = MAGIC + schema_fingerprint(raw)
            fields = tuple(f["name"] for f in raw["fields"])
            missing = set(fields) ^ {f.name for f in dataclasses.fields(cls)}
            if missing:
                raise RuntimeError(f"schema {full} and model {cls.__name__} disagree on {sorted(missing)}")
            self._writers[cls] = _Writer(cls.__name__, full, parsed, prefix, fields)
            self._current[full] = parsed
            self._builders[full] = _builder(cls)
            self._models[full] = cls
            self._readers[prefix[2:]] = _Reader(full, parsed, None, self._builders[full], cls)
        for raw in schemas.history():
            self.register_writer(raw)

    def register_writer(self, raw: dict[str, Any]) -> bytes:
        """Accept bytes written with an older (or otherwise compatible) writer schema of a known record;
        they are resolved into the current schema on decode. Returns its fingerprint."""
        parsed = cast(dict[str, Any], parse_schema(raw))
        full = parsed["name"]
        if full not in self._current:
            raise ValueError(f"{full} is not a record of this codec")
        fp = schema_fingerprint(raw)
        if fp not in self._readers:
            self._readers[fp] = _Reader(full, parsed, self._current[full], self._builders[full], self._models[full])
        return fp

    def _writer(self, cls: type) -> _Writer:
        try:
            return self._writers[cls]
        except KeyError:
            raise EncodeError(f"{cls.__name__} is not a record of this codec") from None

    def schema_name(self, obj_or_cls: Any) -> str:
        return self._writer(obj_or_cls if isinstance(obj_or_cls, type) else type(obj_or_cls)).full_name

    def encode(self, obj: Any, *, validate: bool = True) -> bytes:
        """``validate``: check every value against the schema first (fastavro's writer does not:
        1.5 into a long, None into a boolean). Only callers that built ``obj`` from typed values
        themselves (the SDK's own events, on its hot path) turn it off."""
        w = self._writer(type(obj))
        record = {n: getattr(obj, n) for n in w.fields}
        if validate:
            try:
                _validate(record, w.parsed, raise_errors=True)
            except ValidationError as e:
                raise EncodeError(f"cannot encode {w.name}: {e}") from e
        buf = io.BytesIO()
        buf.write(w.prefix)
        try:
            fastavro.schemaless_writer(buf, w.parsed, record)
        except (TypeError, ValueError, AttributeError, KeyError, OverflowError) as e:
            raise EncodeError(f"cannot encode {w.name}: {e}") from e
        return buf.getvalue()

    def header(self, obj: Any) -> tuple[str, bytes]:
        """The Kafka header that names the record's schema."""
        return HEADER, self._writer(type(obj)).full_name.encode()

    def decode(self, data: bytes | bytearray | memoryview | None) -> Any:
        r, d = self._decode(data)
        try:
            return r.build(d)
        except (ValueError, TypeError, KeyError) as e:
            raise DecodeError(f"{r.full_name}: decoded fields do not fit the model: {e}") from e

    def decode_fields(self, data: bytes | bytearray | memoryview | None) -> tuple[type, dict[str, Any]]:
        """``decode`` without building the model object: its class and the fields as decoded (enum
        symbols as str, arrays as lists). For readers of millions of records that need a few fields
        of each (``effects audit``): building the object is about half of ``decode``'s cost."""
        r, d = self._decode(data)
        return r.model, d

    def _decode(self, data: bytes | bytearray | memoryview | None) -> tuple[_Reader, dict[str, Any]]:
        if data is None:
            raise DecodeError("no value (null record)")
        data = bytes(data)
        if len(data) < _PREFIX_LEN:
            raise DecodeError(f"{len(data)} bytes is shorter than the single-object header")
        if data[:2] != MAGIC:
            raise DecodeError(f"not Avro single-object encoding (starts {data[:2].hex()}, expected c301)")
        fp = data[2:_PREFIX_LEN]
        r = self._readers.get(fp)
        if r is None:
            raise DecodeError(f"unknown schema fingerprint {fp.hex()}")
        buf = io.BytesIO(data)
        buf.seek(_PREFIX_LEN)
        try:
            d = fastavro.schemaless_reader(buf, r.writer, r.reader)
        except Exception as e:  # fastavro raises EOFError, UnicodeDecodeError, IndexError, ...
            raise DecodeError(f"cannot decode {r.full_name}: {type(e).__name__}: {e}") from e
        if buf.tell() != len(data):
            raise DecodeError(f"{r.full_name}: {len(data) - buf.tell()} trailing bytes after the record")
        return r, d  # type: ignore[return-value]


_default: Codec | None = None


def default_codec() -> Codec:
    """A process-wide codec (building one parses every schema)."""
    global _default
    if _default is None:
        _default = Codec()
    return _default

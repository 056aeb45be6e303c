"""Avro single-object encoding for every effect-ledger record.

Wire format (Avro spec, "Single object encoding"): ``C3 01``, the 8-byte little-endian CRC-64-AVRO
fingerprint of the writer schema's parsing canonical form, then the schemaless Avro body. Any Avro
library can decode it without a schema registry. The schema's full name also travels in the Kafka
header ``HEADER`` so tools can route records without decoding them.

Schemas evolve under ``schemas/COMPATIBILITY.md``: every released writer schema
(``schemas/history/``) decodes, resolved into the current reader schema. A writer schema newer than
this release is learned at run time: a codec given a ``resolver`` (``effect_ledger.streams.schema_topic``
reads the compacted ``effects.schemas`` topic, keyed by fingerprint) asks it once per unknown
fingerprint, and raises ``UnknownSchema`` when it has no answer.

Optionally (``registry``, see ``effect_ledger.streams.registry``) records are framed the Confluent
Schema Registry way instead: byte ``0``, the 4-byte big-endian schema id, the same body. A codec with
a registry decodes both framings; ``frame_writes`` makes ``encode`` (and ``to_wire``) write it.

Python objects become dicts only here, at the boundary.
"""

from __future__ import annotations

import dataclasses
import io
from collections.abc import Callable
from enum import StrEnum
from typing import Any, Protocol, cast, get_type_hints

import fastavro
from fastavro.schema import fingerprint, parse_schema, to_parsing_canonical_form
from fastavro.validation import ValidationError
from fastavro.validation import validate as _validate

from effect_ledger import schemas
from effect_ledger.core import model
from effect_ledger.errors import DecodeError, EncodeError, LedgerError, UnknownSchema
from effect_ledger.streams._avro_writer import compile_record

MAGIC = b"\xc3\x01"
HEADER = "effect-ledger.schema"
_PREFIX_LEN = len(MAGIC) + 8
#: Confluent Schema Registry framing: this byte, then the schema id (4 bytes, big-endian), the body.
REGISTRY_MAGIC = b"\x00"
_REGISTRY_PREFIX_LEN = 5


class Registry(Protocol):
    """What framing needs of a schema registry (``effect_ledger.streams.registry.RegistryClient``)."""

    def register(self, raw: dict[str, Any]) -> int: ...

    def schema(self, schema_id: int) -> dict[str, Any]: ...


#: Asked for the writer schema of an unknown fingerprint (8 bytes, as in the header): the schema as
#: parsed JSON, or None when it is not there; raises LookupError (with the reason) when it could
#: not look. Called once per fingerprint per codec, again only after it found nothing.
Resolver = Callable[[bytes], "dict[str, Any] | None"]


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
    # The compiled writer (``avro_writer``): header and body, as fastavro would write them.
    fast: Callable[[Any], bytes] | None


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
    """Encodes and decodes the records of ``effect_ledger.core.model`` with the schemas of ``schemas/``."""

    def __init__(
        self, resolver: Resolver | None = None, registry: Registry | None = None, frame_writes: bool = False
    ) -> None:
        """``resolver``: where unknown writer schemas are looked up. ``registry``: a Schema Registry,
        to read (and with ``frame_writes``, to write) the registry framing."""
        if frame_writes and registry is None:
            raise ValueError("frame_writes needs a registry")
        self.resolver = resolver
        self.registry = registry
        self.frame_writes = frame_writes
        self._registry_ids: dict[bytes, int] = {}  # fingerprint -> schema id
        self._by_registry_id: dict[int, bytes] = {}  # schema id -> fingerprint
        self._known: dict[bytes, dict[str, Any]] = {}  # fingerprint -> writer schema as JSON
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
            fast = compile_record(parsed, prefix)
            self._writers[cls] = _Writer(cls.__name__, full, parsed, prefix, fields, fast)
            self._current[full] = parsed
            self._builders[full] = _builder(cls)
            self._models[full] = cls
            self._readers[prefix[2:]] = _Reader(full, parsed, None, self._builders[full], cls)
            self._known[prefix[2:]] = raw
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
            self._known[fp] = raw
        return fp

    def knows(self, fp: bytes) -> bool:
        """Whether records with this writer fingerprint decode without asking the resolver."""
        return fp in self._readers

    def writer_schemas(self) -> dict[bytes, dict[str, Any]]:
        """Every writer schema this codec knows, by fingerprint: the current ones (what it writes),
        the released history, and any learned at run time. What a writer publishes to
        ``effects.schemas``."""
        return dict(self._known)

    def fingerprint_of(self, obj_or_cls: Any) -> bytes:
        """The 8-byte fingerprint this codec writes for a record type."""
        return self._writer(obj_or_cls if isinstance(obj_or_cls, type) else type(obj_or_cls)).prefix[2:]

    def _learn(self, fp: bytes) -> _Reader:
        """The reader for an unknown fingerprint, from the resolver; UnknownSchema when there is none
        or its answer is not a schema of a record this release knows."""
        if self.resolver is None:
            raise UnknownSchema(fp)
        try:
            raw = self.resolver(fp)
        except LookupError as e:
            raise UnknownSchema(fp, f" (and the schemas could not be looked up: {e})") from e
        if raw is None:
            raise UnknownSchema(fp, " (not in the schemas topic either)")
        try:
            got = schema_fingerprint(raw)
        except Exception as e:  # fastavro raises several types for a malformed schema
            raise UnknownSchema(fp, f" (the schema found for it does not parse: {e})") from e
        if got != fp:
            raise UnknownSchema(fp, f" (the schema found for it has fingerprint {got.hex()})")
        try:
            self.register_writer(raw)
        except ValueError as e:
            raise UnknownSchema(fp, f" ({e})") from e
        return self._readers[fp]

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
        if not validate and w.fast is not None:
            try:
                data = w.fast(obj)
            except (TypeError, ValueError, AttributeError, KeyError, OverflowError) as e:
                raise EncodeError(f"cannot encode {w.name}: {e}") from e
            return self.to_wire(data) if self.frame_writes else data
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
        return self.to_wire(buf.getvalue()) if self.frame_writes else buf.getvalue()

    def register_all(self) -> None:
        """Register every current writer schema with the registry now, so that ``encode`` never waits
        on it. Raises the registry's LedgerError."""
        if self.registry is not None:
            for w in self._writers.values():
                self._registry_id(w.prefix[2:])

    def _registry_id(self, fp: bytes) -> int:
        schema_id = self._registry_ids.get(fp)
        if schema_id is None:
            assert self.registry is not None
            schema_id = self.registry.register(self._known[fp])
            self._registry_ids[fp] = schema_id
            self._by_registry_id[schema_id] = fp
        return schema_id

    def to_wire(self, data: bytes) -> bytes:
        """The bytes to produce for a single-object-encoded record: unchanged, or with
        ``frame_writes`` the registry framing (what the relay does to the outbox's rows)."""
        if not self.frame_writes or data[:1] == REGISTRY_MAGIC:
            return data
        fp = data[2:_PREFIX_LEN]
        if fp not in self._known:
            raise EncodeError(f"no schema for fingerprint {fp.hex()} to register")
        return REGISTRY_MAGIC + self._registry_id(fp).to_bytes(4, "big") + data[_PREFIX_LEN:]

    def _unframe(self, data: bytes) -> bytes:
        """Registry framing -> single-object encoding, learning the schema id from the registry."""
        if len(data) < _REGISTRY_PREFIX_LEN:
            raise DecodeError(f"{len(data)} bytes is shorter than the schema registry header")
        schema_id = int.from_bytes(data[1:_REGISTRY_PREFIX_LEN], "big")
        fp = self._by_registry_id.get(schema_id)
        if fp is None:
            if self.registry is None:
                raise DecodeError(
                    f"not Avro single-object encoding (starts {data[:2].hex()}, expected c301): byte 0 starts "
                    f"the Schema Registry framing (schema id {schema_id}), which this reader reads only with "
                    "a schema registry (--schema-registry URL, EFFECTS_SCHEMA_REGISTRY)"
                )
            try:
                raw = self.registry.schema(schema_id)
                fp = self.register_writer(raw)
            except (LedgerError, ValueError) as e:
                raise DecodeError(f"Schema Registry schema id {schema_id}: {e}") from e
            self._by_registry_id[schema_id] = fp
            self._registry_ids.setdefault(fp, schema_id)
        return MAGIC + fp + data[_REGISTRY_PREFIX_LEN:]

    def header(self, obj: Any) -> tuple[str, bytes]:
        """The Kafka header that names the record's schema."""
        return HEADER, self._writer(type(obj)).full_name.encode()

    def decode(self, data: bytes | bytearray | memoryview | None) -> Any:
        """The model object of one single-object-encoded record, resolved from its writer schema into
        the current one. Raises DecodeError (UnknownSchema for an unknown writer schema)."""
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
        if data[:1] == REGISTRY_MAGIC:
            data = self._unframe(data)
        if len(data) < _PREFIX_LEN:
            raise DecodeError(f"{len(data)} bytes is shorter than the single-object header")
        if data[:2] != MAGIC:
            raise DecodeError(f"not Avro single-object encoding (starts {data[:2].hex()}, expected c301)")
        fp = data[2:_PREFIX_LEN]
        r = self._readers.get(fp)
        if r is None:
            r = self._learn(fp)
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

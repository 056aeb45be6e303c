"""The Schema Registry wire format in the codec (byte 0 + 4-byte big-endian schema id + the Avro
body) and the registry client over real HTTP on loopback (``tests/registry_server.py``)."""

from __future__ import annotations

import io
import json

import fastavro
import pytest

from effect_ledger import schemas
from effect_ledger.core import model as m
from effect_ledger.errors import DecodeError, RegistryError
from effect_ledger.streams.codec import Codec, schema_fingerprint
from effect_ledger.streams.registry import RegistryClient
from tests.registry_server import RegistryServer
from tests.unit.streams.test_codec import SAMPLES


@pytest.fixture(scope="module")
def registry() -> RegistryServer:
    with RegistryServer() as r:
        yield r  # type: ignore[misc]


@pytest.mark.parametrize("obj", SAMPLES, ids=lambda o: type(o).__name__)
def test_framed_records_round_trip_and_are_plain_avro_behind_the_id(registry: RegistryServer, obj: object) -> None:
    writer = Codec(registry=RegistryClient(registry.url), frame_writes=True)
    data = writer.encode(obj)
    assert data[0] == 0
    schema_id = int.from_bytes(data[1:5], "big")
    text = registry.schemas[schema_id]
    assert schema_fingerprint(json.loads(text)) == Codec().fingerprint_of(obj)
    # What any registry consumer does: the schema by id, the rest is the schemaless body.
    body = fastavro.schemaless_reader(io.BytesIO(data[5:]), fastavro.parse_schema(json.loads(text)))
    assert body["effect_id" if hasattr(obj, "effect_id") else "consumer"] == getattr(
        obj, "effect_id", getattr(obj, "consumer", None)
    )
    # A reader that knows the registry decodes it (learning the id once); the single-object bytes
    # and the framed ones give the same record.
    reader = Codec(registry=RegistryClient(registry.url))
    assert reader.decode(data) == obj == reader.decode(Codec().encode(obj))


def test_to_wire_reframes_single_object_bytes_once(registry: RegistryServer) -> None:
    writer = Codec(registry=RegistryClient(registry.url), frame_writes=True)
    single = Codec().encode(SAMPLES[0])
    framed = writer.to_wire(single)
    assert framed[0] == 0 and framed[5:] == single[10:] and writer.to_wire(framed) == framed
    assert Codec().to_wire(single) == single  # no registry: unchanged


def test_subject_is_the_record_full_name(registry: RegistryServer) -> None:
    Codec(registry=RegistryClient(registry.url), frame_writes=True).register_all()
    assert {f"effect_ledger.{n}" for n in schemas.NAMES} <= set(registry.subjects)


def test_framed_bytes_without_a_registry_are_a_typed_error(registry: RegistryServer) -> None:
    data = Codec(registry=RegistryClient(registry.url), frame_writes=True).encode(SAMPLES[0])
    with pytest.raises(
        DecodeError, match=r"not Avro single-object.*Schema Registry framing \(schema id \d+\).*--schema-registry"
    ):
        Codec().decode(data)


def test_unknown_schema_id_is_a_typed_error(registry: RegistryServer) -> None:
    data = b"\x00" + (999_999).to_bytes(4, "big") + b"\x02"
    with pytest.raises(DecodeError, match="schema id 999999.*HTTP 404"):
        Codec(registry=RegistryClient(registry.url)).decode(data)


def test_registry_client_errors_are_typed() -> None:
    with pytest.raises(RegistryError, match="http:// or https://"):
        RegistryClient("ftp://x")
    with pytest.raises(RegistryError, match="unreachable"):
        RegistryClient("http://127.0.0.1:1", timeout=2).register(schemas.load("Intent"))


def test_frame_writes_needs_a_registry() -> None:
    with pytest.raises(ValueError, match="needs a registry"):
        Codec(frame_writes=True)


def test_decision_model_is_registered_with_its_defaults(registry: RegistryServer) -> None:
    """The registered schema is the full writer schema (defaults and docs), not the canonical form."""
    client = RegistryClient(registry.url)
    sid = client.register(schemas.load("Decision"))
    assert client.schema(sid) == schemas.load("Decision")
    assert m.DecisionKind.ABANDONED.value == client.schema(sid)["fields"][4]["type"]["default"]

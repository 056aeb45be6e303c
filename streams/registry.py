"""Optional Confluent Schema Registry wire format, for shops whose consumers expect it.

With a registry configured (``--schema-registry URL``, ``EFFECTS_SCHEMA_REGISTRY``, or
``KafkaConfig(schema_registry=URL)``), every writer registers each writer schema it uses under the
subject of the record's full name (the registry's *RecordNameStrategy*: ``effect_ledger.EffectState``,
``effect_ledger.Intent``, ...; one topic carries several record types) and frames records the
standard way: byte ``0``, the 4-byte big-endian schema id, the Avro body. Stock deserializers
(``confluent_kafka.schema_registry.avro.AvroDeserializer``, Java's ``KafkaAvroDeserializer``) read
them. effect-ledger's own readers accept both framings.

Only the two REST calls that framing needs are used: ``POST /subjects/{subject}/versions`` and
``GET /schemas/ids/{id}``. Answers are bounded (``MAX_ANSWER_BYTES``), every call has a timeout,
and every failure is a ``RegistryError``.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from effect_ledger.errors import RegistryError

#: A registry answer larger than this is refused (a schema of ours is ~1-2 KiB).
MAX_ANSWER_BYTES = 1024 * 1024
CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"


class RegistryClient:
    """A minimal client of a Confluent-compatible Schema Registry (``url``: its base URL)."""

    def __init__(self, url: str, timeout: float = 10.0) -> None:
        if not url.startswith(("http://", "https://")):
            raise RegistryError(f"schema registry {url!r}: give an http:// or https:// URL")
        self.url = url.rstrip("/")
        self.timeout = timeout

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(
            self.url + path, data=data, method=method, headers={"Content-Type": CONTENT_TYPE, "Accept": CONTENT_TYPE}
        )
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:  # noqa: S310 - http(s) checked above
                raw = resp.read(MAX_ANSWER_BYTES + 1)
        except urllib.error.HTTPError as e:
            detail = e.read(4096).decode("utf-8", "replace")
            raise RegistryError(f"schema registry {method} {path}: HTTP {e.code}: {detail[:300]}") from e
        except (urllib.error.URLError, OSError) as e:
            raise RegistryError(f"schema registry at {self.url} unreachable: {e}") from e
        if len(raw) > MAX_ANSWER_BYTES:
            raise RegistryError(f"schema registry {method} {path}: answer over {MAX_ANSWER_BYTES} bytes")
        try:
            return json.loads(raw)
        except ValueError as e:
            raise RegistryError(f"schema registry {method} {path}: not JSON: {e}") from e

    def register(self, raw: dict[str, Any]) -> int:
        """Register writer schema ``raw`` under its record's full name; returns its schema id (the same
        id again for a schema the registry already has)."""
        subject = f"{raw.get('namespace', '')}.{raw['name']}".lstrip(".")
        path = f"/subjects/{urllib.parse.quote(subject, safe='')}/versions"
        got = self._call("POST", path, {"schema": json.dumps(raw), "schemaType": "AVRO"})
        if not isinstance(got, dict) or not isinstance(got.get("id"), int):
            raise RegistryError(f"schema registry POST {path}: no schema id in {str(got)[:200]}")
        return int(got["id"])

    def schema(self, schema_id: int) -> dict[str, Any]:
        """The schema registered under ``schema_id``, as parsed JSON."""
        got = self._call("GET", f"/schemas/ids/{schema_id}")
        try:
            parsed = json.loads(got["schema"])
        except (TypeError, KeyError, ValueError) as e:
            raise RegistryError(f"schema registry: schema id {schema_id} is not an Avro schema: {e}") from e
        if not isinstance(parsed, dict):
            raise RegistryError(f"schema registry: schema id {schema_id} is not a record schema")
        return parsed

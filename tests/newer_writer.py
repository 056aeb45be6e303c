"""A writer from a future release, for the schema-evolution tests: its schemas add a field with a
default and an enum symbol to today's, as ``schemas/COMPATIBILITY.md`` allows. It encodes plain
dicts with fastavro and frames them itself, the way another codebase would."""

from __future__ import annotations

import copy
import io
from typing import Any

import fastavro

from effect_ledger import schemas
from effect_ledger.streams.codec import MAGIC, schema_fingerprint


def newer(name: str) -> dict[str, Any]:
    """Today's schema ``name`` with one more field (``region``, default "eu") and, where the record has
    an enum, one more symbol in it (``<ENUM>_NEXT``)."""
    s = copy.deepcopy(schemas.load(name))
    s["fields"].append({"name": "region", "type": "string", "default": "eu"})
    for f in s["fields"]:
        if isinstance(f["type"], dict) and f["type"].get("type") == "enum":
            f["type"]["symbols"].append(f"{f['type']['name'].upper()}_NEXT")
    return s


def encode(schema: dict[str, Any], record: dict[str, Any]) -> bytes:
    """Single-object encoding of ``record`` with ``schema`` (validated)."""
    parsed = fastavro.parse_schema(copy.deepcopy(schema))
    assert fastavro.validate(record, parsed)
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, parsed, record)
    return MAGIC + schema_fingerprint(schema) + buf.getvalue()

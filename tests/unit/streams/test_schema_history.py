"""The compatibility policy (``schemas/COMPATIBILITY.md``) across every released schema version.

Two independent checks per (writer, reader) pair of versions of each record, both directions: the
Apache ``avro`` package's ``ReaderWriterCompatibilityChecker`` (the Python port of Java's
``SchemaCompatibility``), and real records of the writer version -- every enum symbol, optional
fields set and unset -- written by fastavro and resolved into the reader version. A deliberately
incompatible change must fail both, so the checks can fail. ``make schemas-check`` runs Java's own
checker over the same pairs."""

from __future__ import annotations

import copy
import io
import itertools
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import fastavro
import pytest
from avro.compatibility import ReaderWriterCompatibilityChecker, SchemaCompatibilityType
from avro.schema import parse as avro_parse

from effect_ledger import schemas
from effect_ledger.streams.codec import Codec, schema_fingerprint

VERSIONS = schemas.versions()
LATEST = max(VERSIONS)


def _all_schemas(name: str) -> list[tuple[str, dict[str, Any]]]:
    """Every released version of record ``name`` plus the current file."""
    found = [(f"v{n}", v[name]) for n, v in VERSIONS.items() if name in v]
    return [*found, ("current", schemas.load(name))]


PAIRS = [
    pytest.param(name, w, r, id=f"{name}:{w[0]}->{r[0]}")
    for name in schemas.NAMES
    for w, r in itertools.product(_all_schemas(name), repeat=2)
]


def _enums(t: Any) -> list[dict[str, Any]]:
    if isinstance(t, list):
        return [e for x in t for e in _enums(x)]
    if isinstance(t, dict):
        if t.get("type") == "enum":
            return [t]
        return (
            [e for f in t.get("fields", []) for e in _enums(f["type"])]
            + _enums(t.get("items"))
            + _enums(t.get("type") if isinstance(t.get("type"), (dict, list)) else None)
        )
    return []


def test_versions_are_complete_and_the_newest_is_the_current_set() -> None:
    assert min(VERSIONS) == 0 and list(VERSIONS) == list(range(LATEST + 1)), "no gaps in history/v<N>"
    for n, v in VERSIONS.items():
        # A record introduced later (Retirement, in v2) is missing from older versions; none is ever
        # dropped, so every version holds only current records, and v1 on holds every v1 record.
        assert set(v) <= set(schemas.NAMES), f"v{n} holds a record that is no longer current"
        if n >= 2:
            assert set(VERSIONS[n - 1]) <= set(v), f"v{n} dropped a record of v{n - 1}"
    # A change to a current .avsc without a new history version would ship an unrecorded release.
    assert VERSIONS[LATEST] == {n: schemas.load(n) for n in schemas.NAMES}


def test_every_enum_has_a_default_among_its_symbols() -> None:
    for name in schemas.NAMES:
        for e in _enums(schemas.load(name)):
            assert "default" in e, f"{name}: enum {e['name']} has no default"
            assert e["default"] in e["symbols"], f"{name}: enum {e['name']} default is not a symbol"


def test_no_enum_symbol_is_ever_removed() -> None:
    """Avro lets a reader with an enum default read a removed symbol (as the default); the policy does
    not: an old writer's symbol would silently change meaning."""
    for name in schemas.NAMES:
        current = {e["name"]: set(e["symbols"]) for e in _enums(schemas.load(name))}
        for n, v in VERSIONS.items():
            for e in _enums(v.get(name, {})):
                assert set(e["symbols"]) <= current[e["name"]], f"{name}: v{n} symbol of {e['name']} removed"


def test_v2_changes_no_fingerprint_of_v1() -> None:
    """Enum defaults are not part of the parsing canonical form: v1 and v2 bytes are identical."""
    for name in VERSIONS[1]:
        assert schema_fingerprint(VERSIONS[1][name]) == schema_fingerprint(VERSIONS[2][name])


def _compatible(writer: dict[str, Any], reader: dict[str, Any]) -> tuple[bool, str]:
    result = ReaderWriterCompatibilityChecker().get_compatibility(
        avro_parse(json.dumps(reader)), avro_parse(json.dumps(writer))
    )
    return result.compatibility is SchemaCompatibilityType.compatible, str(result.messages)


# --- real records through fastavro's reader/writer resolution ----------------------------------------


def _values(t: Any, i: int) -> Any:
    """The i-th sample value of Avro type ``t``: cycles enum symbols and union branches so a handful of
    records covers every symbol and both sides of every optional field."""
    if isinstance(t, list):
        branch = t[i % len(t)]
        return _values(branch, i // len(t))
    if isinstance(t, dict):
        kind = t["type"]
        if kind == "enum":
            return t["symbols"][i % len(t["symbols"])]
        if kind == "array":
            return [_values(t["items"], i + k) for k in range(i % 3)]
        if kind == "record":
            return {f["name"]: _values(f["type"], i + k) for k, f in enumerate(t["fields"])}
        return _values(kind, i)
    return {
        "null": None,
        "boolean": i % 2 == 0,
        "int": i * 7 - 3,
        "long": 1_700_000_000_000 + i,
        "string": f"s{i}-ü",
        "bytes": bytes([i % 256, 0xC3]),
    }[t]


def _records(schema: dict[str, Any]) -> list[dict[str, Any]]:
    n = max([len(e["symbols"]) for e in _enums(schema)] + [4]) * 2
    return [_values(schema, i) for i in range(n)]


def _expected(writer: dict[str, Any], reader: dict[str, Any], record: dict[str, Any]) -> dict[str, Any]:
    """What Avro resolution must give: the writer's value for fields both have (an unknown enum symbol
    becomes the reader enum's default), the reader's default for fields only the reader has."""
    out: dict[str, Any] = {}
    writer_fields = {f["name"]: f for f in writer["fields"]}
    for f in reader["fields"]:
        if f["name"] not in writer_fields:
            out[f["name"]] = copy.deepcopy(f["default"])
            continue
        value = record[f["name"]]
        for e in _enums(f["type"]):
            if (
                value not in e["symbols"]
                and isinstance(value, str)
                and value in _enum_symbols(writer_fields[f["name"]])
            ):
                value = e["default"]
        out[f["name"]] = value
    return out


def _enum_symbols(field: dict[str, Any]) -> list[str]:
    return [s for e in _enums(field["type"]) for s in e["symbols"]]


def _resolve(writer: dict[str, Any], reader: dict[str, Any], record: dict[str, Any]) -> Any:
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, fastavro.parse_schema(copy.deepcopy(writer)), record)
    buf.seek(0)
    back = fastavro.schemaless_reader(
        buf, fastavro.parse_schema(copy.deepcopy(writer)), fastavro.parse_schema(copy.deepcopy(reader))
    )
    assert buf.tell() == len(buf.getvalue()), "resolution must consume the whole body"
    return back


@pytest.mark.parametrize(("name", "w", "r"), PAIRS)
def test_every_writer_version_is_readable_by_every_reader_version(
    name: str, w: tuple[str, dict[str, Any]], r: tuple[str, dict[str, Any]]
) -> None:
    writer, reader = w[1], r[1]
    ok, why = _compatible(writer, reader)
    assert ok, f"{name}: reader {r[0]} cannot read writer {w[0]}: {why}"
    for record in _records(writer):
        assert _resolve(writer, reader, record) == _expected(writer, reader, record)


# --- the checks can fail -----------------------------------------------------------------------------


def _next_release(name: str) -> dict[str, Any]:
    return copy.deepcopy(schemas.load(name))


def test_a_field_added_with_a_default_and_an_enum_symbol_pass() -> None:
    """The two changes the rolling-upgrade test relies on: readable by every released reader that has
    enum defaults, old records readable by the new reader."""
    new = _next_release("Executed")
    new["fields"].append({"name": "region", "type": "string", "default": "eu"})
    new["fields"][4]["type"]["symbols"].append("PARTIAL")
    for _, old in _all_schemas("Executed")[2:]:  # v2 onwards: the enum defaults
        assert _compatible(new, old)[0] and _compatible(old, new)[0]
        for record in _records(new):
            back = _resolve(new, old, record)
            assert back["outcome"] == ("UNKNOWN" if record["outcome"] == "PARTIAL" else record["outcome"])
    # v1 had no enum defaults: exactly what the policy's v2 fixed.
    assert not _compatible(new, VERSIONS[1]["Executed"])[0]


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(lambda s: s["fields"].append({"name": "x", "type": "string"}), id="field-without-default"),
        pytest.param(
            lambda s: (
                s["fields"][4]["type"].update(symbols=["OK", "FAILED", "TIMEOUT"], default=None)
                or s["fields"][4]["type"].pop("default")
            ),
            id="enum-symbol-renamed-default-dropped",
        ),
        pytest.param(lambda s: s["fields"][2].update(type="int"), id="long-narrowed-to-int"),
        pytest.param(lambda s: s["fields"].pop(0), id="field-without-default-removed"),
    ],
)
def test_an_incompatible_change_is_caught(change: Any) -> None:
    new = _next_release("Executed")
    change(new)
    old = schemas.load("Executed")
    assert not (_compatible(new, old)[0] and _compatible(old, new)[0])
    with pytest.raises(Exception):  # noqa: B017,PT011 - fastavro raises several types; any failure counts
        for a, b in ((new, old), (old, new)):
            for record in _records(a):
                assert _resolve(a, b, record) == _expected(a, b, record)


def test_the_codec_accepts_every_released_writer() -> None:
    codec = Codec()
    for v in VERSIONS.values():
        for raw in v.values():
            assert codec.knows(schema_fingerprint(raw))


@pytest.mark.skipif(
    not (shutil.which("java") and shutil.which("mvn")), reason="needs java and mvn (Apache Avro's Java checker)"
)
def test_official_java_checker_agrees() -> None:
    """``make schemas-check``: Apache Avro's own SchemaCompatibility over every pair, and Java's
    parsingFingerprint64 equal to ours."""
    root = Path(__file__).resolve().parents[3]
    run = subprocess.run(
        ["bash", str(root / "scripts/schemas-check.sh")],
        capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHON": sys.executable},
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    assert " 0 incompatible" in run.stdout
    assert f"equals the Python codec's for all {len(schemas.NAMES)} records" in run.stdout

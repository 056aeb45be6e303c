"""The processor table's value: one folded effect, bounded.

Layout (format 2)::

    >B  format (2)
    >q  due_ms (-1: nothing due), read without decoding the rest when the deadline index is rebuilt
    >I  number of blobs, then each blob as >I length + UTF-8 bytes
    JSON of the folded ``Effect``, every string of BLOB_BYTES or more replaced by {"$": i}

The ``Effect`` is serialized generically (every dataclass field, nested dataclasses tagged with
their class name, enums by value), so a field added to ``Effect`` or to an event survives a round
trip without a change here. Large strings (requests, receipt values) go to blobs, stored once
however many fields repeat them (an effect's latest intent is also one of its facts).

Bounded by construction: ``slim`` keeps a payload (an intent's request, a receipt's or a
resolution's value) only where the fold reads it (the latest intent's request, for reconcilers,
and the earliest receipt's value, returned to callers); any other payload of ``ELIDE_OVER`` bytes
or more is replaced by a short marker with its size and sha256 (a marker that keeps saying
"inexact" when the value did, since the fold flags that). ``encode`` then refuses, with
``TableValueTooLarge``, any value over ``MAX_TABLE_VALUE_BYTES``: the processor dead-letters the
event that would have made it so, instead of writing it (so the table's changelog, limited by
Kafka's record size, never refuses a write, and a table rebuilt from it agrees with the fold).

Format 1 (the events of the key, concatenated) is still read, so a table written by an earlier
release is folded into format 2 the next time its key changes.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
import struct
import sys
import types
import typing
from collections.abc import Callable
from functools import cache
from typing import Any

from effect_ledger.streams import effect as effect_mod
from effect_ledger.streams import model as model_mod
from effect_ledger.streams.effect import Effect, apply
from effect_ledger.streams.limits import MAX_TABLE_VALUE_BYTES
from effect_ledger.streams.model import INEXACT, INEXACT_PREFIX, Intent, Receipt, Resolution, is_event

FORMAT = 2
LEGACY_FORMAT = 1
_HEADER = struct.Struct(">Bq")  # format, due_ms (-1: nothing due)
_COUNT = struct.Struct(">I")
BLOB_BYTES = 512  # strings this long or longer are stored as blobs (deduplicated, unescaped)
ELIDE_OVER = 1024  # payloads the fold does not read are replaced by a marker from this size on
ELIDED = "effect_ledger.elided"  # the key of the marker of a payload left out of the table


class TableValueTooLarge(ValueError):
    """The effect, even slimmed, does not fit in ``MAX_TABLE_VALUE_BYTES``."""

    def __init__(self, effect_id: str, size: int) -> None:
        super().__init__(
            f"the table value of {effect_id!r} would be {size} bytes, over the {MAX_TABLE_VALUE_BYTES}-byte limit"
        )
        self.size = size


# -- slimming -----------------------------------------------------------------------------------


def elided(value: str) -> str:
    """The marker that stands for a payload the table does not keep: its size and sha256. A value
    the fold flags as inexact (see limits.py) stays marked inexact."""
    data = value.encode("utf-8", "surrogatepass")
    body = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    key = INEXACT if value.startswith(INEXACT_PREFIX) else ELIDED
    return json.dumps({key: {"reason": "left out of the processor's table", **body}}, sort_keys=True)


def _slim_fact(f: Any, keep: set[int]) -> Any:
    if id(f) in keep:
        return f
    if isinstance(f, Intent) and len(f.request) >= ELIDE_OVER:
        return dataclasses.replace(f, request=elided(f.request))
    if isinstance(f, Receipt | Resolution) and f.value is not None and len(f.value) >= ELIDE_OVER:
        return dataclasses.replace(f, value=elided(f.value))
    return f


def slim(effect: Effect) -> Effect:
    """``effect`` with only the payloads the fold reads: the latest intent's request and the
    earliest receipt's value. Its state, flags, receipt and every fact's identity are unchanged."""
    keep = {id(effect.intent)}
    r = effect.receipt
    if r is not None:
        for f in effect.facts:
            if isinstance(f, Receipt | Resolution) and f.receipt_id == r.receipt_id and f.value == r.value:
                keep.add(id(f))
                break
    facts = tuple(_slim_fact(f, keep) for f in effect.facts)
    if all(a is b for a, b in zip(facts, effect.facts, strict=True)):
        return effect
    first = effect.first_intent
    if first is not None and first is not effect.intent:
        first = _slim_fact(first, set())
    return dataclasses.replace(effect, facts=facts, first_intent=first)


# -- generic serialization -------------------------------------------------------------------------


@cache
def _classes() -> dict[str, type]:
    """Every dataclass of the model and of the fold, by name: what a tagged object may be."""
    out: dict[str, type] = {}
    for mod in (model_mod, effect_mod):
        for name, obj in vars(mod).items():
            if isinstance(obj, type) and dataclasses.is_dataclass(obj):
                out[name] = obj
    return out


@cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls, vars(sys.modules[cls.__module__]))


def _dump(obj: Any, blobs: dict[str, int]) -> Any:
    if isinstance(obj, str):
        if len(obj) < BLOB_BYTES:
            return obj
        return {"$": blobs.setdefault(obj, len(blobs))}
    if obj is None or isinstance(obj, bool | int | float):
        return obj
    if isinstance(obj, enum.Enum):
        return obj.value
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        out: dict[str, Any] = {"@": type(obj).__name__}
        for f in dataclasses.fields(obj):
            out[f.name] = _dump(getattr(obj, f.name), blobs)
        return out
    if isinstance(obj, tuple | list | frozenset | set):
        items = sorted(obj) if isinstance(obj, frozenset | set) else obj
        return [_dump(x, blobs) for x in items]
    if isinstance(obj, dict):
        return {"#": [[_dump(k, blobs), _dump(v, blobs)] for k, v in obj.items()]}
    raise TypeError(f"cannot store a {type(obj).__name__} in the table")


def _load(data: Any, hint: Any, blobs: list[str]) -> Any:
    if isinstance(data, dict):
        if "$" in data:
            return blobs[data["$"]]
        if "@" in data:
            cls = _classes()[data["@"]]
            hints = _hints(cls)
            # A field this release does not know is dropped; one it knows but the value lacks takes
            # its default (the dataclass raises when it has none).
            kwargs = {k: _load(v, hints[k], blobs) for k, v in data.items() if k in hints}
            return cls(**kwargs)
    if data is None:
        return None
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in args if a is not type(None)]
        return _load(data, options[0], blobs) if len(options) == 1 else data
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return hint(data)
    if origin is tuple and args and (len(args) != 2 or args[1] is not Ellipsis):
        return tuple(_load(x, h, blobs) for x, h in zip(data, args, strict=False))
    if origin in (tuple, list, frozenset, set):
        inner = args[0] if args else Any
        return origin(_load(x, inner, blobs) for x in data)
    if origin is dict and isinstance(data, dict):
        kh, vh = args if args else (Any, Any)
        return {_load(k, kh, blobs): _load(v, vh, blobs) for k, v in data["#"]}
    return data


# -- the value ------------------------------------------------------------------------------------


def encode(effect: Effect, due_ms: int | None) -> bytes:
    """The table value of ``effect`` (slimmed). ``TableValueTooLarge`` over the limit."""
    blobs: dict[str, int] = {}
    skeleton = json.dumps(_dump(slim(effect), blobs), separators=(",", ":"), ensure_ascii=False).encode(
        "utf-8", "surrogatepass"
    )
    parts = [_HEADER.pack(FORMAT, -1 if due_ms is None else due_ms), _COUNT.pack(len(blobs))]
    for text in blobs:  # dicts keep insertion order: index i is the i-th blob
        data = text.encode("utf-8", "surrogatepass")
        parts += [_COUNT.pack(len(data)), data]
    parts.append(skeleton)
    value = b"".join(parts)
    if len(value) > MAX_TABLE_VALUE_BYTES:
        raise TableValueTooLarge(effect.effect_id, len(value))
    return value


def due_of_value(value: bytes) -> int | None:
    """The due time in a value's header (both formats), without decoding the effect."""
    _, due = _HEADER.unpack_from(value)
    return None if due < 0 else int(due)


def decode(value: bytes, decode_event: Callable[[bytes], Any]) -> Effect | None:
    """The effect in a table value. ``decode_event`` (the Avro codec) reads format 1 values."""
    fmt, _ = _HEADER.unpack_from(value)
    if fmt == LEGACY_FORMAT:
        return _decode_legacy(value, decode_event)
    if fmt != FORMAT:
        raise ValueError(f"table value in format {fmt}; this release reads formats 1 and 2")
    pos = _HEADER.size
    (n,) = _COUNT.unpack_from(value, pos)
    pos += _COUNT.size
    blobs = []
    for _ in range(n):
        (size,) = _COUNT.unpack_from(value, pos)
        pos += _COUNT.size
        blobs.append(value[pos : pos + size].decode("utf-8", "surrogatepass"))
        pos += size
    effect = _load(json.loads(value[pos:].decode("utf-8", "surrogatepass")), Effect, blobs)
    assert isinstance(effect, Effect)
    return effect


def _decode_legacy(value: bytes, decode_event: Callable[[bytes], Any]) -> Effect | None:
    """Format 1: every event of the key, each length-prefixed Avro single-object bytes."""
    effect: Effect | None = None
    pos = _HEADER.size
    while pos < len(value):
        (n,) = _COUNT.unpack_from(value, pos)
        pos += _COUNT.size
        ev = decode_event(value[pos : pos + n])
        pos += n
        if is_event(ev):  # a table written before non-events were refused may hold one
            effect, _ = apply(effect, ev)
    return effect

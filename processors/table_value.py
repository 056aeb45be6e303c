"""The processor table's value: one folded effect, bounded.

Layout (format 4)::

    >B  format (4)
    >q  due_ms (-1: nothing due), read without decoding the rest when the deadline index is rebuilt
    >I  how many facts of the events topic the effect folds (its intents, outcomes, receipts,
    >I  resolutions and timeouts) and how many of the decisions topic (its decisions): read
        without decoding the rest when a changelog record is weighed against the value held
        (``compare``)
    >I  number of blobs, then each blob as >I length + UTF-8 bytes
    JSON of the folded ``Effect``, every string of BLOB_BYTES or more replaced by {"$": i}

The ``Effect`` is serialized generically (every dataclass field, nested dataclasses tagged with
their class name, enums by value), so a field added to ``Effect`` or to an event survives a round
trip without a change here. Large strings (requests, receipt values) go to blobs, stored once
however many fields repeat them (an effect's latest intent is also one of its facts). Each
dataclass's walk is made once, from its fields, and the JSON text is orjson's where installed:
the same bytes as the standard library's (``_skeleton`` says when the standard library writes).

Bounded by construction: ``slim`` keeps a payload (an intent's request, a receipt's or a
resolution's value) only where the fold reads it (the latest intent's request, for reconcilers,
and the earliest receipt's value, returned to callers); any other payload of ``ELIDE_OVER`` bytes
or more is replaced by a short marker with its size and sha256 (a marker that keeps saying
"inexact" when the value did, since the fold flags that). ``encode`` then refuses, with
``TableValueTooLarge``, any value over ``MAX_TABLE_VALUE_BYTES``: the processor dead-letters the
event that would have made it so, instead of writing it (so the table's changelog, limited by
Kafka's record size, never refuses a write, and a table rebuilt from it agrees with the fold).

Formats 1 (the events of the key, concatenated) and 2 (format 4 without the counts) are still
read, so a table written by an earlier release is folded into format 4 the next time its key
changes. Format 3 is a retired key's marker (``retirement``).

Why the counts are in the header: the table's changelog is written by whichever worker owns the
partition, and a batch an old owner had in flight when it was paused or cut off can be
acknowledged after the new owner's records (a late record). Read in the log's order, the late
record would replace the newer value it lands after. Every owner folds a key's events in the
order of its partition, each topic's in turn, so a value folding n facts of a topic holds that
topic's first n facts of the key: of two values, one holding at least as many of each topic's
facts holds every fact of the other. A store recovering the changelog keeps the value held over a
record it holds every fact of, and merges the two when each holds facts the other lacks
(``compare``; ``processors/late_records.py``).
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
import json.encoder
import struct
import sys
import types
import typing
from collections.abc import Callable
from functools import cache
from typing import Any

from effect_ledger.core import effect as effect_mod
from effect_ledger.core import model as model_mod
from effect_ledger.core.effect import Effect, apply
from effect_ledger.core.limits import MAX_TABLE_VALUE_BYTES
from effect_ledger.core.model import (
    INEXACT,
    INEXACT_PREFIX,
    Claimed,
    Decision,
    Intent,
    Receipt,
    Resolution,
    is_event,
)

FORMAT = 4
UNVERSIONED_FORMAT = 2  # format 4 without the version: written by earlier releases, still read
LEGACY_FORMAT = 1
MARKER_FORMAT = 3  # a retired key's marker (``retirement``): it outranks any effect value
_HEADER = struct.Struct(">Bq")  # format, due_ms (-1: nothing due)
_COUNTS = struct.Struct(">II")  # format 4, after the header: facts of the events topic, of the decisions topic
_COUNT = struct.Struct(">I")
BLOB_BYTES = 512  # strings this long or longer are stored as blobs (deduplicated, unescaped)
ELIDE_OVER = 1024  # payloads the fold does not read are replaced by a marker from this size on
ELIDED = "effect_ledger.elided"  # the key of the marker of a payload left out of the table
_JSON = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)  # one encoder for every write


def _json_writer() -> Callable[[Any], str]:
    """``_JSON.encode`` for the table's data (a dict), without the C encoder ``encode`` makes anew
    on every call: the same text, in 85 % of the time."""
    make = getattr(json.encoder, "c_make_encoder", None)  # CPython's C accelerator (not in the stubs)
    if make is None:  # no C accelerator: the pure-Python encoder
        return _JSON.encode
    c = make(None, _JSON.default, json.encoder.encode_basestring, None, ":", ",", False, False, True)
    return lambda data: "".join(c(data, 0))


_to_json = _json_writer()


def _orjson_dumps() -> Callable[[Any], bytes] | None:
    """orjson's ``dumps``: the same text as ``_to_json`` (no spaces, no ASCII escapes), encoded,
    about eight times as fast; None where the [processor] extra's orjson is absent."""
    try:
        import orjson
    except ImportError:  # pragma: no cover - the stdlib writes the same bytes
        return None
    return orjson.dumps


_dumps = _orjson_dumps()


def _skeleton(w: _Writer, data: Any) -> bytes:
    """The JSON text of ``data`` (walked by ``w``), UTF-8. orjson writes what the stdlib writes for
    strings, ints, bools and None; it refuses a lone surrogate (which the stdlib's text keeps, encoded
    with surrogatepass) and an int beyond 64 bits, and formats floats its own way: those go to the
    stdlib."""
    if _dumps is not None and w.exact:
        try:
            return _dumps(data)
        except TypeError:  # orjson.JSONEncodeError is a TypeError
            pass
    return _to_json(data).encode("utf-8", "surrogatepass")


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
    for f in effect.facts:  # most effects hold no payload that large: nothing to look at twice
        if isinstance(f, Intent):
            if len(f.request) >= ELIDE_OVER:
                break
        elif isinstance(f, Receipt | Resolution) and f.value is not None and len(f.value) >= ELIDE_OVER:
            break
    else:
        return effect
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


@cache
def _field_names(cls: type) -> tuple[str, ...] | None:
    if not dataclasses.is_dataclass(cls):
        return None
    return tuple(f.name for f in dataclasses.fields(cls))


class _Writer:
    """Walks an object into JSON-able data. Strings of ``BLOB_BYTES`` or more become {"$": i}
    (blob i); a dataclass object met again (an effect's intent is also one of its facts) becomes
    {"^": n}, n counting dataclass objects in the order they were first met. ``exact`` turns False
    on a float: the stdlib's JSON text is then written (``_skeleton``)."""

    def __init__(self) -> None:
        self.blobs: dict[str, int] = {}
        self.seen: dict[int, int] = {}
        self.exact = True

    def dump(self, obj: Any) -> Any:
        t = type(obj)
        if t is str:
            return obj if len(obj) < BLOB_BYTES else {"$": self.blobs.setdefault(obj, len(self.blobs))}
        if obj is None or t is int or t is bool:
            return obj
        dump_object = _DUMPERS.get(t)
        if dump_object is not None:
            return dump_object(self, obj)
        if t is tuple or t is list:  # the common items kept as they are, like a dataclass's fields
            return [
                x if (type(x) is str and len(x) < BLOB_BYTES) or x is None or type(x) is int else self.dump(x)
                for x in obj
            ]
        if isinstance(obj, enum.Enum):
            return obj.value
        if _field_names(t) is not None:  # type: ignore[arg-type]  # any type is hashable
            return _dumper(t)(self, obj)
        if t is float:
            self.exact = False
            return obj
        if isinstance(obj, str | int | float):  # a subclass (an enum is handled above)
            return obj
        if isinstance(obj, tuple | list):
            return [self.dump(x) for x in obj]
        if isinstance(obj, frozenset | set):
            return [self.dump(x) for x in sorted(obj)]
        if isinstance(obj, dict):
            return {"#": [[self.dump(k), self.dump(v)] for k, v in obj.items()]}
        raise TypeError(f"cannot store a {type(obj).__name__} in the table")


# A dataclass's walk, made once per class: this runs for every table write. Each field's value is
# kept as it is where ``_Writer.dump`` would return it unchanged (a short str, None, an int, a bool),
# else walked by ``dump``; the fields in their order, so blobs and objects are numbered as before.
_DUMPERS: dict[type, Callable[[_Writer, Any], dict[str, Any]]] = {}


def _dumper(cls: type) -> Callable[[_Writer, Any], dict[str, Any]]:
    made = _DUMPERS.get(cls)
    if made is not None:
        return made
    names = _field_names(cls) or ()
    lines = [
        "def dump_object(w, obj):",
        "    seen = w.seen",
        "    ref = seen.get(id(obj))",
        "    if ref is not None:",
        "        return {'^': ref}",
        "    seen[id(obj)] = len(seen)",
        "    dump = w.dump",
    ]
    items = [f"'@': {cls.__name__!r}"]
    for i, name in enumerate(names):
        lines.append(f"    v{i} = obj.{name}")
        lines.append(
            f"    if not ((type(v{i}) is str and len(v{i}) < {BLOB_BYTES}) or v{i} is None or type(v{i}) is int"
            f" or type(v{i}) is bool):"
        )
        lines.append(f"        v{i} = dump(v{i})")
        items.append(f"{name!r}: v{i}")
    lines.append("    return {" + ", ".join(items) + "}")
    scope: dict[str, Any] = {}
    exec("\n".join(lines), scope)  # noqa: S102 - the code is made from the dataclass's own field names
    made = scope["dump_object"]
    _DUMPERS[cls] = made
    return made


Converter = Callable[["_Reader", Any], Any]


class _Reader:
    """The inverse of ``_Writer``, guided by the dataclasses' type hints (enums, tuples)."""

    def __init__(self, blobs: list[str]) -> None:
        self.blobs = blobs
        self.objs: list[Any] = []

    def any(self, data: Any) -> Any:
        if type(data) is dict:
            if "$" in data:
                return self.blobs[data["$"]]
            if "^" in data:
                return self.objs[data["^"]]
            if "@" in data:
                return self.obj(data)
            if "#" in data:
                return {self.any(k): self.any(v) for k, v in data["#"]}
        return data

    def obj(self, data: dict[str, Any]) -> Any:
        cls = _classes()[data["@"]]
        plan = _plan(cls)
        n = len(self.objs)
        self.objs.append(None)  # numbered when first met, like the writer: before its fields
        # A field this release does not know is dropped; one it knows but the value lacks takes its
        # default (the dataclass raises when it has none).
        obj = cls(**{k: plan[k](self, v) for k, v in data.items() if k in plan})
        self.objs[n] = obj
        return obj


def _any(r: _Reader, v: Any) -> Any:
    return r.any(v)


@cache
def _plan(cls: type) -> dict[str, Converter]:
    names = _field_names(cls) or ()
    return {name: _converter(hint) for name, hint in _hints(cls).items() if name in names}


@cache
def _converter(hint: Any) -> Converter:
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in args if a is not type(None)]
        if len(options) != 1:
            return _any
        inner = _converter(options[0])
        return lambda r, v: None if v is None else inner(r, v)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        enum_type = hint
        return lambda r, v: enum_type(v)
    if origin is tuple and args and (len(args) != 2 or args[1] is not Ellipsis):
        convs = [_converter(a) for a in args]
        return lambda r, v: tuple(c(r, x) for c, x in zip(convs, v, strict=False))
    if origin in (tuple, list, frozenset, set):
        each = _converter(args[0]) if args else _any
        kind = origin
        return lambda r, v: kind([each(r, x) for x in v])
    return _any


# -- the value ------------------------------------------------------------------------------------


def encode(effect: Effect, due_ms: int | None) -> bytes:
    """The table value of ``effect`` (slimmed). ``TableValueTooLarge`` over the limit."""
    w = _Writer()
    skeleton = _skeleton(w, w.dump(slim(effect)))
    blobs = w.blobs
    parts = [
        _HEADER.pack(FORMAT, -1 if due_ms is None else due_ms),
        _COUNTS.pack(*counts(effect)),
        _COUNT.pack(len(blobs)),
    ]
    for text in blobs:  # dicts keep insertion order: index i is the i-th blob
        data = text.encode("utf-8", "surrogatepass")
        parts += [_COUNT.pack(len(data)), data]
    parts.append(skeleton)
    value = b"".join(parts)
    if len(value) > MAX_TABLE_VALUE_BYTES:
        raise TableValueTooLarge(effect.effect_id, len(value))
    return value


def due_of_value(value: bytes) -> int | None:
    """The due time in a value's header (every format), without decoding the effect."""
    _, due = _HEADER.unpack_from(value)
    return None if due < 0 else int(due)


def counts(effect: Effect) -> tuple[int, int]:
    """How many facts ``effect`` folds from the events topic and from the decisions topic (its
    decisions). Claim verdicts are not counted: the fold derives them from the others."""
    decisions = claims = 0
    for f in effect.facts:
        if type(f) is Decision:
            decisions += 1
        elif type(f) is Claimed:
            claims += 1
    return len(effect.facts) - decisions - claims, decisions


#: A retired key's marker holds more than any effect value (whose counts are ``>I``).
MARKER_COUNTS = (1 << 32, 1 << 32)


def counts_of(value: bytes | None) -> tuple[int, int] | None:
    """A table value's counts (``counts``), from its header alone: ``MARKER_COUNTS`` for a retired
    key's marker (nothing brings a retired key back); None for no value, a tombstone, or a value of
    an earlier format (whose facts are not known without decoding)."""
    if value is None or len(value) < _HEADER.size:
        return None
    if value[0] == FORMAT and len(value) >= _HEADER.size + _COUNTS.size:
        n_events, n_decisions = _COUNTS.unpack_from(value, _HEADER.size)
        return int(n_events), int(n_decisions)
    if value[0] == MARKER_FORMAT:
        return MARKER_COUNTS
    return None


APPLY, KEEP, MERGE = "apply", "keep", "merge"


def compare(held: bytes | None, incoming: bytes | None) -> str:
    """What a store holding ``held`` does with ``incoming``, a changelog record later in the log:
    ``KEEP`` the value held when it holds every fact of ``incoming`` and more (a late record of an
    old owner; the module docstring); ``MERGE`` the two when each holds facts the other lacks;
    ``APPLY`` ``incoming`` otherwise, as faust does: it holds every fact of the value held, or is
    a tombstone, or a value without counts (which cannot be weighed)."""
    if held is None or incoming is None:
        return APPLY
    h, i = counts_of(held), counts_of(incoming)
    if h is None or i is None or i == h:
        return APPLY
    if i[0] <= h[0] and i[1] <= h[1]:
        return KEEP
    if i[0] >= h[0] and i[1] >= h[1]:
        return APPLY
    return MERGE


def decode(value: bytes, decode_event: Callable[[bytes], Any]) -> Effect | None:
    """The effect in a table value. ``decode_event`` (the Avro codec) reads format 1 values."""
    fmt, _ = _HEADER.unpack_from(value)
    if fmt == LEGACY_FORMAT:
        return _decode_legacy(value, decode_event)
    if fmt == FORMAT:
        pos = _HEADER.size + _COUNTS.size
    elif fmt == UNVERSIONED_FORMAT:
        pos = _HEADER.size
    else:
        raise ValueError(f"table value in format {fmt}; this release reads formats 1, 2 and 4")
    (n,) = _COUNT.unpack_from(value, pos)
    pos += _COUNT.size
    blobs = []
    for _ in range(n):
        (size,) = _COUNT.unpack_from(value, pos)
        pos += _COUNT.size
        blobs.append(value[pos : pos + size].decode("utf-8", "surrogatepass"))
        pos += size
    effect = _Reader(blobs).any(json.loads(value[pos:].decode("utf-8", "surrogatepass")))
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

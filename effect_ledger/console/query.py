"""The console's questions, read from its request parameters: a time window, states, targets, a
stuck threshold and a search. Every bad value is a ``BadInput`` with a message for the page (and a
400 from the API); the same time syntax as the command line (``effect_ledger.core.timeparse``).

A search (``q``) is at most ``MAX_SEARCH_CHARS`` characters of at most ``MAX_TERMS`` terms, each
``name:value`` or a bare value (see ``Term``); values are matched as text in Python, never
written into SQL."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from effect_ledger.core.model import State
from effect_ledger.core.timeparse import TimeSpecError, duration_ms, iso, time_ms

DEFAULT_FROM = "-24h"
DEFAULT_TO = "now"
DEFAULT_STUCK = "10m"
MAX_SEARCH_CHARS = 256
MAX_TERMS = 8
_WORD = re.compile(r'(?:[^\s"]+|"[^"]*")+')
#: Names a term may use (``key`` is a prefix of the effect id; the others match exactly), beside
#: the request fields the targets file declares searchable.
TERM_NAMES = {
    "key": "key",
    "run": "run",
    "step": "step",
    "target": "target",
    "op": "operation",
    "operation": "operation",
}


class BadInput(ValueError):
    """A parameter the console cannot answer: shown on the page, a 400 from the API."""


@dataclass(frozen=True)
class Query:
    from_text: str
    to_text: str
    from_ms: int
    to_ms: int
    states: tuple[str, ...]
    targets: tuple[str, ...]
    stuck_text: str
    stuck_ms: int
    search: tuple[Term, ...] = ()
    search_text: str = ""


@dataclass(frozen=True)
class Term:
    """One term of a search. ``name`` is ``key`` (the effect id begins with ``value``), ``run``,
    ``step``, ``target``, ``operation``, ``field`` (the request field ``path`` has the value) or
    ``any`` (a bare value: any of the id prefix, run, step or a searchable field)."""

    name: str
    value: str
    path: str = ""


@dataclass(frozen=True)
class Searchable:
    """The request fields declared searchable, per target (``searchable = [...]`` in the targets
    file)."""

    fields: dict[str, tuple[str, ...]] = field(default_factory=dict)

    @property
    def paths(self) -> tuple[str, ...]:
        return tuple(sorted({p for ps in self.fields.values() for p in ps}))


def parse_search(text: str, searchable: Searchable) -> tuple[Term, ...]:
    """The terms of a search box's text; ``BadInput`` for anything outside the bounds, an unknown
    name or a field no target declares searchable."""
    if len(text) > MAX_SEARCH_CHARS:
        raise BadInput(f"a search is at most {MAX_SEARCH_CHARS} characters")
    if any(ord(c) < 32 or ord(c) == 127 or 0xD800 <= ord(c) <= 0xDFFF for c in text):
        raise BadInput("a search holds text only: no control characters")
    if text.count('"') % 2:
        raise BadInput('the search could not be read: a double quote (") is not closed')
    # Words split on spaces; double quotes keep spaces in a value (step:"refund order 7"). Single
    # quotes are text: a name such as o'brien is searched as written.
    words = [w.replace('"', "") for w in _WORD.findall(text)]
    if len(words) > MAX_TERMS:
        raise BadInput(f"a search has at most {MAX_TERMS} terms")
    terms = []
    paths = searchable.paths
    for w in words:
        name, sep, value = w.partition(":")
        if sep and name in TERM_NAMES:
            kind, path = TERM_NAMES[name], ""
        elif sep and name in paths:
            kind, path = "field", name
        else:
            # An effect id holds a colon (target:hash): a word whose prefix is no known name is a
            # bare value (an id prefix, a run, a step, a field's value).
            kind, path, value = "any", "", w
        if not value:
            raise BadInput(f"nothing to search for after {name}:")
        terms.append(Term(kind, value, path))
    return tuple(terms)


def _values(params: Mapping[str, str] | object, name: str) -> list[str]:
    """Every value of ``name``, repeated or comma-separated, blanks dropped."""
    getall = getattr(params, "getall", None)
    raw = getall(name, []) if getall else ([params[name]] if name in params else [])  # type: ignore[operator, index]
    return [v.strip() for item in raw for v in str(item).split(",") if v.strip()]


def parse_query(params: Mapping[str, str], now_ms: int, searchable: Searchable | None = None) -> Query:
    """The window (``from``/``to``), ``state``, ``target``, ``older_than`` and search (``q``) of a
    request."""
    from_text = (params.get("from") or DEFAULT_FROM).strip()
    to_text = (params.get("to") or DEFAULT_TO).strip()
    stuck_text = (params.get("older_than") or DEFAULT_STUCK).strip()
    try:
        start = time_ms(from_text, now_ms)
        end = time_ms(to_text, now_ms)
        stuck = duration_ms(stuck_text)
    except TimeSpecError as e:
        raise BadInput(str(e)) from None
    if start >= end:
        raise BadInput(f"empty window: from {iso(start)} is not before to {iso(end)}")
    states = tuple(s.upper() for s in _values(params, "state"))
    unknown = [s for s in states if s not in State.__members__]
    if unknown:
        raise BadInput(f"unknown state {', '.join(unknown)}: one of {', '.join(State.__members__)}")
    search_text = (params.get("q") or "").strip()
    terms = parse_search(search_text, searchable or Searchable())
    return Query(
        from_text, to_text, start, end, states, tuple(_values(params, "target")), stuck_text, stuck, terms, search_text
    )

"""The console's questions, read from its request parameters: a time window, states, targets, a
stuck threshold. Every bad value is a ``BadInput`` with a message for the page (and a 400 from the
API); the same time syntax as the command line (``effect_ledger.core.timeparse``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from effect_ledger.core.model import State
from effect_ledger.core.timeparse import TimeSpecError, duration_ms, iso, time_ms

DEFAULT_FROM = "-24h"
DEFAULT_TO = "now"
DEFAULT_STUCK = "10m"


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


def _values(params: Mapping[str, str] | object, name: str) -> list[str]:
    """Every value of ``name``, repeated or comma-separated, blanks dropped."""
    getall = getattr(params, "getall", None)
    raw = getall(name, []) if getall else ([params[name]] if name in params else [])  # type: ignore[operator, index]
    return [v.strip() for item in raw for v in str(item).split(",") if v.strip()]


def parse_query(params: Mapping[str, str], now_ms: int) -> Query:
    """The window (``from``/``to``), ``state``, ``target`` and ``older_than`` of a request."""
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
    return Query(from_text, to_text, start, end, states, tuple(_values(params, "target")), stuck_text, stuck)

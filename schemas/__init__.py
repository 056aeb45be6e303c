"""The Avro schemas of every effect-ledger topic: the language-neutral contract.

Each ``<Name>.avsc`` is the current schema of one record. Every released version of the set is
kept in ``history/v<N>/<Name>.avsc`` (the newest equals the current files; ``v0`` holds the few
writer schemas that reached topics before ``v1``), so bytes written by any older producer still
decode, and ``COMPATIBILITY.md`` (checked by ``scripts/schemas-check.sh`` and the unit tests) says
what a change may do. This package is data only: it imports nothing from the rest of effect-ledger.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent

NAMES = (
    "Intent",
    "Executed",
    "Receipt",
    "Resolution",
    "Decision",
    "Timeout",
    "Claimed",
    "EffectState",
    "UncertainEffect",
    "DeadLetter",
    "Retirement",
)


def load(name: str) -> dict[str, Any]:
    """The current schema ``name`` as parsed JSON."""
    if name not in NAMES:
        raise KeyError(f"no schema named {name!r}; known: {', '.join(NAMES)}")
    return json.loads((HERE / f"{name}.avsc").read_text())


def versions() -> dict[int, dict[str, dict[str, Any]]]:
    """Every released version of the schemas, oldest first: ``{n: {record name: schema}}`` read from
    ``history/v<n>/``. A version holds the records as that release wrote them (``v0`` only those
    that changed before ``v1``)."""
    folder = HERE / "history"
    found: dict[int, dict[str, dict[str, Any]]] = {}
    for d in folder.glob("v*"):
        if d.is_dir() and d.name[1:].isdigit():
            found[int(d.name[1:])] = {p.stem: json.loads(p.read_text()) for p in sorted(d.glob("*.avsc"))}
    return dict(sorted(found.items()))


def history() -> list[dict[str, Any]]:
    """Every released writer schema, oldest version first: each is accepted on decode."""
    return [s for v in versions().values() for s in v.values()]

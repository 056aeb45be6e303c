"""The Avro schemas of every effect-ledger topic: the language-neutral contract.

Each ``<Name>.avsc`` is the current schema of one record. Older writer schemas, kept so that
bytes written by an older producer still decode, live in ``history/<Name>.<n>.avsc``.
This package is data only: it imports nothing from the rest of effect-ledger.
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
)


def load(name: str) -> dict[str, Any]:
    """The current schema ``name`` as parsed JSON."""
    if name not in NAMES:
        raise KeyError(f"no schema named {name!r}; known: {', '.join(NAMES)}")
    return json.loads((HERE / f"{name}.avsc").read_text())


def history() -> list[dict[str, Any]]:
    """Older writer schemas still accepted on decode, oldest first."""
    folder = HERE / "history"
    if not folder.is_dir():
        return []
    return [json.loads(p.read_text()) for p in sorted(folder.glob("*.avsc"))]

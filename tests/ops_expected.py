"""What the operator tools must report about the known incident (``tests/incident.py``), as the
audit's rows, and a helper that writes events into an embedded ledger file. Shared by
``tests/unit/ops/test_ops_embedded.py`` and ``tests/integration/test_ops_kafka.py``."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from effect_ledger.core.effect import Effect
from effect_ledger.core.model import Event
from effect_ledger.sdk.store.sqlite import Store
from tests.incident import EXPECTED, Expected, Incident

CHECKS = (
    "keyed_writes",
    "recorded_outcomes",
    "receipts",
    "uncertain",
    "resolved_by_reconciliation",
    "duplicate_executions",
    "stuck_over_10m",
    "sent_unrecorded_window",
    "undecodable_records",
)


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def expected_checks(x: Expected = EXPECTED) -> dict[str, dict[str, Any]]:
    """EXPECTED as the audit's rows: name -> numerator, denominator, criterion, passed (and the
    window's detail)."""
    executions = x.executed + x.duplicates  # one window per execution; the doubled ones ran twice
    rows = {
        "keyed_writes": (x.keyed, x.attempts, "all"),
        "recorded_outcomes": (x.outcomes, x.attempts, "all"),  # every attempt is past its deadline
        "receipts": (x.executed, x.executed, "all"),
        "uncertain": (x.uncertain, x.effects, "informational"),
        "resolved_by_reconciliation": (x.resolved, x.uncertain, "all"),
        "duplicate_executions": (x.duplicates, x.effects, "none"),
        "stuck_over_10m": (x.stuck, x.effects, "none"),
        "sent_unrecorded_window": (executions, executions, "p99 <= 1000 ms"),
        "undecodable_records": (0, x.records, "none"),
    }
    out = {}
    for name, (num, den, criterion) in rows.items():
        passed = {"all": num == den, "none": num == 0}.get(criterion, True)
        out[name] = {"numerator": num, "denominator": den, "criterion": criterion, "passed": passed}
    w = x.window_ms
    out["sent_unrecorded_window"]["detail"] = f"p50 {w} ms, p99 {w} ms, max {w} ms"
    return out


def checks_of(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """An audit JSON report's checks in the shape of ``expected_checks``."""
    keys = ("numerator", "denominator", "criterion", "passed")
    out = {c["name"]: {k: c[k] for k in keys} for c in report["checks"]}
    for c in report["checks"]:
        if c["detail"]:
            out[c["name"]]["detail"] = c["detail"]
    return out


def expected_targets(inc: Incident) -> dict[str, dict[str, Any]]:
    """The per-target rows, counted from the incident's own lists of keys."""
    rows: dict[str, dict[str, Any]] = {}
    for kind, keys in (
        ("doubled", inc.doubled),
        ("stuck", inc.stuck),
        ("uncertain", inc.uncertain),
        ("normal", inc.normal),
    ):
        for key in keys:
            target = key.split(":", 1)[0]
            r = rows.setdefault(
                target,
                dict.fromkeys(("effects", "attempts", "keyed", "uncertain", "resolved", "duplicates", "stuck"), 0),
            )
            r["effects"] += 1
            r["attempts"] += 2 if kind == "doubled" else 1
            r["keyed"] += 0 if kind == "doubled" else 1
            r["uncertain"] += kind == "uncertain"
            r["resolved"] += kind == "uncertain"
            r["duplicates"] += kind == "doubled"
            r["stuck"] += kind == "stuck"
    for r in rows.values():
        r["window_p99_ms"] = float(EXPECTED.window_ms)
    return rows


async def _append_all(path: Path, events: list[Event]) -> None:
    store = await Store.open(path)
    try:
        folded: dict[str, Effect] = {}
        for e in events:  # one transaction per event, each folded onto what the file already holds
            folded[e.effect_id] = (await store.append(folded.get(e.effect_id), [e], now_ms=now_ms())).effect
    finally:
        await store.close()


def write_ledger(path: Path, events: list[Event]) -> Path:
    """Write ``events`` into an embedded ledger file with ``Store.append``, in order."""
    asyncio.run(_append_all(path, events))
    return path

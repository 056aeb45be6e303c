"""A month of tool calls with known defects, for ``effects assess``: the scenario, and what the eight
rows must say about it, derived from how it was built. Each format's test writes the same attempts
with that format's own library (``tests/unit/ops/test_assess_formats.py``; the OpenAI Agents SDK in
``tests/integrations/openai_agents/test_assess_spans.py``), so every reader is held to the same answers.

What is injected (per run of :func:`scenario`):

* ``refund``: 120 calls keyed ``refund:<order>`` (a stable rule); 10 time out after 5 s and are
  retried with the same key, 6 of them 50 ms later (sooner than any refund takes: early) and 4 of them
  3 s later; with ``pending``, 3 more stay started for good, one of them retried 30 minutes later
  with its key (noticed), two never (stuck, unnoticed).
* ``send_email``: 60 calls with no key; 5 sent again 2 minutes later with the same arguments and a
  fresh ``request_id`` (both succeed: semantic duplicates); 4 sent again a day later (not duplicates).
* ``create_ticket``: 40 calls keyed ``tkt-<epoch ms>`` (a key that carries time, minted per attempt);
  4 fail with a reset connection and are retried 1 s later under a new key.
* ``lookup``: 30 reads (not named in ``--writes``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

T0 = datetime(2026, 10, 1, tzinfo=UTC)
T0_MS = int(T0.timestamp() * 1000)
DAY = 86_400_000
WRITES = ("refund", "send_email", "create_ticket")


@dataclass(frozen=True)
class Attempt:
    """One attempt as the application made it (times in epoch ms; ``end_ms`` None: still started)."""

    tool: str
    call_id: str
    start_ms: int
    end_ms: int | None
    outcome: str  # ok | timeout | reset
    args: dict[str, Any]
    key: str | None = None

    @property
    def error(self) -> str | None:
        return {"ok": None, "timeout": "TimeoutError: timed out", "reset": "ConnectionResetError: reset by peer"}.get(
            self.outcome
        )

    def arguments(self) -> dict[str, Any]:
        """The arguments as sent: the key travels inside them."""
        return {**self.args, "idempotency_key": self.key} if self.key is not None else dict(self.args)

    def iso(self, ms: int | None) -> str | None:
        return None if ms is None else (T0 + timedelta(milliseconds=ms - T0_MS)).isoformat()

    @property
    def start(self) -> datetime:
        return T0 + timedelta(milliseconds=self.start_ms - T0_MS)

    @property
    def end(self) -> datetime | None:
        return None if self.end_ms is None else T0 + timedelta(milliseconds=self.end_ms - T0_MS)


@dataclass
class Scenario:
    """The attempts in time order and the injected counts."""

    attempts: list[Attempt] = field(default_factory=list)
    expected: dict[str, Any] = field(default_factory=dict)


def scenario(pending: bool = False) -> Scenario:
    """The month of calls (see the module docstring); ``pending``: the format can show started calls."""
    at: list[Attempt] = []
    for i in range(120):
        t = T0_MS + i * (30 * DAY // 120) + 1_000
        args = {"order": f"A-{i}", "amount": 100 + i}
        key = f"refund:A-{i}"
        dur = 200 + i % 50
        if i < 10:
            at.append(Attempt("refund", f"rf-{i}", t, t + 5_000, "timeout", args, key))
            delay = 50 if i < 6 else 3_000
            t2 = t + 5_000 + delay
            at.append(Attempt("refund", f"rf-{i}", t2, t2 + dur, "ok", args, key))
        else:
            at.append(Attempt("refund", f"rf-{i}", t, t + dur, "ok", args, key))
    if pending:
        for j in range(3):
            t = T0_MS + 10 * DAY + j * 3_600_000 + 7_000
            args = {"order": f"P-{j}", "amount": 900 + j}
            at.append(Attempt("refund", f"rp-{j}", t, None, "ok", args, f"refund:P-{j}"))
            if j == 0:
                t2 = t + 30 * 60_000
                at.append(Attempt("refund", f"rp-{j}", t2, t2 + 220, "ok", args, f"refund:P-{j}"))
    for i in range(60):
        t = T0_MS + i * (29 * DAY // 60) + 2_000
        args = {"to": f"c{i}@example.com", "template": "receipt", "request_id": f"m-{i}"}
        at.append(Attempt("send_email", f"em-{i}", t, t + 300, "ok", args))
        if i < 5:
            at.append(
                Attempt("send_email", f"em-{i}b", t + 120_000, t + 120_300, "ok", {**args, "request_id": f"n-{i}"})
            )
        elif i < 9:
            at.append(Attempt("send_email", f"em-{i}c", t + DAY, t + DAY + 300, "ok", args))
    for i in range(40):
        t = T0_MS + i * (30 * DAY // 40) + 3_000
        args = {"subject": f"order B-{i}", "queue": "billing"}
        if i < 4:
            at.append(Attempt("create_ticket", f"tk-{i}", t, t + 400, "reset", args, f"tkt-{t}"))
            t2 = t + 400 + 1_000
            at.append(Attempt("create_ticket", f"tk-{i}", t2, t2 + 400 + i, "ok", args, f"tkt-{t2}"))
        else:
            at.append(Attempt("create_ticket", f"tk-{i}", t, t + 400 + i, "ok", args, f"tkt-{t}"))
    for i in range(30):
        t = T0_MS + i * DAY + 4_000
        at.append(Attempt("lookup", f"lk-{i}", t, t + 20, "ok", {"order": "A-1"}))
    at.sort(key=lambda a: (a.start_ms, a.tool))
    return Scenario(at, _expected(at, pending))


def _expected(at: list[Attempt], pending: bool) -> dict[str, Any]:
    """The rows' counts, from what was injected above (numbers written out, then checked against the
    attempts so the two descriptions cannot drift apart)."""
    writes = [a for a in at if a.tool in WRITES]
    n_writes = 120 + 10 + 69 + 44 + (4 if pending else 0)
    assert len(writes) == n_writes
    keyed = 130 + 44 + (4 if pending else 0)
    assert sum(a.key is not None for a in writes) == keyed
    unknown = 10 + 4 + (3 if pending else 0)
    ok = n_writes - unknown
    first = min(a.start_ms for a in at)
    last = max(a.end_ms if a.end_ms is not None else a.start_ms for a in at)
    days = (last - first) / DAY
    return {
        "rows": {
            "keyed": (keyed, n_writes, "fix first"),
            "intent": (None, None, "not measurable"),
            "stuck": (3, n_writes, "fail") if pending else (None, None, "not measurable"),
            "stable": (10, 14, "fail"),
            "derived": (keyed - 44, keyed, "fail"),
            "window": (unknown, n_writes, "fail"),
            "rhythm": (6, 14, "fail"),
            "duplicates": (5, ok, "fail"),
        },
        "stuck_noticed": 1 if pending else None,
        "below_half": ["send_email"],
        "window_max_ms": 5_000,
        "days": days,
        "writes_per_month": n_writes * 30 / days,
        "duplicates_per_month": (unknown + 5) * 30 / days,
        "tools": {"refund": 130 + (4 if pending else 0), "send_email": 69, "create_ticket": 44, "lookup": 0},
    }


def check(report: dict[str, Any], sc: Scenario) -> None:
    """Assert an ``effects assess --json`` report recovers exactly what the scenario injected."""
    exp = sc.expected
    got = {r["id"]: (r["numerator"], r["denominator"], r["verdict"]) for r in report["rows"]}
    assert got == exp["rows"], json.dumps(report["rows"], indent=1)
    order = [r["needs"] for r in report["rows"]]
    assert order == sorted(order, key=lambda n: n != "schema")  # schema changes first
    rows = {r["id"]: r for r in report["rows"]}
    assert rows["keyed"]["detail"]["below_half"] == exp["below_half"]
    assert rows["window"]["detail"]["max_ms"] == exp["window_max_ms"]
    if exp["stuck_noticed"] is not None:
        assert rows["stuck"]["detail"]["noticed"] == exp["stuck_noticed"]
    for r in report["rows"]:
        if r["numerator"] is None:
            assert r["missing"].startswith("needs ")
    ar = report["arithmetic"]
    assert abs(ar["log_days"] - exp["days"]) < 1e-9
    assert abs(ar["writes_per_month"] - exp["writes_per_month"]) < 1e-6
    assert abs(ar["duplicates_per_month"] - exp["duplicates_per_month"]) < 1e-6
    assert {t["tool"]: t["writes"] for t in report["tools"]} == exp["tools"]


def ledger_incident(now_ms: int) -> tuple[list[Any], dict[str, tuple[Any, Any, str]]]:
    """The known incident (``tests/incident.py``) plus one effect 25 minutes after its traffic (so its
    stuck intents are over 10 minutes old), and the eight rows ``effects assess`` must give for it."""
    from effect_ledger.core.model import Executed, Intent, Outcome, Receipt, ReceiptSource
    from tests.incident import DOUBLED, STUCK, UNCERTAIN, N, incident

    inc = incident(now_ms)
    t = inc.start_ms + 35 * 60 * 1000
    later = [
        Intent("i-late", "k-late", t, 1, "payments", "create", "default", "r", "s", "{}", "dl", t + 10_000, "w"),
        Executed("x-late", "k-late", t + 50, 1, Outcome.OK, None, t + 1, t + 45, None, "w"),
        Receipt("r-late", "k-late", t + 51, 1, "re-late", ReceiptSource.CALL, "{}"),
    ]
    writes = N + DOUBLED + 1  # a doubled effect has two attempts
    ok = writes - STUCK - UNCERTAIN
    rows = {
        "keyed": (writes - 2 * DOUBLED, writes, "fail"),  # the naive producer's intents: no key handed over
        "intent": (writes, writes, "pass"),
        "stuck": (STUCK, writes, "fail"),
        "stable": (0, 0, "no data"),
        "derived": (writes - 2 * DOUBLED, writes - 2 * DOUBLED, "pass"),
        "window": (STUCK + UNCERTAIN, writes, "fail"),
        "rhythm": (0, 0, "no data"),
        "duplicates": (DOUBLED, ok, "fail"),  # executed twice, both OK, without a key
    }
    return inc.events + later, rows

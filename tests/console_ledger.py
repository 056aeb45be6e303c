"""A ledger file with known contents for the console's tests: the known incident
(``tests/incident.py``: 1,000 effects, 3 double-executed, 5 stuck, 20 uncertain then reconciled)
plus two escalated effects on ``payments``, one of them with an attempt still in flight (an
ABSENT decision on it is refused)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from pathlib import Path

from effect_ledger.core.keys import effect_key
from effect_ledger.core.model import Event, Intent, Resolution, Timeout, TimeoutPhase, Verdict
from tests.incident import Incident, incident
from tests.ops_expected import write_ledger


@dataclass
class ConsoleLedger:
    path: Path
    incident: Incident
    escalated: str  # deadline long past: any decision is allowed
    in_flight: str  # deadline in the future: ABSENT is refused


def _escalated(key: str, t: int, deadline: int) -> list[Event]:
    return [
        Intent(uuid.uuid4().hex, key, t, 1, "payments", "refund.create", "default", "run-9", key[-6:],
               '{"amount":4800}', "d" * 64, deadline, "worker-1"),
        Timeout(f"timeout:call:1:{key}", key, t + 11_000, 1, TimeoutPhase.CALL, t + 10_000),
        Resolution(uuid.uuid4().hex, key, t + 12_000, 1, Verdict.UNKNOWN, "http:gw", "gateway answered 503", tries=1),
        Resolution(uuid.uuid4().hex, key, t + 60_000, 1, Verdict.ESCALATE, "http:gw", "no answer after 5 tries",
                   tries=5),
    ]  # fmt: skip


def console_ledger(path: Path, now_ms: int) -> ConsoleLedger:
    inc = incident(now_ms)
    escalated = effect_key("payments", "refund.create", "run-9", "refund-escalated")
    in_flight = effect_key("payments", "refund.create", "run-9", "refund-in-flight")
    t = now_ms - 15 * 60 * 1000
    events = inc.events + _escalated(escalated, t, t + 10_000) + _escalated(in_flight, t, now_ms + 3_600_000)
    return ConsoleLedger(write_ledger(path, events), inc, escalated, in_flight)

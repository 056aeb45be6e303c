"""A ledger file with known contents for the console's tests: the known incident
(``tests/incident.py``: 1,000 effects, 3 double-executed, 5 stuck, 20 uncertain then reconciled)
plus two escalated refunds on ``payments`` in run ``run-9`` (orders 1001 and 1002, the customer's
email redacted as the target's body policy records it), one of them with an attempt still in flight
(an ABSENT decision on it is refused). ``TARGETS`` declares ``payments`` with ``order_id``
searchable, as a console would be started with."""

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
    escalated_order: str = "1001"
    in_flight_order: str = "1002"


TARGETS = """
[targets.payments]
lookup = "none"
body = "redact"
redact = ["email"]
searchable = ["order_id"]
"""


def _escalated(key: str, step: str, order: str, t: int, deadline: int) -> list[Event]:
    request = f'{{"amount":4800,"currency":"EUR","email":"effect_ledger.redacted","order_id":"{order}"}}'
    return [
        Intent(uuid.uuid4().hex, key, t, 1, "payments", "refund.create", "default", "run-9", step,
               request, "d" * 64, deadline, "worker-1"),
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
    events = (
        inc.events
        + _escalated(escalated, "refund-escalated", "1001", t, t + 10_000)
        + _escalated(in_flight, "refund-in-flight", "1002", t, now_ms + 3_600_000)
    )
    return ConsoleLedger(write_ledger(path, events), inc, escalated, in_flight)

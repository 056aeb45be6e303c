"""A window of traffic with known answers, for testing the audit and the operator views.

``incident(now_ms)`` returns the events of 1,000 effects on target ``payments`` (plus a few
on ``tickets``), all begun 30 to 20 minutes before ``now_ms``:

* 3 double-executed by a naive producer: two intents (without the key) and two successful
  executions with two receipt ids each;
* 5 left stuck: an intent, nothing after;
* 20 made uncertain (their deadline passed) and then found by a reconciler;
* the rest intent -> executed OK (recorded 2 ms after the call ended) -> receipt.

``EXPECTED`` holds what the audit must report.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass

from effect_ledger.core.keys import effect_key
from effect_ledger.core.model import (
    Event,
    Executed,
    Intent,
    Outcome,
    Receipt,
    ReceiptSource,
    Resolution,
    Timeout,
    TimeoutPhase,
    Verdict,
)

N, DOUBLED, STUCK, UNCERTAIN = 1000, 3, 5, 20


@dataclass(frozen=True)
class Expected:
    effects: int = N
    attempts: int = N + DOUBLED
    keyed: int = N + DOUBLED - 2 * DOUBLED
    outcomes: int = N + DOUBLED - STUCK
    executed: int = N - STUCK - UNCERTAIN
    uncertain: int = UNCERTAIN
    resolved: int = UNCERTAIN
    duplicates: int = DOUBLED
    stuck: int = STUCK
    window_ms: int = 2  # every recorded execution: 2 ms from call end to record
    # records on the log: doubled 2 x (intent, executed, receipt); stuck an intent; uncertain intent,
    # timeout, resolution; normal intent, executed, receipt
    records: int = 6 * DOUBLED + STUCK + 3 * UNCERTAIN + 3 * (N - DOUBLED - STUCK - UNCERTAIN)


EXPECTED = Expected()


@dataclass
class Incident:
    events: list[Event]
    doubled: list[str]
    stuck: list[str]
    uncertain: list[str]
    normal: list[str]
    start_ms: int


def incident(now_ms: int, seed: int = 7) -> Incident:
    rng = random.Random(seed)
    start = now_ms - 30 * 60 * 1000
    events: list[Event] = []
    doubled, stuck, uncertain, normal = [], [], [], []
    for i in range(N):
        target = "payments" if i % 10 else "tickets"
        key = effect_key(target, "create", "incident-run", f"step-{i}")
        t = start + i * 600 + rng.randint(0, 100)  # spread over 10 minutes
        kind = (
            "doubled"
            if i < DOUBLED
            else "stuck"
            if i < DOUBLED + STUCK
            else ("uncertain" if i < DOUBLED + STUCK + UNCERTAIN else "normal")
        )
        keyed = kind != "doubled"
        attempts = 2 if kind == "doubled" else 1
        for a in range(1, attempts + 1):
            ta = t + (a - 1) * 5000
            deadline = ta + 10_000
            events.append(
                Intent(
                    f"i{a}-{i}",
                    key,
                    ta,
                    a,
                    target,
                    "create",
                    "default",
                    "incident-run",
                    f"step-{i}",
                    json.dumps({"n": i}),
                    f"d{i}",
                    deadline,
                    "worker-1",
                    keyed,
                )
            )
            if kind == "stuck":
                continue
            if kind == "uncertain":
                events.append(Timeout(f"timeout:call:1:{key}", key, deadline + 1000, 1, TimeoutPhase.CALL, deadline))
                events.append(
                    Resolution(
                        f"resolution:1:1:{key}",
                        key,
                        deadline + 1500,
                        1,
                        Verdict.FOUND,
                        "http:gw",
                        "found at the destination",
                        f"re-{i}",
                        "{}",
                        1,
                    )
                )
                continue
            events.append(Executed(f"x{a}-{i}", key, ta + 42, a, Outcome.OK, None, ta + 1, ta + 40, None, "worker-1"))
            events.append(Receipt(f"r{a}-{i}", key, ta + 43, a, f"re-{i}-{a}", ReceiptSource.CALL, "{}"))
        {"doubled": doubled, "stuck": stuck, "uncertain": uncertain, "normal": normal}[kind].append(key)
    return Incident(events, doubled, stuck, uncertain, normal, start)

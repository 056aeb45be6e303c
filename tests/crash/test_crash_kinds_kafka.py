"""The crash points against the ``payment`` and ``ticket`` kinds through Kafka: the agent writes its
intent to Kafka before the call (sync), is SIGKILLed at each crash point, and is restarted on
"another host" (an empty disk) that learns what happened only through the ledger processor and the
kind's search. Exactly one payment or ticket, and the processor's table holds the effect CONFIRMED
with the destination's own id."""

from __future__ import annotations

import asyncio
import os
import signal
import tempfile
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from effect_ledger.core.keys import effect_key
from effect_ledger.sdk import crashpoints
from tests.crash.kind_agent import OPERATION, TARGET
from tests.crash.matrix import KafkaMode, kafka_setup, settled_kafka
from tests.crash.test_crash_kinds import KINDS, Outcome, _agent, _fake


def _cell(point: str, kind: str, kafka: KafkaMode) -> Outcome:
    with tempfile.TemporaryDirectory(prefix="el-kind-kafka-") as tmp, _fake(kind) as srv:
        run_id = f"run-{uuid.uuid4().hex[:12]}"
        host_a, host_b = Path(tmp, "a"), Path(tmp, "b")
        host_a.mkdir()
        host_b.mkdir()
        code, _ = _agent(kind, srv.url, host_a, run_id, point, *kafka.args())
        second, _ = _agent(kind, srv.url, host_b, run_id, None, *kafka.args())
        key = effect_key(TARGET[kind], OPERATION[kind], run_id, "order-123")
        state, receipt, evidence = asyncio.run(settled_kafka(kafka, key))
        return Outcome(point, kind, code == -signal.SIGKILL, srv.app.made(), state, receipt, evidence, second)


@pytest.fixture(scope="module")
def outcomes(kafka_bootstrap: str) -> Iterator[list[Outcome]]:
    os.environ.setdefault("KAFKA_BOOTSTRAP", kafka_bootstrap)
    with kafka_setup() as kafka, ThreadPoolExecutor(4) as pool:
        jobs = [(p, k) for p in crashpoints.POINTS for k in KINDS]
        yield list(pool.map(lambda job: _cell(job[0], job[1], kafka), jobs))


def test_every_crash_point_killed_the_agent(outcomes: list[Outcome]) -> None:
    assert len(outcomes) == len(crashpoints.POINTS) * len(KINDS)
    assert [(o.point, o.kind) for o in outcomes if not o.crashed] == []


def test_exactly_one_payment_or_ticket_and_confirmed_with_its_id(outcomes: list[Outcome]) -> None:
    for o in outcomes:
        assert len(o.made) == 1, f"{o.point}/{o.kind}: {len(o.made)} made at the destination"
        own_id = o.made[0]["id"] if o.kind == "payment" else o.made[0]["key"]
        assert (o.state, o.receipt_id) == ("CONFIRMED", own_id), f"{o.point}/{o.kind}: {o}"
        assert o.second_exit == 0, f"{o.point}/{o.kind}: the restarted agent did not confirm ({o.second_exit})"

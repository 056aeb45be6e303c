"""A processor that stays late does not get a dozen attempts per call (found by ``make chaos``).

In a 30-minute chaos run, for 230 s and whatever fault fell there, almost every call failed: the
processor's claim verdicts came too late for the calls (2 s each), each such attempt was FAILED
without a call and ``execute`` wrote a new one, for its whole ``sync_timeout`` (30 s). Every
failing call became many intents and FAILED outcomes, the workers folded about three times the
events of the load, and stayed late after the faults had passed. Now one ``execute`` writes at most
``MOST_REFUSED_ATTEMPTS`` attempts refused so, then raises ``LedgerUnavailable`` (passing: the
caller may try again later).

Here the processor runs 0.1 s in every 2.1 s (SIGSTOP/SIGCONT), so a verdict comes about 2 s after
its intent: every attempt is refused for want of time.
"""

from __future__ import annotations

import signal
import sqlite3
import threading
import time
import uuid
from pathlib import Path

from effect_ledger.demo.gateway import Gateway
from effect_ledger.sdk._executor import MOST_REFUSED_ATTEMPTS
from effect_ledger.streams.config import KafkaConfig
from tests.claim_agent import AgentProcess
from tests.services import Processor
from tests.topic_io import running

CALL_TIMEOUT_S = 2.0
STOPPED_S, RUNNING_S = 2.0, 0.1


def intents(db: Path, key: str) -> int:
    with sqlite3.connect(db) as c:
        sql = "SELECT count(*) FROM events WHERE effect_id = ? AND kind = 'Intent'"
        return int(c.execute(sql, (key,)).fetchone()[0])


def test_a_processor_that_stays_late_gets_a_bounded_number_of_attempts(
    kafka_config: KafkaConfig, tmp_path: Path
) -> None:
    proc = Processor(kafka_config, tmp_path / "data")
    key = f"late-{uuid.uuid4().hex[:8]}"
    db = tmp_path / "host.db"
    with Gateway("key+lookup") as gateway, running(proc):
        proc.wait_ready()
        agent = AgentProcess(str(db), kafka_config, proc.url, gateway.url, str(tmp_path / "host.log"),
                             timeout_s=CALL_TIMEOUT_S)  # fmt: skip
        assert proc.proc is not None
        stop = threading.Event()

        def stutter() -> None:
            assert proc.proc is not None
            while not stop.is_set():
                proc.proc.send_signal(signal.SIGSTOP)
                stop.wait(STOPPED_S)
                proc.proc.send_signal(signal.SIGCONT)
                stop.wait(RUNNING_S)

        t = threading.Thread(target=stutter, daemon=True)
        try:
            t.start()
            started = time.monotonic()
            agent.send(f"execute {key}")
            answer = agent.answer(90)
            took = time.monotonic() - started
        finally:
            stop.set()
            t.join(10)
            proc.proc.send_signal(signal.SIGCONT)
            agent.stop()
        calls = [r for r in gateway.refunds() if r.idempotency_key == key]
    written = intents(db, key)
    # At most MOST_REFUSED_ATTEMPTS attempts, whether the last was called (its verdict came in a
    # running slice early enough: rare) or refused like the others.
    assert written <= MOST_REFUSED_ATTEMPTS, (written, answer)
    if answer["outcome"] == "called":
        assert len(calls) == 1, calls
        return
    assert answer["outcome"] == "unavailable", answer
    assert "attempts of this execute were refused" in answer["reason"], answer
    assert written == MOST_REFUSED_ATTEMPTS, (written, answer)
    assert calls == []
    assert took < 25, f"the execute took {took:.1f} s: it kept trying for its whole sync_timeout"

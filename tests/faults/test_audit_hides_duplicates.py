"""Issue 10, item 6: the audit must never hide a double execution.

Two ways it used to: an effect whose later event carries a clock earlier than ``--from`` (a second
agent or a webhook host with a slow clock) was counted as "began before the window" and left out, and
an effect whose intent record does not decode had no intent, so it was left out too. Either way the
audit passed with ``duplicate_executions 0`` while ``effects trace`` showed DUPLICATE_EXECUTION.

Each case runs on an embedded ledger file (``--db``) and on the real broker (records produced the way
the relay produces them, with the Kafka timestamp of the producing host's clock).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from confluent_kafka import KafkaError, Producer

from effect_ledger.cli.main import main
from effect_ledger.core.keys import effect_key
from effect_ledger.core.model import Event, Executed, Intent, Outcome, Receipt, ReceiptSource
from effect_ledger.sdk.kafka.relay import producer_config
from effect_ledger.streams.codec import default_codec
from effect_ledger.streams.config import KafkaConfig
from tests.ops_expected import now_ms, write_ledger

SKEW_MS = 60 * 60_000  # the slow host's clock is an hour behind
GARBAGE = b"\xc3\x01" + b"\x00" * 8 + b"damaged segment"  # the single-object header, then nothing that decodes


def cli(*args: str | Path) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args])


def intent(key: str, at: int, attempt: int, worker: str) -> Intent:
    return Intent(f"i{attempt}-{worker}", key, at, attempt, "payments", "refund.create", "default", "run-1",
                  "refund-1", "{}", "d", at + 10_000, worker)  # fmt: skip


def execution(key: str, at: int, attempt: int, worker: str, receipt: str, source: ReceiptSource) -> list[Event]:
    return [
        Executed(f"x{attempt}-{worker}", key, at + 42, attempt, Outcome.OK, None, at + 1, at + 40, None, worker),
        Receipt(f"r{attempt}-{worker}", key, at + 43, attempt, receipt, source, "{}"),
    ]


def clean_effect(t: int) -> list[Event]:
    """An ordinary effect in the window: intent, executed, receipt."""
    key = effect_key("payments", "refund.create", "run-0", "refund-0")
    return [intent(key, t, 1, "agent-a"), *execution(key, t, 1, "agent-a", "re-0", ReceiptSource.CALL)]


# -- the two backends: (events, the keys whose intent record is damaged) -> audit JSON, trace flags ----


Backend = Callable[[list[Event], set[str]], tuple[dict[str, Any], Callable[[str], list[str]]]]


def _embedded(tmp_path: Path) -> Backend:
    def run(events: list[Event], damaged: set[str]) -> tuple[dict[str, Any], Callable[[str], list[str]]]:
        path = write_ledger(tmp_path / "ledger.db", events)
        with sqlite3.connect(path) as conn:  # damage the stored bytes of those intents
            for key in damaged:
                conn.execute("UPDATE events SET body = ? WHERE effect_id = ? AND kind = 'Intent'", (GARBAGE, key))
        r = cli("audit", "--db", path, "--from", "-30m", "--json", "--report-only")
        assert r.exit_code == 0, r.output

        def flags(key: str) -> list[str]:
            t = cli("trace", key, "--db", path, "--json")
            assert t.exit_code == 0, t.output
            return list(json.loads(t.stdout)["flags"])

        return json.loads(r.stdout), flags

    return run


def _kafka(cfg: KafkaConfig) -> Backend:
    def run(events: list[Event], damaged: set[str]) -> tuple[dict[str, Any], Callable[[str], list[str]]]:
        codec = default_codec()
        producer = Producer(producer_config(cfg, **{"message.timeout.ms": 30_000}))
        errors: list[KafkaError] = []
        for e in events:
            broken = isinstance(e, Intent) and e.effect_id in damaged
            producer.produce(
                cfg.topics.events,
                key=e.effect_id.encode(),
                value=GARBAGE if broken else codec.encode(e),
                headers=[codec.header(e)],
                timestamp=e.at_ms,  # the producing host's clock, as the relay stamps it
                on_delivery=lambda err, _m: errors.append(err) if err else None,
            )
        assert producer.flush(30) == 0 and not errors, errors[:3]
        p = ["--bootstrap", cfg.bootstrap, "--prefix", cfg.prefix]
        r = cli("audit", *p, "--from", "-30m", "--json", "--report-only")
        assert r.exit_code == 0, r.output

        def flags(key: str) -> list[str]:
            t = cli("trace", key, *p, "--json")
            assert t.exit_code == 0, t.output
            return list(json.loads(t.stdout)["flags"])

        return json.loads(r.stdout), flags

    return run


@pytest.fixture(params=["embedded", "kafka"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    if request.param == "embedded":
        yield _embedded(tmp_path)
    else:
        yield _kafka(request.getfixturevalue("kafka_config"))


def checks(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in report["checks"]}


# -- the faults --------------------------------------------------------------------------------------


def doubled_with_a_slow_host(t: int, key: str, *, agent_slow: bool) -> list[Event]:
    """Agent A executes attempt 1 at ``t``; agent B executes attempt 2 and a webhook host records B's
    receipt. The webhook host's clock, and B's too when ``agent_slow``, is an hour behind."""
    b = t + 5_000 - (SKEW_MS if agent_slow else 0)
    return [
        *clean_effect(t - 1_000),
        intent(key, t, 1, "agent-a"),
        *execution(key, t, 1, "agent-a", "re-1", ReceiptSource.CALL),
        intent(key, b, 2, "agent-b"),
        execution(key, b, 2, "agent-b", "re-2", ReceiptSource.CALL)[0],
        Receipt("r2-webhook", key, t + 6_000 - SKEW_MS, 2, "re-2", ReceiptSource.WEBHOOK, "{}"),
    ]


def assert_reported(report: dict[str, Any], key: str) -> None:
    assert report["duplicate_keys"] == [key], report
    dup = checks(report)["duplicate_executions"]
    assert (dup["numerator"], dup["denominator"], dup["passed"]) == (1, 2, False)
    assert report["passed"] is False


def test_audit_counts_a_double_execution_recorded_by_a_host_with_a_slow_clock(backend: Backend) -> None:
    """The second execution's events carry times before ``--from``; their records are in the window's
    part of the log all the same, and the second execution is a double execution."""
    t = now_ms() - 10 * 60_000
    key = effect_key("payments", "refund.create", "run-1", "refund-1")
    report, flags = backend(doubled_with_a_slow_host(t, key, agent_slow=True), set())
    assert "DUPLICATE_EXECUTION" in flags(key)  # what `effects trace` shows
    assert_reported(report, key)


def test_audit_counts_a_double_execution_whose_webhook_receipt_has_a_slow_clock(kafka_config: KafkaConfig) -> None:
    """Only the webhook host's clock is slow: one receipt dated before ``--from`` made the whole effect
    "began before the window" on Kafka. (An embedded ledger has one clock per file: no such case.)"""
    t = now_ms() - 10 * 60_000
    key = effect_key("payments", "refund.create", "run-1", "refund-1")
    report, flags = _kafka(kafka_config)(doubled_with_a_slow_host(t, key, agent_slow=False), set())
    assert "DUPLICATE_EXECUTION" in flags(key)
    assert_reported(report, key)


def test_audit_fails_when_an_intent_record_cannot_be_decoded(backend: Backend) -> None:
    """The intent record of an effect executed twice is damaged: the audit cannot tell when the effect
    began, but it must neither pass nor drop what the other records show."""
    t = now_ms() - 10 * 60_000
    key = effect_key("payments", "refund.create", "run-1", "refund-1")
    events = [
        *clean_effect(t - 1_000),
        intent(key, t, 1, "agent-a"),
        *execution(key, t, 1, "agent-a", "re-1", ReceiptSource.CALL),
        *execution(key, t + 5_000, 1, "agent-b", "re-2", ReceiptSource.CALL),  # a naive retry: same attempt
    ]
    report, flags = backend(events, {key})

    assert "DUPLICATE_EXECUTION" in flags(key)
    assert report["passed"] is False
    bad = checks(report).get("undecodable_records")
    assert bad is not None, f"no undecodable_records check in {[c['name'] for c in report['checks']]}"
    assert (bad["numerator"], bad["denominator"], bad["criterion"], bad["passed"]) == (1, len(events), "none", False)
    assert key in bad["detail"]
    assert report["duplicate_keys"] == [key]
    assert checks(report)["duplicate_executions"]["passed"] is False

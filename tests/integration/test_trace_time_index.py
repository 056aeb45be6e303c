"""``effects trace`` on Kafka reads a key's partition from where its first intent lies (the time
index: ``offsets_for_times``), not from offset 0; ``--since`` reads from a given time.

The key's partition holds, at its start, a receipt of the same key stamped 40 days ago: a trace
that read from offset 0 would show it. Another key began 3 days ago: found by the growing steps."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

from confluent_kafka import Producer

from effect_ledger.core.keys import effect_key
from effect_ledger.core.model import Event, Executed, Intent, Outcome, Receipt, ReceiptSource
from effect_ledger.ops.sources import key_events
from effect_ledger.sdk.kafka.relay import producer_config
from effect_ledger.streams.codec import default_codec
from effect_ledger.streams.config import KafkaConfig
from tests.ops_expected import now_ms
from tests.topic_io import recorded_times

DAY = 86_400_000


def intent(key: str, at: int) -> Intent:
    return Intent(uuid.uuid4().hex, key, at, 1, "payments", "refund.create", "default", "run-t", key[-8:], "{}",
                  "d" * 64, at + 30_000, "agent-1")  # fmt: skip


def executed(key: str, at: int) -> Executed:
    return Executed(uuid.uuid4().hex, key, at, 1, Outcome.OK, None, at - 5, at - 1, None, "agent-1")


def receipt(key: str, at: int, rid: str) -> Receipt:
    return Receipt(uuid.uuid4().hex, key, at, 1, rid, ReceiptSource.CALL, "{}")


def produce(cfg: KafkaConfig, events: list[Event]) -> None:
    codec = default_codec()
    p = Producer(producer_config(cfg))  # murmur2: the partition the tools compute for the key
    for e in events:
        p.produce(cfg.topics.events, key=e.effect_id.encode(), value=codec.encode(e), headers=[codec.header(e)],
                  timestamp=e.at_ms)  # fmt: skip
    assert p.flush(30) == 0


def trace_json(cfg: KafkaConfig, key: str, *extra: str) -> dict[str, object]:
    r = subprocess.run(
        [sys.executable, "-m", "effect_ledger", "trace", key, "--json", "--bootstrap", cfg.bootstrap,
         "--prefix", cfg.prefix, *extra],
        capture_output=True, text=True, timeout=120, env=dict(os.environ),
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    doc: dict[str, object] = json.loads(r.stdout)
    return doc


def test_trace_reads_from_the_first_intent_not_from_offset_0(kafka_config: KafkaConfig) -> None:
    cfg = kafka_config
    recorded_times(cfg)  # the test writes a history days long: its records keep their times
    now = now_ms()
    recent = effect_key("payments", "refund.create", "run-t", "recent")
    older = effect_key("payments", "refund.create", "run-t", "three-days")
    produce(
        cfg,
        [
            receipt(recent, now - 40 * DAY, "re_ancient"),  # a record of the key long before its intent
            receipt(older, now - 40 * DAY, "re_ancient_2"),
            intent(older, now - 3 * DAY),
            executed(older, now - 3 * DAY + 5),
            receipt(older, now - 3 * DAY + 5, "re_older"),
            intent(recent, now - 10 * 60_000),
            executed(recent, now - 10 * 60_000 + 5),
            receipt(recent, now - 10 * 60_000 + 5, "re_recent"),
        ],
    )
    # Read from the last hour: the intent is there; the receipt stamped 40 days ago is not read.
    got = list(key_events(cfg, recent, now_ms=now))
    assert [type(e).__name__ for e in got] == ["Intent", "Executed", "Receipt"]
    assert [e.receipt_id for e in got if isinstance(e, Receipt)] == ["re_recent"]
    # Three days back: not in the last hour nor the last day; found at the 7-day step.
    got = list(key_events(cfg, older, now_ms=now))
    assert [e.receipt_id for e in got if isinstance(e, Receipt)] == ["re_older"]
    # --since further back reads what lies there too.
    got = list(key_events(cfg, recent, since_ms=now - 41 * DAY))
    assert sorted(e.receipt_id for e in got if isinstance(e, Receipt)) == ["re_ancient", "re_recent"]

    doc = trace_json(cfg, recent)
    assert doc["effect_id"] == recent and doc["state"] == "CONFIRMED"
    assert [e["event"] for e in doc["events"]] == [
        "intent attempt 1 refund.create (deadline +30 s)",
        "executed OK (call 4 ms)",
        "receipt re_recent",
    ]  # type: ignore[index,union-attr]


def test_trace_since_after_the_effect_finds_nothing(kafka_config: KafkaConfig) -> None:
    cfg = kafka_config
    recorded_times(cfg)  # the test writes a history days long: its records keep their times
    now = now_ms()
    key = effect_key("payments", "refund.create", "run-t", "gone")
    produce(cfg, [intent(key, now - 2 * DAY), executed(key, now - 2 * DAY + 5)])
    r = subprocess.run(
        [sys.executable, "-m", "effect_ledger", "trace", key, "--since", "-1h", "--bootstrap", cfg.bootstrap,
         "--prefix", cfg.prefix],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 1
    assert r.stderr.startswith(f"effects: no effect with key {key!r} since ") and len(r.stderr.splitlines()) == 1

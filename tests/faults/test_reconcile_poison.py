"""Fault: ``effects reconcile`` crash-loops on one record (issue 10, item 8).

A resolution too large to produce (a lookup that answers with a 1.5 MB body) or an oversized record
on ``effects.uncertain`` (dead-lettered with a full copy, which is larger still) made the service die
within seconds, on every restart, and everything behind the record starved. Now: a bad record goes
to the DLQ as a bounded copy with the reason, the consumer commits past it, and resolutions carry a
bounded, flagged receipt value.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

from effect_ledger.core.limits import MAX_RECEIPT_BYTES
from effect_ledger.core.model import INEXACT, DeadLetter, Resolution, UncertainEffect, Verdict
from effect_ledger.core.reconcile import EffectView, Found, Target, judge
from effect_ledger.streams.codec import default_codec
from effect_ledger.streams.config import KafkaConfig
from effect_ledger.streams.dlq import MAX_VALUE_COPY
from tests.services import Reconcilers, wait_for
from tests.topic_io import Record, TopicReader, running

WAIT = 60.0
GROUP = "effect-ledger-reconcilers"
BIG = 1_500_000  # over Kafka's default 1 MB record limit


class _Destination(BaseHTTPRequestHandler):
    """A payment gateway's lookup by key: a huge answer for one key, a normal one for another."""

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802
        key = self.path.rsplit("/", 1)[-1].replace("%3A", ":")
        if key == "payments:huge-answer":
            body = json.dumps({"id": "re_huge", "statement": "x" * BIG}).encode()
        elif key.startswith("payments:normal"):
            body = json.dumps({"id": f"re_{key[-4:]}"}).encode()
        else:
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def destination() -> Iterator[str]:
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Destination)
    srv.daemon_threads = True
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()


def uncertain(key: str, request: str = '{"order":"1"}') -> UncertainEffect:
    return UncertainEffect(f"uncertain:1:0:{key}", key, 1, 1, "payments", "refund.create", request, "d" * 64,
                           "deadline passed", 1, 2)  # fmt: skip


def committed(cfg: KafkaConfig, partition: int) -> int:
    c = Consumer(cfg.confluent(**{"group.id": f"{cfg.prefix}{GROUP}", "enable.auto.commit": False}))
    try:
        (tp,) = c.committed([TopicPartition(cfg.topics.uncertain, partition)], timeout=10)
        return int(tp.offset)
    finally:
        c.close()


def test_reconcilers_survive_oversized_records_and_answers(
    kafka_config: KafkaConfig, tmp_path: Path, destination: str
) -> None:
    """On one partition of effects.uncertain, in this order: 1.5 MB of garbage, a work item whose
    request is not JSON, one whose lookup answers with a 1.5 MB body, and a normal one. The service
    keeps running; the first two are dead-lettered (bounded copies, with the reason); the huge answer
    is resolved with a bounded value; the normal one behind them all is resolved; offsets are
    committed past all four."""
    cfg = kafka_config
    codec = default_codec()
    # The topic accepts large records (someone raised its limit); the DLQ keeps the default 1 MB.
    admin = AdminClient(cfg.confluent())
    limit = ConfigEntry("max.message.bytes", "4000000", incremental_operation=AlterConfigOpType.SET)
    res = ConfigResource(ResourceType.TOPIC, cfg.topics.uncertain, incremental_configs=[limit])
    for f in admin.incremental_alter_configs([res]).values():
        f.result(30)

    def limit_applied() -> bool:  # the broker applies a topic's config shortly after the controller took it
        described = admin.describe_configs([ConfigResource(ResourceType.TOPIC, cfg.topics.uncertain)])
        entries = next(iter(described.values())).result(10)
        return entries["max.message.bytes"].value == "4000000"

    wait_for(limit_applied, 30, "the topic's raised max.message.bytes to be applied")
    p = Producer(cfg.confluent(**{"message.max.bytes": 4_000_000, "acks": "all"}))
    normal = f"payments:normal-{uuid.uuid4().hex[:4]}"
    records = [
        (b"payments:garbage", b"\x00" + b"g" * BIG),
        (b"payments:bad-request", codec.encode(uncertain("payments:bad-request", "{not json"))),
        (b"payments:huge-answer", codec.encode(uncertain("payments:huge-answer"))),
        (normal.encode(), codec.encode(uncertain(normal))),
    ]
    errors: list[str] = []
    for key, value in records:
        p.produce(cfg.topics.uncertain, value, key, partition=0, on_delivery=lambda e, _m: e and errors.append(str(e)))
    assert p.flush(30) == 0 and not errors, errors

    targets = tmp_path / "targets.toml"
    targets.write_text(f'[targets.payments]\nlookup = "{destination}/refunds/by-key/{{key}}"\nhonours_keys = true\n')
    service = Reconcilers(cfg, tmp_path, ["--targets", str(targets)])
    with running(service), TopicReader(cfg, cfg.topics.events) as events, TopicReader(cfg, cfg.topics.dlq) as dlq:

        def resolved(key: str) -> Any:
            events.poll()
            return [v for v in events.values(Resolution) if v.effect_id == key]

        wait_for(lambda: not service.alive or resolved(normal), WAIT, "the normal record's resolution")
        assert service.alive, f"the service died:\n{service.log()[-3000:]}"
        (r,) = resolved(normal)
        assert (r.verdict, r.receipt_id) == (Verdict.FOUND, f"re_{normal[-4:]}")

        # The huge answer became a resolution that fits, flagged when its value was cut.
        (huge,) = resolved("payments:huge-answer")
        assert len(codec.encode(huge)) < 100_000
        if huge.verdict is Verdict.FOUND:  # (a reconciler that bounds what it reads answers Unknown instead)
            assert huge.value is not None and INEXACT in json.loads(huge.value)
            assert len(huge.value.encode()) <= MAX_RECEIPT_BYTES

        # The two bad records: bounded dead letters with the reason, each under 1 MB.
        def letters(rs: list[Record]) -> list[Record]:
            return [x for x in rs if isinstance(x.value, DeadLetter) and x.value.topic == cfg.topics.uncertain]

        got = {x.value.offset: x for x in dlq.until(lambda rs: len(letters(rs)) >= 2 and letters(rs), WAIT, "two")}
        assert sorted(got) == [0, 1]
        garbage = got[0].value
        assert "not Avro" in garbage.error and f"of {len(records[0][1]):,} bytes" in garbage.error
        assert garbage.value == records[0][1][:MAX_VALUE_COPY] and got[0].raw is not None
        assert len(got[0].raw) < 100_000
        assert "cannot reconcile" in got[1].value.error and got[1].value.value == records[1][1]

        wait_for(lambda: committed(cfg, 0) == 4, WAIT, "the group to commit past every record")
        assert service.alive


def test_a_found_answer_too_large_to_write_is_kept_bounded_and_flagged() -> None:
    """The rule behind it, in ``judge`` (shared by the service, the embedded runner and the SDK): a
    receipt value over the limit, or one JSON cannot hold, becomes a flagged stand-in, and a receipt
    id over its limit its digest; the resolution is FOUND either way (the effect happened)."""
    v = EffectView("payments:k", "payments", "refund.create", {}, 1, 0, 0)
    big = judge(v, Target("payments"), Found("re_1", {"blob": "x" * BIG}), "http", 10)
    assert big.verdict is Verdict.FOUND and big.receipt_id == "re_1"
    assert big.value is not None and len(big.value.encode()) <= MAX_RECEIPT_BYTES
    stand_in = json.loads(big.value)
    assert stand_in[INEXACT]["bytes"] > BIG and len(stand_in[INEXACT]["sha256"]) == 64
    assert "stand-in" in big.reason

    circular: dict[str, Any] = {}
    circular["self"] = circular
    odd = judge(v, Target("payments"), Found("y" * 5000, circular), "http", 10)
    assert odd.verdict is Verdict.FOUND and odd.value is not None and INEXACT in json.loads(odd.value)
    assert odd.receipt_id is not None and odd.receipt_id.startswith("sha256:") and len(odd.receipt_id) < 100

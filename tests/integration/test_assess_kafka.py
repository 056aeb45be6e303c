"""``effects assess --topics``: the eight rows from the ledger's own Kafka topics, the known incident
produced to ``effects.events`` as the relay produces it (key, schema header, the event's time); the
same answers as from a ledger file (``tests/unit/ops/test_assess_ledger.py``)."""

from __future__ import annotations

import json

from click.testing import CliRunner
from confluent_kafka import KafkaError, Producer

from effect_ledger.cli.main import main
from effect_ledger.sdk.kafka.relay import producer_config
from effect_ledger.streams.codec import default_codec
from effect_ledger.streams.config import KafkaConfig
from tests.assess_gen import ledger_incident
from tests.ops_expected import now_ms
from tests.topic_io import recorded_times


def test_assess_reads_the_ledgers_topics(kafka_config: KafkaConfig) -> None:
    cfg = kafka_config
    recorded_times(cfg)  # the records keep the events' own times
    events, expected = ledger_incident(now_ms())
    codec = default_codec()
    producer = Producer(producer_config(cfg, **{"message.timeout.ms": 30_000}))
    errors: list[KafkaError] = []
    for e in events:
        producer.produce(cfg.topics.events, key=e.effect_id.encode(), value=codec.encode(e),
                         headers=[codec.header(e)], timestamp=e.at_ms,
                         on_delivery=lambda err, _m: errors.append(err) if err else None)  # fmt: skip
        producer.poll(0)
    assert producer.flush(30) == 0 and not errors, errors[:3]
    args = ["assess", "--topics", "--bootstrap", cfg.bootstrap, "--prefix", cfg.prefix, "--json"]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output
    report = json.loads(r.stdout)
    assert report["format"] == "ledger"
    assert {x["id"]: (x["numerator"], x["denominator"], x["verdict"]) for x in report["rows"]} == expected

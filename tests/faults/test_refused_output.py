"""A record of a batch that Kafka refuses for good (here: an operator lowered ``effects.state``'s
``max.message.bytes`` below a state record) stops the worker without committing the batch, so a
worker started once the topic is fixed folds its events. The worker stopped, but faust acknowledged
the failed batch as it closed the stream on the way out and committed it: the next worker started
past the intent, which no table, lookup or deadline then ever saw."""

from __future__ import annotations

from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource

from effect_ledger.core.effect import fold, to_state
from effect_ledger.streams.config import KafkaConfig
from effect_ledger.streams.partition import partition_for
from tests.faults._flow import answered, commits, intent, now_ms
from tests.services import Processor, wait_for
from tests.topic_io import RawProducer, TopicReader, running, untimed

WAIT = 90.0


def _set_max_message_bytes(cfg: KafkaConfig, topic: str, value: str | None) -> None:
    """Set (or, with None, remove) ``topic``'s ``max.message.bytes``, and wait until the broker reports it."""
    admin = AdminClient(cfg.confluent())
    op = AlterConfigOpType.SET if value is not None else AlterConfigOpType.DELETE
    entry = ConfigEntry("max.message.bytes", value or "", incremental_operation=op)
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=[entry])
    for fut in admin.incremental_alter_configs([resource]).values():
        fut.result(timeout=30)

    def shown() -> bool:
        described = admin.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, topic)])
        got = next(iter(described.values())).result(timeout=30)["max.message.bytes"]
        return got.value == value if value is not None else got.is_default

    wait_for(shown, 30, f"{topic}'s max.message.bytes to show {value}")


@pytest.mark.timeout(400)
def test_a_batch_kafka_refuses_stops_the_worker_and_is_not_committed(kafka_config: KafkaConfig, tmp_path: Path) -> None:
    cfg = kafka_config
    key = "payments:refused-output"
    p = partition_for(key.encode(), cfg.partitions)
    first = intent(key, now_ms(), now_ms() + 3_600_000)
    expected = fold([first])
    assert expected is not None
    a = Processor(cfg, tmp_path / "data")
    with TopicReader(cfg, cfg.topics.state) as states:
        with running(a):
            a.wait_ready(WAIT)
            _set_max_message_bytes(cfg, cfg.topics.state, "100")  # a state record is larger
            producer = RawProducer(cfg)
            producer.event(first)
            producer.flush(30)
            wait_for(lambda: not a.alive, WAIT, "the worker to stop on the refused record")
            assert a.proc is not None and a.proc.returncode != 0, "a worker that could not write its batch exited 0"
            assert "Kafka refused 1 record(s) of the batch" in a.log(), a.log()[-3000:]
        committed, end = commits(cfg)[p]
        assert committed < end, f"partition {p} committed through {committed}, past the intent the worker never wrote"

        _set_max_message_bytes(cfg, cfg.topics.state, None)
        b = Processor(cfg, tmp_path / "data")  # the same data dir
        with running(b):
            b.wait_ready(WAIT)
            wait_for(lambda: answered(b, key, "PENDING"), WAIT, "the next worker to fold the intent")

            def published() -> bool:
                states.poll()
                return untimed(states.latest().get(key)) == untimed(to_state(expected))

            wait_for(published, WAIT, "the intent's state on effects.state")

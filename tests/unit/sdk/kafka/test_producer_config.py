"""The producer settings every writer to Kafka uses (``effect_ledger.sdk.kafka.relay.producer_config``)
and what each is for: the promise rests on them."""

from __future__ import annotations

from effect_ledger.sdk.kafka.relay import producer_config
from effect_ledger.streams.config import KafkaConfig


def test_the_producer_gives_up_on_a_request_before_the_broker_does() -> None:
    """A leader cut off from the other brokers (not from the producer) holds a produce request for
    followers that no longer fetch from it, then answers "timed out"; librdkafka retries that answer
    on the same connection, to the broker whose stale metadata still names itself leader, for as
    long as the cut lasts. When the producer's own wait (``socket.timeout.ms``) ends first, it drops
    the connection and looks the leader up on another broker: on three brokers in network namespaces,
    a worker's writes stalled for a whole 25 s cut in 6 of 21 runs with the broker giving up first
    (2.5 s against 3.5 s), in 0 of 10 with the producer giving up first (2.5 s against 5 s)."""
    conf = producer_config(KafkaConfig(bootstrap="127.0.0.1:9092"))
    assert conf["socket.timeout.ms"] < conf["request.timeout.ms"]
    assert conf["socket.connection.setup.timeout.ms"] <= conf["socket.timeout.ms"]


def test_the_settings_the_promise_rests_on() -> None:
    conf = producer_config(KafkaConfig(bootstrap="127.0.0.1:9092"))
    assert conf["acks"] == "all" and conf["enable.idempotence"] is True
    assert conf["message.timeout.ms"] == 0  # retried until the broker is back: a key's events never reorder

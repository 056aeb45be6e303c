"""The optional Schema Registry wire format, end to end with a real broker: an SDK (``KafkaConfig(
schema_registry=URL)``) and the ledger processor (``effects --schema-registry URL worker``, a child
process) register their schemas and frame records the Confluent way (byte 0 + 4-byte schema id);
confluent-kafka's own ``AvroDeserializer`` reads ``effects.state`` and ``effects.events``, and the
processor folds the framed events. The registry is ``tests/registry_server.py`` (no
Confluent-compatible registry server can be run here; its docstring says what was tried)."""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer
from confluent_kafka.serialization import MessageField, SerializationContext

from effect_ledger.errors import DecodeError
from effect_ledger.sdk.ledger import Ledger
from effect_ledger.streams.codec import Codec
from effect_ledger.streams.config import KafkaConfig
from effect_ledger.streams.schema_topic import kafka_codec
from tests.registry_server import RegistryServer
from tests.sdk_contract import DECLARED
from tests.services import Processor
from tests.topic_io import running

WAIT = 60.0


def read_with_confluent(cfg: KafkaConfig, topic: str, url: str, done: Any, timeout: float) -> list[tuple[bytes, Any]]:
    """Every record of ``topic`` as confluent-kafka's AvroDeserializer decodes it, until ``done``."""
    deserialize = AvroDeserializer(SchemaRegistryClient({"url": url}))
    c = Consumer(cfg.confluent(**{"group.id": f"g-{uuid.uuid4().hex[:8]}", "auto.offset.reset": "earliest"}))
    c.subscribe([topic])
    got: list[tuple[bytes, Any]] = []
    end = time.monotonic() + timeout
    try:
        while not done(got) and time.monotonic() < end:
            msg = c.poll(1.0)
            if msg is None or msg.error() or msg.value() is None:
                continue
            got.append((msg.value(), deserialize(msg.value(), SerializationContext(topic, MessageField.VALUE))))
    finally:
        c.close()
    return got


def test_registry_framing_read_by_confluent_deserializer(kafka_config: KafkaConfig, tmp_path: Path) -> None:
    with RegistryServer() as registry:
        cfg = dataclasses.replace(kafka_config, schema_registry=registry.url)
        proc = Processor(cfg, tmp_path / "data")
        proc.args[:0] = ["--schema-registry", registry.url]  # the global option, before `worker`
        key_holder: list[str] = []

        async def write() -> None:
            async with await Ledger.open(str(tmp_path / "agent.db"), targets=DECLARED, kafka=cfg, sync=True) as ledger:
                r = await ledger.execute(
                    target="payments", operation="refund.create", run_id="run-1", step="refund-1",
                    request={"order": "1", "amount": 4800}, call=lambda key: {"id": f"re_{key[-6:]}"},
                )  # fmt: skip
                key_holder.append(r.effect_id)

        with running(proc):
            proc.wait_ready()
            asyncio.run(write())
            (key,) = key_holder

            # effects.state, written by the processor: framed, and the stock deserializer reads it.
            def confirmed(got: list[tuple[bytes, Any]]) -> bool:
                return any(d["effect_id"] == key and d["state"] == "CONFIRMED" for _, d in got)

            states = read_with_confluent(cfg, cfg.topics.state, registry.url, confirmed, WAIT)
            assert confirmed(states), states
            for raw, _ in states:
                assert raw[0] == 0 and int.from_bytes(raw[1:5], "big") in registry.schemas

        # effects.events, written by the SDK's relay: the same framing; every event of the effect.
        events = read_with_confluent(cfg, cfg.topics.events, registry.url, lambda g: len(g) >= 3, WAIT)
        kinds = {tuple(sorted(d)) for _, d in events}
        assert {d["effect_id"] for _, d in events} == {key}
        assert any("request_digest" in k and "keyed" in k for k in kinds), "an Intent"
        assert all(raw[0] == 0 for raw, _ in events)
        assert {"effect_ledger.Intent", "effect_ledger.Executed", "effect_ledger.EffectState"} <= set(registry.subjects)

        # effect-ledger's own readers: with the registry they decode it; without, a typed one-line error.
        raw = events[0][0]
        assert kafka_codec(cfg).decode(raw).effect_id == key
        try:
            Codec().decode(raw)
        except DecodeError as e:
            assert "Schema Registry framing" in str(e) and "--schema-registry" in str(e)
        else:
            raise AssertionError("registry-framed bytes must not decode without a registry")

    # The SDK's wait for its effect (sync=True) and the processor's fold both went through framed
    # records: nothing was dead-lettered.
    c = Consumer(cfg.confluent(**{"group.id": f"g-{uuid.uuid4().hex[:8]}", "auto.offset.reset": "earliest"}))
    try:
        lo_hi = [c.get_watermark_offsets(tp, timeout=10) for tp in _partitions(c, cfg.topics.dlq)]
    finally:
        c.close()
    assert all(hi == lo for lo, hi in lo_hi)


def _partitions(c: Consumer, topic: str) -> list[Any]:
    from confluent_kafka import TopicPartition

    md = c.list_topics(topic, timeout=10)
    return [TopicPartition(topic, p) for p in md.topics[topic].partitions]

"""A rolling upgrade with real Kafka: a newer release's writers (a field added with a default, an enum
symbol added: ``tests/newer_writer.py``) publish their schemas to ``effects.schemas`` and write
records; today's ledger processor (``effects worker``, a child process) and today's subscribers (the
SQL sink, ``latest_states``, and the README's plain consumer) read them without being redeployed and
without dead letters. A record whose schema was never published is dead-lettered with the typed
reason, after a bounded wait."""

from __future__ import annotations

import sqlite3
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer

from effect_ledger.core.model import DeadLetter, EffectState, State
from effect_ledger.errors import UnknownSchema
from effect_ledger.ops.sink import StateSink
from effect_ledger.ops.sources import latest_states
from effect_ledger.streams.codec import Codec, schema_fingerprint
from effect_ledger.streams.config import KafkaConfig
from effect_ledger.streams.schema_topic import kafka_codec, publish_schemas
from tests.newer_writer import encode, newer
from tests.services import Processor, wait_for
from tests.topic_io import RawProducer, TopicReader, running

WAIT = 60.0


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def subscribe_states(
    cfg: KafkaConfig, done: Callable[[dict[str, EffectState]], bool], timeout: float
) -> dict[str, EffectState]:
    """The README's subscriber: a plain consumer of effects.state with the learning codec; the latest
    state per effect, read until ``done`` says so."""
    codec = kafka_codec(cfg)  # today's schemas + any newer one, learned from effects.schemas
    c = Consumer(cfg.confluent(**{"group.id": f"g-{uuid.uuid4().hex[:8]}", "auto.offset.reset": "earliest"}))
    c.subscribe([cfg.topics.state])
    got: dict[str, EffectState] = {}
    end = time.monotonic() + timeout
    try:
        while not done(got) and time.monotonic() < end:
            msg = c.poll(1.0)
            if msg is None or msg.error() or msg.value() is None:
                continue
            state = codec.decode(msg.value())  # an EffectState
            got[state.effect_id] = state
    finally:
        c.close()
    return got


def test_todays_processor_and_subscribers_read_a_newer_writer(kafka_config: KafkaConfig, tmp_path: Path) -> None:
    cfg = kafka_config
    intent_v, executed_v, state_v = newer("Intent"), newer("Executed"), newer("EffectState")
    today = Codec()
    for s in (intent_v, executed_v, state_v):
        assert not today.knows(schema_fingerprint(s)), "the newer writer's schemas are not shipped today"

    # The newer release publishes its schemas before its first record (what every writer does).
    assert publish_schemas(cfg, [intent_v, executed_v, state_v]) == 3
    key = f"payments:{uuid.uuid4().hex}"
    t = now_ms()
    intent = {
        "event_id": f"i-{uuid.uuid4().hex}", "effect_id": key, "at_ms": t, "attempt": 1, "target": "payments",
        "operation": "refund.create", "namespace": "tests", "run_id": "run-1", "step": "s1",
        "request": '{"amount":100}', "request_digest": "d" * 64, "deadline_ms": t + 600_000, "worker": "w-next",
        "keyed": True, "region": "ap",
    }  # fmt: skip
    executed = {
        "event_id": f"x-{uuid.uuid4().hex}", "effect_id": key, "at_ms": t + 1, "attempt": 1,
        "outcome": "OUTCOME_NEXT", "error": "a result only the next release names", "call_started_ms": t,
        "call_ended_ms": t + 1, "receipt_deadline_ms": None, "worker": "w-next", "region": "ap",
    }  # fmt: skip
    # A newer processor's state record, on the compacted topic subscribers read.
    other = f"payments:{uuid.uuid4().hex}"
    state = {
        "effect_id": other, "state": "STATE_NEXT", "target": "payments", "operation": "refund.create",
        "namespace": "tests", "run_id": "run-2", "step": "s2", "request_digest": "e" * 64, "attempt": 1,
        "version": 3, "created_ms": t, "updated_ms": t + 2, "deadline_ms": None, "receipt_id": None,
        "executions": 0, "receipt_ids": [], "flags": [], "reason": None, "region": "ap",
    }  # fmt: skip
    # A writer that never published its schema: nobody can learn it.
    unpublished = newer("Receipt")
    unpublished["fields"].append({"name": "extra", "type": "int", "default": 0})
    stray_key = f"payments:{uuid.uuid4().hex}"
    stray = {
        "event_id": f"r-{uuid.uuid4().hex}", "effect_id": stray_key, "at_ms": t, "attempt": 1, "receipt_id": "re_1",
        "source": "CALL", "value": "{}", "region": "ap", "extra": 1,
    }  # fmt: skip

    proc = Processor(cfg, tmp_path / "data")
    with (
        running(proc),
        TopicReader(cfg, cfg.topics.state) as states,
        TopicReader(cfg, cfg.topics.dlq) as dlq,
    ):
        proc.wait_ready()
        out = RawProducer(cfg)
        out.raw(cfg.topics.events, key.encode(), encode(intent_v, intent))
        out.raw(cfg.topics.events, key.encode(), encode(executed_v, executed))
        out.raw(cfg.topics.state, other.encode(), encode(state_v, state))
        out.raw(cfg.topics.events, stray_key.encode(), encode(unpublished, stray))
        out.flush()

        # Today's processor folded the newer events: the unknown outcome is UNKNOWN (the enum's
        # default), so the effect is uncertain and goes to the reconcilers, not to a dead letter.
        def folded() -> Any:
            states.poll()
            st = states.latest().get(key)
            return st if st is not None and st.state is State.UNCERTAIN else None

        st = wait_for(folded, WAIT, "today's processor to fold the newer writer's events")
        assert st.target == "payments" and st.reason is not None and "call outcome unknown" in st.reason

        # Only the record whose schema nobody published is a dead letter, with the typed reason.
        letters = dlq.until(lambda rs: rs, WAIT, "the unpublished writer's dead letter")
        (letter,) = [r.value for r in letters]
        assert isinstance(letter, DeadLetter) and letter.key == stray_key.encode()
        assert f"unknown schema fingerprint {schema_fingerprint(unpublished).hex()}" in letter.error
        assert "not in the schemas topic" in letter.error

    # Today's subscribers read the newer processor's state: STATE_NEXT becomes UNCERTAIN (the default).
    seen = subscribe_states(cfg, lambda s: other in s and s.get(key) == st, WAIT)
    assert seen[other].state is State.UNCERTAIN and seen[other].version == 3
    assert seen[key].state is State.UNCERTAIN
    assert latest_states(cfg)[other].state is State.UNCERTAIN

    sink = StateSink(cfg, f"sqlite:///{tmp_path / 'sink.db'}")
    try:
        stats = sink.run(once=True)
    finally:
        sink.close()
    assert stats.skipped == 0 and stats.records >= 2
    with sqlite3.connect(tmp_path / "sink.db") as db:
        rows = dict(db.execute("SELECT effect_id, state FROM effects WHERE effect_id IN (?, ?)", (key, other)))
    assert rows == {key: "UNCERTAIN", other: "UNCERTAIN"}

    # The dead letter was the only one: nothing of the newer writer's was refused.
    with TopicReader(cfg, cfg.topics.dlq) as dlq_again:
        assert len(dlq_again.drain()) == 1


def test_a_reader_fails_typed_and_bounded_when_the_schema_is_absent(kafka_config: KafkaConfig) -> None:
    unpublished = newer("Timeout")
    data = encode(
        unpublished,
        {"event_id": "t", "effect_id": "k", "at_ms": 1, "attempt": 1, "phase": "CALL", "deadline_ms": 1, "region": "x"},
    )
    codec = kafka_codec(kafka_config)
    try:
        codec.decode(data)
    except UnknownSchema as e:
        assert e.fingerprint == schema_fingerprint(unpublished)
        assert "not in the schemas topic" in str(e)
    else:
        raise AssertionError("an unpublished schema must not decode")
    # Published later (a writer that starts now): the next record with it decodes.
    publish_schemas(kafka_config, [unpublished])

    def decoded() -> Any:
        try:
            return codec.decode(data)
        except UnknownSchema:
            return None  # within the miss window, the topic is not read again

    back = wait_for(decoded, 30, "the published schema to be learned")
    assert back.effect_id == "k"

"""Fault: the processor folds any record type found on ``effects.events`` (issue 10, item 9).

An ``UncertainEffect`` or ``EffectState`` as a key's first record was folded as a fact: every later
real event of the key was dead-lettered, the lookup failed, and an SDK that looked the key up copied
the poison into its own ledger. A ``DeadLetter`` record crashed the fold agent (skipped on restart,
never dead-lettered). Only events are folded; anything else goes to ``effects.dlq`` with the reason
and the stream goes on.
"""

from __future__ import annotations

import asyncio
import base64
import sqlite3
import struct
import time
from pathlib import Path
from typing import Any

import pytest

from effect_ledger.core.effect import apply
from effect_ledger.core.model import (
    DeadLetter,
    EffectState,
    Intent,
    State,
    UncertainEffect,
    is_event,
)
from effect_ledger.core.reconcile import Target
from effect_ledger.processors import table_value
from effect_ledger.sdk.ledger import Ledger
from effect_ledger.streams.codec import default_codec
from effect_ledger.streams.config import KafkaConfig
from effect_ledger.streams.partition import partition_for
from tests.services import Processor, wait_for
from tests.topic_io import RawProducer, TopicReader, running

WAIT = 60.0
REQUEST = {"order": "o-1", "amount": 100}


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def wrong_records(key: str) -> dict[str, Any]:
    """One record of every type that is not an event, as it would appear on the wrong topic."""
    t = now_ms()
    return {
        "UncertainEffect": UncertainEffect(
            f"uncertain:1:0:{key}", key, t, 1, "payments", "refund.create", "{}", "d" * 64, "poison", t, t
        ),
        "EffectState": EffectState(
            key,
            State.CONFIRMED,
            "payments",
            "refund.create",
            "default",
            "r",
            "s",
            "d" * 64,
            1,
            1,
            t,
            t,
            receipt_id="re_forged",
        ),  # fmt: skip
        "DeadLetter": DeadLetter(t, "someone", "elsewhere", 0, 7, "copied here by mistake", key.encode(), b"x"),
    }


def test_non_event_records_are_dead_lettered_and_the_key_folds_right(kafka_config: KafkaConfig, tmp_path: Path) -> None:
    """Each wrong type as a key's first record, then the key's real events (an SDK execute): the
    key's state is right, each wrong record is in the DLQ with the reason, the processor keeps
    running, and an agent on another host that looks the key up gets the receipt without calling
    and stores nothing but events."""
    cfg = kafka_config
    codec = default_codec()
    proc = Processor(cfg, tmp_path / "data")
    keys = {kind: f"payments:first-is-{kind}" for kind in ("UncertainEffect", "EffectState", "DeadLetter")}
    with (
        running(proc),
        TopicReader(cfg, cfg.topics.dlq) as dlq,
        TopicReader(cfg, cfg.topics.state) as states,
        TopicReader(cfg, cfg.topics.events) as events,
    ):
        proc.wait_ready()
        producer = RawProducer(cfg)
        for kind, key in keys.items():
            kb, value = key.encode(), codec.encode(wrong_records(key)[kind])
            producer.raw(cfg.topics.events, kb, value, partition_for(kb, cfg.partitions))
        producer.flush()
        wrong = events.until(lambda rs: len(rs) == 3 and rs, 10, "the three wrong records")
        offsets = {r.key: r.offset for r in wrong}

        async def execute(db: str, **kw: Any) -> dict[str, Any]:
            calls: list[str] = []
            out = {}
            async with await Ledger.open(db, kafka=cfg, sync=True, targets=[Target("payments")], **kw) as ledger:
                for key in keys.values():
                    c = await ledger.execute(
                        target="payments", operation="refund.create", key=key, request=REQUEST,
                        call=lambda k: calls.append(k) or {"id": f"re_{k[-6:]}"},
                    )  # fmt: skip
                    out[key] = (c.receipt_id, c.called)
            return {"confirmations": out, "calls": calls}

        first = asyncio.run(execute(str(tmp_path / "host-1.db")))
        assert sorted(first["calls"]) == sorted(keys.values())

        # effects.state: every key CONFIRMED from its three real events, the wrong record not among them.
        def confirmed() -> Any:
            states.poll()
            latest = states.latest()
            return all((s := latest.get(k)) and s.state is State.CONFIRMED for k in keys.values()) and latest

        latest = wait_for(confirmed, WAIT, "every key CONFIRMED on effects.state")
        for key in keys.values():
            st = latest[key]
            assert (st.version, st.executions, st.receipt_id) == (3, 1, f"re_{key[-6:]}"), st

        # Each wrong record in the DLQ, with the reason; nothing else there.
        letters = dlq.until(lambda rs: len(rs) >= 3 and rs, WAIT, "three dead letters")
        for r in letters:
            d = r.value
            assert isinstance(d, DeadLetter) and d.topic == cfg.topics.events, r
            assert d.offset == offsets[r.key] and "is not an event" in d.error, d
        assert sorted(r.key for r in letters) == sorted(k.encode() for k in keys.values())
        dlq.drain()
        assert len(dlq.records) == 3

        # The processor kept running (the DeadLetter record used to crash its agent), and its
        # lookup hands out only events.
        assert proc.alive and (proc.health() or {}).get("ready")
        for key in keys.values():
            status, body = proc.lookup(key)
            assert status == 200 and body["state"] == "CONFIRMED", body
            decoded = [codec.decode(base64.b64decode(b)) for b in body["events"]]
            # The agent's three events and the processor's verdict on the claim of attempt 1.
            assert len(decoded) == 4 and all(is_event(e) for e in decoded), decoded

        # Another host, an empty file: it looks the keys up, returns the receipts without calling,
        # and its file holds only events.
        host2 = str(tmp_path / "host-2.db")
        second = asyncio.run(execute(host2, lookup=proc.url))
        assert second["calls"] == []
        assert second["confirmations"] == {k: (first["confirmations"][k][0], False) for k in keys.values()}
        with sqlite3.connect(host2) as conn:
            kinds = {k for (k,) in conn.execute("SELECT DISTINCT kind FROM events")}
        assert kinds <= {"Intent", "Executed", "Receipt", "Claimed"}, kinds


def test_a_table_poisoned_before_the_fix_serves_and_folds_only_events() -> None:
    """A processor table written before non-events were refused (format 1: the key's records,
    concatenated) may hold one as a key's first record: reading it skips it, so the folded effect
    (what the lookup hands out, and what is written back in format 4) holds only the event."""
    codec = default_codec()
    key = "payments:old-poison"
    poison = codec.encode(wrong_records(key)["UncertainEffect"])
    t = now_ms()
    real = codec.encode(
        Intent("i-1", key, t, 1, "payments", "refund.create", "default", "r", "s", "{}", "d" * 64, t + 60_000, "w")
    )
    value = struct.pack(">Bq", 1, t + 60_000) + b"".join(struct.pack(">I", len(b)) + b for b in (poison, real))
    assert table_value.due_of_value(value) == t + 60_000
    effect = table_value.decode(value, codec.decode)
    assert effect is not None and effect.state is State.PENDING and effect.version == 1
    assert [codec.encode(f) for f in effect.facts] == [real]
    again = table_value.decode(table_value.encode(effect, t + 60_000), codec.decode)
    assert again == effect


@pytest.mark.parametrize("kind", ["UncertainEffect", "EffectState", "DeadLetter"])
def test_the_fold_refuses_a_record_that_is_not_an_event(kind: str) -> None:
    """At the pure core: ``apply`` raises TypeError for a non-event, first or later, so no caller
    (the processor, the SDK's store, the operator tools) can fold one as a fact."""
    record = wrong_records("payments:k")[kind]
    with pytest.raises(TypeError, match="is not an event"):
        apply(None, record)

"""Retention with the real broker and a real ``effects worker``: one sweep retires a closed effect
and every reader agrees afterwards. The processor's lookup answers 410 (also after a fresh worker
rebuilt its table from the changelog), ``effects.state`` carries the tombstone, the SQL sink deletes
the row, a compacted read drops the key, an agent on another host gets ``EffectRetired`` without
calling the destination, an old event of the key is dead-lettered, and the audit of
``effects.events`` still counts the retired effect and reads the command as no damage. An open
effect of the same age is not retired. Every wait polls a condition against a deadline."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest

from effect_ledger.core.model import DeadLetter, Intent, State
from effect_ledger.errors import EffectRetired, EffectUncertain
from effect_ledger.ops.audit import audit
from effect_ledger.ops.retire import sweep
from effect_ledger.ops.sink import StateSink
from effect_ledger.ops.sources import latest_states, replay_events
from effect_ledger.sdk.ledger import Ledger
from effect_ledger.streams.config import KafkaConfig
from tests.sdk_contract import DECLARED
from tests.services import Processor, wait_for
from tests.topic_io import RawProducer, TopicReader, recorded_times, running

WAIT = 60.0
DAY = 24 * 3600 * 1000


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def sink_rows(cfg: KafkaConfig, path: Path) -> dict[str, str]:
    sink = StateSink(cfg, f"sqlite:///{path}")
    try:
        sink.run(once=True)
    finally:
        sink.close()
    with sqlite3.connect(path) as conn:
        return dict(conn.execute("SELECT effect_id, state FROM effects").fetchall())


def test_a_retired_effect_is_retired_for_every_reader(kafka_config: KafkaConfig, tmp_path: Path) -> None:
    cfg = kafka_config
    recorded_times(cfg)  # the sweep's command says "two days later": its time must be the one folded
    proc = Processor(cfg, tmp_path / "data")
    with running(proc):
        proc.wait_ready()

        async def agent() -> tuple[str, str, list[Any]]:
            async with await Ledger.open(str(tmp_path / "agent.db"), targets=DECLARED, kafka=cfg, sync=True) as led:
                done = await led.execute(
                    target="payments", operation="refund.create", run_id="r", step="closed",
                    request={"order": "1"}, call=lambda key: {"id": "re_closed"},
                )  # fmt: skip

                def lost(key: str) -> Any:
                    raise ConnectionError("connection reset")

                with pytest.raises(EffectUncertain):
                    await led.execute(
                        target="payments", operation="refund.create", run_id="r", step="open",
                        request={"order": "2"}, call=lost,
                    )  # fmt: skip
                (open_key,) = [
                    r["effect_id"]
                    for r in await led.store.query("SELECT effect_id FROM effects WHERE state = 'UNCERTAIN'")
                ]
                deadline = time.monotonic() + WAIT
                while await led.store.outbox_depth() > 0:
                    assert time.monotonic() < deadline, "the relay did not deliver"
                    await asyncio.sleep(0.02)
                intents = [ev for _, ev, _ in await led.store.events(done.effect_id) if isinstance(ev, Intent)]
                return done.effect_id, open_key, intents

        closed, still_open, intents = asyncio.run(agent())

        def folded() -> bool:
            states = latest_states(cfg)
            return closed in states and states[closed].state is State.CONFIRMED and still_open in states

        wait_for(folded, WAIT, "both effects on effects.state")
        db = tmp_path / "ops.db"
        assert sink_rows(cfg, db) == {closed: "CONFIRMED", still_open: "UNCERTAIN"}

        # Two days later, with a retention of one day: the closed effect is due, the open one never.
        due = sweep(cfg, DAY, "test", now_ms=now_ms() + 2 * DAY)
        assert [s.effect_id for s in due] == [closed]

        state_topic = TopicReader(cfg, cfg.topics.state)
        try:
            state_topic.until(
                lambda rs: any(r.key == closed.encode() and r.raw is None for r in rs), WAIT, "the tombstone"
            )
        finally:
            state_topic.close()
        status, body = wait_for(lambda: (lambda a: a if a[0] == 410 else None)(proc.lookup(closed)), WAIT, "410")
        assert body["retired"] is True and body["state"] == "CONFIRMED" and body["receipt_id"] == "re_closed"
        assert proc.lookup(still_open)[0] == 200

        # The sink deletes the row; a compacted read drops the key; the open effect stays in both.
        assert sink_rows(cfg, db) == {still_open: "UNCERTAIN"}
        states = latest_states(cfg)
        assert closed not in states and still_open in states

        # An agent on another host, same key: refused, the destination never called.
        calls: list[str] = []

        async def elsewhere() -> None:
            async with await Ledger.open(
                str(tmp_path / "other.db"), targets=DECLARED, kafka=cfg, lookup=proc.url
            ) as led:
                with pytest.raises(EffectRetired) as info:
                    await led.execute(
                        target="payments", operation="refund.create", run_id="r", step="closed",
                        request={"order": "1"}, call=lambda key: calls.append(key) or {"id": "twice"},
                    )  # fmt: skip
                assert info.value.state == "CONFIRMED"

        asyncio.run(elsewhere())
        assert calls == []

        # An old event of the key (a replay, an agent without a lookup): dead-lettered, not folded.
        producer = RawProducer(cfg)
        producer.event(intents[0])
        producer.flush()
        dlq = TopicReader(cfg, cfg.topics.dlq)
        try:
            letter = dlq.until(
                lambda rs: next(
                    (r.value for r in rs if isinstance(r.value, DeadLetter) and "retired" in r.value.error), None
                ),
                WAIT,
                "the dead letter of the retired key's event",
            )
        finally:
            dlq.close()
        assert closed in letter.error
        assert proc.lookup(closed)[0] == 410

    # A fresh worker rebuilds its table from the changelog: the key is still retired there.
    (tmp_path / "fresh").mkdir()
    fresh = Processor(cfg, tmp_path / "fresh" / "data")
    with running(fresh):
        fresh.wait_ready()
        status, body = fresh.lookup(closed)
        assert status == 410 and body["retired"] is True

    # The event record is untouched (the audit still proves what happened); the command is no damage.
    report = audit(replay_events(cfg, None), 0, now_ms() + 1, now_ms() + 1)
    assert report.undecodable == 0
    assert {c.name: c.numerator for c in report.checks}["keyed_writes"] == 2


# -- erasure on Kafka: one command reaches every copy ---------------------------------------------


def test_erasing_a_subject_on_kafka_leaves_its_bodies_unreadable_and_the_audit_whole(
    kafka_config: KafkaConfig, tmp_path: Path
) -> None:
    from click.testing import CliRunner

    from effect_ledger.cli.main import main
    from effect_ledger.core.bodies import BodyMode, BodyPolicy
    from effect_ledger.core.reconcile import Target
    from effect_ledger.errors import BodyErased
    from effect_ledger.sdk import erasure
    from effect_ledger.sdk.kafka.keyring import KafkaKeyring

    cfg = kafka_config
    email = "jane.doe@example.com"
    target = Target("payments", body=BodyPolicy(BodyMode.ENCRYPT, subject="customer.id"))

    async def agents() -> None:
        # Two agents on two "hosts" (two files): the same subject gets one key, from the topic.
        for host, (step, customer) in enumerate((("a", "cus_42"), ("b", "cus_42"), ("c", "cus_7"))):
            path = str(tmp_path / f"agent-{host}.db")
            async with await Ledger.open(path, targets=[target], kafka=cfg, sync=True) as led:
                await led.execute(
                    target="payments", operation="refund.create", run_id="r", step=step,
                    request={"order": step, "customer": {"id": customer, "email": email}},
                    call=lambda key: {"id": f"re_{key[-6:]}"},
                )  # fmt: skip
                deadline = time.monotonic() + WAIT
                while await led.store.outbox_depth() > 0:
                    assert time.monotonic() < deadline, "the relay did not deliver"
                    await asyncio.sleep(0.02)

    asyncio.run(agents())
    events = TopicReader(cfg, cfg.topics.events)
    try:
        events.until(lambda rs: len([r for r in rs if isinstance(r.value, Intent)]) == 3, WAIT, "three intents")
        intents = sorted(events.values(Intent), key=lambda i: i.step)
        assert all(email.encode() not in (r.raw or b"") for r in events.records)  # never on effects.events
    finally:
        events.close()
    assert len({erasure.key_id(i.request) for i in intents}) == 2  # one key per subject, across hosts

    async def opened(keyring: KafkaKeyring) -> list[Any]:
        out: list[Any] = []
        for i in intents:
            try:
                out.append((await erasure.open_body(keyring, i.effect_id, i.request, i.request_digest))["order"])
            except BodyErased:
                out.append(None)
        return out

    assert asyncio.run(opened(KafkaKeyring(cfg))) == ["a", "b", "c"]
    r = CliRunner().invoke(
        main, ["erase", "--bootstrap", cfg.bootstrap, "--prefix", cfg.prefix, "--subject", "cus_42", "--json"]
    )
    assert r.exit_code == 0, r.output
    assert json.loads(r.output) == {"subject_keys_erased": 1}
    # A reader starting now (a reconciler, an auditor) can open the other subject's body only.
    assert asyncio.run(opened(KafkaKeyring(cfg))) == [None, None, "c"]

    report = audit(replay_events(cfg, None), 0, now_ms() + 1, now_ms() + 1)
    assert report.passed and report.undecodable == 0
    assert {c.name: c.numerator for c in report.checks}["receipts"] == 3

"""One row Kafka refuses cannot block the relay (issue 10, item 5, the relay side). Real broker.

Before the fix a row the producer or the broker refused (MSG_SIZE_TOO_LARGE) failed the whole
batch, the relay retried it for ever, and every later event stayed in the outbox (with
``sync=True`` every later execute failed). Now a row refused for good is dead-lettered: marked in
the outbox with the reason (``sent = 2`` and a ``dead_letters`` row), copied, bounded, to
``effects.dlq``, and the relay goes on, the other rows in their order.

The poison rows are forced into the outbox through the store, past the SDK's own size checks (as a
file written by an older version, or a broker whose limit is lower than the SDK's, would hold).
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource

from effect_ledger.core.keys import canonical_json, digest, effect_key
from effect_ledger.core.model import DeadLetter, Intent, State
from effect_ledger.core.reconcile import Target
from effect_ledger.errors import LedgerUnavailable
from effect_ledger.sdk.ledger import Ledger
from effect_ledger.sdk.store.sqlite import ClaimOp
from effect_ledger.streams.codec import default_codec
from effect_ledger.streams.config import KafkaConfig
from tests.integration.test_relay import TopicReader, check_records, outbox, read_topic

pytestmark = pytest.mark.integration

codec = default_codec()
TIMEOUT = 30.0


def poison_intent(key: str, size: int, now_ms: int) -> Intent:
    """An intent whose encoded event is exactly ``size`` bytes."""

    def intent(blob: int) -> Intent:
        canonical = canonical_json({"blob": "x" * blob})
        return Intent(
            "0" * 32,
            key,
            now_ms,
            1,
            "payments",
            "refund.create",
            "default",
            "run-poison",
            key,
            canonical,
            digest(canonical),
            now_ms + 30_000,
            "elsewhere:1:1:dead",
        )

    overhead = len(codec.encode(intent(size))) - size  # the same for every size in one varint range
    made = intent(size - overhead)
    assert len(codec.encode(made)) == size
    return made


def dead_rows(path: str | Path) -> list[tuple[int, str, int, str]]:
    """(seq, effect_id, sent, reason) of the dead-lettered rows."""
    conn = sqlite3.connect(str(path))
    try:
        return conn.execute(
            "SELECT e.seq, e.effect_id, e.sent, d.reason FROM events e JOIN dead_letters d ON d.seq = e.seq "
            "ORDER BY e.seq"
        ).fetchall()
    finally:
        conn.close()


def set_topic_limit(cfg: KafkaConfig, max_message_bytes: int) -> None:
    """Lower the events topic's ``max.message.bytes``, and wait until the broker reports it."""
    admin = AdminClient(cfg.confluent())
    resource = ConfigResource(
        ConfigResource.Type.TOPIC,
        cfg.topics.events,
        incremental_configs=[
            ConfigEntry("max.message.bytes", str(max_message_bytes), incremental_operation=AlterConfigOpType.SET)
        ],
    )
    for fut in admin.incremental_alter_configs([resource]).values():
        fut.result(timeout=TIMEOUT)
    deadline = time.monotonic() + TIMEOUT
    while True:
        described = admin.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, cfg.topics.events)])
        entries = next(iter(described.values())).result(timeout=TIMEOUT)
        if entries["max.message.bytes"].value == str(max_message_bytes):
            return
        assert time.monotonic() < deadline, "the topic limit never showed"
        time.sleep(0.05)


async def wait_until_drained(ledger: Ledger, what: str) -> None:
    end = time.monotonic() + TIMEOUT
    while await ledger.store.outbox_depth() > 0:
        assert time.monotonic() < end, f"outbox still holds {await ledger.store.outbox_depth()} rows: {what}"
        await asyncio.sleep(0.05)


async def call(key: str) -> dict[str, Any]:
    return {"id": f"re_{key[-8:]}"}


def dlq_records(cfg: KafkaConfig) -> list[tuple[bytes | None, DeadLetter]]:
    reader = TopicReader(cfg, cfg.topics.dlq)
    try:
        return [(m.key(), codec.decode(m.value())) for m in reader.read_to_end()]
    finally:
        reader.close()


@pytest.mark.parametrize(
    ("size", "topic_limit", "refused_by"),
    [(2 * 1024 * 1024, None, "relay"), (999_990, None, "producer"), (700_000, 600_000, "broker")],
    ids=["2MB-over-MAX_EVENT_BYTES", "999990B-refused-by-the-producer", "700KB-refused-by-the-broker"],
)
def test_an_oversized_outbox_row_is_dead_lettered_and_the_next_50_effects_reach_kafka(
    kafka_config: KafkaConfig, tmp_path: Path, size: int, topic_limit: int | None, refused_by: str
) -> None:
    if topic_limit is not None:
        set_topic_limit(kafka_config, topic_limit)
    path = str(tmp_path / "effects.db")
    poison_key = f"poison-{refused_by}"
    keys: list[str] = []

    async def body() -> None:
        async with await Ledger.open(path, kafka=kafka_config, targets=[Target("payments")]) as ledger:
            now = ledger.now_ms()
            await ledger.store.append(None, [poison_intent(poison_key, size, now)], now_ms=now, claim_op=ClaimOp.KEEP)
            for i in range(50):
                c = await ledger.execute(
                    target="payments",
                    operation="refund.create",
                    run_id="run-poison",
                    step=f"after-{i}",
                    request={"i": i},
                    call=call,
                    timeout=30.0,
                )
                keys.append(c.effect_id)
            # A later event of the poisoned key itself still goes out, after the dead row.
            await ledger.record_receipt(poison_key, "re_poison", {"id": "re_poison"}, attempt=1)
            await wait_until_drained(ledger, "a refused row must not block the others")
            assert ledger.relay is not None and ledger.relay.stats.dead_letters == 1

    asyncio.run(body())
    rows = outbox(path)
    dead = dead_rows(path)
    assert [(effect_id, sent) for _, effect_id, sent, _ in dead] == [(poison_key, 2)]
    assert "MSG_SIZE_TOO_LARGE" in dead[0][3] or "too large" in dead[0][3].lower(), dead[0][3]
    delivered = [r for r in rows if r[0] != dead[0][0]]
    assert len(delivered) == 50 * 3 + 1 and all(r[4] == 1 for r in delivered)
    seen = check_records(delivered, read_topic(kafka_config), kafka_config.partitions)
    assert sum(seen.values()) >= len(delivered)
    letters = dlq_records(kafka_config)
    assert len(letters) == 1
    key, letter = letters[0]
    assert key == poison_key.encode() and letter.topic == kafka_config.topics.events
    assert letter.offset == dead[0][0] and letter.error == dead[0][3]
    assert letter.value is not None and len(letter.value) <= 64 * 1024 < size


def test_with_sync_a_dead_lettered_row_does_not_fail_later_executes(kafka_config: KafkaConfig, tmp_path: Path) -> None:
    path = str(tmp_path / "effects.db")
    calls: list[str] = []

    async def counted(key: str) -> dict[str, Any]:
        calls.append(key)
        return {"id": "re_1"}

    async def body() -> None:
        ledger = await Ledger.open(
            path, kafka=kafka_config, targets=[Target("payments")], sync=True, sync_timeout=TIMEOUT
        )
        try:
            now = ledger.now_ms()
            await ledger.store.append(None, [poison_intent("poison-sync", 2 * 1024 * 1024, now)], now_ms=now)
            for i in range(3):
                c = await ledger.execute(
                    target="payments",
                    operation="refund.create",
                    run_id="run-sync",
                    step=f"s-{i}",
                    request={"i": i},
                    call=counted,
                    timeout=30.0,
                )
                assert c.called
            assert len(calls) == 3
        finally:
            await ledger.close()

    asyncio.run(body())
    assert [effect_id for _, effect_id, _, _ in dead_rows(path)] == ["poison-sync"]


def test_with_sync_an_intent_the_broker_refuses_is_never_called(kafka_config: KafkaConfig, tmp_path: Path) -> None:
    """The broker's limit is below what the SDK accepts: the intent cannot reach Kafka, so the
    destination must not be called (the intent is dead-lettered, the effect FAILED)."""
    set_topic_limit(kafka_config, 100_000)
    path = str(tmp_path / "effects.db")
    calls: list[str] = []

    async def counted(key: str) -> dict[str, Any]:
        calls.append(key)
        return {"id": "re_1"}

    async def body() -> None:
        ledger = await Ledger.open(
            path, kafka=kafka_config, targets=[Target("payments")], sync=True, sync_timeout=TIMEOUT
        )
        try:
            with pytest.raises(LedgerUnavailable, match="refused"):
                await ledger.execute(
                    target="payments",
                    operation="refund.create",
                    run_id="run-sync",
                    step="big",
                    request={"blob": "x" * 150_000},
                    call=counted,
                    timeout=30.0,
                )
            assert calls == []
            effect = await ledger.get(effect_key("payments", "refund.create", "run-sync", "big"))
            assert effect is not None and effect.state is State.FAILED
            small = await ledger.execute(
                target="payments",
                operation="refund.create",
                run_id="run-sync",
                step="small",
                request={"i": 1},
                call=counted,
                timeout=30.0,
            )
            assert small.called and calls == [small.effect_id]
        finally:
            await ledger.close()

    asyncio.run(body())


@pytest.mark.parametrize(("size", "topic_limit"), [(999_990, None), (700_000, 600_000)], ids=["producer", "broker"])
def test_a_refused_row_in_the_middle_of_a_batch_leaves_the_rest_in_order(
    kafka_config: KafkaConfig, tmp_path: Path, size: int, topic_limit: int | None
) -> None:
    """``effects relay --db`` on a file written without a broker: one batch, the refused rows among
    the others (on every partition, some on the refused rows' own keys). Everything else arrives,
    per key in seq order, and the CLI reports the dead letters."""
    from tests.integration.test_relay import cli

    if topic_limit is not None:
        set_topic_limit(kafka_config, topic_limit)
    path = str(tmp_path / "effects.db")
    poisoned: list[str] = []

    async def write() -> None:
        async with await Ledger.open(path, targets=[Target("payments")]) as ledger:  # embedded: no relay
            for i in range(40):
                c = await ledger.execute(
                    target="payments",
                    operation="refund.create",
                    run_id="run-mid",
                    step=f"s-{i}",
                    request={"i": i},
                    call=call,
                    timeout=30.0,
                )
                if i % 13 == 5:  # a refused row on a key that has events before and after it
                    now = ledger.now_ms()
                    bad = poison_intent(c.effect_id, size, now)
                    bad = Intent(f"poison-{i}", *[getattr(bad, f) for f in bad.__dataclass_fields__][1:])
                    await ledger.store.append(await ledger.get(c.effect_id), [bad], now_ms=now, claim_op=ClaimOp.KEEP)
                    await ledger.record_receipt(c.effect_id, f"re_late_{i}", {"late": i}, attempt=1)
                    poisoned.append(c.effect_id)

    asyncio.run(write())
    proc, _ = cli("relay", "--db", path, "--bootstrap", kafka_config.bootstrap, "--prefix", kafka_config.prefix)
    assert proc.returncode == 0, proc.stderr
    assert f"dead-lettered {len(poisoned)} events Kafka refused" in proc.stdout, proc.stdout
    dead = dead_rows(path)
    assert [effect_id for _, effect_id, _, _ in dead] == poisoned
    delivered = [r for r in outbox(path) if r[0] not in {d[0] for d in dead}]
    assert len(delivered) == 40 * 3 + len(poisoned) and all(r[4] == 1 for r in delivered)
    check_records(delivered, read_topic(kafka_config), kafka_config.partitions)  # per key in seq order
    assert sorted(k for k, _ in dlq_records(kafka_config)) == sorted(p.encode() for p in poisoned)


def test_a_topic_limit_lowered_under_a_running_relay_dead_letters_only_the_row_at_fault(
    kafka_config: KafkaConfig, tmp_path: Path
) -> None:
    """The relay fitted its producer to the topic's limit, then the limit is lowered: the broker
    refuses whole batches, the rows that came with the oversized one included. Only the row refused
    on its own is dead-lettered; every other row reaches Kafka (their per-key order may suffer once,
    see the relay's docstring, so it is not checked here)."""
    from effect_ledger.sdk.kafka.relay import Relay

    path = str(tmp_path / "effects.db")
    poisoned: list[str] = []

    async def body() -> None:
        async with await Ledger.open(path, targets=[Target("payments")]) as ledger:  # embedded: no relay
            relay = Relay(ledger.store, kafka_config)
            try:
                for i in range(3):
                    await ledger.execute(
                        target="payments",
                        operation="refund.create",
                        run_id="run-low",
                        step=f"w-{i}",
                        request={"i": i},
                        call=call,
                        timeout=30.0,
                    )
                assert await relay.drain() == 9  # fitted to the topic's limit as it was (Kafka's default)
                await asyncio.to_thread(set_topic_limit, kafka_config, 600_000)
                for i in range(40):
                    await ledger.execute(
                        target="payments",
                        operation="refund.create",
                        run_id="run-low",
                        step=f"s-{i}",
                        request={"i": i},
                        call=call,
                        timeout=30.0,
                    )
                    if i == 20:
                        now = ledger.now_ms()
                        await ledger.store.append(None, [poison_intent("poison-low", 700_000, now)], now_ms=now)
                        poisoned.append("poison-low")
                assert await relay.drain() == 40 * 3
                assert relay.stats.dead_letters == 1
            finally:
                await relay.stop(1.0)

    asyncio.run(body())
    dead = dead_rows(path)
    assert [effect_id for _, effect_id, _, _ in dead] == poisoned
    delivered = [r for r in outbox(path) if r[2] not in poisoned]
    assert len(delivered) == 43 * 3 and all(r[4] == 1 for r in delivered)
    on_topic = {codec.decode(m.value()).event_id for m in read_topic(kafka_config)}
    assert {r[1] for r in delivered} <= on_topic

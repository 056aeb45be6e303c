"""The SDK contract (``tests/sdk_contract.py``) against the Kafka-mode ledger: ``Ledger.open`` on a
SQLite file that is also an outbox, relayed to a real broker, with ``sync=True`` (every intent is
acknowledged by Kafka before the destination is called).

On top of the contract, the Kafka mode promises that nothing stays behind in the outbox: after each
ledger is closed its file holds no row with ``sent = 0``, and at the end of the module every
``event_id`` written to any of the files is on ``effects.events``.

All tests share one topic prefix (module scope: creating four topics per test would dominate the
run time). Keys repeat across tests, which is fine: each test has its own SQLite file and nothing
here looks keys up on the processor.
"""

from __future__ import annotations

import sqlite3
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition

from effect_ledger.sdk.ledger import DEFAULT_CONFIRM_WITHIN_S, Ledger
from effect_ledger.streams.admin import delete_topics, ensure_topics
from effect_ledger.streams.codec import default_codec
from effect_ledger.streams.config import KafkaConfig
from tests.sdk_contract import _RACE_SCRIPT, DECLARED, LedgerContract

TIMEOUT = 30.0


@dataclass
class KafkaMode:
    cfg: KafkaConfig
    files: list[str] = field(default_factory=list)  # every SQLite file a test of this module wrote

    def register(self, path: str) -> None:
        if path not in self.files:
            self.files.append(path)


@pytest.fixture(scope="module")
def kafka_mode(kafka_bootstrap: str) -> Iterator[KafkaMode]:
    cfg = KafkaConfig(bootstrap=kafka_bootstrap, prefix=f"t{uuid.uuid4().hex[:12]}.", partitions=3)
    ensure_topics(cfg)
    try:
        yield KafkaMode(cfg)
    finally:
        delete_topics(cfg, list(cfg.topics.all()))


def unsent_rows(path: str) -> list[tuple[int, str, str]]:
    """(seq, effect_id, kind) of every row of the outbox the relay has not had acknowledged."""
    conn = sqlite3.connect(path)
    try:
        return conn.execute("SELECT seq, effect_id, kind FROM events WHERE sent = 0 ORDER BY seq").fetchall()
    finally:
        conn.close()


def event_ids(path: str) -> list[str]:
    if not Path(path).exists():
        return []
    conn = sqlite3.connect(path)
    try:
        return [r[0] for r in conn.execute("SELECT event_id FROM events ORDER BY seq")]
    finally:
        conn.close()


def consume_all(cfg: KafkaConfig, topic: str) -> list[Any]:
    """Every record of ``topic``: read each partition from the beginning up to the high watermark
    seen at the start."""
    consumer = Consumer(
        cfg.confluent(
            **{
                "group.id": f"g-{uuid.uuid4().hex[:12]}",
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
            }
        )
    )
    try:
        md = consumer.list_topics(topic, timeout=TIMEOUT)
        partitions = sorted(md.topics[topic].partitions)
        deadline = time.monotonic() + TIMEOUT
        high: dict[int, int] = {}
        for p in partitions:
            while p not in high:
                try:
                    high[p] = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=5)[1]
                except KafkaException as e:  # stale metadata (no or an old leader): retry
                    if not e.args[0].retriable() and e.args[0].code() != KafkaError.NOT_LEADER_FOR_PARTITION:
                        raise
                    assert time.monotonic() < deadline, f"no watermark for {topic}[{p}]: {e}"
                    time.sleep(0.05)
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        position = {p: 0 for p in partitions}
        out: list[Any] = []
        while any(position[p] < high[p] for p in partitions):
            assert time.monotonic() < deadline, f"read {position} of {high} within {TIMEOUT} s"
            msg = consumer.poll(0.2)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            out.append(msg)
            position[msg.partition()] = msg.offset() + 1
        return out
    finally:
        consumer.close()


class TestKafkaLedger(LedgerContract):
    @pytest.fixture(autouse=True)
    def _kafka_mode(self, kafka_mode: KafkaMode) -> Iterator[None]:
        self.mode = kafka_mode
        self.files: list[str] = []
        yield
        # Also covers files written only by child processes (the race), which this class never closes.
        left = {p: unsent_rows(p) for p in self.files if Path(p).exists()}
        assert {p: rows for p, rows in left.items() if rows} == {}, "outbox not drained after the test"

    deadline_extra_ms = int(DEFAULT_CONFIRM_WITHIN_S * 1000)  # sync=True, the default confirm_within

    async def open_ledger(self, path: str, **kwargs: Any) -> Ledger:
        kwargs.setdefault("targets", DECLARED)
        ledger = await Ledger.open(path, kafka=self.mode.cfg, sync=True, **kwargs)
        self.mode.register(path)
        if path not in self.files:
            self.files.append(path)
        close = ledger.close

        async def close_and_check() -> None:
            await close()
            # Ledger.close stops the relay after it drained the outbox: nothing may stay unsent.
            assert unsent_rows(path) == [], f"outbox of {path} not drained after close"

        ledger.close = close_and_check  # type: ignore[method-assign]
        return ledger

    def race_command(self, db: str, me: str, workdir: Path) -> list[str]:
        """The racing processes open the file in Kafka mode too (same topics, sync=True)."""
        script = workdir / "race_kafka.py"
        if not script.exists():
            embedded = 'ledger = await Ledger.open(db, targets=[Target("payments")])'
            assert _RACE_SCRIPT.count(embedded) == 1, "the contract's race script changed: adapt this override"
            cfg = self.mode.cfg
            kafka = (
                f"ledger = await Ledger.open(db, kafka=KafkaConfig(bootstrap={cfg.bootstrap!r}, "
                f"prefix={cfg.prefix!r}, partitions={cfg.partitions}), sync=True, targets=[Target('payments')])"
            )
            imports = "from effect_ledger.sdk.ledger import Ledger"
            text = _RACE_SCRIPT.replace(embedded, kafka).replace(
                imports, f"{imports}\nfrom effect_ledger.streams.config import KafkaConfig"
            )
            script.write_text(text)
        self.mode.register(db)
        if db not in self.files:
            self.files.append(db)
        return [sys.executable, str(script), db, me, str(workdir)]


def test_every_event_written_to_the_files_is_on_kafka(kafka_mode: KafkaMode, tmp_path: Path) -> None:
    """Runs after the contract (module order): every event_id of every file is on effects.events
    (decisions on effects.decisions).
    Run on its own, it first writes a few effects of its own."""
    if not kafka_mode.files:
        import asyncio

        async def write(path: str) -> None:
            async with await Ledger.open(path, kafka=kafka_mode.cfg, sync=True, targets=DECLARED) as ledger:
                for i in range(3):
                    await ledger.execute(
                        target="payments", operation="refund.create", run_id="alone", step=f"s{i}",
                        request={"i": i}, call=lambda key: {"id": f"re-{key[-6:]}"},
                    )  # fmt: skip

        path = str(tmp_path / "alone.db")
        asyncio.run(write(path))
        kafka_mode.register(path)
    # Some event ids are derived from the effect (a Timeout's, a Resolution's), so the same id may be
    # written to several files (tests reuse keys and the fake clock), as the same event: each file
    # relays its copy. ``written`` counts the files holding each id.
    written: Counter[str] = Counter()
    for path in kafka_mode.files:
        written.update(set(event_ids(path)))
    assert written, "the contract wrote no events"
    codec = default_codec()
    topics = kafka_mode.cfg.topics
    on_kafka: Counter[str] = Counter()
    for topic in (topics.events, topics.decisions):  # a person's decision is relayed to its own topic
        records = [codec.decode(msg.value()) for msg in consume_all(kafka_mode.cfg, topic)]
        assert all((type(r).__name__ == "Decision") == (topic == topics.decisions) for r in records), topic
        on_kafka.update(r.event_id for r in records)
    missing = sorted(set(written) - set(on_kafka))
    assert missing == [], f"{len(missing)} of {len(written)} events never reached Kafka: {missing[:5]}"
    unexpected = sorted(set(on_kafka) - set(written))
    assert unexpected == [], f"events on the module's topic that no file holds: {unexpected[:5]}"
    # At-least-once: a record sent twice (two relays on one file, a retried batch) is allowed; count it.
    resent = {k: on_kafka[k] - written[k] for k in written if on_kafka[k] > written[k]}
    print(
        f"\n{len(written)} distinct events ({sum(written.values())} file copies) in {len(kafka_mode.files)} files; "
        f"{sum(on_kafka.values())} records on Kafka; {sum(resent.values())} resent records of {len(resent)} events"
    )

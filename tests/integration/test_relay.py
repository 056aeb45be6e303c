"""The outbox relay against real brokers: rows are marked sent only after Kafka acknowledged them,
records land keyed, headed and partitioned as documented, ``sync=True`` puts the intent on Kafka
before the destination is called, a dead or stopped broker never blocks the SDK (the outbox grows
and drains when the broker is back, losing nothing and keeping per-key order), and
``effects relay --db`` drains what a dead agent left behind.

A second broker (``scripts/kafka.sh`` on free ports, its own run dir) is started for the outage test
only; the session's broker is never stopped. Every wait polls a condition against a monotonic
deadline.
"""

from __future__ import annotations

import asyncio
import os
import socket
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Message, TopicPartition

from effect_ledger.core.model import Intent, State
from effect_ledger.core.reconcile import Target
from effect_ledger.errors import LedgerUnavailable
from effect_ledger.sdk.ledger import Ledger
from effect_ledger.sdk.store.sqlite import Store
from effect_ledger.streams.admin import ensure_topics
from effect_ledger.streams.codec import HEADER, default_codec
from effect_ledger.streams.config import KafkaConfig
from effect_ledger.streams.partition import partition_for

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 30.0
DEAD = "127.0.0.1:1"  # nothing listens on port 1: connections are refused at once
TARGETS = [Target("payments")]  # the destination these tests call; nothing can ask it
codec = default_codec()


# --- helpers -----------------------------------------------------------------------------------------


class TopicReader:
    """Reads every partition of a topic from the beginning; ``read_to_end`` returns everything read so
    far once each partition is read up to the high watermark seen when it was called."""

    def __init__(self, cfg: KafkaConfig, topic: str) -> None:
        self.topic = topic
        self.consumer = Consumer(
            cfg.confluent(
                **{
                    "group.id": f"g-{uuid.uuid4().hex[:12]}",
                    "enable.auto.commit": False,
                    "auto.offset.reset": "earliest",
                    "log_level": 0,
                }
            )
        )
        md = self.consumer.list_topics(topic, timeout=TIMEOUT)
        self.partitions = sorted(md.topics[topic].partitions)
        self.consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in self.partitions])
        self.position = {p: 0 for p in self.partitions}
        self.messages: list[Message] = []

    def read_to_end(self, timeout: float = TIMEOUT) -> list[Message]:
        deadline = time.monotonic() + timeout
        high = {p: self._high_watermark(p, deadline) for p in self.partitions}
        while any(self.position[p] < high[p] for p in self.partitions):
            assert time.monotonic() < deadline, f"read {self.position} of {high} within {timeout} s"
            msg = self.consumer.poll(0.2)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            self.messages.append(msg)
            self.position[msg.partition()] = msg.offset() + 1
        return self.messages

    def _high_watermark(self, partition: int, deadline: float) -> int:
        """Right after topic creation a client's metadata can still name no leader (or an old one):
        retry retriable errors until the deadline."""
        while True:
            try:
                return int(self.consumer.get_watermark_offsets(TopicPartition(self.topic, partition), timeout=5)[1])
            except KafkaException as e:
                if not e.args[0].retriable() and e.args[0].code() != KafkaError.NOT_LEADER_FOR_PARTITION:
                    raise
                assert time.monotonic() < deadline, f"no watermark for {self.topic}[{partition}]: {e}"
                time.sleep(0.05)

    def close(self) -> None:
        self.consumer.close()


def read_topic(cfg: KafkaConfig) -> list[Message]:
    reader = TopicReader(cfg, cfg.topics.events)
    try:
        return reader.read_to_end()
    finally:
        reader.close()


def outbox(path: str | Path) -> list[tuple[int, str, str, str, int]]:
    """Every row of the file's event log: (seq, event_id, effect_id, kind, sent), in seq order."""
    conn = sqlite3.connect(str(path))
    try:
        return conn.execute("SELECT seq, event_id, effect_id, kind, sent FROM events ORDER BY seq").fetchall()
    finally:
        conn.close()


def unsent(path: str | Path) -> int:
    return sum(1 for row in outbox(path) if not row[4])


def check_records(rows: list[tuple[int, str, str, str, int]], messages: list[Message], partitions: int) -> Counter[str]:
    """Every row of the file is on the topic, keyed by its effect id, with the schema header, on the
    partition ``partition_for`` names, and per key in seq order. Returns how often each event id was
    read (at-least-once: more than once is allowed, and reported by the caller)."""
    by_id = {event_id: (seq, effect_id, kind) for seq, event_id, effect_id, kind, _ in rows}
    seen: Counter[str] = Counter()
    per_key: dict[str, list[tuple[int, int, str]]] = defaultdict(list)  # key -> (partition, offset, event_id)
    for msg in messages:
        event = codec.decode(msg.value())
        assert event.event_id in by_id, f"an event on the topic that the file does not hold: {event}"
        seq, effect_id, kind = by_id[event.event_id]
        assert type(event).__name__ == kind
        assert msg.key() == effect_id.encode() == event.effect_id.encode()
        assert msg.headers() == [(HEADER, f"effect_ledger.{kind}".encode())] == [codec.header(event)]
        assert msg.partition() == partition_for(msg.key(), partitions), (effect_id, msg.partition())
        seen[event.event_id] += 1
        per_key[effect_id].append((msg.partition(), msg.offset(), event.event_id))
    missing = [r for r in rows if r[1] not in seen]
    assert missing == [], f"{len(missing)} of {len(rows)} events are not on the topic: {missing[:3]}"
    for key, records in per_key.items():
        records.sort()
        assert len({p for p, _, _ in records}) == 1, key
        first_seen: list[str] = []
        for _, _, event_id in records:
            if event_id not in first_seen:
                first_seen.append(event_id)
        in_file = [event_id for _, event_id, effect_id, _, _ in rows if effect_id == key]
        assert first_seen == in_file, f"events of {key} on the topic out of seq order"
    return seen


async def wait_until(cond: Callable[[], Awaitable[bool]], timeout: float, what: str) -> None:
    end = time.monotonic() + timeout
    while not await cond():
        assert time.monotonic() < end, f"timed out after {timeout} s waiting for {what}"
        await asyncio.sleep(0.02)


class Destination:
    def __init__(self) -> None:
        self.calls: list[str] = []

    async def __call__(self, key: str) -> dict[str, Any]:
        self.calls.append(key)
        return {"id": f"re_{len(self.calls):04d}", "key": key}


async def execute(ledger: Ledger, call: Any, step: str, **kw: Any) -> Any:
    return await ledger.execute(
        target="payments",
        operation="refund.create",
        run_id="run-relay",
        step=step,
        request={"step": step},
        call=call,
        timeout=30.0,
        **kw,
    )


async def stop_relay_quickly(ledger: Ledger) -> None:
    """With a dead broker, ``Ledger.close`` waits 10 s for the outbox to drain before it gives up;
    stop the relay first with a short grace period (the rows stay unsent either way)."""
    assert ledger.relay is not None
    await ledger.relay.stop(timeout=0.2)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cli(*args: str, timeout: float = 90) -> tuple[subprocess.CompletedProcess[str], float]:
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "effect_ledger", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )
    return proc, time.monotonic() - started


# --- the relay against an unreachable broker, started first: it takes its time ----------------------


@pytest.fixture(scope="module", autouse=True)
def relay_cli_without_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """``effects relay`` against a broker that is not there waits (up to 30 s) for it. Start it when the
    module starts, so the wait overlaps the other tests; ``test_relay_cli_unreachable_broker`` checks
    what it did."""
    db = tmp_path_factory.mktemp("dead-relay") / "effects.db"

    async def create() -> None:
        await (await Store.open(str(db))).close()

    asyncio.run(create())
    proc = subprocess.Popen(
        [sys.executable, "-m", "effect_ledger", "relay", "--db", str(db), "--bootstrap", DEAD, "--prefix", "x."],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )
    state: dict[str, Any] = {"proc": proc, "started": time.monotonic(), "db": db}

    def note_exit() -> None:
        proc.wait()
        state["ended"] = time.monotonic()

    threading.Thread(target=note_exit, daemon=True).start()
    try:
        yield state
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


# --- acknowledged, keyed, headed, partitioned, ordered ---------------------------------------------


def test_rows_marked_sent_only_after_the_broker_acknowledged_them(kafka_config: KafkaConfig, tmp_path: Path) -> None:
    """While effects are being written, every row the file shows as sent is already on the topic;
    at the end every row is there, keyed, headed, on its murmur2 partition, per key in seq order."""
    path = tmp_path / "effects.db"
    reader = TopicReader(kafka_config, kafka_config.topics.events)
    dest = Destination()
    snapshots = 0

    async def body() -> None:
        nonlocal snapshots
        async with await Ledger.open(str(path), kafka=kafka_config, targets=TARGETS) as ledger:
            for batch in range(5):
                await asyncio.gather(*(execute(ledger, dest, f"s-{batch}-{i}") for i in range(12)))
                # A later event (a webhook's second receipt) on a key that already has events on Kafka.
                await ledger.record_receipt(
                    (await execute(ledger, dest, f"s-{batch}-0")).effect_id, f"hook-{batch}", {"n": batch}
                )
                await check_sent_rows_are_on_topic()
                # Once more after the relay marked this batch's rows sent (it may not have run yet:
                # without sync it polls every 0.5 s), so the check always sees rows marked sent.
                await wait_until(_all_sent(path), TIMEOUT, f"the rows of batch {batch} marked sent")
                await check_sent_rows_are_on_topic()
            await wait_until(_depth_zero(ledger), TIMEOUT, "the outbox to drain")

    async def check_sent_rows_are_on_topic() -> None:
        nonlocal snapshots
        sent_now = {event_id for _, event_id, _, _, sent in outbox(path) if sent}
        on_topic = {codec.decode(m.value()).event_id for m in await asyncio.to_thread(reader.read_to_end)}
        assert sent_now <= on_topic, f"marked sent but not on Kafka: {sorted(sent_now - on_topic)[:3]}"
        snapshots += len(sent_now)

    try:
        asyncio.run(body())
        rows = outbox(path)
        assert len(rows) == 5 * (12 * 3 + 1) and unsent(path) == 0
        seen = check_records(rows, reader.read_to_end(), kafka_config.partitions)
        assert snapshots > 0, "no row was ever seen sent while the ledger ran"
        assert max(seen.values()) == 1, {k: n for k, n in seen.items() if n > 1}  # one producer, no outage
        assert len({partition_for(r[2].encode(), kafka_config.partitions) for r in rows}) == kafka_config.partitions
    finally:
        reader.close()


def _all_sent(path: Path) -> Callable[[], Awaitable[bool]]:
    async def cond() -> bool:
        return all(sent for *_, sent in outbox(path))

    return cond


def _depth_zero(ledger: Ledger) -> Callable[[], Awaitable[bool]]:
    async def cond() -> bool:
        return await ledger.store.outbox_depth() == 0

    return cond


def test_sync_puts_the_intent_on_kafka_before_the_destination_is_called(
    kafka_config: KafkaConfig, group_id: Callable[[], str], tmp_path: Path
) -> None:
    found: dict[str, Any] = {}

    def consume_intent(key: str) -> list[Any]:
        """What a fresh consumer group finds on the topic for ``key`` (polled until an Intent shows)."""
        consumer = Consumer(
            kafka_config.confluent(
                **{
                    "group.id": group_id(),
                    "auto.offset.reset": "earliest",
                    "enable.auto.commit": False,
                }
            )
        )
        events: list[Any] = []
        try:
            consumer.subscribe([kafka_config.topics.events])
            deadline = time.monotonic() + 15
            while not any(isinstance(e, Intent) for e in events) and time.monotonic() < deadline:
                msg = consumer.poll(0.2)
                if msg is None:
                    continue
                assert msg.error() is None, msg.error()
                if msg.key() == key.encode():
                    events.append(codec.decode(msg.value()))
        finally:
            consumer.close()
        return events

    async def call(key: str) -> dict[str, Any]:
        found["events"] = await asyncio.to_thread(consume_intent, key)
        return {"id": "re_1"}

    async def body() -> None:
        path = str(tmp_path / "effects.db")
        async with await Ledger.open(path, kafka=kafka_config, sync=True, targets=TARGETS) as ledger:
            c = await execute(ledger, call, "sync-1")
            found["key"] = c.effect_id
            assert c.called

    asyncio.run(body())
    assert [type(e).__name__ for e in found["events"]] == ["Intent"], found["events"]
    assert found["events"][0].effect_id == found["key"]


def test_sync_timeout_without_a_broker_fails_the_effect_without_calling(tmp_path: Path) -> None:
    path = str(tmp_path / "effects.db")
    dest = Destination()
    cfg = KafkaConfig(bootstrap=DEAD, prefix="dead.", partitions=3)

    async def body() -> None:
        ledger = await Ledger.open(path, kafka=cfg, sync=True, sync_timeout=1, targets=TARGETS)
        try:
            started = time.monotonic()
            with pytest.raises(LedgerUnavailable, match="not acknowledged"):
                await execute(ledger, dest, "sync-dead")
            elapsed = time.monotonic() - started
            assert 1.0 <= elapsed < 5.0, elapsed
            assert dest.calls == []
            effect = await ledger.get(next(r[2] for r in outbox(path)))
            assert effect is not None and effect.state is State.FAILED
            assert [r[3] for r in outbox(path)] == ["Intent", "Executed"]
        finally:
            await stop_relay_quickly(ledger)
            await ledger.close()

    asyncio.run(body())
    assert unsent(path) == 2  # still in the outbox, for the next start or `effects relay`


def test_without_sync_a_dead_broker_does_not_stop_the_sdk(tmp_path: Path) -> None:
    path = str(tmp_path / "effects.db")
    dest = Destination()
    cfg = KafkaConfig(bootstrap=DEAD, prefix="dead.", partitions=3)

    async def body() -> None:
        ledger = await Ledger.open(path, kafka=cfg, sync=False, sync_timeout=1, targets=TARGETS)
        try:
            for i in range(3):
                c = await execute(ledger, dest, f"nosync-{i}")
                assert c.called
            assert await ledger.store.outbox_depth() == 9
        finally:
            await stop_relay_quickly(ledger)
            await ledger.close()

    asyncio.run(body())
    assert len(dest.calls) == 3
    assert unsent(path) == 9 and [r[3] for r in outbox(path)] == ["Intent", "Executed", "Receipt"] * 3


def test_sync_intent_relayed_by_another_ledger_on_the_same_file(kafka_config: KafkaConfig, tmp_path: Path) -> None:
    """Several processes may share one file, each with its relay. When B's relay sends and marks A's
    intent before A's relay reads the outbox, the intent *is* on Kafka, so A's ``sync`` execute must
    go on and call the destination. (A's relay is made to read the outbox only once B's relay has
    drained it: the order a busy relay and an idle one can take.)"""
    path = str(tmp_path / "effects.db")
    dest = Destination()

    async def body() -> None:
        a = await Ledger.open(path, kafka=kafka_config, sync=True, sync_timeout=5, targets=TARGETS)
        b: Ledger | None = None
        try:
            # A's relay is running and has acknowledged something: its watermark is initialised.
            assert (await execute(a, dest, "warm-up")).called
            b = await Ledger.open(path, kafka=kafka_config, targets=TARGETS)
            original = a.store.unsent

            async def after_the_other_relay(limit: int, after: int = 0) -> Any:
                await wait_until(_depth_zero(a), TIMEOUT, "B's relay to drain the outbox")
                return await original(limit, after)

            a.store.unsent = after_the_other_relay  # type: ignore[method-assign]
            c = await execute(a, dest, "shared-file")
            assert c.called and dest.calls[-1] == c.effect_id
        finally:
            await a.close()
            if b is not None:
                await b.close()

    asyncio.run(body())
    assert unsent(path) == 0


# --- a broker outage -----------------------------------------------------------------------------------


def kafka_sh(command: str, env: dict[str, str]) -> None:
    proc = subprocess.run(
        ["bash", str(ROOT / "scripts/kafka.sh"), command], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, f"kafka.sh {command} failed:\n{proc.stdout}\n{proc.stderr}"


def test_broker_outage_the_outbox_grows_then_drains_in_order(tmp_path: Path) -> None:
    """Three groups of effects: ``n`` acknowledged before the outage, ``k`` written just before the
    broker is told to stop (its controlled shutdown usually still acknowledges them), ``m`` written
    while it is down, plus later receipts on keys of the first group. Nothing blocks, nothing is
    lost, per-key order holds across the outage."""
    port, cport = free_port(), free_port()
    while cport == port:
        cport = free_port()
    run_dir = str(tmp_path / "kafka")
    env = dict(os.environ, KAFKA_PORT=str(port), KAFKA_CONTROLLER_PORT=str(cport), KAFKA_RUN_DIR=run_dir)
    cfg = KafkaConfig(bootstrap=f"127.0.0.1:{port}", prefix="outage.", partitions=3)
    path = str(tmp_path / "effects.db")
    dest = Destination()
    n, k, m = 20, 20, 30
    report: dict[str, Any] = {}

    async def body() -> None:
        ledger = await Ledger.open(path, kafka=cfg, sync=False, targets=TARGETS)
        try:
            keys = [(await execute(ledger, dest, f"before-{i}")).effect_id for i in range(n)]
            await wait_until(_depth_zero(ledger), TIMEOUT, "the first effects to be acknowledged")
            for i in range(k):
                await execute(ledger, dest, f"in-flight-{i}")
            await asyncio.to_thread(kafka_sh, "down", env)
            at_stop = await ledger.store.outbox_depth()
            for i in range(m):
                assert (await execute(ledger, dest, f"during-{i}")).called
            # Later events of keys whose first events are on Kafka already: their order must survive.
            for i in range(0, n, 3):
                await ledger.record_receipt(keys[i], f"hook-{i}", {"late": i})
            during = await ledger.store.outbox_depth()
            assert during == at_stop + 3 * m + len(range(0, n, 3)), (at_stop, during)
            report["depth"] = (at_stop, during)
            started = time.monotonic()
            await asyncio.to_thread(kafka_sh, "up", env)  # the same run dir: the same cluster and data
            await wait_until(_depth_zero(ledger), 60, "the outbox to drain after the broker returned")
            report["drain_s"] = time.monotonic() - started
        finally:
            await ledger.close()

    kafka_sh("up", env)
    try:
        ensure_topics(cfg)
        asyncio.run(body())
        rows = outbox(path)
        assert len(rows) == 3 * (n + k + m) + len(range(0, n, 3)) and unsent(path) == 0
        seen = check_records(rows, read_topic(cfg), cfg.partitions)
        dup = {key: c for key, c in seen.items() if c > 1}
        print(
            f"\noutage: outbox depth {report['depth'][0]} at the stop -> {report['depth'][1]} during it; "
            f"drained {report['drain_s']:.1f} s after `kafka.sh up` began; {len(rows)} events, "
            f"{sum(seen.values())} records, {len(dup)} events delivered more than once"
        )
        assert len(dest.calls) == n + k + m
    finally:
        kafka_sh("down", env)


# --- effects relay --db -----------------------------------------------------------------------------


def test_relay_cli_drains_an_outbox_a_dead_agent_left(kafka_config: KafkaConfig, tmp_path: Path) -> None:
    path = str(tmp_path / "effects.db")
    dest = Destination()
    dead = KafkaConfig(bootstrap=DEAD, prefix=kafka_config.prefix, partitions=kafka_config.partitions)

    async def agent() -> None:
        ledger = await Ledger.open(path, kafka=dead, targets=TARGETS)
        try:
            for i in range(7):
                await execute(ledger, dest, f"left-{i}")
        finally:
            await stop_relay_quickly(ledger)
            await ledger.close()

    asyncio.run(agent())
    rows = outbox(path)
    assert len(rows) == 21 and unsent(path) == 21

    proc, _ = cli("relay", "--db", path, "--bootstrap", kafka_config.bootstrap, "--prefix", kafka_config.prefix)
    assert proc.returncode == 0, proc.stderr
    assert f"relayed 21 events from {path} to {kafka_config.topics.events}" in proc.stdout, proc.stdout
    assert unsent(path) == 0
    seen = check_records(outbox(path), read_topic(kafka_config), kafka_config.partitions)
    assert sum(seen.values()) == 21

    # Nothing left: a second run relays nothing and still succeeds.
    again, _ = cli("relay", "--db", path, "--bootstrap", kafka_config.bootstrap, "--prefix", kafka_config.prefix)
    assert again.returncode == 0 and "relayed 0 events" in again.stdout, (again.stdout, again.stderr)


def test_relay_cli_unreachable_broker(relay_cli_without_broker: dict[str, Any]) -> None:
    """Started by the module fixture at the module's start: exits non-zero with one line and no
    traceback, after waiting for the broker (up to 30 s)."""
    proc: subprocess.Popen[str] = relay_cli_without_broker["proc"]
    out, err = proc.communicate(timeout=90)
    state = relay_cli_without_broker
    end = time.monotonic() + 5
    while "ended" not in state:  # the watcher thread notes the exit time right after the exit
        assert time.monotonic() < end
        time.sleep(0.01)
    elapsed = state["ended"] - state["started"]
    print(f"\neffects relay against {DEAD}: exit {proc.returncode} after {elapsed:.1f} s")
    assert elapsed < 45, elapsed  # it waits up to 30 s for the broker, then gives up
    assert proc.returncode != 0
    assert "Traceback" not in err and "Traceback" not in out
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("effects: ") and DEAD in lines[0], err
    assert unsent(relay_cli_without_broker["db"]) == 0

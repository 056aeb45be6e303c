"""The ledger processor (``effects worker``) as a real child process against the real broker: the
fold into effects.state and effects.uncertain, deadlines fired through effects.events, a SIGKILL in
the middle of the stream, the dead-letter queue, the lookup view's read-your-writes, a restart with
nothing to replay, and two instances sharing the partitions. Every wait polls a condition against a
deadline."""

from __future__ import annotations

import asyncio
import base64
import threading
import time
import uuid
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition

from effect_ledger.core.effect import Effect, fold, to_state
from effect_ledger.core.model import (
    Claimed,
    DeadLetter,
    EffectState,
    Executed,
    Intent,
    Outcome,
    Receipt,
    ReceiptSource,
    State,
    Timeout,
    TimeoutPhase,
    UncertainEffect,
)
from effect_ledger.demo.gateway import Gateway
from effect_ledger.errors import DefiniteFailure, EffectUncertain
from effect_ledger.processors import rocks
from effect_ledger.sdk.ledger import Ledger
from effect_ledger.streams.codec import default_codec
from effect_ledger.streams.config import KafkaConfig
from effect_ledger.streams.partition import partition_for
from tests.sdk_contract import DECLARED
from tests.services import Processor, wait_for
from tests.topic_io import RawProducer, Record, TopicReader, one_key_per_partition, run_agent, running, untimed

WAIT = 60.0


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def decode_events(body: dict[str, Any]) -> list[Any]:
    codec = default_codec()
    return [codec.decode(base64.b64decode(e)) for e in body["events"]]


def states_match(reader: TopicReader, expected: dict[str, EffectState]) -> dict[str, Any] | None:
    reader.poll()
    latest = reader.latest()
    return latest if all(untimed(latest.get(k)) == untimed(v) for k, v in expected.items()) else None


def folded_by_key(records: list[Record]) -> dict[str, Effect]:
    by_key: dict[str, list[Any]] = defaultdict(list)
    for r in sorted(records, key=lambda r: (r.partition, r.offset)):
        if r.value is not None:
            by_key[r.value.effect_id].append(r.value)
    out = {}
    for k, evs in by_key.items():
        e = fold(evs)
        assert e is not None
        out[k] = e
    return out


def lookup_all(proc: Processor, keys: list[str]) -> dict[str, tuple[int, dict[str, Any]]]:
    """Look every key up, many at a time (each lookup waits on the processor's high-watermark query)."""
    with ThreadPoolExecutor(32) as pool:
        return dict(zip(keys, pool.map(proc.lookup, keys), strict=True))


def intent(key: str, deadline_ms: int) -> Intent:
    return Intent(
        f"i-{uuid.uuid4().hex}", key, now_ms(), 1, "payments", "refund.create", "tests", "run-1", key.split(":", 1)[1],
        '{"amount":100}', "d" * 64, deadline_ms, "test-worker",
    )  # fmt: skip


def executed(key: str, outcome: Outcome, receipt_deadline_ms: int | None = None) -> Executed:
    t = now_ms()
    err = "card_declined" if outcome is Outcome.FAILED else None
    return Executed(f"x-{uuid.uuid4().hex}", key, t, 1, outcome, err, t - 5, t, receipt_deadline_ms, "test-worker")


def receipt(key: str) -> Receipt:
    return Receipt(f"r-{uuid.uuid4().hex}", key, now_ms(), 1, f"re_{key[-8:]}", ReceiptSource.CALL, "{}")


def hang(_key: str) -> Any:
    return asyncio.Event().wait()  # a call that never returns: the SDK's deadline cuts it off


# -- 1. fold & publish ------------------------------------------------------------------------------


def test_fold_publishes_state_and_uncertain_and_serves_lookups(kafka_config: KafkaConfig, tmp_path: Path) -> None:
    proc = Processor(kafka_config, tmp_path / "data")
    with (
        running(proc),
        TopicReader(kafka_config, kafka_config.topics.state) as states,
        TopicReader(kafka_config, kafka_config.topics.uncertain) as uncertain,
    ):
        proc.wait_ready()

        async def write() -> tuple[dict[str, EffectState], dict[str, set[str]], list[str], str, str]:
            db = str(tmp_path / "agent.db")
            async with await Ledger.open(db, targets=DECLARED, kafka=kafka_config, sync=True) as ledger:
                confirmed = []
                for i in range(5):
                    c = await ledger.execute(
                        target="payments", operation="refund.create", run_id="run-1", step=f"refund-{i}",
                        request={"order": i, "amount": 100 + i},
                        call=lambda key, i=i: {"id": f"re_{i}", "key": key},
                    )  # fmt: skip
                    assert c.called and c.receipt_id == f"re_{i}"
                    confirmed.append(c.effect_id)

                def reject(key: str) -> Any:
                    raise DefiniteFailure("card declined")

                failed_key = "payments:fold-failed"
                with pytest.raises(DefiniteFailure):
                    await ledger.execute(
                        target="payments", operation="refund.create", key=failed_key, request={"order": "f"},
                        call=reject,
                    )  # fmt: skip
                uncertain_key = "payments:fold-uncertain"
                with pytest.raises(EffectUncertain):
                    await ledger.execute(
                        target="payments", operation="refund.create", key=uncertain_key, request={"order": "u"},
                        call=hang, timeout=2.0,
                    )  # fmt: skip
                deadline = time.monotonic() + WAIT
                while await ledger.store.outbox_depth() > 0:  # everything acknowledged by Kafka
                    assert time.monotonic() < deadline, "the relay did not drain the outbox"
                    await asyncio.sleep(0.02)
                keys = [*confirmed, failed_key, uncertain_key]
                expected, event_ids = {}, {}
                for k in keys:
                    e = await ledger.get(k)
                    assert e is not None
                    expected[k] = to_state(e)
                    event_ids[k] = {ev.event_id for _, ev, _ in await ledger.store.events(k)}
                return expected, event_ids, confirmed, failed_key, uncertain_key

        expected, event_ids, confirmed, failed_key, uncertain_key = asyncio.run(write())
        assert [expected[k].state for k in confirmed] == [State.CONFIRMED] * 5
        assert expected[failed_key].state is State.FAILED
        assert expected[uncertain_key].state is State.UNCERTAIN

        # effects.state converges, per key, to exactly what the SQLite ledger folded.
        wait_for(lambda: states_match(states, expected), WAIT, "effects.state to match the SQLite ledger")

        # effects.uncertain holds the uncertain effect, and only it.
        uncertain.until(lambda rs: any(r.value.effect_id == uncertain_key for r in rs), WAIT, "the uncertain effect")
        uncertain.drain()
        assert {r.key for r in uncertain.records} == {uncertain_key.encode()}
        u = uncertain.records[0].value
        assert isinstance(u, UncertainEffect)
        assert (u.target, u.operation, u.attempt, u.executed) == ("payments", "refund.create", 1, False)
        assert u.request == '{"order":"u"}'

        # The lookup view: known keys with their state and every event, 404 for an unknown one.
        for k in (confirmed[0], failed_key, uncertain_key):
            status, body = proc.lookup(k)
            assert status == 200, body
            assert body["known"] is True and body["effect_id"] == k
            assert body["state"] == expected[k].state.value
            assert body["version"] == expected[k].version and body["attempt"] == 1
            assert body["receipt_id"] == expected[k].receipt_id
            events = decode_events(body)
            # Every event the agent wrote, plus the processor's verdict on the claim of attempt 1.
            assert {e.event_id for e in events if not isinstance(e, Claimed)} == event_ids[k]
            intents = [e.event_id for e in events if isinstance(e, Intent)]
            assert [(c.attempt, c.intent_id) for c in events if isinstance(c, Claimed)] == [(1, intents[0])]
        status, body = proc.lookup("payments:never-heard-of")
        assert status == 404, body
        assert body["known"] is False and body["effect_id"] == "payments:never-heard-of"


# -- 2. deadlines -----------------------------------------------------------------------------------


def test_deadline_of_a_dead_agent_fires_a_timeout_then_an_uncertain_effect(
    kafka_config: KafkaConfig, tmp_path: Path
) -> None:
    proc = Processor(kafka_config, tmp_path / "data")
    with (
        running(proc),
        Gateway("key+lookup") as gw,
        TopicReader(kafka_config, kafka_config.topics.events) as events,
        TopicReader(kafka_config, kafka_config.topics.uncertain) as uncertain,
    ):
        proc.wait_ready()
        agent = run_agent(kafka_config, tmp_path / "agent", gw.url, "after_intent", run_id="dies", timeout=4.0)
        out, _ = agent.communicate(timeout=WAIT)
        assert agent.returncode == -9, out.decode(errors="replace")  # killed itself after the intent

        # The agent waited for Kafka's ack of its intent (sync) before it died.
        intents = events.until(lambda rs: [r for r in rs if isinstance(r.value, Intent)], 10, "the intent")
        assert len(intents) == 1
        i = intents[0].value
        assert isinstance(i, Intent)
        # The deadline is a duration from when the log took the intent (its LogAppendTime), not the
        # agent's claimed time.
        key, deadline = i.effect_id, intents[0].timestamp_ms + (i.deadline_ms - i.at_ms)

        # Before the deadline the call may still land: the effect stays PENDING and nothing is sent.
        status, body = proc.lookup(key)
        events.poll()
        assert now_ms() < deadline, "the agent took longer than its own deadline to start; raise --timeout"
        assert status == 200 and body["state"] == "PENDING", body
        assert not events.values(Timeout)

        timeouts = events.until(
            lambda rs: [r for r in rs if isinstance(r.value, Timeout)], WAIT, "the processor's Timeout command"
        )
        t = timeouts[0]
        assert t.key == key.encode()
        assert isinstance(t.value, Timeout)
        assert (t.value.effect_id, t.value.attempt, t.value.phase) == (key, 1, TimeoutPhase.CALL)
        assert t.value.deadline_ms == deadline
        assert t.value.at_ms >= deadline and t.timestamp_ms >= deadline, (t, deadline)

        urs = uncertain.until(lambda rs: [r for r in rs if r.key == key.encode()], WAIT, "the UncertainEffect")
        u = urs[0].value
        assert isinstance(u, UncertainEffect)
        assert urs[0].timestamp_ms >= deadline and u.at_ms >= deadline
        assert (u.target, u.operation, u.attempt, u.deadline_ms) == ("payments", "refund.create", 1, deadline)
        assert u.request == i.request and u.executed is False
        assert "deadline" in u.reason

        status, body = proc.lookup(key)
        assert status == 200 and body["state"] == "UNCERTAIN", body
        assert gw.refunds() == []  # the agent died before calling


# -- 3. SIGKILL in the middle of the stream, restart on the same data dir ------------------------


def test_kill_9_mid_stream_and_restart(kafka_config: KafkaConfig, tmp_path: Path) -> None:
    data = tmp_path / "data"
    proc = Processor(kafka_config, data)
    n_before, n_dead = 300, 100
    kinds = ("confirmed", "pending", "executed", "failed", "far")
    keys: dict[str, list[str]] = {kind: [] for kind in kinds}
    producer = RawProducer(kafka_config)

    def progress() -> int:
        h = proc.health() or {}
        return sum(o + 1 for o in (h.get("processed") or {}).values())

    def produce(n: int, tag: str, deadline_ms: int, paced: bool = False) -> None:
        """``paced``: every 10 effects, wait until the processor has folded half of what was written
        (or is dead), so that it is killed mid-stream however fast it folds."""
        written = 0
        for i in range(n):
            if paced and i % 10 == 0 and i:
                producer.flush()
                half = written // 2
                wait_for(lambda: not proc.alive or progress() >= half, 30, "the processor to keep up")  # noqa: B023
            kind = kinds[i % len(kinds)]
            key = f"payments:{tag}-{kind}-{i}"
            keys[kind].append(key)
            far = now_ms() + 3_600_000
            if kind == "confirmed":
                evs = [intent(key, far), executed(key, Outcome.OK), receipt(key)]
            elif kind == "pending":  # deadline passes while the processor is dead
                evs = [intent(key, deadline_ms)]
            elif kind == "executed":  # executed, receipt deadline passes while it is dead
                evs = [intent(key, far), executed(key, Outcome.OK, receipt_deadline_ms=deadline_ms)]
            elif kind == "failed":
                evs = [intent(key, far), executed(key, Outcome.FAILED)]
            else:  # a deadline far away: must stay PENDING
                evs = [intent(key, far)]
            for ev in evs:
                producer.event(ev)
            written += len(evs)
        producer.flush()

    with (
        running(proc),
        TopicReader(kafka_config, kafka_config.topics.events) as events,
        TopicReader(kafka_config, kafka_config.topics.state) as states,
        TopicReader(kafka_config, kafka_config.topics.uncertain) as uncertain,
    ):
        proc.wait_ready()
        short = now_ms() + 4000
        # Feed the stream from a thread while the processor folds it; kill it part-way.
        feeder = threading.Thread(target=produce, args=(n_before, "a", short, True))
        feeder.start()
        folded_at_kill = wait_for(lambda: progress() >= 100 and progress(), 30, "the processor to fold some events")
        proc.kill()
        feeder.join(30)
        total = sum(events.high_watermarks().values())
        assert folded_at_kill < total, "the processor folded everything before the kill: not mid-stream"
        # While it is dead: more effects. The short deadlines pass before it folds again (a killed
        # member holds its partitions until its session times out).
        produce(n_dead, "b", short)

        proc.start()  # same data dir, same port
        proc.wait_ready()
        # The reopened partitions are on the worker's bounded RocksDB store: one cache for all of
        # them, its memtables counted (processors/rocks.py), as the health view reports.
        rocksdb = (proc.health() or {}).get("rocksdb") or {}
        assert rocksdb.get("cache_capacity") == rocks.CACHE_BYTES, rocksdb
        assert rocksdb.get("memtables", 0) > 0, rocksdb

        passed = keys["pending"] + keys["executed"]
        try:
            uncertain.until(
                lambda rs: set(passed) <= {r.key.decode() for r in rs if r.key}, WAIT,
                "an UncertainEffect for every effect whose deadline passed",
            )  # fmt: skip
        except TimeoutError:
            got = {r.key.decode() for r in uncertain.records if r.key}
            missing = [k for k in passed if k not in got]
            by_partition = Counter(partition_for(k.encode(), kafka_config.partitions) for k in missing)
            pytest.fail(
                f"{len(missing)} of {len(passed)} effects whose deadline passed have no UncertainEffect after "
                f"{WAIT:g} s, by partition {dict(by_partition)}; processor health {proc.health()}; "
                f"events high watermarks {events.high_watermarks()}"
            )

        # Quiet now: every open effect with a passed deadline is UNCERTAIN. The expected state of each
        # key is the fold of everything on effects.events (the timeouts the processor sent included).
        def settled() -> dict[str, Effect] | None:
            events.drain()
            expected = folded_by_key(events.records)
            return expected if all(expected[k].state is State.UNCERTAIN for k in passed) else None

        expected = wait_for(settled, WAIT, "the timeouts of every passed deadline on effects.events")
        all_keys = [k for ks in keys.values() for k in ks]
        assert set(expected) == set(all_keys)
        assert {expected[k].state for k in keys["confirmed"]} == {State.CONFIRMED}
        assert {expected[k].state for k in keys["failed"]} == {State.FAILED}
        assert {expected[k].state for k in keys["far"]} == {State.PENDING}
        # A timeout may be sent more than once; the fold applies it once.
        timeouts = events.values(Timeout)
        assert {t.effect_id for t in timeouts} == set(passed)
        assert all(t.at_ms >= t.deadline_ms for t in timeouts)

        # The lookup equals the fold of the key's events: a sample of every kind, folded before the
        # kill, replayed after it, and produced while the processor was dead (every key's state is
        # checked on effects.state below; a lookup costs about a second).
        sample = [k for kind in kinds for k in (keys[kind][0], keys[kind][len(keys[kind]) // 2], keys[kind][-1])]
        wrong = {}
        for k, (status, body) in lookup_all(proc, sample).items():
            e = expected[k]
            answer = (status, body.get("state"), body.get("version"), body.get("attempt"), body.get("receipt_id"))
            want = (200, e.state.value, e.version, e.attempt, e.receipt.receipt_id if e.receipt else None)
            if answer != want:
                wrong[k] = (answer, want)
        assert wrong == {}

        # effects.state: no key missing, and its latest record per key is that fold's state.
        want_states = {k: to_state(e) for k, e in expected.items()}
        try:
            wait_for(lambda: states_match(states, want_states), 30, "effects.state to hold every key's final state")
        except TimeoutError:
            latest = states.latest()
            missing = sorted(set(want_states) - set(latest))
            stale = {
                k: (latest[k].state.value, latest[k].version, want_states[k].state.value, want_states[k].version)
                for k in want_states
                if k in latest and untimed(latest[k]) != untimed(want_states[k])
            }
            asked = lookup_all(proc, [*missing[:5], *list(stale)[:5]])
            table = {k: (status, body.get("state"), body.get("version")) for k, (status, body) in asked.items()}
            pytest.fail(f"effects.state after kill -9: {len(missing)} keys missing {missing[:5]}, "
                        f"{len(stale)} stale (published state, version; expected state, version) "
                        f"{dict(list(stale.items())[:5])}; the processor's table (lookup) has {table}")  # fmt: skip
        assert not [v for v in uncertain.values() if v.effect_id in keys["far"] or v.effect_id in keys["confirmed"]]


# -- 4. dead letters --------------------------------------------------------------------------------


def test_bad_records_go_to_the_dlq_and_the_stream_goes_on(kafka_config: KafkaConfig, tmp_path: Path) -> None:
    proc = Processor(kafka_config, tmp_path / "data")
    codec = default_codec()
    topic = kafka_config.topics.events
    good_key = "payments:after-the-garbage"
    p = partition_for(good_key.encode(), kafka_config.partitions)
    other = intent("payments:the-real-effect-id", now_ms() + 3_600_000)
    truncated = codec.encode(intent("payments:truncated", now_ms() + 3_600_000))[:-7]
    bad = [
        (good_key.encode(), b"\x00garbage, not avro at all", "not Avro single-object encoding"),
        (good_key.encode(), truncated, "cannot decode effect_ledger.Intent"),
        (b"payments:some-other-key", codec.encode(other), "is not its effect_id"),
    ]
    good = intent(good_key, now_ms() + 3_600_000)
    with (
        running(proc),
        TopicReader(kafka_config, kafka_config.topics.dlq) as dlq,
        TopicReader(kafka_config, kafka_config.topics.state) as states,
        TopicReader(kafka_config, topic) as events,
    ):
        proc.wait_ready()
        producer = RawProducer(kafka_config)
        for key, value, _ in bad:  # all on the good event's partition, ahead of it
            producer.raw(topic, key, value, partition=p)
        producer.raw(topic, good_key.encode(), codec.encode(good), partition=p)
        producer.flush()
        produced = events.until(lambda rs: len(rs) == 4 and rs, 10, "the four records")
        offsets = {r.raw: r.offset for r in produced}

        letters = dlq.until(lambda rs: len(rs) >= 3 and rs, WAIT, "three dead letters")
        dead = sorted((r.value for r in letters), key=lambda d: d.offset)
        assert all(isinstance(d, DeadLetter) for d in dead), letters
        for d, (key, value, why) in zip(dead, bad, strict=True):
            assert why in d.error, (why, d.error)
            assert (d.topic, d.partition, d.offset) == (topic, p, offsets[value])
            assert (d.key, d.value) == (key, value)  # the original record, byte for byte
            assert d.consumer == f"{kafka_config.prefix}effect-ledger"
        assert [r.key for r in letters] == [key for key, _, _ in bad]

        # The valid event after the bad ones is folded.
        st = states.until(lambda rs: [r.value for r in rs if r.key == good_key.encode()], WAIT, "the good state")
        assert st[-1].state is State.PENDING and st[-1].version == 1
        status, body = proc.lookup(good_key)
        assert status == 200 and body["state"] == "PENDING"
        # Neither the mismatched record's effect_id nor the truncated one became an effect.
        never = lookup_all(proc, ["payments:the-real-effect-id", "payments:truncated"])
        assert [status for status, _ in never.values()] == [404, 404], never
        dlq.drain()
        assert len(dlq.records) == 3


# -- 5. read-your-writes ------------------------------------------------------------------------------


def test_lookup_right_after_a_synced_execute_sees_what_kafka_acknowledged(
    kafka_config: KafkaConfig, tmp_path: Path
) -> None:
    proc = Processor(kafka_config, tmp_path / "data")
    with running(proc):
        proc.wait_ready()

        async def go() -> list[tuple[str, int, dict[str, Any], set[str]]]:
            seen = []
            db = str(tmp_path / "agent.db")
            async with await Ledger.open(db, targets=DECLARED, kafka=kafka_config, sync=True) as ledger:
                for i in range(8):
                    c = await ledger.execute(
                        target="payments", operation="refund.create", run_id="ryw", step=f"s-{i}",
                        request={"i": i}, call=lambda key, i=i: {"id": f"re_{i}"},
                    )  # fmt: skip
                    # A sync caller goes on at its intent's delivery report; the relay marks the
                    # rows sent once its whole batch is in: wait for that mark, then read what
                    # Kafka acknowledged before the lookup.
                    end = time.monotonic() + WAIT
                    while not (
                        acked := {ev.event_id for _, ev, sent in await ledger.store.events(c.effect_id) if sent}
                    ):
                        assert time.monotonic() < end, f"{c.effect_id}: its intent was never marked sent"
                        await asyncio.sleep(0.01)
                    status, body = await asyncio.to_thread(proc.lookup, c.effect_id)
                    seen.append((c.effect_id, status, body, acked))
                deadline = time.monotonic() + WAIT
                while await ledger.store.outbox_depth() > 0:
                    assert time.monotonic() < deadline
                    await asyncio.sleep(0.02)
            return seen

        seen = asyncio.run(go())
        for key, status, body, acked in seen:
            assert status == 200, (key, body)  # the intent was acknowledged before the call: never 404
            assert body["known"] is True
            got = {e.event_id for e in decode_events(body)}
            assert acked and acked <= got, f"{key}: acknowledged before the lookup {acked - got} missing"
            assert body["state"] in ("PENDING", "EXECUTED", "CONFIRMED")
        # Once the relay has delivered everything, every lookup answers the final state.
        for key, *_ in seen:
            status, body = proc.lookup(key)
            assert (status, body["state"]) == (200, "CONFIRMED"), body


# -- 6. a restart with nothing new to fold -----------------------------------------------------


def committed_offsets(cfg: KafkaConfig, group: str, topic: str) -> dict[int, int]:
    """A group's committed offsets, asked without joining the group."""
    c = Consumer(cfg.confluent(**{"group.id": group, "enable.auto.commit": False}))
    try:
        tps = c.committed([TopicPartition(topic, p) for p in range(cfg.partitions)], timeout=10)
        return {tp.partition: int(tp.offset) for tp in tps}
    finally:
        c.close()


def test_restart_with_nothing_to_replay_answers_lookups_and_fires_deadlines(
    kafka_config: KafkaConfig, tmp_path: Path
) -> None:
    """Every offset committed, then a clean restart: no partition has anything new to fold. The
    restarted processor must still answer lookups (its table is complete) and fire the deadlines
    of effects it recovered from its table."""
    cfg = kafka_config
    proc = Processor(cfg, tmp_path / "data")
    done = one_key_per_partition("payments:idle-done-", cfg.partitions)
    open_ = one_key_per_partition("payments:idle-open-", cfg.partitions)
    with (
        running(proc),
        TopicReader(cfg, cfg.topics.events) as events,
        TopicReader(cfg, cfg.topics.state) as states,
        TopicReader(cfg, cfg.topics.uncertain) as uncertain,
    ):
        proc.wait_ready()
        producer = RawProducer(cfg)
        deadline = now_ms() + 10_000  # passes after the restart (or while it is down)
        for k in done:
            for ev in (intent(k, now_ms() + 3_600_000), executed(k, Outcome.OK), receipt(k)):
                producer.event(ev)
        for k in open_:
            producer.event(intent(k, deadline))
        producer.flush()
        want = {**{k: State.CONFIRMED for k in done}, **{k: State.PENDING for k in open_}}
        states.until(
            lambda rs: all(getattr(states.latest().get(k), "state", None) is s for k, s in want.items()),
            WAIT, "every effect folded",
        )  # fmt: skip
        group = f"{cfg.prefix}effect-ledger"
        wait_for(
            lambda: committed_offsets(cfg, group, cfg.topics.events) == events.high_watermarks(),
            30, "the processor to commit every offset it folded",
        )  # fmt: skip
        proc.stop()
        events.poll()
        assert not events.values(Timeout), "the deadline passed before the restart: raise it"
        proc.start()
        proc.wait_ready()

        problems = []
        for k, (status, body) in lookup_all(proc, done).items():
            if (status, body.get("state")) != (200, "CONFIRMED"):
                problems.append(f"lookup of {k} (partition {partition_for(k.encode(), cfg.partitions)}): "
                                f"{status} {body}")  # fmt: skip
        try:
            uncertain.until(
                lambda rs: set(open_) <= {r.key.decode() for r in rs if r.key},
                (deadline - now_ms()) / 1000 + 12, "an UncertainEffect for every passed deadline",
            )  # fmt: skip
        except TimeoutError:
            got = {r.key.decode() for r in uncertain.records if r.key}
            problems.append(
                f"deadlines never fired after the restart for {sorted(set(open_) - got)} "
                f"(deadline {deadline}, now {now_ms()}); health {proc.health()}"
            )
        assert problems == [], "\n".join(problems)


# -- 7. two instances -------------------------------------------------------------------------------


def test_two_instances_share_partitions_and_route_lookups(kafka_config: KafkaConfig, tmp_path: Path) -> None:
    a = Processor(kafka_config, tmp_path / "a" / "data")
    b = Processor(kafka_config, tmp_path / "b" / "data")
    every = set(range(kafka_config.partitions))
    with (
        running(a, b),
        TopicReader(kafka_config, kafka_config.topics.events) as events,
        TopicReader(kafka_config, kafka_config.topics.state) as states,
    ):

        def split() -> tuple[set[int], set[int]] | None:
            ha, hb = a.health(), b.health()
            if not (ha and hb and ha["ready"] and hb["ready"]):
                return None
            pa, pb = set(ha["partitions"]), set(hb["partitions"])
            return (pa, pb) if pa and pb and not pa & pb and pa | pb == every else None

        pa, pb = wait_for(split, WAIT, "both instances ready, owning disjoint partitions that cover all")

        producer = RawProducer(kafka_config)
        soon = now_ms() + 1500
        keys = []
        for i in range(60):
            key = f"payments:two-{i}"
            keys.append(key)
            far = now_ms() + 3_600_000
            producer.event(intent(key, soon if i % 3 == 1 else far))
            if i % 3 == 0:
                producer.event(executed(key, Outcome.OK))
                producer.event(receipt(key))
        producer.flush()
        owners = {partition_for(k.encode(), kafka_config.partitions) for k in keys}
        assert owners & pa and owners & pb, "the keys must land on both instances' partitions"

        timed_out = keys[1::3]

        def settled() -> dict[str, Effect] | None:
            events.drain()
            expected = folded_by_key(events.records)
            ok = set(expected) == set(keys) and all(expected[k].state is State.UNCERTAIN for k in timed_out)
            return expected if ok else None

        expected = wait_for(settled, WAIT, "every short deadline timed out (by whichever instance owns it)")
        want = {k: to_state(e) for k, e in expected.items()}
        wait_for(lambda: states_match(states, want), WAIT, "effects.state to equal a single fold per key")

        wrong = []
        # Four keys of every partition, asked through each instance (a lookup costs about a second).
        by_partition: dict[int, list[str]] = defaultdict(list)
        for k in keys:
            by_partition[partition_for(k.encode(), kafka_config.partitions)].append(k)
        sample = [k for ks in by_partition.values() for k in ks[:4]]
        for via, name in ((a, "A"), (b, "B")):
            for k, (status, body) in lookup_all(via, sample).items():
                p = partition_for(k.encode(), kafka_config.partitions)
                if (status, body.get("state"), body.get("version")) != (200, want[k].state.value, want[k].version):
                    owner = "A" if p in pa else "B"
                    wrong.append(f"asked {name}: {k} (partition {p}, owned by {owner}) -> {status} {body}")
        assert wrong == [], f"{len(wrong)} of {2 * len(sample)} lookups wrong:\n" + "\n".join(wrong)
        h = (a.health() or {}, b.health() or {})
        assert set(h[0]["partitions"]) == pa and set(h[1]["partitions"]) == pb  # no rebalance meanwhile

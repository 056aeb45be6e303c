"""Helpers of the processor's fault tests: events of a key, a steady flow of effects written to
effects.events from a thread (each key's events spread over time, so they cross batches,
rebalances and restarts), the check that the workers' published state of every key equals a single
in-order fold of its events, and the processors' consumer group (its commits, deleting it)."""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient

from effect_ledger.core.effect import fold, to_state
from effect_ledger.core.model import Executed, Intent, Outcome, Receipt, ReceiptSource
from effect_ledger.streams.config import KafkaConfig
from tests.services import Processor, wait_for
from tests.topic_io import RawProducer, TopicReader, running, untimed


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def intent(key: str, at_ms: int, deadline_ms: int, attempt: int = 1) -> Intent:
    """An intent of ``key``'s attempt ``attempt`` (a refund of 1), written at ``at_ms``."""
    return Intent(f"i{attempt}-{uuid.uuid4().hex}", key, at_ms, attempt, "payments", "refund.create", "tests",
                  "run-1", key, '{"amount": 1}', "d" * 64, deadline_ms, "w")  # fmt: skip


def key_events(key: str, shape: str, t: int) -> list[Any]:
    """``key``'s events from ``t`` on, its deadline an hour later: "pending" (the intent),
    "executed" (and its call's success), "confirmed" (and the receipt)."""
    far = t + 3_600_000
    first = intent(key, t, far)
    if shape == "pending":
        return [first]
    ex = Executed(f"x-{uuid.uuid4().hex}", key, t + 1, 1, Outcome.OK, None, t, t + 1, far, "w")
    if shape == "executed":
        return [first, ex]
    return [first, ex, Receipt(f"rc-{uuid.uuid4().hex}", key, t + 2, 1, f"re_{key}", ReceiptSource.CALL, "{}")]


def answered(p: Processor, key: str, state: str) -> bool:
    """Whether the worker's lookup of ``key`` answers ``state`` (the worker must be running)."""
    assert p.alive, p.log()[-3000:]
    status, body = p.lookup(key)
    return status == 200 and body.get("state") == state


def commits(cfg: KafkaConfig) -> dict[int, tuple[int, int]]:
    """partition of effects.events -> (the processors' committed offset, the end offset)."""
    c = Consumer(cfg.confluent(**{"group.id": f"{cfg.prefix}effect-ledger", "enable.auto.commit": False}))
    try:
        tps = [TopicPartition(cfg.topics.events, p) for p in range(cfg.partitions)]
        ends = {tp.partition: c.get_watermark_offsets(tp, timeout=10)[1] for tp in tps}
        return {tp.partition: (tp.offset, ends[tp.partition]) for tp in c.committed(tps, timeout=10)}
    finally:
        c.close()


def committed_through_end(cfg: KafkaConfig) -> bool:
    """Whether the processors' group has committed every partition of effects.events up to its end."""
    return all(committed >= end for committed, end in commits(cfg).values())


def forget_commits(cfg: KafkaConfig) -> None:
    """Delete the processors' consumer group (its members are gone): no partition has a commit."""
    group = f"{cfg.prefix}effect-ledger"
    admin = AdminClient(cfg.confluent())
    futures = admin.delete_consumer_groups([group], request_timeout=30)
    futures[group].result(timeout=30)


class Flow:
    """Writes ``keys`` effects over about ``seconds``: every key's intent first, its later events
    a little after, interleaved with other keys'. ``events`` holds what was acknowledged."""

    def __init__(self, cfg: KafkaConfig, prefix: str, keys: int, seconds: float, seed: int = 7) -> None:
        self.cfg = cfg
        rnd = random.Random(seed)
        t = time.time_ns() // 1_000_000
        shapes = ["confirmed", "confirmed", "executed", "pending"]
        self.events: dict[str, list[Any]] = {
            f"payments:{prefix}-{i}": key_events(f"payments:{prefix}-{i}", shapes[i % len(shapes)], t + i)
            for i in range(keys)
        }
        # A schedule: (when, event); a key's events are 0.3-3 s apart.
        sched: list[tuple[float, Any]] = []
        for i, evs in enumerate(self.events.values()):
            at = seconds * i / keys
            for ev in evs:
                sched.append((at, ev))
                at += rnd.uniform(0.3, 3.0)
        sched.sort(key=lambda x: x[0])
        self.schedule = sched
        self.done = threading.Event()
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> Flow:
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            p = RawProducer(self.cfg)
            t0 = time.monotonic()
            for at, ev in self.schedule:
                wait = t0 + at - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
                p.event(ev)
            p.flush(60)
        except BaseException as e:  # noqa: BLE001
            self.error = e
        finally:
            self.done.set()

    def join(self, timeout: float = 120) -> None:
        assert self.done.wait(timeout), "the flow did not finish"
        assert self.error is None, self.error

    def expected(self) -> dict[str, Any]:
        return {k: to_state(fold(v)) for k, v in self.events.items()}


def mismatches(states: TopicReader, expected: dict[str, Any], same: Callable[[Any], Any] = untimed) -> dict[str, Any]:
    """The keys whose published state differs from ``expected`` (compared through ``same``)."""
    states.poll()
    latest = states.latest()
    return {k: (latest.get(k), s) for k, s in expected.items() if same(latest.get(k)) != same(s)}


def describe(bad: dict[str, Any], n: int = 5) -> str:
    out = []
    for k, (got, want) in list(bad.items())[:n]:
        g = None if got is None else (got.state.value, got.version)
        out.append(f"{k}: published {g}, single fold {(want.state.value, want.version)}")
    return f"{len(bad)} key(s) differ: " + "; ".join(out)


def write_each(producer: RawProducer, keys: list[str], events: dict[str, list[Any]]) -> Callable[[int], None]:
    """``write(i)``: the i-th event of every key, flushed."""

    def write(i: int) -> None:
        for k in keys:
            producer.event(events[k][i])
        producer.flush(30)

    return write


def published(states: TopicReader, keys: list[str], state: str) -> bool:
    """Whether every key's latest published state is ``state`` (reads what came meanwhile)."""
    states.poll()
    latest = states.latest()
    return all((s := latest.get(k)) is not None and s.state.value == state for k in keys)


def settled(cfg: KafkaConfig, states: TopicReader, expected: dict[str, Any], commit_wait: float) -> None:
    """Every key's last published state becomes its single fold (within 60 s), and the processors'
    group commits every event (within ``commit_wait``)."""
    try:
        wait_for(lambda: not mismatches(states, expected), 60, "every key's last state to be its single fold")
    except TimeoutError as e:
        raise AssertionError(f"{e}: {describe(mismatches(states, expected))}") from None
    wait_for(lambda: committed_through_end(cfg), commit_wait, "the group to commit every event")


def rebuilt(cfg: KafkaConfig, data_dir: Any, keys: list[str], state: str, ready_wait: float) -> None:
    """A worker with an empty ``data_dir`` (the changelog and the commits only) serves ``state`` for
    every key."""
    c = Processor(cfg, data_dir)
    with running(c):
        c.wait_ready(ready_wait)
        for k in keys:
            wait_for(lambda k=k: answered(c, k, state), 30, f"{k} rebuilt {state}")

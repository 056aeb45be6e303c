"""Test helpers for the service-level integration tests: reading a topic from its beginning (no
consumer group, every partition), producing raw records, and running real services for the span of a
``with`` block. Every wait polls a condition against a deadline."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition

from effect_ledger.errors import DecodeError
from effect_ledger.sdk.kafka.relay import producer_config
from effect_ledger.streams.codec import default_codec
from effect_ledger.streams.config import KafkaConfig
from effect_ledger.streams.partition import partition_for
from tests.services import Service, wait_for

S = TypeVar("S", bound=Service)
ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Record:
    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    key: bytes | None
    raw: bytes | None
    value: Any  # decoded with the default codec; None when it does not decode


class TopicReader:
    """Every record of one topic, from offset 0 of each partition, decoded as it arrives."""

    def __init__(self, cfg: KafkaConfig, topic: str) -> None:
        self.cfg = cfg
        self.topic = topic
        self.codec = default_codec()
        self.records: list[Record] = []
        self._consumer = Consumer(
            cfg.confluent(
                **{
                    "group.id": f"reader-{uuid.uuid4().hex[:12]}",  # never joins: assign(), no commits
                    "enable.auto.commit": False,
                    "auto.offset.reset": "earliest",
                    "enable.partition.eof": False,
                }
            )
        )
        self._consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(cfg.partitions)])

    def poll(self, timeout: float = 0.1) -> list[Record]:
        got: list[Record] = []
        for m in self._consumer.consume(1000, timeout):
            err = m.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    continue
                raise RuntimeError(f"reading {self.topic}: {err}")
            raw = m.value()
            try:
                value = self.codec.decode(raw)
            except DecodeError:
                value = None
            ts = m.timestamp()[1]
            got.append(Record(self.topic, int(m.partition() or 0), int(m.offset() or 0), ts, m.key(), raw, value))
        self.records.extend(got)
        return got

    def until(self, predicate: Callable[[list[Record]], Any], timeout: float, what: str) -> Any:
        """Read until ``predicate(all records so far)`` is truthy; return its value."""
        end = time.monotonic() + timeout
        while True:
            self.poll()
            value = predicate(self.records)
            if value:
                return value
            if time.monotonic() > end:
                raise TimeoutError(f"timed out after {timeout} s waiting for {what} on {self.topic}")

    def high_watermarks(self) -> dict[int, int]:
        return {
            p: self._consumer.get_watermark_offsets(TopicPartition(self.topic, p), timeout=10, cached=False)[1]
            for p in range(self.cfg.partitions)
        }

    def drain(self, timeout: float = 30) -> list[Record]:
        """Read everything the topic holds right now (up to the current high watermarks)."""
        hw = self.high_watermarks()

        def done(records: list[Record]) -> bool:
            last: dict[int, int] = {}
            for r in records:
                last[r.partition] = max(last.get(r.partition, -1), r.offset)
            return all(last.get(p, -1) >= h - 1 for p, h in hw.items())

        self.until(done, timeout, f"the records up to the high watermarks {hw}")
        return self.records

    def values(self, kind: type | None = None) -> list[Any]:
        return [r.value for r in self.records if r.value is not None and (kind is None or isinstance(r.value, kind))]

    def latest(self) -> dict[str, Any]:
        """The last decoded value per record key (what a compacted topic converges to)."""
        out: dict[str, Any] = {}
        for r in sorted(self.records, key=lambda r: (r.partition, r.offset)):
            if r.key is not None and r.value is not None:
                out[r.key.decode()] = r.value
        return out

    def close(self) -> None:
        self._consumer.close()

    def __enter__(self) -> TopicReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class RawProducer:
    """An idempotent producer for ``effects.events`` (the relay's settings), with codec helpers."""

    def __init__(self, cfg: KafkaConfig) -> None:
        self.cfg = cfg
        self.codec = default_codec()
        self._p = Producer(producer_config(cfg, **{"message.timeout.ms": 30_000}))
        self.errors: list[str] = []

    def _report(self, err: KafkaError | None, _msg: Any) -> None:
        if err is not None:
            self.errors.append(str(err))

    def raw(self, topic: str, key: bytes | None, value: bytes | None, partition: int | None = None) -> None:
        kwargs: dict[str, Any] = {"key": key, "value": value, "on_delivery": self._report}
        if partition is not None:
            kwargs["partition"] = partition
        while True:
            try:
                self._p.produce(topic, **kwargs)
                break
            except BufferError:
                self._p.poll(0.05)
        self._p.poll(0)

    def event(self, ev: Any, topic: str | None = None) -> None:
        self._p.produce(
            topic or self.cfg.topics.events,
            key=ev.effect_id.encode(),
            value=self.codec.encode(ev),
            headers=[self.codec.header(ev)],
            on_delivery=self._report,
        )
        self._p.poll(0)

    def flush(self, timeout: float = 30) -> None:
        left = self._p.flush(timeout)
        assert left == 0 and not self.errors, f"{left} records not delivered; errors {self.errors[:3]}"


def one_key_per_partition(prefix: str, partitions: int) -> list[str]:
    """A key for each partition, in partition order: ``prefix`` and a number."""
    keys: dict[int, str] = {}
    i = 0
    while len(keys) < partitions:
        k = f"{prefix}{i}"
        keys.setdefault(partition_for(k.encode(), partitions), k)
        i += 1
    return [keys[p] for p in range(partitions)]


@contextmanager
def running(*services: S) -> Iterator[tuple[S, ...]]:
    """Start the services; SIGKILL whatever still runs on the way out (the topics are deleted
    afterwards anyway), and show their logs when the block failed."""
    try:
        for s in services:
            if not s.alive:
                s.start()
        yield services
    except BaseException:
        for s in services:
            print(f"---- log of {' '.join(s.args[:2])} ({s.log_path}) ----\n{s.log()[-6000:]}")
        raise
    finally:
        for s in services:
            s.kill()


def run_agent(
    cfg: KafkaConfig,
    workdir: Path,
    gateway: str,
    crash: str,
    *,
    run_id: str,
    timeout: float,
    extra: Sequence[str] = (),
    env: dict[str, str] | None = None,
) -> subprocess.Popen[bytes]:
    """The demo agent in Kafka mode (intent acknowledged by Kafka before the call), killing itself with
    SIGKILL at the crash point ``crash`` ("" for none). Its order id is its run id. ``extra``: more
    agent options (``--kind``, ``--lookup``); ``env``: more environment (a skewed clock)."""
    workdir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, EFFECT_LEDGER_CRASH=crash, **(env or {}))
    return subprocess.Popen(
        [
            sys.executable, "-m", "effect_ledger.demo.agent", "--mode", "ledger", "--kafka", cfg.bootstrap,
            "--prefix", cfg.prefix, "--workdir", str(workdir), "--gateway", gateway, "--run-id", run_id,
            "--order", run_id, "--timeout", str(timeout), *extra,
        ],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip


def recorded_times(cfg: KafkaConfig) -> None:
    """Keep the producer's timestamps on ``cfg``'s events and decisions topics (CreateTime), for a
    fixture that replays a recorded incident with its original times: on the topics as created,
    the broker stamps each record as it appends it (LogAppendTime), and a replay would all be "now"."""
    from confluent_kafka.admin import (
        AdminClient,
        AlterConfigOpType,
        ConfigEntry,
        ConfigResource,
        ResourceType,
    )

    admin = AdminClient(cfg.confluent())
    entry = ConfigEntry("message.timestamp.type", "CreateTime", incremental_operation=AlterConfigOpType.SET)
    topics = (cfg.topics.events, cfg.topics.decisions)
    resources = [ConfigResource(ResourceType.TOPIC, t, incremental_configs=[entry]) for t in topics]
    for fut in admin.incremental_alter_configs(resources).values():
        fut.result(30)

    # The controller has committed the change; the broker applies it when it replays the metadata
    # log, a moment later on a loaded machine. Until then it still stamps (and describes) LogAppendTime.
    def applied() -> bool:
        described = admin.describe_configs([ConfigResource(ResourceType.TOPIC, t) for t in topics])
        return all(f.result(30)["message.timestamp.type"].value == "CreateTime" for f in described.values())

    wait_for(applied, 30, f"{topics} described with message.timestamp.type CreateTime")


def untimed(s: Any) -> Any:
    """A state record without its times, to compare what the processor published with a fold of
    the same events: the processor's times are the log's (when the broker took each event), a
    test's fold has the writers' claims; everything else is folded alike."""
    import dataclasses

    if s is None:
        return None
    return dataclasses.replace(s, created_ms=0, updated_ms=0, deadline_ms=None if s.deadline_ms is None else 0)

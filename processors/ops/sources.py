"""Where the operator tools read from: the Kafka topics, or an embedded ledger's SQLite file.

Replays stream: events are yielded one at a time and never collected into a list, so a replay of
millions of events runs in the memory of what is folded from them.

confluent-kafka (the ``[kafka]`` extra) is imported only by the Kafka readers: ``db_events`` works
in the base install.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from effect_ledger.streams.codec import Codec, DecodeError, default_codec
from effect_ledger.streams.config import KafkaConfig
from effect_ledger.streams.errors import StorageError
from effect_ledger.streams.model import EffectState, Event, Retirement, misplaced
from effect_ledger.streams.partition import partition_for
from effect_ledger.streams.reader import LedgerReader
from effect_ledger.streams.schema_topic import kafka_codec

if TYPE_CHECKING:
    from confluent_kafka import Consumer, KafkaError, TopicPartition

Progress = Callable[[int, int], None]  # (done, total)


class SourceError(RuntimeError):
    """The source cannot be read (no broker, no such file or topic): a one-line message."""


@dataclass(frozen=True)
class Replayed:
    event: Event | None  # None: the record could not be decoded
    error: str | None
    partition: int
    offset: int
    key: str | None = None  # the record's key (the effect id), known even when the value does not decode
    in_window: bool = True  # positioned before the window's end (see ``effect_ledger.processors.ops.audit``)


def _consumer(cfg: KafkaConfig) -> Consumer:
    from confluent_kafka import Consumer

    return Consumer(
        cfg.confluent(
            **{
                "group.id": f"effects-tool-{uuid.uuid4().hex}",
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                "enable.partition.eof": False,
                "fetch.max.bytes": 52_428_800,
                "queued.max.messages.kbytes": 65_536,  # the fold, not the fetch, is the bottleneck
            }
        )
    )


def _partitions(c: Consumer, topic: str) -> list[int]:
    from confluent_kafka import KafkaException

    try:
        md = c.list_topics(topic, timeout=10)
    except KafkaException as e:
        raise SourceError(f"cannot read topic {topic}: {e.args[0].str()}") from None
    t = md.topics.get(topic)
    if t is None or t.error is not None or not t.partitions:
        raise SourceError(f"topic {topic} does not exist (wrong --prefix?)")
    return sorted(t.partitions)


def _ranges(c: Consumer, topic: str, parts: list[int], from_ms: int | None) -> list[TopicPartition]:
    """Start offsets (at ``from_ms`` by offsets_for_times, or the beginning) and the end offsets
    (high watermarks when the replay starts: later records are not part of it)."""
    from confluent_kafka import OFFSET_END, TopicPartition

    starts: dict[int, int] = {}
    if from_ms is None:
        for p in parts:
            lo, _ = c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            starts[p] = lo
    else:
        found = c.offsets_for_times([TopicPartition(topic, p, from_ms) for p in parts], timeout=10)
        for tp in found:
            starts[tp.partition] = tp.offset
    out = []
    for p in parts:
        _, hi = c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
        start = hi if starts[p] in (OFFSET_END, -1) else starts[p]
        if start < hi:
            out.append(TopicPartition(topic, p, start, metadata=str(hi)))  # metadata: where it ends
    return out


def replay_topic(
    cfg: KafkaConfig,
    topic: str,
    from_ms: int | None = None,
    progress: Progress | None = None,
    partitions: list[int] | None = None,
) -> Iterator[tuple[bytes | None, bytes | None, int, int]]:
    """Raw records (key, value, partition, offset) of ``topic`` from ``from_ms`` (or the start) to
    the end offsets seen when the replay began."""
    c = _consumer(cfg)
    try:
        parts = partitions if partitions is not None else _partitions(c, topic)
        ranges = _ranges(c, topic, parts, from_ms)
        if not ranges:
            return
        ends = {tp.partition: int(tp.metadata or 0) for tp in ranges}
        total = sum(ends[tp.partition] - tp.offset for tp in ranges)
        done = 0
        c.assign(ranges)
        remaining = set(ends)
        while remaining:
            # Never ask for more than is left: consume() would wait out its timeout for the rest.
            msgs = c.consume(max(1, min(10_000, total - done)), 1.0)
            for m in msgs:
                if m.error():
                    raise SourceError(f"reading {topic}: {m.error()}")
                p, off = int(m.partition() or 0), int(m.offset() or 0)
                if p not in remaining:
                    continue
                if off >= ends[p]:
                    remaining.discard(p)
                    continue
                done += 1
                yield m.key(), m.value(), p, off
                if off >= ends[p] - 1:
                    remaining.discard(p)
            if progress and msgs:
                progress(done, total)
    finally:
        c.close()


def window_ends(cfg: KafkaConfig, topic: str, to_ms: int) -> dict[int, int]:
    """Per partition, the offset of the first record whose timestamp is at or after ``to_ms``
    (``offsets_for_times``), or the high watermark when there is none: where a window ending at
    ``to_ms`` ends in the log. Found the same way as where it starts, so a window is a range of
    positions in each partition, and no event's own clock decides what lies inside it."""
    from confluent_kafka import OFFSET_END, TopicPartition

    c = _consumer(cfg)
    try:
        parts = _partitions(c, topic)
        found = c.offsets_for_times([TopicPartition(topic, p, to_ms) for p in parts], timeout=10)
        ends = {}
        for tp in found:
            end = tp.offset
            if end in (OFFSET_END, -1):  # no record at or after to_ms: the window runs to the end
                _, end = c.get_watermark_offsets(TopicPartition(topic, tp.partition), timeout=10)
            ends[tp.partition] = end
        return ends
    finally:
        c.close()


def _key_text(key: bytes | None) -> str | None:
    return None if key is None else key.decode("utf-8", "replace")


def follow_topic(
    cfg: KafkaConfig,
    topic: str,
    *,
    give_up_s: float,
    from_beginning: bool = False,
    stop: threading.Event | None = None,
) -> Iterator[bytes | None]:
    """The values of ``topic`` as they arrive (a fresh consumer group, no commits), until ``stop``
    is set. Raises ``SourceError`` once no broker has answered for ``give_up_s`` seconds: at the
    start, or after the broker went away. While it is away the consumer asks for metadata once a
    second, so a broker that comes back within the bound is followed again."""
    from confluent_kafka import Consumer, KafkaError, KafkaException

    # librdkafka's errors meaning "no broker can be reached" (as opposed to a record-level error).
    unreachable = frozenset({KafkaError._ALL_BROKERS_DOWN, KafkaError._TRANSPORT, KafkaError._RESOLVE})
    down_since: float | None = time.monotonic()  # until a broker has answered
    last_error = "no answer yet"

    def on_error(err: KafkaError) -> None:  # librdkafka reports here, from poll(); its logs stay quiet
        nonlocal down_since, last_error
        last_error = err.str()
        if err.code() in unreachable and down_since is None:
            down_since = time.monotonic()

    c = Consumer(
        cfg.confluent(
            **{
                "group.id": f"effects-follow-{uuid.uuid4().hex}",
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest" if from_beginning else "latest",
                "error_cb": on_error,
            }
        )
    )
    probe_at = 0.0
    try:
        c.subscribe([topic])
        while stop is None or not stop.is_set():
            m = c.poll(0.5)
            if m is not None and not m.error():
                down_since = None
                yield m.value()
                continue
            if down_since is None:
                continue
            now = time.monotonic()
            if now - down_since >= give_up_s:
                raise SourceError(
                    f"no Kafka broker answered at {cfg.bootstrap} for {give_up_s:g} s ({last_error}); gave up"
                )
            if now >= probe_at:
                probe_at = now + 1.0
                try:
                    c.list_topics(topic, timeout=min(1.0, give_up_s))
                    down_since = None
                except KafkaException as e:
                    last_error = e.args[0].str() if e.args else str(e)
    finally:
        c.close()


def _fold_sources(cfg: KafkaConfig) -> list[tuple[str, bool]]:
    """The topics the processor folds, as (name, is the decisions topic). A deployment whose
    decisions topic was never created has no decisions: that topic is left out, not an error."""
    c = _consumer(cfg)
    try:
        _partitions(c, cfg.topics.events)  # the events topic must exist
        try:
            _partitions(c, cfg.topics.decisions)
            has_decisions = True
        except SourceError:
            has_decisions = False
    finally:
        c.close()
    return [(cfg.topics.events, False)] + ([(cfg.topics.decisions, True)] if has_decisions else [])


def _decoded(codec: Codec, value: bytes | None, decisions_topic: bool) -> tuple[Event | None, str | None]:
    """The event a record holds, or why it is not one the processor folds (the same rule)."""
    try:
        record = codec.decode(value)
    except DecodeError as e:
        return None, str(e)
    if isinstance(record, Retirement):
        return None, None  # a command to the processor (retention), not a fact about the effect
    why = misplaced(record, decisions_topic=decisions_topic)
    return (None, why) if why is not None else (record, None)


def replay_events(
    cfg: KafkaConfig, from_ms: int | None, progress: Progress | None = None, to_ms: int | None = None
) -> Iterator[Replayed]:
    """Every record of ``effects.events`` and ``effects.decisions`` from the first whose timestamp
    is at or after ``from_ms``: the event, or why it is none (undecodable, or a record the processor
    does not fold from that topic). With ``to_ms``, records from the first whose timestamp is at or
    after it on are marked ``in_window=False`` (they are replayed all the same: later events of
    effects begun inside)."""
    codec = kafka_codec(cfg)
    for topic, decisions in _fold_sources(cfg):
        ends = window_ends(cfg, topic, to_ms) if to_ms is not None else None
        for key, value, p, off in replay_topic(cfg, topic, from_ms, progress):
            in_window = ends is None or off < ends.get(p, 0)
            event, error = _decoded(codec, value, decisions)
            if event is None and error is None:
                continue  # a retention command: the audit counts facts only
            yield Replayed(event, error, p, off, _key_text(key), in_window)


def key_events(cfg: KafkaConfig, key: str, progress: Progress | None = None) -> Iterator[Event]:
    """Every event of one key, as the processor folds them: only its partition of each topic is
    read."""
    c = _consumer(cfg)
    try:
        n = len(_partitions(c, cfg.topics.events))
    finally:
        c.close()
    codec = kafka_codec(cfg)
    kb = key.encode()
    for topic, decisions in _fold_sources(cfg):
        for k, value, _p, _off in replay_topic(cfg, topic, None, progress, [partition_for(kb, n)]):
            if k == kb:
                event, _ = _decoded(codec, value, decisions)
                if event is not None:
                    yield event


def latest_states(cfg: KafkaConfig, progress: Progress | None = None) -> dict[str, EffectState]:
    """The latest state of every effect, from the compacted ``effects.state``."""
    codec = kafka_codec(cfg)
    out: dict[str, EffectState] = {}
    for k, value, _p, _off in replay_topic(cfg, cfg.topics.state, None, progress):
        if value is None and k is not None:
            out.pop(k.decode("utf-8", "replace"), None)  # a tombstone: the effect was retired
            continue
        try:
            st = codec.decode(value)
        except DecodeError:
            continue
        prev = out.get(st.effect_id)
        if prev is None or st.version >= prev.version:
            out[st.effect_id] = st
    return out


def db_events(path: str | Path, from_ms: int | None = None, to_ms: int | None = None) -> Iterator[Replayed]:
    """Events of an embedded ledger file, in the order they were written, from the first row whose
    time is at or after ``from_ms``: the same cut as ``offsets_for_times`` on Kafka. Rows after that
    one are all replayed, whatever time they carry; with ``to_ms``, rows from the first at or after it
    on are marked ``in_window=False``."""
    p = Path(path)
    if not p.exists():
        raise SourceError(f"no ledger file at {p}")
    codec = default_codec()
    try:
        reader = LedgerReader.open(p)
    except StorageError as e:
        raise SourceError(str(e)) from None
    started, ended = from_ms is None, False
    try:
        try:
            # One pass in the order of writing: times only mark where the window starts and ends.
            for seq, key, at_ms, body in reader.events():
                started = started or (from_ms is not None and at_ms >= from_ms)
                if not started:
                    continue
                ended = ended or (to_ms is not None and at_ms >= to_ms)
                try:
                    yield Replayed(codec.decode(body), None, 0, seq, key, not ended)
                except DecodeError as e:
                    yield Replayed(None, str(e), 0, seq, key, not ended)
        except StorageError as e:
            raise SourceError(str(e)) from None
    finally:
        reader.close()

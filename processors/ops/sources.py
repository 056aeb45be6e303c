"""Where the operator tools read from: the Kafka topics, or an embedded ledger's SQLite file.

Replays stream: events are yielded one at a time and never collected into a list, so a replay of
millions of events runs in the memory of what is folded from them.
"""

from __future__ import annotations

import sqlite3
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import OFFSET_END, Consumer, KafkaException, TopicPartition

from effect_ledger.streams.codec import Codec, DecodeError, default_codec
from effect_ledger.streams.config import KafkaConfig
from effect_ledger.streams.model import EffectState, Event, misplaced
from effect_ledger.streams.partition import partition_for

Progress = Callable[[int, int], None]  # (done, total)


class SourceError(RuntimeError):
    """The source cannot be read (no broker, no such file or topic): a one-line message."""


@dataclass(frozen=True)
class Replayed:
    event: Event | None  # None: the record could not be decoded
    error: str | None
    partition: int
    offset: int


def _consumer(cfg: KafkaConfig) -> Consumer:
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
    why = misplaced(record, decisions_topic=decisions_topic)
    return (None, why) if why is not None else (record, None)


def replay_events(cfg: KafkaConfig, from_ms: int | None, progress: Progress | None = None) -> Iterator[Replayed]:
    """Every record of ``effects.events`` and ``effects.decisions`` from ``from_ms``: the event, or
    why it is none (undecodable, or a record the processor does not fold from that topic)."""
    codec = default_codec()
    for topic, decisions in _fold_sources(cfg):
        for _key, value, p, off in replay_topic(cfg, topic, from_ms, progress):
            event, error = _decoded(codec, value, decisions)
            yield Replayed(event, error, p, off)


def key_events(cfg: KafkaConfig, key: str, progress: Progress | None = None) -> Iterator[Event]:
    """Every event of one key, as the processor folds them: only its partition of each topic is
    read."""
    c = _consumer(cfg)
    try:
        n = len(_partitions(c, cfg.topics.events))
    finally:
        c.close()
    codec = default_codec()
    kb = key.encode()
    for topic, decisions in _fold_sources(cfg):
        for k, value, _p, _off in replay_topic(cfg, topic, None, progress, [partition_for(kb, n)]):
            if k == kb:
                event, _ = _decoded(codec, value, decisions)
                if event is not None:
                    yield event


def latest_states(cfg: KafkaConfig, progress: Progress | None = None) -> dict[str, EffectState]:
    """The latest state of every effect, from the compacted ``effects.state``."""
    codec = default_codec()
    out: dict[str, EffectState] = {}
    for _k, value, _p, _off in replay_topic(cfg, cfg.topics.state, None, progress):
        try:
            st = codec.decode(value)
        except DecodeError:
            continue
        prev = out.get(st.effect_id)
        if prev is None or st.version >= prev.version:
            out[st.effect_id] = st
    return out


def db_events(path: str | Path, from_ms: int | None = None) -> Iterator[Replayed]:
    """Events of an embedded ledger file, in the order they were written."""
    p = Path(path)
    if not p.exists():
        raise SourceError(f"no ledger file at {p}")
    codec = default_codec()
    conn = sqlite3.connect(f"file:{p}?mode=ro", uri=True)
    try:
        sql = "SELECT seq, body FROM events" + (" WHERE at_ms >= ?" if from_ms is not None else "") + " ORDER BY seq"
        try:
            cur = conn.execute(sql, (from_ms,) if from_ms is not None else ())
        except sqlite3.DatabaseError as e:
            raise SourceError(f"{p} is not an effect-ledger file: {e}") from None
        for seq, body in cur:
            try:
                yield Replayed(codec.decode(body), None, 0, seq)
            except DecodeError as e:
                yield Replayed(None, str(e), 0, seq)
    finally:
        conn.close()

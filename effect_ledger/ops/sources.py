"""Where the operator tools read from: the Kafka topics, or an embedded ledger's SQLite file.

Replays stream: events are yielded one at a time and never collected into a list, so a replay of
millions of events runs in the memory of what is folded from them.

confluent-kafka (the ``[kafka]`` extra) is imported only by the Kafka readers: ``db_events`` works
in the base install.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from effect_ledger.core.model import (
    DECISIONS_TOPIC_TYPES,
    EVENTS_TOPIC_TYPES,
    EffectState,
    Event,
    Intent,
    Retirement,
    misplaced,
)
from effect_ledger.errors import DecodeError, NotAuthorized, StorageError
from effect_ledger.sdk.store.reader import LedgerReader
from effect_ledger.streams.acl import client_group
from effect_ledger.streams.codec import Codec, default_codec
from effect_ledger.streams.config import KafkaConfig
from effect_ledger.streams.log_clock import log_time_of
from effect_ledger.streams.partition import partition_for
from effect_ledger.streams.schema_topic import kafka_codec

if TYPE_CHECKING:
    from confluent_kafka import Consumer, KafkaError, TopicPartition

Progress = Callable[[int, int], None]  # (done, total)


class SourceError(RuntimeError):
    """The source cannot be read (no broker, no such file or topic): a one-line message."""


class Replayed(NamedTuple):
    """One replayed record. A named tuple: a replay makes millions of them, and a frozen
    dataclass costs several times more to build."""

    event: Event | None  # None: the record could not be decoded
    error: str | None
    partition: int
    offset: int
    key: str | None = None  # the record's key when ``event`` is None (the event names its effect itself)
    in_window: bool = True  # positioned before the window's end (see ``effect_ledger.ops.audit``)
    # With ``build=False`` (the audit): instead of ``event``, its class and its fields as decoded.
    model: type | None = None
    fields: dict[str, Any] | None = None


def _consumer(cfg: KafkaConfig) -> Consumer:
    from confluent_kafka import Consumer

    return Consumer(
        cfg.confluent(
            **{
                "group.id": client_group(cfg.prefix, "tool"),
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
    if t is not None and t.error is not None:
        _refused(topic, t.error, "Describe")
    if t is None or t.error is not None or not t.partitions:
        raise SourceError(f"topic {topic} does not exist (wrong --prefix?)")
    return sorted(t.partitions)


def _refused(topic: str, err: Any, operation: str = "Read", *, group: bool = False) -> None:
    """``NotAuthorized`` when ``err`` is Kafka's ACLs refusing this client ``topic`` (or, with
    ``group``, its consumer group): a credential that may not read a topic is told so, never that
    the topic is missing or the key unknown, and never left waiting in silence."""
    from confluent_kafka import KafkaError

    code = KafkaError.GROUP_AUTHORIZATION_FAILED if group else KafkaError.TOPIC_AUTHORIZATION_FAILED
    if isinstance(err, KafkaError) and err.code() == code:
        what = "its consumer group (effects acl)" if group else f"topic {topic}"
        raise NotAuthorized(f"reading {topic}", "this client's principal", [f"{operation} on {what}"])


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
        c.assign(ranges)
        for batch in _consume_range(c, topic, ends, sum(ends[tp.partition] - tp.offset for tp in ranges), progress):
            for m in batch:
                yield m.key(), m.value(), m.partition(), m.offset()
    finally:
        c.close()


_give_up_s = 30.0


def set_give_up(seconds: float) -> None:
    """How long a replay waits while no record arrives and no broker answers before it gives up
    (``SourceError``) [30 s]; the command line sets ``--broker-timeout``."""
    global _give_up_s
    _give_up_s = seconds


def _consume_range(
    c: Consumer, topic: str, ends: dict[int, int], total: int, progress: Progress | None = None
) -> Iterator[list[Any]]:
    """The records of the partitions assigned to ``c`` up to ``ends`` (exclusive end offsets), a
    batch (a list) at a time, then stop. A broker that goes away mid-replay is not waited for
    forever: once nothing has arrived for the give-up time (``set_give_up``) and a metadata request
    fails, ``SourceError``."""
    from confluent_kafka import KafkaException

    remaining = set(ends)
    done = 0
    quiet_since = time.monotonic()
    while remaining:
        # Never ask for more than is left: consume() would wait out its timeout for the rest.
        msgs = c.consume(max(1, min(10_000, total - done)), 1.0)
        if not msgs:
            if time.monotonic() - quiet_since >= _give_up_s:
                try:
                    c.list_topics(topic, timeout=min(5.0, _give_up_s))
                except KafkaException as e:
                    why = e.args[0].str() if e.args else str(e)
                    raise SourceError(
                        f"reading {topic}: no Kafka broker answered for {_give_up_s:g} s ({why}); gave up "
                        f"after {done:,} of {total:,} records"
                    ) from None
                quiet_since = time.monotonic()  # the broker answers: records are only slow to come
            continue
        quiet_since = time.monotonic()
        batch = []
        for m in msgs:
            if m.error():
                _refused(topic, m.error())
                raise SourceError(f"reading {topic}: {m.error()}")
            p, off = m.partition(), m.offset()
            if p not in remaining or off is None:
                continue
            if off >= ends[p]:
                remaining.discard(p)
                continue
            batch.append(m)
            if off >= ends[p] - 1:
                remaining.discard(p)
        done += len(batch)
        yield batch
        if progress:
            progress(done, total)


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
                "group.id": client_group(cfg.prefix, "follow"),
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
            if m is not None:
                _refused(topic, m.error())  # the ACLs' answer is one line, not a silent wait
                _refused(f"the group of {topic}", m.error(), "Read", group=True)
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
        return _fold_sources_of(c, cfg)
    finally:
        c.close()


def _fold_sources_of(c: Consumer, cfg: KafkaConfig) -> list[tuple[str, bool]]:
    _partitions(c, cfg.topics.events)  # the events topic must exist
    try:
        _partitions(c, cfg.topics.decisions)
        has_decisions = True
    except SourceError:
        has_decisions = False
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


Key = bytes | str | None
Reader = Callable[[bytes | None, int, int, Key, bool], "Replayed | None"]


def _reader(decisions: bool | None, build: bool, codec: Codec) -> Reader:
    """Record -> ``Replayed``: the event (or with ``build=False`` its class and fields), or why it
    is none: undecodable, or a record the processor does not fold from that topic (``decisions``:
    read from the decisions topic; None: a ledger file, which holds both). None for a retention
    command (``Retirement``): an instruction to the processor, not a fact about the effect."""
    allowed = (
        EVENTS_TOPIC_TYPES + DECISIONS_TOPIC_TYPES
        if decisions is None
        else DECISIONS_TOPIC_TYPES
        if decisions
        else EVENTS_TOPIC_TYPES
    )

    def refused(value: bytes | None, p: int, off: int, key: Key, in_window: bool) -> Replayed:
        try:
            why = misplaced(codec.decode(value), decisions_topic=bool(decisions)) or "not an event"
        except DecodeError as e:
            why = str(e)
        return Replayed(None, why, p, off, key if not isinstance(key, bytes) else _key_text(key), in_window)

    if build:
        decode = codec.decode

        def read(value: bytes | None, p: int, off: int, key: Key, in_window: bool) -> Replayed | None:
            try:
                event = decode(value)
            except DecodeError:
                return refused(value, p, off, key, in_window)
            if type(event) is Retirement:
                return None
            if type(event) in allowed:
                return _replayed(Replayed, (event, None, p, off, None, in_window, None, None))
            return refused(value, p, off, key, in_window)

        return read

    decode_fields = codec.decode_fields

    def read_fields(value: bytes | None, p: int, off: int, key: Key, in_window: bool) -> Replayed | None:
        try:
            model, fields = decode_fields(value)
        except DecodeError:
            return refused(value, p, off, key, in_window)
        if model is Retirement:
            return None
        if model in allowed:
            return _replayed(Replayed, (None, None, p, off, None, in_window, model, fields))
        return refused(value, p, off, key, in_window)

    return read_fields


# ``Replayed(...)`` runs a Python-level __new__ (the named tuple's defaults); a replay of millions
# builds them with the C-level tuple constructor, every field given.
_replayed = tuple.__new__


def replay_events(
    cfg: KafkaConfig,
    from_ms: int | None,
    progress: Progress | None = None,
    to_ms: int | None = None,
    *,
    build: bool = True,
) -> Iterator[Replayed]:
    """Every record of ``effects.events`` and ``effects.decisions`` from the first whose timestamp
    is at or after ``from_ms``: the event, or why it is none (undecodable, or a record the processor
    does not fold from that topic; then ``key`` is the record's). With ``to_ms``, records from the
    first whose timestamp is at or after it on are marked ``in_window=False`` (they are replayed all
    the same: later events of effects begun inside). ``build=False``: each event's class and
    fields instead of the event (``Codec.decode_fields``: half the cost). One loop, no layer per
    record: the audit replays millions, and its speed is measured against a bare consumer's."""
    codec = kafka_codec(cfg)
    for topic, decisions in _fold_sources(cfg):
        read = _reader(decisions, build, codec)
        c = _consumer(cfg)
        try:
            ranges = _ranges(c, topic, _partitions(c, topic), from_ms)
            if not ranges:
                continue
            ends = {tp.partition: int(tp.metadata or 0) for tp in ranges}
            window = window_ends(cfg, topic, to_ms) if to_ms is not None else None
            c.assign(ranges)
            total = sum(ends[tp.partition] - tp.offset for tp in ranges)
            for batch in _consume_range(c, topic, ends, total, progress):
                for m in batch:
                    off = m.offset()
                    p = m.partition()
                    r = read(m.value(), p, off, m.key(), window is None or off < window.get(p, 0))
                    if r is not None:  # None: a retention command, not a fact the audit counts
                        yield r
        finally:
            c.close()


# How far back ``key_events`` looks for a key's first intent, step by step, before it reads the
# key's partition from its start: an effect is traced from the part of the log where it began.
KEY_SEARCH_STEPS_MS = (3_600_000, 86_400_000, 7 * 86_400_000, 31 * 86_400_000)


def _key_range(
    c: Consumer, topic: str, p: int, lo: int, hi: int, kb: bytes
) -> list[tuple[bytes | None, int, int | None]]:
    """The values of ``kb``'s records at offsets [lo, hi) of one partition, in order, with their
    offsets and log times (None: a topic whose records carry the producer's time)."""
    from confluent_kafka import TopicPartition

    out: list[tuple[bytes | None, int, int | None]] = []
    if lo >= hi:
        return out
    c.assign([TopicPartition(topic, p, lo)])
    for batch in _consume_range(c, topic, {p: hi}, hi - lo):
        out.extend((m.value(), m.offset(), log_time_of(*m.timestamp())) for m in batch if m.key() == kb)
    return out


def key_events(
    cfg: KafkaConfig, key: str, *, since_ms: int | None = None, now_ms: int | None = None
) -> Iterator[Event]:
    """``key_records`` without the log times."""
    for event, _log_ms in key_records(cfg, key, since_ms=since_ms, now_ms=now_ms):
        yield event


def key_records(
    cfg: KafkaConfig, key: str, *, since_ms: int | None = None, now_ms: int | None = None
) -> Iterator[tuple[Event, int | None]]:
    """Every event of one key, as the processor folds them: only its partition of each topic is
    read, and only from where the key's records begin. With ``since_ms``: from the first record at
    or after that time (``offsets_for_times``). Without: back from now in growing steps
    (``KEY_SEARCH_STEPS_MS``, then the partition's start) until the part read holds the key's
    first intent (attempt 1). The intent is the first record an effect writes, so everything after
    its offset is read; ``effects.decisions`` is read from the same time. Each event comes with its
    record's log time (LogAppendTime; None where the topic keeps the producer's time)."""
    from confluent_kafka import OFFSET_END, TopicPartition

    kb = key.encode()
    codec = kafka_codec(cfg)
    now = now_ms if now_ms is not None else time.time_ns() // 1_000_000
    c = _consumer(cfg)
    try:
        sources = _fold_sources_of(c, cfg)
        p = partition_for(kb, len(_partitions(c, cfg.topics.events)))

        def offset_at(topic: str, at_ms: int | None) -> tuple[int, int, int]:
            lo, hi = c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            if at_ms is None:
                return lo, lo, hi
            (tp,) = c.offsets_for_times([TopicPartition(topic, p, max(0, at_ms))], timeout=10)
            return (hi if tp.offset in (OFFSET_END, -1) else max(lo, tp.offset)), lo, hi

        steps: list[int | None] = [since_ms] if since_ms is not None else [now - s for s in KEY_SEARCH_STEPS_MS]
        if since_ms is None:
            steps.append(None)
        events_topic = sources[0][0]
        found: list[tuple[bytes | None, int, int | None]] = []
        end: int | None = None
        start_ms: int | None = None
        for start_ms in steps:
            at, lo, hi = offset_at(events_topic, start_ms)
            top = hi if end is None else end
            if at >= top and end is not None:
                continue  # nothing older in this step
            found = _key_range(c, events_topic, p, at, top, kb) + found
            end = at
            if at <= lo or any(_first_intent(codec, v) for v, _off, _t in found):
                break
        for value, _off, log_ms in found:
            event, _ = _decoded(codec, value, False)
            if event is not None:
                yield event, log_ms
        for topic, decisions in sources[1:]:
            at, _lo, hi = offset_at(topic, start_ms)
            for value, _off, log_ms in _key_range(c, topic, p, at, hi, kb):
                event, _ = _decoded(codec, value, decisions)
                if event is not None:
                    yield event, log_ms
    finally:
        c.close()


def _first_intent(codec: Codec, value: bytes | None) -> bool:
    try:
        e = codec.decode(value)
    except DecodeError:
        return False
    return isinstance(e, Intent) and e.attempt == 1


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


def db_events(
    path: str | Path, from_ms: int | None = None, to_ms: int | None = None, *, build: bool = True
) -> Iterator[Replayed]:
    """Events of an embedded ledger file, in the order they were written, from the first row whose
    time is at or after ``from_ms``: the same cut as ``offsets_for_times`` on Kafka. Rows after that
    one are all replayed, whatever time they carry; with ``to_ms``, rows from the first at or after it
    on are marked ``in_window=False``. ``build=False``: as in ``replay_events``."""
    p = Path(path)
    if not p.exists():
        raise SourceError(f"no ledger file at {p}")
    read = _reader(None, build, default_codec())  # a ledger file holds events and decisions alike
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
                r = read(body, 0, seq, key, not ended)
                if r is not None:
                    yield r
        except StorageError as e:
            raise SourceError(str(e)) from None
    finally:
        reader.close()

"""Schemas learnable at run time from Kafka itself: the compacted ``effects.schemas`` topic.

Every effect-ledger writer (the SDK's relay, the ledger processor, the reconcilers, people's
decisions) publishes each writer schema it knows to ``effects.schemas`` and waits for the broker's
acknowledgement *before* its first record: so a reader that meets a record with a fingerprint it does
not know finds the schema there (it was acknowledged before the record was written), whatever
release wrote it.

Record layout (language-neutral, what the README's subscriber recipe relies on):

- key: the fingerprint as 16 lowercase hex characters, exactly bytes 2..9 of a record's value (the
  CRC-64-AVRO fingerprint of the schema's parsing canonical form, little-endian, as Avro
  single-object encoding writes it);
- value: the writer schema as JSON text (UTF-8), defaults and docs included;
- header ``effect-ledger.schema``: the record's full name.

The topic is compacted: one record per fingerprint stays for ever. A reader checks that the value's
fingerprint is its key and ignores anything else (or any value over ``MAX_SCHEMA_BYTES``).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterable
from typing import Any

from effect_ledger.errors import SchemaTopicError
from effect_ledger.streams.acl import client_group
from effect_ledger.streams.codec import HEADER, Codec, schema_fingerprint
from effect_ledger.streams.config import KafkaConfig
from effect_ledger.streams.log_clock import log_time_of
from effect_ledger.streams.registry import RegistryClient
from effect_ledger.streams.watermarks import high_watermark

log = logging.getLogger(__name__)

#: A schema record's value larger than this is ignored (ours are ~1-2 KiB).
MAX_SCHEMA_BYTES = 64 * 1024
#: How long a reader waits for ``effects.schemas`` to answer when it meets an unknown fingerprint.
DEFAULT_WAIT_S = 10.0
#: After a fingerprint was looked up and not found, records with it fail at once for this long
#: instead of reading the topic again (a stream of foreign records must not stall a consumer).
MISS_TTL_S = 5.0


def schema_key(fp: bytes) -> str:
    """The key of a schema record: the 8 fingerprint bytes of a record header as lowercase hex."""
    return fp.hex()


def schema_value(raw: dict[str, Any]) -> bytes:
    """The value of a schema record: the schema's JSON text."""
    return json.dumps(raw, ensure_ascii=False, separators=(",", ":")).encode()


#: How often a wait for the broker looks whether it was called off (``publish_schemas``'s ``cancel``).
_CANCEL_SLICE_S = 0.25


#: How long a schemas topic reported missing is asked about again (another process may be creating it).
_MISSING_WAIT_S = 10.0


def broker_now(cfg: KafkaConfig, schema: dict[str, Any], timeout: float = 30.0) -> int | None:
    """The log's time now, asked of the broker: ``schema`` (one this writer publishes anyway) is
    published again (the same key and value on a compacted topic: nothing changes) and its append
    time read from the acknowledgement. None on a topic that keeps the producer's time."""
    seen: list[int] = []
    publish_schemas(cfg, [schema], timeout, log_times=seen)
    return max(seen) if seen else None


def publish_schemas(
    cfg: KafkaConfig,
    writer_schemas: Iterable[dict[str, Any]],
    timeout: float = 30.0,
    cancel: threading.Event | None = None,
    log_times: list[int] | None = None,
) -> int:
    """Publish writer schemas (parsed JSON) to ``effects.schemas`` and wait until the broker
    acknowledged each (acks=all); ``log_times`` gets their append times (LogAppendTime topics).
    Returns how many were published. Raises SchemaTopicError, also
    when ``cancel`` is set while it waits: a writer that closes does not wait out the timeout for
    a broker that is gone (a program would not exit until this thread ended)."""
    from confluent_kafka import KafkaError, KafkaException, Producer

    topic = cfg.topics.schemas
    known = {schema_fingerprint(raw): raw for raw in writer_schemas}
    errors: list[str] = []
    deadline = time.monotonic() + timeout

    def report(err: Any, msg: Any) -> None:
        if err is not None:
            errors.append(str(err))
        elif log_times is not None:
            log_ms = log_time_of(*msg.timestamp())
            if log_ms is not None:
                log_times.append(log_ms)

    def remaining() -> float:
        if cancel is not None and cancel.is_set():
            raise SchemaTopicError(f"cannot publish schemas to {topic}: the writer was closed meanwhile")
        return deadline - time.monotonic()

    try:
        # No auto-creation: a topic the broker made on the fly would not be compacted.
        p = Producer(cfg.confluent(**{"acks": "all", "enable.idempotence": True, "allow.auto.create.topics": False}))
        missing_until: float | None = None
        while True:  # in slices, so that ``cancel`` is seen
            try:
                md = p.list_topics(topic, timeout=max(0.01, min(_CANCEL_SLICE_S, remaining())))
            except KafkaException as e:
                waiting = e.args[0].code() in (KafkaError._TIMED_OUT, KafkaError._TRANSPORT)
                if not waiting or remaining() <= 0:
                    raise
                continue
            t = md.topics.get(topic)
            # A topic another process is creating (the workers, started beside this one) may not be
            # known yet to the broker asked: asked again for a few seconds.
            if missing_until is None:
                missing_until = time.monotonic() + _MISSING_WAIT_S
            if (t is not None and t.error is None) or remaining() <= 0 or time.monotonic() >= missing_until:
                break
            time.sleep(min(0.2, max(0.0, remaining())))
        if t is None or t.error is not None:
            raise SchemaTopicError(
                f"topic {topic} does not exist: create it with `effects topics create` before writing records"
            )
        for fp, raw in known.items():
            name = f"{raw.get('namespace', '')}.{raw['name']}".lstrip(".")
            p.produce(topic, schema_value(raw), schema_key(fp), headers=[(HEADER, name.encode())], on_delivery=report)
        left = p.flush(0)
        while left and (wait := remaining()) > 0:
            left = p.flush(min(_CANCEL_SLICE_S, wait))
    except KafkaException as e:
        raise SchemaTopicError(f"cannot publish schemas to {topic}: {e}") from e
    if left or errors:
        why = errors[0] if errors else f"{left} not acknowledged within {timeout:.0f} s"
        raise SchemaTopicError(f"cannot publish schemas to {topic}: {why}")
    return len(known)


class SchemaPublisher:
    """Publishes a codec's schemas once per process and cluster/prefix, before the first record.
    ``ensure()`` is cheap after the first success and safe from several threads."""

    _done: set[tuple[str, str, int]] = set()  # (bootstrap, prefix, id(codec)) published in this process
    _lock = threading.Lock()

    def __init__(self, cfg: KafkaConfig, codec: Codec, timeout: float = 30.0) -> None:
        self.cfg = cfg
        self.codec = codec
        self.timeout = timeout

    def ensure(self, cancel: threading.Event | None = None) -> None:
        """Publish unless this process already did for this cluster and codec. Raises
        SchemaTopicError (also once ``cancel`` is set while it waits for the broker)."""
        key = (self.cfg.bootstrap, self.cfg.prefix, id(self.codec))
        if key in self._done:
            return
        with self._lock:
            if key not in self._done:
                publish_schemas(self.cfg, self.codec.writer_schemas().values(), self.timeout, cancel)
                self.codec.register_all()  # with a schema registry: encode never waits on it
                self._done.add(key)


class TopicResolver:
    """A codec ``resolver`` that reads ``effects.schemas``: on an unknown fingerprint, reads what the
    topic gained since the last read (up to its high watermarks, within ``wait_s``) and answers from
    everything read so far. Raises LookupError when the topic cannot be read in time."""

    def __init__(self, cfg: KafkaConfig, wait_s: float = DEFAULT_WAIT_S) -> None:
        self.cfg = cfg
        self.wait_s = wait_s
        self._schemas: dict[bytes, dict[str, Any]] = {}
        self._next: dict[int, int] = {}  # partition -> next offset to read
        self._misses: dict[bytes, float] = {}
        self._lock = threading.Lock()

    def __call__(self, fp: bytes) -> dict[str, Any] | None:
        with self._lock:
            if fp in self._schemas:
                return self._schemas[fp]
            missed = self._misses.get(fp)
            if missed is not None and time.monotonic() - missed < MISS_TTL_S:
                return None
            self._read()
            found = self._schemas.get(fp)
            if found is None:
                self._misses[fp] = time.monotonic()
                if len(self._misses) > 10_000:  # bounded: forget the oldest misses
                    for k in sorted(self._misses, key=self._misses.__getitem__)[:5_000]:
                        del self._misses[k]
            return found

    def _read(self) -> None:
        from confluent_kafka import Consumer, KafkaException, TopicPartition

        topic = self.cfg.topics.schemas
        deadline = time.monotonic() + self.wait_s
        c = Consumer(
            self.cfg.confluent(
                **{
                    "group.id": client_group(self.cfg.prefix, "schemas"),
                    "enable.auto.commit": False,
                    "enable.partition.eof": False,
                }
            )
        )
        try:
            md = c.list_topics(topic, timeout=self.wait_s)
            t = md.topics.get(topic)
            if t is None or t.error is not None:
                raise LookupError(f"topic {topic} does not exist")
            todo: dict[int, int] = {}
            for p in t.partitions:
                high = high_watermark(c, TopicPartition(topic, p), deadline)
                if high > self._next.get(p, 0):
                    todo[p] = high
            if not todo:
                return
            c.assign([TopicPartition(topic, p, self._next.get(p, 0)) for p in todo])
            while todo:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"{topic} not read to its end within {self.wait_s:.0f} s")
                msg = c.poll(min(left, 0.5))
                if msg is not None and msg.error() is None:  # errors are transient: librdkafka retries
                    self._take(msg.key(), msg.value())
                # Positions, not record offsets, say when a partition is read to its end (compaction
                # leaves gaps in offsets).
                for tp in c.position([TopicPartition(topic, p) for p in todo]):
                    if tp.offset >= 0:
                        self._next[tp.partition] = tp.offset
                    if tp.offset >= todo[tp.partition]:
                        del todo[tp.partition]
        except (KafkaException, TimeoutError) as e:
            raise LookupError(f"{topic} could not be read: {e}") from e
        finally:
            c.close()

    def _take(self, key: bytes | None, value: bytes | None) -> None:
        """Keep a schema record whose value really has the fingerprint its key names."""
        if not key or not value or len(value) > MAX_SCHEMA_BYTES:
            return
        try:
            raw = json.loads(value)
            fp = schema_fingerprint(raw)
        except Exception:  # not JSON, not a schema: someone else's record
            log.warning("ignoring a record of %s that is not an Avro schema", self.cfg.topics.schemas)
            return
        if schema_key(fp) == key.decode("ascii", "replace"):
            self._schemas[fp] = raw


_codecs: dict[tuple[str, str, str | None, bool], Codec] = {}
_resolvers: dict[tuple[str, str], TopicResolver] = {}
_codecs_lock = threading.Lock()


def kafka_codec(cfg: KafkaConfig, *, writes: bool = False, cancel: threading.Event | None = None) -> Codec:
    """The process-wide codec for one cluster, topic prefix and schema registry: it learns unknown
    writer schemas from ``effects.schemas`` and, with ``cfg.schema_registry``, reads the registry
    framing too. ``writes``: this process writes records with it, so its schemas are published
    first (SchemaTopicError if they cannot be) and, with a registry, registered (RegistryError) and
    its records framed the registry way. ``cancel``: set, the wait for the broker ends at once."""
    key = (cfg.bootstrap, cfg.prefix, cfg.schema_registry, writes)
    with _codecs_lock:
        codec = _codecs.get(key)
        if codec is None:
            resolver = _resolvers.setdefault((cfg.bootstrap, cfg.prefix), TopicResolver(cfg))
            registry = RegistryClient(cfg.schema_registry) if cfg.schema_registry else None
            codec = _codecs[key] = Codec(resolver=resolver, registry=registry, frame_writes=writes and bool(registry))
    if writes:
        SchemaPublisher(cfg, codec).ensure(cancel)
    return codec

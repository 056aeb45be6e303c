"""A partition's watermarks, asked again while the broker answers "not yet".

A partition whose leader is being elected (a topic just created, a broker restarting) answers a
watermark query with NOT_LEADER_FOR_PARTITION or LEADER_NOT_AVAILABLE for a moment; a client whose
metadata is stale (a broker died and its partitions moved, partitions were added) does not know the
partition's leader at all (the client's own UNKNOWN_PARTITION) until it asks for metadata again,
which librdkafka does on its own only every few minutes: this module asks for it at once. A leader
that is paused or cut off takes the query and never answers: each query waits at most
``ATTEMPT_S``, then the metadata is asked again and the query goes to the partition's new leader. Every
reader that reads a compacted topic from its start to its end (the schemas, the erasure keys, the
state sink) and the claims' watermark reads ask through here, so none of them reports such a moment
as a topic it cannot read, nor fails an agent's call for it.
"""

from __future__ import annotations

import time
from functools import cache
from typing import Any

_PAUSE_S = 0.05  # a leader election takes a few heartbeats: no need to hammer the broker
#: One query's longest wait. A paused or cut-off leader takes a query and never answers: past this the
#: client's metadata is asked again (the cluster may have fenced that broker and moved the partition)
#: and the query goes to whoever leads now, while the caller's deadline allows.
ATTEMPT_S = 1.5


@cache
def _not_yet() -> frozenset[int]:
    """Errors that say "not yet", not "no" (the client's own retriable errors count too). Built on
    first use: confluent-kafka is the ``[kafka]`` extra, and this module is imported without it."""
    from confluent_kafka import KafkaError

    return frozenset(
        {
            KafkaError.NOT_LEADER_FOR_PARTITION,
            KafkaError.LEADER_NOT_AVAILABLE,
            KafkaError.UNKNOWN_TOPIC_OR_PART,  # a partition of a topic created a moment ago
            KafkaError._UNKNOWN_PARTITION,  # the client's metadata is stale (refreshed below)
            KafkaError._TRANSPORT,
            KafkaError._TIMED_OUT,
            # A leader elected a moment ago answers this until its high watermark is established
            # (KIP-207); a broker the cluster dropped from its metadata ends its client's handle.
            KafkaError.OFFSET_NOT_AVAILABLE,
            KafkaError._DESTROY_BROKER,
        }
    )


def watermarks(consumer: Any, tp: Any, deadline: float) -> tuple[int, int]:
    """(low, high) of ``tp``, asked again while the broker answers "not yet" and the monotonic
    ``deadline`` is ahead; any other error, or one at the deadline, is raised (``KafkaException``)."""
    from confluent_kafka import KafkaError, KafkaException

    stale = {KafkaError._UNKNOWN_PARTITION, KafkaError._TIMED_OUT, KafkaError.NOT_LEADER_FOR_PARTITION,
             KafkaError.OFFSET_NOT_AVAILABLE, KafkaError._DESTROY_BROKER}  # fmt: skip
    while True:
        try:
            wait = max(0.1, min(ATTEMPT_S, deadline - time.monotonic()))
            low, high = consumer.get_watermark_offsets(tp, timeout=wait)
            return int(low), int(high)
        except KafkaException as e:
            err = e.args[0] if e.args else None
            transient = err is not None and (err.code() in _not_yet() or err.retriable())
            if not transient or time.monotonic() + _PAUSE_S >= deadline:
                raise
            if err is not None and err.code() in stale:  # the leader may have moved: ask who leads now
                _refresh(consumer, tp.topic, deadline)
        time.sleep(_PAUSE_S)


def _refresh(consumer: Any, topic: str, deadline: float) -> None:
    """Ask the broker for ``topic``'s metadata now: the client's cache is stale."""
    from confluent_kafka import KafkaException

    try:
        consumer.list_topics(topic, timeout=max(0.1, min(2.0, deadline - time.monotonic())))
    except KafkaException:
        pass  # the next watermark query says what is wrong


def high_watermark(consumer: Any, tp: Any, deadline: float) -> int:
    """The high watermark of ``tp`` (``watermarks``)."""
    return watermarks(consumer, tp, deadline)[1]


__all__ = ["high_watermark", "watermarks"]

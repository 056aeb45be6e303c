"""The log's time, as one process can know it: the broker's append time of the latest record it has
seen (topics with ``message.timestamp.type=LogAppendTime``), plus what its own monotonic clock has
measured since. No writer's wall clock enters it, so a process whose clock is hours off still
decides deadlines on the time every other process decides them on.

Before a process has seen any log time it falls back to its wall clock (``fallback``): a processor
proposes timeouts by it, which the fold admits only once the log's time has passed the deadline
(``core.effect.apply``), and a reconciler or an agent has a work item or a lookup answer first.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

#: A record's timestamp type when the broker stamped it, as confluent-kafka's ``Message.timestamp()``
#: says it (``TIMESTAMP_LOG_APPEND_TIME``; its CreateTime is 1).
LOG_APPEND_TIME = 2
#: The same, as aiokafka (and so faust) says it: Kafka's own ``TimestampType.LOG_APPEND_TIME`` (its
#: CreateTime is 0).
AIOKAFKA_LOG_APPEND_TIME = 1


def wall_ms() -> int:
    """This process's wall clock, epoch milliseconds (a claim, never an authority)."""
    return time.time_ns() // 1_000_000


class LogClock:
    """``now()`` on the log's time. ``observe(ms)`` with the append time of each record read (or a
    processor's answer); older times than the current estimate are ignored. Thread-safe."""

    def __init__(self, fallback: Callable[[], int] = wall_ms, monotonic: Callable[[], float] = time.monotonic) -> None:
        self._fallback = fallback
        self._monotonic = monotonic
        self._base: int | None = None
        self._at = 0.0
        self._lock = threading.Lock()

    @property
    def known(self) -> bool:
        """Whether a log time was seen (else ``now()`` is the fallback wall clock)."""
        return self._base is not None

    def observe(self, log_ms: int) -> None:
        """A record the log took at ``log_ms`` was just read."""
        with self._lock:
            if self._base is None or log_ms > self._now():
                self._base, self._at = log_ms, self._monotonic()

    def _now(self) -> int:
        assert self._base is not None
        return self._base + int((self._monotonic() - self._at) * 1000)

    def now(self) -> int:
        """The log's time now (epoch ms): the latest log time seen plus the monotonic time since."""
        with self._lock:
            return self._fallback() if self._base is None else self._now()

    def skew_ms(self) -> int | None:
        """This process's wall clock minus the log's time (None: no log time seen yet)."""
        with self._lock:
            return None if self._base is None else self._fallback() - self._now()


def log_time_of(timestamp_type: int | None, timestamp_ms: int | None) -> int | None:
    """A confluent-kafka record's log time (``log_time_of(*msg.timestamp())``): its timestamp when the
    broker stamped it (LogAppendTime), else None (the producer's clock stamped it: a writer's claim)."""
    if timestamp_type == LOG_APPEND_TIME and timestamp_ms is not None and timestamp_ms >= 0:
        return int(timestamp_ms)
    return None


def log_time_of_message(msg: Any) -> int | None:
    """The same for an aiokafka or faust message (``timestamp`` in seconds, ``timestamp_type`` as
    Kafka numbers it)."""
    ts = getattr(msg, "timestamp", None)
    if getattr(msg, "timestamp_type", None) != AIOKAFKA_LOG_APPEND_TIME or ts is None or ts < 0:
        return None
    return round(ts * 1000)


__all__ = ["AIOKAFKA_LOG_APPEND_TIME", "LOG_APPEND_TIME", "LogClock", "log_time_of", "log_time_of_message", "wall_ms"]

"""What the soak watches while it runs: the three topics (one reader thread, every partition from
the beginning, no group) and the consumer-group lag of the workers and the reconcilers (a sampler
thread). Both ride out the broker restart: librdkafka reconnects, a sample with no answer is kept
as None."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, TopicPartition

from effect_ledger.core.model import EffectState, Executed, Intent, State, UncertainEffect
from effect_ledger.streams.codec import HEADER, default_codec
from effect_ledger.streams.config import KafkaConfig
from tests.soak.report import Seen

UNCERTAIN = State.UNCERTAIN.value


def _consumer(cfg: KafkaConfig, group: str | None = None) -> Consumer:
    return Consumer(
        cfg.confluent(
            **{
                "group.id": group or f"soak-observer-{uuid.uuid4().hex[:8]}",
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                "enable.partition.eof": False,
                "fetch.wait.max.ms": 50,
                "log_level": 2,  # the broker restart is expected: no line per refused reconnect
            }
        )
    )


class TopicObserver(threading.Thread):
    """Folds effects.events (intents and first outcomes), effects.uncertain and effects.state into
    one ``Seen`` per effect. Only intents and outcomes are decoded on the events topic (the schema
    header says which record a value is)."""

    def __init__(self, cfg: KafkaConfig) -> None:
        super().__init__(daemon=True, name="soak-observer")
        self.cfg = cfg
        self.seen: dict[str, Seen] = {}
        self.records = 0
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self._wanted = {
            default_codec().schema_name(Intent).encode(),
            default_codec().schema_name(Executed).encode(),
        }

    def run(self) -> None:
        codec = default_codec()
        c = _consumer(self.cfg)
        t = self.cfg.topics
        c.assign([TopicPartition(topic, p, OFFSET_BEGINNING)
                  for topic in (t.events, t.uncertain, t.state) for p in range(self.cfg.partitions)])  # fmt: skip
        try:
            while not self.stop.is_set():
                batch = c.consume(1000, 0.2)
                with self.lock:
                    for m in batch:
                        if m.error() is not None:
                            continue
                        self.records += 1
                        topic = m.topic()
                        if topic == t.events and dict(m.headers() or ()).get(HEADER) not in self._wanted:
                            continue
                        self._fold(codec.decode(m.value()), m.timestamp()[1])
        except BaseException as e:  # surfaced in the report
            self.error = e
        finally:
            c.close()

    def _fold(self, ev: Any, ts: int) -> None:
        e = self.seen.get(ev.effect_id)
        if e is None:
            e = self.seen[ev.effect_id] = Seen(ev.effect_id)
        if isinstance(ev, Intent):
            if e.intent_ms is None:
                e.intent_ms, e.deadline_ms, e.target = ts, ev.deadline_ms, ev.target
        elif isinstance(ev, Executed):
            if e.outcome_ms is None:
                e.outcome_ms, e.outcome = ts, ev.outcome.value
        elif isinstance(ev, UncertainEffect):
            e.uncertain_ms = ts if e.uncertain_ms is None else min(e.uncertain_ms, ts)
        elif isinstance(ev, EffectState):
            state = ev.state.value
            if state == UNCERTAIN:
                e.uncertain_ms = ts if e.uncertain_ms is None else min(e.uncertain_ms, ts)
            if not e.states or e.states[-1] != state:
                e.states.append(state)
            e.state = state
            e.executions = max(e.executions, ev.executions)

    def snapshot(self) -> dict[str, Seen]:
        with self.lock:
            return dict(self.seen)

    def open_effects(self) -> int:
        """Effects with an intent whose last state is still open (or not published yet)."""
        with self.lock:
            return sum(
                1 for e in self.seen.values()
                if e.intent_ms is not None and (e.state is None or e.state in ("PENDING", "EXECUTED", UNCERTAIN))
            )  # fmt: skip


class LagSampler(threading.Thread):
    """Every ``interval`` s: the committed-offset lag of the workers' group on effects.events and of
    the reconcilers' group on effects.uncertain (high watermark - committed, summed over partitions;
    a partition never committed counts from its low watermark); and ``folded()``, the events the
    workers report folded in their health views (faust commits every few seconds, folding runs
    ahead of it)."""

    def __init__(self, cfg: KafkaConfig, workers_group: str, reconcilers_group: str, t0: float,
                 folded: Callable[[], int | None], interval: float = 5.0) -> None:  # fmt: skip
        super().__init__(daemon=True, name="soak-lag")
        self.cfg = cfg
        self.groups = {"workers_lag": (workers_group, cfg.topics.events),
                       "reconcilers_lag": (reconcilers_group, cfg.topics.uncertain)}  # fmt: skip
        self.t0 = t0
        self.folded = folded
        self.interval = interval
        self.samples: list[dict[str, Any]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        consumers = {name: _consumer(self.cfg, group) for name, (group, _) in self.groups.items()}
        try:
            while not self.stop.is_set():
                sample: dict[str, Any] = {"t_s": round(time.monotonic() - self.t0, 1)}
                for name, (_, topic) in self.groups.items():
                    sample[name] = self._lag(consumers[name], topic)
                high = self._high(consumers["workers_lag"], self.cfg.topics.events)
                folded = self.folded()
                sample["workers_unfolded"] = None if high is None or folded is None else max(0, high - folded)
                self.samples.append(sample)
                self.stop.wait(self.interval)
        finally:
            for c in consumers.values():
                c.close()

    def _high(self, c: Consumer, topic: str) -> int | None:
        try:
            return sum(c.get_watermark_offsets(TopicPartition(topic, p), timeout=2, cached=False)[1]
                       for p in range(self.cfg.partitions))  # fmt: skip
        except KafkaException:
            return None

    def _lag(self, c: Consumer, topic: str) -> int | None:
        parts = [TopicPartition(topic, p) for p in range(self.cfg.partitions)]
        try:
            committed = c.committed(parts, timeout=2)
            total = 0
            for tp in committed:
                low, high = c.get_watermark_offsets(TopicPartition(topic, tp.partition), timeout=2, cached=False)
                total += max(0, high - (tp.offset if tp.offset >= 0 else low))
            return total
        except KafkaException:
            return None

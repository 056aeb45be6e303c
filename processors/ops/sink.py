"""``effects sink``: materialise ``effects.state`` into a SQL table an on-call engineer can query.

Each batch is one SQLite transaction holding both the rows and the consumed offsets, so a restart
resumes exactly after the last committed batch: no row lost, none doubled. A row is only replaced
by a state of the same or a newer version.
"""

from __future__ import annotations

import sqlite3
import uuid
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import Consumer, TopicPartition

from effect_ledger.processors.ops.sources import SourceError, _partitions
from effect_ledger.streams.codec import DecodeError, default_codec
from effect_ledger.streams.config import KafkaConfig

SINK_SCHEMA = """
CREATE TABLE IF NOT EXISTS effects (
    effect_id      TEXT PRIMARY KEY,
    state          TEXT NOT NULL,
    target         TEXT NOT NULL,
    operation      TEXT NOT NULL,
    namespace      TEXT NOT NULL,
    run_id         TEXT NOT NULL,
    step           TEXT NOT NULL,
    attempt        INTEGER NOT NULL,
    version        INTEGER NOT NULL,
    created_ms     INTEGER NOT NULL,
    updated_ms     INTEGER NOT NULL,
    deadline_ms    INTEGER,
    receipt_id     TEXT,
    executions     INTEGER NOT NULL,
    flags          TEXT NOT NULL,
    reason         TEXT
);
CREATE INDEX IF NOT EXISTS effects_state_updated ON effects(state, updated_ms);
CREATE INDEX IF NOT EXISTS effects_updated ON effects(updated_ms);
CREATE INDEX IF NOT EXISTS effects_target ON effects(target, state);
CREATE TABLE IF NOT EXISTS sink_offsets (
    topic       TEXT NOT NULL,
    partition   INTEGER NOT NULL,
    next_offset INTEGER NOT NULL,
    PRIMARY KEY (topic, partition)
);
"""

_UPSERT = """
INSERT INTO effects VALUES (:effect_id, :state, :target, :operation, :namespace, :run_id, :step, :attempt,
    :version, :created_ms, :updated_ms, :deadline_ms, :receipt_id, :executions, :flags, :reason)
ON CONFLICT(effect_id) DO UPDATE SET
    state = excluded.state, target = excluded.target, operation = excluded.operation,
    namespace = excluded.namespace, run_id = excluded.run_id, step = excluded.step, attempt = excluded.attempt,
    version = excluded.version, created_ms = excluded.created_ms, updated_ms = excluded.updated_ms,
    deadline_ms = excluded.deadline_ms, receipt_id = excluded.receipt_id, executions = excluded.executions,
    flags = excluded.flags, reason = excluded.reason
WHERE excluded.version >= effects.version
"""


def sqlite_path(url: str) -> Path:
    """``sqlite:///ops.db`` (relative) or ``sqlite:////abs/ops.db`` -> a path."""
    prefix = "sqlite:///"
    if not url.startswith(prefix):
        raise SourceError(f"--to {url!r}: only sqlite:///PATH is supported")
    return Path(url[len(prefix) :])


@dataclass
class SinkStats:
    records: int = 0
    batches: int = 0
    skipped: int = 0


class StateSink:
    def __init__(self, cfg: KafkaConfig, url: str) -> None:
        self.cfg = cfg
        self.path = sqlite_path(url)
        self.topic = cfg.topics.state
        self.stats = SinkStats()
        try:
            self.db = sqlite3.connect(self.path, isolation_level=None)
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.executescript(SINK_SCHEMA)
        except sqlite3.Error as e:
            raise SourceError(f"--to {url}: cannot open {self.path}: {e}") from None
        self.codec = default_codec()

    def _offsets(self) -> dict[int, int]:
        rows = self.db.execute("SELECT partition, next_offset FROM sink_offsets WHERE topic = ?", (self.topic,))
        return {p: o for p, o in rows}

    def run(self, once: bool = False, stop: object = None) -> SinkStats:
        """Consume until ``stop`` (a threading.Event) is set, or with ``once`` until the end offsets
        seen at the start are reached."""
        c = Consumer(
            self.cfg.confluent(
                **{
                    "group.id": f"effects-sink-{uuid.uuid4().hex}",
                    "enable.auto.commit": False,
                    "auto.offset.reset": "earliest",
                }
            )
        )
        try:
            parts = _partitions(c, self.topic)
            stored = self._offsets()
            assignment = []
            ends: dict[int, int] = {}
            for p in parts:
                lo, hi = c.get_watermark_offsets(TopicPartition(self.topic, p), timeout=10)
                start = max(stored.get(p, lo), lo)
                ends[p] = hi
                assignment.append(TopicPartition(self.topic, p, start))
            position = {tp.partition: tp.offset for tp in assignment}
            c.assign(assignment)
            while True:
                if once and all(position[p] >= ends[p] for p in parts):
                    break
                if stop is not None and stop.is_set():  # type: ignore[attr-defined]
                    break
                msgs = c.consume(5000, 0.5)
                good = [m for m in msgs if not m.error()]
                if good:
                    self._write(good, position)
        finally:
            c.close()
        return self.stats

    def _write(self, msgs: list, position: dict[int, int]) -> None:  # type: ignore[type-arg]
        rows = []
        for m in msgs:
            try:
                st = self.codec.decode(m.value())
            except DecodeError:
                self.stats.skipped += 1
            else:
                rows.append(
                    {
                        "effect_id": st.effect_id,
                        "state": st.state.value,
                        "target": st.target,
                        "operation": st.operation,
                        "namespace": st.namespace,
                        "run_id": st.run_id,
                        "step": st.step,
                        "attempt": st.attempt,
                        "version": st.version,
                        "created_ms": st.created_ms,
                        "updated_ms": st.updated_ms,
                        "deadline_ms": st.deadline_ms,
                        "receipt_id": st.receipt_id,
                        "executions": st.executions,
                        "flags": ",".join(st.flags),
                        "reason": st.reason,
                    }
                )
            position[m.partition()] = max(position[m.partition()], m.offset() + 1)
        # Rows and offsets in one transaction: a restart neither loses nor doubles a row.
        self.db.execute("BEGIN IMMEDIATE")
        try:
            self.db.executemany(_UPSERT, rows)
            self.db.executemany(
                "INSERT INTO sink_offsets VALUES (?, ?, ?) ON CONFLICT(topic, partition) "
                "DO UPDATE SET next_offset = excluded.next_offset",
                [(self.topic, p, o) for p, o in position.items()],
            )
            self.db.execute("COMMIT")
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self.stats.records += len(msgs)
        self.stats.batches += 1

    def close(self) -> None:
        self.db.close()

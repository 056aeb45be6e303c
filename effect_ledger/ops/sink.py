"""``effects sink``: materialise ``effects.state`` into a SQL table an on-call engineer can query.

The table is SQLite (``sqlite:///ops.db``) or PostgreSQL (``postgresql://...``, the
``[postgres]`` extra); ``sink_db`` holds what differs between them. Each batch is one transaction
holding both the rows and the consumed offsets, so a restart resumes exactly after the last
committed batch: no row lost, none doubled. A row is only replaced by a state of the same or a
newer version.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, TopicPartition

from effect_ledger.errors import DecodeError
from effect_ledger.metrics import logs
from effect_ledger.metrics.logs import DEFAULT_SUMMARY_S, Summary
from effect_ledger.ops.sink_db import SinkStore, open_store
from effect_ledger.ops.sources import SourceError, _partitions
from effect_ledger.sdk.store.tables import state_row
from effect_ledger.streams.acl import client_group
from effect_ledger.streams.config import KafkaConfig
from effect_ledger.streams.schema_topic import kafka_codec
from effect_ledger.streams.watermarks import watermarks

log = logging.getLogger("effect_ledger.sink")

MAX_BATCH = 100_000  # records per transaction, at most (--batch)


#: One row of the ``effects`` table for a state record: the ledger file's builder, shared.
effect_row = state_row


@dataclass
class SinkStats:
    records: int = 0
    batches: int = 0
    skipped: int = 0
    deleted: int = 0  # tombstones: rows of retired effects deleted


class StateSink:
    def __init__(self, cfg: KafkaConfig, url: str, batch: int = 5000, summary_s: float = DEFAULT_SUMMARY_S) -> None:
        if not 1 <= batch <= MAX_BATCH:
            raise SourceError(f"--batch {batch}: give 1 to {MAX_BATCH:,} records per transaction")
        self.cfg = cfg
        self.batch = batch
        self.topic = cfg.topics.state
        self.stats = SinkStats()
        self.store: SinkStore = open_store(url)
        self.codec = kafka_codec(cfg)  # learns newer writers' schemas from effects.schemas
        self.summary = Summary(log, summary_s)

    @property
    def describe(self) -> str:
        """Where the rows go (a path or a URL without its password)."""
        return self.store.describe

    def run(self, once: bool = False, stop: object = None) -> SinkStats:
        """Consume until ``stop`` (a threading.Event) is set, or with ``once`` until the end offsets
        seen at the start are reached."""
        c = Consumer(
            self.cfg.confluent(
                **{
                    "group.id": client_group(self.cfg.prefix, "sink"),
                    "enable.auto.commit": False,
                    "auto.offset.reset": "earliest",
                }
            )
        )
        try:
            parts = _partitions(c, self.topic)
            stored = self.store.offsets(self.topic)
            assignment = []
            ends: dict[int, int] = {}
            for p in parts:
                lo, hi = watermarks(c, TopicPartition(self.topic, p), time.monotonic() + 10)
                start = max(stored.get(p, lo), lo)
                ends[p] = hi
                assignment.append(TopicPartition(self.topic, p, start))
            position = {tp.partition: tp.offset for tp in assignment}
            c.assign(assignment)
            logs.started(
                log,
                f"sink materialising {self.topic} from {self.cfg.bootstrap} into {self.describe}",
                bootstrap=self.cfg.bootstrap, topics=[self.topic], to=self.describe, partitions=parts,
                behind=sum(max(0, ends[p] - position[p]) for p in parts),
            )  # fmt: skip
            while True:
                if once and all(position[p] >= ends[p] for p in parts):
                    break
                if stop is not None and stop.is_set():  # type: ignore[attr-defined]
                    break
                msgs = c.consume(self.batch, 0.5)
                good = [m for m in msgs if not m.error()]
                if good:
                    self._write(good, position)
                self.summary.tick()
        finally:
            c.close()
            self.summary.emit()
        return self.stats

    def _write(self, msgs: list, position: dict[int, int]) -> None:  # type: ignore[type-arg]
        # The last record of each key in the batch wins: a state, or a tombstone (the effect was
        # retired, effect_ledger/core/retention.py), which deletes its row as a compacted read drops the key.
        latest: dict[str, dict[str, Any] | None] = {}
        for m in msgs:
            if m.value() is None and m.key() is not None:
                latest[m.key().decode("utf-8", "replace")] = None
                self.stats.deleted += 1
            else:
                try:
                    st = self.codec.decode(m.value())
                except DecodeError:
                    self.stats.skipped += 1
                else:
                    latest.pop(st.effect_id, None)  # keep the batch's order: a retire after it comes last
                    latest[st.effect_id] = effect_row(st)
            position[m.partition()] = max(position[m.partition()], m.offset() + 1)
        rows = [r for r in latest.values() if r is not None]
        deletes = [k for k, r in latest.items() if r is None]
        # Rows, deletions and offsets in one transaction: a restart neither loses nor doubles a row.
        self.store.write(rows, self.topic, position, deletes)
        self.stats.records += len(msgs)
        self.stats.batches += 1
        self.summary.count("state_records", len(msgs))
        self.summary.count("rows_written", len(rows))
        if deletes:
            self.summary.count("rows_deleted", len(deletes))

    def close(self) -> None:
        self.store.close()

"""Prometheus metrics of the Kafka services, as real processes against the real broker, scraped
over real HTTP: the ledger processor (``effects worker --metrics-port``), the reconcilers
(``effects reconcile --metrics-port``) and an agent's relay (``Ledger.open(metrics_port=...)``).
One effect goes through the agent (intent, executed, receipt), one intent is left past its deadline
(the worker makes it uncertain, the reconcilers escalate it: nobody can ask its destination), and
one record is garbage (dead-lettered). Every wait polls a condition against a deadline."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from effect_ledger.core.keys import effect_key
from effect_ledger.core.model import Intent
from effect_ledger.core.reconcile import Target
from effect_ledger.metrics.names import exported_names
from effect_ledger.processors import rocks
from effect_ledger.sdk.ledger import Ledger
from effect_ledger.streams.config import KafkaConfig
from tests.services import Processor, Reconcilers, free_port, wait_for
from tests.topic_io import RawProducer, recorded_times, running

WAIT = 90.0
Samples = dict[str, dict[tuple[tuple[str, str], ...], float]]


def scrape(port: int) -> Samples | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            text = r.read().decode()
    except OSError:
        return None  # not listening yet
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def total(m: Samples, name: str, **labels: str) -> float:
    want = set(labels.items())
    return sum(v for k, v in m.get(name, {}).items() if want <= set(k))


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def test_worker_reconcilers_and_relay_metrics(kafka_config: KafkaConfig, tmp_path: Path) -> None:
    cfg = kafka_config
    recorded_times(cfg)  # an intent written a minute in the past is folded at that time
    worker_port, reconcile_port, relay_port = free_port(), free_port(), free_port()
    targets = tmp_path / "targets.toml"
    targets.write_text('[targets.payments]\nlookup = "none"\n\n[targets.mail]\nlookup = "none"\n')
    proc = Processor(cfg, tmp_path / "data", metrics_port=worker_port)
    rec = Reconcilers(cfg, tmp_path, ["--targets", str(targets), "--metrics-port", str(reconcile_port)])
    with running(proc, rec):
        proc.wait_ready()

        # The agent: one effect recorded through the relay, which serves its own /metrics.
        async def agent() -> Samples | None:
            async with await Ledger.open(
                str(tmp_path / "agent.db"),
                kafka=cfg,
                targets=[Target("payments"), Target("mail")],
                metrics_port=relay_port,
            ) as ledger:

                async def call(key: str) -> dict[str, Any]:
                    return {"id": "re_1"}

                await ledger.execute(
                    target="payments", operation="refund.create", run_id="m", step="s", request={"n": 1}, call=call
                )
                # Polled from a thread: the relay is a task of this event loop.
                what = "the relay's outbox drained"
                return await asyncio.to_thread(wait_for, lambda: _drained(relay_port), WAIT, what)

        relay = asyncio.run(agent())
        assert relay is not None and relay["effect_ledger_dead_letters_total"][()] == 0
        assert relay["effect_ledger_outbox_depth"][()] == 0
        assert scrape(relay_port) is None  # close() stopped serving

        # An intent left past its deadline, and a record that is not an event.
        key = effect_key("mail", "send", "m", "late")
        at = now_ms() - 60_000
        p = RawProducer(cfg)
        late = Intent("i-late", key, at, 1, "mail", "send", "default", "m", "late", json.dumps({}), "d", at + 1000, "w")
        p.event(late)
        p.raw(cfg.topics.events, b"garbage", b"not an event")
        p.flush()

        def worker_settled() -> Samples | None:
            m = scrape(worker_port)
            if m is None:
                return None
            done = (
                total(m, "effect_ledger_events_total", kind="Executed") >= 1
                and total(m, "effect_ledger_escalated_total", target="mail") >= 1
                and total(m, "effect_ledger_dead_letters_total") >= 1
            )
            return m if done else None

        w = wait_for(worker_settled, WAIT, "the worker to fold, escalate and dead-letter")
        assert total(w, "effect_ledger_events_total", kind="Intent") >= 2
        assert total(w, "effect_ledger_events_total", kind="Resolution") >= 1
        assert total(w, "effect_ledger_uncertain_total", target="mail") >= 1
        assert total(w, "effect_ledger_detection_latency_seconds_count") >= 1
        # The intent's deadline was 59 s before the worker saw it.
        assert total(w, "effect_ledger_detection_latency_seconds_sum") >= 59
        assert total(w, "effect_ledger_unrecorded_window_seconds_count") >= 1
        lag = w["effect_ledger_consumer_lag"]
        assert {dict(k)["topic"] for k in lag} == {cfg.topics.events}
        assert {dict(k)["partition"] for k in lag} == {str(i) for i in range(cfg.partitions)}
        assert all(v >= 0 for v in lag.values())

        # RocksDB's own counts of the table's memory, set every 10 s (processors/rocks.py).
        rocksdb = wait_for(
            lambda: (scrape(worker_port) or {}).get("effect_ledger_rocksdb_bytes"), WAIT, "the worker's RocksDB gauge"
        )
        by_kind = {dict(k)["kind"]: v for k, v in rocksdb.items()}
        assert by_kind["cache_capacity"] == rocks.CACHE_BYTES, by_kind
        assert by_kind["memtables"] > 0 and by_kind["cache_usage"] > 0, by_kind

        def reconcilers_settled() -> Samples | None:
            m = scrape(reconcile_port)
            return m if m and total(m, "effect_ledger_resolutions_total", verdict="ESCALATE") >= 1 else None

        r = wait_for(reconcilers_settled, WAIT, "the reconcilers' escalation counted")
        lag = wait_for(lambda: (scrape(reconcile_port) or {}).get("effect_ledger_consumer_lag"), WAIT, "their lag")
        assert {dict(k)["topic"] for k in lag} == {cfg.topics.uncertain}
        assert all(v >= 0 for v in lag.values())
        for m in (w, r, relay):
            shown = {name for name in m if name.startswith("effect_ledger_")}
            assert shown <= exported_names(), shown - exported_names()


def _drained(port: int) -> Samples | None:
    m = scrape(port)
    return m if m and m.get("effect_ledger_outbox_depth", {}).get(()) == 0 else None

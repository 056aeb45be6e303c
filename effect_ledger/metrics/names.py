"""Prometheus metrics: every name effect-ledger exports, defined in one place.

prometheus-client is the ``[metrics]`` extra: it is imported only when metrics are asked for
(``--metrics-port``, ``Ledger.open(metrics_port=...)``, ``LedgerMetrics()``); without it, a
``MissingExtra`` names the extra to install. Each process builds one ``LedgerMetrics`` on a
registry of its own (or the application's) and updates it where it already handles the events:
no metric costs a query per event. ``METRICS`` is the table the docs (reference/metrics.md), the Grafana dashboard and
the alert rules are checked against (tests/unit/metrics/test_metrics_ops.py).
"""

from __future__ import annotations

from typing import Any

from effect_ledger import _extras as extras

#: Histogram buckets in seconds: from a few milliseconds (a recorded call) to an hour (a deadline
#: found late by a runner that was down).
BUCKETS = (0.005, 0.05, 0.25, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)

# name -> (type, labels, help, exported by). The single definition of what is exported.
METRICS: dict[str, tuple[str, tuple[str, ...], str, str]] = {
    "effect_ledger_effects": (
        "gauge",
        ("state", "target"),
        "Effects in the ledger by state and target (refreshed every few seconds, not per event)",
        "runner",
    ),
    "effect_ledger_oldest_overdue_seconds": (
        "gauge",
        (),
        "How long the most overdue open effect has been past its deadline or next check (0: none)",
        "runner, worker",
    ),
    "effect_ledger_open_effects": (
        "gauge",
        (),
        "Effects waiting on a deadline or a reconciliation check (PENDING, EXECUTED, UNCERTAIN)",
        "runner, worker",
    ),
    "effect_ledger_events_total": ("counter", ("kind",), "Events folded, by kind (Intent, Executed, ...)", "worker"),
    "effect_ledger_uncertain_total": (
        "counter",
        ("target", "cause"),
        "Effects that became UNCERTAIN, every way: cause = deadline (passed without an outcome), "
        "unknown_outcome (the agent's call timed out or lost its connection), other",
        "worker; embedded: runner, SDK (Ledger.open(metrics=...))",
    ),
    "effect_ledger_duplicate_executions_total": (
        "counter",
        ("target", "kind"),
        "Effects the destination executed twice, on the ledger's evidence: kind = execution (two successful "
        "Executed records for one key) or receipt (two distinct receipt ids); once per effect, as effects audit counts",
        "worker; embedded: runner, SDK (Ledger.open(metrics=...))",
    ),
    "effect_ledger_escalated_total": (
        "counter",
        ("target",),
        "Effects ESCALATED to a person (reconcilers could not tell)",
        "runner, worker",
    ),
    "effect_ledger_resolutions_total": (
        "counter",
        ("verdict",),
        "Reconciliation answers written, by verdict (FOUND, ABSENT, UNKNOWN, ESCALATE)",
        "runner, reconcilers",
    ),
    "effect_ledger_detection_latency_seconds": (
        "histogram",
        (),
        "From an attempt's deadline to the moment it was found UNCERTAIN",
        "runner, worker",
    ),
    "effect_ledger_unrecorded_window_seconds": (
        "histogram",
        (),
        "Sent-but-unrecorded window: from a call's end to its durable Executed record",
        "worker",
    ),
    "effect_ledger_consumer_lag": (
        "gauge",
        ("topic", "partition"),
        "Records on the partition not processed yet (high watermark - next offset)",
        "worker, reconcilers",
    ),
    "effect_ledger_dead_letters_total": (
        "counter",
        (),
        "Records written to effects.dlq (cannot be decoded, applied or produced)",
        "worker, reconcilers, relay",
    ),
    "effect_ledger_rocksdb_bytes": (
        "gauge",
        ("kind",),
        "RocksDB's own count of the worker's table memory, by kind: cache_capacity, cache_usage "
        "(blocks, index and filter blocks, the memtables' charge), cache_pinned, memtables, table_readers",
        "worker",
    ),
    "effect_ledger_writer_clock_skew_seconds": (
        "gauge",
        ("writer",),
        "A writer's clock against the log's, on its latest record: its claimed time minus the broker's append "
        "time (positive: ahead; negative: behind, or the record reached the log late); writer: agent, reconciler, "
        "operator, processor",
        "worker",
    ),
    "effect_ledger_clock_skew_flagged_total": (
        "counter",
        ("writer",),
        "Records whose writer's clock ran over 5 s ahead of the log's: flagged CLOCK_SKEW, an ABSENT refused",
        "worker",
    ),
    "effect_ledger_outbox_depth": (
        "gauge",
        (),
        "Events in the ledger file's outbox that Kafka has not acknowledged",
        "relay (agent)",
    ),
}


def _client(feature: str) -> Any:
    extras.require("metrics", feature)
    import prometheus_client

    return prometheus_client


class LedgerMetrics:
    """The collectors of ``METRICS`` on one registry (a fresh one unless given: an application
    may pass its own and serve it itself). Attribute names drop the ``effect_ledger_`` prefix and
    the ``_total`` or ``_seconds`` suffix: ``m.uncertain.labels(target="payments").inc()``,
    ``m.detection_latency.observe(...)``."""

    def __init__(self, registry: Any = None, *, feature: str = "metrics") -> None:
        pc = _client(feature)
        self.registry = registry if registry is not None else pc.CollectorRegistry(auto_describe=True)
        kinds = {"gauge": pc.Gauge, "counter": pc.Counter, "histogram": pc.Histogram}
        for name, (kind, labels, doc, _who) in METRICS.items():
            short = name.removeprefix("effect_ledger_").removesuffix("_total").removesuffix("_seconds")
            extra: dict[str, Any] = {"buckets": BUCKETS} if kind == "histogram" else {}
            metric_name = name.removesuffix("_total") if kind == "counter" else name
            setattr(self, short, kinds[kind](metric_name, doc, labels, registry=self.registry, **extra))

    def __getattr__(self, name: str) -> Any:  # the collectors are set in __init__, by name
        raise AttributeError(name)

    def serve(self, port: int, host: str = "127.0.0.1", token: str | None = None) -> Any:
        """Serve ``/metrics`` on ``host:port`` from a daemon thread: loopback unless told, and
        beyond loopback only with ``token``, which scrapers send as ``Authorization: Bearer TOKEN``
        (``effect_ledger.metrics.http``). Returns the HTTP server (``.shutdown()`` stops
        it; ``.server_port`` is the bound port)."""
        _client("the metrics endpoint")
        from effect_ledger.metrics.http import serve_metrics

        return serve_metrics(self.registry, port, host, token)


def exported_names() -> set[str]:
    """Every sample name a scrape can show: counters' ``_total``, histograms' ``_bucket``,
    ``_sum`` and ``_count``, and the ``_created`` samples of both."""
    out: set[str] = set()
    for name, (kind, *_rest) in METRICS.items():
        if kind == "counter":
            base = name.removesuffix("_total")
            out |= {name, base + "_created"}
        elif kind == "histogram":
            out |= {name, name + "_bucket", name + "_sum", name + "_count", name + "_created"}
        else:
            out.add(name)
    return out


def markdown_table() -> str:
    """The table of metrics of docs/reference/metrics.md (put there when the site is built), from ``METRICS``."""
    rows = ["| metric | type | labels | exported by | meaning |", "|---|---|---|---|---|"]
    for name, (kind, labels, doc, who) in METRICS.items():
        rows.append(f"| `{name}` | {kind} | {', '.join(labels) or '-'} | {who} | {doc} |")
    return "\n".join(rows)

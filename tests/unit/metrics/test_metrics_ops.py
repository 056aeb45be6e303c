"""The Grafana dashboard and the Prometheus alert rules shipped in ops/ only name metrics the code
exports (``effect_ledger.metrics.names.METRICS``), so they cannot drift from it; checked by
parsing them (JSON, YAML, the metric names in every PromQL expression), without promtool. And
``--metrics-port`` without the [metrics] extra is one line naming it."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from effect_ledger.metrics.names import METRICS, LedgerMetrics, exported_names, markdown_table

ROOT = Path(__file__).resolve().parents[3]
DASHBOARD = ROOT / "ops" / "grafana" / "effect-ledger.json"
ALERTS = ROOT / "ops" / "prometheus" / "alerts.yml"
NAME = re.compile(r"\beffect_ledger_[a-z0-9_]+")
# PromQL functions and keywords an expression may use next to metric names (anything else bare is
# a typo or a metric of something else).
PROMQL_WORDS = {
    "sum", "max", "min", "avg", "by", "without", "rate", "increase", "histogram_quantile", "le",
    "state", "target", "topic", "kind", "verdict", "writer", "instance", "cause", "m", "h", "ESCALATED",
}  # fmt: skip


def _referenced(expr: str) -> set[str]:
    return set(NAME.findall(expr))


def _dashboard_exprs() -> list[str]:
    dash = json.loads(DASHBOARD.read_text())
    assert dash["schemaVersion"] >= 36 and dash["title"] and dash["uid"]
    exprs = []
    ids = set()
    for p in dash["panels"]:
        assert {"id", "type", "title", "gridPos", "targets", "datasource"} <= set(p), p.get("title")
        assert p["id"] not in ids
        ids.add(p["id"])
        assert set(p["gridPos"]) == {"x", "y", "w", "h"} and p["gridPos"]["x"] + p["gridPos"]["w"] <= 24
        assert p["targets"], p["title"]
        for t in p["targets"]:
            assert t["refId"] and t["expr"]
            exprs.append(t["expr"])
    return exprs


def _alert_rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(ALERTS.read_text())
    rules = [r for g in doc["groups"] for r in g["rules"]]
    for r in rules:
        assert set(r) <= {"alert", "expr", "for", "labels", "annotations"}, r
        assert r["alert"] and r["expr"] and r["annotations"]["summary"]
        assert re.fullmatch(r"\d+[smh]", r.get("for", "0s")), r
    return rules


def _well_formed(expr: str) -> None:
    """Balanced brackets, and no bare word PromQL would not know."""
    depth = {"(": 0, "[": 0, "{": 0}
    closing = {")": "(", "]": "[", "}": "{"}
    for ch in expr:
        if ch in depth:
            depth[ch] += 1
        elif ch in closing:
            depth[closing[ch]] -= 1
            assert depth[closing[ch]] >= 0, expr
    assert all(v == 0 for v in depth.values()), expr
    words = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", re.sub(r'"[^"]*"', "", expr)))
    assert words - PROMQL_WORDS - exported_names() <= set(), (expr, words - PROMQL_WORDS - exported_names())


def test_every_metric_the_dashboard_names_is_exported_and_every_metric_is_on_it() -> None:
    exprs = _dashboard_exprs()
    used: set[str] = set()
    for e in exprs:
        _well_formed(e)
        refs = _referenced(e)
        assert refs, e
        assert refs <= exported_names(), (e, refs - exported_names())
        used |= refs
    # Every metric has a panel: a counter's base name, a histogram's _bucket or _sum count.
    for name, (kind, *_rest) in METRICS.items():
        forms = {name, name + "_bucket", name + "_sum", name + "_count"}
        assert used & forms, f"{name} ({kind}) is on no panel"


def test_every_metric_the_alert_rules_name_is_exported() -> None:
    rules = _alert_rules()
    for r in rules:
        _well_formed(r["expr"])
        refs = _referenced(r["expr"])
        assert refs and refs <= exported_names(), (r["alert"], refs - exported_names())
    by_metric = {name: r for r in rules for name in _referenced(r["expr"])}
    # The three the on-call asked for: stuck more than 10 minutes, dead letters growing, lag.
    assert "> 600" in by_metric["effect_ledger_oldest_overdue_seconds"]["expr"]
    assert "increase(effect_ledger_dead_letters_total" in by_metric["effect_ledger_dead_letters_total"]["expr"]
    assert "effect_ledger_consumer_lag" in by_metric


def test_a_name_the_code_does_not_export_is_caught() -> None:
    """The drift check itself can fail."""
    assert not {"effect_ledger_effects_by_state"} <= exported_names()
    with pytest.raises(AssertionError):
        _well_formed("sum(effect_ledger_effect)")
    with pytest.raises(AssertionError):
        _well_formed("sum(rate(effect_ledger_uncertain_total[5m])")


def test_the_registry_exports_exactly_the_table() -> None:
    m = LedgerMetrics()
    families = {f.name for f in m.registry.collect()}
    # prometheus_client names a counter's family without _total.
    assert families == {n.removesuffix("_total") for n in METRICS}
    assert all(n.startswith("effect_ledger_") for n in METRICS)
    table = markdown_table()
    assert all(f"`{n}`" in table for n in METRICS)


def test_metrics_port_without_the_extra_is_one_line_naming_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from effect_ledger.cli.main import main

    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # "not installed" to find_spec
    (tmp_path / "t.toml").write_text('[targets.payments]\nlookup = "none"\n')
    db = tmp_path / "l.db"
    result = CliRunner().invoke(
        main, ["run", "--db", str(db), "--targets", str(tmp_path / "t.toml"), "--metrics-port", "1", "--once"]
    )
    assert result.exit_code == 1
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "[metrics]" in lines[0] and "--metrics-port" in lines[0], result.output
    assert not db.exists()  # refused before the ledger file is created


def test_the_relay_counts_its_outbox_on_the_applications_registry(tmp_path: Path) -> None:
    """Kafka unreachable: the three events of an executed effect wait in the outbox, and the
    gauge on the application's own registry says so (read at scrape time, nothing per event)."""
    pytest.importorskip("confluent_kafka", reason="the relay is in the [kafka] extra")
    import asyncio

    from prometheus_client import CollectorRegistry

    from effect_ledger.core.reconcile import Target
    from effect_ledger.sdk.ledger import Ledger

    app_registry = CollectorRegistry()
    metrics = LedgerMetrics(app_registry)

    async def go() -> float | None:
        ledger = await Ledger.open(
            str(tmp_path / "a.db"), kafka="127.0.0.1:1", targets=[Target("payments")], metrics=metrics
        )

        async def call(key: str) -> dict[str, str]:
            return {"id": "re_1"}

        try:
            await ledger.execute(target="payments", operation="o", run_id="r", step="s", request={}, call=call)
            return app_registry.get_sample_value("effect_ledger_outbox_depth")
        finally:
            await ledger.close(relay_timeout=0.1)  # nothing can be sent: do not wait for it

    assert asyncio.run(go()) == 3  # intent, executed, receipt

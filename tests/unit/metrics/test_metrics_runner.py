"""``effects run --metrics-port`` as a real child process over real HTTP, on a ledger file holding
the known incident (tests/incident.py: 1,000 effects, 5 of them stuck with their deadline 20 to 30
minutes past). The runner finds the 5 stuck ones UNCERTAIN, nobody can ask their destination, so it
escalates them; ``/metrics`` must say exactly that, and its effects-by-state gauge must be the
file's own count."""

from __future__ import annotations

import sqlite3
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from effect_ledger.metrics.names import exported_names
from tests.incident import EXPECTED, incident
from tests.ops_expected import now_ms, write_ledger
from tests.services import Service, free_port, wait_for

WAIT = 60.0


def scrape(port: int) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """sample name -> {sorted labels: value}"""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def in_file(db: Path) -> dict[tuple[tuple[str, str], ...], float]:
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as c:
        rows = c.execute("SELECT state, target, COUNT(*) FROM effects GROUP BY state, target").fetchall()
    return {(("state", s), ("target", t)): float(n) for s, t, n in rows}


@pytest.fixture
def runner(tmp_path: Path) -> Iterator[tuple[Service, int, Path]]:
    db = write_ledger(tmp_path / "incident.db", incident(now_ms()).events)
    targets = tmp_path / "targets.toml"
    targets.write_text('[targets.payments]\nlookup = "none"\n\n[targets.tickets]\nlookup = "none"\n')
    port = free_port()
    args = ["run", "--db", str(db), "--targets", str(targets), "--interval", "0.2", "--metrics-port", str(port)]
    svc = Service(args, tmp_path / "run.log").start()
    yield svc, port, db
    svc.stop()


def test_the_runner_metrics_of_the_known_incident(runner: tuple[Service, int, Path]) -> None:
    svc, port, db = runner

    def settled() -> dict[str, dict[tuple[tuple[str, str], ...], float]] | None:
        assert svc.alive, svc.log()[-3000:]
        try:
            m = scrape(port)
        except OSError:
            return None  # not listening yet
        escalated = sum(m.get("effect_ledger_escalated_total", {}).values())
        # The gauges are refreshed every few seconds: wait until they show the file as it is.
        return m if escalated == EXPECTED.stuck and m.get("effect_ledger_effects") == in_file(db) else None

    m = wait_for(settled, WAIT, "the 5 stuck effects escalated and the gauges equal to the file")
    effects = m["effect_ledger_effects"]
    assert sum(effects.values()) == EXPECTED.effects
    assert effects[(("state", "ESCALATED"), ("target", "payments"))] == EXPECTED.stuck
    # Everything else of the incident was settled when the runner started: 1,000 - 5 CONFIRMED.
    confirmed = sum(v for k, v in effects.items() if ("state", "CONFIRMED") in k)
    assert confirmed == EXPECTED.effects - EXPECTED.stuck
    assert m["effect_ledger_uncertain_total"] == {(("cause", "deadline"), ("target", "payments")): EXPECTED.stuck}
    assert m["effect_ledger_resolutions_total"] == {(("verdict", "ESCALATE"),): EXPECTED.stuck}
    assert m["effect_ledger_open_effects"][()] == 0
    assert m["effect_ledger_oldest_overdue_seconds"][()] == 0
    # Detection latency: the incident's deadlines passed 20 to 30 minutes before the runner started.
    assert m["effect_ledger_detection_latency_seconds_count"][()] == EXPECTED.stuck
    assert m["effect_ledger_detection_latency_seconds_sum"][()] >= EXPECTED.stuck * 19 * 60
    assert m["effect_ledger_detection_latency_seconds_bucket"][(("le", "900.0"),)] == 0
    assert m["effect_ledger_detection_latency_seconds_bucket"][(("le", "3600.0"),)] == EXPECTED.stuck
    # Nothing it shows is outside the documented table.
    shown = {name for name in m if name.startswith("effect_ledger_")}
    assert shown <= exported_names(), shown - exported_names()


def test_a_metrics_port_in_use_is_one_line_and_exit_1(tmp_path: Path) -> None:
    import socket

    db = write_ledger(tmp_path / "incident.db", incident(now_ms()).events[:3])
    targets = tmp_path / "targets.toml"
    targets.write_text('[targets.payments]\nlookup = "none"\n[targets.tickets]\nlookup = "none"\n')
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        args = ["run", "--db", str(db), "--targets", str(targets), "--metrics-port", str(port)]
        svc = Service(args, tmp_path / "x.log").start()
        assert svc.proc is not None
        assert svc.proc.wait(60) == 1
    lines = svc.log().strip().splitlines()
    assert len(lines) == 1 and f"127.0.0.1:{port}" in lines[0], lines

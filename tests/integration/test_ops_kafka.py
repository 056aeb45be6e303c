"""The operator and auditor commands against the real broker and a real ledger processor.

The known incident of ``tests/incident.py`` is produced to ``effects.events`` the way the relay
produces (``effect_ledger.sdk.kafka.relay.producer_config``, key = effect_id, the schema header), with each record's
Kafka timestamp set to the event's time so that ``effects audit``'s ``offsets_for_times`` seek means
something. The audit replays it as it stands; then a processor (``effects worker``, a child process)
folds it into ``effects.state``, and ``stuck``, ``trace``, ``sink``, ``tail``, ``escalations`` and
``resolve`` read what it published. Every wait polls a condition against a deadline.

One module-wide setup (topics under a fresh prefix, the incident, one processor): the tests read it;
the sink test, last, changes one effect (``resolve --abandon``).
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, Producer

from effect_ledger.core.model import Resolution, State, Timeout
from effect_ledger.sdk.kafka.relay import producer_config
from effect_ledger.streams.admin import delete_topics, ensure_topics, list_topics
from effect_ledger.streams.codec import default_codec
from effect_ledger.streams.config import KafkaConfig
from tests.incident import EXPECTED, Incident, incident
from tests.ops_expected import CHECKS, checks_of, expected_checks, expected_targets, now_ms, write_ledger
from tests.services import Processor
from tests.topic_io import TopicReader, recorded_times

ROOT = Path(__file__).resolve().parents[2]
WAIT = 60.0
INTERMEDIATE = {"PENDING", "EXECUTED", "UNCERTAIN", "ESCALATED"}

# The on-call's queries over the sink's table (docs/guides/oncall-sql.md), exactly as run here.
SQL_UNCERTAIN_LAST_HOUR = (
    "SELECT effect_id FROM effects WHERE state = 'UNCERTAIN' AND updated_ms > (strftime('%s','now') - 3600) * 1000"
)
SQL_STUCK = (
    "SELECT effect_id, state, target, created_ms FROM effects "
    "WHERE state IN ('PENDING','EXECUTED','UNCERTAIN','ESCALATED') "
    "AND created_ms < (strftime('%s','now') - 600) * 1000 ORDER BY created_ms"
)
SQL_BY_TARGET = "SELECT target, state, count(*) FROM effects GROUP BY target, state ORDER BY target, state"
SQL_DUPLICATES = "SELECT effect_id FROM effects WHERE ',' || flags || ',' LIKE '%,DUPLICATE_EXECUTION,%'"
SQL_CONFIRMED_BY_RECONCILIATION = (
    "SELECT effect_id, receipt_id FROM effects WHERE state = 'CONFIRMED' AND executions = 0"
)


def cli(*args: str | Path, cwd: Path = ROOT, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, COLUMNS="200", PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run(
        [sys.executable, "-m", "effect_ledger", *map(str, args)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def ok(r: subprocess.CompletedProcess[str], code: int = 0) -> str:
    assert r.returncode == code, f"exit {r.returncode} (expected {code})\nstdout:\n{r.stdout}\nstderr:\n{r.stderr}"
    return r.stdout


def json_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


@dataclass
class Setup:
    cfg: KafkaConfig
    inc: Incident
    processor: Processor
    workdir: Path
    audit_before: subprocess.CompletedProcess[str]  # `audit --from -1h --json`, before the processor ran
    empty_before: subprocess.CompletedProcess[str]  # `audit --from -5m --json`, before the processor ran
    processor_started_ms: int

    @property
    def p(self) -> list[str]:
        return ["--bootstrap", self.cfg.bootstrap, "--prefix", self.cfg.prefix]


def produce(cfg: KafkaConfig, inc: Incident) -> None:
    codec = default_codec()
    producer = Producer(producer_config(cfg, **{"message.timeout.ms": 30_000}))
    errors: list[KafkaError] = []
    for e in inc.events:
        producer.produce(
            cfg.topics.events,
            key=e.effect_id.encode(),
            value=codec.encode(e),
            headers=[codec.header(e)],
            timestamp=e.at_ms,
            on_delivery=lambda err, _m: errors.append(err) if err else None,
        )
        producer.poll(0)
    assert producer.flush(30) == 0 and not errors, errors[:3]


def final_state(inc: Incident, key: str) -> str:
    # The processor's deadline timer times out the stuck ones (their deadline passed 20 minutes
    # ago); nothing answers for them, so they stay UNCERTAIN.
    return State.UNCERTAIN.value if key in set(inc.stuck) else State.CONFIRMED.value


@pytest.fixture(scope="module")
def setup(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    cfg = KafkaConfig(bootstrap=kafka_bootstrap, prefix=f"t{uuid.uuid4().hex[:12]}.", partitions=3)
    ensure_topics(cfg)
    recorded_times(cfg)  # the incident happened over the last half hour: its records keep their times
    workdir = tmp_path_factory.mktemp("ops-kafka")
    processor = Processor(cfg, workdir / "data")
    try:
        inc = incident(now_ms())
        produce(cfg, inc)
        p = ["--bootstrap", cfg.bootstrap, "--prefix", cfg.prefix]
        audit_before = cli("audit", *p, "--from", "-1h", "--json", "--report-only")
        empty_before = cli("audit", *p, "--from", "-5m", "--json", "--report-only")

        started = now_ms()
        processor.start().wait_ready(WAIT)
        want = {k: final_state(inc, k) for k in inc.doubled + inc.stuck + inc.uncertain + inc.normal}
        with TopicReader(cfg, cfg.topics.state) as states:
            states.until(
                lambda _records: {k: v.state.value for k, v in states.latest().items()} == want,
                WAIT,
                "the final state of all 1,000 effects",
            )
        yield Setup(cfg, inc, processor, workdir, audit_before, empty_before, started)
    except BaseException:
        print(f"---- processor log ({processor.log_path}) ----\n{processor.log()[-6000:]}")
        raise
    finally:
        processor.kill()
        # The four topics and the processor's own (table changelog, assignor): all under the prefix.
        delete_topics(cfg, [t for t in list_topics(cfg) if t.startswith(cfg.prefix)])


# -- audit -------------------------------------------------------------------------------------------


def test_audit_replays_the_incident_exactly(setup: Setup) -> None:
    report = json.loads(ok(setup.audit_before))
    inc = setup.inc
    assert [c["name"] for c in report["checks"]] == list(CHECKS)
    assert checks_of(report) == expected_checks()
    assert report["duplicate_keys"] == sorted(inc.doubled)
    assert report["stuck_keys"] == sorted(inc.stuck)
    assert report["events"] == len(inc.events)
    assert report["continuing"] == 0 and report["undecodable"] == 0
    assert {t.pop("target"): t for t in report["targets"]} == expected_targets(inc)


def test_audit_of_a_window_that_excludes_everything(setup: Setup) -> None:
    """Every incident event is at least 20 minutes old: from 5 minutes ago there is nothing."""
    report = json.loads(ok(setup.empty_before))
    assert (report["events"], report["continuing"], report["targets"]) == (0, 0, [])
    assert all(c["denominator"] == 0 and c["passed"] for c in report["checks"])

    # After the processor, the window holds its timeouts of the stuck effects (stamped now): events
    # of effects that began before the window, counted as continuing and left out.
    after = json.loads(ok(cli("audit", *setup.p, "--from", "-5m", "--json", "--report-only")))
    # Only undecodable_records counts them: every record replayed decoded.
    assert after["targets"] == [] and all(
        c["denominator"] == 0 for c in after["checks"] if c["name"] != "undecodable_records"
    )
    assert checks_of(after)["undecodable_records"] == {
        "numerator": 0, "denominator": after["events"], "criterion": "none", "passed": True,
    }  # fmt: skip
    assert after["continuing"] >= EXPECTED.stuck


def test_audit_after_the_processor_adds_only_the_timeouts_of_the_stuck(setup: Setup) -> None:
    """Once the processor ran, the stuck five have a timeout (they became uncertain, and nobody
    resolved them); every other number of the incident is unchanged."""
    report = json.loads(ok(cli("audit", *setup.p, "--from", "-1h", "--json", "--report-only")))
    want = expected_checks()
    uncertain = EXPECTED.uncertain + EXPECTED.stuck
    want["uncertain"].update(numerator=uncertain)
    want["resolved_by_reconciliation"].update(denominator=uncertain, passed=False)
    want["undecodable_records"].update(denominator=EXPECTED.records + EXPECTED.stuck)  # + their timeouts
    assert checks_of(report) == want
    assert report["duplicate_keys"] == sorted(setup.inc.doubled)
    assert report["stuck_keys"] == sorted(setup.inc.stuck)


def test_the_processor_times_out_only_the_effects_that_are_stuck(setup: Setup) -> None:
    """The processor's deadline timer must not time out an attempt whose outcome is already on
    ``effects.events`` and merely not yet consumed: such a Timeout is a false fact in the permanent
    audit record. Only the five stuck effects have nothing after their intent."""
    inc = setup.inc
    with TopicReader(setup.cfg, setup.cfg.topics.events) as events:
        events.drain(WAIT)
        late = [t for t in events.values(Timeout) if t.at_ms >= setup.processor_started_ms]
    kinds = {**dict.fromkeys(inc.doubled, "doubled"), **dict.fromkeys(inc.uncertain, "uncertain")}
    kinds.update({**dict.fromkeys(inc.normal, "normal"), **dict.fromkeys(inc.stuck, "stuck")})
    by_kind = Counter(kinds[k] for k in {t.effect_id for t in late})
    assert {t.effect_id for t in late} == set(inc.stuck), f"effects the processor timed out, by kind: {by_kind}"


# -- stuck, trace, escalations, tail -----------------------------------------------------------------


def test_stuck_lists_the_five_and_exits_3(setup: Setup) -> None:
    rows = json_lines(ok(cli("stuck", *setup.p, "--older-than", "10m", "--json"), 3))
    assert sorted(r["effect_id"] for r in rows) == sorted(setup.inc.stuck)
    assert {r["state"] for r in rows} <= INTERMEDIATE
    assert [r["created_ms"] for r in rows] == sorted(r["created_ms"] for r in rows)
    assert ok(cli("stuck", *setup.p, "--older-than", "1h", "--json")) == ""


@pytest.mark.parametrize("kind", ["doubled", "uncertain"])
def test_trace_matches_the_embedded_ledger(setup: Setup, kind: str, tmp_path: Path) -> None:
    inc = setup.inc
    key = {"doubled": inc.doubled, "uncertain": inc.uncertain}[kind][0]
    db = write_ledger(tmp_path / "one.db", [e for e in inc.events if e.effect_id == key])
    embedded = json.loads(ok(cli("trace", key, "--db", db, "--json")))
    kafka = json.loads(ok(cli("trace", key, *setup.p, "--json")))
    # A timeout the processor may have written for an attempt already settled (see
    # test_the_processor_times_out_only_the_effects_that_are_stuck) is left out of the comparison.
    kafka["events"] = [e for e in kafka["events"] if e["at_ms"] < setup.processor_started_ms]
    assert kafka == embedded
    if kind == "doubled":
        assert "DUPLICATE_EXECUTION" in kafka["flags"]
        assert sum(e["event"].startswith("executed OK") for e in kafka["events"]) == 2
    else:
        found = next(e for e in inc.events if isinstance(e, Resolution) and e.effect_id == key)
        assert kafka["events"][-1]["source"] == found.reconciler
        assert kafka["receipt_id"] == found.receipt_id


def test_trace_of_an_unknown_key_is_one_line(setup: Setup) -> None:
    r = cli("trace", "payments:no-such-effect", *setup.p, "--json")
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines() == [r.stderr.strip()] and r.stderr.startswith("effects: ")


def test_escalations_queue_is_empty(setup: Setup) -> None:
    assert "the escalation queue is empty" in ok(cli("escalations", *setup.p))
    assert ok(cli("escalations", *setup.p, "--json")) == ""


def test_tail_from_the_beginning_filters_by_state(setup: Setup) -> None:
    out = ok(cli("tail", *setup.p, "--from-beginning", "--state", "PENDING", "--count", "5", "--json", timeout=WAIT))
    rows = json_lines(out)
    assert len(rows) == 5
    assert {r["state"] for r in rows} == {"PENDING"}
    everyone = set(setup.inc.doubled + setup.inc.stuck + setup.inc.uncertain + setup.inc.normal)
    assert {r["effect_id"] for r in rows} <= everyone


# -- the sink and the on-call's SQL ------------------------------------------------------------------


def table(db: Path) -> dict[str, tuple[Any, ...]]:
    with sqlite3.connect(db) as conn:
        return {r[0]: tuple(r) for r in conn.execute("SELECT * FROM effects")}


def query(db: Path, sql: str) -> list[tuple[Any, ...]]:
    with sqlite3.connect(db) as conn:
        return [tuple(r) for r in conn.execute(sql)]


def test_sink_materialises_the_state_and_survives_restarts(setup: Setup) -> None:
    inc, workdir = setup.inc, setup.workdir
    db = workdir / "ops.db"
    first = ok(cli("sink", *setup.p, "--to", "sqlite:///ops.db", "--once", cwd=workdir))
    assert first.startswith("sink: ") and "ops.db" in first
    rows = table(db)
    assert len(rows) == EXPECTED.effects
    assert set(rows) == set(inc.doubled + inc.stuck + inc.uncertain + inc.normal)

    # The stuck five sit in an intermediate state (the processor timed them out: UNCERTAIN).
    intermediate = query(db, "SELECT effect_id, state, reason FROM effects WHERE state != 'CONFIRMED'")
    assert sorted(k for k, _, _ in intermediate) == sorted(inc.stuck)
    assert {(s, r) for _, s, r in intermediate} == {("UNCERTAIN", "deadline passed without a recorded outcome")}
    assert sorted(k for (k,) in query(db, SQL_DUPLICATES)) == sorted(inc.doubled)
    found = {e.effect_id: e.receipt_id for e in inc.events if isinstance(e, Resolution)}
    assert dict(query(db, SQL_CONFIRMED_BY_RECONCILIATION)) == found  # the 20 once uncertain
    assert len(found) == EXPECTED.uncertain

    # The README's on-call queries.
    assert sorted(k for (k,) in query(db, SQL_UNCERTAIN_LAST_HOUR)) == sorted(inc.stuck)
    stuck_rows = query(db, SQL_STUCK)
    assert [k for k, *_ in stuck_rows] == [k for k, *_ in sorted(stuck_rows, key=lambda r: r[3])]
    assert sorted(k for k, *_ in stuck_rows) == sorted(inc.stuck)
    by_target = Counter((k.split(":", 1)[0], final_state(inc, k)) for k in rows)
    assert query(db, SQL_BY_TARGET) == sorted((t, s, n) for (t, s), n in by_target.items())

    # Restart: nothing new on effects.state, so nothing added and nothing doubled.
    second = ok(cli("sink", *setup.p, "--to", "sqlite:///ops.db", "--once", cwd=workdir))
    assert second.startswith("sink: 0 state records"), second
    assert table(db) == rows

    # One more state change: a person abandons a stuck effect; the processor publishes it.
    key = inc.stuck[0]
    decided = ok(cli("resolve", key, *setup.p, "--abandon", "--by", "bob", "--reason", "x"))
    assert "decision ABANDONED" in decided
    with TopicReader(setup.cfg, setup.cfg.topics.state) as states:
        states.until(
            lambda _r: (st := states.latest().get(key)) is not None and st.state is State.ABANDONED,
            WAIT,
            f"{key} ABANDONED on effects.state",
        )
    run3 = cli("sink", *setup.p, "--to", "sqlite:///ops.db", "--once", "--log-format", "json", cwd=workdir)
    third = ok(run3)
    assert third.startswith("sink: 1 state records"), third
    # What the sink said on stderr (JSON lines): where it reads and writes, then what it wrote.
    said = json_lines(run3.stderr)
    start = next(x for x in said if x["event"] == "start")
    assert start["service"] == "sink" and start["topics"] == [setup.cfg.topics.state] and "ops.db" in start["to"]
    assert start["bootstrap"] == setup.cfg.bootstrap and start["behind"] == 1
    (summary,) = [x for x in said if x["event"] == "summary"]  # the last one, when it stops
    assert summary["counts"] == {"state_records": 1, "rows_written": 1}
    after = table(db)
    assert set(after) == set(rows)
    changed = {k for k in after if after[k] != rows[k]}
    assert changed == {key}
    assert query(db, f"SELECT state, reason FROM effects WHERE effect_id = '{key}'") == [
        ("ABANDONED", "abandoned by bob: x")
    ]


# -- errors ------------------------------------------------------------------------------------------


def test_unreachable_broker_is_one_line(setup: Setup, tmp_path: Path) -> None:
    """Every Kafka-reading command, against a port nobody listens on: one line, exit 1."""
    key = setup.inc.stuck[1]
    commands = {
        "audit": ["audit", "--from", "-1h"],
        "stuck": ["stuck"],
        "trace": ["trace", key],
        "escalations": ["escalations"],
        "resolve": ["resolve", key, "--absent", "--by", "a", "--reason", "r"],
        "tail": ["tail", "--count", "1", "--give-up-after", "5"],
        "sink": ["sink", "--to", f"sqlite:///{tmp_path / 'x.db'}", "--once"],
    }
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    procs = {
        name: subprocess.Popen(
            [sys.executable, "-m", "effect_ledger", *args, "--bootstrap", "127.0.0.1:1", "--prefix", "nobody."],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name, args in commands.items()
    }  # concurrently: each waits 5 s for a broker
    failures = []
    for name, p in procs.items():
        out, err = p.communicate(timeout=WAIT)
        lines = err.strip().splitlines()
        if p.returncode == 0 or "Traceback" in err or len(lines) != 1 or not lines[0].startswith("effects: "):
            failures.append(f"{name}: exit {p.returncode}, stderr:\n{err}")
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize(
    "url",
    ["postgresql://127.0.0.1:1/ops", "sqlite:///{tmp}/no-such-folder/ops.db"],
    ids=["postgres nobody listens on", "missing folder"],
)
def test_sink_to_a_bad_target_is_one_line(setup: Setup, tmp_path: Path, url: str) -> None:
    r = cli("sink", *setup.p, "--to", url.format(tmp=tmp_path), "--once")
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and r.stderr.startswith("effects: "), r.stderr

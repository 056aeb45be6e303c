"""What the services say, as real processes against the real broker: ``effects worker`` and
``effects reconcile`` started with ``--log-format json`` (and the reconcilers once in text), their
start line (what they serve, where), a line per rebalance, per effect made UNCERTAIN (a passed
deadline, an unknown outcome), per verdict and escalation, and the periodic summary; no coordinator
warning at start-up shown as a warning or an error. Every wait polls the log against a deadline."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from effect_ledger.core.keys import effect_key
from effect_ledger.core.model import Executed, Intent, Outcome
from effect_ledger.metrics.logs import is_coordinator_noise
from effect_ledger.streams.config import KafkaConfig
from tests.integration.test_metrics_kafka import Samples, scrape, total
from tests.services import Processor, Reconcilers, free_port, wait_for
from tests.topic_io import RawProducer, recorded_times, running

WAIT = 90.0


def json_lines(text: str) -> list[dict[str, Any]]:
    """The JSON lines of a service's log; a line that is not one fails the test (faust's own lines
    go through the same handler)."""
    out = []
    for line in text.splitlines():
        if not line.strip():
            continue
        out.append(json.loads(line))  # every line of --log-format json is one JSON object
    return out


def events(svc: Any) -> list[dict[str, Any]]:
    return json_lines(svc.log())


def find(svc: Any, event: str, **fields: Any) -> dict[str, Any] | None:
    for rec in events(svc):
        if rec.get("event") == event and all(rec.get(k) == v for k, v in fields.items()):
            return rec
    return None


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def test_worker_and_reconcilers_say_what_they_do_in_json(kafka_config: KafkaConfig, tmp_path: Path) -> None:
    cfg = kafka_config
    recorded_times(cfg)  # the intents below are written a minute in the past
    targets = tmp_path / "targets.toml"
    targets.write_text('[targets.mail]\nlookup = "none"\n')
    as_json = ["--log-format", "json", "--log-summary", "1"]
    metrics_port = free_port()
    proc = Processor(cfg, tmp_path / "data", metrics_port=metrics_port, extra=as_json)
    rec = Reconcilers(cfg, tmp_path, ["--targets", str(targets), *as_json])
    with running(proc, rec):
        proc.wait_ready()
        start = wait_for(lambda: find(proc, "start"), WAIT, "the worker's start line")
        assert start["service"] == "worker" and start["level"] == "INFO"
        assert start["bootstrap"] == cfg.bootstrap and start["group"].startswith(cfg.prefix)
        assert cfg.topics.events in start["topics"] and cfg.topics.events in start["msg"]
        assigned = wait_for(lambda: find(proc, "partitions_assigned"), WAIT, "the worker's assignment")
        assert assigned["topic"] == cfg.topics.events
        assert sorted(assigned["partitions"]) == list(range(cfg.partitions))

        r_start = wait_for(lambda: find(rec, "start"), WAIT, "the reconcilers' start line")
        assert r_start["service"] == "reconcile" and r_start["topics"][0] == cfg.topics.uncertain
        assert r_start["group"].startswith(cfg.prefix) and r_start["targets"] == ["mail"]
        wait_for(lambda: find(rec, "partitions_assigned", topic=cfg.topics.uncertain), WAIT, "their assignment")

        # One intent past its deadline, one whose call's outcome the agent did not know.
        at = now_ms() - 60_000
        late = effect_key("mail", "send", "logs", "late")
        lost = effect_key("mail", "send", "logs", "lost")
        p = RawProducer(cfg)
        p.event(Intent("i-late", late, at, 1, "mail", "send", "default", "logs", "late", "{}", "d", at + 1000, "w"))
        p.event(Intent("i-lost", lost, at, 1, "mail", "send", "default", "logs", "lost", "{}", "d", at + 1000, "w"))
        p.event(Executed("x-lost", lost, at + 500, 1, Outcome.UNKNOWN, "timed out", at, at + 500, None, "w"))
        # Two attempts of one key that both returned ok: the destination executed it twice.
        dup = effect_key("mail", "send", "logs", "twice")
        for n in (1, 2):
            t = at + n * 2000
            p.event(
                Intent(f"i-dup{n}", dup, t, n, "mail", "send", "default", "logs", "twice", "{}", "d", t + 1000, "w")
            )
            p.event(Executed(f"x-dup{n}", dup, t + 500, n, Outcome.OK, None, t, t + 500, None, "w"))
        p.flush()

        by_deadline = wait_for(lambda: find(proc, "uncertain", effect_id=late), WAIT, "the deadline's UNCERTAIN line")
        assert by_deadline["detail"] == "deadline" and by_deadline["target"] == "mail"
        unknown = wait_for(lambda: find(proc, "uncertain", effect_id=lost), WAIT, "the unknown outcome's line")
        assert unknown["detail"] == "unknown_outcome" and unknown["operation"] == "send"

        twice = wait_for(lambda: find(proc, "duplicate", effect_id=dup), WAIT, "the duplicate execution's line")
        assert twice["level"] == "ERROR" and twice["detail"] == "execution" and twice["target"] == "mail"

        # The same changes on the worker's /metrics: every way into UNCERTAIN, and the duplicate.
        def counted_on_metrics() -> Samples | None:
            m = scrape(metrics_port)
            done = m and total(m, "effect_ledger_duplicate_executions_total", kind="execution") >= 1
            return m if done else None

        m = wait_for(counted_on_metrics, WAIT, "the worker's counters")
        assert total(m, "effect_ledger_uncertain_total", target="mail", cause="unknown_outcome") == 1
        assert total(m, "effect_ledger_uncertain_total", target="mail", cause="deadline") >= 1
        assert total(m, "effect_ledger_duplicate_executions_total", target="mail", kind="execution") == 1
        assert total(m, "effect_ledger_duplicate_executions_total", kind="receipt") == 0

        # Nobody can ask "mail": the reconcilers escalate both, and the worker folds the escalations.
        for key in (late, lost):
            esc = wait_for(lambda k=key: find(rec, "escalated", effect_id=k), WAIT, f"the escalation of {key}")
            assert esc["level"] == "WARNING" and esc["verdict"] == "ESCALATE" and esc["reason"]
            wait_for(lambda k=key: find(proc, "escalated", effect_id=k), WAIT, f"the worker's escalation of {key}")

        # The summaries (every second here) count what happened since the one before.
        def counted(svc: Any, name: str) -> int:
            return sum(r.get("counts", {}).get(name, 0) for r in events(svc) if r.get("event") == "summary")

        wait_for(lambda: counted(proc, "uncertain") >= 2, WAIT, "the worker's summaries to count both")
        assert counted(proc, "escalated") >= 0  # present once folded; the line above already proved it
        wait_for(lambda: counted(rec, "verdicts_ESCALATE") >= 2, WAIT, "the reconcilers' summaries")
        summary = find(proc, "summary")
        assert summary is not None and summary["seconds"] >= 0 and "open_effects" in summary

    # Start-up coordinator noise is never a warning or an error: at most INFO, with the note why.
    for svc in (proc, rec):
        for r in events(svc):
            if is_coordinator_noise(r["msg"]):
                assert r["level"] in ("DEBUG", "INFO"), r


def test_reconcilers_speak_plain_text_by_default(kafka_config: KafkaConfig, tmp_path: Path) -> None:
    targets = tmp_path / "targets.toml"
    targets.write_text('[targets.mail]\nlookup = "none"\n')
    rec = Reconcilers(kafka_config, tmp_path, ["--targets", str(targets)])
    with running(rec):

        def lines() -> list[str]:
            return rec.log().splitlines()

        start = wait_for(
            lambda: next((x for x in lines() if " reconcile: started: " in x), None), WAIT, "the start line"
        )
        # 2026-12-05T18:40:01.123Z INFO reconcile: started: ...  key=value ...
        stamp, level, *_ = start.split(" ")
        assert stamp.endswith("Z") and "T" in stamp and level == "INFO"
        assert kafka_config.topics.uncertain in start and f"bootstrap={kafka_config.bootstrap}" in start
        wait_for(lambda: any("partitions assigned" in x for x in lines()), WAIT, "the assignment line")
        assert not any(x.lstrip().startswith("{") for x in lines())  # not JSON

"""The services' one logging setup (``effect_ledger.metrics.logs``): text and JSON lines with the
record's fields, the start-up coordinator warnings of the Kafka clients shown as INFO (or not at
all), the summary's counts since the last one; and ``effects run`` saying what it serves, in a real
child process on a real ledger file."""

from __future__ import annotations

import io
import json
import logging
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from effect_ledger.metrics import logs
from effect_ledger.streams.config import send_client_logs_to
from tests.services import wait_for


@pytest.fixture
def stream() -> Iterator[io.StringIO]:
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    # Only this test's handler: one another test left on the root (a CLI run in-process) would
    # write what this test expects its own handler to drop.
    for h in handlers:
        if type(h) is logging.StreamHandler:
            root.removeHandler(h)
    logs._handler = None
    out = io.StringIO()
    yield out
    root.handlers[:] = handlers
    root.setLevel(level)
    logs._handler = None
    logging.getLogger("effect_ledger").setLevel(logging.NOTSET)
    send_client_logs_to(None)  # logs.service routed librdkafka's lines: not for the next tests


def test_json_lines_carry_the_event_and_its_fields(stream: io.StringIO) -> None:
    logs.setup("json", stream=stream)
    logs.service("reconcile")
    log = logging.getLogger("effect_ledger.reconcilers")
    logs.started(log, "reconcilers: t.effects.uncertain", bootstrap="127.0.0.1:9660", topics=["t.effects.uncertain"])
    logs.event(log, "verdict", "effect k: FOUND", effect_id="payments:k", verdict="FOUND")
    logging.getLogger("effect_ledger.store").debug("not shown: below INFO")
    first, second = (json.loads(x) for x in stream.getvalue().splitlines())
    assert first["event"] == "start" and first["service"] == "reconcile" and first["level"] == "INFO"
    assert first["msg"] == "started: reconcilers: t.effects.uncertain"
    assert first["bootstrap"] == "127.0.0.1:9660" and first["topics"] == ["t.effects.uncertain"]
    assert first["ts"].endswith("Z") and first["logger"] == "effect_ledger.reconcilers"
    assert second["event"] == "verdict" and second["effect_id"] == "payments:k" and second["verdict"] == "FOUND"


def test_text_lines_are_a_sentence_then_the_fields(stream: io.StringIO) -> None:
    logs.setup("text", stream=stream)
    logs.service("worker")
    logs.event(
        logging.getLogger("effect_ledger.processor"), "partitions_assigned", "partitions assigned: [0, 1]",
        partitions=[0, 1], group="g 1",
    )  # fmt: skip
    (line,) = stream.getvalue().splitlines()
    stamp, rest = line.split(" ", 1)
    assert stamp.endswith("Z")
    assert rest == 'INFO worker: partitions assigned: [0, 1]  partitions=0,1 group="g 1"'


@pytest.mark.parametrize(
    "logger, text",
    [
        ("aiokafka.consumer.group_coordinator", "Coordinator Request failed: [Error 15] CoordinatorNotAvailableError"),
        ("aiokafka.consumer.group_coordinator", "OffsetCommit failed: [Error 16] NotCoordinatorForGroupError"),
        ("librdkafka", "GETPID [rdkafka#producer-3] Failed to acquire PID: Broker: Coordinator load in progress"),
        ("librdkafka", "COMMITFAIL [rdkafka#consumer-1] Offset commit failed: Broker: Not coordinator"),
    ],
)  # fmt: skip
def test_start_up_coordinator_warnings_are_info_or_nothing(stream: io.StringIO, logger: str, text: str) -> None:
    # The libraries' loggers at their defaults (an earlier test in this process may have set them).
    chain = [logger.rsplit(".", i)[0] for i in range(logger.count(".") + 1)]
    levels = {name: logging.getLogger(name).level for name in chain}
    for name in chain:
        logging.getLogger(name).setLevel(logging.NOTSET)
    try:
        _coordinator_noise(stream, logger, text)
    finally:
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)


def _coordinator_noise(stream: io.StringIO, logger: str, text: str) -> None:
    logs.setup("json", stream=stream)
    logging.getLogger(logger).error(text)
    assert stream.getvalue() == ""  # the root logger shows warnings only: a downgraded line is not one
    logs.setup("json", verbose=True, stream=stream)  # -v: shown, as INFO, with the reason
    logging.getLogger(logger).error(text)
    (rec,) = (json.loads(x) for x in stream.getvalue().splitlines())
    assert rec["level"] == "INFO" and rec["msg"].startswith(text) and "coordinator starts" in rec["msg"]


def test_a_real_error_stays_an_error(stream: io.StringIO) -> None:
    logs.setup("json", stream=stream)
    logging.getLogger("aiokafka.conn").error("Unable to connect to node with id 1: [Errno 111] Connection refused")
    (rec,) = (json.loads(x) for x in stream.getvalue().splitlines())
    assert rec["level"] == "ERROR"


def test_the_summary_counts_since_the_last_one(stream: io.StringIO) -> None:
    logs.setup("json", stream=stream)
    logs.service("run")
    now = [0.0]
    s = logs.Summary(logging.getLogger("effect_ledger.runner"), every=60, clock=lambda: now[0])
    s.count("uncertain")
    s.count("verdicts_FOUND", 2)
    assert not s.tick()  # not due yet
    now[0] = 61
    assert s.tick(open_effects=3)
    now[0] = 125
    assert s.tick()
    first, second = (json.loads(x) for x in stream.getvalue().splitlines())
    assert first["event"] == "summary" and first["counts"] == {"uncertain": 1, "verdicts_FOUND": 2}
    assert first["seconds"] == 61 and first["open_effects"] == 3
    assert first["msg"] == "summary of the last 61 s: 1 uncertain, 2 verdicts_FOUND"
    assert second["counts"] == {} and second["msg"].endswith("nothing new") and second["seconds"] == 64
    assert not logs.Summary(logging.getLogger("x"), every=0, clock=lambda: 1e9).tick()  # 0: never


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_effects_run_says_what_it_serves_and_sums_up_when_stopped(tmp_path: Path, sig: signal.Signals) -> None:
    targets = tmp_path / "t.toml"
    targets.write_text('[targets.payments]\nlookup = "none"\n')
    db = tmp_path / "l.db"
    err = tmp_path / "stderr.log"
    args = ["run", "--db", str(db), "--targets", str(targets), "--log-format", "json", "--interval", "0.1"]
    with err.open("wb") as sink:
        proc = subprocess.Popen([sys.executable, "-m", "effect_ledger", *args], stderr=sink)
    try:

        def said() -> list[dict[str, Any]]:
            # Whole lines only: the service may be half-way through writing the last one.
            whole = err.read_text().rpartition("\n")[0]
            return [json.loads(x) for x in whole.splitlines() if x.strip()]

        start = wait_for(lambda: next((x for x in said() if x["event"] == "start"), None), 60, "the start line")
        assert start["service"] == "run" and start["db"] == str(db) and start["targets"] == ["payments"]
        assert str(db) in start["msg"] and start["interval_s"] == 0.1
    finally:
        proc.send_signal(sig)  # Ctrl-C or a supervisor: the tick in progress ends, then it stops and sums up
        assert proc.wait(60) == 0
    (summary,) = [x for x in said() if x["event"] == "summary"]
    assert summary["service"] == "run" and summary["counts"] == {}


def test_one_tick_of_effects_run_is_a_command_not_a_service(tmp_path: Path) -> None:
    """``--once`` answers on stdout; stderr stays empty (one line there is an error's)."""
    targets = tmp_path / "t.toml"
    targets.write_text('[targets.payments]\nlookup = "none"\n')
    args = ["run", "--db", str(tmp_path / "l.db"), "--targets", str(targets), "--once", "--log-format", "json"]
    out = subprocess.run([sys.executable, "-m", "effect_ledger", *args], capture_output=True, text=True, timeout=120)
    assert (out.returncode, out.stderr) == (0, "")
    assert json.loads(out.stdout) == {"timed_out": [], "reconciled": {}}

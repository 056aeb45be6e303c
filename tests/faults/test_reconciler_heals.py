"""The reconcilers heal by themselves: a batch the broker fails mid-way (its group coordinator and
the partitions' leader gone, here a broker frozen for longer than the producer waits) is rewound and
consumed again once the broker is back. Before, ``effects reconcile`` exited for good, and the
uncertain effect of that batch waited for a person to restart it.

The broker is frozen (SIGSTOP) while the reconcilers wait for a slow destination's answer, so the
resolution they then write times out (30 s) and the batch is not committed.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from effect_ledger.core.keys import effect_key
from effect_ledger.core.model import State
from effect_ledger.demo.gateway import Gateway
from effect_ledger.streams.config import KafkaConfig
from tests.conftest import ROOT
from tests.services import Processor, Reconcilers, wait_for
from tests.topic_io import run_agent

SLOW_S = 5.0  # the destination's lookup answers this late
FROZEN_S = 40.0  # longer than the reconcilers' producer waits for an acknowledgement (30 s)


def slow_proxy(target: str) -> tuple[ThreadingHTTPServer, str]:
    """A lookup endpoint that answers what ``target`` answers, SLOW_S late."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            time.sleep(SLOW_S)
            try:
                with urllib.request.urlopen(target + self.path, timeout=10) as r:  # noqa: S310 - loopback
                    status, body = r.status, r.read()
            except urllib.error.HTTPError as e:
                status, body = e.code, e.read()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


def broker_pid(cfg: KafkaConfig) -> int:
    pidfile = ROOT / ".kafka" / "broker.pid"
    if not pidfile.exists() or not cfg.bootstrap.endswith(":" + os.environ.get("KAFKA_PORT", "9092")):
        pytest.skip("needs the repo's own broker (scripts/kafka.sh), which this test freezes")
    return int(pidfile.read_text())


@pytest.fixture
def gateway() -> Iterator[Gateway]:
    g = Gateway("lookup").start()
    yield g
    g.stop()


def test_the_reconcilers_consume_a_failed_batch_again_once_the_broker_is_back(
    kafka_config: KafkaConfig, tmp_path: Path, gateway: Gateway
) -> None:
    pid = broker_pid(kafka_config)
    proxy, url = slow_proxy(gateway.url)
    targets = tmp_path / "targets.toml"
    targets.write_text(
        f'[targets.payments]\nlookup = "{url}/refunds/by-key/{{key}}"\nhonours_keys = false\n'
        'key_retention = "24h"\ndefinite_errors = ["effect_ledger.demo.client:RefundRejected"]\n'
    )
    proc = Processor(kafka_config, tmp_path / "data").start().wait_ready(90)
    rec = Reconcilers(kafka_config, tmp_path, ["--targets", str(targets)]).start()
    try:
        run = f"heal-{uuid.uuid4().hex[:6]}"
        a = run_agent(kafka_config, tmp_path / "agent", gateway.url, "after_intent", run_id=run, timeout=1.0,
                      extra=["--kind", "lookup", "--targets", str(targets)])  # fmt: skip
        a.communicate(timeout=90)
        key = effect_key("payments", "refund.create", run, f"refund-order-{run}")

        def state() -> str | None:
            status, body = proc.lookup(key)
            return body.get("state") if status == 200 else None

        wait_for(lambda: state() == State.UNCERTAIN.value, 60, "the deadline passing")
        time.sleep(1.0)  # the reconcilers have the record and are asking the slow destination
        os.kill(pid, signal.SIGSTOP)
        try:
            time.sleep(FROZEN_S)
        finally:
            os.kill(pid, signal.SIGCONT)
        assert rec.alive, f"the reconcilers exited:\n{rec.log()[-3000:]}"
        wait_for(lambda: state() == State.ABSENT.value, 120, "the batch consumed again: ABSENT")
        assert rec.alive and "consuming it again" in rec.log(), rec.log()[-3000:]
    finally:
        rec.kill()
        proc.kill()
        proxy.shutdown()
